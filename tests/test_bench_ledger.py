"""The bench's sections: written as each ends, resumed after a stop, compared with an earlier table
(experiments/bench_ledger.py). Tiny sections of plain Python stand in for the timed ones: what is
tested is the bookkeeping, not a timing."""

from __future__ import annotations

import argparse
import json

import pytest

from experiments.bench_ledger import Section, compare, load, run_sections


class Stopped(Exception):
    """The bench stopped mid-section (a kill, Ctrl-C)."""


def _sections(calls: list[str], stop_at: str | None = None) -> list[Section]:
    def part(name: str, value: float):
        def measure() -> dict:
            calls.append(name)
            if name == stop_at:
                raise Stopped(name)
            return {"rows": [{"comparison": name, "variant": "b", "baseline": "a", "ratio": value,
                              "ci_low": value - 0.01, "ci_high": value + 0.01}]}
        return Section(name, measure)

    return [part("first", 1.01), part("second", 1.02), part("third", 1.03)]


PLAN = {"repeats": 3, "only": ""}


def test_a_stopped_bench_keeps_each_finished_section_and_resumes_at_the_first_unfinished(tmp_path):
    ledger, published, calls = tmp_path / "sections.json", [], []
    with pytest.raises(Stopped):
        run_sections(_sections(calls, stop_at="second"), ledger, PLAN, lambda d, p: published.append((list(d), p)))
    assert calls == ["first", "second"]
    assert published == [(["first"], ["second", "third"])]   # the finished section was published before the stop
    kept = load(ledger)
    assert list(kept["sections"]) == ["first"] and not kept["complete"]
    record = kept["sections"]["first"]
    assert record["result"]["rows"][0]["ratio"] == 1.01 and record["commit"] and record["finished"]
    assert {"cores", "cpu", "load_before"} <= set(record["machine"])

    said, calls = [], []
    done = run_sections(_sections(calls), ledger, PLAN, lambda d, p: published.append((list(d), p)), echo=said.append)
    assert calls == ["second", "third"]                      # the first is not measured again
    assert list(done) == ["first", "second", "third"] and load(ledger)["complete"]
    assert published[-1] == (["first", "second", "third"], [])
    assert said[0].startswith("bench: resuming: 1 of 3 sections already measured")
    assert any(line.startswith("[2/3] second (") for line in said)


def test_a_finished_bench_a_restart_or_other_arguments_start_over(tmp_path):
    ledger, calls = tmp_path / "sections.json", []
    run_sections(_sections(calls), ledger, PLAN, lambda d, p: None)
    calls.clear()
    run_sections(_sections(calls), ledger, PLAN, lambda d, p: None)            # complete: a new bench
    assert calls == ["first", "second", "third"]

    calls.clear()
    with pytest.raises(Stopped):
        run_sections(_sections(calls, stop_at="third"), ledger, PLAN, lambda d, p: None)
    calls.clear()
    run_sections(_sections(calls), ledger, PLAN, lambda d, p: None, restart=True)
    assert calls == ["first", "second", "third"]

    calls.clear()
    with pytest.raises(Stopped):
        run_sections(_sections(calls, stop_at="third"), ledger, PLAN, lambda d, p: None)
    calls.clear()
    said = []
    run_sections(_sections(calls), ledger, {**PLAN, "repeats": 5}, lambda d, p: None, echo=said.append)
    assert calls == ["first", "second", "third"] and said[0].endswith("ran other arguments: starting over")


def test_the_progress_line_says_how_long_the_remaining_sections_took_the_last_time(tmp_path):
    ledger, said = tmp_path / "sections.json", []
    run_sections(_sections([]), ledger, PLAN, lambda d, p: None, echo=said.append)
    assert said[0] == "[1/3] first (this and the 2 after it: no earlier time here, the first bench of them)"
    said.clear()
    run_sections(_sections([]), ledger, PLAN, lambda d, p: None, echo=said.append)
    assert said[0].startswith("[1/3] first (this and the 2 after it took ") and said[0].endswith(" the last time)")
    assert any(line.startswith("[3/3] third (the last section took ") for line in said), said
    said.clear()   # a section this ledger never timed (a new one): the sum of the others, and how many are new
    run_sections(_sections([]) + [Section("fourth", lambda: {"rows": []})], ledger, PLAN, lambda d, p: None,
                 echo=said.append)
    assert said[0].startswith("[1/4] first (this and the 3 after it took ") and said[0].endswith(
        ", 1 of them not timed before)")


def _table(ratios: dict[str, tuple[float, float, float]], date: str) -> dict:
    return {"meta": {"date": date, "commit": "abc"},
            "comparisons": [{"comparison": c, "variant": "ampgan", "baseline": "bare", "ratio": r, "ci_low": lo,
                             "ci_high": hi} for c, (r, lo, hi) in ratios.items()],
            "startup": [{"phase": "ampgan beyond the floor", "cold": 0.4, "cold_ci": [0.3, 0.5], "warm": 0.2,
                         "warm_ci": [0.15, 0.25]}]}


def test_the_comparison_gives_each_ratios_change_and_whether_its_interval_moved():
    old = _table({"gan": (1.00, 0.99, 1.01), "lm": (1.03, 1.02, 1.04), "gone": (1.0, 1.0, 1.0)}, "2026-12-01")
    new = _table({"gan": (1.05, 1.04, 1.06), "lm": (1.025, 1.015, 1.035), "added": (1.0, 1.0, 1.0)}, "2026-12-05")
    text = compare(new, old, "docs/bench/bench.json")
    lines = {line.split(" | ")[0].strip("| "): line for line in text.splitlines() if line.startswith("| ")}
    assert "| 1.050 [1.040-1.060] | 1.000 [0.990-1.010] | +0.050 | up: intervals apart |" in lines["gan"]
    assert "| -0.005 | no: intervals overlap |" in lines["lm"]
    assert "Only in this table: added / ampgan" in text and "Only in docs/bench/bench.json: gone / ampgan" in text
    assert "| start-up (cold) | ampgan beyond the floor | 0.40 s | 0.40 s | +0.00 s | no: intervals overlap |" in text


def _args(**kw) -> argparse.Namespace:
    base = dict(device="CPU", full=False, quick=False, only="", no_startup=False, startup_rounds=None)
    return argparse.Namespace(**{**base, **kw})


def test_the_default_bench_measures_the_headline_sections_and_full_adds_the_rest(tmp_path):
    from experiments.bench import sections

    default = [s.name for s in sections(_args(), 3, 0, "sqlite://", tmp_path)]
    full = [s.name for s in sections(_args(full=True), 5, 20000, "sqlite://", tmp_path)]
    for headline in ("ampgan vs bare MindSpore (WGAN-GP", "ampgan vs bare MindSpore: language model", "gradient health",
                     "activation headroom (", "tracking to MLflow", "loss-scale strategy",
                     "diagnose, whole command vs one training run", "start-up",
                     "per-job overhead", "ampgan's step cell vs MindSpore's TrainOneStepCell under Model.train (",
                     "ampgan's step cell vs MindSpore's TrainOneStepCell under Model.train in GRAPH_MODE"):
        assert any(n.startswith(headline) for n in default), headline
    extra = set(full) - set(default)
    for beside in ("calibration", "activation headroom: classifier",
                   "diagnose replay vs training"):
        assert any(n.startswith(beside) for n in extra), beside   # not headline figures: bench-full's
    assert any(n.startswith("jit vs PYNATIVE") for n in extra) and any(n.startswith("scaling:") for n in extra)
    assert any(n.startswith("data parallel") for n in extra) and any(n.startswith("AMP level") for n in extra)
    assert default == [n for n in full if n in default]   # the same order
    only = [s.name for s in sections(_args(only="jit vs", no_startup=True), 3, 0, "sqlite://", tmp_path)]
    assert len(only) == 1 and only[0].startswith("jit vs PYNATIVE")   # named by --only: measured
    whole = [s.name for s in sections(_args(only="whole command", no_startup=True), 3, 0, "sqlite://", tmp_path)]
    assert whole == ["diagnose, whole command vs one training run"]
    assert "memory" not in default and full[0] == "memory"   # the RSS runs are bench-full's
    asked = [s.name for s in sections(_args(), 3, 300, "sqlite://", tmp_path)]
    assert asked[0] == "memory"   # unless --memory-steps asks for them


def test_compare_reads_the_last_table_and_an_earlier_one_and_refuses_a_missing_one(tmp_path, monkeypatch, capsys):
    from experiments.bench import main

    monkeypatch.setenv("AMPGAN_OUTPUTS", str(tmp_path / "outputs"))
    assert main(["--compare", str(tmp_path / "old.json")]) == 2
    assert capsys.readouterr().err.startswith("ampgan: error: --compare: ")
    (tmp_path / "outputs" / "bench").mkdir(parents=True)
    (tmp_path / "outputs" / "bench" / "bench.json").write_text(json.dumps(_table({"gan": (1.01, 1.0, 1.02)}, "now")))
    (tmp_path / "old.json").write_text(json.dumps(_table({"gan": (1.01, 1.0, 1.02)}, "then")))
    assert main(["--compare", str(tmp_path / "old.json")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# bench: this table (now, commit abc) against ") and "| +0.000 | no: intervals overlap |" in out


def test_an_only_that_names_no_section_is_one_line(tmp_path, monkeypatch, capsys):
    from experiments.bench import main

    monkeypatch.setenv("AMPGAN_OUTPUTS", str(tmp_path / "outputs"))
    assert main(["--only", "nothing like this", "--no-startup"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ampgan: error: --only nothing like this: names no section") and err.count("\n") == 1


def test_the_step_cell_section_runs_after_an_earlier_section_started_mindspores_runtime():
    """The bench measures its sections in one process: `Model.train`'s runners are built after
    other sections have run kernels, so they must not select the device again (MindSpore refuses
    `set_device` once its runtime is up). Both runners train a block and change the net."""
    import mindspore as ms
    import numpy as np

    from experiments.bench import ModelTrainRunner

    ms.Tensor(np.ones(2, np.float32)) + 1   # a kernel: the runtime is up (no set_device: an earlier test may have started it)
    for ampgan_cell in (True, False):
        for graph in (False, True):
            runner = ModelTrainRunner(ampgan_cell, "CPU", graph=graph)
            before = [p.asnumpy().copy() for p in runner.model.train_network.trainable_params()]
            runner.run(3)
            after = [p.asnumpy() for p in runner.model.train_network.trainable_params()]
            assert any(not np.array_equal(a, b) for a, b in zip(before, after)), (ampgan_cell, graph)
            assert ms.get_context("mode") == ms.PYNATIVE_MODE   # a GRAPH_MODE block leaves the next section's mode as it was
