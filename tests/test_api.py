"""The Python API (`ampgan.api`): the README's example runs as written and leaves a finished
training run and a diagnosis in MLflow; bad input is one AmpganError line and no run."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest
from mindspore import nn

from ampgan import AmpganError, api
from tests.conftest import ROOT, all_runs


def readme_example() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("## From Python", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readme_example_trains_and_diagnoses(tmp_path, outputs):
    script = tmp_path / "example.py"
    script.write_text(readme_example())
    env = {**os.environ, "AMPGAN_OUTPUTS": str(outputs), "GLOG_v": "3"}
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    accuracy = float(re.search(r"^accuracy (\S+) MLflow run (\w+)$", done.stdout, re.M).group(1))
    assert accuracy > 0.6, "three well-separated blobs: 100 steps learn them"
    verdict = re.search(r"^verdict (\w+) (\d+) ", done.stdout, re.M)
    assert verdict.group(1) == "healthy" and verdict.group(2) == "0"
    _, runs = all_runs(outputs)
    trained = [r for r in runs if r.data.tags.get("ampgan.kind") != "diagnose"]
    diagnosed = [r for r in runs if r.data.tags.get("ampgan.kind") == "diagnose"]
    assert len(trained) == 1 and trained[0].info.status == "FINISHED"
    assert trained[0].data.params["model.net._target_"] == "ampgan.api.user.net"
    assert trained[0].data.params["model.optimizer._target_"] == "ampgan.api.user.optimizer"   # the SGD factory
    assert "grad/head.weight/underflow" in trained[0].data.metrics
    assert len(diagnosed) == 1 and diagnosed[0].data.tags["ampgan.verdict"] == "healthy"


class Net(nn.Cell):
    def __init__(self, in_channels: int, num_classes: int):
        super().__init__()
        self.fc = nn.Dense(in_channels, num_classes)

    def construct(self, x):
        return self.fc(x)


XY = (np.zeros((64, 4), np.float32), np.arange(64) % 2)
BAD = {
    "a net instead of its class": (dict(net=Net(4, 2), data=XY), "net must be a class or a function"),
    "labels that are floats": (dict(net=Net, data=(XY[0], XY[1].astype(float))), "labels must be integers"),
    "a batch larger than the data": (dict(net=Net, data=XY, batch_size=1000), "trainer.batch_size=1000"),
    "an unknown override": (dict(net=Net, data=XY, overrides=("trainer.nope=1",)), "trainer.nope"),
    "an optimizer that is no class or function": (dict(net=Net, data=XY, optimizer=0.1), "api: optimizer must be"),
    "batches that are not pairs": (dict(net=Net, data=iter([1, 2])), "x_train has shape (); want (N, C, H, W) images"),
}


class PointGenerator(nn.Cell):
    """A user's own generator: z -> a 2-D point (given z_dim and sample_shape by name)."""

    def __init__(self, z_dim: int, sample_shape: tuple):
        super().__init__()
        self.body = nn.SequentialCell([nn.Dense(z_dim, 32), nn.ReLU(), nn.Dense(32, sample_shape[0])])

    def construct(self, z):
        return self.body(z)


class PointCritic(nn.Cell):
    def __init__(self, sample_shape: tuple):
        super().__init__()
        self.body = nn.SequentialCell([nn.Dense(sample_shape[0], 32), nn.ReLU(), nn.Dense(32, 1)])

    def construct(self, x):
        return self.body(x).squeeze(-1)


class TinyLM(nn.Cell):
    """A user's own language model: token ids -> next-token logits (given vocab_size, seq_len)."""

    def __init__(self, vocab_size: int, seq_len: int):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, 16)
        self.head = nn.Dense(16, vocab_size)

    def construct(self, ids):
        return self.head(self.embed(ids))


def test_a_gan_of_the_users_own_nets_trains_on_bare_points(outputs):
    """task="wgan_gp": the user's generator and critic, samples without labels, ampgan's loop and
    MLflow run; the objective is the GAN's own (a distance, finite and positive)."""
    points = np.random.default_rng(0).normal(size=(512, 2)).astype(np.float32)
    run = api.train(task="wgan_gp", generator=PointGenerator, critic=PointCritic, data=points, steps=4,
                    overrides=("trainer.eval_every=4", "trainer.eval_samples=200"))
    assert np.isfinite(run.objective) and run.objective > 0
    _, runs = all_runs(outputs)
    assert len(runs) == 1 and runs[0].info.status == "FINISHED" and runs[0].info.run_id == run.run_id
    params = runs[0].data.params
    assert params["model.generator._target_"] == "ampgan.api.user.generator"
    assert params["model.critic._target_"] == "ampgan.api.user.critic"
    assert "eval/swd" in runs[0].data.metrics


@pytest.mark.slow  # `make test-full` (CI's 30 minutes on a slow machine)
def test_a_language_model_of_the_users_own_is_diagnosed_on_its_own_text(outputs):
    """task="lm": the user's net and text through diagnose; a tiny embedding LM trains alike in
    both precisions over its few steps, and the verdict says so with its exit code."""
    text = "the quick brown fox jumps over the lazy dog. " * 200
    verdict = api.diagnose(task="lm", net=TinyLM, text=text, steps=20,
                           overrides=("trainer.eval_every=10", "diagnose.verify=false"), echo=lambda *a, **k: None)
    assert verdict.name in ("healthy", "not_amp") and verdict.exit_code in (0, 3)
    _, runs = all_runs(outputs)
    diagnosed = [r for r in runs if r.data.tags.get("ampgan.kind") == "diagnose"]
    assert len(diagnosed) == 1 and diagnosed[0].data.params["model.net._target_"] == "ampgan.api.user.net"
    assert diagnosed[0].data.params["model.text._target_"] == "ampgan.api.user.text"


TASK_BAD = {
    "an unknown task": (dict(task="gan"), "api: task must be one of classifier, wgan_gp, lm"),
    "a generator for a classifier": (dict(net=Net, data=XY, generator=PointGenerator), "a classifier run has no generator"),
    "a net for a GAN": (dict(task="wgan_gp", net=Net), "a wgan_gp run has no net; it takes generator, critic"),
    "a critic instance": (dict(task="wgan_gp", critic=PointCritic((2,))), "api: critic must be a class or a function"),
    "data for a language model": (dict(task="lm", data=XY), "api: a language model reads text=, not data="),
    "text that is a number": (dict(task="lm", text=3), "api: text must be a str or a function"),
    "a classifier's data without labels": (dict(net=Net, data=XY[0]), "a classifier's data is (x, y)"),
}


@pytest.mark.parametrize("case", {**BAD, **TASK_BAD})
def test_bad_input_is_one_line_and_no_run(case, outputs):
    """Bad input, a task given the wrong parts included: one AmpganError line, no run."""
    kwargs, message = {**BAD, **TASK_BAD}[case]
    with pytest.raises(AmpganError) as err:
        api.train(**kwargs, steps=2)
    assert message in str(err.value) and "\n" not in str(err.value)
    _, runs = all_runs(outputs)
    assert runs == []
