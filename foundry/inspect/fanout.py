"""Per-graph work over an archive's selection, spread over the machine's cores.

``inspect`` and ``lint`` read every graph (size, sha256, typed decoding and the
structure check on each) and reduce it to a few counts. The graphs are independent,
so on a large archive each is read, checked and reduced in a worker process
(forked: the archive and the work with its context are already in memory), and only
the reductions travel back, in the selection's order. Every check runs as it does
in one process; the first graph that fails (in that order) is the error raised,
and the graphs after it are abandoned. A small archive, or one process asked for,
stays in this process.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from foundry.archive.reader import Archive
from foundry.archive.schema import GraphEntry

T = TypeVar("T")
#: (rank, entry) -> what one graph contributes; ``context`` is what the work needs besides the archive
Work = Callable[[Archive, Any, int, GraphEntry], T]

PARALLEL_BYTES = 16 << 20  # below this much graph data, forking costs more than it saves
MAX_WORKERS = 8

_shared: tuple[Archive, Any, Work, list[tuple[int, GraphEntry]]] | None = None  # what forked workers inherit


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def workers_for(selection: list[tuple[int, GraphEntry]], workers: int | None = None) -> int:
    """How many processes read ``selection``: ``workers`` if given, else one per core (up to
    :data:`MAX_WORKERS`) when the selection holds :data:`PARALLEL_BYTES` or more, else one."""
    if workers is None:
        big = sum(entry.size for _, entry in selection) >= PARALLEL_BYTES
        workers = min(cores(), MAX_WORKERS) if big else 1
    if "fork" not in multiprocessing.get_all_start_methods():
        return 1
    return max(1, min(workers, len(selection)))


def _run(index: int) -> Any:
    assert _shared is not None  # set before the workers were forked
    archive, context, work, selection = _shared
    rank, entry = selection[index]
    with collector_paused():
        return work(archive, context, rank, entry)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while graphs are read: decoding one makes hundreds of
    thousands of containers, none in a cycle (refcounting frees them), and the collector would
    walk them again and again (a tenth of the reading time). Only in a process of one thread (a
    command, a worker): the collector is the whole process's, and an application's other
    threads (the TUI's) would pay for the pause with a full collection afterwards."""
    if not gc.isenabled() or threading.active_count() > 1:
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def map_graphs(archive: Archive, selection: list[tuple[int, GraphEntry]], work: Work, context: Any = None, *,
               workers: int | None = None, meanwhile: Callable[[], object] | None = None) -> Iterator[T]:  # fmt: skip
    """``work(archive, context, rank, entry)`` for every pair of ``selection``, yielded in its
    order. ``work`` must be a module-level function (workers find it by name); what it returns
    crosses back by pickle, so it should be small. Where no worker can be started (no fork,
    no semaphores in a container) the graphs are read in this process. ``meanwhile`` is what
    this process does while the workers read (a command's imports for its output: otherwise
    they would wait for the last graph); without workers it runs first."""
    global _shared
    count = workers_for(selection, workers)
    pool, futures = _start(archive, selection, work, context, count) if count > 1 else (None, [])
    if meanwhile is not None:
        meanwhile()
    if pool is None:
        for rank, entry in selection:
            with collector_paused():
                result = work(archive, context, rank, entry)
            yield result
        return
    try:
        for future in futures:
            yield future.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # after a failure, the graphs not yet read stay unread
        _shared = None


def _start(archive: Archive, selection: list[tuple[int, GraphEntry]], work: Work, context: Any,
           count: int) -> tuple[Any, list[Any]]:  # fmt: skip
    """``count`` forked workers with every graph of ``selection`` submitted, or ``(None, [])``."""
    from concurrent.futures import ProcessPoolExecutor  # imported here: most runs never fork

    import foundry.graphir.codec  # noqa: F401  imported once here, not again in every worker

    global _shared
    _shared = (archive, context, work, selection)  # what the workers inherit when they are forked
    pool = None
    try:
        pool = ProcessPoolExecutor(max_workers=count, mp_context=multiprocessing.get_context("fork"))
        return pool, [pool.submit(_run, index) for index in range(len(selection))]
    except OSError:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        _shared = None
        return None, []
