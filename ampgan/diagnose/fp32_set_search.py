"""A minimal FP32 keep-list by delta debugging (Zeller's ddmin) over the nets' cell paths.

The property tested for a set S of cell paths: with `amp.keep_fp32=S` a short synced replay is
`healthy`. ddmin starts from every candidate cell (which must pass: that is all of the model in
FP32, cell by cell) and removes chunks while the property holds; the result is 1-minimal: no
single cell can be dropped from it. Candidates: cells that own parameters, and custom cells
(not from mindspore.nn), since a custom cell can compute outside its children (`head` scaling
its logits). Each probe is one short replay against a shared FP32 record.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mindspore import nn

from ampgan.config.schema import validate
from ampgan.amp.cell_paths import cell_paths
from ampgan.diagnose.analysis import analyse, reference_for
from ampgan.diagnose.case import Case
from ampgan.diagnose.replay import build_seeded, fp32_twin_settings, roots
from ampgan.diagnose.verify import with_overrides


def candidate_cells(task) -> list[str]:
    out = []
    for root, net in roots(task).items():
        paths = cell_paths({root: net})
        for _, cell in net.cells_and_names():
            path = paths.get(id(cell))
            if not path or path == root or isinstance(cell, nn.SequentialCell):
                continue
            custom = not type(cell).__module__.startswith("mindspore")
            if custom or list(cell.get_parameters(expand=False)):
                out.append(path)
    return list(dict.fromkeys(out))


def ddmin(items: list[str], passes: Callable[[list[str]], bool]) -> list[str]:
    """Smallest subset (1-minimal) of `items` that still passes; `items` itself must pass."""
    n = 2
    while len(items) >= 2:
        size = -(-len(items) // n)
        chunks = [items[i : i + size] for i in range(0, len(items), size)]
        for chunk in chunks:
            if passes(chunk):
                items, n = chunk, 2
                break
        else:
            for i in range(len(chunks)):
                rest = [x for j, c in enumerate(chunks) if j != i for x in c]
                if len(chunks) > 2 and passes(rest):
                    items, n = rest, max(n - 1, 2)
                    break
            else:
                if n >= len(items):
                    break
                n = min(2 * n, len(items))
    return items


@dataclass
class SearchResult:
    keep: list[str]
    candidates: int
    probes: int
    confirmed: bool

    @property
    def override(self) -> str:
        return f"amp.keep_fp32=[{','.join(self.keep)}]"

    def describe(self) -> str:
        state = "confirmed healthy by replay" if self.confirmed else "NOT confirmed"
        return f"{self.override} ({len(self.keep)} of {self.candidates} cells; {self.probes} probes; {state})"


def search_keep_list(case: Case, cache: dict, progress, start: Path | None = None) -> SearchResult:
    """ddmin over `case`'s cells from `start` (the replay's); each probe reuses `cache`'s FP32 record."""
    cfg, dcfg, data = case.cfg, case.dcfg, case.data
    items = candidate_cells(build_seeded(fp32_twin_settings(case.settings), data))  # the cells as built, before AMP wraps any
    seen: dict[tuple, bool] = {}

    def passes(keep: list[str]) -> bool:
        key = tuple(sorted(keep))
        if key not in seen:
            s2 = validate(with_overrides(cfg, [f"amp.keep_fp32=[{','.join(keep)}]"]))
            ref = reference_for(s2, data, dcfg.search_steps, lambda m: None, cache, start)
            verdict = analyse(s2, dcfg, data, ref, ["synced"], lambda m: None, with_locate=False).verdict.name
            seen[key] = verdict == "healthy"
            progress(f"search probe {len(seen)}: keep {len(keep)} cell(s) -> {verdict}")
        return seen[key]

    if not passes(items):
        return SearchResult(items, len(items), len(seen), False)
    keep = ddmin(items, passes)
    return SearchResult(keep, len(items), len(seen), passes(keep))
