"""What every train step shares: scaled backward -> unscale -> health -> clip -> adjust -> update."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from functools import cached_property

import mindspore as ms
import numpy as np
from mindspore import ops

from ampgan.amp.activations import ActivationPeaks, no_peaks, no_reset
from ampgan.amp.health import HEALTH_FIELDS, all_finite, global_norm, no_health, no_norm
from ampgan.steps.parallel import Replicas, replicas_for

STATUS_FIELDS = ("finite", "applied", "scale", "grad_norm", "clipped")
FINITE, APPLIED, SCALE, GRAD_NORM, CLIPPED = range(len(STATUS_FIELDS))   # their places in the status fields


def _own_gradients(scaled_grads):
    """A single process: the gradients as they are, and their finite flag."""
    return scaled_grads, all_finite(scaled_grads)


def _same(value):
    return value


def build_update(optimizer, scaler, health_fn: Callable, norm_fn: Callable = global_norm,
                 replicas: Replicas | None = None) -> Callable:
    """Return `update(scaled_grads) -> (status, health, unscaled grads)` for a compiled step.

    The unscaled gradients are the ones before clipping, unscaled by the scale the step used.

    `health_fn`/`norm_fn` are chosen outside the graph: with gradient health off, or in a
    step's plain variant (and a scaler that does not clip), neither statistic is computed at all.
    `replicas` (data parallel, `ampgan.steps.parallel`): the gradients are summed over ranks
    first, health and norm read the sum, the scaler adjusts on the flag every rank agrees on,
    and the status's `finite` is this rank's own flag. A single process (None) has its own
    gradients and its own flag, agreed with nobody.
    """
    exchange, agree = (replicas.gradients, replicas.agree) if replicas is not None else (_own_gradients, _same)

    def update(scaled_grads):
        scaled_grads, own_finite = exchange(scaled_grads)
        health = health_fn(scaled_grads)
        scale_used = scaler.scale_value * 1.0
        unscaled = scaler.unscale(scaled_grads)
        finite = agree(own_finite)
        norm = norm_fn(unscaled)
        grads, clipped = scaler.clip(unscaled, norm)
        apply = scaler.adjust(finite, health)
        if apply:
            optimizer(grads)
        status = ops.stack([own_finite.astype(ms.float32), apply.astype(ms.float32), scale_used, norm, clipped])
        return status, health, unscaled

    return update


@dataclass(frozen=True)
class StatusLayout:
    """The packed status of a step: losses, the STATUS_FIELDS, a health row per parameter, the
    activation peaks; the slices of each, for one status (a row) or for stacked statuses (columns)."""

    n_losses: int
    n_params: int
    n_act: int

    @property
    def losses(self) -> slice:
        return slice(0, self.n_losses)

    @property
    def stat(self) -> slice:
        return slice(self.n_losses, self.n_losses + len(STATUS_FIELDS))

    @property
    def health(self) -> slice:
        start = self.n_losses + len(STATUS_FIELDS)
        return slice(start, start + self.n_params * len(HEALTH_FIELDS))

    @property
    def act(self) -> slice:
        start = self.health.stop
        return slice(start, start + self.n_act)


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
    act: np.ndarray     # (n_cells,): each leaf cell's max |output| (ActivationPeaks; NOT_REACHED: not run)


@dataclass
class Step:
    """A compiled train step, in two variants of one status layout, and that layout.

    `fn` measures: gradient health (and the global norm) as configured, and the activation
    peaks of `peaks`' cells (always launched inside `peaks.watching()`, so it is compiled with
    their recording holders in the nets). `plain` is the same update without health (and without the norm unless the scaler
    clips) and without peaks: its health rows and peaks are zeros, so both decode alike.
    `launch(measure=False)` runs the plain variant, built and compiled on its first use; when
    there is none (`build_plain` None: health off, or a scaler that reads health every step)
    `plain` is `fn` and every launch measures.
    """

    fn: Callable
    loss_names: tuple[str, ...]
    weights: tuple
    measures_health: bool = True   # False: the health rows are zeros that were never computed
    measures_norm: bool = True     # False: the grad_norm field is a zero that was never computed
    build_plain: Callable[[], Callable] | None = None  # makes the plain variant; None: fn is the only one
    plain_norm: bool = False       # the plain variant computes grad_norm too (a scaler that clips)
    peaks: ActivationPeaks | None = None  # the leaf cells whose max |output| `fn` measures; None: none

    def __post_init__(self):
        self.plain: Callable | None = self.fn if self.build_plain is None else None  # None: not built yet

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.weights)

    @property
    def act_paths(self) -> tuple[str, ...]:
        """The cell paths of the status's activation peaks (`ActivationPeaks.paths`; empty: none)."""
        return self.peaks.paths if self.peaks is not None else ()

    def measured(self, measure: bool) -> bool:
        """Whether `launch(measure=measure)` runs the measuring variant `fn`."""
        return measure or self.build_plain is None

    def computes_norm(self, measured: bool) -> bool:
        """Whether a status of that variant holds a computed grad_norm."""
        return self.measures_norm if measured else self.plain_norm

    def launch(self, *inputs, measure: bool = True) -> ms.Tensor:
        """Run the step (measured, or plain when `measure` is False and a plain variant exists);
        return its packed status without waiting for it (MindSpore runs ahead)."""
        if self.measured(measure):
            with self.peaks.watching() if self.peaks is not None else nullcontext():
                return self.fn(*inputs)
        if self.plain is None:
            self.plain = self.build_plain()
        return self.plain(*inputs)

    def __call__(self, *inputs) -> StepStatus:
        """Run the measuring step and wait for its decoded status."""
        return self.decode(self.launch(*inputs).asnumpy())

    @cached_property
    def layout(self) -> StatusLayout:
        """Where each field sits in the packed status (fixed once the step is built)."""
        return StatusLayout(len(self.loss_names), len(self.weights), len(self.act_paths))

    def decode(self, packed: np.ndarray) -> StepStatus:
        lay = self.layout
        stat = packed[lay.stat]
        return StepStatus(
            losses=dict(zip(self.loss_names, packed[lay.losses].tolist())),
            finite=bool(stat[FINITE]), applied=bool(stat[APPLIED]), scale=float(stat[SCALE]),
            grad_norm=float(stat[GRAD_NORM]), clipped=bool(stat[CLIPPED]),
            health=packed[lay.health].reshape(lay.n_params, len(HEALTH_FIELDS)),
            act=packed[lay.act],
        )


def build_body(grad_fn: Callable, optimizer, scaler, health_fn: Callable, norm_fn: Callable,
               act: tuple[Callable, Callable] = (no_reset, no_peaks), replicas: Replicas | None = None) -> Callable:
    """`body(*inputs) -> (packed status, unscaled gradients)`: one train step's whole update.

    `act` is the (reset, read) pair of the step's activation peaks (`ActivationPeaks.step_fns`):
    reset before the forward passes, read after the update, appended to the status.
    A train step returns the packed status; diagnose's probe also returns the gradients.
    `replicas` (data parallel): the losses are averaged and the peaks maximised over ranks."""
    update = build_update(optimizer, scaler, health_fn, norm_fn, replicas)
    reset, read = act
    losses_of = replicas.losses if replicas is not None else _same
    peaks_of = read

    def all_peaks():   # a named def: MindSpore's jit parser cannot parse a lambda
        return replicas.peaks(read())

    if replicas is not None and read is not no_peaks:   # no peaks: nothing to gather
        peaks_of = all_peaks

    def body(*inputs):
        reset()
        (_, losses), scaled_grads = grad_fn(*inputs)
        status, health_rows, grads = update(scaled_grads)
        return ops.concat([losses_of(losses.astype(ms.float32)), status, health_rows.reshape(-1), peaks_of()]), grads

    return body


def make_step(loss_fn: Callable, weights: Sequence, optimizer, scaler, health_fn: Callable,
              loss_names: Sequence[str], jit: bool = True, peaks: ActivationPeaks | None = None) -> Step:
    """Wrap `loss_fn(*inputs) -> (scaled_loss, stacked_losses)` into a full train step.

    Two variants share one update (same gradients, scaler, optimizer, Parameters): the
    measuring one computes `health_fn`, the global norm (the norm only with health on or a
    clipping scaler) and the activation peaks of `peaks` (None: none); the plain one none of
    them (the norm only for a clipping scaler), for steps whose status is never read. There is
    no plain variant with health off (nothing to save; no peaks either) or for a scaler that
    reads health (`needs_health`): it must see health every step.
    """
    replicas = replicas_for(tuple(weights))   # None in a single process
    if replicas is not None:
        loss_fn = replicas.part_of(loss_fn)   # this rank's share of the global batch's loss
    grad_fn = ms.value_and_grad(loss_fn, None, tuple(weights), has_aux=True)
    scaler.watch(weights)
    peaks = None if health_fn is no_health else peaks

    def variant(health: Callable, norm: Callable) -> Callable:
        act = peaks.step_fns(measure=health is not no_health) if peaks is not None else (no_reset, no_peaks)
        body = build_body(grad_fn, optimizer, scaler, health, norm, act, replicas)

        def step(*inputs):
            packed, _ = body(*inputs)
            return packed

        return ms.jit(step) if jit else step

    plain_norm = global_norm if scaler.needs_norm else no_norm
    norm_fn = plain_norm if health_fn is no_health else global_norm
    single = health_fn is no_health or scaler.config.needs_health
    return Step(fn=variant(health_fn, norm_fn), loss_names=tuple(loss_names), weights=tuple(weights),
                measures_health=health_fn is not no_health, measures_norm=norm_fn is not no_norm,
                build_plain=None if single else lambda: variant(no_health, plain_norm),
                plain_norm=plain_norm is not no_norm, peaks=peaks)
