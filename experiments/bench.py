"""`make bench`: what ampgan costs over bare MindSpore, and what each feature costs.

Every comparison builds its variants once (graphs compiled and warmed), then times blocks
of training iterations interleaved A B, B A, A B ... (the order flips each round, so a drift
of the machine within a round favours neither variant). A figure is the median over the
rounds, with min and max to show the noise; a ratio is taken round by round (the variant's
block over the baseline's block in the same round), and beside its median stands a 95%
bootstrap interval over the rounds. A target counts as met only when the whole interval is
below it ("met"); "not met" when the whole interval is above it; "unresolved" when the
interval straddles it (the machine was too noisy to tell). The headline pairs (ampgan vs a
bare MindSpore loop, for each model; gradient health; activation headroom; tracking) time 4x more rounds of
half-length blocks than the other comparisons, to resolve a 2% difference; a calibration
pair (two identical loops) shows how far from 1.00 the bench reads no difference. Periodic work
(evaluation, checkpoints) is switched off in the timed blocks; metric logging keeps its
default cadence. Host time, for each ampgan-vs-bare pair: a loop's wall time minus the time
inside its compiled step calls (`StepClock`), per iteration; ampgan's beyond bare's, round by
round, in µs with its interval (target <= 100 µs): a CPU figure, so it holds for any device's
host. Memory: the peak RSS of the default `python -m ampgan.train` run, and RSS
over a long in-process run (`--memory-steps`). Results: outputs/bench/bench.md,
outputs/bench/bench.json, and an MLflow run in the experiment "ampgan-bench".

    python -m experiments.bench                    # the headline sections (make bench), in under 15 min on 2 cores
    python -m experiments.bench --full             # every section, the 20000-step memory run, 5 repeats (make bench-full)
    python -m experiments.bench --quick            # fewer rounds, smaller blocks, a short memory run
    python -m experiments.bench --device GPU       # on a GPU machine: AMP's real speed-up too
    python -m experiments.bench --only "whole command" --no-startup   # diagnose's whole command against a run
    python -m experiments.bench --only "diagnose replay" --no-startup   # diagnose's replay cost alone
    python -m experiments.bench --only memory --no-startup     # memory alone
    python -m experiments.bench --only "ampgan vs bare"        # the six bare-loop comparisons
    python -m experiments.bench --only "data parallel" --no-startup   # 1 vs 2 workers (msrun), the all-reduce's share
    python -m experiments.bench --only "ampgan vs bare,gradient health,tracking to" --repeats 25 --no-startup  # the headline pairs, 100 rounds
    python -m experiments.bench --quick --only "activation headroom" --no-startup   # activation headroom's cost alone
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from hydra import compose, initialize_config_dir

from ampgan import AmpganError, report_error
from ampgan.training import hardware  # first: it quiets MindSpore's C++ logging before MindSpore loads
from ampgan.config.schema import CONF_DIR, Settings, TrainerConfig, outputs_dir, validate
from ampgan.data import Dataset
from ampgan.tasks import build_task, load_data, task_class
from ampgan.tracking.tracker import MlflowTracker
from ampgan.training.entry import build_run_tracker
from ampgan.training.loop import Progress, run_steps, tracked_run
from experiments.bare_loop import BareClassifier, BareWganGp
from experiments.bench_stats import CI_LEVEL, CI_RESAMPLES, bootstrap_ci, host_row, ratio_row, verdict
from mindspore import runtime as ms_runtime  # after ampgan.training.hardware (above)

PERIODIC_OFF = ["trainer.eval_every=0", "trainer.checkpoint_every=0", "trainer.print_every=100000",
                "trainer.max_steps=1000000"]
GAN = ["model=wgan_gp", "data=gaussians8", *PERIODIC_OFF]
CONV_GAN = ["model=wgan_gp", "data=digits", "data.image_size=8", "model.hidden=16", "model.z_dim=32",
            "model.gp_lambda=10", "trainer.batch_size=64", *PERIODIC_OFF]
CLASSIFIER = ["model=classifier", "data=digits", "trainer=classifier", *PERIODIC_OFF]
RESNET = [*CLASSIFIER, "model.net._target_=ampgan.models.ResNet"]
TRANSFORMER = [*CLASSIFIER, "model.net._target_=ampgan.models.VisionTransformer"]
LANGUAGE_MODEL = ["model=lm", "trainer=classifier", "trainer.batch_size=64", *PERIODIC_OFF]
O2_DYNAMIC = ["amp=o2", "scaler=dynamic"]
LIKE_BARE = ["trainer.grad_health=false", "tracking=none"]  # what the bare loops leave out

HOST_CYCLE = TrainerConfig.log_every   # a host block's steps: whole cycles of the default log cadence
HOST_ROUNDS = 6    # about this many rounds (at least) also time a synced host block (StepClock.synced): on
                   # the slow-step models (classifier, ResNet, LM) the 10-step host blocks were 90% of the section

# The targets: the most a feature (or ampgan itself) may cost, as a ratio over its baseline.
TARGET_AMPGAN_VS_BARE = 1.02
TARGET_HEALTH = 1.03
TARGET_MODEL_CELL = 1.03    # ampgan's step cell under Model.train against MindSpore's TrainOneStepCell
TARGET_HEADROOM = 1.03      # activation headroom on top of gradient health, at the default cadence
TARGET_TRACKING = 1.02
TARGET_HOST_US = 100.0     # host time per iteration beyond the bare loop's, in µs, on every model
TARGET_DIAGNOSE = 3.0
TARGET_MEMORY_GROWTH_PCT = 5.0
TARGET_STARTUP_S = 5.0      # command to first finished step, cold
TARGET_BEYOND_FLOOR_S = 0.5  # ampgan's command to first finished step beyond bare MindSpore's, cold and warm
TARGET_JOB_OVERHEAD_S = 1.5  # seconds a job of a serial sweep adds beyond its steps

HEADLINE_ROUNDS = 4.0  # the headline pairs: 4x the --repeats rounds, of half-length blocks
DEFAULT_REPEATS = 3    # `make bench`: the headline figures in about 15 minutes on 2 cores
FULL_REPEATS = 5       # `make bench-full`
COMMITTED = Path(__file__).resolve().parent.parent / "docs" / "bench" / "bench.json"   # the table --compare reads

# ampgan vs bare, one comparison per model: (name, overrides, block length relative to the MLP
# WGAN-GP's headline block), so that a block takes about the same wall time for each model. On 2
# CPU cores an O2 iteration of either WGAN-GP (5 critic steps + 1 generator step) takes ~130 ms;
# an O2 classifier step ~1 s (MindSpore's float16 convolutions on CPU), so its blocks are 1 step.
BARE_MODELS = [
    ("ampgan vs bare MindSpore (WGAN-GP O2 dynamic, health off, no tracking)", GAN, 1.0),
    ("ampgan vs bare MindSpore: conv WGAN-GP (digits 8x8, O2 dynamic, health off, no tracking)", CONV_GAN, 1.0),
    ("ampgan vs bare MindSpore: classifier (digits, O2 dynamic, health off, no tracking)", CLASSIFIER, 0.125),
    ("ampgan vs bare MindSpore: ResNet (digits, O2 dynamic, health off, no tracking)", RESNET, 0.125),
    ("ampgan vs bare MindSpore: vision transformer (digits, O2 dynamic, health off, no tracking)", TRANSFORMER, 0.25),
    ("ampgan vs bare MindSpore: language model (Python's docstrings, O2 dynamic, health off, no tracking)",
     LANGUAGE_MODEL, 2.0),
]

def settings_for(overrides: list[str], device: str) -> Settings:
    """The validated settings `python -m ampgan.train <overrides> hardware=<device>` would run with."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides + [f"hardware={device.lower()}"])
    return validate(cfg)


class StepClock:
    """Seconds spent inside compiled step calls.

    A loop's wall time minus this is its host time: everything the loop does in Python around the
    steps (batches, inputs, statuses, bookkeeping, logging). The bench wraps the steps of a built
    runner from outside (`wrap`); nothing in ampgan's own classes is timed.

    `synced`: each call is followed by `mindspore.runtime.synchronize()` inside the timing, so a
    step's time holds all of its graph. A jitted call on CPU can return while its graph's last
    kernels still run (measured on the vision transformer: a fetch right after the call waits up
    to 4 ms in 1 call of 10, 0.2 ms after a 5 ms sleep); unsynced, that tail is counted as host
    time by whichever fetch waits for it, and a loop that fetches every 10 steps is charged it
    10 times as often as one that fetches every 100. The host figures come from synced blocks;
    the ratios from unsynced ones (the loops as they run)."""

    def __init__(self):
        self.seconds = 0.0
        self.synced = False

    def wrap(self, fn: Callable) -> Callable:
        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                out = fn(*args, **kwargs)
                if self.synced:
                    ms_runtime.synchronize()
                return out
            finally:
                self.seconds += time.perf_counter() - started

        return timed

    def wrap_step(self, step) -> None:
        """Time both variants of an ampgan `Step`, the plain one also when it is built later."""
        single = step.plain is step.fn
        step.fn = self.wrap(step.fn)
        if single:
            step.plain = step.fn
        elif step.plain is not None:
            step.plain = self.wrap(step.plain)
        else:
            build = step.build_plain
            step.build_plain = lambda: self.wrap(build())


class AmpganRunner:
    """ampgan's own loop (`trainer.run_steps`) on a task and tracker built exactly as `train()` builds them."""

    def __init__(self, overrides: list[str], store: str, device: str):
        self.settings = s = settings_for(overrides, device)
        if s.tracking.backend == "mlflow":
            s.tracking.uri = store
        hardware.setup(s.hardware, s.trainer.seed)
        self.task = build_task(s, load_data(s))
        self.run_dir = Path(tempfile.mkdtemp(prefix="ampgan-bench-"))
        self.tracker, _ = build_run_tracker(s, self.run_dir)  # journals metrics in the run folder, as train() does
        self.tracker.start("bench-variant", {}, {"bench": "variant"})
        t = s.trainer
        self.progress, self.step = Progress(t.max_steps, 0, t.print_every, t.print_seconds), 1
        self.clock = StepClock()
        for state in self.task.states():
            self.clock.wrap_step(state.step)

    def run(self, iterations: int) -> None:
        steps = range(self.step, self.step + iterations)
        run_steps(self.task, self.tracker, self.settings.trainer, self.run_dir, steps, self.progress)
        self.step += iterations

    def align(self, cycle: int) -> None:
        """Number the next block's steps from a multiple of `cycle` plus 1, so that a block of whole
        cycles fetches the statuses once a cycle, at its end, as a run does (a block that ends
        between two fetches has its pending statuses fetched when `run_steps` returns: an extra
        fetch a real run does not make). Only the step numbers move; nothing is trained twice."""
        self.step += (1 - self.step) % cycle

    def close(self) -> None:
        self.tracker.finish("FINISHED")
        shutil.rmtree(self.run_dir, ignore_errors=True)


def _bare_wgan_gp(s: Settings, data: Dataset) -> BareWganGp:
    m, sc = s.model, s.scaler
    return BareWganGp(data.x_train, z_dim=m.z_dim, hidden=m.hidden, depth=m.depth, batch_size=s.trainer.batch_size,
                      n_critic=m.n_critic, gp_lambda=m.gp_lambda, lr=m.lr_d, betas=tuple(m.betas),
                      amp_level=s.amp.level, init_scale=sc.init_scale, factor=sc.factor, window=sc.window,
                      seed=s.trainer.seed)


def _bare_classifier(s: Settings, data: Dataset) -> BareClassifier:
    from ampgan.config.targets import instantiate

    m, sc = s.model, s.scaler

    def make_net():  # the same model.net target ampgan builds, with the same data arguments
        return instantiate(m.net, "model.net", task_class(s).given(s, data))

    return BareClassifier(data.x_train, data.y_train, make_net=make_net,
                          batch_size=s.trainer.batch_size, lr=m.lr, betas=tuple(m.betas), amp_level=s.amp.level,
                          init_scale=sc.init_scale, factor=sc.factor, window=sc.window, seed=s.trainer.seed)


def _timed_block(runner, iterations: int) -> tuple[float, float]:
    """Run one block; (wall seconds, host seconds) per iteration (host: wall minus the clocked steps,
    0 for a runner without a clock)."""
    clock = getattr(runner, "clock", None)
    in_steps = clock.seconds if clock is not None else 0.0
    started = time.perf_counter()
    runner.run(iterations)
    wall = time.perf_counter() - started
    steps = clock.seconds - in_steps if clock is not None else wall
    return wall / iterations, (wall - steps) / iterations


# model.name -> its bare loop (the language model is a classifier over every position of a window)
BARE_LOOPS = {"wgan_gp": _bare_wgan_gp, "classifier": _bare_classifier, "lm": _bare_classifier}


class BareRunner:
    """The hand-written MindSpore loop (experiments/bare_loop.py) for the model and settings the overrides choose."""

    def __init__(self, overrides: list[str], device: str):
        s = settings_for(overrides, device)
        hardware.setup(s.hardware, s.trainer.seed)
        self.loop = BARE_LOOPS[s.model.name](s, load_data(s))
        self.clock = StepClock()
        for name in ("step", "critic_step", "generator_step"):
            if hasattr(self.loop, name):
                setattr(self.loop, name, self.clock.wrap(getattr(self.loop, name)))

    def run(self, iterations: int) -> None:
        self.loop.run(iterations)

    def close(self) -> None: ...


class ModelTrainRunner:
    """MindSpore's own `Model.train` on one net and the digits, as a user's script runs it: with
    ampgan's train-step cell (`api.train_step`, a static scale, its defaults otherwise: with no
    callback to read them, no step measures gradient health), or with MindSpore's
    `TrainOneStepCell` and the same fixed scale
    (`FixedLossScaleManager(drop_overflow_update=False)`, the manager CPU's `Model` accepts, with
    the optimizer's `loss_scale` the same, as its docs ask: the optimizer unscales the gradients,
    as ampgan's cell does; without it Adam was handed gradients 1024 times too large).
    A block is one `model.train(1, ...)` over that many batches, with no callback.

    `graph`: the block runs in GRAPH_MODE (set for the block, PYNATIVE again after), where `Model`
    compiles MindSpore's cell whole; in the default PYNATIVE mode its cell runs op by op, while
    ampgan's cell is compiled in either. `mindcv`: a mindcv model of that name (`pretrained=False`)
    on the digits at 16x16 instead of the MLP."""

    SCALE = 1024.0

    def __init__(self, ampgan_cell: bool, device: str, batch_size: int = 64, graph: bool = False, mindcv: str = ""):
        import mindspore as ms
        import mindspore.dataset as mds
        from mindspore import nn
        from mindspore.train import FixedLossScaleManager, Model
        from sklearn.datasets import load_digits

        from ampgan import api

        if ms.get_context("device_target") != device:   # a section before it may have started the runtime
            ms.set_device(device)
        ms.set_seed(0)
        d = load_digits()
        x, y = (d.images.reshape(-1, 64) / 16.0).astype(np.float32), d.target.astype(np.int32)
        if mindcv:   # a mindcv model on the digits upsampled to 16x16, one channel
            x = (np.repeat(np.repeat(d.images, 2, 1), 2, 2)[:, None] / 16.0).astype(np.float32)

        def dataset(n: int):   # n batches, cycling through the digits (`repeat()` with `take` hangs MindSpore's iterator)
            rows = np.arange(n * batch_size) % len(x)
            return mds.NumpySlicesDataset({"x": x[rows], "y": y[rows]}, shuffle=False).batch(batch_size)

        self._dataset = dataset
        if mindcv:
            import mindcv as cv

            net = cv.create_model(mindcv, pretrained=False, num_classes=10, in_channels=1)
        else:
            net = nn.SequentialCell([nn.Dense(64, 256), nn.ReLU(), nn.Dense(256, 256), nn.ReLU(), nn.Dense(256, 10)])
        loss = nn.CrossEntropyLoss()
        if ampgan_cell:
            opt = nn.Adam(net.trainable_params(), learning_rate=1e-3)
            self.model = Model(api.train_step(nn.WithLossCell(net, loss), opt, amp="O2", scaler="static",
                                              init_scale=self.SCALE))
        else:   # as FixedLossScaleManager's docs ask: the optimizer divides the scale out of the gradients
            opt = nn.Adam(net.trainable_params(), learning_rate=1e-3, loss_scale=self.SCALE)
            self.model = Model(net, loss, opt, amp_level="O2",
                               loss_scale_manager=FixedLossScaleManager(self.SCALE, drop_overflow_update=False))
        self.graph = graph

    def run(self, iterations: int) -> None:
        import mindspore as ms

        if self.graph:
            ms.set_context(mode=ms.GRAPH_MODE)
        try:
            self.model.train(1, self._dataset(iterations), dataset_sink_mode=False)
        finally:
            if self.graph:
                ms.set_context(mode=ms.PYNATIVE_MODE)

    def close(self) -> None: ...


@dataclass
class Comparison:
    name: str
    variants: dict[str, Callable]          # label -> runner factory (built when measured)
    baseline: str
    iterations: int                        # per timed block
    target: float | None = None            # max ratio over the baseline, where there is one
    rounds: float = 1.0                    # x the --repeats rounds (the headline figures get more)
    full_only: bool = False                # measured by `--full` (or named by --only), not by the default bench
    times: dict[str, list[float]] = field(default_factory=dict)
    host: dict[str, list[float]] = field(default_factory=dict)   # per round: seconds per iteration outside the steps

    def measure(self, repeats: int, echo: Callable[[str], None] | None = None) -> None:
        """Build and warm every variant, then time one block of each per round, the order flipped each round;
        `echo` gets a progress line after each round (its number and the time left at the pace so far)."""
        rounds = max(3, round(repeats * self.rounds))
        runners = {label: make() for label, make in self.variants.items()}
        for runner in runners.values():
            runner.run(2)  # compile and warm up
        self.times = {label: [] for label in runners}
        self.host = {label: [] for label in runners if hasattr(runners[label], "clock")}
        labels = list(runners)
        host_every = max(1, rounds // HOST_ROUNDS)
        began = time.perf_counter()
        for r in range(rounds):
            for label in labels if r % 2 == 0 else labels[::-1]:
                runner = runners[label]
                self.times[label].append(_timed_block(runner, self.iterations)[0])
            if self.host_rows and r % host_every == 0:   # one synced block each, for the host time
                for label in labels if (r // host_every) % 2 == 0 else labels[::-1]:
                    runner = runners[label]
                    if hasattr(runner, "align"):
                        runner.align(HOST_CYCLE)
                    runner.clock.synced = True
                    self.host[label].append(_timed_block(runner, self.host_iterations)[1])
                    runner.clock.synced = False
            if echo is not None:
                pace = (time.perf_counter() - began) / (r + 1)
                echo(f"round {r + 1} of {rounds}, about {pace * (rounds - r - 1):.0f} s left")
        for runner in runners.values():
            runner.close()

    @property
    def host_iterations(self) -> int:
        """A host block: whole cycles of the default log cadence (at least one), so that ampgan's
        loop fetches as often in it as in a real run (once a cycle, at its end: `AmpganRunner.align`)."""
        return HOST_CYCLE * -(-self.iterations // HOST_CYCLE)

    @property
    def host_rows(self) -> bool:
        """Whether this comparison reports host time: against bare, every variant's steps clocked."""
        return self.baseline == "bare" and set(self.host) == set(self.times)

    def rows(self) -> list[dict]:
        base = self.times[self.baseline]
        rows = [ratio_row(self.name, label, ts, base, self.baseline, self.target) for label, ts in self.times.items()]
        if self.host_rows:
            for row in rows:
                row.update(host_row(self.host[row["variant"]], self.host[self.baseline],
                                    TARGET_HOST_US if row["variant"] != self.baseline else None))
        return rows


def comparisons(store: str, device: str, quick: bool, only: str = ""):
    """Each comparison whose name contains one of the comma-separated texts of `only` (all: "");
    its variants are built when it is measured."""
    wanted = [w.strip() for w in only.lower().split(",")]
    for comp in _comparisons(store, device, quick):
        if any(w in comp.name.lower() for w in wanted):
            yield comp


def _comparisons(store: str, device: str, quick: bool):
    it = 4 if quick else 8  # iterations per block
    short = it // 2         # the headline pairs' blocks
    o2 = GAN + O2_DYNAMIC

    def amp(extra: list[str]) -> AmpganRunner:
        return AmpganRunner(extra, store, device)

    for name, model, relative in BARE_MODELS:
        overrides = model + O2_DYNAMIC
        yield Comparison(name, {"bare": lambda o=overrides: BareRunner(o, device), "ampgan": lambda o=overrides: amp(o + LIKE_BARE)},
                         "bare", max(1, round(short * relative)), target=TARGET_AMPGAN_VS_BARE, rounds=HEADLINE_ROUNDS)
    yield Comparison("ampgan's step cell vs MindSpore's TrainOneStepCell under Model.train (MLP on digits, O2, "
                     "fixed scale 1024)",
                     {"TrainOneStepCell": lambda: ModelTrainRunner(False, device),
                      "ampgan cell": lambda: ModelTrainRunner(True, device)},
                     "TrainOneStepCell", 2 * it, target=TARGET_MODEL_CELL, rounds=HEADLINE_ROUNDS)
    yield Comparison("ampgan's step cell vs MindSpore's TrainOneStepCell under Model.train in GRAPH_MODE (MLP on "
                     "digits, O2, fixed scale 1024)",
                     {"TrainOneStepCell": lambda: ModelTrainRunner(False, device, graph=True),
                      "ampgan cell": lambda: ModelTrainRunner(True, device, graph=True)},
                     "TrainOneStepCell", 4 * it, target=TARGET_MODEL_CELL, rounds=HEADLINE_ROUNDS)
    # the MLP's step is mostly kernel launches (about 6 ms): the cell's fixed cost per step shows
    # whole there; on a user's conv net (mindcv's smallest) it is a share of a real step
    yield Comparison("ampgan's step cell vs MindSpore's TrainOneStepCell under Model.train in GRAPH_MODE (mindcv "
                     "mobilenet_v1_025 on digits 16x16, batch 32, O2, fixed scale 1024)",
                     {"TrainOneStepCell": lambda: ModelTrainRunner(False, device, 32, graph=True, mindcv="mobilenet_v1_025"),
                      "ampgan cell": lambda: ModelTrainRunner(True, device, 32, graph=True, mindcv="mobilenet_v1_025")},
                     "TrainOneStepCell", 2 * it, target=TARGET_MODEL_CELL, rounds=HEADLINE_ROUNDS, full_only=True)
    yield Comparison("calibration: one loop against its twin (WGAN-GP O2 dynamic, health off, no tracking)",
                     {"a": lambda: amp(o2 + LIKE_BARE), "b": lambda: amp(o2 + LIKE_BARE)}, "a", short,
                     rounds=HEADLINE_ROUNDS, full_only=True)  # the same work twice: how far from 1.00 the bench reads it
    yield Comparison("gradient health (WGAN-GP O2 dynamic, no tracking)",
                     {"off": lambda: amp(o2 + LIKE_BARE), "on": lambda: amp(o2 + ["tracking=none"])}, "off", short,
                     target=TARGET_HEALTH, rounds=HEADLINE_ROUNDS)
    # a block is one cycle of the default cadence (log_every iterations, one of them measured), so that every
    # round's ratio holds the measured step's cost in its share; both variants run the same step numbers
    cycle = TrainerConfig.log_every
    for name, model in (("activation headroom (WGAN-GP O2 dynamic, gradient health on, no tracking)", GAN),
                        ("activation headroom: classifier (digits, O2 dynamic, gradient health on, no tracking)",
                         CLASSIFIER + ["trainer.batch_size=64"])):
        on = model + O2_DYNAMIC + ["tracking=none"]
        yield Comparison(name, {"off": lambda o=on: amp(o + ["trainer.headroom=false"]), "on": lambda o=on: amp(o)},
                         "off", cycle, target=TARGET_HEADROOM, rounds=HEADLINE_ROUNDS if model is GAN else 1.0,
                         full_only=model is not GAN)
    yield Comparison("tracking to MLflow at the default cadence (WGAN-GP O2 dynamic)",
                     {"none": lambda: amp(o2 + ["tracking=none"]), "mlflow": lambda: amp(o2 + ["tracking.background=never"]),
                      "mlflow, helper process": lambda: amp(o2 + ["tracking.background=always"])}, "none", short,
                     target=TARGET_TRACKING, rounds=HEADLINE_ROUNDS)
    yield Comparison("loss-scale strategy (WGAN-GP O2, no tracking)",
                     {name: (lambda n=name: amp(GAN + ["amp=o2", f"scaler={n}", "tracking=none"]))
                      for name in ("none", "static", "dynamic", "underflow_aware", "fixed_clip")}, "none", it)
    yield Comparison("AMP level (WGAN-GP, dynamic scaler, no tracking)",
                     {lvl: (lambda v=lvl: amp(GAN + [f"amp={v}", "scaler=dynamic", "tracking=none"])) for lvl in ("o0", "o2", "o3")},
                     "o0", it, full_only=True)
    yield Comparison("jit vs PYNATIVE (classifier on digits, O0; WGAN-GP refuses PYNATIVE)",
                     {"jit": lambda: amp(CLASSIFIER + ["tracking=none"]),
                      "pynative": lambda: amp(CLASSIFIER + ["tracking=none", "hardware.jit=false"])}, "jit", 4 * it,
                     full_only=True)
    scale_it = max(2, it // 2)
    for label, key in (("batch size", "trainer.batch_size"), ("model width", "model.hidden")):
        for value in (64, 128, 256, 512):
            extra = GAN + ["amp=o0", "scaler=dynamic", f"{key}={value}"]
            yield Comparison(f"scaling: {label} {value} (WGAN-GP O0 dynamic)",
                             {"bare": lambda e=extra: BareRunner(e, device),
                              "ampgan": lambda e=extra: amp(e + LIKE_BARE)},
                             "bare", scale_it, rounds=0.6, full_only=True)


DIAGNOSED = (("WGAN-GP", GAN), ("transformer, ViT on digits", TRANSFORMER))


def diagnose_cost(store: str, device: str, quick: bool, repeats: int = 5) -> list[dict]:
    """diagnose's replay against training, for each model of `DIAGNOSED`, and the op-level locate's one-off cost."""
    rows = []
    for label, model in DIAGNOSED:
        rows += replay_cost(label, model, store, device, quick, repeats)
    return rows + op_locate_cost(store, device, repeats)


def replay_cost(label: str, model: list[str], store: str, device: str, quick: bool, repeats: int) -> list[dict]:
    """diagnose's replay of N iterations against N training iterations of the same run (target <= 3x).

    The replay is what `python -m ampgan.diagnose diagnose.mode=synced` runs per iteration: the FP32
    twin's step (weights and gradients kept), the synced AMP step and the in-graph comparison.
    Rounds interleave a replay and a training block of the same N iterations, so the machine's
    drift hits both alike; the ratio is taken round by round. Compilation is excluded on both
    sides: each replay builds and compiles anew and runs 1 + N iterations, of which the first
    (the compiling one) is left out (`iteration_seconds`); training runs on one task warmed up by
    two iterations.
    """
    from ampgan.diagnose.replay import record_reference, replay_amp

    n = 4 if quick else 12
    rounds = max(3, repeats)
    overrides = model + O2_DYNAMIC + ["tracking=none"]
    s = settings_for(overrides, device)
    data = load_data(s)
    runner = AmpganRunner(overrides, store, device)
    runner.run(2)
    diag, train, twin, amp = [], [], [], []
    for _ in range(rounds):
        ref = record_reference(s, data, 1 + n, lambda m: None)
        traces, _, _ = replay_amp(s, data, ref, ["synced"], lambda m: None)
        twin.append(sum(ref.iteration_seconds[1:]) / n)
        amp.append(sum(traces["synced"].iteration_seconds[1:]) / n)
        diag.append(twin[-1] + amp[-1])
        del ref, traces
        t = time.perf_counter()
        runner.run(n)
        train.append((time.perf_counter() - t) / n)
    runner.close()
    name = f"diagnose replay vs training ({label} O2 dynamic, N iterations)"
    return [ratio_row(name, "training", train, train, "training"),
            ratio_row(name, "diagnose replay (synced)", diag, train, "training", TARGET_DIAGNOSE),
            ratio_row(name, "replay part: FP32 twin (record)", twin, train, "training"),
            ratio_row(name, "replay part: AMP step + comparison", amp, train, "training")]


def op_locate_cost(store: str, device: str, repeats: int) -> list[dict]:
    """The op-level locate, paid once per diagnosis: the failing step's forward pass and loss replayed
    uncompiled with every op call hooked, AMP and FP32 twin, on the transformer (ViT on digits, O2),
    against one compiled training step of the same run, round by round."""
    from ampgan.diagnose.oplocate import locate_op
    from ampgan.diagnose.replay import build_seeded, fp32_twin_settings, roots

    overrides = TRANSFORMER + O2_DYNAMIC + ["tracking=none"]
    s = settings_for(overrides, device)
    data = load_data(s)
    task, twin = build_seeded(s, data), build_seeded(fp32_twin_settings(s), data)
    name, inputs = task.step_inputs()[0]
    runner = AmpganRunner(overrides, store, device)
    runner.run(2)
    located, step = [], []
    for _ in range(max(3, repeats)):
        t = time.perf_counter()
        locate_op(task, twin, roots(task), roots(twin), name, inputs)
        located.append(time.perf_counter() - t)
        t = time.perf_counter()
        runner.run(1)
        step.append(time.perf_counter() - t)
    runner.close()
    name = "op-level locate, once per diagnosis (ViT on digits, O2; ms per call)"
    return [ratio_row(name, "training step", step, step, "training step"),
            ratio_row(name, "op-level locate (AMP + FP32 twin, every op hooked)", located, step, "training step")]


# the whole diagnose command against one training run of the same configuration and length:
# (label, the run's overrides). The default run, shortened to 150 steps and under O2 (a bare
# `python -m ampgan.diagnose` diagnoses O2 with MindSpore's dynamic scale), and a case whose every
# AMP step overflows, so that its interventions all replay (the corpus's temperature net). Both
# are in the default bench, 2 rounds each (4.8 min for both on 2 cores in a fast hour, 2026-12-07;
# 8.3 min in a slow one).
DIAGNOSED_WHOLE = (("the default run, O2 dynamic, 150 steps", ["amp=o2", "scaler=dynamic", "trainer.max_steps=150"]),
                   ("every-step overflow: a user's attention net at temperature 1e6, 200 steps",
                    ["+experiment=case_temperature_attention"]))
TARGET_DIAGNOSE_WHOLE = 4.0
VERDICT_EXITS = (0, 1, 3, 4, 5)   # python -m ampgan.diagnose: a verdict (2 is bad input)


def diagnose_whole(scratch: Path, device: str, rounds: int) -> list[dict]:
    """`python -m ampgan.diagnose` as a user runs it (horizon over the run's length, replay, locate,
    every intervention replayed; its report and MLflow run), against `python -m ampgan.train` of the
    same configuration and length: whole commands, start-up included, in alternating order for
    `rounds` rounds. One row pair per `DIAGNOSED_WHOLE` case; the figure is ms per command."""
    env = {**os.environ, "AMPGAN_OUTPUTS": str(scratch), "GLOG_v": "3"}
    uri = f"tracking.uri=sqlite:///{scratch / 'whole.db'}"
    rows = []
    for label, overrides in DIAGNOSED_WHOLE:
        commands = {"training (python -m ampgan.train)": [sys.executable, "-m", "ampgan.train", *overrides, uri,
                                                          f"hardware={device.lower()}"],
                    "diagnose (python -m ampgan.diagnose)": [sys.executable, "-m", "ampgan.diagnose", *overrides, uri,
                                                             f"hardware={device.lower()}", "diagnose.progress=false"]}
        times: dict[str, list[float]] = {name: [] for name in commands}
        for r in range(rounds):
            for name in list(commands) if r % 2 == 0 else list(commands)[::-1]:
                started = time.perf_counter()
                proc = subprocess.run(commands[name], env=env, capture_output=True, cwd=scratch)
                times[name].append(time.perf_counter() - started)
                ok = proc.returncode in (VERDICT_EXITS if "diagnose" in name else (0,))
                if not ok:
                    tail = proc.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
                    raise AmpganError(f"bench: {name} on {label} exited {proc.returncode}: {tail[0][:200]}")
            print(f"    {label}: round {r + 1} of {rounds}", flush=True)
        name = f"diagnose, whole command vs one training run ({label}; ms per command)"
        base = "training (python -m ampgan.train)"
        rows += [ratio_row(name, variant, ts, times[base], base, None if variant == base else TARGET_DIAGNOSE_WHOLE)
                 for variant, ts in times.items()]
    return rows


def default_run_peak_rss(device: str, max_steps: int | None = None) -> dict:
    """Peak RSS of `python -m ampgan.train` at its defaults (a child process), its store and outputs in a temp folder.

    The child is reaped with `os.wait4`, whose resource usage is that child's alone: RUSAGE_CHILDREN
    would report the largest of every child this process ever waited for (the start-up runs too).
    `max_steps` shortens the run (--quick); None leaves the default length.
    """
    with tempfile.TemporaryDirectory(prefix="ampgan-bench-rss-") as tmp:
        cmd = [sys.executable, "-m", "ampgan.train", f"tracking.uri=sqlite:///{tmp}/mlflow.db", f"hardware={device.lower()}"]
        if max_steps is not None:
            cmd.append(f"trainer.max_steps={max_steps}")
        env = {**os.environ, "AMPGAN_OUTPUTS": tmp, "GLOG_v": "3"}
        log = Path(tmp) / "train.log.txt"
        started = time.perf_counter()
        with open(log, "wb") as out:
            child = subprocess.Popen(cmd, cwd=tmp, env=env, stdout=out, stderr=subprocess.STDOUT)
            _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        if child.returncode != 0:
            tail = log.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{' '.join(cmd)} exited with {child.returncode}:\n{tail}")
        steps = settings_for([], device).trainer.max_steps if max_steps is None else max_steps
        return {"command": "python -m ampgan.train" + ("" if max_steps is None else f" trainer.max_steps={max_steps}"),
                "steps": steps, "seconds": time.perf_counter() - started,
                "peak_rss_mb": usage.ru_maxrss / 1024}  # Linux: ru_maxrss in KiB


def rss_over_run(store: str, device: str, steps: int) -> dict:
    """RSS of this process over `steps` iterations of the default WGAN-GP run through ampgan's loop.

    The default config (evaluations with their pictures, MLflow tracking to `store`) with
    max_steps = `steps`; RSS is sampled every `steps` / 40 iterations. The warm-up is the first
    tenth, and at least up to the first evaluation (compilation, the first pictures); growth is
    from the sample after it to the last, in percent: a leak shows as growth that a warmed-up
    run should not have.
    """
    import psutil

    process = psutil.Process()
    runner = AmpganRunner([f"trainer.max_steps={steps}"], store, device)
    every = max(10, steps // 40)
    warmup = min(steps, max(every, steps // 10, runner.settings.trainer.eval_every))
    samples, done, started = [], 0, time.perf_counter()
    while done < steps:
        n = min(every, steps - done)
        runner.run(n)
        done += n
        samples.append((done, process.memory_info().rss / 2**20))
    runner.close()
    warm_step, warm = next((step, rss) for step, rss in samples if step >= warmup)
    end_step, end = samples[-1]
    growth = 100 * (end - warm) / warm
    return {"steps": steps, "seconds": time.perf_counter() - started, "warmup_step": warm_step, "rss_warm_mb": warm,
            "end_step": end_step, "rss_end_mb": end, "rss_max_mb": max(rss for _, rss in samples),
            "growth_pct": growth, "target_pct": TARGET_MEMORY_GROWTH_PCT,
            "verdict": "met" if growth < TARGET_MEMORY_GROWTH_PCT else "not met", "samples": samples}


def memory(store: str, device: str, quick: bool, steps: int, full: bool = False) -> dict:
    """The default run's peak RSS (its 3000 steps with --full, 1000 by default, 200 in --quick) and RSS over
    `steps` in-process iterations (0: skipped)."""
    out = {"default_run": default_run_peak_rss(device, 200 if quick else None if full else 1000)}
    if steps > 0:
        out["long_run"] = rss_over_run(store, device, steps)
    return out


STARTUP_ROUNDS = 3  # paired rounds (ampgan, then the floor; cold, then warm) of the start-up figures (--full: 5)
FULL_STARTUP_ROUNDS = 5
STARTUP_PHASES = ("startup/imports_s", "startup/build_s", "startup/store_s", "startup/first_step_s")


def drop_page_cache() -> bool:
    """Empty the OS page cache (root on Linux), so that the next command reads its files from disk."""
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def startup(store_dir: Path, device: str, rounds: int) -> list[dict]:
    """Command to first finished step, ampgan beside bare MindSpore's floor, in paired rounds.

    A pair is ampgan's default command (2 steps, as a run of any length starts: the first step
    plain, the second one measuring) and the floor, `python -m experiments.bare_loop` (the
    default run's WGAN-GP trained by hand, from its process's start to its first finished
    iteration). First `rounds` cold pairs, the page cache dropped before each run (where allowed:
    otherwise only the bench's very first pair counts as cold); then one untimed warm-up of each,
    so that no warm run reads what a cold run's dropped cache evicted; then `rounds` warm pairs,
    in alternating order. Pairing cancels the machine's drift between rounds: the figure is the
    median of the pairs' differences, with its bootstrap interval. Each ampgan run also logs its
    own split (startup/*).
    """
    from ampgan.tracking.tracker import make_client

    uri = f"sqlite:///{store_dir / 'startup.db'}"
    MlflowTracker(uri, "startup")  # create the store outside the timed runs
    env = {**os.environ, "AMPGAN_OUTPUTS": str(store_dir), "GLOG_v": "3"}
    root = Path(__file__).resolve().parents[1]
    # Python keeps the bytecode of what it imported (__pycache__); where writing it is switched off
    # (PYTHONDONTWRITEBYTECODE), each run compiles this repository's modules again, ~0.05 s that no
    # user's second start pays. Write it once, for both commands (the installed packages have theirs).
    for folder in ("ampgan", "experiments"):
        compileall.compile_dir(root / folder, quiet=1)

    def ampgan(experiment: str = "startup") -> float:
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "ampgan.train", "trainer.max_steps=2", "trainer.eval_samples=100",
                        f"tracking.uri={uri}", f"tracking.experiment={experiment}", f"hardware={device.lower()}"],
                       env=env, check=True, capture_output=True)
        return time.perf_counter() - t

    def bare() -> float:
        out = subprocess.run([sys.executable, "-m", "experiments.bare_loop"], env=env, check=True,
                             capture_output=True, text=True, cwd=root).stdout.splitlines()[-1]
        return json.loads(out)["to_first_step_s"]

    walls, floors, temps = [], [], []

    def pair_done(temp: str, total: int) -> None:
        temps.append(temp)
        print(f"        {temp} pair {temps.count(temp)}/{total}: ampgan's whole command {walls[-1]:.2f} s, "
              f"the floor to its first step {floors[-1]:.2f} s", flush=True)

    dropped = drop_page_cache()
    cold = rounds if dropped else 1
    for _ in range(cold):
        if temps:
            drop_page_cache()
        walls.append(ampgan())
        drop_page_cache()
        floors.append(bare())
        pair_done("cold", cold)
    ampgan("startup_warmup")   # untimed: the files a cold run's dropped cache evicted are read again
    bare()
    for r in range(rounds):
        if r % 2:
            floors.append(bare())
            walls.append(ampgan())
        else:
            walls.append(ampgan())
            floors.append(bare())
        pair_done("warm", rounds)
    client = make_client(uri)
    runs = sorted(client.search_runs([client.get_experiment_by_name("startup").experiment_id]),
                  key=lambda run: run.info.start_time)
    phases = {key: [run.data.metrics[key] for run in runs] for key in STARTUP_PHASES}
    return startup_rows(phases, walls, floors, temps, dropped)


def startup_rows(phases: dict[str, list[float]], walls: list[float], floors: list[float], temps: list[str],
                 dropped: bool) -> list[dict]:
    """The start-up table from paired runs: `phases` (ampgan's logged split, run by run), `walls` (its
    whole command), `floors` (the floor of the same pair), `temps` ("cold" or "warm", pair by pair).

    A row holds, for cold and for warm, the median and range over its runs; "ampgan beyond the floor"
    also the bootstrap interval of the median of the paired differences, judged against
    TARGET_BEYOND_FLOOR_S, and "command to first finished step" the cold median against TARGET_STARTUP_S."""
    to_first = [sum(v[i] for v in phases.values()) for i in range(len(temps))]
    beyond = [a - b for a, b in zip(to_first, floors)]
    series = [("whole command (2 steps, final eval, exit)", walls),
              *[(key.split("/")[1][:-2], values) for key, values in phases.items()],
              ("command to first finished step", to_first),
              ("bare MindSpore, command to first finished step (the floor)", floors),
              ("ampgan beyond the floor", beyond)]
    rows = []
    for label, values in series:
        row = {"phase": label, "cache_dropped": dropped}
        for temp in ("cold", "warm"):
            picked = [v for v, t in zip(values, temps) if t == temp]
            if picked:
                row.update({f"{temp}": statistics.median(picked), f"{temp}_min": min(picked),
                            f"{temp}_max": max(picked), f"{temp}_runs": len(picked)})
        row["seconds"] = row.get("warm", float("nan"))
        rows.append(row)
    first, extra = rows[-3], rows[-1]
    first.update(target=f"<= {TARGET_STARTUP_S:.1f} cold",
                 verdict=verdict((first["cold_min"], first["cold_max"]), TARGET_STARTUP_S))
    extra["target"] = f"<= {TARGET_BEYOND_FLOOR_S:.1f} cold and warm"
    verdicts = []
    for temp in ("cold", "warm"):
        picked = [v for v, t in zip(beyond, temps) if t == temp]
        if picked:
            extra[f"{temp}_ci"] = bootstrap_ci(picked)
            verdicts.append(verdict(extra[f"{temp}_ci"], TARGET_BEYOND_FLOOR_S))
    extra["verdict"] = ("met" if all(v == "met" for v in verdicts) else
                        "not met" if "not met" in verdicts else "unresolved")
    return rows


SWEEP_CLIP_NORMS = (0.25, 0.5, 1, 2, 4, 8)  # the serial 6-job clip sweep of the per-job overhead


def sweep_overhead(store_dir: Path, device: str, quick: bool) -> dict:
    """Per-job overhead of a serial sweep: `python -m ampgan.train -m scaler=fixed_clip scaler.clip_norm=<6 values>`.

    A job's overhead is its cycle, from its MLflow run's start to the next job's, minus its steps
    at the loop's own speed (`perf/step_s` x steps): what ampgan and Hydra add to each job (build,
    graphs, store, final evaluation and pictures, checkpoint, the next job's set-up). The first job
    compiles the steps; the later ones run them (`ampgan.graph_pool`). Each job also logs its own
    in-process figure (`job/overhead_s`: from validation to the final checkpoint, minus its steps).
    """
    from ampgan.tracking.tracker import make_client

    steps = 50 if quick else 100
    uri = f"sqlite:///{store_dir / 'sweep.db'}"
    MlflowTracker(uri, "sweep")  # the store exists before the timed sweep
    cmd = [sys.executable, "-m", "ampgan.train", "-m", "scaler=fixed_clip",
           f"scaler.clip_norm={','.join(f'{c:g}' for c in SWEEP_CLIP_NORMS)}", f"trainer.max_steps={steps}",
           "trainer.eval_every=0", f"tracking.uri={uri}", "tracking.experiment=sweep", f"hardware={device.lower()}"]
    env = {**os.environ, "AMPGAN_OUTPUTS": str(store_dir), "GLOG_v": "3"}
    started = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, capture_output=True, cwd=store_dir)
    wall = time.perf_counter() - started
    client = make_client(uri)
    runs = client.search_runs([client.get_experiment_by_name("sweep").experiment_id])
    jobs = sorted((r for r in runs if "job_num" in r.data.tags), key=lambda r: int(r.data.tags["job_num"]))
    cycles = [(b.info.start_time - a.info.start_time) / 1000 - steps * a.data.metrics["perf/step_s"]
              for a, b in zip(jobs, jobs[1:])]
    in_process = [r.data.metrics["job/overhead_s"] for r in jobs]
    later = cycles[1:]
    low, high = bootstrap_ci(later)
    return {"jobs": len(jobs), "steps": steps, "sweep_seconds": wall,
            "graphs": [r.data.tags.get("ampgan.graphs", "") for r in jobs],
            "first_job_s": cycles[0], "later_jobs_s": statistics.median(later), "later_min": min(later),
            "later_max": max(later), "ci_low": low, "ci_high": high, "in_process_s": in_process,
            "target_s": TARGET_JOB_OVERHEAD_S, "verdict": verdict((low, high), TARGET_JOB_OVERHEAD_S)}


def _metric_name(text: str) -> str:
    """MLflow metric names: letters, digits, _ - . / only (spaces turned into _)."""
    return re.sub(r"[^A-Za-z0-9_\-./]", "", text.replace(" ", "_"))


def _comparison_lines(rows: list[dict]) -> list[str]:
    """A table per comparison: time per iteration, ratio with its interval, target and verdict."""
    lines, current = [], None
    for r in rows:
        if r["comparison"] != current:
            current = r["comparison"]
            lines += ["", f"## {current}", "", "| variant | ms / iteration | ratio to baseline | 95% interval | target | verdict |",
                      "|---|---|---|---|---|---|"]
        target = f"<= {r['target']:.2f}" if "target" in r else ""
        lines.append(f"| {r['variant']} | {r['ms_per_iteration']:.1f} [{r['ms_min']:.1f}-{r['ms_max']:.1f}] | "
                     f"{r['ratio']:.3f} [{r['ratio_min']:.3f}-{r['ratio_max']:.3f}] | "
                     f"{r['ci_low']:.3f}-{r['ci_high']:.3f} | {target} | {r.get('verdict', '')} |")
        if "host_us" in r and r["variant"] != r["baseline"]:
            lines.append(f"| host time per iteration, µs (wall minus the compiled steps): {r['variant']} "
                         f"{r['host_us']:.0f} [{r['host_us_min']:.0f}-{r['host_us_max']:.0f}] | | beyond {r['baseline']}: "
                         f"{r['host_beyond_us']:+.0f} | {r['host_ci_low_us']:+.0f} to {r['host_ci_high_us']:+.0f} | "
                         f"<= {r['host_target_us']:.0f} µs | {r['host_verdict']} |")
    return lines


def _memory_lines(mem: dict) -> list[str]:
    if not mem:
        return []
    run = mem["default_run"]
    lines = ["", "## memory", "", "| measurement | value |", "|---|---|",
             f"| peak RSS of `{run['command']}` ({run['steps']} steps, {run['seconds']:.0f} s) | {run['peak_rss_mb']:.0f} MB |"]
    if "long_run" in mem:
        m = mem["long_run"]
        lines += [f"| long run in process (default WGAN-GP, {m['steps']} steps, {m['seconds']:.0f} s): RSS after warm-up "
                  f"(step {m['warmup_step']}) | {m['rss_warm_mb']:.0f} MB |",
                  f"| RSS at the end (step {m['end_step']}); max over the run | {m['rss_end_mb']:.0f} MB; {m['rss_max_mb']:.0f} MB |",
                  f"| growth after warm-up (target < {m['target_pct']:.0f}%) | {m['growth_pct']:+.1f}%: {m['verdict']} |"]
    return lines


def _startup_lines(start: list[dict]) -> list[str]:
    if not start:
        return []
    cold = "cold (page cache dropped)" if start[0]["cache_dropped"] else "cold (the bench's first runs)"
    runs = f"{start[0].get('cold_runs', 0)} cold and {start[0].get('warm_runs', 0)} warm paired runs"
    lines = ["", f"## start-up ({runs}: ampgan's command, then bare MindSpore's floor)", "",
             f"| phase | {cold}: median [min-max] | warm: median [min-max] | target | verdict |", "|---|---|---|---|---|"]

    def cell(r: dict, temp: str) -> str:
        if temp not in r:
            return ""
        ci = f", 95% interval {r[temp + '_ci'][0]:.2f}-{r[temp + '_ci'][1]:.2f}" if temp + "_ci" in r else ""
        return f"{r[temp]:.2f} [{r[temp + '_min']:.2f}-{r[temp + '_max']:.2f}]{ci}"

    for r in start:
        lines.append(f"| {r['phase']} | {cell(r, 'cold')} | {cell(r, 'warm')} | {r.get('target', '')} | "
                     f"{r.get('verdict', '')} |")
    return lines


def _sweep_lines(sweep: dict) -> list[str]:
    if not sweep:
        return []
    later = sweep["in_process_s"][1:]
    return ["", f"## per-job overhead of a serial {sweep['jobs']}-job clip sweep ({sweep['steps']} steps a job, "
            f"{sweep['sweep_seconds']:.0f} s in all)", "",
            "| job | seconds beyond its steps | 95% interval | target | verdict |", "|---|---|---|---|---|",
            f"| first (graphs {sweep['graphs'][0]}) | {sweep['first_job_s']:.2f} | | | |",
            f"| later (graphs {', '.join(sorted(set(sweep['graphs'][1:])))}), run start to next run start | "
            f"{sweep['later_jobs_s']:.2f} [{sweep['later_min']:.2f}-{sweep['later_max']:.2f}] | "
            f"{sweep['ci_low']:.2f}-{sweep['ci_high']:.2f} | <= {sweep['target_s']:.1f} | {sweep['verdict']} |",
            f"| later, in process (`job/overhead_s`: validation to final checkpoint) | "
            f"{statistics.median(later):.2f} [{min(later):.2f}-{max(later):.2f}] | | | |"]


def markdown(rows: list[dict], start: list[dict], mem: dict, meta: dict, sweep: dict | None = None) -> str:
    lines = [f"# ampgan benchmark ({meta['device']}, {meta['cpus']} cores, MindSpore {meta['mindspore']}, {meta['date']})", "",
             "Per-iteration time (WGAN-GP: n_critic critic steps + 1 generator step; classifier: 1 step),"
             " median [min-max] over the rounds; ratio to the comparison's baseline, round by round: median [min-max]"
             f" and a {CI_LEVEL:.0%} bootstrap interval of the median ({CI_RESAMPLES} resamples of the rounds)."
             " Verdict: met when the whole interval is below the target, not met when it is all above,"
             " unresolved when it straddles the target.", ""]
    lines += _comparison_lines(rows) + _memory_lines(mem) + _startup_lines(start) + _sweep_lines(sweep or {})
    return "\n".join(lines) + "\n"


def figures(rows: list[dict], start: list[dict], mem: dict, sweep: dict | None = None) -> dict[str, float]:
    """The MLflow metrics of a bench run: every time, ratio and interval, start-up phase, memory and sweep figure."""
    out = {f"sweep/{k}": sweep[k] for k in ("first_job_s", "later_jobs_s", "ci_low", "ci_high")} if sweep else {}
    for r in rows:
        key = _metric_name(f"{r['comparison'].split(' (')[0]}/{r['variant']}")
        out.update({f"{key}/ms": r["ms_per_iteration"], f"{key}/ratio": r["ratio"],
                    f"{key}/ratio_ci_low": r["ci_low"], f"{key}/ratio_ci_high": r["ci_high"]})
        if "host_us" in r:
            out.update({f"{key}/host_us": r["host_us"], f"{key}/host_beyond_us": r["host_beyond_us"],
                        f"{key}/host_ci_low_us": r["host_ci_low_us"], f"{key}/host_ci_high_us": r["host_ci_high_us"]})
    for r in start:
        name = _metric_name(r["phase"].split(" (")[0])
        out[f"startup/{name}_s"] = r["seconds"]
        if "cold" in r:
            out[f"startup/cold_{name}_s"] = r["cold"]
        for temp in ("cold", "warm"):
            if f"{temp}_ci" in r:
                out[f"startup/{temp}_{name}_ci_low_s"], out[f"startup/{temp}_{name}_ci_high_s"] = r[f"{temp}_ci"]
    if mem:
        out["memory/default_run_peak_rss_mb"] = mem["default_run"]["peak_rss_mb"]
    if "long_run" in mem:
        out.update({f"memory/long_run_{k}": mem["long_run"][k] for k in ("rss_warm_mb", "rss_end_mb", "rss_max_mb", "growth_pct")})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="CPU", choices=["CPU", "GPU", "Ascend"])
    parser.add_argument("--full", action="store_true",
                        help="every section (AMP levels, jit vs PYNATIVE, scaling, data parallel), the long memory "
                             f"run and {FULL_REPEATS} repeats: `make bench-full`")
    parser.add_argument("--repeats", type=int, default=None,
                        help=f"rounds per comparison (default {DEFAULT_REPEATS}, --full {FULL_REPEATS}; the headline "
                             f"pairs: {HEADLINE_ROUNDS:g}x as many, of half-length blocks)")
    parser.add_argument("--quick", action="store_true",
                        help="3 repeats, half-size blocks, a 200-step default run and a 300-step memory run")
    parser.add_argument("--only", default="",
                        help="run only the comparisons whose name contains one of these comma-separated texts "
                             "('diagnose', 'memory', 'sweep', 'data parallel' select those parts)")
    parser.add_argument("--no-startup", action="store_true", help="skip the start-up and sweep-overhead measurements")
    parser.add_argument("--startup-rounds", type=int, default=None,
                        help=f"paired start-up rounds, cold and then warm (default {STARTUP_ROUNDS}; --quick: 2); "
                             "each pair takes two commands' start, ~10-20 s on 2 CPU cores")
    parser.add_argument("--memory-steps", type=int, default=None,
                        help="iterations of the long in-process memory run (--full: 20000, ~15 min on 2 CPU cores; "
                             "--quick: 300; default 0: skipped)")
    parser.add_argument("--restart", action="store_true",
                        help="start over, even where an unfinished bench of the same arguments left finished sections")
    parser.add_argument("--compare", nargs="?", const=str(COMMITTED), default=None, metavar="BENCH_JSON",
                        help=f"print the last table (outputs/bench/bench.json) beside an earlier one (default: "
                             f"{COMMITTED.relative_to(COMMITTED.parents[1])}) and run nothing")
    args = parser.parse_args(argv)
    if args.compare is not None:
        return _compare(Path(args.compare))
    repeats = 3 if args.quick else args.repeats or (FULL_REPEATS if args.full else DEFAULT_REPEATS)
    if args.startup_rounds is not None and args.startup_rounds < 1:
        return report_error(f"--startup-rounds {args.startup_rounds}: give 1 or more")
    if args.startup_rounds is not None and args.no_startup:
        return report_error(f"--startup-rounds {args.startup_rounds} with --no-startup: the start-up part is skipped; "
                            "drop one of them")
    if args.memory_steps and args.only and "memory" not in args.only.lower():
        return report_error(f"--memory-steps {args.memory_steps} with --only {args.only}: the memory part is skipped; "
                            "add 'memory' to --only, or drop --memory-steps")
    memory_steps = args.memory_steps if args.memory_steps is not None else (
        300 if args.quick else 20000 if args.full else 0)
    try:
        hardware.check_device(args.device)
    except Exception as err:  # noqa: BLE001
        return report_error(err)
    scratch = Path(tempfile.mkdtemp(prefix="ampgan-bench-store-"))   # its stores, runs and MindSpore's files
    home = Path.cwd()
    try:
        _bench(args, repeats, memory_steps, scratch)
    except AmpganError as err:
        return report_error(err)
    finally:
        os.chdir(home)
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


def _compare(earlier: Path) -> int:
    from experiments.bench_ledger import compare

    latest = outputs_dir() / "bench" / "bench.json"
    for path, what in ((latest, "no bench table yet: run `make bench` first"),
                       (earlier, "no earlier bench table there (give its bench.json)")):
        if not path.is_file():
            return report_error(f"--compare: {path}: {what}")
    try:
        new, old = json.loads(latest.read_text()), json.loads(earlier.read_text())
    except ValueError as err:
        return report_error(f"--compare: a bench table is not JSON: {err}")
    print(compare(new, old, str(earlier)))
    return 0


def sections(args: argparse.Namespace, repeats: int, memory_steps: int, store: str, scratch: Path) -> list:
    """The bench's sections, in order, for these arguments (experiments/bench_ledger.py runs them)."""
    from experiments.bench_ledger import Section

    only = args.only.lower()
    out = []
    # bench-full's (or asked for by --memory-steps, or by --only); first: the long run's RSS starts
    # from a process that has built nothing else
    if (args.full or memory_steps > 0) and not only or "memory" in only:
        out.append(Section("memory", lambda: {"memory": memory(store, args.device, args.quick, memory_steps, args.full)}))
    for comp in comparisons(store, args.device, args.quick, args.only):
        if comp.full_only and not (args.full or only):
            continue

        def measure(c=comp) -> dict:
            c.measure(repeats, echo=lambda text: print(f"    {text}", flush=True))
            return {"rows": c.rows()}

        out.append(Section(comp.name, measure))
    if args.full and not only or "data parallel" in only:
        from experiments import bench_parallel

        out.append(Section("data parallel: 1 vs 2 workers", lambda: {"rows": bench_parallel.rows(scratch, args.quick, repeats)}))
    if not only or "whole command" in only:   # what a user waits for: diagnose's whole command
        out.append(Section("diagnose, whole command vs one training run",
                           lambda: {"rows": diagnose_whole(scratch, args.device, 1 if args.quick else 2)}))
    if args.full and not only or "diagnose replay" in only:   # its replay alone, per iteration
        out.append(Section("diagnose replay vs training",
                           lambda: {"rows": diagnose_cost(store, args.device, args.quick, repeats)}))
    if not args.no_startup:
        rounds = args.startup_rounds or (2 if args.quick else FULL_STARTUP_ROUNDS if args.full else STARTUP_ROUNDS)
        out.append(Section("start-up", lambda: {"startup": startup(scratch, args.device, rounds)}))
    if not args.no_startup or "sweep" in only:
        out.append(Section(f"per-job overhead: a serial {len(SWEEP_CLIP_NORMS)}-job clip sweep",
                           lambda: {"sweep": sweep_overhead(scratch, args.device, args.quick)}))
    return out


def gather(done: dict) -> tuple[list[dict], list[dict], dict, dict]:
    """(rows, start-up, memory, sweep) from the finished sections' records; each row carries its
    section's commit, date and machine."""
    rows, start, mem, sweep = [], [], {}, {}
    for record in done.values():
        where = {"commit": record["commit"], "date": record["finished"], "machine": record["machine"]}
        result = record["result"]
        rows += [{**r, **where} for r in result.get("rows", [])]
        start += result.get("startup", [])
        mem = result.get("memory", mem)
        sweep = result.get("sweep", sweep)
    return rows, start, mem, sweep


def _bench(args: argparse.Namespace, repeats: int, memory_steps: int, scratch: Path) -> None:
    """Every section `args` asks for, in `scratch` (removed by the caller); each section's results in
    outputs/bench as it ends (a stopped bench resumes: experiments/bench_ledger.py)."""
    import mindspore as ms

    from experiments.bench_ledger import LEDGER, commit, machine, run_sections

    out = outputs_dir() / "bench"
    out.mkdir(parents=True, exist_ok=True)
    store = f"sqlite:///{scratch / 'variants.db'}"
    planned = sections(args, repeats, memory_steps, store, scratch)
    if not planned:
        raise AmpganError(f"--only {args.only}: names no section of this bench (a comparison's name, or memory, "
                          f"diagnose, data parallel, sweep)")
    MlflowTracker(store, "ampgan")
    os.chdir(scratch)  # MindSpore's scratch files
    plan = {"device": args.device, "full": args.full, "quick": args.quick, "repeats": repeats, "only": args.only,
            "no_startup": args.no_startup, "startup_rounds": args.startup_rounds, "memory_steps": memory_steps}
    meta = {"device": args.device, "cpus": os.cpu_count(), "mindspore": ms.__version__,
            "python": platform.python_version(), "repeats": repeats, "full": args.full,
            "headline_rounds": max(3, round(repeats * HEADLINE_ROUNDS)), "memory_steps": memory_steps}

    def publish(done: dict, pending: list[str]) -> None:
        rows, start, mem, sweep = gather(done)
        last = max(done.values(), key=lambda r: r["finished"])
        meta.update(date=last["finished"][:16], commit=commit(), machine=machine(),
                    seconds=sum(r["seconds"] for r in done.values()), pending=pending)
        (out / "bench.json").write_text(json.dumps({"meta": meta, "comparisons": rows, "startup": start, "memory": mem,
                                                    "sweep": sweep, "sections": {k: {x: v for x, v in r.items() if x != "result"}
                                                                                 for k, r in done.items()}}, indent=2))
        report = markdown(rows, start, mem, meta, sweep)
        if pending:
            report += "\nNot measured yet (the bench was stopped, or is still running): " + "; ".join(pending) + "\n"
        (out / "bench.md").write_text(report)

    done = run_sections(planned, out / LEDGER, plan, publish, restart=args.restart)
    rows, start, mem, sweep = gather(done)
    print((out / "bench.md").read_text())
    tracker = MlflowTracker(f"sqlite:///{outputs_dir() / 'mlflow.db'}", "ampgan-bench")
    with tracked_run(tracker, f"bench-{args.device.lower()}", {k: v for k, v in meta.items() if k != "pending"},
                     {"device": args.device}):
        tracker.log_metrics(figures(rows, start, mem, sweep), 0)
        tracker.log_artifact(out / "bench.md")
        tracker.log_artifact(out / "bench.json")
    verdicts = ([r["verdict"] for r in rows + start if "verdict" in r] + [r["host_verdict"] for r in rows if "host_verdict" in r]
                + ([sweep["verdict"]] if sweep else [])
                + ([mem["long_run"]["verdict"]] if "long_run" in mem else []))
    print(f"done in {meta['seconds'] / 60:.1f} min; targets: {verdicts.count('met')} met, {verdicts.count('not met')} not met, "
          f"{verdicts.count('unresolved')} unresolved; written to {out}")


if __name__ == "__main__":
    sys.exit(main())
