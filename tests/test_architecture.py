"""The import rules of docs/architecture.md, checked on the tree: every import, lazy ones inside
functions included, followed transitively through the package (as import-linter does)."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LOWER = ("ampgan.config.schema", "ampgan.data", "ampgan.models", "ampgan.amp", "ampgan.steps")
UPPER = ("ampgan.tasks", "ampgan.training", "ampgan.tracking", "ampgan.sweeps", "ampgan.reporting", "ampgan.diagnose")
ENTRIES = ("ampgan.train", "ampgan.sync", "ampgan.sweep", "ampgan.search", "ampgan.report")

# (what, modules the rule is about, modules they must never reach, transitively?)
RULES = [
    ("the loop never imports tracking or the steps",
     ("ampgan.training.loop", "ampgan.training.checkpoint"), ("ampgan.tracking", "ampgan.steps"), True),
    ("the steps never import tracking", ("ampgan.steps",), ("ampgan.tracking",), True),
    ("models and data never import amp or tracking", ("ampgan.models", "ampgan.data"), ("ampgan.amp", "ampgan.tracking"), True),
    ("amp never imports the build stage or anything above it", ("ampgan.amp",), UPPER, True),
    ("nothing imports upward from config, data, models, amp and steps", LOWER, UPPER, True),
    ("tracking never imports the build stage, the steps or the loop",
     ("ampgan.tracking",), ("ampgan.tasks", "ampgan.steps", "ampgan.training"), True),
    ("reporting reads runs: it never builds a task or runs a step",
     ("ampgan.reporting",), ("ampgan.tasks", "ampgan.steps", "ampgan.training", "ampgan.diagnose", "ampgan.sweeps"), True),
    ("only diagnose and the Python API import diagnose", ("ampgan",), ("ampgan.diagnose",), False),
    ("the library never imports development tooling or experiments", ("ampgan",), ("devtools", "experiments"), False),
]
EXEMPT = {"only diagnose and the Python API import diagnose": ("ampgan.diagnose", "ampgan.api")}


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, name: str) -> set[str]:
    """Every module `path` (module `name`) imports, anywhere in it."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)  # `from pkg import module`
    return found


def graph(root: Path, packages: tuple[str, ...] = ("ampgan",)) -> dict[str, set[str]]:
    modules = {module_name(p, root): p for pkg in packages for p in (root / pkg).rglob("*.py")}
    return {m: {i for i in imports_of(p, m)} for m, p in modules.items()}


def within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def reach(g: dict[str, set[str]], start: str) -> dict[str, list[str]]:
    """Every module reachable from `start`, with one import chain to it."""
    chains = {start: [start]}
    todo = [start]
    while todo:
        m = todo.pop()
        for i in g.get(m, ()):
            if i not in chains:
                chains[i] = chains[m] + [i]
                if i in g:
                    todo.append(i)
    return chains


def violations(g: dict[str, set[str]], rules=RULES, exempt=EXEMPT) -> list[str]:
    out = []
    for what, sources, forbidden, transitive in rules:
        for m in sorted(g):
            if not within(m, sources) or within(m, exempt.get(what, ())) or m in ENTRIES:
                continue
            targets = reach(g, m) if transitive else {i: [m, i] for i in g[m]}
            for target, chain in sorted(targets.items()):
                if within(target, forbidden):
                    out.append(f"{what}: {' -> '.join(chain)}")
                    break
    return out


def test_the_tree_keeps_the_import_rules():
    assert violations(graph(ROOT)) == []


def test_the_rules_see_every_stage():
    g = graph(ROOT)
    for prefix in (*LOWER, *UPPER, "ampgan.training.loop", "ampgan.training.checkpoint", *ENTRIES):
        assert any(within(m, (prefix,)) for m in g), f"no module {prefix}: a rule is checking nothing"


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    return tmp_path


def test_an_upward_import_breaks_the_rules(tmp_path):
    clean = {
        "ampgan/__init__.py": "",
        "ampgan/steps/__init__.py": "",
        "ampgan/steps/gan.py": "from ampgan.amp import health\n",
        "ampgan/amp/__init__.py": "",
        "ampgan/amp/health.py": "import numpy\n",
        "ampgan/training/__init__.py": "",
        "ampgan/training/loop.py": "from ampgan.training import checkpoint\n",
        "ampgan/training/checkpoint.py": "import json\n",
        "ampgan/tracking/__init__.py": "",
        "ampgan/tracking/tracker.py": "",
    }
    assert violations(graph(_tree(tmp_path / "clean", clean))) == []
    # a lazy import inside a function, two modules away from the loop, is found all the same
    upward = {**clean, "ampgan/training/checkpoint.py": "def f():\n    from ampgan.amp import health\n",
              "ampgan/amp/health.py": "def g():\n    from ..tracking.tracker import x\n"}
    found = violations(graph(_tree(tmp_path / "upward", upward)))
    assert any(v.startswith("the loop never imports tracking") and v.endswith("ampgan.tracking.tracker") for v in found), found
    assert any(v.startswith("amp never imports") for v in found), found
