"""Opening the session ``foundry run`` asked for (foundry/runtime/sessions/open.py)."""

from __future__ import annotations

import pytest

from foundry.errors import FoundryError
from foundry.runtime.launch import launcher
from foundry.runtime.sessions.base import Session
from foundry.runtime.sessions.open import load_options, open_session

from .conftest import SAVE_A


def test_load_options_read_the_instantiation_mode(monkeypatch, with_hook):
    monkeypatch.delenv("FOUNDRY_INSTANTIATE", raising=False)
    assert load_options()["instantiate"] == "now"
    monkeypatch.setenv("FOUNDRY_INSTANTIATE", "background")
    assert load_options()["instantiate"] == "background"
    env = launcher.environment(launcher.RunConfig("load", SAVE_A, builder="native", instantiate="background"),
                               base_env={})  # fmt: skip
    assert env["FOUNDRY_INSTANTIATE"] == "background" and env["FOUNDRY_BUILDER"] == "native"


def test_open_session_reads_the_launcher_environment(monkeypatch):
    monkeypatch.delenv("FOUNDRY_MODE", raising=False)
    assert type(open_session()) is Session
    monkeypatch.setenv("FOUNDRY_MODE", "bogus")
    with pytest.raises(FoundryError, match="unknown mode"):
        open_session()
    monkeypatch.setenv("FOUNDRY_MODE", "save")
    monkeypatch.delenv("FOUNDRY_ARCHIVE", raising=False)
    with pytest.raises(FoundryError, match="FOUNDRY_ARCHIVE"):
        open_session()
