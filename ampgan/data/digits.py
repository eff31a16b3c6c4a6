"""scikit-learn's bundled 8x8 handwritten digits (1797 images, shipped in its wheel)."""

from __future__ import annotations

import numpy as np
from PIL import Image

from ampgan.data.base import Dataset, split


def load_digits_dataset(cfg) -> Dataset:
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = digits.images.astype(np.float32) / 16.0  # (N, 8, 8) in [0, 1]
    if cfg.image_size != 8:
        images = np.stack([
            np.asarray(Image.fromarray(img).resize((cfg.image_size, cfg.image_size), Image.BILINEAR))
            for img in images
        ])
    x = (images * 2.0 - 1.0)[:, None, :, :].astype(np.float32)  # (N, 1, S, S) in [-1, 1]
    y = digits.target.astype(np.int32)
    rng = np.random.default_rng(cfg.seed)
    x_train, y_train, x_test, y_test = split(x, y, cfg.test_fraction, rng)
    return Dataset(name=cfg.name, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test, n_classes=10)
