"""Lockstep replay: the AMP run against its FP32 twin, step by step, on the same batches and noise.

1. `record_reference`: the FP32 twin (amp O0, no loss scale, same settings and seed, so the same
   initial weights) trains `steps` iterations; before each sub-step (GAN: each critic step and
   the generator step) its weights, the step's inputs and its gradients are kept.
2. `replay_amp`: the AMP task is built from the same seed and driven with the very same inputs.
   synced: before each sub-step its nets get the twin's weights (errors do not compound: the
   per-step error of float16); free: it follows its own trajectory from the same start
   (divergence). Both from one build: optimizer and scaler state are reset in between.
   After each sub-step the probe's unscaled gradients are compared with the twin's in-graph.

Everything here is host-side orchestration; the compiled pieces are in `ampgan.diagnose.probe`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import mindspore as ms
import numpy as np

from ampgan import AmpganError
from ampgan.training import checkpoint, graph_pool, hardware
from ampgan.config.schema import AmpConfig, Settings
from ampgan.data import Dataset
from ampgan.steps.common import StepStatus
from ampgan.diagnose.probe import COMPARE_FIELDS, Probe, compare_gradients, make_loader, make_probe
from ampgan.tasks import build_task

Progress = Callable[[str], None]


def fp32_twin_settings(s: Settings) -> Settings:
    """The same run in FP32: amp O0, no loss scale (non-finite updates applied, as plain FP32 would);
    what the scaler does that is not precision (clipping) stays (`fp32_twin()` of its settings)."""
    return replace(s, amp=AmpConfig(level="O0", keep_fp32=[], fp32_loss=True, fp32_gradient_penalty=False),
                   scaler=s.scaler.fp32_twin())


def build_seeded(s: Settings, data: Dataset, start: Path | None = None):
    """`build_task` right after seeding: two builds with one seed start from the same weights.

    `start`: a full-state checkpoint set (`ampgan.checkpoint`) loaded into the task before anything
    is compiled: weights, optimizer moments, sampler position, RNGs, and the loss scaler's state,
    except for a task without loss scaling (the FP32 twin keeps scale 1 whatever the run used)."""
    hardware.setup(s.hardware, s.trainer.seed)
    task = build_task(s, data)
    if start is not None:
        own = {k: p.asnumpy().copy() for k, p in task.state_parameters().items() if k.split("/")[0] in task.scalers}
        checkpoint.load(task, start)
        if s.scaler == s.scaler.fp32_twin():  # an FP32 twin keeps its own scale (1), not the run's
            params = task.state_parameters()
            for k, value in own.items():
                params[k].set_data(ms.Tensor(value, dtype=params[k].dtype))
    return task


@contextlib.contextmanager
def pooled_task(s: Settings, data: Dataset, start: Path | None = None, keep: bool = False):
    """`build_seeded`, whose task runs the compiled steps of a pooled task of the same structure
    when the process holds one (`ampgan.training.graph_pool`: its Parameters take this task's
    values), and goes back to the pool when the block ends without an exception (not when `keep`:
    the caller goes on using it). Diagnose's courses, interventions and seed proofs replay few
    structures (the run's, its FP32 twin's, an intervention's) many times: each compiles once."""
    task = build_seeded(s, data, start)
    graph_pool.lend_graphs(task, s)
    yield task
    if not keep:
        graph_pool.give_back(task, s)


def recorded_start(s: Settings, data: Dataset, rec, folder: Path) -> Path:
    """A flight recording (`api.callback`'s, `ampgan.tracking.recorder`) as a checkpoint set of this
    run's task in `folder`: the recorded net, optimizer and scaler state by the names the user's
    code gave them, the sampler at the first recorded batch (the data's training split is the
    recorded batches, in order). A recording of another net (a name missing, a shape differing) is
    one AmpganError line."""
    from ampgan.tracking.recorder import STATE

    hardware.setup(s.hardware, s.trainer.seed)
    task = build_task(s, data)
    saved = {k: v.asnumpy() for k, v in ms.load_checkpoint(str(Path(rec.folder) / STATE)).items()}
    roles = [(task.nets, ("net/",), lambda p: p.get_parameters()),
             (task.optimizers, ("optimizer/", "net/"), lambda o: (p for _, p in o.parameters_and_names())),
             (task.scalers, ("scaler/",), None)]
    for group, prefixes, params_of in roles:
        for owner in group.values():
            items = ([(p.name, p) for p in params_of(owner)] if params_of else
                     [(a, v) for a, v in sorted(vars(owner).items())
                      if isinstance(v, ms.Parameter) and a not in owner.hyperparameters])
            for name, param in items:
                key = next((f"{pre}{name}" for pre in prefixes if f"{pre}{name}" in saved), None)
                if key is None:
                    raise AmpganError(f"start={rec.folder}: the recording does not fit this net: it has no "
                                      f"'{prefixes[0]}{name}' (recorded from {rec.net} with {rec.optimizer}; "
                                      "give the same net class and optimizer)")
                if saved[key].shape != tuple(param.shape):
                    raise AmpganError(f"start={rec.folder}: the recording does not fit this net: '{key}' has "
                                      f"shape {saved[key].shape}, this net's is {tuple(param.shape)} (recorded from {rec.net})")
                param.set_data(ms.Tensor(np.array(saved[key], copy=True), dtype=param.dtype))
    n = rec.steps_recorded * rec.batch_size
    task.batches.load_state({"rng": task.batches.rng.bit_generator.state, "order": list(range(n)), "pos": 0})
    return checkpoint.save(task, folder, rec.step, keep=1)


# ---------------------------------------------------------------- what diagnose needs of a task
def roots(task) -> dict[str, ms.nn.Cell]:
    """The task's nets by the root name keep-list paths use ("critic", "gen"; "" for the classifier)."""
    return task.roots()


def net_parameters(task) -> list[ms.Parameter]:
    """Every Parameter of the task's nets (BatchNorm statistics included), in a fixed order."""
    return task.net_parameters()


def probes(task, jit: bool) -> dict[str, Probe]:
    """One probe per optimised net, built from the task's own nets, losses, optimizers and scalers."""
    return {name: make_probe(o.loss_fn(o.scaler), o.params, o.optimizer, o.scaler, o.losses, jit)
            for name, o in task.optimised().items()}


def snapshot(params) -> tuple[ms.Tensor, ...]:
    return tuple(ms.Tensor(p.asnumpy()) for p in params)


# ---------------------------------------------------------------- the FP32 reference
@dataclass
class RefStep:
    iteration: int
    net: str
    inputs: tuple
    weights: tuple          # every net Parameter before the step
    grads: tuple            # the twin's gradients (FP32)
    status: StepStatus


@dataclass
class Reference:
    settings: Settings
    task: object
    steps: list[RefStep]
    param_names: dict[str, tuple[str, ...]]
    seconds: float
    failed_at: int | None = None    # first iteration whose FP32 loss or gradient is not finite
    failure: str = ""
    start: Path | None = None       # the checkpoint set both runs started from (None: step 0)
    start_step: int = 0             # its training step: iteration i replays training step start_step + i
    iteration_seconds: list[float] = field(default_factory=list)  # wall time of each iteration (the first compiles)


def record_reference(s: Settings, data: Dataset, iterations: int, progress: Progress,
                     start: Path | None = None) -> Reference:
    started = time.perf_counter()
    ref_s = fp32_twin_settings(s)
    task = build_seeded(ref_s, data, start)
    nets = probes(task, ref_s.hardware.jit)
    params = net_parameters(task)
    steps, failed_at, failure, clock = [], None, "", []
    for it in range(1, iterations + 1):
        t0 = time.perf_counter()
        for net, inputs in task.step_inputs():
            weights = snapshot(params)
            status, grads = nets[net](*inputs)
            steps.append(RefStep(it, net, inputs, weights, grads, status))
            bad = [k for k, v in status.losses.items() if not np.isfinite(v)]
            if failed_at is None and (bad or not status.finite):
                failed_at = it
                failure = (f"{net} loss {', '.join(bad)} not finite" if bad else f"{net} gradients not finite")
        clock.append(time.perf_counter() - t0)
        _tick(progress, "FP32 twin", it, iterations)
    names = {net: probe.layout.param_names for net, probe in nets.items()}
    return Reference(ref_s, task, steps, names, time.perf_counter() - started, failed_at, failure, start,
                     checkpoint.step_of(start), clock)


def _tick(progress: Progress, what: str, it: int, total: int) -> None:
    if it == total or it % max(1, total // 4) == 0:
        progress(f"{what}: step {it}/{total}")


# ---------------------------------------------------------------- the AMP replay
@dataclass
class NetTrace:
    """One optimised net's record over a replay: a row per sub-step."""

    net: str
    param_names: tuple[str, ...]
    sizes: np.ndarray
    iterations: list[int] = field(default_factory=list)
    compare: list[np.ndarray] = field(default_factory=list)   # (n_params, len(COMPARE_FIELDS))
    health: list[np.ndarray] = field(default_factory=list)    # AMP's scaled-gradient health (n_params, 4)
    hist: np.ndarray | None = None                            # FP32 exponent histogram, summed over steps
    amp_losses: list[dict] = field(default_factory=list)
    fp32_losses: list[dict] = field(default_factory=list)
    scale: list[float] = field(default_factory=list)
    applied: list[bool] = field(default_factory=list)
    finite: list[bool] = field(default_factory=list)

    def field(self, name: str) -> np.ndarray:
        """(sub-steps, n_params) of one comparison field."""
        return np.array([c[:, COMPARE_FIELDS.index(name)] for c in self.compare]).reshape(len(self.compare), -1)

    def health_field(self, column: int) -> np.ndarray:
        return np.array([h[:, column] for h in self.health]).reshape(len(self.health), -1)


@dataclass
class Trace:
    mode: str
    nets: dict[str, NetTrace]
    seconds: float
    first_nonfinite: tuple[int, str, int] | None = None  # (iteration, net, index into ref.steps)
    bad: list = field(default_factory=list)   # (RefStep, StepStatus) of the bad sub-steps kept for locate
    iteration_seconds: list[float] = field(default_factory=list)  # wall time of each iteration (the first compiles)
    # each net's summary (statistics.summaries), computed once the replay is done, with the sub-step count it saw
    summary_cache: dict = field(default_factory=dict, compare=False, repr=False)


def loss_finite(status) -> bool:
    """Every loss of a step's status is finite: its forward pass stayed in range."""
    return all(np.isfinite(v) for v in status.losses.values())


def replay_amp(s: Settings, data: Dataset, ref: Reference, modes: list[str],
               progress: Progress) -> tuple[dict[str, Trace], object, Callable]:
    """Replay the AMP run in each of `modes` ("synced", "free") against `ref`; return the traces,
    the task and its weight loader (`load(ref_step.weights)` puts a step's weights back, for locate).

    Each trace keeps (`bad`) its first sub-step whose AMP loss or gradients are not finite, each
    net's first such sub-step after a finite one, and each net's first whose loss is not finite,
    with their statuses.
    """
    task = build_seeded(s, data, ref.start)
    nets = probes(task, s.hardware.jit)
    params = net_parameters(task)
    load_weights = make_loader(params)
    # optimizer and scaler state per group: two optimizers both own a `state_step` (names clash in one graph)
    groups: dict[str, list] = {}
    for key, p in task.state_parameters().items():
        if not any(p is q for q in params):
            groups.setdefault(key.split("/")[0], []).append(p)
    resets = [(make_loader(g), snapshot(g)) for g in [params, *groups.values()]]
    traces = {}
    for mode in modes:
        started = time.perf_counter()
        if mode != modes[0]:
            for load, initial in resets:  # the same start: weights, optimizer moments, scaler state
                load(initial)
        traces[mode] = trace = Trace(mode, {n: NetTrace(n, ref.param_names[n], np.array([p.size for p in nets[n].weights]))
                                            for n in nets}, 0.0)
        t0 = time.perf_counter()
        relocated: set[str] = set()
        forward_kept: set[str] = set()
        for i, rs in enumerate(ref.steps):
            if mode == "synced":
                load_weights(rs.weights)
            status, grads = nets[rs.net](*rs.inputs)
            stats, hist = compare_gradients(grads, rs.grads)
            t = trace.nets[rs.net]
            t.iterations.append(rs.iteration)
            t.compare.append(stats.asnumpy())
            h = hist.asnumpy()
            t.hist = h if t.hist is None else t.hist + h
            t.health.append(status.health)
            t.amp_losses.append(status.losses)
            t.fp32_losses.append(rs.status.losses)
            t.scale.append(status.scale)
            t.applied.append(status.applied)
            forward_bad = not loss_finite(status)
            bad = not status.finite or forward_bad
            t.finite.append(not bad)
            # kept for locate: the first bad sub-step, a net's first bad one after a finite one (a
            # skipping scaler's first steps may be it finding its scale; a failure after that is the
            # finding), and a net's first one whose loss is not finite (the forward: no scale ends it)
            after_finite = bad and any(t.finite[:-1]) and rs.net not in relocated
            first_forward = forward_bad and rs.net not in forward_kept
            if bad and (trace.first_nonfinite is None or after_finite or first_forward):
                if trace.first_nonfinite is None:
                    trace.first_nonfinite = (rs.iteration, rs.net, i)
                if after_finite:
                    relocated.add(rs.net)
                if forward_bad:
                    forward_kept.add(rs.net)
                trace.bad.append((rs, status))
            if i + 1 == len(ref.steps) or ref.steps[i + 1].iteration != rs.iteration:
                trace.iteration_seconds.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                _tick(progress, f"AMP {mode}", rs.iteration, ref.steps[-1].iteration)
        trace.seconds = time.perf_counter() - started
    return traces, task, load_weights

