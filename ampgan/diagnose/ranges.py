"""Loss-scale range per layer, from the FP32 gradients' exponent histograms.

With loss scale 2**k, an FP32 gradient element of exponent e (|g| in [2**e, 2**(e+1))) sits at
exponent e + k in float16. It underflows (below the smallest normal 2**-14: subnormal or
flushed) when e + k < -14, and overflows (above 65504 < 2**16) when e + k > 15. A layer's
range is [2**k_lo, 2**k_hi]: k_lo the smallest k with fewer than u of its nonzero elements
underflowing, k_hi the largest with none overflowing. The scale that fits every layer is the
intersection; when it is empty, no single scale works.

Parameter gradients are not every float16 value of the backward pass: FP32's gradient is the
net result after terms cancel, float16 holds the partial sums. Every loss here is a mean over
the batch (|dL/dy| ~ 1/batch per sample), so the output layer's bias gradient sums s x ~1 in
float16 before the real and fake terms (or the classes) cancel: at s = 2^19 it overflows
although FP32's bias gradient is 0. The common range's top is therefore capped at
2^SEED_K_HI (2x headroom below 65504 for that sum), whatever the parameter gradients allow.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ampgan.amp.float16 import FP16_MIN_NORMAL_EXP
from ampgan.diagnose.probe import EXP_MIN

NORMAL_EXP = FP16_MIN_NORMAL_EXP
MAX_EXP = 15         # 2**15 * (2 - 2**-10) = 65504: exponents above 15 overflow
SEED_K_HI = 14       # loss scales above 2**14 overflow the output layer's float16 partial sums (above)


@dataclass
class LayerRange:
    param: str
    k_lo: int | None   # None: no nonzero gradient seen (no constraint)
    k_hi: int | None

    @property
    def empty(self) -> bool:
        return self.k_lo is not None and self.k_hi is not None and self.k_lo > self.k_hi


def layer_range(param: str, hist: np.ndarray, u: float) -> LayerRange:
    """`hist[b]` counts nonzero elements with exponent EXP_MIN + b (summed over the replay's steps)."""
    total = hist.sum()
    if total == 0:
        return LayerRange(param, None, None)
    exps = EXP_MIN + np.arange(len(hist))
    e_max = int(exps[np.flatnonzero(hist)[-1]])
    k_hi = MAX_EXP - e_max
    k_lo = None
    for k in range(-64, 96):
        if hist[exps + k < NORMAL_EXP].sum() < u * total:
            k_lo = k
            break
    return LayerRange(param, k_lo, k_hi)


@dataclass
class ScaleFit:
    layers: list[LayerRange]
    k_lo: int | None
    k_hi: int | None

    @property
    def fits(self) -> bool:
        return self.k_lo is None or self.k_hi is None or self.k_lo <= self.k_hi

    def best(self) -> float | None:
        """The low end of the common range, 2^k_lo (the most headroom that clears underflow); when no
        single scale fits, the top 2^k_hi (the least underflow that does not overflow); None when
        no nonzero gradient was seen."""
        if self.k_lo is None or self.k_hi is None:
            return None
        return float(2.0 ** (self.k_lo if self.fits else self.k_hi))

    def describe(self) -> str:
        if self.k_lo is None:
            return "no nonzero gradients seen"
        if self.fits:
            return f"every layer fits loss scales 2^{self.k_lo} .. 2^{self.k_hi}"
        low = max(self.layers, key=lambda r: r.k_lo if r.k_lo is not None else -999)
        high = min(self.layers, key=lambda r: r.k_hi if r.k_hi is not None else 999)
        top = (f"{high.param} overflows above 2^{high.k_hi}" if high.k_hi is not None and high.k_hi <= self.k_hi
               else f"the output layer's float16 partial sums overflow above 2^{self.k_hi}")
        return f"no single loss scale fits: {low.param} needs >= 2^{low.k_lo}, {top}"


def fit_scales(names: tuple[str, ...], hist: np.ndarray, u: float) -> ScaleFit:
    layers = [layer_range(n, h, u) for n, h in zip(names, hist)]
    los = [r.k_lo for r in layers if r.k_lo is not None]
    his = [r.k_hi for r in layers if r.k_hi is not None]
    return ScaleFit(layers, max(los) if los else None, min(his + [SEED_K_HI]) if his else None)


def merge_fits(fits: list[ScaleFit]) -> ScaleFit:
    """One range for several nets that share a scaler setting: the intersection of theirs."""
    los = [f.k_lo for f in fits if f.k_lo is not None]
    his = [f.k_hi for f in fits if f.k_hi is not None]
    return ScaleFit([r for f in fits for r in f.layers], max(los) if los else None, min(his) if his else None)
