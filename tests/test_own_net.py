"""A user's own net through `model.net._target_`: a file outside the repo, on PYTHONPATH, trained,
checkpointed, resumed, swept and diagnosed as ampgan's own; mindcv's resnet18; bad targets
stopped at the door with one line and no run."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from ampgan import AmpganError
from ampgan.training.entry import train
from tests.conftest import all_runs, compose_cfg, run_cli
from tests.test_diagnose import run_diagnose

USER_NETS = '''
from mindspore import nn


class TinyNet(nn.Cell):
    """What a user writes: their own cell names, the data's shape by the names ampgan passes."""

    def __init__(self, in_channels: int, num_classes: int, hidden: int = 16):
        super().__init__()
        self.features = nn.SequentialCell([nn.Conv2d(in_channels, hidden, 3, pad_mode="same"), nn.ReLU(),
                                           nn.AdaptiveAvgPool2d(1), nn.Flatten()])
        self.classify = nn.Dense(hidden, num_classes)

    def construct(self, x):
        return self.classify(self.features(x))


class Frozen(nn.Cell):
    def __init__(self):
        super().__init__()
        self.flat = nn.Flatten()

    def construct(self, x):
        return self.flat(x)


class FixedClasses(TinyNet):
    def __init__(self, in_channels: int):
        super().__init__(in_channels, 7)


def object_samples():
    import numpy as np

    return np.array([["a", "b"]] * 10, dtype=object), np.zeros(10, dtype=np.int64)


def images_without_channels():
    import numpy as np

    return np.zeros((8, 8, 8), np.float32), np.zeros(8, np.int64)  # (N, H, W): no channel axis


def broken_import():
    import a_module_nobody_has  # noqa: F401
'''

OWN = ["model=classifier", "data=digits", "model.net._target_=mynets.TinyNet", "amp=o2", "scaler=dynamic"]
SHORT = ["trainer=smoke", "trainer.max_steps=8", "trainer.log_every=1", "trainer.layer_health_every=4",
         "trainer.checkpoint_every=4", "trainer.eval_every=0", "trainer.batch_size=32"]


@pytest.fixture
def user_package(tmp_path, monkeypatch) -> Path:
    """`mynets.py` in a folder outside the repo, on PYTHONPATH (for this process and its children)."""
    folder = tmp_path / "user_code"
    folder.mkdir()
    (folder / "mynets.py").write_text(textwrap.dedent(USER_NETS))
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv("PYTHONPATH", str(folder))
    return folder


@pytest.mark.slow  # `make test-full` (CI's 30 minutes on a slow machine)
def test_a_users_net_trains_logs_its_own_names_checkpoints_and_resumes(user_package, outputs):
    done = run_cli(*OWN, *SHORT, "amp.keep_fp32=[classify]", outputs=outputs)
    assert done.returncode == 0, done.stderr[-2000:]
    client, runs = all_runs(outputs)
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    run = runs[0]
    assert run.data.params["model.net._target_"] == "mynets.TinyNet"
    keys = set(run.data.metrics)
    # per-layer health under the user's own parameter names
    assert {"grad/features.0.weight/underflow", "grad/classify.weight/max_abs"} <= keys, sorted(keys)[:20]
    resumed = run_cli(*OWN, *SHORT, "trainer.max_steps=12", "amp.keep_fp32=[classify]",
                      f"trainer.resume={run.info.run_id}", outputs=outputs)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    client, runs = all_runs(outputs)
    assert len(runs) == 1, "the resumed run continues the same MLflow run"
    steps = [m.step for m in client.get_metric_history(runs[0].info.run_id, "train/loss")]
    assert max(steps) == 12 and 8 in steps and 9 in steps


@pytest.mark.slow  # 69 s, `make test-full` (CI's time): the user's net trains above; diagnose of users' nets: test_diagnose_cases
def test_a_users_net_in_a_sweep_and_in_diagnose(user_package, outputs):
    swept = run_cli("-m", *OWN[:3], "amp=o2", "scaler=static,dynamic", *SHORT, outputs=outputs)
    assert swept.returncode == 0, swept.stderr[-2000:]
    _, runs = all_runs(outputs)
    jobs = [r for r in runs if "ampgan.sweep_parent" not in r.data.tags]
    assert sorted(r.data.tags["scaler"] for r in jobs) == ["dynamic", "static"]
    assert all(r.info.status == "FINISHED" and r.data.params["model.net._target_"] == "mynets.TinyNet" for r in runs)
    # a horizon past the smoke run's 6 steps (the default is the run's own length, over which
    # neither precision learns: that is `not_amp`, exit 3)
    diag = run_diagnose(*OWN, "trainer=smoke", "trainer.batch_size=32", "amp.keep_fp32=[classify]",
                        "tracking=none", "diagnose.horizon=50", outputs=outputs)
    assert diag.returncode == 0, diag.stderr[-2000:]
    assert "classify.weight" in diag.stdout and "features.0.weight" in diag.stdout


@pytest.mark.slow  # `make test-full` (CI's time): search in test_search stays
def test_a_users_net_in_a_search(user_package, outputs):
    import optuna

    from ampgan.sweeps.optuna_search import open_storage
    from tests.test_search import search_cli

    done = search_cli("--trials", "2", "--workers", "1", *OWN[:3], "amp=o2", "scaler=dynamic", *SHORT,
                      "amp.keep_fp32=[classify]", "model.lr=tag(log,interval(1e-3,1e-2))", outputs=outputs)
    assert done.returncode == 0, done.stderr[-2000:]
    folder = next(outputs.glob("multirun/*/*/optuna.journal")).parent
    study = optuna.load_study(study_name=folder.name, storage=open_storage(str(folder / "optuna.journal")))
    assert study.direction.name == "MAXIMIZE" and len(study.trials) == 2   # the classifier's eval/accuracy
    assert all(t.state.name == "COMPLETE" and 1e-3 <= t.params["model.lr"] <= 1e-2 for t in study.trials)
    _, runs = all_runs(outputs)
    jobs = [r for r in runs if "ampgan.sweep_parent" not in r.data.tags]
    assert len(jobs) == 2 and all(r.data.params["model.net._target_"] == "mynets.TinyNet" for r in jobs)
    assert all("grad/classify.weight/max_abs" in r.data.metrics for r in jobs)


DOOR = {
    "target that does not import": (["model.net._target_=nope.Net"],
                                    "model.net._target_=nope.Net: cannot import it (ModuleNotFoundError: No module named 'nope')"),
    "missing dependency inside the user's module": (["model.net._target_=mynets.broken_import"],
                                                    "No module named 'a_module_nobody_has'"),
    "argument the net does not take": (["model.net._target_=mynets.TinyNet", "+model.net.hiden=8"],
                                       "unexpected keyword argument 'hiden' (did you mean hidden?)"),
    "output that does not fit the loss": (["model.net._target_=mynets.FixedClasses"],
                                          "to (2, 7); the loss needs logits of shape (2, 10)"),
    "net with no trainable parameters": (["model.net._target_=mynets.Frozen"], "has no trainable parameters"),
    "net that does not take the samples": (["model.net._target_=mindspore.nn.Dense", "+model.net.in_channels=3",
                                            "+model.net.out_channels=10"], "does not take the data's samples"),
    "loss that does not take logits and labels": (["model.loss._target_=mindspore.nn.MSELoss"],
                                                  "model.loss: does not take logits (2, 10) and labels (2,)"),
    "keep_fp32 path the net does not have": (["model.net._target_=mynets.TinyNet", "amp.keep_fp32=[clasify]"],
                                             "clasify"),
    "target that is no cell": (["model.net._target_=builtins.dict"], "not a mindspore.nn.Cell"),
    "data of the wrong dtype": (["data=custom", "data.source._target_=mynets.object_samples"],
                                "data.source: mynets.object_samples's x_train has dtype object; samples must be numbers"),
    "optimizer that does not take the parameters": (["model.optimizer._target_=builtins.dict"],
                                                    "model.optimizer: builtins.dict(the net's parameters) failed: "),
    "optimizer that is no cell": (["model.optimizer._target_=builtins.list"],
                                  "model.optimizer: builtins.list gave a list, not an optimizer Cell"),
    "optimizer argument it does not take": (["model.optimizer._target_=mindspore.mint.optim.SGD",
                                             "+model.optimizer.momentun=0.9"], "(did you mean momentum?)"),
    "data of the wrong shape": (["data=custom", "data.source._target_=mynets.images_without_channels"],
                                "x_train has shape (8, 8, 8); want (N, C, H, W) images or (N, F) points"),
}


@pytest.mark.parametrize("case", DOOR)
def test_bad_user_code_is_one_line_and_no_run(case, user_package, outputs):
    overrides, message = DOOR[case]
    with pytest.raises(AmpganError) as err:
        train(compose_cfg("model=classifier", "data=digits", "trainer=smoke", "amp=o2", *overrides))
    assert message in str(err.value) and "\n" not in str(err.value)
    _, runs = all_runs(outputs)
    assert runs == []


GAN_DOOR = {
    "critic that scores with two numbers": (["model.critic._target_=mindspore.nn.Dense", "+model.critic.in_channels=2",
                                             "+model.critic.out_channels=1"],
                                            "model.critic: the net maps inputs of shape (2, 2) to (2, 1); WGAN-GP needs (2,)"),
    "generator that does not import": (["model.generator._target_=mynets.NoSuchGenerator"],
                                       "model.generator._target_=mynets.NoSuchGenerator: cannot import it (AttributeError"),
}


@pytest.mark.parametrize("case", GAN_DOOR)
def test_bad_wgan_nets_are_one_line_and_no_run(case, user_package, outputs):
    overrides, message = GAN_DOOR[case]
    with pytest.raises(AmpganError) as err:
        train(compose_cfg("trainer=smoke", *overrides))
    assert message in str(err.value) and "\n" not in str(err.value)
    _, runs = all_runs(outputs)
    assert runs == []


@pytest.mark.slow  # `make test-full` (CI's time): the user's net resumes above
def test_an_optimizer_of_the_users_choice_trains_checkpoints_and_resumes(outputs):
    """SGD with momentum as a partial target: it gets lr by name (not Adam's betas, which SGD does not
    take), and its momentum buffers are checkpointed with the run."""
    sgd = ["model.optimizer._target_=mindspore.mint.optim.SGD", "+model.optimizer.momentum=0.9", "model.lr=0.05"]
    done = run_cli("model=classifier", "data=digits", *sgd, *SHORT, outputs=outputs)
    assert done.returncode == 0, done.stderr[-2000:]
    client, runs = all_runs(outputs)
    run = runs[0]
    assert run.data.params["model.optimizer._target_"] == "mindspore.mint.optim.SGD"
    losses = [m.value for m in sorted(client.get_metric_history(run.info.run_id, "train/loss"), key=lambda m: m.step)]
    assert losses[-1] < losses[0]
    resumed = run_cli("model=classifier", "data=digits", *sgd, *SHORT, "trainer.max_steps=10",
                      f"trainer.resume={run.info.run_id}", outputs=outputs)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    client, runs = all_runs(outputs)
    assert len(runs) == 1 and max(m.step for m in client.get_metric_history(run.info.run_id, "train/loss")) == 10


def test_a_step_mindspore_cannot_compile_is_one_line_and_a_failed_run(outputs):
    """mint.optim.AdamW builds, but MindSpore 2.10 has no AdamW kernel on CPU: the first step fails."""
    done = run_cli("model=classifier", "data=digits", "model.optimizer._target_=mindspore.mint.optim.AdamW", *SHORT,
                   outputs=outputs)
    errors = [ln for ln in done.stderr.splitlines() if ln.strip() and " INFO " not in ln and "INFO mlflow" not in ln]
    assert done.returncode == 2 and len(errors) == 1, errors[-5:]
    assert errors[0].startswith("ampgan: error: the first training step failed (RuntimeError: Unsupported op [AdamW] on CPU")
    _, runs = all_runs(outputs)
    assert [r.info.status for r in runs] == ["FAILED"] and "AdamW" in runs[0].data.tags["error"]


def test_no_production_net_or_schema_carries_a_planted_failure_knob():
    """The corpus's hazards live in ampgan_corpus; ampgan's own nets and model schemas have none."""
    import dataclasses
    import inspect

    from ampgan import models
    from ampgan.config.schema import MODELS

    knobs = {"gain", "input_scale", "logit_scale", "norm_scale", "feature_offset", "critic_gain", "critic_input_scale"}
    for name in models.__all__:
        assert not knobs & set(inspect.signature(getattr(models, name)).parameters), name
    for schema in MODELS.values():
        assert not knobs & {f.name for f in dataclasses.fields(schema)}, schema.__name__


def test_the_command_line_says_it_in_one_line(user_package, outputs):
    done = run_cli("model=classifier", "data=digits", "model.net._target_=mynets.Frozen", outputs=outputs)
    assert done.returncode != 0
    errors = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert errors == ["ampgan: error: model.net: mynets.Frozen has no trainable parameters: nothing to train"], errors


MINDCV = ["model=classifier", "data=digits", "data.image_size=16", "model.net._target_=mindcv.create_model",
          "+model.net.model_name=resnet18", "amp=o2", "trainer=smoke", "trainer.max_steps=3", "trainer.batch_size=16",
          "trainer.eval_every=0", "trainer.log_every=1"]


def test_mindcv_resnet18_builds_under_o2_with_its_own_cell_names():
    """The fast suite builds it (the door's forward pass included); test-full trains it under every scaler."""
    from ampgan.config.schema import validate
    from ampgan.tasks import build_task, load_data

    s = validate(compose_cfg(*MINDCV, "scaler=dynamic"))
    task = build_task(s, load_data(s))
    names = [p.name for p in task.optimised()["train"].params]
    assert "conv1.weight" in names and any(n.startswith("layer4.") for n in names)


@pytest.mark.parametrize("scaler", [pytest.param("dynamic", marks=pytest.mark.slow),
                                    pytest.param("static", marks=pytest.mark.slow),
                                    pytest.param("none", marks=pytest.mark.slow),
                                    pytest.param("fixed_clip", marks=pytest.mark.slow),
                                    pytest.param("underflow_aware", marks=pytest.mark.slow)])
def test_mindcv_resnet18_trains_under_o2(scaler, outputs):
    done = run_cli(*MINDCV, f"scaler={scaler}", outputs=outputs)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Cell.__del__" not in done.stderr, "mindcv's cells must not print tracebacks at exit"
    client, runs = all_runs(outputs)
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert "grad/layer4.1.conv2.weight/underflow" in runs[0].data.metrics
    assert runs[0].data.metrics["train/steps"] == 3


@pytest.mark.slow
def test_mindcv_resnet18_can_be_diagnosed(outputs):
    diag = run_diagnose(*[a for a in MINDCV if not a.startswith("trainer.max_steps")], "scaler=dynamic",
                        "diagnose.steps=4", "tracking=none", outputs=outputs, timeout=1500)
    assert diag.returncode in (0, 1, 3), diag.stderr[-2000:]   # a verdict (healthy, AMP's, not AMP's), no crash
    assert "verdict" in diag.stdout.lower() and "conv1.weight" in diag.stdout

