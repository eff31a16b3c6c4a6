"""Quality of real runs at their default length (slow: `make test-full`)."""

from __future__ import annotations

import pytest

from ampgan.training.entry import train
from tests.conftest import all_runs, compose_cfg

pytestmark = pytest.mark.slow


def test_wgan_gp_gaussians8_o0_covers_all_modes(outputs, tmp_path):
    train(compose_cfg(), run_dir=tmp_path / "run")
    _, runs = all_runs(outputs)
    metrics = runs[0].data.metrics
    assert metrics["eval/modes_covered"] == 8, metrics
    assert metrics["eval/swd"] < 0.15, metrics


@pytest.mark.parametrize("amp", ["o0", "o2"])
def test_classifier_digits_reaches_95_percent(outputs, tmp_path, amp):
    accuracy = train(compose_cfg("+experiment=classifier_digits", f"amp={amp}", "scaler=dynamic"), run_dir=tmp_path / "run")
    assert accuracy >= 0.95
