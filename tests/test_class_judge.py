"""The image GAN's quality measure: a classifier of the real digits judges generated ones
(ampgan.tasks.metrics.ClassJudge; docs/metrics.md)."""

from __future__ import annotations

import numpy as np
import pytest
from omegaconf import OmegaConf

from ampgan.data.digits import load_digits_dataset
from ampgan.tasks.metrics import ClassJudge, frechet_distance


@pytest.fixture(scope="module")
def digits():
    return load_digits_dataset(OmegaConf.create({"name": "digits", "image_size": 8, "test_fraction": 0.2, "seed": 0}))


@pytest.fixture(scope="module")
def judge(digits):
    return ClassJudge(digits.x_train, digits.y_train, digits.x_test, digits.y_test, digits.n_classes, seed=0)


def test_the_frechet_distance_of_two_gaussians():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((500, 4))
    cov = np.cov(a, rowvar=False)
    assert frechet_distance((a.mean(0), cov), (a.mean(0), cov)) == pytest.approx(0.0, abs=1e-5)
    shift = np.array([1.0, 2.0, 0.0, 0.0])
    assert frechet_distance((a.mean(0), cov), (a.mean(0) + shift, cov)) == pytest.approx(5.0, abs=1e-4)
    # scaled covariance: tr(S + 4S - 2*2S) = tr(S)
    assert frechet_distance((np.zeros(4), cov), (np.zeros(4), 4 * cov)) == pytest.approx(np.trace(cov), rel=1e-4)


def test_the_judge_knows_the_real_digits_and_finds_real_test_images_closest(judge, digits):
    assert judge.accuracy >= 0.9
    real = judge(digits.x_test)
    assert real["classes_covered"] == 10 and real["judge_fd"] == pytest.approx(0.0, abs=1e-3)
    assert real["class_confidence"] == pytest.approx(judge.real["class_confidence"])
    assert judge(digits.x_train)["judge_fd"] == pytest.approx(judge.real["judge_fd"])   # the floor: train vs test


def test_collapse_noise_and_blur_each_score_worse_than_real_digits(judge, digits):
    rng = np.random.default_rng(1)
    floor = judge.real["judge_fd"]
    threes = judge(digits.x_test[digits.y_test == 3])
    assert threes["classes_covered"] <= 2 and threes["judge_fd"] > 20 * floor          # collapse onto one digit
    noise = judge(rng.uniform(-1, 1, digits.x_test.shape).astype(np.float32))
    assert noise["class_confidence"] < judge.real["class_confidence"] - 0.2 and noise["judge_fd"] > threes["judge_fd"]
    blurred = [judge(np.clip(digits.x_test + rng.normal(0, s, digits.x_test.shape), -1, 1))["judge_fd"]
               for s in (0.1, 0.3, 0.6)]
    assert 0 < blurred[0] < blurred[1] < blurred[2] < noise["judge_fd"]   # worse as the test images degrade


@pytest.mark.slow  # `make test-full` (CI's 30 minutes on a slow machine)
def test_a_gan_run_on_digits_logs_the_judges_figures_and_one_on_points_does_not(outputs, tmp_path):
    from ampgan.training.entry import train
    from tests.conftest import all_runs, compose_cfg

    small = ["trainer=smoke", "trainer.max_steps=2", "trainer.eval_every=1", "model.hidden=4", "model.z_dim=4"]
    train(compose_cfg("model=wgan_gp", "data=digits", "data.image_size=8", *small), run_dir=tmp_path / "digits")
    train(compose_cfg("model=wgan_gp", "data=gaussians8", *small), run_dir=tmp_path / "points")
    client, runs = all_runs(outputs)
    by_data = {r.data.tags["data"]: r for r in runs}
    digits_run = by_data["digits"]
    history = client.get_metric_history(digits_run.info.run_id, "eval/judge_fd")
    assert [m.step for m in history] == [1, 2] and all(m.value > 0 for m in history)
    metrics = digits_run.data.metrics
    assert metrics["eval/classes_total"] == 10 and 0 <= metrics["eval/classes_covered"] <= 10
    assert 0.1 <= metrics["eval/class_confidence"] <= 1 and metrics["eval/judge_accuracy"] >= 0.9
    assert not any(k.startswith(("eval/judge", "eval/class")) for k in by_data["gaussians8"].data.metrics)
