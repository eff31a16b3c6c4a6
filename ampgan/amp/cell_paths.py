"""Cell paths, one home for headroom and locate: a cell's keep-list path in a task's nets, with AMP's
wrappers transparent.

A path is the net's name in the task (`critic`, `gen`; "" for the classifier) and the cell's
attribute names below it (`critic.score.0`, `head.fc`). AMP wraps cells: ampgan's `KeepFP32`
(its `cell`) and MindSpore's O2 output casts `_OutputTo16` / `_OutputTo32` (their `_backbone`;
private names in 2.10, looked up so that their absence only shows the attribute in paths). A
wrapped cell takes the wrapper's path, as in the FP32 twin (a black-listed LayerNorm is
`blocks.0.norm1`, not `blocks.0.norm1._backbone`).
"""

from __future__ import annotations

from mindspore import nn
from mindspore.train import amp as ms_amp

from ampgan.amp.policy import KeepFP32

# (wrapper type, the attribute that holds the wrapped cell)
AMP_WRAPPERS = ((KeepFP32, "cell"), *((getattr(ms_amp, n), "_backbone") for n in ("_OutputTo16", "_OutputTo32")
                                      if hasattr(ms_amp, n)))


def is_wrapper(cell: nn.Cell) -> bool:
    """An AMP wrapper (its child takes its path)."""
    return isinstance(cell, tuple(wrapper for wrapper, _ in AMP_WRAPPERS))


def unwrapped(cell: nn.Cell) -> nn.Cell:
    """The user's cell inside AMP's wrappers (`auto_mixed_precision(net, "O2")` returns an `_OutputTo32`)."""
    while is_wrapper(cell):
        cell = next(getattr(cell, attr) for wrapper, attr in AMP_WRAPPERS if isinstance(cell, wrapper))
    return cell


def child_path(parent: nn.Cell, path: str, name: str) -> str:
    """The path of `parent`'s child `name`, `parent` being at `path`: the parent's own when it is a wrapper."""
    return path if is_wrapper(parent) else ".".join(p for p in (path, name) if p)


def cell_paths(roots: dict[str, nn.Cell]) -> dict[int, str]:
    """id(cell) -> its keep-list path (`critic.score.0`, `head`); the roots themselves are left out.

    AMP's wrappers are transparent: ampgan's `KeepFP32` and MindSpore's O2 `_OutputTo16` /
    `_OutputTo32` (a black-listed LayerNorm is `blocks.0.norm1`, as in the FP32 twin, not
    `blocks.0.norm1._backbone`): the wrapped cell takes the wrapper's path."""
    out: dict[int, str] = {}
    for root, net in roots.items():
        named = dict(net.cells_and_names())
        for name, cell in named.items():
            if id(cell) in out or not name:
                continue
            parts = name.split(".")
            local = ".".join(part for i, part in enumerate(parts)
                             if not any(part == attr and isinstance(named.get(".".join(parts[:i])), wrapper)
                                        for wrapper, attr in AMP_WRAPPERS))
            if local:
                out[id(cell)] = ".".join(p for p in (root, local) if p)
    return out
