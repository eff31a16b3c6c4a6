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


@pytest.mark.parametrize("case", BAD)
def test_bad_input_is_one_line_and_no_run(case, outputs):
    kwargs, message = BAD[case]
    with pytest.raises(AmpganError) as err:
        api.train(**kwargs, steps=2)
    assert message in str(err.value) and "\n" not in str(err.value)
    _, runs = all_runs(outputs)
    assert runs == []
