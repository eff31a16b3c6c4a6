"""From a replay's per-step records to the numbers a verdict and a report use.

Per layer (parameter): median and max relative error, min cosine, max flushed fraction and
lost norm, max subnormal fraction of AMP's scaled gradient, non-finite steps. Per step: the
whole net's relative error (all its parameters as one vector), the loss difference, the scale,
whether the update was skipped. Steps whose AMP gradient is not finite are counted apart and
left out of the error figures (their error is infinite, and says "overflow", not "precision").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ampgan.amp.health import HEALTH_FIELDS
from ampgan.diagnose.replay import NetTrace, Trace

LAYER_COLUMNS = ("net", "param", "size", "rel_err_median", "rel_err_max", "cosine_min", "flushed_max",
                 "lost_norm_max", "subnormal_max", "nonfinite_steps", "fp32_norm_median", "scale_lo", "scale_hi")


def net_rel_err(t: NetTrace) -> np.ndarray:
    """Per sub-step relative error of the whole net's gradient: sqrt(sum (rel_p ||g_p||)^2) / sqrt(sum ||g_p||^2)."""
    rel, nf = t.field("rel_err"), t.field("fp32_norm")
    with np.errstate(invalid="ignore", over="ignore"):
        return np.sqrt(((rel * nf) ** 2).sum(1)) / np.maximum(np.sqrt((nf ** 2).sum(1)), 1e-30)


def net_lost_norm(t: NetTrace) -> np.ndarray:
    """Per sub-step share of the whole net's FP32 gradient norm flushed to zero under AMP."""
    lost, nf = t.field("lost_norm"), t.field("fp32_norm")
    with np.errstate(invalid="ignore", over="ignore"):
        return np.sqrt(((lost * nf) ** 2).sum(1)) / np.maximum(np.sqrt((nf ** 2).sum(1)), 1e-30)


@dataclass
class NetSummary:
    net: str
    substeps: int
    nonfinite: int             # sub-steps with a non-finite AMP loss or gradient
    skipped: int               # AMP updates not applied
    rel_err_median: float      # over finite sub-steps
    rel_err_max: float
    lost_norm_max: float
    scale_first: float
    scale_last: float
    scale_changes: int         # changes of the loss scale from the first finite sub-step on (finding it is not oscillating)
    settled_at: int | None     # the first finite sub-step (None: none was finite)
    nonfinite_after: int       # non-finite sub-steps after it
    first_failure: int | None  # iteration of the first non-finite sub-step after it (of the first, if none settled)
    loss_nonfinite: int = 0    # sub-steps whose AMP loss is not finite: the forward pass, whatever the scale

    @property
    def finding_scale(self) -> bool:
        """No finite step yet, only the backward overflowing, while the scale falls and is above 1:
        a skipping scaler still finding its scale when the replay ended."""
        return self.settled_at is None and not self.loss_nonfinite and 1.0 < self.scale_last < self.scale_first

    @property
    def halvings_to_settle(self) -> int:
        """Halvings of a scale still being found down to 1 (a skipped sub-step halves it); 0 when settled."""
        return int(np.ceil(np.log2(self.scale_last))) if self.finding_scale else 0

    def failing(self, skips: bool, skip_tol: float) -> bool:
        """Does this net fail? Without skipping, any non-finite step. A scaler that skips may spend
        its first steps finding its scale: it fails when more than `skip_tol` of the steps have a
        non-finite loss (the forward: no scale helps), when no step was finite unless it is still
        finding its scale, or when more than `skip_tol` of the steps after the first finite one are
        not finite. A NaN error is a finding."""
        if not self.nonfinite:
            return not np.isfinite(self.rel_err_median)
        if not skips or self.loss_nonfinite / self.substeps > skip_tol:
            return True
        if self.settled_at is None:
            return not self.finding_scale
        return self.nonfinite_after / max(self.substeps - self.settled_at, 1) > skip_tol


def settling_steps(sums, steps: int) -> int | None:
    """A replay length that lets every scaler still finding its scale settle or fail: the `steps`
    iterations run, plus one per halving from its last scale down to 1 (an iteration has at least
    one sub-step), plus 2. None when no net (`sums`: NetSummary) is still finding it."""
    halvings = max((x.halvings_to_settle for x in sums if x.finding_scale), default=None)
    return None if halvings is None else steps + halvings + 2


def summaries(trace: Trace) -> dict[str, NetSummary]:
    """Each net's summary of a replay, computed once and kept on the trace (again only if its
    record has changed since): the verdict, the checks, the command and the report all read these."""
    out = {}
    for name, t in trace.nets.items():
        key = (tuple(t.finite), tuple(t.applied), tuple(t.scale), len(t.compare))
        seen = trace.summary_cache.get(name)
        if seen is None or seen[0] != key:
            seen = trace.summary_cache[name] = (key, summarize_net(t))
        out[name] = seen[1]
    return out


def summarize_net(t: NetTrace) -> NetSummary:
    ok = np.array(t.finite, bool)
    settled = int(np.argmax(ok)) if ok.any() else None
    after = np.flatnonzero(~ok[settled:]) + settled if settled is not None else np.flatnonzero(~ok)
    first_failure = t.iterations[after[0]] if len(after) else None
    rel = net_rel_err(t)[ok] if ok.any() else np.array([np.nan])
    lost = net_lost_norm(t)[ok] if ok.any() else np.array([0.0])
    scale = np.array(t.scale)
    return NetSummary(t.net, len(t.finite), int((~ok).sum()), int((~np.array(t.applied, bool)).sum()),
                      float(np.median(rel)), float(np.max(rel)), float(np.max(lost)),
                      float(scale[0]), float(scale[-1]), int((np.diff(scale[settled or 0:]) != 0).sum()),
                      settled, int(len(after)) if settled is not None else 0, first_failure,
                      sum(not all(np.isfinite(v) for v in losses.values()) for losses in t.amp_losses))


def layer_rows(trace: Trace, ranges: dict | None = None) -> list[dict]:
    """One row per parameter (LAYER_COLUMNS); `ranges[net]` is a ranges.ScaleFit."""
    rows = []
    for net, t in trace.nets.items():
        ok = np.array(t.finite, bool)
        rel, cos = t.field("rel_err"), t.field("cosine")
        sub = t.health_field(HEALTH_FIELDS.index("underflow"))
        nonf = t.health_field(HEALTH_FIELDS.index("nonfinite"))
        flushed, lost, nf = t.field("flushed"), t.field("lost_norm"), t.field("fp32_norm")
        fit = ranges.get(net) if ranges else None
        for i, name in enumerate(t.param_names):
            r = rel[ok, i] if ok.any() else np.array([np.nan])
            lr = fit.layers[i] if fit else None
            rows.append({
                "net": net, "param": name, "size": int(t.sizes[i]),
                "rel_err_median": float(np.median(r)), "rel_err_max": float(np.max(r)),
                "cosine_min": float(np.min(cos[ok, i])) if ok.any() else float("nan"),
                "flushed_max": float(flushed[ok, i].max()) if ok.any() else 0.0,
                "lost_norm_max": float(lost[ok, i].max()) if ok.any() else 0.0,
                "subnormal_max": float(sub[:, i].max()),
                "nonfinite_steps": int((nonf[:, i] > 0).sum()),
                "fp32_norm_median": float(np.median(nf[:, i])),
                "scale_lo": "" if lr is None or lr.k_lo is None else f"2^{lr.k_lo}",
                "scale_hi": "" if lr is None or lr.k_hi is None else f"2^{lr.k_hi}",
            })
    return rows


def heat_iterations(trace: Trace) -> list[int]:
    """The replayed iterations, in order: the columns of `heat`."""
    return sorted({i for t in trace.nets.values() for i in t.iterations})


def heat(trace: Trace, field: str = "rel_err") -> tuple[list[str], np.ndarray]:
    """Layers x iterations: the max of `field` over each iteration's sub-steps (inf where not finite)."""
    names, rows = [], []
    iters = heat_iterations(trace)
    for net, t in trace.nets.items():
        vals = t.field(field)
        its = np.array(t.iterations)
        for p, name in enumerate(t.param_names):
            names.append(name)
            rows.append([np.max(vals[its == i, p]) if (its == i).any() else np.nan for i in iters])
    return names, np.array(rows, dtype=np.float64)
