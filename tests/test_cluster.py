"""A real single-node SLURM (slurm-wlm + munge) and a PostgreSQL-backed `mlflow server`, started and stopped here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from devtools.services import Cluster, Server, _alive
from tests.conftest import ROOT


@pytest.fixture
def services(tmp_path):
    server, cluster = Server(tmp_path / "server"), Cluster(tmp_path / "cluster")
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


def submit(*args: str, cluster: Cluster, outputs: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, **cluster.env(), "AMPGAN_OUTPUTS": str(outputs), "GLOG_v": "3"}
    return subprocess.run([sys.executable, "-m", "ampgan.train", "-m", "hydra/launcher=slurm", *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=900)


def test_slurm_sweep_logs_to_postgres_backed_server(services, tmp_path):
    from mlflow.tracking import MlflowClient

    from ampgan.reporting.report import PARENT_TAG

    server, cluster = services
    outputs = tmp_path / "out"
    done = submit("trainer=smoke", "trainer.layer_health_every=0", f"tracking.uri={server.uri}",
                  "scaler=fixed_clip", "scaler.clip_norm=0.5,1,2,4", "hydra.launcher.array_parallelism=2",
                  cluster=cluster, outputs=outputs)
    assert done.returncode == 0, done.stderr[-3000:]
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


def test_slurm_sweep_refuses_a_sqlite_store(tmp_path):
    env = {**os.environ, "AMPGAN_OUTPUTS": str(tmp_path), "GLOG_v": "3"}
    done = subprocess.run([sys.executable, "-m", "ampgan.train", "-m", "hydra/launcher=slurm", "trainer=smoke",
                           "trainer.seed=0,1"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert done.stderr.startswith("ampgan: error: hydra/launcher=slurm: cluster jobs log to a tracking server")
