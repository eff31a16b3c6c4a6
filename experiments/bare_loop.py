"""The baselines for `make bench`: ampgan's models trained by hand in plain MindSpore, as a user would.

Same nets (ampgan.models), same data and sampling, same work per step: `mint.optim.Adam`,
MindSpore's own `amp.auto_mixed_precision` and `amp.DynamicLossScaler`, and the step of
MindSpore's mixed-precision tutorial (`train_step`): scaled backward, unscale, `all_finite`,
adjust the scale, update only when finite, all under `ms.jit`. A loop fetches its loss every
100 iterations (a hand-written loop prints now and then); no health, no tracking.

- `BareWganGp`: WGAN-GP, the critic step with the gradient penalty by double backprop, then
  the generator step. The nets follow the data as in ampgan: MLPs for 2-D points, small conv
  nets for images (digits). Read it beside ampgan/steps/gan.py and ampgan/steps/common.py.
- `BareClassifier`: the backbone + head classifier (or any net of the zoo), softmax
  cross-entropy; over every position for the language model. Read it beside
  ampgan/steps/classifier.py.

What the loops share is what a user writing both would share too: the tutorial's step and an
epoch-by-epoch batch sampler. Everything model-specific stays inline.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import mindspore as ms
import numpy as np
from mindspore import amp, mint, ops

from ampgan.models import Critic, Generator

FETCH_EVERY = 100  # iterations between two loss fetches (a hand-written loop's occasional print)


def train_step(loss_fn: Callable, weights, optimizer, scaler: amp.DynamicLossScaler, reports: bool = False) -> Callable:
    """`loss_fn(*inputs) -> loss` as a jitted step -> loss, the step of MindSpore's AMP tutorial:
    backward of the scaled loss, unscale, update (and grow the scale) only when every gradient is finite.
    `reports`: `loss_fn` returns (loss, report) and the step returns the report (e.g. loss and accuracy)."""

    def scaled_loss(*inputs):
        if reports:
            loss, report = loss_fn(*inputs)
            return scaler.scale(loss), report
        loss = loss_fn(*inputs)
        return scaler.scale(loss), loss

    grad_fn = ms.value_and_grad(scaled_loss, None, weights, has_aux=True)

    @ms.jit
    def step(*inputs):
        (_, loss), grads = grad_fn(*inputs)
        grads = scaler.unscale(grads)
        finite = amp.all_finite(grads)
        scaler.adjust(finite)
        if finite:
            optimizer(grads)
        return loss

    return step


def batch_indices(n: int, batch_size: int, rng: np.random.Generator) -> Iterator[np.ndarray]:
    """Endless mini-batch indices: a fresh permutation each epoch, the incomplete last batch dropped."""
    while True:
        order = rng.permutation(n)
        for start in range(0, n - batch_size + 1, batch_size):
            yield order[start : start + batch_size]


class BareWganGp:
    def __init__(self, x_train: np.ndarray, *, z_dim: int, hidden: int, depth: int, batch_size: int,
                 n_critic: int, gp_lambda: float, lr: float, betas: tuple[float, float], amp_level: str,
                 init_scale: float, factor: int, window: int, seed: int = 0):
        ms.set_seed(seed)
        shape = x_train.shape[1:]
        gen, critic = Generator(z_dim, shape, hidden, depth), Critic(shape, hidden, depth)
        gen.update_parameters_name("bare_gen.")
        critic.update_parameters_name("bare_critic.")
        if amp_level != "O0":
            gen = amp.auto_mixed_precision(gen, amp_level)
            critic = amp.auto_mixed_precision(critic, amp_level)
        opt_g = mint.optim.Adam(gen.trainable_params(), lr=lr, betas=betas)
        opt_d = mint.optim.Adam(critic.trainable_params(), lr=lr, betas=betas)
        scaler_g = amp.DynamicLossScaler(init_scale, factor, window)
        scaler_d = amp.DynamicLossScaler(init_scale, factor, window)

        def critic_sum(x):
            return critic(x).sum()

        input_grad = ms.grad(critic_sum)

        def critic_loss(real, z, alpha):
            fake = ops.stop_gradient(gen(z))
            x_hat = alpha * real + (1 - alpha) * fake
            g = input_grad(x_hat)
            gp = ops.square(ops.sqrt(ops.square(g).reshape(g.shape[0], -1).sum(1) + 1e-12) - 1).mean()
            return critic(fake).mean() - critic(real).mean() + gp_lambda * gp

        def generator_loss(z):
            return -critic(gen(z)).mean()

        self.critic_step = train_step(critic_loss, critic.trainable_params(), opt_d, scaler_d)
        self.generator_step = train_step(generator_loss, gen.trainable_params(), opt_g, scaler_g)
        self.x, self.batch_size, self.n_critic, self.z_dim = x_train, batch_size, n_critic, z_dim
        self.rng = np.random.default_rng(seed)
        self.batches = batch_indices(len(x_train), batch_size, self.rng)
        self.alpha_shape = (batch_size,) + (1,) * len(shape)
        self.iteration = 0

    def _z(self) -> ms.Tensor:
        return ms.Tensor(self.rng.standard_normal((self.batch_size, self.z_dim)).astype(np.float32))

    def run(self, iterations: int) -> None:
        for _ in range(iterations):
            for _ in range(self.n_critic):
                alpha = self.rng.uniform(size=self.alpha_shape).astype(np.float32)
                self.critic_step(ms.Tensor(self.x[next(self.batches)]), self._z(), ms.Tensor(alpha))
            loss = self.generator_step(self._z())
            self.iteration += 1
            if self.iteration % FETCH_EVERY == 0:
                loss.asnumpy()
        loss.asnumpy()  # the timed block ends when its work is done


class BareClassifier:
    def __init__(self, x_train: np.ndarray, y_train: np.ndarray, *, make_net, batch_size: int,
                 lr: float, betas: tuple[float, float], amp_level: str, init_scale: float, factor: int,
                 window: int, seed: int = 0):
        """`make_net()`: the net, built after the seed is set (the bench builds ampgan's target)."""
        ms.set_seed(seed)
        net = make_net()
        net.update_parameters_name("bare_classifier.")
        if amp_level != "O0":
            net = amp.auto_mixed_precision(net, amp_level)
        net.set_train()  # BatchNorm on batch statistics (a Cell starts in inference mode)
        optimizer = mint.optim.Adam(net.trainable_params(), lr=lr, betas=betas)
        scaler = amp.DynamicLossScaler(init_scale, factor, window)

        def loss_fn(x, y):  # logits (batch, classes), or (batch, seq, vocab) for a language model
            logits = net(x).astype(ms.float32)
            loss = ops.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
            # the batch accuracy, as a loop that reports its training accuracy computes it (ampgan's
            # classifier step reports loss and accuracy every step: the same work on both sides)
            return loss, ops.stack([loss, (logits.argmax(-1) == y).astype(ms.float32).mean()])

        self.step = train_step(loss_fn, net.trainable_params(), optimizer, scaler, reports=True)
        self.x, self.y = x_train, y_train
        self.batches = batch_indices(len(x_train), batch_size, np.random.default_rng(seed))
        self.iteration = 0

    def run(self, iterations: int) -> None:
        for _ in range(iterations):
            idx = next(self.batches)
            loss = self.step(ms.Tensor(self.x[idx]), ms.Tensor(self.y[idx]))
            self.iteration += 1
            if self.iteration % FETCH_EVERY == 0:
                loss.asnumpy()
        loss.asnumpy()  # the timed block ends when its work is done


def first_step_seconds() -> dict[str, float]:
    """The start-up floor: this process from its start to the first finished iteration of the default
    run's WGAN-GP (8 Gaussians, FP32) trained by hand. `make bench` sets it beside ampgan's start-up."""
    import time

    from ampgan import process_age
    from ampgan.config.schema import DataConfig, WganGpConfig
    from ampgan.data import build_dataset

    since_start = process_age()  # interpreter and the imports above
    clock = time.perf_counter()
    m, data = WganGpConfig(), build_dataset(DataConfig())
    loop = BareWganGp(data.x_train, z_dim=m.z_dim, hidden=m.hidden, depth=m.depth, batch_size=256,
                      n_critic=m.n_critic, gp_lambda=m.gp_lambda, lr=m.lr_d, betas=m.betas, amp_level="O0",
                      init_scale=1.0, factor=2, window=1000)
    built = time.perf_counter()
    loop.run(1)
    done = time.perf_counter()
    return {"imports_s": since_start, "build_s": built - clock, "first_step_s": done - built,
            "to_first_step_s": since_start + done - clock}


if __name__ == "__main__":  # python -m experiments.bare_loop: one JSON line of first_step_seconds()
    import json

    print(json.dumps(first_step_seconds()))
