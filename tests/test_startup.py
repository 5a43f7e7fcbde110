"""What a LOAD moves off SGLang's graph phase: Triton's cache key computed on a thread
(foundry.integrations.common.startup), and SGLang's collections around its capture loop
left out when the warm-ups' bytes are restored (plugin._freeze_gc). Triton is not installed
on CPU machines: a stand-in module plays ``triton.runtime.cache``, and the test says so."""

from __future__ import annotations

import contextlib
import gc
import sys
import threading
import time
import types

import pytest

from foundry.integrations.common import startup
from foundry.integrations.sglang import plugin
from foundry.integrations.sglang.config import PluginConfig


@pytest.fixture
def fake_triton(monkeypatch):
    """A stand-in for triton.runtime.cache (Triton needs a GPU build here): its key
    function records the thread it ran on and waits to be released."""
    ran, release = [], threading.Event()

    def triton_key() -> str:
        ran.append(threading.current_thread().name)
        release.wait(5)
        return "3.6.0-key"

    cache = types.ModuleType("triton.runtime.cache")
    cache.triton_key = triton_key
    for name, module in {"triton": types.ModuleType("triton"), "triton.runtime": types.ModuleType("triton.runtime"),
                         "triton.runtime.cache": cache}.items():  # fmt: skip
        monkeypatch.setitem(sys.modules, name, module)
    return ran, release


def test_the_key_is_computed_on_a_thread_while_the_caller_goes_on(fake_triton):
    ran, release = fake_triton
    prefetch = startup.prefetch_triton_key()
    assert prefetch is not None and prefetch.seconds() is None  # still running: the caller was not held
    release.set()
    prefetch.thread.join(5)
    assert ran == ["foundry-triton-key"] and prefetch.seconds() is not None and prefetch.error is None


def test_without_triton_nothing_is_started(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)  # as if it were not installed
    assert startup.prefetch_triton_key() is None


def test_a_failing_key_is_reported_not_raised():
    prefetch = startup.Prefetch("boom", lambda: 1 / 0)
    prefetch.thread.join(5)
    assert prefetch.error.startswith("ZeroDivisionError")


class Collections:
    """SGLang's freeze_gc as a stand-in original: records that it ran."""

    def __init__(self) -> None:
        self.calls: list[bool] = []

    def __call__(self, enable_cudagraph_gc: bool):
        self.calls.append(enable_cudagraph_gc)
        return contextlib.nullcontext()


def _state(monkeypatch, mode: str, warmup: str, **fields) -> None:
    config = PluginConfig(mode=mode, archive="/a", warmup=warmup)
    monkeypatch.setattr(plugin, "_state", plugin.SchedulerState(config, object(), 0, **fields))


def watched_gc(monkeypatch) -> list[str]:
    """The garbage collector's collect, freeze and unfreeze, recorded in order instead of run."""
    seen: list[str] = []
    monkeypatch.setattr(gc, "collect", lambda *a: seen.append("collect") or 0)
    monkeypatch.setattr(gc, "freeze", lambda: seen.append("freeze"))
    monkeypatch.setattr(gc, "unfreeze", lambda: seen.append("unfreeze"))
    return seen


def test_a_load_restoring_the_warmups_freezes_without_collecting(monkeypatch):
    _state(monkeypatch, "load", "restore")
    original, seen = Collections(), watched_gc(monkeypatch)
    with plugin._freeze_gc(original, False):
        seen.append("capture loop")
    assert seen == ["freeze", "capture loop", "unfreeze"]  # SGLang's freeze kept, its two collections left out
    assert original.calls == [] and plugin._state.skipped_collections


@pytest.mark.parametrize(("mode", "warmup", "gc_choice"), [("load", "replay", None), ("save", "replay", None),
                                                           ("load", "restore", "keep")])  # fmt: skip
def test_sglangs_collections_stay_everywhere_else(monkeypatch, mode, warmup, gc_choice):
    _state(monkeypatch, mode, warmup)
    if gc_choice:
        monkeypatch.setenv("FOUNDRY_SGLANG_GC", gc_choice)
    original = Collections()
    with plugin._freeze_gc(original, False):
        pass
    assert original.calls == [False] and not plugin._state.skipped_collections
    assert plugin._state.collected_before_loop  # SGLang's own collections ran


def test_a_load_restoring_the_warmups_that_follows_saves_trace_collects_before_the_loop_only(monkeypatch):
    # its capture loop makes SAVE's allocations again: garbage left uncollected would move them
    _state(monkeypatch, "load", "restore", placed=[(4096, 512)], follows_trace=True)
    original, seen = Collections(), watched_gc(monkeypatch)
    with plugin._freeze_gc(original, False):
        seen.append("capture loop")
    assert seen == ["collect", "freeze", "capture loop", "unfreeze"] and original.calls == []
    seen.clear()
    with plugin._freeze_gc(original, True):  # SGLang's garbage collection on during capture: no freeze
        seen.append("capture loop")
    assert seen == ["collect", "capture loop"]


def test_skip_all_leaves_out_the_collection_before_a_loop_that_follows_saves_trace(monkeypatch):
    # the trace and the placed blocks are still checked: an allocation that garbage moved refuses
    _state(monkeypatch, "load", "restore", placed=[(4096, 512)], follows_trace=True)
    monkeypatch.setenv("FOUNDRY_SGLANG_GC", "skip-all")
    original, seen = Collections(), watched_gc(monkeypatch)
    with plugin._freeze_gc(original, False):
        seen.append("capture loop")
    assert seen == ["freeze", "capture loop", "unfreeze"] and original.calls == []
    assert plugin._state.skipped_collections and not plugin._state.collected_before_loop


def test_the_report_says_whether_the_collection_before_the_loop_ran(monkeypatch):
    _state(monkeypatch, "load", "restore", placed=[(4096, 512)], follows_trace=True)
    watched_gc(monkeypatch)
    with plugin._freeze_gc(Collections(), False):
        pass
    report = plugin._startup_report()
    assert report["skipped_collections"] and report["collected_before_loop"]


@pytest.mark.parametrize("warmup", ["restore", "replay"])
def test_the_capture_loops_seconds_are_reported_even_when_the_loop_fails(monkeypatch, warmup):
    """What of SGLang's graph phase its capture loops took, the rest being its set-up
    around them; a loop that raises still counts."""
    _state(monkeypatch, "load", warmup)
    watched_gc(monkeypatch)
    with plugin._freeze_gc(Collections(), False):
        time.sleep(0.02)
    first = plugin._state.seconds["capture_loop_s"]
    assert first >= 0.02
    with pytest.raises(RuntimeError), plugin._freeze_gc(Collections(), False):
        time.sleep(0.01)
        raise RuntimeError("a capture failed")
    assert plugin._state.seconds["capture_loop_s"] >= first + 0.01
