"""The dashboard: `python -m ampgan.tracking ui` serves MLflow's UI on the embedded store."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from ampgan.config.schema import outputs_dir
from ampgan.tracking.tracker import default_artifact_root, ensure_experiment


def training_view(host: str, port: int, experiment_id: str) -> str:
    """The page `make ui` opens on: the runs table of an experiment, in MLflow's training view."""
    return f"http://{host}:{port}/#/experiments/{experiment_id}/runs?workflowType=machine_learning"


def main(argv: list[str]) -> int:
    """`python -m ampgan.tracking ui [--port P] [--host H]`: serve the dashboard on the embedded store."""
    parser = argparse.ArgumentParser(prog="python -m ampgan.tracking ui",
                                     description="Serve the MLflow dashboard on the embedded store.")
    parser.add_argument("--port", type=int, default=5000)
    parser.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args(argv)
    db = outputs_dir() / "mlflow.db"
    db.parent.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{db}"
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp_id = ensure_experiment(client, "ampgan", default_artifact_root(uri))  # creates the store
    for exp in client.search_experiments():  # every experiment of the store opens in the training view
        ensure_experiment(client, exp.name, None)
    print(f"MLflow dashboard on http://{args.host}:{args.port}  (store: {db}; Ctrl-C stops)\n"
          f"ampgan's runs: {training_view(args.host, args.port, exp_id)}", flush=True)
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri,
           "--host", args.host, "--port", str(args.port), "--workers", "1"]
    try:
        return subprocess.call(cmd, env=env)
    except KeyboardInterrupt:
        return 0
