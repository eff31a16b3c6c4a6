"""devtools.walk: the reading aid that follows a run's configuration through the package's stages."""

from __future__ import annotations

import sys
import textwrap

from devtools.walk import PACKAGE, Walk, module_of, stage_of


def test_modules_and_stages_are_named_from_the_files():
    assert module_of(str(PACKAGE / "diagnose" / "replay.py")) == "ampgan.diagnose.replay"
    assert module_of(str(PACKAGE / "tasks" / "__init__.py")) == "ampgan.tasks"
    assert module_of("/usr/lib/python3/json/__init__.py") is None
    assert [stage_of(m) for m in ("ampgan.diagnose.replay", "ampgan.tasks", "ampgan.api", "ampgan.train")] == [
        "diagnose", "tasks", "entry", "entry"]


def test_entries_and_re_entries_are_counted_from_the_passes():
    walk = Walk()
    walk.passes = [("(outside)", "ampgan.diagnose.command", "diagnose"),
                   ("ampgan.diagnose.command", "ampgan.diagnose.case", "open_case"),   # same stage: no new entry
                   ("ampgan.diagnose.case", "ampgan.config.schema", "validate"),
                   ("ampgan.config.schema", "ampgan.diagnose.pipeline", "run"),         # diagnose again: a re-entry
                   ("ampgan.diagnose.pipeline", "ampgan.training.loop", "run_steps"),
                   ("ampgan.training.loop", "ampgan.tasks.gan", "train_step"),
                   ("ampgan.diagnose.pipeline", "ampgan.tasks.gan", "train_step")]
    out = walk.summary()
    assert out["passes"] == 7 and out["modules"] == 6
    assert out["stage_order"] == ["diagnose", "config", "diagnose", "training", "tasks"]
    assert out["stage_entries"] == {"diagnose": 2, "config": 1, "training": 1, "tasks": 1}
    assert out["re_entries"] == 1
    assert out["per_function"]["ampgan.tasks.gan.train_step"] == 2 and out["per_module"]["ampgan.tasks.gan"] == 2


def test_the_hook_counts_only_calls_that_cross_modules_with_the_whole_config(tmp_path, monkeypatch):
    """Two real modules of the package's shape, called under the hook: the call that carries a
    `Settings` across counts; the same module calling itself, or a call with a section, does not."""
    pkg = tmp_path / "walkpkg"   # named apart from ampgan: its modules are read as ampgan's by their path
    (pkg / "config").mkdir(parents=True)
    (pkg / "tasks").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "config" / "__init__.py").write_text("")
    (pkg / "tasks" / "__init__.py").write_text("")
    (pkg / "config" / "schema.py").write_text(textwrap.dedent("""
        class Settings:
            section = 1
        def helper(s):
            return s
        def validate(s):
            return helper(s)
    """))
    (pkg / "tasks" / "build.py").write_text(textwrap.dedent("""
        from walkpkg.config.schema import Settings, validate
        def build(s):
            validate(s)
            return section_only(s.section)
        def section_only(x):
            return x
        def start():
            return build(Settings())
    """))
    import devtools.walk as walk_module

    monkeypatch.setattr(walk_module, "PACKAGE", pkg)
    monkeypatch.syspath_prepend(str(tmp_path))
    from walkpkg.tasks.build import start

    walk = Walk()
    sys.setprofile(walk.hook)
    try:
        start()
    finally:
        sys.setprofile(None)
    assert walk.passes == [("ampgan.tasks.build", "ampgan.config.schema", "validate")]
