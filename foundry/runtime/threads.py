"""Work a LOAD starts on a thread of its own and collects later (a future)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


def on_thread(name: str, fn: Callable[..., T], *args: Any) -> Future[T]:
    """``fn(*args)`` on a new thread named ``name``; the future gives its result or raises its
    error. The thread ends with the work: nothing waits for it but the future's reader."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
    future = pool.submit(fn, *args)
    pool.shutdown(wait=False)
    return future
