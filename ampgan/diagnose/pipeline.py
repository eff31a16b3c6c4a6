"""One diagnosis, one way: Case -> Evidence -> Verdict -> Remedies, each stage entered once.

1. Case (`case.open_case`): the run's settings, data and start, validated once.
2. Evidence (`analysis`): the framework check, the horizon (the run and its FP32 twin trained over
   the run's length), the FP32 twin's record, and the lockstep replay against it, located down to
   the op. The twin's record is kept in `cache`: every intervention whose FP32 twin is the run's
   reuses it rather than recording it again.
3. Verdict: the rules' hypothesis over that evidence (`verdict.decide`, pure), then the
   interventions replayed from the same start on the same batches (`verify`) and the verdict
   they confirm (`interventions.confirm`): the cause whose intervention removes the failure.
4. Remedies: the fixes whose replay removed the failure (optionally the minimal FP32 keep-list,
   and the best fix proved over K seeds). An untried fix is never among them.

`diagnose_case` returns the Result; printing it and logging it are the command's (`verdict_report`).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from ampgan.diagnose.analysis import Analysis, analyse, evidence_of, framework_check, reference_for
from ampgan.diagnose.case import Case
from ampgan.diagnose.fp32_set_search import SearchResult, search_keep_list
from ampgan.diagnose.horizon import BLOCK, Horizon, run_horizon
from ampgan.diagnose.interventions import candidates, confirm, settles, table, unconfirmed
from ampgan.diagnose.verdict import NO_AMP_FIX, Fix, Verdict
from ampgan.diagnose.verify import Checked, Proof, prove_seeds, verify_fixes
from ampgan.training import checkpoint


@dataclass
class Result:
    case: Case
    verdict: Verdict
    analysis: Analysis
    checked: list[Checked] | None = None
    proof: Proof | None = None
    search: SearchResult | None = None
    interventions: list[dict] | None = None   # the table of interventions tried (interventions.table)
    run_id: str | None = None                 # the diagnose run's, once it is logged
    folder: Path | None = None                # its report files, once they are written

    @property
    def rows(self) -> list[dict]:
        return self.analysis.rows

    @property
    def synced(self):
        return self.analysis.synced

    @property
    def fits(self):
        return self.analysis.fits

    @property
    def free(self) -> str | None:
        return self.analysis.free_summary()

    @property
    def exit_code(self) -> int:
        return self.verdict.exit_code


def diagnose_case(case: Case, progress) -> Result:
    """The four stages over `case`; `progress(line)` hears each replay as it goes."""
    dcfg, s, data = case.dcfg, case.settings, case.data
    for line in case.describe():
        progress(line)
    cache: dict = {}
    framework = framework_check(s, data, dcfg.framework_check, case.start)
    if framework is not None:
        progress(framework.describe())
    with tempfile.TemporaryDirectory(prefix="ampgan-horizon-") as scratch:
        horizon = run_case_horizon(case, Path(scratch), progress)
        start = horizon.lockstep_start() if horizon is not None else case.start
        ref = reference_for(s, data, lockstep_length(dcfg.steps, horizon, start), progress, cache, start)
        modes = ["synced", "free"] if dcfg.mode == "both" else [dcfg.mode]
        analysis = analyse(s, dcfg, data, ref, modes, progress, dcfg.locate, framework, horizon, case.failed_at)
        if horizon is not None:
            horizon.release()
        result = Result(case, analysis.verdict, analysis)
        remedies(result, horizon, start, cache, progress)
    return result


def run_case_horizon(case: Case, scratch: Path, progress) -> Horizon | None:
    """The run and its FP32 twin trained over the horizon (`horizon_length`); None when it is off."""
    dcfg, s = case.dcfg, case.settings
    if dcfg.horizon == 0:
        return None
    steps = horizon_length(dcfg, s.trainer.max_steps, checkpoint.step_of(case.start), case.failed_at)
    every = max(1, min(BLOCK, dcfg.steps))   # the failure known to within the replay's length
    # a logged run's FP32 twin may train on past the failure to see whether FP32 recovers
    later = None if case.failed_at is None else min(s.trainer.max_steps, case.failed_at + (dcfg.horizon or steps))
    return run_horizon(s, case.data, steps, dcfg, scratch, case.start, every, progress,
                       run_failed_at=case.failed_at, run_failure=case.failure, recover_to=later)


def remedies(result: Result, horizon: Horizon | None, start: Path | None, cache: dict, progress) -> None:
    """The verdict the interventions confirm, and the fixes they proved: the keep-list search
    (`diagnose.search`), every candidate replayed (`diagnose.verify`), the best fix over K seeds
    (`diagnose.seeds`). Fills `result` in place."""
    case, analysis = result.case, result.analysis
    dcfg = case.dcfg
    hypothesis = analysis.verdict
    if dcfg.search and hypothesis.on_evaluation:
        progress("search: skipped (the keep-list search replays training steps; this verdict is the evaluation's)")
    elif dcfg.search and hypothesis.name not in NO_AMP_FIX:
        result.search = search_keep_list(case, cache, progress, start)
        hypothesis.fixes = [Fix([result.search.override], "minimal FP32 keep-list found by ddmin")] + [
            f for f in hypothesis.fixes if f.overrides != [result.search.override]]
    facts = evidence_of(analysis)
    tried = candidates(hypothesis, facts, dcfg.max_fixes)
    if dcfg.verify:
        if tried:   # each intervention replayed; over its own course too when the horizon saw the failure
            seen = horizon is not None and (horizon.amp.failed_at is not None or horizon.amp_trails(dcfg))
            result.checked = verify_fixes(case, tried, cache, progress, start=start,
                                          horizon=horizon if seen else None, enough=settles(hypothesis))
        result.verdict = analysis.verdict = confirm(hypothesis, result.checked or [], facts)
        result.interventions = table(result.checked or [], facts)
    else:
        result.verdict = analysis.verdict = unconfirmed(hypothesis)
    if result.search is not None:
        result.search.confirmed = any(c.confirmed and c.fix.overrides == [result.search.override]
                                      for c in result.checked or [])
    best = next((c.fix for c in result.checked or [] if c.confirmed and c.fix in result.verdict.fixes), None)
    if dcfg.seeds and best is not None:   # only a fix whose replay removed the failure
        result.proof = prove_seeds(case, best, progress)


def horizon_length(dcfg, max_steps: int, start_step: int, failed_at: int | None) -> int:
    """How many steps the horizon trains from `start_step`: a logged run's up to its failure; else
    `diagnose.horizon`, or (null) the rest of the run's own configured length, so that a failure
    late in the run is reached (the time bound `diagnose.horizon_seconds` may still cut it short)."""
    if failed_at is not None:
        return max(1, failed_at - start_step)
    return dcfg.horizon if dcfg.horizon is not None else max(1, max_steps - start_step)


def lockstep_length(steps: int, horizon: Horizon | None, start: Path | None) -> int:
    """`diagnose.steps`, or as many as reach the failure the horizon found from where the replay starts."""
    if horizon is None or horizon.amp.kind != "non_finite":
        return steps
    return max(steps, horizon.amp.failed_at - checkpoint.step_of(start))
