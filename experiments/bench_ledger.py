"""The bench's sections, written as each one ends, resumed after a stop, compared with an earlier table.

A bench is a list of sections (`Section`: a name and what it measures). `run_sections` runs
them in order. The moment one ends, its result goes into the ledger
(`outputs/bench/sections.json`), with the commit, the machine (cores, CPU model, the load before
the section) and the date. The ledger is written whole to a temporary file and then renamed, so
a kill leaves the previous one. The caller's `publish` then rewrites the tables from every
section finished so far.

Started again with the same plan (the same arguments), a bench resumes at its first unfinished
section. `restart=True` (`--restart`) starts over. A different plan starts over too, because its
sections would not make one table. A finished bench's ledger is marked complete, and the next
bench starts over.

Each section's duration is kept across benches, so the progress line can say how long the
sections still to run took the last time.

`compare` sets two tables side by side (this one and an earlier `bench.json`, by default the one
committed under docs/). It gives each ratio's change and whether its interval moved: the two
95% intervals do not overlap.
"""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

LEDGER = "sections.json"


@dataclass(frozen=True)
class Section:
    name: str
    measure: Callable[[], dict]   # -> its part of the results, e.g. {"rows": [...]} or {"memory": {...}}


def machine(load_before: float | None = None) -> dict:
    """Cores, CPU model and the 1-minute load average (before the section, when given)."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = load_before if load_before is not None else (os.getloadavg()[0] if hasattr(os, "getloadavg") else math.nan)
    return {"cores": os.cpu_count(), "cpu": cpu, "load_before": round(load, 2)}


def commit(where: Path | None = None) -> str:
    """The checkout's commit (short), with "+changes" when its tracked files differ from it; "unknown" outside git."""
    where = where or Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=where, capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--"], cwd=where, capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+changes" if dirty.returncode == 1 else "")


def load(path: Path) -> dict:
    """The ledger at `path` ({} when there is none or it cannot be read)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def save(path: Path, ledger: dict) -> None:
    """Write the ledger whole, then rename it into place: a kill leaves the previous ledger intact."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(ledger, indent=2))
    os.replace(tmp, path)


def _duration(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 90 else f"{seconds:.0f} s"


def _time_left(pending: list[str], past: dict) -> str:
    """How long the sections still to run took the last time, as far as the ledger knows."""
    known = [past[n] for n in pending if n in past]
    after = f"this and the {len(pending) - 1} after it" if len(pending) > 1 else "the last section"
    if not known:
        return f"{after}: no earlier time here, the first bench of them"
    unknown = len(pending) - len(known)
    return (f"{after} took {_duration(sum(known))} the last time"
            + (f", {unknown} of them not timed before" if unknown else ""))


def run_sections(sections: list[Section], path: Path, plan: dict, publish: Callable[[dict, list[str]], None],
                 restart: bool = False, echo: Callable[[str], None] = print) -> dict:
    """Run each section not yet finished under this `plan`, recording each as it ends; returns
    {name: record} of every section (a record: result, seconds, finished, commit, machine).
    `publish(done, pending)` is called after each section with the records so far and the names
    still to run."""
    names = [s.name for s in sections]
    if len(set(names)) != len(names):
        raise ValueError(f"bench sections must have distinct names: {names}")
    ledger = load(path)
    past = ledger.get("seconds", {})
    resumable = not restart and ledger.get("plan") == plan and not ledger.get("complete")
    done = {k: v for k, v in ledger.get("sections", {}).items() if k in names} if resumable else {}
    if done:
        echo(f"bench: resuming: {len(done)} of {len(sections)} sections already measured "
             f"(the last at {max(r['finished'] for r in done.values())}); --restart starts over")
    elif ledger.get("sections") and not restart and not ledger.get("complete"):
        echo("bench: the unfinished bench in the ledger ran other arguments: starting over")
    for i, section in enumerate(sections, 1):
        if section.name in done:
            continue
        pending = [s.name for s in sections if s.name not in done]
        echo(f"[{i}/{len(sections)}] {section.name} ({_time_left(pending, past)})")
        before = machine()
        started = time.perf_counter()
        result = section.measure()
        seconds = time.perf_counter() - started
        done[section.name] = {"result": result, "seconds": seconds, "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
                              "commit": commit(), "machine": before}
        past[section.name] = seconds
        pending = [s.name for s in sections if s.name not in done]
        save(path, {"plan": plan, "complete": not pending, "sections": done, "seconds": past})
        publish(done, pending)
        echo(f"[{i}/{len(sections)}] {section.name}: done in {_duration(seconds)}")
    return done


# ---------------------------------------------------------------- comparing two tables
def _rows_by_key(table: dict) -> dict[tuple[str, str], dict]:
    return {(r["comparison"], r["variant"]): r for r in table.get("comparisons", []) if r["variant"] != r["baseline"]}


def _moved(new: tuple[float, float], old: tuple[float, float]) -> str:
    if new[0] > old[1]:
        return "up: intervals apart"
    if new[1] < old[0]:
        return "down: intervals apart"
    return "no: intervals overlap"


def compare(new: dict, old: dict, old_name: str = "earlier") -> str:
    """Markdown: each ratio of `new` beside the same one of `old`, its change and whether its interval moved;
    then the start-up phases the same way. Rows in only one table are listed after."""
    nm, om = new.get("meta", {}), old.get("meta", {})
    lines = [f"# bench: this table ({nm.get('date', '?')}, commit {nm.get('commit', '?')}) against {old_name} "
             f"({om.get('date', '?')}, commit {om.get('commit', '?')})", "",
             "| comparison | variant | ratio now [95% interval] | ratio then [95% interval] | change | moved |",
             "|---|---|---|---|---|---|"]
    a, b = _rows_by_key(new), _rows_by_key(old)
    for key in [k for k in a if k in b]:
        n, o = a[key], b[key]
        lines.append(f"| {key[0]} | {key[1]} | {n['ratio']:.3f} [{n['ci_low']:.3f}-{n['ci_high']:.3f}] | "
                     f"{o['ratio']:.3f} [{o['ci_low']:.3f}-{o['ci_high']:.3f}] | {n['ratio'] - o['ratio']:+.3f} | "
                     f"{_moved((n['ci_low'], n['ci_high']), (o['ci_low'], o['ci_high']))} |")
    starts_new = {r["phase"]: r for r in new.get("startup", [])}
    starts_old = {r["phase"]: r for r in old.get("startup", [])}
    for phase in [p for p in starts_new if p in starts_old]:
        for temp in ("cold", "warm"):
            n, o = starts_new[phase], starts_old[phase]
            if temp not in n or temp not in o:
                continue
            moved = (_moved(tuple(n[f"{temp}_ci"]), tuple(o[f"{temp}_ci"]))
                     if f"{temp}_ci" in n and f"{temp}_ci" in o else "-")
            lines.append(f"| start-up ({temp}) | {phase} | {n[temp]:.2f} s | {o[temp]:.2f} s | {n[temp] - o[temp]:+.2f} s | {moved} |")
    only_new = [f"{c} / {v}" for c, v in a if (c, v) not in b]
    only_old = [f"{c} / {v}" for c, v in b if (c, v) not in a]
    if only_new:
        lines += ["", "Only in this table: " + "; ".join(only_new)]
    if only_old:
        lines += ["", f"Only in {old_name}: " + "; ".join(only_old)]
    return "\n".join(lines) + "\n"
