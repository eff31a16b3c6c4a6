"""The command line as a user types it: bad input -> one line on stderr, non-zero exit, no RUNNING run."""

from __future__ import annotations

import pytest

from tests.conftest import all_runs, run_cli

BAD = {
    "unknown amp level": (["amp=o9"], "amp=o9"),
    "negative init scale": (["scaler=dynamic", "scaler.init_scale=-1"], "scaler.init_scale"),
    "init scale on the none scaler": (["scaler.init_scale=-1"], "scaler.init_scale"),
    "zero steps": (["trainer.max_steps=0"], "trainer.max_steps"),
    "unknown data set": (["data=nope"], "data=nope"),
    "missing gpu": (["hardware=gpu"], "hardware=gpu"),
    "bad value inside a sweep": (["-m", "scaler=dynamic", "scaler.window=10,0"], "scaler.window"),
    "zero clip norm": (["scaler=fixed_clip", "scaler.clip_norm=0"], "scaler.clip_norm"),
    "negative clip norm": (["scaler=fixed_clip", "scaler.clip_norm=-2"], "scaler.clip_norm"),
    "factor of one": (["scaler=underflow_aware", "scaler.factor=1"], "scaler.factor"),
    "window of zero": (["scaler=underflow_aware", "scaler.window=0"], "scaler.window"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_fails_with_one_line(outputs, case):
    args, fragment = BAD[case]
    proc = run_cli(*args, outputs=outputs)
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("ampgan: error:")]
    assert len(errors) == 1 and fragment in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr
    _, runs = all_runs(outputs) if (outputs / "mlflow.db").exists() else (None, [])
    assert all(r.info.status != "RUNNING" for r in runs)
    assert runs == []  # every one of these fails before a run is created


def test_cli_smoke_run_and_help(outputs):
    proc = run_cli("model=classifier", "data=digits", "amp=o3", "hardware=cpu", "trainer=smoke", outputs=outputs)
    assert proc.returncode == 0, proc.stderr
    assert "step 6/6" in proc.stdout + proc.stderr
    _, runs = all_runs(outputs)
    assert [r.info.status for r in runs] == ["FINISHED"]
    assert runs[0].data.tags["amp"] == "O3"


def _job_runs(outputs):
    """The runs of a sweep's jobs (its parent run, ampgan.sweep_runs, left out)."""
    from ampgan.reporting.sweep_report import PARENT_TAG

    client, runs = all_runs(outputs)
    return client, [r for r in runs if PARENT_TAG not in r.data.tags]


@pytest.mark.slow  # `make test-full` (CI's time): test_sweeps' parallel sweep stays
def test_sweep_logs_one_run_per_job_with_sweep_tags(outputs):
    proc = run_cli("-m", "scaler=fixed_clip", "scaler.clip_norm=0.5,1,2,5", "trainer=smoke", outputs=outputs)
    assert proc.returncode == 0, proc.stderr[-2000:]
    client, runs = _job_runs(outputs)
    assert len(runs) == 4 and {r.info.status for r in runs} == {"FINISHED"}
    assert len({r.data.tags["sweep_id"] for r in runs}) == 1
    assert sorted(r.data.tags["job_num"] for r in runs) == ["0", "1", "2", "3"]
    assert sorted(float(r.data.params["scaler.clip_norm"]) for r in runs) == [0.5, 1.0, 2.0, 5.0]
    assert all(r.data.tags["scaler"] == "fixed_clip" and "critic/clip_rate" in r.data.metrics for r in runs)
    from ampgan.reporting.sweep_report import main as report

    assert report(["--uri", f"sqlite:///{outputs / 'mlflow.db'}"]) == 0


@pytest.mark.slow
def test_scaler_by_amp_sweep(outputs):
    proc = run_cli("-m", "scaler=dynamic,underflow_aware,fixed_clip", "amp=o2,o3", "trainer=smoke", outputs=outputs,
                   timeout=1200)
    assert proc.returncode == 0, proc.stderr[-2000:]
    _, runs = _job_runs(outputs)
    combos = sorted((r.data.tags["amp"], r.data.tags["scaler"]) for r in runs)
    assert combos == sorted((a, s) for a in ("O2", "O3") for s in ("dynamic", "underflow_aware", "fixed_clip"))
    assert len({r.data.tags["sweep_id"] for r in runs}) == 1 and {r.info.status for r in runs} == {"FINISHED"}


@pytest.mark.parametrize("sig", [pytest.param("SIGINT", marks=pytest.mark.slow), "SIGTERM"])   # SIGINT: make test-full
def test_signal_ends_the_run_killed_with_metrics_kept(outputs, sig):
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.conftest import ROOT

    from ampgan.tracking.tracker import MlflowTracker

    MlflowTracker(f"sqlite:///{outputs / 'mlflow.db'}", "ampgan")  # create the store: polling it must not race its creation
    env = {**os.environ, "AMPGAN_OUTPUTS": str(outputs), "GLOG_v": "3"}
    proc = subprocess.Popen([sys.executable, "-m", "ampgan.train", "model=classifier", "data=digits",
                             "trainer.max_steps=100000", "trainer.log_every=1", "tracking.flush_every=5"],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline, seen = time.time() + 180, 0
        while time.time() < deadline and seen < 3:
            time.sleep(1)
            client, runs = all_runs(outputs)
            if runs:
                seen = len(client.get_metric_history(runs[0].info.run_id, "train/loss"))
        if seen < 3:
            pytest.fail("the run never started logging")
        proc.send_signal(getattr(signal, sig))
        proc.wait(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode != 0
    client, runs = all_runs(outputs)
    assert [r.info.status for r in runs] == ["KILLED"]
    assert "interrupted" in runs[0].data.tags["error"]
    steps = [m.step for m in client.get_metric_history(runs[0].info.run_id, "train/loss")]
    assert len(steps) >= seen and steps == list(range(1, len(steps) + 1))  # nothing logged was lost
