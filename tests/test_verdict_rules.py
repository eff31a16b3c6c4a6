"""The verdict's rules on traces written by hand, one hole each (issue: a verdict only where the
numbers hold it up): not_amp only when FP32 fails no later than AMP; a
failure in the loss gets the loss's fix; no place claimed without its location; the FP32 twin
keeps the run's clipping; a bare `python -m ampgan.diagnose` diagnoses AMP, not FP32 against
itself."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from ampgan.config.schema import validate
from ampgan.diagnose.config import DiagnoseConfig
from ampgan.diagnose.locate import Located
from ampgan.diagnose.probe import COMPARE_FIELDS
from ampgan.diagnose.replay import NetTrace, Trace
from ampgan.diagnose.verdict import decide
from tests.conftest import compose_cfg
from tests.test_diagnose import compose_diag

PARAMS = ("fc.weight", "fc.bias")


def net_trace(net: str, finite: list[bool], rel_err: float = 0.001, scale: float = 1024.0) -> NetTrace:
    """A net's replay record: `finite[i]` for each sub-step, the same small error on every finite one."""
    t = NetTrace(net, tuple(f"{net}.{p}" if net != "train" else p for p in PARAMS), np.array([64.0, 8.0]))
    for i, ok in enumerate(finite):
        row = np.zeros((len(PARAMS), len(COMPARE_FIELDS)))
        row[:, COMPARE_FIELDS.index("rel_err")] = rel_err if ok else np.nan
        row[:, COMPARE_FIELDS.index("cosine")] = 1.0
        row[:, COMPARE_FIELDS.index("fp32_norm")] = 1.0
        t.iterations.append(i)
        t.compare.append(row)
        t.health.append(np.zeros((len(PARAMS), 4)))
        t.scale.append(scale)
        t.applied.append(ok)
        t.finite.append(ok)
    return t


def synced(nets: dict[str, NetTrace]) -> Trace:
    first = min(((t.iterations[i], n, i) for n, t in nets.items() for i, ok in enumerate(t.finite) if not ok),
                default=None)
    return Trace("synced", nets, 0.0, first)


def fp32_twin(failed_at: int | None = None):
    return SimpleNamespace(failed_at=failed_at, failure="loss nan" if failed_at is not None else "")


def test_a_dynamic_scaler_finding_its_scale_is_still_healthy():
    s = validate(compose_cfg("amp=o2", "scaler=dynamic"))
    nets = {"critic": net_trace("critic", [False] + [True] * 24), "gen": net_trace("gen", [True] * 5)}
    v = decide(s, DiagnoseConfig(), fp32_twin(), synced(nets), {})
    assert v.name == "healthy"


def test_fp32_failing_later_than_amp_is_amps_failure_not_not_amp():
    s = validate(compose_cfg("model=classifier", "data=digits", "amp=o2", "scaler=static"))
    amp_first = {"train": net_trace("train", [True, True, False, False, False, False])}
    located = Located(2, "train", "forward", "head", float("inf"), 3.0)
    v = decide(s, DiagnoseConfig(), fp32_twin(failed_at=5), synced(amp_first), {}, located)
    assert v.name == "overflow" and v.layer == "head"
    same_time = decide(s, DiagnoseConfig(), fp32_twin(failed_at=2), synced(amp_first), {}, located)
    assert same_time.name == "not_amp" and same_time.exit_code == 3


def test_a_failure_in_the_loss_gets_the_losses_fix_never_a_cell_named_loss():
    s = validate(compose_cfg("model=classifier", "data=digits", "amp=o2", "scaler=static", "amp.fp32_loss=false"))
    nets = {"train": net_trace("train", [True, False, False, False])}
    located = Located(1, "train", "loss", "loss", float("nan"), float("nan"))
    v = decide(s, DiagnoseConfig(), fp32_twin(), synced(nets), {}, located)
    assert v.name == "overflow" and v.layer == ""
    overrides = [o for f in v.fixes for o in f.overrides]
    assert overrides[0] == "amp.fp32_loss=true"
    assert not any(o.startswith("amp.keep_fp32") for o in overrides)
    assert "the loss" in located.describe()


def test_no_place_is_claimed_without_its_location():
    s = validate(compose_cfg("model=classifier", "data=digits", "amp=o2", "scaler=static"))
    nets = {"train": net_trace("train", [False] * 4)}
    v = decide(s, DiagnoseConfig(), fp32_twin(), synced(nets), {}, None)
    assert v.name == "overflow" and v.layer == "" and "?" not in v.headline
    assert "not located" in v.headline and "diagnose.locate=true" in v.headline


def test_the_bare_command_diagnoses_o2_with_dynamic_scaling():
    s = validate(compose_diag())
    assert s.amp.level == "O2" and s.scaler.name == "dynamic"


def test_the_fp32_twin_keeps_the_runs_clipping_and_drops_only_precision():
    from ampgan.diagnose.replay import fp32_twin_settings

    clipped = fp32_twin_settings(validate(compose_cfg("amp=o2", "scaler=fixed_clip", "scaler.clip_norm=0.5")))
    assert clipped.amp.level == "O0" and clipped.scaler.name == "fixed_clip"
    assert clipped.scaler.clip_norm == 0.5 and clipped.scaler.init_scale == 1.0
    assert clipped.scaler == clipped.scaler.fp32_twin(), "the twin's own twin is itself: it keeps its scale on resume"
    dynamic = fp32_twin_settings(validate(compose_cfg("amp=o2", "scaler=dynamic")))
    assert dynamic.scaler.name == "none"

