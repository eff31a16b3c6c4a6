"""Study 1, WGAN-GP under AMP: which differences from FP32 exceed seed noise?

FP32 against O2 with each loss scale (dynamic, underflow-aware, fixed + clipping, static), with
the gradient penalty through an FP32 twin, and O3 with the dynamic scale, on 8 Gaussians, three
seeds each: 128-wide MLPs, batch 256, Adam 6e-4, 1000 generator steps of 5 critic steps (the
loss-scale study's length, at which its FP32 run covered 8 of 8 modes). The FP32 reference must
cover >= 6 of 8 modes on every seed before anything is compared with it
(`conf/experiment/study_wgan_amp.yaml`, `conf/arm/wgan_data/gaussians8_long.yaml`).

    python -m experiments.wgan_amp            # the default form above: 21 runs
    python -m experiments.wgan_amp --full     # also 25 Gaussians and 8x8 digits, O3 with every
                                              # scale, 1000 generator steps each: 99 runs
    python -m experiments.wgan_amp --quick    # 4 runs of 4 steps: checks that it runs
"""

from __future__ import annotations

import sys

from experiments.study import Bar, Context, Study, beyond_noise, run, seeds

STUDY = Study(
    setup=__doc__.split("\n\n")[1],
    name="wgan_amp",
    title="WGAN-GP under AMP",
    question="Does O2 or O3, with any loss scale or an FP32 gradient penalty, train a WGAN-GP differently from FP32 beyond seed noise?",
    groups=["wgan_data", "wgan_amp"],
    metrics=["swd", "modes_covered", "critic skipped", "critic final scale", "critic underflow (mean)", "critic clip rate"],
    reference={"wgan_amp": "fp32"},
    # a reference that has not learned the data compares nothing: most modes covered on every seed
    # (digits, in --full, has no mode count and no measured bar: no conclusion is drawn there)
    bars=[Bar("modes_covered", 6, facet="gaussians8_long"), Bar("modes_covered", 6, facet="gaussians8"),
          Bar("modes_covered", 18, facet="gaussians25")],
    facet="wgan_data",
    quick=["+arm/wgan_data=gaussians8_long", "+arm/wgan_amp=fp32,o2_dynamic", "trainer.seed=0,1", "trainer.max_steps=4",
           "trainer.eval_samples=200"],
    full=["+arm/wgan_data=gaussians8_long,gaussians25,digits", "+arm/wgan_amp=fp32,o2_dynamic,o2_underflow_aware,o2_fixed_clip,o2_static,o2_fp32_gp,"
          "o3_dynamic,o3_underflow_aware,o3_fixed_clip,o3_static,o3_fp32_gp", "trainer.max_steps=1000",
          "trainer.eval_every=250"],
)


def identical(ctx: Context) -> list[list[str]]:
    """Configurations whose runs gave the very same swd, seed by seed, on every data set."""
    runs: dict[str, list] = {}
    for r in sorted(ctx.rows, key=lambda r: (r["wgan_data"], str(r.get("trainer.seed")))):
        runs.setdefault(r["wgan_amp"], []).append(r.get("swd"))
    same: dict[tuple, list[str]] = {}
    for arm, values in runs.items():
        same.setdefault(tuple(values), []).append(arm)
    return [arms for arms in same.values() if len(arms) > 1]


def answer(ctx: Context) -> str:
    worse, better = beyond_noise(ctx, lower_is_better=True)
    n = sum(1 for r in ctx.table if r.get("beyond noise") in ("yes", "no"))
    twins = "; ".join(" = ".join(arms) for arms in identical(ctx))
    twins = f" Identical runs, seed for seed: {twins}." if twins else ""
    if not worse and not better:
        return (f"None of the {n} AMP configurations differs from FP32 in swd beyond seed noise "
                f"(t-test paired by seed, p >= 0.05, {seeds(ctx)} seeds each).{twins}")
    parts = []
    if worse:
        parts.append("worse than FP32: " + ", ".join(worse))
    if better:
        parts.append("better than FP32: " + ", ".join(better))
    return (f"{n - len(worse) - len(better)} of {n} AMP configurations match FP32 within seed noise; "
            + "; ".join(parts) + "." + twins)


if __name__ == "__main__":
    sys.exit(run(STUDY, answer=answer))
