"""WGAN-GP steps: the critic step (gradient penalty by double backprop) and the generator step.

The penalty's second-order gradient is silently wrong in MindSpore 2.10's PYNATIVE mode;
it is right under `ms.jit`, which is why `config.validate` refuses a GAN with jit off.
The inner gradient d critic / d x is taken unscaled: scaling its seed by s >= 65504
would overflow float16 by itself. `critic_gp` is the critic, or its FP32 twin
(`amp.fp32_gradient_penalty`) sharing the same Parameters.
"""

from __future__ import annotations

import mindspore as ms
from mindspore import ops

from ampgan.amp.activations import ActivationPeaks
from ampgan.steps.common import Step, make_step


def penalty_inner_gradient(critic_gp, real, fake, alpha):
    """d sum(critic(x_hat)) / d x_hat as FP32, x_hat = alpha * real + (1 - alpha) * fake."""

    def critic_sum(x):
        return critic_gp(x).sum()

    x_hat = alpha * real + (1 - alpha) * fake
    return ms.grad(critic_sum)(x_hat).astype(ms.float32)


def gradient_penalty(critic_gp, real, fake, alpha):
    """mean((||d critic(x_hat) / d x_hat||_2 - 1)^2), x_hat on lines between real and fake."""

    grad_x = penalty_inner_gradient(critic_gp, real, fake, alpha)
    norm = ops.sqrt(ops.square(grad_x).reshape(grad_x.shape[0], -1).sum(1) + 1e-12)
    return ops.square(norm - 1).mean()


CRITIC_LOSSES = ("loss", "wasserstein", "gp")
GENERATOR_LOSSES = ("loss",)


def critic_loss_fn(gen, critic, critic_gp, scaler_d, gp_lambda: float):
    """`critic_loss(real, z, alpha) -> (scaled loss, stack(CRITIC_LOSSES))`; diagnose's probes reuse it."""

    def critic_loss(real, z, alpha):
        fake = ops.stop_gradient(gen(z))
        d_real = critic(real).mean()
        d_fake = critic(fake).mean()
        gp = gradient_penalty(critic_gp, real, fake, alpha)
        loss = d_fake - d_real + gp_lambda * gp
        return scaler_d.scale(loss), ops.stack([loss, d_real - d_fake, gp])

    return critic_loss


def generator_loss_fn(gen, critic, scaler_g):
    """`generator_loss(z) -> (scaled loss, stack(GENERATOR_LOSSES))`."""

    def generator_loss(z):
        loss = -critic(gen(z)).mean()
        return scaler_g.scale(loss), ops.stack([loss])

    return generator_loss


def build_gan_steps(gen, critic, critic_gp, opt_g, opt_d, scaler_g, scaler_d, gp_lambda: float,
                    health_fn, jit: bool = True, critic_peaks: ActivationPeaks | None = None,
                    gen_peaks: ActivationPeaks | None = None) -> tuple[Step, Step]:
    """Return (critic_step(real, z, alpha), generator_step(z)); each measures the activation peaks
    of its own net (`critic_peaks`, `gen_peaks`; None: none)."""
    critic_loss = critic_loss_fn(gen, critic, critic_gp, scaler_d, gp_lambda)
    generator_loss = generator_loss_fn(gen, critic, scaler_g)
    critic_step = make_step(critic_loss, critic.trainable_params(), opt_d, scaler_d, health_fn,
                            CRITIC_LOSSES, jit, critic_peaks)
    generator_step = make_step(generator_loss, gen.trainable_params(), opt_g, scaler_g, health_fn,
                               GENERATOR_LOSSES, jit, gen_peaks)
    return critic_step, generator_step
