"""One rank of a data-parallel run: what it does, and its entry point.

msrun starts `python -m ampgan.training.rank <job folder>` once per rank (the job's own process,
`ampgan.training.parallel.launch`, writes the folder and starts msrun). A rank joins the cluster
(`join`: `mindspore.communication.init()`, data-parallel mode), then trains the job's run through
the ordinary composition root, `ampgan.training.entry.train` (`run_rank`), and writes what the
job's process reads: its pid, its exit record and, on rank 0, `result.json`. What differs in a
rank (its slice of each batch, its folder, who tracks) is `ampgan.training.parallel`'s.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

from omegaconf import OmegaConf

from ampgan import AmpganError, report_error
from ampgan.tracking.tracker import write_atomic
from ampgan.training import parallel
from ampgan.training.entry import train
from ampgan.training.loop import STOP, exit_code


def worker_main(job_dir: str) -> int:
    """One rank (started by msrun): join the cluster, train the job's run, write what the job reads."""
    job = Path(job_dir)
    spec = OmegaConf.load(job / "job.yaml")
    if not join(spec.config.hardware.device):
        return 0
    return run_rank(job, spec)


def join(device: str) -> bool:
    """Join msrun's cluster as a rank, in data-parallel mode; False: this process is msrun's
    scheduler (msrun runs the script there too), which has nothing else to do."""
    import mindspore as ms
    from mindspore.communication import get_group_size, get_rank, init

    ms.set_device(device)
    init()
    if os.environ.get("MS_ROLE") == "MS_SCHED":
        return False
    parallel.set_rank((get_rank(), get_group_size()))
    ms.set_auto_parallel_context(parallel_mode="data_parallel", gradients_mean=True)
    return True


def run_rank(job: Path, spec) -> int:
    """Train the job's run as this rank (`join` first): rank 0 tracks it and writes `result.json`;
    every rank writes its pid and, at its end, its exit record (the job's process reads them)."""
    r = parallel.rank()
    os.environ[parallel.JOB_ENV] = str(job)
    (job / f"rank-{r}.pid").write_text(str(os.getpid()))
    logging.basicConfig(level=logging.INFO, format=f"[%(asctime)s][rank {r}][%(levelname)s] - %(message)s")
    if spec.hydra is not None:
        set_hydra(spec.hydra)
    run_dir = Path(spec.run_dir)
    parallel.own_folder(run_dir).mkdir(parents=True, exist_ok=True)
    os.chdir(parallel.own_folder(run_dir))   # MindSpore's scratch files: each rank its own

    STOP.in_rank(r)

    code, error = 0, ""
    try:
        objective = train(spec.config, run_dir)
        if r == 0:
            write_atomic(job / "result.json", json.dumps({"objective": objective}))
    except AmpganError as err:
        error = str(err)
        code = report_error(err)
    except KeyboardInterrupt as err:
        code = exit_code(err)
    except Exception as err:  # noqa: BLE001 - the job's process reports it
        error, code = f"{type(err).__name__}: {err}", 1
        raise
    finally:
        write_atomic(job / f"rank-{r}.exit", json.dumps({"code": code, "error": error}))
    return code


def set_hydra(node) -> None:
    """The job's Hydra config in a rank: its run folder, sweep, overrides, as in the job's process."""
    from hydra.conf import HydraConf
    from hydra.core.hydra_config import HydraConfig

    schema = OmegaConf.structured(HydraConf)
    OmegaConf.set_struct(schema, False)   # keys a plugin or a newer Hydra adds
    HydraConfig.instance().set_config(OmegaConf.create({"hydra": OmegaConf.merge(schema, node)}))


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1]))
