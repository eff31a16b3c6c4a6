"""Build stage: turn validated settings into a task the trainer loop can drive.

A task owns its nets, optimizers, scalers and compiled steps, and offers the loop:
`train_step(step, measure)` (launches the steps, does not wait; `measure`: this step's status
will be read, so compute its gradient health), `metrics()` (fetches the pending step
statuses: (step, flat metrics) per net), `layer_health()`, `nonfinite_run()`, `evaluate()`,
`eval_picture(dir, step)` (samples over training), `save_pictures(dir)`, and for checkpoints `state_parameters()`, `host_state()`,
`load_host_state()`. `GanTask` and `ClassifierTask` share everything below that through
`ampgan.steps.common`.

The model config names its task class (`model.task`), which carries the config's schema
(`Config`): a new task kind is one module and one YAML (`ampgan.tasks.lm`, conf/model/lm.yaml).
"""

from __future__ import annotations

from ampgan.config.schema import Settings
from ampgan.config.targets import import_object
from ampgan.data import Dataset
from ampgan.tasks.base import SAMPLES_OVER_TIME, NetState, TaskBase
from ampgan.tasks.classifier import ClassifierTask
from ampgan.tasks.gan import GanTask

__all__ = ["SAMPLES_OVER_TIME", "ClassifierTask", "GanTask", "NetState", "TaskBase", "build_task", "load_data",
           "task_class"]


def task_class(s: Settings) -> type[TaskBase]:
    """The task class the model config names (`model.task`; validation has imported it)."""
    return import_object(s.model.task)


def load_data(s: Settings) -> Dataset:
    """The task's data: the data group's set, or what a task that reads its own loads (model=lm)."""
    return task_class(s).load_data(s)


def build_task(s: Settings, data: Dataset):
    return task_class(s)(s, data)
