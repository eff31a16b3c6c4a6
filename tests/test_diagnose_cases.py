"""diagnose on runs it was not tuned on (`conf/experiment/case_*.yaml`, nets under
ampgan_corpus/users/): each case was written with its expected verdict before the rules changed
(issue: a verdict is an experiment). Each must get its verdict and exit code, the op and source
line where one exists, and an intervention table in which every printed fix removed the failure.

Their full horizons train the run's own length, so most are slow tests (`make test-full`); the
every-step overflow in a user's own op stays in `make test`, through the command and the API."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir

from ampgan.config.schema import CONF_DIR
from ampgan.diagnose.command import diagnose
from ampgan_corpus.cases import REALISTIC as CASES, Case

EXIT = {"healthy": 0, "not_amp": 3, "not_reproduced": 4, "unexplained": 5}




def run_case(case: Case):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="diagnose_main",
                      overrides=[f"+experiment={case.preset}", "tracking=none", "diagnose.mode=synced", *case.overrides])
    with tempfile.TemporaryDirectory(prefix="ampgan-test-cases-") as folder:
        return diagnose(cfg, Path(folder), echo=lambda *a, **k: None)


def check(case: Case, result) -> None:
    v = result.verdict
    assert v.name == case.verdict, f"{case.preset} ({case.why}): got {v.name}: {v.headline}"
    assert v.exit_code == EXIT.get(case.verdict, 1)
    if case.layer:
        assert v.layer == case.layer, f"{case.preset}: layer {v.layer!r}, expected {case.layer!r}"
    if case.site is not None:
        op = result.analysis.located.op
        assert (op.op, Path(op.file).name, op.line) == case.site, op.describe()
        assert f"{Path(op.file).name}:{op.line}" in v.headline
    confirmed = {c.fix.text for c in result.checked or [] if c.confirmed}
    assert {f.text for f in v.fixes} <= confirmed, f"{case.preset}: a printed fix was not confirmed by its replay"
    if case.fix:
        assert case.fix in {f.text for f in v.fixes}, f"{case.preset}: {case.fix} not printed: {result.interventions}"
    if v.name not in ("healthy", "not_reproduced"):
        rows = result.interventions
        assert rows and rows[0]["intervention"].startswith("FP32 throughout"), rows
    if v.name == "not_reproduced":
        assert "diagnose.horizon_seconds=" in " ".join(v.evidence)


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c.slow else c for c in CASES],
                         ids=[c.preset + ("-" + "-".join(c.overrides) if c.overrides else "") for c in CASES])
def test_case(case: Case):
    check(case, run_case(case))


@pytest.mark.slow   # 76 s; the same case through the command runs in `make test` (test_case)
def test_the_temperature_net_through_the_python_api(outputs):
    """The same user's net through `ampgan.api.diagnose`, as a script passes it: a mindspore.dataset
    pipeline of the digits, a loss Cell and an optimizer factory. overflow at line 27 of the user's
    file, with the keep-list fix confirmed by its replay and the scale intervention refuted."""
    import mindspore as ms
    import mindspore.dataset as ds
    from mindspore import nn
    from sklearn.datasets import load_digits

    from ampgan import api
    from ampgan_corpus.users.temperature_attention import TemperatureNet

    digits = load_digits()
    x, y = (digits.data / 16.0).astype(np.float32), digits.target.astype(np.int32)
    pipeline = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(128)
    lines = []
    v = api.diagnose(TemperatureNet, data=pipeline, loss=nn.CrossEntropyLoss(),
                     optimizer=lambda params, lr, betas: ms.mint.optim.Adam(params, lr=lr, betas=tuple(betas)),
                     amp="O2", scaler="dynamic", overrides=("tracking=none", "trainer.max_steps=100"),
                     echo=lambda *words, **_: lines.append(" ".join(map(str, words))))
    assert v.name == "overflow" and v.exit_code == 1 and v.layer == "attn", v.headline
    assert "temperature_attention.py:27" in v.headline and "Tensor.__mul__" in v.headline
    assert [f.text for f in v.fixes] == ["amp.keep_fp32=[attn]"]
    report = "\n".join(lines)
    assert "scaler=static scaler.init_scale=1" in report and "does not (its replay: overflow" in report, report
