"""The flight recorder of `api.callback`: the last good state of a user's own run, kept so that
diagnose can start from just before its first bad step.

While a `Model.train` run goes well, the recorder holds (in host memory) a copy of every state
tensor of ampgan's step cell (`UserTrainStep.state_tensors`: the net's parameters, the
optimizer's moments and step count, the scaler's scale and counters) as of its newest log step
whose block of steps all had a finite loss, and the batches trained since. The callback reads the
losses once a block (its log cadence), so the first non-finite step is known to its block and the
state kept is the one before it. When a block shows a non-finite loss, the recorder writes once:

    <run folder>/recording/
        recording.json   the step of the state, the first bad step, what failed, the batch size,
                         the net, loss and optimizer classes, the AMP level, keep-list and scaler
        state.ckpt       the state tensors as of that step, under `net/`, `optimizer/`, `scaler/`
        batches.npz      the batches of the steps after it, up to and including the first bad one
                         (`input_<i>`: shape (steps, batch, ...) per input of the step)

A float16 run whose activation headroom (65504 / the largest leaf-cell output, measured at a log
step) falls under the warning factor is recorded the same way, once, in `headroom-recording/`:
the state before that log step and its block's batches, all still finite. The recorder goes on,
so a later non-finite loss still leaves `recording/`.

Each is written under a temporary name and renamed when complete. `ampgan.api.diagnose(...,
start=<folder>)` replays from it beside an FP32 twin on the same batches (diagnose converts it
into a checkpoint set of its own task).
"""

from __future__ import annotations

import json
import math
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ampgan import AmpganError

RECORDING = "recording"                  # the state before the first non-finite loss
HEADROOM_RECORDING = "headroom-recording"  # the state before the log step whose float16 headroom fell low
MANIFEST = "recording.json"
STATE = "state.ckpt"
BATCHES = "batches.npz"
FORMAT = 1


@dataclass
class Recording:
    """What `recording.json` says, and where the recording is."""

    step: int                      # the training step after which the state was kept (0: before the first)
    first_bad_step: int            # the first step whose loss was not finite
    failure: str                   # what failed, in words
    batch_size: int
    steps_recorded: int            # batches in batches.npz: steps step+1 .. first_bad_step
    net: str                       # qualified class names, for the diagnose call and its checks
    loss: str
    optimizer: str
    amp: str
    keep_fp32: list = field(default_factory=list)
    scaler: dict = field(default_factory=dict)
    lr: str = ""                   # the optimizer's learning rate as recorded (a number or a schedule)
    run_id: str = ""
    folder: str = ""

    def batches(self) -> list[np.ndarray]:
        """The recorded batches, one array per input of the step, each (steps, batch, ...)."""
        with np.load(Path(self.folder) / BATCHES) as f:
            return [f[f"input_{i}"] for i in range(len(f.files))]


def read(folder) -> Recording:
    """The recording in `folder` (a recording folder or the run folder that holds one)."""
    path = Path(folder).expanduser()
    if (path / RECORDING / MANIFEST).exists():
        path = path / RECORDING
    if not (path / MANIFEST).exists():
        raise AmpganError(f"start={folder}: no flight recording there (want a folder with {MANIFEST}, "
                          "written by api.callback when a run's loss goes non-finite)")
    data = json.loads((path / MANIFEST).read_text())
    if data.pop("format", None) != FORMAT:
        raise AmpganError(f"start={folder}: a recording of another format than {FORMAT}")
    return Recording(**{**data, "folder": str(path)})


class FlightRecorder:
    """Keeps the last good state and the batches since; writes them once, at the first bad block."""

    def __init__(self):
        self.state: dict[str, np.ndarray] | None = None
        self.step = 0
        self.window: list[tuple] = []       # (loss, inputs) of the steps since the kept state, not fetched
        self.written: Path | None = None

    def keep(self, tensors: dict, step: int) -> None:
        """The state as of `step` (every block of steps up to it finite); the window starts anew."""
        self.state = {k: np.array(v.asnumpy(), copy=True) for k, v in tensors.items()}
        self.step = step
        self.window.clear()

    def push(self, loss, inputs) -> None:
        """One step's loss (a device value, fetched only at the block's end) and its batch."""
        self.window.append((loss, tuple(inputs)))

    def first_bad(self) -> int | None:
        """The first step of the window whose loss is not finite (fetches the window's losses), or None."""
        for i, (loss, _) in enumerate(self.window):
            value = loss.asnumpy() if hasattr(loss, "asnumpy") else np.asarray(loss)
            if not np.all(np.isfinite(value)):
                return self.step + i + 1
        return None

    def write(self, run_folder: Path, first_bad: int, describe: dict, name: str = RECORDING) -> Path:
        """The recording of the kept state and the window's batches up to `first_bad`, in the run
        folder's `name` (RECORDING; HEADROOM_RECORDING for a headroom warning); its folder."""
        import mindspore as ms

        final, tmp = run_folder / name, run_folder / f".{name}.partial"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        ms.save_checkpoint([{"name": k, "data": ms.Tensor(v)} for k, v in self.state.items()], str(tmp / STATE))
        window = self.window[: first_bad - self.step]
        inputs = [np.stack([_host(batch[i]) for _, batch in window]) for i in range(len(window[0][1]))]
        np.savez(tmp / BATCHES, **{f"input_{i}": a for i, a in enumerate(inputs)})
        manifest = {"format": FORMAT, "step": self.step, "first_bad_step": first_bad,
                    "batch_size": int(inputs[0].shape[1]), "steps_recorded": len(window), **describe}
        with open(tmp / MANIFEST, "w") as f:
            json.dump(manifest, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        shutil.rmtree(final, ignore_errors=True)
        os.rename(tmp, final)
        self.written = final
        return final


def _host(value) -> np.ndarray:
    return np.asarray(value.asnumpy() if hasattr(value, "asnumpy") else value)


def diagnose_call(rec: dict, folder: Path) -> str:
    """The Python call that diagnoses a recording, as the recorder prints it."""
    net = rec["net"].rsplit(".", 1)[-1]
    loss = rec["loss"].rsplit(".", 1)[-1]
    optimizer = rec["optimizer"].rsplit(".", 1)[-1]
    lr = rec.get("lr", "")
    opt = f"lambda params: {optimizer}(params, learning_rate={lr}...)" if lr and not math.isnan(_float(lr)) else optimizer
    return (f'ampgan.api.diagnose({net}, loss={loss}(...), optimizer={opt}, start="{folder}")')


def qualname(obj) -> str:
    cls = obj if isinstance(obj, type) else type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def _float(text) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):
        return math.nan


def describe_cell(cell) -> dict:
    """What a recording names of ampgan's step cell: classes, AMP level, keep-list, scaler."""
    out = {"net": cell.net_class, "loss": qualname(cell.loss_fn) if cell.loss_fn is not None else "",
           "optimizer": qualname(cell.optimizer), "amp": cell.amp_level, "keep_fp32": list(cell.keep_fp32),
           "scaler": {k: v for k, v in asdict(cell.scaler_cfg).items()}}
    describe = cell.describe()
    out["lr"] = describe.get("model.lr", "")
    return out
