"""In-graph activation peaks: max |output| of every leaf cell of a net, one small tensor per step.

For each leaf cell (a cell without child cells) of the net a step optimises, the peak is
    max |y| over every output y the cell produced in the step's forward passes
(a cell called several times in one step, e.g. the critic on real, fake and interpolated
samples, counts all its calls); a non-finite output gives a non-finite peak. In a float16 run
the headroom FP16_MAX / peak says how many times larger the activations may grow before the
forward pass overflows.

How it runs inside `ms.jit`: while the step's measuring variant is launched (`watching()`),
each leaf cell sits in its parent behind a `Recording` holder, which calls the cell, then does
    peak <- max(peak, max|y|)            (ops.assign into a float32 scalar Parameter)
MindSpore 2.10 parses the cells' constructs when it compiles a graph and keeps that graph as
compiled, whatever the cell tree looks like later: the measuring variant, always compiled and
launched inside `watching()`, records; the plain variant, compiled and launched on the cells
as they are, holds no activation reduction at all. The step resets every peak to NOT_REACHED
first and stacks them after its update: a cell the step never ran keeps NOT_REACHED. In
PYNATIVE (`hardware.jit=false`) the holders run eagerly.

Measured, not taken on trust: forward hooks would need no holder, but under `ms.jit` MindSpore
2.10 compiles a hook only into a cell called as an attribute (`self.fc(x)`), never into the
cells of a SequentialCell or CellList; a subclass of the cell's class calling its construct
as a function loses the cell's mixed precision (O2's float16 casts).

The holders read the outputs only (stop_gradient) and call the cell as its parent did (its own
mixed precision applies): the forward and backward passes, hence the trajectory, are those of
the cells as they are. Cell paths and parameter names do not change. A net that is itself a
leaf cell has no parent to hold it: it has no peaks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import mindspore as ms
from mindspore import nn, ops

from ampgan.amp.float16 import FP16_MAX
from ampgan.amp.cell_paths import child_path
from ampgan.amp.policy import put_cell

NOT_REACHED = -1.0   # a peak the step's forward passes never set (|y| >= 0 otherwise)
PEAK_PREFIX = "ampgan_act_peak"   # the peaks' Parameter names: ampgan's instruments, no state of the user's net



def leaf_cells(net: nn.Cell, root: str = "") -> list[tuple[str, nn.Cell, list[tuple[nn.Cell, str]]]]:
    """(path, cell, places) of every leaf cell of `net` below it, in `cells_and_names` order, each
    cell once; `places` are the (parent, attribute) pairs that hold it.

    A path is the cell's keep-list path: `root` (the net's name in the task: "critic", "gen",
    "" for the classifier), then the cell's attribute names, without the AMP wrappers' own
    attribute (`_backbone` of MindSpore's output casts, `cell` of KeepFP32)."""
    found: dict[int, tuple[str, nn.Cell, list[tuple[nn.Cell, str]]]] = {}

    def walk(cell: nn.Cell, path: str) -> None:
        for name, child in cell.name_cells().items():
            below = child_path(cell, path, name)   # AMP wrappers are transparent (ampgan.amp.cell_paths)
            if child.name_cells():
                walk(child, below)
            else:
                found.setdefault(id(child), (below, child, []))[2].append((cell, name))

    walk(net, root)
    return list(found.values())


def peak_of(output) -> ms.Tensor:
    """max |y| over a cell's output (a tensor, or a tuple of them) as a float32 scalar.

    ReduceMax on CPU skips a NaN unless it comes first: the sum, which any NaN or inf turns
    non-finite, carries it into the peak (x + 0 * sum is x when the sum is finite)."""
    outs = output if isinstance(output, (tuple, list)) else (output,)
    peak = ops.zeros((), ms.float32)
    for y in outs:
        a = ops.abs(ops.stop_gradient(y).astype(ms.float32))
        peak = ops.maximum(peak, a.max() + 0 * a.sum())
    return peak


class Recording(nn.Cell):
    """Calls `cell` (its own mixed precision applies), then folds max |output| into `slot`.
    Parameter names unchanged (auto_prefix=False)."""

    def __init__(self, cell: nn.Cell, slot: ms.Parameter):
        super().__init__(auto_prefix=False)
        self.cell = cell
        self.slot = slot

    def construct(self, *args, **kwargs):
        y = self.cell(*args, **kwargs)
        ops.assign(self.slot, ops.maximum(self.slot, peak_of(y)))
        return y


class ActivationPeaks:
    """The leaf cells of one net, a peak Parameter and a `Recording` holder per cell.

    `step_fns(measure)` gives the compiled step its (reset, read) pair; the launch of the
    measuring variant runs inside `watching()`, which puts each leaf cell's holder in its place."""

    def __init__(self, net: nn.Cell, root: str = ""):
        leaves = leaf_cells(net, root)
        tag = root or "net"
        self.paths = tuple(path for path, _, _ in leaves)
        self.slots = tuple(ms.Parameter(ms.Tensor(NOT_REACHED, ms.float32), name=f"{PEAK_PREFIX}.{tag}.{i}",
                                        requires_grad=False) for i in range(len(leaves)))
        # (parent, attribute, the cell, its holder) for every place a leaf cell sits in
        self.places = [(parent, name, cell, holder)
                       for (_, cell, places), slot in zip(leaves, self.slots)
                       for holder in [Recording(cell, slot)] for parent, name in places]

    def __len__(self) -> int:
        return len(self.slots)

    @contextmanager
    def watching(self) -> Iterator[None]:
        """Every leaf cell behind its `Recording` holder for the duration of the block (a launch of
        the measuring variant); in its own place again afterwards, whatever happens."""
        try:
            for parent, name, _, holder in self.places:
                put_cell(parent, name, holder)
            yield
        finally:
            for parent, name, cell, _ in self.places:
                put_cell(parent, name, cell)

    def step_fns(self, measure: bool) -> tuple[Callable, Callable]:
        """(reset, read) for a step's body: measuring, reset every peak to NOT_REACHED before the
        forward passes and stack the peaks after them; plain, nothing and zeros of the same shape."""
        slots, n = self.slots, len(self.slots)
        not_reached = ms.Tensor(NOT_REACHED, ms.float32)

        def zeros():
            return ops.zeros((n,), ms.float32)

        if not measure:
            return no_reset, zeros

        def reset():
            for slot in slots:
                ops.assign(slot, not_reached)
            return ops.zeros((), ms.float32)

        def read():
            return ops.stack(list(slots))

        return reset, read


def reset_peaks(peaks: ActivationPeaks) -> None:
    """Every peak of `peaks` back to NOT_REACHED, from the host (in place: a compiled step sees it)."""
    not_reached = ms.Tensor(NOT_REACHED, ms.float32)
    for slot in peaks.slots:
        ops.assign(slot, not_reached)


def no_reset() -> ms.Tensor:
    return ops.zeros((), ms.float32)


def no_peaks() -> ms.Tensor:
    """A step without activation peaks (diagnose's probes): no values in its status."""
    return ops.zeros((0,), ms.float32)


def headroom(peak: float) -> float:
    """FP16_MAX / peak: how many times the activations may grow before float16 overflows (0: not finite)."""
    if not peak < float("inf"):
        return 0.0
    return FP16_MAX / peak if peak > 0 else float("inf")
