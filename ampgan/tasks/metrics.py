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


class ClassJudge:
    """The quality of generated images of a labelled set, judged by a classifier of the real ones.

    Fitted once on the training split (scikit-learn's MLP, one hidden layer of `hidden` ReLUs,
    in FP32, seeded), outside the run's nets and precision. On a batch of generated images it gives
      class_confidence  the mean of the judge's top class probability: how much each sample looks
                        like some class of the real set (real test images: `real["class_confidence"]`);
      classes_covered   the classes that take at least `min_share` of an even share of the samples'
                        predicted classes (as `mode_coverage` counts modes): collapse onto a few
                        classes lowers it;
      judge_fd          the Frechet distance between the judge's hidden features of the samples and
                        of the real test images (as FID, in a feature space fitted on this set:
                        no network weights are downloaded); the train split against the test split
                        gives its floor, `real["judge_fd"]`.
    """

    def __init__(self, x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, y_test: np.ndarray,
                 n_classes: int, seed: int = 0, hidden: int = 64, min_share: float = 0.2):
        import warnings

        from sklearn.exceptions import ConvergenceWarning
        from sklearn.neural_network import MLPClassifier

        self.n_classes, self.min_share = n_classes, min_share
        self.model = MLPClassifier(hidden_layer_sizes=(hidden,), max_iter=300, random_state=seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            self.model.fit(_flat(x_train), y_train)
        self.test_features = self.features(x_test)
        self.test_stats = _gaussian(self.test_features)
        self.accuracy = float((self.model.predict(_flat(x_test)) == y_test).mean())
        self.real = {"class_confidence": float(self.model.predict_proba(_flat(x_test)).max(axis=1).mean()),
                     "judge_fd": frechet_distance(_gaussian(self.features(x_train)), self.test_stats)}

    def features(self, x: np.ndarray) -> np.ndarray:
        """The judge's hidden layer: ReLU(x W + b)."""
        return np.maximum(_flat(x) @ self.model.coefs_[0] + self.model.intercepts_[0], 0.0)

    def __call__(self, samples: np.ndarray) -> dict[str, float]:
        probs = self.model.predict_proba(_flat(samples))
        counts = np.bincount(probs.argmax(axis=1), minlength=self.n_classes)
        covered = int((counts >= self.min_share * len(samples) / self.n_classes).sum())
        return {"class_confidence": float(probs.max(axis=1).mean()), "classes_covered": float(covered),
                "classes_total": float(self.n_classes),
                "judge_fd": frechet_distance(_gaussian(self.features(samples)), self.test_stats)}


def _flat(x: np.ndarray) -> np.ndarray:
    return x.reshape(len(x), -1).astype(np.float64)


def _gaussian(features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return features.mean(axis=0), np.cov(features, rowvar=False)


def frechet_distance(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray], eps: float = 1e-6) -> float:
    """Frechet distance of two Gaussians (mean, covariance): |m1 - m2|^2 + tr(S1 + S2 - 2 (S1 S2)^(1/2)).
    `eps` on the diagonals keeps the product's square root defined when a feature never fires
    (a ReLU unit dead on every sample has zero variance)."""
    import warnings

    from scipy import linalg

    (m1, s1), (m2, s2) = a, b
    offset = eps * np.eye(len(s1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", linalg.LinAlgWarning)
        root = linalg.sqrtm((s1 + offset) @ (s2 + offset))
    root = root.real if np.iscomplexobj(root) else root
    return float(max(0.0, np.sum((m1 - m2) ** 2) + np.trace(s1 + s2 - 2.0 * root)))
