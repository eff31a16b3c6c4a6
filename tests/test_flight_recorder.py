"""The flight recorder (issue 43, item 5): a user's `Model.train` script whose loss goes
non-finite leaves its last good state and the batches since; the printed call diagnoses it from
there, beside an FP32 twin, on the same batches, and names the user's op and line."""

from __future__ import annotations

import json

import mindspore as ms
import mindspore.dataset as mds
import numpy as np
import pytest
from mindspore import nn
from mindspore.train import Model

from ampgan import NEXT_COMMAND_TAG, WARNING_TAG, AmpganError, api
from ampgan.amp.activations import PEAK_PREFIX, Recording
from ampgan_corpus.users.annealed_sharpening import AnnealedNet
from tests.conftest import all_runs, functional_step

GROWTH = 1.3   # the sharpening grows 30% a step: float16's logits pass 65504 after ~30 steps


def blobs(n: int = 960, seed: int = 0):
    """Three classes of 8x8 one-channel images, separable: the net learns them in a few steps."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n).astype(np.int32)
    x = (rng.normal(size=(n, 1, 8, 8)) * 0.3 + y[:, None, None, None]).astype(np.float32)
    return x, y


def sharpened(in_channels: int, image_size: int, num_classes: int):
    return AnnealedNet(in_channels, image_size, num_classes, growth=GROWTH)


def adam(params):
    return nn.Adam(params, learning_rate=1e-3)


def train_until_it_fails(outputs, capsys, steps: int = 60, loss=None):
    """The user's script: their net, loss, optimizer and dataset; ampgan's cell and callback."""
    ms.set_seed(0)
    x, y = blobs()
    net = sharpened(1, 8, 3)
    loss = loss if loss is not None else nn.CrossEntropyLoss()
    step_cell = api.train_step(nn.WithLossCell(net, loss), adam(net.trainable_params()), amp="O2", scaler="dynamic")
    callback = api.callback(log_every=5)
    dataset = mds.NumpySlicesDataset({"image": x, "label": y}, shuffle=False).batch(16).take(steps)
    Model(step_cell).train(1, dataset, callbacks=[callback], dataset_sink_mode=False)
    return callback, capsys.readouterr().err


def test_a_non_finite_loss_leaves_the_state_before_it_and_the_call_that_diagnoses_it(outputs, capsys):
    callback, err = train_until_it_fails(outputs, capsys)
    folder = callback.recording
    assert folder is not None and (folder / "recording.json").exists() and (folder / "state.ckpt").exists()
    rec = json.loads((folder / "recording.json").read_text())
    first_bad, kept = rec["first_bad_step"], rec["step"]
    # the kept state is the last log step (every 5) before the first bad one, and the window reaches it
    assert 10 < first_bad < 60 and kept % 5 == 0 and kept < first_bad <= kept + 5
    assert rec["steps_recorded"] == first_bad - kept and rec["amp"] == "O2" and rec["scaler"]["name"] == "dynamic"
    with np.load(folder / "batches.npz") as b:
        assert b["input_0"].shape == (first_bad - kept, 16, 1, 8, 8) and b["input_1"].shape == (first_bad - kept, 16)
        x, _ = blobs()
        np.testing.assert_array_equal(b["input_0"][0], x[kept * 16:(kept + 1) * 16])   # the very batches, in order
    line = [ln for ln in err.splitlines() if ln.startswith("ampgan: step") and "the loss is not finite" in ln]
    assert len(line) == 1 and f"step {first_bad}: the loss is not finite" in line[0]
    assert "ampgan.api.diagnose(AnnealedNet, loss=CrossEntropyLoss(...), optimizer=lambda params: Adam(" in line[0]
    assert f'start="{folder}"' in line[0]
    _, runs = all_runs(outputs)
    (run,) = runs
    assert run.info.status == "FINISHED"   # training went on (its steps skipped); the run ended as it does
    assert run.data.tags["ampgan.first_bad_step"] == str(first_bad) and run.data.tags["ampgan.recording"] == str(folder)

    # the call the line prints: the user's net, loss and optimizer, the recording; their data for evaluation
    verdict = api.diagnose(sharpened, data=blobs(), loss=nn.CrossEntropyLoss(), optimizer=adam, start=folder,
                           overrides=("diagnose.mode=synced",), echo=lambda *a, **k: None)
    assert verdict.name == "overflow" and verdict.exit_code == 1 and verdict.layer == "sharpen"
    assert "first bad value: step" in " ".join(verdict.evidence) and "output of cell sharpen" in " ".join(verdict.evidence)
    # each printed fix was replayed and removed the failure: under O2 a kept cell's output is cast back to
    # float16 (still above 65504), so the one that works keeps it FP32 under O1
    assert [f.text for f in verdict.fixes] == ["amp=o1 amp.keep_fp32=[sharpen]"]
    _, runs = all_runs(outputs)
    (diagnosis,) = [r for r in runs if r.data.tags.get("ampgan.kind") == "diagnose"]
    assert diagnosis.data.tags["ampgan.recording"] == str(folder) and diagnosis.data.tags["ampgan.start_step"] == str(kept)


class OtherNet(nn.Cell):
    def __init__(self, in_channels: int, image_size: int, num_classes: int):
        super().__init__()
        self.fc = nn.Dense(in_channels * image_size * image_size, num_classes)

    def construct(self, x):
        return self.fc(x.reshape(x.shape[0], -1))


def test_a_recording_given_another_net_or_no_recording_is_one_line(outputs, capsys, tmp_path):
    callback, _ = train_until_it_fails(outputs, capsys)
    loss = nn.CrossEntropyLoss()
    with pytest.raises(AmpganError) as err:
        api.diagnose(OtherNet, data=blobs(), loss=loss, optimizer=adam, start=callback.recording, echo=lambda *a, **k: None)
    assert "the recording does not fit this net" in str(err.value) and "AnnealedNet" in str(err.value)
    assert "\n" not in str(err.value) and len(str(err.value)) <= 400
    with pytest.raises(AmpganError) as err:
        api.diagnose(sharpened, loss=loss, optimizer=adam, start=tmp_path, echo=lambda *a, **k: None)
    assert "no flight recording there" in str(err.value)


def test_a_run_that_stays_finite_records_nothing(outputs, capsys):
    callback, err = train_until_it_fails(outputs, capsys, steps=8)   # the sharpening is still small
    assert callback.recording is None and "ampgan: step" not in err
    _, runs = all_runs(outputs)
    assert "ampgan.first_bad_step" not in runs[0].data.tags


def test_a_loss_that_fails_in_fp32_too_is_not_blamed_on_float16(outputs, capsys):
    """MindSpore's `SoftmaxCrossEntropyWithLogits(sparse=True)` is inf in FP32 on CPU once a wrong
    class's logit leads the true one by ~90 (measured: logits [100, 0, 0] with label 1 give inf;
    `CrossEntropyLoss` gives 100). With it, the sharpened logits fail in FP32 at the very step
    float16 does: the recording's replay says not_amp, and prints no fix."""
    softmax_ce = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    callback, _ = train_until_it_fails(outputs, capsys, loss=softmax_ce)
    verdict = api.diagnose(sharpened, data=blobs(), loss=softmax_ce, optimizer=adam, start=callback.recording,
                           overrides=("diagnose.mode=synced",), echo=lambda *a, **k: None)
    assert verdict.name == "not_amp" and verdict.exit_code == 3 and not verdict.fixes


def headroom_history(client, run_id: str) -> dict[int, float]:
    return {m.step: m.value for m in client.get_metric_history(run_id, "train/headroom")}


@pytest.mark.slow  # `make test-full` (CI's 30 minutes on a slow machine)
def test_a_headroom_warning_records_the_state_before_it_while_every_loss_is_still_finite(outputs, capsys):
    """Item 5's other trigger: the sharpening's output nears 65504 log steps before the loss goes
    non-finite. At the first log step whose train/headroom (65504 / the largest leaf-cell output,
    measured in ampgan's cell) is under `headroom_warn` (8), the recorder saves the state of the log
    step before it and the block's batches, tags the run as the trainer's loop tags a warning, and
    prints the diagnose call; it goes on, and the non-finite loss later leaves its own recording.
    The replay from the warning's state reaches the overflow ahead and confirms a fix."""
    callback, err = train_until_it_fails(outputs, capsys)
    warned, failed = callback.headroom_recording, callback.recording
    assert warned is not None and failed is not None
    assert warned.name == "headroom-recording" and warned.parent == failed.parent
    w = json.loads((warned / "recording.json").read_text())
    at = w["first_bad_step"]
    assert at % 5 == 0 and w["step"] == at - 5 and w["steps_recorded"] == 5
    assert at < json.loads((failed / "recording.json").read_text())["first_bad_step"]
    assert w["failure"].startswith(f"step {at}: train/headroom ") and "< headroom_warn=8" in w["failure"]
    client, runs = all_runs(outputs)
    (run,) = runs
    history = headroom_history(client, run.info.run_id)
    assert history[at] < 8 <= min(v for step, v in history.items() if step < at)   # the first log step under it
    assert run.data.tags[WARNING_TAG].startswith(f"step {at}: train/headroom ")
    call = run.data.tags[NEXT_COMMAND_TAG]
    assert call.startswith("ampgan.api.diagnose(AnnealedNet") and call.endswith(f'start="{warned}")')
    assert run.data.tags["ampgan.headroom_recording"] == str(warned)
    lines = [ln for ln in err.splitlines() if ln.startswith("ampgan: step")]
    assert len(lines) == 2 and lines[0].startswith(f"ampgan: step {at}: train/headroom ") and call in lines[0]

    verdict = api.diagnose(sharpened, data=blobs(), loss=nn.CrossEntropyLoss(), optimizer=adam, start=warned,
                           overrides=("diagnose.mode=synced",), echo=lambda *a, **k: None)
    # before the forward overflow at `sharpen`, the gradient of `head` overflows float16 at any loss scale
    assert verdict.name == "overflow" and verdict.layer == "head"
    assert verdict.fixes and verdict.fixes[0].text == "amp=o1 amp.keep_fp32=[head]"


# ---------------------------------------------------------------- the monitor's recorder: a functional loop
def float16_growth(steps: int) -> np.float32:
    """The sharpening after `steps` steps when each `factor * growth` is computed in float16."""
    factor = np.float32(1.0)
    for _ in range(steps):
        factor = np.float32(np.float16(factor) * np.float16(GROWTH))
    return factor


def functional_until_it_fails(steps: int = 60, **settings):
    """The user's functional loop: their net under MindSpore's own O2, their loss and optimizer,
    ampgan's dynamic loss scaler, `api.monitor` told the net, optimizer and each step's batch."""
    from mindspore import amp as ms_amp

    ms.set_seed(0)
    x, y = blobs()
    net = ms_amp.auto_mixed_precision(sharpened(1, 8, 3), "O2")
    net.set_train()
    loss_fn = nn.CrossEntropyLoss()
    optimizer = adam(net.trainable_params())
    scaler = api.loss_scaler("dynamic")
    train_step = functional_step(net, loss_fn, optimizer, scaler)

    with api.monitor(log_every=5, net=net, optimizer=optimizer, loss=loss_fn, amp="O2", **settings) as monitor:
        for i in range(steps):
            xb, yb = ms.Tensor(x[16 * i:16 * (i + 1)]), ms.Tensor(y[16 * i:16 * (i + 1)])
            loss, finite, _ = train_step(xb, yb)
            monitor.step(loss, finite, scaler, batch=(xb, yb))
    return monitor


def test_a_functional_loops_monitor_records_the_state_before_its_first_non_finite_loss(outputs, capsys):
    monitor = functional_until_it_fails()
    folder = monitor.recording
    assert folder is not None and (folder / "state.ckpt").exists()
    rec = json.loads((folder / "recording.json").read_text())
    first_bad, kept = rec["first_bad_step"], rec["step"]
    assert 10 < first_bad < 60 and kept % 5 == 0 and kept < first_bad <= kept + 5
    assert rec["amp"] == "O2" and rec["scaler"]["name"] == "dynamic" and rec["net"].endswith("AnnealedNet")
    state = ms.load_checkpoint(str(folder / "state.ckpt"))
    assert {"scaler/scale_value", "scaler/counter"} <= set(state) and any(k.startswith("optimizer/") for k in state)
    # as of the kept step; MindSpore's O2 rewrites the user's `factor * growth` into float16 too
    assert state["net/sharpen.factor"].asnumpy() == float16_growth(kept)
    line = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("ampgan: step") and "not finite" in ln]
    assert len(line) == 1 and f'start="{folder}"' in line[0] and "ampgan.api.diagnose(AnnealedNet" in line[0]
    _, runs = all_runs(outputs)
    (run,) = runs
    assert run.data.tags["ampgan.recording"] == str(folder) and run.data.tags["ampgan.first_bad_step"] == str(first_bad)

    verdict = api.diagnose(sharpened, data=blobs(), loss=nn.CrossEntropyLoss(), optimizer=adam, start=folder,
                           overrides=("diagnose.mode=synced",), echo=lambda *a, **k: None)
    assert verdict.name == "overflow" and verdict.layer == "sharpen"
    assert [f.text for f in verdict.fixes] == ["amp=o1 amp.keep_fp32=[sharpen]"]


def test_a_monitor_without_batches_or_with_record_off_records_nothing_and_a_missing_batch_is_one_line(outputs, capsys):
    monitor = functional_until_it_fails(record=False)
    assert monitor.recording is None and "ampgan: step" not in capsys.readouterr().err
    with pytest.raises(AmpganError) as err:
        with api.monitor(net=nn.Dense(2, 2), optimizer=adam(nn.Dense(2, 2).trainable_params())) as mon:
            scaler = api.loss_scaler("static")
            mon.step(ms.Tensor(1.0), ms.Tensor(True), scaler, batch=(ms.Tensor(np.ones((2, 2), np.float32)),))
            mon.step(ms.Tensor(1.0), ms.Tensor(True), scaler)
    assert "was given at step 1 but not at step 2" in str(err.value) and "\n" not in str(err.value)


def test_a_functional_loops_monitor_measures_headroom_and_records_its_warning(outputs, capsys):
    """The monitor measures the activation peaks inside the user's own compiled step (a holder
    around each leaf cell for the `with` block), logs train/headroom at its log steps, and records
    the first under the factor as the callback does; after the block the net is as it was, and no
    recording holds the monitor's peaks."""
    monitor = functional_until_it_fails()
    warned = monitor.headroom_recording
    assert warned is not None and warned.name == "headroom-recording" and monitor.recording is not None
    at = json.loads((warned / "recording.json").read_text())["first_bad_step"]
    client, runs = all_runs(outputs)
    (run,) = runs
    history = headroom_history(client, run.info.run_id)
    assert sorted(history) == [1] + list(range(5, 61, 5))
    assert history[at] < 8 <= min(v for step, v in history.items() if step < at)
    assert history[1] > 1000 and history[60] == 0.0   # the peaks are the block's: large headroom first, none once inf
    assert run.data.tags[WARNING_TAG].startswith(f"step {at}: train/headroom ")
    assert run.data.tags["model"].endswith("AnnealedNet")   # the user's class, not MindSpore's O2 wrapper
    net = monitor.settings["net"]
    assert not any(isinstance(cell, Recording) for _, cell in net.cells_and_names())
    for folder in (warned, monitor.recording):
        assert not any(PEAK_PREFIX in name for name in ms.load_checkpoint(str(folder / "state.ckpt")))


def test_headroom_settings_are_checked_and_can_be_turned_off(outputs, capsys):
    for build in (api.callback, api.monitor):
        with pytest.raises(AmpganError, match="headroom_warn must be a number > 1") as err:
            build(headroom_warn=1)
        assert "\n" not in str(err.value)
    monitor = functional_until_it_fails(steps=45, headroom=False)
    assert monitor.headroom_recording is None and monitor.recording is not None
    client, runs = all_runs(outputs)
    assert client.get_metric_history(runs[0].info.run_id, "train/headroom") == []
