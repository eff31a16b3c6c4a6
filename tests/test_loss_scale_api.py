"""ampgan's scalers in the user's own script: `api.loss_scaler` (MindSpore's LossScaler shape, for a
functional loop under `@ms.jit`) and `api.loss_scale_manager` (a LossScaleManager for `Model`)."""

from __future__ import annotations

import itertools

import mindspore as ms
import numpy as np
import pytest
from mindspore import Parameter, Tensor, amp, nn

from ampgan import AmpganError, api
from ampgan.amp.health import grad_health
from ampgan.amp.scaler_config import UnderflowAwareScalerConfig
from ampgan.amp.scalers import build_scaler, times


# ---------------------------------------------------------------- the manager against DynamicLossScaleManager
def trajectories(overflows, init: float, factor: int, window: int):
    """Drive ampgan's dynamic manager and MindSpore's DynamicLossScaleManager with one overflow
    sequence: [(scale after the step, step skipped)] for each."""
    ours = api.loss_scale_manager("dynamic", init_scale=init, factor=factor, window=window)
    ref = amp.DynamicLossScaleManager(init, factor, window)
    assert ours.get_loss_scale() == ref.get_loss_scale() == init
    assert ours.get_drop_overflow_update() is ref.get_drop_overflow_update() is True
    got, want = [], []
    for overflow in overflows:
        applied = ours.update_loss_scale(overflow)
        ref.update_loss_scale(overflow)
        got.append((ours.get_loss_scale(), not applied))
        want.append((ref.get_loss_scale(), bool(overflow) and ref.get_drop_overflow_update()))
    return got, want


def test_dynamic_manager_matches_mindspore_on_every_sequence_up_to_8_steps():
    """All 256 overflow sequences of 8 steps (so every shorter one as a prefix, compared after every
    step): from scale 4 two overflows reach the floor 1, window 3 puts boundaries at steps 3 and 6."""
    seen = {"floor": False, "window_growth": False, "overflow_run": False}
    for overflows in itertools.product((False, True), repeat=8):
        got, want = trajectories(overflows, 4.0, 2, 3)
        assert got == want, f"overflows {[int(o) for o in overflows]}"
        scales = [s for s, _ in want]
        seen["floor"] |= 1.0 in scales
        seen["window_growth"] |= max(scales) > 4.0
        seen["overflow_run"] |= any(a and b for a, b in zip(overflows, overflows[1:]))
    assert all(seen.values()), seen


@pytest.mark.parametrize("seed,p_overflow,init,factor,window", [(0, 0.1, 2.0**10, 2, 5), (1, 0.35, 27.0, 3, 2),
                                                                  (2, 0.02, 1.0, 2, 7)])
def test_dynamic_manager_matches_mindspore_on_long_random_sequences(seed, p_overflow, init, factor, window):
    rng = np.random.default_rng(seed)
    overflows = rng.random(300) < p_overflow
    overflows[100:112] = True  # one long run of overflows: down to the floor
    got, want = trajectories(overflows, init, factor, window)
    assert got == want
    scales = [s for s, _ in want]
    assert min(scales) == 1.0 and max(scales) > init


def test_the_update_cell_matches_mindspore_update_cell():
    """The cell GPU/Ascend's TrainOneStepWithLossScaleCell calls in its graph, against MindSpore's own."""

    class Drive(nn.Cell):
        def __init__(self, update, init):
            super().__init__()
            self.update = update
            self.scale_sense = Parameter(Tensor(init, ms.float32), name="scale_sense")

        def construct(self, overflow):
            skip = self.update(self.scale_sense, overflow)
            return skip, self.scale_sense * 1.0

    manager = api.loss_scale_manager("dynamic", init_scale=8.0, factor=2, window=2)
    ours = Drive(manager.update_cell(), manager.get_loss_scale())
    ref = Drive(nn.DynamicLossScaleUpdateCell(8.0, 2, 2), 8.0)
    overflows = [0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 1, 0, 0, 0, 0]
    got = [tuple(x.asnumpy().item() for x in ours(Tensor(bool(o)))) for o in overflows]
    want = [tuple(x.asnumpy().item() for x in ref(Tensor(bool(o)))) for o in overflows]
    assert got == want
    assert min(s for _, s in want) == 1.0 and max(s for _, s in want) == 16.0


def test_a_later_update_cell_starts_where_the_host_is():
    manager = api.loss_scale_manager("dynamic", init_scale=8.0, factor=2, window=2)
    for overflow in (True, True):
        manager.update_loss_scale(overflow)
    cell = manager.update_cell()
    assert manager.get_loss_scale() == cell.get_loss_scale() == 2.0


# ---------------------------------------------------------------- the functional scaler inside ms.jit
def test_functional_dynamic_scaler_matches_mindspore_inside_jit():
    ours = api.loss_scaler("dynamic", init_scale=4.0, factor=2, window=3)
    ref = amp.DynamicLossScaler(4.0, 2, 3)

    def step_of(scaler):
        @ms.jit
        def step(loss, g1, g2):
            scaled_loss = scaler.scale(loss)
            grads = scaler.unscale((g1, g2))
            finite = amp.all_finite(grads)
            applied = scaler.adjust(finite)
            return scaled_loss, scaler.unscale(scaled_loss), grads, finite, applied, scaler.scale_value * 1.0
        return step

    step, step_ref = step_of(ours), step_of(ref)
    rng = np.random.default_rng(0)
    nonfinite = [0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 2, 0, 0, 0]   # 1: inf, 2: nan
    scales = []
    for bad in nonfinite:
        g1, g2 = rng.normal(size=(3, 5)).astype(np.float32), rng.normal(size=(5,)).astype(np.float32)
        g1[1, 2] = (None, np.inf, np.nan)[bad] if bad else g1[1, 2]
        args = (Tensor(np.float32(rng.random())), Tensor(g1), Tensor(g2))
        a, b = step(*args), step_ref(*args)
        assert a[0].asnumpy() == b[0].asnumpy() and a[1].asnumpy() == b[1].asnumpy()       # scale / unscale of the loss
        for x, y in zip(a[2], b[2]):
            np.testing.assert_array_equal(x.asnumpy(), y.asnumpy())                          # unscaled grads, nan included
        assert bool(a[3].asnumpy()) == (not bad) and bool(a[4].asnumpy()) == (not bad)     # ours returns apply
        assert a[5].asnumpy() == b[5].asnumpy() == ours.scale_value.asnumpy()
        scales.append(float(a[5].asnumpy()))
    assert min(scales) == 1.0 and max(scales) == 8.0 and scales[-1] == 2.0   # the floor, a window growth


@pytest.mark.parametrize("path", ["unscale_then_adjust", "adjust_with_grads"])
def test_underflow_aware_measures_health_as_ampgans_own_steps_do(path):
    """The pooled health row the adapter measures (in `unscale` of the scaled grads, or in
    `adjust(finite, grads)` of the unscaled ones) steers the scaler exactly as ampgan's own steps
    steer it (per-parameter rows of the scaled grads, weighed by `watch`). Sizes 96 and 4: half of
    the big gradient underflows, so the size-weighted fraction (0.48) passes a threshold of 0.4
    while an unweighted mean over parameters (0.25) would not."""
    settings = dict(init_scale=1.0, factor=2, window=1000, underflow_threshold=0.4, min_interval=1)
    ours = api.loss_scaler("underflow_aware", **settings)
    own = build_scaler(UnderflowAwareScalerConfig(**settings), "own_step")
    g1 = np.where(np.arange(96) % 2 == 0, 1e-6, 1.0).astype(np.float32)    # at scale s: 1e-6*s < 2**-14 until s >= 64
    g2 = np.ones(4, np.float32)
    own.watch([g1, g2])

    @ms.jit
    def step(g1, g2):
        grads = ours.unscale(times(ours.scale_value, (g1, g2)))   # the scaled grads of the user's backward pass
        finite = amp.all_finite(grads)
        return ours.adjust(finite) if path == "unscale_then_adjust" else ours.adjust(finite, grads)

    @ms.jit
    def own_step(g1, g2):
        scaled = times(own.scale_value, (g1, g2))
        return own.adjust(amp.all_finite(scaled), grad_health(scaled))

    got, want = [], []
    for _ in range(10):
        step(Tensor(g1), Tensor(g2))
        own_step(Tensor(g1), Tensor(g2))
        got.append(float(ours.scale_value.asnumpy()))
        want.append(float(own.scale_value.asnumpy()))
    assert got == want
    assert got[:6] == [2.0, 4.0, 8.0, 16.0, 32.0, 64.0] and got[-1] == 64.0   # early raises, then no underflow left


def test_fixed_clip_unscale_clips_a_tuple_of_grads_and_only_unscales_the_loss():
    scaler = api.loss_scaler("fixed_clip", init_scale=4.0, clip_norm=1.0)

    @ms.jit
    def step(g1, g2, loss):
        return scaler.unscale((g1, g2)), scaler.unscale(loss)

    grads, loss = step(Tensor(np.full((3, 4), 8.0, np.float32)), Tensor(np.zeros(4, np.float32)), Tensor(np.float32(12.0)))
    norm = np.sqrt(sum(float((g.asnumpy() ** 2).sum()) for g in grads))
    assert norm == pytest.approx(1.0, rel=1e-6) and float(loss.asnumpy()) == 3.0


class TwoLayer(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(8, 32)
        self.relu = nn.ReLU()
        self.fc2 = nn.Dense(32, 3)

    def construct(self, x):
        return self.fc2(self.relu(self.fc1(x)))


def train_functional(make_scaler, steps: int = 60):
    """MindSpore's functional AMP loop (value_and_grad, unscale, all_finite, adjust) on a 2-layer
    net at O2; the scaler comes from `make_scaler`, the one line a user changes."""
    ms.set_seed(0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(128, 8)).astype(np.float32)
    y = (x[:, :3] * np.array([1.0, -1.0, 0.5], np.float32)).argmax(1).astype(np.int32)
    net = amp.auto_mixed_precision(TwoLayer(), "O2")
    loss_fn = nn.CrossEntropyLoss()
    optimizer = nn.Adam(net.trainable_params(), learning_rate=0.02)
    loss_scaler = make_scaler()

    def forward(data, label):
        return loss_scaler.scale(loss_fn(net(data), label))

    grad_fn = ms.value_and_grad(forward, None, optimizer.parameters)

    @ms.jit
    def train_step(data, label):
        loss, grads = grad_fn(data, label)
        loss = loss_scaler.unscale(loss)
        grads = loss_scaler.unscale(grads)
        finite = amp.all_finite(grads)
        loss_scaler.adjust(finite)
        if finite:
            optimizer(grads)
        return loss, finite

    data, label = Tensor(x), Tensor(y)
    losses, finites = [], []
    for _ in range(steps):
        loss, finite = train_step(data, label)
        losses.append(float(loss.asnumpy()))
        finites.append(bool(finite.asnumpy()))
    return losses, finites, float(loss_scaler.scale_value.asnumpy())


def test_a_functional_o2_loop_with_underflow_aware_trains():
    before = train_functional(lambda: amp.DynamicLossScaler(scale_value=2.0**10, scale_factor=2, scale_window=20))
    losses, finites, scale = train_functional(lambda: api.loss_scaler("underflow_aware", init_scale=2.0**10, factor=2,
                                                                       window=20))
    assert all(finites)
    assert np.mean(losses[-5:]) < 0.5 * losses[0], losses
    assert scale >= 2.0**10 * 2   # at least the window's raises (60 finite steps, window 20)
    assert losses[0] == before[0][0] and before[1] == finites   # the same loop, the same first step
    assert abs(np.mean(losses[-5:]) - np.mean(before[0][-5:])) < 0.1 * before[0][0]


# ---------------------------------------------------------------- bad use: one line
@pytest.mark.parametrize("build", [api.loss_scaler, api.loss_scale_manager])
@pytest.mark.parametrize("scaler,settings,words", [
    ("dynamc", {}, ["unknown scaler 'dynamc'", "did you mean dynamic", "none, static, dynamic, underflow_aware, fixed_clip"]),
    (None, {}, ["unknown scaler None", "none, static, dynamic"]),
    ("dynamic", {"windw": 5}, ["no setting 'windw'", "did you mean window", "init_scale, factor, window"]),
    ("dynamic", {"name": "static"}, ["no setting 'name'", "init_scale, factor, window"]),
    ("dynamic", {"window": 0}, ["scaler.window must be >= 1, got 0"]),
    ("dynamic", {"factor": 2.5}, ["scaler.factor", "2.5"]),
    ("static", {"init_scale": float("inf")}, ["scaler.init_scale"]),
])
def test_bad_name_key_or_value_is_one_line(build, scaler, settings, words):
    with pytest.raises(AmpganError) as err:
        build(scaler, **settings)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"api.{build.__name__}: ")
    for word in words:
        assert word in message, message


@pytest.mark.parametrize("scaler", ["underflow_aware", "fixed_clip"])
def test_a_manager_of_a_scaler_that_needs_gradients_is_refused(scaler):
    with pytest.raises(AmpganError, match="only the overflow flag.*api.loss_scaler") as err:
        api.loss_scale_manager(scaler)
    assert "\n" not in str(err.value) and "api.train_step(" in str(err.value)


def _model_parts():
    net = nn.Dense(4, 2)
    return net, nn.MSELoss(), nn.SGD(net.trainable_params(), learning_rate=0.1)


@pytest.mark.parametrize("scaler,settings", [("dynamic", {}), ("static", {}), ("none", {"skip_nonfinite": True})])
def test_model_on_cpu_refuses_a_dropping_manager_with_one_clear_line(scaler, settings):
    from mindspore.train import Model

    assert ms.get_context("device_target") == "CPU"
    net, loss, opt = _model_parts()
    manager = api.loss_scale_manager(scaler, **settings)
    with pytest.raises(AmpganError) as err:
        Model(net, loss, opt, amp_level="O2", loss_scale_manager=manager)
    message = str(err.value)
    assert "\n" not in message and "CPU" in message and "ampgan.api.train_step(" in message, message


def test_model_on_cpu_trains_with_a_manager_that_drops_nothing():
    """`static` with skip_nonfinite=false is MindSpore's FixedLossScaleManager(scale, False): no update cell."""
    import mindspore.dataset as ds
    from mindspore.train import Model

    net, loss, opt = _model_parts()
    manager = api.loss_scale_manager("static", init_scale=1.0, skip_nonfinite=False)
    assert manager.get_update_cell() is None and manager.get_drop_overflow_update() is False
    model = Model(net, loss, opt, loss_scale_manager=manager)
    rng = np.random.default_rng(0)
    data = ds.NumpySlicesDataset({"x": rng.random((16, 4), np.float32), "y": rng.random((16, 2), np.float32)},
                                 shuffle=False).batch(4)
    before = net.weight.asnumpy().copy()
    model.train(1, data, dataset_sink_mode=False)
    assert not np.array_equal(before, net.weight.asnumpy())
