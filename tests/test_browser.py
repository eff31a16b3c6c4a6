"""The dashboard as a person sees it: `make ui`'s server, Debian's chromium driven by Playwright.

On a store holding a finished 4-job clip sweep: the sweep is one row on the experiment page
whose four children unfold under it; a child run shows its loss-scale chart; the parent run's
HTML report shows its table and charts in MLflow's artifact viewer. Screenshots go to
outputs/browser/. `make test` installs chromium (`make browser`) and Playwright (the lock).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

import psutil
import pytest
from playwright.sync_api import sync_playwright

from ampgan.training.parallel import free_port
from tests.conftest import ROOT
from tests.test_report import NAMES, finished_clip_sweep

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--run-all-compositor-stages-before-draw"]


@pytest.fixture(scope="module")
def clip_sweep(tmp_path_factory):
    return finished_clip_sweep(tmp_path_factory.getbasetemp() / "clip_sweep")


@pytest.fixture(scope="module")
def diagnosed(clip_sweep):
    """One job of the sweep diagnosed by `python -m ampgan.diagnose diagnose.run=<its id>`: (run, diagnose run)."""
    child = next(c for c in clip_sweep.children if c.info.run_name == "o0-fixed_clip-clip_norm=0.5-seed0")
    env = {**os.environ, "AMPGAN_OUTPUTS": str(clip_sweep.outputs)}
    done = subprocess.run([sys.executable, "-m", "ampgan.diagnose", f"diagnose.run={child.info.run_id}",
                           "diagnose.steps=2"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode in (0, 1, 3), done.stderr[-3000:]  # a verdict (not 2: bad input)
    run = clip_sweep.client.get_run(child.info.run_id)
    diagnosis = clip_sweep.client.get_run(run.data.tags["ampgan.diagnosis"])
    return run, diagnosis


@pytest.fixture
def ui_server(clip_sweep, tmp_path):
    """`python -m ampgan.tracking ui` on the sweep's store; stopped with its whole process group.
    (base address, experiment id, the page it printed to open)."""
    port = free_port()
    env = {**os.environ, "AMPGAN_OUTPUTS": str(clip_sweep.outputs)}
    printed = tmp_path / "ui.out"
    with printed.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "ampgan.tracking", "ui", "--port", str(port)], cwd=ROOT, env=env,
                                stdout=out, stderr=subprocess.DEVNULL, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while proc.poll() is None and time.time() < deadline:
            try:
                urllib.request.urlopen(f"{base}/health", timeout=5)
                break
            except OSError:
                time.sleep(1)
        assert proc.poll() is None, "the dashboard server stopped"
        exp = json.load(urllib.request.urlopen(f"{base}/api/2.0/mlflow/experiments/get-by-name?experiment_name=ampgan"))
        opens = [ln.split(": ", 1)[1].strip() for ln in printed.read_text().splitlines() if ln.startswith("ampgan's runs: ")]
        assert opens, printed.read_text()
        yield base, exp["experiment"]["experiment_id"], opens[0]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
        deadline = time.time() + 60
        while _group(proc.pid) and time.time() < deadline:
            time.sleep(0.5)
        left = _group(proc.pid)
        for p in left:
            p.kill()
        assert not left, f"left running: {[p.cmdline() for p in left]}"


def close_assistant(page) -> None:
    """MLflow 3.17 opens an assistant side panel; close it so the screenshots show the runs."""
    close = page.locator("button[aria-label=Close]")
    if close.count():
        close.first.click()


def _group(pgid: int) -> list:
    out = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (ProcessLookupError, psutil.Error):
            continue
    return out


def test_sweep_dashboard_in_a_real_browser(clip_sweep, ui_server):
    base, exp_id, _ = ui_server
    shots = clip_sweep.outputs / "browser"
    shots.mkdir(parents=True, exist_ok=True)
    parent = clip_sweep.parent
    child = next(c for c in clip_sweep.children if c.info.run_name == "o0-fixed_clip-clip_norm=0.5-seed0")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=shutil.which("chromium"), args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.set_default_timeout(60_000)

            # the experiment page: one row for the sweep, its four jobs unfold under it
            page.goto(f"{base}/#/experiments/{exp_id}?workflowType=machine_learning")
            row = page.locator("[role=row]", has_text=parent.info.run_name).first
            row.wait_for()
            for name in NAMES:
                assert page.get_by_text(name, exact=True).count() == 0  # folded: only the sweep's row
            row.locator("button[data-component-id*=runnamecellrenderer]").click()
            for name in NAMES:
                page.get_by_text(name, exact=True).wait_for()
            assert page.locator("[role=row]", has_text="o0-fixed_clip-clip_norm=").count() == 4
            close_assistant(page)
            page.screenshot(path=str(shots / "experiment.png"))

            # a child run: its loss-scale chart (MLflow groups charts by prefix: section "critic", chart "scale")
            page.goto(f"{base}/#/experiments/{exp_id}/runs/{child.info.run_id}/model-metrics")
            page.get_by_placeholder("Search metric charts").fill("critic/scale")
            card = page.locator("[data-testid=experiment-view-compare-runs-card]",
                                has=page.get_by_text("scale", exact=True)).first
            card.locator("svg.main-svg").first.wait_for()
            assert child.info.run_name in card.inner_text()  # the legend names the run
            assert card.locator("path.js-line, g.trace").count() >= 1  # a plotted line
            page.screenshot(path=str(shots / "child_loss_scale.png"))

            # the parent run: its HTML report (table and charts) in the artifact viewer
            page.goto(f"{base}/#/experiments/{exp_id}/runs/{parent.info.run_id}/artifacts/report/report.html")
            report = page.frame_locator("iframe").first
            table_rows = report.locator("#report-table tbody tr")
            table_rows.first.wait_for()
            assert table_rows.count() == 4
            text = report.locator("#report-table").inner_text()
            assert all(name in text for name in NAMES)
            images = report.locator("#charts img")
            assert images.count() == 4
            for i in range(4):
                images.nth(i).scroll_into_view_if_needed()
                assert images.nth(i).evaluate("img => img.complete && img.naturalWidth > 200")
            page.screenshot(path=str(shots / "parent_report.png"))
        finally:
            browser.close()
    for shot in ("experiment.png", "child_loss_scale.png", "parent_report.png"):
        assert (shots / shot).stat().st_size > 10_000


@pytest.mark.slow  # `make test-full` (CI's 30 minutes on a slow machine)
def test_the_dashboard_opens_on_the_training_view_with_each_verdict_on_its_run(clip_sweep, diagnosed, ui_server):
    """The page `make ui` prints: ampgan's runs table (not MLflow's GenAI welcome page); a diagnosed run
    shows its verdict and the link to its diagnosis; the diagnosis's description starts with the verdict."""
    base, exp_id, opens = ui_server
    run, diagnosis = diagnosed
    verdict, line = run.data.tags["ampgan.verdict"], run.data.tags["ampgan.verdict.line"]
    assert opens == f"{base}/#/experiments/{exp_id}/runs?workflowType=machine_learning"
    assert diagnosis.data.tags["mlflow.note.content"].startswith(f"**ampgan verdict: {verdict}**: {line}")
    shots = clip_sweep.outputs / "browser"
    shots.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=shutil.which("chromium"), args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.set_default_timeout(60_000)
            page.goto(opens)
            page.locator("[role=row]", has_text=clip_sweep.parent.info.run_name).first.wait_for()
            text = page.locator("body").inner_text()
            # the training view's runs table, not the GenAI view (welcome page, traces, evaluations)
            assert "Run Name" in text and "Welcome to MLflow" not in text and "Evaluations" not in text, text[:2000]
            assert f"/experiments/{exp_id}" in page.url
            close_assistant(page)
            page.screenshot(path=str(shots / "training_view.png"))

            # the diagnosed run, opened as the diagnosis's link does; still the training view
            assert run.data.tags["ampgan.diagnosis.link"] == (
                f"#/experiments/{diagnosis.info.experiment_id}/runs/{diagnosis.info.run_id}?workflowType=machine_learning")
            page.goto(f"{base}/#/experiments/{exp_id}/runs/{run.info.run_id}?workflowType=machine_learning")
            page.get_by_text("ampgan.verdict.line").first.wait_for()
            text = page.locator("body").inner_text()
            assert "Evaluation runs" not in text, text[:2000]
            assert verdict in text and line[:60] in text and diagnosis.info.run_id in text, text[:3000]
            page.screenshot(path=str(shots / "diagnosed_run.png"), full_page=True)

            page.goto(f"{base}/{run.data.tags['ampgan.diagnosis.link']}")
            page.get_by_text(f"ampgan verdict: {verdict}").first.wait_for()
            page.screenshot(path=str(shots / "diagnosis.png"), full_page=True)
        finally:
            browser.close()
    assert (shots / "training_view.png").stat().st_size > 10_000
