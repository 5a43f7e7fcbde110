"""An engine plugin's configuration: what ``foundry run`` set, or a TOML file.

``foundry run --mode save|load --archive DIR -- <server command>`` sets
``FOUNDRY_MODE``, ``FOUNDRY_ARCHIVE`` and the region (:mod:`foundry.env`); a
plugin reads those. Without it, the engine's own variable (``FOUNDRY_SGLANG_CONFIG``,
``FOUNDRY_VLLM_CONFIG``) names a TOML file::

    mode = "load"                  # save | load | off
    archive = "/srv/archives/qwen3"
    region_base = 0x600000000000   # optional: LOAD relocates when it differs from SAVE's
    region_size = 68719476736      # optional, bytes
    warmup = "restore"             # optional, LOAD: skip the engine's warm-up forwards (default "replay")
    jit_caches = true              # optional, LOAD: install the archive's JIT caches (default true)
    trust_cached_code = false      # optional, LOAD: their host code too (default false: code from the archive)

and the plugin itself prepares the processes the engine spawns (the hook
preloaded, the same variables set). Neither: the plugin stays off.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

import msgspec

from foundry.env import RunEnvironment, launched
from foundry.errors import FoundryError


class PluginConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What a plugin does in this process: its mode, archive, region and warm-up."""

    mode: Literal["off", "save", "load"] = "off"
    archive: str | None = None
    region_base: int | None = None
    region_size: int | None = None
    warmup: Literal["replay", "restore"] = "replay"  # LOAD: repeat the engine's warm-up forwards, or skip them
    jit_caches: bool = True  # LOAD: install the archive's JIT caches before the engine spawns its processes
    trust_cached_code: bool = False  # LOAD: their host code too (code taken from the archive then runs)
    from_launcher: bool = False  # set by `foundry run`: the environment is prepared already

    def __post_init__(self) -> None:
        if self.mode != "off" and not self.archive:
            raise FoundryError(f"mode {self.mode} needs an archive", field="archive")
        if self.region_size is not None and self.region_size < 1 << 30:
            raise FoundryError("the region must be at least 1 GiB", field="region_size", found=self.region_size)


def load_config(environ: Mapping[str, str], file: Path | None) -> PluginConfig:
    """The configuration for a process whose environment is ``environ``: the launcher's
    variables when ``foundry run`` set them, else the TOML ``file`` (the engine's
    configuration variable), else off."""
    if launched(environ):
        return _from_launcher(environ)
    if file is None:
        return PluginConfig()
    return _from_file(file)


def _from_launcher(env: Mapping[str, str]) -> PluginConfig:
    run = RunEnvironment.from_env(env)
    archive = None if run.archive is None else str(run.archive)
    return PluginConfig(run.mode, archive, run.region_base, run.region_size, run.load_warmup, from_launcher=True)


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
