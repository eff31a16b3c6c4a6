"""The state a replay needs of a user's own training: what `api.callback`'s and `api.monitor`'s
flight recorders save, and what diagnose loads back (`diagnose.replay.recorded_start`)."""

from __future__ import annotations

import mindspore as ms

from ampgan.amp.activations import PEAK_PREFIX


def training_state(net, optimizer, scaler=None) -> dict[str, ms.Parameter]:
    """Every state tensor of a training, by role and the name the user's code gives it:
    `net/<name>` (all the net's parameters, BatchNorm's statistics too), `optimizer/<name>` (its
    moments and step count: what is not a net weight), `scaler/<attribute>` (the scale and counters
    of ampgan's scalers or of MindSpore's `DynamicLossScaler`/`StaticLossScaler`, not their
    settings: a scaler's `hyperparameters` are left out)."""
    params = [p for p in net.get_parameters() if not p.name.startswith(PEAK_PREFIX)]   # not a monitor's peaks
    out = {f"net/{p.name}": p for p in params}
    weights = {id(p) for p in params}
    for _, p in optimizer.parameters_and_names():
        if id(p) not in weights:
            out[f"optimizer/{p.name}"] = p
    if scaler is not None:
        settings = getattr(scaler, "hyperparameters", ())
        for attr, value in sorted(vars(scaler).items()):
            if isinstance(value, ms.Parameter) and attr not in settings:
                out[f"scaler/{attr}"] = value
    return out
