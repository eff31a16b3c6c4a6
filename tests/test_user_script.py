"""ampgan inside the user's own script: `api.train_step` + `api.callback` under MindSpore's own
`Model.train`, and `api.monitor` around a functional loop (issue 43, items 1, 3 and 4)."""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn
from mindspore.train import Callback, LossMonitor, Model

from ampgan import AmpganError, api
from tests.conftest import all_runs, functional_step, store_uri


def digits(n: int, size: int = 8, batch: int = 32, bad: tuple[int, ...] = (), only: tuple[int, ...] | None = None):
    """The 8x8 digits as the user's own `mindspore.dataset` pipeline (NCHW float32, int32 labels);
    the batches numbered in `bad` hold an inf pixel (a planted non-finite step); `only`: just these batches."""
    import mindspore.dataset as ds
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.images[:n] / 16.0).astype(np.float32)[:, None]
    x = np.repeat(np.repeat(x, size // 8, 2), size // 8, 3)
    for b in bad:
        x[b * batch, 0, 0, 0] = np.inf
    y = d.target[:n].astype(np.int32)
    if only is not None:
        rows = np.concatenate([np.arange(b * batch, (b + 1) * batch) for b in only])
        x, y = x[rows], y[rows]
    return ds.NumpySlicesDataset({"image": x, "label": y}, shuffle=False).batch(batch)


class Recorder(Callback):
    """The user's own callback: it reads net_outputs as from TrainOneStepWithLossScaleCell."""

    def __init__(self):
        self.rows = []

    def on_train_step_end(self, run_context):
        loss, overflow, scale = run_context.original_args().net_outputs
        self.rows.append((float(loss.asnumpy()), bool(overflow.asnumpy()), float(scale.asnumpy())))


class SmallNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.body = nn.SequentialCell([nn.Flatten(), nn.Dense(64, 32), nn.ReLU(), nn.Dense(32, 10)])

    def construct(self, x):
        return self.body(x)


def run_of(outputs, run_id):
    client, runs = all_runs(outputs)
    (run,) = [r for r in runs if r.info.run_id == run_id]
    return client, run


def test_mindcv_model_trains_under_model_train_with_ampgan_cell_and_callback(outputs):
    mindcv = pytest.importorskip("mindcv")
    ms.set_seed(0)
    net = mindcv.create_model("mobilenet_v1_025", pretrained=False, num_classes=10, in_channels=1)
    optimizer = nn.Adam(net.trainable_params(), learning_rate=0.01)
    step_cell = api.train_step(nn.WithLossCell(net, nn.CrossEntropyLoss()), optimizer, amp="O2", scaler="dynamic",
                               window=20)
    cb, rec = api.callback(log_every=5), Recorder()
    Model(step_cell).train(3, digits(256, size=16), callbacks=[cb, rec, LossMonitor(8)], dataset_sink_mode=False)

    losses = [r[0] for r in rec.rows if not r[1]]
    assert len(rec.rows) == 24 and np.mean(losses[-4:]) < np.mean(losses[:4]) - 0.1, rec.rows
    client, run = run_of(outputs, cb.run_id)     # the default store: outputs/mlflow.db
    assert run.info.status == "FINISHED"
    assert {"amp": "O2", "scaler": "dynamic", "ampgan.source": "callback"}.items() <= run.data.tags.items()
    assert run.data.params["model.net._target_"].endswith("MobileNetV1")
    assert run.data.params["scaler.window"] == "20" and run.data.params["model.lr"] == "0.01"
    for key in ("train/loss", "train/scale", "train/skipped", "train/underflow", "train/max_abs_scaled_grad",
                "train/act_max_abs", "train/headroom"):
        assert key in run.data.metrics, key
    steps = [m.step for m in client.get_metric_history(cb.run_id, "train/loss")]
    assert steps == [1, 5, 8, 10, 15, 16, 20, 24]          # the log cadence and the epoch ends
    assert run.data.metrics["train/skipped"] == sum(r[1] for r in rec.rows)
    assert run.data.metrics["train/scale"] == rec.rows[-1][2]


def _train(bad: tuple[int, ...] = (), only: tuple[int, ...] | None = None):
    ms.set_seed(1)
    net = SmallNet()
    optimizer = nn.SGD(net.trainable_params(), learning_rate=[0.5, 0.2, 0.1, 0.05, 0.02, 0.01])  # a schedule
    cell = api.train_step(nn.WithLossCell(net, nn.CrossEntropyLoss()), optimizer, amp="O2", scaler="dynamic",
                          health=False)
    rec = Recorder()
    Model(cell).train(1, digits(32 * 5, bad=bad, only=only), callbacks=[rec], dataset_sink_mode=False)
    return net, optimizer, rec


def test_a_skipped_step_does_not_advance_the_optimizer_or_its_schedule():
    net, optimizer, rec = _train(bad=(1, 3))      # batches 1 and 3 hold an inf: skipped
    assert [r[1] for r in rec.rows] == [False, True, False, True, False]
    assert [r[2] for r in rec.rows] == [2.0**16, 2.0**16, 2.0**15, 2.0**15, 2.0**14]   # the scale each step used
    assert int(optimizer.global_step.asnumpy()[0]) == 3                 # applied updates only
    # the three good batches alone: the same learning rates, so the same weights
    twin, twin_opt, _ = _train(only=(0, 2, 4))
    assert int(twin_opt.global_step.asnumpy()[0]) == 3
    for p, q in zip(net.trainable_params(), twin.trainable_params()):
        np.testing.assert_allclose(p.asnumpy(), q.asnumpy(), rtol=1e-3, atol=1e-6)


class MeasuredSteps(Callback):
    """The user's own callback: which steps the cell ran in its measuring variant."""

    def __init__(self, cell):
        self.cell, self.measured = cell, []

    def on_train_step_end(self, run_context):
        self.measured.append(self.cell.last_measured)


@pytest.mark.parametrize("settings, expected", [
    ({}, [False] * 5),                                       # nothing reads health: no step measures
    ({"measure_every": 2}, [True, True, False, True, False]),  # the first and every 2nd
])
def test_without_api_callback_the_cell_measures_only_when_told(settings, expected):
    ms.set_seed(1)
    net = SmallNet()
    cell = api.train_step(nn.WithLossCell(net, nn.CrossEntropyLoss()), nn.SGD(net.trainable_params(), 0.1),
                          amp="O2", scaler="static", **settings)
    seen = MeasuredSteps(cell)
    Model(cell).train(1, digits(32 * 5), callbacks=[seen], dataset_sink_mode=False)
    assert seen.measured == expected
    for bad in (0, 1.5, True, "10"):
        with pytest.raises(AmpganError, match="measure_every must be a whole number >= 1 or None"):
            api.train_step(nn.WithLossCell(net, nn.CrossEntropyLoss()), nn.SGD(net.trainable_params(), 0.1),
                           measure_every=bad)


class CountingStatus:
    """A test double for a step's packed status: it counts the reads cut out of it."""

    def __init__(self, packed):
        self.packed, self.reads = packed, []

    def __getitem__(self, i):
        self.reads.append(i)
        return self.packed[i]


def test_the_step_cells_outputs_are_a_tuple_of_three_read_only_when_asked():
    from ampgan.steps.common import FINITE, SCALE
    from ampgan.steps.user_step import StepOutputs

    ms.set_seed(1)
    net = SmallNet()
    cell = api.train_step(nn.WithLossCell(net, nn.CrossEntropyLoss()), nn.SGD(net.trainable_params(), 0.1),
                          amp="O2", scaler="dynamic", health=False)
    x = ms.Tensor(np.ones((4, 1, 8, 8), np.float32))
    out = cell(x, ms.Tensor(np.arange(4, dtype=np.int32)))
    loss, overflow, scale = out                          # as from TrainOneStepWithLossScaleCell
    assert isinstance(out, tuple) and len(out) == 3 and len(list(out)) == 3
    assert np.isfinite(float(loss.asnumpy())) and not bool(overflow.asnumpy()) and float(scale.asnumpy()) == 2.0**16
    assert out[-1] is scale and out[0] is loss and out[:2] == (loss, overflow) and overflow in out
    assert str(float(loss.asnumpy()))[:5] in repr(out)

    status = CountingStatus(np.array([1.5, 1.0, 1.0, 8.0, 0.0, 0.0]))   # loss, then STATUS_FIELDS
    lazy = StepOutputs(status, 1)
    assert status.reads == []                            # nothing is cut out until it is read
    assert lazy[2] == 8.0 and lazy[2] == 8.0 and status.reads == [1 + SCALE]   # once
    assert bool(lazy[1]) is False and status.reads == [1 + SCALE, 1 + FINITE]
    with pytest.raises(IndexError):
        lazy[3]


# ---------------------------------------------------------------- functional loop + monitor
def _functional(steps: int, monitor, fail_at: int | None = None):
    from sklearn.datasets import load_digits

    d = load_digits()
    x = ms.Tensor((d.images / 16.0).astype(np.float32).reshape(-1, 64))
    y = ms.Tensor(d.target.astype(np.int32))
    ms.set_seed(2)
    net = SmallNet()
    optimizer = nn.Adam(net.trainable_params(), learning_rate=0.01)
    loss_scaler = api.loss_scaler("dynamic", init_scale=2.0**10, window=50)
    train_step = functional_step(net, nn.CrossEntropyLoss(), optimizer, loss_scaler)
    for i in range(steps):
        if i == fail_at:
            raise RuntimeError("the user's loop broke")
        sl = slice(32 * i, 32 * (i + 1))
        loss, finite, grads = train_step(x[sl], y[sl])
        monitor.step(loss, finite, loss_scaler, grads)


def test_monitor_logs_a_functional_loop_and_ends_finished_or_failed(outputs):
    uri = store_uri(outputs)
    with api.monitor(tracking_uri=uri, experiment="script", log_every=5, amp="O0") as mon:
        _functional(12, mon)
    client, run = run_of(outputs, mon.run_id)
    assert run.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(mon.run_id, "train/loss")] == [1, 5, 10, 12]
    assert run.data.metrics["train/scale"] == 2.0**10 and run.data.metrics["train/skipped"] == 0
    assert "train/underflow" in run.data.metrics and run.data.tags["ampgan.source"] == "monitor"
    assert run.data.metrics["train/steps"] == 12 and run.data.metrics["train/skipped_total"] == 0   # the run's totals

    with pytest.raises(RuntimeError, match="broke"):
        with api.monitor(tracking_uri=uri, experiment="script", log_every=5) as failing:
            _functional(12, failing, fail_at=3)
    _, run = run_of(outputs, failing.run_id)
    assert run.info.status == "FAILED" and "the user's loop broke" in run.data.tags["error"]
    assert run.data.metrics["train/loss"] > 0   # the pending steps were still logged


# ---------------------------------------------------------------- bad use
def test_bad_use_is_one_clear_error_and_no_run_is_left_running(outputs):
    net = SmallNet()
    opt = nn.SGD(net.trainable_params(), learning_rate=0.1)
    with pytest.raises(AmpganError, match="returns the loss only.*api.train_step") as err:
        Model(net, nn.CrossEntropyLoss(), opt).train(1, digits(64), callbacks=[api.callback()], dataset_sink_mode=False)
    assert "\n" not in str(err.value)
    with pytest.raises(AmpganError, match="unknown scaler 'dynamc'.*did you mean"):
        api.train_step(nn.WithLossCell(net, nn.CrossEntropyLoss()), opt, scaler="dynamc")
    with pytest.raises(AmpganError, match="amp must be one of"):
        api.train_step(nn.WithLossCell(net, nn.CrossEntropyLoss()), opt, amp="O4")
    with pytest.raises(AmpganError, match="has no setting 'windw'"):
        api.train_step(nn.WithLossCell(net, nn.CrossEntropyLoss()), opt, windw=5)
    with pytest.raises(AmpganError, match="keep_fp32.*'bdy.1' matches no cell.*'body.1'"):
        api.train_step(nn.WithLossCell(net, nn.CrossEntropyLoss()), opt, keep_fp32=["bdy.1"])
    with pytest.raises(AmpganError, match="no setting 'log_evry'"):
        api.callback(log_evry=5)
    with pytest.raises(AmpganError, match="outside its"):
        api.monitor().step(1.0, True, None)

    class Boom(Callback):
        def on_train_step_end(self, run_context):
            raise ValueError("the user's callback broke")

    cb = api.callback()
    cell = api.train_step(nn.WithLossCell(net, nn.CrossEntropyLoss()), opt, amp="O0", health=False)
    with pytest.raises(ValueError, match="broke"):
        Model(cell).train(1, digits(64), callbacks=[cb, Boom()], dataset_sink_mode=False)
    _, runs = all_runs(outputs)
    assert [r.info.status for r in runs] == ["FAILED"]   # the failed training's run; none RUNNING
    assert "ValueError: the user's callback broke" in runs[0].data.tags["error"]


# ---------------------------------------------------------------- the same run, two ways
TRAJECTORY = ["model=classifier", "data=digits", "data.image_size=16", "model.net._target_=mindcv.create_model",
              "+model.net.model_name=mobilenet_v1_025", "amp=o2", "scaler=dynamic", "trainer.max_steps=20",
              "trainer.batch_size=32", "trainer.log_every=1", "trainer.eval_every=0", "trainer.layer_health_every=0",
              "trainer.seed=0"]


@pytest.mark.slow   # 142 s: two trainings of the mindcv net; `make test` keeps the other mindcv Model.train test
def test_a_mindcv_model_under_model_train_follows_ampgans_own_trainer_step_for_step(outputs, tmp_path):
    """The same mindcv net, seed, batches, optimizer, O2 and dynamic scale: its losses under
    `Model.train` with ampgan's cell and callback track `python -m ampgan.train`'s within float16's
    tolerance, step for step."""
    import mindcv
    import mindspore.dataset as ds
    from mindspore import mint

    from ampgan.config.schema import validate
    from ampgan.data import Batches, build_dataset
    from ampgan.training.entry import train
    from tests.conftest import compose_cfg

    cfg = compose_cfg(*TRAJECTORY)
    s = validate(cfg)
    train(cfg, run_dir=tmp_path / "trainer")
    client, runs = all_runs(outputs)
    (trainer_run,) = runs
    trainer_losses = [m.value for m in sorted(client.get_metric_history(trainer_run.info.run_id, "train/loss"),
                                              key=lambda m: m.step)]

    data = build_dataset(s.data)
    batches = Batches(data.x_train, data.y_train, s.trainer.batch_size, s.trainer.seed)   # the trainer's own order
    drawn = [batches.next() for _ in range(s.trainer.max_steps)]
    x, y = np.concatenate([b[0] for b in drawn]), np.concatenate([b[1] for b in drawn])
    dataset = ds.NumpySlicesDataset({"image": x, "label": y}, shuffle=False).batch(s.trainer.batch_size)

    ms.set_seed(s.trainer.seed)
    net = mindcv.create_model("mobilenet_v1_025", pretrained=False, num_classes=10, in_channels=1)
    optimizer = mint.optim.Adam(net.trainable_params(), lr=s.model.lr, betas=tuple(s.model.betas))
    step_cell = api.train_step(nn.WithLossCell(net, nn.CrossEntropyLoss()), optimizer, amp="O2", scaler="dynamic")
    rec = Recorder()
    callback = api.callback(log_every=1)
    Model(step_cell).train(1, dataset, callbacks=[callback, rec], dataset_sink_mode=False)

    script_losses = [r[0] for r in rec.rows]
    assert len(script_losses) == len(trainer_losses) == 20
    np.testing.assert_allclose(script_losses, trainer_losses, rtol=2e-2, atol=1e-3)   # float16's tolerance
    assert np.mean(script_losses[-5:]) < np.mean(script_losses[:5])                    # and it learns
    _, runs = all_runs(outputs)
    (script_run,) = [r for r in runs if r.info.run_id == callback.run_id]
    assert script_run.data.metrics["train/loss"] == pytest.approx(script_losses[-1], rel=1e-6)
    trainer_metrics = {k for k in trainer_run.data.metrics if k.startswith("train/")}
    # the trainer's metric names, all but its classifier's own accuracy (the user's loss cell gives the loss
    # only) and its early stop (Model.train does not stop a run whose losses stay non-finite)
    assert trainer_metrics - set(script_run.data.metrics) == {"train/acc", "train/diverged"}
    assert script_run.data.metrics["train/steps"] == 20 and script_run.data.metrics["train/skipped_total"] == sum(
        r[1] for r in rec.rows)
