"""The first non-finite or out-of-range value of a failing step: where, and in which phase.

Run on the first synced sub-step whose AMP loss or gradients are not finite, with the AMP nets
holding that step's weights again. Forward passes and first-order gradients are right in
PYNATIVE mode (only the penalty's second-order gradient is not), so this stage runs the nets
uncompiled with hooks:
  forward   every cell's output, in completion order (a cell finishes after its children):
            the first that is non-finite, or beyond float16's range (|x| > 65504) in a cell
            kept in FP32, while its inputs are finite (a cell fed NaN is not the origin: the
            enclosing cell that computed it is); the FP32 twin's value there is the evidence;
  gp_inner  (critic steps) d critic / d x_hat, the penalty's inner gradient;
  backward  else the first parameter in backward order (nearest the loss) whose gradient is.
Down to the op and the source line (`ampgan.diagnose.oplocate`): the sub-step's forward pass and
loss are replayed once more under an op hook, AMP and the FP32 twin; the first op whose float16
result leaves float16's range from clean inputs is `Located.op`, in a forward location (inside or
before its cell) and in the loss: when every cell's output is finite but an op of the loss
computation (outside every net) is that op, the phase is `loss`, ahead of the gradient checks
(a non-finite loss makes every gradient non-finite too). In the backward phase the replay runs
the first-order gradient too: `Located.op` is the op whose output first receives a non-finite
gradient where the FP32 twin's is finite.
"""

from __future__ import annotations

from dataclasses import dataclass

import mindspore as ms
import numpy as np
from mindspore import nn

from ampgan.amp.float16 import FP16_MAX
from ampgan.amp.health import HEALTH_FIELDS
from ampgan.amp.cell_paths import cell_paths, is_wrapper
from ampgan.diagnose.oplocate import CellHooks, OpHit, locate_op, peak_and_nonfinite, tensors
from ampgan.diagnose.probe import make_inner_gradient_probe


@dataclass
class Located:
    iteration: int
    net: str
    phase: str          # forward | gp_inner | backward | loss (no cell's value: the loss itself) |
                        # inference (the evaluation's forward pass: `inference.py`; net "eval")
    where: str          # a cell path or a parameter name
    amp_value: float    # max |value| there under AMP (inf/nan when not finite)
    fp32_value: float   # the FP32 twin's, when known (nan otherwise)
    op: OpHit | None = None   # the first op whose float16 result (forward, loss) or gradient (backward) leaves the range

    def describe(self) -> str:
        what = {"forward": "output of cell", "gp_inner": "penalty's inner gradient through",
                "backward": "gradient of", "loss": "the loss, with every cell's output finite:",
                "inference": "the evaluation forward pass (inference mode) in"}[self.phase]
        twin = f", FP32 {self.fp32_value:.4g}" if np.isfinite(self.fp32_value) else ""
        op = f"; {self.op.describe()}" if self.op is not None else ""
        head = f"after step {self.iteration}" if self.phase == "inference" else f"step {self.iteration} ({self.net} step)"
        return (f"{head}, {self.phase}: {what} {self.where}: "
                f"AMP max|x| {self.amp_value:.4g}{twin}{op}")


class _Recorder(CellHooks):
    """Forward hooks on every named cell: (path, max |output|, FP32 output, clean inputs) in completion order."""

    def __init__(self, roots: dict[str, nn.Cell]):
        super().__init__(roots)
        self.seen: list[tuple[str, float, bool, bool]] = []

    def finished(self, cell, inputs, output) -> None:
        outs = tensors(output)
        if not outs:
            return
        peak, _, _ = peak_and_nonfinite(outs)
        fp32 = all(o.dtype != ms.float16 for o in outs)
        _, bad_in, _ = peak_and_nonfinite(tensors(inputs))
        self.seen.append((self.paths[id(cell)], peak, fp32, bad_in == 0))


def _peaks(task, roots, net, inputs) -> list[tuple[str, float, bool, bool]]:
    rec = _Recorder(roots)
    try:
        task.forward(net, inputs)
    finally:
        rec.close()
    return rec.seen


def first_nonfinite(task, fp32_task, roots, fp32_roots, ref_step, status, load_fp32_weights) -> Located:
    """Find the failing step's first bad value. `load_fp32_weights(values)` puts the step's weights
    into the FP32 twin (for its evidence values)."""
    net, inputs = ref_step.net, ref_step.inputs
    amp_seen = _peaks(task, roots, net, inputs)
    load_fp32_weights(ref_step.weights)
    fp32_seen = {}
    for path, peak, _, _ in _peaks(fp32_task, fp32_roots, net, inputs):
        fp32_seen[path] = max(fp32_seen.get(path, 0.0), peak)
    op = locate_op(task, fp32_task, roots, fp32_roots, net, inputs)
    for path, peak, is_fp32, clean_in in amp_seen:  # the origin: bad output from clean inputs
        if clean_in and (not np.isfinite(peak) or (is_fp32 and peak > FP16_MAX)):
            return Located(ref_step.iteration, net, "forward", path, peak, fp32_seen.get(path, float("nan")), op)
    if op is not None and not op.in_net:   # every cell finite, an op of the loss computation is not
        return Located(ref_step.iteration, net, "loss", "loss", op.amp_max, op.fp32_max, op)
    penalty = task.penalty(net, inputs)   # the optional hook: a gradient penalty's inner gradient
    if penalty is not None:
        root, gp_net, args = penalty
        peak, nonfinite = make_inner_gradient_probe(gp_net, jit=False)(*args).asnumpy()
        if nonfinite > 0 or not np.isfinite(peak):
            _, gp_net32, args32 = fp32_task.penalty(net, inputs)
            peak32, _ = make_inner_gradient_probe(gp_net32, jit=False)(*args32).asnumpy()
            first = _first_layer(root, roots[root])
            return Located(ref_step.iteration, net, "gp_inner", first, float("inf"), float(peak32))
    nf = status.health[:, HEALTH_FIELDS.index("nonfinite")]
    names = ref_step_names(task, net)
    for i in reversed(range(len(nf))):
        if nf[i] > 0:
            op = locate_op(task, fp32_task, roots, fp32_roots, net, inputs, backward=True)
            return Located(ref_step.iteration, net, "backward", names[i], float("inf"), float("nan"), op)
    return Located(ref_step.iteration, net, "loss", "loss", float("nan"), float("nan"))


def _first_layer(root: str, net: nn.Cell) -> str:
    """The net's first cell with its own parameters: where the inner gradient reaches the input."""
    paths = cell_paths({root: net})
    for _, cell in net.cells_and_names():
        if id(cell) in paths and not is_wrapper(cell) and list(cell.get_parameters(expand=False)):
            return paths[id(cell)]
    return root


def ref_step_names(task, net: str) -> tuple[str, ...]:
    return tuple(p.name for p in task.optimised()[net].params)
