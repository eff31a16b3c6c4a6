"""What every case study shares: run its sweep, read it back, aggregate over seeds, publish.

A study is a preset `conf/experiment/study_<name>.yaml` (a sweep whose jobs differ in the
configuration compared and in `trainer.seed`) and a module `experiments/<name>.py` holding a
`Study`: which swept keys name a configuration, which metrics to compare, which configuration
is the reference, what to add after the sweep (diagnose's verdicts). Running one:

    python -m experiments.<name>            # the default form (<= 15 minutes on 2 cores)
    python -m experiments.<name> --full     # the full length
    python -m experiments.<name> --quick    # the shortest form: checks that it runs (the tests use it)
    python -m experiments.<name> --sweep outputs/studies/<name>/sweep/<time>   # publish a finished sweep again

1. the sweep runs as `python -m ampgan.train -m +experiment=study_<name> ...` (a parent MLflow
   run with one child per job, and the sweep's own report); a study whose default form is in
   `parts` (a data set with its own arms) runs one such sweep per part, one after another, and
   publishes to the first part's parent run;
2. its runs are read back from the store; each configuration's metrics are summarised over
   seeds (mean, standard deviation, min-max, diverged seeds) and compared with the reference
   configuration by a paired t-test over the seeds both ran (same seed: same initial weights
   and batches; Welch's test when they share fewer than two): a difference "exceeds seed
   noise" when p < 0.05;
3. the table (`table.md`, `table.csv`, every run in `runs.csv`), the charts and a
   self-contained `report.html` go to `outputs/studies/<name>/` and to the parent run under
   `study/`, with the study's conclusion line as the parent's `ampgan.study_answer` tag.
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from ampgan import AmpganError, report_error
from ampgan.config.schema import outputs_dir

SEED_KEY = "trainer.seed"
NOISE_P = 0.05          # the t-test level at which a difference exceeds seed noise
STUDY_DIR = "study"     # artifact folder on the sweep's parent run


@dataclass
class Group:
    """One configuration of a study: its swept values and its runs' rows (one per seed)."""

    key: tuple[str, ...]
    rows: list[dict]

    def values(self, metric: str) -> list[float]:
        return [float(r[metric]) if isinstance(r.get(metric), (int, float)) else math.nan for r in self.rows]


@dataclass(frozen=True)
class Bar:
    """A quality bar the reference configuration must pass on every seed before the study compares
    anything with it: a model that has not learned says nothing about whether float16 harms learning.
    `facet`: the facet value it applies to (None: every facet). `last`: how many of the run's last
    evaluations must each pass (the worst of them is judged): a GAN's quality swings between
    evaluations, and one good evaluation at the end is luck, not training."""

    metric: str
    threshold: float
    higher_is_better: bool = True
    facet: str | None = None
    last: int = 1

    @property
    def column(self) -> str:
        """The row key the bar reads: the metric, or its worst over the last evaluations."""
        return self.metric if self.last == 1 else f"{self.metric} (worst of last {self.last})"

    def worst_recent(self, history: list[float]) -> float | None:
        """The worst of the last `last` values of a metric's history (None when it has fewer)."""
        recent = history[-self.last:]
        if len(recent) < self.last:
            return None
        return min(recent) if self.higher_is_better else max(recent)

    def passes(self, value) -> bool:
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            return False
        return value >= self.threshold if self.higher_is_better else value <= self.threshold

    def describe(self) -> str:
        each = f" at each of the last {self.last} evaluations" if self.last > 1 else ""
        return f"{self.metric} {'>=' if self.higher_is_better else '<='} {self.threshold:g}{each}"


@dataclass
class Study:
    name: str
    title: str
    question: str
    groups: list[str]                 # swept keys naming a configuration (the seed is not one)
    metrics: list[str]                # row keys summarised over seeds; the first is the headline
    reference: dict[str, str] = field(default_factory=dict)   # the configuration the others are compared with
    quick: list[str] = field(default_factory=list)  # overrides of the shortest form
    full: list[str] = field(default_factory=list)   # overrides of the full length
    # the default form as sweeps run one after another, each with its own overrides (a data set
    # with its own arms); empty: one sweep of the preset as it stands
    parts: list[list[str]] = field(default_factory=list)
    facet: str | None = None          # a group key drawn as one chart panel per value (e.g. data)
    run_metrics: list[str] = field(default_factory=list)  # more MLflow metrics into the rows (last value)
    after: Callable | None = None     # after(ctx) -> extra text / rows (diagnose's verdicts)
    charts: Callable | None = None    # charts(ctx) -> {name: figure}, besides the seed-spread chart
    setup: str = ""                   # what runs, in prose (the README section's "setup")
    bars: list[Bar] = field(default_factory=list)   # the reference's quality bars (per facet, or for all)
    headline: dict[str, str] = field(default_factory=dict)  # facet value -> its headline metric (else metrics[0])

    def head(self, row: dict) -> str:
        """The headline metric of a row's facet: what its difference from the reference is judged on."""
        return self.headline.get(str(row.get(self.facet)), self.metrics[0]) if self.facet else self.metrics[0]


@dataclass
class Context:
    """What a study's `after` and `charts` hooks get: the sweep read back and where to write."""

    study: Study
    client: object
    uri: str
    parent: object
    runs: list
    rows: list[dict]
    table: list[dict]
    folder: Path
    mode: str
    echo: Callable = print
    given: tuple[str, ...] = ()                      # the user's own overrides (arms, lengths) for every job
    notes: list[str] = field(default_factory=list)
    diagnoses: dict = field(default_factory=dict)   # what `after` learnt from diagnose, by arm
    reuse: bool = False                              # publishing a finished sweep again: reuse its diagnoses
    started: float = 0.0                             # perf_counter when the sweep had finished
    sweep_minutes: float = 0.0                       # the sweep's own duration (its parent run's)

    def form(self) -> str:
        """The form as said in the study's lines: `default form`, `full form`, `quick form`, with the
        user's own overrides when given (`default form; given +arm/wgan_amp=o2_static`)."""
        return form_label(self.mode, self.given)

    def minutes(self) -> float:
        """The study's duration: its sweep, then what this process did after it (diagnose, charts)."""
        return self.sweep_minutes + (time.perf_counter() - self.started) / 60


# ---------------------------------------------------------------- running the sweep
def sweep_command(study: Study, mode: str, sweep_dir: Path, uri: str | None, extra: list[str]) -> list[str]:
    overrides = {"quick": study.quick, "full": study.full}.get(mode, [])
    cmd = [sys.executable, "-m", "ampgan.train", "-m", f"+experiment=study_{study.name}", *overrides, *extra,
           f"hydra.sweep.dir={sweep_dir}"]
    return cmd + ([f"tracking.uri={uri}"] if uri else [])


def form_label(mode: str, given: list[str] | tuple[str, ...]) -> str:
    """`default form`, and `; given <overrides>` when the user's overrides change what runs."""
    return f"{mode} form" + (f"; given {' '.join(given)}" if given else "")


def override_key(override: str) -> str:
    """The key a Hydra override sets, without its `+`, `++` or `~` prefix: `+arm/wgan_amp=fp32,o2` -> `arm/wgan_amp`."""
    return override.partition("=")[0].lstrip("+~")


def sweep_parts(study: Study, mode: str, extra: list[str]) -> list[list[str]]:
    """The sweeps a form runs, one after another, each as its overrides: the study's `parts` in
    the default form, unless the user's own overrides name a key that a part sets (then one sweep
    of the user's overrides: e.g. `+arm/wgan_data=digits_long` for one data set)."""
    if mode != "default" or not study.parts:
        return [[]]
    keys = {override_key(o) for part in study.parts for o in part}
    if any(override_key(o) in keys for o in extra):
        return [[]]
    return [list(part) for part in study.parts]


def sweep_records(folder: Path) -> list[dict]:
    """The parent-run records of a finished sweep folder: its own, or one per part (`<time>-part-<i>/`)."""
    own = folder / "parent_run.json"
    parts = sorted(folder.glob("*part-[0-9]*/parent_run.json"), key=lambda f: int(f.parent.name.rsplit("part-", 1)[1]))
    files = [own] if own.exists() else parts
    if not files:
        raise AmpganError(f"--sweep {folder}: no parent_run.json there, nor in *-part-<i>/ (a study's sweep folder is "
                          f"outputs/studies/<name>/sweep/<time>)")
    return [json.loads(f.read_text()) for f in files]


class Stopped(AmpganError):
    """The study was stopped (Ctrl-C, SIGTERM) while a child ran; the child ended its runs first."""


CHILD_STOP_S = (10.0, 120.0, 30.0)   # a stopped child's grace: on its own, after SIGINT, after SIGTERM


def run_child(cmd: list[str], what: str, capture: bool = False) -> subprocess.CompletedProcess:
    """Run `cmd` to its end (its output on this console, or captured). When the study is stopped
    meanwhile (KeyboardInterrupt: Ctrl-C, or SIGTERM by `run`'s handler), the child ends its own
    runs before the study exits, as a trainer does on a signal (its run ended KILLED, its sweep's
    parent run too), never killed with its runs left RUNNING:

        1. wait CHILD_STOP_S[0] for it to end on its own (a terminal's Ctrl-C reached it too);
        2. else send it SIGINT and wait CHILD_STOP_S[1] (a trainer ends its run at the next step);
        3. else SIGTERM (a trainer's second signal: it stops at once, its run still ended), then SIGKILL.

    A second stop of the study moves on to the next of these at once. Raises Stopped after."""
    pipe = subprocess.PIPE if capture else None
    proc = subprocess.Popen(cmd, stdout=pipe, stderr=pipe, text=True)
    try:
        out, err = proc.communicate()
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    except KeyboardInterrupt:
        pass
    for sig, grace in zip((None, signal.SIGINT, signal.SIGTERM), CHILD_STOP_S):
        if sig is not None and proc.poll() is None:
            proc.send_signal(sig)
        try:
            proc.communicate(timeout=grace)
            break
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            continue
    else:
        proc.kill()
        proc.communicate()
    ended = ("its runs ended in the store" if proc.returncode != -signal.SIGKILL else
             "it did not stop and was killed (the next run on its store ends its runs)")
    raise Stopped(f"the study stopped while {what} ran; {ended}")


def run_sweep(cmd: list[str], sweep_dir: Path) -> dict:
    """Run the sweep in a child process (its progress on this console); the parent-run record it wrote."""
    proc = run_child(cmd, f"the sweep in {sweep_dir}")
    record = sweep_dir / "parent_run.json"
    if not record.exists():
        raise AmpganError(f"the sweep wrote no parent run (exit {proc.returncode}); is tracking.backend=mlflow?")
    if proc.returncode != 0:
        raise AmpganError(f"the sweep failed (exit {proc.returncode}); its runs: {sweep_dir}")
    return json.loads(record.read_text())


def arm_of(run, key: str) -> str:
    """A job's option of an arm group (`+arm/<key>=<option>`), read from its recorded overrides."""
    for item in run.data.tags.get("overrides", "").split(","):
        if override_key(item) in (key, f"arm/{key}"):
            return item.partition("=")[2]
    return "-"


# ---------------------------------------------------------------- seed statistics
def welch_p(a: list[float], b: list[float]) -> float | None:
    """Two-sided Welch t-test p-value of mean(a) != mean(b); None when either side has < 2 finite values."""
    from scipy import stats

    a = [x for x in a if math.isfinite(x)]
    b = [x for x in b if math.isfinite(x)]
    if len(a) < 2 or len(b) < 2:
        return None
    if np.std(a) == 0 and np.std(b) == 0:
        return 1.0 if np.mean(a) == np.mean(b) else 0.0
    return float(stats.ttest_ind(a, b, equal_var=False).pvalue)


def paired_p(a: list[float], b: list[float]) -> float | None:
    """Two-sided paired t-test p-value of mean(a - b) != 0 over pairs (same seed); None with < 2 finite pairs."""
    from scipy import stats

    pairs = [(x, y) for x, y in zip(a, b) if math.isfinite(x) and math.isfinite(y)]
    if len(pairs) < 2:
        return None
    d = [x - y for x, y in pairs]
    if np.std(d) == 0:
        return 1.0 if np.mean(d) == 0 else 0.0
    return float(stats.ttest_rel([x for x, _ in pairs], [y for _, y in pairs]).pvalue)


def paired_interval(a: list[float], b: list[float], level: float = 0.95) -> tuple[float, float] | None:
    """The t interval of mean(a - b) over pairs (same seed); None with < 2 finite pairs."""
    from scipy import stats

    d = [x - y for x, y in zip(a, b) if math.isfinite(x) and math.isfinite(y)]
    if len(d) < 2:
        return None
    half = float(stats.t.ppf(0.5 + level / 2, len(d) - 1) * np.std(d, ddof=1) / math.sqrt(len(d)))
    return float(np.mean(d)) - half, float(np.mean(d)) + half


def paired_rows(g: Group, base: Group) -> tuple[Group, Group]:
    """The two configurations' runs of the seeds both ran, in the same order."""
    by_seed = {str(r.get(SEED_KEY)): r for r in base.rows}
    pairs = [(r, by_seed[str(r.get(SEED_KEY))]) for r in g.rows if str(r.get(SEED_KEY)) in by_seed]
    return Group(g.key, [x for x, _ in pairs]), Group(base.key, [y for _, y in pairs])


def compare(g: Group, base: Group, metric: str) -> tuple[float | None, str]:
    """(p, test): paired over the seeds both configurations ran (same seed: same initial weights and
    batches, so the seed's own effect cancels), else Welch's test on the two samples."""
    a, b = paired_rows(g, base)
    if len(a.rows) >= 2:
        return paired_p(a.values(metric), b.values(metric)), "paired"
    return welch_p(g.values(metric), base.values(metric)), "Welch"


def spread(values: list[float]) -> dict:
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return {"mean": math.nan, "std": math.nan, "min": math.nan, "max": math.nan, "n": 0}
    return {"mean": float(np.mean(finite)), "std": float(np.std(finite, ddof=1)) if len(finite) > 1 else 0.0,
            "min": float(min(finite)), "max": float(max(finite)), "n": len(finite)}


def group_rows(rows: list[dict], keys: list[str]) -> list[Group]:
    groups: dict[tuple, Group] = {}
    for r in rows:
        k = tuple(str(r.get(key, "-")) for key in keys)
        groups.setdefault(k, Group(k, [])).rows.append(r)
    return list(groups.values())


def _fmt(v: float) -> str:
    return "-" if not math.isfinite(v) else f"{v:.3g}" if abs(v) >= 1e-3 or v == 0 else f"{v:.2e}"


def seed_table(study: Study, rows: list[dict]) -> list[dict]:
    """One row per configuration: mean +- std [min-max] of each metric over seeds, diverged seeds, and
    (headline metric) the difference from the reference configuration with Welch's p."""
    groups = group_rows(rows, study.groups)
    ref = next((g for g in groups if _is_ref(g, study)), None) if study.reference else None
    # every headline's difference column sits before the interval and p that belong to it (a study
    # over two data sets judges each by its own headline: swd, judge_fd)
    heads = list(dict.fromkeys(study.head(dict(zip(study.groups, g.key))) for g in groups))
    out = []
    for g in groups:
        row: dict = dict(zip(study.groups, g.key))
        head = study.head(row)
        row["seeds"] = len(g.rows)
        row["diverged"] = sum(r.get("outcome") == "diverged" or r.get("status") != "FINISHED" for r in g.rows)
        for m in study.metrics:
            s = spread(g.values(m))
            row[m] = f"{_fmt(s['mean'])} ± {_fmt(s['std'])} [{_fmt(s['min'])}-{_fmt(s['max'])}]" if s["n"] else "-"
            row[f"_{m}"] = s
        if ref is not None and not _is_ref(g, study) and study.reference.keys() <= set(study.groups):
            r_facet = [gg for gg in groups if _same_except(gg.key, g.key, study) and _is_ref(gg, study)]
            base = r_facet[0] if r_facet else ref
            diff = spread(g.values(head))["mean"] - spread(base.values(head))["mean"]
            p, test = compare(g, base, head)
            row.update({f"{h} - ref": "-" for h in heads})
            row[f"{head} - ref"] = _fmt(diff)
            a, b = paired_rows(g, base)
            ci = paired_interval(a.values(head), b.values(head))
            row["95% interval (paired)"] = "-" if ci is None else f"[{_fmt(ci[0])}, {_fmt(ci[1])}]"
            row["p"] = "-" if p is None else f"{p:.3f} ({test})"
            row["beyond noise"] = "-" if p is None else ("yes" if p < NOISE_P else "no")
        out.append(row)
    return out


def _is_ref(g: Group, study: Study) -> bool:
    return all(same_value(g.key[study.groups.index(k)], v) for k, v in study.reference.items())


def same_value(a, b) -> bool:
    """Swept values compared as numbers when both are ("100" == "100.0"), else as text."""
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return str(a) == str(b)


def _same_except(a: tuple, b: tuple, study: Study) -> bool:
    """Same configuration apart from the reference's keys (the reference within the same facet)."""
    return all(x == y for k, x, y in zip(study.groups, a, b) if k not in study.reference)


def public(table: list[dict]) -> list[dict]:
    """The table without its hidden numeric columns (the `_metric` spreads)."""
    return [{k: v for k, v in r.items() if not k.startswith("_")} for r in table]


def untrained(study: Study, rows: list[dict]) -> dict[str | None, str]:
    """Facet value (None: the whole study) -> why its reference has not trained: a seed below a bar,
    or no bar stated for it. Empty when every reference passes its bar on every seed."""
    if not study.reference:
        return {}
    facet = study.facet if study.facet in study.groups else None
    values = list(dict.fromkeys(str(r.get(facet)) for r in rows)) if facet else [None]
    out: dict[str | None, str] = {}
    for fv in values:
        refs = [r for r in rows if (fv is None or str(r.get(facet)) == fv)
                and all(same_value(r.get(k), v) for k, v in study.reference.items())]
        bars = [b for b in study.bars if b.facet is None or b.facet == fv]
        where = f" on {fv}" if fv is not None else ""
        if not bars:
            out[fv] = f"no quality bar is stated for the reference{where}"
            continue
        if not refs:
            arms = ", ".join(f"{k}={v}" for k, v in study.reference.items())
            out[fv] = f"no run of the reference ({arms}){where}: nothing to compare with"
            continue
        for bar in bars:
            got = [r.get(bar.column) for r in refs]
            short = [g for g in got if not bar.passes(g)]
            if short:
                shown = ", ".join(_fmt(float(g)) if isinstance(g, (int, float)) else "-" for g in got)
                out[fv] = (f"the reference{where} misses its bar {bar.describe()} on {len(short)} of {len(refs)} "
                           f"seeds ({bar.column}: {shown})")
                break
    return out


def restrict(ctx: Context, facets: set) -> Context:
    """The context with only the given facet values' rows and table rows (the answer's view)."""
    facet = ctx.study.facet

    def keep(row: dict) -> bool:
        return str(row.get(facet)) in facets

    kept = [(r, run_) for r, run_ in zip(ctx.rows, ctx.runs) if keep(r)]
    return replace(ctx, rows=[r for r, _ in kept], runs=[run_ for _, run_ in kept],
                   table=[r for r in ctx.table if keep(r)])


def conclude(ctx: Context, answer: Callable[[Context], str] | None) -> str:
    """The study's answer, drawn only where its reference trained: facets whose reference missed its
    bar are left out of the answer and named; with none left, "reference not trained: no conclusion"."""
    failed = untrained(ctx.study, ctx.rows)
    for why in failed.values():
        ctx.notes.append(f"reference not trained: {why}")
    if None in failed:
        return f"Reference not trained: {failed[None]}. No conclusion."
    facet = ctx.study.facet if ctx.study.facet in ctx.study.groups else None
    trained = [fv for fv in dict.fromkeys(str(r.get(facet)) for r in ctx.rows)] if facet else []
    trained = [fv for fv in trained if fv not in failed]
    if facet and not trained:
        return "Reference not trained: " + "; ".join(failed.values()) + ". No conclusion."
    text = answer(restrict(ctx, set(trained)) if failed else ctx) if answer else ""
    if failed:
        text += (f" No conclusion on {', '.join(str(f) for f in failed)}: reference not trained ("
                 + "; ".join(failed.values()) + ").")
    return text


# ---------------------------------------------------------------- charts
def chart_seed_spread(study: Study, rows: list[dict], metric: str | None = None):
    """Each configuration's runs as dots (one per seed) with their mean; one panel per facet value."""
    from ampgan.reporting.sweep_report import new_figure

    facet = study.facet if study.facet in study.groups else None
    facets = list(dict.fromkeys(str(r.get(facet)) for r in rows)) if facet else [None]
    chosen = metric
    keys = [k for k in study.groups if k != facet]
    fig, axes = new_figure(len(facets), width=max(4.5, 0.55 * len(group_rows(rows, keys)) + 2), height=3.8)
    for ax, fv in zip(axes[0], facets):
        sub = [r for r in rows if facet is None or str(r.get(facet)) == fv]
        metric = chosen or study.head({facet: fv} if facet else {})
        groups = group_rows(sub, keys)
        for i, g in enumerate(groups):
            ys = g.values(metric)
            finite = [y for y in ys if math.isfinite(y)]
            ax.plot([i] * len(finite), finite, "o", color="tab:blue", alpha=0.6)
            if finite:
                ax.plot([i - 0.3, i + 0.3], [np.mean(finite)] * 2, "-", color="black")
            if len(finite) < len(ys):
                ax.annotate(f"{len(ys) - len(finite)} nan", (i, ax.get_ylim()[1]), ha="center", fontsize=7, color="red")
        ax.set_xticks(range(len(groups)), ["-".join(g.key) for g in groups], rotation=35, ha="right", fontsize=8)
        ax.set_ylabel(metric)
        ax.set_title(f"{metric}{f' ({facet}={fv})' if fv else ''}: one dot per seed")
        ax.grid(alpha=0.3)
    return fig


def chart_history(ctx: Context, metric: str | None, title: str):
    """An MLflow metric (None: each facet's headline, `eval/<headline>`) against the step, one panel
    per facet value, one line per configuration: its mean over seeds at each logged step, with a
    band from the seeds' min to their max. Facets without that metric get no panel (None: none has it)."""
    from ampgan.reporting.sweep_report import new_figure

    study = ctx.study
    facet = study.facet if study.facet in study.groups else None
    keys = [k for k in study.groups if k != facet]
    panels = []
    for fv in (list(dict.fromkeys(str(r.get(facet)) for r in ctx.rows)) if facet else [None]):
        name = metric or f"eval/{study.head({facet: fv} if facet else {})}"
        lines = []
        for g in group_rows([dict(r, _run=run_) for r, run_ in zip(ctx.rows, ctx.runs)
                             if facet is None or str(r.get(facet)) == fv], keys):
            by_step: dict[int, list[float]] = {}
            for r in g.rows:
                for m in ctx.client.get_metric_history(r["_run"].info.run_id, name):
                    if math.isfinite(m.value):
                        by_step.setdefault(m.step, []).append(m.value)
            if by_step:
                lines.append(("-".join(g.key), sorted(by_step), by_step))
        if lines:
            panels.append((fv, name, lines))
    if not panels:
        return None
    fig, axes = new_figure(len(panels), width=7.0, height=4.2)
    for ax, (fv, name, lines) in zip(axes[0], panels):
        for label, steps, by_step in lines:
            line, = ax.plot(steps, [np.mean(by_step[s]) for s in steps], "o-", ms=3, label=label)
            ax.fill_between(steps, [min(by_step[s]) for s in steps], [max(by_step[s]) for s in steps],
                            color=line.get_color(), alpha=0.15)
        ax.set_xlabel("step")
        ax.set_ylabel(name)
        ax.set_title(f"{title}{f' ({facet}={fv})' if fv else ''}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return fig


def chart_lines(rows: list[dict], x: str, series: str | None, metric: str, title: str, logx: bool = True):
    """`metric` against a numeric swept key, one line (mean over seeds, min-max bars) per `series` value
    (one line in all when `series` is None)."""
    from ampgan.reporting.sweep_report import new_figure

    fig, axes = new_figure(1)
    ax = axes[0][0]
    for sv in dict.fromkeys(str(r.get(series)) for r in rows):
        pts: dict[float, list[float]] = {}
        for r in rows:
            if str(r.get(series)) == sv and isinstance(r.get(metric), (int, float)) and math.isfinite(r[metric]):
                pts.setdefault(float(r[x]), []).append(float(r[metric]))
        xs = sorted(pts)
        if not xs:
            continue
        mean = [np.mean(pts[v]) for v in xs]
        ax.errorbar(xs, mean, yerr=[[m - min(pts[v]) for m, v in zip(mean, xs)], [max(pts[v]) - m for m, v in zip(mean, xs)]],
                    fmt="o-", capsize=3, label=f"{series}={sv}" if series else metric)
    if logx:
        ax.set_xscale("log")
    ax.set_xlabel(x)
    ax.set_ylabel(metric)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig


# ---------------------------------------------------------------- diagnose from a study
def quick_diagnose(ctx: Context) -> list[str]:
    """Diagnose's overrides for the study's mode: two replayed iterations and a 4-step horizon in the quick form."""
    return (["diagnose.steps=2", "diagnose.locate=false", "diagnose.mode=synced", "diagnose.horizon=4"]
            if ctx.mode == "quick" else [])


def first_run(ctx: Context, **values: str):
    """The study's run with these swept values and the lowest seed (None if there is none)."""
    hits = [(int(r.get(SEED_KEY, 0) or 0), run_) for r, run_ in zip(ctx.rows, ctx.runs)
            if all(same_value(r.get(k), v) for k, v in values.items())]
    return min(hits, key=lambda h: h[0])[1] if hits else None


def diagnose_run(ctx: Context, run_id: str, extra: list[str] = ()) -> dict:
    """`python -m ampgan.diagnose diagnose.run=<run_id>` in a child process; its verdict, layer and fix.

    When the study publishes a finished sweep again (`--sweep`), a diagnosis already logged for
    that run is reused instead of replayed."""
    client = ctx.client
    exp = client.get_experiment_by_name("ampgan-diagnose")
    if ctx.reuse and exp is not None:
        done = _diagnoses(client, exp.experiment_id, run_id, 0)
        if done:
            ctx.echo(f"study: diagnose of run {run_id}: reusing {done[0].info.run_id}")
            return _verdict(client, done[0], 0, None)
    started = int(time.time() * 1000)
    cmd = [sys.executable, "-m", "ampgan.diagnose", f"diagnose.run={run_id}", f"tracking.uri={ctx.uri}", *extra]
    ctx.echo(f"study: {' '.join(cmd[1:])}")
    proc = run_child(cmd, f"the diagnosis of run {run_id}", capture=True)
    exp = client.get_experiment_by_name("ampgan-diagnose")
    found = _diagnoses(client, exp.experiment_id, run_id, started) if exp else []
    if not found:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise AmpganError(f"diagnose of run {run_id} made no run (exit {proc.returncode}): {tail[0]}")
    return _verdict(client, found[0], proc.returncode, proc.stdout)


def _diagnoses(client, experiment_id: str, run_id: str, since_ms: int) -> list:
    return client.search_runs([experiment_id], f"tags.`ampgan.diagnosed_run` = '{run_id}' and attributes.status = "
                              f"'FINISHED' and attributes.start_time >= {since_ms}",
                              order_by=["attributes.start_time DESC"], max_results=1)


def _verdict(client, run, exit_code: int, text: str | None) -> dict:
    """A diagnose run's verdict, layer, fix and terminal report (read back from its report.md when reused)."""
    if text is None:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="ampgan-study-") as scratch:
            try:
                text = Path(client.download_artifacts(run.info.run_id, "report.md", scratch)).read_text()
            except Exception:  # noqa: BLE001 - an older diagnose run without its report: the verdict is enough
                text = ""
    t = run.data.tags
    return {"verdict": t.get("ampgan.verdict", "-"), "layer": t.get("ampgan.layer", "-") or "-",
            "fix": t.get("ampgan.fix", "-"), "diagnose run": run.info.run_id, "exit": exit_code, "text": text}


# ---------------------------------------------------------------- publishing
def publish(ctx: Context, pngs: dict[str, bytes], answer: str) -> Path:
    from ampgan.reporting.sweep_report import csv_text, html_page, markdown

    folder, study = ctx.folder, ctx.study
    table = public(ctx.table)
    (folder / "table.md").write_text(markdown(table) + "\n")
    (folder / "table.csv").write_text(csv_text(table))
    (folder / "runs.csv").write_text(csv_text(ctx.rows))
    for name, png in pngs.items():
        (folder / f"{name}.png").write_bytes(png)
    notes = "\n".join(ctx.notes)
    (folder / "answer.md").write_text(f"{answer}\n" + (f"\n{notes}\n" if notes else ""))
    (folder / "section.md").write_text(section(ctx, table, list(pngs), answer))
    summary = f"{study.question} Mode: {ctx.form()}; {len(ctx.runs)} runs. Answer: {answer}"
    (folder / "report.html").write_text(html_page(f"study {study.name}: {study.title}", summary, table, pngs, notes))
    pid = ctx.parent.info.run_id
    for name in [f"{n}.png" for n in pngs] + ["table.md", "table.csv", "runs.csv", "answer.md", "section.md", "report.html"]:
        ctx.client.log_artifact(pid, str(folder / name), STUDY_DIR)
    ctx.client.set_tag(pid, "ampgan.study", study.name)
    ctx.client.set_tag(pid, "ampgan.study_answer", answer[:5000])
    return folder


def section(ctx: Context, table: list[dict], charts: list[str], answer: str) -> str:
    """The study's section for experiments/README.md, from this run: question, setup, table, charts, answer, command."""
    from ampgan.reporting.sweep_report import markdown

    study, minutes = ctx.study, ctx.minutes()
    flag = {"default": "", "full": "--full", "quick": "--quick"}[ctx.mode]
    lines = [f"### {study.title}", "", f"**Question.** {study.question}", "", f"**Setup.** {' '.join(study.setup.split())}",
             "", f"**Result** ({ctx.form()}, {len(ctx.runs)} runs, {minutes:.0f} min; mean ± sd [min-max] over seeds; "
             f"'beyond noise': t-test against the reference, paired by seed, p < {NOISE_P}):", "", markdown(table), ""]
    lines += [f"![{name}](../docs/studies/{study.name}/{name}.png)" for name in charts]
    lines += ["", *[f"    {n}" for n in ctx.notes], ""] if ctx.notes else [""]
    args = " ".join(a for a in (flag, *ctx.given) if a)
    make = f"make study NAME={study.name}" + (f" ARGS='{args}'" if args else "")
    lines += [f"**Answer.** {answer}", "", f"**Reproduce.** `{make}` "
              f"(or `python -m experiments.{study.name}{' ' + args if args else ''}`)", ""]
    return "\n".join(lines)


def run(study: Study, argv: list[str] | None = None, answer: Callable[[Context], str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m experiments.{study.name}", description=f"{study.title}: {study.question}")
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--full", action="store_true", help="the full length (longer runs)")
    length.add_argument("--quick", action="store_true", help="the shortest form (checks that the study runs)")
    parser.add_argument("--uri", default=None, help="MLflow tracking URI (default: the embedded store)")
    parser.add_argument("--out", type=Path, default=None, help="folder for the table and charts (default outputs/studies/<name>)")
    parser.add_argument("--sweep", default=None, help="publish this sweep folder again instead of running a new sweep")
    parser.add_argument("overrides", nargs="*", help="more train overrides for every job (key=value)")
    args = parser.parse_args(argv)
    mode = "full" if args.full else "quick" if args.quick else "default"
    previous = signal.signal(signal.SIGTERM, _interrupt)   # a scheduler's stop ends the children as Ctrl-C does
    try:
        return _run(study, args, mode, answer)
    except Stopped as err:
        print(f"ampgan: interrupted: {err}", file=sys.stderr)
        return 130
    except AmpganError as err:
        return report_error(err)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _run(study: Study, args, mode: str, answer) -> int:
    from ampgan.reporting.sweep_report import children_of, figure_png, markdown, summarize
    from ampgan.tracking.tracker import make_client

    folder = Path(args.out or outputs_dir() / "studies" / (study.name + ("" if mode == "default" else f"-{mode}")))
    folder.mkdir(parents=True, exist_ok=True)
    if args.sweep:   # publish a sweep that already ran (e.g. after the runner itself was stopped)
        records = sweep_records(Path(args.sweep))
    else:
        sweep_dir = folder / "sweep" / time.strftime("%Y-%m-%d_%H-%M-%S")
        parts = sweep_parts(study, mode, list(args.overrides))
        records = []
        for i, part in enumerate(parts, 1):
            # a sweep's id is its folder's name (`ampgan.report <id>`, `ampgan.sweep resume <id>`): the
            # study's time is in each part's, so that two studies' parts never share one
            part_dir = sweep_dir / f"{sweep_dir.name}-part-{i}" if len(parts) > 1 else sweep_dir
            cmd = sweep_command(study, mode, part_dir, args.uri, part + list(args.overrides))
            print(f"study {study.name} ({form_label(mode, args.overrides)}{f', part {i} of {len(parts)}' if len(parts) > 1 else ''}): "
                  f"{' '.join(cmd[1:])}", flush=True)
            records.append(run_sweep(cmd, part_dir))
    record = records[0]   # the first part's parent run holds the study's publication
    client = make_client(record["uri"])
    parent = client.get_run(record["run_id"])
    parents = [parent] + [client.get_run(r["run_id"]) for r in records[1:]]
    runs = [run_ for p in parents for run_ in children_of(client, p)]
    varies = study.groups + [SEED_KEY]
    rows = [summarize(client, r, varies) for r in runs]
    for r, run_ in zip(rows, runs):
        r.update({k: arm_of(run_, k) for k in varies if r.get(k) in (None, "-")})
        r.update({k: run_.data.metrics.get(k) for k in study.run_metrics})
        r["run_id"] = run_.info.run_id
        for bar in (b for b in study.bars if b.last > 1):
            history = sorted((m.step, m.value) for m in client.get_metric_history(run_.info.run_id, f"eval/{bar.metric}"))
            r[bar.column] = bar.worst_recent([v for _, v in history])
    sweep_minutes = sum(((p.info.end_time or p.info.start_time) - p.info.start_time) / 60000 for p in parents)
    ctx = Context(study, client, record["uri"], parent, runs, rows, seed_table(study, rows), folder, mode,
                  reuse=bool(args.sweep), started=time.perf_counter(), sweep_minutes=sweep_minutes,
                  given=tuple(args.overrides))
    if study.after is not None:
        study.after(ctx)
    figs = {"seed_spread": chart_seed_spread(study, rows)}
    if study.charts is not None:
        figs.update(study.charts(ctx))
    pngs = {name: figure_png(fig) for name, fig in figs.items() if fig is not None}
    text = conclude(ctx, answer)
    publish(ctx, pngs, text)
    minutes = ctx.minutes()
    client.set_tag(parent.info.run_id, "ampgan.study_minutes", f"{minutes:.1f}")
    print(markdown(public(ctx.table)))
    for line in ctx.notes:
        print(line)
    print(f"answer: {text}")
    print(f"study {study.name} ({ctx.form()}) took {minutes:.1f} min; table and charts: {folder} "
          f"and parent run {parent.info.run_id} ({STUDY_DIR}/)")
    return 0


def beyond_noise(ctx: Context, lower_is_better: bool) -> tuple[list[str], list[str]]:
    """The configurations whose headline metric differs from the reference's beyond seed noise: (worse, better)."""
    worse, better = [], []
    for r in ctx.table:
        if r.get("beyond noise") != "yes":
            continue
        head = ctx.study.head(r)
        name = "/".join(str(r[k]) for k in ctx.study.groups)
        diff = float(r[f"{head} - ref"])
        (worse if (diff > 0) == lower_is_better else better).append(f"{name} ({head} {'+' if diff > 0 else ''}{r[f'{head} - ref']}, p {r['p']})")
    return worse, better


def seeds(ctx: Context) -> str:
    """The seeds per configuration, as a range when they differ ("3", "2-3")."""
    n = sorted({int(r["seeds"]) for r in ctx.table})
    return str(n[0]) if len(n) == 1 else f"{n[0]}-{n[-1]}"


# ---------------------------------------------------------------- the README
STUDIES = ("wgan_amp", "collapse", "underflow", "classifier_nan", "clip_threshold", "lr_sensitivity")
README = Path(__file__).with_name("README.md")
DOCS = Path(__file__).resolve().parents[1] / "docs" / "studies"
START, END = "<!-- studies:start -->", "<!-- studies:end -->"


def update_readme(readme: Path = README, docs: Path = DOCS, outputs: Path | None = None) -> list[str]:
    """Put each study's latest default-form section (outputs/studies/<name>/section.md) between the
    README's markers and copy its charts to docs/studies/<name>/; the studies published. A study
    with no section in `outputs` keeps the section the README has for it (by its title)."""
    import importlib
    import shutil

    text = readme.read_text()
    if START not in text or END not in text:
        raise AmpganError(f"{readme} has no {START} ... {END} block")
    head, rest = text.split(START, 1)
    block, tail = rest.split(END, 1)
    # the README's sections by title: the block is "\n### <title>\n<body>" repeated
    kept = {part.split("\n", 1)[0].strip(): "### " + part.strip() for part in block.split("\n### ") if part.strip()}
    sections, done = [], []
    for name in STUDIES:
        folder = (outputs or outputs_dir()) / "studies" / name
        if (folder / "section.md").exists():
            (docs / name).mkdir(parents=True, exist_ok=True)
            for png in folder.glob("*.png"):
                shutil.copy(png, docs / name / png.name)
            sections.append((folder / "section.md").read_text().strip())
            done.append(name)
            continue
        title = importlib.import_module(f"experiments.{name}").STUDY.title
        if title in kept:
            sections.append(kept[title])
    readme.write_text(head + START + "\n" + "\n\n".join(sections) + "\n" + END + tail)
    return done


if __name__ == "__main__":   # python -m experiments.study: the README's case-study sections from the latest runs
    print("published:", ", ".join(update_readme()) or "nothing (run a study first)")
