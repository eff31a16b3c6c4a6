"""Build stage: turn validated settings into a task the trainer loop can drive.

A task owns its nets, optimizers, scalers and compiled steps, and offers the loop:
`train_step(step, measure)` (launches the steps, does not wait; `measure`: this step's status
will be read, so compute its gradient health), `metrics()` (fetches the pending step
statuses: (step, flat metrics) per net), `layer_health()`, `nonfinite_run()`, `evaluate()`,
`eval_picture(dir, step)` (samples over training), `save_pictures(dir)`, and for checkpoints `state_parameters()`, `host_state()`,
`load_host_state()`. `GanTask` and `ClassifierTask` share everything below that through
`ampgan.steps.common`.
"""

from __future__ import annotations

from ampgan.config.schema import Settings
from ampgan.data import Dataset
from ampgan.tasks.base import SAMPLES_OVER_TIME, NetState, TaskBase
from ampgan.tasks.classifier import ClassifierTask
from ampgan.tasks.gan import GanTask

__all__ = ["SAMPLES_OVER_TIME", "TASKS", "ClassifierTask", "GanTask", "NetState", "TaskBase", "build_task"]

TASKS = {"wgan_gp": GanTask, "classifier": ClassifierTask}


def build_task(s: Settings, data: Dataset):
    return TASKS[s.model.name](s, data)
