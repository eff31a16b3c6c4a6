"""Underflow-aware and fixed-clip scalers: scripted state machines and real compiled steps."""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import mint, nn, ops

from ampgan.amp.health import grad_health
from ampgan.amp.policy import apply_amp
from ampgan.amp.scalers import (DynamicScalerConfig, FixedClipScalerConfig, UnderflowAwareScalerConfig,
                                build_scaler)
from ampgan.steps.common import make_step
from tests.test_scalers import reference_dynamic

_ids = iter(range(10**6))


def health_row(sub=0.0, zero=0.0, max_abs=1.0):
    return np.array([[zero, sub, max_abs, 0.0]], np.float32)


def raised_early(scaler) -> bool:
    """Whether the step just adjusted made an early raise: the scaler's own `since_raise` is 1 right
    after one (and at least 2 otherwise: it starts at probation + min_interval and counts up)."""
    return int(scaler.since_raise.asnumpy()) == 1


def drive(scaler, script):
    """script: [(finite, health (1, 4))]; returns [(scale_before, applied, counter, cooldown, early raises so far)]."""
    scaler.watch([ms.Tensor(np.zeros(10, np.float32))])

    @ms.jit
    def adjust(finite, health):
        before = scaler.scale_value * 1.0
        return before, scaler.adjust(finite, health)

    out, raises = [], 0
    for finite, health in script:
        before, applied = adjust(ms.Tensor(bool(finite)), ms.Tensor(health))
        raises += raised_early(scaler)
        out.append((float(before.asnumpy()), bool(applied.asnumpy()), int(scaler.counter.asnumpy()),
                    int(scaler.cooldown_left.asnumpy()), raises))
    return out


def ua(**kw):
    base = dict(init_scale=128.0, factor=2, window=1000, underflow_threshold=0.05, headroom_margin=8.0,
                history=4, min_interval=2, probation=3, cooldown=6, max_scale=2.0**14)
    base.update(kw)
    return build_scaler(UnderflowAwareScalerConfig(**base), f"ua{next(_ids)}")


def test_underflowing_gradients_raise_every_min_interval_until_clear():
    # 30% of nonzero elements subnormal, small max|g|: plenty of headroom
    got = drive(ua(), [(True, health_row(sub=0.3, max_abs=128 * 1e-3))] * 7)
    assert [s for s, *_ in got] == [128, 256, 256, 512, 512, 1024, 1024]
    assert got[-1][4] == 4 and all(applied for _, applied, *_ in got)  # the 7th step raised too


def test_exact_zeros_are_not_underflow():
    got = drive(ua(), [(True, health_row(sub=0.0, zero=0.9, max_abs=0.1))] * 6)
    assert [s for s, *_ in got] == [128] * 6 and got[-1][4] == 0


def test_subnormal_share_is_relative_to_nonzero_elements():
    # 4% of all elements are subnormal but 80% are exact zeros: 20% of the nonzero ones -> raise
    got = drive(ua(), [(True, health_row(sub=0.04, zero=0.8, max_abs=0.1))] * 2)
    assert got[-1][4] == 1


def test_no_raise_without_headroom():
    # max|scaled g| 2000 at scale 128: x2 x margin 8 = 32000 < 65504 -> one raise allowed;
    # then 4200 at scale 256: x2 x 8 = 67200 > 65504 -> no more (the history keeps the larger value)
    got = drive(ua(), [(True, health_row(sub=0.3, max_abs=2000.0))] + [(True, health_row(sub=0.3, max_abs=4200.0))] * 5)
    assert [s for s, *_ in got] == [128, 256, 256, 256, 256, 256]


def test_overflow_after_an_early_raise_starts_a_cooldown():
    sub = health_row(sub=0.3, max_abs=1.0)
    script = [(True, sub), (False, sub)] + [(True, sub)] * 8
    got = drive(ua(), script)
    scales = [s for s, *_ in got]
    assert scales[:3] == [128, 256, 128]          # raised, overflowed, halved
    assert got[0][3] == 0 and got[1][3] == 6       # the overflow started a 6-step cooldown
    assert scales[2:9] == [128] * 7                # steps 2..7: no early raise while cooling down
    assert got[7][3] == 0 and scales[9] == 256     # step 8 raises again
    assert [applied for _, applied, *_ in got] == [f for f, _ in script]


@pytest.mark.parametrize("cooldown", [0, 1, 3, 6])
def test_cooldown_pauses_early_raises_for_exactly_that_many_steps(cooldown):
    sub = health_row(sub=0.3, max_abs=1.0)
    got = drive(ua(cooldown=cooldown, min_interval=1), [(True, sub), (False, sub)] + [(True, sub)] * (cooldown + 2))
    raises = [r for *_, r in got]                  # early raises so far, after each step
    assert raises[:2] == [1, 1]                    # step 0 raised, step 1 overflowed (blamed)
    after = raises[2:]
    assert after[:cooldown] == [1] * cooldown      # the next `cooldown` steps make no early raise
    assert after[cooldown] == 2                    # the step after them does


@pytest.mark.parametrize("probation", [1, 3])
def test_probation_blames_an_overflow_within_exactly_that_many_steps(probation):
    under, clear = health_row(sub=0.3, max_abs=1.0), health_row(sub=0.0, max_abs=1.0)
    # the overflow comes `probation` steps after the early raise: blamed, a cooldown starts
    blamed = drive(ua(probation=probation), [(True, under)] + [(True, clear)] * (probation - 1) + [(False, clear)])
    assert blamed[0][4] == 1 and blamed[-1][3] == 6
    # one step later it is not blamed
    spared = drive(ua(probation=probation), [(True, under)] + [(True, clear)] * probation + [(False, clear)])
    assert spared[0][4] == 1 and spared[-1][3] == 0


def test_floor_and_ceiling():
    at_floor = drive(ua(init_scale=1.0), [(False, health_row())] * 3)
    assert [s for s, *_ in at_floor] == [1.0, 1.0, 1.0]
    at_ceiling = drive(ua(init_scale=2.0**13, max_scale=2.0**14), [(True, health_row(sub=0.5, max_abs=1e-3))] * 5)
    assert max(s for s, *_ in at_ceiling) == 2.0**14 and at_ceiling[-1][4] == 1


@pytest.mark.parametrize("seq", [[True] * 7, [True, False] * 4, [False] * 5 + [True] * 6])
def test_without_underflow_it_is_the_dynamic_scaler(seq):
    got = drive(ua(window=3), [(f, health_row(sub=0.0)) for f in seq])
    ref = reference_dynamic(128.0, 2, 3, seq)
    assert [(s, c) for s, _, c, _, _ in got] == ref


def test_fixed_clip_clips_and_reports():
    scaler = build_scaler(FixedClipScalerConfig(init_scale=1024.0, clip_norm=1.0), f"fc{next(_ids)}")
    grads = (ms.Tensor(np.array([3.0, 4.0], np.float32)),)
    clipped, flag = scaler.clip(grads, ms.Tensor(5.0, ms.float32))
    np.testing.assert_allclose(clipped[0].asnumpy(), [0.6, 0.8], rtol=1e-6)
    assert float(flag.asnumpy()) == 1.0
    same, flag = scaler.clip((ms.Tensor(np.array([0.3, 0.4], np.float32)),), ms.Tensor(0.5, ms.float32))
    np.testing.assert_allclose(same[0].asnumpy(), [0.3, 0.4], rtol=1e-6)
    assert float(flag.asnumpy()) == 0.0


@pytest.mark.parametrize("skip", [True, False])
def test_fixed_clip_nonfinite_policy(skip):
    scaler = build_scaler(FixedClipScalerConfig(clip_norm=10.0, skip_nonfinite=skip), f"fcn{next(_ids)}")
    scaler.watch([ms.Tensor(np.zeros(3, np.float32))])
    grads = (ms.Tensor(np.array([np.inf, 3.0, 4.0], np.float32)),)
    fixed, clipped = scaler.clip(grads, ms.Tensor(np.inf, ms.float32))
    applied = bool(scaler.adjust(ms.Tensor(False), ms.Tensor(np.zeros((1, 4), np.float32))).asnumpy())
    assert applied is (not skip)
    assert float(clipped.asnumpy()) == 0.0  # skipped: nothing clipped; kept: norm 5 <= 10
    if not skip:
        np.testing.assert_allclose(fixed[0].asnumpy(), [0.0, 3.0, 4.0])


@pytest.mark.parametrize("skip", [True, False])
def test_fixed_clip_does_not_count_a_skipped_step_as_clipped(skip):
    """A real compiled step whose gradient is infinite: skipped (and not clipped), or applied
    with the bad element zeroed (and clipped, since the rest still exceeds clip_norm)."""
    scaler = build_scaler(FixedClipScalerConfig(init_scale=1024.0, clip_norm=1.0, skip_nonfinite=skip),
                          f"fcs{next(_ids)}")
    net = nn.Dense(3, 1, weight_init="ones", has_bias=False)
    net.update_parameters_name(f"fcs{next(_ids)}.")
    opt = mint.optim.SGD(net.trainable_params(), lr=0.0)

    def loss_fn(x):
        loss = net(x).sum()
        return scaler.scale(loss), ops.stack([loss])

    step = make_step(loss_fn, net.trainable_params(), opt, scaler, grad_health, ("loss",))
    overflow = step(ms.Tensor(np.array([[3e38, 3.0, 4.0]], np.float32)))   # d loss / d w0 = 3e38 * 1024 = inf
    assert not overflow.finite and overflow.applied is (not skip)
    assert overflow.clipped is (not skip)
    big = step(ms.Tensor(np.array([[30.0, 40.0, 0.0]], np.float32)))       # finite, norm 50 > 1
    assert big.finite and big.applied and big.clipped
    small = step(ms.Tensor(np.array([[0.3, 0.4, 0.0]], np.float32)))       # norm 0.5 <= 1
    assert small.applied and not small.clipped


# ---------------------------------------------------------------- real compiled steps
def tiny_gradient_step(scaler, seed=0):
    """An O2 MLP whose loss is so small that float16 gradients sit in the subnormal range."""
    ms.set_seed(seed)
    net = nn.SequentialCell([nn.Dense(16, 64), nn.Tanh(), nn.Dense(64, 64), nn.Tanh(), nn.Dense(64, 1)])
    net.update_parameters_name(f"tiny{next(_ids)}.")
    net = apply_amp(net, "O2", [])
    opt = mint.optim.SGD(net.trainable_params(), lr=0.0)

    def loss_fn(x):
        loss = net(x).mean() * 2e-5
        return scaler.scale(loss), ops.stack([loss])

    return make_step(loss_fn, net.trainable_params(), opt, scaler, grad_health, ("loss",))


def subnormal_share(status, sizes):
    h = status.health
    return float((h[:, 1] * sizes).sum() / ((1 - h[:, 0]) * sizes).sum())


def run_steps(step, n):
    x = ms.Tensor(np.random.default_rng(0).standard_normal((32, 16)).astype(np.float32))
    return [step(x) for _ in range(n)]


def test_underflow_aware_lifts_a_stuck_scale_where_dynamic_does_not():
    dyn = build_scaler(DynamicScalerConfig(init_scale=128.0, factor=2, window=1000), f"dyn{next(_ids)}")
    uaw = build_scaler(UnderflowAwareScalerConfig(init_scale=128.0, factor=2, window=1000), f"uaw{next(_ids)}")
    results = {}
    for name, scaler in (("dynamic", dyn), ("underflow_aware", uaw)):
        step = tiny_gradient_step(scaler)
        sizes = np.array([p.size for p in step.weights], np.float64)
        statuses = run_steps(step, 40)
        results[name] = (statuses[0], statuses[-1])
    d0, d1 = results["dynamic"]
    u0, u1 = results["underflow_aware"]
    assert subnormal_share(d0, sizes) > 0.2                    # the case underflows
    assert d1.scale == 128.0                                   # dynamic never moves
    assert subnormal_share(d1, sizes) == pytest.approx(subnormal_share(d0, sizes))
    assert u1.scale >= 128.0 * 2**6                            # lifted within 40 steps
    assert subnormal_share(u1, sizes) < 0.25 * subnormal_share(u0, sizes)
    assert all(s.applied for s in run_steps(tiny_gradient_step(
        build_scaler(UnderflowAwareScalerConfig(init_scale=128.0), f"u2{next(_ids)}")), 40))


def test_underflow_aware_leaves_a_healthy_relu_net_alone():
    """Many exact zeros (dead ReLUs), normal magnitudes: no early raise, no extra skipped step."""
    skipped = {}
    for cfg in (DynamicScalerConfig(init_scale=1024.0, window=1000),
                UnderflowAwareScalerConfig(init_scale=1024.0, window=1000)):
        scaler = build_scaler(cfg, f"relu{next(_ids)}")
        ms.set_seed(1)
        net = nn.SequentialCell([nn.Dense(16, 128, bias_init=-0.5), nn.ReLU(), nn.Dense(128, 128), nn.ReLU(), nn.Dense(128, 4)])
        net.update_parameters_name(f"relu{next(_ids)}.")
        net = apply_amp(net, "O2", [])
        opt = mint.optim.Adam(net.trainable_params(), lr=1e-3)

        def loss_fn(x, y):
            loss = ops.cross_entropy(net(x), y)
            return scaler.scale(loss), ops.stack([loss])

        step = make_step(loss_fn, net.trainable_params(), opt, scaler, grad_health, ("loss",))
        rng = np.random.default_rng(2)
        statuses, early = [], 0
        for _ in range(40):
            x = rng.standard_normal((16, 16)).astype(np.float32)
            x[:, 10:] = 0.0  # unused input features: their weight gradients are exactly zero
            x, y = ms.Tensor(x), ms.Tensor(rng.integers(0, 4, 16).astype(np.int32))
            statuses.append(step(x, y))
            early += cfg.name == "underflow_aware" and raised_early(scaler)
        sizes = np.array([p.size for p in step.weights], np.float64)
        zero_share = np.mean([(s.health[:, 0] * sizes).sum() / sizes.sum() for s in statuses])
        assert zero_share > 0.2  # dead ReLUs and unused inputs really produce exact zeros
        skipped[cfg.name] = sum(not s.applied for s in statuses)
        if cfg.name == "underflow_aware":
            assert early == 0
    assert skipped["underflow_aware"] <= skipped["dynamic"] + 2
