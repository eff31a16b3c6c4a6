"""What every train step shares: scaled backward -> unscale -> health -> clip -> adjust -> update."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import mindspore as ms
import numpy as np
from mindspore import amp, ops

from ampgan.amp.health import HEALTH_FIELDS, global_norm, no_health, no_norm

STATUS_FIELDS = ("finite", "applied", "scale", "grad_norm", "clipped")


def build_update(optimizer, scaler, health_fn: Callable, norm_fn: Callable = global_norm) -> Callable:
    """Return `update(scaled_grads) -> (status, health)` for use inside a compiled step.

    `health_fn`/`norm_fn` are chosen outside the graph: with gradient health off (and a
    scaler that does not clip) neither statistic is computed at all.
    """

    def update(scaled_grads):
        health = health_fn(scaled_grads)
        scale_used = scaler.scale_value * 1.0
        grads = scaler.unscale(scaled_grads)
        finite = amp.all_finite(grads)
        norm = norm_fn(grads)
        grads, clipped = scaler.clip(grads, norm)
        apply = scaler.adjust(finite, health)
        if apply:
            optimizer(grads)
        status = ops.stack([finite.astype(ms.float32), apply.astype(ms.float32), scale_used, norm, clipped])
        return status, health

    return update


@dataclass
class StepStatus:
    """One step's status on the host, decoded from the packed tensor."""

    losses: dict[str, float]
    finite: bool
    applied: bool
    scale: float
    grad_norm: float
    clipped: bool
    health: np.ndarray  # (n_params, len(HEALTH_FIELDS))


@dataclass
class Step:
    """A compiled train step and the layout of the status tensor it returns."""

    fn: Callable
    loss_names: tuple[str, ...]
    weights: tuple
    measures_health: bool = True   # False: the health rows are zeros that were never computed
    measures_norm: bool = True     # False: the grad_norm field is a zero that was never computed

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.weights)

    def launch(self, *inputs) -> ms.Tensor:
        """Run the step; return its packed status without waiting for it (MindSpore runs ahead)."""
        return self.fn(*inputs)

    def __call__(self, *inputs) -> StepStatus:
        """Run the step and wait for its decoded status."""
        return self.decode(self.fn(*inputs).asnumpy())

    def decode(self, packed: np.ndarray) -> StepStatus:
        n_loss, n_stat = len(self.loss_names), len(STATUS_FIELDS)
        stat = packed[n_loss : n_loss + n_stat]
        return StepStatus(
            losses=dict(zip(self.loss_names, packed[:n_loss].tolist())),
            finite=bool(stat[0]), applied=bool(stat[1]), scale=float(stat[2]),
            grad_norm=float(stat[3]), clipped=bool(stat[4]),
            health=packed[n_loss + n_stat :].reshape(len(self.param_names), len(HEALTH_FIELDS)),
        )


def make_step(loss_fn: Callable, weights: Sequence, optimizer, scaler, health_fn: Callable,
              loss_names: Sequence[str], jit: bool = True) -> Step:
    """Wrap `loss_fn(*inputs) -> (scaled_loss, stacked_losses)` into a full train step."""
    grad_fn = ms.value_and_grad(loss_fn, None, tuple(weights), has_aux=True)
    scaler.watch(weights)
    norm_fn = no_norm if health_fn is no_health and not scaler.needs_norm else global_norm
    update = build_update(optimizer, scaler, health_fn, norm_fn)

    def step(*inputs):
        (_, losses), scaled_grads = grad_fn(*inputs)
        status, health = update(scaled_grads)
        return ops.concat([losses.astype(ms.float32), status, health.reshape(-1)])

    return Step(fn=ms.jit(step) if jit else step, loss_names=tuple(loss_names), weights=tuple(weights),
                measures_health=health_fn is not no_health, measures_norm=norm_fn is not no_norm)
