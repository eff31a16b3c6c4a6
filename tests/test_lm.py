"""model=lm, the third task kind: a causal transformer on Python's docstrings, trained, tracked
and diagnosed through the same door as the classifier and the WGAN-GP; a user's own task kind
from one module and one YAML in their own config folder."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from ampgan.config.schema import validate
from ampgan.tasks import build_task, load_data
from ampgan.tasks.lm import python_docs, text_windows
from tests.conftest import ROOT, all_runs, compose_cfg, run_cli
from tests.test_diagnose import run_diagnose

LM = ["model=lm", "amp=o2", "scaler=dynamic", "+model.text.max_chars=20000", "+model.net.dim=32"]
SHORT = ["trainer=smoke", "trainer.max_steps=12", "trainer.log_every=1", "trainer.layer_health_every=4",
         "trainer.eval_every=0", "trainer.batch_size=16"]


def test_text_windows_are_next_character_pairs_with_a_held_out_tail():
    text = python_docs(max_chars=5000)
    data = text_windows(text, seq_len=16, test_fraction=0.2)
    vocab = data.info["vocab"]
    assert data.x_train.dtype == np.int32 and data.x_train.shape[1:] == (16,) and data.n_classes == len(vocab)
    first = "".join(vocab[i] for i in data.x_train[0])
    # y is x shifted by one character, and both are the text itself
    assert first == text[:16] and "".join(vocab[i] for i in data.y_train[0]) == text[1:17]
    assert "".join(vocab[i] for i in data.x_test[0]) == text[4000:4016]   # the test windows: the last 20%


def test_the_lm_task_gets_vocab_and_length_and_maps_tokens_to_next_token_logits():
    s = validate(compose_cfg(*LM))
    data = load_data(s)
    task = build_task(s, data)
    assert task.objective == "eval/loss" and task.direction == "minimize"
    logits = task.logits(data.x_test[:3])
    assert logits.shape == (3, 32, data.n_classes)
    # causal: the first position's logits do not depend on the later characters
    other = data.x_test[:3].copy()
    other[:, 1:] = (other[:, 1:] + 1) % data.n_classes
    np.testing.assert_allclose(task.logits(other)[:, 0], logits[:, 0], rtol=1e-5, atol=1e-5)
    assert not np.allclose(task.logits(other)[:, 5], logits[:, 5])


def test_qk_norm_bounds_the_attention_logits_that_the_headroom_records_and_z_loss_adds_log_z_squared():
    """The zoo's qk_norm: q and k layer-normalised (cells q_norm, k_norm), |logit| <= sqrt(head_dim) at
    unit gains whatever the weights; the logits are the output of the leaf cell `attn.logits` (what
    the activation headroom records). z-loss: CE + z_loss * mean(logsumexp(logits)^2)."""
    import mindspore as ms

    from ampgan.amp.activations import leaf_cells
    from ampgan.models import CausalTransformer
    from ampgan.tasks.lm import TokenCrossEntropy

    seen = {}
    for qk_norm in (False, True):
        net = CausalTransformer(vocab_size=11, seq_len=8, dim=16, depth=1, heads=2, qk_norm=qk_norm)
        for p in net.blocks[0].attn.qkv.get_parameters():
            p.set_data(p * 50)   # a large init: q.k grows with it, unless normalised
        paths = [path for path, _, _ in leaf_cells(net)]
        assert "blocks.0.attn.logits" in paths and ("blocks.0.attn.q_norm" in paths) == qk_norm
        attn = net.blocks[0].attn
        attn.logits.register_forward_hook(lambda cell, i, out, q=qk_norm: seen.__setitem__(q, np.abs(out.asnumpy()).max()))
        net(ms.Tensor(np.arange(16, dtype=np.int32).reshape(2, 8) % 11))
    assert seen[True] <= np.sqrt(8) * (1 + 1e-5) < 100 < seen[False]

    logits = np.random.default_rng(0).normal(size=(2, 3, 5)).astype(np.float32) * 4
    labels = np.array([[0, 1, 2], [3, 4, 0]], dtype=np.int32)
    plain = float(TokenCrossEntropy()(ms.Tensor(logits), ms.Tensor(labels)).asnumpy())
    z = float(TokenCrossEntropy(z_loss=0.5)(ms.Tensor(logits), ms.Tensor(labels)).asnumpy())
    lse = np.log(np.exp(logits.astype(np.float64)).sum(-1))
    assert z - plain == pytest.approx(0.5 * np.mean(lse ** 2), rel=1e-5)
    with pytest.raises(ValueError, match="z_loss must be >= 0"):
        TokenCrossEntropy(z_loss=-1.0)


@pytest.mark.slow  # `make test-full` (CI's 30 minutes on a slow machine)
def test_lm_trains_under_o2_logs_health_and_resumes(outputs):
    done = run_cli(*LM, *SHORT, "trainer.checkpoint_every=6", "amp.keep_fp32=[head]", outputs=outputs)
    assert done.returncode == 0, done.stderr[-2000:]
    client, runs = all_runs(outputs)
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    run = runs[0]
    assert run.data.tags["model"] == "lm" and run.data.tags["data"] == "python_docs"
    assert run.data.tags["ampgan.objective"] == "eval/loss"
    m = run.data.metrics
    assert {"eval/loss", "eval/bits_per_char", "eval/accuracy", "train/acc", "train/scale"} <= m.keys()
    assert {"grad/embed.embedding_table/underflow", "grad/blocks.0.attn.qkv.weight/max_abs"} <= m.keys()
    # better than a uniform guess over the characters after a dozen steps
    assert m["eval/loss"] < np.log(len(set(python_docs(max_chars=20000))))
    resumed = run_cli(*LM, *SHORT, "trainer.max_steps=16", "trainer.checkpoint_every=6", "amp.keep_fp32=[head]",
                      f"trainer.resume={run.info.run_id}", outputs=outputs)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    client, runs = all_runs(outputs)
    steps = [x.step for x in client.get_metric_history(runs[0].info.run_id, "train/loss")]
    assert len(runs) == 1 and max(steps) == 16 and len(steps) == len(set(steps))


def not_text(max_chars: int = 0) -> list:
    return ["words", "in", "a", "list"]


def test_lm_door_errors_are_one_line(outputs):
    for args, want in (
        (["model.text._target_=tests.test_lm.not_text"], "model.text: tests.test_lm.not_text must return a non-empty str, got list"),
        (["model.net._target_=ampgan.models.ResNet", "+model.net.in_channels=1"], "model.net: the net does not take the data's samples of shape (2, 32)"),
        (["model.seq_len=1"], "model.seq_len must lie in 2 .. 4096, got 1"),
        (["model.task=ampgan.tasks.gan.GanTask"], "model.task=ampgan.tasks.gan.GanTask trains model configs of type WganGpConfig"),
    ):
        done = run_cli(*LM[:4], *SHORT, *args, outputs=outputs)   # the net's own defaults
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and lines[-1].startswith("ampgan: error: ") and want in lines[-1], (args, lines[-3:])
        assert "Traceback" not in done.stderr
    assert all_runs(outputs)[1] == []


@pytest.mark.slow
def test_lm_can_be_diagnosed(outputs):
    diag = run_diagnose(*LM, "trainer=smoke", "trainer.batch_size=16", "tracking=none", outputs=outputs)
    assert diag.returncode == 0, diag.stderr[-2000:]
    assert "blocks.0.attn.qkv.weight" in diag.stdout


@pytest.mark.slow
@pytest.mark.parametrize("amp", ["o0", "o2"])
def test_lm_quality(amp, outputs):
    """600 steps of 64 windows (measured, seed 0: 2.907 FP32, 2.904 O2): well under the unigram entropy (4.69 bits)."""
    done = run_cli("model=lm", f"amp={amp}", "scaler=dynamic" if amp == "o2" else "scaler=none", "trainer=classifier",
                   "trainer.max_steps=600", "trainer.batch_size=64", "trainer.eval_every=0", outputs=outputs, timeout=1200)
    assert done.returncode == 0, done.stderr[-2000:]
    _, runs = all_runs(outputs)
    assert runs[0].data.metrics["eval/bits_per_char"] < 3.1


USER_TASK = '''
"""A user's own task kind: a classifier whose eval is top-2 accuracy."""
from dataclasses import dataclass

import numpy as np
from omegaconf import MISSING

from ampgan.config.schema import ClassifierConfig
from ampgan.tasks.classifier import ClassifierTask


@dataclass
class Top2Config(ClassifierConfig):
    name: str = MISSING
    task: str = MISSING


class Top2Task(ClassifierTask):
    Config = Top2Config
    objective = "eval/top2"

    def evaluate(self):
        logits = self.logits(self.data.x_test)
        top2 = np.argsort(logits, axis=1)[:, -2:]
        return {**super().evaluate(), "eval/top2": float((top2 == self.data.y_test[:, None]).any(1).mean())}
'''


def test_a_users_own_task_kind_is_one_module_and_one_yaml(tmp_path, outputs):
    code, conf = tmp_path / "code", tmp_path / "conf" / "model"
    code.mkdir()
    conf.mkdir(parents=True)
    (code / "mytask.py").write_text(textwrap.dedent(USER_TASK))
    (conf / "top2.yaml").write_text("name: top2\ntask: mytask.Top2Task\n")
    env = {**os.environ, "AMPGAN_OUTPUTS": str(outputs), "PYTHONPATH": str(code), "GLOG_v": "3"}
    done = subprocess.run([sys.executable, "-m", "ampgan.train", "--config-dir", str(tmp_path / "conf"),
                           "model=top2", "data=digits", *SHORT], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    _, runs = all_runs(outputs)
    assert runs[0].data.tags["ampgan.objective"] == "eval/top2" and "eval/top2" in runs[0].data.metrics
    assert runs[0].data.metrics["eval/top2"] >= runs[0].data.metrics["eval/accuracy"]
