"""Data sets: generated 2-D toy sets, scikit-learn's bundled digits, or a user's `data.source`
target (ampgan.data.custom). Nothing is downloaded.

Each loader returns a `Dataset` with a fixed train/test split drawn from `data.seed`.
"""

from ampgan.data import digits, toy2d
from ampgan.data.base import Batches, Dataset
from ampgan.data.custom import load_custom
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
    """`cfg` is a validated `DataConfig`: its `source` (a user's target) or one of `DATASETS`."""
    if cfg.source is not None:
        return load_custom(cfg)
    return DATASETS[cfg.name](cfg)


def train_size(cfg) -> int | None:
    """Samples in the training split `build_dataset(cfg)` would give, without building the set
    (None for a user's `data.source`: known once it is loaded)."""
    if cfg.source is not None:
        return None
    return _TRAIN_SIZES[cfg.name](cfg)


__all__ = ["DATASETS", "Batches", "Dataset", "build_dataset", "train_size"]
