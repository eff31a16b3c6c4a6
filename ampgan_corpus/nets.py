"""Classifiers with one float16 hazard each, planted in the head so the expected verdict has one place.

Each is a mindspore.nn.Cell with a `backbone` and a `head` child (its cell paths: `head`,
`head.fc`), built from the data's `sample_shape` and `num_classes` as any model.net target is.
The hazard computes the same function in FP32; only float16 breaks it.
"""

from __future__ import annotations

from mindspore import nn, ops

from ampgan.models.classifier import Backbone


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
    of 1e3 + x (steps of 0.5): precision, not range."""

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
