"""`python -m ampgan.sync [run folder ...]`: deliver what a store is missing; end runs whose process died.

    python -m ampgan.sync                       # every run folder under outputs/ with a journal
    python -m ampgan.sync outputs/runs/2026-11-29/10-00-00-000000

Each run folder holds a journal of every metric it logged (`metrics.jsonl`, written before the
metric is sent) and where its run lives (`tracking.json`). Sync sends the journal's metrics the
store lacks (each (metric, step) once), then, if the run is still RUNNING, ends it: with the
status the journal's end record names, or FAILED ("process lost") when its process is gone.
The next run on a store does the second half for every run of its experiment (`end_lost_runs`).
"""

from __future__ import annotations

import argparse
import json
import logging
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ampgan import report_error
from ampgan.config.schema import outputs_dir
from ampgan.tracking.tracker import (BATCH_METRICS, JOURNAL, JOURNAL_SENT, RUN_RECORD, make_client, read_journal,
                             write_atomic)

log = logging.getLogger("ampgan")

LOST_AFTER_BEATS = 10       # a run on another host is lost when its heartbeat is this many periods old
LOST_AFTER_MIN_SECONDS = 600


@dataclass
class SyncResult:
    folder: Path
    run_id: str
    sent: int          # metrics the store did not have
    ended: str = ""    # status set now, if the run was still RUNNING


def sync_folder(folder: Path, end: bool = True) -> SyncResult:
    """Send the journal's metrics that the run lacks; with `end`, end a RUNNING run whose process is gone."""
    from mlflow.entities import Metric

    folder = Path(folder)
    record = json.loads((folder / RUN_RECORD).read_text())
    client, run_id = make_client(record["uri"]), record["run_id"]
    records, confirmed = read_journal(folder)
    unsent = [r for r in records[confirmed:] if "k" in r]
    have: set[tuple[str, int]] = set()
    for key in {r["k"] for r in unsent}:  # lines after the mark may have arrived before the process died
        have.update((key, m.step) for m in client.get_metric_history(run_id, key))
    todo, seen = [], set()
    for r in unsent:
        if (r["k"], r["s"]) not in have and (r["k"], r["s"]) not in seen:
            seen.add((r["k"], r["s"]))
            todo.append(Metric(r["k"], float(r["v"]), int(r["t"]), int(r["s"])))
    for i in range(0, len(todo), BATCH_METRICS):
        client.log_batch(run_id, metrics=todo[i : i + BATCH_METRICS])
    write_atomic(folder / JOURNAL_SENT, str(len(records)))
    result = SyncResult(folder, run_id, len(todo))
    run = client.get_run(run_id)
    if end and run.info.status == "RUNNING":
        ends = [r for r in records if "end" in r]
        if ends:
            status, error = ends[-1]["end"], ends[-1].get("error")
        elif process_alive(run.data.tags):
            return result
        else:
            status, error = "FAILED", lost_reason(run.data.tags)
        if error:
            client.set_tag(run_id, "error", error[:5000])
        client.set_terminated(run_id, status=status)
        result.ended = status
    return result


def running(pid: int) -> bool:
    """The process `pid` runs: it exists and has not ended (a zombie, ended and waiting for its
    parent to reap it, has: a killed rank whose msrun was killed too)."""
    import psutil

    try:
        return psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.Error:
        return False


def process_alive(tags: dict[str, str]) -> bool:
    """Is the process that runs this run still there? Same host: its pid (and start time); else its heartbeat."""
    import psutil

    if "ampgan.pid" not in tags:
        return True  # not an ampgan run, or one from before liveness was recorded: leave it alone
    if tags.get("ampgan.host") == socket.gethostname():
        pid = int(tags["ampgan.pid"])
        try:
            started = psutil.Process(pid).create_time()
        except psutil.Error:
            return False
        return running(pid) and abs(started - float(tags.get("ampgan.pid_started", started))) < 1.0
    beat = time.mktime(time.strptime(tags.get("ampgan.heartbeat", "1970-01-01T00:00:00Z"), "%Y-%m-%dT%H:%M:%SZ"))
    age = time.mktime(time.gmtime()) - beat
    period = float(tags.get("ampgan.heartbeat_seconds", 30))
    return age < max(LOST_AFTER_BEATS * period, LOST_AFTER_MIN_SECONDS)


def lost_reason(tags: dict[str, str]) -> str:
    return (f"process lost: pid {tags.get('ampgan.pid', '?')} on {tags.get('ampgan.host', '?')} stopped "
            f"without ending the run (killed, out of memory or the machine went down); last heartbeat "
            f"{tags.get('ampgan.heartbeat', '?')}")


def end_lost_runs(client, experiment_id: str) -> list[str]:
    """End every RUNNING run of the experiment whose process is gone; their journals delivered first."""
    ended = []
    for run in client.search_runs([experiment_id], "attributes.status = 'RUNNING'", max_results=1000):
        tags = run.data.tags
        if process_alive(tags):
            continue
        folder = Path(tags.get("output_dir", ""))
        try:
            if (folder / RUN_RECORD).exists() and (folder / JOURNAL).exists():
                sync_folder(folder)
        except Exception as err:  # noqa: BLE001 - a broken journal must not block ending the run
            log.warning(f"could not deliver the journal of {run.info.run_id}: {err}")
        if client.get_run(run.info.run_id).info.status == "RUNNING":
            client.set_tag(run.info.run_id, "error", lost_reason(tags))
            client.set_terminated(run.info.run_id, status="FAILED")
        log.warning(f"run {run.info.run_id} ({run.info.run_name}) had lost its process: ended")
        ended.append(run.info.run_id)
    return ended


def run_folders(root: Path) -> list[Path]:
    return sorted(p.parent for p in root.rglob(RUN_RECORD))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ampgan.sync", description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="*", type=Path, help="run folders (default: every one under outputs/)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    folders = args.folders or run_folders(outputs_dir())
    for folder in folders:
        if not (folder / RUN_RECORD).exists():
            return report_error(f"{folder} is not a tracked run folder (no {RUN_RECORD})")
    failed = 0
    for folder in folders:
        try:
            r = sync_folder(folder)
        except Exception as err:  # noqa: BLE001 - report and go on with the other folders
            print(f"{folder}: not synced: {type(err).__name__}: {str(err).splitlines()[0]}", file=sys.stderr)
            failed += 1
            continue
        print(f"{folder}: run {r.run_id}: {r.sent} metrics sent" + (f", ended {r.ended}" if r.ended else ""))
    return 1 if failed else 0
