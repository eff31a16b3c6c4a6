"""The classifier task: a user's (or ampgan's) net and loss from `_target_`s, accuracy; the confusion matrix."""

from __future__ import annotations

import contextlib
from pathlib import Path
import mindspore as ms
import numpy as np
from ampgan.amp.policy import apply_amp, check_keep_paths
from ampgan.amp.scalers import build_scaler
from ampgan.config.schema import ClassifierConfig, Settings
from ampgan.data import Batches, Dataset
from ampgan.tasks.metrics import confusion_matrix, softmax_cross_entropy
from ampgan.steps.classifier import LOSSES, build_classifier_step, classifier_loss_fn
from ampgan.tasks.base import NetState, Optimised, TaskBase, activation_peaks, computes_float16, health_fn
from ampgan.config.targets import instantiate
from ampgan.tasks.targets import build_net, build_optimizer, check_classifier_fits, data_shape_args


class ClassifierTask(TaskBase):
    Config = ClassifierConfig
    objective = "eval/accuracy"
    direction = "maximize"
    objective_best = 1.0
    GRAPH_ATTRS = TaskBase.GRAPH_ATTRS + ("net", "net_amp", "loss")

    def __init__(self, s: Settings, data: Dataset):
        self.data = data
        self.net = build_net(s.model.net, "model.net", self.given(s, data))
        self.loss = instantiate(s.model.loss, "model.loss")
        check_classifier_fits(self.net, self.loss, data.x_train, data.y_train, self.logits_shape(data))
        self.fp32_loss = s.amp.fp32_loss
        check_keep_paths({"": self.net}, s.amp.keep_fp32)
        net_amp = apply_amp(self.net, s.amp.level, s.amp.keep_fp32)
        net_amp.set_train(True)  # cells start in inference mode: BatchNorm would use its moving statistics
        self.net_amp = net_amp
        self.nets = {"train": net_amp}   # one name for the one optimised net: its metrics are train/...
        opt = build_optimizer(s.model.optimizer, "model.optimizer", net_amp.trainable_params(), s.model.lr, s.model.betas)
        self.optimizers = {"train.opt": opt}
        self.scalers = {"train.scaler": build_scaler(s.scaler, "train.scaler")}
        self.rngs = {}
        step = build_classifier_step(net_amp, self.loss, opt, self.scalers["train.scaler"], health_fn(s),
                                     fp32_loss=s.amp.fp32_loss, jit=s.hardware.jit,
                                     peaks=activation_peaks(s, net_amp, ""))
        self.state = NetState("train", step, float16=computes_float16(s))
        self.batches = Batches(data.x_train, data.y_train, s.trainer.batch_size, s.trainer.seed)

    @staticmethod
    def given(s: Settings, data: Dataset) -> dict:
        """What the net's constructor may take by name (see `ampgan.config.targets.instantiate`)."""
        return data_shape_args(data.sample_shape, data.n_classes)

    @staticmethod
    def logits_shape(data: Dataset) -> tuple[int, ...]:
        """One sample's logits: (classes,)."""
        return (data.n_classes,)

    def states(self) -> list[NetState]:
        return [self.state]

    def roots(self) -> dict[str, ms.nn.Cell]:
        return {"": self.net}   # keep-list paths name the net's own cells: `head`, `layer4.1.conv2`

    def optimised(self) -> dict[str, Optimised]:
        return {"train": Optimised(self.net_amp, lambda sc: classifier_loss_fn(self.net_amp, self.loss, sc, self.fp32_loss),
                                   self.optimizers["train.opt"], self.scalers["train.scaler"], LOSSES)}

    def forward(self, name: str, inputs: tuple) -> None:
        self.net_amp(inputs[0])

    def step_inputs(self) -> list[tuple[str, tuple]]:
        """One step's sub-steps and inputs: [("train", (x, y))], the sampler's next batch."""
        x, y = self.batches.next()
        return [("train", (ms.Tensor(x), ms.Tensor(y)))]

    def run_inputs(self, step: int, subs: list[tuple[str, tuple]], measure: bool) -> None:
        """Launch one step; `measure`: with gradient health (its status will be read)."""
        for _, inputs in subs:
            self.state.launch(step, inputs, measure)

    @contextlib.contextmanager
    def inference(self):
        """The net in inference mode for the block (BatchNorm on its moving statistics)."""
        self.net_amp.set_train(False)
        try:
            yield self.net_amp
        finally:
            self.net_amp.set_train(True)

    @staticmethod
    def eval_chunks(x: np.ndarray) -> list[np.ndarray]:
        """The batches evaluation runs `x` in (about 512 samples each)."""
        return np.array_split(x, max(1, len(x) // 512))

    def logits(self, x: np.ndarray) -> np.ndarray:
        with self.inference() as net:
            return np.concatenate([net(ms.Tensor(c)).asnumpy().astype(np.float64) for c in self.eval_chunks(x)])

    def eval_forward(self):
        """The net's inference-mode forward pass on evaluation's first batch of the test set."""
        x = ms.Tensor(self.eval_chunks(self.data.x_test)[0])

        def run():
            with self.inference() as net:
                return net(x)
        return run

    def evaluate(self) -> dict[str, float]:
        """Accuracy and softmax cross-entropy over every prediction: a sample's, or each position's
        of a sequence (logits (..., classes) against labels (...))."""
        logits = self.logits(self.data.x_test)
        logits, y = logits.reshape(-1, logits.shape[-1]), self.data.y_test.reshape(-1)
        return {"eval/accuracy": float((logits.argmax(1) == y).mean()), "eval/loss": softmax_cross_entropy(logits, y)}

    def save_pictures(self, folder: Path) -> list[Path]:
        pred = self.logits(self.data.x_test).argmax(1)
        cm = confusion_matrix(pred, self.data.y_test, self.data.n_classes)
        from ampgan.reporting.sweep_report import figure_png, heatmap_figure

        labels = [str(k) for k in range(self.data.n_classes)]
        fig = heatmap_figure(cm, labels, labels, "confusion: rows true, columns predicted", "test examples",
                             xlabel="predicted", annotate=True)
        path = Path(folder) / "confusion.png"
        path.write_bytes(figure_png(fig))
        return [path]
