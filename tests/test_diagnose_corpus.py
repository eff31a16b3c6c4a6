"""diagnose's planted corpus: each preset fails (or not) in float16 for a stated reason, and
diagnose must give the expected verdict, name the expected layer and (`diagnose.verify=true`)
confirm a fix on every AMP case; `diagnose.search=true` finds a keep-list smaller than every cell
on the forward-overflow case; `diagnose.seeds=2` re-checks a fix on the objective. Short replays
(2 iterations) keep the file near 4 minutes."""

from __future__ import annotations

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
    ("diag_framework", "framework", "critic",
     "it is not float16: PYNATIVE's second-order gradient of the penalty is wrong (the FP32 twin's too); "
     "the conv critic's final Dense gets zero"),
]


def run(preset: str, *extra: str):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="diagnose_main", overrides=[f"+experiment={preset}", *FAST, *extra])
    return diagnose(cfg, None, echo=lambda *a, **k: None)


# two cases also run the optional stages (one diagnosis each, to keep the file short)
EXTRA = {
    "diag_forward_overflow": ["diagnose.search=true", "diagnose.search_steps=2"],
    "diag_precision": ["diagnose.seeds=2", "diagnose.seed_steps=40"],
}


@pytest.mark.parametrize("preset,verdict,layer,why", CORPUS, ids=[c[0] for c in CORPUS])
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
