"""Tracking: the MLflow tracker with its journal and heartbeat (`tracker`), the same tracker in a
helper process (`helper`), journal-to-store delivery and ending lost runs (`sync`), and the
dashboard (`ui`, `python -m ampgan.tracking ui`).

May import: `ampgan`, `ampgan.config`. Never the build stage, the steps or the loop: the trainer
hands it metrics, and it is the only package that imports MLflow's tracking client.
"""
