"""`python -m ampgan.report`: read a sweep back from the store; a table and charts, in outputs/ and on its parent run.

    python -m ampgan.report                 # the latest sweep in the embedded store
    python -m ampgan.report SWEEP_ID        # one sweep (its `sweep_id` tag); --sweep SWEEP_ID works too
    python -m ampgan.report --all --last 10 # the ten latest runs, sweep or not (table only)

A sweep's report: `table.md` and `table.csv` (swept values, objective, skipped steps, final
scale, clip rate, underflow, wall time, outcome per run), charts drawn with matplotlib
(objective against each swept value, loss scale over steps, skipped steps and clip rate
against the swept value, the per-layer underflow heat map of the best run) and `report.html`
holding the table and the charts. Written to `outputs/reports/<sweep_id>/` and logged to the
sweep's parent run under `report/` (charts with `log_figure`), where MLflow's artifact
viewer shows the page.
"""

from __future__ import annotations

import argparse
import base64
import csv
import html
import io
import math
from pathlib import Path

import numpy as np

from ampgan import AmpganError, report_error
from ampgan.config.schema import outputs_dir
from ampgan.tracking.tracker import DIRECTION_TAG, OBJECTIVE_TAG

PREFIXES = ("critic", "gen", "train")
PARENT_TAG = "ampgan.sweep_parent"          # a sweep's parent run (ampgan.sweep_runs)
EVAL_KEYS = ("eval/swd", "eval/modes_covered", "eval/high_quality", "eval/judge_fd", "eval/classes_covered",
             "eval/class_confidence", "eval/accuracy", "eval/loss")
REPORT_DIR = "report"                        # artifact folder on the parent run


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def objective_of(run) -> str | None:
    """The metric the run's task optimises, as the run itself names it (its `ampgan.objective` tag),
    when the run logged it."""
    key = run.data.tags.get(OBJECTIVE_TAG)
    return key if key in run.data.metrics else None


def direction_of(run) -> str:
    """"minimize" or "maximize": how the run's task reads its objective (its `ampgan.direction` tag)."""
    return run.data.tags.get(DIRECTION_TAG, "minimize")


def swept_value(run, key: str) -> str:
    """The value a run had for a swept key: its param (a group choice is `<group>.name`), else its tag."""
    p = run.data.params
    return p.get(key, p.get(f"{key}.name", run.data.tags.get(key, "-")))


def summarize(client, run, varies: list[str] | None = None) -> dict:
    """One row: identity (swept values in a sweep), objective, quality, per-net scaler figures, time, outcome."""
    m, t = run.data.metrics, run.data.tags
    row: dict = {"run": run.info.run_name, "job": t.get("job_num", "")}
    if varies:
        row.update({k: swept_value(run, k) for k in varies})
    else:
        row.update({"amp": t.get("amp"), "scaler": t.get("scaler"), "overrides": t.get("overrides", "")})
    objective = objective_of(run)
    for key in ([objective] if objective else []) + [k for k in EVAL_KEYS if k != objective]:
        if key in m:
            row[key.split("/", 1)[1]] = m[key]
    for p in PREFIXES:
        if f"{p}/scale" not in m:
            continue
        row[f"{p} skipped"] = m.get(f"{p}/skipped_total", m.get(f"{p}/skipped"))
        row[f"{p} final scale"] = m[f"{p}/scale"]
        if f"{p}/clip_rate" in m:
            row[f"{p} clip rate"] = m[f"{p}/clip_rate"]
        hist = [x.value for x in client.get_metric_history(run.info.run_id, f"{p}/underflow")]
        row[f"{p} underflow (mean)"] = float(np.mean(hist)) if hist else None
    end = run.info.end_time or run.info.start_time
    row["wall time (s)"] = round((end - run.info.start_time) / 1000, 1) if run.info.start_time else None
    row["status"] = run.info.status
    row["outcome"] = t.get("outcome", "-")
    return row


def columns(rows: list[dict]) -> list[str]:
    cols: list[str] = []
    for r in rows:
        cols += [k for k in r if k not in cols]
    return cols


def markdown(rows: list[dict]) -> str:
    cols = columns(rows)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_fmt(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def csv_text(rows: list[dict]) -> str:
    """Full precision values (repr), empty cells for what a run did not measure."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    cols = columns(rows)
    writer.writerow(cols)
    for r in rows:
        writer.writerow(["" if r.get(c) is None else repr(r[c]) if isinstance(r[c], float) else r[c] for c in cols])
    return out.getvalue()


# ---------------------------------------------------------------- finding a sweep's runs
def children_of(client, parent) -> list:
    """The job runs of a sweep's parent run (its nested runs, else the runs with its sweep_id), by job number."""
    exp = parent.info.experiment_id
    runs = client.search_runs([exp], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'", max_results=5000)
    if not runs and parent.data.tags.get("sweep_id"):
        runs = [r for r in _sweep_runs(client, exp, parent.data.tags["sweep_id"]) if PARENT_TAG not in r.data.tags]
    return sorted(runs, key=lambda r: int(r.data.tags.get("job_num", 0) or 0))


def _sweep_runs(client, experiment_id: str, sweep_id: str) -> list:
    return client.search_runs([experiment_id], f"tags.sweep_id = '{sweep_id}'", max_results=5000)


def find_sweep(client, experiment_id: str, sweep_id: str) -> tuple[str, object | None, list]:
    """(sweep id, parent run or None for a sweep made before parent runs, job runs)."""
    if sweep_id == "latest":
        latest = client.search_runs([experiment_id], "tags.sweep_id != ''", order_by=["attributes.start_time DESC"],
                                    max_results=1)
        if not latest:
            raise AmpganError("no sweep in the store yet (run one: python -m ampgan.train -m ...)")
        sweep_id = latest[0].data.tags["sweep_id"]
    runs = _sweep_runs(client, experiment_id, sweep_id)
    parent = next((r for r in runs if PARENT_TAG in r.data.tags), None)
    children = children_of(client, parent) if parent is not None else sorted(
        runs, key=lambda r: int(r.data.tags.get("job_num", 0) or 0))
    if not children:
        raise AmpganError(f"no runs of sweep '{sweep_id}'")
    return sweep_id, parent, children


def varied_keys(parent, children: list) -> list[str]:
    """The swept keys: the parent's record, else the params whose values differ among the runs."""
    import json

    if parent is not None and "ampgan.varies" in parent.data.tags:
        return json.loads(parent.data.tags["ampgan.varies"])
    keys = sorted({k for r in children for k in r.data.params})
    return [k for k in keys if len({r.data.params.get(k) for r in children}) > 1]


# ---------------------------------------------------------------- charts
def _axis(values: list[str]) -> tuple[list[float], list[str] | None, bool]:
    """x positions for swept values: numbers (log axis when positive and spread over 10x), else categories."""
    try:
        nums = [float(v) for v in values]
    except ValueError:
        cats = list(dict.fromkeys(values))
        return [float(cats.index(v)) for v in values], cats, False
    positive = all(n > 0 for n in nums)
    return nums, None, positive and max(nums) / min(nums) >= 10


def _against(ax, runs: list, key: str, ys: list[float | None], label: str) -> None:
    """Points of every run at its swept value; mean line with the min-max spread where values repeat (seeds)."""
    xs, cats, logx = _axis([swept_value(r, key) for r in runs])
    pts = [(x, y) for x, y in zip(xs, ys) if y is not None and math.isfinite(y)]
    if pts:
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o", alpha=0.6, label=label)
        ux = sorted({p[0] for p in pts})
        mean = [float(np.mean([y for x, y in pts if x == u])) for u in ux]
        lo = [mean[i] - min(y for x, y in pts if x == u) for i, u in enumerate(ux)]
        hi = [max(y for x, y in pts if x == u) - mean[i] for i, u in enumerate(ux)]
        ax.errorbar(ux, mean, yerr=[lo, hi], fmt="-", capsize=3, color=ax.lines[-1].get_color())
    if cats:
        ax.set_xticks(range(len(cats)), cats, rotation=20)
    else:
        if logx:
            ax.set_xscale("log")
        ticks = sorted(set(xs))
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax.minorticks_off()
    ax.set_xlabel(key)
    ax.grid(alpha=0.3)


def new_figure(ncols: int = 1, nrows: int = 1, width: float = 5.0, height: float = 3.6):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width * ncols, height * nrows), dpi=80, layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    return fig, axes


def chart_objective(runs: list, varies: list[str]):
    scored = next((r for r in runs if objective_of(r)), None)
    if scored is None:
        return None
    objective = objective_of(scored)
    keys = varies or ["run"]
    fig, axes = new_figure(len(keys))
    for ax, key in zip(axes[0], keys):
        ys = [r.data.metrics.get(objective) for r in runs]
        if key == "run":
            ax.bar(range(len(runs)), [y if y is not None else 0 for y in ys])
            ax.set_xticks(range(len(runs)), [r.info.run_name for r in runs], rotation=30, ha="right")
        else:
            _against(ax, runs, key, ys, objective)
        ax.set_ylabel(f"{objective} ({direction_of(scored)})")
        ax.set_title(f"{objective} against {key}")
    return fig


def chart_loss_scale(client, runs: list):
    prefixes = [p for p in PREFIXES if any(f"{p}/scale" in r.data.metrics for r in runs)]
    if not prefixes:
        return None
    fig, axes = new_figure(len(prefixes))
    for ax, p in zip(axes[0], prefixes):
        for r in runs:
            hist = sorted((m.step, m.value) for m in client.get_metric_history(r.info.run_id, f"{p}/scale"))
            if hist:
                ax.step([h[0] for h in hist], [h[1] for h in hist], where="post", label=r.info.run_name)
        ax.set_yscale("log", base=2)
        ax.set_xlabel("step")
        ax.set_ylabel(f"{p}/scale")
        ax.set_title(f"{p} loss scale over steps")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    return fig


def chart_skipped_clip(runs: list, varies: list[str]):
    prefixes = [p for p in PREFIXES if any(f"{p}/scale" in r.data.metrics for r in runs)]
    if not prefixes:
        return None
    key = varies[0] if varies else None
    fig, axes = new_figure(2)
    for ax, (what, metric) in zip(axes[0], (("skipped steps", "skipped_total"), ("clip rate", "clip_rate"))):
        for p in prefixes:
            ys = [r.data.metrics.get(f"{p}/{metric}", r.data.metrics.get(f"{p}/skipped") if metric == "skipped_total" else None)
                  for r in runs]
            if key is not None:
                _against(ax, runs, key, ys, p)
            else:
                ax.plot(range(len(runs)), [y if y is not None else np.nan for y in ys], "o-", label=p)
        ax.set_ylabel(what)
        ax.set_title(f"{what} against {key or 'run'}")
        ax.legend(fontsize=8)
    return fig


def chart_underflow(client, run):
    """Per-layer underflow (fraction of nonzero gradient elements below 2^-14) over steps, for one run."""
    keys = sorted(k for k in run.data.metrics if k.startswith("grad/") and k.endswith("/underflow"))
    if not keys:
        return None
    hists = {k: {m.step: m.value for m in client.get_metric_history(run.info.run_id, k)} for k in keys}
    steps = sorted({s for h in hists.values() for s in h})
    grid = np.array([[hists[k].get(s, np.nan) for s in steps] for k in keys])
    return heatmap_figure(grid, [k[len("grad/"):-len("/underflow")] for k in keys], [str(s) for s in steps],
                          f"per-layer underflow: {run.info.run_name}", "underflow fraction")


def heatmap_figure(grid: np.ndarray, rows: list[str], cols: list[str], title: str, label: str,
                   xlabel: str = "step", log: bool = False, bad: str | None = None, annotate: bool = False):
    """A rows x columns matrix as a matplotlib heat map: the sweep report's and diagnose's layers x
    steps, the classifier's confusion matrix (`annotate`: each cell's value written in it).

    Colour from 0 to the largest finite value (`log`: a log scale over the positive finite values,
    when there are some); non-finite cells are drawn in `bad` (e.g. "red" for an infinite error),
    blank by default."""
    from matplotlib.colors import LogNorm, Normalize

    grid = np.asarray(grid, dtype=np.float64)
    finite = np.isfinite(grid)
    positive = finite & (grid > 0)
    if log and positive.any():
        lo, hi = float(grid[positive].min()), float(grid[positive].max())
        norm = LogNorm(vmin=lo, vmax=max(hi, lo * 10))
    else:
        norm = Normalize(vmin=0.0, vmax=max(float(grid[finite].max()), 1e-6) if finite.any() else 1.0)
    fig, axes = new_figure(width=max(5.0, 1.2 + 0.35 * len(cols)), height=1.4 + 0.28 * len(rows))
    ax = axes[0][0]
    import matplotlib

    cmap = matplotlib.colormaps["viridis"].copy()
    if bad is not None:
        cmap.set_bad(bad)
    shown = np.ma.masked_where(~finite | (log & positive.any() & (grid <= 0)), grid)
    im = ax.imshow(shown, aspect="auto", cmap=cmap, norm=norm)
    ax.set_yticks(range(len(rows)), rows, fontsize=7)
    ax.set_xticks(range(len(cols)), cols, fontsize=7, rotation=90 if len(cols) > 12 else 0)
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    if annotate:
        for (r, c), v in np.ndenumerate(grid):
            ax.text(c, r, f"{v:g}"[:5], ha="center", va="center", fontsize=7,
                    color="white" if finite[r, c] and norm(v) < 0.5 else "black")
    ax.figure.colorbar(im, ax=ax, label=label)
    return fig


def figure_png(fig) -> bytes:
    """A matplotlib figure as PNG bytes (for the HTML page and the files under outputs/)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def best_run(runs: list):
    """The run chosen for the heat map: the best objective among finished runs (else the first run)."""
    scored = [(r.data.metrics[o], r) for r in runs if r.info.status == "FINISHED" and (o := objective_of(r))
              and math.isfinite(r.data.metrics[o])]
    if not scored:
        return runs[0] if runs else None
    sign = 1 if direction_of(scored[0][1]) == "minimize" else -1
    return min(scored, key=lambda s: sign * s[0])[1]


def charts(client, runs: list, varies: list[str]) -> dict:
    """name -> matplotlib Figure, in the report's order (charts without data are left out)."""
    chosen = best_run(runs)
    figs = {"objective": chart_objective(runs, varies), "loss_scale": chart_loss_scale(client, runs),
            "skipped_clip": chart_skipped_clip(runs, varies),
            "underflow_heatmap": chart_underflow(client, chosen) if chosen is not None else None}
    return {k: v for k, v in figs.items() if v is not None}


# ---------------------------------------------------------------- the page
def html_page(title: str, summary: str, rows: list[dict], pngs: dict[str, bytes], text: str = "") -> str:
    """One self-contained page (images inline): MLflow's artifact viewer shows it without fetching anything.

    `text`: preformatted lines shown above the table (diagnose's terminal report)."""
    cols = columns(rows)
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(r.get(c)))}</td>" for c in cols) + "</tr>" for r in rows)
    images = "".join(f'<figure><img alt="{html.escape(name)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'
                     f"<figcaption>{html.escape(name)}</figcaption></figure>" for name, png in pngs.items())
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;margin:16px;color:#222}} table{{border-collapse:collapse;font-size:13px}}
th,td{{border:1px solid #ccc;padding:3px 7px;text-align:right}} th{{background:#f0f0f0}}
figure{{display:inline-block;margin:8px}} img{{max-width:100%}} figcaption{{font-size:12px;color:#666}}</style>
</head><body><h2>{html.escape(title)}</h2><p>{html.escape(summary)}</p>
{f'<pre id="report-text">{html.escape(text)}</pre>' if text else ""}
<table id="report-table"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>
<div id="charts">{images}</div></body></html>
"""


def write_report(client, parent, children: list, sweep_id: str | None = None, out_dir: Path | None = None) -> Path:
    """The sweep's table and charts under `out_dir` (default outputs/reports/<sweep_id>/) and on the parent run."""
    sweep_id = sweep_id or (parent.data.tags.get("sweep_id", parent.info.run_id) if parent is not None else "runs")
    varies = varied_keys(parent, children)
    rows = [summarize(client, r, varies) for r in children]
    folder = Path(out_dir or outputs_dir() / "reports" / sweep_id)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "table.md").write_text(markdown(rows) + "\n")
    (folder / "table.csv").write_text(csv_text(rows))
    pngs = {}
    figs = charts(client, children, varies)
    for name, fig in figs.items():
        pngs[name] = figure_png(fig)
        (folder / f"{name}.png").write_bytes(pngs[name])
    summary = parent.data.tags.get("outcome", "") if parent is not None else f"{len(children)} runs"
    title = f"sweep {sweep_id}" + (f": {parent.info.run_name}" if parent is not None else "")
    (folder / "report.html").write_text(html_page(title, f"{len(children)} runs; {summary}; varies: "
                                                  f"{', '.join(varies) or 'nothing'}", rows, pngs))
    if parent is not None:
        pid = parent.info.run_id
        for name, fig in figs.items():
            client.log_figure(pid, fig, f"{REPORT_DIR}/{name}.png")
        for name in ("table.md", "table.csv", "report.html"):
            client.log_artifact(pid, str(folder / name), REPORT_DIR)
    return folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ampgan.report", description=__doc__.splitlines()[0])
    parser.add_argument("sweep_id", nargs="?", help="sweep_id tag (default: the latest sweep)")
    parser.add_argument("--uri", default=f"sqlite:///{outputs_dir() / 'mlflow.db'}")
    parser.add_argument("--experiment", default="ampgan")
    parser.add_argument("--sweep", default=None, help="sweep_id tag, or 'latest' (same as the positional)")
    parser.add_argument("--all", action="store_true", help="ignore sweeps: the latest runs (table only)")
    parser.add_argument("--last", type=int, default=20)
    parser.add_argument("--out", type=Path, default=None, help="folder for the report (default outputs/reports/<sweep_id>)")
    args = parser.parse_args(argv)
    try:
        return _report(args)
    except AmpganError as err:
        return report_error(err)


def _report(args) -> int:
    from ampgan.tracking.tracker import make_client

    if args.uri.startswith("sqlite:///") and not Path(args.uri[len("sqlite:///"):]).exists():
        raise AmpganError(f"no store at {args.uri}")
    client = make_client(args.uri)
    exp = client.get_experiment_by_name(args.experiment)
    if exp is None:
        raise AmpganError(f"no experiment '{args.experiment}' in {args.uri}")
    if args.all:
        runs = client.search_runs([exp.experiment_id], order_by=["attributes.start_time DESC"], max_results=args.last)
        print(markdown([summarize(client, r) for r in runs if PARENT_TAG not in r.data.tags]))
        return 0
    if args.sweep_id and args.sweep and args.sweep_id != args.sweep:
        raise AmpganError(f"two sweeps asked for: {args.sweep_id} and --sweep {args.sweep}")
    sweep_id, parent, children = find_sweep(client, exp.experiment_id, args.sweep_id or args.sweep or "latest")
    print(f"sweep {sweep_id}: {len(children)} runs")
    folder = write_report(client, parent, children, sweep_id, args.out)
    print((folder / "table.md").read_text(), end="")
    where = f" and to parent run {parent.info.run_id} ({REPORT_DIR}/)" if parent is not None else \
        " (this sweep has no parent run: it ran before sweeps had one)"
    print(f"report: {folder / 'report.html'}{where}")
    return 0
