"""`make bench`'s data-parallel figures: 1 vs 2 workers on the same global batch, and the
all-reduce's share of a 2-rank step.

    python -m experiments.bench --only "data parallel" --no-startup

1. steps/s: rounds of `python -m ampgan.train <classifier> hardware.workers=1`, then `=2` (the order
   flipped each round), the same settings and global batch; each run's `perf/step_s` (its steps
   after the first, the loop's evaluations included). Ratio per round, bootstrap interval.
2. the all-reduce's share: one msrun job (this file as the rank script) times, on each rank,
   blocks of training steps and blocks of the step's collectives alone (the gradient mean over
   the net's gradient shapes, the finite flag's sum, the losses' mean), alternately;
   share = collectives / step per round, bootstrap interval.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

MODEL = ["model=classifier", "data=gaussians8", "data.n_train=20000", "amp=o2", "scaler=dynamic",
         "trainer.batch_size=256", "trainer.eval_every=0", "trainer.layer_health_every=0", "trainer.print_seconds=0",
         "trainer.print_every=100000", "+model.net.width=256"]


def _env() -> dict[str, str]:
    root = Path(__file__).resolve().parents[1]
    return {**os.environ, "GLOG_v": "3", "PYTHONPATH": str(root),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}


def steps_per_second(scratch: Path, rounds: int, steps: int) -> dict[int, list[float]]:
    """workers -> seconds per step of each round's run."""
    from ampgan.tracking.tracker import make_client

    uri = f"sqlite:///{scratch / 'parallel.db'}"
    out: dict[int, list[float]] = {1: [], 2: []}
    for r in range(rounds):
        for workers in (1, 2) if r % 2 == 0 else (2, 1):
            name = f"dp-w{workers}-r{r}"
            done = subprocess.run([sys.executable, "-m", "ampgan.train", *MODEL, f"trainer.max_steps={steps}",
                                   f"hardware.workers={workers}", f"tracking.uri={uri}", f"tracking.run_name={name}",
                                   "tracking.experiment=bench-parallel"],
                                  env={**_env(), "AMPGAN_OUTPUTS": str(scratch)}, capture_output=True, text=True,
                                  cwd=scratch)
            if done.returncode != 0:
                raise RuntimeError(f"{name} failed: {done.stderr[-1000:]}")
            client = make_client(uri)
            exp = client.get_experiment_by_name("bench-parallel")
            run = client.search_runs([exp.experiment_id], f"attributes.run_name = '{name}'")[0]
            out[workers].append(run.data.metrics["perf/step_s"])
    return out


def allreduce_share(scratch: Path, rounds: int, block: int) -> dict[str, list[float]]:
    """Seconds per step and per step's collectives alone, per round, measured on rank 0 of a 2-rank job."""
    from ampgan.training.parallel import JOB_ENV, free_port

    result = scratch / "share.json"
    (scratch / "job").mkdir(exist_ok=True)   # the ranks' shared job folder, inside the bench's scratch
    cmd = [sys.executable, "-m", "mindspore.parallel.cluster.run", "--worker_num=2", "--local_worker_num=2",
           "--master_addr=127.0.0.1", f"--master_port={free_port()}", "--join=True", f"--log_dir={scratch / 'logs'}",
           "--tail_worker_log=2", "python", "-m", "experiments.bench_parallel", str(result), str(rounds), str(block)]
    done = subprocess.run(cmd, env={**_env(), "AMPGAN_OUTPUTS": str(scratch), JOB_ENV: str(scratch / "job")},
                          capture_output=True, text=True, cwd=scratch)
    if done.returncode != 0:
        raise RuntimeError(f"the all-reduce timing failed: see {scratch / 'logs'}")
    return json.loads(result.read_text())


def rank_main(result: str, rounds: int, block: int) -> int:
    """In each rank: time blocks of train steps and of the step's collectives alone, alternately."""
    import mindspore as ms
    from mindspore import nn, ops

    from ampgan.config.schema import CONF_DIR, validate
    from ampgan.tasks import build_task, load_data
    from ampgan.training import hardware, parallel, rank
    from hydra import compose, initialize_config_dir

    if not rank.join("CPU"):
        return 0
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        s = validate(compose(config_name="train", overrides=MODEL + ["hardware.workers=2", "tracking=none"]))
    hardware.setup(s.hardware, s.trainer.seed)
    task = parallel.shard(build_task(s, load_data(s)), s.trainer.batch_size)
    weights = [p for state in task.states() for p in state.step.weights]
    grads = tuple(ms.Tensor(np.zeros(p.shape, np.float32)) for p in weights)
    reducer = nn.DistributedGradReducer(weights, mean=True, degree=2)
    all_sum = ops.AllReduce()

    @ms.jit
    def collectives(g, flag, losses):
        return reducer(g), all_sum(flag), all_sum(losses)

    flag, losses = ms.Tensor(np.zeros(1, np.float32)), ms.Tensor(np.zeros(2, np.float32))

    def steps(n: int, first: int) -> None:
        for i in range(n):
            task.train_step(first + i, measure=False)
        task.metrics()

    def comm(n: int) -> None:
        for _ in range(n):
            out = collectives(grads, flag, losses)
        out[1].asnumpy()

    steps(3, 1)
    comm(3)
    times, at = {"step": [], "collectives": []}, 4
    for _ in range(rounds):
        t = time.perf_counter()
        steps(block, at)
        at += block
        times["step"].append((time.perf_counter() - t) / block)
        t = time.perf_counter()
        comm(block)
        times["collectives"].append((time.perf_counter() - t) / block)
    if parallel.rank() == 0:
        Path(result).write_text(json.dumps(times))
    return 0


def rows(scratch: Path, quick: bool, repeats: int) -> list[dict]:
    """The bench's rows: 2 workers against 1 (seconds per step), and the collectives against a 2-rank step."""
    from experiments.bench_stats import ratio_row

    rounds = max(3, repeats)
    per_step = steps_per_second(scratch, rounds, 100 if quick else 300)
    name = "data parallel: 1 vs 2 workers, the same global batch (classifier MLP, 256 wide, batch 256, O2 dynamic)"
    out = [ratio_row(name, f"{w} worker{'s' if w > 1 else ''}", per_step[w], per_step[1], "1 worker") for w in (1, 2)]
    times = allreduce_share(scratch, rounds * 2, 20 if quick else 50)
    out.append(ratio_row(name, "the collectives of a 2-rank step, over that step", times["collectives"], times["step"],
                         "a 2-rank step"))
    return out


if __name__ == "__main__":
    sys.exit(rank_main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
