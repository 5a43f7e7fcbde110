"""What of a server must match between SAVE and LOAD, compared by field.

A plugin records, in the archive's catalog (``model``), every setting that shapes
memory or chooses kernels as ``<engine>.<name>`` -> its value as JSON text; a LOAD
computes the same record from its live server and refuses the first entry that
differs, naming it and every other one that differs too.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from foundry.errors import DriftError


def check_fields(recorded: Mapping[str, str], live: Mapping[str, str]) -> None:
    """Refuse ``live`` when an entry differs from SAVE's record: the field is the first
    that differs, the message names every one (a batch-size change also changes the
    resolved graph configuration beside it)."""
    differing = [key for key, value in live.items() if recorded.get(key) != value]
    if differing:
        key = differing[0]
        saved = recorded.get(key)
        also = f" (also {', '.join(differing[1:])})" if differing[1:] else ""
        raise DriftError(f"the live server differs from SAVE's in {key}{also}", field=key,
                         expected=saved if saved is not None else "(not recorded)", found=live[key])  # fmt: skip


def config_digest(config: Any) -> str:
    """sha256 of a model's configuration (a transformers config, or anything with a stable repr)."""
    text = config.to_json_string(use_diff=False) if hasattr(config, "to_json_string") else repr(config)
    return hashlib.sha256(text.encode()).hexdigest()


def value_text(value: Any) -> str:
    """A setting's value as JSON text that two processes write alike: enums by name,
    sets sorted, dataclasses field by field, and objects with no stable text by
    their type's name (never a repr holding a process's address)."""
    return json.dumps(_plain(value), sort_keys=True)


def _plain(value: Any, depth: int = 0) -> Any:
    if depth > 16:
        return "..."
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, Mapping):
        return {str(k): _plain(v, depth + 1) for k, v in value.items()}
    if isinstance(value, set | frozenset):
        return sorted((_plain(v, depth + 1) for v in value), key=repr)
    if isinstance(value, list | tuple):
        return [_plain(v, depth + 1) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: _plain(getattr(value, f.name, None), depth + 1) for f in dataclasses.fields(value)}
        return {"type": type(value).__name__, **fields}
    text = str(value)
    return f"<{type(value).__name__}>" if " at 0x" in text or text.startswith("<") else text
