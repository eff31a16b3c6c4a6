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


# ---------------------------------------------------------------- no circles, no private imports
def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of `g` (its strongly connected parts of more than one module), each sorted.
    An import of a package `ampgan.x` from its own submodules is not counted: a package's
    `__init__` loading first is not a circle of roles."""
    edges = {m: {i for i in deps if i in g and i != m and not m.startswith(i + ".")} for m, deps in g.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []
    for root in sorted(edges):   # Tarjan's algorithm, iteratively
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                part = []
                while True:
                    m = stack.pop()
                    part.append(m)
                    if m == node:
                        break
                if len(part) > 1:
                    found.append(sorted(part))
    return found


def private_imports(root: Path, packages: tuple[str, ...]) -> list[str]:
    """`from module import _name` across modules: one module reaching into another's private code."""
    out = []
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in packages:
                    out += [f"{module_name(path, root)}: from {node.module} import {a.name}"
                            for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
    return out


def test_the_package_and_the_experiments_have_no_import_circle():
    assert cycles(graph(ROOT, ("ampgan", "experiments"))) == []


def test_no_module_imports_another_modules_private_functions():
    assert private_imports(ROOT, ("ampgan", "experiments")) == []


def test_a_circle_and_a_private_import_are_found(tmp_path):
    tree = _tree(tmp_path, {
        "ampgan/__init__.py": "",
        "ampgan/training/__init__.py": "",
        "ampgan/training/entry.py": "def f():\n    from ampgan.training import parallel\n",
        "ampgan/training/parallel.py": "def g():\n    from ampgan.training.entry import _hydra_output_dir\n",
        "ampgan/training/loop.py": "from ampgan.training import checkpoint\n",
        "ampgan/training/checkpoint.py": "import ampgan.training\n",
    })
    assert cycles(graph(tree)) == [["ampgan.training.entry", "ampgan.training.parallel"]]
    assert private_imports(tree, ("ampgan",)) == ["ampgan.training.parallel: from ampgan.training.entry import _hydra_output_dir"]


def mlflow_outside_tracking(root: Path, packages: tuple[str, ...]) -> list[str]:
    """Modules outside `ampgan.tracking` that import MLflow themselves (lazy imports included)."""
    out = []
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            name = module_name(path, root)
            if within(name, ("ampgan.tracking",)):
                continue
            out += [f"{name}: {i}" for i in sorted(imports_of(path, name)) if within(i, ("mlflow",))][:1]
    return out


def test_mlflow_is_imported_only_in_tracking():
    assert mlflow_outside_tracking(ROOT, ("ampgan", "experiments")) == []
    assert mlflow_outside_tracking(ROOT, ("ampgan",)) == [] and any(   # the check sees tracking's own imports
        within(i, ("mlflow",)) for i in imports_of(ROOT / "ampgan/tracking/tracker.py", "ampgan.tracking.tracker"))


# a name several modules define for the same job: entry points, each data set's size, and the
# Python API, whose functions are the facade of the modules that do the work
SHARED_NAMES = {"main", "train_size", "train", "diagnose", "loss_scaler", "loss_scale_manager"}


def shared_function_names(root: Path, package: str = "ampgan") -> dict[str, list[str]]:
    """Public top-level functions defined under the same name in several modules."""
    where: dict[str, list[str]] = {}
    for path in sorted((root / package).rglob("*.py")):
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
                where.setdefault(node.name, []).append(module_name(path, root))
    return {name: mods for name, mods in where.items() if len(mods) > 1 and name not in SHARED_NAMES}


def test_no_two_modules_give_one_name_to_two_jobs():
    assert shared_function_names(ROOT) == {}
    # each module behind a `python -m` entry has a name of its own
    for entry in ("search", "report", "sync"):
        assert len(list((ROOT / "ampgan").rglob(f"{entry}.py"))) == 1, entry


STAGES = ("open_case", "framework_check", "run_case_horizon", "reference_for", "analyse", "remedies")


def calls_in(path: Path, function: str) -> list[str]:
    """The names `function` (top level of `path`) calls, in source order, once per call site."""
    node = next(n for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef) and n.name == function)
    calls = [c for c in ast.walk(node) if isinstance(c, ast.Call)]
    names = [c.func.id if isinstance(c.func, ast.Name) else getattr(c.func, "attr", "") for c in calls]
    return [n for _, n in sorted(zip([(c.lineno, c.col_offset) for c in calls], names))]


def test_diagnose_reads_one_way_and_its_command_only_parses_prints_and_logs():
    """Case -> Evidence -> Verdict -> Remedies: the command opens the Case and hands it to the
    pipeline, which enters each stage once, in that order; the command imports no stage itself."""
    diag = ROOT / "ampgan" / "diagnose"
    inside = {m for m in imports_of(diag / "command.py", "ampgan.diagnose.command") if m.startswith("ampgan.")}
    assert {m.rpartition(".")[0] if m.count(".") > 2 else m for m in inside} == {
        "ampgan.diagnose", "ampgan.diagnose.case", "ampgan.diagnose.pipeline", "ampgan.diagnose.verdict_report"}
    command = [n for n in calls_in(diag / "command.py", "diagnose") if n in ("open_case", "diagnose_case", "terminal", "publish")]
    assert command == ["open_case", "diagnose_case", "terminal", "publish"]
    stages = [n for n in calls_in(diag / "pipeline.py", "diagnose_case") if n in STAGES]
    assert stages == ["framework_check", "run_case_horizon", "reference_for", "analyse", "remedies"]
    remedies = [n for n in calls_in(diag / "pipeline.py", "remedies")
                if n in ("search_keep_list", "candidates", "verify_fixes", "confirm", "unconfirmed", "prove_seeds")]
    assert remedies == ["search_keep_list", "candidates", "verify_fixes", "confirm", "unconfirmed", "prove_seeds"]
    # the stages after the Case never re-read the raw config to validate the run itself
    for name in ("pipeline.py", "analysis.py", "verify.py", "fp32_set_search.py"):
        text = (diag / name).read_text()
        assert "validate(cfg)" not in text and "validate(case.cfg)" not in text, name
