"""Classifier step: softmax cross-entropy, in FP32 unless `amp.fp32_loss=false`."""

from __future__ import annotations

import mindspore as ms
from mindspore import ops

from ampgan.steps.common import Step, make_step


LOSSES = ("loss", "acc")


def classifier_loss_fn(net, scaler, fp32_loss: bool = True):
    """`loss_fn(x, y) -> (scaled loss, stack(LOSSES))`; diagnose's probes reuse it."""
    loss_dtype = ms.float32 if fp32_loss else ms.float16

    def loss_fn(x, y):
        logits = net(x).astype(loss_dtype)
        loss = ops.cross_entropy(logits, y).astype(ms.float32)
        acc = (logits.argmax(-1) == y).astype(ms.float32).mean()
        return scaler.scale(loss), ops.stack([loss, acc])

    return loss_fn


def build_classifier_step(net, optimizer, scaler, health_fn, fp32_loss: bool = True, jit: bool = True) -> Step:
    """Return step(x, y) with status losses (loss, acc): acc is the batch accuracy."""
    loss_fn = classifier_loss_fn(net, scaler, fp32_loss)
    return make_step(loss_fn, net.trainable_params(), optimizer, scaler, health_fn, LOSSES, jit)
