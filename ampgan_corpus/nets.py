"""Nets with one float16 hazard each: classifiers with a planted head, WGAN-GP critics with planted
initial weights or input scale.

Each is a mindspore.nn.Cell with a `backbone` and a `head` child (its cell paths: `head`,
`head.fc`), built from the data's `sample_shape` and `num_classes` as any model.net target is.
The hazard computes the same function in FP32; only float16 breaks it.
"""

from __future__ import annotations

import mindspore as ms
from mindspore import nn, ops

from ampgan.models.classifier import Backbone
from ampgan.models.wgan_gp import Critic


class _Planted(nn.Cell):
    """ampgan's backbone, then `head_cls(features, num_classes, knob)` (built in that order, so the
    weights are those of ampgan's own Classifier with the same seed)."""

    def __init__(self, sample_shape, num_classes: int, width: int, head_cls, knob: float):
        super().__init__()
        self.backbone = Backbone(tuple(sample_shape), width)
        self.head = head_cls(self.backbone.out_features, num_classes, knob)

    def construct(self, x):
        return self.head(self.backbone(x))


class ScaledLogitsHead(nn.Cell):
    """Dense logits times `scale`: 1e-4 makes every gradient ~1e-4 of its size (underflow in float16)."""

    def __init__(self, in_features: int, num_classes: int, scale: float):
        super().__init__()
        self.fc = nn.Dense(in_features, num_classes)
        self.scale = float(scale)

    def construct(self, features):
        return self.fc(features) * self.scale


class CosineHead(nn.Cell):
    """Features times `scale`, divided by their L2 norm, then Dense: the scale cancels, but 1e5
    squared overflows float16's sum of squares (inf / inf: NaN)."""

    def __init__(self, in_features: int, num_classes: int, scale: float):
        super().__init__()
        self.fc = nn.Dense(in_features, num_classes)
        self.scale = float(scale)

    def construct(self, features):
        x = features * self.scale
        return self.fc(x / ops.sqrt(ops.square(x).sum(-1, keepdims=True) + 1e-6))


class OffsetCentredHead(nn.Cell):
    """Features plus `offset`, centred, then Dense: the offset cancels, but float16 keeps 11 bits
    of offset + x (steps of 0.5 at 1e3, 8 at 1.6e4): precision, not range."""

    def __init__(self, in_features: int, num_classes: int, offset: float):
        super().__init__()
        self.fc = nn.Dense(in_features, num_classes)
        self.offset = float(offset)

    def construct(self, features):
        shifted = features + self.offset
        return self.fc(shifted - shifted.mean(-1, keep_dims=True))


def scaled_logits(sample_shape, num_classes: int, logit_scale: float, width: int = 32) -> nn.Cell:
    return _Planted(sample_shape, num_classes, width, ScaledLogitsHead, logit_scale)


def cosine_head(sample_shape, num_classes: int, norm_scale: float, width: int = 32) -> nn.Cell:
    return _Planted(sample_shape, num_classes, width, CosineHead, norm_scale)


def offset_centred(sample_shape, num_classes: int, feature_offset: float, width: int = 32) -> nn.Cell:
    return _Planted(sample_shape, num_classes, width, OffsetCentredHead, feature_offset)


class ScaledCritic(Critic):
    """ampgan's critic with planted initial weights: every weight and bias times `gain` (0.1:
    gradients far below float16's normal range, so a loss scale of 1 flushes them); `input_scale`
    multiplies the input and divides the first layer's initial weights by the same factor, so
    the function is unchanged but the penalty's inner gradient (w.r.t. the scaled input) is
    1/input_scale times larger (1e-4: beyond float16's range)."""

    def __init__(self, sample_shape, hidden: int, depth: int, gain: float = 1.0, input_scale: float = 1.0):
        super().__init__(sample_shape, hidden, depth)
        self.input_scale = float(input_scale)
        scale_init(self, gain, first_layer=1.0 / self.input_scale)

    def construct(self, x):
        return ops.squeeze(self.score(self.features(x * self.input_scale)), -1)


def scale_init(net: nn.Cell, gain: float, first_layer: float = 1.0) -> None:
    """Multiply the initial weights and biases of every Dense/Conv cell by `gain` (the first one
    by `gain * first_layer` too, weights only). Call at construction, before anything is compiled."""
    layers = [c for _, c in net.cells_and_names() if isinstance(c, (nn.Dense, nn.Conv2d, nn.Conv2dTranspose))]
    for i, cell in enumerate(layers):
        for param in cell.get_parameters(expand=False):
            factor = gain * (first_layer if i == 0 and param.ndim > 1 else 1.0)
            param.set_data(ms.Tensor(param.asnumpy() * factor))
