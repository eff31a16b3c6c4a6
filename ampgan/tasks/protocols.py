"""What each caller asks of a task, one protocol per role (`TaskBase` implements them all).

A caller depends only on the protocol it uses; `tests/test_task_protocols.py` checks, in each
caller's source, that it touches nothing of a task outside its protocols:

    Trainable       the loop and the composition root: step, drain statuses, per-layer health
    Evaluable       the loop, the root and diagnose's horizon: evaluate, the objective, pictures
    Checkpointable  checkpoints: every Parameter, the host-side state
    Poolable        the graph pool: a task's compiled steps handed to the next job of its structure
    Shardable       data parallel: a rank draws the iteration's sub-steps, launches its share of
                    them, and reads its own statuses before they are drained
    Replayable      diagnose: the nets by root, the optimised sub-steps, their inputs, forward
                    passes and the gradient penalty, for replays, locate and the framework check

This module imports nothing of ampgan: any stage may name a protocol.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol


class Trainable(Protocol):
    def states(self) -> list: ...
    def train_step(self, step: int, measure: bool = True) -> None: ...
    def metrics(self) -> list[tuple[int, dict[str, float]]]: ...
    def layer_health(self) -> dict[str, float]: ...
    def nonfinite_run(self) -> int: ...


class Evaluable(Protocol):
    objective: str
    direction: str
    objective_best: float

    def evaluate(self) -> dict[str, float]: ...
    def eval_picture(self, folder: Path, step: int) -> Path | None: ...
    def save_pictures(self, folder: Path) -> list: ...


class Checkpointable(Protocol):
    def state_parameters(self) -> dict[str, Any]: ...
    def host_state(self) -> dict: ...
    def load_host_state(self, state: dict) -> None: ...


class Poolable(Protocol):
    data: Any
    GRAPH_ATTRS: tuple[str, ...]

    def states(self) -> list: ...
    def graph_parameters(self) -> dict[str, Any]: ...


class Shardable(Protocol):
    def states(self) -> list: ...
    def step_inputs(self) -> list[tuple[str, tuple]]: ...
    def run_inputs(self, step: int, subs: list[tuple[str, tuple]], measure: bool) -> None: ...
    def metrics(self) -> list[tuple[int, dict[str, float]]]: ...


class Replayable(Protocol):
    nets: dict
    optimizers: dict
    scalers: dict
    batches: Any

    def roots(self) -> dict[str, Any]: ...
    def optimised(self) -> dict[str, Any]: ...
    def step_inputs(self) -> list[tuple[str, tuple]]: ...
    def forward(self, name: str, inputs: tuple) -> None: ...
    def penalty(self, name: str, inputs: tuple): ...
    def eval_forward(self) -> Callable[[], object] | None: ...
    def net_parameters(self) -> list: ...
    def state_parameters(self) -> dict[str, Any]: ...


ROLES = {"Trainable": Trainable, "Evaluable": Evaluable, "Checkpointable": Checkpointable,
         "Poolable": Poolable, "Shardable": Shardable, "Replayable": Replayable}


def members(protocol: type) -> set[str]:
    """The attributes and methods a protocol names."""
    names = set(getattr(protocol, "__annotations__", {}))
    names |= {n for n, v in vars(protocol).items() if callable(v) and not n.startswith("_")}
    return names
