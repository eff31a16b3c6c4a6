"""Compile once per sweep: a job that reuses an earlier job's compiled steps trains as if it compiled its own.

The settings a sweep varies (learning rates, the loss scale's start, factor and window, the clip
norm) enter the compiled steps as Parameters; `ampgan.graph_pool` lends a finished task's steps
to the next task of the same structure, with the new task's values copied in.
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import ops

from ampgan.training import graph_pool, hardware
from ampgan.amp.scalers import SCALERS, DynamicScaler, FixedClipScaler
from ampgan.config.schema import validate
from ampgan.data import build_dataset
from ampgan.tasks import build_task
from ampgan.tracking.tracker import NullTracker
from ampgan.training.loop import fit
from tests.conftest import all_runs, compose_cfg, run_cli

GAN = ["model=wgan_gp", "data=gaussians8", "trainer=smoke", "model.hidden=32", "model.n_critic=2", "amp=o2",
       "scaler=fixed_clip"]
CLASSIFIER = ["model=classifier", "data=digits", "trainer=smoke", "amp=o2", "scaler=dynamic"]
# job A, then job B: every setting that enters the steps as a Parameter differs, and the seed
SWEPT = {
    "gan": (["scaler.clip_norm=0.05", "model.lr_d=1e-3", "model.lr_g=1e-3", "scaler.init_scale=256", "trainer.seed=3"],
            ["scaler.clip_norm=0.2", "model.lr_d=3e-4", "model.lr_g=2e-4", "scaler.init_scale=1024", "trainer.seed=4"]),
    "classifier": (["scaler.factor=4", "scaler.window=3", "model.lr=1e-2", "scaler.init_scale=4096", "trainer.seed=3"],
                   ["scaler.factor=2", "scaler.window=5", "model.lr=3e-3", "scaler.init_scale=65536", "trainer.seed=4"]),
}
STEPS = 20


def build(*overrides: str):
    s = validate(compose_cfg(*overrides, "tracking=none", "trainer.eval_every=0"))
    hardware.setup(s.hardware, s.trainer.seed)
    return s, build_task(s, build_dataset(s.data))


def train(task) -> tuple[list, dict[str, np.ndarray]]:
    """STEPS steps, every status: (step, metrics) in order, then every Parameter the steps read."""
    trace = []
    for step in range(1, STEPS + 1):
        task.train_step(step, measure=step % 2 == 0)
        trace += task.metrics()
    return trace, {k: p.asnumpy().copy() for k, p in task.graph_parameters().items()}


def assert_same(a, b) -> None:
    (trace_a, weights_a), (trace_b, weights_b) = a, b
    assert trace_b == trace_a
    assert weights_b.keys() == weights_a.keys()
    for k, w in weights_a.items():
        np.testing.assert_array_equal(weights_b[k], w, err_msg=k)


@pytest.mark.parametrize("case", [pytest.param("gan", marks=pytest.mark.slow), "classifier"])   # the GAN: make test-full
def test_a_job_on_reused_steps_trains_exactly_like_a_freshly_compiled_one(case):
    base = GAN if case == "gan" else CLASSIFIER
    job_a, job_b = SWEPT[case]
    graph_pool.clear()
    s_b, fresh = build(*base, *job_b)
    assert not graph_pool.lend_graphs(fresh, s_b)  # nothing pooled: it compiles its own
    expected = train(fresh)

    graph_pool.clear()
    s_a, first = build(*base, *job_a)
    trained_a = train(first)
    graph_pool.give_back(first, s_a)
    s_b, second = build(*base, *job_b)
    assert graph_pool.lend_graphs(second, s_b)
    assert [st.step for st in second.states()] == [st.step for st in first.states()]  # A's compiled steps
    reused = train(second)
    graph_pool.clear()

    assert trained_a[0] != expected[0]  # the swept settings did change the run
    assert_same(expected, reused)
    # the scaler acted under B's own settings: skips and scale changes (classifier), clipping (GAN)
    scales = [m[k] for _, m in reused[0] for k in m if k.endswith("/scale")]
    if case == "classifier":
        assert scales[0] == 65536 and len(set(scales)) > 1
    else:
        assert max(m["critic/clip_rate"] for _, m in reused[0] if "critic/clip_rate" in m) > 0


@ms.jit_class
class ConstantClip(FixedClipScaler):
    """The clip norm as a graph constant, as it was before it became a Parameter."""

    hyperparameters = ()

    def __init__(self, cfg, prefix: str):
        super().__init__(cfg, prefix)
        self.clip_norm = cfg.clip_norm

    def clip(self, grads, grad_norm):  # the clip as it was, a constant over the norm (zeroing omitted: skip_nonfinite)
        ratio = self.clip_norm / ops.maximum(grad_norm, 1e-12)
        factor = ops.minimum(ratio, ops.ones((), ms.float32))
        clipped = ops.logical_and(ratio < 1.0, ops.isfinite(grad_norm))
        return tuple(g * factor.astype(g.dtype) for g in grads), clipped.astype(ms.float32)


@ms.jit_class
class ConstantDynamic(DynamicScaler):
    """Factor and window as graph constants, as they were before they became Parameters."""

    hyperparameters = ()

    def __init__(self, cfg, prefix: str):
        super().__init__(cfg, prefix)
        self.factor, self.window = cfg.factor, cfg.window


# the GAN with clipping (66 s in CI) in make test-full: make test keeps the classifier's dynamic scale
@pytest.mark.parametrize("case,name,constant", [pytest.param("gan", "fixed_clip", ConstantClip, marks=pytest.mark.slow),
                                                ("classifier", "dynamic", ConstantDynamic)])
def test_settings_as_parameters_train_exactly_like_the_constants_did(case, name, constant, monkeypatch):
    overrides = (GAN if case == "gan" else CLASSIFIER) + SWEPT[case][0]
    graph_pool.clear()
    _, task = build(*overrides)
    as_parameters = train(task)
    monkeypatch.setitem(SCALERS, name, constant)
    _, task = build(*overrides)
    as_constants = train(task)
    trace, weights = as_parameters
    settings = {k for k in weights if k.rsplit("/", 1)[-1] in ("factor", "window", "clip_norm")}
    assert settings  # the Parameter form holds them; the constant form does not
    assert_same((trace, {k: w for k, w in weights.items() if k not in settings}), as_constants)
    skipped = [m[k] for _, m in trace for k in m if k.endswith("/skipped") or k.endswith("/clip_rate")]
    assert max(skipped) > 0  # the scaler acted: it skipped (dynamic) or clipped (fixed_clip)


def test_structure_key_separates_what_is_compiled_from_what_is_read_at_run_time():
    base = ["model=wgan_gp", "data=gaussians8", "amp=o2", "scaler=dynamic"]
    s = validate(compose_cfg(*base))
    data = build_dataset(s.data)
    key = graph_pool.structure_key(s, data)
    for same in (["model.lr_g=1e-3", "model.lr_d=1e-2"], ["scaler.factor=4", "scaler.window=7"],
                 ["scaler.init_scale=8"], ["trainer.seed=9", "trainer.max_steps=5", "trainer.log_every=3"],
                 ["data.seed=5", "data.noise=0.1"], ["hardware.threads=1"]):
        assert graph_pool.structure_key(validate(compose_cfg(*base, *same)), data) == key, same
    for other in (["amp=o0"], ["model.betas=[0.9,0.99]"], ["model.gp_lambda=1"], ["trainer.batch_size=64"],
                  ["trainer.grad_health=false"], ["scaler=underflow_aware"], ["amp.keep_fp32=[Dense]"]):
        assert graph_pool.structure_key(validate(compose_cfg(*base, *other)), data) != key, other


def test_checkpoints_hold_state_not_the_settings_read_at_run_time():
    _, task = build(*CLASSIFIER)
    state, everything = task.state_parameters(), task.graph_parameters()
    assert "train.scaler/scale_value" in state and "train.scaler/counter" in state
    assert {"train.scaler/factor", "train.scaler/window", "train.opt/lr0"} <= everything.keys() - state.keys()


@pytest.mark.slow  # `make test-full` (CI's time): the reuse itself is checked bit for bit above
def test_a_serial_sweep_compiles_once_and_says_so(outputs):
    """Jobs in order: (0.5, reuse), (0.5, no reuse), (2, reuse), (2, no reuse), (8, reuse), (8, no reuse)."""
    proc = run_cli("-m", "scaler=fixed_clip", "scaler.clip_norm=0.5,2,8", "trainer.reuse_compiled=true,false",
                   "trainer=smoke", "trainer.max_steps=12", outputs=outputs)
    assert proc.returncode == 0, proc.stderr[-2000:]
    _, runs = all_runs(outputs)
    jobs = sorted((r for r in runs if "job_num" in r.data.tags), key=lambda r: int(r.data.tags["job_num"]))
    assert [r.data.params["trainer.reuse_compiled"] for r in jobs] == ["True", "False"] * 3
    assert [r.data.tags["ampgan.graphs"] for r in jobs] == ["compiled", "compiled", "reused", "compiled", "reused", "compiled"]
    assert (proc.stdout + proc.stderr).count("compiled steps of an earlier job reused") == 2
    for r in jobs:
        m = r.data.metrics
        assert 0 < m["perf/step_s"] and 0 < m["job/overhead_s"] < m["job/wall_s"]
    assert jobs[0].data.metrics["startup/imports_s"] > 0 and jobs[1].data.metrics["startup/imports_s"] == 0


class MetricsRecorder(NullTracker):
    """A tracker that keeps the metrics it is given (and drops the rest)."""

    def __init__(self):
        self.logged: dict[str, float] = {}

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.logged.update(metrics)


@pytest.mark.parametrize("steps", [1, 3])
def test_the_loop_speed_is_logged_only_when_measured(steps, tmp_path):
    """`perf/step_s` is the time of the steps after the first: a one-step run has none to log."""
    s, task = build(*CLASSIFIER, f"trainer.max_steps={steps}")
    tracker = MetricsRecorder()
    final = fit(task, tracker, s.trainer, tmp_path)
    if steps == 1:
        assert "perf/step_s" not in final and "perf/step_s" not in tracker.logged
    else:
        assert final["perf/step_s"] > 0 and tracker.logged["perf/step_s"] == final["perf/step_s"]
