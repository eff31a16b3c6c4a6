"""The tracking helper process: what a run tracked by it holds, and what survives either process dying."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from ampgan.tracking.helper import HOLD_SECONDS
from ampgan.tracking.tracker import MAX_KEY_LENGTH, read_journal
from ampgan.training.entry import train
from tests.conftest import ROOT, all_runs, compose_cfg, run_cli
from tests.test_resume import run_folder, start, wait_for_step

TIMING = ("startup/", "perf/", "job/")  # metrics that time the run: they differ between any two runs


def helpers_of(outputs: Path) -> list[psutil.Process]:
    """Tracking helpers still running for runs under `outputs` (their command line names the run folder)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "ampgan.tracking.helper" in cmd and str(outputs) in cmd:
            found.append(p)
    return found


def store_metrics(client, run_id: str) -> dict[tuple[str, int], list[float]]:
    """(key, step) -> every value the store holds for it."""
    out: dict[tuple[str, int], list[float]] = {}
    for key in client.get_run(run_id).data.metrics:
        for m in client.get_metric_history(run_id, key):
            out.setdefault((key, m.step), []).append(m.value)
    return out


def journal_metrics(folder: Path) -> dict[tuple[str, int], float]:
    records, _ = read_journal(folder)
    return {(r["k"], r["s"]): r["v"] for r in records if "k" in r}


def assert_store_holds_the_journal_once(client, run_id: str, folder: Path) -> None:
    stored, journaled = store_metrics(client, run_id), journal_metrics(folder)
    assert journaled, "nothing was journaled"
    assert set(stored) == set(journaled)
    for key, values in stored.items():
        assert values == pytest.approx([journaled[key]], nan_ok=True), key  # each (metric, step) once, same value


def sync(folder: Path, outputs: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "ampgan.sync", str(folder)], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "AMPGAN_OUTPUTS": str(outputs)}, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def wait_gone(procs: list[psutil.Process], timeout: float = 60) -> None:
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    assert not alive, f"left running: {[p.pid for p in alive]}"


LONG = ("model=classifier", "data=gaussians8", "trainer=smoke", "trainer.log_every=5", "trainer.eval_every=0",
        "trainer.checkpoint_every=0", "trainer.layer_health_every=0", "tracking.flush_every=20")


def test_a_single_command_is_tracked_by_the_helper_and_the_store_holds_its_journal(outputs):
    launched_ms = time.time() * 1000
    done = run_cli("trainer=smoke", outputs=outputs)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "created by the tracking helper" in done.stdout + done.stderr
    client, (run,) = all_runs(outputs)
    assert run.info.status == "FINISHED"
    assert run.data.tags["ampgan.tracking"] == "helper"
    assert int(run.data.tags["ampgan.pid"]) != os.getpid()  # the trainer's pid, not the helper's
    folder = run_folder(outputs)
    assert_store_holds_the_journal_once(client, run.info.run_id, folder)
    records, sent = read_journal(folder)
    assert sent == len(records) and records[-1] == {"end": "FINISHED", "error": None}
    assert {"config.yaml", "samples", "checkpoints"} <= {a.path for a in client.list_artifacts(run.info.run_id)}
    assert json.loads((folder / "tracking.json").read_text())["run_id"] == run.info.run_id
    # the helper held the store back until the first step was done (its time is journaled then),
    # or for HOLD_SECONDS after the trainer started, when the compile took longer (a loaded machine)
    first_done = next(r["t"] for r in records if r.get("k") == "startup/first_step_s")
    assert run.info.start_time >= min(first_done, launched_ms + HOLD_SECONDS * 1000)
    assert not helpers_of(outputs)


@pytest.mark.slow  # `make test-full` (CI's 30 minutes on a slow machine)
def test_the_helper_logs_what_the_trainer_logs_in_process(outputs, tmp_path):
    """The same run tracked by the helper and in process: the same params and metrics, value for value."""
    histories = {}
    for mode in ("always", "never"):
        cfg = compose_cfg("model=wgan_gp", "trainer=smoke", "amp=o2", "scaler=dynamic", f"tracking.background={mode}",
                          f"tracking.run_name={mode}")
        train(cfg, run_dir=tmp_path / mode)
    client, runs = all_runs(outputs)
    by_name = {r.info.run_name: r for r in runs}
    assert by_name["always"].data.tags["ampgan.tracking"] == "helper"
    assert by_name["never"].data.tags["ampgan.tracking"] == "process"
    for name, run in by_name.items():
        assert run.info.status == "FINISHED"
        histories[name] = {k: v for k, v in store_metrics(client, run.info.run_id).items() if not k[0].startswith(TIMING)}
    assert histories["always"] == histories["never"]
    assert len(histories["always"]) > 50
    params = [{k: v for k, v in r.data.params.items() if k not in ("tracking.background", "tracking.run_name")}
              for r in (by_name["always"], by_name["never"])]
    assert params[0] == params[1]


def test_a_trainer_killed_hard_lets_its_helper_exit_and_sync_delivers_the_rest(outputs):
    proc = start(*LONG, "trainer.max_steps=1000000", outputs=outputs)
    try:
        wait_for_step(proc, outputs, 100)  # the run exists (tracking.json) and has journaled step 100
        helpers = helpers_of(outputs)
        assert len(helpers) == 1
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        wait_gone(helpers)  # the end of its input: no helper outlives its trainer
    finally:
        proc.kill()
        proc.wait()
    client, (run,) = all_runs(outputs)
    assert run.info.status == "RUNNING"  # until sync, or the next run on the store, ends it
    folder = run_folder(outputs)
    sync(folder, outputs)
    run = client.get_run(run.info.run_id)
    assert run.info.status == "FAILED" and "process" in run.data.tags["error"]
    assert_store_holds_the_journal_once(client, run.info.run_id, folder)


@pytest.mark.slow  # `make test-full` (CI's time): the trainer killed hard stays
def test_a_helper_killed_hard_stops_nothing_and_loses_nothing(outputs):
    proc = start(*LONG, "trainer.max_steps=2000", outputs=outputs)
    try:
        wait_for_step(proc, outputs, 50)   # the helper has created the run: it wrote tracking.json
        (helper,) = helpers_of(outputs)
        helper.kill()
        assert proc.poll() is None, "the run ended before its helper was killed"
        _, err = proc.communicate(timeout=600)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, err[-3000:]  # training went on
    folder = run_folder(outputs)
    said = (folder / "train.log").read_text()
    assert "the tracking helper exited" in said and "python -m ampgan.sync" in said
    records, sent = read_journal(folder)
    assert records[-1] == {"end": "FINISHED", "error": None} and sent < len(records)
    assert max(r["s"] for r in records if "k" in r) == 2000
    sync(folder, outputs)
    client, (run,) = all_runs(outputs)
    assert run.info.status == "FINISHED"  # the end the journal recorded
    assert_store_holds_the_journal_once(client, run.info.run_id, folder)


@pytest.mark.parametrize("mode", ["always", "never"])
def test_a_store_that_cannot_be_opened_stops_the_run_with_one_line(outputs, mode):
    uri = "sqlite:////proc/ampgan-no-such-folder/mlflow.db"
    done = run_cli("trainer=smoke", f"tracking.background={mode}", f"tracking.uri={uri}", outputs=outputs)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"ampgan: error: tracking store {uri}: FileNotFoundError"), done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert not helpers_of(outputs)


def test_the_key_limit_is_mlflows():
    from mlflow.utils.validation import MAX_ENTITY_KEY_LENGTH

    assert MAX_KEY_LENGTH == MAX_ENTITY_KEY_LENGTH


def test_the_helper_tracks_only_new_runs_that_cannot_be_requeued(outputs):
    from ampgan.config.schema import validate
    from ampgan.training.entry import tracks_in_background

    def background(*overrides, resume=None):
        return tracks_in_background(validate(compose_cfg(*overrides)), resume)

    assert background("tracking.background=always")
    assert not background("tracking.background=never")
    assert not background("tracking.background=always", resume=Path("ckpt"))
    assert not background("tracking.background=always", "trainer.requeue=true")
    assert not background("tracking.background=always", "tracking=none")
    assert not background("tracking.background=auto")  # this process has loaded MLflow: opening the store is cheap
    assert "mlflow" in sys.modules


def test_a_run_whose_process_is_a_zombie_counts_as_lost():
    """A killed process waits as a zombie until its parent reaps it (a rank whose msrun was killed
    too): it has ended, so its run is lost, and a live process's run is not."""
    import socket
    import time

    from ampgan.tracking.store_sync import process_alive

    def tags(proc: subprocess.Popen) -> dict[str, str]:
        return {"ampgan.host": socket.gethostname(), "ampgan.pid": str(proc.pid),
                "ampgan.pid_started": str(psutil.Process(proc.pid).create_time())}

    live = subprocess.Popen(["sleep", "60"])
    ended = subprocess.Popen(["sleep", "60"])
    try:
        live_tags, ended_tags = tags(live), tags(ended)
        ended.kill()   # not waited for: a zombie until then
        deadline = time.monotonic() + 10
        while psutil.Process(ended.pid).status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
            time.sleep(0.05)
        assert psutil.Process(ended.pid).status() == psutil.STATUS_ZOMBIE
        assert not process_alive(ended_tags)
        assert process_alive(live_tags)
    finally:
        for proc in (live, ended):
            proc.kill()
            proc.wait()
