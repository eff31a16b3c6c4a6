"""The bench's statistics: the bootstrap interval of the median ratio and the verdict against a target.

Nothing here builds or runs a net.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from ampgan.steps.common import Step
from experiments.bench import HOST_CYCLE, HOST_ROUNDS, AmpganRunner, Comparison, StepClock
from experiments.bench_stats import bootstrap_ci, host_row, ratio_row, verdict


def test_identical_ratios_give_a_zero_width_interval_at_their_value():
    assert bootstrap_ci([1.013] * 20) == pytest.approx((1.013, 1.013))


def test_the_interval_holds_the_median_and_lies_within_the_sample():
    ratios = np.random.default_rng(3).normal(1.0, 0.03, size=25)
    low, high = bootstrap_ci(ratios)
    assert ratios.min() <= low <= np.median(ratios) <= high <= ratios.max()
    assert high - low > 0


def test_a_shifted_sample_shifts_its_interval():
    ratios = np.random.default_rng(4).normal(1.0, 0.02, size=20)
    low, high = bootstrap_ci(ratios)
    shifted = bootstrap_ci(ratios + 0.05)
    assert shifted == pytest.approx((low + 0.05, high + 0.05))


def test_more_rounds_narrow_the_interval():
    rng = np.random.default_rng(5)
    few, many = bootstrap_ci(rng.normal(1.0, 0.03, size=6)), bootstrap_ci(rng.normal(1.0, 0.03, size=60))
    assert many[1] - many[0] < few[1] - few[0]


def test_the_same_timings_give_the_same_interval_and_another_seed_may_not():
    ratios = list(np.random.default_rng(6).normal(1.0, 0.05, size=15))
    assert bootstrap_ci(ratios) == bootstrap_ci(list(ratios))
    assert bootstrap_ci(ratios, seed=1) != bootstrap_ci(ratios)


def test_no_ratio_is_an_error():
    with pytest.raises(ValueError):
        bootstrap_ci([])


@pytest.mark.parametrize("interval, expected", [
    ((0.99, 1.015), "met"),          # wholly below the target
    ((1.021, 1.05), "not met"),      # wholly above
    ((1.00, 1.04), "unresolved"),    # straddles it
    ((1.00, 1.02), "unresolved"),    # touching it is not below it
    ((1.02, 1.02), "unresolved"),
])
def test_verdict(interval, expected):
    assert verdict(interval, 1.02) == expected


def test_a_row_takes_ratios_round_by_round_and_judges_only_variants_with_a_target():
    base = [0.100, 0.200, 0.100]          # a slow round hits both variants
    variant = [0.101, 0.202, 0.101]
    row = ratio_row("c", "ampgan", variant, base, "bare", target=1.02)
    assert row["ratio"] == pytest.approx(1.01) and row["ratio_max"] == pytest.approx(1.01)
    assert (row["ci_low"], row["ci_high"]) == pytest.approx((1.01, 1.01))
    assert row["verdict"] == "met" and row["rounds"] == 3
    assert "verdict" not in ratio_row("c", "bare", base, base, "bare", target=1.02)
    assert "verdict" not in ratio_row("c", "other", variant, base, "bare")


def test_host_time_beyond_the_baseline_is_taken_round_by_round_in_microseconds():
    base = [300e-6, 900e-6, 310e-6]       # a slow round slows both loops' host work
    variant = [350e-6, 950e-6, 355e-6]
    row = host_row(variant, base, target_us=100)
    assert row["host_beyond_us"] == pytest.approx(50) and row["host_us"] == pytest.approx(355)
    assert row["host_ci_low_us"] >= 45 - 1e-9 and row["host_ci_high_us"] <= 50 + 1e-9
    assert row["host_verdict"] == "met"
    assert host_row([500e-6] * 3, [300e-6] * 3, target_us=100)["host_verdict"] == "not met"
    assert "host_verdict" not in host_row(base, base, None)


def test_the_step_clock_counts_time_inside_both_variants_even_one_built_later():
    """The bench wraps a built Step from outside: the measured variant, and the plain one when it is built."""
    calls = []

    def work(tag):
        def run(*inputs):
            calls.append(tag)
            return tag
        return run

    clock = StepClock()
    step = Step(fn=work("measured"), loss_names=("loss",), weights=(), build_plain=lambda: work("plain"))
    clock.wrap_step(step)
    assert step.launch(measure=True) == "measured" and step.launch(measure=False) == "plain"
    assert calls == ["measured", "plain"] and clock.seconds > 0
    single = Step(fn=work("only"), loss_names=("loss",), weights=())
    clock.wrap_step(single)
    assert single.plain is single.fn and single.launch(measure=False) == "only"


def test_host_time_comes_from_synced_blocks_and_the_ratio_from_the_loops_as_they_run():
    """Against bare, each round times one unsynced block per variant (the ratio) and then one synced
    block each (StepClock.synced: a step's graph tail counted in the step), for the host time."""

    class Runner:
        def __init__(self, host_s: float, tail_s: float):
            self.clock, self.blocks, self.host_s, self.tail_s = StepClock(), [], host_s, tail_s

        def run(self, iterations: int) -> None:
            self.blocks.append((self.clock.synced, iterations))
            # unsynced, the step's tail lands in host time (a fetch waits for it); synced, in the step's
            step = self.clock.wrap(lambda: time.sleep(0.002 + (self.tail_s if self.clock.synced else 0.0)))
            for _ in range(iterations):
                step()
                time.sleep(self.host_s + (0.0 if self.clock.synced else self.tail_s))

        def close(self) -> None: ...

    made = {"bare": Runner(0.001, 0.0), "ampgan": Runner(0.001, 0.004)}
    c = Comparison("c", {k: (lambda r=r: r) for k, r in made.items()}, "bare", iterations=2)
    c.measure(repeats=3)
    # warm-up, then per round an unsynced block and a synced one of a whole log cadence
    assert made["ampgan"].blocks == [(False, 2)] + [(False, 2), (True, HOST_CYCLE)] * 3
    assert HOST_ROUNDS >= 3   # so 3 rounds each take a host block
    assert len(c.times["ampgan"]) == len(c.host["ampgan"]) == 3
    many = Comparison("c", {k: (lambda r=r: r) for k, r in made.items()}, "bare", iterations=1)
    many.measure(repeats=3 * HOST_ROUNDS)   # long comparisons: about HOST_ROUNDS host blocks, spread out
    assert len(many.times["ampgan"]) == 3 * HOST_ROUNDS and len(many.host["ampgan"]) == HOST_ROUNDS
    row = next(r for r in c.rows() if r["variant"] == "ampgan")
    assert row["host_beyond_us"] < 2500        # the 4 ms tail is the step's, not host time
    assert row["ratio"] > 1.0                  # the loops as they ran: ampgan's tail made it slower


def test_a_host_block_of_ampgans_loop_starts_its_step_numbers_after_a_whole_log_cadence():
    """So that it fetches once a cycle, at its end, as a run does (no extra fetch when run_steps returns)."""
    runner = AmpganRunner.__new__(AmpganRunner)   # align() moves step numbers only: nothing built
    for first, aligned in ((1, 1), (2, 11), (10, 11), (11, 11), (12, 21)):
        runner.step = first
        runner.align(10)
        assert runner.step == aligned


def test_start_up_beyond_the_floor_is_taken_pair_by_pair_for_cold_and_warm_runs():
    """Drift shared by a round's pair cancels: ampgan is always 0.3 s above the floor of its own round,
    though both move by seconds from round to round; the medians' difference would read otherwise."""
    from experiments.bench import STARTUP_PHASES, TARGET_BEYOND_FLOOR_S, startup_rows

    temps = ["cold", "warm", "cold", "warm", "cold", "warm"]
    floors = [6.0, 4.0, 9.0, 4.5, 7.0, 6.5]
    imports = [f + 0.3 - 3.0 for f in floors]   # with 1 + 1 + 1 s of build, store and first step: floor + 0.3
    phases = {STARTUP_PHASES[0]: imports, **{key: [1.0] * 6 for key in STARTUP_PHASES[1:]}}
    rows = {r["phase"]: r for r in startup_rows(phases, [10.0] * 6, floors, temps, dropped=True)}
    beyond = rows["ampgan beyond the floor"]
    for temp in ("cold", "warm"):
        assert beyond[temp] == pytest.approx(0.3)
        assert beyond[f"{temp}_ci"] == pytest.approx((0.3, 0.3))
        assert beyond[f"{temp}_runs"] == 3
    assert beyond["verdict"] == "met" and str(TARGET_BEYOND_FLOOR_S) in beyond["target"]
    first = rows["command to first finished step"]
    assert first["cold"] == pytest.approx(7.3) and first["warm"] == pytest.approx(4.8)
    assert first["verdict"] == "not met"   # every cold run above 5 s
    assert rows["bare MindSpore, command to first finished step (the floor)"]["warm_min"] == 4.0

    slower = startup_rows({**phases, STARTUP_PHASES[0]: [i + (1.0 if t == "cold" else 0.0) for i, t in zip(imports, temps)]},
                          [10.0] * 6, floors, temps, dropped=True)[-1]
    assert slower["cold"] == pytest.approx(1.3) and slower["warm"] == pytest.approx(0.3)
    assert slower["verdict"] == "not met"   # met warm, not cold: the target holds for both or it is not met


def test_start_up_without_a_dropped_page_cache_has_one_cold_pair_and_says_so():
    from experiments.bench import STARTUP_PHASES, _startup_lines, startup_rows

    temps = ["cold", "warm", "warm"]
    phases = {key: [1.0, 1.0, 1.0] for key in STARTUP_PHASES}
    rows = startup_rows(phases, [9.0, 8.0, 8.0], [3.0, 3.5, 3.7], temps, dropped=False)
    assert rows[-1]["cold_runs"] == 1 and rows[-1]["warm_runs"] == 2
    text = "\n".join(_startup_lines(rows))
    assert "cold (the bench's first runs)" in text and "1 cold and 2 warm paired runs" in text
    assert "| ampgan beyond the floor | 1.00 [1.00-1.00], 95% interval 1.00-1.00 | 0.40 [0.30-0.50]" in text


def test_a_start_up_round_count_below_one_is_refused_in_one_line(capsys):
    from experiments.bench import main

    assert main(["--startup-rounds", "0"]) == 2
    assert capsys.readouterr().err.strip() == "ampgan: error: --startup-rounds 0: give 1 or more"


@pytest.mark.parametrize("argv,said", [
    (["--no-startup", "--startup-rounds", "8"], "--startup-rounds 8 with --no-startup: the start-up part is skipped"),
    (["--only", "calibration", "--memory-steps", "300"], "--memory-steps 300 with --only calibration: the memory part is skipped"),
])
def test_an_option_for_a_skipped_part_is_refused_in_one_line(capsys, argv, said):
    from experiments.bench import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"ampgan: error: {said}"), err


@pytest.mark.slow  # `make test-full` (CI's 30 minutes on a slow machine)
def test_a_bench_part_reports_and_leaves_no_scratch_behind(tmp_path, monkeypatch):
    """`--only calibration --quick`: one comparison end to end (two of ampgan's loops, an MLflow store,
    run folders, MindSpore's files), its report in outputs/bench, nothing left in the temp folder."""
    from experiments.bench import main

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    monkeypatch.setenv("AMPGAN_OUTPUTS", str(tmp_path / "outputs"))
    monkeypatch.chdir(tmp_path)
    assert main(["--only", "calibration", "--quick", "--no-startup", "--memory-steps", "0"]) == 0
    report = (tmp_path / "outputs" / "bench" / "bench.md").read_text()
    assert "calibration: one loop against its twin" in report and "Not measured yet" not in report
    table = json.loads((tmp_path / "outputs" / "bench" / "bench.json").read_text())
    assert table["meta"]["pending"] == [] and len(table["comparisons"]) == 2
    assert all(r["commit"] and r["date"] and r["machine"]["cores"] for r in table["comparisons"])
    ledger = json.loads((tmp_path / "outputs" / "bench" / "sections.json").read_text())
    assert ledger["complete"] and list(ledger["sections"]) == [table["comparisons"][0]["comparison"]]
    assert list(scratch.iterdir()) == []
    assert Path.cwd() == tmp_path   # the bench worked in its scratch folder and came back
