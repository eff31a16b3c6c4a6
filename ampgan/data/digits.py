"""scikit-learn's bundled 8x8 handwritten digits (1797 images, shipped in its wheel)."""

from __future__ import annotations

import numpy as np
from PIL import Image

from ampgan.data.base import Dataset, split, train_count

# Images per class (0..9) in scikit-learn's digits: the split's size without loading them.
CLASS_COUNTS = (178, 182, 177, 183, 181, 182, 181, 179, 174, 180)


def train_size(cfg) -> int:
    return train_count(CLASS_COUNTS, cfg.test_fraction)


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
