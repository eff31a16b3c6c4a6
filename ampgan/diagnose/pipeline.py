"""One diagnosis of one configuration: replay, statistics, ranges, locate, verdict.

`analyse` is what the command runs once, and what verification and the keep-list search run
again for every candidate (shorter, without the slow stages).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ampgan.config.schema import Settings
from ampgan.data import Dataset
from ampgan.diagnose.framework import FrameworkCheck, check_penalty_gradient
from ampgan.diagnose.locate import Located, locate
from ampgan.diagnose.ranges import ScaleFit, fit_scales
from ampgan.diagnose.replay import (Reference, Trace, build_seeded, fp32_twin_settings, net_parameters,
                                    record_reference, replay_amp, roots)
from ampgan.diagnose.statistics import layer_rows, net_rel_err
from ampgan.diagnose.verdict import Verdict, decide
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

    def free_summary(self) -> str | None:
        if self.free is None:
            return None
        parts = []
        for net, t in self.free.nets.items():
            rel = net_rel_err(t)
            parts.append(f"{net} gradient error vs FP32 {rel[0]:.3g} at the first step, {rel[-1]:.3g} at the last")
        return "; ".join(parts)


def framework_check(s: Settings, data: Dataset, when: str, start: Path | None = None) -> FrameworkCheck | None:
    """The GP gradient check on a fresh pair of tasks (`when`: auto = only when jit is off)."""
    if not task_class(s).has_penalty or when == "never" or (when == "auto" and s.hardware.jit):
        return None
    amp_task = build_seeded(s, data, start)
    fp32_task = build_seeded(fp32_twin_settings(s), data, start)
    name, inputs = next((n, i) for n, i in fp32_task.step_inputs() if fp32_task.penalty(n, i) is not None)
    return check_penalty_gradient(amp_task, fp32_task, name, inputs, s.hardware.jit, s.trainer.seed)


def analyse(s: Settings, dcfg, data: Dataset, ref: Reference, modes: list[str], progress,
            with_locate: bool = True, framework: FrameworkCheck | None = None) -> Analysis:
    found: list[Located] = []
    fp32_loader = []

    def on_nonfinite(task, ref_step, status):
        if not with_locate:
            return
        if not fp32_loader:
            fp32_loader.append(make_loader(net_parameters(ref.task)))
        found.append(locate(task, ref.task, roots(task), roots(ref.task), ref_step, status, fp32_loader[0]))
        progress(f"located: {found[0].describe()}")

    traces, _ = replay_amp(s, data, ref, modes, progress, on_nonfinite)
    synced = traces.get("synced") or traces["free"]
    fits = {net: fit_scales(t.param_names, t.hist, dcfg.underflow_fraction) for net, t in synced.nets.items()}
    located = found[0] if found else None
    verdict = decide(s, dcfg, ref, synced, fits, located, framework)
    return Analysis(s, ref, synced, traces.get("free") if "synced" in traces else None, fits, located, framework,
                    verdict, layer_rows(synced, fits))


def reference_for(s: Settings, data: Dataset, steps: int, progress, cache: dict,
                  start: Path | None = None) -> Reference:
    """The FP32 twin's record, shared by every candidate whose FP32 twin is the same run."""
    key = (repr(fp32_twin_settings(s)), steps, str(start))
    if key not in cache:
        cache[key] = record_reference(s, data, steps, progress, start)
    return cache[key]
