"""In-graph gradient health against the same quantities computed in NumPy."""

from __future__ import annotations

import mindspore as ms
import numpy as np

from ampgan.amp.float16 import FP16_MIN_NORMAL
from ampgan.amp.health import HEALTH_FIELDS, all_finite, global_norm, grad_health


def numpy_health(g: np.ndarray) -> list[float]:
    a = np.abs(g.astype(np.float64)).ravel()
    with np.errstate(invalid="ignore"):
        return [float((a == 0).mean()), float(((a > 0) & (a < FP16_MIN_NORMAL)).mean()),
                float(np.nanmax(a)) if np.isfinite(a).all() else float(a.max()), float((~np.isfinite(a)).sum())]


def test_health_matches_numpy():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((64, 32)).astype(np.float32)
    a[rng.random(a.shape) < 0.3] = 0.0                                         # exact zeros
    a[rng.random(a.shape) < 0.1] = 3e-6                                        # fp16 subnormal range
    a[0, 0] = 2.0**-24                                                         # the smallest subnormal
    a[0, 1] = FP16_MIN_NORMAL                                                  # normal: not counted
    b = (rng.standard_normal(17) * 1e-3).astype(np.float32)
    c = rng.standard_normal((3, 3, 2)).astype(np.float32)
    c[1, 1, 1] = np.inf
    c[2, 0, 0] = np.nan
    grads = [a, b, c]

    @ms.jit
    def health(*gs):
        return grad_health(gs), global_norm(gs[:2])

    got, norm = health(*[ms.Tensor(g) for g in grads])
    got = got.asnumpy()
    assert got.shape == (3, len(HEALTH_FIELDS))
    for row, g in zip(got[:2], grads[:2]):
        np.testing.assert_allclose(row, numpy_health(g), rtol=1e-6)
    assert got[2, 3] == 2.0 and not np.isfinite(got[2, 2])                     # two non-finite elements
    np.testing.assert_allclose(got[2, :2], numpy_health(c)[:2], rtol=1e-6)
    expected_norm = np.sqrt(sum((g.astype(np.float64) ** 2).sum() for g in grads[:2]))
    np.testing.assert_allclose(float(norm.asnumpy()), expected_norm, rtol=1e-5)


def test_all_finite_is_false_exactly_when_an_element_is_not_finite():
    """The step's finite check (one float32 sum per gradient) against NumPy's elementwise check,
    in both dtypes a gradient has, with a float16 gradient whose float16 sum would overflow."""
    rng = np.random.default_rng(0)

    @ms.jit
    def check(*gs):
        return all_finite(gs)

    def grads(dtype16: bool) -> list[np.ndarray]:
        a = rng.standard_normal((16, 8)).astype(np.float32)
        b = np.full(64, 60000.0, np.float16 if dtype16 else np.float32)   # float16's sum: inf; float32's: finite
        return [a, b]

    for dtype16 in (False, True):
        for plant in (None, np.inf, -np.inf, np.nan, "both infinities"):
            gs = grads(dtype16)
            if plant == "both infinities":     # +inf and -inf: their sum is NaN, still not finite
                gs[0][0, 0], gs[0][1, 1] = np.inf, -np.inf
            elif plant is not None:
                gs[1][3] = plant
            expected = all(np.isfinite(g).all() for g in gs)
            got = bool(check(*[ms.Tensor(g) for g in gs]).asnumpy())
            assert got == expected, (dtype16, plant)
