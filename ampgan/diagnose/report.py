"""The report: terminal text (verdict first), Markdown, the per-layer CSV, a heat map, an MLflow run."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from ampgan import plots
from ampgan.diagnose.statistics import LAYER_COLUMNS, heat, layer_rows


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
    if v.fixes:
        lines.append("fix:" if result.checked is None else "fixes (verified, best first):")
        if result.checked is None:
            lines += [f"  {f.text}    # {f.why}" for f in v.fixes]
        else:
            for c in result.checked:
                mark = "confirmed" if c.confirmed else f"not confirmed ({c.verdict})"
                lines.append(f"  {c.fix.text}    # {mark}; rel. error {c.rel_err:.3g}; FP32 share {c.fp32_share:.2f}; "
                             f"{c.seconds:.1f}s")
    elif v.name == "not_amp":
        lines.append("fix: none offered by diagnose: FP32 fails the same way")
    if result.proof is not None:
        lines.append(f"seeds: {result.proof.describe()}")
    if result.search is not None:
        lines.append(f"search: {result.search.describe()}")
    return "\n".join(lines)


def markdown(result) -> str:
    out = [f"# diagnose: {result.verdict.name}", "", terminal(result).replace("\n", "  \n"), "",
           "## per layer", "", "| " + " | ".join(LAYER_COLUMNS) + " |", "|" + "---|" * len(LAYER_COLUMNS)]
    for r in result.rows:
        out.append("| " + " | ".join(f"{r[c]:.4g}" if isinstance(r[c], float) else str(r[c]) for c in LAYER_COLUMNS) + " |")
    return "\n".join(out) + "\n"


def write_files(result, folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    csv_path = folder / "layers.csv"
    with csv_path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=LAYER_COLUMNS)
        writer.writeheader()
        writer.writerows(result.rows)
    md = folder / "report.md"
    md.write_text(markdown(result))
    names, matrix = heat(result.synced)
    shown = np.where(np.isfinite(matrix), matrix, np.nanmax(np.where(np.isfinite(matrix), matrix, 0)) * 2 + 1)
    png = plots.heatmap(np.round(shown, 4), folder / "heatmap.png", cell=36,
                        title=f"relative gradient error, layers (rows: {', '.join(names[:3])}...) x steps")
    return [csv_path, md, png]


def layer_table(result) -> list[dict]:
    return layer_rows(result.synced, result.fits)
