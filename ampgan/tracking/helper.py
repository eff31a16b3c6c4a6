"""The tracker of a run in a helper process, so that opening the store overlaps the training.

Importing MLflow and opening its store take about 2 s of one core. In the training process they
cannot overlap the compile or the steps, since all of them hold Python's GIL. A helper process
(`python -m ampgan.tracking.helper`, started by `BackgroundTracker`) does them on the other core;
the trainer never imports MLflow.

    trainer (BackgroundTracker)                    helper (an MlflowTracker)
    journal the metrics, then hand them over  ->   import MLflow, open the store, end lost runs,
    (one JSON line each on the helper's stdin)     create the run, send metrics in batches,
                                              <-   the run id, its warnings as log lines, the end

The helper holds the store back while the trainer compiles its first step: it takes the run's
start, then waits for the trainer's "go" (sent when the first step is done, when the run id is
asked for, or with the run's end) before it imports MLflow, at most HOLD_SECONDS. Beside the
compile, its import and the store's opening cost the first step 0.1-0.2 s on a 2-core machine
(measured cold, paired rounds); after it, they overlap the next steps, and the whole command
takes as long. A compile longer than HOLD_SECONDS still shows its run in the store early.

The journal (`metrics.jsonl`) stays with the trainer: a metric is in the run folder before it is
handed over, so a hard kill of either process loses nothing that `python -m ampgan.sync` (or the
next run on the store) cannot deliver. The helper marks what the store confirmed (`metrics.sent`).
When the trainer dies, the helper reads the end of its input and exits; the run stays RUNNING
until sync or the next run ends it, as for a run tracked in process. A store that fails the
start (unreachable, refused) raises AmpganError at the trainer's next tracker call.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ampgan import AmpganError, frozen_imports, process_age, report_error
from ampgan.tracking.tracker import (JOURNAL, JOURNAL_SENT, Journal, MlflowTracker, mlflow_key, store_failure,
                             this_process, write_atomic)

log = logging.getLogger("ampgan.tracking")

HELPER_EXIT_SECONDS = 30.0  # after the end is delivered, how long the helper may take to exit
HOLD_SECONDS = 10.0  # how long the helper holds the store back for the trainer's first step at most


class BackgroundTracker:
    """MlflowTracker's interface for one new run; the store is the helper process's business.

    Calls return at once (the helper works through them in order), except `finish`, which waits
    until the run has ended in the store, and `run_id`, which waits until the run exists.
    """

    def __init__(self, uri: str, experiment: str, flush_every: int = 500, run_dir: Path | None = None,
                 heartbeat_seconds: float = 30.0):
        self.uri, self.run_dir = uri, Path(run_dir) if run_dir else None
        setup = {"uri": uri, "experiment": experiment, "flush_every": flush_every, "heartbeat_seconds": heartbeat_seconds,
                 "run_dir": str(self.run_dir) if self.run_dir else None,
                 "owner": this_process(), "hold_seconds": HOLD_SECONDS,
                 "command_started": time.time() - process_age()}
        self._proc = subprocess.Popen([sys.executable, "-m", "ampgan.tracking.helper", json.dumps(setup)],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                      start_new_session=True)  # Ctrl-C reaches the trainer only: it ends the run
        self._replies: queue.Queue = queue.Queue()
        self._reader = threading.Thread(target=self._read, name="ampgan-tracking-helper", daemon=True)
        self._reader.start()
        self._run_id: str | None = None
        self._started = False     # start() was called
        self._released = False    # "go" was sent: the helper may open the store
        self._failed: str | None = None  # why the helper could not start the run
        self._raised = False
        self._gone = False         # the helper exited or its input broke
        self._journal: Journal | None = None

    # -- the helper's output: replies for the trainer, its warnings into the trainer's log ------
    def _read(self) -> None:
        for line in self._proc.stdout:
            try:
                msg = json.loads(line)
            except json.JSONDecodeError:
                continue
            if msg.get("op") == "log":
                log.log(int(msg["level"]), msg["text"])
            else:
                self._replies.put(msg)
        self._replies.put({"op": "exit"})

    def _reply(self, wanted: str, block: bool) -> dict | None:
        """The next reply named `wanted` (or the helper's exit); None if none has come and not `block`."""
        while True:
            try:
                msg = self._replies.get(block=block)
            except queue.Empty:
                return None
            if msg["op"] == "started":
                self._run_id = msg["run_id"]
                log.info(f"run {self._run_id} created by the tracking helper ({msg['since_start']:.1f} s after the "
                         f"command started; opening the store took {msg['seconds']:.1f} s of that)")
            elif msg["op"] == "failed":
                self._failed = msg["error"]
            elif msg["op"] == "exit":  # before the reply awaited: the helper died (a "started" came first)
                self._lost(drain=False)
            if msg["op"] == wanted or msg["op"] in ("failed", "exit"):
                return msg

    def _send(self, op: str, **fields: Any) -> None:
        if self._gone or self._failed:
            return
        try:
            self._proc.stdin.write(json.dumps({"op": op, **fields}) + "\n")
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):  # the helper is gone
            self._lost()

    def _lost(self, drain: bool = True) -> None:
        """Say once that the helper is gone; training goes on, the journal keeps every metric.
        `drain`: first read what the helper said before it died (a write found it gone)."""
        if self._gone or self._failed:
            return
        self._gone = True
        deadline = time.monotonic() + (5.0 if drain else 0.0)
        while self._run_id is None and time.monotonic() < deadline:
            # the helper may have created the run just before it died: its reply can still be on its
            # way through the reader thread (the pipe closes, the reader ends with "exit")
            try:
                msg = self._replies.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if msg["op"] == "started":
                self._run_id = msg["run_id"]
            elif msg["op"] in ("exit", "failed"):
                break
        if self._run_id is None:
            log.error(f"the tracking helper exited (code {self._proc.poll()}) before the run was created: this run "
                      f"is not tracked; its metrics stay in {JOURNAL} in the run folder")
            return
        where = f" {self.run_dir}" if self.run_dir else ""
        log.error(f"the tracking helper exited (code {self._proc.poll()}); metrics stay in the run folder's "
                  f"journal: deliver them with `python -m ampgan.sync{where}`")

    def _check(self) -> None:
        """Raise (once) if the helper could not start the run: the store refused it or is unreachable."""
        if self._run_id is None and self._started and not self._failed:
            self._reply("started", block=False)
        if self._failed and not self._raised:
            self._raised = True
            raise AmpganError(self._failed)

    # -- MlflowTracker's interface ---------------------------------------------------------------
    @property
    def run_id(self) -> str | None:
        if self._run_id is None and self._started and not (self._failed or self._gone):
            self.first_step_done()   # asked for now: the helper must not hold the store back
            self._reply("started", block=True)
        return self._run_id

    def first_step_done(self) -> None:
        """The first step is compiled and done: the helper may import MLflow and open the store."""
        if self._started and not self._released:
            self._released = True
            self._send("go")

    def start(self, run_name: str, params: dict[str, Any], tags: dict[str, str], resume_run_id: str | None = None) -> None:
        if resume_run_id:
            raise ValueError("a resumed run is tracked in process (its journal is delivered first)")
        if self.run_dir is not None:
            self._journal = Journal(self.run_dir)
        self._started = True
        self._send("start", run_name=run_name, params={k: str(v) for k, v in params.items()}, tags=tags)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self._check()
        fresh = {mlflow_key(k): float(v) for k, v in metrics.items()}
        if not fresh:
            return
        if self._journal is not None:
            now = int(time.time() * 1000)
            self._journal.append([{"k": k, "v": v, "s": step, "t": now} for k, v in fresh.items()])
        self._send("metrics", metrics=fresh, step=step, lines=self._lines())

    def log_artifact(self, path: Path, subdir: str | None = None) -> None:
        self._check()
        self._send("artifact", path=str(path), subdir=subdir)

    def log_image(self, path: Path, key: str, step: int) -> None:
        self._check()
        self._send("image", path=str(path), key=key, step=step)

    def set_tags(self, tags: dict[str, str]) -> None:
        self._check()
        self._send("tags", tags={k: str(v) for k, v in tags.items()})

    def finish(self, status: str = "FINISHED", error: str | None = None) -> None:
        """The end in the journal, then in the store (the helper retries); wait for the helper to exit."""
        if self._started and self.run_id is not None:
            if self._journal is not None:
                self._journal.append([{"end": status, "error": error}])
            self._send("finish", status=status, error=error, lines=self._lines())
            if not self._gone:
                self._reply("finished", block=True)
        self.close()
        if status == "FINISHED":   # a store that refused the run after the trainer's last call: one error
            self._check()          # (a failed or killed run keeps its own error)

    def close(self) -> None:
        """Let the helper go: end of its input, then wait for it (killed if it hangs)."""
        if self._journal is not None:
            self._journal.close()
            self._journal = None
        try:
            self._proc.stdin.close()
        except OSError:
            pass
        try:
            self._proc.wait(timeout=HELPER_EXIT_SECONDS)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._reader.join(timeout=5)
        if self._started and self._proc.returncode not in (0, None):
            self._lost()

    def _lines(self) -> int:
        return self._journal.lines if self._journal is not None else 0


class _SentMarker:
    """The helper's side of the trainer's journal: it writes no line, only how many are confirmed sent."""

    def __init__(self, folder: Path):
        self.sent_path = folder / JOURNAL_SENT
        self.lines = 0  # the trainer's count, with each hand-over

    def append(self, records: list[dict]) -> None: ...

    def mark_sent(self, lines: int) -> None:
        write_atomic(self.sent_path, str(lines))

    def close(self) -> None: ...


class _HelperTracker(MlflowTracker):
    """An MlflowTracker whose journal the trainer writes."""

    def _open_journal(self):
        return _SentMarker(self.run_dir)

    def handed_over(self, lines: int) -> None:
        """The trainer's journal held `lines` lines when it handed over the next call."""
        if self._journal is not None:
            self._journal.lines = lines


class _ReplyHandler(logging.Handler):
    """The helper's log records, sent to the trainer (its console and its Hydra log file)."""

    def __init__(self, reply):
        super().__init__(logging.INFO)
        self.reply = reply

    def emit(self, record: logging.LogRecord) -> None:
        self.reply({"op": "log", "level": record.levelno, "text": record.getMessage()})


def held_back(lines, hold_seconds: float):
    """The trainer's messages (`lines`, JSON) in their order, those from "start" on held back until
    its "go" (the first step is done, or the run id is wanted), its "finish", the end of its input,
    or `hold_seconds` after the start, whichever comes first. "go" itself is not passed on."""
    inbox: queue.Queue = queue.Queue()

    def read() -> None:
        try:
            for line in lines:
                inbox.put(json.loads(line))
        finally:
            inbox.put(None)

    threading.Thread(target=read, name="ampgan-helper-input", daemon=True).start()
    held: list[dict] | None = None   # None: nothing held (before the start, or released)
    deadline = 0.0
    while True:
        try:
            msg = inbox.get(timeout=None if held is None else max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            msg = {"op": "go"}   # held long enough: a long compile still shows its run early
        if held is None and msg is not None and msg["op"] == "start":
            held, deadline = [msg], time.monotonic() + hold_seconds
            continue
        if held is not None and msg is not None and msg["op"] not in ("go", "finish"):
            held.append(msg)
            continue
        yield from held or ()
        held = None
        if msg is None:
            return
        if msg["op"] != "go":
            yield msg


def serve(setup: dict, lines, reply) -> int:
    """Work through the trainer's hand-overs (`lines`, JSON) until the run ends or the input does."""
    tracker: _HelperTracker | None = None
    for msg in held_back(lines, setup.get("hold_seconds", 0.0)):
        op = msg.pop("op")
        if op == "start":
            clock = time.perf_counter()
            try:
                tracker = _start(setup, **msg)
            except Exception as err:  # noqa: BLE001 - any store error: the trainer raises it
                reply({"op": "failed", "error": store_failure(setup["uri"], err)})
                return 1
            reply({"op": "started", "run_id": tracker.run_id, "seconds": time.perf_counter() - clock,
                   "since_start": time.time() - setup["command_started"]})
            continue
        if tracker is None:
            continue
        if "lines" in msg:
            tracker.handed_over(msg.pop("lines"))
        if op == "metrics":
            tracker.log_metrics(msg["metrics"], msg["step"])
        elif op == "tags":
            tracker.set_tags(msg["tags"])
        elif op == "artifact":
            tracker.log_artifact(Path(msg["path"]), msg["subdir"])
        elif op == "image":
            _try_image(tracker, msg)
        elif op == "finish":
            tracker.finish(msg["status"], msg["error"])
            reply({"op": "finished"})
            return 0
    return 0  # the trainer is gone: its journal holds the rest (sync, or the next run, delivers it)


def _start(setup: dict, run_name: str, params: dict, tags: dict) -> _HelperTracker:
    from ampgan.tracking.store_sync import end_lost_runs

    with frozen_imports():   # this process is the helper's own: MLflow's import and store stay frozen
        tracker = _HelperTracker(setup["uri"], setup["experiment"], setup["flush_every"],
                                 Path(setup["run_dir"]) if setup["run_dir"] else None, setup["heartbeat_seconds"],
                                 owner=tuple(setup["owner"]))
    end_lost_runs(tracker.client, tracker.experiment_id)
    tracker.start(run_name, params, tags)
    return tracker


def _try_image(tracker: MlflowTracker, msg: dict) -> None:
    try:
        tracker.log_image(Path(msg["path"]), msg["key"], msg["step"])
    except OSError as err:  # the picture is gone or unreadable: a warning, not the end of tracking
        log.warning(f"could not log picture {msg['path']}: {err}")


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        return report_error("python -m ampgan.tracking.helper is started by the trainer (BackgroundTracker), "
                            "with its set-up as one JSON argument; it is not a command to run by hand")
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # the trainer handles signals and then ends the run here
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    out = os.fdopen(os.dup(1), "w", buffering=1)  # replies; anything else printed goes to stderr
    os.dup2(2, 1)
    lock = threading.Lock()

    def reply(msg: dict) -> None:
        with lock:
            try:
                out.write(json.dumps(msg) + "\n")
                out.flush()
            except (BrokenPipeError, OSError):
                pass

    root = logging.getLogger("ampgan")
    root.handlers[:] = [_ReplyHandler(reply)]
    root.setLevel(logging.INFO)
    root.propagate = False
    return serve(json.loads(argv[0]), sys.stdin, reply)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
