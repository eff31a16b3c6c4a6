"""One protocol per role (ampgan/tasks/protocols.py): each caller touches only what its protocols
name, and every task implements them all."""

from __future__ import annotations

import ast

import pytest

from ampgan.tasks.protocols import ROLES, members
from tests.conftest import ROOT

# caller module -> the roles it uses
CALLERS = {
    "ampgan/training/loop.py": ("Trainable", "Evaluable"),
    "ampgan/training/entry.py": ("Trainable", "Evaluable"),
    "ampgan/training/checkpoint.py": ("Checkpointable",),
    "ampgan/training/graph_pool.py": ("Poolable",),
    "ampgan/training/parallel.py": ("Shardable",),
    "ampgan/diagnose/horizon.py": ("Evaluable",),
    "ampgan/diagnose/replay.py": ("Replayable",),
    "ampgan/diagnose/locate.py": ("Replayable",),
    "ampgan/diagnose/framework.py": ("Replayable",),
    "ampgan/diagnose/analysis.py": ("Replayable",),
    "ampgan/diagnose/inference.py": ("Replayable", "Evaluable"),
}


def touched(path) -> set[str]:
    """The attributes read of any name `task` (or `fp32_task`, `pooled`), or of a wrapper's
    `self.task`, in a module's source."""
    names = {"task", "fp32_task", "pooled"}

    def is_task(value) -> bool:
        if isinstance(value, ast.Name):
            return value.id in names
        return (isinstance(value, ast.Attribute) and value.attr == "task" and isinstance(value.value, ast.Name)
                and value.value.id == "self")

    return {node.attr for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Attribute) and is_task(node.value)}


@pytest.mark.parametrize("module", sorted(CALLERS))
def test_each_caller_touches_only_what_its_protocols_name(module):
    allowed = set().union(*(members(ROLES[r]) for r in CALLERS[module]))
    assert touched(ROOT / module) <= allowed, sorted(touched(ROOT / module) - allowed)


def test_every_task_implements_every_protocol():
    from ampgan.tasks.classifier import ClassifierTask
    from ampgan.tasks.gan import GanTask
    from ampgan.tasks.lm import LanguageModelTask

    for task in (GanTask, ClassifierTask, LanguageModelTask):
        for role in ROLES.values():
            missing = {m for m in members(role) if not hasattr(task, m) and m not in task.__annotations__
                       and not any(m in getattr(base, "__annotations__", {}) for base in task.__mro__)}
            assert not missing, (task.__name__, role.__name__, missing)


def test_a_caller_reaching_past_its_protocol_is_found(tmp_path):
    source = tmp_path / "caller.py"
    source.write_text("def f(task):\n    task.train_step(1)\n    return task.optimizers\n")
    allowed = members(ROLES["Trainable"])
    assert touched(source) - allowed == {"optimizers"}
    wrapper = tmp_path / "wrapper.py"
    wrapper.write_text("class W:\n    def f(self):\n        self.task.run_inputs(1, [], True)\n        return self.task.nets\n")
    assert touched(wrapper) - members(ROLES["Shardable"]) == {"nets"}
