"""Where a `_target_` points: the object, or one AmpganError line naming the key and the cause.

Config validation resolves every `_target_` (so a sweep's preflight stops a target that does not
import before any job runs); the build stage and data=custom instantiate them with `instantiate`.
"""

from __future__ import annotations

import importlib
import inspect
import re
from typing import Any

from ampgan import AmpganError, closest


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


def _named_parameters(obj) -> set[str]:
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return set()
    return {n for n, p in sig.parameters.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def instantiate(node: dict, key: str, given: dict[str, Any] | None = None):
    """Build `node` with `hydra.utils.instantiate`, adding those of `given` that the target's
    signature names (not merely `**kwargs`) and the node does not set; any failure is one
    AmpganError line naming `key` (with the closest parameter for a mistyped argument)."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate as hydra_instantiate

    target, obj = node["_target_"], resolve_target(node, key)
    named = _named_parameters(obj)
    extra = {k: v for k, v in (given or {}).items() if k in named and k not in node}
    try:
        return hydra_instantiate(node, **extra)
    except InstantiationException as err:
        cause = err.__cause__ or err
        msg = str(cause).splitlines()[0] if str(cause) else type(cause).__name__
        args = ", ".join(f"{k}={v}" for k, v in {**{k: v for k, v in node.items() if not k.startswith("_")},
                                                 **extra}.items())
        bad = re.search(r"unexpected keyword argument '([^']+)'", msg)
        hint = closest(bad.group(1), named) if bad else ""
        raise AmpganError(f"{key}: {target}({args}) failed: {type(cause).__name__}: {msg}{hint}") from None


def first_line(err: BaseException) -> str:
    """The first line of an error's message that says something (MindSpore's carry banners)."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip() and not ln.startswith("-")]
    return lines[0] if lines else type(err).__name__
