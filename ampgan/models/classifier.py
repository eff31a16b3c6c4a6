"""A classifier as two cells, backbone and head, so AMP and diagnosis can treat them apart."""

from __future__ import annotations

from mindspore import nn, ops

from ampgan.models.layers import mlp


class Backbone(nn.Cell):
    """Small CNN with BatchNorm for images (two conv blocks, global average pool); MLP for points."""

    def __init__(self, sample_shape: tuple[int, ...], width: int):
        super().__init__()
        if len(sample_shape) == 1:
            self.body = nn.SequentialCell([mlp([sample_shape[0], width, width]), nn.ReLU()])
            self.out_features = width
        else:
            c = sample_shape[0]
            self.body = nn.SequentialCell([
                nn.Conv2d(c, width, 3, pad_mode="same"), nn.BatchNorm2d(width), nn.ReLU(),
                nn.Conv2d(width, 2 * width, 3, stride=2, pad_mode="same"), nn.BatchNorm2d(2 * width), nn.ReLU(),
                nn.Conv2d(2 * width, 2 * width, 3, pad_mode="same"), nn.BatchNorm2d(2 * width), nn.ReLU(),
                nn.AdaptiveAvgPool2d(1), nn.Flatten(),
            ])
            self.out_features = 2 * width

    def construct(self, x):
        return self.body(x)


class Head(nn.Cell):
    """Dense logits. Two knobs for diagnose's planted cases, both off by default, computed inside
    the head and so in the head's precision under AMP:
    `logit_scale` multiplies the logits (large: float16 rounds them coarsely);
    `norm_scale` > 0 makes it a cosine head: the features, times norm_scale, are divided by their
    L2 norm before the Dense (the scale cancels; large: float16's sum of squares overflows);
    `feature_offset` > 0: the features, plus the offset, are centred (their mean over features
    subtracted: the offset cancels; large: float16 keeps 11 significant bits of features + offset,
    so 1e3 rounds the features to steps of 0.5 before the cancellation: precision, not range)."""

    def __init__(self, in_features: int, n_classes: int, logit_scale: float = 1.0, norm_scale: float = 0.0,
                 feature_offset: float = 0.0):
        super().__init__()
        self.fc = nn.Dense(in_features, n_classes)
        self.logit_scale = float(logit_scale)
        self.norm_scale = float(norm_scale)
        self.feature_offset = float(feature_offset)

    def construct(self, features):
        if self.feature_offset > 0:
            shifted = features + self.feature_offset
            features = shifted - shifted.mean(-1, keep_dims=True)
        if self.norm_scale > 0:
            x = features * self.norm_scale
            features = x / ops.sqrt(ops.square(x).sum(-1, keepdims=True) + 1e-6)
        logits = self.fc(features)
        if self.logit_scale != 1.0:
            logits = logits * self.logit_scale
        return logits


class Classifier(nn.Cell):
    def __init__(self, sample_shape: tuple[int, ...], n_classes: int, width: int, logit_scale: float = 1.0,
                 norm_scale: float = 0.0, feature_offset: float = 0.0):
        super().__init__()
        self.backbone = Backbone(sample_shape, width)
        self.head = Head(self.backbone.out_features, n_classes, logit_scale, norm_scale, feature_offset)

    def forward_features(self, x):
        return self.backbone(x)

    def forward_head(self, features):
        return self.head(features)

    def construct(self, x):
        return self.forward_head(self.forward_features(x))
