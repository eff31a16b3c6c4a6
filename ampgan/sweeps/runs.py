"""Sweeps as MLflow nested runs: one parent run per sweep, each job's run its child.

`SweepRuns` is a Hydra callback (registered in conf/hydra/default.yaml). When a sweep starts,
it creates the parent run (the sweep's overrides as params, its command line and folder as
tags) and records it in the sweep folder (`parent_run.json`), before any job runs; each job
finds it there (`parent_tags`, `job_run_name`): its run gets the tag `mlflow.parentRunId` and
a name that says what varies (`o2-fixed_clip-clip_norm=2-seed0`). When the sweep ends (or its
process exits because a job raised), the parent gets the jobs' outcome counts and the sweep's
report (`ampgan.report`), and ends FINISHED, FAILED or KILLED after its children.
"""

from __future__ import annotations

import atexit
import json
import logging
import shlex
import socket
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

log = logging.getLogger("ampgan")

PARENT_RECORD = "parent_run.json"   # in the sweep folder: {"uri", "experiment", "run_id", "varies"}
NAME_SKIPS = ("amp", "scaler", "trainer.seed")  # always in a job's run name already


def swept_keys(overrides: list[str], sweeper_params: dict[str, Any] | None = None) -> list[str]:
    """The keys a sweep varies: overrides with several values (`a=1,2`, `range(..)`, `glob(..)`) and sweeper params."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    lines = list(overrides) + [f"{k}={v}" for k, v in (sweeper_params or {}).items()]
    keys: list[str] = []
    for ov in OverridesParser.create().parse_overrides(lines):
        key = ov.key_or_group.lstrip("+~")
        if ov.is_sweep_override() and key not in keys and not key.startswith("hydra"):
            keys.append(key)
    return keys


def read_record(sweep_dir: str | Path) -> dict | None:
    path = Path(sweep_dir) / PARENT_RECORD
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _multirun_dir() -> Path | None:
    """This job's sweep folder when running inside a Hydra sweep, else None."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    hc = HydraConfig.get()
    return Path(hc.sweep.dir) if hc.mode is not None and hc.mode.name == "MULTIRUN" else None


def parent_tags(uri: str) -> dict[str, str]:
    """`mlflow.parentRunId` for a job of a sweep whose parent run lives in the same store as the job's run."""
    sweep_dir = _multirun_dir()
    record = read_record(sweep_dir) if sweep_dir is not None else None
    if not record or record.get("uri") != uri:
        return {}
    return {"mlflow.parentRunId": record["run_id"]}


def job_run_name(amp: str, scaler: str, seed: int) -> str | None:
    """`<amp>-<scaler>-<what else varies>-seed<N>` for a job of a sweep (None outside a sweep)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.override_parser.overrides_parser import OverridesParser

    sweep_dir = _multirun_dir()
    if sweep_dir is None:
        return None
    record = read_record(sweep_dir) or {}
    varies = record.get("varies")
    parts = [amp.lower(), scaler]
    for ov in OverridesParser.create().parse_overrides(list(HydraConfig.get().overrides.task)):
        key = ov.key_or_group.lstrip("+~")
        if key in NAME_SKIPS or key.startswith("hydra") or (varies is not None and key not in varies):
            continue
        value = ov.get_value_element_as_str()
        parts.append(f"{key.rsplit('.', 1)[-1]}={value}" if "." in key else value)
    return "-".join([*parts, f"seed{seed}"])


def sweep_name(overrides: list[str], varies: list[str], sweep_id: str) -> str:
    """The parent run's name: `sweep clip_norm=0.5,1,2,5` (what varies), else the sweep's id."""
    shown = [o.lstrip("+~") for o in overrides if o.lstrip("+~").split("=", 1)[0] in varies]
    return ("sweep " + " ".join(shown))[:200] if shown else f"sweep {sweep_id}"


def _tracking(config: DictConfig):
    """The sweep's TrackingConfig (its defaults: per-job overrides of `tracking` are the jobs' own)."""
    from ampgan.config.schema import TrackingConfig

    node = OmegaConf.to_container(config.get("tracking", {}), resolve=True) or {}
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TrackingConfig), node))


class SweepRuns(Callback):
    """Hydra callback: the parent run of a sweep, its outcome counts and its report."""

    def __init__(self) -> None:
        self.client = None
        self.parent_id: str | None = None
        self.sweep_id = ""

    def __getstate__(self) -> dict:  # launchers pickle the callbacks to their workers: the parent stays here
        return {**self.__dict__, "client": None, "parent_id": None}

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            tracking = _tracking(config)
        except Exception as err:  # noqa: BLE001 - a bad tracking setting fails each job with one line
            log.warning(f"sweep: no parent run ({type(err).__name__}: {err})")
            return
        if tracking.backend != "mlflow":
            return
        from ampgan.reporting.sweep_report import PARENT_TAG
        from ampgan.tracking.tracker import (default_artifact_root, ensure_experiment, make_client, mlflow_value, this_process,
                                     write_atomic)

        sweep_dir = Path(config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        overrides = list(config.hydra.overrides.task)
        params = config.hydra.sweeper.get("params")
        params = OmegaConf.to_container(params, resolve=True) if params else {}
        typed = {o.split("=", 1)[0].lstrip("+~") for o in overrides}
        params = {k: v for k, v in params.items() if k.lstrip("+~") not in typed}  # the command line wins
        varies = swept_keys(overrides, params)
        self.sweep_id = sweep_dir.name
        self.client = make_client(tracking.uri)
        exp_id = ensure_experiment(self.client, tracking.experiment, default_artifact_root(tracking.uri))
        if self._reopen(read_record(sweep_dir), tracking.uri):  # `ampgan.sweep resume`: the same parent
            return
        pid, started = this_process()
        tags = {PARENT_TAG: "true", "sweep_id": self.sweep_id, "sweep_dir": str(sweep_dir),
                "ampgan.varies": json.dumps(varies), "command": mlflow_value(f"python -m ampgan.train {shlex.join(sys.argv[1:])}", 5000),
                "ampgan.host": socket.gethostname(), "ampgan.pid": str(pid), "ampgan.pid_started": f"{started:.3f}"}
        run = self.client.create_run(exp_id, run_name=sweep_name(overrides + [f"{k}={v}" for k, v in params.items()],
                                                                   varies, self.sweep_id), tags=tags)
        self.parent_id = run.info.run_id
        try:
            logged: dict[str, str] = {}   # a key given twice takes its last value, as Hydra does
            for line in overrides + [f"{k}={v}" for k, v in params.items()]:
                key, _, value = line.lstrip("+~").partition("=")
                logged[key[:250]] = value
            for key, value in logged.items():
                self.client.log_param(self.parent_id, key, mlflow_value(value, 6000))
        except Exception:
            self.client.set_terminated(self.parent_id, "FAILED")  # no parent left RUNNING
            self.parent_id = None
            raise
        write_atomic(sweep_dir / PARENT_RECORD, json.dumps(
            {"uri": tracking.uri, "experiment": tracking.experiment, "run_id": self.parent_id, "varies": varies}))
        log.info(f"sweep {self.sweep_id}: parent run {self.parent_id}")
        atexit.register(self._end)  # a job that raised skips on_multirun_end

    def _reopen(self, record: dict | None, uri: str) -> bool:
        if not record or record.get("uri") != uri:
            return False
        try:
            self.client.update_run(record["run_id"], status="RUNNING")
        except Exception:  # noqa: BLE001 - deleted meanwhile: a new parent
            return False
        from ampgan.tracking.tracker import this_process

        pid, started = this_process()
        self.client.set_tag(record["run_id"], "ampgan.pid", str(pid))
        self.client.set_tag(record["run_id"], "ampgan.pid_started", f"{started:.3f}")
        self.parent_id = record["run_id"]
        atexit.register(self._end)
        log.info(f"sweep {self.sweep_id}: parent run {self.parent_id} (resumed)")
        return True

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        self._end()

    def _end(self) -> None:
        """Outcome counts and the report on the parent run; end it after its children."""
        if self.parent_id is None:
            return
        parent_id, self.parent_id = self.parent_id, None
        atexit.unregister(self._end)
        from ampgan.reporting.sweep_report import children_of, write_report
        from ampgan.tracking.tracker import log_points

        client = self.client
        children = children_of(client, client.get_run(parent_id))
        statuses = [c.info.status for c in children]
        outcomes = [c.data.tags.get("outcome", "") for c in children]
        counts = {"finished": statuses.count("FINISHED"), "failed": statuses.count("FAILED"),
                  "killed": statuses.count("KILLED"), "diverged": outcomes.count("diverged")}
        summary = f"{counts['finished']}/{len(children)} finished" + "".join(
            f", {n} {k}" for k, n in counts.items() if k != "finished" and n)
        client.set_tag(parent_id, "outcome", summary)
        log_points(client, parent_id, [("sweep/jobs", len(children), 0)] + [(f"sweep/{k}", v, 0) for k, v in counts.items()])
        try:
            folder = write_report(client, client.get_run(parent_id), children)
            log.info(f"sweep {self.sweep_id}: {summary}; report {folder / 'report.html'} (and on run {parent_id})")
        except Exception as err:  # noqa: BLE001 - the runs are safe; the report can be made again
            log.warning(f"sweep {self.sweep_id}: no report ({type(err).__name__}: {err}); "
                        f"make it with: python -m ampgan.report {self.sweep_id}")
        status = "KILLED" if counts["killed"] else "FINISHED" if counts["finished"] == len(children) and children else "FAILED"
        client.set_terminated(parent_id, status=status)


