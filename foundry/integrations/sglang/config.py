"""The plugin's configuration: what ``foundry run`` set, or a TOML file.

``foundry run --mode save|load --archive DIR -- python -m sglang.launch_server ...``
sets ``FOUNDRY_MODE``, ``FOUNDRY_ARCHIVE`` and the region; the plugin reads
those. Without it, ``FOUNDRY_SGLANG_CONFIG`` names a TOML file::

    mode = "load"                  # save | load | off
    archive = "/srv/archives/qwen3"
    region_base = 0x600000000000   # optional: LOAD relocates when it differs from SAVE's
    region_size = 68719476736      # optional, bytes
    warmup = "restore"             # optional, LOAD: skip SGLang's warm-up forwards (default "replay")

and the plugin itself prepares the scheduler processes SGLang spawns (the hook
preloaded, the same variables set). Neither: the plugin stays off.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

import msgspec

from foundry.errors import FoundryError
from foundry.runtime.sessions.base import MODES, WARMUP_MODES

CONFIG_VARIABLE = "FOUNDRY_SGLANG_CONFIG"


class PluginConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    mode: Literal["off", "save", "load"] = "off"
    archive: str | None = None
    region_base: int | None = None
    region_size: int | None = None
    warmup: Literal["replay", "restore"] = "replay"  # LOAD: repeat SGLang's warm-up forwards, or skip them
    from_launcher: bool = False  # set by `foundry run`: the environment is prepared already

    def __post_init__(self) -> None:
        if self.mode != "off" and not self.archive:
            raise FoundryError(f"mode {self.mode} needs an archive", field="archive")
        if self.region_size is not None and self.region_size < 1 << 30:
            raise FoundryError("the region must be at least 1 GiB", field="region_size", found=self.region_size)


def load_config(environ: Mapping[str, str] | None = None) -> PluginConfig:
    """The configuration for this process (see the module docstring)."""
    env = os.environ if environ is None else environ
    if env.get("FOUNDRY_MODE"):
        return _from_launcher(env)
    path = env.get(CONFIG_VARIABLE)
    if not path:
        return PluginConfig()
    return _from_file(Path(path))


def _from_launcher(env: Mapping[str, str]) -> PluginConfig:
    def number(name: str) -> int | None:
        text = env.get(name)
        if not text:
            return None
        try:
            return int(text, 0)
        except ValueError:
            raise FoundryError("not a number", field=name, found=text) from None

    mode = env["FOUNDRY_MODE"]
    if mode not in MODES:
        raise FoundryError("unknown mode", field="FOUNDRY_MODE", expected=list(MODES), found=mode)
    warmup = env.get("FOUNDRY_LOAD_WARMUP", "replay")
    if warmup not in WARMUP_MODES:
        raise FoundryError("unknown warm-up mode", field="FOUNDRY_LOAD_WARMUP", expected=list(WARMUP_MODES),
                           found=warmup)  # fmt: skip
    return PluginConfig(mode, env.get("FOUNDRY_ARCHIVE"), number("FOUNDRY_REGION_BASE"), number("FOUNDRY_REGION_SIZE"),
                        warmup, from_launcher=True)  # fmt: skip


def _from_file(path: Path) -> PluginConfig:
    try:
        data = tomllib.loads(path.read_text())
    except OSError as err:
        raise FoundryError(f"cannot read the plugin configuration: {err.strerror}", path=str(path)) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise FoundryError(f"the plugin configuration is not TOML: {err}", path=str(path)) from None
    if "from_launcher" in data:
        raise FoundryError("unknown setting", path=str(path), field="from_launcher")
    try:
        return msgspec.convert(data, PluginConfig)
    except msgspec.ValidationError as err:
        raise FoundryError(f"invalid plugin configuration: {err}", path=str(path)) from None
