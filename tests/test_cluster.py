"""A real single-node SLURM (slurm-wlm + munge) and a PostgreSQL-backed `mlflow server`, started and stopped here."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from devtools.services import Cluster, Server, _alive
from tests.conftest import ROOT


# The services' state lives this deep (a user's repository can too): a Unix socket made under it
# would pass the 108 bytes a socket's path may have (slurmd's job-step sockets, PostgreSQL's own).
DEEP = "a-state-folder-as-deep-as-a-users-repository-may-put-it"


@contextlib.contextmanager
def running(server: Server, cluster: Cluster):
    """Both services started, then stopped; no process of theirs outlives the stop."""
    pids: list[int] = []
    try:
        server.start()
        pids += server.state["pids"].values()
        cluster.start()
        pids += cluster.state["pids"].values()
        yield server, cluster
    finally:
        cluster.stop()
        server.stop()
        assert not [p for p in pids if _alive(p)], "a service process outlived its stop"


@pytest.fixture
def services(tmp_path):
    with running(Server(tmp_path / DEEP / "server"), Cluster(tmp_path / DEEP / "cluster")) as both:
        yield both


def submit(*args: str, cluster: Cluster, outputs: Path, timeout: float = 900, **popen) -> subprocess.CompletedProcess:
    env = {**os.environ, **cluster.env(), "AMPGAN_OUTPUTS": str(outputs), "GLOG_v": "3"}
    return subprocess.run([sys.executable, "-m", "ampgan.train", "-m", "hydra/launcher=slurm", *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=timeout, **popen)


def sweep_process(*args: str, cluster: Cluster, outputs: Path) -> subprocess.Popen:
    env = {**os.environ, **cluster.env(), "AMPGAN_OUTPUTS": str(outputs), "GLOG_v": "3"}
    return subprocess.Popen([sys.executable, "-m", "ampgan.train", "-m", "hydra/launcher=slurm", *args], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def sacct_noise(stderr: str) -> list[str]:
    """What submitit's polls print where SLURM keeps no accounting: its warning, and sacct's own line."""
    return [ln for ln in stderr.splitlines() if "sacct" in ln or "accounting storage is disabled" in ln]


@pytest.mark.slow  # `make test-full` (CI's 30 minutes on a slow machine)
def test_slurm_sweep_logs_to_postgres_backed_server(services, tmp_path, monkeypatch):
    """Submitted held (`sbatch --hold`): the sweep says what its jobs wait for, and goes on once released.
    This SLURM keeps no accounting, so nobody asks `sacct` about the jobs, and nothing prints its noise."""
    from mlflow.tracking import MlflowClient

    from ampgan.reporting.sweep_report import PARENT_TAG
    from hydra_plugins.ampgan_sweeps.submitit_slurm import slurm_keeps_accounting

    server, cluster = services
    for key, value in cluster.env().items():
        monkeypatch.setenv(key, value)
    assert slurm_keeps_accounting() is False   # AccountingStorageType=accounting_storage/none
    outputs = tmp_path / "out"
    proc = sweep_process("trainer=smoke", "trainer.layer_health_every=0", f"tracking.uri={server.uri}",
                         "scaler=fixed_clip", "scaler.clip_norm=0.5,1,2,4", "hydra.launcher.array_parallelism=2",
                         "+hydra.launcher.additional_parameters.hold=true", cluster=cluster, outputs=outputs)
    stuck = threading.Timer(300, proc.kill)   # no line for a held job: the sweep would wait for ever
    stuck.start()
    try:
        said = []   # what the sweep prints before its jobs are released
        while not (said and said[-1].startswith("[sweep] ")) and proc.poll() is None:
            said.append(proc.stdout.readline())
        stuck.cancel()
        held = said[-1]
        assert held.startswith("[sweep] SLURM job ") and "is held (JobHeldUser)" in held, said
        release = held.split("`scontrol release ")[1].split("`")[0]
        subprocess.run(["scontrol", "release", release], env={**os.environ, **cluster.env()}, check=True, timeout=60)
        out, err = proc.communicate(timeout=900)
    finally:
        stuck.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    done = subprocess.CompletedProcess(proc.args, proc.returncode, "".join(said) + out, err)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not sacct_noise(done.stderr), sacct_noise(done.stderr)[:3]
    assert not (outputs / "mlflow.db").exists()  # nothing went to a local sqlite store
    client = MlflowClient(server.uri)
    exp = client.get_experiment_by_name("ampgan")
    runs = [r for r in client.search_runs([exp.experiment_id]) if PARENT_TAG not in r.data.tags]
    assert len(runs) == 4 and {r.info.status for r in runs} == {"FINISHED"}
    for run in runs:
        assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "critic/loss")) == list(range(1, 7))
        assert "eval/swd" in run.data.metrics
        assert client.list_artifacts(run.info.run_id, "samples")  # served artifacts, over HTTP
    slurm_jobs = list(outputs.glob("multirun/*/*/.submitit/*"))
    assert len(slurm_jobs) >= 1  # the jobs went through sbatch
    assert len([ln for ln in done.stdout.splitlines() if ln.startswith("[sweep] job ")]) == 4

    # the device is checked where the job runs: a GPU sweep is submitted from this CPU host, and fails there
    gpu = submit("trainer=smoke", "hardware=gpu", f"tracking.uri={server.uri}", "trainer.seed=0,1",
                 cluster=cluster, outputs=tmp_path / "gpu")
    assert gpu.returncode != 0
    assert "hardware=gpu: not available on this machine" in gpu.stdout + gpu.stderr


@pytest.mark.slow
def test_slurm_runs_a_two_worker_job_data_parallel(services, tmp_path):
    """`hydra/launcher=slurm hardware.workers=2`: one SLURM job, one task with 2 CPUs (cpus_per_task
    follows hardware.workers), msrun inside it starting the 2 ranks; the run FINISHED on the server,
    tracked once by rank 0, with per-rank figures; no process left. Then a long one cancelled
    (scancel): its run KILLED with a checkpoint, no process left."""
    from mlflow.tracking import MlflowClient

    from tests.test_parallel import CLASSIFIER, O2_DYNAMIC, leftover

    server, cluster = services
    outputs = tmp_path / "out"
    done = submit(*CLASSIFIER, *O2_DYNAMIC, "trainer.max_steps=8", "trainer.checkpoint_every=4", "hardware.workers=2",
                  f"tracking.uri={server.uri}", cluster=cluster, outputs=outputs)
    assert done.returncode == 0, done.stderr[-3000:]
    scripts = list(outputs.glob("multirun/*/*/.submitit/*/*_submission.sh"))
    assert len(scripts) == 1
    script = scripts[0].read_text()
    assert "#SBATCH --cpus-per-task=2" in script and "#SBATCH --ntasks-per-node=1" in script, script
    client = MlflowClient(server.uri)
    exp = client.get_experiment_by_name("ampgan")
    runs = [r for r in client.search_runs([exp.experiment_id]) if "job_num" in r.data.tags]
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    run = runs[0]
    assert run.data.params["hardware.workers"] == "2" and run.data.metrics["train/steps"] == 8
    assert [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")] == list(range(1, 9))  # once each
    for r in (0, 1):
        assert f"rank{r}/train/overflow_steps" in run.data.metrics
    folder = Path(run.data.tags["output_dir"])
    assert (folder / "parallel" / "msrun.log").exists() and (folder / "parallel" / "logs" / "worker_1.log").exists()
    assert (folder / "ranks" / "rank-1" / "checkpoints").is_dir()
    assert not (folder / "ranks" / "rank-1" / "tracking.json").exists()   # rank 1 tracked nothing
    assert not leftover(str(folder / "parallel"))

    # scancel of a running 2-worker job: SLURM signals every process of the job (ranks included); the
    # run ends KILLED with a checkpoint, the submitting process reports the job, no process is left
    env = {**os.environ, **cluster.env(), "AMPGAN_OUTPUTS": str(tmp_path / "long"), "GLOG_v": "3"}
    proc = subprocess.Popen([sys.executable, "-m", "ampgan.train", "-m", "hydra/launcher=slurm", *CLASSIFIER,
                             "trainer.max_steps=100000", "hardware.workers=2", f"tracking.uri={server.uri}",
                             "tracking.experiment=long"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline, log = time.time() + 300, None
        while time.time() < deadline and not (log and "step 10/" in log.read_text(errors="replace")):
            time.sleep(0.5)
            log = next((tmp_path / "long").glob("multirun/*/*/0/parallel/logs/worker_0.log"), None)
        assert log is not None and "step 10/" in log.read_text(errors="replace"), "the job never trained"
        subprocess.run(["scancel", "--partition", cluster.partition], env=env, check=True, timeout=60)
        out, err = proc.communicate(timeout=180)   # submitit polls the queue ever more slowly as a job runs
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode != 0 and "interrupted (SIGTERM)" in out + err, (out + err)[-3000:]
    runs = [r for r in client.search_runs([client.get_experiment_by_name("long").experiment_id])
            if "job_num" in r.data.tags]
    assert [r.info.status for r in runs] == ["KILLED"]
    folder = Path(runs[0].data.tags["output_dir"])
    assert list((folder / "checkpoints").glob("step-*"))   # written at the stop
    assert not leftover(str(folder / "parallel"))


def test_a_job_slurm_cannot_launch_ends_the_sweep_in_one_line(tmp_path):
    """slurmd cannot launch a job whose step socket's path passes 108 bytes (here: a deep spool
    folder); SLURM requeues the job held, where submitit alone would wait for it for ever. The sweep
    ends with one line, its jobs that had not started are cancelled, and its parent run is not
    left RUNNING."""
    from mlflow.tracking import MlflowClient

    from ampgan.reporting.sweep_report import PARENT_TAG

    spool_root = tmp_path / ("s" * 110)
    spool_root.mkdir()
    with running(Server(tmp_path / "server"), Cluster(tmp_path / "cluster", spool_root=spool_root)) as (server, cluster):
        # started as in the background of a script (`... &`), which ignores SIGINT
        done = submit("trainer=smoke", f"tracking.uri={server.uri}", "trainer.seed=0,1,2",
                      cluster=cluster, outputs=tmp_path / "out", timeout=300,   # it would wait for ever
                      preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
        queue = subprocess.run(["squeue", "-h", "-o", "%i %T %r"], env={**os.environ, **cluster.env()},
                               capture_output=True, text=True, timeout=60)
        client = MlflowClient(server.uri)
        runs = client.search_runs([client.get_experiment_by_name("ampgan").experiment_id])
    assert done.returncode == 1, (done.stdout + done.stderr)[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ampgan: error: SLURM could not launch job ") and "launch failed requeued held" in last, last
    assert "jobs that had not started were cancelled" in last
    assert not sacct_noise(done.stderr), sacct_noise(done.stderr)[:3]
    assert queue.returncode == 0 and queue.stdout.strip() == "", queue.stdout   # nothing left held in the queue
    parents = [r for r in runs if PARENT_TAG in r.data.tags]
    assert len(parents) == 1 and parents[0].info.status == "FAILED"
    assert not [r for r in runs if r.info.status == "RUNNING"]


def test_a_two_worker_slurm_job_needs_one_task_with_two_cpus(tmp_path):
    env = {**os.environ, "AMPGAN_OUTPUTS": str(tmp_path), "GLOG_v": "3"}
    for bad, said in (("hydra.launcher.cpus_per_task=1", "add hydra.launcher.cpus_per_task=2"),
                      ("hydra.launcher.tasks_per_node=2", "leave tasks_per_node at 1")):
        done = subprocess.run([sys.executable, "-m", "ampgan.train", "-m", "hydra/launcher=slurm", "trainer=smoke",
                               "hardware.workers=2", "tracking.uri=http://127.0.0.1:9", bad], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        assert done.stderr.startswith("ampgan: error: ") and said in done.stderr, done.stderr


def test_slurm_sweep_refuses_a_sqlite_store(tmp_path):
    env = {**os.environ, "AMPGAN_OUTPUTS": str(tmp_path), "GLOG_v": "3"}
    done = subprocess.run([sys.executable, "-m", "ampgan.train", "-m", "hydra/launcher=slurm", "trainer=smoke",
                           "trainer.seed=0,1"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert done.stderr.startswith("ampgan: error: hydra/launcher=slurm: cluster jobs log to a tracking server")
