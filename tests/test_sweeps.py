"""Sweeps beyond one process: parallel workers, progress lines, `ampgan.sweep status|resume`.

Real subprocesses, a real sqlite store in tmp_path; the sweeps are small (trainer=smoke).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_cli, store_uri

SMOKE = ["trainer=smoke", "trainer.layer_health_every=0"]


def sweep_runs(outputs: Path):
    """(client, job runs of the store; a sweep's parent run left out)."""
    from mlflow.tracking import MlflowClient

    from ampgan.reporting.sweep_report import PARENT_TAG

    client = MlflowClient(store_uri(outputs))
    exp = client.get_experiment_by_name("ampgan")
    runs = client.search_runs([exp.experiment_id], max_results=1000) if exp else []
    return client, [r for r in runs if PARENT_TAG not in r.data.tags]


def sweep_cli(*args: str, outputs: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    """`python -m ampgan.sweep ...`; on a timeout its whole process group (the sweep's workers) is killed."""
    env = {**os.environ, "AMPGAN_OUTPUTS": str(outputs), "GLOG_v": "3"}
    proc = subprocess.Popen([sys.executable, "-m", "ampgan.sweep", *args], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"ampgan.sweep {' '.join(args)}: no answer within {timeout}s\n{err[-3000:]}") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.slow  # `make test-full` (CI's 30 minutes on a slow machine)
def test_parallel_clip_sweep_six_runs_one_sweep_with_progress_lines(outputs):
    done = run_cli("-m", "hydra/launcher=parallel", *SMOKE, "scaler=fixed_clip",
                   "scaler.clip_norm=0.25,0.5,1,2,4,8", outputs=outputs)
    assert done.returncode == 0, done.stderr[-3000:]
    client, runs = sweep_runs(outputs)
    assert len(runs) == 6 and {r.info.status for r in runs} == {"FINISHED"}
    assert len({r.data.tags["sweep_id"] for r in runs}) == 1
    assert sorted(float(r.data.params["scaler.clip_norm"]) for r in runs) == [0.25, 0.5, 1, 2, 4, 8]
    pids = {r.data.tags["ampgan.pid"] for r in runs}
    assert len(pids) == 2, pids  # two worker processes, each running several jobs
    assert {r.data.params["hardware.threads"] for r in runs} == {str(max(1, (os.cpu_count() or 1) // 2))}
    for run in runs:  # all their metrics: every step's losses and the final evaluation
        steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, "critic/loss"))
        assert steps == list(range(1, 7))
        assert {"eval/swd", "eval/modes_covered", "train/steps"} <= set(run.data.metrics)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("[sweep] job ")]
    assert len(lines) == 6 and all(" FINISHED in " in ln and "objective " in ln for ln in lines), done.stdout[-3000:]
    assert {ln.split("scaler.clip_norm=")[1].split()[0] for ln in lines} == {"0.25", "0.5", "1", "2", "4", "8"}


@pytest.mark.slow  # `make test-full`; the fast suite runs parallel sweeps above and below, and checks presets' sweeps in preflight
def test_preset_that_defines_its_own_sweep_runs_in_parallel(outputs):
    done = run_cli("+experiment=scaler_study", "hydra/launcher=parallel", *SMOKE, "trainer.eval_every=0",
                   outputs=outputs)
    assert done.returncode == 0, done.stderr[-3000:]
    _, runs = sweep_runs(outputs)
    assert len(runs) == 8 and {r.info.status for r in runs} == {"FINISHED"}
    assert {(r.data.tags["amp"], r.data.tags["scaler"]) for r in runs} == {
        (a, s) for a in ("O0", "O2") for s in ("none", "dynamic", "underflow_aware", "fixed_clip")}
    status = sweep_cli("status", runs[0].data.tags["sweep_id"], outputs=outputs)
    assert status.returncode == 0, status.stderr
    assert "8 jobs, 8 FINISHED" in status.stdout


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def checkpoints(outputs: Path) -> list[Path]:
    return list(outputs.glob("multirun/*/*/*/checkpoints/step-*"))


@pytest.mark.slow  # `make test-full` (CI's time): a SIGKILLed sweep; test_resume's sweep and SIGKILL tests stay
def test_killed_sweep_resumes_every_job_once(outputs):
    """The launching process and its running jobs are SIGKILLed mid-sweep; `resume` finishes the rest.

    Three classifier jobs on two workers: the two running ones are killed with a checkpoint each
    (resume continues them), the third never started (resume runs it, in a worker that has just
    continued a killed job).
    """
    from mlflow.tracking import MlflowClient

    from ampgan.reporting.sweep_report import PARENT_TAG

    env = {**os.environ, "AMPGAN_OUTPUTS": str(outputs), "GLOG_v": "3"}
    args = ["-m", "hydra/launcher=parallel", "model=classifier", "data=digits", *SMOKE, "trainer.max_steps=40",
            "trainer.eval_every=0", "trainer.checkpoint_every=4", "trainer.log_every=4", "trainer.print_every=20",
            "trainer.seed=0,1,2"]
    proc = subprocess.Popen([sys.executable, "-m", "ampgan.train", *args], cwd=ROOT, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:  # both running jobs have a checkpoint: kill the launcher and every worker (the jobs mid-run) at once
        wait_for(lambda: len({p.parents[1] for p in checkpoints(outputs)}) >= 2 or proc.poll() is not None, 300,
                 "a checkpoint in two jobs")
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    sweep_id = next(outputs.glob("multirun/*/*")).name
    before = sweep_cli("status", sweep_id, outputs=outputs)
    assert before.returncode == 0, before.stderr
    assert "3 jobs" in before.stdout and "continue" in before.stdout, before.stdout  # a killed job has a checkpoint
    _, runs = sweep_runs(outputs)
    assert runs and "RUNNING" not in {r.info.status for r in runs}  # status ended the lost runs
    lost = {r.info.run_id for r in runs if r.info.status == "FAILED" and "process lost" in r.data.tags.get("error", "")}
    assert lost

    resumed = sweep_cli("resume", sweep_id, outputs=outputs)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    client, runs = sweep_runs(outputs)
    assert len(runs) == 3, [(r.data.tags.get("overrides"), r.info.status) for r in runs]
    assert {r.info.status for r in runs} == {"FINISHED"}
    assert sorted(r.data.params["trainer.seed"] for r in runs) == ["0", "1", "2"]
    assert sorted(r.data.tags["job_num"] for r in runs) == ["0", "1", "2"]
    continued = {r.info.run_id for r in runs if "ampgan.resumed_from_step" in r.data.tags}
    assert continued and continued <= lost  # killed runs went on in their own MLflow runs
    for run in runs:  # every logged step once: nothing lost, nothing twice
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")]
        assert len(steps) == len(set(steps)) and max(steps) == 40, run.info.run_id
        assert run.data.metrics["train/steps"] == 40
    # one parent run for the sweep, reopened by the resume (not a second one), ended FINISHED
    exp = MlflowClient(store_uri(outputs)).get_experiment_by_name("ampgan")
    parents = [r for r in client.search_runs([exp.experiment_id]) if PARENT_TAG in r.data.tags]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED", [(p.info.run_id, p.info.status) for p in parents]
    assert {r.data.tags["mlflow.parentRunId"] for r in runs} == {parents[0].info.run_id}
    again = sweep_cli("resume", sweep_id, outputs=outputs)
    assert again.returncode == 0 and "nothing to do" in again.stdout


JOB_AFTER_AN_EDIT = textwrap.dedent("""
    import sys
    import numpy as np
    import mindspore as ms
    import ampgan.training.entry
    import ampgan.models.classifier as mod
    ms.set_context(mode=ms.PYNATIVE_MODE)
    pin = ampgan.training.entry._pin_sources if sys.argv[1] == "pin" else (lambda: None)

    def make(net):
        def step(x):
            return net(x)
        return ms.jit(step)

    x = ms.Tensor(np.zeros((4, 1, 8, 8), np.float32))
    pin()  # the first job of a worker
    make(mod.Classifier((1, 8, 8), 10, width=8))(x)
    with open(mod.__file__) as f:
        source = f.read()
    with open(mod.__file__, "w") as f:  # another developer edits the file while the worker lives
        f.write("# edited\\n" * 22 + source)
    pin()  # the worker's next job
    print("next job:", make(mod.Classifier((1, 8, 8), 10, width=8))(x).shape)
""")


def test_a_worker_compiles_the_code_it_imported(tmp_path):
    """ms.jit reads a function's source file each time it compiles: a worker's next job must not parse a
    file edited since the worker imported it (old line numbers, wrong lines: the cause of a resumed sweep's
    "Miss argument input for parameter: n_classes"). Every job pins ampgan's imported source first."""
    copy = tmp_path / "src"
    shutil.copytree(ROOT / "ampgan", copy / "ampgan", ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "job.py").write_text(JOB_AFTER_AN_EDIT)
    env = {**os.environ, "GLOG_v": "3", "PYTHONPATH": str(copy)}
    for mode in ("pin", "no-pin"):
        shutil.copy(ROOT / "ampgan/models/classifier.py", copy / "ampgan/models/classifier.py")
        done = subprocess.run([sys.executable, str(copy / "job.py"), mode], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)
        if mode == "pin":
            assert done.returncode == 0 and "next job: (4, 10)" in done.stdout, done.stderr[-3000:]
        else:  # the failure this guards against, without the pin
            assert done.returncode != 0 and "next job" not in done.stdout, done.stdout
