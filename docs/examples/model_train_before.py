"""A mindcv-style training script: MindSpore's Model.train on the 8x8 digits, at O2."""

import argparse

import mindcv
import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore import nn
from mindspore.train import LossMonitor, Model
from sklearn.datasets import load_digits


def digits(batch_size: int, batches: int):
    d = load_digits()
    x = np.repeat(np.repeat(d.images[:, None] / 16.0, 2, 2), 2, 3).astype(np.float32)   # 16x16
    y = d.target.astype(np.int32)
    return ds.NumpySlicesDataset({"image": x, "label": y}, shuffle=False).batch(batch_size).take(batches)


def main(epochs: int, batches: int) -> None:
    ms.set_seed(0)
    net = mindcv.create_model("mobilenet_v1_025", pretrained=False, num_classes=10, in_channels=1)
    loss_fn = nn.CrossEntropyLoss()
    optimizer = nn.Adam(net.trainable_params(), learning_rate=0.01)
    model = Model(net, loss_fn, optimizer, amp_level="O2", loss_scale_manager=None)  # CPU: no loss scaling
    model.train(epochs, digits(32, batches), callbacks=[LossMonitor(8)], dataset_sink_mode=False)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batches", type=int, default=8)
    args = parser.parse_args()
    main(args.epochs, args.batches)
