"""The two scripts of docs/own-script.md, before and after ampgan enters them (issue 43, item 6):
each runs as a user would run it, the docs show them verbatim, and the lines ampgan adds or
changes are all marked `# ampgan`."""

from __future__ import annotations

import difflib
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT, all_runs

EXAMPLES = ROOT / "docs" / "examples"
SCRIPTS = {"model_train": ["--epochs", "2", "--batches", "4"], "functional": ["--steps", "12"]}


def run_script(name: str, outputs, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "AMPGAN_OUTPUTS": str(outputs), "GLOG_v": "3"}
    return subprocess.run([sys.executable, str(EXAMPLES / f"{name}.py"), *args], cwd=outputs.parent, env=env,
                          capture_output=True, text=True, timeout=600)


# model_train (58 s) in make test-full: make test keeps Model.train with ampgan's cell and callback (test_user_script)
@pytest.mark.parametrize("script", [pytest.param(s, marks=pytest.mark.slow) if s == "model_train" else s
                                    for s in sorted(SCRIPTS)])
def test_the_script_runs_before_and_after_and_only_after_is_an_ampgan_run(script, outputs):
    outputs.mkdir(parents=True, exist_ok=True)
    before = run_script(f"{script}_before", outputs, *SCRIPTS[script])
    assert before.returncode == 0, before.stderr[-2000:]
    assert not (outputs / "mlflow.db").exists()            # the plain script logs nowhere
    after = run_script(f"{script}_after", outputs, *SCRIPTS[script])
    assert after.returncode == 0, after.stderr[-2000:]
    client, runs = all_runs(outputs)
    (run,) = runs
    assert run.info.status == "FINISHED" and run.data.tags["amp"] == "O2"
    assert run.data.tags["ampgan.source"] == {"model_train": "callback", "functional": "monitor"}[script]
    history = client.get_metric_history(run.info.run_id, "train/loss")
    assert len(history) >= 2 and all(m.value == m.value for m in history)   # logged at its cadence, finite
    assert "train/scale" in run.data.metrics and "train/underflow" in run.data.metrics


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_every_line_ampgan_adds_or_changes_is_marked(script):
    before = [line.strip() for line in (EXAMPLES / f"{script}_before.py").read_text().splitlines()]
    after = [line.strip() for line in (EXAMPLES / f"{script}_after.py").read_text().splitlines()]
    diff = list(difflib.ndiff(before, after))
    added = [line[2:] for line in diff if line.startswith("+ ") and line[2:]]
    removed = [line[2:] for line in diff if line.startswith("- ") and line[2:]]
    assert added and all("# ampgan" in line for line in added), added
    assert len(removed) <= 3, removed   # the lines ampgan replaces: a scaler, Model(...), its callbacks


def test_the_docs_show_both_scripts_verbatim():
    text = (ROOT / "docs" / "own-script.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    for script in SCRIPTS:
        for side in ("before", "after"):
            assert (EXAMPLES / f"{script}_{side}.py").read_text() in blocks, f"{script}_{side}.py"
