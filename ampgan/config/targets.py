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


def import_object(path: str):
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
        return import_object(target)
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
    AmpganError line naming `key` (with the closest parameter for a mistyped argument).

    The given values reach the target as they are (a tuple stays a tuple: Hydra would wrap
    them in its config types). A `_partial_: true` node gives a partial with them bound."""
    import functools

    from hydra.errors import InstantiationException
    from hydra.utils import instantiate as hydra_instantiate

    named = _named_parameters(resolve_target(node, key))
    extra = {k: v for k, v in (given or {}).items() if k in named and k not in node}
    try:
        build = hydra_instantiate({**node, "_partial_": True})
        return functools.partial(build, **extra) if node.get("_partial_") else build(**extra)
    except Exception as err:  # noqa: BLE001 - the user's target: one line with its reason
        cause = (err.__cause__ or err) if isinstance(err, InstantiationException) else err
        raise call_failed(key, node, cause, extra) from None


def call_failed(key: str, node: dict, err: BaseException, extra: dict | None = None, first: str = "") -> AmpganError:
    """The one line for a target whose call failed: `key: target(first, args) failed: Error: reason`,
    with the closest parameter for a mistyped argument."""
    msg = first_line(err) if str(err) else type(err).__name__
    args = [first] if first else []
    args += [f"{k}={v}" for k, v in {**{k: v for k, v in node.items() if not k.startswith("_")}, **(extra or {})}.items()]
    bad = re.search(r"unexpected keyword argument '([^']+)'", msg)
    hint = closest(bad.group(1), _named_parameters(resolve_target(node, key))) if bad else ""
    return AmpganError(f"{key}: {node['_target_']}({', '.join(args)}) failed: {type(err).__name__}: {msg}{hint}")


def first_line(err: BaseException) -> str:
    """The first line of an error's message that says something (MindSpore's carry banners)."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip() and not ln.startswith("-")]
    return lines[0] if lines else type(err).__name__
