"""ampgan's MLflow run for the user's own training script: a `Model.train` callback and its twin
for a functional loop (`ampgan.api.callback`, `ampgan.api.monitor`).

Both make the run an ampgan run: the store `python -m ampgan.train` uses from the same folder
(`outputs/mlflow.db`, `tracking.uri` otherwise), its tags (`model`, `amp`, `scaler`, `hardware`,
`output_dir`, the objective) and metric names (`train/loss`, `train/scale`, `train/skipped`,
`train/finite`, gradient health `train/underflow`, `train/zero`, `train/max_abs_scaled_grad`,
`train/nonfinite`, ...), a run folder with the crash-safe metrics journal. Statuses are fetched
only at the logging cadence (`log_every`): the steps in between are not waited for.

Every run ends FINISHED, or FAILED with the error (KILLED on Ctrl-C): `Model.train` enters each
callback as a context manager, so the callback's `__exit__` sees an exception that training
raised (MindSpore calls `on_train_end` only on success); the monitor is a context manager itself.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ampgan import NEXT_COMMAND_TAG, WARNING_TAG, AmpganError, outputs_dir
from ampgan.amp.cell_paths import unwrapped
from ampgan.amp.float16 import low_headroom
from ampgan.amp.state import training_state
from ampgan.tracking.recorder import HEADROOM_RECORDING, FlightRecorder, describe_cell, diagnose_call, qualname
from ampgan.tracking.tracker import DIRECTION_TAG, OBJECTIVE_TAG, MlflowTracker

try:   # `mindspore.train.Callback`: Model.train calls its hooks (and enters it as a context manager)
    from mindspore.train import Callback as _Callback
except ImportError:  # pragma: no cover - MindSpore is a dependency; the monitor needs none of it
    _Callback = object

SOURCE_TAG = "ampgan.source"    # where the run comes from: callback (Model.train) or monitor (a functional loop)
NO_STATUS = ("Model's network {name} returns {what}, no step status (overflow flag, loss scale): build "
             "Model(ampgan.api.train_step(net_with_loss, optimizer, amp=..., scaler=...)) and keep the callback")


def _settings(who: str, settings: dict, allowed: dict) -> dict:
    from ampgan import closest

    for key in settings:
        if key not in allowed:
            raise AmpganError(f"{who}: no setting {key!r}{closest(key, list(allowed))}; its settings: {', '.join(allowed)}")
    out = {**allowed, **settings}
    if not isinstance(out["log_every"], int) or out["log_every"] < 1:
        raise AmpganError(f"{who}: log_every must be an integer >= 1, got {out['log_every']!r}")
    warn = out["headroom_warn"]
    if isinstance(warn, bool) or not isinstance(warn, (int, float)) or not warn > 1:
        raise AmpganError(f"{who}: headroom_warn must be a number > 1 (as trainer.headroom_warn), got {warn!r}")
    return out


def _tracking(who: str, experiment: str | None, tracking_uri: str | None, flush_every: int):
    """The validated tracking config: the default store is the trainer's (outputs/mlflow.db)."""
    from ampgan.config.schema import TrackingConfig

    try:
        return TrackingConfig(uri=tracking_uri or "", experiment=experiment or "ampgan", flush_every=flush_every)
    except AmpganError as err:
        raise AmpganError(f"{who}: {err}") from None


def run_folder(kind: str) -> Path:
    """A fresh run folder under outputs/runs/<date>/ (the journal and tracking.json live there)."""
    folder = outputs_dir() / "runs" / time.strftime("%Y-%m-%d") / f"{kind}-{time.strftime('%H-%M-%S')}-{time.time_ns() % 10**6:06d}"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _device() -> str:
    try:
        import mindspore as ms

        return str(ms.get_context("device_target"))
    except Exception:  # noqa: BLE001 - a tag, not worth failing for
        return "unknown"


class _Run:
    """One tracked run: started once, ended once (FINISHED / FAILED / KILLED), never left RUNNING."""

    def __init__(self, who: str, kind: str, experiment, tracking_uri, settings: dict):
        self.who, self.kind = who, kind
        self.settings = settings
        self.cfg = _tracking(who, experiment, tracking_uri, settings["flush_every"])
        self.tracker: MlflowTracker | None = None
        self.folder: Path | None = None
        self.status: str | None = None    # how the run ended (None: not ended)

    @property
    def run_id(self) -> str | None:
        return self.tracker.run_id if self.tracker is not None else None

    @property
    def open(self) -> bool:
        return self.tracker is not None and self.status is None

    def start(self, params: dict[str, Any], tags: dict[str, str]) -> None:
        self.folder = run_folder(self.kind)
        self.tracker = MlflowTracker(self.cfg.uri, self.cfg.experiment, self.cfg.flush_every, self.folder,
                                     self.cfg.heartbeat_seconds)
        self.status = None
        base = {"hardware": _device(), "output_dir": str(self.folder), SOURCE_TAG: self.kind,
                OBJECTIVE_TAG: "train/loss", DIRECTION_TAG: "minimize"}
        name = self.settings.get("run_name") or f"{tags.get('model', 'net').rsplit('.', 1)[-1]}-{tags.get('amp', '')}-{tags.get('scaler', '')}".lower()
        self.tracker.start(name, params, {**base, **tags})

    def log(self, metrics: dict[str, float], step: int) -> None:
        if self.open and metrics:
            self.tracker.log_metrics(metrics, step)

    def end(self, error: BaseException | None = None) -> None:
        if not self.open:
            return
        if error is None:
            status, text = "FINISHED", None
        elif isinstance(error, KeyboardInterrupt):
            status, text = "KILLED", f"interrupted ({error or 'Ctrl-C'})"
        else:
            status, text = "FAILED", f"{type(error).__name__}: {error}"
        self.status = status
        self.tracker.set_tags({"outcome": "completed" if error is None else "failed"})
        self.tracker.finish(status, text)


class TupleStatus:
    """Host bookkeeping of (loss, finite, scale) statuses, fetched in one go at the cadence.

    The steps' values stay device tensors (or numbers) until `drain`: the steps between two
    log steps are not waited for. Metrics are ampgan's: train/loss (mean since the last drain),
    train/scale (newest), train/skipped (non-finite steps so far, when they are skipped),
    train/finite (all steps since the last drain were finite)."""

    def __init__(self, prefix: str = "train"):
        self.prefix = prefix
        self.pending: list[tuple] = []
        self.skipped = self.steps = 0

    def push(self, loss, finite, scale, applies_nonfinite: bool = False) -> None:
        self.pending.append((loss, finite, scale, applies_nonfinite))

    def drain(self) -> dict[str, float]:
        if not self.pending:
            return {}
        rows = [(_number(loss), bool(np.all(_array(finite))), _number(scale), keep) for loss, finite, scale, keep in self.pending]
        self.pending.clear()
        self.steps += len(rows)
        self.skipped += sum(1 for _, finite, _, keep in rows if not finite and not keep)
        p = self.prefix
        return {f"{p}/loss": float(np.mean([r[0] for r in rows])), f"{p}/scale": rows[-1][2],
                f"{p}/skipped": float(self.skipped), f"{p}/finite": float(all(r[1] for r in rows))}


def run_totals(steps: int, skipped: int, prefix: str = "train") -> dict[str, float]:
    """The trainer's end-of-run totals that a script's run has too: the steps trained
    (`train/steps`) and skipped in all (`<net>/skipped_total`). Not `train/diverged`: the trainer
    stops a run whose losses stay non-finite, `Model.train` and a user's loop do not."""
    return {"train/steps": float(steps), f"{prefix}/skipped_total": float(skipped)}


def _array(value) -> np.ndarray:
    return np.asarray(value.asnumpy() if hasattr(value, "asnumpy") else value)


def _number(value) -> float:
    return float(_array(value).reshape(-1)[0]) if _array(value).size else math.nan


class AmpganCallback(_Callback):
    """`callbacks=[api.callback(...)]` for `Model.train` (see the module's docstring).

    With ampgan's step cell (`api.train_step`) it reads the cell's packed statuses (losses,
    scale, applied, gradient health) at its log steps, which it tells the cell to measure; with
    MindSpore's `TrainOneStepWithLossScaleCell` it reads `(loss, overflow, scale)`. Any other
    network (a plain `TrainOneStepCell`: the loss only) is one `AmpganError` line before a run starts.
    `status_reader(step, float16)`: what drains the ampgan cell's statuses into metrics (the
    trainer's own `NetState`, given by `ampgan.api`).
    """

    DEFAULTS = {"log_every": 10, "flush_every": 500, "run_name": "", "record": True, "headroom_warn": 8.0}

    def __init__(self, experiment: str | None = None, tracking_uri: str | None = None,
                 status_reader: Callable | None = None, **settings):
        super().__init__()
        self.settings = _settings("api.callback", settings, self.DEFAULTS)
        self.log_every = self.settings["log_every"]
        self.run = _Run("api.callback", "callback", experiment, tracking_uri, self.settings)
        self._reader_factory = status_reader
        self._reader = None
        self._cell = None
        self._tuple: TupleStatus | None = None
        self._recorder: FlightRecorder | None = None
        self._last_step = self._last_logged = 0
        self.recording: Path | None = None   # the flight recording, once the loss went non-finite
        self.headroom_recording: Path | None = None   # the one of the first log step whose headroom fell low

    @property
    def run_id(self) -> str | None:
        return self.run.run_id

    # ---------------------------------------------------------------- context manager (Model.train enters it)
    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if self.run.open:
            if exc is None:
                self._drain(self._last_step)
            self.run.end(exc)
        return False

    # ---------------------------------------------------------------- hooks
    def on_train_begin(self, run_context):
        cb = run_context.original_args()
        net = cb.train_network if getattr(cb, "train_network", None) is not None else cb.network
        self._cell, self._tuple, self._reader = None, None, None
        if getattr(net, "ampgan_step", False):
            self._cell = net
            self._reader = self._reader_factory(net.step, net.float16) if self._reader_factory else None
            params, tags = net.describe(), {}
            tags.update(model=params["model.net._target_"], amp=net.amp_level, scaler=net.scaler_cfg.name)
        elif _is_loss_scale_cell(net):
            self._tuple = TupleStatus()
            params, tags = _describe_mindspore_cell(net), {"amp": "unknown", "scaler": "loss_scale_manager"}
            tags["model"] = params["model.net._target_"]
        else:
            raise AmpganError("api.callback: " + NO_STATUS.format(name=type(net).__name__, what="the loss only"))
        dataset = getattr(cb, "train_dataset", None)
        tags["data"] = type(dataset).__name__ if dataset is not None else "user"
        params.update({"trainer.epochs": str(getattr(cb, "epoch_num", "")), "trainer.log_every": str(self.log_every),
                       "data.batches_per_epoch": str(getattr(cb, "batch_num", ""))})
        self._last_step = self._last_logged = 0
        self.run.start(params, tags)
        self._recorder = None
        if self._cell is not None and self.settings["record"] and hasattr(self._cell, "state_tensors"):
            self._recorder = FlightRecorder()
            self._recorder.keep(self._cell.state_tensors(), 0)

    def on_train_step_begin(self, run_context):
        if self._cell is not None:
            step = run_context.original_args().cur_step_num
            self._cell.measure_next = self._due(step)   # the steps it logs run the measuring variant

    def on_train_step_end(self, run_context):
        if not self.run.open:
            return
        cb = run_context.original_args()
        step = cb.cur_step_num
        self._last_step = step
        if self._cell is not None:
            if self._reader is not None:
                self._reader.push(step, self._cell.last_status, self._cell.last_measured)
            if self._recorder is not None:
                self._recorder.push(cb.net_outputs[0], cb.train_dataset_element or ())
        else:
            out = cb.net_outputs
            if not isinstance(out, (tuple, list)) or len(out) < 3:
                raise AmpganError("api.callback: " + NO_STATUS.format(name=type(cb.train_network).__name__,
                                                                      what="the loss only"))
            self._tuple.push(out[0], _NotOverflow(out[1]), out[2])
        if self._due(step):
            self._drain(step)

    def on_train_epoch_end(self, run_context):
        if self.run.open:
            self._drain(run_context.original_args().cur_step_num)

    def on_train_end(self, run_context):
        if self.run.open:
            step = run_context.original_args().cur_step_num
            self._drain(step)
            counter = self._reader if self._reader is not None else self._tuple
            self.run.log(run_totals(step, counter.skipped), step)
            self.run.end(None)

    # ---------------------------------------------------------------- internals
    def _due(self, step: int) -> bool:
        return step == 1 or step % self.log_every == 0

    def _drain(self, step: int) -> None:
        if not step or step == self._last_logged:
            return
        metrics: dict[str, float] = {}
        if self._reader is not None:
            _, metrics = self._reader.drain()
        elif self._tuple is not None:
            metrics = self._tuple.drain()
        self._record(step, metrics)
        self._last_logged = step
        self.run.log(metrics, step)

    def _record(self, step: int, metrics: dict[str, float]) -> None:
        """At a block's end (`metrics`: its drained metrics): at the first block with a non-finite
        loss, write the recording, tag the run and print the call that diagnoses it (once); at the
        first whose float16 headroom fell under `headroom_warn`, the same into `headroom-recording/`
        (once); then keep the state, every loss so far being finite."""
        rec = self._recorder
        if rec is None:
            return
        bad = rec.first_bad()
        if bad is not None:
            self._recorder = None   # once per run: the first bad step is the one to diagnose
            self.recording = record_failure(rec, bad, describe_cell(self._cell), self.run)
            return
        low = low_headroom(metrics, self.settings["headroom_warn"], "headroom_warn")
        if low and self.headroom_recording is None:
            self.headroom_recording = record_headroom(rec, step, low, describe_cell(self._cell), self.run)
        rec.keep(self._cell.state_tensors(), step)


def record_failure(rec: FlightRecorder, bad: int, describe: dict, run) -> Path:
    """The first non-finite loss at step `bad`: write the recording into the run's folder, tag the
    run, and print the one line with the call that diagnoses it from there; the recording's folder."""
    describe = {**describe, "failure": f"train/loss not finite at step {bad}", "run_id": run.run_id or ""}
    folder = rec.write(run.folder, bad, describe)
    run.tracker.set_tags({"ampgan.recording": str(folder), "ampgan.first_bad_step": str(bad)})
    _announce(rec, bad, "the loss is not finite", folder, diagnose_call(describe, folder))
    return folder


def record_headroom(rec: FlightRecorder, step: int, why: str, describe: dict, run) -> Path:
    """Float16 headroom under the warning factor at log step `step` (every loss still finite, `why`
    in words): write the state before the block and its batches into `headroom-recording/`, tag the
    run as the trainer's loop tags a warning, print the diagnose call; the recording's folder."""
    describe = {**describe, "failure": f"step {step}: {why}", "run_id": run.run_id or ""}
    folder = rec.write(run.folder, step, describe, HEADROOM_RECORDING)
    call = diagnose_call(describe, folder)
    run.tracker.set_tags({WARNING_TAG: f"step {step}: {why}; next: {call}", NEXT_COMMAND_TAG: call,
                          "ampgan.headroom_recording": str(folder)})
    _announce(rec, step, why, folder, call)
    return folder


def _announce(rec: FlightRecorder, step: int, what: str, folder: Path, call: str) -> None:
    import sys

    since = step - rec.step
    print(f"ampgan: step {step}: {what}; the state after step {rec.step} and the {since} "
          f"batch{'es' if since != 1 else ''} since are saved in {folder}. Diagnose from there: "
          f"{call}", file=sys.stderr, flush=True)


class _NotOverflow:
    """A step's overflow flag, read as its finite flag when the status is fetched (not before)."""

    def __init__(self, overflow):
        self.overflow = overflow

    def asnumpy(self):
        return np.logical_not(_array(self.overflow))


def _is_loss_scale_cell(net) -> bool:
    try:
        from mindspore import nn

        return isinstance(net, nn.TrainOneStepWithLossScaleCell)
    except ImportError:  # pragma: no cover
        return False


def _describe_mindspore_cell(cell) -> dict[str, str]:
    net = getattr(cell, "network", cell)
    backbone = getattr(net, "_backbone", net)
    opt = getattr(cell, "optimizer", None)
    params = {"model.net._target_": qualname(backbone),
              "model.params": str(int(sum(p.size for p in backbone.trainable_params())))}
    if opt is not None:
        params["model.optimizer._target_"] = qualname(opt)
    return params


class Monitor:
    """`with api.monitor(...) as monitor:` around a functional loop; `monitor.step(loss, finite,
    scaler, grads=None)` once a step. The callback's twin: the same run, tags and metrics.

    `loss`, `finite` (the step's `all_finite` flag) and `scaler` (ampgan's `api.loss_scaler` or
    MindSpore's `DynamicLossScaler`/`StaticLossScaler`: its `scale_value` is read) are kept as
    device values and fetched at log steps only; `grads` (the step's unscaled gradients), when
    given, are measured at log steps: `train/underflow`, `train/zero` (of the gradients as
    they are) and `train/max_abs_grad`, `train/nonfinite`. A non-finite step counts as skipped
    unless the scaler applies non-finite steps (ampgan's `none`, `static`/`fixed_clip` with
    `skip_nonfinite=false`). Settings: `log_every` (10), `net`, `optimizer`, `amp`, `loss` (recorded
    as params and tags when given), `run_name`, `flush_every`, `record` (True), `headroom` (True),
    `headroom_warn` (8.0).

    Activation headroom: given `net` and a float16 `amp` (O1-O3), the monitor puts a holder around
    each leaf cell of the net for the length of the `with` block (`ampgan.amp.activations`: the
    cell runs as before, and its max |output| is folded into a float32 Parameter), so the user's
    step, compiled or not, measures its activation peaks; at each log step the monitor reads the
    peaks of the block's steps, logs `train/act_max_abs` and `train/headroom` (65504 / the peak),
    and resets them. Enter the monitor before the step's first call (its compile).

    The flight recorder, as the callback's: given `net` and `optimizer`, and each step's `batch`
    (the step's inputs, `monitor.step(..., batch=(x, y))`), the monitor keeps the state of the net,
    the optimizer and the scaler (`ampgan.amp.state.training_state`) as of its newest log step
    whose block of losses was finite, and the batches since. At the first block with a non-finite
    loss it writes them (`ampgan.tracking.recorder`), tags the run and prints the
    `ampgan.api.diagnose(..., start=...)` call that replays from there.
    """

    DEFAULTS = {"log_every": 10, "flush_every": 500, "run_name": "", "net": None, "optimizer": None, "amp": None,
                "loss": None, "record": True, "headroom": True, "headroom_warn": 8.0}

    def __init__(self, experiment: str | None = None, tracking_uri: str | None = None, **settings):
        self.settings = _settings("api.monitor", settings, self.DEFAULTS)
        self.log_every = self.settings["log_every"]
        self.run = _Run("api.monitor", "monitor", experiment, tracking_uri, self.settings)
        self.status = TupleStatus()
        self.steps = 0
        self._health: dict[str, float] = {}
        self._scaler_logged = False
        self._scaler = self._scaler_wrapper = None   # the loop's scaler: its state (inner), its settings (wrapper)
        self._recorder: FlightRecorder | None = None
        self.recording: Path | None = None   # the flight recording, once the loss went non-finite
        self.headroom_recording: Path | None = None   # the one of the first log step whose headroom fell low
        self._peaks = self._watching = None   # the net's leaf-cell peaks, while the block runs

    @property
    def run_id(self) -> str | None:
        return self.run.run_id

    def __enter__(self):
        self.run.start(*self._params())
        self._watch()
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            if self.run.open:
                if exc is None:
                    self._drain()
                    self.run.log(run_totals(self.steps, self.status.skipped), self.steps)
                self.run.end(exc)
        finally:
            if self._watching is not None:   # the net's cells in their own places again
                self._watching.__exit__(None, None, None)
                self._watching = None
        return False

    def _watch(self) -> None:
        """Measure the activation peaks of a float16 `net` (settings `net`, `amp`, `headroom`)."""
        s = self.settings
        if not s["headroom"] or s["net"] is None or str(s["amp"] or "O0").upper() not in ("O1", "O2", "O3"):
            return
        from ampgan.amp.activations import ActivationPeaks

        peaks = ActivationPeaks(s["net"], "")
        if len(peaks):
            self._peaks, self._watching = peaks, peaks.watching()
            self._watching.__enter__()

    def _peak_metrics(self) -> dict[str, float]:
        """The block's activation peak and float16 headroom (one fetch), the peaks reset for the next block."""
        if self._peaks is None:
            return {}
        from ampgan.amp.activations import NOT_REACHED, headroom, reset_peaks

        values = np.array([float(_number(slot)) for slot in self._peaks.slots])
        reached = values[~(values < 0)]   # NOT_REACHED is negative; a NaN peak was reached
        reset_peaks(self._peaks)
        if not reached.size:
            return {}
        peak = float(np.max(reached)) if np.all(np.isfinite(reached)) else float("nan")
        return {"train/act_max_abs": peak, "train/headroom": headroom(peak)}

    def _params(self) -> tuple[dict, dict]:
        s = self.settings
        params: dict[str, str] = {"trainer.log_every": str(self.log_every)}
        tags: dict[str, str] = {"data": "user"}
        net, opt, amp = s["net"], s["optimizer"], s["amp"]
        if net is not None:   # the user's class, not MindSpore's AMP wrapper around it
            params["model.net._target_"] = tags["model"] = qualname(unwrapped(net))
            if hasattr(net, "trainable_params"):
                params["model.params"] = str(int(sum(p.size for p in net.trainable_params())))
        if opt is not None:
            params["model.optimizer._target_"] = qualname(opt)
            lr = getattr(opt, "learning_rate", None)
            if lr is not None and hasattr(lr, "asnumpy") and lr.size == 1:
                params["model.lr"] = f"{float(lr.asnumpy().reshape(-1)[0]):g}"
        if amp is not None:
            params["amp.level"] = tags["amp"] = str(amp).upper()
        return params, tags

    def step(self, loss, finite, scaler, grads=None, batch=None) -> None:
        """Record one step: kept on the device, fetched and logged every `log_every` steps (and the first).
        `batch`: the step's inputs, for the flight recorder (every step's, from the first)."""
        if not self.run.open:
            raise AmpganError("api.monitor: monitor.step(...) outside its `with api.monitor(...) as monitor:` block")
        self.steps += 1
        if not self._scaler_logged:
            self._describe_scaler(scaler)
            self._scaler = getattr(scaler, "inner", scaler)
            s = self.settings
            if s["record"] and batch is not None and s["net"] is not None and s["optimizer"] is not None:
                self._recorder = FlightRecorder()
        if self._recorder is not None:
            if batch is None:
                raise AmpganError(f"api.monitor: monitor.step(..., batch=...) was given at step 1 but not at step "
                                  f"{self.steps}: the flight recorder needs every step's batch (or record=False)")
            self._recorder.push(loss, batch if isinstance(batch, (tuple, list)) else (batch,))
        value = getattr(scaler, "scale_value", 1.0)
        scale = value * 1.0 if hasattr(value, "asnumpy") else value   # a copy: the Parameter changes in place
        self.status.push(loss, finite, scale, _applies_nonfinite(scaler))
        if self.steps == 1 or self.steps % self.log_every == 0:
            if grads is not None:
                self._health = _grad_health(grads)
            self._drain()

    def _describe_scaler(self, scaler) -> None:
        self._scaler_logged = True
        self._scaler_wrapper = scaler
        inner = getattr(scaler, "inner", None)
        cfg = getattr(inner, "config", None)
        name = getattr(cfg, "name", None) or type(scaler).__name__
        self.run.tracker.set_tags({"scaler": name})

    def _drain(self) -> None:
        metrics = self.status.drain()
        metrics.update(self._health)
        metrics.update(self._peak_metrics())
        self._health = {}
        self._record(metrics)
        self.run.log(metrics, self.steps)

    def _record(self, metrics: dict[str, float]) -> None:
        """At a block's end (`metrics`: its metrics), as the callback's: the first block with a
        non-finite loss is recorded (once), and so is the first whose float16 headroom fell under
        `headroom_warn` (once); then the state is kept, every loss so far being finite."""
        rec, s = self._recorder, self.settings
        if rec is None:
            return
        bad = rec.first_bad()
        if bad is None:
            low = low_headroom(metrics, s["headroom_warn"], "headroom_warn")
            if low and self.headroom_recording is None and rec.state is not None:
                self.headroom_recording = record_headroom(rec, self.steps, low, self._describe(), self.run)
            rec.keep(training_state(s["net"], s["optimizer"], self._scaler), self.steps)
            return
        self._recorder = None   # once per run
        import sys

        if rec.state is None:   # the first step failed: there is no earlier state than the start
            self.run.tracker.set_tags({"ampgan.first_bad_step": str(bad)})
            name = qualname(unwrapped(s["net"])).rsplit(".", 1)[-1]
            print(f"ampgan: step {bad}: the loss is not finite at the first step; diagnose from the start: "
                  f"ampgan.api.diagnose({name}, ...)", file=sys.stderr, flush=True)
            return
        self.recording = record_failure(rec, bad, self._describe(), self.run)

    def _describe(self) -> dict:
        """What a recording names of the loop: classes, AMP level, the scaler's name and settings."""
        s, params = self.settings, self._params()[0]
        return {"net": qualname(unwrapped(s["net"])), "loss": qualname(s["loss"]) if s["loss"] is not None else "",
                "optimizer": qualname(s["optimizer"]), "amp": str(s["amp"] or "O0").upper(), "keep_fp32": [],
                "scaler": scaler_settings(self._scaler_wrapper), "lr": params.get("model.lr", "")}


def scaler_settings(scaler) -> dict:
    """A loop's scaler as conf/scaler/ names it: ampgan's (`api.loss_scaler`) by its settings;
    MindSpore's `DynamicLossScaler` as `dynamic` and `StaticLossScaler` as `static`, from the scale
    they have now (a replay from a recording starts there)."""
    from dataclasses import asdict

    cfg = getattr(scaler, "settings", None)
    if cfg is not None:
        return asdict(cfg)
    scale = _number(getattr(scaler, "scale_value", 1.0))
    if hasattr(scaler, "scale_window"):
        return {"name": "dynamic", "init_scale": scale, "factor": float(scaler.scale_factor),
                "window": int(scaler.scale_window)}
    return {"name": "static", "init_scale": scale}


def _applies_nonfinite(scaler) -> bool:
    flag = getattr(getattr(scaler, "inner", None), "apply_nonfinite", None)
    return bool(_array(flag)) if flag is not None else False


def _grad_health(grads) -> dict[str, float]:
    """The gradients' health, pooled over all of them: one reduction per gradient on the device, one fetch."""
    from ampgan.amp.health import HEALTH_FIELDS, grad_health

    rows = _array(grad_health(tuple(grads)))
    sizes = np.array([float(np.prod(g.shape)) for g in grads])
    w = sizes / sizes.sum()
    nonzero = float(w @ (1.0 - rows[:, HEALTH_FIELDS.index("zero")]))
    return {"train/zero": float(w @ rows[:, HEALTH_FIELDS.index("zero")]),
            "train/underflow": float(w @ rows[:, HEALTH_FIELDS.index("underflow")]),
            "train/underflow_of_nonzero": float(w @ rows[:, HEALTH_FIELDS.index("underflow")]) / max(nonzero, 1e-12),
            "train/max_abs_grad": float(rows[:, HEALTH_FIELDS.index("max_abs")].max()),
            "train/nonfinite": float(rows[:, HEALTH_FIELDS.index("nonfinite")].sum())}
