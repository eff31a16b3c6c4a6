"""Scaler state machines, driven by scripted finite/overflow sequences inside a compiled function."""

from __future__ import annotations


import mindspore as ms
import numpy as np
import pytest
from mindspore import amp

from ampgan.amp.scalers import DynamicScalerConfig, NoneScalerConfig, StaticScalerConfig, build_scaler


def drive(scaler, finite_seq, n_params: int = 1):
    """Feed `finite_seq` to scaler.adjust inside ms.jit; return [(scale_before, applied, counter)]."""
    health = ms.Tensor(np.zeros((n_params, 4), np.float32))

    @ms.jit
    def adjust(finite):
        before = scaler.scale_value * 1.0
        applied = scaler.adjust(finite, health)
        return before, applied

    out = []
    for f in finite_seq:
        before, applied = adjust(ms.Tensor(bool(f)))
        counter = int(scaler.counter.asnumpy()) if hasattr(scaler, "counter") else None
        out.append((float(before.asnumpy()), bool(applied.asnumpy()), counter))
    return out


def reference_dynamic(init, factor, window, finite_seq):
    """MindSpore's own amp.DynamicLossScaler on the same sequence."""
    ref = amp.DynamicLossScaler(init, factor, window)

    @ms.jit
    def adjust(finite):
        before = ref.scale_value * 1.0
        ref.adjust(finite)
        return before

    return [(float(adjust(ms.Tensor(bool(f))).asnumpy()), int(ref.counter.asnumpy())) for f in finite_seq]


SEQUENCES = {
    "all_finite": [True] * 9,
    "overflow_first": [False, False, True, True, True, True],
    "alternating": [True, False] * 5,
    "to_the_floor": [False] * 12 + [True] * 3,
    "grow_then_overflow": [True] * 6 + [False] + [True] * 7,
}


@pytest.mark.parametrize("name,factor,window", [(n, f, w) for n in SEQUENCES for f, w in [(2, 3), (4, 1), (2, 1000)]])
def test_dynamic_matches_mindspore_trajectory(name, factor, window):
    seq = SEQUENCES[name]
    cfg = DynamicScalerConfig(init_scale=64.0, factor=factor, window=window)
    ours = drive(build_scaler(cfg, f"t{factor}{window}{name}"), seq)
    ref = reference_dynamic(64.0, factor, window, seq)
    assert [(s, c) for s, _, c in ours] == ref
    assert [a for _, a, _ in ours] == seq  # overflow steps are skipped, finite ones applied


def test_dynamic_exact_states():
    cfg = DynamicScalerConfig(init_scale=8.0, factor=2, window=2)
    seq = [True, True, True, False, False, False, False, True]
    got = drive(build_scaler(cfg, "exact"), seq)
    scales = [s for s, _, _ in got]
    assert scales == [8, 8, 16, 16, 8, 4, 2, 1]   # grows after 2 finite steps, halves on overflow
    assert drive(build_scaler(DynamicScalerConfig(init_scale=1.0, factor=2, window=5), "floor"), [False] * 3)[-1][0] == 1.0


def test_dynamic_does_not_grow_past_float32():
    cfg = DynamicScalerConfig(init_scale=2.0**127, factor=2, window=1)
    got = drive(build_scaler(cfg, "ceiling"), [True] * 3)
    assert all(s == 2.0**127 for s, _, _ in got)


@pytest.mark.parametrize("skip", [True, False])
def test_static_and_none_keep_scale_and_skip_only_when_told(skip):
    for cfg in (StaticScalerConfig(init_scale=512.0, skip_nonfinite=skip), NoneScalerConfig(skip_nonfinite=skip)):
        seq = [True, False, True]
        got = drive(build_scaler(cfg, f"st{skip}{cfg.name}"), seq)
        expected_scale = 512.0 if cfg.name == "static" else 1.0
        assert all(s == expected_scale for s, _, _ in got)
        assert [a for _, a, _ in got] == [True, not skip, True]


def test_scale_and_unscale_round_trip():
    scaler = build_scaler(StaticScalerConfig(init_scale=1024.0), "rt")
    grads = (ms.Tensor(np.array([1.0, -2.0], np.float32)), ms.Tensor(np.array([[3.0]], np.float32)))
    scaled = tuple(g * 1024.0 for g in grads)
    back = scaler.unscale(scaled)
    for a, b in zip(back, grads):
        np.testing.assert_allclose(a.asnumpy(), b.asnumpy())
    assert float(scaler.scale(ms.Tensor(2.0, ms.float32)).asnumpy()) == 2048.0


def test_two_scalers_in_one_graph_have_distinct_parameters():
    a = build_scaler(DynamicScalerConfig(), "G.scaler")
    b = build_scaler(DynamicScalerConfig(), "D.scaler")
    names = {a.scale_value.name, a.counter.name, b.scale_value.name, b.counter.name}
    assert len(names) == 4
