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
            task = shard(task, batch_size)
            if plant and parallel.rank() == plant["rank"]:
                inner, calls = task.step_inputs, [0]

                def step_inputs():
                    calls[0] += 1
                    out = inner()
                    if calls[0] == plant["call"]:
                        out = [(name, (inputs[0] * plant["factor"],) + tuple(inputs[1:])) for name, inputs in out]
                    return out

                task.step_inputs = step_inputs
            return task

        parallel.shard = planted_shard
        step_parallel.agree_finite = own_only if job.get("unsynced") else agree
        folder = Path(job["job"])   # written by the test (`parallel.write_job`)
        code = rank.run_rank(folder, OmegaConf.load(folder / "job.yaml")) or code
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
