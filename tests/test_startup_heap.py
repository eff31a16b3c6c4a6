"""A command's start-up heap is frozen once its check has imported MindSpore, and the tracking
helper's once MLflow is imported and the store open (issue 24, `ampgan.frozen_imports`): the work
after runs with the collector on and the imports out of its way, the garbage frozen with them is
only the check's own, and nobody else's collector is touched.

Each case runs in a fresh interpreter: the collector's state is the process's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PROBE = textwrap.dedent("""
    import gc, json, sys
    from ampgan import AmpganError
    from ampgan.config import preflight

    frozen_garbage = []
    freeze = gc.freeze

    def counting_freeze():   # what a collection would free right now is what the freeze keeps
        frozen_garbage.append(gc.collect())
        freeze()

    gc.freeze = counting_freeze
    if sys.argv[2] == "paused":
        gc.disable()
    seen = {}

    def body(cfg):
        seen.update(enabled=gc.isenabled(), frozen=gc.get_freeze_count(), mindspore="mindspore" in sys.modules)
        return 0.0

    error = None
    try:
        ran = preflight.check(json.loads(sys.argv[1]), run=body if sys.argv[3] == "runs" else None)
    except AmpganError as err:
        ran, error = False, str(err)
    print(json.dumps({"ran": ran, "error": error, "job": seen, "after": {"enabled": gc.isenabled(),
                      "frozen": gc.get_freeze_count()}, "frozen_garbage": frozen_garbage}))
""")


def fresh_python(tmp_path: Path, code: str, *args: str) -> dict:
    """Run `code` in a fresh interpreter (outputs in tmp_path); its last line of output, as JSON."""
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=tmp_path,
                         timeout=300, env={**os.environ, "AMPGAN_OUTPUTS": str(tmp_path), "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.splitlines()[-1])


def probe(tmp_path: Path, argv: list[str], collector: str = "on", runs: bool = True) -> dict:
    return fresh_python(tmp_path, PROBE, json.dumps(argv), collector, "runs" if runs else "checks")


RUN = ["tracking=none", "trainer.max_steps=1"]


def test_a_single_run_starts_with_the_imports_frozen_and_the_collector_on(tmp_path):
    got = probe(tmp_path, RUN)
    assert got["ran"] and got["error"] is None
    job = got["job"]
    assert job["mindspore"] and job["enabled"]
    assert job["frozen"] > 100_000, job   # MindSpore's modules and what came before them
    # frozen once; only the check's own garbage went with it (0.16 MB, 1,300 objects, measured)
    assert len(got["frozen_garbage"]) == 1 and got["frozen_garbage"][0] < 5_000, got
    # no second freeze after the job (frozen objects still go when their last reference does)
    assert got["after"]["enabled"] and 100_000 < got["after"]["frozen"] <= job["frozen"]


def test_a_check_that_fails_still_leaves_the_collector_on(tmp_path):
    got = probe(tmp_path, [*RUN, "scaler=dynamic", "scaler.init_scale=-1"])
    assert not got["ran"] and "init_scale" in got["error"]
    assert got["after"]["enabled"]


@pytest.mark.parametrize("argv, runs", [(RUN, False),                              # a check alone (sweeps, search)
                                        (["-m", *RUN, "trainer.seed=1,2"], True)])  # a sweep's check
def test_a_check_that_does_not_run_the_job_here_freezes_nothing(tmp_path, argv, runs):
    got = probe(tmp_path, argv, runs=runs)
    assert not got["ran"] and got["error"] is None
    assert got["after"] == {"enabled": True, "frozen": 0} and got["frozen_garbage"] == []


def test_a_collector_the_caller_paused_stays_paused_and_nothing_is_frozen(tmp_path):
    got = probe(tmp_path, RUN, collector="paused")
    assert got["ran"] and got["job"]["mindspore"]
    assert got["job"]["enabled"] is False and got["job"]["frozen"] == 0 and got["frozen_garbage"] == []


HELPER = textwrap.dedent("""
    import gc, json, sys, time
    from ampgan.tracking import helper

    setup = {"uri": sys.argv[1], "experiment": "heap", "flush_every": 10, "run_dir": None,
             "heartbeat_seconds": 30, "owner": ["test", 1], "command_started": time.time()}
    tracker = helper._start(setup, "run", {"a": 1}, {"b": "c"})
    print(json.dumps({"enabled": gc.isenabled(), "frozen": gc.get_freeze_count(), "mlflow": "mlflow" in sys.modules,
                      "run": bool(tracker.run_id)}))
""")


def test_the_tracking_helper_starts_its_run_with_mlflow_frozen(tmp_path):
    got = fresh_python(tmp_path, HELPER, f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert got["run"] and got["mlflow"] and got["enabled"]
    assert got["frozen"] > 100_000, got   # MLflow's modules, its store's engine
