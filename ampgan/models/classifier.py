"""A classifier as two cells, backbone and head, so AMP and diagnosis can treat them apart."""

from __future__ import annotations

from mindspore import nn

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
    """Dense logits."""

    def __init__(self, in_features: int, num_classes: int):
        super().__init__()
        self.fc = nn.Dense(in_features, num_classes)

    def construct(self, features):
        return self.fc(features)


class Classifier(nn.Cell):
    """ampgan's own classifier, the default `model.net`: the task passes `sample_shape` and
    `num_classes` from the data (ampgan.tasks.targets)."""

    def __init__(self, sample_shape: tuple[int, ...], num_classes: int, width: int = 32):
        super().__init__()
        self.backbone = Backbone(tuple(sample_shape), width)
        self.head = Head(self.backbone.out_features, num_classes)

    def forward_features(self, x):
        return self.backbone(x)

    def forward_head(self, features):
        return self.head(features)

    def construct(self, x):
        return self.forward_head(self.forward_features(x))
