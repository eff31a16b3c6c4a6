"""ampgan from Python (a notebook, your own script): your net, loss and data; ampgan's training
loop, loss scaling, gradient health, MLflow tracking and diagnose.

    import numpy as np
    from ampgan import api

    run = api.train(TinyNet, data=(x, y), amp="O2", scaler="dynamic", steps=200)
    print(run.objective, run.run_id, run.folder)
    verdict = api.diagnose(TinyNet, data=(x, y), amp="O2", scaler="dynamic")
    print(verdict.name, verdict.exit_code, verdict.layer, verdict.fixes)

The arguments become overrides of the real config (conf/), composed with Hydra's compose API, so
a run from here is the run `python -m ampgan.train` makes: the same validation, build, loop,
checkpoints and MLflow run. The objects you pass become `_target_`s (`ampgan.api.user.<name>`).
`net` is a class or a function that builds a fresh `mindspore.nn.Cell` (diagnose builds it
twice from one seed); it is given `num_classes`, `in_channels`, `image_size` or `sample_shape`
by name as any `model.net` target is. `data` is `(x, y)` or `(x_train, y_train, x_test, y_test)`
arrays, an iterable of `(x, y)` batches or a `mindspore.dataset` pipeline (ampgan.data.custom).
`optimizer` is an optimizer class or a function of the parameters (default: Adam); it gets
`lr` and `betas` by name as `model.optimizer` does (`overrides=("model.lr=0.05",)`). Bad input raises `ampgan.AmpganError` with one line, before any run.

`task` is the kind of run, an option of conf/model/ (its task class is the protocol the loop and
diagnose call): `"classifier"` (the default: `net`, `loss`, `data` of `(x, y)`), `"wgan_gp"`
(`generator` and `critic`, each a class or function building a Cell, given `z_dim`, `hidden`,
`depth`, `sample_shape` by name; `data` of samples `x`, or `(x, y)` whose labels it ignores) or
`"lm"` (`net` given `vocab_size` and `seq_len`; `text`, a str or a function returning one). A
part left out is the task's own default (ampgan's nets, its data set):

    run = api.train(task="wgan_gp", generator=MyGenerator, critic=MyCritic, data=points, amp="O2", steps=300)
    verdict = api.diagnose(task="lm", net=MyLM, text=open("corpus.txt").read(), amp="O3")
"""

from __future__ import annotations

import json
import time
import types
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig

from ampgan import AmpganError

user = types.SimpleNamespace()  # the objects passed in, for `_target_: ampgan.api.user.<name>`


@dataclass
class TrainResult:
    objective: float        # the task's objective (classifier: eval/accuracy; wgan_gp: eval/swd; lm: its eval loss)
    run_id: str | None      # the MLflow run (None with tracking="none")
    folder: Path            # the run folder: config.yaml, checkpoints, pictures


def _provide(name: str, obj) -> str:
    setattr(user, name, obj)
    return f"ampgan.api.user.{name}"


TASKS = ("classifier", "wgan_gp", "lm")   # conf/model/'s options: the task kinds a script can run
# the trainer option each task's own docs name (conf/model/classifier.yaml, lm.yaml): the default
# trainer is the 2-D WGAN-GP's schedule (3000 steps)
TRAINERS = {"classifier": "classifier", "lm": "classifier"}


def _builder(name: str, obj):
    import mindspore as ms

    if isinstance(obj, ms.nn.Cell) or not callable(obj):
        raise AmpganError(f"api: {name} must be a class or a function that builds a fresh mindspore.nn.Cell "
                          f"(diagnose builds it twice from one seed), got {type(obj).__name__}")
    return _provide(name, obj)


def _samples(data, task: str):
    """`data` as the custom data source reads it; a generative task takes bare samples too."""
    if hasattr(data, "shape") and hasattr(data, "dtype"):
        if task == "classifier":
            raise AmpganError("api: a classifier's data is (x, y), got one array without labels")
        import numpy as np

        return (data, np.zeros(len(data), np.int32))   # a GAN reads samples only: one label for all
    if hasattr(data, "__next__"):
        return list(data)   # a generator: read once here, so each build (diagnose builds twice) sees it all
    return data


def _overrides(task: str, parts: dict, data, amp: str, scaler: str, settings: dict, overrides) -> list[str]:
    """The command line this call stands for. `parts` maps the model's `_target_` keys (net,
    generator, critic, loss, optimizer, text) to what the caller gave; None keeps the task's own."""
    if task not in TASKS:
        raise AmpganError(f"api: task must be one of {', '.join(TASKS)}, got {task!r}")
    out = [f"model={task}", f"amp={amp.lower()}", f"scaler={scaler}"]
    if task in TRAINERS:
        out.append(f"trainer={TRAINERS[task]}")
    model = _compose("train", [f"model={task}"]).model
    for key, obj in parts.items():
        if obj is None:
            continue
        if key not in model:
            own = ", ".join(k for k in ("net", "generator", "critic", "loss", "text") if k in model)
            raise AmpganError(f"api: a {task} run has no {key}; it takes {own}, optimizer")
        if key == "text":
            if not (isinstance(obj, str) or callable(obj)):
                raise AmpganError(f"api: text must be a str or a function returning one, got {type(obj).__name__}")
            target = _provide("text", (lambda text=obj: text) if isinstance(obj, str) else obj)
        elif key == "optimizer":
            if not callable(obj):
                raise AmpganError("api: optimizer must be an optimizer class or a function of the parameters "
                                  f"(e.g. mindspore.mint.optim.SGD), got {type(obj).__name__}")
            target = _provide("optimizer", obj)
        elif key == "loss":
            import mindspore as ms

            target = _provide("loss", (lambda cell=obj: cell) if isinstance(obj, ms.nn.Cell) or not isinstance(obj, type) else obj)
        else:
            target = _builder(key, obj)
        out.append(f"model.{key}._target_={target}")
    if data is not None:
        if task == "lm":
            raise AmpganError("api: a language model reads text=, not data=")
        data = _samples(data, task)
        out += ["data=custom", f"data.source._target_={_provide('data', lambda arrays=data: arrays)}"]
    out += [f"{key}={value}" for key, value in settings.items() if value is not None]
    return out + list(overrides)


def _compose(config_name: str, overrides: list[str]) -> DictConfig:
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from ampgan.config.schema import CONF_DIR

    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return compose(config_name=config_name, overrides=overrides)
    except (HydraException, OmegaConfBaseException) as err:
        raise AmpganError(f"api: {str(err).splitlines()[0]}") from None


def _run_folder(kind: str) -> Path:
    from ampgan.config.schema import outputs_dir

    return outputs_dir() / kind / time.strftime("%Y-%m-%d") / f"api-{time.strftime('%H-%M-%S')}-{time.time_ns() % 10**6:06d}"


def train(net=None, data=None, *, task: str = "classifier", generator=None, critic=None, text=None, loss=None,
          optimizer=None, amp: str = "O2", scaler: str = "dynamic", steps: int | None = None,
          batch_size: int | None = None, seed: int | None = None, tracking_uri: str | None = None,
          experiment: str | None = None, overrides: tuple[str, ...] = ()) -> TrainResult:
    """Train `net` on `data` (or a GAN's `generator` and `critic`, a language model's `net` on
    `text`: see `task` above) with ampgan's loop; `overrides`: any further `key=value` of the config
    (`trainer.eval_every=50`, `amp.keep_fp32=[head]`, `tracking=none`, ...). Returns the task's
    objective (accuracy, swd, perplexity: the one its runs report), the MLflow run id and the run
    folder."""
    from ampgan.training.entry import train as train_cfg

    parts = dict(net=net, generator=generator, critic=critic, text=text, loss=loss, optimizer=optimizer)
    settings = {"trainer.max_steps": steps, "trainer.batch_size": batch_size, "trainer.seed": seed,
                "tracking.uri": tracking_uri, "tracking.experiment": experiment}
    cfg = _compose("train", _overrides(task, parts, data, amp, scaler, settings, overrides))
    folder = _run_folder("runs")
    objective = train_cfg(cfg, folder)
    from ampgan.tracking.tracker import RUN_RECORD

    record = folder / RUN_RECORD
    run_id = json.loads(record.read_text()).get("run_id") if record.exists() else None
    return TrainResult(objective, run_id, folder)


def diagnose(net=None, data=None, *, task: str = "classifier", generator=None, critic=None, text=None, loss=None,
             optimizer=None, amp: str | None = None, scaler: str | None = None, steps: int | None = None,
             batch_size: int | None = None, seed: int | None = None, tracking_uri: str | None = None,
             start=None, overrides: tuple[str, ...] = (), echo=print):
    """Replay the run beside its FP32 twin (`python -m ampgan.diagnose`): returns the verdict
    (`name`, `headline`, `evidence`, `layer`, `fixes`, `exit_code`), after printing the report
    (`echo`) and logging the diagnosis to MLflow as the command does. The run is described as for
    `train` (`task`, its parts, `steps`: the run's length, which the replay covers; `amp` "O2" and
    `scaler` "dynamic" unless given); `overrides` takes `diagnose.*` keys too (`diagnose.verify=true`).

    `start`: a flight recording (the folder `api.callback` wrote and printed when a `Model.train`
    run's loss went non-finite, or that run's folder). The replay then starts from its state (the
    net's weights, the optimizer's moments, the scaler's scale, as after its step) and trains on
    its recorded batches, in order, through the first bad step; `net`, `loss` and `optimizer` must
    build what the script trained (the same classes), and the AMP level, keep-list and scaler are
    the recorded ones unless given. `data`, when given, is only the evaluation's (and says how
    many classes there are); otherwise the recorded batches are evaluated on too."""
    from ampgan.diagnose.command import diagnose as diagnose_cfg

    parts = dict(net=net, generator=generator, critic=critic, text=text, loss=loss, optimizer=optimizer)
    settings = {"trainer.max_steps": steps, "trainer.batch_size": batch_size, "trainer.seed": seed,
                "tracking.uri": tracking_uri}
    recorded: list[str] = []
    if start is not None:
        data, recorded, amp, scaler = _recorded(start, data, task, amp, scaler, settings)
    cfg = _compose("diagnose_main", _overrides(task, parts, data, amp or "O2", scaler or "dynamic", settings,
                                               (*recorded, *overrides)))
    return diagnose_cfg(cfg, _run_folder("diagnose"), echo=echo).verdict


def _value(v) -> str:
    """A recorded setting as a command-line value."""
    return "null" if v is None else str(v).lower() if isinstance(v, bool) else str(v)


def _recorded(start, data, task: str, amp, scaler, settings: dict):
    """What a flight recording fixes of the run: its batches as the training split (in order), its
    batch size, a length through its first bad step, and (unless given) its AMP level, keep-list
    and scaler. Returns (data, overrides, amp, scaler)."""
    import numpy as np

    from ampgan.data.custom import arrays_of
    from ampgan.tracking.recorder import read

    if task != "classifier":
        raise AmpganError(f"api: start= replays a Model.train classifier's recording; task={task!r} has none")
    rec = read(start)
    inputs = rec.batches()
    if len(inputs) != 2:
        raise AmpganError(f"start={start}: its step took {len(inputs)} inputs; diagnose replays (data, label) batches")
    x, y = (a.reshape(-1, *a.shape[2:]) for a in inputs)
    test = arrays_of(data, "api: data") if data is not None else {"x_train": x, "y_train": y}
    x_test, y_test = test.get("x_test", test["x_train"]), test.get("y_test", test["y_train"])
    out = [f"diagnose.start={rec.folder}"]
    if amp is None:
        amp = rec.amp
        out += [f"amp.keep_fp32=[{','.join(rec.keep_fp32)}]"] if rec.keep_fp32 else []
    if scaler is None:
        scaler = rec.scaler.get("name", "dynamic")
        out += [f"scaler.{k}={_value(v)}" for k, v in rec.scaler.items() if k != "name"]
    settings["trainer.batch_size"] = settings["trainer.batch_size"] or rec.batch_size
    settings["trainer.max_steps"] = settings["trainer.max_steps"] or rec.first_bad_step + 10
    arrays = (np.asarray(x, np.float32), np.asarray(y).astype(np.int32), x_test, y_test)
    return arrays, out, amp, scaler


def loss_scaler(scaler: str, **settings):
    """ampgan's loss scaler `scaler` (none, static, dynamic, underflow_aware, fixed_clip: the options
    of conf/scaler/) with `settings` (its keys, e.g. `init_scale`, `factor`, `window`) in the shape of
    `mindspore.amp.LossScaler`, for your own functional `value_and_grad` loop, inside `@ms.jit`:

        loss_scaler = api.loss_scaler("underflow_aware", init_scale=2**16, factor=2, window=50)
        ...  grads = loss_scaler.unscale(grads)     # underflow_aware: measures their health first
             finite = amp.all_finite(grads)
             loss_scaler.adjust(finite)             # or adjust(finite, grads): health of these grads
             if finite: optimizer(grads)

    `adjust` returns whether to apply the update; `scale_value` is the current scale (a
    Parameter). `prefix=` names its state Parameters (two scalers in one graph).
    A bad name, key or value raises `ampgan.AmpganError` with one line. See docs/own-script.md."""
    from ampgan.amp.user_scalers import loss_scaler as build

    return build(scaler, **settings)


def loss_scale_manager(scaler: str, **settings):
    """ampgan's loss scaler `scaler` (none, static or dynamic) with `settings` as a
    `mindspore.amp.LossScaleManager`, for `Model(..., loss_scale_manager=...)` or
    `amp.build_train_network` on GPU and Ascend. `dynamic` decides as MindSpore's
    `DynamicLossScaleManager` does, step for step. On CPU, MindSpore runs no loss-scale cell: a
    manager that drops overflowing steps raises `ampgan.AmpganError` when `Model` is built, naming
    `api.train_step(...)` to use instead. See docs/own-script.md."""
    from ampgan.amp.user_scalers import loss_scale_manager as build

    return build(scaler, **settings)


def train_step(net_with_loss, optimizer, amp: str = "O2", scaler: str = "dynamic", **settings):
    """ampgan's compiled train step as a `mindspore.nn.Cell`, for your own `Model.train` script:

        step_cell = api.train_step(nn.WithLossCell(net, loss_fn), optimizer, amp="O2", scaler="dynamic")
        Model(step_cell).train(epochs, dataset, callbacks=[api.callback()], dataset_sink_mode=False)

    It applies the AMP level (O0..O3) and `keep_fp32=[...]` (cell types or paths of the net, as
    `amp.keep_fp32`) to the net itself; a `nn.WithLossCell`'s loss is computed in FP32. `scaler` is
    a name of conf/scaler/ and `settings` its keys (`init_scale`, `factor`, `window`, ...).
    Dynamic scaling works on CPU too. It returns `(loss, overflow, loss_scale)` as
    `nn.TrainOneStepWithLossScaleCell` does; a skipped (non-finite) step leaves the optimizer
    (and its `global_step`, so a learning-rate schedule) untouched. Further settings:
    `health` (True: gradient-health reductions in the measuring variant of the step),
    `headroom` (True, with `health`: each leaf cell's max |output| there too, so `api.callback`
    logs train/act_max_abs and float16's train/headroom), `measure_every` (None: with no `api.callback` to read them, no step measures; N: the first and every N-th), `jit` (True).
    Bad input raises `ampgan.AmpganError` with one line. See docs/own-script.md."""
    from ampgan.amp.user_scalers import scaler_config
    from ampgan.steps.user_step import build_train_step

    own = {k: settings.pop(k) for k in ("keep_fp32", "health", "measure_every", "jit", "headroom") if k in settings}
    cfg = scaler_config(scaler, settings, "api.train_step")
    return build_train_step(net_with_loss, optimizer, cfg, amp, **own)


def callback(experiment: str | None = None, tracking_uri: str | None = None, **settings):
    """A `mindspore.train.Callback` that makes a `Model.train` run an ampgan MLflow run: the store
    `python -m ampgan.train` uses from this folder (outputs/mlflow.db) unless `tracking_uri`, its
    tags and metric names (train/loss, train/scale, train/skipped, gradient health), the config
    it can see (net, size, amp level, optimizer, learning rate, scaler). Statuses are read every
    `log_every` steps (10) and the first; no other step waits for the device. The run ends
    FINISHED with training, FAILED if training raises. Model's network must be
    `api.train_step(...)` (or MindSpore's TrainOneStepWithLossScaleCell): a plain TrainOneStepCell
    returns no status and is one `ampgan.AmpganError` line. Settings: `log_every`, `run_name`, `record`
    (True: the flight recorder, which saves the state before the first non-finite loss, and
    before the first log step whose float16 headroom is under `headroom_warn`, 8), `flush_every`.
    `.run_id`, `.recording` and `.headroom_recording` after training. See docs/own-script.md."""
    from ampgan.tasks.base import NetState
    from ampgan.tracking.callback import AmpganCallback

    def reader(step, float16: bool):
        return NetState("train", step, float16=float16)   # the trainer's own metrics from the same statuses

    return AmpganCallback(experiment, tracking_uri, status_reader=reader, **settings)


def monitor(experiment: str | None = None, tracking_uri: str | None = None, **settings):
    """The callback's twin for a functional `value_and_grad` loop, a context manager:

        with api.monitor(net=net, optimizer=optimizer, loss=loss_fn, amp="O2") as monitor:
            for x, y in batches:
                loss, finite, grads = train_step(x, y)
                monitor.step(loss, finite, loss_scaler, grads, batch=(x, y))   # grads, batch optional

    The same store, tags and metrics as `api.callback`, read every `log_every` steps (10). The run
    ends FINISHED when the block ends, FAILED (the error recorded) when it raises. With `net`,
    `optimizer` and each step's `batch`, its flight recorder saves the state before the first
    non-finite loss and prints the `api.diagnose(..., start=...)` call (`record=False`: off).
    Under `amp` O1-O3 it watches `net`'s leaf-cell outputs for the block (`headroom=False`: off),
    logs train/headroom and records the state before the first headroom under `headroom_warn` (8)."""
    from ampgan.tracking.callback import Monitor

    return Monitor(experiment, tracking_uri, **settings)
