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
"""

from __future__ import annotations

from dataclasses import dataclass

import mindspore as ms
import numpy as np
from mindspore import nn

from ampgan.amp.float16 import FP16_MAX
from ampgan.amp.health import HEALTH_FIELDS
from ampgan.amp.policy import KeepFP32
from ampgan.diagnose.probe import make_inner_gradient_probe


@dataclass
class Located:
    iteration: int
    net: str
    phase: str          # forward | gp_inner | backward | loss (no cell's value: the loss itself)
    where: str          # a cell path or a parameter name
    amp_value: float    # max |value| there under AMP (inf/nan when not finite)
    fp32_value: float   # the FP32 twin's, when known (nan otherwise)

    def describe(self) -> str:
        what = {"forward": "output of cell", "gp_inner": "penalty's inner gradient through",
                "backward": "gradient of", "loss": "the loss, with every cell's output finite:"}[self.phase]
        twin = f", FP32 {self.fp32_value:.4g}" if np.isfinite(self.fp32_value) else ""
        return (f"step {self.iteration} ({self.net} step), {self.phase}: {what} {self.where}: "
                f"AMP max|x| {self.amp_value:.4g}{twin}")


def cell_paths(roots: dict[str, nn.Cell]) -> dict[int, str]:
    """id(cell) -> its keep-list path (`critic.score.0`, `head`); KeepFP32 wrappers are transparent."""
    out: dict[int, str] = {}
    for root, net in roots.items():
        for name, cell in net.cells_and_names():
            if id(cell) in out or not name:
                continue
            parent, _, last = name.rpartition(".")
            if last == "cell" and parent and isinstance(dict(net.cells_and_names()).get(parent), KeepFP32):
                name = parent
            out[id(cell)] = ".".join(p for p in (root, name) if p)
    return out


class _Recorder:
    """Forward hooks on every named cell: (path, max |output|) in completion order."""

    def __init__(self, roots: dict[str, nn.Cell]):
        self.paths = cell_paths(roots)
        self.seen: list[tuple[str, float, bool]] = []
        self.handles = []
        for net in roots.values():
            for _, cell in net.cells_and_names():
                if id(cell) in self.paths and not isinstance(cell, KeepFP32):
                    self.handles.append(cell.register_forward_hook(self._hook))

    def _hook(self, cell, inputs, output):
        outs = output if isinstance(output, (tuple, list)) else (output,)
        vals = [np.abs(o.asnumpy().astype(np.float64)) for o in outs if hasattr(o, "asnumpy")]
        if not vals:
            return
        peak = max(float(v.max()) if np.isfinite(v).all() else float("inf") for v in vals)
        fp32 = all(o.dtype != ms.float16 for o in outs if hasattr(o, "dtype"))
        ins = inputs if isinstance(inputs, (tuple, list)) else (inputs,)
        clean_in = all(np.isfinite(i.asnumpy()).all() for i in ins if hasattr(i, "asnumpy"))
        self.seen.append((self.paths[id(cell)], peak, fp32, clean_in))

    def close(self) -> None:
        for h in self.handles:
            h.remove()


def _peaks(task, roots, net, inputs) -> list[tuple[str, float, bool]]:
    rec = _Recorder(roots)
    try:
        task.forward(net, inputs)
    finally:
        rec.close()
    return rec.seen


def locate(task, fp32_task, roots, fp32_roots, ref_step, status, load_fp32_weights) -> Located:
    """Find the failing step's first bad value. `load_fp32_weights(values)` puts the step's weights
    into the FP32 twin (for its evidence values)."""
    net, inputs = ref_step.net, ref_step.inputs
    amp_seen = _peaks(task, roots, net, inputs)
    load_fp32_weights(ref_step.weights)
    fp32_seen = {}
    for path, peak, _, _ in _peaks(fp32_task, fp32_roots, net, inputs):
        fp32_seen[path] = max(fp32_seen.get(path, 0.0), peak)
    for path, peak, is_fp32, clean_in in amp_seen:  # the origin: bad output from clean inputs
        if clean_in and (not np.isfinite(peak) or (is_fp32 and peak > FP16_MAX)):
            return Located(ref_step.iteration, net, "forward", path, peak, fp32_seen.get(path, float("nan")))
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
            return Located(ref_step.iteration, net, "backward", names[i], float("inf"), float("nan"))
    return Located(ref_step.iteration, net, "loss", "loss", float("nan"), float("nan"))


def _first_layer(root: str, net: nn.Cell) -> str:
    """The net's first cell with its own parameters: where the inner gradient reaches the input."""
    paths = cell_paths({root: net})
    for _, cell in net.cells_and_names():
        if id(cell) in paths and not isinstance(cell, KeepFP32) and list(cell.get_parameters(expand=False)):
            return paths[id(cell)]
    return root


def ref_step_names(task, net: str) -> tuple[str, ...]:
    return tuple(p.name for p in task.optimised()[net].params)
