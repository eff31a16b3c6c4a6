"""Data sets: generated 2-D toy sets and scikit-learn's bundled digits. Nothing is downloaded.

Each loader returns a `Dataset` with a fixed train/test split drawn from `data.seed`.
"""

from ampgan.data.base import Batches, Dataset
from ampgan.data.digits import load_digits_dataset
from ampgan.data.toy2d import gaussians8, gaussians25, swissroll

DATASETS = {
    "gaussians8": gaussians8,
    "gaussians25": gaussians25,
    "swissroll": swissroll,
    "digits": load_digits_dataset,
}


def build_dataset(cfg) -> Dataset:
    """`cfg` is a validated `DataConfig`."""
    return DATASETS[cfg.name](cfg)


__all__ = ["DATASETS", "Batches", "Dataset", "build_dataset"]
