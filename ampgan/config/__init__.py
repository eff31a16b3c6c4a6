"""Configuration: the dataclass schemas and their validation (`schema`), the command-line
check that runs before Hydra (`preflight`) and the one place that touches Hydra's internals
(`hydra_compat`).

May import: `ampgan` (errors), `ampgan.amp` (scaler and cell-type schemas), `ampgan.data`
(data-set names). Nothing from the build stage, training, tracking, sweeps, reporting or
diagnose, except `preflight`, which opens the tracking store to check it before a run.
"""
