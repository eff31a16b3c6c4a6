"""float16's range, named once: every module that compares a value with it imports these."""

FP16_MAX = 65504.0                       # the largest finite float16 (just under 2**16)
FP16_MIN_NORMAL_EXP = -14                # float16's smallest normal is 2**-14 (~6.1e-5) ...
FP16_MIN_NORMAL = 2.0**FP16_MIN_NORMAL_EXP
FP16_MIN_SUBNORMAL_EXP = -24             # ... and its subnormals reach down to 2**-24


def low_headroom(metrics: dict[str, float], threshold: float, setting: str) -> str | None:
    """Why an activation is too close to float16's largest value, or None: the smallest
    `<net>/headroom` metric (FP16_MAX / the net's largest leaf-cell output) under `threshold`
    (a NaN headroom counts), in words that name the `setting` that sets the threshold."""
    low = sorted((v, k) for k, v in metrics.items() if k.endswith("/headroom") and not v >= threshold)
    if not low:
        return None
    value, key = low[0]
    return (f"{key} {value:.3g} < {setting}={threshold:g}: an activation is within "
            f"{value:.3g}x of float16's largest value {FP16_MAX:g} (a forward overflow ahead)")
