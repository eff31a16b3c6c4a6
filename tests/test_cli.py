"""The command line as a user types it: bad input -> one line on stderr, non-zero exit, no RUNNING run."""

from __future__ import annotations

import pytest

from tests.conftest import all_runs, run_cli

BAD = {
    "unknown amp level": (["amp=o9"], "amp=o9"),
    "negative init scale": (["scaler=dynamic", "scaler.init_scale=-1"], "scaler.init_scale"),
    "init scale on the none scaler": (["scaler.init_scale=-1"], "scaler.init_scale"),
    "zero steps": (["trainer.max_steps=0"], "trainer.max_steps"),
    "unknown data set": (["data=nope"], "data=nope"),
    "missing gpu": (["hardware=gpu"], "hardware=gpu"),
    "bad value inside a sweep": (["-m", "scaler=dynamic", "scaler.window=10,0"], "scaler.window"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_fails_with_one_line(outputs, case):
    args, fragment = BAD[case]
    proc = run_cli(*args, outputs=outputs)
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("ampgan: error:")]
    assert len(errors) == 1 and fragment in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr
    _, runs = all_runs(outputs) if (outputs / "mlflow.db").exists() else (None, [])
    assert all(r.info.status != "RUNNING" for r in runs)
    assert runs == []  # every one of these fails before a run is created


def test_cli_smoke_run_and_help(outputs):
    proc = run_cli("model=classifier", "data=digits", "amp=o3", "hardware=cpu", "trainer=smoke", outputs=outputs)
    assert proc.returncode == 0, proc.stderr
    assert "step 6/6" in proc.stdout + proc.stderr
    _, runs = all_runs(outputs)
    assert [r.info.status for r in runs] == ["FINISHED"]
    assert runs[0].data.tags["amp"] == "O3"
