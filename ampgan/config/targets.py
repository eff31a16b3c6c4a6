"""Where a `_target_` points: the object, or one AmpganError line naming the key and the cause.

Config validation resolves every `_target_` (so a sweep's preflight stops a target that does not
import before any job runs); the build stage instantiates them (ampgan.tasks.targets).
"""

from __future__ import annotations

import importlib
from typing import Any

from ampgan import AmpganError


def locate(path: str):
    """The object a dotted `_target_` path names: the longest importable module prefix, then
    attributes. An error inside the user's module (a missing dependency, a syntax error) is raised
    as it is, not taken for a shorter path."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            obj = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name is not None and (err.name == module_name or module_name.startswith(err.name + ".")):
                continue  # this prefix is no module: try a shorter one
            raise
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(f"No module named '{parts[0]}'", name=parts[0])


def resolve_target(node: Any, key: str):
    target = node.get("_target_") if isinstance(node, dict) else None
    if not isinstance(target, str) or not target:
        raise AmpganError(f"{key}: needs a _target_ (a dotted path such as mypkg.nets.Net), got {node!r}")
    try:
        return locate(target)
    except Exception as err:  # noqa: BLE001 - the user's module: one line with its reason
        hint = "; put its package on PYTHONPATH or install it" if isinstance(err, ModuleNotFoundError) else ""
        raise AmpganError(f"{key}._target_={target}: cannot import it ({type(err).__name__}: "
                          f"{first_line(err)}){hint}") from None


def first_line(err: BaseException) -> str:
    """The first line of an error's message that says something (MindSpore's carry banners)."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip() and not ln.startswith("-")]
    return lines[0] if lines else type(err).__name__
