"""`python -m ampgan.diagnose`: open the Case, run the pipeline, print the report, log it, exit.

    exit 0  healthy: AMP tracks FP32
    exit 1  an AMP problem (overflow, underflow, precision, scaler, framework); the fix is printed
    exit 3  not AMP: the FP32 twin fails the same way, no later
    exit 4  not reproduced: the run fails, but the replay did not reach or explain it (how to get there is printed)
    exit 5  unexplained: FP32 trains, and no intervention tried removes the failure (the table shows them)
    exit 2  bad input (one line `ampgan: error: ...`)

The stages are `ampgan.diagnose.pipeline`'s; the report and the MLflow run are `verdict_report`'s.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from omegaconf import DictConfig

from ampgan.diagnose import verdict_report as report
from ampgan.diagnose.case import diagnose_settings, open_case
from ampgan.diagnose.pipeline import Result, diagnose_case


def check_node(cfg: DictConfig) -> None:
    """preflight's `extra`: the diagnose node of every composed combination."""
    diagnose_settings(cfg)


def diagnose(cfg: DictConfig, run_dir: Path, echo=print) -> Result:
    """Diagnose the run `cfg` describes (or `diagnose.run`'s recorded run, or `diagnose.start`'s
    recording): the verdict, its interventions and fixes printed; the report files in `run_dir`
    and an MLflow run tagged ampgan.kind=diagnose."""
    started = time.perf_counter()
    case = open_case(cfg, run_dir)

    def progress(msg: str) -> None:
        if case.dcfg.progress:
            echo(f"[diagnose {time.perf_counter() - started:5.1f}s] {msg}", file=sys.stderr, flush=True)

    result = diagnose_case(case, progress)
    echo(report.terminal(result))
    report.publish(result, run_dir, time.perf_counter() - started)
    return result
