"""Tracking: the trainer hands metrics to a tracker and never imports MLflow itself.

`MlflowTracker` talks to a store through `MlflowClient` with an explicit run id (no global
active run, so sweep workers that run several jobs cannot mix runs up). Metrics are
buffered and sent with `log_batch`; `finish()` flushes them and sets the final status.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any

from ampgan import AmpganError, one_line

log = logging.getLogger(__name__)

BATCH_METRICS = 1000     # log_batch limits per request
BATCH_PARAMS = 100
JOURNAL = "metrics.jsonl"        # every metric, appended before it is sent
JOURNAL_SENT = "metrics.sent"    # how many journal lines the store has confirmed
RUN_RECORD = "tracking.json"     # where the run lives: store URI, experiment, run id
RETRY_SECONDS = 10.0             # after a failed send, wait this long before trying again
OBJECTIVE_TAG = "ampgan.objective"   # a run's tags: the metric its task optimises ...
DIRECTION_TAG = "ampgan.direction"   # ... and whether to minimize or maximize it
MAX_KEY_LENGTH = 250             # MLflow's MAX_ENTITY_KEY_LENGTH (a test checks), known without importing MLflow


def mlflow_key(key: str) -> str:
    """A key MLflow accepts (<= 250 chars); a longer one is cut and keeps a hash of the whole."""
    if len(key) <= MAX_KEY_LENGTH:
        return key
    digest = hashlib.sha1(key.encode()).hexdigest()[:10]
    return f"{key[: MAX_KEY_LENGTH - 12]}~{digest}"


def mlflow_value(value: Any, limit: int) -> str:
    """A param/tag value MLflow accepts: longer text is cut and says so (the full config is an artifact)."""
    text = str(value)
    if len(text) <= limit:
        return text
    marker = f"...[cut: {len(text)} chars]"
    return text[: limit - len(marker)] + marker


class NullTracker:
    """`tracking=none`: keeps nothing, costs nothing."""

    run_id: str | None = None

    def start(self, run_name: str, params: dict[str, Any], tags: dict[str, str], resume_run_id: str | None = None) -> None: ...
    def log_metrics(self, metrics: dict[str, float], step: int) -> None: ...
    def log_artifact(self, path: Path, subdir: str | None = None) -> None: ...
    def log_image(self, path: Path, key: str, step: int) -> None: ...
    def set_tags(self, tags: dict[str, str]) -> None: ...
    def finish(self, status: str = "FINISHED", error: str | None = None) -> None: ...
    def first_step_done(self) -> None: ...


def store_failure(uri: str, err: BaseException) -> str:
    """The one line that says a store could not be opened or refused the run."""
    return f"tracking store {uri}: " + one_line(f"{type(err).__name__}: {err}")


def default_artifact_root(uri: str) -> str | None:
    """Artifacts of a local sqlite store live beside the database file (not in the cwd)."""
    if uri.startswith("sqlite:///"):
        return (Path(uri[len("sqlite:///"):]).parent / "mlartifacts").resolve().as_uri()
    return None


def make_client(uri: str):
    """An MlflowClient that fails fast on an unreachable server (the journal keeps what it could not send)."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    from mlflow.tracking import MlflowClient

    if uri.startswith("sqlite:///"):
        Path(uri[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
    return MlflowClient(tracking_uri=uri)


class Journal:
    """Metrics appended to a local file before they are sent: a hard kill loses nothing written here.

    One JSON line per metric: {"k": key, "v": value, "s": step, "t": ms timestamp}; a final
    {"end": status, "error": ...} line records how the run ended. `metrics.sent` holds the number
    of lines the store has confirmed, so `ampgan.sync` knows where to resume sending.
    """

    def __init__(self, folder: Path):
        folder.mkdir(parents=True, exist_ok=True)
        self.path, self.sent_path = folder / JOURNAL, folder / JOURNAL_SENT
        self.lines = sum(1 for _ in self.path.open()) if self.path.exists() else 0
        self._file = self.path.open("a", encoding="utf-8")

    def append(self, records: list[dict]) -> None:
        self._file.write("".join(json.dumps(r, allow_nan=True) + "\n" for r in records))
        self._file.flush()  # in the OS's hands: survives the process being killed
        self.lines += len(records)

    def mark_sent(self, lines: int) -> None:
        write_atomic(self.sent_path, str(lines))

    def close(self) -> None:
        self._file.close()


def read_journal(folder: Path) -> tuple[list[dict], int]:
    """(all records, number confirmed sent) of a run folder's journal."""
    path, sent = folder / JOURNAL, folder / JOURNAL_SENT
    records = []
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut by a hard kill
                break
    return records, int(sent.read_text()) if sent.exists() else 0


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class MlflowTracker:
    """Talks to one MLflow store with an explicit run id; journals metrics when given a run folder.

    A failed send (server unreachable) does not stop training: metrics stay buffered and in the
    journal, the run is tagged `ampgan.tracking_gap`, and sending resumes when the store answers.
    """

    def __init__(self, uri: str, experiment: str, flush_every: int = 500, run_dir: Path | None = None,
                 heartbeat_seconds: float = 30.0, owner: tuple[int, float] | None = None):
        """`owner`: (pid, start time) of the training process, when it is not this one (a helper's tracker)."""
        self.uri = uri
        self.owner = owner or this_process()
        self.client = make_client(uri)
        self.experiment_name = experiment
        self.experiment_id = ensure_experiment(self.client, experiment, default_artifact_root(uri))
        self.flush_every = flush_every
        self.run_dir = Path(run_dir) if run_dir else None
        self.heartbeat_seconds = heartbeat_seconds
        self.run_id: str | None = None
        self._buffer: list = []
        self._journal: Journal | None = None
        self._skip: dict[str, int] = {}      # key -> last step already in the store (a resumed run)
        self._offline_since: float | None = None
        self._last_beat = 0.0

    def start(self, run_name: str, params: dict[str, Any], tags: dict[str, str], resume_run_id: str | None = None) -> None:
        """Create the run (or reopen `resume_run_id`), record where it lives, log params and tags."""
        from mlflow.entities import Param, RunTag
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH, MAX_TAG_VAL_LENGTH

        liveness = {"ampgan.host": socket.gethostname(), "ampgan.pid": str(self.owner[0]),
                    "ampgan.pid_started": f"{self.owner[1]:.3f}",
                    "ampgan.heartbeat_seconds": str(self.heartbeat_seconds), "ampgan.heartbeat": _now_iso()}
        if resume_run_id:
            self.run_id = resume_run_id
            self.client.update_run(resume_run_id, status="RUNNING")
            params = {}  # recorded when the run began; re-logging a param with another value raises
        else:
            self.run_id = self.client.create_run(self.experiment_id, run_name=run_name).info.run_id
        if self.run_dir is not None:
            write_atomic(self.run_dir / RUN_RECORD, json.dumps(
                {"uri": self.uri, "experiment": self.experiment_name, "run_id": self.run_id}))
            self._journal = self._open_journal()
            if resume_run_id:
                self._skip = last_steps(read_journal(self.run_dir)[0])
        items = [Param(mlflow_key(k), mlflow_value(v, MAX_PARAM_VAL_LENGTH)) for k, v in params.items()]
        tag_items = [RunTag(mlflow_key(k), mlflow_value(v, MAX_TAG_VAL_LENGTH)) for k, v in {**tags, **liveness}.items()]
        for i in range(0, max(len(items), len(tag_items)), BATCH_PARAMS):
            self.client.log_batch(self.run_id, params=items[i : i + BATCH_PARAMS], tags=tag_items[i : i + BATCH_PARAMS])
        self._last_beat = time.monotonic()

    def _open_journal(self):
        return Journal(self.run_dir)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        fresh = {mlflow_key(k): float(v) for k, v in metrics.items() if step > self._skip.get(mlflow_key(k), -1)}
        if not fresh:
            return
        if self._journal is not None:
            self._journal.append([{"k": k, "v": v, "s": step, "t": now} for k, v in fresh.items()])
        self._buffer.extend(Metric(k, v, now, step) for k, v in fresh.items())
        if len(self._buffer) >= self.flush_every:
            self.flush(required=False)
        if time.monotonic() - self._last_beat > self.heartbeat_seconds:
            self.heartbeat()

    def heartbeat(self) -> None:
        """Tell the store this process is alive (another host judges a lost run by this tag's age)."""
        self._last_beat = time.monotonic()
        self._try(lambda: self.client.set_tag(self.run_id, "ampgan.heartbeat", _now_iso()))

    def flush(self, required: bool = True) -> bool:
        """Send what is buffered; True when the store has it all. An unreachable store is retried later."""
        if not required and self._offline_since and time.monotonic() - self._offline_since < RETRY_SECONDS:
            return False
        while self._buffer:
            chunk = self._buffer[:BATCH_METRICS]
            if not self._try(lambda: self.client.log_batch(self.run_id, metrics=chunk)):
                return False
            del self._buffer[: len(chunk)]
        if self._journal is not None:
            self._journal.mark_sent(self._journal.lines)
        return True

    def _try(self, send) -> bool:
        try:
            send()
        except Exception as err:  # noqa: BLE001 - any transport or store error: keep training, keep the data
            if self._offline_since is None:
                log.warning(f"tracking store unreachable ({type(err).__name__}: {str(err).splitlines()[0][:200]}); "
                            f"training goes on, metrics are kept in the run folder's journal")
            self._offline_since = time.monotonic()
            return False
        if self._offline_since is not None:
            self._offline_since = None
            log.warning("tracking store reachable again; sending the metrics it missed")
            self.client.set_tag(self.run_id, "ampgan.tracking_gap", "true")
        return True

    def log_artifact(self, path: Path, subdir: str | None = None) -> None:
        if Path(path).is_dir():
            self._try(lambda: self.client.log_artifacts(self.run_id, str(path), subdir))
        else:
            self._try(lambda: self.client.log_artifact(self.run_id, str(path), subdir))

    def log_image(self, path: Path, key: str, step: int) -> None:
        """One picture of a sequence (`key`, at `step`): MLflow's image view steps through them."""
        from PIL import Image

        with Image.open(path) as img:
            picture = img.convert("RGB")
        self._try(lambda: self.client.log_image(self.run_id, picture, key=key, step=step))

    def set_tags(self, tags: dict[str, str]) -> None:
        from mlflow.entities import RunTag
        from mlflow.utils.validation import MAX_TAG_VAL_LENGTH

        items = [RunTag(mlflow_key(k), mlflow_value(v, MAX_TAG_VAL_LENGTH)) for k, v in tags.items()]
        self._try(lambda: self.client.log_batch(self.run_id, tags=items))

    def first_step_done(self) -> None:
        """Nothing held back for the compile: the store is open."""

    def finish(self, status: str = "FINISHED", error: str | None = None) -> None:
        """Flush, record the error, set the final status: never left RUNNING while the store answers.

        If the store cannot be reached, the end is written to the journal and `python -m ampgan.sync`
        (or the next run on this store) delivers it with the missing metrics.
        """
        if self.run_id is None:
            return
        if self._journal is not None:
            self._journal.append([{"end": status, "error": error}])
        delivered = False
        for attempt in range(3):
            if self.flush() and (not error or self._try(lambda: self.client.set_tag(self.run_id, "error", error[:5000]))):
                delivered = self._try(lambda: self.client.set_terminated(self.run_id, status=status))
            if delivered:
                break
            time.sleep(2.0 * (attempt + 1))
        if self._journal is not None:
            if delivered:
                self._journal.mark_sent(self._journal.lines)
            self._journal.close()
        if not delivered:
            where = f" {self.run_dir}" if self.run_dir else ""
            log.error(f"tracking store unreachable at the end of run {self.run_id}: "
                      f"deliver the rest with `python -m ampgan.sync{where}`")


def last_steps(records: list[dict]) -> dict[str, int]:
    """Per metric key, the last step a journal holds."""
    out: dict[str, int] = {}
    for r in records:
        if "k" in r:
            out[r["k"]] = max(out.get(r["k"], -1), int(r["s"]))
    return out


def _now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def this_process() -> tuple[int, float]:
    """(pid, start time) of this process, as a run's liveness tags record it and `sync.process_alive`
    compares it (psutil's create_time: an identity, not a clock; `ampgan.process_age` is the clock)."""
    import psutil

    return os.getpid(), psutil.Process(os.getpid()).create_time()


EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")  # MLflow's UI: the training view


def ensure_experiment(client, name: str, artifact_root: str | None) -> str:
    """The id of experiment `name`, created if missing; tagged as a model-training experiment, so
    that MLflow's UI opens it in its training view (runs, charts), not the GenAI one."""
    exp = client.get_experiment_by_name(name)
    if exp is None:
        try:
            return client.create_experiment(name, artifact_location=artifact_root, tags=dict([EXPERIMENT_KIND]))
        except Exception:  # created meanwhile by a parallel job
            exp = client.get_experiment_by_name(name)
            if exp is None:
                raise
    if exp.tags.get(EXPERIMENT_KIND[0]) != EXPERIMENT_KIND[1]:  # a store made before ampgan tagged it
        client.set_experiment_tag(exp.experiment_id, *EXPERIMENT_KIND)
    return exp.experiment_id


def log_points(client, run_id: str, points: list[tuple[str, float, int]]) -> None:
    """Metrics (name, value, step) to a run in one request, stamped now."""
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    if points:
        client.log_batch(run_id, metrics=[Metric(name, float(value), now, int(step)) for name, value, step in points])


def tag_run(client, run_id: str, tags: dict[str, Any]) -> None:
    """Tags to a run in one request, each value cut to what MLflow accepts."""
    from mlflow.entities import RunTag

    client.log_batch(run_id, tags=[RunTag(key, mlflow_value(value, 5000)) for key, value in tags.items()])


def store_errors() -> tuple[type[BaseException], ...]:
    """What a store request raises for a missing run or artifact: MLflow's exception and OSError."""
    from mlflow.exceptions import MlflowException

    return (MlflowException, OSError)


def run_link(experiment_id: str, run_id: str) -> str:
    """A run's page in MLflow's UI (training view), relative to the server's address."""
    return f"#/experiments/{experiment_id}/runs/{run_id}?workflowType=machine_learning"


def build_tracker(cfg, run_dir: Path | None = None):
    """`cfg` is a validated TrackingConfig; with `run_dir`, metrics are journaled there too."""
    if cfg.backend == "none":
        return NullTracker()
    return MlflowTracker(cfg.uri, cfg.experiment, cfg.flush_every, run_dir, cfg.heartbeat_seconds)


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists stay whole values."""
    out: dict[str, Any] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: d}


def run_folder_in_store(run_id: str, tracking_uri: str) -> Path:
    """The folder of the run `run_id` in the store at `tracking_uri` (its `output_dir` tag), for `trainer.resume=<run id>`."""
    try:
        run = make_client(tracking_uri).get_run(run_id)
    except Exception:  # noqa: BLE001 - MLflow raises several kinds for an unknown id
        raise AmpganError(f"trainer.resume={run_id}: not a folder, and no run with that id in {tracking_uri}") from None
    folder = run.data.tags.get("output_dir")
    if not folder or not Path(folder).is_dir():
        raise AmpganError(f"trainer.resume={run_id}: the run's folder ({folder or 'not recorded'}) is not on this machine")
    return Path(folder)
