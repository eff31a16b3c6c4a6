"""The gradient penalty's weight gradient (a second-order gradient) against finite differences.

MindSpore 2.10 gets it silently wrong in PYNATIVE mode; ampgan computes it under ms.jit.
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest

from ampgan.amp.policy import apply_amp, shared_fp32_twin
from ampgan.models import Critic
from ampgan.diagnose.framework import differences
from ampgan.steps.gan import gradient_penalty


def gp_value(critic, real, fake, alpha) -> float:
    return float(gradient_penalty(critic, real, fake, alpha).asnumpy())




def penalty_weight_grads(critic, params, real, fake, alpha) -> list[np.ndarray]:
    """d GP / d params, compiled with ms.jit (as the critic step does)."""

    def penalty(r, f, a):
        return gradient_penalty(critic, r, f, a)

    return [g.asnumpy() for g in ms.jit(ms.grad(penalty, None, params))(real, fake, alpha)]


@pytest.mark.parametrize("shape", [(2,), (1, 8, 8)])
def test_gp_weight_gradient_matches_finite_differences(shape):
    ms.set_seed(3)
    rng = np.random.default_rng(3)
    critic = Critic(shape, hidden=8, depth=2)
    critic.update_parameters_name("D.")
    real = ms.Tensor(rng.standard_normal((16, *shape)).astype(np.float32))
    fake = ms.Tensor(rng.standard_normal((16, *shape)).astype(np.float32))
    alpha = ms.Tensor(rng.uniform(size=(16,) + (1,) * len(shape)).astype(np.float32))
    params = critic.trainable_params()

    analytic = penalty_weight_grads(critic, params, real, fake, alpha)

    checked = 0
    for p, g in zip(params, analytic):
        if p.ndim < 2:
            continue  # weights only; biases of the last layer have a zero GP gradient by construction
        flat = np.argsort(-np.abs(g).ravel())[:3]
        indices = [np.unravel_index(i, g.shape) for i in flat]
        # ReLU kinks can spoil one step size; a wrong (e.g. zero) gradient fails at both.
        fds = [differences(lambda: gp_value(critic, real, fake, alpha), p, indices, eps)[0] for eps in (1e-3, 3e-4)]
        got = g[tuple(np.array(indices).T)]
        ok = np.any([np.isclose(got, fd, rtol=0.05, atol=2e-4) for fd in fds], axis=0)
        assert ok.all(), f"{p.name}: analytic {got} vs finite differences {fds}"
        assert np.abs(g).max() > 1e-4, f"{p.name}: GP weight gradient is all zero"
        checked += 1
    assert checked >= 2


def test_fp32_twin_shares_parameters_and_matches_fp32_gradient():
    """Under O2 the GP through the FP32 twin equals the GP of an all-FP32 critic."""
    ms.set_seed(5)
    rng = np.random.default_rng(5)
    make = lambda: Critic((2,), hidden=16, depth=2)  # noqa: E731
    critic = make()
    critic.update_parameters_name("D.")
    twin = shared_fp32_twin(make, critic)
    assert all(a is b for a, b in zip(critic.trainable_params(), twin.trainable_params()))
    real, fake = (ms.Tensor(rng.standard_normal((32, 2)).astype(np.float32)) for _ in range(2))
    alpha = ms.Tensor(rng.uniform(size=(32, 1)).astype(np.float32))
    params = critic.trainable_params()
    fp32 = penalty_weight_grads(critic, params, real, fake, alpha)
    apply_amp(critic, "O2", [])
    via_twin = penalty_weight_grads(twin, params, real, fake, alpha)
    for a, b in zip(fp32, via_twin):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_the_framework_check_runs_compiled_too_on_the_fp32_twin_and_finds_it_right():
    """The old check ran only with jit off and compared the AMP critic's gradient (float16's own
    error read as MindSpore's). Now: whenever the task has a penalty, the FP32 twin's gradient in
    the run's mode (here compiled) against finite differences at two step sizes: right."""
    from ampgan.config.schema import validate
    from ampgan.diagnose.analysis import framework_check
    from ampgan.tasks import load_data
    from tests.conftest import compose_cfg

    s = validate(compose_cfg("amp=o2", "scaler=dynamic", "trainer.batch_size=64"))
    check = framework_check(s, load_data(s), "auto")
    assert check is not None and set(check.modes) == {"jit"} and check.run_mode == "jit"
    assert not check.wrong and check.entries >= 8, check.describe()
    assert framework_check(s, load_data(s), "never") is None
