"""Shared building blocks."""

from __future__ import annotations

from mindspore import nn


def mlp(sizes: list[int], final_activation: nn.Cell | None = None) -> nn.SequentialCell:
    """Dense layers with ReLU between them (ReLU, not LeakyReLU: AMP O1 cannot rewrite LeakyReLU)."""
    layers: list[nn.Cell] = []
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Dense(n_in, n_out))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    if final_activation is not None:
        layers.append(final_activation)
    return nn.SequentialCell(layers)


def upsamples_for(image_size: int) -> int:
    """Conv nets work from a 4x4 map: 8x8 images need one stride-2 step, 16x16 two."""
    steps = {8: 1, 16: 2}
    if image_size not in steps:
        raise ValueError(f"conv nets support 8x8 and 16x16 images, got {image_size}")
    return steps[image_size]
