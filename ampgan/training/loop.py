"""The loop: train steps -> metrics to the tracker, periodic eval, checkpoints, one status line.

The run's lifecycle is here too: whatever happens, the tracked run ends FINISHED, FAILED
(the error recorded) or KILLED (Ctrl-C / SIGTERM: the current step finishes, a checkpoint is
written, every fetched status is logged), with every buffered metric flushed.
"""

from __future__ import annotations

import logging
import math
import signal
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ampgan import NEXT_COMMAND_TAG, WARNING_TAG
from ampgan.amp.float16 import low_headroom
from ampgan.training import checkpoint

log = logging.getLogger("ampgan")



def fit(task, tracker, cfg, run_dir: Path, start_step: int = 0, compiled: bool = True) -> dict[str, float]:
    """Train `task` from `start_step` to `cfg.max_steps` (`cfg` is a TrainerConfig); the final metrics.

    `compiled`: the first step compiles the steps (False: they come compiled from an earlier job)."""
    progress = Progress(cfg.max_steps, start_step, cfg.print_every, cfg.print_seconds, compiled)
    steps = range(start_step + 1, cfg.max_steps + 1)
    last_step, outcome = run_steps(task, tracker, cfg, run_dir, steps, progress)
    return finish(task, tracker, cfg, run_dir, last_step, outcome, progress.seconds_per_step(last_step))


def run_steps(task, tracker, cfg, run_dir: Path, steps: range, progress: Progress) -> tuple[int, str]:
    """The loop proper: step, log, report, evaluate, checkpoint; stop early when losses stay non-finite.

    Steps run ahead of the host: statuses are fetched at the logging / printing / checkpoint
    cadence (and on a stop request), and every fetched status is logged. Whatever ends the
    loop (an error, a signal), the statuses still pending are fetched and logged. Only the
    steps whose health is logged compute it (gradient health, activation peaks): log steps,
    layer-health steps, the run's last step and a new run's second step, which stands for the
    start of training (per-layer health is logged at both). The first step runs the plain
    variant: the measuring one compiles at the second step, after the first step's status line,
    not before it. A status fetched for the status line, a checkpoint or a stop request may lack
    health. Every fetch is checked for the run's one warning (`warn_once`).
    """
    step = steps.start - 1
    cadence = Cadence(cfg, first_step=steps.start, opens=not progress.past_first)
    try:
        for step in steps:
            started = time.perf_counter()
            now = cadence.at(step, print_due=progress.due(step))
            task.train_step(step, measure=now.measure)  # launched; status fetched only when needed
            if now.fetch or STOP.requested:
                metrics = log_pending(task, tracker, cfg, progress)
                if now.first:  # the first step compiles the graphs
                    tracker.log_metrics({"startup/first_step_s": time.perf_counter() - started}, 0)
                    tracker.first_step_done()   # what the tracker held back for the compile may start
                if now.layers:
                    tracker.log_metrics(task.layer_health(), step)
                if now.status_line:
                    log.info(progress.line(step, metrics))
                if task.nonfinite_run() >= cfg.max_nonfinite_steps:
                    log.warning(f"step {step}: losses non-finite for {task.nonfinite_run()} steps in a row; stopping (diverged)")
                    return step, "diverged"
            if now.evaluate:
                evaluation = task.evaluate()
                tracker.log_metrics(evaluation, step)
                log_eval_picture(task, tracker, run_dir, step)
                log.info(f"eval at step {step}: {_fmt(evaluation)}")
            if now.save or STOP.requested:
                save_checkpoint(task, tracker, cfg, run_dir, step)
            STOP.check()
    finally:
        try:
            log_pending(task, tracker, cfg, progress)
        except Exception as err:  # noqa: BLE001 - a broken runtime must not hide the original error
            log.warning(f"could not fetch the last step statuses: {type(err).__name__}: {err}")
    return step, "completed"


@dataclass(frozen=True)
class Moment:
    """What the loop does at one step (`Cadence.at`)."""

    first: bool      # the run's first step: its status line times the compile
    measure: bool    # run the measuring variant (gradient health, activation peaks)
    log: bool        # fetch and log the statuses
    status_line: bool   # the status line
    layers: bool     # per-layer health
    save: bool       # a checkpoint (the last step's comes from `finish`)
    evaluate: bool   # an evaluation (the last step's comes from `finish`)

    @property
    def fetch(self) -> bool:
        """The pending statuses are fetched at this step."""
        return self.log or self.status_line or self.layers or self.save


@dataclass(frozen=True)
class Cadence:
    """At which steps the loop measures, logs, prints, checkpoints and evaluates (one schedule).

    `cfg`: the TrainerConfig. `first_step`: the loop's first step; `opens`: the loop starts the run
    (a resumed run's loop starts it too; the bench's later blocks do not). A new run's second step
    stands for the start of training: it is measured, logged and gets per-layer health. Its first
    step runs the plain variant (the measuring one compiles at the second step, after the first
    step's status line). The run's last step is measured and gets per-layer health."""

    cfg: object
    first_step: int = 1
    opens: bool = True

    def at(self, step: int, print_due: bool = False) -> Moment:
        cfg = self.cfg
        first = self.opens and step == self.first_step
        early = self.opens and self.first_step == 1 and step == 2
        last = step == cfg.max_steps
        logged = step % cfg.log_every == 0
        layers = bool(cfg.layer_health_every) and (step % cfg.layer_health_every == 0 or early or last)
        return Moment(first=first, measure=logged or layers or early or last, log=logged or first or early,
                      status_line=print_due or first, layers=layers,
                      save=bool(cfg.checkpoint_every) and step % cfg.checkpoint_every == 0 and step < cfg.max_steps,
                      evaluate=bool(cfg.eval_every) and step % cfg.eval_every == 0 and step < cfg.max_steps)


def log_pending(task, tracker, cfg=None, progress: Progress | None = None) -> dict[str, float]:
    """Fetch every pending step status and log it at its own step; the merged metrics (for the status line).
    With `cfg` and `progress`, each fetched status is checked for the run's warning (`warn_once`)."""
    merged: dict[str, float] = {}
    for step, metrics in task.metrics():
        tracker.log_metrics(metrics, step)
        merged.update(metrics)
        if progress is not None and not progress.warned:
            warn_once(task, tracker, cfg, progress, step, metrics)
    return merged


def warning_reason(metrics: dict[str, float], nonfinite_run: int, threshold: float) -> str | None:
    """Why a run should be diagnosed now, from one fetch's metrics, or None.

    In order: the smallest `<net>/headroom` (FP16_MAX / the net's largest leaf-cell output, float16
    runs) under `threshold`; a loss or an activation peak that is not finite, or losses non-finite
    in the newest step (`nonfinite_run`)."""
    low = low_headroom(metrics, threshold, "trainer.headroom_warn")
    if low:
        return low
    bad = [k for k, v in metrics.items() if k.endswith(("/loss", "/act_max_abs")) and not math.isfinite(v)]
    if bad or nonfinite_run:
        return f"{', '.join(bad) or 'the losses'} not finite"
    return None


def diagnose_command(run_id: str | None) -> str:
    """The command that asks whether the run's trouble is float16's fault."""
    if run_id:
        return f"python -m ampgan.diagnose diagnose.run={run_id}"
    return "python -m ampgan.diagnose <this run's overrides>"


def warn_once(task, tracker, cfg, progress: Progress, step: int, metrics: dict[str, float]) -> None:
    """The run's one warning: a log line and the tags `ampgan.warning` (why, and the next command)
    and `ampgan.next_command` (the command alone: `python -m ampgan.diagnose diagnose.run=<run id>`)."""
    reason = warning_reason(metrics, task.nonfinite_run(), cfg.headroom_warn)
    if reason is None:
        return
    progress.warned = True
    command = diagnose_command(tracker.run_id)
    log.warning(f"step {step}: {reason}; is it float16's fault? next: {command}")
    tracker.set_tags({WARNING_TAG: f"step {step}: {reason}; next: {command}", NEXT_COMMAND_TAG: command})


def log_eval_picture(task, tracker, run_dir: Path, step: int) -> None:
    """The task's picture at an evaluation (samples over training): under `samples/steps/`, and as
    the image sequence `samples` that MLflow's UI steps through."""
    picture = task.eval_picture(Path(run_dir), step) if run_dir else None
    if picture is not None:
        tracker.log_artifact(picture, "samples/steps")
        tracker.log_image(picture, "samples", step)


def save_checkpoint(task, tracker, cfg, run_dir: Path, step: int) -> Path | None:
    if not run_dir:
        return None
    return checkpoint.save(task, Path(run_dir) / "checkpoints", step, keep=cfg.keep_checkpoints,
                           extra={"run_id": tracker.run_id})


def finish(task, tracker, cfg, run_dir: Path, step: int, outcome: str, step_s: float = float("nan")) -> dict[str, float]:
    """Final evaluation, pictures and a final checkpoint, all handed to the tracker.

    `step_s`: seconds per step after the first (the compiling one), the loop's evaluations included;
    logged as `perf/step_s` when measured (NaN: the run had no step after its first)."""
    final = {**task.evaluate(), "train/steps": float(step), "train/diverged": float(outcome == "diverged")}
    if math.isfinite(step_s):
        final["perf/step_s"] = step_s
    for state in task.states():
        final[f"{state.prefix}/skipped_total"] = float(state.skipped)
    tracker.log_metrics(final, step)
    log_eval_picture(task, tracker, run_dir, step)
    for picture in task.save_pictures(run_dir):
        tracker.log_artifact(picture, "samples")
    saved = save_checkpoint(task, tracker, cfg, run_dir, step)
    if saved is not None:
        tracker.log_artifact(saved, "checkpoints")
    tracker.set_tags({"outcome": outcome})
    log.info(f"final: {_fmt(final)}")
    return final


def _duration(seconds: float) -> str:
    """12s, 3m05s, 1h02m."""
    s = int(seconds)
    return f"{s}s" if s < 60 else f"{s // 60}m{s % 60:02d}s" if s < 3600 else f"{s // 3600}h{s % 3600 // 60:02d}m"


def _fmt(metrics: dict[str, float]) -> str:
    return "  ".join(f"{k} {v:.4g}" for k, v in metrics.items())


class Progress:
    """One status line: step, main losses, loss scales, skipped steps, speed, time left.

    Due every `every` steps and at least every `seconds` seconds (0: steps only), and at the end.
    `warns=False`: the loop gives no warning (diagnose's replays: a replay is not a run to diagnose).
    """

    def __init__(self, total: int, start_step: int = 0, every: int = 200, seconds: float = 0.0, compiles: bool = True,
                 warns: bool = True):
        self.total, self.start_step, self.every, self.seconds = total, start_step, every, seconds
        self.first_note = "compiling" if compiles else "compiled steps reused"
        self.start = self.last = time.perf_counter()
        self.past_first = False  # the first step's line was printed: speed counts from there
        self.warned = not warns  # the run's one warning was given (`warn_once`), or is not to be given

    def due(self, step: int) -> bool:
        timed = self.seconds > 0 and time.perf_counter() - self.last >= self.seconds
        return step % self.every == 0 or step == self.total or timed

    def seconds_per_step(self, step: int) -> float:
        """Seconds per step since the first step's status (NaN before a second step)."""
        done = step - self.start_step
        return (time.perf_counter() - self.start) / done if done > 0 and self.past_first else float("nan")

    def line(self, step: int, m: dict[str, float]) -> str:
        self.last = now = time.perf_counter()
        parts = [f"step {step}/{self.total} ({100 * step // self.total}%)"]
        parts += [f"{k} {v:.4g}" for k, v in m.items() if k.endswith("/loss")]
        parts += [f"{k} {v:g}" for k, v in m.items() if k.endswith("/scale") or k.endswith("/skipped")]
        if not self.past_first:  # the first step compiles the graphs: its time says nothing of the rest
            parts.append(f"first step {now - self.start:.1f}s ({self.first_note})")
            self.start, self.start_step, self.past_first = now, step, True
        else:
            rate = max(step - self.start_step, 1) / max(now - self.start, 1e-9)
            parts.append(f"{rate:.1f} step/s, {_duration((self.total - step) / rate)} left")
        return " | ".join(parts)


SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRequest:
    """Ctrl-C / SIGTERM during a run: the loop stops at the next step boundary, after a checkpoint.

    Raising KeyboardInterrupt from the signal handler itself could cut a tracker write (an
    sqlite transaction) in half; instead the first signal sets a flag the loop checks after
    each step. A second signal interrupts at once. While the run is created or ended
    (`deferred()`), signals wait until that is done. MindSpore 2.10's runtime installs its own
    SIGINT handler while it runs a graph and answers Ctrl-C there with a SIGTERM to the process
    (seen under strace), so a Ctrl-C may be reported as SIGTERM (exit 143, not 130).
    """

    def __init__(self):
        self.requested: str | None = None
        self._previous: dict = {}
        self.rank: int | None = None   # a data-parallel rank (`in_rank`): its job's process stops and escalates

    def in_rank(self, rank: int) -> None:
        """This process is rank `rank` of a data-parallel run. Its job's process stops the job by a
        SIGTERM to rank 0, and escalates with SIGKILL; a SLURM cancel signals every rank too. So rank
        r > 0 ignores signals (it follows rank 0 into the next collective and is ended by the job's
        process), and rank 0 takes a repeated signal as the same request (never cutting its checkpoint)."""
        self.rank = rank

    def install(self) -> None:
        for sig in SIGNALS:
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread (a sweep worker thread): leave signals alone
                return

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
        self.requested = None

    def _handle(self, signum, frame) -> None:
        if self.rank is not None and (self.rank > 0 or self.requested):
            return
        if self.requested:
            raise KeyboardInterrupt(self.requested)
        self.requested = signal.Signals(signum).name
        log.warning(f"{self.requested}: stopping after this step with a checkpoint (send it again to stop at once)")

    def check(self) -> None:
        if self.requested:
            raise KeyboardInterrupt(self.requested)

    @contextmanager
    def deferred(self):
        """Hold SIGINT/SIGTERM back while the block runs (creating or ending a run); deliver them after."""
        try:
            signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
            blocked = True
        except (ValueError, OSError):
            blocked = False
        try:
            yield
        finally:
            if blocked:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)


STOP = StopRequest()


def exit_code(err: KeyboardInterrupt) -> int:
    """128 + the signal number: 130 for Ctrl-C / SIGINT, 143 for SIGTERM."""
    name = str(err.args[0]) if err.args else "SIGINT"
    return 128 + getattr(signal.Signals, name, signal.SIGINT).value


@contextmanager
def tracked_run(tracker, run_name: str, params: dict, tags: dict, resume_run_id: str | None = None):
    """Start (or reopen) a run; end it FINISHED, KILLED (Ctrl-C, SIGTERM) or FAILED (error recorded).

    A signal that arrives after the loop (during the final evaluation) still ends the run KILLED;
    one that arrives while the run is being ended is delivered once it has ended.
    """
    STOP.install()
    try:
        try:
            with STOP.deferred():
                tracker.start(run_name, params, tags, resume_run_id)
            yield tracker
            STOP.check()
        except KeyboardInterrupt as err:
            with STOP.deferred():
                tracker.finish("KILLED", f"interrupted ({err or 'Ctrl-C'})")
            raise
        except BaseException as err:
            with STOP.deferred():
                tracker.finish("FAILED", f"{type(err).__name__}: {err}")
            raise
        else:
            with STOP.deferred():
                tracker.finish("FINISHED")
        STOP.check()
    finally:
        STOP.restore()
