"""Optuna search: 6 trials, 2 worker processes sharing one study; every trial an MLflow run of the search."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.test_sweeps import sweep_runs


def search_cli(*args: str, outputs: Path, timeout: int = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, "AMPGAN_OUTPUTS": str(outputs), "GLOG_v": "3"}
    return subprocess.run([sys.executable, "-m", "ampgan.search", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow  # `make test-full` (CI's time): test_failed_trials_are_failed_not_nan runs a search here
def test_search_six_trials_two_workers_one_study(outputs):
    import optuna

    from ampgan.sweeps.optuna_search import open_storage

    done = search_cli("--trials", "6", "--workers", "2", "trainer=smoke", "trainer.layer_health_every=0",
                      "trainer.eval_every=0", "scaler=choice(dynamic,fixed_clip)",
                      "scaler.clip_norm=tag(log,interval(0.1,10))", "amp=choice(o0,o2)", outputs=outputs)
    assert done.returncode == 0, done.stderr[-3000:]
    folder = next(outputs.glob("multirun/*/*/optuna.journal")).parent
    study = optuna.load_study(study_name=folder.name, storage=open_storage(str(folder / "optuna.journal")))
    assert study.direction.name == "MINIMIZE"  # WGAN-GP: eval/swd
    trials = study.trials
    assert len(trials) >= 6 and all(t.state.name == "COMPLETE" for t in trials)
    best = json.loads((folder / "best.json").read_text())
    assert best["value"] == min(t.value for t in trials) and "scaler" in best["params"]
    assert f"best: trial {best['trial']}" in done.stdout
    for t in trials:  # conditional parameter: clip_norm only where the scaler clips
        assert ("scaler.clip_norm" in t.params) == (t.params["scaler"] == "fixed_clip")
    client, runs = sweep_runs(outputs)
    assert len(runs) == len(trials) and {r.info.status for r in runs} == {"FINISHED"}
    assert {r.data.tags["sweep_id"] for r in runs} == {folder.name}
    assert {r.info.run_id for r in runs} == {t.user_attrs["run_id"] for t in trials}
    for t in trials:  # each trial's run holds the trial's objective
        run = client.get_run(t.user_attrs["run_id"])
        assert run.data.metrics["eval/swd"] == pytest.approx(t.value)
        assert run.data.tags["job_num"] == str(t.number)
    assert len({r.data.tags["ampgan.pid"] for r in runs}) == 2  # two workers shared the study
    assert len([ln for ln in done.stdout.splitlines() if ln.startswith("[sweep] job ")]) == len(trials)


def test_failed_trials_are_failed_not_nan(outputs):
    """A classifier search maximises accuracy; a trial whose job raises is FAILED with its error."""
    import optuna

    from ampgan.sweeps.optuna_search import open_storage

    done = search_cli("--trials", "3", "--workers", "1", "model=classifier", "data=digits", "trainer=smoke",
                      "trainer.layer_health_every=0", "trainer.eval_every=0",
                      "trainer.resume=choice(/nonexistent/run,/nonexistent/other)", "amp=choice(o0,o2)",
                      outputs=outputs)
    folder = next(outputs.glob("multirun/*/*/optuna.journal")).parent
    study = optuna.load_study(study_name=folder.name, storage=open_storage(str(folder / "optuna.journal")))
    assert study.direction.name == "MAXIMIZE"
    assert study.trials and all(t.state.name == "FAIL" and t.value is None for t in study.trials)
    assert all("trainer.resume" in t.user_attrs["error"] for t in study.trials)
    assert done.returncode == 1 and "no trial completed" in done.stderr
