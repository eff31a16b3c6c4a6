"""Apply an AMP level and FP32 keep-lists to a Cell, with MindSpore's own amp functions.

A keep-list entry (`amp.keep_fp32`) is either
  - a cell *type*: a `mindspore.nn` class name such as `Dense` or `BatchNorm2d` (one word,
    no dot, starting with an upper-case letter): every cell of that type is kept, or
  - a cell *path*: anything else (dotted names), the name of one cell as `cells_and_names()` spells
    it, prefixed with the net's root in the task (`critic.score.0`, `gen.body.2`; the
    classifier's root is empty: `head`, `backbone.body.0`). Custom cells work too (`head`).
A kept cell computes in FP32 (its inputs and parameters are cast to FP32) and its output goes
back to what the level expects (float16 under O2/O3, FP32 under O1); the rest of the net keeps
its level. Parameter names are the same before and after `apply_amp`.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable

import mindspore as ms
from mindspore import amp, nn

from ampgan import AmpganError

_TYPE_NAME = re.compile(r"[A-Z][A-Za-z0-9_]*")
_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.([A-Za-z_][A-Za-z0-9_]*|[0-9]+))*")


def is_type_name(entry: str) -> bool:
    """A keep-list entry names a cell type when it is one word starting with an upper-case letter."""
    return _TYPE_NAME.fullmatch(entry) is not None


def _cell_classes() -> list[str]:
    return [name for name in dir(nn) if isinstance(getattr(nn, name), type) and issubclass(getattr(nn, name), nn.Cell)]


def o2_keeps_fp32(cell: nn.Cell) -> bool:
    """O2 computes cells of this type in FP32 (MindSpore's black list: BatchNorm, LayerNorm...)."""
    return isinstance(cell, tuple(amp.get_black_list()))


def resolve_cell_types(entries: list[str]) -> list[type]:
    """Validate a keep-list; return the `mindspore.nn` classes its type names stand for.

    Type names must be `mindspore.nn` cell classes; paths are only checked for their syntax
    here (whether a path names a cell is known once the nets exist: `check_keep_paths`).
    """
    types = []
    for entry in entries:
        if not isinstance(entry, str) or not entry:
            raise AmpganError(f"amp.keep_fp32: entries must be cell type names or cell paths, got '{entry}'")
        if is_type_name(entry):
            if entry not in _cell_classes():
                close = difflib.get_close_matches(entry, _cell_classes(), n=1)
                hint = f"did you mean '{close[0]}'?" if close else "e.g. Dense, Conv2d, BatchNorm2d"
                raise AmpganError(f"amp.keep_fp32: '{entry}' is not a mindspore.nn cell class ({hint}); "
                                  "cell paths start with a lower-case name (e.g. critic.score.0, head)")
            types.append(getattr(nn, entry))
        elif _PATH.fullmatch(entry) is None:
            raise AmpganError(f"amp.keep_fp32: '{entry}' is neither a mindspore.nn cell class (e.g. Dense) "
                              "nor a dotted cell path (e.g. critic.score.0, head)")
    return types


def _paths(keep_fp32: Iterable[str]) -> list[str]:
    return [e for e in keep_fp32 if not is_type_name(e)]


def _local(path: str, root: str) -> str | None:
    """`path` relative to the net named `root` ("" for the net itself), None if it is another net's."""
    if not root:
        return path
    if path == root:
        return ""
    return path[len(root) + 1:] if path.startswith(root + ".") else None


def _all_paths(nets: dict[str, nn.Cell]) -> list[str]:
    out = []
    for root, net in nets.items():
        for name, _ in net.cells_and_names():
            full = ".".join(p for p in (root, name) if p)
            if full:
                out.append(full)
    return out


def _no_cell_error(path: str, nets: dict[str, nn.Cell]) -> AmpganError:
    known = _all_paths(nets)
    close = difflib.get_close_matches(path, known, n=1, cutoff=0.0)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    return AmpganError(f"amp.keep_fp32: '{path}' matches no cell of the model{hint}")


def check_keep_paths(nets: dict[str, nn.Cell], keep_fp32: list[str]) -> None:
    """Raise a one-line AmpganError for a keep-list path that names no cell in any of `nets`.

    `nets` maps each net's root name to the net, before `apply_amp` (e.g. {"critic": critic,
    "gen": gen}, or {"": classifier}). Type names are not checked here (`resolve_cell_types`).
    """
    cells = {root: dict(net.cells_and_names()) for root, net in nets.items()}
    for path in _paths(keep_fp32):
        if not any(_local(path, root) in names for root, names in cells.items()):
            raise _no_cell_error(path, nets)


class KeepFP32(nn.Cell):
    """Holds one kept cell so the O2/O3 black list can name it (parameter names unchanged)."""

    def __init__(self, cell: nn.Cell):
        super().__init__(auto_prefix=False)
        self.cell = cell

    def construct(self, *args):
        return self.cell(*args)


def _outermost(cells: dict[str, nn.Cell]) -> dict[str, nn.Cell]:
    """Drop the paths that lie inside another kept path (that cell is FP32 already)."""
    return {p: c for p, c in cells.items() if not any(p.startswith(q + ".") for q in cells)}


def put_cell(parent: nn.Cell, name: str, cell: nn.Cell) -> None:
    """Make `cell` `parent`'s child `name` in place of the one there (a SequentialCell's list too)."""
    parent._cells[name] = cell  # not setattr: a Cell attribute would get the attribute name as a prefix
    if isinstance(parent, nn.SequentialCell):
        parent.cell_list = list(parent._cells.values())


def _replace(net: nn.Cell, path: str, new: nn.Cell) -> None:
    parent_path, _, name = path.rpartition(".")
    put_cell(dict(net.cells_and_names())[parent_path], name, new)


def apply_amp(net: nn.Cell, level: str, keep_fp32: list[str], root: str = "") -> nn.Cell:
    """Return `net` under AMP `level` ("O0".."O3"), the cells named by `keep_fp32` in FP32.

    `root` is `net`'s name in the task ("critic", "gen", "" for the classifier): path entries
    of another root are left to that net's call; a path under `root` that names no cell
    raises AmpganError. Kept cells, by level:
      O1  every kept cell (by type or path) is marked `to_float(float32)` before MindSpore's
          source rewrite, which then leaves it whole: none of its operators (MatMul inside
          Dense...) is cast. Its output is FP32, as between O1's operators.
      O2/O3  kept types join the black list; a kept path is wrapped in `KeepFP32`, which is
          black-listed too: MindSpore runs it in FP32 and casts its output to float16.
    Keeping `root` itself leaves the whole net in FP32. Parameters stay FP32 and keep their
    names (O1's rewrite renames them; the names are put back). Outputs of the net are FP32.
    Under O2/O3 `net` is changed in place, as MindSpore's functions do, and kept or
    black-listed cells sit inside wrappers afterwards: resolve cell paths before this call.
    """
    types = resolve_cell_types(keep_fp32)
    if level == "O0":
        return net
    cells = dict(net.cells_and_names())
    kept = {}
    for path in _paths(keep_fp32):
        local = _local(path, root)
        if local is None:
            continue
        if local not in cells:
            raise _no_cell_error(path, {root: net})
        kept[local] = cells[local]
    if "" in kept:
        return net
    names = [(p, p.name) for p in net.get_parameters()]
    if level == "O1":
        for name, cell in cells.items():
            if name in kept or (types and isinstance(cell, tuple(types))):
                cell.to_float(ms.float32)
        out = amp.auto_mixed_precision(net, "O1", dtype=ms.float16)
    elif not kept and not types:
        out = amp.auto_mixed_precision(net, level, dtype=ms.float16)
    else:
        for path, cell in _outermost(kept).items():
            _replace(net, path, KeepFP32(cell))
        base = amp.get_black_list() if level == "O2" else []
        black = base + [t for t in types if t not in base] + [KeepFP32]
        out = amp.custom_mixed_precision(net, black_list=black, dtype=ms.float16)
    for param, name in names:
        param.name = name
    return out


def shared_fp32_twin(make: Callable[[], nn.Cell], source: nn.Cell) -> nn.Cell:
    """A second instance of `source`'s architecture that uses `source`'s very Parameter objects.

    Call before AMP is applied to `source`: the twin then computes in FP32 while gradients
    reach the shared parameters (used for the gradient penalty under `amp.fp32_gradient_penalty`).
    """
    twin = make()
    pairs = list(zip(source.cells_and_names(), twin.cells_and_names()))
    for (src_name, src_cell), (dst_name, dst_cell) in pairs:
        if src_name != dst_name or type(src_cell) is not type(dst_cell):
            raise ValueError(f"twin structure differs at '{src_name}' vs '{dst_name}'")
        for key, param in src_cell._params.items():
            setattr(dst_cell, key, param)
    return twin
