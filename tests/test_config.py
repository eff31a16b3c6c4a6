"""Every config group option composes, validates and builds; bad values fail with one line.

The dataclasses in ampgan/config.py (and the scaler configs) are the one source of truth for
defaults: the YAML options extend them and may only hold what differs.
"""

from __future__ import annotations

import logging
from dataclasses import fields
from types import SimpleNamespace

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf


from ampgan import AmpganError
from ampgan.config.schema import (CONF_DIR, COMBINATIONS, GROUPS, SCHEMAS, ClassifierConfig, Settings, TrainerConfig,
                           build_group, schema_of, validate)
from tests.conftest import compose_cfg


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


GROUP_OPTIONS = [(g, o) for g in GROUPS for o in options(g)]


def blobs(n: int = 200, seed: int = 0):
    """A user's data source for data=custom: three Gaussian blobs in 2-D."""
    import numpy as np

    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    return (rng.normal(size=(n, 2)) * 0.3 + y[:, None]).astype(np.float32), y


# what an option needs besides itself: the swiss roll has no labels; data=custom needs its source
OPTION_EXTRAS = {"swissroll": ["model=wgan_gp"], "custom": ["data.source._target_=tests.test_config.blobs"]}


def _compose_option_overrides(option: str, group: str = "data") -> list[str]:
    return [f"{group}={option}", *OPTION_EXTRAS.get(option, [])]


def _compose_option(group: str, option: str):
    return compose_cfg(*_compose_option_overrides(option, group))


@pytest.mark.parametrize("group,option", GROUP_OPTIONS)
def test_every_group_option_composes_and_validates(group, option):
    settings = validate(_compose_option(group, option))
    assert getattr(settings, group) is not None
    if group in ("model", "scaler", "data"):
        assert getattr(settings, group).name == option


@pytest.mark.parametrize("name", options("experiment"))
def test_every_experiment_preset_composes(name):
    validate(compose_cfg(f"+experiment={name}"))


# ---------------------------------------------------------------- one source of truth
def _own_values(group: str, option: str) -> list[dict]:
    """The values an option file sets itself, after those of the options it extends (in order)."""
    raw = OmegaConf.to_container(OmegaConf.load(CONF_DIR / group / f"{option}.yaml"), resolve=False)
    parents = [d for d in raw.pop("defaults", []) if isinstance(d, str) and d not in ("_self_",) and not d.startswith("/")]
    return [v for parent in parents for v in _own_values(group, parent)] + [raw]


def _schema_path(group: str, option: str) -> str:
    raw = OmegaConf.to_container(OmegaConf.load(CONF_DIR / group / f"{option}.yaml"), resolve=False)
    defaults = raw.get("defaults", [])
    schemas = [d for d in defaults if isinstance(d, str) and d.startswith("/schema/")]
    if schemas:
        return schemas[0][1:].split("@")[0]
    return _schema_path(group, next(d for d in defaults if d != "_self_"))


@pytest.mark.parametrize("group,option", GROUP_OPTIONS)
def test_every_option_is_its_schema_plus_its_own_values(group, option):
    """Composing an option gives exactly its dataclass's defaults with the file's own values on top.

    An option that stops extending its schema (and so could restate a default that then drifts
    from the dataclass) fails here: its node is no longer typed by the dataclass.
    """
    node = compose_cfg(f"{group}={option}")[group]   # the option alone (data=custom's source stays ???)
    schema = schema_of(group, node)
    if "task" in _own_values(group, option)[-1] and OmegaConf.get_type(node) not in SCHEMAS[group].values():
        # a task kind of its own (model=lm): its task's Config checks, the YAML holds every value once
        from ampgan.config.targets import import_object

        assert schema is import_object(node.task).Config
        unset = [f.name for f in fields(schema) if OmegaConf.is_missing(OmegaConf.merge(OmegaConf.structured(schema), node), f.name)]
        assert not unset, f"conf/{group}/{option}.yaml leaves {unset} unset"
        assert all(OmegaConf.is_missing(OmegaConf.structured(schema), f.name) for f in fields(schema)), \
            "a field with a default in the dataclass would be a second copy of the YAML's value"
        return
    assert SCHEMAS[group][_schema_path(group, option)] is schema
    assert OmegaConf.get_type(node) is schema
    expected = OmegaConf.merge(OmegaConf.structured(schema), *_own_values(group, option))
    assert OmegaConf.to_container(node, resolve=True) == OmegaConf.to_container(expected, resolve=True)


@pytest.mark.parametrize("group,option", GROUP_OPTIONS)
def test_option_files_hold_only_what_differs(group, option):
    """A value equal to the one it overrides is a second copy of a default: it must not be there."""
    node = _compose_option(group, option)[group]
    inherited = OmegaConf.to_container(OmegaConf.structured(schema_of(group, node)))
    for values in _own_values(group, option):
        for key, value in values.items():
            assert inherited.get(key) != value, f"conf/{group}/{option}.yaml restates {key}: {value}"
            inherited[key] = value


def test_defaults_that_used_to_disagree_are_the_ones_that_run():
    """TrainerConfig.eval_every said 0 and the YAML 250; ClassifierConfig.lr said 1e-3 and the YAML 3e-3."""
    assert compose_cfg().trainer.eval_every == TrainerConfig().eval_every
    assert compose_cfg("model=classifier", "data=digits").model.lr == ClassifierConfig().lr


def test_new_fields_have_their_defaults_in_the_composed_config():
    cfg = compose_cfg()
    assert (cfg.trainer.resume, cfg.trainer.requeue, cfg.trainer.keep_checkpoints, cfg.trainer.print_seconds) == (
        "", False, 2, 30.0)
    assert cfg.tracking.heartbeat_seconds == 30.0 and cfg.hardware.unsafe_pynative_gp is False


# ---------------------------------------------------------------- data sizes
def test_every_data_set_builds_with_fixed_split():
    from ampgan.data import build_dataset

    for name in options("data"):
        s = validate(compose_cfg(f"data={name}", "model=wgan_gp", *([] if name == "swissroll" else OPTION_EXTRAS.get(name, []))))
        a, b = build_dataset(s.data), build_dataset(s.data)
        assert (a.x_test == b.x_test).all() and (a.x_train == b.x_train).all()
        assert a.x_train.dtype.name == "float32" and len(a.x_test) > 0
        assert abs(a.x_train).max() <= 4.0


@pytest.mark.parametrize("name", [o for o in options("data") if o != "custom"])
@pytest.mark.parametrize("n_train,test_fraction,seed", [(20000, 0.2, 1234), (333, 0.37, 7), (16, 0.9, 1), (100, 0.01, 3)])
def test_train_size_is_the_built_split_size(name, n_train, test_fraction, seed):
    from ampgan.data import build_dataset, train_size

    cfg = SimpleNamespace(name=name, n_train=n_train, test_fraction=test_fraction, noise=0.02, image_size=8, seed=seed,
                          source=None)
    assert train_size(cfg) == len(build_dataset(cfg).x_train)


def test_a_users_data_is_sized_once_loaded_and_split_by_class():
    from ampgan.data import build_dataset, train_size

    s = validate(compose_cfg("model=classifier", *_compose_option_overrides("custom")))
    assert train_size(s.data) is None
    data = build_dataset(s.data)
    assert len(data.x_train) + len(data.x_test) == 200 and data.n_classes == 3
    assert sorted(set(data.y_test.tolist())) == [0, 1, 2]


def test_digits_class_counts_are_scikit_learns():
    import numpy as np
    from sklearn.datasets import load_digits

    from ampgan.data.digits import CLASS_COUNTS

    assert tuple(np.bincount(load_digits().target)) == CLASS_COUNTS


# ---------------------------------------------------------------- bad values
@pytest.mark.parametrize("overrides,fragment", [
    (["scaler=dynamic", "scaler.init_scale=-1"], "scaler.init_scale"),
    (["scaler=dynamic", "scaler.factor=1"], "scaler.factor"),
    (["scaler=dynamic", "scaler.window=0"], "scaler.window"),
    (["trainer.max_steps=0"], "trainer.max_steps"),
    (["amp.level=O9"], "amp.level"),
    (["amp.keep_fp32=[NotACell]"], "NotACell"),
    (["data.name=nope"], "unknown data set 'nope'"),
    (["hardware.jit=false"], "PYNATIVE"),
    (["model.betas=[0.5,0.9,0.99]"], "model.betas must be two numbers"),
    (["model.lr_g=inf"], "model.lr_g=inf: must be a finite number"),
    (["model.gp_lambda=nan"], "model.gp_lambda"),
    (["trainer.seed=-1"], "trainer.seed must lie in 0 .. 2**32-1"),
    (["data.seed=4294967296"], "data.seed"),
    (["model.hidden=100000"], "model.hidden must lie in 1 .. 16384"),
    (["data.n_train=1000000000000000"], "generating the set needs"),
    (["tracking.experiment="], "tracking.experiment must be 1 to 500 characters"),
    (["tracking.uri=nope"], "tracking.uri must be a URI"),
    (["tracking.uri=sqlite:///relative.db"], "absolute sqlite path"),
    (["trainer.keep_checkpoints=0"], "trainer.keep_checkpoints"),
    (["tracking.heartbeat_seconds=0"], "tracking.heartbeat_seconds"),
    (["+trainer.max_step=5"], "no key 'max_step' in trainer (did you mean max_steps?)"),
    (["model.name=classifier"], "choose the option instead (model=classifier)"),
    (["trainer.max_steps=1000000001"], "trainer.max_steps must be at most 10**9, got 1000000001"),
    (["tracking.uri=ftp://x"], "no tracking store for 'ftp:' URIs"),
])
def test_bad_values_raise_one_line(overrides, fragment):
    with pytest.raises(AmpganError) as err:
        validate(compose_cfg(*overrides))
    assert fragment in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("overrides,fragment", [
    (["trainer.batch_size=20001"], "trainer.batch_size=20001 is larger than the 20000 training samples of data=gaussians8"),
    (["model=classifier", "data=digits", "trainer.batch_size=1500"], "training samples of data=digits"),
    (["amp.fp32_loss=false"], "amp.fp32_loss=false with model=wgan_gp"),
    (["model=classifier", "data=digits", "amp.fp32_gradient_penalty=true"], "with model=classifier"),
    (["model=classifier", "data=swissroll"], "data=swissroll has no class labels"),
    (["scaler=underflow_aware", "trainer.grad_health=false"], "reads gradient health"),
])
def test_misfitting_combinations_raise_one_line(overrides, fragment):
    with pytest.raises(AmpganError) as err:
        validate(compose_cfg(*overrides))
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_the_bounds_themselves_are_accepted():
    from ampgan.config.schema import MAX_STEPS

    assert validate(compose_cfg(f"trainer.max_steps={MAX_STEPS}")).trainer.max_steps == 10**9
    for uri in ("http://localhost:5000", "https://h", "postgresql+psycopg2://u@h/db", "mysql://h/db", "databricks://profile"):
        assert validate(compose_cfg(f"tracking.uri={uri}")).tracking.uri == uri


def test_a_batch_beyond_memory_is_refused_where_the_data_is_known_only_once_loaded():
    with pytest.raises(AmpganError, match="larger than any data set this machine holds"):
        validate(compose_cfg("model=lm", "trainer.batch_size=1000000000000"))


def test_batch_as_large_as_the_split_is_accepted():
    from ampgan.data import train_size

    s = validate(compose_cfg("model=classifier", "data=digits"))
    validate(compose_cfg("model=classifier", "data=digits", f"trainer.batch_size={train_size(s.data)}"))


def test_classifier_accepts_pynative():
    assert validate(compose_cfg("model=classifier", "data=digits", "hardware.jit=false")).hardware.jit is False


def test_unsafe_pynative_gp_allows_pynative_wgan_with_a_loud_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="ampgan"):
        s = validate(compose_cfg("hardware.jit=false", "hardware.unsafe_pynative_gp=true"))
    assert s.hardware.jit is False
    assert any("UNSAFE" in r.message and "second-order gradient" in r.message for r in caplog.records)


# ---------------------------------------------------------------- combinations read what they say
class _Reads:
    """Settings whose attribute reads are recorded as "group.field" (is_gan reads model.name)."""

    def __init__(self, settings: Settings, log: set[str]):
        self._s, self._log = settings, log

    @property
    def is_gan(self) -> bool:
        self._log.add("model.name")
        return self._s.is_gan

    def __getattr__(self, group: str):
        return _GroupReads(group, getattr(self._s, group), self._log)


class _GroupReads:
    def __init__(self, group: str, obj, log: set[str]):
        self._group, self._obj, self._log = group, obj, log

    def __getattr__(self, name: str):
        self._log.add(f"{self._group}.{name}")
        return getattr(self._obj, name)


def _settings_variety():
    base = [["model=wgan_gp"], ["model=classifier", "data=digits"]]
    tweaks = [[], ["amp.fp32_loss=false"], ["amp.fp32_gradient_penalty=true"], ["hardware.jit=false"],
              ["hardware.jit=false", "hardware.unsafe_pynative_gp=true"],
              ["scaler=underflow_aware", "trainer.grad_health=false"],
              ["trainer.batch_size=100000"], ["data=swissroll"], ["data=digits", "data.test_fraction=0.99"]]
    for b in base:
        for t in tweaks:
            cfg = compose_cfg(*b, *t)
            yield Settings(**{g: build_group(g, schema_of(g, cfg[g]), cfg[g]) for g in GROUPS})


def test_every_combination_check_reads_only_the_fields_it_declares():
    """The preflight trusts `reads` to pick which swept keys can interact: a check must not read more."""
    variety = list(_settings_variety())
    for combination in COMBINATIONS:
        seen: set[str] = set()
        for s in variety:
            try:
                combination.check(_Reads(s, seen))
            except AmpganError:
                pass
        assert seen <= set(combination.reads), (combination.check.__name__, seen - set(combination.reads))
        assert seen, combination.check.__name__


def test_every_declared_field_exists():
    known = {f"{g}.{f.name}" for g in GROUPS for schema in SCHEMAS[g].values() for f in fields(schema)}
    for combination in COMBINATIONS:
        assert set(combination.reads) <= known, combination.reads


def test_the_diagnose_group_is_its_schema_with_no_restated_default():
    """conf/diagnose/default.yaml extends DiagnoseConfig and repeats none of its defaults."""
    from ampgan.diagnose.case import DiagnoseConfig

    raw = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "diagnose" / "default.yaml"), resolve=False)
    defaults = raw.pop("defaults", [])
    assert "/schema/diagnose/default@_here_" in defaults
    inherited = OmegaConf.to_container(OmegaConf.structured(DiagnoseConfig))
    assert [k for k, v in raw.items() if inherited.get(k) == v] == []
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        node = compose(config_name="diagnose_main", overrides=["diagnose.verify=true"]).diagnose
    assert OmegaConf.get_type(node) is DiagnoseConfig
    assert OmegaConf.to_container(node) == {**inherited, "verify": True}
