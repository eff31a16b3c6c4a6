"""diagnose's corpus, as data: each case's preset and the verdict it must get, written before the
rules it tests. Read by the tests (tests/test_diagnose_corpus.py, tests/test_diagnose_cases.py)
and by the confusion table's command (`python -m experiments.diagnose_cases`), so the table in
docs/diagnose.md and the tests judge the same expectations.

PLANTED: one per verdict on ampgan's toy nets, and a harmless twin of one; ARCHITECTURES: on the zoo's real architectures;
REALISTIC: runs a user could have written, which the rules were not tuned on.
"""

from __future__ import annotations

from dataclasses import dataclass

# preset, expected verdict, expected layer ("" when there is none), why float16 fails there
PLANTED = [
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
     "features + 1.6e4 sit where float16's steps are 8: centring them inside the head leaves nothing of "
     "features of size ~1, with every value far inside float16's range; the run does not learn, FP32 does"),
    ("diag_precision_harmless", "healthy", "",
     "it costs nothing: features + 1e3 (steps of 0.5) put the head's gradient ~40% off FP32's, but the run "
     "learns as its FP32 twin does (accuracy 1 in 50 steps): an error is evidence, not a failure"),
    ("diag_framework", "framework", "critic.score",
     "it is not float16: PYNATIVE's second-order gradient of the penalty is wrong (the FP32 twin's too); "
     "the conv critic's final Dense gets zero"),
]


# planted cases whose failure shows only over a longer horizon than the short one the corpus test
# and the confusion run give the others (diagnose.horizon=50): measured, in 50 steps neither
# PYNATIVE nor jit moves diag_framework's swd (0.6793 -> 0.6793), so the jit intervention cannot
# show that it removes the failure (not_amp); over 300 steps jit learns and PYNATIVE does not (framework)
PLANTED_HORIZON = {"diag_framework": ("diagnose.horizon=300",)}

@dataclass(frozen=True)
class ArchitectureCase:
    preset: str
    verdict: str
    layer: str                        # "" when there is none
    op: tuple[str, str, str] | None   # (op, its cell, its file) that Located.op names; None: no op expected
    confirmed: str = ""               # a candidate fix that verify must confirm
    net_fix: str = ""                 # a change to the net (an override) whose own diagnosis is healthy
    refuted: str = ""                 # a candidate verify replays and must not confirm, with the verdict it gets
    why: str = ""


ARCHITECTURES = [
    ArchitectureCase("diag_attention_overflow", "overflow", "blocks.0.attn", ("ops.matmul", "blocks.0.attn", "architectures.py"),
         net_fix="model.net.qk_norm=true", refuted="amp.keep_fp32=[blocks.0.attn] precision",
         why="ViT: q and k start 150x too large, q.k ~1.1e5 > 65504 is inf in float16 (softmax NaN); FP32's "
             "softmax of big finite logits is fine. The kept attention still gets float16-rounded inputs, "
             "which move logits of 1e5 by tens: only qk-norm fixes it"),
    ArchitectureCase("diag_lm_attention_overflow", "overflow", "blocks.0.attn", ("ops.matmul", "blocks.0.attn", "architectures.py"),
         net_fix="model.net.qk_norm=true", refuted="amp.keep_fp32=[blocks.0.attn] precision",
         why="LM: the same large init (120x) on causal attention, q.k ~1e5; with the attention kept in FP32 "
             "the backward overflows at 2^16 and 2^15, and once the scaler settles the gradients are far "
             "from FP32's (median relative error ~0.9): verify replays it until it settles"),
    ArchitectureCase("diag_lm_fp16_loss", "overflow", "", ("ops.cross_entropy", "", "lm.py"), confirmed="amp.fp32_loss=true",
         why="LM with amp.fp32_loss=false: MindSpore's float16 NLLLoss on CPU accumulates every class's "
             "log-probability (2048 positions x 96 x ~4.6 ~ 9e5 > 65504): the loss is NaN, every cell's output finite"),
    ArchitectureCase("diag_lm_lr", "not_amp", "", None,
         why="LM at lr 1e20: the FP32 twin's loss is not finite by step 2, no later than AMP's"),
    ArchitectureCase("diag_hand_layernorm", "overflow", "embed_norm", ("Tensor.__mul__", "embed_norm", "architectures.py"),
         confirmed="amp.keep_fp32=[embed_norm]",
         why="ViT on raw 12-bit pixels (0..4095) normalised by a hand-written one-pass LayerNorm, which no AMP "
             "level keeps in FP32: x * x passes 65504 in float16 (FP32 2.5e7), inf - inf = NaN"),
    ArchitectureCase("diag_bn_o3", "overflow", "stem.1", ("BatchNorm", "stem.1", "zoo.py"),
         confirmed="amp.keep_fp32=[BatchNorm2d]",   # tried first now, and confirmed: verify stops there (max_fixes=2)
         why="ResNet on raw 12-bit pixels under O3: the training steps match O2 (the kernel keeps batch statistics "
             "in FP32), but BatchNorm's moving variance (~1e6 after 50 steps, an FP32 parameter) is inf in float16 "
             "at inference: the run trails FP32 (eval/accuracy 0.10 vs 0.98), the same weights evaluate to 0.98 in "
             "FP32, and the inference stage finds the stem's BatchNorm fed it; fixes verified on eval/accuracy"),
    ArchitectureCase("diag_lm_underflow", "underflow", "pos", None, confirmed="scaler=static scaler.init_scale=16384",
         why="LM whose loss divides the token mean by the 2048 tokens again: every gradient is 1/2048 of the "
             "right one and flushes to zero in float16 at loss scale 1; Adam's FP32 steps do not depend on the scale"),
]


@dataclass(frozen=True)
class Case:
    preset: str
    verdict: str
    layer: str = ""
    site: tuple[str, str, int] | None = None   # (op, file name, line) of the first op out of float16's range
    fix: str = ""                              # a fix the interventions must confirm (and print)
    overrides: tuple[str, ...] = ()
    slow: bool = True
    why: str = ""


REALISTIC = [
    Case("case_temperature_attention", "overflow", "attn", ("Tensor.__mul__", "temperature_attention.py", 27),
         "amp.keep_fp32=[attn]", slow=False,
         why="the temperature 1e6/sqrt(16) is above 65504 itself: every step inf at any scale; FP32 trains"),
    Case("case_naive_softplus", "overflow", "act", ("ops.exp", "naive_softplus.py", 20), "amp.keep_fp32=[act]",
         why="exp(20 x) passes 65504 once x > 0.55"),
    Case("case_classifier_lr1", "healthy",
         why="Adam at lr 1.0 on digits: written as 'falls to chance after step 50 in FP32 too' (a report), measured "
             "to train in both over its 500 steps (0.986 AMP, 0.969 FP32)"),
    Case("case_pynative_wgan_o2", "framework", fix="hardware.jit=true hardware.unsafe_pynative_gp=false",
         why="PYNATIVE's penalty gradient is right in FP32 for Dense nets, wrong under O2: the mode, not float16"),
    Case("case_pynative_wgan_swissroll_o3", "framework", fix="hardware.jit=true hardware.unsafe_pynative_gp=false",
         why="the same on the Swiss roll under O3"),
    Case("case_static_scale_too_high", "scaler", why="a static scale of 2^24 overflows every backward pass"),
    Case("case_late_logit_overflow", "healthy",
         why="written as 'logits x 2000 pass 65504 only after some training' (overflow at head); measured: no step "
             "is non-finite over its 300 steps under O3 (accuracy 0.10 -> 0.958, as FP32): the softmax saturates "
             "before the logits grow that far"),
    Case("case_annealed_sharpening", "overflow", "sharpen", ("Tensor.__mul__", "annealed_sharpening.py", 24),
         "amp=o1 amp.keep_fp32=[sharpen]",
         why="a sharpening factor growing 5% a step: the logits pass 65504 in float16 at step 210 of 300. Written "
             "expecting the fix amp.keep_fp32=[sharpen]; measured: under O2 the kept cell's output is cast back to "
             "float16, still inf, so only O1 with it kept (its output FP32) removes the failure"),
    Case("case_healthy_full", "healthy", why="healthy for its whole configured length"),
    Case("case_slow_fp32", "healthy", why="FP32 learns slowly but learns; AMP as slowly: slow is not 'no progress'"),
    Case("case_wgan_o2_full", "healthy", why="the default WGAN-GP under O2 trains like FP32 over its 1000 steps"),
    Case("case_wgan_o2_long", "healthy",
         why="the default WGAN-GP at 3000 steps under O2 matches FP32 within seed noise (the WGAN-GP study, 5 seeds); "
             "its critic's 6% gradient error at the end is not a failure"),
    Case("case_classifier_lr1", "not_reproduced", overrides=("diagnose.horizon_seconds=2",),
         why="a time bound that cuts the horizon short: the step reached and how to go further, never healthy"),
]
