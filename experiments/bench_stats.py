"""The bench's statistics, shared by `experiments/bench.py` and `experiments/bench_parallel.py`:
the bootstrap interval of a median ratio, the verdict against a target, and a table row."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import numpy as np

CI_LEVEL = 0.95
CI_RESAMPLES = 2000
CI_SEED = 0  # a fixed seed: the same timings always give the same interval


def bootstrap_ci(ratios: Sequence[float], resamples: int = CI_RESAMPLES, level: float = CI_LEVEL,
                 seed: int = CI_SEED) -> tuple[float, float]:
    """Percentile-bootstrap interval of the median of `ratios` (one per round).

    Resample the rounds with replacement `resamples` times, take each resample's median, and
    return the (1 - level) / 2 and (1 + level) / 2 percentiles of those medians. Rounds are the
    unit of resampling because a round's ratio already cancels the drift its two blocks share.
    """
    x = np.asarray(ratios, dtype=np.float64)
    if x.size == 0:
        raise ValueError("bootstrap_ci needs at least one ratio")
    picks = np.random.default_rng(seed).integers(0, x.size, size=(resamples, x.size))
    medians = np.median(x[picks], axis=1)
    low, high = np.percentile(medians, [50 * (1 - level), 50 * (1 + level)])
    return float(low), float(high)


def verdict(interval: tuple[float, float], target: float) -> str:
    """'met' when the whole interval is below `target`, 'not met' when it is all above, else 'unresolved'."""
    low, high = interval
    if high < target:
        return "met"
    if low > target:
        return "not met"
    return "unresolved"


def ratio_row(comparison: str, variant: str, times: Sequence[float], base_times: Sequence[float],
              baseline: str, target: float | None = None) -> dict:
    """One row of the table: the variant's time per iteration (median [min-max]) and its ratio to
    the baseline, round by round: median [min-max], 95% bootstrap interval, verdict against `target`."""
    ratios = [a / b for a, b in zip(times, base_times)]
    low, high = bootstrap_ci(ratios)
    row = {"comparison": comparison, "variant": variant, "rounds": len(ratios),
           "ms_per_iteration": 1e3 * statistics.median(times), "ms_min": 1e3 * min(times), "ms_max": 1e3 * max(times),
           "ratio": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
           "ci_low": low, "ci_high": high, "baseline": baseline}
    if target is not None and variant != baseline:
        row.update(target=target, verdict=verdict((low, high), target))
    return row


def host_row(host: Sequence[float], base_host: Sequence[float], target_us: float | None) -> dict:
    """A variant's host time per iteration (wall minus its compiled steps), median [min-max] in µs, and
    beyond the baseline's, round by round: median with its 95% bootstrap interval and verdict."""
    us = [1e6 * h for h in host]
    beyond = [1e6 * (h - b) for h, b in zip(host, base_host)]
    low, high = bootstrap_ci(beyond)
    out = {"host_us": statistics.median(us), "host_us_min": min(us), "host_us_max": max(us),
           "host_beyond_us": statistics.median(beyond), "host_ci_low_us": low, "host_ci_high_us": high}
    if target_us is not None:
        out.update(host_target_us=target_us, host_verdict=verdict((low, high), target_us))
    return out
