"""A verdict is an experiment (ampgan/diagnose/interventions.py): which interventions are replayed
for a hypothesis, and how their outcomes decide the verdict. Pure functions over hand-written
outcomes: every branch of `confirm`, and that no fix is kept whose replay did not remove the failure."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from ampgan.diagnose.interventions import Evidence, candidates, confirm, table, unconfirmed
from ampgan.diagnose.verdict import Fix, Verdict


@dataclass
class Outcome:   # the shape of verify.Checked that confirm and table read
    fix: Fix
    verdict: str
    rel_err: float = 0.001
    seconds: float = 1.0

    @property
    def confirmed(self) -> bool:
        return self.verdict == "healthy"


def facts(**changes) -> Evidence:
    base = dict(jit=True, scale=65536.0, nonfinite=True, located_cell="attn", fp32_fails=False,
                fp32_line="eval/accuracy 0.1 -> 0.9; does not fail")
    return Evidence(**{**base, **changes})


KEEP = Fix(["amp.keep_fp32=[attn]"], "attn in FP32")
SCALE = Fix(["scaler.init_scale=16384"], "a smaller scale", "scaler")
OVERFLOW = Verdict("overflow", "forward overflow at attn", ["e"], "attn", [KEEP])
SCALER = Verdict("scaler", "the loss scale oscillates", ["e"], "", [SCALE])


def texts(fixes) -> list[str]:
    return [f.text for f in fixes]


def test_candidates_put_the_mode_first_then_other_causes_probes_then_the_hypothesis_and_its_own_probes():
    tried = candidates(SCALER, facts(jit=False))
    assert texts(tried) == ["hardware.jit=true hardware.unsafe_pynative_gp=false", "amp.keep_fp32=[attn]",
                            "amp=o1 amp.keep_fp32=[attn]", "scaler.init_scale=16384", "scaler=static scaler.init_scale=1"]
    assert [f.cause for f in tried] == ["framework", "overflow", "overflow", "scaler", "scaler"]


def test_a_hypothesis_fix_keeps_its_cause_when_a_probe_repeats_it():
    tried = candidates(OVERFLOW, facts())
    assert texts(tried) == ["scaler=static scaler.init_scale=1", "amp.keep_fp32=[attn]", "amp=o1 amp.keep_fp32=[attn]"]
    assert [f.cause for f in tried] == ["scaler", "overflow", "overflow"] and tried[1].why == "attn in FP32"


@pytest.mark.parametrize("level, o1", [("O1", False), ("O2", True), ("O3", True)])
def test_the_located_cell_keeps_its_output_fp32_under_o1_only_when_o2_or_o3_would_cast_it_back(level, o1):
    """O2/O3 run a kept cell in FP32 and cast its output to float16: a cell whose own output passes
    65504 (a sharpened logit) is removed only by O1 with it kept; an O1 run has that probe already."""
    tried = texts(candidates(OVERFLOW, facts(level=level)))
    assert ("amp=o1 amp.keep_fp32=[attn]" in tried) is o1 and "amp.keep_fp32=[attn]" in tried


def test_no_cell_or_scale_probe_without_non_finite_steps_nor_a_scale_probe_at_scale_one():
    precision = Verdict("precision", "error 0.3", [], "head", [Fix(["amp.fp32_loss=true"], "loss in FP32")])
    assert texts(candidates(precision, facts(nonfinite=False))) == ["amp.fp32_loss=true"]
    assert "scaler=static scaler.init_scale=1" not in texts(candidates(OVERFLOW, facts(scale=1.0)))


@pytest.mark.parametrize("name", ["healthy", "not_reproduced"])
def test_nothing_is_replayed_when_there_is_no_failure_to_remove(name):
    v = Verdict(name, "h", [], "", [])
    assert candidates(v, facts(jit=False)) == []
    assert confirm(v, [], facts()) is v


def test_when_fp32_fails_too_only_the_mode_is_tried_and_the_verdict_is_not_amp():
    assert texts(candidates(OVERFLOW, facts(fp32_fails=True))) == []
    assert texts(candidates(OVERFLOW, facts(fp32_fails=True, jit=False))) == [
        "hardware.jit=true hardware.unsafe_pynative_gp=false"]
    v = confirm(OVERFLOW, [], facts(fp32_fails=True))
    assert v.name == "not_amp" and v.exit_code == 3 and not v.fixes


def test_the_mode_removing_the_failure_is_framework_whatever_the_rules_suspected():
    jit = candidates(OVERFLOW, facts(jit=False))[0]
    v = confirm(OVERFLOW, [Outcome(jit, "healthy"), Outcome(KEEP, "healthy")], facts(jit=False))
    assert v.name == "framework" and texts(v.fixes) == [jit.text] and "suspected overflow" in v.headline
    framework = Verdict("framework", "wrong GP gradient", [], "critic.score", [])
    not_removed = confirm(framework, [Outcome(jit, "precision")], facts(jit=False))
    assert not_removed.name == "unexplained" and not_removed.exit_code == 5 and not not_removed.fixes
    assert confirm(framework, [Outcome(jit, "precision")], facts(jit=False, fp32_fails=True)).name == "not_amp"


def test_the_hypothesis_stands_only_with_its_own_removing_fixes():
    other = Fix(["amp.keep_fp32=[head]"], "head in FP32")
    v = confirm(OVERFLOW, [Outcome(KEEP, "healthy"), Outcome(other, "overflow")], facts())
    assert v.name == "overflow" and texts(v.fixes) == ["amp.keep_fp32=[attn]"]


def test_another_cause_whose_intervention_removes_the_failure_replaces_the_hypothesis():
    keep = Fix(["amp.keep_fp32=[attn]"], "the located cell attn in FP32", "overflow")
    v = confirm(SCALER, [Outcome(SCALE, "overflow"), Outcome(keep, "healthy")], facts())
    assert v.name == "overflow" and v.layer == "attn" and texts(v.fixes) == ["amp.keep_fp32=[attn]"]
    assert "suspected scaler" in v.headline


def test_no_removing_intervention_is_unexplained_never_the_nearest_rule():
    v = confirm(SCALER, [Outcome(SCALE, "overflow"), Outcome(KEEP, "overflow")], facts())
    assert v.name == "unexplained" and v.exit_code == 5 and not v.fixes
    assert "no intervention tried removes the failure" in v.headline


def test_the_table_starts_with_fp32_and_gives_each_outcome():
    rows = table([Outcome(SCALE, "overflow"), Outcome(KEEP, "healthy")], facts())
    assert [r["intervention"].split(" ")[0] for r in rows] == ["FP32", "scaler.init_scale=16384", "amp.keep_fp32=[attn]"]
    assert [r["removes_failure"] for r in rows] == [True, False, True]
    assert rows[1]["outcome"].startswith("does not (its replay: overflow") and rows[2]["outcome"].startswith("removes")
    assert table([], facts(fp32_fails=True))[0]["outcome"].startswith("fails too")


def test_an_unconfirmed_hypothesis_prints_no_fix():
    v = unconfirmed(OVERFLOW)
    assert v.name == "overflow" and not v.fixes and "not confirmed" in v.headline


def test_replaying_stops_once_the_mode_or_the_hypothesis_is_confirmed():
    from ampgan.diagnose.interventions import settles

    enough = settles(SCALER)
    assert enough(Outcome(SCALE, "healthy"))
    assert enough(Outcome(Fix(list(("hardware.jit=true",)), "jit", "framework"), "healthy"))
    other = Fix(["amp.keep_fp32=[attn]"], "attn in FP32", "overflow")
    assert not enough(Outcome(other, "healthy"))         # another cause: the hypothesis's own may still remove it
    assert enough(Outcome(KEEP, "healthy"))              # untagged: the hypothesis's own
    assert not enough(Outcome(SCALE, "overflow"))        # not removed


def test_max_fixes_cuts_the_hypothesis_fixes_never_the_probes_that_decide_the_verdict():
    """With diagnose.max_fixes=1 the hypothesis's first fix is still replayed after the other cause's
    probe (a cut of the whole list to one left only that probe: every planted overflow `unexplained`)."""
    many = Verdict("overflow", "h", [], "attn", [KEEP, Fix(["amp.keep_fp32=[head]"], "head in FP32")])
    tried = texts(candidates(many, facts(jit=False), max_fixes=1))
    assert tried == ["hardware.jit=true hardware.unsafe_pynative_gp=false", "scaler=static scaler.init_scale=1",
                     "amp.keep_fp32=[attn]", "amp=o1 amp.keep_fp32=[attn]"]
    assert "amp.keep_fp32=[head]" in texts(candidates(many, facts(), max_fixes=2))
