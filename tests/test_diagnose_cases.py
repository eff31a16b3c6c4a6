"""diagnose on runs it was not tuned on (`conf/experiment/case_*.yaml`, nets under
ampgan_corpus/users/): each case was written with its expected verdict before the rules changed
(issue: a verdict is an experiment). Each must get its verdict and exit code, the op and source
line where one exists, and an intervention table in which every printed fix removed the failure.

Their full horizons train the run's own length, so most are slow tests (`make test-full`); the
every-step overflow in a user's own op stays in `make test`, through the command and the API."""

from __future__ import annotations

import tempfile
from pathlib import Path

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
