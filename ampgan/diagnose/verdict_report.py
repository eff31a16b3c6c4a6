"""The report: terminal text (verdict first), Markdown, the per-layer CSV, heat maps, an HTML page;
and `publish`, which writes them and logs the diagnosis as an MLflow run (through `ampgan.tracking`).

Built with the sweep report's machinery (`ampgan.report`): the heat maps are matplotlib charts
(`heatmap_figure`) and the page is `html_page`, self-contained, so MLflow's artifact viewer shows it.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import numpy as np

from ampgan.diagnose.statistics import LAYER_COLUMNS, heat, heat_iterations
from ampgan.reporting.sweep_report import figure_png


def worst_layers(rows: list[dict], n: int = 5) -> list[dict]:
    def key(r):
        return (r["nonfinite_steps"], r["lost_norm_max"], r["rel_err_median"] if np.isfinite(r["rel_err_median"]) else 1e9)

    return sorted(rows, key=key, reverse=True)[:n]


def terminal(result) -> str:
    v = result.verdict
    lines = [f"verdict: {v.name} - {v.headline}"]
    if v.layer:
        lines.append(f"layer: {v.layer}")
    ref = result.analysis.ref
    lines.append(f"replayed: {ref.steps[-1].iteration} iterations from "
                 + (f"checkpoint step {ref.start_step} ({ref.start})" if ref.start else "step 0"))
    lines.append("evidence:")
    lines += [f"  {e}" for e in v.evidence]
    lines.append("worst layers (median rel. error, max flushed, max lost norm, non-finite steps, loss-scale range):")
    for r in worst_layers(result.rows):
        rng = f"{r['scale_lo']}..{r['scale_hi']}" if r["scale_lo"] != "" else "-"
        lines.append(f"  {r['param']:<32} {r['rel_err_median']:.3g}  {r['flushed_max']:.3g}  {r['lost_norm_max']:.3g}  "
                     f"{r['nonfinite_steps']}  {rng}")
    if result.free is not None:
        lines.append(f"free-running: {result.free}")
    if result.interventions:
        lines.append("interventions (each replayed from the same state, on the same batches and seed):")
        width = max(len(r["intervention"]) for r in result.interventions)
        for r in result.interventions:
            took = f"; {r['seconds']:.1f}s" if np.isfinite(r["seconds"]) else ""
            lines.append(f"  {r['intervention']:<{width}}  tests {r['tests']:<10} {r['outcome']}{took}")
    if v.fixes:   # only interventions whose replay removed the failure
        lines.append("fix (replayed: it removes the failure):")
        lines += [f"  {f.text}    # {f.why}" for f in v.fixes]
    elif v.name == "not_amp":
        lines.append("fix: none offered by diagnose: FP32 fails the same way")
    if result.proof is not None:
        lines.append(f"seeds: {result.proof.describe()}")
    if result.search is not None:
        lines.append(f"search: {result.search.describe()}")
    return "\n".join(lines)


def verdict_markdown(result) -> str:
    out = [f"# diagnose: {result.verdict.name}", "", terminal(result).replace("\n", "  \n"), "",
           "## per layer", "", "| " + " | ".join(LAYER_COLUMNS) + " |", "|" + "---|" * len(LAYER_COLUMNS)]
    for r in result.rows:
        out.append("| " + " | ".join(f"{r[c]:.4g}" if isinstance(r[c], float) else str(r[c]) for c in LAYER_COLUMNS) + " |")
    return "\n".join(out) + "\n"


# the heat maps (layers x training steps of the synced replay): file stem -> (field, what, log colour scale)
# (flushed: the share of a layer's FP32-nonzero gradient elements that are exactly zero under AMP)
HEATMAPS = {"heatmap": ("rel_err", "gradient error vs FP32", True),
            "underflow_heatmap": ("flushed", "true underflow", False)}


def heat_tables(result) -> dict[str, tuple[list[str], list[int], np.ndarray]]:
    """stem -> (parameter names, training steps, layers x steps matrix) of each heat map."""
    ref = result.analysis.ref
    out = {}
    for stem, (name, _, _) in HEATMAPS.items():
        names, matrix = heat(result.synced, name)
        out[stem] = (names, [ref.start_step + i for i in heat_iterations(result.synced)], matrix)
    return out


def heat_figures(result, tables: dict | None = None) -> dict:
    """stem -> matplotlib Figure, drawn with the sweep report's helper (`ampgan.reporting.sweep_report.heatmap_figure`)."""
    from ampgan.reporting.sweep_report import heatmap_figure

    figs = {}
    for stem, (names, steps, matrix) in (tables or heat_tables(result)).items():
        name, what, log = HEATMAPS[stem]
        figs[stem] = heatmap_figure(matrix, names, [str(s) for s in steps], f"{what} (synced replay)",
                                    f"{name}, step max (red: not finite)", log=log, bad="red")
    return figs


def heat_csv(tables: dict) -> str:
    """The heat maps' numbers, one row per (field, parameter), one column per training step (repr floats)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    steps = next(iter(tables.values()))[1]
    writer.writerow(["field", "param", *steps])
    for stem, (names, _, matrix) in tables.items():
        for name, row in zip(names, matrix):
            writer.writerow([HEATMAPS[stem][0], name, *(repr(float(v)) for v in row)])
    return out.getvalue()


def html(result, pngs: dict[str, bytes]) -> str:
    """The report page: terminal report, per-layer table, heat maps (`ampgan.reporting.sweep_report.html_page`)."""
    from ampgan.reporting.sweep_report import html_page

    s, v = result.analysis.settings, result.verdict
    title = f"diagnose: {v.name} ({s.model.name}, {s.data_name}, amp {s.amp.level}, scaler {s.scaler.name})"
    return html_page(title, v.headline, result.rows, pngs, text=terminal(result))


def write_files(result, folder: Path) -> tuple[list[Path], dict]:
    """layers.csv, heatmap.csv, report.md, report.html and the heat-map PNGs into `folder`.

    Returns the files to log as artifacts and the heat maps as matplotlib figures (logged with
    `log_figure`, as the sweep report's charts are)."""
    folder.mkdir(parents=True, exist_ok=True)
    csv_path = folder / "layers.csv"
    with csv_path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=LAYER_COLUMNS)
        writer.writeheader()
        writer.writerows(result.rows)
    md = folder / "report.md"
    md.write_text(verdict_markdown(result))
    tables = heat_tables(result)
    heat_path = folder / "heatmap.csv"
    heat_path.write_text(heat_csv(tables))
    figs = heat_figures(result, tables)
    pngs = {}
    for stem, fig in figs.items():
        pngs[stem] = figure_png(fig)
        (folder / f"{stem}.png").write_bytes(pngs[stem])
    page = folder / "report.html"
    page.write_text(html(result, pngs))
    files = [csv_path, heat_path, md, page]
    if result.interventions:
        tried = folder / "interventions.csv"
        with tried.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=INTERVENTION_COLUMNS)
            writer.writeheader()
            writer.writerows(result.interventions)
        files.append(tried)
    return files, figs


INTERVENTION_COLUMNS = ["intervention", "tests", "outcome", "removes_failure", "seconds"]



# ---------------------------------------------------------------- the rules, as docs/diagnose.md shows them
def rules_markdown() -> str:
    """verdict.py's rules (its docstring, first match wins) as a table with each verdict's exit code:
    docs/diagnose.md shows this very text, so the docs and the rules cannot disagree."""
    from ampgan.diagnose import verdict

    body = verdict.__doc__.split("Rules, first match wins:\n", 1)[1].split("\nA NaN", 1)[0]
    entries: list[list[str]] = []
    for line in body.splitlines():
        if line[2:3].strip():   # a rule's first line: two spaces, its verdict, its condition
            name, text = line.strip().split(None, 1)
            entries.append([name, text])
        elif line.strip():
            entries[-1][1] += " " + line.strip()
    rows = ["| verdict | when | exit |", "|---|---|---|"]
    rows += [f"| `{name}` | {_cell(text)} | {verdict.EXIT_CODES.get(name, 1)} |" for name, text in entries]
    rows.append(f"| `unexplained` | decided by the interventions (above): FP32 trains and no intervention tried removes "
                f"the failure | {verdict.EXIT_CODES['unexplained']} |")
    return "\n".join(rows)


def interventions_markdown() -> str:
    """interventions.py's table of interventions and its decision, from its docstring (as rules_markdown)."""
    from ampgan.diagnose import interventions

    doc = interventions.__doc__
    lines = doc.split("verdict is decided on what was measured (`confirm`):\n\n", 1)[1].splitlines()
    header = lines[0]
    c1, c2 = header.index("cause it tests"), header.index("where it comes from")
    rows: list[list[str]] = []
    i = 1
    while lines[i].strip():
        line = lines[i]
        what, cause, where = line[:c1].strip(), line[c1:c2].strip(), line[c2:].strip()
        if cause:
            rows.append([what, cause, where])
        else:
            rows[-1] = [" ".join(p for p in (rows[-1][0], what) if p), rows[-1][1],
                        " ".join(p for p in (rows[-1][2], where) if p)]
        i += 1
    out = ["| intervention | cause it tests | where it comes from |", "|---|---|---|"]
    out += [f"| {_cell(a)} | {f'`{b}`' if ' ' not in b else b} | {_cell(c)} |" for a, b, c in rows]
    steps: list[str] = []
    for line in lines[i + 1:]:
        if not line.strip():
            continue
        head = line.strip()
        if head[:2].rstrip(".").isdigit() and head[1:3].startswith("."):
            steps.append(head)
        elif line.startswith("       ") and steps:
            steps[-1] += " " + head
        else:
            steps.append(head)
    decision, after = [], []
    for step in steps:
        if "->" in step:
            cond, result = step.split("->", 1)
            decision.append(f"{' '.join(cond.split())}: {' '.join(result.split())}")
        else:
            after.append(" ".join(step.split()))
    return "\n".join(out + [""] + decision + ([""] + [" ".join(after)] if after else []))


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


RULES_BLOCK = ("<!-- rules: from ampgan/diagnose/verdict.py's docstring (python -m experiments.diagnose_cases --rules) -->",
               "<!-- end of rules -->")
INTERVENTIONS_BLOCK = ("<!-- interventions: from ampgan/diagnose/interventions.py's docstring "
                       "(python -m experiments.diagnose_cases --rules) -->", "<!-- end of interventions -->")


def docs_blocks() -> dict[tuple[str, str], str]:
    """docs/diagnose.md's generated blocks: (begin marker, end marker) -> the text between them."""
    return {RULES_BLOCK: rules_markdown(), INTERVENTIONS_BLOCK: interventions_markdown()}


# ---------------------------------------------------------------- the MLflow run
def publish(result, run_dir: Path, seconds: float) -> None:
    """The pipeline's Result as files in `run_dir`, and as an MLflow run tagged ampgan.kind=diagnose
    with them as artifacts; a diagnosed run gets the verdict as tags, with a link."""
    from omegaconf import OmegaConf

    from ampgan.diagnose.statistics import summaries
    from ampgan.tracking.tracker import build_tracker, flatten
    from ampgan.training.loop import tracked_run

    cfg, s, diagnosed = result.case.cfg, result.case.settings, result.case.run_id

    folder = Path(run_dir)
    result.folder = folder
    files, figures = write_files(result, folder)
    (folder / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    tracking = s.tracking
    tracking.experiment = cfg.diagnose.get("experiment", "ampgan-diagnose")
    tracker = build_tracker(tracking)
    v = result.verdict
    tags = {"ampgan.kind": "diagnose", "ampgan.verdict": v.name, "ampgan.layer": v.layer, "model": s.model.name,
            "data": s.data_name, "amp": s.amp.level, "scaler": s.scaler.name}
    if diagnosed:
        tags["ampgan.diagnosed_run"] = diagnosed
        tags["ampgan.start_step"] = str(result.analysis.ref.start_step)
    if cfg.diagnose.get("start"):   # a flight recording: where it is, and the step its state is from
        tags["ampgan.recording"] = str(cfg.diagnose.start)
        tags["ampgan.start_step"] = str(result.analysis.ref.start_step)
    if v.fixes:
        tags["ampgan.fix"] = v.fixes[0].text   # only fixes whose replay removed the failure are kept
    tags["mlflow.note.content"] = verdict_note(result)
    params = flatten(OmegaConf.to_container(cfg, resolve=True))
    with tracked_run(tracker, f"diagnose-{s.model.name}-{s.amp.level.lower()}-{s.scaler.name}", params, tags):
        metrics = {"diagnose/exit_code": float(v.exit_code), "diagnose/seconds": seconds,
                   "diagnose/replay_seconds": result.synced.seconds,
                   "diagnose/interventions": float(len(result.interventions or [])),
                   "diagnose/interventions_removing": float(sum(r["removes_failure"] for r in result.interventions or []))}
        for net, x in summaries(result.synced).items():
            metrics.update({f"diagnose/{net}/rel_err_median": x.rel_err_median, f"diagnose/{net}/nonfinite": x.nonfinite,
                            f"diagnose/{net}/lost_norm_max": x.lost_norm_max, f"diagnose/{net}/skipped": x.skipped})
        tracker.log_metrics(metrics, 0)
        for f in files + [folder / "config.yaml"]:
            tracker.log_artifact(f)
        client = getattr(tracker, "client", None)   # MLflow: the heat maps as charts, like a sweep report's
        for stem, fig in figures.items():
            if client is not None:
                client.log_figure(tracker.run_id, fig, f"{stem}.png")
    result.run_id = tracker.run_id
    if diagnosed and client is not None and tracker.run_id:
        mark_diagnosed(client, diagnosed, result, tags, tracker.experiment_id, tracker.run_id)


def verdict_note(result) -> str:
    """The diagnose run's description in MLflow's UI: the verdict line first, then its evidence."""
    v = result.verdict
    lines = [f"**ampgan verdict: {v.name}**: {v.headline}", ""]
    lines += [f"- {e}" for e in v.evidence]
    if v.fixes:
        lines += ["", "Fixes: " + "; ".join(f"`{f.text}`" for f in v.fixes)]
    return "\n".join(lines)


def mark_diagnosed(client, run_id: str, result, tags: dict, experiment_id: str, diagnosis_id: str) -> None:
    """The verdict where the run is: tags on the diagnosed run, with a link to its diagnosis (one request)."""
    from ampgan.tracking.tracker import run_link, tag_run

    v = result.verdict
    located = result.analysis.located
    marks = {"ampgan.verdict": v.name, "ampgan.verdict.line": v.headline, "ampgan.verdict.cell": v.layer or "-",
             "ampgan.verdict.op": located.describe() if located is not None else "-",
             "ampgan.verdict.fix": tags.get("ampgan.fix", "-"), "ampgan.diagnosis": diagnosis_id,
             "ampgan.diagnosis.link": run_link(experiment_id, diagnosis_id)}
    tag_run(client, run_id, marks)
