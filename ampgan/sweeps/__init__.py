"""Sweeps: a sweep's jobs, their identity, status and resume (`jobs`, `python -m ampgan.sweep`),
its parent and child runs (`runs`), and Optuna search over sweep jobs (`search`,
`python -m ampgan.search`).

Beside the loop: sweeps run jobs through `ampgan.training.entry.train` and read runs back
through `ampgan.tracking` and `ampgan.reporting`; they never copy the build or the steps.
"""
