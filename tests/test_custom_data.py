"""data.source beyond arrays: a generator of batches, a list of batches, a mindspore.dataset
pipeline (batched or sample by sample), each read once into arrays and checked like arrays."""

from __future__ import annotations

import numpy as np
import pytest

from ampgan import AmpganError
from ampgan.config.schema import DataConfig
from ampgan.data.custom import load_custom


def _arrays(n: int = 40):
    rng = np.random.default_rng(0)
    y = np.arange(n) % 4
    return (rng.standard_normal((n, 3)) + y[:, None]).astype(np.float32), y.astype(np.int64)


def batch_generator():
    x, y = _arrays()
    for start in range(0, len(x), 8):
        yield x[start : start + 8], y[start : start + 8]


def batch_list():
    return list(batch_generator())


def mindspore_batches():
    import mindspore.dataset as ds

    x, y = _arrays()
    return ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(8)


def mindspore_samples():
    import mindspore.dataset as ds

    x, y = _arrays()
    return ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False)


def ragged_batches():
    x, y = _arrays()
    yield x[:8], y[:8]
    yield x[8:16, :2], y[8:16]


def not_pairs():
    yield from [1, 2, 3]


def empty():
    yield from ()


def _load(name: str):
    return load_custom(DataConfig(name="custom", source={"_target_": f"tests.test_custom_data.{name}"}))


@pytest.mark.parametrize("name", ["batch_generator", "batch_list", "mindspore_batches", "mindspore_samples"])
def test_batches_and_pipelines_read_into_the_same_arrays(name):
    data = _load(name)
    x, y = _arrays()
    assert len(data.x_train) + len(data.x_test) == len(x) and data.n_classes == 4
    assert data.x_train.dtype == np.float32 and data.y_train.dtype == np.int32 and data.sample_shape == (3,)
    # every sample arrives with its own label, whichever way it came
    pairs = {tuple(row.round(5)): label for row, label in zip(x, y)}
    got = np.concatenate([data.x_train, data.x_test]), np.concatenate([data.y_train, data.y_test])
    assert all(pairs[tuple(row.round(5))] == label for row, label in zip(*got))


@pytest.mark.parametrize("name,message", [
    ("ragged_batches", "batches have samples of different shapes"),
    ("not_pairs", "item 0 is a int; an iterable must give (x, y) batches or samples"),
    ("empty", "gave no batches"),
])
def test_bad_batches_are_one_line(name, message):
    with pytest.raises(AmpganError) as err:
        _load(name)
    assert message in str(err.value) and "\n" not in str(err.value)
