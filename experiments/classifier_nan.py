"""Study 4, the classifier "NaN under O2": where does FP32 train, where does only O2 fail?

Learning rates 1e-3 .. 1 x (FP32, the seed's O2, O2 with a float16 loss, O2 with clipping,
O2 with the head in FP32), three seeds; diagnose on the seed's O2 run at each rate
(`conf/experiment/study_classifier_nan.yaml`).

    python -m experiments.classifier_nan [--full | --quick]
"""

from __future__ import annotations

import sys

from experiments.study import Bar, Context, Study, chart_lines, diagnose_run, first_run, quick_diagnose, run, seeds

TRAINS = 0.8   # mean test accuracy at which a configuration counts as training (digits, 10 classes)

STUDY = Study(
    setup=__doc__.split("\n\n")[1],
    name="classifier_nan",
    title="The classifier NaN",
    question="Across learning rates, where does FP32 train, where does only O2 fail, where do both, and what do the fixes change?",
    groups=["model.lr", "nan_fix"],
    metrics=["accuracy", "loss", "train skipped", "train clip rate"],
    reference={"nan_fix": "fp32"},
    bars=[Bar("accuracy", TRAINS)],   # per learning rate: where FP32 does not train, nothing is compared
    facet="model.lr",
    quick=["model.lr=1e-2", "+arm/nan_fix=fp32,o2", "trainer.seed=0,1", "trainer.max_steps=4"],
    full=["trainer.max_steps=1000"],
)


def after(ctx: Context) -> None:
    for lr in dict.fromkeys(r["model.lr"] for r in ctx.table):
        target = first_run(ctx, **{"model.lr": lr, "nan_fix": "o2"})
        if target is None:
            continue
        d = diagnose_run(ctx, target.info.run_id, quick_diagnose(ctx))
        ctx.diagnoses[lr] = d
        ctx.notes.append(f"diagnose O2 at lr {lr} (run {target.info.run_name}): verdict {d['verdict']}"
                         + (f" at {d['layer']}" if d["layer"] != "-" else "") + (f", fix: {d['fix']}" if d["fix"] != "-" else ""))
    for row in ctx.table:
        if row["nan_fix"] == "o2":
            row["diagnose"] = ctx.diagnoses.get(row["model.lr"], {}).get("verdict", "-")


def charts(ctx: Context) -> dict:
    return {"accuracy_vs_lr": chart_lines(ctx.rows, "model.lr", "nan_fix", "accuracy", "test accuracy against the learning rate")}


def trains(row: dict) -> bool:
    return row["diverged"] == 0 and row["_accuracy"]["n"] > 0 and row["_accuracy"]["mean"] >= TRAINS


def answer(ctx: Context) -> str:
    lrs = list(dict.fromkeys(r["model.lr"] for r in ctx.table))
    fp32 = {r["model.lr"]: r for r in ctx.table if r["nan_fix"] == "fp32"}
    ok = [lr for lr in lrs if lr in fp32 and trains(fp32[lr])]
    bad = [lr for lr in lrs if lr in fp32 and not trains(fp32[lr])]
    nonfinite = sum(r["diverged"] for r in ctx.table)
    off = [f"{r['nan_fix']} at lr {r['model.lr']} ({r['accuracy - ref']}, p {r['p']})"
           for r in ctx.table if r.get("beyond noise") == "yes"]
    verdicts = sorted({d["verdict"] for d in ctx.diagnoses.values()})
    return (f"{nonfinite} of {len(ctx.runs)} runs went non-finite; FP32 trains (accuracy >= {TRAINS}) at lr "
            f"{', '.join(ok) or 'none'} and falls short at {', '.join(bad) or 'none'}; the seed's O2 and the fixes "
            f"differ from FP32 beyond seed noise {'only for ' + '; '.join(off) if off else 'nowhere'} "
            f"({seeds(ctx)} seeds, accuracy); diagnose on O2 at each rate: {', '.join(verdicts) or '-'}.")


STUDY.after, STUDY.charts = after, charts

if __name__ == "__main__":
    sys.exit(run(STUDY, answer=answer))
