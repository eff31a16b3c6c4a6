"""A verdict is an experiment: the cause named is the one whose intervention removes the failure.

The rules (`verdict.decide`) read the evidence and give a hypothesis: a cause, the cell or op,
and the interventions that would remove the failure if that cause is right. Each intervention is
then replayed from the same state, on the same batches and seed (`verify.verify_fixes`: its own
lockstep replay, and its own horizon course when the failure was seen in the horizon), and the
verdict is decided on what was measured (`confirm`):

    intervention                          cause it tests    where it comes from
    FP32 throughout (the twin)            not_amp           the horizon's FP32 course, the replay
    the run's mode switched to jit        framework         any run that is not jitted
    the hypothesis's own fixes            its cause         keep-lists, fp32_loss, the FP32 penalty,
                                                            a loss scale (scaler; underflow when raised)
    the located cell in FP32              overflow          a non-finite step located to a cell
    that cell in FP32 with its output     overflow          the same, under O2/O3, which cast a kept
      FP32 too (O1 with the keep-list)                      cell's output back to float16: a value
                                                            the cell returns above 65504 needs O1
    loss scale 1, skipping overflow       scaler            a run with non-finite steps and a scale > 1

    1. the jit intervention removes the failure               -> framework
    2. the hypothesis is `framework`, not confirmed by jit    -> not_amp when FP32 fails too, else unexplained
    3. FP32 fails the same way, no later                      -> not_amp (no precision intervention can help)
    4. an intervention of the hypothesis's cause removes it   -> the hypothesis, with those fixes only
       (probes of other causes are replayed before the hypothesis's own fixes, and replaying stops
       at the first intervention of the mode or of the hypothesis's cause that removes the failure)
    5. an intervention of another cause removes it            -> that cause (the first that does)
    6. none does, while FP32 trains                           -> unexplained (exit 5), with the table
A hypothesis of `healthy` or `not_reproduced` has no failure to remove: nothing is replayed.
No fix is printed unless its replay removed the failure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ampgan.diagnose.verdict import Fix, Verdict

NOTHING_TO_REMOVE = ("healthy", "not_reproduced")
FP32_ROW = "FP32 throughout (amp=o0, no loss scale: the twin)"
JIT = ("hardware.jit=true", "hardware.unsafe_pynative_gp=false")


@dataclass(frozen=True)
class Evidence:
    """What `candidates` and `confirm` read besides the hypothesis: plain facts of the run."""

    jit: bool                      # the run's steps are compiled
    scale: float                   # the loss scale the run started with (1: none)
    nonfinite: bool                # the run had non-finite AMP steps (replay or horizon)
    located_cell: str              # the cell of the first bad value ("" when none was located)
    fp32_fails: bool               # FP32 fails the same way, no later
    fp32_line: str                 # what the FP32 twin did, for the table
    level: str = "O2"              # the run's AMP level (O2/O3 cast a kept cell's output to float16)


def candidates(hypothesis: Verdict, ev: Evidence, max_fixes: int = 5) -> list[Fix]:
    """The interventions to replay, in order: the mode first (a framework fault explains anything
    else it shows), then the hypothesis's own fixes (tagged with its cause; the first `max_fixes`
    of them), then the located cell in FP32 and a loss scale of 1, each tried once. The probes of
    the mode and of each cause are never cut: without them the verdict could not be decided."""
    if hypothesis.name in NOTHING_TO_REMOVE:
        return []
    out = [] if ev.jit else [Fix(list(JIT), "the run's mode switched to jit (compiled), all else the same", "framework")]
    if hypothesis.name in ("framework", "not_amp") or ev.fp32_fails:
        return out   # FP32 itself fails, or the mode is suspected: no precision intervention to try
    own = [f if f.cause else replace(f, cause=hypothesis.name) for f in hypothesis.fixes[:max_fixes]]
    probes = []
    if ev.nonfinite and ev.located_cell:
        probes.append(Fix([f"amp.keep_fp32=[{ev.located_cell}]"], f"the located cell {ev.located_cell} in FP32", "overflow"))
        if ev.level in ("O2", "O3"):   # O2/O3 cast the kept cell's output to float16; O1 leaves it FP32
            probes.append(Fix(["amp=o1", f"amp.keep_fp32=[{ev.located_cell}]"],
                              f"the located cell {ev.located_cell} in FP32 and its output FP32 too (O1)", "overflow"))
    if ev.nonfinite and ev.scale > 1:
        probes.append(Fix(["scaler=static", "scaler.init_scale=1"], "loss scale 1, overflowing steps skipped", "scaler"))
    # another cause's probe first (replaying stops at the hypothesis's first success: the table must
    # show the alternative tried), then the hypothesis's own fixes, then probes of its own cause
    out += [p for p in probes if p.cause != hypothesis.name] + own + [p for p in probes if p.cause == hypothesis.name]
    unique: dict[tuple[str, ...], Fix] = {}
    for f in out:   # the first of equal interventions keeps its cause
        unique.setdefault(tuple(f.overrides), f)
    return list(unique.values())


def settles(hypothesis: Verdict):
    """When to stop replaying: an intervention of the mode, or of the hypothesis's own cause, removed
    the failure (the ones after it could not change the verdict: `confirm` takes those first)."""
    def enough(checked) -> bool:
        return checked.confirmed and (checked.fix.cause or hypothesis.name) in ("framework", hypothesis.name)

    return enough


def confirm(hypothesis: Verdict, checked: list, ev: Evidence) -> Verdict:
    """The verdict decided by the interventions' outcomes (`checked`: verify.Checked, each with its
    fix and `confirmed` = its own replay is healthy). Pure: no I/O, no names of scalers or nets."""
    if hypothesis.name in NOTHING_TO_REMOVE:
        return hypothesis
    removed = [c if c.fix.cause else replace(c, fix=replace(c.fix, cause=hypothesis.name))   # untagged: the hypothesis's
               for c in checked if c.confirmed]
    jit = next((c for c in removed if c.fix.cause == "framework"), None)
    evidence = [f"interventions: {len(checked) + 1} tried (table below); FP32 throughout: {ev.fp32_line}"]
    if jit is not None:
        headline = ("the run's mode is at fault, not float16: switched to jit (all else the same) the failure is gone"
                    + ("" if hypothesis.name == "framework" else f" (the rules first suspected {hypothesis.name})"))
        return Verdict("framework", headline, evidence + hypothesis.evidence, hypothesis.layer if
                       hypothesis.name == "framework" else "", [jit.fix])
    if hypothesis.name == "not_amp" or ev.fp32_fails:
        return replace(hypothesis, evidence=evidence + hypothesis.evidence, fixes=[]) if hypothesis.name == "not_amp" \
            else Verdict("not_amp", f"FP32 fails the same way ({ev.fp32_line}): not float16", evidence + hypothesis.evidence)
    if hypothesis.name == "framework":
        return _unexplained(hypothesis, evidence, "switching the run's mode to jit did not remove the failure")
    own = [c.fix for c in removed if c.fix.cause == hypothesis.name]
    if own:
        return replace(hypothesis, evidence=evidence + hypothesis.evidence, fixes=own)
    if removed:
        first = removed[0].fix
        cause_fixes = [c.fix for c in removed if c.fix.cause == first.cause]
        layer = _cell_of_keep(first) or hypothesis.layer
        return Verdict(first.cause, f"{first.cause}: {first.why} removes the failure (the rules first suspected "
                       f"{hypothesis.name}: {hypothesis.headline})", evidence + hypothesis.evidence, layer, cause_fixes,
                       hypothesis.on_evaluation)
    return _unexplained(hypothesis, evidence, f"the rules suspected {hypothesis.name} ({hypothesis.headline})")


def unconfirmed(hypothesis: Verdict) -> Verdict:
    """`diagnose.verify=false`: the rules' hypothesis as it stands, marked so, with no fix (none was tried)."""
    if hypothesis.name in NOTHING_TO_REMOVE:
        return hypothesis
    return replace(hypothesis, headline=f"{hypothesis.headline} (a hypothesis: not confirmed by intervention, "
                   "diagnose.verify=false)", fixes=[])


def _unexplained(hypothesis: Verdict, evidence: list[str], why: str) -> Verdict:
    return Verdict("unexplained", f"FP32 trains, and no intervention tried removes the failure: {why}",
                   evidence + hypothesis.evidence, hypothesis.layer)


def _cell_of_keep(fix: Fix) -> str:
    """`amp.keep_fp32=[head]` -> "head"; "" for any other fix."""
    for o in fix.overrides:
        if o.startswith("amp.keep_fp32=[") and o.endswith("]") and "," not in o:
            return o[len("amp.keep_fp32=["):-1]
    return ""


def table(checked: list, ev: Evidence) -> list[dict]:
    """The interventions tried, FP32's first, each with its outcome: the report's and the run's table."""
    rows = [{"intervention": FP32_ROW, "tests": "not_amp",
             "outcome": ("fails too: " if ev.fp32_fails else "trains: ") + ev.fp32_line,
             "removes_failure": not ev.fp32_fails, "seconds": math.nan}]
    for c in checked:
        rows.append({"intervention": c.fix.text, "tests": c.fix.cause or "-",
                     "outcome": ("removes the failure" if c.confirmed else "does not")
                     + f" (its replay: {c.verdict}" + (f", rel. error {c.rel_err:.3g})" if math.isfinite(c.rel_err) else ")"),
                     "removes_failure": c.confirmed, "seconds": c.seconds})
    return rows
