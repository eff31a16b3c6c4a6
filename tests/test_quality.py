"""Quality of real runs at their default length (slow: `make test-full`)."""

from __future__ import annotations

import pytest

from ampgan.training.entry import train
from tests.conftest import all_runs, compose_cfg

pytestmark = pytest.mark.slow


def test_wgan_gp_gaussians8_o0_covers_all_modes_at_each_of_its_last_evaluations(outputs, tmp_path):
    """The default run (`make train`): 8 of 8 modes at each of the last 3 evaluations, not one lucky one."""
    train(compose_cfg(), run_dir=tmp_path / "run")
    client, runs = all_runs(outputs)
    metrics = runs[0].data.metrics
    history = sorted((m.step, m.value) for m in client.get_metric_history(runs[0].info.run_id, "eval/modes_covered"))
    assert len(history) >= 3 and [v for _, v in history[-3:]] == [8, 8, 8], history
    assert metrics["eval/swd"] < 0.15, metrics


@pytest.mark.parametrize("amp", ["o0", "o2"])
def test_classifier_digits_reaches_95_percent(outputs, tmp_path, amp):
    accuracy = train(compose_cfg("+experiment=classifier_digits", f"amp={amp}", "scaler=dynamic"), run_dir=tmp_path / "run")
    assert accuracy >= 0.95
