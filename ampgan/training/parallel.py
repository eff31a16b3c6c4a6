"""One run on several processes: `hardware.workers=N` trains one run data-parallel through msrun.

    python -m ampgan.train hardware.workers=2 model=classifier amp=o2 scaler=dynamic

The job's process (the one Hydra started, `launch`) does not train: it checks the settings
(`trainer.batch_size` must split evenly), resolves a resume point, writes the job folder
`<run folder>/parallel/` and starts MindSpore's launcher, `msrun --worker_num=N ...
python -m ampgan.training.rank <job folder>`, with this Python first on PATH. Each rank
(`ampgan.training.rank`: what a rank does, and its entry point) joins the cluster (`mindspore.communication.init()`, backend mccl on CPU), sets
`parallel_mode="data_parallel"` and trains the run through the ordinary composition root
(`ampgan.training.entry.train`) with three differences, all here:

- every rank draws the same global batch (same seeds) and trains on its slice of it (`shard`):
  rank r takes rows [r*B/N, (r+1)*B/N) of every input whose first axis is the batch B. The
  sampler and the noise RNG therefore hold one global state, the same on every rank: a
  checkpoint holds it once, and a run may resume on another number of workers;
- the compiled steps average gradients and agree on the finite flag (`ampgan.steps.parallel`);
- rank 0 tracks (the run's MLflow run, its folder, its checkpoints); rank r > 0 tracks nothing
  and writes its own checkpoints under `<run folder>/ranks/rank-r/` (`own_folder`).

Per-rank figures (which rank's shard overflowed at which step) go to `parallel/rank-r.jsonl`;
the job's process logs them to the run as `rank<r>/<net>/overflow` (1 at each such step) and
`rank<r>/<net>/overflow_steps` once the ranks are done. When a rank dies, msrun kills the
others; this process then kills what is left (msrun's scheduler waits 30 s otherwise), ends the
run FAILED if rank 0 could not (its journal reaches the store first: nothing lost) and exits
with one line. Ctrl-C / SIGTERM go to rank 0, which stops after its step with a checkpoint and
ends the run KILLED.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from omegaconf import OmegaConf

from ampgan import AmpganError
from ampgan.tracking.store_sync import running

log = logging.getLogger("ampgan")

JOB_FOLDER = "parallel"       # in the job's run folder: job.yaml, msrun.log, logs/, rank-*.pid|exit|jsonl, result.json
RANKS_FOLDER = "ranks"        # in the run folder: rank-r/ (followers' checkpoints, pictures, MindSpore's scratch)
_rank: tuple[int, int] | None = None   # (rank, workers) once this process is a rank of a data-parallel run


# ---------------------------------------------------------------- in a rank
def rank() -> int | None:
    """This process's rank in a data-parallel run; None in a single process (or the job's own)."""
    return _rank[0] if _rank else None


def tracks() -> bool:
    """This process tracks its run: a single process, or rank 0."""
    return not _rank or _rank[0] == 0


def own_folder(run_dir: Path) -> Path:
    """Where this process writes: the run folder (one process, rank 0), or `ranks/rank-r/` in it."""
    return run_dir if tracks() else Path(run_dir) / RANKS_FOLDER / f"rank-{_rank[0]}"


def launches(workers: int) -> bool:
    """`hardware.workers` > 1 in the job's own process (not in a rank): `launch` runs the job."""
    return workers > 1 and _rank is None


def shard(task, batch_size: int):
    """In a rank: `task` as this rank sees it (`RankShare`): its slice of each global batch, its
    own overflows recorded. A single process: `task` itself."""
    if _rank is None:
        return task
    r, workers = _rank
    part = batch_size // workers
    return RankShare(task, slice(r * part, (r + 1) * part), batch_size, Path(os.environ[JOB_ENV]) / f"rank-{r}.jsonl")


JOB_ENV = "AMPGAN_PARALLEL_JOB"   # the job folder, in every rank's environment


class RankShare:
    """A task wrapped for one rank of a data-parallel run; the task itself is not changed.

    Each iteration's sub-steps are drawn by the task as a single process draws them (the whole
    global batch, the same noise on every rank), and this rank launches them on its `rows`
    (`run_inputs`). Before statuses are drained (`metrics`), each pending step whose gradients
    were not finite on this rank is appended to `record` (a data-parallel status's `finite` is
    the rank's own flag, `ampgan.steps.parallel`). Every other role is the task's own.
    """

    def __init__(self, task, rows: slice, batch_size: int, record: Path):
        self.task, self.rows, self.batch_size, self.record = task, rows, batch_size, record
        record.write_text(json.dumps({"nets": [state.prefix for state in task.states()]}) + "\n")

    def __getattr__(self, name: str):   # only for what the instance lacks
        if name == "task":
            raise AttributeError(name)
        return getattr(self.task, name)

    def step_inputs(self) -> list[tuple[str, tuple]]:
        """The task's sub-steps, each batch-sized input cut to this rank's rows."""
        return [(name, tuple(x[self.rows] if _is_batch(x, self.batch_size) else x for x in inputs))
                for name, inputs in self.task.step_inputs()]

    def train_step(self, step: int, measure: bool = True) -> None:
        self.task.run_inputs(step, self.step_inputs(), measure)

    def metrics(self) -> list[tuple[int, dict[str, float]]]:
        bad = [{"net": state.prefix, "step": step} for state in self.task.states()
               for step, packed, _ in state.pending if not state.step.decode(packed.asnumpy()).finite]
        if bad:
            with open(self.record, "a") as f:
                f.writelines(json.dumps(row) + "\n" for row in bad)
        return self.task.metrics()


def _is_batch(x, batch_size: int) -> bool:
    shape = getattr(x, "shape", ())
    return len(shape) > 0 and shape[0] == batch_size


def write_job(job: Path, config: dict, run_dir: Path, hydra: dict | None = None) -> None:
    """The job folder's `job.yaml`: the run's resolved config, its folder, the job's Hydra config."""
    job.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(OmegaConf.create({"config": config, "run_dir": str(run_dir), "hydra": hydra}), job / "job.yaml")


def set_rank(rank_and_workers: tuple[int, int]) -> None:
    """This process is rank r of a data-parallel run on `workers` processes (`ampgan.training.rank.join`)."""
    global _rank
    _rank = rank_and_workers


def launch(cfg, settings, run_dir: Path | None = None, resume: Path | None = None) -> float:
    """Run the job on `hardware.workers` ranks through msrun; the objective rank 0 returned.

    `run_dir`: the run's folder (Hydra's output folder, from `entry.train`). `resume`: the
    checkpoint set the run continues from (`run_dir` is then the run's own folder): the store is
    read here once, and every rank continues from that very set."""
    workers = settings.hardware.workers
    run_dir = Path(run_dir).resolve()
    run_folder = run_dir
    job = run_dir / JOB_FOLDER
    job.mkdir(parents=True, exist_ok=True)
    for old in job.glob("rank-*"):
        old.unlink()
    (job / "result.json").unlink(missing_ok=True)
    plain = OmegaConf.to_container(cfg, resolve=True)
    if resume is not None:
        plain["trainer"]["resume"] = str(resume)
    # rank 0 tracks in its own process: a tracking helper (its own session) would outlive a rank msrun kills
    plain["tracking"]["background"] = "never"
    write_job(job, plain, run_dir, _hydra_node())
    env = {**os.environ, JOB_ENV: str(job), "GLOG_v": os.environ.get("GLOG_v", "3"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",   # msrun runs `python`
           "PYTHONPATH": os.pathsep.join(p for p in (str(_source_root()), os.environ.get("PYTHONPATH")) if p)}
    cmd = [sys.executable, "-m", "mindspore.parallel.cluster.run", f"--worker_num={workers}",
           f"--local_worker_num={workers}", "--master_addr=127.0.0.1", f"--master_port={free_port()}",
           "--join=True", f"--log_dir={job / 'logs'}", f"--tail_worker_log={workers}",   # none: rank 0's is echoed here
           "python", "-m", "ampgan.training.rank", str(job)]
    log.info(f"data parallel: {workers} workers through msrun, global batch {settings.trainer.batch_size} "
             f"({settings.trainer.batch_size // workers} per rank); logs {job / 'logs'}")
    with open(job / "msrun.log", "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=run_dir,
                                start_new_session=True)   # Ctrl-C reaches this process only: it tells rank 0
        watch = Watch(proc, job, workers)
        interrupted = watch.wait()
    failure = watch.failure()
    if failure is None and interrupted is None:
        _log_rank_figures(settings, run_folder, job, workers)
        return json.loads((job / "result.json").read_text())["objective"]
    status = _end_run(settings, run_folder, failure or f"interrupted ({interrupted})")
    _log_rank_figures(settings, run_folder, job, workers)
    if interrupted is not None:
        raise KeyboardInterrupt(interrupted)
    raise AmpganError(f"data-parallel run on {workers} workers: {failure}"
                      + (f"; the run ended {status}" if status else "")
                      + f" (logs: {job / 'logs'}); continue it with trainer.resume=<run id or run folder>")


def _hydra_node():
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    node = HydraConfig.get()
    try:
        return OmegaConf.to_container(node, resolve=True, enum_to_str=True)
    except Exception:  # noqa: BLE001 - an interpolation that resolves only inside Hydra: keep it as written
        return OmegaConf.to_container(node, resolve=False, enum_to_str=True)


def _source_root() -> Path:
    from ampgan.config.schema import PACKAGE_DIR

    return PACKAGE_DIR.parent   # the ranks import this very ampgan


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Watch:
    """msrun and its ranks, from the job's process: echo rank 0's log, notice a rank that died,
    forward Ctrl-C / SIGTERM to rank 0, and leave no process behind."""

    GRACE_S = 3.0          # after every rank has ended, msrun's scheduler gets this long to end too
    STOP_GRACE_S = 120.0   # after a stop request, rank 0 gets this long to checkpoint before all is killed

    def __init__(self, proc: subprocess.Popen, job: Path, workers: int):
        self.proc, self.job, self.workers = proc, job, workers
        self.pids: dict[int, int] = {}
        self.dead: dict[int, str] = {}    # rank -> how it ended, for ranks that did not exit cleanly
        self.signal: str | None = None
        self._echo_at = 0

    def wait(self) -> str | None:
        """Until msrun and every rank have ended; the signal that stopped the job, or None."""
        previous = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                previous[sig] = signal.signal(sig, self._on_signal)
            except ValueError:   # not the main thread
                break
        try:
            ended_at = stop_at = None
            while True:
                self._read_pids()
                self._echo()
                if self.proc.poll() is not None:
                    if self.proc.returncode == -signal.SIGTERM and self.signal is None:
                        self._on_signal(signal.SIGTERM, None)   # msrun was stopped (a SLURM cancel signals every process)
                    if not (self.signal and self._stopping()):
                        break
                live = [r for r, pid in self.pids.items() if running(pid)]
                for r, pid in self.pids.items():
                    if r not in live and not (self.job / f"rank-{r}.exit").exists():
                        self.dead.setdefault(r, "was killed (no exit record: SIGKILL, out of memory or a crash)")
                if (self.pids and not live and len(self.pids) == self.workers or (self.dead and not live)
                        or self._ended_badly()):
                    ended_at = ended_at or time.monotonic()
                    if time.monotonic() - ended_at > self.GRACE_S:
                        break   # msrun's scheduler would wait for a lost rank's heartbeat (30 s)
                if self.signal and stop_at is None:
                    stop_at = time.monotonic()
                    self._send(signal.SIGTERM, ranks=[0])
                if stop_at is not None and time.monotonic() - stop_at > self.STOP_GRACE_S:
                    break
                time.sleep(0.2)
        finally:
            self._kill_all()
            self._echo()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return self.signal

    def _stopping(self) -> bool:
        """Rank 0 is still finishing its step and checkpoint after a stop request."""
        pid = self.pids.get(0)
        return pid is not None and running(pid) and not (self.job / "rank-0.exit").exists()

    def _ended_badly(self) -> bool:
        """A rank has written a non-zero exit record (stopped by a signal, or failed): its run is
        ended and checkpointed, and nothing more can happen; the others, waiting in a collective
        for it (and its own process, ~7 s in MindSpore's teardown), get GRACE_S before all is killed."""
        for r in range(self.workers):
            path = self.job / f"rank-{r}.exit"
            try:
                if path.exists() and json.loads(path.read_text())["code"] != 0:
                    return True
            except (OSError, ValueError, KeyError):   # being written
                continue
        return False

    def _on_signal(self, signum, frame) -> None:
        if self.signal:   # the second one: stop at once
            self._send(signal.SIGKILL)
        self.signal = signal.Signals(signum).name
        log.warning(f"{self.signal}: rank 0 stops after its step with a checkpoint (send it again to stop at once)")

    def _read_pids(self) -> None:
        for r in range(self.workers):
            if r not in self.pids and (path := self.job / f"rank-{r}.pid").exists():
                text = path.read_text().strip()
                if text:
                    self.pids[r] = int(text)

    def _send(self, sig: int, ranks=None) -> None:
        for r, pid in self.pids.items():
            if (ranks is None or r in ranks) and running(pid):
                try:
                    os.killpg(os.getpgid(pid), sig) if sig == signal.SIGKILL else os.kill(pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass

    def _kill_all(self) -> None:
        """Kill what is left, and wait until no rank runs: the run is ended after this, and a rank
        still alive (SIGKILL is delivered asynchronously) would look like a run still going."""
        self._send(signal.SIGKILL)
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)   # msrun and its scheduler
            except (ProcessLookupError, PermissionError):
                pass
        self.proc.wait()
        deadline = time.monotonic() + self.GRACE_S
        while any(running(pid) for pid in self.pids.values()) and time.monotonic() < deadline:
            time.sleep(0.05)

    def _echo(self) -> None:
        """Rank 0's new log lines, on this process's stdout (MindSpore's own chatter left out)."""
        path = self.job / "logs" / "worker_0.log"
        if not path.exists():
            return
        with open(path, "rb") as f:
            f.seek(self._echo_at)
            data = f.read()
        cut = data.rfind(b"\n") + 1
        self._echo_at += cut
        lines = [line for line in data[:cut].decode(errors="replace").splitlines()
                 if not line.startswith(("[INFO]", "[WARNING]", "[DEBUG]"))]
        if lines:
            print("\n".join(lines), flush=True)

    def failure(self) -> str | None:
        """What went wrong, in a few words; None when every rank exited cleanly."""
        exits = {}
        for r in range(self.workers):
            path = self.job / f"rank-{r}.exit"
            if path.exists():
                exits[r] = json.loads(path.read_text())
        for r, record in sorted(exits.items()):
            if record["code"] != 0 and record["error"]:
                return f"rank {r}: {record['error']}"
        first = self._first_failure()
        if first is not None:
            return first
        if self.dead:
            r = next(iter(self.dead))   # the first one seen gone
            return f"rank {r} {self.dead[r]}"
        missing = [r for r in range(self.workers) if r not in exits]
        bad = [r for r, record in exits.items() if record["code"] != 0]
        if missing or bad or not (self.job / "result.json").exists():
            if not self.pids:
                return f"the ranks did not start (msrun: {self.job / 'msrun.log'})"
            return f"rank {(bad or missing or [0])[0]} ended without finishing"
        return None


    def _first_failure(self) -> str | None:
        """The first rank msrun saw exit with an error, and how (msrun.log), or None."""
        import re

        path = self.job / "msrun.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        found = re.search(r"Worker process (\d+) exit with exception\. Error code: (-?\d+)", text)
        if not found:
            return None
        pid, code = int(found.group(1)), int(found.group(2))
        r = next((r for r, p in self.pids.items() if p == pid), None)
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 and -code in signal.valid_signals() \
            else f"exited with code {code}"
        return f"{'rank ' + str(r) if r is not None else 'a rank (pid ' + str(pid) + ')'} {how}"


def _end_run(settings, run_folder: Path, reason: str) -> str:
    """End rank 0's run if it is still RUNNING (its journal first): the status it has now."""
    from ampgan.tracking.tracker import RUN_RECORD, make_client

    if settings.tracking.backend != "mlflow" or not (run_folder / RUN_RECORD).exists():
        return ""
    from ampgan.tracking.store_sync import sync_folder

    result = sync_folder(run_folder)
    client = make_client(json.loads((run_folder / RUN_RECORD).read_text())["uri"])
    if result.ended:
        client.set_tag(result.run_id, "error", f"data parallel: {reason}"[:5000])
    return client.get_run(result.run_id).info.status


def _log_rank_figures(settings, run_folder: Path, job: Path, workers: int) -> None:
    """Each rank's own overflows (from its `rank-r.jsonl`) to rank 0's run: per step and counted."""
    from ampgan.tracking.tracker import RUN_RECORD, log_points, make_client

    if settings.tracking.backend != "mlflow" or not (run_folder / RUN_RECORD).exists():
        return
    record = json.loads((run_folder / RUN_RECORD).read_text())
    points = []
    for r in range(workers):
        lines = _records(job, r)
        nets = [net for line in lines for net in line.get("nets", [])]
        lines = [line for line in lines if "step" in line]
        for line in lines:
            points.append((f"rank{r}/{line['net']}/overflow", 1.0, int(line["step"])))
        for net in nets:
            points.append((f"rank{r}/{net}/overflow_steps", float(sum(x["net"] == net for x in lines)), 0))
    log_points(make_client(record["uri"]), record["run_id"], points)


def _records(job: Path, r: int) -> list[dict]:
    path = job / f"rank-{r}.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
