"""The verdict's rules on traces written by hand, one hole each (issue: a verdict only where the
numbers hold it up): not_amp only when FP32 fails no later than AMP; a
failure in the loss gets the loss's fix; no place claimed without its location; the FP32 twin
keeps the run's clipping; a bare `python -m ampgan.diagnose` diagnoses AMP, not FP32 against
itself."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from ampgan.config.schema import validate
from ampgan.diagnose.case import DiagnoseConfig
from ampgan.diagnose.locate import Located
from ampgan.diagnose.probe import COMPARE_FIELDS
from ampgan.diagnose.replay import NetTrace, Trace
from ampgan.diagnose.verdict import decide
from tests.conftest import compose_cfg
from tests.test_diagnose import compose_diag

PARAMS = ("fc.weight", "fc.bias")


def net_trace(net: str, finite: list[bool], rel_err: float = 0.001, scale: float = 1024.0) -> NetTrace:
    """A net's replay record: `finite[i]` for each sub-step, the same small error on every finite one."""
    t = NetTrace(net, tuple(f"{net}.{p}" if net != "train" else p for p in PARAMS), np.array([64.0, 8.0]))
    for i, ok in enumerate(finite):
        row = np.zeros((len(PARAMS), len(COMPARE_FIELDS)))
        row[:, COMPARE_FIELDS.index("rel_err")] = rel_err if ok else np.nan
        row[:, COMPARE_FIELDS.index("cosine")] = 1.0
        row[:, COMPARE_FIELDS.index("fp32_norm")] = 1.0
        t.iterations.append(i)
        t.compare.append(row)
        t.health.append(np.zeros((len(PARAMS), 4)))
        t.scale.append(scale)
        t.applied.append(ok)
        t.finite.append(ok)
    return t


def synced(nets: dict[str, NetTrace]) -> Trace:
    first = min(((t.iterations[i], n, i) for n, t in nets.items() for i, ok in enumerate(t.finite) if not ok),
                default=None)
    return Trace("synced", nets, 0.0, first)


def fp32_twin(failed_at: int | None = None, iterations: int = 4):
    """The FP32 twin's record as the verdict reads it: when it failed, and the replayed iterations."""
    return SimpleNamespace(failed_at=failed_at, failure="loss nan" if failed_at is not None else "", start_step=0,
                           steps=[SimpleNamespace(iteration=i) for i in range(1, iterations + 1)])


def test_a_dynamic_scaler_finding_its_scale_is_still_healthy():
    s = validate(compose_cfg("amp=o2", "scaler=dynamic"))
    nets = {"critic": net_trace("critic", [False] + [True] * 24), "gen": net_trace("gen", [True] * 5)}
    v = decide(s, DiagnoseConfig(), fp32_twin(), synced(nets), {})
    assert v.name == "healthy"


def test_fp32_failing_later_than_amp_is_amps_failure_not_not_amp():
    s = validate(compose_cfg("model=classifier", "data=digits", "amp=o2", "scaler=static"))
    amp_first = {"train": net_trace("train", [True, True, False, False, False, False])}
    located = Located(2, "train", "forward", "head", float("inf"), 3.0)
    v = decide(s, DiagnoseConfig(), fp32_twin(failed_at=5), synced(amp_first), {}, located)
    assert v.name == "overflow" and v.layer == "head"
    same_time = decide(s, DiagnoseConfig(), fp32_twin(failed_at=2), synced(amp_first), {}, located)
    assert same_time.name == "not_amp" and same_time.exit_code == 3


def test_a_failure_in_the_loss_gets_the_losses_fix_never_a_cell_named_loss():
    s = validate(compose_cfg("model=classifier", "data=digits", "amp=o2", "scaler=static", "amp.fp32_loss=false"))
    nets = {"train": net_trace("train", [True, False, False, False])}
    located = Located(1, "train", "loss", "loss", float("nan"), float("nan"))
    v = decide(s, DiagnoseConfig(), fp32_twin(), synced(nets), {}, located)
    assert v.name == "overflow" and v.layer == ""
    overrides = [o for f in v.fixes for o in f.overrides]
    assert overrides[0] == "amp.fp32_loss=true"
    assert not any(o.startswith("amp.keep_fp32") for o in overrides)
    assert "the loss" in located.describe()


def test_no_place_is_claimed_without_its_location():
    s = validate(compose_cfg("model=classifier", "data=digits", "amp=o2", "scaler=static"))
    nets = {"train": net_trace("train", [False] * 4)}
    v = decide(s, DiagnoseConfig(), fp32_twin(), synced(nets), {}, None)
    assert v.name == "overflow" and v.layer == "" and "?" not in v.headline
    assert "not located" in v.headline and "diagnose.locate=true" in v.headline


def test_the_bare_command_diagnoses_o2_with_dynamic_scaling():
    s = validate(compose_diag())
    assert s.amp.level == "O2" and s.scaler.name == "dynamic"


def test_the_fp32_twin_keeps_the_runs_clipping_and_drops_only_precision():
    from ampgan.diagnose.replay import fp32_twin_settings

    clipped = fp32_twin_settings(validate(compose_cfg("amp=o2", "scaler=fixed_clip", "scaler.clip_norm=0.5")))
    assert clipped.amp.level == "O0" and clipped.scaler.name == "fixed_clip"
    assert clipped.scaler.clip_norm == 0.5 and clipped.scaler.init_scale == 1.0
    assert clipped.scaler == clipped.scaler.fp32_twin(), "the twin's own twin is itself: it keeps its scale on resume"
    dynamic = fp32_twin_settings(validate(compose_cfg("amp=o2", "scaler=dynamic")))
    assert dynamic.scaler.name == "none"



# ---------------------------------------------------------------- per-net accounting, NaN-safe statistics
def wgan_dynamic():
    return validate(compose_cfg("amp=o2", "scaler=dynamic"))


def test_skips_are_counted_per_net_a_generator_failing_every_step_is_not_hidden_by_the_critic():
    # 5 critic steps per generator step: summed over both nets, 5/30 non-finite stayed under skip_tol
    nets = {"critic": net_trace("critic", [True] * 25), "gen": net_trace("gen", [False] * 5)}
    v = decide(wgan_dynamic(), DiagnoseConfig(), fp32_twin(), synced(nets), {})
    assert v.name == "overflow" and "gen" in v.headline and v.exit_code == 1
    assert "no finite gradient to compare" in v.evidence[0]


def test_a_nan_error_is_a_finding_never_dropped_by_max():
    s = validate(compose_cfg("model=classifier", "data=digits", "amp=o2", "scaler=static"))
    nan_error = {"train": net_trace("train", [True] * 4, rel_err=np.nan)}
    v = decide(s, DiagnoseConfig(), fp32_twin(), synced(nan_error), {})
    assert v.name != "healthy"


def test_a_dynamic_scaler_that_settles_and_then_fails_is_overflow_but_finding_its_scale_is_not():
    s = wgan_dynamic()
    settle_then_fail = {"critic": net_trace("critic", [False, True, True, False, False, False, False]),
                        "gen": net_trace("gen", [True] * 2)}
    v = decide(s, DiagnoseConfig(), fp32_twin(), synced(settle_then_fail), {})
    assert v.name == "overflow"
    finding = {"critic": net_trace("critic", [False, False, True, True, True, True, True]),
               "gen": net_trace("gen", [True] * 2)}
    assert decide(s, DiagnoseConfig(), fp32_twin(), synced(finding), {}).name == "healthy"


# ---------------------------------------------------------------- the horizon: does the run fail, does FP32
def course(label: str, failed_at: int | None = None, kind: str = "", done: int = 100, timed_out: bool = False):
    from ampgan.diagnose.horizon import Course

    c = Course(label, 0, 100, "eval/accuracy", "maximize", 1.0, 0.1, 0.9 if failed_at is None else 0.1, done=done,
               timed_out=timed_out)
    if failed_at is not None:
        c.failed_at, c.kind, c.failure = failed_at, kind, f"{kind} at {failed_at}"
    return c


def horizon(amp, fp32, run_failed_at=None):
    from ampgan.diagnose.horizon import Horizon

    return Horizon(amp, fp32, None, run_failed_at, "train/loss not finite" if run_failed_at else "")


def classifier_o2():
    return validate(compose_cfg("model=classifier", "data=digits", "amp=o2", "scaler=dynamic"))


def clean():
    return synced({"train": net_trace("train", [True] * 4)})


def test_fp32_that_does_not_learn_either_is_not_amp_even_without_a_nan():
    both_stuck = horizon(course("AMP", 100, "no_progress"), course("FP32", 100, "no_progress"))
    v = decide(classifier_o2(), DiagnoseConfig(), fp32_twin(), clean(), {}, horizon=both_stuck)
    assert v.name == "not_amp" and v.exit_code == 3 and "no_progress" in v.headline
    # a replay that shows float16 failing comes first: a run that does not learn and overflows too
    located = Located(1, "train", "forward", "head", float("inf"), 3.0)
    failing = synced({"train": net_trace("train", [False] * 4)})
    assert decide(classifier_o2(), DiagnoseConfig(), fp32_twin(), failing, {}, located, horizon=both_stuck).name == "overflow"


def test_not_amp_only_when_fp32_fails_no_later_than_amp():
    amp_first = horizon(course("AMP", 3, "non_finite"), course("FP32", 50, "non_finite"))
    located = Located(1, "train", "forward", "head", float("inf"), 3.0)
    failing = synced({"train": net_trace("train", [False] * 4)})
    v = decide(classifier_o2(), DiagnoseConfig(), fp32_twin(), failing, {}, located, horizon=amp_first)
    assert v.name == "overflow" and v.layer == "head"


def test_a_spike_fp32_survives_but_float16_turns_into_nan_is_float16s_not_not_amp():
    """FP32 diverges by AMP's NaN step, then recovers by the horizon's end: float16 made the spike fatal."""
    located = Located(1, "train", "forward", "head", float("inf"), 3.0)
    failing = synced({"train": net_trace("train", [False] * 4)})
    fp32 = course("FP32", 30, "diverged")
    stays = decide(classifier_o2(), DiagnoseConfig(), fp32_twin(), failing, {}, located,
                   horizon=horizon(course("AMP", 30, "non_finite"), fp32))
    assert stays.name == "not_amp"   # FP32 still diverged at the end: it fails the same way
    fp32.recovered_at, fp32.recovered = 100, "eval/accuracy 0.9 at step 100"
    recovers = decide(classifier_o2(), DiagnoseConfig(), fp32_twin(), failing, {}, located,
                      horizon=horizon(course("AMP", 30, "non_finite"), fp32))
    assert recovers.name == "overflow" and recovers.layer == "head"
    assert any("recovered by step 100" in e for e in recovers.evidence)


def test_a_run_that_fails_where_the_replay_shows_nothing_is_not_reproduced_never_healthy():
    amp_fails = horizon(course("AMP", 40, "non_finite"), course("FP32"))
    v = decide(classifier_o2(), DiagnoseConfig(), fp32_twin(), clean(), {}, horizon=amp_fails)
    assert v.name == "not_reproduced" and v.exit_code == 4
    assert "step 40" in v.headline and any("diagnose.steps=" in e for e in v.evidence)


def test_a_logged_failure_the_replay_did_not_reach_is_not_reproduced_with_the_way_there():
    short = horizon(course("AMP", done=20, timed_out=True), course("FP32", done=20), run_failed_at=80)
    v = decide(classifier_o2(), DiagnoseConfig(), fp32_twin(), clean(), {}, horizon=short, run_failed_at=80)
    assert v.name == "not_reproduced" and "step 80" in v.headline and "horizon_seconds" in v.headline
    assert any("trainer.checkpoint_every" in e and "diagnose.horizon=81" in e for e in v.evidence)
    no_horizon = decide(classifier_o2(), DiagnoseConfig(), fp32_twin(), clean(), {}, run_failed_at=80)
    assert no_horizon.name == "not_reproduced" and "diagnose.horizon=0" in no_horizon.headline


def test_healthy_only_when_the_run_does_not_fail_over_the_horizon():
    fine = horizon(course("AMP"), course("FP32"))
    v = decide(classifier_o2(), DiagnoseConfig(), fp32_twin(), clean(), {}, horizon=fine)
    assert v.name == "healthy" and "does not fail over 100 steps" in v.headline
    unchecked = decide(classifier_o2(), DiagnoseConfig(), fp32_twin(), clean(), {})
    assert unchecked.name == "healthy" and "not checked" in unchecked.headline


def test_precision_only_where_the_run_pays_for_the_gradient_error():
    """A 40% gradient error with nothing else wrong: `precision` when the run fails or trails FP32
    over the horizon, or failed in its logged history, or when no horizon says (diagnose.horizon=0);
    `healthy`, with the error in the headline and the evidence, when the run trains as FP32 does;
    never `healthy` when the horizon was cut short (not_reproduced)."""
    off = synced({"train": net_trace("train", [True] * 4, rel_err=0.4)})
    dcfg = DiagnoseConfig()

    def verdict(h, run_failed_at=None):
        return decide(classifier_o2(), dcfg, fp32_twin(), off, {}, horizon=h, run_failed_at=run_failed_at)

    fine = verdict(horizon(course("AMP"), course("FP32")))
    assert fine.name == "healthy" and not fine.fixes
    assert "a median 0.4 off FP32's (> 0.05), an error the run does not pay for" in fine.headline
    assert "does not pay for" in fine.evidence[0]
    one_step = verdict(horizon(course("AMP", done=1), course("FP32", done=1)))   # a finished run's last checkpoint
    assert one_step.name == "healthy" and "over 1 step " in one_step.headline
    for pays, h, logged in [("fails", horizon(course("AMP", 100, "no_progress"), course("FP32")), None),
                            ("trails", trailing(), None),
                            ("failed in its logged history", horizon(course("AMP"), course("FP32")), 80),
                            ("no horizon", None, None)]:
        v = verdict(h, logged)
        assert v.name == "precision", (pays, v.name, v.headline)
        assert v.layer == "fc" and [f.text for f in v.fixes] == ["amp.keep_fp32=[fc]"], pays
    cut = verdict(horizon(course("AMP", done=20, timed_out=True), course("FP32", done=20)))
    assert cut.name == "not_reproduced" and "was not seen to pay for" in cut.headline and "horizon_seconds" in cut.headline


# ---------------------------------------------------------------- the framework check: measured layer and fix
def framework(run_mode: str, run_err: float, jit_err: float | None = None):
    from ampgan.diagnose.framework import FrameworkCheck, ModeCheck

    check = FrameworkCheck(run_mode, entries=8)
    check.modes[run_mode] = ModeCheck(run_mode, {"critic.score.0.weight": 0.01, "critic.score.6.weight": run_err}, 0.5)
    if jit_err is not None:
        check.modes["jit"] = ModeCheck("jit", {"critic.score.0.weight": 0.01, "critic.score.6.weight": jit_err}, 0.0)
    return check


def test_the_framework_verdict_takes_its_layer_and_fix_from_what_was_measured():
    s = wgan_dynamic()
    nets = {"critic": net_trace("critic", [True] * 5), "gen": net_trace("gen", [True])}
    v = decide(s, DiagnoseConfig(), fp32_twin(), synced(nets), {}, framework=framework("PYNATIVE", 1.0, 0.01))
    assert v.name == "framework" and v.layer == "critic.score.6"
    assert v.fixes and v.fixes[0].overrides[0] == "hardware.jit=true"
    both_wrong = decide(s, DiagnoseConfig(), fp32_twin(), synced(nets), {}, framework=framework("PYNATIVE", 1.0, 0.9))
    assert both_wrong.name == "framework" and not both_wrong.fixes   # no mode measured right: no fix claimed
    nan = decide(s, DiagnoseConfig(), fp32_twin(), synced(nets), {}, framework=framework("jit", np.nan))
    assert nan.name == "framework"   # a NaN gradient is wrong, never passed


def test_relative_error_needs_both_step_sizes_to_be_wrong_and_counts_a_nan_gradient():
    from ampgan.diagnose.framework import relative_error

    fd_good, fd_kinked = np.array([1.0, 2.0, -3.0]), np.array([1.0, 9.0, -3.0])   # a ReLU kink spoils one step
    assert relative_error(np.array([1.0, 2.0, -3.0]), [fd_kinked, fd_good]) < 1e-9
    assert relative_error(np.zeros(3), [fd_kinked, fd_good]) == pytest.approx(1.0)
    assert relative_error(np.array([1.0, np.nan, -3.0]), [fd_good, fd_good]) == np.inf


def test_a_parameter_on_the_net_itself_is_named_but_never_offered_as_a_cell_to_keep_in_fp32():
    """A language model's position table `pos` is a Parameter of the net, not of a cell: a keep-list
    entry `pos` would match no cell (verify: unverifiable)."""
    s = classifier_o2()
    t = net_trace("train", [True] * 4, rel_err=0.5)
    t.param_names = ("pos", "head.fc.weight")
    rows = t.compare
    for row in rows:
        row[1, COMPARE_FIELDS.index("rel_err")] = 0.001   # the head tracks FP32; pos does not
    v = decide(s, DiagnoseConfig(), fp32_twin(), synced({"train": t}), {})
    assert v.name == "precision" and v.layer == "pos"
    assert not any(o.startswith("amp.keep_fp32") for f in v.fixes for o in f.overrides), [f.text for f in v.fixes]


def test_a_scaler_still_halving_through_backward_overflows_is_finding_its_scale_but_a_forward_overflow_fails():
    s = wgan_dynamic()
    gen = net_trace("gen", [False, False])
    gen.scale = [1024.0, 512.0]                      # halved after each skipped step; every loss finite
    gen.amp_losses = [{"loss": 0.5}, {"loss": 0.4}]
    nets = {"critic": net_trace("critic", [True] * 10), "gen": gen}
    v = decide(s, DiagnoseConfig(), fp32_twin(), synced(nets), {})
    assert v.name != "overflow" and any("still finding its scale" in e for e in v.evidence)
    gen.amp_losses = [{"loss": float("inf")}, {"loss": float("inf")}]   # the forward overflows: no scale helps
    assert decide(s, DiagnoseConfig(), fp32_twin(), synced(nets), {}).name == "overflow"



def test_a_net_still_finding_its_scale_is_never_called_healthy_without_the_horizon():
    """Horizon off, the generator's scaler still halving when the replay ended: none of its steps was
    compared with FP32, and nothing shows how the run goes once the scale is found. Not 'healthy'
    (as it was, with 'AMP tracks FP32' read off the critic alone) but not_reproduced, with the
    replay length that lets the scale settle; with the horizon the horizon judges, and says so."""
    s = wgan_dynamic()
    gen = net_trace("gen", [False, False])
    gen.scale = [1024.0, 512.0]
    gen.amp_losses = [{"loss": 0.5}, {"loss": 0.4}]
    nets = {"critic": net_trace("critic", [True] * 10), "gen": gen}
    v = decide(s, DiagnoseConfig(), fp32_twin(iterations=2), synced(nets), {})
    assert v.name == "not_reproduced" and "gen" in v.headline and "found its scale" in v.headline
    assert any("diagnose.steps=13" in e for e in v.evidence)   # 2 + 9 halvings from 512 to 1 + 2
    clean_course = horizon(course("AMP"), course("FP32"))
    v = decide(s, DiagnoseConfig(), fp32_twin(iterations=2), synced(nets), {}, horizon=clean_course)
    assert v.name == "healthy" and "gen: still finding its scale there, judged by the horizon" in v.headline
    gen.finite[1] = True                                  # settled on its second step: compared, and tracking
    assert decide(s, DiagnoseConfig(), fp32_twin(iterations=2), synced(nets), {}).name == "healthy"


def test_verify_replays_a_candidate_still_finding_its_scale_until_it_settles_or_fails():
    """A fix whose replay ended with its scaler still halving has shown nothing: verify replays it for
    one more step per halving down to scale 1, plus 2 (so it settles or fails: below 1 is not
    'finding'), instead of calling it confirmed on no finite step."""
    from ampgan.diagnose.verify import replay_settling_steps

    gen = net_trace("gen", [False, False])
    gen.scale = [1024.0, 512.0]
    gen.amp_losses = [{"loss": 0.5}, {"loss": 0.4}]
    nets = {"critic": net_trace("critic", [True] * 10), "gen": gen}
    analysis = SimpleNamespace(synced=synced(nets))
    assert replay_settling_steps(analysis, 2) == 2 + 9 + 2
    gen.finite[1] = True                               # settled on its second step: judged as it is
    assert replay_settling_steps(analysis, 2) is None

# ---------------------------------------------------------------- the inference stage: float16 breaks the evaluation
def trailing():
    """AMP learns a little (not 'no progress') where FP32 learns much: it trails."""
    amp = course("AMP")
    amp.after = 0.12
    return horizon(amp, course("FP32"))


def evaluated(blames: bool, hit=True):
    from ampgan.diagnose.inference import Inference
    from ampgan.diagnose.oplocate import OpHit

    op = OpHit("BatchNorm", "stem.1", (16,), float("inf"), 4.1e5, "zoo.py", 65, cast_input=True) if hit else None
    return Inference(100, "eval/accuracy", 0.1, 0.12, 0.95 if blames else 0.12, 0.9, blames, op if blames else None,
                     "BatchNorm2d", True)


def test_a_run_trails_fp32_only_when_it_closes_much_less_of_the_gap_and_fp32_learns():
    dcfg = DiagnoseConfig()
    assert trailing().amp_trails(dcfg)
    assert not horizon(course("AMP"), course("FP32")).amp_trails(dcfg)   # both at 0.9
    stuck = trailing()
    stuck.fp32.after = 0.1   # FP32 learns nothing either: nothing to trail
    assert not stuck.amp_trails(dcfg)
    assert not horizon(course("AMP", 40, "non_finite"), course("FP32")).amp_trails(dcfg)   # the replay's business


def test_an_evaluation_that_overflows_in_float16_is_overflow_at_the_ops_cell_with_evaluation_fixes():
    o3 = validate(compose_cfg("model=classifier", "data=digits", "amp=o3", "scaler=dynamic"))
    v = decide(o3, DiagnoseConfig(), fp32_twin(), clean(), {}, horizon=trailing(), inference=evaluated(True))
    assert v.name == "overflow" and v.layer == "stem.1" and v.on_evaluation and v.exit_code == 1
    assert [f.text for f in v.fixes] == ["amp.keep_fp32=[BatchNorm2d]", "amp=o2", "amp.keep_fp32=[stem.1]"]
    assert any("BatchNorm in cell stem.1" in e and "FP32 4.1e+05" in e for e in v.evidence)
    # O2 already keeps BatchNorm in FP32: not offered there
    o2 = decide(classifier_o2(), DiagnoseConfig(), fp32_twin(), clean(), {}, horizon=trailing(), inference=evaluated(True))
    assert "amp=o2" not in [f.text for f in o2.fixes]
    # float16 breaks the evaluation with every op in range: precision, no place claimed, no fix
    bare = decide(o3, DiagnoseConfig(), fp32_twin(), clean(), {}, horizon=trailing(), inference=evaluated(True, hit=False))
    assert bare.name == "precision" and bare.layer == "" and not bare.fixes


def test_weights_that_evaluate_as_badly_in_fp32_are_never_blamed_on_float16():
    v = decide(classifier_o2(), DiagnoseConfig(), fp32_twin(), clean(), {}, horizon=trailing(), inference=evaluated(False))
    assert v.name == "not_reproduced" and not v.on_evaluation and "as badly in FP32" in v.headline
    # a float16 cause the training replay shows comes first
    located = Located(1, "train", "forward", "head", float("inf"), 3.0)
    failing = synced({"train": net_trace("train", [False] * 4)})
    first = decide(classifier_o2(), DiagnoseConfig(), fp32_twin(), failing, {}, located, horizon=trailing(),
                   inference=evaluated(True))
    assert first.name == "overflow" and first.layer == "head" and not first.on_evaluation


def test_an_fp32_input_a_float16_op_casts_beyond_65504_is_the_origin_in_inference_mode_only():
    from ampgan.diagnose.oplocate import OpCall, first_bad_op

    def call(op, cell, dtype, peak, cast_in=0.0):
        return OpCall(op, cell, 0, (8, 16, 8, 8), dtype, peak, 0, 0, 0, False, True, "zoo.py", 65, cast_in, (16,))

    amp = [call("Conv2D", "stem.0", "Float16", 5112.0), call("BatchNorm", "stem.1", "Float16", 0.009, cast_in=4.1e5)]
    fp32 = [call("Conv2D", "stem.0", "Float32", 5108.7), call("BatchNorm", "stem.1", "Float32", 8.8)]
    hit = first_bad_op(amp, fp32, cast_inputs=True)
    assert (hit.op, hit.cell, hit.shape, hit.fp32_max, hit.cast_input) == ("BatchNorm", "stem.1", (16,), 4.1e5, True)
    assert not np.isfinite(hit.amp_max) and "FP32 input cast to float16" in hit.describe()
    assert first_bad_op(amp, fp32) is None   # training passes: BatchNorm's moving statistics are unused inputs


def test_halving_while_finding_the_scale_is_not_an_oscillating_scale():
    """A dynamic scaler that halves through its first skipped steps and then holds: the changes before
    its first finite step are finding the scale, not oscillation (verify's settling replays have many)."""
    s = wgan_dynamic()
    gen = net_trace("gen", [False] * 8 + [True] * 7)
    gen.scale = [2.0 ** (16 - min(i, 8)) for i in range(15)]
    nets = {"critic": net_trace("critic", [True] * 75), "gen": gen}
    assert decide(s, DiagnoseConfig(), fp32_twin(), synced(nets), {}).name == "healthy"
    gen.scale = [2.0 ** (8 + i % 2) for i in range(15)]     # after settling, up and down every step
    gen.finite, gen.applied = [True] * 15, [True] * 15
    gen.compare = [net_trace("gen", [True]).compare[0]] * 15
    assert decide(s, DiagnoseConfig(), fp32_twin(), synced(nets), {}).name == "scaler"


def test_the_docs_show_the_rules_and_interventions_the_code_states():
    """docs/diagnose.md's tables are generated from verdict.py's and interventions.py's docstrings
    (`python -m experiments.diagnose_cases --rules`): they cannot disagree."""
    from pathlib import Path

    from ampgan.diagnose.verdict import EXIT_CODES
    from ampgan.diagnose.verdict_report import docs_blocks

    text = (Path(__file__).resolve().parents[1] / "docs" / "diagnose.md").read_text()
    for (begin, end), block in docs_blocks().items():
        assert text.split(begin, 1)[1].split(end, 1)[0].strip() == block.strip()
    rules = docs_blocks()[next(iter(docs_blocks()))]
    named = {line.split("`")[1] for line in rules.splitlines()[2:]}
    assert named == {"framework", "not_amp", "overflow", "scaler", "underflow", "precision", "not_reproduced",
                     "healthy", "unexplained"}
    assert all(f"| `{name}` |" in rules and rules.split(f"| `{name}` |")[1].split("\n")[0].endswith(f"| {code} |")
               for name, code in EXIT_CODES.items())


# ---------------------------------------------------------------- which bad step is located
def test_under_a_skipping_scaler_the_first_forward_overflow_is_located_not_an_earlier_backward_one():
    """case_annealed_sharpening: the dynamic scale overflows the backward pass at step 2 (skipped,
    the scale halves), the sharpened logits leave float16's range at step 4 (no scale ends that).
    The step located is the forward one; without skipping, the first bad step carries its
    non-finite update into every later one, so it is the one."""
    from ampgan.diagnose.analysis import failure_step

    kinds = ["ok", "backward", "ok", "forward", "forward", "forward"]
    t = net_trace("train", [k == "ok" for k in kinds])
    t.amp_losses = [{"loss": float("nan") if k == "forward" else 0.5} for k in kinds]
    bad = [(SimpleNamespace(iteration=i, net="train"), SimpleNamespace(losses=losses))
           for i, (k, losses) in enumerate(zip(kinds, t.amp_losses)) if k == "backward" or i == 3]
    bad = [(rs_, SimpleNamespace(losses=st.losses, scale=128.0)) for rs_, st in bad]
    trace = synced({"train": t})
    trace.bad = bad
    fits = {"train": SimpleNamespace(k_lo=-10, k_hi=5)}   # every layer fits 2^-10 .. 2^5; the step ran at 128
    skipping = validate(compose_cfg("model=classifier", "data=digits", "amp=o2", "scaler=dynamic"))
    rs, _ = failure_step(trace, skipping, DiagnoseConfig(), fits)
    assert rs.iteration == 3, "the forward overflow no loss scale ends"
    # the flight recorder's sharpening: the head's gradient overflows at any scale >= 1 (k_hi < 0):
    # that backward overflow is no scaler's doing, and stays the first failure
    rs, _ = failure_step(trace, skipping, DiagnoseConfig(), {"train": SimpleNamespace(k_lo=-10, k_hi=-2)})
    assert rs.iteration == 1
    applying = validate(compose_cfg("model=classifier", "data=digits", "amp=o2", "scaler=static",
                                    "scaler.skip_nonfinite=false"))
    rs, _ = failure_step(trace, applying, DiagnoseConfig(), fits)
    assert rs.iteration == 1, "without skipping, the first bad step poisons the rest"
