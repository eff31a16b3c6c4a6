"""Study 5, the clip threshold: does "a threshold that clips now and then" hold up?

WGAN-GP on 8 Gaussians at O2 with a fixed scale of 1024 and global-norm clipping (the seed's
advice), clip norms 0.1 .. 100, three seeds (`conf/experiment/study_clip_threshold.yaml`).
Clip rate against quality; the reference is 100 (practically never clips).

    python -m experiments.clip_threshold [--full | --quick]
"""

from __future__ import annotations

import math
import sys

from experiments.study import Bar, Context, Study, beyond_noise, chart_lines, run, seeds

NOW_AND_THEN = (0.01, 0.3)   # the clip rates that count as clipping "now and then"

STUDY = Study(
    setup=__doc__.split("\n\n")[1],
    name="clip_threshold",
    title="Clip threshold",
    question="Across clip thresholds, how does the clip rate relate to quality, and is 'clips now and then' the right target?",
    groups=["scaler.clip_norm"],
    metrics=["swd", "critic clip rate", "gen clip rate", "modes_covered"],
    reference={"scaler.clip_norm": "100"},
    bars=[Bar("modes_covered", 6)],   # never clipping must cover most of the 8 modes
    quick=["scaler.clip_norm=1,100", "trainer.seed=0,1", "trainer.max_steps=4", "trainer.eval_samples=200"],
    full=["trainer.max_steps=1000", "trainer.eval_every=250"],
)


def charts(ctx: Context) -> dict:
    from ampgan.reporting.sweep_report import new_figure

    fig, axes = new_figure(1)
    ax = axes[0][0]
    pts = [(r.get("critic clip rate"), r.get("swd"), r.get("scaler.clip_norm")) for r in ctx.rows]
    pts = [p for p in pts if isinstance(p[0], float) and isinstance(p[1], float) and math.isfinite(p[1])]
    for norm in dict.fromkeys(p[2] for p in pts):
        ax.plot([p[0] for p in pts if p[2] == norm], [p[1] for p in pts if p[2] == norm], "o", label=f"clip_norm={norm}")
    ax.axvspan(*NOW_AND_THEN, color="green", alpha=0.1, label="now and then")
    ax.set_xlabel("critic clip rate (share of steps clipped)")
    ax.set_ylabel("swd (lower is better)")
    ax.set_title("quality against clip rate, one dot per run")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return {"swd_vs_clip_rate": fig,
            "swd_vs_clip_norm": chart_lines(ctx.rows, "scaler.clip_norm", None, "swd", "swd against the clip norm")}


def answer(ctx: Context) -> str:
    worse, better = beyond_noise(ctx, lower_is_better=True)
    rows = sorted(ctx.table, key=lambda r: float(r["scaler.clip_norm"]))
    rate = {r["scaler.clip_norm"]: r["_critic clip rate"]["mean"] for r in rows}
    now_and_then = [n for n, v in rate.items() if NOW_AND_THEN[0] <= v <= NOW_AND_THEN[1]]
    return (f"Against never clipping (clip_norm {ctx.study.reference['scaler.clip_norm']}), swd is worse beyond seed "
            f"noise at {', '.join(w.split(' ')[0] for w in worse) or 'no threshold'} and better at "
            f"{', '.join(b.split(' ')[0] for b in better) or 'no threshold'}; critic clip rates "
            + ", ".join(f"{n}: {v:.0%}" for n, v in rate.items())
            + f"; 'now and then' ({NOW_AND_THEN[0]:.0%}-{NOW_AND_THEN[1]:.0%}) at {', '.join(now_and_then) or 'no threshold tried'} "
            f"({seeds(ctx)} seeds).")


STUDY.charts = charts

if __name__ == "__main__":
    sys.exit(run(STUDY, answer=answer))
