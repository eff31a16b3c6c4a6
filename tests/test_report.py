"""Sweeps as nested MLflow runs, and the sweep report: its numbers are the runs' logged metrics.

One real 4-job clip sweep (trainer=smoke) is run once per test session and shared with
tests/test_browser.py (`clip_sweep`).
"""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from ampgan.reporting.sweep_report import PARENT_TAG
from ampgan.sweeps.runs import PARENT_RECORD, parent_tags, swept_keys
from tests.conftest import ROOT, all_runs, run_cli

CLIP_NORMS = ("0.5", "1", "2", "5")
SWEEP = ("-m", "scaler=fixed_clip", f"scaler.clip_norm={','.join(CLIP_NORMS)}", "trainer=smoke")
NAMES = {f"o0-fixed_clip-clip_norm={c}-seed0" for c in CLIP_NORMS}
CHARTS = ("objective.png", "loss_scale.png", "skipped_clip.png", "underflow_heatmap.png")


@dataclass
class Sweep:
    outputs: Path
    sweep_id: str
    sweep_dir: Path
    client: object
    parent: object
    children: list


def finished_clip_sweep(base: Path) -> Sweep:
    """The 4-job clip sweep in `base/outputs`, run the first time it is asked for in this session."""
    outputs = base / "outputs"
    done = base / "sweep.done"
    if not done.exists():
        proc = run_cli(*SWEEP, outputs=outputs)
        assert proc.returncode == 0, proc.stderr[-3000:]
        done.write_text("ok")
    client, runs = all_runs(outputs)
    parents = [r for r in runs if PARENT_TAG in r.data.tags]
    assert len(parents) == 1, [r.info.run_name for r in runs]
    parent = parents[0]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    sweep_id = parent.data.tags["sweep_id"]
    return Sweep(outputs, sweep_id, Path(parent.data.tags["sweep_dir"]), client, parent,
                 sorted(children, key=lambda r: int(r.data.tags["job_num"])))


@pytest.fixture(scope="module")
def clip_sweep(tmp_path_factory) -> Sweep:
    return finished_clip_sweep(tmp_path_factory.getbasetemp() / "clip_sweep")


def report_cli(*args: str, outputs: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "AMPGAN_OUTPUTS": str(outputs), "GLOG_v": "3"}
    return subprocess.run([sys.executable, "-m", "ampgan.report", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # `make test-full` (CI's 30 minutes on a slow machine)
def test_sweep_is_one_parent_run_with_its_jobs_nested(clip_sweep):
    parent, children = clip_sweep.parent, clip_sweep.children
    assert parent.info.status == "FINISHED"
    assert parent.info.run_name == "sweep scaler.clip_norm=0.5,1,2,5"
    assert parent.data.tags["outcome"] == "4/4 finished"
    assert parent.data.params["scaler.clip_norm"] == "0.5,1,2,5" and parent.data.params["trainer"] == "smoke"
    assert "scaler.clip_norm=0.5,1,2,5" in parent.data.tags["command"]
    assert parent.data.metrics["sweep/jobs"] == 4 and parent.data.metrics["sweep/finished"] == 4
    record = json.loads((clip_sweep.sweep_dir / PARENT_RECORD).read_text())
    assert record["run_id"] == parent.info.run_id and record["varies"] == ["scaler.clip_norm"]
    assert len(children) == 4 and {c.info.run_name for c in children} == NAMES
    assert all(c.info.status == "FINISHED" and c.data.tags["sweep_id"] == clip_sweep.sweep_id for c in children)
    # the parent ends after its children: the report it carries saw them finished
    assert parent.info.end_time >= max(c.info.end_time for c in children)
    logged = {f.path for f in clip_sweep.client.list_artifacts(parent.info.run_id, "report")}
    assert logged == {f"report/{n}" for n in ("table.md", "table.csv", "report.html", *CHARTS)}


def test_swept_keys_and_parent_outside_a_sweep():
    assert swept_keys(["amp=o0,o2", "trainer=smoke", "+x.y=range(1,3)"], {"scaler": "none,dynamic"}) == ["amp", "x.y", "scaler"]
    assert swept_keys(["amp=o2", "hydra.launcher.n_jobs=2,3"]) == []
    assert parent_tags("sqlite:////nowhere/mlflow.db") == {}  # a single run stays top-level


def test_report_table_is_the_logged_metrics(clip_sweep):
    proc = report_cli(clip_sweep.sweep_id, outputs=clip_sweep.outputs)
    assert proc.returncode == 0, proc.stderr[-2000:]
    folder = clip_sweep.outputs / "reports" / clip_sweep.sweep_id
    assert f"report: {folder / 'report.html'} and to parent run {clip_sweep.parent.info.run_id}" in proc.stdout
    rows = list(csv.DictReader((folder / "table.csv").open()))
    assert len(rows) == 4
    client = clip_sweep.client
    by_name = {c.info.run_name: c for c in clip_sweep.children}
    for row in rows:
        run = by_name[row["run"]]
        m = run.data.metrics
        assert float(row["scaler.clip_norm"]) == float(run.data.params["scaler.clip_norm"])
        assert row["run"] == f"o0-fixed_clip-clip_norm={float(row['scaler.clip_norm']):g}-seed0"
        assert float(row["swd"]) == m["eval/swd"]
        for p in ("critic", "gen"):
            assert float(row[f"{p} skipped"]) == m[f"{p}/skipped_total"]
            assert float(row[f"{p} final scale"]) == m[f"{p}/scale"] == 1024.0
            assert float(row[f"{p} clip rate"]) == m[f"{p}/clip_rate"]
            history = [x.value for x in client.get_metric_history(run.info.run_id, f"{p}/underflow")]
            assert len(history) >= 3 and math.isclose(float(row[f"{p} underflow (mean)"]), float(np.mean(history)))
        wall = (run.info.end_time - run.info.start_time) / 1000
        assert abs(float(row["wall time (s)"]) - wall) <= 0.05
        assert (row["status"], row["outcome"]) == ("FINISHED", "completed")
    # a tighter threshold clips at least as often: the table reads the way the sweep ran
    rates = [float(r["critic clip rate"]) for r in sorted(rows, key=lambda r: float(r["scaler.clip_norm"]))]
    assert rates == sorted(rates, reverse=True) and rates[0] > rates[-1]
    md = (folder / "table.md").read_text().splitlines()
    assert len(md) == 6 and all(name in "\n".join(md) for name in NAMES)
    for chart in CHARTS:
        with Image.open(folder / chart) as im:
            assert im.format == "PNG" and im.width >= 300 and im.height >= 200
    page = (folder / "report.html").read_text()
    assert page.count("<tr>") == 5 and page.count('src="data:image/png;base64,') == len(CHARTS)
    assert all(name in page for name in NAMES)


def test_report_flags_and_errors(clip_sweep, monkeypatch, capsys):
    from ampgan.reporting.sweep_report import main

    monkeypatch.setenv("AMPGAN_OUTPUTS", str(clip_sweep.outputs))
    assert main([]) == 0 and f"sweep {clip_sweep.sweep_id}: 4 runs" in capsys.readouterr().out  # the latest sweep
    assert main(["--sweep", clip_sweep.sweep_id, "--out", str(clip_sweep.outputs / "by_flag")]) == 0
    assert f"sweep {clip_sweep.sweep_id}: 4 runs" in capsys.readouterr().out
    assert (clip_sweep.outputs / "by_flag" / "table.csv").read_text() == \
        (clip_sweep.outputs / "reports" / clip_sweep.sweep_id / "table.csv").read_text()
    assert main(["--all", "--last", "2"]) == 0
    assert len(capsys.readouterr().out.strip().splitlines()) == 4  # header, rule, 2 runs
    assert main(["no-such-sweep"]) == 2
    assert capsys.readouterr().err == "ampgan: error: no runs of sweep 'no-such-sweep'\n"


def test_gan_samples_over_training(clip_sweep):
    child = clip_sweep.children[0]
    folder = Path(child.data.tags["output_dir"])
    frames = sorted(p.name for p in (folder / "samples").glob("step-*.png"))
    assert frames == ["step-000003.png", "step-000006.png"]  # eval_every=3, and the end of a 6-step run
    with Image.open(folder / "samples" / frames[0]) as frame, Image.open(folder / "samples_strip.png") as strip:
        assert strip.width > 2 * frame.width * 200 / frame.height - 10 and strip.height > 200
    logged = {f.path for f in clip_sweep.client.list_artifacts(child.info.run_id, "samples/steps")}
    assert logged == {f"samples/steps/{f}" for f in frames}
    assert "samples/samples_strip.png" in {f.path for f in clip_sweep.client.list_artifacts(child.info.run_id, "samples")}
    # the same pictures as an MLflow image sequence (the UI's step slider): one per evaluation step
    images = [f.path for f in clip_sweep.client.list_artifacts(child.info.run_id, "images")]
    steps = sorted(int(p.split("+step+")[1].split("+")[0]) for p in images if p.startswith("images/samples+") and p.endswith(".png"))
    assert steps == [3, 6], images
