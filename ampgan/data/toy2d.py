"""The 2-D toy sets of the WGAN-GP paper (Gulrajani et al. 2017, gan_toy.py), generated from a seed."""

from __future__ import annotations

import numpy as np

from ampgan.data.base import Dataset, split, train_count

MODES = {"gaussians8": 8, "gaussians25": 25}


def n_points(cfg) -> int:
    """Points generated in all: `n_train` is the training share of them."""
    return int(cfg.n_train / (1 - cfg.test_fraction))


def _labels(cfg, n_modes: int, rng: np.random.Generator) -> np.ndarray:
    """The mode of every point: the first draw from the set's RNG."""
    return rng.integers(0, n_modes, size=n_points(cfg)).astype(np.int32)


def train_size(cfg) -> int:
    """Training-split size of a toy set, from its labels alone (no points are generated)."""
    if cfg.name in MODES:
        labels = _labels(cfg, MODES[cfg.name], np.random.default_rng(cfg.seed))
        return train_count(np.bincount(labels), cfg.test_fraction)
    return train_count([n_points(cfg)], cfg.test_fraction)  # swissroll: one unlabelled class


def _mixture(cfg, centres: np.ndarray, norm: float) -> Dataset:
    rng = np.random.default_rng(cfg.seed)
    n = n_points(cfg)
    labels = _labels(cfg, len(centres), rng)
    points = (centres[labels] + cfg.noise * rng.standard_normal((n, 2))) / norm
    x_train, y_train, x_test, y_test = split(points.astype(np.float32), labels, cfg.test_fraction, rng)
    return Dataset(
        name=cfg.name, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test,
        n_classes=len(centres), modes=(centres / norm).astype(np.float32),
        mode_radius=max(3 * cfg.noise / norm, 0.05),
    )


def gaussians8(cfg) -> Dataset:
    """Eight Gaussians on a circle of radius 2, scaled by 1/sqrt(2) (paper: std 0.02)."""
    angles = np.arange(8) * (2 * np.pi / 8)
    centres = 2.0 * np.stack([np.cos(angles), np.sin(angles)], axis=1)
    return _mixture(cfg, centres, norm=np.sqrt(2.0))


def gaussians25(cfg) -> Dataset:
    """A 5x5 grid of Gaussians at -4..4, scaled by 1/(2 sqrt(2)) (paper: std 0.05)."""
    grid = np.arange(-2, 3) * 2.0
    centres = np.array([(x, y) for x in grid for y in grid])
    return _mixture(cfg, centres, norm=2 * np.sqrt(2.0))


def swissroll(cfg) -> Dataset:
    """scikit-learn's Swiss roll, first and third coordinates, divided by 7.5 (paper: noise 0.25)."""
    from sklearn.datasets import make_swiss_roll

    rng = np.random.default_rng(cfg.seed)
    n = n_points(cfg)
    points, _ = make_swiss_roll(n, noise=cfg.noise, random_state=cfg.seed)
    points = (points[:, [0, 2]] / 7.5).astype(np.float32)
    labels = np.full(n, -1, dtype=np.int32)
    x_train, y_train, x_test, y_test = split(points, labels, cfg.test_fraction, rng)
    return Dataset(name=cfg.name, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test, n_classes=0)
