"""The case studies (experiments/<study>.py): their statistics, and each one's shortest form end to end."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest

from ampgan.reporting.sweep_report import markdown
from experiments.study import Bar, Context, Study, arm_of, beyond_noise, conclude, same_value, seed_table, welch_p
from tests.conftest import ROOT, all_runs

STUDIES = ("wgan_amp", "collapse", "underflow", "classifier_nan", "clip_threshold", "lr_sensitivity")


def _rows(values: dict[tuple[str, str], list[float]]) -> list[dict]:
    return [{"data": d, "arm": a, "trainer.seed": str(i), "swd": v, "status": "FINISHED", "outcome": "completed"}
            for (d, a), vs in values.items() for i, v in enumerate(vs)]


STUDY = Study(name="t", title="t", question="q", groups=["data", "arm"], metrics=["swd"], reference={"arm": "fp32"},
              facet="data")


def test_seed_table_compares_each_configuration_with_the_reference_of_its_own_facet():
    rows = _rows({("a", "fp32"): [1.0, 1.1, 0.9], ("a", "o2"): [3.0, 3.1, 2.9], ("a", "o3"): [1.05, 0.95, 1.0],
                  ("b", "fp32"): [3.0, 3.1, 2.9], ("b", "o2"): [3.05, 2.95, 3.0]})
    table = {(r["data"], r["arm"]): r for r in seed_table(STUDY, rows)}
    assert table[("a", "o2")]["beyond noise"] == "yes" and float(table[("a", "o2")]["swd - ref"]) == pytest.approx(2.0)
    assert table[("a", "o3")]["beyond noise"] == "no"
    # b/o2 is compared with b/fp32 (3.0), not with a/fp32 (1.0)
    assert table[("b", "o2")]["beyond noise"] == "no" and float(table[("b", "o2")]["swd - ref"]) == pytest.approx(0.0)
    assert "beyond noise" not in table[("a", "fp32")] and "beyond noise" not in table[("b", "fp32")]
    assert table[("a", "o2")]["seeds"] == 3 and table[("a", "o2")]["_swd"]["min"] == 2.9
    ctx = Context(STUDY, None, "", None, [], rows, list(table.values()), ROOT, "default")
    worse, better = beyond_noise(ctx, lower_is_better=True)
    assert [w.split(" ")[0] for w in worse] == ["a/o2"] and better == []


def test_diverged_seeds_are_counted_and_left_out_of_the_spread():
    rows = _rows({("a", "fp32"): [1.0, 1.1, 0.9], ("a", "o2"): [1.0, math.nan, 1.1]})
    rows[4]["outcome"] = "diverged"
    o2 = next(r for r in seed_table(STUDY, rows) if r["arm"] == "o2")
    assert o2["diverged"] == 1 and o2["_swd"]["n"] == 2 and o2["_swd"]["mean"] == pytest.approx(1.05)


def test_welch_and_value_matching():
    assert welch_p([1.0, 1.0], [1.0, 1.0]) == 1.0
    assert welch_p([1.0], [2.0, 3.0]) is None
    assert welch_p([1.0, 1.1, 0.9], [5.0, 5.1, 4.9]) < 0.01
    assert same_value("100", "100.0") and not same_value("o2", "o3")

    class Run:
        class data:  # noqa: N801 - a stand-in for an MLflow run's data
            tags = {"overrides": "+arm/wgan_amp=o2_dynamic,trainer.seed=1,+experiment=study_wgan_amp"}

    assert arm_of(Run, "wgan_amp") == "o2_dynamic" and arm_of(Run, "nothing") == "-"


# two studies in `make test` (a GAN one and the underflow one); every study in `make test-full`
FAST_STUDIES = ()   # every quick form in `make test-full` (CI's time); the rule, bars and answers are tested above


@pytest.mark.parametrize("name", [n if n in FAST_STUDIES else pytest.param(n, marks=pytest.mark.slow) for n in STUDIES])
def test_each_study_runs_its_shortest_form_and_publishes_to_its_sweep(name, outputs):
    env = {**os.environ, "AMPGAN_OUTPUTS": str(outputs), "GLOG_v": "3"}
    proc = subprocess.run([sys.executable, "-m", f"experiments.{name}", "--quick"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    folder = outputs / "studies" / f"{name}-quick"
    table = (folder / "table.md").read_text()
    for f in ("table.csv", "runs.csv", "seed_spread.png", "report.html", "answer.md"):
        assert (folder / f).stat().st_size > 0, f
    assert "answer:" in proc.stdout and "±" in table
    client, runs = all_runs(outputs)
    assert runs and all(r.info.status == "FINISHED" for r in runs), [(r.info.run_name, r.info.status) for r in runs]
    parent = next(r for r in runs if r.data.tags.get("ampgan.study") == name)
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(children) == 4   # two configurations x two seeds
    assert len(table.strip().splitlines()) == 2 + 2   # header, rule, one row per configuration
    published = {a.path for a in client.list_artifacts(parent.info.run_id, "study")}
    assert {"study/table.md", "study/report.html", "study/seed_spread.png"} <= published
    assert parent.data.tags["ampgan.study_answer"] == (folder / "answer.md").read_text().splitlines()[0]
    verdicts = {r.data.tags["ampgan.diagnosed_run"]: r.data.tags["ampgan.verdict"]
                for r in runs if r.data.tags.get("ampgan.kind") == "diagnose"}
    names = {r.info.run_id: r.info.run_name for r in children}
    by_arm = {names[run_id].rsplit("-", 1)[0]: v for run_id, v in verdicts.items()}
    expected = {"collapse": {"o2-dynamic-pynative_o2": "framework"},
                "underflow": {"o2-none-o2_none": "underflow"},
                "classifier_nan": {"o2-none-o2": "healthy"}}.get(name, {})
    assert by_arm == expected


def test_a_small_shift_shared_by_every_seed_exceeds_seed_noise_when_paired():
    """Seeds spread the metric far more than the configuration shifts it; pairing by seed sees the shift."""
    base = [1.0, 2.0, 3.0, 4.0]
    rows = _rows({("a", "fp32"): base, ("a", "o2"): [b + 0.01 + 0.001 * i for i, b in enumerate(base)]})
    o2 = next(r for r in seed_table(STUDY, rows) if r["arm"] == "o2")
    assert o2["beyond noise"] == "yes" and o2["p"].endswith("(paired)")
    assert welch_p([b + 0.01 for b in base], base) > 0.5   # unpaired, the shift drowns in the seeds' spread


def test_the_paired_interval_of_the_difference_holds_the_mean_and_excludes_zero_only_for_a_shift():
    base = [1.0, 2.0, 3.0, 4.0]
    rows = _rows({("a", "fp32"): base, ("a", "o2"): [b + 0.5 + 0.01 * (-1) ** i for i, b in enumerate(base)],
                  ("a", "o3"): [b + 0.01 * (-1) ** i for i, b in enumerate(base)]})
    table = {r["arm"]: r for r in seed_table(STUDY, rows)}

    def interval(arm):
        lo, hi = (float(x) for x in table[arm]["95% interval (paired)"].strip("[]").split(","))
        return lo, hi

    lo, hi = interval("o2")
    assert 0 < lo < 0.5 < hi and table["o2"]["beyond noise"] == "yes"
    lo, hi = interval("o3")
    assert lo < 0 < hi and table["o3"]["beyond noise"] == "no"
    # wider with fewer seeds: three pairs instead of four
    narrow = interval("o2")
    three = seed_table(STUDY, [r for r in rows if r["trainer.seed"] != "3"])
    wide = next(r for r in three if r["arm"] == "o2")["95% interval (paired)"].strip("[]").split(",")
    assert float(wide[1]) - float(wide[0]) > narrow[1] - narrow[0]


def test_each_facet_is_judged_on_its_own_headline_metric():
    study = Study(name="t", title="t", question="q", groups=["data", "arm"], metrics=["swd", "fd"],
                  reference={"arm": "fp32"}, facet="data", headline={"img": "fd"})
    rows = _rows({("pts", "fp32"): [1.0, 1.1, 0.9], ("pts", "o2"): [1.0, 1.1, 0.9],
                  ("img", "fp32"): [5.0, 5.0, 5.0], ("img", "o2"): [5.0, 5.0, 5.0]})
    for r in rows:   # on images, swd does not move but fd does: o2's fd is worse on every seed
        r["fd"] = {"fp32": 1.0, "o2": 3.0}[r["arm"]] + 0.01 * int(r["trainer.seed"]) if r["data"] == "img" else None
    table = {(r["data"], r["arm"]): r for r in seed_table(study, rows)}
    assert table[("img", "o2")]["fd - ref"] == "2" and table[("img", "o2")]["beyond noise"] == "yes"
    assert table[("pts", "o2")]["swd - ref"] == "0" and table[("pts", "o2")]["beyond noise"] == "no"
    ctx = Context(study, None, "", None, [None] * len(rows), rows, list(table.values()), ROOT, "default")
    worse, _ = beyond_noise(ctx, lower_is_better=True)
    assert worse == [f"img/o2 (fd +2, p {table[('img', 'o2')]['p']})"]
    assert study.head({"data": "img"}) == "fd" and study.head({"data": "pts"}) == "swd"
    # in the rendered table both differences sit before the interval, p and verdict that follow them
    header = markdown(list(table.values())).splitlines()[0].strip("| ").split(" | ")
    assert header.index("swd - ref") + 1 == header.index("fd - ref") == header.index("95% interval (paired)") - 1
    assert table[("pts", "o2")]["fd - ref"] == "-" and table[("img", "o2")]["swd - ref"] == "-"


def test_a_bar_over_the_last_evaluations_judges_their_worst():
    bar = Bar("modes_covered", 7, last=3)
    assert bar.worst_recent([0, 8, 8, 2, 8, 8]) == 2 and bar.worst_recent([0, 2, 7, 8, 7]) == 7
    assert bar.worst_recent([8, 8]) is None and not bar.passes(bar.worst_recent([8, 8]))
    assert Bar("swd", 0.1, higher_is_better=False, last=2).worst_recent([0.05, 0.3, 0.08]) == 0.3
    assert bar.column == "modes_covered (worst of last 3)" and Bar("swd", 1).column == "swd"
    assert "at each of the last 3 evaluations" in bar.describe()
    study = Study(name="t", title="t", question="q", groups=["data", "arm"], metrics=["swd"], reference={"arm": "fp32"},
                  facet="data", bars=[bar])
    rows = _rows({("a", "fp32"): [1.0, 1.0], ("a", "o2"): [1.0, 1.0]})
    for r, worst, final in zip(rows, [7, 2, 8, 8], [8, 8, 8, 8]):
        r[bar.column], r["modes_covered"] = worst, final   # the final evaluation passes on every seed
    ctx = Context(study, None, "", None, [None] * len(rows), rows, seed_table(study, rows), ROOT, "default")
    text = conclude(ctx, _answer)
    assert text.startswith("Reference not trained") and "on 1 of 2 seeds (modes_covered (worst of last 3): 7, 2)" in text


# ---------------------------------------------------------------- no conclusion from a reference that has not trained
def _answer(ctx: Context) -> str:
    """A stand-in answer that names the facets it was given."""
    return "compared on " + ",".join(dict.fromkeys(r["data"] for r in ctx.rows)) + "."


def _ctx(study: Study, modes: dict[tuple[str, str], list[float]]) -> Context:
    rows = _rows({k: [1.0] * len(v) for k, v in modes.items()})
    for r, m in zip(rows, [m for v in modes.values() for m in v]):
        r["modes_covered"] = m
    return Context(study, None, "", None, [None] * len(rows), rows, seed_table(study, rows), ROOT, "default")


BARRED = Study(name="t", title="t", question="q", groups=["data", "arm"], metrics=["swd"], reference={"arm": "fp32"},
               facet="data", bars=[Bar("modes_covered", 6, facet="a"), Bar("modes_covered", 6, facet="b")])


def test_a_facet_whose_reference_misses_its_bar_on_one_seed_draws_no_conclusion():
    ctx = _ctx(BARRED, {("a", "fp32"): [8, 7, 8], ("a", "o2"): [8, 8, 8], ("b", "fp32"): [8, 0, 8], ("b", "o2"): [8, 8, 8]})
    text = conclude(ctx, _answer)
    assert text.startswith("compared on a.") and "No conclusion on b: reference not trained" in text
    assert "misses its bar modes_covered >= 6 on 1 of 3 seeds" in text
    assert any(n.startswith("reference not trained") for n in ctx.notes)


def test_no_trained_reference_anywhere_is_no_conclusion_and_the_answer_is_not_drawn():
    ctx = _ctx(BARRED, {("a", "fp32"): [0, 0], ("a", "o2"): [0, 0], ("b", "fp32"): [1, 2], ("b", "o2"): [0, 0]})
    drawn = []
    text = conclude(ctx, lambda c: drawn.append(c) or "drawn")
    assert text.startswith("Reference not trained") and text.endswith("No conclusion.") and not drawn


def test_a_facet_without_any_reference_run_says_so_instead_of_counting_zero_seeds():
    """Arms run on their own (`+arm/wgan_amp=o2_static`): no reference run, nothing compared, and
    the line says that, not "misses its bar on 0 of 0 seeds"."""
    ctx = _ctx(BARRED, {("a", "o2"): [8, 8], ("b", "fp32"): [8, 8], ("b", "o2"): [8, 8]})
    text = conclude(ctx, _answer)
    assert text.startswith("compared on b.") and "no run of the reference (arm=fp32) on a: nothing to compare with" in text
    assert "0 of 0" not in text


def test_a_facet_without_a_stated_bar_draws_no_conclusion_and_trained_references_change_nothing():
    one_bar = Study(name="t", title="t", question="q", groups=["data", "arm"], metrics=["swd"],
                    reference={"arm": "fp32"}, facet="data", bars=[Bar("modes_covered", 6, facet="a")])
    ctx = _ctx(one_bar, {("a", "fp32"): [8, 8], ("a", "o2"): [8, 8], ("b", "fp32"): [8, 8], ("b", "o2"): [8, 8]})
    assert "No conclusion on b" in conclude(ctx, _answer) and "no quality bar" in conclude(ctx, _answer)
    ctx = _ctx(BARRED, {("a", "fp32"): [8, 8], ("a", "o2"): [0, 0], ("b", "fp32"): [6, 7], ("b", "o2"): [8, 8]})
    assert conclude(ctx, _answer) == "compared on a,b."


# ---------------------------------------------------------------- lr_sensitivity: its grid, its scores, its bar and answer
def test_lr_sensitivity_sweeps_six_rates_over_two_orders_fp32_and_o2_with_and_without_qk_norm():
    from omegaconf import OmegaConf

    from ampgan.config.schema import validate
    from tests.conftest import compose_cfg

    params = OmegaConf.load(ROOT / "conf/experiment/study_lr_sensitivity.yaml").hydra.sweeper.params
    lrs = [float(v) for v in str(params["model.lr"]).split(",")]
    assert len(lrs) >= 6 and max(lrs) / min(lrs) >= 100 and len(str(params["trainer.seed"]).split(",")) >= 2
    arms = {}
    for arm in str(params["+arm/lm_arm"]).split(","):
        s = validate(compose_cfg("model=lm", f"+arm/lm_arm={arm}"))
        arms[arm] = (s.amp.level, s.scaler.name, bool(s.model.net.get("qk_norm", False)),
                     float(s.model.loss.get("z_loss", 0.0)))
    assert arms == {"fp32": ("O0", "none", False, 0.0), "fp32_qknorm": ("O0", "none", True, 0.0),
                    "o2": ("O2", "dynamic", False, 0.0), "o2_qknorm": ("O2", "dynamic", True, 0.0),
                    "o2_qknorm_zloss": ("O2", "dynamic", True, 1e-4)}


def _lm_rows(losses: dict[tuple[str, float], list[float]]) -> list[dict]:
    from experiments import lr_sensitivity as lrs

    rows = [{"lm_arm": arm, "model.lr": str(lr), "trainer.seed": str(i), "loss": v, "status": "FINISHED",
             "outcome": "completed", "run": f"{arm}-{lr}-{i}", "run_id": f"id-{arm}-{lr}-{i}",
             "max attn logit": 10.0 * lr, "attn logit inf": False}
            for (arm, lr), vs in losses.items() for i, v in enumerate(vs)]
    for r in rows:
        lrs.score(r, cap=4.5, unigram=3.2)
    return rows


def test_lr_sensitivity_caps_the_loss_finds_each_arms_threshold_above_its_best_rate_and_its_sensitivity():
    from experiments import lr_sensitivity as lrs

    nan = math.nan
    rows = _lm_rows({("fp32", 1e-3): [3.3, 3.25], ("fp32", 1e-2): [2.5, 2.6], ("fp32", 1e-1): [3.5, 2.9],
                     ("o2", 1e-3): [3.3, 3.25], ("o2", 1e-2): [2.5, 2.6], ("o2", 1e-1): [nan, 9.0]})
    assert [r["final loss"] for r in rows[-2:]] == [4.5, 4.5]          # non-finite and above ln(vocab): the cap
    assert rows[0]["fails"] and not rows[2]["fails"]                   # 3.3 nats >= the letters' entropy
    arms = lrs.by_arm(rows)
    # 1e-3 fails too (not trained yet), but below the best rate: the threshold is the first failure above it
    assert lrs.threshold(arms["fp32"]) == 0.1 and lrs.threshold(arms["o2"]) == 0.1
    assert lrs.sensitivity(arms["o2"]) == pytest.approx(((3.275 - 2.55) + 0 + (4.5 - 2.55)) / 3)
    assert lrs.logit_peak({"a": [1.0, 5.0, math.nan], "b": [7.0]}) == (math.inf, True)
    assert lrs.logit_peak({"a": [1.0, 5.0], "b": [7.0]}) == (7.0, False)
    assert lrs.logit_peak({"a": [2.0]}) == (2.0, False) and math.isnan(lrs.logit_peak({})[0])


def test_lr_sensitivity_draws_no_conclusion_from_an_untrained_reference_and_names_diagnoses_verdicts():
    from experiments import lr_sensitivity as lrs

    untrained = _lm_rows({("fp32", 3e-3): [3.1, 2.8], ("o2", 3e-3): [2.8, 2.8]})
    ctx = Context(lrs.STUDY, None, "", None, [None] * 4, untrained, seed_table(lrs.STUDY, untrained), ROOT, "quick")
    text = conclude(ctx, lrs.answer)
    assert text.startswith("Reference not trained") and "final loss <= 3 on 1 of 2 seeds" in text

    rows = _lm_rows({("fp32", 3e-3): [2.7, 2.8], ("fp32", 1e-1): [4.0, 3.9], ("o2", 3e-3): [2.7, 2.8],
                     ("o2", 1e-1): [math.nan, 4.0], ("o2_qknorm", 3e-3): [2.6, 2.7], ("o2_qknorm", 1e-1): [2.9, 3.0]})
    ctx = Context(lrs.STUDY, None, "", None, [None] * len(rows), rows, seed_table(lrs.STUDY, rows), ROOT, "default")
    ctx.diagnoses[("o2", 0.1)] = {"verdict": "not_amp", "arm": "o2", "lr": 0.1}
    text = conclude(ctx, lrs.answer)
    assert "o2 fails from 0.1, fp32 from 0.1 (same)" in text and "o2_qknorm fails from none up to 0.1" in text
    assert "o2 at lr 0.1: not_amp (fp32 fails there too, finite)" in text
    assert "Non-finite from: fp32 never, o2 0.1, o2_qknorm never" in text


def test_the_wgan_study_judges_its_reference_on_its_last_evaluations_and_its_full_form_adds_arms():
    """The default form compares only where its reference can be judged: 7 of 8 modes at each of the
    last 3 evaluations on every seed; --full runs the default's configurations and more."""
    from omegaconf import OmegaConf

    from experiments import wgan_amp

    params = OmegaConf.load(ROOT / "conf/experiment/study_wgan_amp.yaml").hydra.sweeper.params
    default = str(params["+arm/wgan_data"]).split(",")
    quick = next(o for o in wgan_amp.STUDY.quick if o.startswith("+arm/wgan_data=")).split("=", 1)[1].split(",")
    arms = str(params["+arm/wgan_amp"]).split(",")
    full = next(o for o in wgan_amp.STUDY.full if o.startswith("+arm/wgan_amp=")).split("=", 1)[1].split(",")
    assert default == ["gaussians8_long", "digits_long"] and quick == ["gaussians8_long"]   # both data sets, each with its bar
    assert {b.facet for b in wgan_amp.STUDY.bars} == set(default)
    assert len(str(params["trainer.seed"]).split(",")) == 5 and set(arms) < set(full) and "fp32" in arms
    (bar,) = [b for b in wgan_amp.STUDY.bars if b.facet == "gaussians8_long"]
    assert (bar.metric, bar.threshold, bar.last) == ("modes_covered", 7, 3)
    ctx = _ctx(wgan_amp.STUDY, {("gaussians8_long", "fp32"): [8, 5, 8], ("gaussians8_long", "o2_dynamic"): [8, 8, 8]})
    for r in ctx.rows:
        r["wgan_data"], r["wgan_amp"] = r.pop("data"), r.pop("arm")
        r[bar.column] = r["modes_covered"]
    ctx.table = seed_table(wgan_amp.STUDY, ctx.rows)
    assert conclude(ctx, wgan_amp.answer).startswith("Reference not trained")
    for r in ctx.rows:
        r[bar.column] = 8
    assert conclude(ctx, wgan_amp.answer).startswith("The AMP configuration does not differ from FP32 in swd")


# ---------------------------------------------------------------- wgan_amp: one line per arm, quality against the step
def test_wgan_amp_says_one_line_per_configuration_with_its_paired_interval():
    from experiments.wgan_amp import STUDY as WGAN, arm_line

    rows = [{"wgan_data": "g", "wgan_amp": arm, "trainer.seed": str(i), "swd": v, "status": "FINISHED",
             "outcome": "completed", "critic skipped": 0.0, "critic final scale": 1.0, "critic underflow (mean)": 0.0}
            for arm, vs in {"fp32": [0.05, 0.06, 0.07], "o2_dynamic": [0.15, 0.16, 0.18],
                            "o2_underflow_aware_1": [0.051, 0.059, 0.071]}.items() for i, v in enumerate(vs)]
    table = {r["wgan_amp"]: r for r in seed_table(WGAN, rows)}
    worse = arm_line(table["o2_dynamic"])
    assert worse.startswith("o2_dynamic on g: differs from FP32 beyond seed noise (swd 0.103 against FP32, 95% interval [")
    assert arm_line(table["o2_underflow_aware_1"]).startswith("o2_underflow_aware_1 on g: within seed noise of FP32")
    table["o2_dynamic"]["diagnose"] = "scaler (scaler=underflow_aware)"
    assert arm_line(table["o2_dynamic"]).endswith("; diagnose: scaler (scaler=underflow_aware).")


def test_quality_against_the_step_draws_each_configuration_from_its_seeds_histories(tmp_path):
    from mlflow.tracking import MlflowClient

    from experiments.study import chart_history

    client = MlflowClient(f"sqlite:///{tmp_path / 'm.db'}")
    exp = client.create_experiment("t")
    rows, runs = [], []
    for arm in ("fp32", "o2"):
        for seed in range(2):
            run_ = client.create_run(exp)
            for step in (100, 200, 300):
                client.log_metric(run_.info.run_id, "eval/swd", step / 1000 + seed * 0.01, step=step)
            runs.append(client.get_run(run_.info.run_id))
            rows.append({"data": "a", "arm": arm, "trainer.seed": str(seed)})
    ctx = Context(STUDY, client, "", None, runs, rows, seed_table(STUDY, rows), tmp_path, "default")
    fig = chart_history(ctx, "eval/swd", "t")
    assert chart_history(ctx, "eval/nothing", "t") is None   # no panel without the metric
    ax = fig.axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert set(lines) == {"fp32", "o2"}   # one panel per data set: its lines are the configurations
    assert list(lines["fp32"].get_xdata()) == [100, 200, 300]
    assert list(lines["fp32"].get_ydata()) == pytest.approx([0.105, 0.205, 0.305])   # the two seeds' mean
    assert len(ax.collections) == 2   # one min-max band per configuration


def test_publishing_one_study_keeps_the_sections_of_the_others(tmp_path):
    from experiments.study import END, START, update_readme

    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{START}\n### WGAN-GP under AMP\nold wgan\n\n### Underflow for real\nold underflow text\n"
                      f"more of it\n{END}\nafter\n")
    fresh = tmp_path / "outputs" / "studies" / "wgan_amp"
    fresh.mkdir(parents=True)
    (fresh / "section.md").write_text("### WGAN-GP under AMP\nnew wgan\n")
    (fresh / "chart.png").write_bytes(b"png")
    assert update_readme(readme, tmp_path / "docs", tmp_path / "outputs") == ["wgan_amp"]
    text = readme.read_text()
    assert "new wgan" in text and "old wgan" not in text
    assert "### Underflow for real\nold underflow text\nmore of it" in text      # kept as it was
    assert text.startswith("intro\n") and text.endswith(f"{END}\nafter\n")
    assert (tmp_path / "docs" / "wgan_amp" / "chart.png").read_bytes() == b"png"


def test_the_wgan_studys_default_form_runs_each_data_set_with_its_own_arms_and_a_users_choice_wins(tmp_path):
    """`make study NAME=wgan_amp` in an hour: two sweeps, one per data set, each with the arms its
    question needs (`STUDY.parts`); --quick and --full run one sweep; a user's own data set or
    arms (a key a part sets) run the preset's sweep with them, not the parts on top of them."""
    import json

    from experiments.study import override_key, sweep_command, sweep_parts, sweep_records
    from experiments.wgan_amp import STUDY as WGAN

    assert [override_key(o) for o in ("+arm/wgan_amp=fp32,o2", "++a.b=1", "~c", "d=2")] == ["arm/wgan_amp", "a.b", "c", "d"]

    parts = sweep_parts(WGAN, "default", [])
    assert [p[0] for p in parts] == ["+arm/wgan_data=gaussians8_long", "+arm/wgan_data=digits_long"]
    assert "+arm/wgan_amp=fp32,o2_dynamic,o2_underflow_aware_1" in parts[1]   # the seed's fix on the conv nets
    runs = sum(len(p[1].split("=")[1].split(",")) for p in parts) * 5
    assert runs == 25
    assert sweep_parts(WGAN, "default", ["+arm/wgan_data=digits_long"]) == [[]]
    assert sweep_parts(WGAN, "default", ["trainer.max_steps=10"]) == parts   # not a part's key: parts kept
    assert sweep_parts(WGAN, "quick", []) == [[]] and sweep_parts(WGAN, "full", []) == [[]]
    cmd = sweep_command(WGAN, "default", tmp_path / "part-1", None, parts[0])
    assert cmd[cmd.index("+experiment=study_wgan_amp") + 1:][:2] == parts[0]
    # a finished sweep folder is read back whole: its own record, or each part's
    from ampgan import AmpganError

    with pytest.raises(AmpganError, match="no parent_run.json there"):
        sweep_records(tmp_path)
    for i in (10, 2, 1):   # in the parts' order, not the names' (part-10 after part-2)
        (tmp_path / f"{tmp_path.name}-part-{i}").mkdir()
        (tmp_path / f"{tmp_path.name}-part-{i}" / "parent_run.json").write_text(json.dumps({"run_id": f"r{i}", "uri": "u"}))
    assert [r["run_id"] for r in sweep_records(tmp_path)] == ["r1", "r2", "r10"]
    (tmp_path / "parent_run.json").write_text(json.dumps({"run_id": "one", "uri": "u"}))
    assert [r["run_id"] for r in sweep_records(tmp_path)] == ["one"]


def test_a_studys_section_names_the_users_own_overrides_and_reproduces_with_them():
    """A study run with the user's own arms says so in its lines and its section, and its Reproduce
    line runs those arms, not the preset's form."""
    from dataclasses import replace

    from experiments.study import form_label, section

    ctx = _ctx(BARRED, {("a", "fp32"): [8, 8], ("a", "o2"): [8, 8]})
    plain = section(ctx, [], [], "answer")
    assert "(default form, 4 runs" in plain and "`make study NAME=t`" in plain and "given" not in plain
    arms = ("+arm/wgan_data=gaussians8_long", "+arm/wgan_amp=o2_static,o3_dynamic")
    given = section(replace(ctx, mode="full", given=arms), [], [], "answer")
    assert f"(full form; given {' '.join(arms)}, 4 runs" in given
    assert f"`make study NAME=t ARGS='--full {' '.join(arms)}'` (or `python -m experiments.t --full {' '.join(arms)}`)" in given
    assert form_label("default", []) == "default form" and form_label("quick", ["a=1"]) == "quick form; given a=1"


@pytest.mark.parametrize("group", [False, pytest.param(True, marks=pytest.mark.slow)],
                         ids=["the runner alone", "the terminal's process group"])
def test_a_study_stopped_mid_sweep_ends_its_runs_and_says_so_in_one_line(outputs, group):
    """Ctrl-C in a terminal reaches the runner and its sweep; a kill of the runner alone (`kill -INT`,
    a scheduler) reaches the runner only. Either way the sweep's job and parent runs end KILLED
    (none left RUNNING), no later job starts, and the runner ends with one line and exit 130.
    (trainer.max_steps is given twice, the study's quick 4 then 100000: the parent run logs the last,
    as Hydra uses it; a second value for a logged param had ended the parent FAILED at its start.)"""
    import json
    import signal
    import time

    from ampgan.tracking.tracker import read_journal

    env = {**os.environ, "AMPGAN_OUTPUTS": str(outputs), "GLOG_v": "3"}
    proc = subprocess.Popen([sys.executable, "-m", "experiments.wgan_amp", "--quick", "trainer.max_steps=100000",
                             "trainer.log_every=1", "tracking.flush_every=1"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.time() + 240
    while not any(r.get("s", 0) >= 3 for f in (outputs / "studies").glob("*/sweep/*/*/tracking.json")
                  for r in read_journal(f.parent)[0]):
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        assert time.time() < deadline, "no job reached step 3"
        time.sleep(0.1)
    if group:
        os.killpg(proc.pid, signal.SIGINT)
    else:
        proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    lines = [ln for ln in err.splitlines() if ln.startswith("ampgan: ")]
    assert proc.returncode == 130, err[-3000:]
    assert lines[-1].startswith("ampgan: interrupted: the study stopped while the sweep in "), err[-3000:]
    assert "its runs ended in the store" in lines[-1] and "Traceback" not in err, err[-3000:]
    _, runs = all_runs(outputs)
    assert sorted(r.info.status for r in runs) == ["KILLED", "KILLED"], [(r.info.run_name, r.info.status) for r in runs]
    folder = next((outputs / "studies").glob("*/sweep/*"))
    assert json.loads((folder / "parent_run.json").read_text())["run_id"] in {r.info.run_id for r in runs}
