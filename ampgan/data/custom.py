"""A user's own data: `data.source` is a Hydra `_target_` whose call returns arrays or batches.

It returns `(x, y)` or `(x_train, y_train, x_test, y_test)`, or a dict with those keys; or an
iterable of `(x, y)` batches (a generator, a list) or samples, or a `mindspore.dataset`
pipeline, which is read once into arrays. `x` is a
float array of samples, `(N, C, H, W)` images or `(N, F)` points; `y` integer class labels
0 .. K-1 (WGAN-GP ignores them). Without a test split one is cut off with `data.test_fraction`
and `data.seed`, as for ampgan's own sets. Anything else is one AmpganError line.
"""

from __future__ import annotations

import numpy as np

from ampgan import AmpganError
from ampgan.data.base import Dataset, split

KEYS = ("x_train", "y_train", "x_test", "y_test")


def _is_array(a) -> bool:
    return hasattr(a, "shape") and hasattr(a, "dtype")


def _collected(out, target: str) -> dict[str, np.ndarray]:
    """An iterable of (x, y) batches or (x, y) samples, or a mindspore.dataset pipeline: read once
    into arrays (the sampler then draws its own seeded batches, as for any data set)."""
    if hasattr(out, "create_tuple_iterator"):   # a mindspore.dataset pipeline, batched or not
        out = out.create_tuple_iterator(output_numpy=True, num_epochs=1)
    xs, ys = [], []
    for i, item in enumerate(out):
        if not (isinstance(item, (tuple, list)) and len(item) >= 2):
            raise AmpganError(f"data.source: {target}'s item {i} is a {type(item).__name__}; "
                              "an iterable must give (x, y) batches or samples")
        x, y = np.asarray(item[0]), np.asarray(item[1])
        xs.append(x if y.ndim else x[None])     # a sample (scalar label) is a batch of one
        ys.append(y if y.ndim else y[None])
    if not xs:
        raise AmpganError(f"data.source: {target} gave no batches")
    if len({x.shape[1:] for x in xs}) > 1:
        raise AmpganError(f"data.source: {target}'s batches have samples of different shapes "
                          f"{sorted({x.shape[1:] for x in xs})}")
    return {"x_train": np.concatenate(xs), "y_train": np.concatenate(ys)}


def _arrays(out, target: str) -> dict[str, np.ndarray]:
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], (tuple, list)) and len(out[0]) == 2 \
            and _is_array(out[0][0]):
        return _collected(out, target)          # a list of (x, y) batches (not (x, y) as nested lists)
    if not isinstance(out, (dict, tuple, list)) and (hasattr(out, "__iter__") or hasattr(out, "create_tuple_iterator")) \
            and not _is_array(out):
        return _collected(out, target)          # a generator, an iterator, a dataset
    if isinstance(out, dict):
        missing = [k for k in KEYS[:2] if k not in out]
        if missing:
            raise AmpganError(f"data.source: {target} returned a dict without {', '.join(missing)} "
                              f"(want keys {', '.join(KEYS)})")
        return {k: out[k] for k in KEYS if k in out}
    if isinstance(out, (tuple, list)) and len(out) in (2, 4):
        return dict(zip(KEYS, out))
    raise AmpganError(f"data.source: {target} returned a {type(out).__name__}; return (x, y), "
                      "(x_train, y_train, x_test, y_test), a dict with those keys, (x, y) batches or a "
                      "mindspore.dataset")


def _checked(arrays: dict, target: str) -> dict[str, np.ndarray]:
    out = {}
    for key, value in arrays.items():
        a = np.asarray(value)
        if key.startswith("x"):
            if not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.integer)):
                raise AmpganError(f"data.source: {target}'s {key} has dtype {a.dtype}; samples must be numbers")
            if a.ndim not in (2, 4):
                raise AmpganError(f"data.source: {target}'s {key} has shape {a.shape}; want (N, C, H, W) images "
                                  "or (N, F) points")
            a = a.astype(np.float32)
            if not np.isfinite(a).all():
                raise AmpganError(f"data.source: {target}'s {key} holds NaN or infinite values")
        else:
            if not np.issubdtype(a.dtype, np.integer):
                raise AmpganError(f"data.source: {target}'s {key} has dtype {a.dtype}; labels must be integers "
                                  "0 .. classes-1")
            if a.ndim != 1:
                raise AmpganError(f"data.source: {target}'s {key} has shape {a.shape}; want (N,) labels")
            if a.size and a.min() < 0:
                raise AmpganError(f"data.source: {target}'s {key} has negative labels; want 0 .. classes-1")
            a = a.astype(np.int32)
        out[key] = a
    for part in ("train", "test"):
        x, y = out.get(f"x_{part}"), out.get(f"y_{part}")
        if x is not None and len(x) != len(y):
            raise AmpganError(f"data.source: {target} gave {len(x)} x_{part} samples but {len(y)} labels")
    if "x_test" in out and out["x_test"].shape[1:] != out["x_train"].shape[1:]:
        raise AmpganError(f"data.source: {target}'s x_test samples have shape {out['x_test'].shape[1:]}, "
                          f"x_train's {out['x_train'].shape[1:]}")
    return out


def arrays_of(out, target: str) -> dict[str, np.ndarray]:
    """Whatever a data source may return (arrays, batches, a mindspore.dataset), checked, as arrays
    keyed x_train, y_train (and x_test, y_test when it has them)."""
    return _checked(_arrays(out, target), target)


def load_custom(cfg) -> Dataset:
    """`cfg`: a validated DataConfig whose `source` is set."""
    from ampgan.config.targets import instantiate

    target = cfg.source["_target_"]
    out = instantiate(cfg.source, "data.source")
    a = _checked(_arrays(out, target), target)
    if "x_test" not in a:
        if len(a["x_train"]) < 4:
            raise AmpganError(f"data.source: {target} gave {len(a['x_train'])} samples; need at least 4")
        a["x_train"], a["y_train"], a["x_test"], a["y_test"] = split(
            a["x_train"], a["y_train"], cfg.test_fraction, np.random.default_rng(cfg.seed))
    n_classes = int(max(a["y_train"].max(initial=0), a["y_test"].max(initial=0))) + 1
    return Dataset(name=cfg.name, x_train=a["x_train"], y_train=a["y_train"], x_test=a["x_test"],
                   y_test=a["y_test"], n_classes=n_classes)
