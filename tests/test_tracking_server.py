"""A real `mlflow server` on 127.0.0.1 that goes away in the middle of a run and comes back."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from ampgan.training.parallel import free_port
from tests.test_resume import journal_step, run_folder, start


def start_server(folder: Path, port: int) -> subprocess.Popen:
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}",
           "--artifacts-destination", str(folder / "artifacts"), "--host", "127.0.0.1", "--port", str(port),
           "--workers", "1"]
    proc = subprocess.Popen(cmd, env=env, cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).status == 200:
                return proc
        except OSError:
            time.sleep(0.5)
    stop_server(proc)
    raise RuntimeError("mlflow server did not come up")


def stop_server(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


@pytest.mark.slow  # `make test-full` (CI's 30 minutes on a slow machine)
def test_server_stopped_mid_run_and_restarted_loses_no_metric(tmp_path):
    from mlflow.tracking import MlflowClient

    store, outputs = tmp_path / "server", tmp_path / "out"
    store.mkdir()
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    server = start_server(store, port)
    steps, every = 4000, 5
    try:
        proc = start("model=classifier", "data=gaussians8", "trainer=smoke", f"trainer.max_steps={steps}",
                     f"trainer.log_every={every}", "trainer.print_every=100000", "trainer.print_seconds=0",
                     "trainer.eval_every=0", "trainer.layer_health_every=0", "tracking.flush_every=20",
                     f"tracking.uri={uri}", outputs=outputs)
        deadline = time.time() + 240
        while journal_step(outputs) < 20 and time.time() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert journal_step(outputs) >= 20, "the run never started logging"
        stop_server(server)
        time.sleep(3)
        gap_start = journal_step(outputs)
        server = start_server(store, port)
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
        assert gap_start < steps, "the server was down too late to test anything"
        client = MlflowClient(uri)
        run = client.search_runs([client.get_experiment_by_name("ampgan").experiment_id])[0]
        assert run.info.status == "FINISHED"
        history = sorted(m.step for m in client.get_metric_history(run.info.run_id, "train/loss"))
        # every logged step once, none lost, none twice: the first step's line, training's start (2), the log steps
        assert history == [1, 2] + list(range(every, steps + 1, every))
        assert run.data.tags.get("ampgan.tracking_gap") == "true"
        assert (run_folder(outputs) / "metrics.jsonl").exists()
    finally:
        stop_server(server)
