"""Mixed-precision policy, loss scalers and in-graph gradient health."""
