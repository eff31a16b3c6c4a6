"""Tracking: the trainer hands metrics to a tracker and never imports MLflow itself.

`MlflowTracker` talks to a store through `MlflowClient` with an explicit run id (no global
active run, so sweep workers that run several jobs cannot mix runs up). Metrics are
buffered and sent with `log_batch`; `finish()` flushes them and sets the final status.
`python -m ampgan.tracking ui` serves the dashboard on the embedded store.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ampgan.config import outputs_dir

log = logging.getLogger(__name__)

MAX_PARAM_VALUE = 6000   # MLflow cuts longer param values
MAX_KEY = 250            # longer keys raise
BATCH_METRICS = 1000     # log_batch limits per request
BATCH_PARAMS = 100


class NullTracker:
    """`tracking=none`: keeps nothing, costs nothing."""

    run_id: str | None = None

    def start(self, run_name: str, params: dict[str, Any], tags: dict[str, str]) -> None: ...
    def log_metrics(self, metrics: dict[str, float], step: int) -> None: ...
    def log_artifact(self, path: Path, subdir: str | None = None) -> None: ...
    def set_tags(self, tags: dict[str, str]) -> None: ...
    def finish(self, status: str = "FINISHED", error: str | None = None) -> None: ...


def default_artifact_root(uri: str) -> str | None:
    """Artifacts of a local sqlite store live beside the database file (not in the cwd)."""
    if uri.startswith("sqlite:///"):
        return (Path(uri[len("sqlite:///"):]).parent / "mlartifacts").resolve().as_uri()
    return None


class MlflowTracker:
    def __init__(self, uri: str, experiment: str, flush_every: int = 500):
        from mlflow.tracking import MlflowClient

        if uri.startswith("sqlite:///"):
            Path(uri[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
        self.uri = uri
        self.client = MlflowClient(tracking_uri=uri)
        self.experiment_id = ensure_experiment(self.client, experiment, default_artifact_root(uri))
        self.flush_every = flush_every
        self.run_id: str | None = None
        self._buffer: list = []

    def start(self, run_name: str, params: dict[str, Any], tags: dict[str, str]) -> None:
        from mlflow.entities import Param

        run = self.client.create_run(self.experiment_id, run_name=run_name, tags=tags)
        self.run_id = run.info.run_id
        items = [Param(k[:MAX_KEY], str(v)[:MAX_PARAM_VALUE]) for k, v in params.items()]
        for i in range(0, len(items), BATCH_PARAMS):
            self.client.log_batch(self.run_id, params=items[i : i + BATCH_PARAMS])

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self._buffer.extend(Metric(k[:MAX_KEY], float(v), now, step) for k, v in metrics.items())
        if len(self._buffer) >= self.flush_every:
            self.flush()

    def flush(self) -> None:
        while self._buffer:
            chunk = self._buffer[:BATCH_METRICS]
            self.client.log_batch(self.run_id, metrics=chunk)
            del self._buffer[: len(chunk)]

    def log_artifact(self, path: Path, subdir: str | None = None) -> None:
        if Path(path).is_dir():
            self.client.log_artifacts(self.run_id, str(path), subdir)
        else:
            self.client.log_artifact(self.run_id, str(path), subdir)

    def set_tags(self, tags: dict[str, str]) -> None:
        for k, v in tags.items():
            self.client.set_tag(self.run_id, k, str(v)[:5000])

    def finish(self, status: str = "FINISHED", error: str | None = None) -> None:
        """Flush what is buffered, record the error, set the final status: never left RUNNING."""
        if self.run_id is None:
            return
        try:
            self.flush()
            if error:
                self.client.set_tag(self.run_id, "error", error[:5000])
        finally:
            self.client.set_terminated(self.run_id, status=status)


def ensure_experiment(client, name: str, artifact_root: str | None) -> str:
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    try:
        return client.create_experiment(name, artifact_location=artifact_root)
    except Exception:  # created meanwhile by a parallel job
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


def build_tracker(cfg):
    """`cfg` is a validated TrackingConfig."""
    if cfg.backend == "none":
        return NullTracker()
    return MlflowTracker(cfg.uri, cfg.experiment, cfg.flush_every)


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists stay whole values."""
    out: dict[str, Any] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: d}


def _ui(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m ampgan.tracking ui",
                                     description="Serve the MLflow dashboard on the embedded store.")
    parser.add_argument("--port", type=int, default=5000)
    parser.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args(argv)
    db = outputs_dir() / "mlflow.db"
    db.parent.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{db}"
    from mlflow.tracking import MlflowClient

    ensure_experiment(MlflowClient(uri), "ampgan", default_artifact_root(uri))  # creates the store
    print(f"MLflow dashboard on http://{args.host}:{args.port}  (store: {db}; Ctrl-C stops)", flush=True)
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri,
           "--host", args.host, "--port", str(args.port), "--workers", "1"]
    try:
        return subprocess.call(cmd, env=env)
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] != "ui":
        print("usage: python -m ampgan.tracking ui [--port P] [--host H]", file=sys.stderr)
        sys.exit(2)
    sys.exit(_ui(sys.argv[2:]))
