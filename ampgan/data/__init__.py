"""Data sets: generated 2-D toy sets and scikit-learn's bundled digits. Nothing is downloaded.

Each loader returns a `Dataset` with a fixed train/test split drawn from `data.seed`.
"""

from ampgan.data import digits, toy2d
from ampgan.data.base import Batches, Dataset
from ampgan.data.digits import load_digits_dataset
from ampgan.data.toy2d import gaussians8, gaussians25, swissroll

DATASETS = {
    "gaussians8": gaussians8,
    "gaussians25": gaussians25,
    "swissroll": swissroll,
    "digits": load_digits_dataset,
}


_TRAIN_SIZES = {"gaussians8": toy2d.train_size, "gaussians25": toy2d.train_size,
                "swissroll": toy2d.train_size, "digits": digits.train_size}


def build_dataset(cfg) -> Dataset:
    """`cfg` is a validated `DataConfig`."""
    return DATASETS[cfg.name](cfg)


def train_size(cfg) -> int:
    """Samples in the training split `build_dataset(cfg)` would give, without building the set."""
    return _TRAIN_SIZES[cfg.name](cfg)


__all__ = ["DATASETS", "Batches", "Dataset", "build_dataset", "train_size"]
