"""`make bench`: what ampgan costs over bare MindSpore, and what each feature costs.

Every comparison builds its variants once (graphs compiled and warmed), then times blocks
of training iterations interleaved A B A B ... so machine drift hits all variants alike.
A figure is the median over the repeats, with min and max to show the noise; a ratio is
taken pair by pair (A's block over B's block in the same round). Periodic work
(evaluation, checkpoints) is switched off in the timed blocks; metric logging keeps its
default cadence. Results: outputs/bench/bench.md, outputs/bench/bench.json, and an
MLflow run in the experiment "ampgan-bench".

    python -m experiments.bench                 # everything, ~6-8 min on 2 CPU cores
    python -m experiments.bench --quick         # fewer repeats, smaller blocks
    python -m experiments.bench --device GPU    # on a GPU machine: AMP's real speed-up too
    python -m experiments.bench --only diagnose --no-startup   # diagnose's replay cost alone
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hydra import compose, initialize_config_dir

from ampgan import hardware  # first: it quiets MindSpore's C++ logging before MindSpore loads
from ampgan.config import CONF_DIR, outputs_dir, validate
from ampgan.data import build_dataset
from ampgan.tasks import build_task
from ampgan.tracking import MlflowTracker, build_tracker
from ampgan.trainer import Progress, run_steps, tracked_run
from experiments.bare_loop import BareWganGp

GAN = ["model=wgan_gp", "data=gaussians8", "trainer.eval_every=0", "trainer.checkpoint_every=0",
       "trainer.print_every=100000", "trainer.max_steps=1000000"]
CLASSIFIER = ["model=classifier", "data=digits", "trainer=classifier", "trainer.eval_every=0",
              "trainer.checkpoint_every=0", "trainer.print_every=100000", "trainer.max_steps=1000000"]


class AmpganRunner:
    """ampgan's own loop (`trainer.run_steps`) on a task built exactly as `train()` builds it."""

    def __init__(self, overrides: list[str], store: str, device: str):
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name="train", overrides=overrides + [f"hardware={device.lower()}"])
        self.settings = s = validate(cfg)
        if s.tracking.backend == "mlflow":
            s.tracking.uri = store
        hardware.setup(s.hardware, s.trainer.seed)
        self.task = build_task(s, build_dataset(s.data))
        self.tracker = build_tracker(s.tracking)
        self.tracker.start("bench-variant", {}, {"bench": "variant"})
        self.run_dir = Path(tempfile.mkdtemp(prefix="ampgan-bench-"))
        self.progress, self.step = Progress(s.trainer.max_steps), 1

    def run(self, iterations: int) -> None:
        steps = range(self.step, self.step + iterations)
        run_steps(self.task, self.tracker, self.settings.trainer, self.run_dir, steps, self.progress)
        self.step += iterations

    def close(self) -> None:
        self.tracker.finish("FINISHED")


class BareRunner:
    def __init__(self, overrides: list[str], device: str):
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name="train", overrides=overrides + [f"hardware={device.lower()}"])
        s = validate(cfg)
        hardware.setup(s.hardware, s.trainer.seed)
        m, sc = s.model, s.scaler
        self.loop = BareWganGp(build_dataset(s.data).x_train, z_dim=m.z_dim, hidden=m.hidden, depth=m.depth,
                               batch_size=s.trainer.batch_size, n_critic=m.n_critic, gp_lambda=m.gp_lambda,
                               lr=m.lr_d, betas=tuple(m.betas), amp_level=s.amp.level,
                               init_scale=sc.init_scale, factor=sc.factor, window=sc.window, seed=s.trainer.seed)

    def run(self, iterations: int) -> None:
        self.loop.run(iterations)

    def close(self) -> None: ...


@dataclass
class Comparison:
    name: str
    variants: dict[str, Callable]          # label -> runner factory (built when measured)
    baseline: str
    iterations: int
    target: float | None = None            # max ratio over the baseline, where there is one
    rounds: float = 1.0                    # x the --repeats rounds (the headline figures get more)
    times: dict[str, list[float]] = field(default_factory=dict)

    def measure(self, repeats: int) -> None:
        repeats = max(3, round(repeats * self.rounds))
        runners = {label: make() for label, make in self.variants.items()}
        for runner in runners.values():
            runner.run(2)  # compile and warm up
        self.times = {label: [] for label in runners}
        for _ in range(repeats):
            for label, runner in runners.items():
                t = time.perf_counter()
                runner.run(self.iterations)
                self.times[label].append((time.perf_counter() - t) / self.iterations)
        for runner in runners.values():
            runner.close()

    def rows(self) -> list[dict]:
        base = self.times[self.baseline]
        out = []
        for label, ts in self.times.items():
            ratios = [a / b for a, b in zip(ts, base)]
            row = {"comparison": self.name, "variant": label, "ms_per_iteration": 1e3 * statistics.median(ts),
                   "ms_min": 1e3 * min(ts), "ms_max": 1e3 * max(ts),
                   "ratio": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
                   "baseline": self.baseline}
            if self.target is not None and label != self.baseline:
                row["target"] = self.target
                row["met"] = row["ratio"] <= self.target
            out.append(row)
        return out


def comparisons(store: str, device: str, quick: bool, only: str = ""):
    """Each comparison whose name contains `only`; its variants are built when it is measured."""
    for comp in _comparisons(store, device, quick):
        if only.lower() in comp.name.lower():
            yield comp


def _comparisons(store: str, device: str, quick: bool):
    it = 4 if quick else 8
    o2 = GAN + ["amp=o2", "scaler=dynamic"]
    bare_like = o2 + ["trainer.grad_health=false", "tracking=none"]

    def amp(extra: list[str]) -> AmpganRunner:
        return AmpganRunner(extra, store, device)

    yield Comparison("ampgan vs bare MindSpore (WGAN-GP O2 dynamic, health off, no tracking)",
                     {"bare": lambda: BareRunner(o2, device), "ampgan": lambda: amp(bare_like)}, "bare", it, target=1.05, rounds=2)
    yield Comparison("gradient health (WGAN-GP O2 dynamic, no tracking)",
                     {"off": lambda: amp(bare_like), "on": lambda: amp(o2 + ["tracking=none"])}, "off", it, target=1.10, rounds=2)
    yield Comparison("tracking to MLflow at the default cadence (WGAN-GP O2 dynamic)",
                     {"none": lambda: amp(o2 + ["tracking=none"]), "mlflow": lambda: amp(o2)}, "none", it, target=1.03, rounds=2)
    yield Comparison("loss-scale strategy (WGAN-GP O2, no tracking)",
                     {name: (lambda n=name: amp(GAN + ["amp=o2", f"scaler={n}", "tracking=none"]))
                      for name in ("none", "static", "dynamic", "underflow_aware", "fixed_clip")}, "none", it)
    yield Comparison("AMP level (WGAN-GP, dynamic scaler, no tracking)",
                     {lvl: (lambda v=lvl: amp(GAN + [f"amp={v}", "scaler=dynamic", "tracking=none"])) for lvl in ("o0", "o2", "o3")},
                     "o0", it)
    yield Comparison("jit vs PYNATIVE (classifier on digits, O0; WGAN-GP refuses PYNATIVE)",
                     {"jit": lambda: amp(CLASSIFIER + ["tracking=none"]),
                      "pynative": lambda: amp(CLASSIFIER + ["tracking=none", "hardware.jit=false"])}, "jit", 4 * it)
    scale_it = max(2, it // 2)
    for label, key in (("batch size", "trainer.batch_size"), ("model width", "model.hidden")):
        for value in (64, 128, 256, 512):
            extra = GAN + ["amp=o0", "scaler=dynamic", f"{key}={value}"]
            yield Comparison(f"scaling: {label} {value} (WGAN-GP O0 dynamic)",
                             {"bare": lambda e=extra: BareRunner(e, device),
                              "ampgan": lambda e=extra: amp(e + ["trainer.grad_health=false", "tracking=none"])},
                             "bare", scale_it, rounds=0.6)


def diagnose_cost(store: str, device: str, quick: bool, repeats: int = 5) -> list[dict]:
    """diagnose's replay of N iterations against N training iterations of the same run (target <= 3x).

    The replay is what `python -m ampgan.diagnose diagnose.mode=synced` runs per iteration: the FP32
    twin's step (weights and gradients kept), the synced AMP step and the in-graph comparison.
    Rounds interleave a replay and a training block of the same N iterations, so the machine's
    drift hits both alike; the ratio is taken round by round. Compilation is excluded on both
    sides: each replay builds and compiles anew and runs 1 + N iterations, of which the first
    (the compiling one) is left out (`iteration_seconds`); training runs on one task warmed up by
    two iterations.
    """
    from ampgan.diagnose.replay import record_reference, replay_amp

    n = 4 if quick else 12
    rounds = max(3, repeats) + (0 if quick else 3)
    overrides = GAN + ["amp=o2", "scaler=dynamic", "tracking=none"]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        s = validate(compose(config_name="train", overrides=overrides + [f"hardware={device.lower()}"]))
    data = build_dataset(s.data)
    runner = AmpganRunner(overrides, store, device)
    runner.run(2)
    diag, train, twin, amp = [], [], [], []
    for _ in range(rounds):
        ref = record_reference(s, data, 1 + n, lambda m: None)
        traces, _ = replay_amp(s, data, ref, ["synced"], lambda m: None)
        twin.append(sum(ref.iteration_seconds[1:]) / n)
        amp.append(sum(traces["synced"].iteration_seconds[1:]) / n)
        diag.append(twin[-1] + amp[-1])
        del ref, traces
        t = time.perf_counter()
        runner.run(n)
        train.append((time.perf_counter() - t) / n)
    runner.close()
    name = "diagnose replay vs training (WGAN-GP O2 dynamic, N iterations)"

    def row(variant: str, ts: list[float], **extra) -> dict:
        ratios = [d / t for d, t in zip(ts, train)]
        return {"comparison": name, "variant": variant, "ms_per_iteration": 1e3 * statistics.median(ts),
                "ms_min": 1e3 * min(ts), "ms_max": 1e3 * max(ts), "ratio": statistics.median(ratios),
                "ratio_min": min(ratios), "ratio_max": max(ratios), "baseline": "training", **extra}

    whole = row("diagnose replay (synced)", diag, target=3.0)
    whole["met"] = whole["ratio"] <= 3.0
    return [row("training", train), whole, row("replay part: FP32 twin (record)", twin),
            row("replay part: AMP step + comparison", amp)]


def startup(store_dir: Path, device: str, repeats: int) -> list[dict]:
    """Command to first finished step, from outside, and the split each run logs (startup/*)."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{store_dir / 'startup.db'}"
    MlflowTracker(uri, "startup")  # create the store outside the timed runs
    walls = []
    env = {**os.environ, "AMPGAN_OUTPUTS": str(store_dir), "GLOG_v": "3"}
    for _ in range(repeats):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "ampgan.train", "trainer.max_steps=1", "trainer.eval_samples=100",
                        f"tracking.uri={uri}", "tracking.experiment=startup", f"hardware={device.lower()}"],
                       env=env, check=True, capture_output=True)
        walls.append(time.perf_counter() - t)
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("startup").experiment_id])
    rows = [{"phase": "whole command (1 step, final eval, exit)", "seconds": statistics.median(walls),
             "min": min(walls), "max": max(walls)}]
    for key in ("startup/imports_s", "startup/build_s", "startup/store_s", "startup/first_step_s"):
        vals = [r.data.metrics[key] for r in runs if key in r.data.metrics]
        rows.append({"phase": key.split("/")[1][:-2], "seconds": statistics.median(vals), "min": min(vals), "max": max(vals)})
    to_first = sum(r["seconds"] for r in rows[1:])
    rows.append({"phase": "command to first finished step", "seconds": to_first, "min": None, "max": None})
    return rows


def _metric_name(text: str) -> str:
    """MLflow metric names: letters, digits, _ - . / only (spaces turned into _)."""
    return re.sub(r"[^A-Za-z0-9_\-./]", "", text.replace(" ", "_"))


def markdown(rows: list[dict], start: list[dict], meta: dict) -> str:
    lines = [f"# ampgan benchmark ({meta['device']}, {meta['cpus']} cores, MindSpore {meta['mindspore']}, {meta['date']})", "",
             "Per-iteration time (WGAN-GP: n_critic critic steps + 1 generator step; classifier: 1 step),"
             " median [min-max] over the repeats; ratio to the comparison's baseline, pair by pair.", ""]
    current = None
    for r in rows:
        if r["comparison"] != current:
            current = r["comparison"]
            lines += ["", f"## {current}", "", "| variant | ms / iteration | ratio to baseline | target |", "|---|---|---|---|"]
        target = "" if "target" not in r else f"<= {r['target']:.2f}: {'met' if r['met'] else 'MISSED'}"
        lines.append(f"| {r['variant']} | {r['ms_per_iteration']:.1f} [{r['ms_min']:.1f}-{r['ms_max']:.1f}] | "
                     f"{r['ratio']:.3f} [{r['ratio_min']:.3f}-{r['ratio_max']:.3f}] | {target} |")
    lines += ["", "## start-up", "", "| phase | seconds (median) | min | max |", "|---|---|---|---|"]
    for r in start:
        low, high = ("" if r[k] is None else f"{r[k]:.2f}" for k in ("min", "max"))
        lines.append(f"| {r['phase']} | {r['seconds']:.2f} | {low} | {high} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="CPU", choices=["CPU", "GPU", "Ascend"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="3 repeats, half-size blocks")
    parser.add_argument("--only", default="", help="run only the comparisons whose name contains this text")
    parser.add_argument("--no-startup", action="store_true", help="skip the start-up measurement")
    args = parser.parse_args(argv)
    repeats = 3 if args.quick else args.repeats
    try:
        hardware.check_device(args.device)
    except Exception as err:  # noqa: BLE001
        print(f"ampgan: error: {err}", file=sys.stderr)
        return 2
    out = outputs_dir() / "bench"
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="ampgan-bench-store-"))
    store = f"sqlite:///{scratch / 'variants.db'}"
    MlflowTracker(store, "ampgan")
    os.chdir(scratch)  # MindSpore's scratch files
    started = time.perf_counter()
    rows = []
    for comp in comparisons(store, args.device, args.quick, args.only):
        print(f"[{time.perf_counter() - started:5.0f}s] {comp.name}: {', '.join(comp.variants)}", flush=True)
        comp.measure(repeats)
        rows += comp.rows()
    if not args.only or "diagnose" in args.only.lower():
        print(f"[{time.perf_counter() - started:5.0f}s] diagnose replay vs training", flush=True)
        rows += diagnose_cost(store, args.device, args.quick, repeats)
    start = []
    if not args.no_startup:
        print(f"[{time.perf_counter() - started:5.0f}s] start-up", flush=True)
        start = startup(scratch, args.device, 2 if args.quick else 3)
    import mindspore as ms

    meta = {"device": args.device, "cpus": os.cpu_count(), "mindspore": ms.__version__,
            "python": platform.python_version(), "date": time.strftime("%Y-%m-%d %H:%M"), "repeats": repeats,
            "seconds": time.perf_counter() - started}
    (out / "bench.json").write_text(json.dumps({"meta": meta, "comparisons": rows, "startup": start}, indent=2))
    report = markdown(rows, start, meta)
    (out / "bench.md").write_text(report)
    print(report)

    figures = {}
    for r in rows:
        key = _metric_name(f"{r['comparison'].split(' (')[0]}/{r['variant']}")
        figures[f"{key}/ms"] = r["ms_per_iteration"]
        figures[f"{key}/ratio"] = r["ratio"]
    figures.update({f"startup/{_metric_name(r['phase'].split(' (')[0])}_s": r["seconds"] for r in start})
    tracker = MlflowTracker(f"sqlite:///{outputs_dir() / 'mlflow.db'}", "ampgan-bench")
    with tracked_run(tracker, f"bench-{args.device.lower()}", meta, {"device": args.device}):
        tracker.log_metrics(figures, 0)
        tracker.log_artifact(out / "bench.md")
        tracker.log_artifact(out / "bench.json")
    missed = [r for r in rows if r.get("met") is False]
    print(f"done in {meta['seconds']:.0f}s; {len(missed)} target(s) missed; written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
