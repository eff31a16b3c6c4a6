"""The baseline for `make bench`: WGAN-GP written by hand in plain MindSpore, as a user would.

Same nets (ampgan.models), same data and sampling, same work per step: jitted critic step
with the gradient penalty by double backprop, jitted generator step, MindSpore's own
`amp.DynamicLossScaler`, `mint.optim.Adam`, the update skipped on overflow. It fetches the
loss every 100 iterations (a hand-written loop prints now and then); no health, no tracking.
Read it side by side with ampgan/steps/gan.py and ampgan/steps/common.py.
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import amp, mint, ops

from ampgan.models import Critic, Generator


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
            loss = critic(fake).mean() - critic(real).mean() + gp_lambda * gp
            return scaler_d.scale(loss), loss

        def generator_loss(z):
            loss = -critic(gen(z)).mean()
            return scaler_g.scale(loss), loss

        grad_d = ms.value_and_grad(critic_loss, None, critic.trainable_params(), has_aux=True)
        grad_g = ms.value_and_grad(generator_loss, None, gen.trainable_params(), has_aux=True)

        @ms.jit
        def critic_step(real, z, alpha):
            (_, loss), grads = grad_d(real, z, alpha)
            grads = scaler_d.unscale(grads)
            finite = amp.all_finite(grads)
            scaler_d.adjust(finite)
            if finite:
                opt_d(grads)
            return loss

        @ms.jit
        def generator_step(z):
            (_, loss), grads = grad_g(z)
            grads = scaler_g.unscale(grads)
            finite = amp.all_finite(grads)
            scaler_g.adjust(finite)
            if finite:
                opt_g(grads)
            return loss

        self.critic_step, self.generator_step = critic_step, generator_step
        self.x, self.batch_size, self.n_critic, self.z_dim = x_train, batch_size, n_critic, z_dim
        self.rng = np.random.default_rng(seed)
        self.alpha_shape = (batch_size,) + (1,) * len(shape)
        self.iteration = 0
        self._order, self._pos = np.empty(0, np.int64), 0

    def _real(self) -> np.ndarray:
        if self._pos + self.batch_size > len(self._order):
            self._order, self._pos = self.rng.permutation(len(self.x)), 0
        idx = self._order[self._pos : self._pos + self.batch_size]
        self._pos += self.batch_size
        return self.x[idx]

    def _z(self) -> ms.Tensor:
        return ms.Tensor(self.rng.standard_normal((self.batch_size, self.z_dim)).astype(np.float32))

    def run(self, iterations: int) -> None:
        for _ in range(iterations):
            for _ in range(self.n_critic):
                alpha = self.rng.uniform(size=self.alpha_shape).astype(np.float32)
                self.critic_step(ms.Tensor(self._real()), self._z(), ms.Tensor(alpha))
            loss = self.generator_step(self._z())
            self.iteration += 1
            if self.iteration % 100 == 0:
                loss.asnumpy()
        loss.asnumpy()  # the timed block ends when its work is done
