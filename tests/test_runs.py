"""Smoke runs of each model under O0 and O2, tracked in a real MLflow store in tmp_path."""

from __future__ import annotations

import numpy as np
import pytest

from ampgan.training.entry import train
from tests.conftest import all_runs, compose_cfg

CASES = {
    "gan": ["model=wgan_gp", "data=gaussians8"],
    "classifier": ["model=classifier", "data=digits"],
}


@pytest.mark.parametrize("case,amp", [("gan", "o2"), ("classifier", "o0"),   # the other two in `make test-full`
                                      pytest.param("gan", "o0", marks=pytest.mark.slow),
                                      pytest.param("classifier", "o2", marks=pytest.mark.slow)])
def test_smoke_run_is_tracked(outputs, tmp_path, case, amp):
    cfg = compose_cfg(*CASES[case], f"amp={amp}", "scaler=dynamic", "trainer=smoke")
    objective = train(cfg, run_dir=tmp_path / "run")
    assert np.isfinite(objective)

    client, runs = all_runs(outputs)
    assert len(runs) == 1
    run = runs[0]
    assert run.info.status == "FINISHED"
    assert run.data.tags["amp"] == amp.upper() and run.data.tags["scaler"] == "dynamic"
    assert run.data.tags["outcome"] == "completed"
    assert run.data.tags["device"] == "CPU" and run.data.tags["device_tested"] == "true"   # what it ran on
    assert run.data.params["amp.level"] == amp.upper()
    assert run.data.params["trainer.max_steps"] == "6"
    prefix = "critic" if case == "gan" else "train"
    loss = client.get_metric_history(run.info.run_id, f"{prefix}/loss")
    scale = client.get_metric_history(run.info.run_id, f"{prefix}/scale")
    assert [m.step for m in loss] == [1, 2, 3, 4, 5, 6]
    values = [m.value for m in scale]
    assert all(1 <= v <= 65536.0 and np.log2(v).is_integer() for v in values)
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"samples", "checkpoints", "config.yaml"} <= artifacts
    pictures = [a.path for a in client.list_artifacts(run.info.run_id, "samples")]
    assert pictures and pictures[0].endswith(".png")
    layer_key = "grad/critic.score.0.weight/underflow" if case == "gan" else "grad/backbone.body.0.weight/zero"
    assert layer_key in run.data.metrics
    # per-layer health at training's start (step 2: step 1 runs the plain step), every 3 steps, and the last
    assert [m.step for m in client.get_metric_history(run.info.run_id, layer_key)] == [2, 3, 6]
    final_key = "eval/swd" if case == "gan" else "eval/accuracy"
    assert run.data.metrics[final_key] == pytest.approx(objective)
    # the artifact store sits beside the database, not in the working directory
    assert run.info.artifact_uri.startswith((outputs / "mlartifacts").as_uri())


def test_runs_are_deterministic(outputs, tmp_path):
    cfg = compose_cfg("model=wgan_gp", "amp=o2", "scaler=dynamic", "trainer=smoke", "tracking=none")
    a = train(cfg, run_dir=tmp_path / "a")
    b = train(cfg, run_dir=tmp_path / "b")
    assert a == b


def test_failing_run_ends_failed_with_error_and_metrics(outputs, tmp_path, monkeypatch):
    from ampgan import tasks

    calls = {"n": 0}
    original = tasks.ClassifierTask.train_step

    def flaky(self, step, measure=True):
        calls["n"] += 1
        if calls["n"] == 4:
            raise RuntimeError("boom at step 4")
        return original(self, step, measure)

    monkeypatch.setattr(tasks.ClassifierTask, "train_step", flaky)
    cfg = compose_cfg("model=classifier", "data=digits", "trainer=smoke", "tracking.flush_every=1000")
    with pytest.raises(RuntimeError, match="boom"):
        train(cfg, run_dir=tmp_path / "run")
    client, runs = all_runs(outputs)
    assert runs[0].info.status == "FAILED"
    assert "boom at step 4" in runs[0].data.tags["error"]
    # buffered metrics of steps 1-3 were flushed, not dropped
    assert [m.step for m in client.get_metric_history(runs[0].info.run_id, "train/loss")] == [1, 2, 3]


def test_interrupted_run_ends_killed(outputs, tmp_path, monkeypatch):
    from ampgan import tasks

    def interrupt(self, step, measure=True):
        raise KeyboardInterrupt

    monkeypatch.setattr(tasks.ClassifierTask, "train_step", interrupt)
    with pytest.raises(KeyboardInterrupt):
        train(compose_cfg("model=classifier", "data=digits", "trainer=smoke"), run_dir=tmp_path / "run")
    _, runs = all_runs(outputs)
    assert [r.info.status for r in runs] == ["KILLED"]


def test_diverging_run_stops_and_says_so(outputs, tmp_path):
    """A run whose losses stay NaN stops after trainer.max_nonfinite_steps and is tagged diverged."""
    cfg = compose_cfg("model=classifier", "data=gaussians8", "trainer=smoke", "trainer.max_steps=60",
                      "trainer.max_nonfinite_steps=5", "model.lr=1e12")
    train(cfg, run_dir=tmp_path / "run")
    _, runs = all_runs(outputs)
    run = runs[0]
    assert run.info.status == "FINISHED" and run.data.tags["outcome"] == "diverged"
    assert run.data.metrics["train/diverged"] == 1.0
    assert run.data.metrics["train/steps"] < 60


def test_a_status_line_right_after_the_first_reports_speed_not_a_second_compile(monkeypatch):
    """Lines on consecutive steps (print_every 1 or 2): only the first is the compiling one."""
    from ampgan.training import loop as trainer

    clock = iter([0.0, 5.0, 5.5, 6.0, 6.0])
    monkeypatch.setattr(trainer.time, "perf_counter", lambda: next(clock))
    progress = trainer.Progress(total=10, start_step=0, every=1)
    assert progress.line(1, {}).endswith("first step 5.0s (compiling)")
    assert progress.line(2, {}).endswith("2.0 step/s, 4s left")      # 1 step in 0.5 s after the compile
    assert progress.line(3, {}).endswith("2.0 step/s, 3s left")      # 2 steps in 1 s
    assert progress.seconds_per_step(3) == 0.5


def test_status_line_reports_the_compile_then_the_speed_of_the_compiled_steps(monkeypatch):
    """The first line says how long the first (compiling) step took; later lines' speed and time left
    count only the steps after it, and a time-based line is due without waiting for the step count."""
    from ampgan.training import loop as trainer

    clock = iter([0.0, 8.0, 10.0, 10.0, 45.0, 45.0])
    monkeypatch.setattr(trainer.time, "perf_counter", lambda: next(clock))
    progress = trainer.Progress(total=101, start_step=0, every=50, seconds=30)  # start at t=0
    assert progress.line(1, {"critic/loss": 0.5}) == "step 1/101 (0%) | critic/loss 0.5 | first step 8.0s (compiling)"
    assert progress.line(21, {}).endswith("10.0 step/s, 8s left")    # 20 steps in 2 s after the compile
    assert not progress.due(22)                                        # t=10: 0 s since the last line
    assert progress.due(23)                                            # t=45: 35 s > 30 s
    assert progress.line(23, {}).endswith("0.6 step/s, 2m11s left")   # 22 steps in 37 s, 78 to go


def test_process_age_counts_from_the_process_start_not_from_a_rounded_boot_time():
    """startup/imports_s counts from the process's start: never more than the wall time seen from outside."""
    import subprocess
    import sys
    import time

    for _ in range(3):
        t = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", "from ampgan import process_age; print(process_age())"],
                             capture_output=True, text=True, check=True).stdout
        wall = time.perf_counter() - t
        assert 0 < float(out) <= wall + 0.011  # one clock tick of rounding
