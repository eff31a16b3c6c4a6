"""Study 3, underflow for real: float16 stops learning while FP32 trains; which scaler recovers it?

A classifier whose head scales its logits by 1e-4 (`conf/experiment/study_underflow.yaml`):
FP32 and each O2 loss scale (`conf/arm/underflow/`), three seeds; diagnose on the unscaled O2
run gives the verdict and each layer's loss-scale range.

    python -m experiments.underflow [--full | --quick]
"""

from __future__ import annotations

import sys

from experiments.study import Bar, Context, Study, beyond_noise, diagnose_run, first_run, quick_diagnose, run, seeds

STUDY = Study(
    setup=__doc__.split("\n\n")[1],
    name="underflow",
    title="Underflow for real",
    question="When float16 underflow stops learning while FP32 trains, which loss scale recovers it?",
    groups=["underflow"],
    metrics=["accuracy", "train final scale", "train underflow (mean)", "train skipped"],
    reference={"underflow": "fp32"},
    bars=[Bar("accuracy", 0.8)],   # FP32 learns digits (10 classes; chance 0.1)
    quick=["+arm/underflow=fp32,o2_none", "trainer.seed=0,1", "trainer.max_steps=4"],
    full=["trainer.max_steps=1500"],
)


def after(ctx: Context) -> None:
    target = first_run(ctx, underflow="o2_none")
    if target is None:
        return
    d = diagnose_run(ctx, target.info.run_id, quick_diagnose(ctx))
    ctx.diagnoses["o2_none"] = d
    ctx.notes.append(f"diagnose o2_none (run {target.info.run_name}): verdict {d['verdict']} at {d['layer']}"
                     + (f", fix: {d['fix']}" if d["fix"] != "-" else "") + f" (diagnose run {d['diagnose run']})")
    ranges = [line for line in d["text"].splitlines() if "range" in line.lower() or line.startswith("  ")]
    ctx.notes += ranges[:14]


def charts(ctx: Context) -> dict:
    from ampgan.reporting.sweep_report import chart_loss_scale

    firsts = [r for r in (first_run(ctx, underflow=row["underflow"]) for row in ctx.table) if r is not None]
    return {"loss_scale": chart_loss_scale(ctx.client, [r for r in firsts if "none" not in r.info.run_name
                                                        and "fp32" not in r.info.run_name] or firsts)}


def answer(ctx: Context) -> str:
    worse, _ = beyond_noise(ctx, lower_is_better=False)
    failed = {w.split(" ")[0] for w in worse}
    ok = [r["underflow"] for r in ctx.table if r["underflow"] != "fp32" and r["underflow"] not in failed]
    verdict = ctx.diagnoses.get("o2_none", {})
    return (f"Below FP32's accuracy beyond seed noise: {', '.join(sorted(failed)) or 'none'}; "
            f"within noise of FP32: {', '.join(ok) or 'none'} ({seeds(ctx)} seeds); diagnose on O2 without a "
            f"scale: {verdict.get('verdict', '-')} at {verdict.get('layer', '-')}.")


STUDY.after, STUDY.charts = after, charts

if __name__ == "__main__":
    sys.exit(run(STUDY, answer=answer))
