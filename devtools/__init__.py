"""Development tooling, outside the library: local stand-ins for a team's services (`services`)."""
