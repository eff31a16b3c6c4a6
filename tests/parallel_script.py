"""Run under msrun by tests/test_parallel.py: several data-parallel trainings in one cluster.

    msrun --worker_num=2 ... tests/parallel_script.py <plan.json>

The plan lists jobs {"job": job folder with job.yaml, "plant", "unsynced"}; each rank trains each
job through the production path (`ampgan.training.rank.run_rank` -> `entry.train`), so the
cluster's start-up (~10 s) is paid once for all of them. Two test-only changes, made here by
monkeypatching and never present in ampgan itself:

- `plant` {"rank", "call", "factor"}: that rank's shard of its `call`-th batch is multiplied by
  `factor`, so that only its gradients overflow;
- `unsynced`: `ampgan.steps.parallel.agree_finite` is replaced by the rank's own flag, i.e. the
  finite flag is not all-reduced (each rank's scaler decides alone, as MindSpore's functional
  `amp.all_finite` would have it).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from omegaconf import OmegaConf


def own_only(own_finite, all_sum):
    """The test switch: no agreement, each rank keeps its own finite flag."""
    return own_finite


class Planted:
    """A rank's share of a task whose inputs are multiplied by `plant["factor"]` on the
    `plant["call"]`-th iteration (a planted overflow on this rank only); otherwise the share."""

    def __init__(self, share, plant: dict):
        self.share, self.plant, self.calls = share, plant, 0

    def __getattr__(self, name: str):
        return getattr(self.share, name)

    def train_step(self, step: int, measure: bool = True) -> None:
        self.calls += 1
        subs = self.share.step_inputs()
        if self.calls == self.plant["call"]:
            subs = [(name, (inputs[0] * self.plant["factor"],) + tuple(inputs[1:])) for name, inputs in subs]
        self.share.task.run_inputs(step, subs, measure)


def main(plan_path: str) -> int:
    from ampgan.steps import parallel as step_parallel
    from ampgan.training import parallel, rank

    plan = json.loads(Path(plan_path).read_text())
    if not rank.join("CPU"):
        return 0
    agree, shard = step_parallel.agree_finite, parallel.shard
    code = 0
    for job in plan:
        plant = job.get("plant")

        def planted_shard(task, batch_size, plant=plant):
            share = shard(task, batch_size)
            if plant and parallel.rank() == plant["rank"]:
                return Planted(share, plant)
            return share

        parallel.shard = planted_shard
        step_parallel.agree_finite = own_only if job.get("unsynced") else agree
        folder = Path(job["job"])   # written by the test (`parallel.write_job`)
        code = rank.run_rank(folder, OmegaConf.load(folder / "job.yaml")) or code
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
