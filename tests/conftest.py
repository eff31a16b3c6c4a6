"""Shared fixtures: the real config, composed and shrunk; a real MLflow store in tmp_path."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from ampgan.config.schema import CONF_DIR

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _scratch_cwd(tmp_path, monkeypatch):
    """MindSpore writes rank_0/ and *.ir into the working directory: keep them out of the repo."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def outputs(tmp_path, monkeypatch) -> Path:
    """Point ampgan's outputs (runs, embedded MLflow store) at a temporary folder."""
    out = tmp_path / "outputs"
    monkeypatch.setenv("AMPGAN_OUTPUTS", str(out))
    monkeypatch.chdir(tmp_path)
    return out


def compose_cfg(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="train", overrides=list(overrides))


def store_uri(outputs: Path) -> str:
    return f"sqlite:///{outputs / 'mlflow.db'}"


def all_runs(outputs: Path):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(store_uri(outputs))
    exps = client.search_experiments()
    return client, [r for e in exps for r in client.search_runs([e.experiment_id])] if exps else []


def run_cli(*args: str, outputs: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "AMPGAN_OUTPUTS": str(outputs), "GLOG_v": "3"}
    return subprocess.run([sys.executable, "-m", "ampgan.train", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def count_launches(step) -> dict[str, int]:
    """A test double around an ampgan `Step`: counts which variant each launch ran, from outside
    (the measuring `fn` or the plain one, also when the plain one is built later); the counts."""
    counts = {"measured": 0, "plain": 0}

    def counted(fn, kind):
        def launch(*inputs):
            counts[kind] += 1
            return fn(*inputs)
        return launch

    single = step.plain is step.fn
    step.fn = counted(step.fn, "measured")
    if single:
        step.plain = step.fn
    elif step.plain is not None:
        step.plain = counted(step.plain, "plain")
    else:
        build = step.build_plain
        step.build_plain = lambda: counted(build(), "plain")
    return counts


def functional_step(net, loss_fn, optimizer, loss_scaler):
    """The user's own jitted step of a functional loop, as docs/own-script.md writes it: the scaled
    loss's gradients, unscaled, the update only when every one is finite; -> (loss, finite, grads)."""
    import mindspore as ms
    from mindspore import amp

    def forward(data, label):
        loss = loss_fn(net(data), label)
        return loss_scaler.scale(loss), loss

    grad_fn = ms.value_and_grad(forward, None, optimizer.parameters, has_aux=True)

    @ms.jit
    def train_step(data, label):
        (_, loss), grads = grad_fn(data, label)
        grads = loss_scaler.unscale(grads)
        finite = amp.all_finite(grads)
        loss_scaler.adjust(finite)
        if finite:
            optimizer(grads)
        return loss, finite, grads

    return train_step
