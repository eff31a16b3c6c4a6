"""The verdict: one name, its evidence as numbers, the layer where there is one, candidate fixes.

Two sources of numbers: the horizon (`horizon.py`: the run and its FP32 twin trained with their
own steps: does the run fail, does FP32 fail too, and when) and the lockstep replay from just
before the run's failure (per-step gradient error, flushing, non-finite steps, the first bad
value). Rules, first match wins:
  framework       the FP32 twin's GP weight gradient, in the run's mode, disagrees with finite
                  differences at both step sizes (`framework.py`); layer: the worst parameter's cell
  not_amp         the run fails and FP32 fails too, no later than AMP does, in the horizon, by a
                  non-finite loss or divergence (not a divergence FP32 recovers from by the horizon's
                  end while AMP's loss went non-finite: float16 made that spike fatal); or the FP32 twin's loss or gradient is not finite
                  in the replay no later than AMP's first failure (FP32 making no progress from
                  step 0 counts below, after the float16 rules: a run that does not learn and
                  also overflows has a float16 problem besides)
  overflow        a net fails in the replay: non-finite steps, any of them without a skipping
                  scaler; with one (dynamic, underflow_aware, skip_nonfinite), none finite at all, or
                  more than `skip_tol` of the net's steps after its first finite one (the first
                  steps of a dynamic scaler finding its scale are not a failure); counted per net.
                  The first bad value is in the forward pass, the loss, or the penalty's inner
                  gradient (scale-independent), or in the backward pass at a scale the layers'
                  range allows; not located: no cell is named
  scaler          the same, in the backward pass, at a loss scale above the range every layer
                  fits; or the scale oscillates (changes on more than a third of the steps)
  underflow       a net loses more than `lost_tol` of its FP32 gradient norm to flushing (nonzero
                  in FP32, exactly zero in AMP) at a loss scale below its range (more than u of its
                  FP32 gradient elements below float16's normals); the layer named loses the most
  precision       the median relative gradient error (synced) exceeds `rel_tol` with none of the
                  above (zeros where the gradients sit inside the range count here), and the run pays
                  for it: it fails or trails FP32 over the horizon, or failed in its logged history
                  (horizon off: the error alone). An error the run does not pay for is evidence, and
                  the rules below decide
  overflow        (inference) the run trails FP32 on the evaluation objective over the horizon
                  (`Horizon.amp_trails`), its weights evaluate in FP32 to what float16's evaluation
                  misses, and an op of the evaluation forward pass (inference mode) leaves float16's
                  range (`inference.py`): that op's cell; fixes verified on the evaluation objective
  precision       (inference) the same, with no op out of float16's range (no fix offered)
  not_amp         neither the run nor its FP32 twin learns over the horizon (no progress)
  not_reproduced  none of the above, but the run fails (in the horizon, or in its logged history),
                  or trails FP32 with its weights evaluating as badly in FP32, and the replay did
                  not reach or explain it: how to get there is said
  healthy         otherwise: the run does not fail over the horizon and AMP tracks FP32
A NaN in a statistic is a finding (the net failing), never dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ampgan.config.schema import Settings
from ampgan.diagnose.ranges import ScaleFit, merge_fits
from ampgan.diagnose.statistics import layer_rows, settling_steps, summaries

NO_AMP_FIX = ("healthy", "not_amp", "framework", "not_reproduced", "unexplained")   # verdicts that offer no float16 fix to search for
EXIT_CODES = {"healthy": 0, "not_amp": 3, "not_reproduced": 4, "unexplained": 5}   # every other verdict: 1 (an AMP
# problem; its fix printed when an intervention removed the failure: ampgan/diagnose/interventions.py)


@dataclass
class Fix:
    """An intervention: overrides replayed from the same state on the same batches. `cause`: the
    verdict it confirms when it removes the failure ("" until `decide` names it: the verdict's own)."""

    overrides: list[str]
    why: str
    cause: str = ""

    @property
    def text(self) -> str:
        return " ".join(self.overrides)


@dataclass
class Verdict:
    name: str
    headline: str
    evidence: list[str] = field(default_factory=list)
    layer: str = ""
    fixes: list[Fix] = field(default_factory=list)
    on_evaluation: bool = False   # found in the evaluation (inference stage): fixes are verified on its objective

    @property
    def exit_code(self) -> int:
        return EXIT_CODES.get(self.name, 1)


def cell_of(param: str, roots: tuple[str, ...] = ()) -> str:
    """`critic.score.0.weight` -> `critic.score.0`: the keep-list path of a parameter's cell; "" for
    a parameter that sits on a net itself (`pos`, `critic.pos`: no cell to keep in FP32 but the whole net).
    `roots`: the nets' root names in keep-list paths ("critic", "gen"; the classifier's is "")."""
    cell = param.rpartition(".")[0]
    return "" if cell in roots else cell


def owner(param: str, roots: tuple[str, ...] = ()) -> str:
    """The outermost named cell below the net's root that owns the parameter (`head.fc.weight` ->
    `head`, `critic.score.0.weight` -> `critic.score`); "" for a parameter on a net itself."""
    cell = cell_of(param, roots)
    root = next((r for r in roots if r and cell.startswith(r + ".")), "")
    rest = cell[len(root) + 1:] if root else cell
    return ".".join(p for p in (root, rest.split(".")[0]) if p) if rest else ""


def net_roots(trace) -> tuple[str, ...]:
    """The root names the nets' parameter names start with: a net whose every parameter is named
    `<net>.…` has that root (the WGAN-GP's critic, gen); otherwise "" (the classifier's)."""
    return tuple(dict.fromkeys(t.net if t.param_names and all(p.startswith(t.net + ".") for p in t.param_names) else ""
                               for t in trace.nets.values()))


def keep_fixes(paths, why: str) -> list[Fix]:
    """`amp.keep_fp32=[path]` for each distinct cell path; none for "" (a parameter on a net itself)."""
    return [Fix([f"amp.keep_fp32=[{p}]"], why.format(p)) for p in dict.fromkeys(paths) if p]


def skips_nonfinite(s: Settings) -> bool:
    """The run's scaler drops overflowing steps (what the scaler says of itself, not its name)."""
    return bool(s.scaler.skip_nonfinite)


def _scale_fixes(s: Settings, common: ScaleFit | None, cause: str = "scaler") -> list[Fix]:
    best = common.best() if common is not None else None
    scale = best or 1024.0
    if scale < 1:   # the scale that fits is below any loss scale a scaler can start from (>= 1): none fixes it
        return []
    why = ("the low end of the loss-scale range every layer fits" if common is not None and common.fits
           else "the highest loss scale that does not overflow (no single scale fits every layer)")
    fixes = []
    if hasattr(s.scaler, "init_scale") and not s.scaler.adjusts:
        fixes.append(Fix([f"scaler.init_scale={scale:g}"], why, cause))
    elif not hasattr(s.scaler, "init_scale"):   # no loss scaling at all
        fixes.append(Fix(["scaler=static", f"scaler.init_scale={scale:g}"], why, cause))
    fixes.append(Fix(["scaler=dynamic", f"scaler.init_scale={scale:g}"], "dynamic scaling from that scale", cause))
    return fixes


def decide(s: Settings, dcfg, ref, synced, fits: dict, located=None, framework=None, horizon=None,
           run_failed_at: int | None = None, inference=None) -> Verdict:
    """`synced`: the synced Trace; `fits`: net -> ranges.ScaleFit; `located`: locate.Located or None;
    `horizon`: horizon.Horizon or None (off: what the run does beyond the replay is unknown);
    `run_failed_at`: a diagnosed run's first failing step from its logged history;
    `inference`: inference.Inference (the run trails FP32: its evaluation checked) or None."""
    sums = summaries(synced)
    rows = layer_rows(synced, fits)
    roots = net_roots(synced)
    ev = [f"{n}: relative gradient error median {x.rel_err_median:.3g} (max {x.rel_err_max:.3g}); "
          f"{x.nonfinite}/{x.substeps} steps non-finite, {x.skipped} skipped; loss scale {x.scale_first:g} -> "
          f"{x.scale_last:g}; gradient norm lost to flushing up to {x.lost_norm_max:.3g}" for n, x in sums.items()]
    ev += [f"{n}: {fit.describe()}" for n, fit in fits.items()]
    common = merge_fits(list(fits.values())) if fits else None
    if common is not None and len(fits) > 1:
        ev.append(f"all nets (one scaler setting): {common.describe()}")
    if horizon is not None:
        ev = [f"horizon: {line}" for line in horizon.describe()] + ev

    if framework is not None and framework.wrong:
        fixes = ([Fix(["hardware.jit=true", "hardware.unsafe_pynative_gp=false"],
                      "the compiled penalty gradient matched finite differences")]
                 if framework.run_mode != "jit" and framework.compiled_right else [])
        where = ("in FP32 too" if framework.run.wrong else
                 f"at the run's precision, where jit's agrees with FP32's ({framework.at_precision.precision})")
        return Verdict("framework", f"the gradient penalty's second-order gradient is wrong in {framework.run_mode} "
                       f"mode, {where}: MindSpore, not float16", [framework.describe()] + ev,
                       cell_of(framework.param), fixes)
    if horizon is not None and horizon.fp32_fails_first(("non_finite", "diverged")):
        return _fp32_fails(horizon, ev)
    skips = skips_nonfinite(s)
    failing = [n for n, x in sums.items() if x.failing(skips, dcfg.skip_tol)]
    amp_failed_at = min((sums[n].first_failure for n in failing if sums[n].first_failure is not None), default=None)
    if ref.failed_at is not None and (amp_failed_at is None or ref.failed_at <= amp_failed_at):
        return Verdict("not_amp", f"the FP32 twin fails too (replay step {ref.failed_at}: {ref.failure}): "
                       "not float16; look at the learning rate, the data or the model", ev)
    if failing:
        ev.insert(0, "; ".join(f"{n}: {sums[n].nonfinite}/{sums[n].substeps} AMP steps non-finite"
                               + ("" if np.isfinite(sums[n].rel_err_median) else ", no finite gradient to compare")
                               for n in failing))
        if located is not None:
            ev.insert(1, f"first bad value: {located.describe()}")
        if located is None:  # locate off, or the free mode only: the non-finite steps are all that is known
            return Verdict("overflow", f"float16 overflow: non-finite AMP steps in {', '.join(failing)} where FP32's are "
                           "finite; not located (run with diagnose.locate=true diagnose.mode=synced for the cell)", ev)
        if located.phase == "forward":
            where = located.where
            fixes = (keep_fixes([where], "{} computes in FP32, beyond float16's range")
                     + keep_fixes([p for p in [where.rpartition(".")[0]] if p != where and p not in roots],
                                  "the enclosing cell {} in FP32"))
            site = f" ({located.op.site})" if located.op is not None else ""
            return Verdict("overflow", f"forward overflow in float16 at {where}{site}", ev, where, fixes)
        if located.phase == "loss":  # every cell's output finite: the loss itself, not a cell
            fixes = [] if s.amp.fp32_loss else [Fix(["amp.fp32_loss=true"], "the loss in FP32")]
            return Verdict("overflow", "the loss overflows float16 (every cell's output is finite)", ev, "",
                           fixes + _scale_fixes(s, common))
        if located.phase == "gp_inner":
            return Verdict("overflow", f"the gradient penalty's inner gradient overflows float16 (through {located.where})",
                           ev, located.where,
                           [Fix(["amp.fp32_gradient_penalty=true"], "the penalty through an FP32 twin of the critic")]
                           + keep_fixes([located.where], "the layer the inner gradient overflows at in FP32"))
        fit = fits.get(located.net)
        t = synced.nets[located.net]
        scale = float(t.scale[t.iterations.index(located.iteration)])
        if fit is not None and fit.k_hi is not None and scale > 2.0 ** fit.k_hi:
            return Verdict("scaler", f"loss scale {scale:g} is above what the gradients allow "
                           f"(<= 2^{fit.k_hi}): the scaler overflows the backward pass itself", ev,
                           cell_of(located.where, roots), _scale_fixes(s, common))
        site = f" ({located.op.site})" if located.op is not None else ""
        return Verdict("overflow", f"backward overflow in float16 at {located.where}{site}", ev, cell_of(located.where, roots),
                       keep_fixes([cell_of(located.where, roots)], "that layer in FP32") + _scale_fixes(s, common))
    for n, x in sums.items():
        if s.scaler.adjusts and x.scale_changes > max(3, x.substeps / 3):
            return Verdict("scaler", f"the {n} loss scale oscillates ({x.scale_changes} changes in {x.substeps} steps)",
                           ev, "", _scale_fixes(s, common))
    for n, x in sums.items():
        if x.finding_scale:
            ev.append(f"{n}: the scaler was still finding its scale when the replay ended (loss scale {x.scale_first:g} -> "
                      f"{x.scale_last:g}, every step's backward overflowing, the forward finite)")
    nonfinite = sum(x.nonfinite for x in sums.values())
    if nonfinite:
        ev.append(f"{nonfinite}/{sum(x.substeps for x in sums.values())} steps overflowed and were skipped while the "
                  "scaler found its scale (normal)")
    # underflow: gradient norm lost to exact zeros, by a net whose gradients sit below float16's
    # range at the scale used (its range starts above that scale). Zeros where FP32's gradients are
    # inside the range come from elsewhere (a forward value rounded to zero: precision, below)
    lossy = [n for n, x in sums.items() if x.lost_norm_max > dcfg.lost_tol
             and fits.get(n) is not None and fits[n].k_lo is not None and 2.0 ** fits[n].k_lo > x.scale_last]
    if lossy:
        net = max(lossy, key=lambda n: sums[n].lost_norm_max)
        # the layer losing the most gradient in absolute terms (lost share x its norm)
        worst_lost = max((r for r in rows if r["net"] == net and np.isfinite(r["lost_norm_max"])),
                         key=lambda r: r["lost_norm_max"] * r["fp32_norm_median"])
        ev.insert(0, f"{worst_lost['param']}: up to {100 * worst_lost['lost_norm_max']:.1f}% of its FP32 gradient norm "
                     f"flushed to zero ({100 * worst_lost['flushed_max']:.1f}% of elements), "
                     f"{100 * worst_lost['subnormal_max']:.1f}% subnormal, at loss scale {sums[net].scale_last:g}")
        where = cell_of(worst_lost["param"], roots) or worst_lost["param"]   # a parameter on the net itself: itself
        return Verdict("underflow", f"float16 underflow: gradients flushed to zero in {where}", ev, where,
                       _scale_fixes(s, common, "underflow") + [Fix(["scaler=underflow_aware"], "raises the scale when "
                                                                    "gradients sit in float16's subnormal range")]
                       + keep_fixes([cell_of(worst_lost["param"], roots)], "that layer in FP32"))
    unsettled = [n for n, x in sums.items() if x.finding_scale]   # no finite AMP step: none compared with FP32
    # finite: a NaN made its net fail above, except for a net still finding its scale
    rel = max((x.rel_err_median for n, x in sums.items() if n not in unsettled), default=float("nan"))
    pays = horizon is None or run_failed_at is not None or horizon.amp.failed_at is not None or horizon.amp_trails(dcfg)
    unpaid = "was not seen to pay for" if horizon is not None and horizon.amp.timed_out else "does not pay for"
    if rel > dcfg.rel_tol and not pays:
        ev.insert(0, f"a median relative gradient error of {rel:.3g} (> {dcfg.rel_tol}) that the run {unpaid}: "
                     f"it neither fails nor trails FP32 over the horizon ({_n_steps(horizon.amp.done)})")
    if rel > dcfg.rel_tol and pays:
        norms = {}
        for r in rows:
            norms.setdefault(r["net"], 0.0)
            norms[r["net"]] += r["fp32_norm_median"] ** 2
        big = [r for r in rows if r["fp32_norm_median"] ** 2 >= 1e-4 * norms[r["net"]] and np.isfinite(r["rel_err_median"])]
        worst = max(big or rows, key=lambda r: r["rel_err_median"])
        ev.insert(0, f"{worst['param']}: median relative error {worst['rel_err_median']:.3g}, cosine down to "
                     f"{worst['cosine_min']:.4f}, no overflow, {100 * worst['flushed_max']:.2f}% flushed")
        fixes = [] if s.amp.fp32_loss else [Fix(["amp.fp32_loss=true"], "the loss (softmax cross-entropy) in FP32")]
        where = owner(worst["param"], roots) or worst["param"]
        fixes += keep_fixes([owner(worst["param"], roots), cell_of(worst["param"], roots)], "{} in FP32")
        return Verdict("precision", f"float16 precision loss (no range problem) at {where}: median "
                       f"relative gradient error {rel:.3g} > {dcfg.rel_tol}", ev, where, fixes)
    if inference is not None:
        ev.insert(0, f"inference: {inference.describe()}")
        if inference.blames_float16:
            return _inference_verdict(s, inference, ev)
    if horizon is not None and horizon.fp32_fails_first():   # neither learns, and the replay shows no float16 cause
        return _fp32_fails(horizon, ev)
    if inference is not None and horizon.amp.failed_at is None:   # trails, and its weights evaluate as badly in FP32
        a, f = horizon.amp, horizon.fp32
        return Verdict("not_reproduced", f"the run trails its FP32 twin ({a.objective} {a.after:.4g} vs {f.after:.4g} "
                       f"after {a.done} steps) and its weights evaluate as badly in FP32, but the lockstep replay shows "
                       "no float16 cause",
                       ev + [f"how to get there: a longer replay from the same start (diagnose.steps={2 * a.done}), "
                             "or diagnose.run=<id> of a run that wrote checkpoints (trainer.checkpoint_every)"])
    unreached = _unreached(horizon, run_failed_at, ref)
    if unreached:
        return Verdict("not_reproduced", unreached[0], ev + unreached[1:])
    if horizon is None and unsettled:   # nothing shows how the run goes once its scale is found
        done = ref.steps[-1].iteration
        return Verdict("not_reproduced", f"the replay ended before the scaler of {', '.join(unsettled)} found its "
                       f"scale: no finite AMP step of it was compared with FP32 in {done} replayed steps", ev
                       + [f"how to get there: a replay long enough for the scale to settle (diagnose.steps="
                          f"{settling_steps(sums.values(), done)}), or the horizon on (diagnose.horizon)"])
    if not np.isfinite(rel):
        tracks = "no AMP step finite in the lockstep replay to compare with FP32"
    elif rel <= dcfg.rel_tol:
        tracks = f"AMP tracks FP32: median relative gradient error {rel:.3g} <= {dcfg.rel_tol}"
    else:   # the error the precision rule passed over: the run does not pay for it
        tracks = f"float16's gradients are a median {rel:.3g} off FP32's (> {dcfg.rel_tol}), an error the run {unpaid}"
    if unsettled:
        tracks += f" ({', '.join(unsettled)}: still finding its scale there, judged by the horizon)"
    if horizon is None:
        return Verdict("healthy", tracks + f" over {ref.steps[-1].iteration} replayed steps (diagnose.horizon=0: "
                       "whether the run trains was not checked)", ev)
    a = horizon.amp
    if a.timed_out:   # never `healthy` about steps nobody trained
        end = a.start_step + a.planned
        return Verdict("not_reproduced", f"{tracks}, but the horizon stopped at step {a.last_step} of {end} after "
                       f"{a.seconds:.0f}s (diagnose.horizon_seconds): the run's later steps were not followed", ev
                       + [f"how to get there: python -m ampgan.diagnose <the same overrides> diagnose.horizon_seconds="
                          f"{_enough_seconds(a):.0f} (about {a.seconds / max(a.done, 1):.2g}s a step here), or "
                          f"diagnose.run=<id> of a run that wrote checkpoints (trainer.checkpoint_every) near its failure"])
    return Verdict("healthy", f"{tracks}, and the run does not fail over {_n_steps(a.done)} "
                   f"({a.objective} {a.before:.4g} -> {a.after:.4g})", ev)


def _n_steps(n: int) -> str:
    return f"{n} step" if n == 1 else f"{n} steps"


def _enough_seconds(course) -> float:
    """A time bound that lets a course cut short by it train its planned steps, with a margin."""
    return 1.5 * course.seconds * course.planned / max(course.done, 1)


def _inference_verdict(s: Settings, inference, ev: list[str]) -> Verdict:
    """float16 breaks the evaluation: overflow at the op's cell (fixes: its type or its cell in FP32,
    or O2 when it computes that type in FP32), or precision when no op leaves the range."""
    gap = (f"{inference.objective} {inference.amp:.4g} in float16 where the same weights reach "
           f"{inference.fp32:.4g} in FP32")
    hit = inference.hit
    if hit is None:
        return Verdict("precision", f"float16 breaks the evaluation ({gap}) with every op of its forward pass inside "
                       "float16's range", ev, "", [], on_evaluation=True)
    ev.insert(1, f"first bad value of the evaluation forward pass: {hit.describe()}")
    kind = inference.cell_type
    fixes = [Fix([f"amp.keep_fp32=[{kind}]"], f"every {kind} computes in FP32 (the same statistics in each)")] if kind else []
    if s.amp.level == "O3" and inference.o2_keeps_fp32:
        fixes.append(Fix(["amp=o2"], f"O2 computes {kind or 'that cell'} in FP32 (MindSpore's black list)"))
    fixes += keep_fixes([hit.cell], "{} computes in FP32, beyond float16's range")
    return Verdict("overflow", f"float16 overflow in the evaluation (inference mode) at {hit.cell or 'the net'}: "
                   f"{hit.op} {'takes an FP32 input' if hit.cast_input else 'computes a value'} beyond 65504; {gap}",
                   ev, hit.cell, fixes, on_evaluation=True)


def _fp32_fails(horizon, ev: list[str]) -> Verdict:
    return Verdict("not_amp", f"the FP32 twin fails too (step {horizon.fp32.failed_at}: {horizon.fp32.failure}), "
                   f"no later than AMP (step {horizon.amp.failed_at}): not float16; look at the learning rate, "
                   "the data or the model", ev)


def _unreached(horizon, run_failed_at: int | None, ref) -> list[str]:
    """[headline, how to get there...] when the run fails but the replay did not show why; [] otherwise."""
    replayed = f"the lockstep replay (steps {ref.start_step + 1}..{ref.start_step + ref.steps[-1].iteration})"
    if horizon is not None and horizon.amp.failed_at is not None:
        a = horizon.amp
        return [f"the run fails at step {a.failed_at} ({a.failure}) where FP32 does not, but {replayed} shows no "
                "float16 cause",
                f"how to get there: a longer replay from the same start (diagnose.steps={a.failed_at - ref.start_step + 4}), "
                "or diagnose.run=<id> of a run that wrote checkpoints (trainer.checkpoint_every) near that step"]
    if run_failed_at is None:
        return []
    reached = horizon.amp.last_step if horizon is not None else ref.start_step + ref.steps[-1].iteration
    if horizon is not None and horizon.amp.timed_out:
        why = f"the horizon stopped at step {reached} after {horizon.amp.seconds:.0f}s (diagnose.horizon_seconds)"
    elif reached < run_failed_at:
        why = f"the replay ended at step {reached}" + ("" if horizon is not None else " (diagnose.horizon=0)")
    else:
        why = f"the replay ran to step {reached} without failing (the run's failure did not recur from the same state)"
    return [f"the diagnosed run failed at step {run_failed_at}, but {why}",
            f"how to get there: start nearer the failure (trainer.checkpoint_every={max(1, run_failed_at // 10)} in "
            f"the run, then diagnose.run=<id>), or a longer horizon (diagnose.horizon={run_failed_at + 1}, "
            f"diagnose.horizon_seconds={2 * (horizon.amp.seconds if horizon is not None else 60):.0f})"]
