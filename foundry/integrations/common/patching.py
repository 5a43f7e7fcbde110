"""Hook points patched in, and the check that every one is in place.

Both plugins patch through :func:`install`: vLLM has no hook registry, and SGLang's
walks every loaded module for each target it patches. A function that other modules
import by name is patched in each module its hook table names (``defined_in``).

The hook types mean what SGLang's ``HookType`` means: ``BEFORE`` runs
``handler(*args, **kwargs)`` first, ``AFTER`` runs ``handler(result, *args,
**kwargs)`` and returns its value unless that is ``None``, ``AROUND`` runs
``handler(original, *args, **kwargs)`` instead. Every patched attribute keeps the
original as ``__wrapped__``.
"""

from __future__ import annotations

import functools
import pkgutil
from collections.abc import Callable, Iterable
from typing import Any

from foundry.errors import FoundryError
from foundry.integrations.common.hookpoints import ENGINE_NAMES, HookPoint


def _resolve(point: HookPoint, engine: str) -> Any:
    try:
        return pkgutil.resolve_name(point.owner)
    except (ImportError, AttributeError, ValueError) as err:
        raise FoundryError(f"a hook point's owner cannot be imported ({type(err).__name__}: {err})",
                           field=f"{engine}.hooks", found=point.target) from None  # fmt: skip


def wrap(point: HookPoint, original: Callable[..., Any], handler: Callable[..., Any]) -> Callable[..., Any]:
    """``original`` with ``handler`` run at ``point`` as its hook type says."""
    if point.hook == "BEFORE":

        def patched(*args: Any, **kwargs: Any) -> Any:
            handler(*args, **kwargs)
            return original(*args, **kwargs)

    elif point.hook == "AFTER":

        def patched(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            replaced = handler(result, *args, **kwargs)
            return result if replaced is None else replaced

    else:

        def patched(*args: Any, **kwargs: Any) -> Any:
            return handler(original, *args, **kwargs)

    return functools.wraps(original)(patched)


def install(points: Iterable[HookPoint], handlers: Any, engine: str) -> None:
    """Patch every point with its handler (an attribute of ``handlers``, the plugin
    module). Every owner is resolved and every original found before the first
    attribute is replaced, so a missing one patches nothing; a point already patched
    (the plugin loaded twice in one process) is left as it is."""
    planned = []
    for point in points:
        owner = _resolve(point, engine)
        original = getattr(owner, point.attribute, None)
        handler = getattr(handlers, point.handler, None)
        if not callable(original) or not callable(handler):
            missing = point.target if not callable(original) else f"{handlers.__name__}.{point.handler}"
            raise FoundryError("a hook point or its handler does not exist", field=f"{engine}.hooks", found=missing)
        planned.append((owner, point, original, handler))
    for owner, point, original, handler in planned:
        if getattr(original, "__foundry_hook__", None) == point.target:
            continue
        patched = wrap(point, original, handler)
        patched.__foundry_hook__ = point.target  # type: ignore[attr-defined]
        setattr(owner, point.attribute, patched)


def check_patched(points: Iterable[HookPoint], engine: str) -> None:
    """Refuse to start a session while a point is not patched (no ``__wrapped__`` there)."""
    for point in points:
        owner = _resolve(point, engine)
        if not hasattr(getattr(owner, point.attribute, None), "__wrapped__"):
            raise FoundryError(f"one of the plugin's hooks is not in place in {ENGINE_NAMES.get(engine, engine)}",
                               field=f"{engine}.hooks", found=point.target)  # fmt: skip
