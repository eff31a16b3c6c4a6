"""Users' own code through Hydra's `_target_`: nets and losses built by `hydra.utils.instantiate`,
checked at the door so that a bad target costs one line and no run.

A net's constructor gets the data's shape by name (`data_shape_args`, passed by
`ampgan.config.targets.instantiate` to the parameters its signature names), so
`model.net._target_=mypkg.Net` is all a user writes. `mindcv.create_model` takes `num_classes`
and `in_channels` this way.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ampgan import AmpganError
from ampgan.config.targets import call_failed, first_line, instantiate

def data_shape_args(sample_shape: tuple[int, ...], num_classes: int) -> dict[str, Any]:
    """What a net may be given from the data: sample_shape ((C, H, W) or (F,)), num_classes,
    in_channels (C, or F for points) and image_size (H, images only)."""
    out: dict[str, Any] = {"sample_shape": tuple(sample_shape), "num_classes": int(num_classes),
                           "in_channels": int(sample_shape[0])}
    if len(sample_shape) == 3:
        out["image_size"] = int(sample_shape[-1])
    return out


def build_net(node: dict, key: str, given: dict[str, Any]):
    """A `mindspore.nn.Cell` with trainable parameters, from `node` (`given`: by name, see `instantiate`)."""
    from mindspore import nn

    net = instantiate(node, key, given)
    if not isinstance(net, nn.Cell):
        raise AmpganError(f"{key}: {node['_target_']} gave a {type(net).__name__}, not a mindspore.nn.Cell")
    if not net.trainable_params():
        raise AmpganError(f"{key}: {node['_target_']} has no trainable parameters: nothing to train")
    return net


def _door_forward(net, inputs: np.ndarray, key: str, what: str):
    """`net(inputs)` in FP32 and inference mode (BatchNorm's moving statistics stay as they are);
    an error in the user's construct is one line naming `key` and the input shape."""
    import mindspore as ms

    training = net.training
    net.set_train(False)
    try:
        return net(ms.Tensor(inputs))
    except Exception as err:  # noqa: BLE001 - the user's construct: one line with its reason
        raise AmpganError(f"{key}: the net does not take {what} of shape {tuple(inputs.shape)} "
                          f"({type(err).__name__}: {first_line(err)})") from None
    finally:
        net.set_train(training)


def check_classifier_fits(net, loss, x: np.ndarray, y: np.ndarray, logits_shape: tuple[int, ...],
                          key: str = "model.net") -> None:
    """One FP32 forward pass on two training samples: the net must map them to logits of shape
    (2, *logits_shape) (the last axis: one per class) that the loss accepts. Any failure is one
    line naming what to change."""
    import mindspore as ms

    x, y = x[:2], y[:2]
    out = _door_forward(net, x, key, "the data's samples")
    shape, want = tuple(getattr(out, "shape", ())), (len(x), *logits_shape)
    if shape != want:
        raise AmpganError(f"{key}: the net maps samples of shape {tuple(x.shape)} to {shape or type(out).__name__}; "
                          f"the loss needs logits of shape {want} for the {want[-1]} classes of the data")
    try:
        value = loss(out.astype(ms.float32), ms.Tensor(y))
    except Exception as err:  # noqa: BLE001
        raise AmpganError(f"model.loss: does not take logits {shape} and labels {tuple(y.shape)} "
                          f"({type(err).__name__}: {first_line(err)})") from None
    if tuple(getattr(value, "shape", (0,))) not in ((), (1,)):
        raise AmpganError(f"model.loss: must return one number per batch, got shape {tuple(value.shape)}")


def check_gan_fits(gen, critic, z_dim: int, x: np.ndarray) -> None:
    """One FP32 pass on two samples: the generator maps (2, z_dim) noise to samples of the data's
    shape, and the critic maps samples to (2,) scores."""
    z = np.zeros((2, z_dim), dtype=np.float32)
    for key, net, inputs, shape in (("model.generator", gen, z, (2, *x.shape[1:])), ("model.critic", critic, x[:2], (2,))):
        got = tuple(getattr(_door_forward(net, inputs, key, "inputs"), "shape", ()))
        if got != shape:
            raise AmpganError(f"{key}: the net maps inputs of shape {tuple(inputs.shape)} to {got}; "
                              f"WGAN-GP needs {shape}")


def build_optimizer(node: dict, key: str, params: list, lr: float, betas) -> object:
    """The optimizer of `params`: `node` is a partial (`_partial_: true` is implied) given lr and
    betas by name where its signature names them; it must be a Cell (the compiled step calls it)."""
    from mindspore import nn

    made = instantiate({**node, "_partial_": True}, key, {"lr": lr, "betas": tuple(betas)})
    try:
        opt = made(params)
    except Exception as err:  # noqa: BLE001 - the user's optimizer: one line with its reason
        raise call_failed(key, node, err, first="the net's parameters") from None
    if not isinstance(opt, nn.Cell):
        raise AmpganError(f"{key}: {node['_target_']} gave a {type(opt).__name__}, not an optimizer Cell "
                          "(mindspore.mint.optim.* or mindspore.nn.* optimizers)")
    return opt
