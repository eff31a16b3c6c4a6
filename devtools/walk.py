"""Follow one run's configuration through the package: which modules and stages it passes through.

    python -m devtools.walk [--json F] -- -m ampgan.diagnose +experiment=diag_forward_overflow
    python -m devtools.walk -- -m ampgan.train trainer=smoke tracking=none

Runs the command in this process under a profile hook (a few times slower than the command) and
counts, on the main thread:

- a *pass*: a call that crosses from one module to another (or from outside the package into it)
  with the configuration among the callee's arguments: the composed config (`DictConfig`), the
  validated `Settings`, or diagnose's `Case`, the whole object, not one of its sections;
- a *stage* is a folder of `ampgan/` (config, data, models, amp, steps, tasks, training,
  tracking, sweeps, reporting, diagnose); a top-level module (`api`, `train`) is the entry;
- a stage *entry* is a pass into a stage other than the last stage passed into, and a
  *re-entry* one into a stage already entered before: the walk enters each stage once when
  re-entries are 0;
- per module and per function: how often the configuration entered it.

The figures describe one command on one configuration; they are a reading aid for the
architecture (docs/architecture.md), not a test. Nothing in `ampgan` imports this module.
"""

from __future__ import annotations

import argparse
import json
import runpy
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "ampgan"
CONFIG_TYPES = {"DictConfig", "Settings", "Case"}


def module_of(filename: str) -> str | None:
    """`ampgan.diagnose.replay` for a file of the package, else None."""
    try:
        rel = Path(filename).resolve().relative_to(PACKAGE)
    except ValueError:
        return None
    parts = ["ampgan", *rel.with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def stage_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and (PACKAGE / parts[1]).is_dir()) else "entry"


class Walk:
    def __init__(self) -> None:
        self.passes: list[tuple[str, str, str]] = []   # (from module, to module, function)
        self._modules: dict[str, str | None] = {}

    def _module(self, code) -> str | None:
        name = code.co_filename
        if name not in self._modules:
            self._modules[name] = module_of(name)
        return self._modules[name]

    def hook(self, frame, event, arg) -> None:
        if event != "call":
            return
        callee = self._module(frame.f_code)
        if callee is None:
            return
        back = frame.f_back
        caller = None
        while back is not None and caller is None:   # the nearest frame of the package (or none: outside)
            caller = self._module(back.f_code)
            if caller is None:
                back = back.f_back
        if caller == callee:
            return
        code = frame.f_code
        names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
        values = [frame.f_locals.get(n) for n in names]
        if any(type(v).__name__ in CONFIG_TYPES for v in values):
            self.passes.append((caller or "(outside)", callee, code.co_name))

    def summary(self) -> dict:
        stages: list[str] = []
        for stage in (stage_of(dst) for _, dst, _ in self.passes):
            if not stages or stages[-1] != stage:
                stages.append(stage)
        entries = Counter(stages)
        return {"passes": len(self.passes), "modules": len({dst for _, dst, _ in self.passes}),
                "stage_order": stages, "stage_entries": dict(entries), "re_entries": sum(n - 1 for n in entries.values()),
                "per_module": dict(Counter(dst for _, dst, _ in self.passes).most_common()),
                "per_function": dict(Counter(f"{dst}.{fn}" for _, dst, fn in self.passes).most_common())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.walk", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", default=None, help="write the summary here too")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- -m <module> [args...]")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if len(command) < 2 or command[0] != "-m":
        parser.error("give the command as: -- -m <module> [args...]")
    walk = Walk()
    sys.argv = [command[1], *command[2:]]
    code = 0
    sys.setprofile(walk.hook)   # this thread only: the command's own threads are not followed
    try:
        runpy.run_module(command[1], run_name="__main__", alter_sys=True)
    except SystemExit as err:
        code = err.code if isinstance(err.code, int) else (0 if err.code is None else 1)
    finally:
        sys.setprofile(None)
    out = walk.summary()
    out["exit"] = code
    text = json.dumps(out, indent=1)
    if args.json:
        Path(args.json).write_text(text)
    short = {k: v for k, v in out.items() if k not in ("per_module", "per_function")}
    print("walk: " + json.dumps(short), file=sys.stderr)
    print("walk: modules entered most: " + ", ".join(f"{m} {n}" for m, n in list(out["per_module"].items())[:8]),
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
