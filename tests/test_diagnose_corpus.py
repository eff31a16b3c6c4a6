"""diagnose's planted corpus: each preset fails (or not) in float16 for a stated reason, and
diagnose must give the expected verdict, name the expected layer and (`diagnose.verify=true`)
confirm a fix on every AMP case; `diagnose.search=true` finds a keep-list smaller than every cell
on the forward-overflow case; `diagnose.seeds=2` re-checks a fix on the objective. Short replays
(2 iterations) keep the fast part near 4 minutes. The cases on real architectures (a vision
transformer, the causal language model, a ResNet: ampgan_corpus.architectures) are slow tests:
1-3 minutes each (`make test-full`)."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir

from ampgan.config.schema import CONF_DIR
from ampgan.diagnose.command import diagnose

FAST = ["tracking=none", "diagnose.steps=2", "diagnose.mode=synced", "diagnose.max_fixes=1"]

# preset, expected verdict, expected layer ("" when there is none), why float16 fails there
CORPUS = [
    ("diag_healthy", "healthy", "",
     "it does not: the gradients sit inside float16's range at the dynamic scale"),
    ("diag_fp32_fails", "not_amp", "",
     "it is not float16: lr 1e12 makes the FP32 twin's loss non-finite by step 2"),
    ("diag_forward_overflow", "overflow", "head",
     "features x 1e5 inside the cosine head exceed 65504: inf / inf = NaN in float16 only"),
    ("diag_gp_overflow", "overflow", "critic.score.0",
     "the penalty's inner gradient, taken unscaled, passes the first layer's ~1e4 weights and exceeds "
     "65504 at the scaled input, while FP32's is ~16 and every forward value is small"),
    ("diag_underflow", "underflow", "gen.body.4",
     "critic weights 10x too small: the gradient reaching the generator through the critic (~1e-8) "
     "flushes to zero at loss scale 1, half of the generator's gradient norm; FP32 trains"),
    ("diag_scaler_too_high", "scaler", "critic.score.6",
     "a static scale of 1e9 overflows the float16 backward seed: every step skipped"),
    ("diag_precision", "precision", "head",
     "features + 1e3 hold 11 significant bits in float16 (steps of 0.5): centring them inside the head "
     "leaves almost nothing of the features, with every value far inside float16's range"),
    ("diag_framework", "framework", "critic.score",
     "it is not float16: PYNATIVE's second-order gradient of the penalty is wrong (the FP32 twin's too); "
     "the conv critic's final Dense gets zero"),
]


def run(preset: str, *extra: str):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="diagnose_main", overrides=[f"+experiment={preset}", *FAST, *extra])
    with tempfile.TemporaryDirectory(prefix="ampgan-test-diagnose-") as folder:   # its report files
        return diagnose(cfg, Path(folder), echo=lambda *a, **k: None)


# two cases also run the optional stages (one diagnosis each, to keep the file short)
EXTRA = {
    "diag_forward_overflow": ["diagnose.search=true", "diagnose.search_steps=2"],
    "diag_precision": ["diagnose.seeds=2", "diagnose.seed_steps=40"],
}


# every case runs a horizon now (the run and its FP32 twin trained first): two cases stay in
# `make test`, the other six (and the optional stages they run) in `make test-full`, for CI's time
SLOW_CASES = ("diag_framework", "diag_forward_overflow", "diag_precision", "diag_gp_overflow",
              "diag_healthy", "diag_scaler_too_high")  # healthy: test_diagnose's CLI run stays; the scaler rule: test_verdict_rules


@pytest.mark.parametrize("preset,verdict,layer,why",
                         [pytest.param(*c, marks=pytest.mark.slow) if c[0] in SLOW_CASES else c for c in CORPUS],
                         ids=[c[0] for c in CORPUS])
def test_planted_case(preset, verdict, layer, why):
    result = run(preset, "diagnose.verify=true", *EXTRA.get(preset, []))
    v = result.verdict
    assert v.name == verdict, f"{preset} ({why}): got {v.name}: {v.headline}"
    assert v.layer == layer, f"{preset}: layer {v.layer!r}, expected {layer!r} ({why})"
    assert v.exit_code == {"healthy": 0, "not_amp": 3}.get(verdict, 1)
    if verdict in ("healthy", "not_amp"):
        assert not v.fixes
        return
    assert result.checked, f"{preset}: no fix verified"
    best = result.checked[0]
    assert best.confirmed, f"{preset}: best fix {best.fix.text} not confirmed ({best.verdict})"
    if preset == "diag_forward_overflow":
        # ddmin over the classifier's 9 candidate cells: a keep-list smaller than every cell, confirmed
        found = result.search
        assert found is not None and found.confirmed, found
        assert 0 < len(found.keep) < found.candidates == 9 and found.keep == ["head"], found.describe()
        assert best.fix.overrides == [found.override] and found.probes >= 2
    if preset == "diag_precision":
        # the best fix against FP32 on eval/accuracy, seed by seed (stated test: every seed within
        # the margin), with the numbers it is judged on
        proof = result.proof
        assert proof.objective == "eval/accuracy" and len(proof.fp32) == len(proof.fixed) == 2
        assert proof.fix == "amp.keep_fp32=[head]" and proof.equivalent, proof.describe()
        assert proof.gaps == [abs(a - b) for a, b in zip(proof.fixed, proof.fp32)]
        assert "every seed within 0.05" in proof.describe()


# ---------------------------------------------------------------- real architectures
# The zoo's nets as a user changes them (ampgan_corpus.architectures), each preset's header says
# why it fails in float16. Slow: a transformer's or a ResNet's replay, horizon and verify take
# 1-3 minutes each on this CPU (measured times: experiments/README.md, the diagnose corpus).
@dataclass(frozen=True)
class Case:
    preset: str
    verdict: str
    layer: str                        # "" when there is none
    op: tuple[str, str, str] | None   # (op, its cell, its file) that Located.op names; None: no op expected
    confirmed: str = ""               # a candidate fix that verify must confirm
    net_fix: str = ""                 # a change to the net (an override) whose own diagnosis is healthy
    refuted: str = ""                 # a candidate verify replays and must not confirm, with the verdict it gets
    why: str = ""


ARCHITECTURES = [
    Case("diag_attention_overflow", "overflow", "blocks.0.attn", ("ops.matmul", "blocks.0.attn", "architectures.py"),
         net_fix="model.net.qk_norm=true", refuted="amp.keep_fp32=[blocks.0.attn] precision",
         why="ViT: q and k start 150x too large, q.k ~1.1e5 > 65504 is inf in float16 (softmax NaN); FP32's "
             "softmax of big finite logits is fine. The kept attention still gets float16-rounded inputs, "
             "which move logits of 1e5 by tens: only qk-norm fixes it"),
    Case("diag_lm_attention_overflow", "overflow", "blocks.0.attn", ("ops.matmul", "blocks.0.attn", "architectures.py"),
         net_fix="model.net.qk_norm=true", refuted="amp.keep_fp32=[blocks.0.attn] precision",
         why="LM: the same large init (120x) on causal attention, q.k ~1e5; with the attention kept in FP32 "
             "the backward overflows at 2^16 and 2^15, and once the scaler settles the gradients are far "
             "from FP32's (median relative error ~0.9): verify replays it until it settles"),
    Case("diag_lm_fp16_loss", "overflow", "", ("ops.cross_entropy", "", "lm.py"), confirmed="amp.fp32_loss=true",
         why="LM with amp.fp32_loss=false: MindSpore's float16 NLLLoss on CPU accumulates every class's "
             "log-probability (2048 positions x 96 x ~4.6 ~ 9e5 > 65504): the loss is NaN, every cell's output finite"),
    Case("diag_lm_lr", "not_amp", "", None,
         why="LM at lr 1e20: the FP32 twin's loss is not finite by step 2, no later than AMP's"),
    Case("diag_hand_layernorm", "overflow", "embed_norm", ("Tensor.__mul__", "embed_norm", "architectures.py"),
         confirmed="amp.keep_fp32=[embed_norm]",
         why="ViT on raw 12-bit pixels (0..4095) normalised by a hand-written one-pass LayerNorm, which no AMP "
             "level keeps in FP32: x * x passes 65504 in float16 (FP32 2.5e7), inf - inf = NaN"),
    Case("diag_bn_o3", "overflow", "stem.1", ("BatchNorm", "stem.1", "zoo.py"), confirmed="amp=o2",
         why="ResNet on raw 12-bit pixels under O3: the training steps match O2 (the kernel keeps batch statistics "
             "in FP32), but BatchNorm's moving variance (~1e6 after 50 steps, an FP32 parameter) is inf in float16 "
             "at inference: the run trails FP32 (eval/accuracy 0.10 vs 0.98), the same weights evaluate to 0.98 in "
             "FP32, and the inference stage finds the stem's BatchNorm fed it; fixes verified on eval/accuracy"),
    Case("diag_lm_underflow", "underflow", "pos", None, confirmed="scaler=static scaler.init_scale=16384",
         why="LM whose loss divides the token mean by the 2048 tokens again: every gradient is 1/2048 of the "
             "right one and flushes to zero in float16 at loss scale 1; Adam's FP32 steps do not depend on the scale"),
]


@pytest.mark.slow
@pytest.mark.parametrize("case", ARCHITECTURES, ids=lambda c: c.preset)
def test_architecture_case(case: Case):
    result = run(case.preset, "diagnose.verify=true", "diagnose.max_fixes=2")
    v = result.verdict
    assert v.name == case.verdict, f"{case.preset} ({case.why}): got {v.name}: {v.headline}"
    assert v.layer == case.layer, f"{case.preset}: layer {v.layer!r}, expected {case.layer!r} ({case.why})"
    assert v.exit_code == {"healthy": 0, "not_amp": 3}.get(case.verdict, 1)
    op = getattr(result.analysis.located, "op", None)
    if case.op is not None:
        assert op is not None, f"{case.preset}: no op located ({result.analysis.located})"
        assert (op.op, op.cell, Path(op.file).name) == case.op, op.describe()
        assert not np.isfinite(op.amp_max) and np.isfinite(op.fp32_max), op.describe()
    if case.verdict == "not_amp":
        assert not v.fixes
        return
    checked = {c.fix.text: c for c in result.checked or []}
    if case.confirmed:
        assert case.confirmed in checked and checked[case.confirmed].confirmed, \
            f"{case.preset}: {case.confirmed} not confirmed: {[(t, c.verdict) for t, c in checked.items()]}"
    if case.refuted:
        fix, verdict = case.refuted.split()
        assert fix in checked and checked[fix].verdict == verdict, \
            f"{case.preset}: {fix} should replay as {verdict}: {[(t, c.verdict) for t, c in checked.items()]}"
    if case.net_fix:
        fixed = run(case.preset, case.net_fix)
        assert fixed.verdict.name == "healthy", f"{case.preset} with {case.net_fix}: {fixed.verdict.headline}"


def _trained_predictions(preset: str, *overrides: str, steps: int = 3) -> np.ndarray:
    """The preset's classifier after `steps` training steps (ampgan's own task and step): its
    predicted class for each test sample."""
    from ampgan.config.schema import validate
    from ampgan.diagnose.replay import build_seeded
    from ampgan.tasks import load_data

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="diagnose_main", overrides=[f"+experiment={preset}", "tracking=none", *overrides])
    s = validate(cfg)
    task = build_seeded(s, load_data(s))
    for step in range(1, steps + 1):
        task.train_step(step)
    return task.logits(task.data.x_test).argmax(1)


@pytest.mark.slow
def test_bn_o3_inference_collapses():
    """diag_bn_o3's failure, where diagnose's replay does not look: after three O3 training steps
    the stem BatchNorm's moving variance (~4e5, an FP32 parameter) is inf in float16 at inference,
    the stem's features collapse and every test digit gets one class; with BatchNorm kept in FP32
    (what O2 does) the predictions spread over classes as FP32's do."""
    o3 = _trained_predictions("diag_bn_o3")
    kept = _trained_predictions("diag_bn_o3", "amp.keep_fp32=[BatchNorm2d]")
    fp32 = _trained_predictions("diag_bn_o3", "amp=o0", "scaler=none")
    assert len(np.unique(o3)) == 1, np.bincount(o3)
    assert len(np.unique(kept)) > 1 and np.mean(kept == fp32) > 0.9, (np.bincount(kept), np.bincount(fp32))
