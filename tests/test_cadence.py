"""The loop's one schedule (`ampgan.training.loop.Cadence`): at which steps it measures, logs,
prints, writes per-layer health, checkpoints and evaluates. Pure: no task, no step."""

from __future__ import annotations

from types import SimpleNamespace

from ampgan.training.loop import Cadence

CFG = SimpleNamespace(max_steps=12, log_every=5, layer_health_every=4, checkpoint_every=6, eval_every=3)


def steps_where(cadence: Cadence, what: str, steps=range(1, 13), print_every: int = 0) -> list[int]:
    return [s for s in steps
            if getattr(cadence.at(s, print_due=bool(print_every) and s % print_every == 0), what)]


def test_a_new_run_measures_its_second_step_its_log_and_layer_steps_and_its_last():
    new = Cadence(CFG)
    assert steps_where(new, "first") == [1]
    assert steps_where(new, "measure") == [2, 4, 5, 8, 10, 12]     # step 1 runs plain: the compile waits
    assert steps_where(new, "log") == [1, 2, 5, 10]
    assert steps_where(new, "layers") == [2, 4, 8, 12]
    assert steps_where(new, "save") == [6]                          # the last step's checkpoint is finish()'s
    assert steps_where(new, "evaluate") == [3, 6, 9]                # so is the last evaluation
    assert steps_where(new, "fetch") == [1, 2, 4, 5, 6, 8, 10, 12]
    assert steps_where(new, "status_line", print_every=3) == [1, 3, 6, 9, 12]
    assert steps_where(new, "fetch", print_every=3) == [1, 2, 3, 4, 5, 6, 8, 9, 10, 12]


def test_a_resumed_loop_opens_at_its_own_first_step_and_a_later_block_opens_nothing():
    resumed = Cadence(CFG, first_step=7)
    assert steps_where(resumed, "first", range(7, 13)) == [7]
    assert steps_where(resumed, "measure", range(7, 13)) == [8, 10, 12]   # no "training's start" again
    assert steps_where(resumed, "log", range(7, 13)) == [7, 10]
    block = Cadence(CFG, first_step=7, opens=False)                      # the bench's second block
    assert steps_where(block, "first", range(7, 13)) == [] and steps_where(block, "log", range(7, 13)) == [10]


def test_switched_off_cadences_never_fire():
    off = Cadence(SimpleNamespace(max_steps=12, log_every=5, layer_health_every=0, checkpoint_every=0, eval_every=0))
    assert steps_where(off, "layers") == steps_where(off, "save") == steps_where(off, "evaluate") == []
    assert steps_where(off, "measure") == [2, 5, 10, 12]
