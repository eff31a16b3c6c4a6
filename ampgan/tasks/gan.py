"""The WGAN-GP task: generator and critic, their optimizers, scalers and steps; SWD and mode coverage; samples."""

from __future__ import annotations

from pathlib import Path
import mindspore as ms
import numpy as np
from mindspore import ops
from ampgan.reporting import plots
from ampgan.amp.policy import apply_amp, check_keep_paths, shared_fp32_twin
from ampgan.amp.scalers import build_scaler
from ampgan.config.schema import Settings, WganGpConfig
from ampgan.data import Batches, Dataset
from ampgan.tasks.metrics import ClassJudge, mode_coverage, sliced_wasserstein
from ampgan.steps.gan import CRITIC_LOSSES, GENERATOR_LOSSES, build_gan_steps, critic_loss_fn, generator_loss_fn
from ampgan.tasks.base import (SAMPLES_OVER_TIME, NetState, Optimised, TaskBase, activation_peaks, computes_float16,
                               health_fn)
from ampgan.tasks.targets import build_net, build_optimizer, check_gan_fits, data_shape_args


class GanTask(TaskBase):
    Config = WganGpConfig
    objective = "eval/swd"
    direction = "minimize"
    GRAPH_ATTRS = TaskBase.GRAPH_ATTRS + ("gen", "critic", "gen_amp", "critic_amp", "critic_gp")

    def __init__(self, s: Settings, data: Dataset):
        m, shape = s.model, data.sample_shape
        self.data, self.n_critic, self.z_dim = data, m.n_critic, m.z_dim
        self.eval_samples, self.seed = s.trainer.eval_samples, s.trainer.seed

        given = {**data_shape_args(shape, max(data.n_classes, 1)), "z_dim": m.z_dim, "hidden": m.hidden, "depth": m.depth}

        def make_critic():
            return build_net(m.critic, "model.critic", given)

        self.gen = build_net(m.generator, "model.generator", given)
        self.gen.update_parameters_name("gen.")
        self.critic = make_critic()
        check_gan_fits(self.gen, self.critic, m.z_dim, data.x_train)
        self.critic.update_parameters_name("critic.")
        check_keep_paths({"gen": self.gen, "critic": self.critic}, s.amp.keep_fp32)
        twin = shared_fp32_twin(make_critic, self.critic) if s.amp.fp32_gradient_penalty else None
        gen_amp = apply_amp(self.gen, s.amp.level, s.amp.keep_fp32, root="gen")
        critic_amp = apply_amp(self.critic, s.amp.level, s.amp.keep_fp32, root="critic")
        self.gen_amp, self.critic_amp = gen_amp, critic_amp
        self.nets = {"gen": gen_amp, "critic": critic_amp}
        self.critic_gp = twin if twin is not None else critic_amp  # the net the penalty runs through
        self.gp_lambda = m.gp_lambda
        opt_g = build_optimizer(m.optimizer, "model.optimizer", gen_amp.trainable_params(), m.lr_g, m.betas)
        opt_d = build_optimizer(m.optimizer, "model.optimizer", critic_amp.trainable_params(), m.lr_d, m.betas)
        self.optimizers = {"gen.opt": opt_g, "critic.opt": opt_d}
        self.scalers = {"gen.scaler": build_scaler(s.scaler, "gen.scaler"),
                        "critic.scaler": build_scaler(s.scaler, "critic.scaler")}
        critic_step, gen_step = build_gan_steps(
            gen_amp, critic_amp, twin if twin is not None else critic_amp, opt_g, opt_d,
            self.scalers["gen.scaler"], self.scalers["critic.scaler"],
            m.gp_lambda, health_fn(s), jit=s.hardware.jit,
            critic_peaks=activation_peaks(s, critic_amp, "critic"), gen_peaks=activation_peaks(s, gen_amp, "gen"))
        self.critic_state = NetState("critic", critic_step, float16=computes_float16(s))
        self.gen_state = NetState("gen", gen_step, float16=computes_float16(s))
        self.batches = Batches(data.x_train, data.y_train, s.trainer.batch_size, s.trainer.seed)
        self.rng = np.random.default_rng(s.trainer.seed + 1)
        self.rngs = {"noise": self.rng}
        self.batch_size = s.trainer.batch_size
        self.alpha_shape = (self.batch_size,) + (1,) * len(shape)
        self._judge: ClassJudge | None = None   # fitted at the first evaluation (judge())

    has_penalty = True
    penalty_root = "critic"

    def states(self) -> list[NetState]:
        return [self.critic_state, self.gen_state]

    def roots(self) -> dict[str, ms.nn.Cell]:
        return {"gen": self.gen, "critic": self.critic}

    def optimised(self) -> dict[str, Optimised]:
        sd, sg = self.scalers["critic.scaler"], self.scalers["gen.scaler"]
        return {
            "critic": Optimised(self.critic_amp,
                                lambda sc: critic_loss_fn(self.gen_amp, self.critic_amp, self.critic_gp, sc, self.gp_lambda),
                                self.optimizers["critic.opt"], sd, CRITIC_LOSSES),
            "gen": Optimised(self.gen_amp, lambda sc: generator_loss_fn(self.gen_amp, self.critic_amp, sc),
                             self.optimizers["gen.opt"], sg, GENERATOR_LOSSES),
        }

    def forward(self, name: str, inputs: tuple) -> None:
        if name == "critic":
            real, z, _ = inputs
            fake = ops.stop_gradient(self.gen_amp(z))
            self.critic_amp(real)
            self.critic_amp(fake)
        else:
            self.critic_amp(self.gen_amp(*inputs))

    def penalty(self, name: str, inputs: tuple):
        if name != "critic":
            return None
        real, z, alpha = inputs
        return "critic", self.critic_gp, (real, ops.stop_gradient(self.gen_amp(z)), alpha)

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

    def run_inputs(self, step: int, subs: list[tuple[str, tuple]], measure: bool) -> None:
        """Launch one iteration's sub-steps; `measure`: its statuses will be read. A drain reports
        each net's newest measured status (`NetState.drain`), so only each net's last sub-step of
        the iteration measures (gradient health, activation peaks); the critic's others run plain."""
        states = {"critic": self.critic_state, "gen": self.gen_state}
        last = {net: i for i, (net, _) in enumerate(subs)}
        for i, (net, inputs) in enumerate(subs):
            states[net].launch(step, inputs, measure and i == last[net])

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
        judge = self.judge()
        if judge is not None:
            out.update({f"eval/{k}": v for k, v in judge(fake[finite]).items()})
            out["eval/judge_accuracy"] = judge.accuracy
        return out

    def judge(self) -> ClassJudge | None:
        """A classifier of the real images, fitted at the first evaluation of a labelled image set
        (None for points, or images without labels)."""
        data = self.data
        if not data.is_image or data.n_classes < 2 or (data.y_train < 0).any():
            return None
        if self._judge is None:
            self._judge = ClassJudge(data.x_train, data.y_train, data.x_test, data.y_test, data.n_classes, seed=self.seed)
        return self._judge

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
