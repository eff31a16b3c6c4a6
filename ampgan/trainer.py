"""The loop: train steps -> metrics to the tracker, periodic eval, checkpoints, one status line.

The run's lifecycle is here too: whatever happens, the tracked run ends FINISHED, FAILED
(the error recorded) or KILLED (Ctrl-C / SIGTERM), with every buffered metric flushed.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from contextlib import contextmanager
from pathlib import Path

import mindspore as ms

log = logging.getLogger("ampgan")


def fit(task, tracker, cfg, run_dir: Path) -> dict[str, float]:
    """Train `task` for `cfg.max_steps` steps (`cfg` is a TrainerConfig); return the final metrics."""
    last_step, outcome = run_steps(task, tracker, cfg, run_dir, range(1, cfg.max_steps + 1), Progress(cfg.max_steps))
    return finish(task, tracker, run_dir, last_step, outcome)


def run_steps(task, tracker, cfg, run_dir: Path, steps: range, progress: Progress) -> tuple[int, str]:
    """The loop proper: step, log, report, evaluate, checkpoint; stop early when losses stay non-finite.

    Steps run ahead of the host: statuses are fetched at the logging / printing cadence, so
    divergence is noticed at that cadence too.
    """
    step = steps.start - 1
    for step in steps:
        started = time.perf_counter()
        task.train_step()  # launched; its status is fetched only when metrics are needed
        log_now = step % cfg.log_every == 0 or step == 1
        print_now = step % cfg.print_every == 0 or step == cfg.max_steps
        layers_now = cfg.grad_health and cfg.layer_health_every and (step % cfg.layer_health_every == 0 or step == 1)
        if log_now or print_now or layers_now:
            metrics = task.metrics()
            if step == 1:  # the first step compiles the graphs
                tracker.log_metrics({"startup/first_step_s": time.perf_counter() - started}, 0)
            if log_now:
                tracker.log_metrics(metrics, step)
            if layers_now:
                tracker.log_metrics(task.layer_health(), step)
            if print_now:
                log.info(progress.line(step, metrics))
            if task.nonfinite_run() >= cfg.max_nonfinite_steps:
                log.warning(f"step {step}: losses non-finite for {task.nonfinite_run()} steps in a row; stopping (diverged)")
                return step, "diverged"
        if cfg.eval_every and step % cfg.eval_every == 0 and step < cfg.max_steps:
            evaluation = task.evaluate()
            tracker.log_metrics(evaluation, step)
            log.info(f"eval at step {step}: {_fmt(evaluation)}")
        if cfg.checkpoint_every and step % cfg.checkpoint_every == 0:
            save_checkpoints(task, run_dir / "checkpoints")
        STOP.check()
    task.metrics()  # settle the counts of the last steps
    return step, "completed"


def finish(task, tracker, run_dir: Path, step: int, outcome: str) -> dict[str, float]:
    """Final evaluation, pictures and checkpoints, all handed to the tracker."""
    final = {**task.evaluate(), "train/steps": float(step), "train/diverged": float(outcome == "diverged")}
    for state in task.states():
        final[f"{state.prefix}/skipped_total"] = float(state.skipped)
    tracker.log_metrics(final, step)
    for picture in task.save_pictures(run_dir):
        tracker.log_artifact(picture, "samples")
    for ckpt in save_checkpoints(task, run_dir / "checkpoints"):
        tracker.log_artifact(ckpt, "checkpoints")
    tracker.set_tags({"outcome": outcome})
    log.info(f"final: {_fmt(final)}")
    return final


def _fmt(metrics: dict[str, float]) -> str:
    return "  ".join(f"{k} {v:.4g}" for k, v in metrics.items())


def save_checkpoints(task, folder: Path) -> list[Path]:
    """One checkpoint per net, written to a temporary name and renamed: never half-written."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, cell in task.cells().items():
        final, tmp = folder / f"{name}.ckpt", folder / f".{name}.partial.ckpt"
        ms.save_checkpoint(cell, str(tmp))
        os.replace(tmp, final)
        paths.append(final)
    return paths


class Progress:
    """One status line: step, main losses, loss scales, skipped steps, speed, time left."""

    def __init__(self, total: int):
        self.total, self.start = total, time.perf_counter()

    def line(self, step: int, m: dict[str, float]) -> str:
        elapsed = time.perf_counter() - self.start
        rate = step / max(elapsed, 1e-9)
        parts = [f"step {step}/{self.total} ({100 * step // self.total}%)"]
        parts += [f"{k} {v:.4g}" for k, v in m.items() if k.endswith("/loss")]
        parts += [f"{k} {v:g}" for k, v in m.items() if k.endswith("/scale") or k.endswith("/skipped")]
        parts.append(f"{rate:.1f} step/s, eta {int((self.total - step) / rate)}s")
        return " | ".join(parts)


class StopRequest:
    """Ctrl-C / SIGTERM during a run: the loop stops at the next step boundary.

    Raising KeyboardInterrupt from the signal handler itself could cut a tracker write (an
    sqlite transaction) in half; instead the first signal sets a flag the loop checks after
    each step. A second signal interrupts at once.
    """

    def __init__(self):
        self.requested: str | None = None
        self._previous: dict = {}

    def install(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
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
        if self.requested:
            raise KeyboardInterrupt(self.requested)
        self.requested = signal.Signals(signum).name
        log.warning(f"{self.requested}: stopping after this step (send it again to stop at once)")

    def check(self) -> None:
        if self.requested:
            raise KeyboardInterrupt(self.requested)


STOP = StopRequest()


@contextmanager
def tracked_run(tracker, run_name: str, params: dict, tags: dict):
    """Start a run; end it FINISHED, KILLED (Ctrl-C, SIGTERM) or FAILED (error recorded)."""
    STOP.install()
    try:
        tracker.start(run_name, params, tags)
        try:
            yield tracker
        except KeyboardInterrupt as err:
            tracker.finish("KILLED", f"interrupted ({err or 'Ctrl-C'})")
            raise
        except BaseException as err:
            tracker.finish("FAILED", f"{type(err).__name__}: {err}")
            raise
        else:
            tracker.finish("FINISHED")
    finally:
        STOP.restore()
