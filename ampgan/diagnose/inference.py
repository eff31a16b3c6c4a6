"""Does float16 break the evaluation? The AMP-trained weights evaluated in float16 and in FP32.

A run can train right and still evaluate wrong: under O3 a float16 BatchNorm keeps its batch
statistics in FP32 inside the kernel while training, but at inference it normalises with its
moving variance, an FP32 parameter that is inf once cast to float16 when it passed 65504 (raw
12-bit pixels: ~4e5). The lockstep replay checks training steps and finds AMP tracking FP32;
the horizon sees the run trail its FP32 twin on the evaluation objective (`Horizon.amp_trails`).

This stage runs then. The AMP course's trained task is evaluated as the run evaluates (its
float16 policy), and an FP32 twin built from the same settings loads the same weights (BatchNorm
statistics included) and is evaluated in FP32. float16 is blamed only when the FP32 evaluation
of the same weights reaches what float16's misses (`falls_short`: float16's progress from the
run's start trails FP32's): weights that evaluate as badly in FP32 are a training problem, not
this one. The evaluation's forward pass on one batch (the task's `eval_forward()`, inference
mode) is then replayed under the op hook, AMP and the twin (`oplocate.record_ops`), and the first
op leaving float16's range (`first_bad_op`, FP32 inputs cast down for a float16 op counted) is
the located origin.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ampgan.config.schema import Settings
from ampgan.data import Dataset
from ampgan.diagnose.horizon import Horizon, falls_short
from ampgan.diagnose.locate import Located
from ampgan.amp.cell_paths import cell_paths, is_wrapper
from ampgan.diagnose.oplocate import OpHit, first_bad_op, record_ops
from ampgan.diagnose.probe import make_loader
from ampgan.diagnose.replay import build_seeded, fp32_twin_settings, net_parameters, snapshot


@dataclass
class Inference:
    step: int                # the AMP run's weights after this training step
    objective: str
    start: float             # the objective at the horizon's start
    amp: float               # the AMP weights evaluated in the run's float16 policy
    fp32: float              # the same weights evaluated in FP32
    trained_fp32: float      # the FP32 twin's own weights after as many steps, in FP32
    blames_float16: bool     # FP32's evaluation of the same weights reaches what float16's misses
    hit: OpHit | None = None     # the first op of the evaluation forward pass leaving float16's range
    cell_type: str = ""      # the mindspore.nn class of the cell running it (`BatchNorm2d`; "": a custom cell)
    o2_keeps_fp32: bool = False  # O2 computes that class in FP32 (MindSpore's black list)

    def located(self) -> Located | None:
        if self.hit is None:
            return None
        return Located(self.step, "eval", "inference", self.hit.cell, self.hit.amp_max, self.hit.fp32_max, self.hit)

    def describe(self) -> str:
        where = f"; first op out of range: {self.hit.describe()}" if self.hit is not None else \
            "; no op of its forward pass leaves float16's range"
        return (f"the AMP weights after step {self.step} evaluated in float16: {self.objective} {self.amp:.4g}; "
                f"the same weights in FP32: {self.fp32:.4g} (the FP32 twin's own: {self.trained_fp32:.4g}; "
                f"{self.start:.4g} at the start){where}")


def check_inference(s: Settings, data: Dataset, horizon: Horizon, dcfg, progress) -> Inference:
    """Evaluate the horizon's AMP-trained task in float16 and its weights in an FP32 twin; locate
    the first op of the evaluation forward pass that leaves float16's range."""
    a = horizon.amp
    task = a.task
    twin = build_seeded(fp32_twin_settings(s), data)
    make_loader(net_parameters(twin))(snapshot(net_parameters(task)))
    amp = float(task.evaluate()[a.objective])
    fp32 = float(twin.evaluate()[a.objective])
    blames = math.isfinite(fp32) and falls_short(a.progress_to(amp), a.progress_to(fp32), dcfg)
    out = Inference(a.last_step, a.objective, a.before, amp, fp32, horizon.fp32.after, blames)
    run_amp, run_fp32 = task.eval_forward(), twin.eval_forward()
    if blames and run_amp is not None:
        out.hit = first_bad_op(record_ops(task.roots(), run_amp), record_ops(twin.roots(), run_fp32),
                               cast_inputs=True)
        if out.hit is not None:
            cell = _cell_at(task.roots(), out.hit.cell)
            if cell is not None:
                from mindspore import nn

                from ampgan.amp.policy import o2_keeps_fp32

                name = type(cell).__name__   # a keep-list names mindspore.nn classes only
                out.cell_type = name if getattr(nn, name, None) is type(cell) else ""
                out.o2_keeps_fp32 = o2_keeps_fp32(cell)
    progress(f"inference: {out.describe()}")
    return out


def _cell_at(roots, path: str):
    """The cell at keep-list path `path` (an AMP wrapper's child: the wrapper is transparent)."""
    paths = cell_paths(roots)
    return next((cell for net in roots.values() for _, cell in net.cells_and_names()
                 if paths.get(id(cell)) == path and not is_wrapper(cell)), None)
