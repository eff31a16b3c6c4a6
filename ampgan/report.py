"""`python -m ampgan.report`: read runs back from the store and print a comparison table.

    python -m ampgan.report                 # the latest sweep in the embedded store
    python -m ampgan.report --sweep ID      # one sweep (its `sweep_id` tag)
    python -m ampgan.report --all --last 10 # the ten latest runs, sweep or not
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from ampgan.config import outputs_dir

PREFIXES = ("critic", "gen", "train")


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def summarize(client, run) -> dict:
    """One row: identity, outcome, quality, and per-net scaler figures."""
    m, t = run.data.metrics, run.data.tags
    row = {"job": t.get("job_num", ""), "amp": t.get("amp"), "scaler": t.get("scaler"),
           "overrides": t.get("overrides", ""), "status": run.info.status, "outcome": t.get("outcome", "-")}
    for key in ("eval/swd", "eval/modes_covered", "eval/high_quality", "eval/accuracy", "eval/loss"):
        if key in m:
            row[key.split("/", 1)[1]] = m[key]
    for p in PREFIXES:
        if f"{p}/scale" not in m:
            continue
        row[f"{p} skipped"] = m.get(f"{p}/skipped_total", m.get(f"{p}/skipped"))
        row[f"{p} final scale"] = m[f"{p}/scale"]
        hist = [x.value for x in client.get_metric_history(run.info.run_id, f"{p}/underflow")]
        row[f"{p} underflow (mean)"] = float(np.mean(hist)) if hist else None
        if t.get("scaler") == "fixed_clip":
            row[f"{p} clip rate"] = m.get(f"{p}/clip_rate")
    return row


def markdown(rows: list[dict]) -> str:
    cols: list[str] = []
    for r in rows:
        cols += [k for k in r if k not in cols]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_fmt(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ampgan.report", description=__doc__.splitlines()[0])
    parser.add_argument("--uri", default=f"sqlite:///{outputs_dir() / 'mlflow.db'}")
    parser.add_argument("--experiment", default="ampgan")
    parser.add_argument("--sweep", default="latest", help="sweep_id tag, or 'latest'")
    parser.add_argument("--all", action="store_true", help="ignore sweeps: the latest runs")
    parser.add_argument("--last", type=int, default=20)
    args = parser.parse_args(argv)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(args.uri)
    exp = client.get_experiment_by_name(args.experiment)
    if exp is None:
        print(f"ampgan: error: no experiment '{args.experiment}' in {args.uri}", file=sys.stderr)
        return 2
    runs = client.search_runs([exp.experiment_id], order_by=["attributes.start_time DESC"], max_results=1000)
    if not args.all:
        sweep = args.sweep
        if sweep == "latest":
            sweep = next((r.data.tags["sweep_id"] for r in runs if "sweep_id" in r.data.tags), None)
        runs = [r for r in runs if sweep is not None and r.data.tags.get("sweep_id") == sweep]
        if not runs:
            print(f"ampgan: error: no runs of sweep '{args.sweep}' in {args.uri}", file=sys.stderr)
            return 2
        runs.sort(key=lambda r: int(r.data.tags.get("job_num", 0)))
        print(f"sweep {sweep}: {len(runs)} runs")
    else:
        runs = runs[: args.last]
    print(markdown([summarize(client, r) for r in runs]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
