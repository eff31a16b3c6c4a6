"""Does the run fail, and does FP32 fail too? Both trained over a horizon, through the training loop.

From where the diagnosis starts (step 0, or a diagnosed run's checkpoint), the AMP run and then
its FP32 twin (`replay.fp32_twin_settings`: everything but precision kept) train with their own
compiled train steps (`training.loop.run_steps`, nothing tracked, statuses read once a block):
`diagnose.horizon` steps, or a logged run's steps up to its first failing step, each run bounded
by `diagnose.horizon_seconds`. The FP32 twin trains no further than the AMP run failed: all the
verdict asks of it is whether it fails no later (but see "a divergence can pass" below).

A run fails at the first of:
  non_finite   a step whose loss is not finite (known to its block of `every` steps);
  diverged     the objective at the end is worse than at the start by more than `diverge_tol`
               of the gap between the start and its best value (the task's `objective_best`:
               accuracy 1, a distance or a loss 0); at the horizon's last step;
  no_progress  from step 0 only: the run closed less than `min_progress` of that gap (the
               horizon's last step). From a checkpoint a run may have converged already, so
               there only divergence and non-finite losses count.

A run can trail: it fails none of these, but closes less than `1 - trail_tol` of the share of the
gap its FP32 twin closes (`falls_short`; FP32 must learn, at least `min_progress`), as an O3 run
whose float16 BatchNorm evaluates on moving statistics beyond 65504 (its training steps are fine,
its evaluation is not). A run that fails or trails this way while FP32 trains has its evaluation
checked in float16 (`inference.py`): the AMP course keeps its trained task for that (`Course.task`).

A divergence can pass: a loss spike that FP32 survives is fatal in float16 when it overflows.
So when the AMP run's loss goes non-finite and its FP32 twin has only diverged by then, the twin
trains on to the horizon's end; if it is no longer diverged there, it recovered, and its
divergence does not make the AMP run's failure "not AMP" (float16 made the spike fatal).

The AMP run writes a full-state checkpoint set every `every` steps (`diagnose.steps`, at most 10)
into a scratch folder: the lockstep replay (`replay.py`) starts from the newest one before its
failure and runs at least to it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from pathlib import Path

from ampgan.config.schema import Settings
from ampgan.data import Dataset
from ampgan.diagnose.replay import fp32_twin_settings, pooled_task
from ampgan.tracking.tracker import NullTracker
from ampgan.training import checkpoint, graph_pool
from ampgan.training.loop import Progress, run_steps

BLOCK = 10   # steps between status reads and time checks when no checkpoint cadence sets the blocks


@dataclass
class Course:
    """One run's course over the horizon."""

    label: str                  # "AMP" or "FP32"
    start_step: int
    planned: int                # steps asked for
    objective: str
    direction: str
    best: float                 # the objective's best possible value (the task's `objective_best`)
    before: float               # the objective at the start
    after: float = math.nan     # ... at the end (NaN when it failed by a non-finite loss)
    done: int = 0               # steps trained
    seconds: float = 0.0
    failed_at: int | None = None  # the training step by which it failed
    failed_from: int | None = None  # the first step it may have failed at (a non-finite loss is known per block)
    kind: str = ""              # non_finite | diverged | no_progress
    failure: str = ""
    timed_out: bool = False
    folder: Path | None = None  # where its checkpoint sets are (AMP only)
    recovered_at: int | None = None   # a divergence gone by this later step (the course went on to see)
    recovered: str = ""
    task: object = None         # the trained task (the AMP course's, for the inference stage)
    settings: Settings | None = None   # the kept task's settings (`Horizon.release` pools the task)

    @property
    def last_step(self) -> int:
        return self.start_step + self.done

    @property
    def progress(self) -> float:
        """The share of the gap between the start and the best possible objective closed (negative: worse)."""
        return self.progress_to(self.after)

    def progress_to(self, value: float) -> float:
        """The same share for the objective at `value`."""
        gain = value - self.before if self.direction == "maximize" else self.before - value
        return gain / max(abs(self.best - self.before), 1e-12)

    def describe(self) -> str:
        head = (f"{self.label}: {self.done}/{self.planned} steps from step {self.start_step} in {self.seconds:.1f}s"
                + (" (stopped by diagnose.horizon_seconds)" if self.timed_out else ""))
        trend = (f"{self.objective} {self.before:.4g} -> {self.after:.4g}" if math.isfinite(self.after)
                 else f"{self.objective} {self.before:.4g} at the start")
        fate = f"FAILS at step {self.failed_at}: {self.failure}" if self.failed_at is not None else "does not fail"
        if self.recovered_at is not None:
            fate += f"; recovered by step {self.recovered_at} ({self.recovered})"
        return f"{head}; {trend}; {fate}"


class _LossWatch(NullTracker):
    """A tracker that keeps one thing: the first step whose logged loss is not finite."""

    def __init__(self) -> None:
        self.step: int | None = None
        self.what = ""

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        if self.step is not None:
            return
        bad = [k for k, v in metrics.items() if k.endswith("/loss") and not k.startswith("eval/") and not math.isfinite(v)]
        if bad:
            self.step, self.what = step, f"{', '.join(bad)} = {metrics[bad[0]]}"


def falls_short(amp: float, fp32: float, dcfg) -> bool:
    """AMP's progress (a share of the gap to the best objective, `Course.progress_to`) trails FP32's:
    FP32 learns (at least `min_progress`) and AMP closes less than `1 - trail_tol` of what it closes."""
    return fp32 >= dcfg.min_progress and amp < (1.0 - dcfg.trail_tol) * fp32


def train_course(s: Settings, data: Dataset, label: str, steps: int, dcfg, start: Path | None = None,
                 every: int = 0, folder: Path | None = None, progress=lambda msg: None,
                 judge_progress: bool = True, recover_to: int | None = None, keep_task: bool = False) -> Course:
    """Train `s` for `steps` steps from `start` (a checkpoint set; None: step 0) and judge its course
    (`judge_progress` False: a shortened course, where too little progress says nothing).
    `recover_to`: a course that diverged trains on to that step to see whether it recovers.
    `keep_task`: the course holds the trained task (`Course.task`); else the task's compiled steps
    go back to the process's pool for the next replay of the same structure (`pooled_task`)."""
    with pooled_task(s, data, start, keep=keep_task) as task:
        return _course(task, s, label, steps, dcfg, start, every, folder, progress, judge_progress, recover_to,
                       keep_task)


def _course(task, s: Settings, label: str, steps: int, dcfg, start: Path | None, every: int, folder: Path | None,
            progress, judge_progress: bool, recover_to: int | None, keep_task: bool) -> Course:
    start_step = checkpoint.step_of(start)
    course = Course(label, start_step, steps, task.objective, task.direction, task.objective_best,
                    float(task.evaluate()[task.objective]), folder=folder, task=task if keep_task else None,
                    settings=s if keep_task else None)
    end = start_step + steps
    block = every or BLOCK
    # statuses are read once a block (the loop drains what is pending when it returns): a non-finite
    # loss is known to lie in that block, whose start has a checkpoint set (blocks end on multiples of `every`)
    cfg = replace(s.trainer, max_steps=max(end, recover_to or 0), log_every=10**9, print_every=10**9,
                  print_seconds=0.0, eval_every=0, layer_health_every=0, checkpoint_every=every, keep_checkpoints=10**6)
    watch, loop = _LossWatch(), Progress(10**9, start_step, 10**9, 0.0, warns=False)   # a total never reached: no status line
    loop.past_first = True   # nor a first-step line or start-up metric: this is not a run
    started = time.perf_counter()

    def advance(step: int, to: int) -> tuple[int, int]:
        """Train blocks from `step` to `to` (or a non-finite loss, or the time bound): (step, its block's first)."""
        first = step + 1
        while step < to and watch.step is None:
            if time.perf_counter() - started > dcfg.horizon_seconds:
                course.timed_out = True
                break
            first = step + 1
            step, _ = run_steps(task, watch, cfg, folder, range(first, min((step // block + 1) * block, to) + 1), loop)
            progress(f"horizon {label}: step {step - start_step}/{max(steps, (recover_to or 0) - start_step)}")
        return step, first

    step, first = advance(start_step, end)
    course.done, course.seconds = step - start_step, time.perf_counter() - started
    if watch.step is not None:
        course.failed_at, course.failed_from, course.kind = step, first, "non_finite"
        course.failure = f"loss not finite ({watch.what}) in steps {first}..{step}"
        return course
    course.after = float(task.evaluate()[task.objective])
    if not math.isfinite(course.after) or course.progress < -dcfg.diverge_tol:
        course.failed_at, course.kind = step, "diverged"
        course.failure = f"diverged: {course.objective} {course.before:.4g} -> {course.after:.4g}"
        if recover_to is not None and recover_to > step and not course.timed_out:
            later, _ = advance(step, recover_to)
            now = float(task.evaluate()[task.objective]) if watch.step is None else math.nan
            if math.isfinite(now) and course.progress_to(now) >= -dcfg.diverge_tol:
                course.recovered_at = later
                course.recovered = f"{course.objective} {now:.4g} at step {later}"
            course.timed_out = False   # the course itself ran whole: a bound hit on the way on says only "not seen to recover"
            course.seconds = time.perf_counter() - started
    elif judge_progress and start is None and not course.timed_out and course.progress < dcfg.min_progress:
        course.failed_at, course.kind = step, "no_progress"
        course.failure = (f"does not learn: {course.objective} {course.before:.4g} -> {course.after:.4g} "
                          f"({100 * course.progress:+.1f}%, needs {100 * dcfg.min_progress:+.0f}%)")
    return course


@dataclass
class Horizon:
    amp: Course
    fp32: Course
    start: Path | None          # where both started
    run_failed_at: int | None = None   # a diagnosed run's first failing step (its logged history)
    run_failure: str = ""

    def release(self) -> None:
        """The AMP course's kept task goes back to the process's pool once the inference stage is
        done with it: an intervention of the same structure runs its compiled steps."""
        if self.amp.task is not None and self.amp.settings is not None:
            graph_pool.give_back(self.amp.task, self.amp.settings)
        self.amp.task = self.amp.settings = None

    def lockstep_start(self) -> Path | None:
        """The newest checkpoint set the AMP run wrote before its non-finite loss (else the horizon's
        start: a run that diverges or does not learn fails over the whole horizon, at no one step)."""
        if self.amp.kind != "non_finite" or self.amp.folder is None:
            return self.start
        first = self.amp.failed_from or self.amp.failed_at
        return checkpoint.newest_before(self.amp.folder / "checkpoints", first) or self.start

    def fp32_fails_first(self, kinds: tuple[str, ...] = ("non_finite", "diverged", "no_progress")) -> bool:
        """The run fails, and FP32 fails too (in one of `kinds`), no later than AMP does."""
        a, f = self.amp.failed_at, self.fp32.failed_at
        return (a is not None and f is not None and f <= a and self.fp32.kind in kinds
                and self.fp32.recovered_at is None)

    def amp_trails(self, dcfg) -> bool:
        """The AMP run fails or trails FP32 without a non-finite loss (diverged, no progress, or
        `falls_short` of FP32's progress), while FP32 does not fail: what the inference stage checks."""
        a, f = self.amp, self.fp32
        return (a.kind != "non_finite" and math.isfinite(a.after) and f.failed_at is None
                and a.done == f.done and falls_short(a.progress, f.progress, dcfg))

    def describe(self) -> list[str]:
        out = [self.amp.describe(), self.fp32.describe()]
        if self.run_failed_at is not None:
            out.insert(0, f"the diagnosed run failed at step {self.run_failed_at} ({self.run_failure})")
        return out


def run_horizon(s: Settings, data: Dataset, steps: int, dcfg, folder: Path, start: Path | None = None,
                every: int = BLOCK, progress=lambda msg: None, run_failed_at: int | None = None,
                run_failure: str = "", recover_to: int | None = None, fp32: Course | None = None,
                judge_progress: bool = True) -> Horizon:
    """The AMP run over `steps` steps (checkpoints every `every` into `folder`), then its FP32 twin
    up to the AMP run's failure (on to the end when AMP's loss went non-finite and FP32 has only
    diverged by then: does it recover? by `recover_to`, default the horizon's end; a logged run
    that failed at its horizon's last step gives a later one). `fp32`: the twin's course over the
    same steps, already trained (a fix verified on the evaluation objective has the run's twin).
    `judge_progress` False: a course cut shorter than the run (an intervention's, past a non-finite
    failure), where too little progress says nothing."""
    amp = train_course(s, data, "AMP", steps, dcfg, start, every, folder, progress, judge_progress, keep_task=True)
    if fp32 is not None and amp.kind != "non_finite" and amp.done == fp32.done:   # the twin trained as far
        return Horizon(amp, fp32, start, run_failed_at, run_failure)
    fp32_steps = steps if amp.failed_at is None else max(1, amp.failed_at - amp.start_step)
    # a float16 NaN against an FP32 twin that has only diverged by then: does FP32 recover by the end?
    recover_to = recover_to or amp.start_step + steps
    recover_to = recover_to if amp.kind == "non_finite" and amp.start_step + fp32_steps < recover_to else None
    fp32 = train_course(fp32_twin_settings(s), data, "FP32", fp32_steps, dcfg, start, progress=progress,
                        judge_progress=judge_progress and fp32_steps == steps, recover_to=recover_to)
    return Horizon(amp, fp32, start, run_failed_at, run_failure)
