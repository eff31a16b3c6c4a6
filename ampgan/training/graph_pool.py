"""Compile once per sweep: a process keeps its last finished tasks and lends their compiled steps.

A job of a serial sweep (Hydra's basic launcher, a loky worker, an Optuna worker) that differs
from an earlier job of the same process only in settings the compiled steps read at run time
(`RUNTIME_SETTINGS`: learning rates, the loss scale's start, factor and window, the clip norm,
and everything host-side: seed, steps, cadences, data values) runs that job's compiled steps:

    task = build_task(settings, data)     # fresh nets, optimizers, scalers: this job's values, nothing compiled
    lend_graphs(task, settings)           # pooled task of the same structure? its Parameters take the fresh
                                          # values (in place) and the task runs its compiled steps
    ... train ...
    give_back(task, settings)             # only after a job that ended well

Every Parameter a compiled step reads is copied (`TaskBase.graph_parameters`): weights, BatchNorm
statistics, optimizer moments and step, learning rates, scaler state and settings. The copy is
in place (`Parameter.copy_`): a compiled graph does not see a `set_data` made after its first
call. Everything else that enters the graph (shapes, AMP level, keep-lists, Adam's betas, the
penalty's lambda, the scaler's other settings) is part of the structure key.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections import OrderedDict

from ampgan.config.schema import Settings

log = logging.getLogger("ampgan")

POOL_SIZE = 3  # structures kept per process: a sweep whose fastest-varying choice has up to 3 options reuses all
RUNTIME_SETTINGS = {"model": ("lr", "lr_g", "lr_d"), "scaler": ("init_scale", "factor", "window", "clip_norm")}

_pool: OrderedDict[str, object] = OrderedDict()


def structure_key(s: Settings, data) -> str:
    """What the compiled steps are built from: two jobs with one key can share them."""

    def section(name: str) -> dict:
        fields = dataclasses.asdict(getattr(s, name))
        return {k: v for k, v in fields.items() if k not in RUNTIME_SETTINGS.get(name, ())}

    hardware = {k: v for k, v in dataclasses.asdict(s.hardware).items() if k != "threads"}
    key = {"model": section("model"), "amp": section("amp"), "scaler": section("scaler"), "hardware": hardware,
           "batch_size": s.trainer.batch_size, "grad_health": s.trainer.grad_health, "headroom": s.trainer.headroom,
           "sample_shape": list(data.sample_shape), "n_classes": data.n_classes}
    return json.dumps(key, sort_keys=True, default=str)


def lend_graphs(task, s: Settings) -> bool:
    """Give `task` the compiled steps of a pooled task of the same structure, with `task`'s values.

    Returns whether it did; without one (or with `trainer.reuse_compiled` off) `task` compiles
    its own steps on their first call."""
    if not s.trainer.reuse_compiled:
        return False
    key = structure_key(s, task.data)
    pooled = _pool.pop(key, None)
    if pooled is None:
        return False
    src, dst = task.graph_parameters(), pooled.graph_parameters()
    if src.keys() != dst.keys() or any(src[k].shape != dst[k].shape or src[k].dtype != dst[k].dtype for k in src):
        log.warning("graph pool: a pooled task of this structure holds other Parameters; compiling anew")
        return False
    for name, param in dst.items():
        param.copy_(src[name])
    for attr in type(task).GRAPH_ATTRS:
        setattr(task, attr, getattr(pooled, attr))
    for state, pooled_state in zip(task.states(), pooled.states()):
        state.step = pooled_state.step
    return True


def give_back(task, s: Settings) -> None:
    """Pool `task` (a job that ended well) for the next job of its structure in this process
    (nothing with `trainer.reuse_compiled` off)."""
    if not s.trainer.reuse_compiled:
        return
    key = structure_key(s, task.data)
    _pool[key] = task
    _pool.move_to_end(key)
    while len(_pool) > POOL_SIZE:
        _pool.popitem(last=False)


def clear() -> None:
    """Forget every pooled task (their compiled steps are freed with them)."""
    _pool.clear()
