"""Every config group option composes, validates and builds; bad values fail with one line."""

from __future__ import annotations

import pytest

from ampgan import AmpganError
from ampgan.config import CONF_DIR, validate
from tests.conftest import compose_cfg

GROUPS = ["model", "data", "amp", "scaler", "hardware", "trainer", "tracking"]


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


@pytest.mark.parametrize("group,option", [(g, o) for g in GROUPS for o in options(g)])
def test_every_group_option_composes_and_validates(group, option):
    extra = ["model=wgan_gp"] if option == "swissroll" else []
    settings = validate(compose_cfg(f"{group}={option}", *extra))
    assert getattr(settings, group) is not None
    if group in ("model", "scaler", "data"):
        assert getattr(settings, group).name == option


@pytest.mark.parametrize("name", options("experiment"))
def test_every_experiment_preset_composes(name):
    validate(compose_cfg(f"+experiment={name}"))


def test_every_data_set_builds_with_fixed_split():
    from ampgan.data import build_dataset

    for name in options("data"):
        s = validate(compose_cfg(f"data={name}", "model=wgan_gp"))
        a, b = build_dataset(s.data), build_dataset(s.data)
        assert (a.x_test == b.x_test).all() and (a.x_train == b.x_train).all()
        assert a.x_train.dtype.name == "float32" and len(a.x_test) > 0
        assert abs(a.x_train).max() <= 4.0


@pytest.mark.parametrize("overrides,fragment", [
    (["scaler=dynamic", "scaler.init_scale=-1"], "scaler.init_scale"),
    (["scaler=dynamic", "scaler.factor=1"], "scaler.factor"),
    (["scaler=dynamic", "scaler.window=0"], "scaler.window"),
    (["trainer.max_steps=0"], "trainer.max_steps"),
    (["trainer.batch_size=abc"], "trainer.batch_size"),
    (["amp.level=O9"], "amp.level"),
    (["amp.keep_fp32=[NotACell]"], "NotACell"),
    (["data.name=nope"], "unknown data set 'nope'"),
    (["hardware.jit=false"], "PYNATIVE"),
])
def test_bad_values_raise_one_line(overrides, fragment):
    with pytest.raises(AmpganError) as err:
        validate(compose_cfg(*overrides))
    assert fragment in str(err.value)
    assert "\n" not in str(err.value)


def test_classifier_accepts_pynative():
    assert validate(compose_cfg("model=classifier", "data=digits", "hardware.jit=false")).hardware.jit is False
