"""Nothing lost: full-state checkpoints, resume into the same run, signals, the metric journal.

Real subprocesses, real signals (SIGKILL, SIGTERM, SIGINT) and real MLflow sqlite stores.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from ampgan.training import checkpoint
from ampgan.config.schema import validate
from ampgan.reporting.sweep_report import PARENT_TAG
from ampgan.tracking.tracker import MlflowTracker, read_journal
from tests.conftest import ROOT, all_runs, compose_cfg, run_cli

CLASSIFIER = ["model=classifier", "data=digits", "trainer=smoke", "trainer.max_steps=40", "trainer.checkpoint_every=5",
              "trainer.log_every=1", "trainer.eval_every=20", "trainer.layer_health_every=10", "tracking.flush_every=1000",
              "trainer.print_seconds=0"]


# MindSpore's runtime answers a SIGINT that lands during a graph run with SIGTERM to the process
CTRL_C_EXIT = (130, 143)


def start(*args: str, outputs: Path) -> subprocess.Popen:
    env = {**os.environ, "AMPGAN_OUTPUTS": str(outputs), "GLOG_v": "3"}
    return subprocess.Popen([sys.executable, "-m", "ampgan.train", *args], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def run_folder(outputs: Path) -> Path:
    found = sorted(outputs.glob("runs/*/*/tracking.json")) + sorted(outputs.glob("multirun/*/*/*/tracking.json"))
    return found[-1].parent if found else None


def journal_step(outputs: Path, key: str = "train/loss") -> int:
    """The last step of `key` the running process has written to its journal."""
    folder = run_folder(outputs)
    if folder is None:
        return 0
    records, _ = read_journal(folder)
    return max((r["s"] for r in records if r.get("k") == key), default=0)


def wait_for_step(proc: subprocess.Popen, outputs: Path, step: int, key: str = "train/loss", timeout: float = 240) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if journal_step(outputs, key) >= step:
            return
        if proc.poll() is not None:
            pytest.fail(f"the run ended early: {proc.stderr.read()[-2000:]}")
        time.sleep(0.05)
    proc.kill()
    pytest.fail(f"the run never reached step {step}")


def history(client, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


@pytest.mark.slow  # `make test-full` (CI's 30 minutes on a slow machine)
def test_sigkill_at_a_random_step_then_resume_matches_an_uninterrupted_run(tmp_path):
    straight, broken = tmp_path / "straight", tmp_path / "broken"
    done = run_cli(*CLASSIFIER, outputs=straight)
    assert done.returncode == 0, done.stderr[-2000:]
    kill_at = random.Random().randint(7, 33)
    proc = start(*CLASSIFIER, outputs=broken)
    wait_for_step(proc, broken, kill_at)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    folder = run_folder(broken)
    client, runs = all_runs(broken)
    assert [r.info.status for r in runs] == ["RUNNING"]  # a hard kill cannot end its own run
    saved = checkpoint.read_host(checkpoint.latest(folder / "checkpoints"))
    assert saved["step"] % 5 == 0 and saved["step"] <= journal_step(broken)

    resumed = run_cli(*CLASSIFIER, f"trainer.resume={folder}", outputs=broken)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    client_b, runs_b = all_runs(broken)
    client_a, runs_a = all_runs(straight)
    assert [r.info.status for r in runs_b] == ["FINISHED"] and len(runs_b) == 1
    a, b = runs_a[0], runs_b[0]
    assert b.data.tags["ampgan.resumed_from_step"] == str(saved["step"])
    for key in ("train/loss", "train/acc", "train/scale", "train/skipped", "grad/head.fc.weight/max_abs"):
        got, want = history(client_b, b.info.run_id, key), history(client_a, a.info.run_id, key)
        assert [s for s, _ in got] == [s for s, _ in want], f"{key}: each step exactly once"
        np.testing.assert_array_equal([v for _, v in got], [v for _, v in want], err_msg=f"{key} (killed at {kill_at})")
    for key in ("eval/accuracy", "eval/loss", "train/skipped_total"):
        assert b.data.metrics[key] == a.data.metrics[key], key


@pytest.mark.slow  # `make test-full` (CI's time): SIGTERM in test_cli, resume after SIGKILL here stay
def test_sigterm_leaves_a_checkpoint_and_a_killed_run_that_resumes(tmp_path):
    outputs = tmp_path / "out"
    args = [*CLASSIFIER, "trainer.log_every=10", "trainer.checkpoint_every=1000"]
    proc = start(*args, outputs=outputs)
    wait_for_step(proc, outputs, 12)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-2000:]
    assert "ampgan: interrupted (SIGTERM)" in err and "Traceback" not in err
    folder = run_folder(outputs)
    client, runs = all_runs(outputs)
    run = runs[0]
    assert run.info.status == "KILLED" and "interrupted (SIGTERM)" in run.data.tags["error"]
    stopped = checkpoint.read_host(checkpoint.latest(folder / "checkpoints"))["step"]
    logged = history(client, run.info.run_id, "train/loss")
    # the steps since the last log step were fetched and logged before the run ended
    assert logged[-1][0] == stopped and stopped >= 12
    resumed = run_cli(*args, f"trainer.resume={run.info.run_id}", outputs=outputs)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    client, runs = all_runs(outputs)
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    steps = [s for s, _ in history(client, run.info.run_id, "train/loss")]
    assert len(steps) == len(set(steps)) and steps[-1] == 40


@pytest.mark.slow  # `make test-full` (CI's time): test_cli's signal tests stay
def test_ctrl_c_during_the_final_evaluation_ends_killed(tmp_path):
    outputs = tmp_path / "out"
    # a slow final evaluation (many generated samples) gives the signal time to land inside it
    args = ["trainer=smoke", "trainer.max_steps=3", "trainer.eval_every=0", "trainer.eval_samples=300000",
            "tracking.flush_every=1"]
    proc = start(*args, outputs=outputs)
    wait_for_step(proc, outputs, 3, key="critic/loss")
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode in CTRL_C_EXIT, err[-2000:]
    _, runs = all_runs(outputs)
    assert [r.info.status for r in runs] == ["KILLED"]


def test_ctrl_c_stops_a_sequential_sweep(tmp_path):
    outputs = tmp_path / "out"
    proc = start("-m", "trainer.seed=0,1,2", *CLASSIFIER[:3], "trainer.max_steps=100000", "tracking.flush_every=1",
                 outputs=outputs)
    wait_for_step(proc, outputs, 5)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode in CTRL_C_EXIT, err[-2000:]
    _, runs = all_runs(outputs)
    jobs = [r for r in runs if PARENT_TAG not in r.data.tags]
    assert [r.info.status for r in jobs] == ["KILLED"]  # the sweep did not go on to the next job
    assert [r.info.status for r in runs if PARENT_TAG in r.data.tags] == ["KILLED"]  # nor did its parent run


def test_a_second_signal_stops_at_once_and_leaves_no_running_run(tmp_path):
    outputs = tmp_path / "out"
    proc = start(*CLASSIFIER[:3], "trainer.max_steps=100000", "trainer.checkpoint_every=1000",
                 "tracking.flush_every=1", outputs=outputs)
    wait_for_step(proc, outputs, 5)
    proc.send_signal(signal.SIGTERM)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)
    assert proc.returncode != 0
    _, runs = all_runs(outputs)
    assert [r.info.status for r in runs] == ["KILLED"]


def hard_killed_run(outputs: Path, step: int) -> Path:
    """A run that sends nothing to the store (all in its journal), SIGKILLed at `step`; its folder."""
    proc = start(*CLASSIFIER[:3], "trainer.max_steps=100000", "trainer.log_every=1", "tracking.flush_every=100000",
                 outputs=outputs)
    wait_for_step(proc, outputs, step)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    return run_folder(outputs)


@pytest.mark.slow  # `make test-full` (CI's 30 minutes on a slow machine)
def test_hard_killed_run_is_ended_by_the_next_run_with_its_journal_delivered(tmp_path):
    outputs = tmp_path / "out"
    lost_folder = hard_killed_run(outputs, 8)
    journaled = journal_step(outputs)
    client, runs = all_runs(outputs)
    assert runs[0].info.status == "RUNNING" and client.get_metric_history(runs[0].info.run_id, "train/loss") == []
    nxt = run_cli(*CLASSIFIER[:3], outputs=outputs)
    assert nxt.returncode == 0, nxt.stderr[-2000:]
    client, runs = all_runs(outputs)
    lost = next(r for r in runs if r.data.tags["output_dir"] == str(lost_folder))
    assert lost.info.status == "FAILED" and "process lost" in lost.data.tags["error"]
    steps = [s for s, _ in history(client, lost.info.run_id, "train/loss")]
    assert steps == list(range(1, journaled + 1))  # nothing that reached the journal was lost


@pytest.mark.slow  # `make test-full` (CI's 30 minutes on a slow machine)
def test_sync_delivers_a_journal_and_ends_the_run(tmp_path):
    outputs = tmp_path / "out"
    folder = hard_killed_run(outputs, 6)
    env = {**os.environ, "AMPGAN_OUTPUTS": str(outputs)}
    out = subprocess.run([sys.executable, "-m", "ampgan.sync", str(folder)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "ended FAILED" in out.stdout
    again = subprocess.run([sys.executable, "-m", "ampgan.sync", str(folder)], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=120)
    assert "0 metrics sent" in again.stdout  # idempotent: nothing sent twice
    client, runs = all_runs(outputs)
    steps = [s for s, _ in history(client, runs[0].info.run_id, "train/loss")]
    assert steps == sorted(set(steps)) and steps[-1] >= 6


def test_a_run_killed_between_log_steps_keeps_its_last_steps(outputs, tmp_path, monkeypatch):
    """With log_every=10, an error at step 14 still logs steps 11-13 (they were pending, not fetched)."""
    from ampgan import tasks
    from ampgan.training.entry import train

    original = tasks.ClassifierTask.train_step

    def flaky(self, step, measure=True):
        if step == 14:
            raise RuntimeError("boom at step 14")
        return original(self, step, measure)

    monkeypatch.setattr(tasks.ClassifierTask, "train_step", flaky)
    cfg = compose_cfg(*CLASSIFIER, "trainer.log_every=10", "trainer.print_every=1000", "trainer.checkpoint_every=0",
                      "trainer.layer_health_every=0")
    with pytest.raises(RuntimeError, match="boom"):
        train(cfg, run_dir=tmp_path / "run")
    client, runs = all_runs(outputs)
    assert runs[0].info.status == "FAILED"
    # 1: the first step's line; 2: training's start, measured; 10: a log step; 11-13 pending when step 14 failed
    assert [s for s, _ in history(client, runs[0].info.run_id, "train/loss")] == [1, 2, 10, 13]


def test_every_fetched_status_is_logged(outputs, tmp_path):
    """A print-only or layer-only step fetches statuses: they are logged, never dropped."""
    from ampgan.training.entry import train

    cfg = compose_cfg(*CLASSIFIER, "trainer.max_steps=12", "trainer.log_every=5", "trainer.print_every=3",
                      "trainer.layer_health_every=4", "trainer.checkpoint_every=0")
    train(cfg, run_dir=tmp_path / "run")
    client, runs = all_runs(outputs)
    steps = [s for s, _ in history(client, runs[0].info.run_id, "train/loss")]
    # every drain logs its window at its last step: 1, 2 (training's start, measured), 3, 4, 5, 6, 8, 9, 10, 12
    assert steps == [1, 2, 3, 4, 5, 6, 8, 9, 10, 12]
    assert sum(1 for _ in steps) == len(set(steps))


@pytest.mark.parametrize("scaler,has_norm", [("none", False), ("fixed_clip", True)])
def test_unmeasured_health_is_not_logged(outputs, tmp_path, scaler, has_norm):
    from ampgan.training.entry import train

    cfg = compose_cfg("model=classifier", "data=digits", "trainer=smoke", "trainer.grad_health=false", f"scaler={scaler}")
    train(cfg, run_dir=tmp_path / "run")
    _, runs = all_runs(outputs)
    keys = set(runs[0].data.metrics)
    for field in ("underflow", "zero", "max_abs_scaled_grad", "nonfinite"):
        assert f"train/{field}" not in keys
    assert not any(k.startswith("grad/") for k in keys)
    assert ("train/grad_norm" in keys) is has_norm
    assert "train/loss" in keys


def test_checkpoint_round_trip_holds_every_state(tmp_path):
    """Optimizer moments, scaler state, sampler position and RNGs come back exactly."""
    from ampgan.training import hardware
    from ampgan.data import build_dataset
    from ampgan.tasks import build_task

    s = validate(compose_cfg("amp=o2", "scaler=underflow_aware", "trainer=smoke", "tracking=none"))
    hardware.setup(s.hardware, s.trainer.seed)
    task = build_task(s, build_dataset(s.data))
    for step in range(1, 4):
        task.train_step(step)
    task.metrics()
    path = checkpoint.save(task, tmp_path / "checkpoints", 3, keep=2, extra={"run_id": "abc"})
    before = {k: p.asnumpy().copy() for k, p in task.state_parameters().items()}
    assert any(k.startswith("critic.opt/exp_avg") for k in before) and "critic.scaler/amax_hist" in before
    hardware.setup(s.hardware, s.trainer.seed + 1)  # another seed: other initial weights
    fresh = build_task(s, build_dataset(s.data))
    host = checkpoint.load(fresh, path)
    assert host["step"] == 3 and host["run_id"] == "abc"
    for k, p in fresh.state_parameters().items():
        np.testing.assert_array_equal(p.asnumpy(), before[k], err_msg=k)
    assert fresh.batches.next()[0].tolist() == task.batches.next()[0].tolist()
    assert fresh.rng.standard_normal(3).tolist() == task.rng.standard_normal(3).tolist()
    assert fresh.critic_state.counters() == task.critic_state.counters()


def test_checkpoint_sets_are_atomic_and_pruned(tmp_path):
    from ampgan.training import hardware
    from ampgan.data import build_dataset
    from ampgan.tasks import build_task

    s = validate(compose_cfg("model=classifier", "data=digits", "trainer=smoke", "tracking=none"))
    hardware.setup(s.hardware, s.trainer.seed)
    task = build_task(s, build_dataset(s.data))
    folder = tmp_path / "checkpoints"
    for step in (5, 10, 15):
        checkpoint.save(task, folder, step, keep=2)
    assert sorted(p.name for p in folder.glob("step-*")) == ["step-00000010", "step-00000015"]
    (folder / ".step-00000020.partial").mkdir()  # a set cut short by a kill
    (folder / "latest").unlink()
    assert checkpoint.latest(folder).name == "step-00000015"
    assert json.loads((folder / "step-00000015" / checkpoint.HOST_FILE).read_text())["step"] == 15


def test_resume_refuses_changed_settings(outputs, tmp_path):
    from ampgan import AmpganError
    from ampgan.training.entry import train

    train(compose_cfg(*CLASSIFIER[:3], "trainer.max_steps=4"), run_dir=tmp_path / "run")
    with pytest.raises(AmpganError, match="model.lr"):
        train(compose_cfg(*CLASSIFIER[:3], "model.lr=0.5", f"trainer.resume={tmp_path / 'run'}"))
    with pytest.raises(AmpganError, match="no checkpoint|not a folder"):
        train(compose_cfg(*CLASSIFIER[:3], f"trainer.resume={tmp_path / 'nothing-here'}"))


def test_tracker_start_failure_leaves_no_running_run(outputs):
    """A failure after the run is created (here: a param name MLflow rejects) ends it FAILED."""
    from ampgan.training.loop import tracked_run

    tracker = MlflowTracker(f"sqlite:///{outputs / 'mlflow.db'}", "ampgan")
    with pytest.raises(Exception):
        with tracked_run(tracker, "bad-params", {"not a valid name!": 1}, {}):
            pass
    _, runs = all_runs(outputs)
    assert [r.info.status for r in runs] == ["FAILED"]


def test_values_beyond_mlflow_limits_do_not_fail_the_run(outputs, tmp_path):
    from ampgan.training.entry import train

    long_name = "x" * 7000
    train(compose_cfg(*CLASSIFIER[:3], "trainer.max_steps=2", f"tracking.run_name={long_name}"), run_dir=tmp_path / "run")
    _, runs = all_runs(outputs)
    run = runs[0]
    assert run.info.status == "FINISHED"
    assert run.data.params["tracking.run_name"].endswith("[cut: 7000 chars]")


@pytest.mark.slow  # `make test-full` (CI's time): requeue under SLURM's restart
def test_requeue_continues_the_same_run_when_the_job_starts_again(tmp_path):
    """A scheduler's SIGTERM before preemption, then the same command again: one run, continued."""
    outputs = tmp_path / "out"
    args = [*CLASSIFIER[:3], "trainer.max_steps=60", "trainer.log_every=1", "trainer.requeue=true",
            "tracking.flush_every=1"]
    proc = start(*args, outputs=outputs)
    wait_for_step(proc, outputs, 10)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)
    assert proc.returncode == 143
    client, runs = all_runs(outputs)
    assert runs[0].info.status == "KILLED" and runs[0].data.tags["ampgan.requeue"] == "pending"
    again = run_cli(*args, outputs=outputs)
    assert again.returncode == 0, again.stderr[-2000:]
    client, runs = all_runs(outputs)
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    steps = [s for s, _ in history(client, runs[0].info.run_id, "train/loss")]
    assert steps == list(range(1, 61))
