"""Classifier step: the task's loss on the net's logits, in FP32 unless `amp.fp32_loss=false`."""

from __future__ import annotations

import mindspore as ms
from mindspore import ops

from ampgan.amp.activations import ActivationPeaks
from ampgan.steps.common import Step, make_step


LOSSES = ("loss", "acc")


def classifier_loss_fn(net, loss, scaler, fp32_loss: bool = True):
    """`loss_fn(x, y) -> (scaled loss, stack(LOSSES))`; diagnose's probes reuse it. `loss(logits, y)`
    is a Cell or function that MindSpore's graph mode compiles (default: nn.CrossEntropyLoss)."""
    loss_dtype = ms.float32 if fp32_loss else ms.float16

    def loss_fn(x, y):
        logits = net(x).astype(loss_dtype)
        value = loss(logits, y).astype(ms.float32).reshape(())
        acc = (logits.argmax(-1) == y).astype(ms.float32).mean()
        return scaler.scale(value), ops.stack([value, acc])

    return loss_fn


def build_classifier_step(net, loss, optimizer, scaler, health_fn, fp32_loss: bool = True, jit: bool = True,
                          peaks: ActivationPeaks | None = None) -> Step:
    """Return step(x, y) with status losses (loss, acc): acc is the batch accuracy; `peaks`: the
    net's activation peaks its measuring variant records (None: none)."""
    loss_fn = classifier_loss_fn(net, loss, scaler, fp32_loss)
    return make_step(loss_fn, net.trainable_params(), optimizer, scaler, health_fn, LOSSES, jit, peaks)
