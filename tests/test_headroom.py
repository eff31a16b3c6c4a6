"""Activation headroom: each leaf cell's max |output| measured inside the compiled step, only by
the measuring variant; logged as act/<cell>/max_abs, <net>/act_max_abs, <net>/headroom; a run
whose headroom falls under trainer.headroom_warn (or that goes non-finite) warns once and is
tagged with the command that diagnoses it; training itself is unchanged, bit for bit."""

from __future__ import annotations

from dataclasses import replace

import logging
import math
import re

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn, ops

from ampgan import AmpganError
from ampgan.amp.activations import NOT_REACHED, Recording
from ampgan.amp.float16 import FP16_MAX
from ampgan.config.schema import validate
from ampgan.data import build_dataset
from ampgan.tasks import build_task
from ampgan.training import hardware
from ampgan.training.entry import train
from ampgan.tracking.tracker import NullTracker
from ampgan.training.loop import NEXT_COMMAND_TAG, WARNING_TAG, Progress, run_steps, warning_reason
from tests.conftest import all_runs, compose_cfg, count_launches

GAN = ["model=wgan_gp", "data=gaussians8", "trainer=smoke", "model.hidden=32", "model.n_critic=1"]
SMALL_GAN = [*GAN, "model.depth=1", "model.hidden=16"]   # quicker to compile
CLASSIFIER = ["model=classifier", "data=digits", "trainer=smoke"]
MEASURED_ONLY = ("zero", "underflow", "max_abs_scaled_grad", "nonfinite", "grad_norm", "act_max_abs", "headroom")


class Scale(nn.Cell):
    """x times a constant."""

    def __init__(self, factor: float):
        super().__init__()
        self.factor = float(factor)

    def construct(self, x):
        return x * self.factor


class LoudNet(nn.Cell):
    """Dense, ReLU, times `knob`, divided by `knob`, Dense: the function of knob 1, with one
    activation (`loud`) `knob` times larger: a planted forward overflow waiting to happen."""

    def __init__(self, in_channels: int, num_classes: int, knob: float = 1.0, hidden: int = 16):
        super().__init__()
        self.body = nn.SequentialCell([nn.Dense(in_channels, hidden), nn.ReLU()])
        self.loud = Scale(knob)
        self.quiet = Scale(1.0 / knob)
        self.head = nn.Dense(hidden, num_classes)

    def construct(self, x):
        return self.head(self.quiet(self.loud(self.body(x))))


def build(*overrides: str):
    """The task `overrides` configure; each step's `launches`: which variant ran (`count_launches`)."""
    s = validate(compose_cfg(*overrides, "tracking=none", "trainer.eval_every=0"))
    hardware.setup(s.hardware, s.trainer.seed)
    task = build_task(s, build_dataset(s.data))
    for state in task.states():
        state.step.launches = count_launches(state.step)
    return s, task


class Recorder(NullTracker):
    """The tracker `run_steps` talks to, keeping what it was given."""

    def __init__(self):
        self.logged: list[tuple[int, dict[str, float]]] = []
        self.tags: dict[str, str] = {}

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.logged.append((step, dict(metrics)))

    def set_tags(self, tags: dict[str, str]) -> None:
        self.tags.update(tags)


def loop(task, s, steps: int) -> Recorder:
    """A run of `steps` steps (its last step is measured, whatever the cadence)."""
    tracker = Recorder()
    run_steps(task, tracker, replace(s.trainer, max_steps=steps), None, range(1, steps + 1),
              Progress(steps, 0, s.trainer.print_every, 0))
    return tracker


def keep_list_path(root: str, name: str) -> str:
    """A cell's path as amp.keep_fp32 spells it: AMP wrappers' attributes left out."""
    return re.sub(r"\.(_backbone|cell)(?=\.|$)", "", ".".join(p for p in (root, name) if p))


def hooked_peaks(task, root: str, forward) -> dict[str, float]:
    """max |output| of every leaf cell of `root`'s net over `forward()`, by PYNATIVE forward hooks."""
    peaks: dict[str, float] = {}
    handles = []
    for name, cell in task.roots()[root].cells_and_names():
        if cell.name_cells():
            continue
        path = keep_list_path(root, name)

        def hook(cell, inputs, output, path=path):
            peaks[path] = max(peaks.get(path, 0.0), float(np.abs(output.asnumpy().astype(np.float64)).max()))

        handles.append(cell.register_forward_hook(hook))
    try:
        forward()
    finally:
        for handle in handles:
            handle.remove()
    return peaks


@pytest.mark.parametrize("case,amp,jit,rtol", [(CLASSIFIER, "o2", True, 2e-3), (CLASSIFIER, "o0", False, 1e-6),
                                               (GAN, "o0", True, 1e-5)], ids=["classifier-o2", "classifier-pynative",
                                                                              "wgan-gp"])
def test_logged_peaks_are_the_cells_max_abs_output(case, amp, jit, rtol):
    """The first step's act/<cell>/max_abs against forward hooks on the same weights and batch
    (the critic's over its passes on real, fake and interpolated samples), and the summaries."""
    s, task = build(*case, f"amp={amp}", "scaler=dynamic", f"hardware.jit={jit}")
    host = task.host_state()
    subs = task.step_inputs()
    task.load_host_state(host)           # the loop draws the very same batch and noise again
    if task.states()[0].prefix == "train":
        (_, (x, _)), = subs
        expected = hooked_peaks(task, "", lambda: task.net_amp(x))
    else:
        (_, (real, z, alpha)), (_, (z_gen,)) = subs

        def critic_passes():
            fake = task.gen_amp(z)
            for samples in (real, fake, alpha * real + (1 - alpha) * fake):
                task.critic_amp(samples)

        expected = {**hooked_peaks(task, "critic", critic_passes),
                    **hooked_peaks(task, "gen", lambda: task.gen_amp(z_gen))}
    metrics = {k: v for step, m in loop(task, s, 1).logged if step == 1 for k, v in m.items()}
    logged = {k[len("act/"):-len("/max_abs")]: v for k, v in metrics.items() if k.startswith("act/") and k.endswith("/max_abs")}
    assert logged.keys() == expected.keys() and len(logged) >= 7
    for path, value in expected.items():
        assert logged[path] == pytest.approx(value, rel=rtol), path
    for state in task.states():
        cells = [v for path, v in logged.items() if path.split(".")[0] == state.prefix or state.prefix == "train"]
        assert metrics[f"{state.prefix}/act_max_abs"] == max(cells)
        if amp == "o2":
            assert metrics[f"{state.prefix}/headroom"] == pytest.approx(FP16_MAX / max(cells))
            assert all(metrics[f"act/{p}/headroom"] == pytest.approx(FP16_MAX / v) for p, v in logged.items())
        else:   # FP32: no float16 range to speak of
            assert not any(k.endswith("/headroom") for k in metrics)


def test_the_plain_variant_computes_no_activation_statistic():
    """Peaks the plain variant would overwrite stay as planted; its status carries zeros; the
    cell tree is the net's own between launches; a later measured launch records again."""
    _, task = build(*CLASSIFIER, "amp=o2", "scaler=dynamic")
    step, peaks = task.state.step, task.state.step.peaks
    tree = [(name, type(cell)) for name, cell in task.net_amp.cells_and_names()]
    (_, (x, y)), = task.step_inputs()
    measured = step.decode(step.launch(x, y, measure=True).asnumpy())
    assert len(peaks) == 12 and (measured.act > 0).all()
    planted = ms.Tensor(123.0, ms.float32)
    for slot in peaks.slots:
        ops.assign(slot, planted)
    for _ in range(3):
        plain = step.decode(step.launch(x, y, measure=False).asnumpy())
        assert (plain.act == 0).all()
    assert [float(slot.asnumpy()) for slot in peaks.slots] == [123.0] * len(peaks)
    assert step.launches == {"measured": 1, "plain": 3}
    assert [(name, type(cell)) for name, cell in task.net_amp.cells_and_names()] == tree
    assert not any(isinstance(cell, Recording) for _, cell in task.net_amp.cells_and_names())
    again = step.decode(step.launch(x, y, measure=True).asnumpy())
    assert (again.act > 0).all() and (again.act != 123.0).all()
    np.testing.assert_array_equal(again.act, [float(slot.asnumpy()) for slot in peaks.slots])


@pytest.mark.parametrize("case", [CLASSIFIER, pytest.param(SMALL_GAN, marks=pytest.mark.slow)], ids=["classifier", "wgan-gp"])
def test_headroom_leaves_training_bit_identical(case):
    """Same seed, headroom on or off (measured every third step): losses, scales, skips, weights,
    optimizer and scaler state agree exactly; only the on run logs activation metrics."""
    runs = []
    for headroom in (True, False):
        _, task = build(*case, "amp=o2", "scaler=dynamic", "scaler.window=2", "trainer.batch_size=32",
                        f"trainer.headroom={headroom}")
        trace, act_keys = [], set()
        for step in range(1, 9):
            task.train_step(step, measure=step % 3 == 1)
            for n, m in task.metrics():
                act_keys |= {k for k in m if k.endswith(("/act_max_abs", "/headroom"))}
                trace.append((n, {k: v for k, v in m.items() if k.split("/")[-1] not in MEASURED_ONLY}))
            act_keys |= {k for k in task.layer_health() if k.startswith("act/")}
        state = {k: p.asnumpy().copy() for k, p in task.graph_parameters().items()}
        runs.append((trace, state, act_keys))
    (trace_on, state_on, act_on), (trace_off, state_off, act_off) = runs
    assert act_on and not act_off
    assert trace_on == trace_off
    prefix = task.states()[0].prefix
    assert len({m[f"{prefix}/scale"] for _, m in trace_on if f"{prefix}/scale" in m}) > 1   # the scaler did act
    assert state_on.keys() == state_off.keys()
    for k, value in state_on.items():
        np.testing.assert_array_equal(state_off[k], value, err_msg=k)


def test_keep_list_wrappers_are_transparent_in_cell_paths():
    """act/<path> names a cell as amp.keep_fp32 does, whatever AMP wrapped it in."""
    _, fp32 = build(*CLASSIFIER, "amp=o0")
    _, kept = build(*CLASSIFIER, "amp=o2", "amp.keep_fp32=[head.fc,BatchNorm2d]")
    assert kept.state.step.act_paths == fp32.state.step.act_paths
    assert "head.fc" in fp32.state.step.act_paths and "backbone.body.1" in fp32.state.step.act_paths
    _, gan = build(*GAN, "amp=o2")
    assert [p.split(".")[0] for p in gan.critic_state.step.act_paths] == ["critic"] * 8
    assert [p.split(".")[0] for p in gan.gen_state.step.act_paths] == ["gen"] * 7


def test_no_peaks_without_gradient_health_or_with_headroom_off():
    for off in ("trainer.grad_health=false", "trainer.headroom=false"):
        _, task = build(*CLASSIFIER, "amp=o2", off)
        assert task.state.step.peaks is None and task.state.step.act_paths == ()


LOUD = ["model=classifier", "data=gaussians8", "trainer=smoke", "trainer.max_steps=4", "trainer.eval_every=0",
        "trainer.log_every=1", "amp=o2", "scaler=dynamic", "tracking.background=never",
        "model.net._target_=tests.test_headroom.LoudNet"]


def test_a_loud_activation_warns_once_and_tags_the_diagnose_command(outputs, tmp_path, caplog):
    """knob 16384: `loud`'s output ~2e4, headroom under 8 from the first step on; one warning line,
    tags with `python -m ampgan.diagnose diagnose.run=<run id>`. knob 1: no warning."""
    with caplog.at_level(logging.WARNING, logger="ampgan"):
        train(compose_cfg(*LOUD, "+model.net.knob=16384"), run_dir=tmp_path / "loud")
        train(compose_cfg(*LOUD, "+model.net.knob=1"), run_dir=tmp_path / "quiet")
    client, runs = all_runs(outputs)
    by_dir = {r.data.tags["output_dir"]: r for r in runs}
    loud, quiet = by_dir[str(tmp_path / "loud")], by_dir[str(tmp_path / "quiet")]
    command = f"python -m ampgan.diagnose diagnose.run={loud.info.run_id}"
    assert loud.data.tags[NEXT_COMMAND_TAG] == command
    assert loud.data.tags[WARNING_TAG].startswith("step 1: train/headroom ")
    assert loud.data.tags[WARNING_TAG].endswith(f"; next: {command}")
    history = client.get_metric_history(loud.info.run_id, "train/headroom")
    assert [m.step for m in history] == [1, 2, 3, 4] and all(1 < m.value < 8 for m in history)
    loud_cell = client.get_metric_history(loud.info.run_id, "act/loud/max_abs")   # per-layer: from step 2, training's start
    headroom_at = {m.step: m.value for m in history}
    assert loud_cell and loud_cell[0].step == 2 and loud_cell[0].value == pytest.approx(FP16_MAX / headroom_at[2])
    warnings = [r.getMessage() for r in caplog.records if "python -m ampgan.diagnose" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].startswith("step 1: train/headroom ")
    assert warnings[0].endswith(f"is it float16's fault? next: {command}")
    assert WARNING_TAG not in quiet.data.tags and NEXT_COMMAND_TAG not in quiet.data.tags
    assert client.get_metric_history(quiet.info.run_id, "train/headroom")[0].value > 8


def test_diagnoses_replays_of_a_loud_run_give_no_warning(caplog):
    """A replay is not a run to diagnose: the loop that diagnose drives (verify's training, with
    `Progress(warns=False)`) trains the loud net without the warning that its run gives."""
    from ampgan.diagnose.verify import _train

    s = validate(compose_cfg(*LOUD, "+model.net.knob=16384", "tracking=none"))
    with caplog.at_level(logging.WARNING, logger="ampgan"):
        objective, _, value = _train(s, build_dataset(s.data), 4)
    assert objective and math.isfinite(value)   # it trained
    assert not [r for r in caplog.records if "python -m ampgan.diagnose" in r.getMessage()]


def test_warning_reasons():
    """Headroom under the threshold first; else a non-finite loss or activation peak, or losses
    non-finite in the newest step; else none."""
    assert warning_reason({"critic/headroom": 20.0, "gen/headroom": 5.0, "gen/loss": math.nan}, 0, 8.0).startswith(
        "gen/headroom 5 < trainer.headroom_warn=8")
    assert warning_reason({"train/loss": math.inf}, 1, 8.0) == "train/loss not finite"
    assert warning_reason({"train/act_max_abs": math.nan, "train/loss": 1.0}, 0, 8.0) == "train/act_max_abs not finite"
    assert warning_reason({"train/scale": 1.0}, 2, 8.0) == "the losses not finite"
    assert warning_reason({"train/headroom": 8.0, "train/loss": 1.0, "train/act_max_abs": 8188.0}, 0, 8.0) is None


@pytest.mark.parametrize("value", ["1", "0.5", "-8", "nan"])
def test_headroom_warn_must_exceed_one(value):
    with pytest.raises(AmpganError, match=r"headroom_warn") as err:
        validate(compose_cfg("trainer.headroom_warn=" + value))
    assert "\n" not in str(err.value)


def test_a_nan_output_gives_a_nan_peak():
    """CPU's ReduceMax skips a NaN unless it comes first; the peak must not."""
    from ampgan.amp.activations import peak_of

    y = np.arange(12, dtype=np.float32).reshape(3, 4) - 5
    y[1, 2] = np.nan
    assert math.isnan(float(ms.jit(peak_of)(ms.Tensor(y)).asnumpy()))
    assert float(ms.jit(peak_of)(ms.Tensor(np.nan_to_num(y))).asnumpy()) == 6.0
    assert NOT_REACHED < 0
