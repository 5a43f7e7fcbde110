"""Work an engine's start-up pays once per process, moved off its critical path.

Triton keys every kernel it compiles or finds in its cache with a hash of its own
sources and of ``libtriton.so`` (``triton.runtime.cache.triton_key``, computed once
per process and cached); the process's first Triton launch pays it, about 0.4 s on
the H200 test machine, inside SGLang's graph phase. The hash reads files and feeds
``hashlib``, which lets other threads run, so a thread started when the scheduler
starts has it ready by the time the graph phase launches Triton kernels.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any


def triton_key_function() -> Callable[[], Any] | None:
    """Triton's per-process cache key function, or None where Triton (or that function) is absent."""
    try:
        from triton.runtime.cache import triton_key
    except ImportError:
        return None
    return triton_key


class Prefetch:
    """A function run once on a daemon thread; :meth:`seconds` says how long it took (None while it runs)."""

    def __init__(self, name: str, fn: Callable[[], Any]) -> None:
        self.name = name
        self._fn = fn
        self._took: float | None = None
        self.error: str | None = None
        self.thread = threading.Thread(target=self._run, name=f"foundry-{name}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        begun = time.perf_counter()
        try:
            self._fn()
        except Exception as err:  # noqa: BLE001 - the engine computes it again itself; the report says why
            self.error = f"{type(err).__name__}: {err}"
        self._took = time.perf_counter() - begun

    def seconds(self) -> float | None:
        return self._took


def prefetch_triton_key() -> Prefetch | None:
    """Start computing Triton's cache key on a thread; None where Triton is not installed."""
    key = triton_key_function()
    return None if key is None else Prefetch("triton-key", key)
