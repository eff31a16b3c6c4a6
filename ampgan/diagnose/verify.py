"""Fixes, proved: replay each candidate against FP32, rank; then re-check the best on K seeds.

Verification replays a candidate (synced, as many steps as the diagnosis) and calls it
confirmed when its own verdict is `healthy`. A candidate whose skipping scaler is still finding
its scale when that replay ends (no finite step yet, only the backward overflowing, the scale
falling above 1) has shown nothing either way: it is replayed again for as many more steps as
halving its scale down to 1 takes, plus 2, so it either settles (and is judged on its finite
steps) or fails. A verdict found in the evaluation (`on_evaluation`:
the inference stage; the training steps the replay checks are fine with or without a fix) is
verified on the evaluation objective: the candidate's own AMP run trains over the diagnosis's
horizon (same start and seed) beside the run's FP32 twin course (the same twin: reused), so its
verdict is `healthy` only when its evaluation no longer trails FP32's. Ranking: confirmed first, then closeness to FP32
(median relative gradient error), then cost (share of parameters computed in FP32).

The seed check (`diagnose.seeds=K`) trains FP32 and the best fix `seed_steps` steps on each of
K seeds and evaluates the run's objective. Stated test: the fix is *equivalent* when on every
seed its objective is within the margin of FP32's on the same seed (`eval/accuracy`: absolute
margin; `eval/swd`: relative to FP32's value) and no run diverged. Every-seed agreement is
used rather than a paired t-test because K is small (3-5): a mean test on so few pairs has
little power to show equivalence, while a per-seed bound is strict and easy to read.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from omegaconf import DictConfig, OmegaConf

from ampgan import AmpganError
from ampgan.config.schema import CONF_DIR, GROUPS, Settings, validate
from ampgan.data import Dataset
from ampgan.diagnose.horizon import BLOCK, Horizon, run_horizon
from ampgan.diagnose.analysis import analyse, reference_for
from ampgan.diagnose.case import Case
from ampgan.diagnose.replay import fp32_twin_settings, pooled_task
from ampgan.diagnose import statistics
from ampgan.diagnose.statistics import summaries
from ampgan.diagnose.verdict import Fix
from ampgan.tracking.tracker import NullTracker
from ampgan.training.loop import Progress, run_steps
from ampgan.tasks import task_class

def with_overrides(cfg: DictConfig, overrides: list[str]) -> DictConfig:
    """A fix's overrides on a copy of `cfg`, by Hydra's own rules: a group option (`scaler=dynamic`)
    is that option's node as Hydra composes it; any other override (`amp.keep_fp32=[head]`,
    `+model.net.width=8`) is applied as Hydra applies it to a composed config."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    from ampgan.config import hydra_compat

    out = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
    fresh = not GlobalHydra.instance().is_initialized()
    if fresh:  # python -m ampgan.diagnose is a Hydra app; a test or the Python API may not be
        initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3")
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
        groups = [o for o in parsed if o.key_or_group in GROUPS]
        if groups:
            composed = compose(config_name="train", overrides=[o.input_line for o in groups])
            for o in groups:
                out[o.key_or_group] = OmegaConf.to_container(composed[o.key_or_group], resolve=False)
        hydra_compat.apply_overrides([o for o in parsed if o.key_or_group not in GROUPS], out)
    except HydraException as err:
        raise AmpganError(f"fix override {' '.join(overrides)}: {str(err).splitlines()[0]}") from None
    finally:
        if fresh:
            GlobalHydra.instance().clear()
    return out


@dataclass
class Checked:
    """An intervention's outcome. `verdict`: its own diagnosis (the replay's, with its own course);
    `removes`: its own course no longer fails or trails FP32 (None: the failure was seen in the
    replay only, so the replay decides: `healthy`)."""

    fix: Fix
    verdict: str
    rel_err: float
    nonfinite: int
    fp32_share: float
    seconds: float
    removes: bool | None = None

    @property
    def confirmed(self) -> bool:
        """It removes the failure that was observed: the horizon's, judged on its own course over
        the same steps; a failure seen in the replay alone, judged on its replay."""
        return self.removes if self.removes is not None else self.verdict == "healthy"


def verify_fixes(case: Case, fixes: list[Fix], cache: dict, progress, steps: int | None = None,
                 start: Path | None = None, horizon: Horizon | None = None,
                 enough=lambda checked: False) -> list[Checked]:
    """Replay each intervention (`fixes`: `interventions.candidates`, cut to `diagnose.max_fixes` of the
    hypothesis's own) from the same start, seed and
    batches; its verdict `healthy` means it removes the failure. `horizon`: the diagnosis's, when the
    failure was seen there (each candidate then trains its own course over it, `course_length`, and is
    judged on it too, the evaluation objective included); None: the lockstep replay alone.
    `enough(checked)`: true once an outcome settles the question; the rest are not replayed."""
    cfg, dcfg, data = case.cfg, case.dcfg, case.data
    out = []
    twin = repr(fp32_twin_settings(case.settings)) if horizon is not None else ""
    for fix in fixes:
        progress(f"verify: {fix.text}")
        started = time.perf_counter()
        s = validate(with_overrides(cfg, fix.overrides))
        try:
            n = steps or dcfg.steps
            ref = reference_for(s, data, n, progress, cache, start)
            own = None
            if horizon is not None:   # the candidate's own course; the run's FP32 twin when it is the same
                same = repr(fp32_twin_settings(s)) == twin
                length = course_length(horizon)
                own = run_horizon(s, data, length, dcfg, None, horizon.start, 0, progress,
                                  fp32=horizon.fp32 if same else None, judge_progress=length == horizon.amp.planned)
            a = analyse(s, dcfg, data, ref, ["synced"], progress, with_locate=False, horizon=own)
            if (longer := replay_settling_steps(a, n)) is not None:
                progress(f"verify: {fix.text}: the scaler was still finding its scale after {n} steps; "
                         f"replaying {longer}")
                ref = reference_for(s, data, longer, progress, cache, start)
                a = analyse(s, dcfg, data, ref, ["synced"], progress, with_locate=False, horizon=own)
            if own is not None:
                own.release()
        except AmpganError as err:   # e.g. a scaler fix whose state the start's checkpoint does not hold
            progress(f"verify: {fix.text} cannot start from {start}: {err}")
            out.append(Checked(fix, "unverifiable", float("nan"), 0, 0.0, time.perf_counter() - started))
            continue
        sums = list(summaries(a.synced).values())
        rel = max(x.rel_err_median for x in sums)
        removes = None if own is None else own.amp.failed_at is None and not own.amp.timed_out and not own.amp_trails(dcfg)
        out.append(Checked(fix, a.verdict.name, rel, sum(x.nonfinite for x in sums), kept_share(a),
                           time.perf_counter() - started, removes))
        if enough(out[-1]):
            break
    return sorted(out, key=lambda c: (not c.confirmed, c.rel_err if np.isfinite(c.rel_err) else 1e9, c.fp32_share))


def course_length(horizon: Horizon) -> int:
    """How far an intervention's own course trains: the run's whole horizon, except past a
    non-finite loss, where as far again beyond the failing step (at least a block) shows it gone."""
    a = horizon.amp
    if a.kind != "non_finite":
        return a.planned
    return min(a.planned, 2 * (a.failed_at - a.start_step) + BLOCK)


def replay_settling_steps(a, steps: int) -> int | None:
    """`statistics.settling_steps` of analysis `a`'s synced replay: None when every scaler settled."""
    return statistics.settling_steps(list(summaries(a.synced).values()), steps)


def kept_share(a) -> float:
    """Share of the nets' parameters whose cell is kept in FP32 by a path, or by the FP32 penalty twin."""
    s = a.settings
    sizes = {name: int(size) for t in a.synced.nets.values() for name, size in zip(t.param_names, t.sizes)}
    total = sum(sizes.values()) or 1
    paths = [k for k in s.amp.keep_fp32 if "." in k or k[:1].islower()]
    kept = sum(n for name, n in sizes.items() if any(name == p or name.startswith(p + ".") for p in paths))
    root = task_class(s).penalty_root
    if root and s.amp.fp32_gradient_penalty:   # the penalty's pass through that net runs in FP32
        kept += 0.5 * sum(n for name, n in sizes.items() if name.startswith(root + "."))
    return min(1.0, kept / total)


# ---------------------------------------------------------------- K seeds
@dataclass
class Proof:
    objective: str
    fix: str
    fp32: list[float]
    fixed: list[float]
    margin: float
    relative: bool

    @property
    def gaps(self) -> list[float]:
        g = [abs(a - b) for a, b in zip(self.fixed, self.fp32)]
        return [x / max(abs(b), 1e-12) for x, b in zip(g, self.fp32)] if self.relative else g

    @property
    def equivalent(self) -> bool:
        return all(np.isfinite(self.fixed)) and all(g <= self.margin for g in self.gaps)

    def describe(self) -> str:
        kind = "relative" if self.relative else "absolute"
        return (f"{self.fix} on {len(self.fp32)} seeds: {self.objective} FP32 {_fmt(self.fp32)} vs fix {_fmt(self.fixed)}; "
                f"{kind} gaps {_fmt(self.gaps)}; test: every seed within {self.margin:g} -> "
                f"{'EQUIVALENT' if self.equivalent else 'NOT shown equivalent'}")


def _fmt(xs) -> str:
    return "[" + ", ".join(f"{x:.4g}" for x in xs) + "]"


def _train(s: Settings, data: Dataset, steps: int) -> tuple[str, str, float]:
    """`steps` steps of the run through the training loop itself (no tracking, no checkpoints, no
    evaluation on the way); the task's objective, its direction and its value at the end."""
    cfg = replace(s.trainer, max_steps=steps, eval_every=0, checkpoint_every=0, layer_health_every=0,
                  print_every=steps, print_seconds=0.0)
    with pooled_task(s, data) as task:   # a seed after the first runs the first's compiled steps
        run_steps(task, NullTracker(), cfg, None, range(1, steps + 1),
                  Progress(steps, 0, cfg.print_every, 0.0, warns=False))
        return task.objective, task.direction, float(task.evaluate()[task.objective])


def prove_seeds(case: Case, fix: Fix, progress) -> Proof:
    """The fix and FP32 trained `diagnose.seed_steps` steps on each of `diagnose.seeds` seeds."""
    dcfg, data = case.dcfg, case.data
    fixed_cfg = with_overrides(case.cfg, fix.overrides)
    fp32, fixed = [], []
    objective, direction = "", ""
    for k in range(dcfg.seeds):
        seeded = with_overrides(fixed_cfg, [f"trainer.seed={k}"])
        s = validate(seeded)
        progress(f"seeds: seed {k} ({dcfg.seed_steps} steps, FP32 and fix)")
        fp32.append(_train(fp32_twin_settings(s), data, dcfg.seed_steps)[2])
        objective, direction, value = _train(s, data, dcfg.seed_steps)
        fixed.append(value)
    # a distance to minimise (eval/swd) is compared relative to FP32's; a score to maximise
    # (eval/accuracy) by an absolute margin
    return Proof(objective, fix.text, fp32, fixed, dcfg.margin, relative=direction == "minimize")
