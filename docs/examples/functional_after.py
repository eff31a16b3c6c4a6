"""A functional training loop: value_and_grad, MindSpore's dynamic loss scaler, O2."""

import argparse

import mindspore as ms
import numpy as np
from mindspore import amp, nn
from sklearn.datasets import load_digits

from ampgan import api  # ampgan


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.body = nn.SequentialCell([nn.Dense(64, 64), nn.ReLU(), nn.Dense(64, 10)])

    def construct(self, x):
        return self.body(x)


def main(steps: int) -> None:
    d = load_digits()
    x, y = (d.images.reshape(-1, 64) / 16.0).astype(np.float32), d.target.astype(np.int32)
    ms.set_seed(0)
    net = amp.auto_mixed_precision(Net(), "O2")
    loss_fn = nn.CrossEntropyLoss()
    optimizer = nn.Adam(net.trainable_params(), learning_rate=1e-3)
    loss_scaler = api.loss_scaler("underflow_aware", init_scale=2**16, factor=2, window=50)  # ampgan

    def forward(data, label):
        loss = loss_fn(net(data), label)
        return loss_scaler.scale(loss), loss

    grad_fn = ms.value_and_grad(forward, None, optimizer.parameters, has_aux=True)

    @ms.jit
    def train_step(data, label):
        (_, loss), grads = grad_fn(data, label)
        grads = loss_scaler.unscale(grads)
        finite = amp.all_finite(grads)
        loss_scaler.adjust(finite)
        if finite:
            optimizer(grads)
        return loss, finite, grads

    with api.monitor(net=net, optimizer=optimizer, loss=loss_fn, amp="O2") as monitor:  # ampgan
        for i in range(steps):
            data, label = ms.Tensor(x[32 * i:32 * (i + 1)]), ms.Tensor(y[32 * i:32 * (i + 1)])
            loss, finite, grads = train_step(data, label)
            monitor.step(loss, finite, loss_scaler, grads, batch=(data, label))  # ampgan
    print("loss", float(loss.asnumpy()), "scale", float(loss_scaler.scale_value.asnumpy()))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=50)
    main(parser.parse_args().steps)
