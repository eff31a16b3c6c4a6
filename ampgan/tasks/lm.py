"""The language-model task (model=lm): a causal transformer learns next-character cross-entropy
on text that ships with Python itself, its standard library's docstrings. Nothing is downloaded.

The task kind is this module and `conf/model/lm.yaml` (`task: ampgan.tasks.lm.LanguageModelTask`):
its config schema (`LanguageModelTask.Config`), its data (`load_data`: the text, cut into
windows) and its step, which is the classifier's over every position of a window. A task of
your own comes in the same way: a module with a `TaskBase` subclass and its `Config`, and a
YAML that names it.
"""

from __future__ import annotations

import importlib
import inspect
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
from mindspore import nn, ops
from omegaconf import MISSING

from ampgan import AmpganError, require
from ampgan.config.schema import ClassifierConfig, Settings
from ampgan.config.targets import instantiate, resolve_target
from ampgan.data import Dataset
from ampgan.tasks.classifier import ClassifierTask

# modules whose docstrings make the default text (131 248 characters, 96 distinct, with Python 3.11)
DOC_MODULES = ("argparse", "collections", "dataclasses", "functools", "inspect", "itertools", "json",
               "logging", "pathlib", "re", "string", "subprocess", "textwrap", "typing", "unittest")


def python_docs(modules: list[str] | tuple[str, ...] = DOC_MODULES, max_chars: int = 200_000) -> str:
    """The docstrings of `modules` and of their public classes, functions and methods, in a fixed
    order, up to `max_chars` characters: English prose about code, shipped with every Python."""
    parts: list[str] = []
    with warnings.catch_warnings():   # typing's deprecated submodules (typing.io, typing.re) warn when looked at
        warnings.simplefilter("ignore", DeprecationWarning)
        for name in modules:
            module = importlib.import_module(name)
            objects = [module] + [v for k, v in sorted(vars(module).items())
                                  if not k.startswith("_") and (inspect.isclass(v) or inspect.isfunction(v))
                                  and getattr(v, "__module__", None) == name]
            for obj in objects:
                methods = ([v for k, v in sorted(vars(obj).items()) if not k.startswith("_") and inspect.isfunction(v)]
                           if inspect.isclass(obj) else [])
                parts.extend(inspect.cleandoc(m.__doc__) for m in [obj, *methods] if m.__doc__)
    return "\n\n".join(parts)[:max_chars]


def text_windows(text: str, seq_len: int, test_fraction: float) -> Dataset:
    """Character-level windows: x = text[i : i+seq_len], y = text[i+1 : i+seq_len+1] (int32 ids),
    every seq_len // 2 characters. The test windows come from the text's last `test_fraction`."""
    vocab = sorted(set(text))
    lookup = {c: i for i, c in enumerate(vocab)}
    tokens = np.fromiter((lookup[c] for c in text), dtype=np.int32, count=len(text))
    cut = int(len(tokens) * (1 - test_fraction))

    def windows(part: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        starts = np.arange(0, len(part) - seq_len - 1, max(1, seq_len // 2))
        idx = starts[:, None] + np.arange(seq_len)[None, :]
        return part[idx], part[idx + 1]

    require(cut > 4 * seq_len and len(tokens) - cut > 2 * seq_len,
            f"model.text: {len(text)} characters are too few for windows of model.seq_len={seq_len}")
    x_train, y_train = windows(tokens[:cut])
    x_test, y_test = windows(tokens[cut:])
    return Dataset(name="text", x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test,
                   n_classes=len(vocab), info={"vocab": "".join(vocab), "chars": len(text)})


class TokenCrossEntropy(nn.Cell):
    """Mean next-token cross-entropy: logits (batch, seq, vocab), int32 labels (batch, seq).

    `z_loss` > 0 adds z_loss * mean(logsumexp(logits)^2) over the positions (z-loss, PaLM; Wortsman
    et al. 2023 use 1e-4): it keeps the output logits' normaliser log Z near 0, against the
    output-logit divergence of high learning rates (`+model.loss.z_loss=1e-4`). 0: off."""

    def __init__(self, z_loss: float = 0.0):
        super().__init__()
        if not z_loss >= 0:
            raise ValueError(f"z_loss must be >= 0, got {z_loss}")
        self.ce = nn.CrossEntropyLoss()
        self.z_loss = float(z_loss)

    def construct(self, logits, labels):
        flat = logits.reshape(-1, logits.shape[-1])
        loss = self.ce(flat, labels.reshape(-1))
        if self.z_loss > 0:
            loss = loss + self.z_loss * ops.square(ops.logsumexp(flat, -1)).mean()
        return loss


@dataclass
class LanguageModelConfig(ClassifierConfig):
    """A causal language model: `net` maps (batch, seq_len) int32 token ids to next-token logits
    (batch, seq_len, vocab_size) and gets vocab_size and seq_len by name; `text` is a target
    returning one str. The checks live here, the values in conf/model/lm.yaml (its one copy of
    them: a YAML option without a registered schema must list every key a command line may set)."""

    name: str = MISSING
    task: str = MISSING
    net: Any = MISSING
    loss: Any = MISSING
    text: Any = MISSING
    seq_len: int = MISSING
    test_fraction: float = MISSING
    lr: float = MISSING
    betas: tuple[float, float] = MISSING
    optimizer: Any = MISSING

    def __post_init__(self) -> None:
        super().__post_init__()
        resolve_target(self.text, "model.text")
        require(2 <= self.seq_len <= 4096, f"model.seq_len must lie in 2 .. 4096, got {self.seq_len}")
        require(0 < self.test_fraction < 1, f"model.test_fraction must lie in (0, 1), got {self.test_fraction}")

    @property
    def data_name(self) -> str:
        """The run's data label: the text target's name (the data group is not read)."""
        return self.text["_target_"].rsplit(".", 1)[-1]


class LanguageModelTask(ClassifierTask):
    """The classifier's step, net and loss doors over every position of a window: its metrics
    are train/loss and train/acc (next-character accuracy); eval/loss is the objective."""

    Config = LanguageModelConfig
    objective = "eval/loss"
    direction = "minimize"
    objective_best = 0.0

    @staticmethod
    def load_data(s: Settings) -> Dataset:
        text = instantiate(s.model.text, "model.text")
        if not isinstance(text, str) or not text:
            raise AmpganError(f"model.text: {s.model.text['_target_']} must return a non-empty str, "
                              f"got {type(text).__name__}")
        return text_windows(text, s.model.seq_len, s.model.test_fraction)

    @staticmethod
    def given(s: Settings, data: Dataset) -> dict:
        return {"vocab_size": data.n_classes, "seq_len": s.model.seq_len, "num_classes": data.n_classes}

    @staticmethod
    def logits_shape(data: Dataset) -> tuple[int, ...]:
        return (data.x_train.shape[1], data.n_classes)

    def evaluate(self) -> dict[str, float]:
        """The classifier's over every position (nats per character, next-character accuracy), and its bits."""
        out = super().evaluate()
        return {**out, "eval/bits_per_char": out["eval/loss"] / np.log(2)}

    def save_pictures(self, folder) -> list:
        return []


__all__ = ["LanguageModelConfig", "LanguageModelTask", "TokenCrossEntropy", "python_docs", "text_windows"]
