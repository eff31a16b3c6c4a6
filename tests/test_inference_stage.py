"""diagnose's inference stage on a real run (diag_bn_o3's ResNet on raw 12-bit pixels, O3): after
a short horizon the AMP-trained weights evaluate in float16 to one class while the same weights
reach FP32's accuracy in FP32, and the first op out of float16's range in the evaluation forward
pass is the stem's BatchNorm, fed its moving variance (an FP32 parameter beyond 65504); weights
that evaluate as badly in FP32 (untrained) are not blamed on float16."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir

from ampgan.config.schema import CONF_DIR, validate
from ampgan.diagnose.case import DiagnoseConfig
from ampgan.diagnose.horizon import Horizon, train_course
from ampgan.diagnose.inference import check_inference
from ampgan.diagnose.replay import fp32_twin_settings
from ampgan.tasks import load_data

STEPS = 10


def settings(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="diagnose_main", overrides=["+experiment=diag_bn_o3", "tracking=none", *overrides])
    return validate(cfg)


@pytest.fixture(scope="module")
def run():
    """The preset, its data and its FP32 twin's course over the horizon."""
    s = settings()
    data = load_data(s)
    fp32 = train_course(fp32_twin_settings(s), data, "FP32", STEPS, DiagnoseConfig())
    return s, data, fp32


@pytest.mark.slow  # `make test-full` (CI's 30 minutes on a slow machine)
def test_float16_evaluation_of_trained_weights_overflows_at_the_stem_batchnorm(run):
    s, data, fp32 = run
    dcfg = DiagnoseConfig()
    amp = train_course(s, data, "AMP", STEPS, dcfg, keep_task=True)
    horizon = Horizon(amp, fp32, None)
    assert horizon.amp_trails(dcfg), horizon.describe()
    found = check_inference(s, data, horizon, dcfg, lambda msg: None)
    assert found.blames_float16 and found.amp < 0.2 < 0.8 < found.fp32, found.describe()
    hit = found.hit
    assert (hit.op, hit.cell, Path(hit.file).name, hit.cast_input) == ("BatchNorm", "stem.1", "zoo.py", True), hit.describe()
    assert not np.isfinite(hit.amp_max) and 65504 < hit.fp32_max < np.inf, hit.describe()
    assert (found.cell_type, found.o2_keeps_fp32) == ("BatchNorm2d", True)
    located = found.located()
    assert located.phase == "inference" and located.where == "stem.1" and located.op is hit


def test_untrained_weights_that_evaluate_as_badly_in_fp32_are_not_blamed_on_float16(run):
    s, data, fp32 = run
    dcfg = DiagnoseConfig()
    still = settings("model.lr=1e-9")   # the weights stay at their init; BatchNorm's statistics still move
    amp = train_course(still, data, "AMP", STEPS, dcfg, keep_task=True)
    horizon = Horizon(amp, fp32, None)
    assert horizon.amp_trails(dcfg), horizon.describe()
    found = check_inference(still, data, horizon, dcfg, lambda msg: None)
    assert not found.blames_float16 and found.hit is None, found.describe()
    assert found.fp32 < 0.2, found.describe()
