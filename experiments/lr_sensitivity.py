"""Study 6, learning-rate sensitivity: does float16 move a transformer's divergence threshold?

After Wortsman et al. 2023 ("Small-scale proxies for large-scale Transformer training
instabilities", arXiv 2309.14322). The project's language model (model=lm: the zoo's
CausalTransformer, dim 64, 2 blocks of 4 heads, on Python's docstrings) trains 100 Adam steps
at batch 32 for each learning rate 1e-3 .. 3e-1: FP32 and O2 (dynamic scaling), each with and
without qk-layernorm, and O2 with qk-layernorm and z-loss 1e-4 (`conf/arm/lm_arm/`), two seeds
(`conf/experiment/study_lr_sensitivity.yaml`). Final loss: the test loss in nats, capped at the
initial loss ln(vocab) (a non-finite loss counts as that cap), as the paper caps it. A run
fails when its final loss is no better than the letter frequencies' entropy; an arm's
divergence threshold is the first learning rate above its best one where a seed fails. The
largest attention logit over training is the max of `act/blocks.<i>.attn.logits/max_abs`
(the activation headroom, logged every 20 steps). Diagnose (4 synced steps) runs on each
float16 arm's first failing run, and on its first non-finite one when that comes later; an
FP32 run is its own FP32 twin, so FP32 arms are not diagnosed.

    python -m experiments.lr_sensitivity [--full | --quick]
"""

from __future__ import annotations

import math
import sys
from collections import Counter

from experiments.study import (Bar, Context, Study, chart_lines, diagnose_run, quick_diagnose, run, same_value,
                               seed_table, untrained)

ARM = "lm_arm"
LR = "model.lr"
REFERENCE_LR = "3e-3"
TRAINED = 3.0        # nats: the reference (FP32, lr 3e-3) must reach this test loss on every seed
PAIRS = (("fp32", "o2"), ("fp32_qknorm", "o2_qknorm"))   # the same net in FP32 and in float16
LOGIT_KEY = "attn.logits/max_abs"                         # act/blocks.<i>.attn.logits/max_abs
DIAGNOSE = ["diagnose.steps=4", "diagnose.mode=synced"]   # the default form's diagnose: 4 replayed steps

STUDY = Study(
    setup=__doc__.split("\n\n")[1],
    name="lr_sensitivity",
    title="Learning-rate sensitivity of the language model",
    question=("Across learning rates over 2.5 orders of magnitude, does float16 (O2) move the language model's "
              "divergence threshold, do qk-layernorm and z-loss remove the sensitivity, and does diagnose say "
              "'not AMP' where FP32 diverges too?"),
    groups=[ARM, LR],
    metrics=["final loss", "max attn logit", "train skipped", "train final scale"],
    reference={ARM: "fp32", LR: REFERENCE_LR},
    bars=[Bar("final loss", TRAINED, higher_is_better=False)],
    quick=[f"+arm/{ARM}=fp32,o2", f"{LR}={REFERENCE_LR}", "trainer.seed=0,1", "trainer.max_steps=4",
           "trainer.layer_health_every=2"],
    full=["trainer.max_steps=400", "trainer.seed=0,1,2"],
)


# ---------------------------------------------------------------- per run
def text_losses() -> tuple[float, float]:
    """(ln(vocab), the letter frequencies' entropy) of the default text, in nats: the initial loss
    of a model that knows nothing, and the loss of one that knows only how often each character is."""
    from ampgan.tasks.lm import python_docs

    counts = Counter(python_docs())
    total = sum(counts.values())
    return math.log(len(counts)), -sum(c / total * math.log(c / total) for c in counts.values())


def logit_peak(history: dict[str, list[float]]) -> tuple[float, bool]:
    """(the largest attention logit over training, whether a logged peak was not finite), from each
    block's `act/blocks.<i>.attn.logits/max_abs` history: inf once a peak was not finite (in float16,
    q.k beyond 65504); (nan, False) when none was logged."""
    values = [v for hist in history.values() for v in hist]
    finite = [v for v in values if math.isfinite(v)]
    if len(finite) < len(values):
        return math.inf, True
    return (max(finite) if finite else math.nan), False


def score(row: dict, cap: float, unigram: float) -> None:
    """The row's `final loss` (test loss capped at `cap`; a non-finite loss counts as the cap) and
    whether the run `fails` (final loss no better than `unigram`, or the loop stopped it as diverged)."""
    loss = row.get("loss")
    finite = isinstance(loss, (int, float)) and math.isfinite(loss)
    row["final loss"] = min(float(loss), cap) if finite else cap
    row["fails"] = (not finite) or row.get("outcome") == "diverged" or float(loss) >= unigram


# ---------------------------------------------------------------- per arm
def by_arm(rows: list[dict]) -> dict[str, dict[float, list[dict]]]:
    """arm -> learning rate -> its runs, in the sweep's arm order and rising learning rate."""
    out: dict[str, dict[float, list[dict]]] = {}
    for r in rows:
        out.setdefault(str(r[ARM]), {}).setdefault(float(r[LR]), []).append(r)
    return {arm: dict(sorted(lrs.items())) for arm, lrs in out.items()}


def mean_loss(runs: list[dict]) -> float:
    return sum(r["final loss"] for r in runs) / len(runs)


def threshold(lrs: dict[float, list[dict]]) -> float | None:
    """The first learning rate above the arm's best one (lowest mean final loss) where a seed fails."""
    best = min(lrs, key=lambda lr: mean_loss(lrs[lr]))
    return next((lr for lr in lrs if lr > best and any(r["fails"] for r in lrs[lr])), None)


def first_nonfinite(lrs: dict[float, list[dict]]) -> float | None:
    """The first learning rate where a seed's loss is not finite (or the loop stopped it as diverged)."""
    return next((lr for lr, runs in lrs.items() if any(nonfinite(r) for r in runs)), None)


def nonfinite(row: dict) -> bool:
    loss = row.get("loss")
    return row.get("outcome") == "diverged" or not (isinstance(loss, (int, float)) and math.isfinite(loss))


def sensitivity(lrs: dict[float, list[dict]]) -> float:
    """Wortsman et al.'s LR sensitivity: the mean over learning rates of (final loss - the arm's best),
    the final loss already capped at the initial loss (mean over seeds at each rate)."""
    means = [mean_loss(runs) for runs in lrs.values()]
    return sum(m - min(means) for m in means) / len(means)


def _lr(v: float) -> str:
    return f"{v:g}"


def after(ctx: Context) -> None:
    cap, unigram = text_losses()
    for r, run_ in zip(ctx.rows, ctx.runs):
        score(r, cap, unigram)
        keys = [k for k in run_.data.metrics if k.startswith("act/") and k.endswith(LOGIT_KEY)]
        history = {k: [m.value for m in ctx.client.get_metric_history(run_.info.run_id, k)] for k in keys}
        r["max attn logit"], r["attn logit inf"] = logit_peak(history)
    ctx.table = seed_table(ctx.study, ctx.rows)
    arms = by_arm(ctx.rows)
    for row in ctx.table:
        runs = arms[str(row[ARM])][float(row[LR])]
        row["fails"] = sum(r["fails"] for r in runs)
        row["logit inf"] = sum(bool(r["attn logit inf"]) for r in runs)
    ctx.notes.append(f"final loss capped at ln(vocab) = {cap:.3f} nats; a run fails at or above the letter "
                     f"frequencies' entropy, {unigram:.3f} nats")
    ctx.notes += summary_lines(arms)
    if untrained(ctx.study, ctx.rows):
        ctx.notes.append("diagnose not run: the reference has not trained")
        return
    extra = quick_diagnose(ctx) or DIAGNOSE
    for arm, lrs in arms.items():
        if arm.startswith("fp32"):   # an FP32 run is its own FP32 twin: nothing for diagnose to compare
            continue
        first = threshold(lrs)
        if first is None:
            ctx.notes.append(f"diagnose {arm}: no failing learning rate above its best")
        for lr, which in dict.fromkeys([(first, "fails"), (first_nonfinite(lrs), "nonfinite")]):
            if lr is None or (which == "nonfinite" and lr == first):
                continue
            pick = (lambda r: r["fails"]) if which == "fails" else nonfinite
            target = min((r for r in lrs[lr] if pick(r)), key=lambda r: int(r.get("trainer.seed", 0) or 0))
            d = diagnose_run(ctx, target["run_id"], extra)
            ctx.diagnoses[(arm, lr)] = {**d, "arm": arm, "lr": lr, "run": target["run"]}
            ctx.notes.append(f"diagnose {arm} at lr {_lr(lr)} (run {target['run']}): verdict {d['verdict']}"
                             + (f" at {d['layer']}" if d["layer"] != "-" else "")
                             + (f", fix: {d['fix']}" if d["fix"] != "-" else "") + f" (diagnose run {d['diagnose run']})")
            for row in ctx.table:
                if str(row[ARM]) == arm and same_value(row[LR], lr):
                    row["diagnose"] = d["verdict"]


def summary_lines(arms: dict[str, dict[float, list[dict]]]) -> list[str]:
    """The paper's view, one line per arm: mean final loss at each rate, LR sensitivity, threshold, top logit."""
    lrs = sorted({lr for a in arms.values() for lr in a})
    head = f"{'arm':<16}" + "".join(f"{_lr(lr):>8}" for lr in lrs) + "  LR sens.  fails from  max attn logit"
    lines = ["mean final loss (nats) per learning rate:", head]
    for arm, by_lr in arms.items():
        cells = "".join(f"{mean_loss(by_lr[lr]):8.3f}" if lr in by_lr else f"{'-':>8}" for lr in lrs)
        t = threshold(by_lr)
        peaks = [r["max attn logit"] for runs in by_lr.values() for r in runs if math.isfinite(r["max attn logit"])]
        inf = [lr for lr, runs in by_lr.items() if any(r["attn logit inf"] for r in runs)]
        top = (f"{max(peaks):.3g}" if peaks else "-") + (f", inf at {_lr(inf[0])}" if inf else "")
        lines.append(f"{arm:<16}{cells}  {sensitivity(by_lr):8.3f}  {(_lr(t) if t else 'none'):>10}  {top:>13}")
    return lines


# ---------------------------------------------------------------- charts and answer
def charts(ctx: Context) -> dict:
    from ampgan.amp.float16 import FP16_MAX

    loss = chart_lines(ctx.rows, LR, ARM, "final loss", "final test loss (capped) against the learning rate")
    finite = [r for r in ctx.rows if isinstance(r.get("max attn logit"), float) and math.isfinite(r["max attn logit"])]
    logit = chart_lines(finite, LR, ARM, "max attn logit", "largest attention logit over training")
    ax = logit.axes[0]
    ax.set_yscale("log")
    ax.axhline(FP16_MAX, color="red", linestyle="--", linewidth=1, label="float16 max 65504")
    overflowed = sorted({float(r[LR]) for r in ctx.rows if r.get("attn logit inf")})
    if overflowed:
        ax.plot(overflowed, [2 * FP16_MAX] * len(overflowed), "x", color="red", markersize=9,
                label="a logged peak not finite")
    ax.legend(fontsize=8)
    return {"loss_vs_lr": loss, "attn_logit_vs_lr": logit}


def answer(ctx: Context) -> str:
    arms = by_arm(ctx.rows)
    limit = {arm: threshold(lrs) for arm, lrs in arms.items()}
    shown = {arm: (_lr(t) if t else "none up to " + _lr(max(arms[arm]))) for arm, t in limit.items()}
    moves, paired = [], set()
    for fp32, o2 in PAIRS:
        if fp32 in limit and o2 in limit:
            paired |= {fp32, o2}
            same = limit[fp32] == limit[o2]
            moves.append(f"{o2} fails from {shown[o2]}, {fp32} from {shown[fp32]} ({'same' if same else 'moved'})")
    sens = ", ".join(f"{arm} {sensitivity(lrs):.2f}" for arm, lrs in arms.items())
    verdicts = []
    for d in ctx.diagnoses.values():
        arm = d["arm"]
        twin = next((f for f, o in PAIRS if o == arm), None)
        there = arms.get(twin, {}).get(d["lr"], [])
        how = ("fails there too" + (", finite" if not any(nonfinite(r) for r in there) else "")
               if any(r["fails"] for r in there) else "does not fail there")
        verdicts.append(f"{arm} at lr {_lr(d['lr'])}: {d['verdict']}" + (f" ({twin} {how})" if there else ""))
    nan = {arm: first_nonfinite(lrs) for arm, lrs in arms.items()}
    others = [f"{a} fails from {shown[a]}" for a in arms if a not in paired]
    top = max(arms[next(iter(arms))])
    peaks = []
    for arm, lrs in arms.items():
        vals = [r["max attn logit"] for r in lrs.get(top, []) if not math.isnan(r["max attn logit"])]
        peaks.append(f"{arm} " + (f"{max(vals):.3g}" if vals else "-"))
    return (f"Divergence thresholds: {'; '.join(moves + others) or '-'}. Non-finite from: "
            + ", ".join(f"{a} {_lr(v) if v else 'never'}" for a, v in nan.items()) + ". "
            f"Largest attention logit at lr {_lr(top)}: {', '.join(peaks)}. "
            f"LR sensitivity (mean excess final loss, nats): {sens}. "
            f"Diagnose at each float16 arm's first failing and first non-finite rate: {'; '.join(verdicts) or 'no arm fails'}.")


STUDY.after, STUDY.charts = after, charts

if __name__ == "__main__":
    sys.exit(run(STUDY, answer=answer))
