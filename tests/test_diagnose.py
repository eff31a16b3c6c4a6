"""`python -m ampgan.diagnose`: the replay's numbers against direct computation, the CLI, the MLflow run.

The planted corpus (one case per verdict) is in tests/test_diagnose_corpus.py.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from hydra import compose, initialize_config_dir

from ampgan.training import checkpoint
from ampgan.config.schema import CONF_DIR, validate
from ampgan.data import build_dataset
from ampgan.diagnose.case import checkpoint_start, recorded_config
from ampgan.diagnose.command import diagnose
from ampgan.diagnose.case import DiagnoseConfig, diagnose_settings
from ampgan.diagnose.analysis import analyse
from ampgan.diagnose.verdict_report import HEATMAPS
from ampgan.diagnose.ranges import MAX_EXP, NORMAL_EXP, fit_scales
from ampgan.diagnose.replay import (build_seeded, fp32_twin_settings, net_parameters, probes,
                                    record_reference, replay_amp)
from ampgan.diagnose.statistics import LAYER_COLUMNS, heat, layer_rows, net_rel_err
from ampgan.diagnose.verdict import decide
from ampgan.diagnose.probe import COMPARE_FIELDS, compare_gradients, make_loader
from tests.conftest import ROOT, all_runs

TINY = ["model=classifier", "data=gaussians8", "+model.net.width=8", "trainer.batch_size=16", "tracking=none",
        "amp=o2", "scaler=static", "scaler.init_scale=8"]


def compose_diag(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="diagnose_main", overrides=list(overrides))


def numpy_compare(ga: np.ndarray, gf: np.ndarray) -> dict[str, float]:
    ga, gf = ga.astype(np.float64).ravel(), gf.astype(np.float64).ravel()
    nf, na = np.linalg.norm(gf), np.linalg.norm(ga)
    flushed = (gf != 0) & (ga == 0)
    return {"rel_err": np.linalg.norm(ga - gf) / nf if nf else 0.0,
            "cosine": ga @ gf / (na * nf) if na * nf else 1.0,
            "flushed": flushed.mean(), "lost_norm": np.linalg.norm(gf[flushed]) / nf if nf else 0.0,
            "fp32_norm": nf}


def numpy_range(g: np.ndarray, u: float) -> tuple[int, int]:
    """Smallest k with < u of the nonzero |g| * 2^k below 2^-14; largest with max |g| * 2^k < 2^16."""
    a = np.abs(g[g != 0].astype(np.float64))
    e = np.floor(np.log2(a))
    k_lo = next(k for k in range(-64, 96) if (e + k < NORMAL_EXP).mean() < u)
    return k_lo, MAX_EXP - int(e.max())


def test_compare_statistics_match_numpy():
    rng = np.random.default_rng(0)
    gf = rng.standard_normal((16, 8)).astype(np.float32) * 1e-3
    ga = (gf + rng.standard_normal(gf.shape).astype(np.float32) * 1e-5).astype(np.float32)
    ga[0, :4] = 0.0                                   # flushed in AMP
    gf2 = np.zeros(5, np.float32)                     # both zero: error 0, cosine 1
    rows, hist = compare_gradients([ms.Tensor(ga), ms.Tensor(gf2)], [ms.Tensor(gf), ms.Tensor(gf2)])
    rows, hist = rows.asnumpy(), hist.asnumpy()
    want = numpy_compare(ga, gf)
    for i, name in enumerate(COMPARE_FIELDS):
        assert rows[0, i] == pytest.approx(want[name], rel=1e-4, abs=1e-7), name
    assert rows[1, COMPARE_FIELDS.index("rel_err")] == 0 and rows[1, COMPARE_FIELDS.index("cosine")] == 1
    assert hist[0].sum() == gf.size and hist[1].sum() == 0
    assert fit_scales(("a",), hist[:1], 0.01).layers[0].k_lo == numpy_range(gf, 0.01)[0]


def test_loader_is_seen_by_an_already_compiled_function():
    """MindSpore 2.10 may not see Parameter.set_data after a compiled call; the in-graph copy is seen."""
    p = ms.Parameter(ms.Tensor(np.zeros(3, np.float32)), name="p_loader_test")

    @ms.jit
    def read():
        return p * 1.0

    assert read().asnumpy().tolist() == [0, 0, 0]
    make_loader([p])([ms.Tensor(np.array([1, 2, 3], np.float32))])
    assert read().asnumpy().tolist() == [1, 2, 3]


def test_twin_starts_from_the_same_weights_and_batches():
    s = validate(compose_diag(*TINY))
    data = build_dataset(s.data)
    amp_task, fp32_task = build_seeded(s, data), build_seeded(fp32_twin_settings(s), data)
    for a, b in zip(net_parameters(amp_task), net_parameters(fp32_task)):
        assert a.name == b.name and np.array_equal(a.asnumpy(), b.asnumpy())
    (_, (xa, ya)), (_, (xb, yb)) = amp_task.step_inputs()[0], fp32_task.step_inputs()[0]
    assert np.array_equal(xa.asnumpy(), xb.asnumpy()) and np.array_equal(ya.asnumpy(), yb.asnumpy())


def test_replay_numbers_match_direct_computation():
    """Synced replay on a tiny O2 net: every number of the first step recomputed by hand in NumPy."""
    s = validate(compose_diag(*TINY))
    data = build_dataset(s.data)
    ref = record_reference(s, data, 3, lambda m: None)
    traces, _, _ = replay_amp(s, data, ref, ["synced"], lambda m: None)
    trace = traces["synced"].nets["train"]

    # direct: fresh tasks from the same seed, the reference's first inputs, gradients to NumPy
    amp_task, fp32_task = build_seeded(s, data), build_seeded(fp32_twin_settings(s), data)
    inputs = ref.steps[0].inputs
    st_a, g_a = probes(amp_task, True)["train"](*inputs)
    st_f, g_f = probes(fp32_task, True)["train"](*inputs)
    g_a, g_f = [g.asnumpy() for g in g_a], [g.asnumpy() for g in g_f]
    for p, (ga, gf) in enumerate(zip(g_a, g_f)):
        want = numpy_compare(ga, gf)
        for i, name in enumerate(COMPARE_FIELDS):
            assert trace.compare[0][p, i] == pytest.approx(want[name], rel=1e-4, abs=1e-7), (trace.param_names[p], name)
        scaled = np.abs(ga.astype(np.float64) * 8).ravel()
        assert trace.health[0][p, 1] == pytest.approx(((scaled > 0) & (scaled < 2.0**-14)).mean())
    assert trace.amp_losses[0]["loss"] == pytest.approx(st_a.losses["loss"], rel=1e-6)
    assert trace.fp32_losses[0]["loss"] == pytest.approx(st_f.losses["loss"], rel=1e-6)
    assert trace.scale[0] == 8.0 and trace.applied[0]

    # the whole-net error: all parameters as one vector
    va, vf = np.concatenate([g.ravel() for g in g_a]), np.concatenate([g.ravel() for g in g_f])
    assert net_rel_err(trace)[0] == pytest.approx(np.linalg.norm(va - vf) / np.linalg.norm(vf), rel=1e-4)

    # later steps: the synced AMP nets hold the twin's weights, so step 2 starts from them too
    w2 = ref.steps[1].weights
    make_loader(net_parameters(amp_task))(w2)
    _, g2 = probes(amp_task, True)["train"](*ref.steps[1].inputs)
    want = numpy_compare(g2[0].asnumpy(), ref.steps[1].grads[0].asnumpy())
    assert trace.compare[1][0, 0] == pytest.approx(want["rel_err"], rel=1e-3, abs=1e-7)

    # loss-scale ranges: from the FP32 gradients of all three steps
    fits = {"train": fit_scales(trace.param_names, trace.hist, 0.01)}
    for p, name in enumerate(trace.param_names):
        g = np.concatenate([r.grads[p].asnumpy().ravel() for r in ref.steps])
        if (g != 0).any():
            lr = fits["train"].layers[p]
            assert (lr.k_lo, lr.k_hi) == numpy_range(g, 0.01), name
    rows = layer_rows(traces["synced"], fits)
    rel = np.array([c[0, 0] for c in trace.compare])
    assert rows[0]["rel_err_median"] == pytest.approx(np.median(rel))
    verdict = decide(s, DiagnoseConfig(), ref, traces["synced"], fits)
    assert verdict.name == "healthy" and verdict.exit_code == 0


def run_diagnose(*args: str, outputs, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "AMPGAN_OUTPUTS": str(outputs), "GLOG_v": "3"}
    return subprocess.run([sys.executable, "-m", "ampgan.diagnose", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("bad", ["diagnose.steps=0", "diagnose.mode=sideways", "diagnose.nope=1", "amp=o9",
                                 "diagnose.seeds=1"])
def test_bad_input_is_one_line_exit_2(bad, outputs):
    proc = run_diagnose(bad, outputs=outputs)
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("ampgan: error: "), proc.stderr
    assert not (outputs / "mlflow.db").exists()


def test_cli_healthy_run_logged_and_linked(outputs, tmp_path, monkeypatch):
    """Train a tiny run with checkpoints, then diagnose it by run id: the replay starts from its
    newest full-state checkpoint (step 4), exit 0, a diagnose run linked to it, artifacts. Its
    learning rate lets it learn in 4 steps (accuracy 0.127 -> 0.25): at the default it does not,
    and a logged run that never learned is diagnosed from step 0 (the test below that)."""
    train = subprocess.run([sys.executable, "-m", "ampgan.train", *[a for a in TINY if a != "tracking=none"],
                            "trainer.max_steps=4", "trainer.checkpoint_every=2", "trainer.eval_samples=100",
                            "model.lr=0.02"],
                           cwd=ROOT, env={**os.environ, "AMPGAN_OUTPUTS": str(outputs), "GLOG_v": "3"},
                           capture_output=True, text=True, timeout=600)
    assert train.returncode == 0, train.stderr
    client, runs = all_runs(outputs)
    trained = runs[0].info.run_id
    proc = run_diagnose(f"diagnose.run={trained}", "diagnose.steps=3", outputs=outputs)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[0].startswith("verdict: healthy")
    assert "replayed: 3 iterations from checkpoint step 4 (" in proc.stdout
    assert "AMP synced: step 3/3" in proc.stderr                     # progress lines
    client, runs = all_runs(outputs)
    diag = [r for r in runs if r.data.tags.get("ampgan.kind") == "diagnose"]
    assert len(diag) == 1 and diag[0].info.status == "FINISHED"
    tags = diag[0].data.tags
    assert tags["ampgan.diagnosed_run"] == trained and tags["ampgan.verdict"] == "healthy"
    assert tags["ampgan.start_step"] == "4"
    assert tags["amp"] == "O2" and tags["scaler"] == "static"        # from the recorded config
    run_id = diag[0].info.run_id
    arts = {a.path for a in client.list_artifacts(run_id)}
    assert {"layers.csv", "heatmap.csv", "report.md", "report.html", "heatmap.png", "underflow_heatmap.png",
            "config.yaml"} <= arts
    assert diag[0].data.metrics["diagnose/exit_code"] == 0
    got = Path(client.download_artifacts(run_id, "", str(outputs / "downloaded")))
    layers = list(csv.DictReader((got / "layers.csv").open()))
    heat_rows = list(csv.reader((got / "heatmap.csv").open()))
    # the report page (the sweep report's html_page): the verdict, the per-layer table with a row per
    # parameter, both heat maps inline (MLflow's artifact viewer shows it without fetching anything)
    page = (got / "report.html").read_text()
    assert "<h2>diagnose: healthy (classifier, gaussians8, amp O2, scaler static)</h2>" in page
    assert page.count("<tr>") == 1 + len(layers) and 'id="report-table"' in page
    for stem in ("heatmap", "underflow_heatmap"):
        assert f'<img alt="{stem}" src="data:image/png;base64,' in page
        png = (got / f"{stem}.png").read_bytes()      # logged with log_figure: a matplotlib chart
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000

    # what the replay starts from: the checkpoint's weights, optimizer state and sampler position
    # in both tasks; the AMP task its loss scale, the FP32 twin scale 1
    scratch = tmp_path / "scratch"   # the recorded config.yaml is fetched into a folder that does not outlive the call
    scratch.mkdir()
    with monkeypatch.context() as m:
        m.setattr(tempfile, "tempdir", str(scratch))
        cfg = recorded_config(compose_diag(), trained)
    assert not list(scratch.iterdir())
    start = checkpoint_start(trained, cfg, None)
    assert start.name == "step-00000004"
    s = validate(cfg)
    data = build_dataset(s.data)
    saved = {k: v.asnumpy() for k, v in ms.load_checkpoint(str(start / "state.ckpt")).items()}
    amp_task, fp32_task = build_seeded(s, data, start), build_seeded(fp32_twin_settings(s), data, start)
    for task in (amp_task, fp32_task):
        for key, p in task.state_parameters().items():
            if not key.startswith("train.scaler/"):
                assert np.array_equal(p.asnumpy(), saved[key]), key
        assert task.batches.state() == checkpoint.read_host(start)["batches"]
    assert float(amp_task.scalers["train.scaler"].scale_value.asnumpy()) == 8.0
    assert float(fp32_task.scalers["train.scaler"].scale_value.asnumpy()) == 1.0
    assert checkpoint_start("0123456789abcdef0123456789abcdef", cfg, None) is None   # no such run: from step 0

    # the logged CSVs hold the replay's numbers: replay the same 3 steps from the same checkpoint here
    dcfg = diagnose_settings(cfg)
    ref = record_reference(s, data, 3, lambda m: None, start)
    analysis = analyse(s, dcfg, data, ref, ["synced"], lambda m: None)
    assert [r["param"] for r in layers] == [r["param"] for r in analysis.rows]
    for logged, replayed in zip(layers, analysis.rows):
        for col in LAYER_COLUMNS:
            want = replayed[col]
            assert (float(logged[col]) == want if isinstance(want, float) else logged[col] == str(want)), (col, logged)
    assert heat_rows[0] == ["field", "param", "5", "6", "7"]         # training steps after the checkpoint's 4
    for stem, (field, _, _) in HEATMAPS.items():
        names, matrix = heat(analysis.synced, field)
        rows = [r for r in heat_rows[1:] if r[0] == field]
        assert [r[1] for r in rows] == names
        assert np.array_equal(np.array([[float(x) for x in r[2:]] for r in rows]), matrix), stem
    rel = analysis.synced.nets["train"].field("rel_err")           # the heat map: max over each step's sub-steps
    assert np.array_equal(heat(analysis.synced, "rel_err")[1], rel.T)


def trained_50_steps(preset: str, outputs):
    """`+experiment=<preset>` trained 50 steps into `outputs`' store, a checkpoint set and an
    evaluation every 10: its finished MLflow run."""
    env = {**os.environ, "AMPGAN_OUTPUTS": str(outputs), "GLOG_v": "3"}
    train = subprocess.run([sys.executable, "-m", "ampgan.train", f"+experiment={preset}",
                            "trainer.max_steps=50", "trainer.checkpoint_every=10", "trainer.eval_every=10"],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert train.returncode == 0, train.stderr
    _, runs = all_runs(outputs)
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    return runs[0]


def test_logged_run_whose_gradient_error_costs_nothing_is_healthy(outputs):
    """A finished run diagnosed from its last checkpoint (`diagnose.run=<id>`), whose float16
    gradient is far off FP32's there but which trained as FP32 does (diag_precision_harmless:
    accuracy 1 by step 40): the error is reported as evidence, the verdict is `healthy`, nothing is
    offered as a fix. Before the precision rule asked whether the run pays for the error, this run
    got `precision` with "head in FP32" (the WGAN-GP study's finished runs did the same)."""
    run = trained_50_steps("diag_precision_harmless", outputs)
    assert run.data.metrics["eval/accuracy"] == 1.0   # it trained: there is nothing to fix
    proc = run_diagnose(f"diagnose.run={run.info.run_id}", "diagnose.steps=4", outputs=outputs)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    head = proc.stdout.splitlines()[0]
    assert head.startswith("verdict: healthy - float16's gradients are a median "), head
    error = float(head.split("a median ")[1].split(" ")[0])
    assert error > 0.05 and "an error the run does not pay for" in head, head   # the error is there, and said
    assert "replayed: 4 iterations from checkpoint step 50 (" in proc.stdout
    assert "\nfix" not in proc.stdout and "amp.keep_fp32" not in proc.stdout   # nothing to remove: no fix tried
    _, runs = all_runs(outputs)
    diag = [r for r in runs if r.data.tags.get("ampgan.kind") == "diagnose"]
    assert len(diag) == 1 and diag[0].data.tags["ampgan.verdict"] == "healthy" and diag[0].info.status == "FINISHED"


def test_logged_run_that_never_learned_is_judged_from_step_0_never_healthy(outputs):
    """A finished run that logged no failure but never learned (diag_precision: eval/accuracy flat
    at 0.128 over 50 steps, where FP32 reaches 1): from its last checkpoint it would neither fail
    nor trail over a 1-step horizon, and its gradient error would look unpaid. Its logged history
    against its untrained nets says it did not learn, so it is diagnosed from step 0: the run fails
    (no progress) where its FP32 twin learns, and the verdict is `precision` at `head`, the fix
    replayed on its own course."""
    run = trained_50_steps("diag_precision", outputs)
    assert run.data.metrics["eval/accuracy"] < 0.2   # it did not learn
    proc = run_diagnose(f"diagnose.run={run.info.run_id}", "diagnose.steps=4", "diagnose.mode=synced",
                        outputs=outputs)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[0].startswith("verdict: precision - "), proc.stdout
    assert "layer: head" in proc.stdout and "replayed: 4 iterations from step 0" in proc.stdout
    assert "the diagnosed run failed at step 50 (did not learn: eval/accuracy " in proc.stdout
    assert "starting from step 0 (a run that never learned is judged from its start)" in proc.stderr
    assert "amp.keep_fp32=[head]    # " in proc.stdout   # the fix, replayed on its own course


def test_unknown_run_id_is_bad_input(outputs):
    proc = run_diagnose("diagnose.run=0123456789abcdef", outputs=outputs)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("ampgan: error: diagnose.run=")


def test_a_logged_failure_beyond_the_replay_is_not_reproduced_and_the_horizon_reaches_it(outputs):
    """A run whose loss goes non-finite at step 2 (lr 1e12: FP32's too). A one-step replay without
    the horizon does not reach it: not_reproduced, exit 4, with the way there. The horizon trains
    to the logged failure and finds FP32 failing no later: not_amp, exit 3."""
    env = {**os.environ, "AMPGAN_OUTPUTS": str(outputs), "GLOG_v": "3"}
    train = subprocess.run([sys.executable, "-m", "ampgan.train", *[a for a in TINY if a != "tracking=none"],
                            "model.lr=1e12", "scaler=dynamic", "trainer.max_steps=4", "trainer.log_every=1",
                            "trainer.eval_samples=100"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert train.returncode == 0, train.stderr
    _, runs = all_runs(outputs)
    trained = runs[0].info.run_id
    short = run_diagnose(f"diagnose.run={trained}", "diagnose.steps=1", "diagnose.horizon=0", outputs=outputs)
    assert short.returncode == 4, short.stdout + short.stderr
    first = next(line for line in short.stdout.splitlines() if line.startswith("verdict: "))
    assert first.startswith("verdict: not_reproduced") and "failed at step 2" in first, first
    assert "diagnose.horizon=3" in short.stdout and "trainer.checkpoint_every" in short.stdout
    reached = run_diagnose(f"diagnose.run={trained}", "diagnose.steps=1", outputs=outputs)
    assert reached.returncode == 3, reached.stdout + reached.stderr
    verdict = next(line for line in reached.stdout.splitlines() if line.startswith("verdict: "))
    assert verdict.startswith("verdict: not_amp - the FP32 twin fails too (step 2"), verdict


def test_fp32_that_does_not_learn_is_not_amp_not_healthy(tmp_path):
    """lr 1e-7: no NaN anywhere and AMP tracks FP32 closely, but neither learns over the horizon;
    the old rules said healthy."""
    cfg = compose_diag(*TINY, "model.lr=1e-7", "diagnose.steps=2", "diagnose.mode=synced", "diagnose.horizon=30")
    result = diagnose(cfg, tmp_path, echo=lambda *a, **k: None)
    h = result.analysis.horizon
    assert result.verdict.name == "not_amp" and result.exit_code == 3, result.verdict.headline
    assert h.fp32.kind == "no_progress" and h.fp32.progress < 0.05 and h.fp32.done == 30
    assert "does not learn" in result.verdict.headline
