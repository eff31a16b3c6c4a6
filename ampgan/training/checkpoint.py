"""Full-state checkpoints: everything a run needs to continue exactly where it stopped.

A checkpoint set is a folder `checkpoints/step-00000500/` holding
    state.ckpt   every Parameter of the nets, the optimizers (Adam moments, step counts) and the
                 loss scalers (scale, counters, history), under names unique across them
    host.json    the step, the batch sampler's position, the NumPy RNG states, the host-side
                 counters (skipped, clipped, ...), the MLflow run id
It is written under a temporary name and renamed when complete; `checkpoints/latest` then
names it. The previous set stays valid until the new one is complete; the newest
`trainer.keep_checkpoints` sets are kept.

    path = save(task, run_dir / "checkpoints", step, keep=2, extra={"run_id": ...})
    host = load(task, path)          # before the task's compiled steps first run
    path = find_checkpoint("<run id | run folder | checkpoint path>", find_run)   # find_run: run id -> run folder
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import mindspore as ms
import numpy as np

from ampgan import AmpganError

if TYPE_CHECKING:
    from ampgan.tasks.protocols import Checkpointable

STATE_FILE = "state.ckpt"
HOST_FILE = "host.json"
LATEST = "latest"
FORMAT = 1


def save(task: Checkpointable, folder: Path, step: int, keep: int = 2, extra: dict | None = None) -> Path:
    """Write one complete checkpoint set for `step`; return its folder."""
    folder.mkdir(parents=True, exist_ok=True)
    name = f"step-{step:08d}"
    final, tmp = folder / name, folder / f".{name}.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    params = task.state_parameters()
    ms.save_checkpoint([{"name": k, "data": p} for k, p in params.items()], str(tmp / STATE_FILE))
    host = {"format": FORMAT, "step": step, **task.host_state(), **(extra or {})}
    with open(tmp / HOST_FILE, "w") as f:
        json.dump(host, f)
        f.flush()
        os.fsync(f.fileno())
    if final.exists():  # the same step saved again (a signal right after a periodic checkpoint)
        shutil.rmtree(final)
    os.rename(tmp, final)
    pointer = folder / f".{LATEST}.tmp"
    pointer.write_text(name)
    os.replace(pointer, folder / LATEST)
    for old in sorted(folder.glob("step-*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def newest_before(folder: Path, step: int) -> Path | None:
    """The newest complete set in a `checkpoints/` folder written before training step `step`, or None."""
    sets = [p for p in sorted(folder.glob("step-*")) if (p / HOST_FILE).exists() and read_host(p)["step"] < step]
    return sets[-1] if sets else None


def step_of(path: Path | None) -> int:
    """The training step a checkpoint set was written at; 0 for None (a start from step 0)."""
    return read_host(path)["step"] if path is not None else 0


def latest(folder: Path) -> Path | None:
    """The newest complete set in a `checkpoints/` folder, or None."""
    pointer = folder / LATEST
    if pointer.exists() and (folder / pointer.read_text().strip() / HOST_FILE).exists():
        return folder / pointer.read_text().strip()
    sets = [p for p in sorted(folder.glob("step-*")) if (p / HOST_FILE).exists()]
    return sets[-1] if sets else None


def read_host(path: Path) -> dict:
    return json.loads((Path(path) / HOST_FILE).read_text())


def load(task: Checkpointable, path: Path) -> dict:
    """Put the checkpoint set at `path` into `task` (every Parameter, sampler, RNGs, counters); its host record."""
    path = Path(path)
    saved = ms.load_checkpoint(str(path / STATE_FILE))
    params = task.state_parameters()
    missing = sorted(set(params) - set(saved))
    if missing:
        raise AmpganError(f"checkpoint {path} does not fit this run: it has no '{missing[0]}' "
                          f"({len(missing)} state tensors missing; was it written with another model or scaler?)")
    for key, param in params.items():
        value = saved[key].asnumpy()
        if value.shape != tuple(param.shape):
            raise AmpganError(f"checkpoint {path} does not fit this run: '{key}' has shape {value.shape}, "
                              f"the run's is {tuple(param.shape)}")
        param.set_data(ms.Tensor(np.array(value, copy=True), dtype=param.dtype))  # keeps 0-d shapes
    host = read_host(path)
    task.load_host_state(host)
    return host


def find_checkpoint(spec: str, find_run: Callable[[str], Path] | None = None) -> Path:
    """The checkpoint set named by `trainer.resume`: a run folder, a checkpoints folder, a checkpoint
    set folder, or a run id that `find_run` turns into its run folder (the tracking store's lookup,
    `ampgan.tracking.tracker.run_folder`: checkpoints know no store)."""
    path = Path(spec).expanduser()
    if not path.exists():
        if find_run is None:
            raise AmpganError(f"trainer.resume={spec}: no such folder, and no tracking store to look up a run id")
        path = find_run(spec)
    if (path / HOST_FILE).exists():
        return path
    folder = path / "checkpoints" if (path / "checkpoints").is_dir() else path
    found = latest(folder)
    if found is None:
        raise AmpganError(f"trainer.resume={spec}: no checkpoint in {folder} "
                          f"(set trainer.checkpoint_every to write them during a run)")
    return found


def run_folder_of(checkpoint: Path) -> Path:
    """checkpoints/step-N -> the run folder that holds config.yaml."""
    return Path(checkpoint).resolve().parent.parent
