"""Studies and benchmarks run on top of ampgan (`python -m experiments.<name>`)."""
