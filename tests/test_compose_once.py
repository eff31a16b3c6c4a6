"""A single run's config is composed once (issue 24): the pre-flight check's composition is the
one the job runs on, and it is the config Hydra's own entry would have run it on."""

from __future__ import annotations

import os
import sys

import hydra
import pytest
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import OmegaConf

from ampgan.config import preflight
from ampgan.config.hydra_compat import ConfigLoaderImpl
from ampgan.config.schema import CONF_DIR

SEEN: list[dict] = []


@hydra.main(config_path=str(CONF_DIR), config_name="train", version_base="1.3")
def record(cfg):
    """A job that records what it ran on: its config, Hydra's node and the folder it ran in."""
    SEEN.append({"cfg": OmegaConf.to_container(cfg, resolve=True),
                 "hydra": OmegaConf.to_container(HydraConfig.get(), resolve=False), "cwd": os.getcwd()})
    return 0.5


@pytest.fixture
def counted(monkeypatch, tmp_path):
    """The number of compositions Hydra's config loader makes; runs in tmp_path, outputs there too."""
    calls = []
    original = ConfigLoaderImpl.load_configuration

    def load(self, *args, **kwargs):
        calls.append(kwargs.get("run_mode"))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(ConfigLoaderImpl, "load_configuration", load)
    monkeypatch.setenv("AMPGAN_OUTPUTS", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    SEEN.clear()
    yield calls


# the node Hydra fills in per process and per run (time-stamped folders, this process's cwd)
PER_RUN = ("runtime", "run")


def _comparable(hydra_node: dict) -> dict:
    return {k: v for k, v in hydra_node.items() if k not in PER_RUN}


@pytest.mark.parametrize("argv", [["trainer.max_steps=3", "amp=o2", "scaler=dynamic"],
                                  ["+experiment=classifier_digits", "trainer.seed=4"]])
def test_a_single_run_is_composed_once_into_the_config_hydra_would_run(counted, monkeypatch, argv):
    monkeypatch.setattr(sys, "argv", ["train.py", *argv])
    preflight.run_checked(record)
    ours, composed = SEEN[-1], len(counted)
    assert composed == 1, counted

    counted.clear()
    record()   # Hydra's own entry, on the same command line
    theirs = SEEN[-1]
    assert len(counted) >= 2, counted   # Hydra's entry composes for the mode, then for the run
    assert ours["cfg"] == theirs["cfg"]
    assert _comparable(ours["hydra"]) == _comparable(theirs["hydra"])
    assert ours["hydra"]["job"]["name"] == "test_compose_once"
    assert ours["hydra"]["mode"] == RunMode.RUN and "hydra.mode=RUN" in ours["hydra"]["overrides"]["hydra"]
    assert ours["cwd"] != theirs["cwd"] and all(os.path.isdir(os.path.join(s["cwd"], ".hydra")) for s in (ours, theirs))


def test_a_sweep_and_a_bad_override_still_go_their_ways(counted, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["train.py", "amp=o9"])
    with pytest.raises(SystemExit) as stop:
        preflight.run_checked(record)
    assert stop.value.code == 2 and capsys.readouterr().err.startswith("ampgan: error: amp=o9")
    assert not SEEN

    # --cfg is Hydra's: the check leaves it to Hydra's entry, which prints the config and runs nothing
    monkeypatch.setattr(sys, "argv", ["train.py", "--cfg", "job", "trainer.seed=7"])
    preflight.run_checked(record)
    assert not SEEN and "seed: 7" in capsys.readouterr().out
