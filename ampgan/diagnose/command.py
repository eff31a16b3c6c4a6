"""`python -m ampgan.diagnose`: the stages in order, the report, the MLflow run, the exit code.

    exit 0  healthy: AMP tracks FP32
    exit 1  an AMP problem (overflow, underflow, precision, scaler, framework); the fix is printed
    exit 3  not AMP: the FP32 twin fails the same way, no later
    exit 4  not reproduced: the run fails, but the replay did not reach or explain it (how to get there is printed)
    exit 5  unexplained: FP32 trains, and no intervention tried removes the failure (the table shows them)
    exit 2  bad input (one line `ampgan: error: ...`)
"""

from __future__ import annotations

import logging
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from ampgan import AmpganError
from ampgan.config.schema import validate
from ampgan.tasks import load_data
from ampgan.diagnose import verdict_report as report
from ampgan.diagnose.config import diagnose_settings
from ampgan.diagnose.interventions import candidates, confirm, settles, table, unconfirmed
from ampgan.diagnose.pipeline import Analysis, analyse, evidence_of, framework_check, reference_for
from ampgan.diagnose.fp32_set_search import SearchResult, search_keep_list
from ampgan.diagnose.horizon import BLOCK, run_horizon
from ampgan.diagnose.verdict import NO_AMP_FIX, Fix, Verdict
from ampgan.training import checkpoint
from ampgan.diagnose.verify import Checked, Proof, prove_seeds, verify_fixes

log = logging.getLogger("ampgan")


@dataclass
class Result:
    verdict: Verdict
    analysis: Analysis
    checked: list[Checked] | None = None
    proof: Proof | None = None
    search: SearchResult | None = None
    interventions: list[dict] | None = None   # the table of interventions tried (interventions.table)
    run_id: str | None = None
    folder: Path | None = None

    @property
    def rows(self) -> list[dict]:
        return self.analysis.rows

    @property
    def synced(self):
        return self.analysis.synced

    @property
    def fits(self):
        return self.analysis.fits

    @property
    def free(self) -> str | None:
        return self.analysis.free_summary()

    @property
    def exit_code(self) -> int:
        return self.verdict.exit_code


def check_node(cfg: DictConfig) -> None:
    """preflight's `extra`: the diagnose node of every composed combination."""
    diagnose_settings(cfg)


def recorded_config(cfg: DictConfig, run_id: str) -> DictConfig:
    """The diagnosed run's recorded config (its `config.yaml` artifact) with this command's diagnose
    and tracking nodes. Raises AmpganError for an unknown run or a run without a config."""
    from ampgan.tracking.tracker import make_client, store_errors

    client = make_client(cfg.tracking.uri)
    with tempfile.TemporaryDirectory(prefix="ampgan-diagnose-") as scratch:
        try:
            client.get_run(run_id)
            path = client.download_artifacts(run_id, "config.yaml", scratch)
        except store_errors() as err:
            raise AmpganError(f"diagnose.run={run_id}: no such run with a config.yaml in {cfg.tracking.uri} "
                              f"({str(err).splitlines()[0][:120]})") from None
        recorded = OmegaConf.load(path)
    recorded.diagnose = cfg.diagnose
    recorded.tracking = cfg.tracking
    return recorded


def one_process(recorded: DictConfig) -> int:
    """Replay a data-parallel run (`hardware.workers=N`) in this one process, on the same global
    batch: `trainer.batch_size` is already the global batch, and rank 0's checkpoint holds the one
    global sampler and RNG state every rank shared. Sets `hardware.workers=1` (nothing here starts
    msrun: the replays build their steps in this process, outside any cluster); the run's own number."""
    workers = int(OmegaConf.select(recorded, "hardware.workers", default=1))
    if "hardware" in recorded:
        recorded.hardware.workers = 1
    return workers


def checkpoint_start(run_id: str, cfg: DictConfig, failed_at: int | None) -> Path | None:
    """Where a diagnosed run's replay starts: its newest full-state checkpoint set from before its
    first failing step (the newest set when it logged no failure); None (step 0 with the run's
    seed) when the run wrote none before it or its folder is not on this machine."""
    from ampgan.tracking.tracker import run_folder_in_store

    uri = cfg.tracking.uri
    try:
        newest = checkpoint.find_checkpoint(run_id, (lambda rid: run_folder_in_store(rid, uri)) if uri else None)
    except AmpganError:
        return None
    if failed_at is None:
        return newest
    return checkpoint.newest_before(newest.parent, failed_at)


def horizon_length(dcfg, max_steps: int, start_step: int, failed_at: int | None) -> int:
    """How many steps the horizon trains from `start_step`: a logged run's up to its failure; else
    `diagnose.horizon`, or (null) the rest of the run's own configured length, so that a failure
    late in the run is reached (the time bound `diagnose.horizon_seconds` may still cut it short)."""
    if failed_at is not None:
        return max(1, failed_at - start_step)
    return dcfg.horizon if dcfg.horizon is not None else max(1, max_steps - start_step)


def lockstep_length(steps: int, horizon, start: Path | None) -> int:
    """`diagnose.steps`, or as many as reach the failure the horizon found from where the replay starts."""
    if horizon is None or horizon.amp.kind != "non_finite":
        return steps
    return max(steps, horizon.amp.failed_at - checkpoint.step_of(start))


def run_failure(run_id: str, uri: str) -> tuple[int | None, str]:
    """A logged run's first failure from its metric history: the first step with a non-finite
    `*/loss`, else the step at which it stopped as diverged (`train/diverged` 1); (None, "") when
    its history shows none."""
    import math

    from ampgan.tracking.tracker import make_client

    client = make_client(uri)
    run = client.get_run(run_id)
    keys = [k for k in run.data.metrics if k.endswith("/loss") and not k.startswith("eval/")]
    bad = sorted((m.step, k) for k in keys for m in client.get_metric_history(run_id, k) if not math.isfinite(m.value))
    if bad:
        return bad[0][0], f"{bad[0][1]} not finite"
    if run.data.metrics.get("train/diverged", 0.0) > 0:
        step = int(run.data.metrics.get("train/steps", 0))
        return step, "stopped as diverged"
    return None, ""


def diagnose(cfg: DictConfig, run_dir: Path, echo=print) -> Result:
    """Diagnose the run `cfg` describes (or `diagnose.run`'s recorded run): replay, verdict, fixes;
    its report files go to `run_dir`, and to an MLflow run tagged ampgan.kind=diagnose."""
    started = time.perf_counter()
    dcfg = diagnose_settings(cfg)
    diagnosed = dcfg.run or None
    start, failed_at, failure, workers = None, None, "", 1
    if diagnosed:
        cfg = recorded_config(cfg, diagnosed)
        workers = one_process(cfg)
        failed_at, failure = run_failure(diagnosed, cfg.tracking.uri)
        start = checkpoint_start(diagnosed, cfg, failed_at)
    s = validate(cfg)
    data = load_data(s)
    recording = None
    if dcfg.start:   # a flight recording: its state, converted once into a checkpoint set of this task
        from ampgan.diagnose.replay import recorded_start
        from ampgan.tracking.recorder import read

        recording = read(dcfg.start)
        failed_at, failure = recording.first_bad_step, recording.failure
        start = recorded_start(s, data, recording, Path(run_dir) / "start")

    def progress(msg: str) -> None:
        if dcfg.progress:
            echo(f"[diagnose {time.perf_counter() - started:5.1f}s] {msg}", file=sys.stderr, flush=True)

    if recording is not None:
        progress(f"flight recording {recording.folder}: {failure}; starting from the state after step "
                 f"{recording.step}, on its {recording.steps_recorded} recorded batches")
    if diagnosed:
        progress(f"run {diagnosed}: " + (f"data parallel on {workers} workers, replayed in one process on its global "
                                         f"batch of {s.trainer.batch_size}; " if workers > 1 else "")
                 + (f"failed at step {failed_at} ({failure}); " if failed_at else "")
                 + "starting from " + (f"checkpoint {start}" if start else "step 0 (no checkpoint before it)"))
    cache: dict = {}
    framework = framework_check(s, data, dcfg.framework_check, start)
    if framework is not None:
        progress(framework.describe())
    with tempfile.TemporaryDirectory(prefix="ampgan-horizon-") as scratch:
        horizon = None
        if dcfg.horizon != 0:
            steps = horizon_length(dcfg, s.trainer.max_steps, checkpoint.step_of(start), failed_at)
            every = max(1, min(BLOCK, dcfg.steps))   # the failure known to within the replay's length
            # a logged run's FP32 twin may train on past the failure to see whether FP32 recovers
            later = None if failed_at is None else min(s.trainer.max_steps, failed_at + (dcfg.horizon or steps))
            horizon = run_horizon(s, data, steps, dcfg, Path(scratch), start, every, progress,
                                  run_failed_at=failed_at, run_failure=failure, recover_to=later)
            start = horizon.lockstep_start()
        replay = lockstep_length(dcfg.steps, horizon, start)
        ref = reference_for(s, data, replay, progress, cache, start)
        modes = ["synced", "free"] if dcfg.mode == "both" else [dcfg.mode]
        analysis = analyse(s, dcfg, data, ref, modes, progress, dcfg.locate, framework, horizon, failed_at)
        hypothesis = analysis.verdict
        result = Result(hypothesis, analysis)
        if dcfg.search and hypothesis.on_evaluation:
            progress("search: skipped (the keep-list search replays training steps; this verdict is the evaluation's)")
        elif dcfg.search and hypothesis.name not in NO_AMP_FIX:
            result.search = search_keep_list(cfg, dcfg, data, cache, progress, start)
            hypothesis.fixes = [Fix([result.search.override], "minimal FP32 keep-list found by ddmin")] + [
                f for f in hypothesis.fixes if f.overrides != [result.search.override]]
        facts = evidence_of(analysis)
        tried = candidates(hypothesis, facts, dcfg.max_fixes)
        if dcfg.verify:
            if tried:   # each intervention replayed; over its own course too when the horizon saw the failure
                seen = horizon is not None and (horizon.amp.failed_at is not None or horizon.amp_trails(dcfg))
                result.checked = verify_fixes(cfg, dcfg, tried, data, cache, progress, start=start,
                                              horizon=horizon if seen else None, enough=settles(hypothesis))
            result.verdict = analysis.verdict = confirm(hypothesis, result.checked or [], facts)
            result.interventions = table(result.checked or [], facts)
        else:
            result.verdict = analysis.verdict = unconfirmed(hypothesis)
        if result.search is not None:
            result.search.confirmed = any(c.confirmed and c.fix.overrides == [result.search.override]
                                          for c in result.checked or [])
    best = next((c.fix for c in result.checked or [] if c.confirmed and c.fix in result.verdict.fixes), None)
    if dcfg.seeds and best is not None:   # only a fix whose replay removed the failure
        result.proof = prove_seeds(cfg, dcfg, best, data, progress)
    echo(report.terminal(result))
    publish(result, cfg, s, diagnosed, run_dir, time.perf_counter() - started)
    return result


def publish(result: Result, cfg: DictConfig, s, diagnosed: str | None, run_dir: Path, seconds: float) -> None:
    """Files into the run folder; an MLflow run tagged ampgan.kind=diagnose with them as artifacts."""
    from ampgan.tracking.tracker import build_tracker, flatten
    from ampgan.training.loop import tracked_run

    folder = Path(run_dir)
    result.folder = folder
    files, figures = report.write_files(result, folder)
    (folder / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    tracking = s.tracking
    tracking.experiment = cfg.diagnose.get("experiment", "ampgan-diagnose")
    tracker = build_tracker(tracking)
    v = result.verdict
    tags = {"ampgan.kind": "diagnose", "ampgan.verdict": v.name, "ampgan.layer": v.layer, "model": s.model.name,
            "data": s.data_name, "amp": s.amp.level, "scaler": s.scaler.name}
    if diagnosed:
        tags["ampgan.diagnosed_run"] = diagnosed
        tags["ampgan.start_step"] = str(result.analysis.ref.start_step)
    if cfg.diagnose.get("start"):   # a flight recording: where it is, and the step its state is from
        tags["ampgan.recording"] = str(cfg.diagnose.start)
        tags["ampgan.start_step"] = str(result.analysis.ref.start_step)
    if v.fixes:
        tags["ampgan.fix"] = v.fixes[0].text   # only fixes whose replay removed the failure are kept
    tags["mlflow.note.content"] = verdict_note(result)
    params = flatten(OmegaConf.to_container(cfg, resolve=True))
    with tracked_run(tracker, f"diagnose-{s.model.name}-{s.amp.level.lower()}-{s.scaler.name}", params, tags):
        metrics = {"diagnose/exit_code": float(v.exit_code), "diagnose/seconds": seconds,
                   "diagnose/replay_seconds": result.synced.seconds,
                   "diagnose/interventions": float(len(result.interventions or [])),
                   "diagnose/interventions_removing": float(sum(r["removes_failure"] for r in result.interventions or []))}
        from ampgan.diagnose.statistics import summaries

        for net, x in summaries(result.synced).items():
            metrics.update({f"diagnose/{net}/rel_err_median": x.rel_err_median, f"diagnose/{net}/nonfinite": x.nonfinite,
                            f"diagnose/{net}/lost_norm_max": x.lost_norm_max, f"diagnose/{net}/skipped": x.skipped})
        tracker.log_metrics(metrics, 0)
        for f in files + [folder / "config.yaml"]:
            tracker.log_artifact(f)
        client = getattr(tracker, "client", None)   # MLflow: the heat maps as charts, like a sweep report's
        for stem, fig in figures.items():
            if client is not None:
                client.log_figure(tracker.run_id, fig, f"{stem}.png")
    result.run_id = tracker.run_id
    if diagnosed and client is not None and tracker.run_id:
        mark_diagnosed(client, diagnosed, result, tags, tracker.experiment_id, tracker.run_id)


def verdict_note(result: Result) -> str:
    """The diagnose run's description in MLflow's UI: the verdict line first, then its evidence."""
    v = result.verdict
    lines = [f"**ampgan verdict: {v.name}**: {v.headline}", ""]
    lines += [f"- {e}" for e in v.evidence]
    if v.fixes:
        lines += ["", "Fixes: " + "; ".join(f"`{f.text}`" for f in v.fixes)]
    return "\n".join(lines)


def mark_diagnosed(client, run_id: str, result: Result, tags: dict, experiment_id: str, diagnosis_id: str) -> None:
    """The verdict where the run is: tags on the diagnosed run, with a link to its diagnosis (one request)."""
    from ampgan.tracking.tracker import run_link, tag_run

    v = result.verdict
    located = result.analysis.located
    marks = {"ampgan.verdict": v.name, "ampgan.verdict.line": v.headline, "ampgan.verdict.cell": v.layer or "-",
             "ampgan.verdict.op": located.describe() if located is not None else "-",
             "ampgan.verdict.fix": tags.get("ampgan.fix", "-"), "ampgan.diagnosis": diagnosis_id,
             "ampgan.diagnosis.link": run_link(experiment_id, diagnosis_id)}
    tag_run(client, run_id, marks)
