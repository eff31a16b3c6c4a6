"""Apply an AMP level and FP32 keep-lists to a Cell, with MindSpore's own amp functions."""

from __future__ import annotations

from collections.abc import Callable

import mindspore as ms
from mindspore import amp, nn

from ampgan import AmpganError


def resolve_cell_types(names: list[str]) -> list[type]:
    """Map `mindspore.nn` class names (e.g. "Dense", "BatchNorm2d") to classes."""
    types = []
    for name in names:
        cls = getattr(nn, name, None)
        if not (isinstance(cls, type) and issubclass(cls, nn.Cell)):
            raise AmpganError(f"amp.keep_fp32: '{name}' is not a mindspore.nn cell class (e.g. Dense, Conv2d, BatchNorm2d)")
        types.append(cls)
    return types


def apply_amp(net: nn.Cell, level: str, keep_fp32: list[str]) -> nn.Cell:
    """Return `net` under AMP `level` ("O0".."O3"); cells of the `keep_fp32` types stay FP32.

    Without a keep-list this is `amp.auto_mixed_precision`. With one, O2/O3 become
    `custom_mixed_precision(black_list=...)` (O2's own black list plus the keep-list) and O1
    drops the kept types from its white list. Parameters stay FP32 either way; outputs are FP32.
    """
    keep = resolve_cell_types(keep_fp32)
    if level == "O0":
        return net
    if not keep:
        return amp.auto_mixed_precision(net, level, dtype=ms.float16)
    if level == "O1":
        white = [t for t in amp.get_white_list() if t not in keep]
        return amp.custom_mixed_precision(net, white_list=white)
    base = amp.get_black_list() if level == "O2" else []
    return amp.custom_mixed_precision(net, black_list=base + [t for t in keep if t not in base])


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
