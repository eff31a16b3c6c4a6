"""Evaluation metrics, in NumPy: they run outside the compiled graph, on fetched samples."""

from __future__ import annotations

import numpy as np


def sliced_wasserstein(a: np.ndarray, b: np.ndarray, n_projections: int = 256, seed: int = 0) -> float:
    """Mean over random unit directions of the 1-D Wasserstein-1 distance of the projections.

    `a` and `b` are (N, ...) and (M, ...) samples; they are flattened and, when N != M,
    compared through matching quantiles.
    """
    a = a.reshape(len(a), -1).astype(np.float64)
    b = b.reshape(len(b), -1).astype(np.float64)
    rng = np.random.default_rng(seed)
    dirs = rng.standard_normal((a.shape[1], n_projections))
    dirs /= np.linalg.norm(dirs, axis=0, keepdims=True)
    pa, pb = np.sort(a @ dirs, axis=0), np.sort(b @ dirs, axis=0)
    n = max(len(a), len(b))
    q = (np.arange(n) + 0.5) / n
    qa = pa[np.minimum((q * len(a)).astype(int), len(a) - 1)]
    qb = pb[np.minimum((q * len(b)).astype(int), len(b) - 1)]
    return float(np.abs(qa - qb).mean())


def mode_coverage(samples: np.ndarray, modes: np.ndarray, radius: float, min_share: float = 0.2) -> dict[str, float]:
    """How a 2-D generator covers a mixture's modes.

    A sample is high quality when it lies within `radius` of its nearest mode. A mode is
    covered when it holds at least `min_share` of the high-quality samples an even spread
    would give it: min_share * n_samples / n_modes.
    """
    dist = np.linalg.norm(samples[:, None, :] - modes[None, :, :], axis=-1)
    nearest, closest = dist.argmin(axis=1), dist.min(axis=1)
    good = closest <= radius
    counts = np.bincount(nearest[good], minlength=len(modes))
    covered = int((counts >= min_share * len(samples) / len(modes)).sum())
    return {"modes_covered": float(covered), "modes_total": float(len(modes)), "high_quality": float(good.mean())}


def softmax_cross_entropy(logits: np.ndarray, labels: np.ndarray) -> float:
    z = logits - logits.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return float(-logp[np.arange(len(labels)), labels].mean())


def confusion_matrix(pred: np.ndarray, labels: np.ndarray, n_classes: int) -> np.ndarray:
    m = np.zeros((n_classes, n_classes), dtype=np.int64)
    np.add.at(m, (labels, pred), 1)
    return m
