"""Build stage: turn validated settings into a task the trainer loop can drive.

A task owns its nets, optimizers, scalers and compiled steps, and offers the loop:
`train_step(step, measure)` (launches the steps, does not wait; `measure`: this step's status
will be read, so compute its gradient health), `metrics()` (fetches the pending step
statuses: (step, flat metrics) per net), `layer_health()`, `nonfinite_run()`, `evaluate()`,
`eval_picture(dir, step)` (samples over training), `save_pictures(dir)`, and for checkpoints `state_parameters()`, `host_state()`,
`load_host_state()`. `GanTask` and `ClassifierTask` share everything below that through
`ampgan.steps.common`.
"""

from __future__ import annotations

from pathlib import Path

import mindspore as ms
import numpy as np
from mindspore import mint

from ampgan.reporting import plots
from ampgan.amp.health import HEALTH_FIELDS, grad_health, no_health
from ampgan.amp.policy import apply_amp, check_keep_paths, shared_fp32_twin
from ampgan.amp.scalers import build_scaler
from ampgan.config.schema import Settings
from ampgan.data import Batches, Dataset
from ampgan.tasks.metrics import confusion_matrix, mode_coverage, sliced_wasserstein, softmax_cross_entropy
from ampgan.models import Classifier, Critic, Generator
from ampgan.steps.classifier import build_classifier_step
from ampgan.steps.common import Step
from ampgan.steps.gan import build_gan_steps


SAMPLES_OVER_TIME = "samples"   # run-folder subfolder of the pictures made at each evaluation


class NetState:
    """Host-side bookkeeping for one optimised net: pending step statuses, cumulative counts.

    Steps are launched without waiting (`push`); `drain` fetches what is pending in one go,
    so the host does not stall MindSpore after every step, only at the logging cadence.
    Only what a step measured is reported: health fields from the newest measured status
    drained (none when health was off or no drained status was measured), `grad_norm` only
    when the newest status computed the norm.
    """

    COUNTERS = ("skipped", "clipped", "steps", "nonfinite_run")

    def __init__(self, prefix: str, step: Step):
        self.prefix, self.step = prefix, step
        self.sizes = np.array([p.size for p in step.weights], dtype=np.float64)
        self.pending: list[tuple[int, ms.Tensor, bool]] = []  # (step, packed status, measured)
        self.skipped = self.clipped = self.steps = 0
        self.nonfinite_run = 0          # consecutive steps whose loss was not finite
        self.last_health: np.ndarray | None = None

    def push(self, step: int, packed_status, measured: bool) -> None:
        """A launched step's status; `measured`: it ran the measuring variant (`Step.measured`)."""
        self.pending.append((step, packed_status, measured))

    def launch(self, step: int, inputs: tuple, measure: bool) -> None:
        """Launch the step on `inputs` (measuring or plain variant) and push its status."""
        self.push(step, self.step.launch(*inputs, measure=measure), self.step.measured(measure))

    def drain(self) -> tuple[int, dict[str, float]]:
        """(last step, metrics) of the steps since the last drain: losses averaged; scale from the
        last, health from the last measured."""
        if not self.pending:
            return 0, {}
        last_step, _, last_measured = self.pending[-1]
        statuses = [self.step.decode(t.asnumpy()) for _, t, _ in self.pending]
        measured = [s for s, (_, _, was_measured) in zip(statuses, self.pending) if was_measured]
        self.pending.clear()
        for s in statuses:
            finite_loss = all(np.isfinite(v) for v in s.losses.values())
            self.nonfinite_run = 0 if finite_loss else self.nonfinite_run + 1
        last = statuses[-1]
        self.steps += len(statuses)
        self.skipped += sum(not s.applied for s in statuses)
        self.clipped += sum(s.clipped for s in statuses)
        p = self.prefix
        out = {f"{p}/{k}": float(np.mean([s.losses[k] for s in statuses])) for k in last.losses}
        out.update({
            f"{p}/scale": last.scale, f"{p}/skipped": float(self.skipped),
            f"{p}/finite": float(all(s.finite for s in statuses)), f"{p}/clip_rate": self.clipped / self.steps,
        })
        if self.step.computes_norm(last_measured):
            out[f"{p}/grad_norm"] = last.grad_norm
        if self.step.measures_health and measured:
            h = self.last_health = measured[-1].health
            w = self.sizes / self.sizes.sum()
            out[f"{p}/underflow"] = float(h[:, HEALTH_FIELDS.index("underflow")] @ w)
            out[f"{p}/zero"] = float(h[:, HEALTH_FIELDS.index("zero")] @ w)
            out[f"{p}/max_abs_scaled_grad"] = float(h[:, HEALTH_FIELDS.index("max_abs")].max())
            out[f"{p}/nonfinite"] = float(h[:, HEALTH_FIELDS.index("nonfinite")].sum())
        return last_step, out

    def layer_health(self) -> dict[str, float]:
        """Per-parameter health of the last drained step, named `grad/<param>/<field>` (empty if not measured)."""
        if self.last_health is None:
            return {}
        return {f"grad/{name}/{field}": float(v)
                for name, row in zip(self.step.param_names, self.last_health)
                for field, v in zip(HEALTH_FIELDS, row)}

    def counters(self) -> dict[str, int]:
        return {k: int(getattr(self, k)) for k in self.COUNTERS}

    def load_counters(self, counters: dict[str, int]) -> None:
        for k in self.COUNTERS:
            setattr(self, k, int(counters[k]))


class TaskBase:
    """What the loop asks of every task beyond its own step: drained metrics, health, divergence, state.

    A subclass sets `nets`, `optimizers` and `scalers` (name -> object) and `rngs` (name -> NumPy Generator
    used while training) and implements `states()`; checkpoints then hold everything a run needs to
    continue exactly: every Parameter of the nets, optimizers and scalers, the batch sampler's
    position, the RNGs, the host-side counters.
    """

    nets: dict
    optimizers: dict
    scalers: dict
    batches: Batches
    rngs: dict[str, np.random.Generator]
    # the attributes that hold the compiled steps and what they close over (nets, optimizers,
    # scalers): `ampgan.graph_pool` hands a pooled task's to a fresh task of the same structure
    GRAPH_ATTRS: tuple[str, ...] = ("nets", "optimizers", "scalers")

    def states(self) -> list[NetState]:
        raise NotImplementedError

    def metrics(self) -> list[tuple[int, dict[str, float]]]:
        """Fetch the statuses of the steps since the last call: (last step, metrics) per net."""
        return [drained for state in self.states() if (drained := state.drain())[1]]

    def layer_health(self) -> dict[str, float]:
        return {k: v for state in self.states() for k, v in state.layer_health().items()}

    def nonfinite_run(self) -> int:
        return max(state.nonfinite_run for state in self.states())

    def eval_picture(self, folder: Path, step: int) -> Path | None:
        """The picture made at each evaluation (`samples/step-000250.png`); None: this task makes none."""
        return None

    def state_parameters(self) -> dict[str, ms.Parameter]:
        """Every on-device state tensor, under a name unique across optimizers and scalers."""
        out = {}
        for group, net in self.nets.items():   # what no optimizer holds: BatchNorm's moving statistics
            for param in net.untrainable_params():
                out[f"{group}/{param.name}"] = param
        for group, opt in self.optimizers.items():
            for _, param in opt.parameters_and_names():
                out[f"{group}/{param.name}"] = param
        for group, scaler in self.scalers.items():
            for attr, value in sorted(vars(scaler).items()):
                if isinstance(value, ms.Parameter) and attr not in scaler.hyperparameters:
                    out[f"{group}/{attr}"] = value
        return out

    def graph_parameters(self) -> dict[str, ms.Parameter]:
        """Every Parameter the compiled steps read: the state above, the weights, the learning
        rates and the scalers' settings; `ampgan.graph_pool` copies them all into a pooled task."""
        out = self.state_parameters()
        for group, net in self.nets.items():
            for param in net.trainable_params():
                out.setdefault(f"{group}/{param.name}", param)
        for group, opt in self.optimizers.items():
            for i, lr in enumerate(opt.lrs):
                out[f"{group}/lr{i}"] = lr
        for group, scaler in self.scalers.items():
            for attr in scaler.hyperparameters:
                out[f"{group}/{attr}"] = getattr(scaler, attr)
        return out

    def host_state(self) -> dict:
        """Host-side state as plain JSON-able values."""
        return {"batches": self.batches.state(),
                "rngs": {k: rng.bit_generator.state for k, rng in self.rngs.items()},
                "counters": {s.prefix: s.counters() for s in self.states()}}

    def load_host_state(self, state: dict) -> None:
        self.batches.load_state(state["batches"])
        for k, rng in self.rngs.items():
            rng.bit_generator.state = state["rngs"][k]
        for s in self.states():
            s.load_counters(state["counters"][s.prefix])


def _health_fn(s: Settings):
    return grad_health if s.trainer.grad_health else no_health


class GanTask(TaskBase):
    objective = "eval/swd"
    direction = "minimize"
    GRAPH_ATTRS = TaskBase.GRAPH_ATTRS + ("gen", "critic", "gen_amp", "critic_amp", "critic_gp")

    def __init__(self, s: Settings, data: Dataset):
        m, shape = s.model, data.sample_shape
        self.data, self.n_critic, self.z_dim = data, m.n_critic, m.z_dim
        self.eval_samples, self.seed = s.trainer.eval_samples, s.trainer.seed

        def make_critic():
            return Critic(shape, m.hidden, m.depth, gain=m.critic_gain, input_scale=m.critic_input_scale)

        self.gen = Generator(m.z_dim, shape, m.hidden, m.depth)
        self.gen.update_parameters_name("gen.")
        self.critic = make_critic()
        self.critic.update_parameters_name("critic.")
        check_keep_paths({"gen": self.gen, "critic": self.critic}, s.amp.keep_fp32)
        twin = shared_fp32_twin(make_critic, self.critic) if s.amp.fp32_gradient_penalty else None
        gen_amp = apply_amp(self.gen, s.amp.level, s.amp.keep_fp32, root="gen")
        critic_amp = apply_amp(self.critic, s.amp.level, s.amp.keep_fp32, root="critic")
        self.gen_amp, self.critic_amp = gen_amp, critic_amp
        self.nets = {"gen": gen_amp, "critic": critic_amp}
        self.critic_gp = twin if twin is not None else critic_amp  # the net the penalty runs through
        self.gp_lambda = m.gp_lambda
        opt_g = mint.optim.Adam(gen_amp.trainable_params(), lr=m.lr_g, betas=tuple(m.betas))
        opt_d = mint.optim.Adam(critic_amp.trainable_params(), lr=m.lr_d, betas=tuple(m.betas))
        self.optimizers = {"gen.opt": opt_g, "critic.opt": opt_d}
        self.scalers = {"gen.scaler": build_scaler(s.scaler, "gen.scaler"),
                        "critic.scaler": build_scaler(s.scaler, "critic.scaler")}
        critic_step, gen_step = build_gan_steps(
            gen_amp, critic_amp, twin if twin is not None else critic_amp, opt_g, opt_d,
            self.scalers["gen.scaler"], self.scalers["critic.scaler"],
            m.gp_lambda, _health_fn(s), jit=s.hardware.jit)
        self.critic_state = NetState("critic", critic_step)
        self.gen_state = NetState("gen", gen_step)
        self.batches = Batches(data.x_train, data.y_train, s.trainer.batch_size, s.trainer.seed)
        self.rng = np.random.default_rng(s.trainer.seed + 1)
        self.rngs = {"noise": self.rng}
        self.batch_size = s.trainer.batch_size
        self.alpha_shape = (self.batch_size,) + (1,) * len(shape)

    def states(self) -> list[NetState]:
        return [self.critic_state, self.gen_state]

    def _z(self, n: int) -> ms.Tensor:
        return ms.Tensor(self.rng.standard_normal((n, self.z_dim)).astype(np.float32))

    def step_inputs(self) -> list[tuple[str, tuple]]:
        """One iteration's sub-steps and their inputs, drawn from the sampler and the noise RNG in
        training order: n_critic ("critic", (real, z, alpha)), then ("gen", (z,))."""
        out = []
        for _ in range(self.n_critic):
            real, _ = self.batches.next()
            alpha = self.rng.uniform(size=self.alpha_shape).astype(np.float32)
            out.append(("critic", (ms.Tensor(real), self._z(self.batch_size), ms.Tensor(alpha))))
        out.append(("gen", (self._z(self.batch_size),)))
        return out

    def train_step(self, step: int, measure: bool = True) -> None:
        """Launch one iteration's sub-steps; `measure`: with gradient health (its status will be read)."""
        states = {"critic": self.critic_state, "gen": self.gen_state}
        for net, inputs in self.step_inputs():
            states[net].launch(step, inputs, measure)

    def generate(self, n: int, seed: int) -> np.ndarray:
        rng = np.random.default_rng(seed)
        z = rng.standard_normal((n, self.z_dim)).astype(np.float32)
        return np.concatenate([self.gen_amp(ms.Tensor(chunk)).asnumpy() for chunk in np.array_split(z, max(1, n // 1024))])

    def evaluate(self) -> dict[str, float]:
        fake = self.generate(self.eval_samples, seed=self.seed + 7)
        finite = np.isfinite(fake.reshape(len(fake), -1)).all(axis=1)
        out = {"eval/finite_samples": float(finite.mean())}
        if not finite.any():
            return {**out, "eval/swd": float("nan")}
        out["eval/swd"] = sliced_wasserstein(fake[finite], self.data.x_test, seed=self.seed)
        if self.data.modes is not None:
            cov = mode_coverage(fake[finite], self.data.modes, self.data.mode_radius)
            out.update({f"eval/{k}": v for k, v in cov.items()})
        return out

    def samples_picture(self, path: Path, title: str = "") -> Path:
        """Samples of a fixed noise (the same at every call): an image grid, or a scatter over the real points."""
        if self.data.is_image:
            return plots.image_grid(self.generate(64, seed=self.seed + 9), path)
        fake = self.generate(min(self.eval_samples, 2000), seed=self.seed + 9)
        return plots.scatter(self.data.x_test[:2000], fake, path, title=title)

    def eval_picture(self, folder: Path, step: int) -> Path:
        """Samples over training: one picture per evaluation, `samples/step-000250.png`."""
        out = Path(folder) / SAMPLES_OVER_TIME
        out.mkdir(parents=True, exist_ok=True)
        return self.samples_picture(out / f"step-{step:06d}.png", title=f"step {step} (dark: real, orange: generated)")

    def save_pictures(self, folder: Path) -> list[Path]:
        """The final samples, and a strip of the pictures made at the evaluations (when there are several)."""
        pictures = [self.samples_picture(Path(folder) / "samples.png")]
        frames = sorted((Path(folder) / SAMPLES_OVER_TIME).glob("step-*.png"))
        if len(frames) > 1:
            pictures.append(plots.strip(frames, Path(folder) / "samples_strip.png"))
        return pictures


class ClassifierTask(TaskBase):
    objective = "eval/accuracy"
    direction = "maximize"
    GRAPH_ATTRS = TaskBase.GRAPH_ATTRS + ("net", "net_amp")

    def __init__(self, s: Settings, data: Dataset):
        self.data = data
        self.net = Classifier(data.sample_shape, data.n_classes, s.model.width, s.model.logit_scale,
                              s.model.norm_scale, s.model.feature_offset)
        self.fp32_loss = s.amp.fp32_loss
        check_keep_paths({"": self.net}, s.amp.keep_fp32)
        net_amp = apply_amp(self.net, s.amp.level, s.amp.keep_fp32)
        net_amp.set_train(True)  # cells start in inference mode: BatchNorm would use its moving statistics
        self.net_amp = net_amp
        self.nets = {"net": net_amp}
        opt = mint.optim.Adam(net_amp.trainable_params(), lr=s.model.lr, betas=tuple(s.model.betas))
        self.optimizers = {"opt": opt}
        self.scalers = {"scaler": build_scaler(s.scaler, "scaler")}
        self.rngs = {}
        step = build_classifier_step(net_amp, opt, self.scalers["scaler"], _health_fn(s),
                                     fp32_loss=s.amp.fp32_loss, jit=s.hardware.jit)
        self.state = NetState("train", step)
        self.batches = Batches(data.x_train, data.y_train, s.trainer.batch_size, s.trainer.seed)

    def states(self) -> list[NetState]:
        return [self.state]

    def step_inputs(self) -> list[tuple[str, tuple]]:
        """One step's sub-steps and inputs: [("train", (x, y))], the sampler's next batch."""
        x, y = self.batches.next()
        return [("train", (ms.Tensor(x), ms.Tensor(y)))]

    def train_step(self, step: int, measure: bool = True) -> None:
        """Launch one step; `measure`: with gradient health (its status will be read)."""
        for _, inputs in self.step_inputs():
            self.state.launch(step, inputs, measure)

    def logits(self, x: np.ndarray) -> np.ndarray:
        self.net_amp.set_train(False)
        try:
            return np.concatenate([self.net_amp(ms.Tensor(c)).asnumpy().astype(np.float64)
                                   for c in np.array_split(x, max(1, len(x) // 512))])
        finally:
            self.net_amp.set_train(True)

    def evaluate(self) -> dict[str, float]:
        logits = self.logits(self.data.x_test)
        return {"eval/accuracy": float((logits.argmax(1) == self.data.y_test).mean()),
                "eval/loss": softmax_cross_entropy(logits, self.data.y_test)}

    def save_pictures(self, folder: Path) -> list[Path]:
        pred = self.logits(self.data.x_test).argmax(1)
        cm = confusion_matrix(pred, self.data.y_test, self.data.n_classes)
        return [plots.heatmap(cm, folder / "confusion.png", title="confusion: rows true, columns predicted")]


TASKS = {"wgan_gp": GanTask, "classifier": ClassifierTask}


def build_task(s: Settings, data: Dataset):
    return TASKS[s.model.name](s, data)
