"""The tracking helper holds the store back while the trainer compiles its first step.

`held_back` orders the trainer's messages; the helper process itself (`python -m
ampgan.tracking.helper`, against a real sqlite store) creates the run only once it is let go.
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

from mlflow.tracking import MlflowClient

from ampgan.tracking.helper import held_back
from ampgan.tracking.tracker import this_process
from tests.conftest import ROOT


class Pipe:
    """The trainer's side of the helper's input: lines put in while `held_back` reads them."""

    def __init__(self):
        self.lines: queue.Queue = queue.Queue()

    def send(self, op: str, **fields) -> None:
        self.lines.put(json.dumps({"op": op, **fields}))

    def close(self) -> None:
        self.lines.put(None)

    def __iter__(self):
        while (line := self.lines.get()) is not None:
            yield line


def reader(pipe: Pipe, hold_seconds: float) -> queue.Queue:
    """`held_back` run on `pipe` in a thread; what it passes on, in order (None: its end)."""
    out: queue.Queue = queue.Queue()

    def run() -> None:
        for msg in held_back(pipe, hold_seconds):
            out.put(msg)
        out.put(None)

    threading.Thread(target=run, daemon=True).start()
    return out


def take(out: queue.Queue, n: int, timeout: float = 10.0) -> list:
    return [out.get(timeout=timeout) for _ in range(n)]


def nothing_within(out: queue.Queue, seconds: float) -> bool:
    try:
        out.get(timeout=seconds)
    except queue.Empty:
        return True
    return False


def test_messages_from_the_start_wait_for_go_and_keep_their_order():
    pipe = Pipe()
    out = reader(pipe, hold_seconds=60)
    pipe.send("metrics", step=-1)              # nothing started: passed on at once
    assert [m["op"] for m in take(out, 1)] == ["metrics"]
    pipe.send("start", run_name="r")
    pipe.send("artifact", path="config.yaml")
    pipe.send("metrics", step=0)
    assert nothing_within(out, 0.5), "the start was passed on before the first step was done"
    pipe.send("go")
    assert [m["op"] for m in take(out, 3)] == ["start", "artifact", "metrics"]
    pipe.send("go")                            # a second go: nothing to pass on
    pipe.send("metrics", step=1)               # released: passed on at once
    assert take(out, 1) == [{"op": "metrics", "step": 1}]
    pipe.close()
    assert take(out, 1) == [None]


def test_the_runs_end_or_the_end_of_input_lets_the_held_messages_go():
    pipe = Pipe()
    out = reader(pipe, hold_seconds=60)
    pipe.send("start", run_name="r")
    pipe.send("finish", status="FAILED")       # the first step failed: the run must still be recorded
    assert [m["op"] for m in take(out, 2)] == ["start", "finish"]

    pipe = Pipe()
    out = reader(pipe, hold_seconds=60)
    pipe.send("start", run_name="r")
    pipe.send("metrics", step=0)
    pipe.close()                               # the trainer died while compiling
    assert [m and m["op"] for m in take(out, 3)] == ["start", "metrics", None]


def test_a_long_compile_is_held_for_hold_seconds_at_most():
    pipe = Pipe()
    out = reader(pipe, hold_seconds=0.5)
    clock = time.monotonic()
    pipe.send("start", run_name="r")
    assert take(out, 1)[0]["op"] == "start"    # no go ever came
    assert 0.4 <= time.monotonic() - clock < 5
    pipe.send("metrics", step=1)
    assert take(out, 1)[0]["op"] == "metrics"
    pipe.close()


@contextmanager
def helper(uri: str, hold_seconds: float):
    """The real helper process on the store `uri`: (the process, its replies); killed if a test fails."""
    setup = {"uri": uri, "experiment": "hold", "flush_every": 10, "heartbeat_seconds": 30.0, "run_dir": None,
             "owner": this_process(), "hold_seconds": hold_seconds, "command_started": time.time()}
    proc = subprocess.Popen([sys.executable, "-m", "ampgan.tracking.helper", json.dumps(setup)], cwd=ROOT,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    out: queue.Queue = queue.Queue()

    def read() -> None:
        for line in proc.stdout:
            msg = json.loads(line)
            if msg["op"] != "log":
                out.put(msg)

    threading.Thread(target=read, daemon=True).start()
    try:
        yield proc, out
    finally:
        proc.kill()
        proc.wait()


def send(proc: subprocess.Popen, op: str, **fields) -> None:
    proc.stdin.write(json.dumps({"op": op, **fields}) + "\n")
    proc.stdin.flush()


def end_run(proc: subprocess.Popen, out: queue.Queue) -> None:
    """Finish the run; the helper confirms and exits cleanly."""
    send(proc, "finish", status="FINISHED", error=None)
    assert out.get(timeout=120)["op"] == "finished"
    assert proc.wait(timeout=60) == 0


def runs_in(uri: str) -> list:
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("hold")
    return client.search_runs([exp.experiment_id]) if exp else []


def test_the_helper_process_creates_the_run_only_once_let_go(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with helper(uri, hold_seconds=600) as (proc, out):
        send(proc, "start", run_name="held", params={"a": "1"}, tags={})
        send(proc, "metrics", metrics={"startup/build_s": 0.1}, step=0)
        # unheld, the helper creates the run in ~2-3 s here (MLflow's import, the store)
        assert nothing_within(out, 6.0), "the helper started the run before it was let go"
        assert runs_in(uri) == []
        send(proc, "go")
        started = out.get(timeout=120)
        assert started["op"] == "started", started
        end_run(proc, out)
    (run,) = runs_in(uri)
    assert run.info.run_id == started["run_id"] and run.info.status == "FINISHED"
    assert run.data.params == {"a": "1"} and run.data.metrics == {"startup/build_s": 0.1}


def test_the_helper_process_starts_the_run_after_hold_seconds_without_go(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with helper(uri, hold_seconds=1.0) as (proc, out):
        send(proc, "start", run_name="long compile", params={}, tags={})
        assert out.get(timeout=120)["op"] == "started"   # no go: a compile longer than the hold
        assert [r.info.status for r in runs_in(uri)] == ["RUNNING"]
        end_run(proc, out)
