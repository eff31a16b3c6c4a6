"""Gradient health only on the steps whose status is read: the plain variant changes nothing else.

Each train step comes in two compiled variants of one status layout: the measuring one
(gradient health, global norm) and the plain one (neither). The trainer measures log steps,
layer-health steps and the first step; the rest run plain, unless the scaler reads health.
"""

from __future__ import annotations

import numpy as np
import pytest

from ampgan.training import hardware
from ampgan.amp.scalers import SCALERS
from ampgan.config.schema import validate
from ampgan.data import build_dataset
from ampgan.steps.gan import CRITIC_LOSSES, GENERATOR_LOSSES
from ampgan.tasks import build_task
from ampgan.tracking.tracker import NullTracker
from ampgan.training.loop import Progress, run_steps
from tests.conftest import compose_cfg, count_launches

GAN = ["model=wgan_gp", "data=gaussians8", "trainer=smoke", "model.hidden=32", "model.n_critic=2"]
CLASSIFIER = ["model=classifier", "data=digits", "trainer=smoke"]
HEALTH = ("underflow", "zero", "max_abs_scaled_grad", "nonfinite")


def build(*overrides: str):
    """The task `overrides` configure; each step's `launches`: which variant ran (`count_launches`)."""
    s = validate(compose_cfg(*overrides, "tracking=none", "trainer.eval_every=0"))
    hardware.setup(s.hardware, s.trainer.seed)
    task = build_task(s, build_dataset(s.data))
    for state in task.states():
        state.step.launches = count_launches(state.step)
    return s, task


def is_health(key: str) -> bool:
    """A metric only a measured step has: gradient health, the norm, activation peaks and headroom."""
    return key.split("/")[-1] in (*HEALTH, "grad_norm", "act_max_abs", "headroom")


class Recorder(NullTracker):
    """The tracker `run_steps` talks to, keeping what it was given."""

    def __init__(self):
        self.logged: list[tuple[int, dict[str, float]]] = []

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.logged.append((step, dict(metrics)))


def loop(task, s) -> Recorder:
    """`trainer.run_steps` over the whole schedule, as `fit` runs it (no evaluation, no checkpoints)."""
    tracker = Recorder()
    cfg = s.trainer
    run_steps(task, tracker, cfg, None, range(1, cfg.max_steps + 1), Progress(cfg.max_steps, 0, cfg.print_every, 0))
    return tracker


@pytest.mark.slow  # both cases in `make test-full` (CI's 30 minutes on a slow machine)
@pytest.mark.parametrize("case", [GAN, CLASSIFIER], ids=["gan", "classifier"])
def test_measuring_every_fifth_step_trains_bit_identically(case):
    """Same seed: weights, losses, loss scales and skipped counts agree exactly, step by step."""
    runs = []
    for every in (1, 5):
        _, task = build(*case, "amp=o2", "scaler=dynamic", "scaler.window=4")
        trace = []
        for step in range(1, 26):
            task.train_step(step, measure=step % every == 0)
            trace += [(n, {k: v for k, v in m.items() if not is_health(k)}) for n, m in task.metrics()]
        weights = {p.name: p.asnumpy().copy() for state in task.states() for p in state.step.weights}
        weights.update({k: p.asnumpy().copy() for k, p in task.state_parameters().items()})
        launches = [dict(state.step.launches) for state in task.states()]
        runs.append((trace, weights, launches))
    (trace_a, weights_a, launches_a), (trace_b, weights_b, launches_b) = runs
    # measured every step: every status read was measured (a GAN's critic sub-steps but the last run plain)
    assert all(a["measured"] > b["measured"] and b["plain"] > a["plain"] for a, b in zip(launches_a, launches_b))
    assert launches_a[-1]["plain"] == 0
    assert trace_b == trace_a
    prefix = "critic" if case is GAN else "train"
    scales = [m[f"{prefix}/scale"] for _, m in trace_a if f"{prefix}/scale" in m]
    skipped = [m[f"{prefix}/skipped"] for _, m in trace_a if f"{prefix}/skipped" in m]
    assert len(scales) == 25 and len(set(scales)) > 1 and skipped[-1] > 0  # the scaler did act
    assert weights_b.keys() == weights_a.keys()
    for k, w in weights_a.items():
        np.testing.assert_array_equal(weights_b[k], w, err_msg=k)


def test_health_is_logged_exactly_at_the_measured_drains():
    """Drains at 1 (the first step's line), 2, 3, 4, 5, 6, 8, 9, 10, 12; measured: the second step (training's
    start, with per-layer health), log steps 5, 10, layer steps 4, 8, 12 (also the last). The first step runs
    plain: the measuring variant compiles after its status line."""
    s, task = build(*CLASSIFIER, "amp=o2", "scaler=dynamic", "trainer.max_steps=12", "trainer.log_every=5",
                    "trainer.print_every=3", "trainer.layer_health_every=4")
    tracker = loop(task, s)
    logged = tracker.logged
    drains = [step for step, m in logged if "train/loss" in m]
    assert drains == [1, 2, 3, 4, 5, 6, 8, 9, 10, 12]
    for field in (*HEALTH, "grad_norm"):
        assert [step for step, m in logged if f"train/{field}" in m] == [2, 4, 5, 8, 10, 12], field
    assert [step for step, m in logged if "grad/head.fc.weight/max_abs" in m] == [2, 4, 8, 12]
    assert task.state.step.launches == {"measured": 6, "plain": 6}


def test_the_first_step_runs_plain_and_the_last_step_is_measured():
    """Step 1's status line comes before the measuring variant's compile; a run's last status has health."""
    s, task = build(*CLASSIFIER, "trainer.max_steps=7", "trainer.log_every=50", "trainer.layer_health_every=0")
    logged = loop(task, s).logged
    assert [step for step, m in logged if "train/underflow" in m] == [2, 7]
    first = [m for step, m in logged if step == 1 and "train/loss" in m]
    assert first and "train/underflow" not in first[0]
    assert task.state.step.launches == {"measured": 2, "plain": 5}


@pytest.mark.parametrize("scaler,plain_norm", [("dynamic", False), ("fixed_clip", True)])
def test_a_drain_reports_health_of_its_newest_measured_status(scaler, plain_norm):
    """Health from the newest measured status drained; grad_norm only if the newest status has it."""
    _, task = build(*CLASSIFIER, f"scaler={scaler}")
    state = task.state
    (_, (x, y)), = task.step_inputs()
    measured = state.step.launch(x, y, measure=True)
    state.push(1, measured, True)
    state.push(2, state.step.launch(x, y, measure=False), False)
    _, metrics = state.drain()
    np.testing.assert_array_equal(state.last_health, state.step.decode(measured.asnumpy()).health)
    assert all(f"train/{field}" in metrics for field in HEALTH)
    assert ("train/grad_norm" in metrics) is plain_norm
    state.push(3, state.step.launch(x, y, measure=False), False)
    _, metrics = state.drain()
    assert not any(f"train/{field}" in metrics for field in HEALTH) and "train/loss" in metrics
    assert ("train/grad_norm" in metrics) is plain_norm


def test_a_scaler_that_reads_health_measures_every_step():
    s, task = build(*GAN, "amp=o2", "scaler=underflow_aware", "trainer.max_steps=8", "trainer.log_every=4",
                    "trainer.layer_health_every=0")
    logged = loop(task, s).logged
    for state in task.states():
        assert state.step.plain is state.step.fn and state.step.measured(False)
        assert state.step.launches["plain"] == 0 and state.step.launches["measured"] > 0
    # every drain reports health: every status was measured, even those only fetched for the status line
    assert [step for step, m in logged if "critic/underflow" in m] == [step for step, m in logged if "critic/loss" in m]


def test_no_second_variant_with_health_off():
    s, task = build(*CLASSIFIER, "trainer.grad_health=false", "trainer.log_every=5")
    step = task.state.step
    assert step.build_plain is None and step.plain is step.fn and not step.measures_health
    logged = loop(task, s).logged
    assert step.launches == {"measured": s.trainer.max_steps, "plain": 0}
    assert not any(f"train/{field}" in m for _, m in logged for field in HEALTH)


def test_only_the_underflow_aware_scaler_reads_health():
    """make_step and validation both read the scaler config's `needs_health`."""
    assert [name for name, scaler in SCALERS.items() if scaler.config.needs_health] == ["underflow_aware"]


LOSSES = {"critic": CRITIC_LOSSES, "gen": GENERATOR_LOSSES}


def per_net(trace: list[tuple[int, dict[str, float]]], prefix: str) -> list[tuple[int, dict[str, float]]]:
    return [(step, m) for step, m in trace if f"{prefix}/loss" in m]


@pytest.mark.parametrize("scaler,health", [
    pytest.param("dynamic", True, marks=pytest.mark.slow), ("dynamic", False),   # the rest in `make test-full` (CI's time)
    *(pytest.param(name, health, marks=pytest.mark.slow) for name in ("none", "static", "fixed_clip") for health in (True, False)),
    pytest.param("underflow_aware", True, marks=pytest.mark.slow),   # it reads health: never without it
], ids=lambda v: v if isinstance(v, str) else ("health" if v else "no-health"))
def test_draining_statuses_in_blocks_reads_what_step_by_step_reads(scaler, health):
    """The loop fetches statuses at its cadence, several at once (`NetState.drain` reads them as one
    table). Against the same run drained after every step: the same weights bit for bit, each
    block's losses the mean of its steps' losses, the same scale and skipped count at every
    drain, the same health where a drained step was measured."""
    settings = {"none": (), "static": ("scaler.init_scale=16777216",), "fixed_clip": ("scaler.init_scale=16777216",)}
    own = settings.get(scaler, ("scaler.window=3", "scaler.init_scale=16777216"))   # dynamic scalers: grow and back off
    overrides = (*GAN, "amp=o2", f"scaler={scaler}", *own, f"trainer.grad_health={str(health).lower()}")
    block = 4
    runs = []
    for every in (1, block):
        _, task = build(*overrides)
        trace = []
        for step in range(1, 17):
            task.train_step(step, measure=step % block == 0)
            if step % every == 0:
                trace += task.metrics()
        weights = {k: p.asnumpy().copy() for k, p in task.graph_parameters().items()}
        runs.append((trace, weights, [s.counters() for s in task.states()]))
    (steps, weights_a, counters_a), (blocks, weights_b, counters_b) = runs
    assert counters_b == counters_a
    for k, w in weights_a.items():
        np.testing.assert_array_equal(weights_b[k], w, err_msg=k)
    for prefix in ("critic", "gen"):
        each, drained = dict(per_net(steps, prefix)), per_net(blocks, prefix)
        assert [step for step, _ in drained] == [4, 8, 12, 16]
        for step, m in drained:
            span = range(step - block + 1, step + 1)
            for loss in (f"{prefix}/{name}" for name in LOSSES[prefix]):
                np.testing.assert_equal(m[loss], float(np.mean([each[i][loss] for i in span])), err_msg=loss)
            assert m[f"{prefix}/finite"] == float(all(each[i][f"{prefix}/finite"] for i in span))
            for key in (f"{prefix}/scale", f"{prefix}/skipped", f"{prefix}/clip_rate", f"{prefix}/grad_norm",
                        *(f"{prefix}/{f}" for f in HEALTH)):
                np.testing.assert_equal(m.get(key), each[step].get(key), err_msg=f"{key} at {step}")  # NaN == NaN
    if scaler == "dynamic":   # the scaler did act: scales changed and steps were skipped
        critic = [m for _, m in per_net(steps, "critic")]
        assert len({m["critic/scale"] for m in critic}) > 1 and critic[-1]["critic/skipped"] > 0
