"""LoadSession on the CPU (foundry/runtime/sessions/load.py): the refusals it makes before
any GPU work, on the H200 SAVE."""

from __future__ import annotations

import time

import pytest

from foundry.archive import Archive
from foundry.errors import DriftError, FoundryError
from foundry.runtime.sessions.load import LoadSession

from .conftest import FIXTURES, SAVE_A


def test_restoring_warmup_bytes_needs_them_in_the_archive():
    with pytest.raises(DriftError) as err:
        LoadSession(SAVE_A, warmup="restore")
    assert err.value.field == "region.warmup_bytes"
    with pytest.raises(FoundryError, match="unknown warm-up mode"):
        LoadSession(SAVE_A, warmup="sometimes")


def test_a_load_session_takes_an_archive_its_caller_opened():
    """The SGLang plugin reads SAVE's verdict before the session starts, and hands the
    session the archive it opened rather than having it read the catalog again."""
    opened = Archive.open(SAVE_A)
    session = LoadSession(opened)
    assert session.archive is opened and session.record == opened.session(0)
    assert session.report["archive"] == LoadSession(SAVE_A).report["archive"] == str(opened.root)
    with pytest.raises(DriftError) as err:
        LoadSession(opened, warmup="restore")
    assert err.value.field == "region.warmup_bytes"


def test_background_instantiation_is_asked_for_with_the_native_builder():
    with pytest.raises(FoundryError, match="unknown instantiation mode") as err:
        LoadSession(SAVE_A, builder="native", instantiate="later")
    assert err.value.field == "instantiate"
    with pytest.raises(FoundryError, match="needs the native builder") as err:
        LoadSession(SAVE_A, instantiate="background")
    assert err.value.field == "instantiate"
    assert LoadSession(SAVE_A, builder="native", instantiate="background").instantiate == "background"


def test_a_relocating_load_replays_the_warmup():
    """Restored warm-up bytes can hold pointers into SAVE's region, which nothing rebases."""
    with pytest.raises(DriftError, match="relocating needs"):
        LoadSession(FIXTURES / "saveload-a", relocate=True, warmup="restore")


def test_laps_name_where_a_step_s_time_went():
    from foundry.runtime.sessions.base import Laps

    steps: dict[str, float] = {}
    laps = Laps(steps)
    time.sleep(0.05)
    laps.mark("slow")
    laps.mark("quick")
    assert list(steps) == ["slow", "quick"] and steps["slow"] >= 0.05 > steps["quick"] >= 0


def test_an_archive_without_backend_state_has_the_backends_entry_points_read_on_a_thread():
    """Off the program's path at the session's opening, and importing nothing there (a
    backend's imports could race the program's); the claim checks get the registry a
    discovery made there and then would give."""
    from importlib.metadata import EntryPoint

    from foundry.backends.registry import BackendRegistry

    session = LoadSession(SAVE_A)
    assert not session.record.backends and session.backends == [] and session._discovering is not None
    read = session._discovering.result()
    assert read and all(isinstance(ep, EntryPoint) for ep in read)
    assert [ep.name for ep in read] == sorted(ep.name for ep in read)
    found = session.registry  # loaded here, on the thread that asks
    assert sorted(found.backends) == sorted(BackendRegistry.discover().backends) and not found.broken
    assert session.registry is found  # loaded once
