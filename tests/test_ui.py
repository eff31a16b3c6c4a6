"""`make ui`: a real MLflow server on 127.0.0.1 over the embedded store shows ampgan's runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

from ampgan.training.entry import train
from ampgan.training.parallel import free_port
from tests.conftest import ROOT, compose_cfg


def test_ui_serves_the_embedded_store(outputs, tmp_path):
    train(compose_cfg("model=classifier", "data=digits", "trainer=smoke"), run_dir=tmp_path / "run")
    port = free_port()
    env = {**os.environ, "AMPGAN_OUTPUTS": str(outputs)}
    proc = subprocess.Popen([sys.executable, "-m", "ampgan.tracking", "ui", "--port", str(port)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        base = f"http://127.0.0.1:{port}"
        body = None
        deadline = time.time() + 90
        while time.time() < deadline and proc.poll() is None:
            try:
                exp = json.load(urllib.request.urlopen(
                    f"{base}/api/2.0/mlflow/experiments/get-by-name?experiment_name=ampgan", timeout=5))
                req = urllib.request.Request(f"{base}/api/2.0/mlflow/runs/search", method="POST",
                                             data=json.dumps({"experiment_ids": [exp["experiment"]["experiment_id"]]}).encode(),
                                             headers={"Content-Type": "application/json"})
                body = json.load(urllib.request.urlopen(req, timeout=5))
                break
            except OSError:
                time.sleep(1)
        assert body is not None, "the server did not answer"
        runs = body["runs"]
        assert len(runs) == 1 and runs[0]["info"]["status"] == "FINISHED"
        assert urllib.request.urlopen(f"{base}/", timeout=5).status == 200
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
