"""The data set container and a seeded, endless mini-batch sampler."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ampgan import AmpganError


@dataclass
class Dataset:
    name: str
    x_train: np.ndarray           # float32, (N, 2) points or (N, 1, H, W) images in [-1, 1]
    y_train: np.ndarray           # int32 class labels (mode index for the Gaussians; -1 when none)
    x_test: np.ndarray
    y_test: np.ndarray
    n_classes: int
    modes: np.ndarray | None = None       # (K, 2) centres of the mixture, when it has modes
    mode_radius: float = 0.0              # a sample this close to a centre is "high quality"
    info: dict = field(default_factory=dict)

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])

    @property
    def is_image(self) -> bool:
        return self.x_train.ndim == 4


def held_out(n: int, test_fraction: float) -> int:
    """How many of a class's `n` samples go to the test split (at least one)."""
    return max(1, round(n * test_fraction))


def train_count(class_counts, test_fraction: float) -> int:
    """Training-split size of a set with these class counts, as `split` cuts it."""
    return int(sum(int(n) - held_out(int(n), test_fraction) for n in class_counts if n > 0))


def split(x: np.ndarray, y: np.ndarray, test_fraction: float, rng: np.random.Generator):
    """Shuffle with `rng` and cut off the test part; every class keeps its share (stratified)."""
    test_idx = []
    for label in np.unique(y):
        idx = np.flatnonzero(y == label)
        rng.shuffle(idx)
        test_idx.append(idx[: held_out(len(idx), test_fraction)])
    test = np.zeros(len(y), dtype=bool)
    test[np.concatenate(test_idx)] = True
    train_idx, test_idx = np.flatnonzero(~test), np.flatnonzero(test)
    rng.shuffle(train_idx)
    return x[train_idx], y[train_idx], x[test_idx], y[test_idx]


class Batches:
    """Endless mini-batches: a fresh permutation each epoch, drawn from its own seeded RNG."""

    def __init__(self, x: np.ndarray, y: np.ndarray, batch_size: int, seed: int):
        if batch_size > len(x):
            raise AmpganError(f"trainer.batch_size={batch_size} is larger than the {len(x)} training samples")
        self.x, self.y, self.batch_size = x, y, batch_size
        self.rng = np.random.default_rng(seed)
        self._order = np.empty(0, dtype=np.int64)
        self._pos = 0

    def next(self) -> tuple[np.ndarray, np.ndarray]:
        if self._pos + self.batch_size > len(self._order):
            self._order = self.rng.permutation(len(self.x))
            self._pos = 0
        idx = self._order[self._pos : self._pos + self.batch_size]
        self._pos += self.batch_size
        return self.x[idx], self.y[idx]

    def state(self) -> dict:
        """The sampler's position (RNG, epoch order, offset) as JSON-able values, for checkpoints."""
        return {"rng": self.rng.bit_generator.state, "order": self._order.tolist(), "pos": self._pos}

    def load_state(self, state: dict) -> None:
        self.rng.bit_generator.state = state["rng"]
        self._order = np.asarray(state["order"], dtype=np.int64)
        self._pos = int(state["pos"])
