"""The SGLang plugin's configuration: what ``foundry run`` set, or the TOML file
``FOUNDRY_SGLANG_CONFIG`` names (:mod:`foundry.integrations.common.config`, shared
with the vLLM plugin, says what it holds)."""

from __future__ import annotations

import os
from collections.abc import Mapping

from foundry.env import SGLANG_CONFIG
from foundry.integrations.common import config as shared
from foundry.integrations.common.config import PluginConfig

__all__ = ["PluginConfig", "load_config"]


def load_config(environ: Mapping[str, str] | None = None) -> PluginConfig:
    """The configuration for this process (``environ``: default, this process's environment)."""
    env = os.environ if environ is None else environ
    return shared.load_config(env, SGLANG_CONFIG.read(env))
