"""The pipeline's Evidence stage for one configuration: replay, statistics, ranges, locate,
inference, and the rules' hypothesis over them (`verdict.decide`, pure).

`analyse` is what the pipeline runs once for the diagnosed run, and what verification and the
keep-list search run for each candidate (shorter, without the slow stages); every candidate
whose FP32 twin is the run's reuses the twin's record (`reference_for`'s cache).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ampgan.config.schema import Settings
from ampgan.data import Dataset
from ampgan.diagnose.framework import FrameworkCheck, check_penalty_gradient, compare_modes
from ampgan.diagnose.locate import Located, first_nonfinite
from ampgan.diagnose.ranges import ScaleFit, fit_scales
from ampgan.diagnose.replay import (Reference, Trace, build_seeded, fp32_twin_settings, loss_finite, net_parameters,
                                    record_reference, replay_amp, roots)
from ampgan.diagnose.horizon import Horizon
from ampgan.diagnose.inference import Inference, check_inference
from ampgan.diagnose.statistics import layer_rows, net_rel_err, summaries
from ampgan.diagnose.interventions import Evidence
from ampgan.diagnose.verdict import Verdict, cell_of, decide, net_roots, skips_nonfinite
from ampgan.diagnose.probe import make_loader
from ampgan.tasks import task_class


@dataclass
class Analysis:
    settings: Settings
    ref: Reference
    synced: Trace
    free: Trace | None
    fits: dict[str, ScaleFit]
    located: Located | None
    framework: FrameworkCheck | None
    verdict: Verdict
    rows: list[dict]
    horizon: Horizon | None = None
    inference: Inference | None = None   # the run trailed FP32: its evaluation checked in float16

    def free_summary(self) -> str | None:
        if self.free is None:
            return None
        parts = []
        for net, t in self.free.nets.items():
            rel = net_rel_err(t)
            parts.append(f"{net} gradient error vs FP32 {rel[0]:.3g} at the first step, {rel[-1]:.3g} at the last")
        return "; ".join(parts)


def framework_check(s: Settings, data: Dataset, when: str, start: Path | None = None) -> FrameworkCheck | None:
    """The GP gradient check on a fresh FP32 twin, whenever the task has a second-order term
    (`when`: auto/always; never: off), in the run's mode and compiled; for a run that is not
    jitted and not FP32, its own nets too, PYNATIVE against jit at its precision, same inputs."""
    if not task_class(s).has_penalty or when == "never":
        return None
    fp32_task = build_seeded(fp32_twin_settings(s), data, start)
    name, inputs = next((n, i) for n, i in fp32_task.step_inputs() if fp32_task.penalty(n, i) is not None)
    check = check_penalty_gradient(fp32_task, name, inputs, s.hardware.jit)
    if not s.hardware.jit and s.amp.level != "O0":
        check.at_precision = compare_modes(build_seeded(s, data, start), name, inputs, s.amp.level)
    return check


def analyse(s: Settings, dcfg, data: Dataset, ref: Reference, modes: list[str], progress,
            with_locate: bool = True, framework: FrameworkCheck | None = None, horizon: Horizon | None = None,
            run_failed_at: int | None = None) -> Analysis:
    traces, task, load_weights = replay_amp(s, data, ref, modes, progress)
    synced = traces.get("synced") or traces["free"]
    located = None
    fits = {net: fit_scales(t.param_names, t.hist, dcfg.underflow_fraction) for net, t in synced.nets.items()}
    if with_locate and "synced" in traces:
        at = failure_step(synced, s, dcfg, fits)
        if at is not None:
            rs, status = at
            load_weights(rs.weights)
            located = first_nonfinite(task, ref.task, roots(task), roots(ref.task), rs, status,
                             make_loader(net_parameters(ref.task)))
            progress(f"located: {located.describe()}")
    inference = None
    if horizon is not None and horizon.amp.task is not None and horizon.amp_trails(dcfg):
        inference = check_inference(s, data, horizon, dcfg, progress)
    verdict = decide(s, dcfg, ref, synced, fits, located, framework, horizon, run_failed_at, inference)
    if verdict.on_evaluation and located is None:   # the verdict is the evaluation's: its first bad op
        located = inference.located()
    return Analysis(s, ref, synced, traces.get("free") if "synced" in traces else None, fits, located, framework,
                    verdict, layer_rows(synced, fits), horizon, inference)


def failure_step(synced: Trace, s: Settings, dcfg, fits: dict[str, ScaleFit]):
    """Of the bad sub-steps the replay kept, the one the verdict is about: the first failing net's
    first failure (after its scaler settled); else the first bad one (a scaler that skips every
    step may be finding its scale, or meeting an overflow no scale ends: the interventions tell);
    None when no step was bad.

    Under a scaler that skips non-finite steps, a failing net's first step whose loss is not finite
    comes before that net's earlier backward-only overflows when each of them ran at a scale above
    the net's range (`fits`: ranges.ScaleFit) while a scale >= 1 fits it: the scaler lowering a
    scale too high, skipped, while the forward pass left float16's range, which no loss scale
    changes. A backward overflow that no scale >= 1 avoids stays first. Without skipping, the
    first bad step is the cause: its update carries the non-finite values into every later step."""
    skips = skips_nonfinite(s)
    failing = {n: x for n, x in summaries(synced).items() if x.failing(skips, dcfg.skip_tol)}
    if not failing:
        return synced.bad[0] if synced.bad else None
    if skips:
        forward = next((i for i, (rs, st) in enumerate(synced.bad) if rs.net in failing and not loss_finite(st)), None)
        if forward is not None:
            rs, _ = synced.bad[forward]
            fit = fits.get(rs.net)
            earlier = [st for r, st in synced.bad[:forward] if r.net == rs.net]
            if all(fit is not None and fit.k_hi is not None and fit.k_hi >= 0 and st.scale > 2.0 ** fit.k_hi
                   for st in earlier):
                return synced.bad[forward]
    firsts = [(x.first_failure, n) for n, x in failing.items() if x.first_failure is not None]
    if firsts:
        iteration, net = min(firsts)
        hit = next(((rs, st) for rs, st in synced.bad if rs.iteration == iteration and rs.net == net), None)
        if hit is not None:
            return hit
    return synced.bad[0] if synced.bad else None


def reference_for(s: Settings, data: Dataset, steps: int, progress, cache: dict,
                  start: Path | None = None) -> Reference:
    """The FP32 twin's record, shared by every candidate whose FP32 twin is the same run."""
    key = (repr(fp32_twin_settings(s)), steps, str(start))
    if key not in cache:
        cache[key] = record_reference(s, data, steps, progress, start)
    return cache[key]


def evidence_of(a: Analysis) -> Evidence:
    """The plain facts the interventions stage reads (`interventions.Evidence`), from the analysis."""
    s, h, ref = a.settings, a.horizon, a.ref
    sums = list(summaries(a.synced).values())
    amp_first = min((x.first_failure for x in sums if x.first_failure is not None), default=None)
    in_replay = ref.failed_at is not None and (amp_first is None or ref.failed_at <= amp_first)
    fp32_fails = in_replay or (h is not None and h.fp32_fails_first())
    if h is not None:
        fp32_line = h.fp32.describe()
    elif ref.failed_at is not None:
        fp32_line = f"not finite in the replay at step {ref.failed_at} ({ref.failure})"
    else:
        fp32_line = f"finite over the {ref.steps[-1].iteration} replayed steps"
    if in_replay and h is not None:
        fp32_line += f"; in the replay not finite at step {ref.failed_at} ({ref.failure})"
    return Evidence(jit=s.hardware.jit, scale=float(getattr(s.scaler, "init_scale", 1.0)),
                    nonfinite=any(x.nonfinite for x in sums) or (h is not None and h.amp.kind == "non_finite"),
                    located_cell=located_cell(a.located, net_roots(a.synced)), fp32_fails=fp32_fails, fp32_line=fp32_line,
                    level=s.amp.level)


def located_cell(located: Located | None, net_roots: tuple[str, ...]) -> str:
    """The keep-list path of the cell where the first bad value was found: the op's own cell when the
    op is known, the cell (forward, the penalty's inner gradient) or the parameter's cell (backward);
    "" for the loss itself or when nothing was located."""
    if located is None or located.phase == "loss":
        return ""
    if located.op is not None and located.op.cell:
        return located.op.cell
    return located.where if located.phase != "backward" else cell_of(located.where, net_roots)
