"""Per-graph work over an archive's selection, spread over the machine's cores.

``inspect`` and ``lint`` read every graph (size, sha256, typed decoding and the
structure check on each) and reduce it to a few counts. The graphs are independent,
so on a large archive each is read, checked and reduced in a worker process
(forked: the archive and the work with its context are already in memory), and only
the reductions travel back, in the selection's order. Every check runs as it does
in one process; the first graph that fails (in that order) is the error raised,
and the graphs after it are abandoned. A small archive, or one process asked for,
stays in this process.

The workers are plain forks, each with a fixed share of the graphs (every n-th) and
a pipe back: no pool, whose imports, threads and queues cost a command more than a
share of a few dozen similar graphs loses to uneven work.
"""

from __future__ import annotations

import contextlib
import gc
import os
import pickle
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO, NamedTuple, NoReturn, TypeVar

from foundry.archive.reader import Archive
from foundry.archive.schema import GraphEntry

T = TypeVar("T")
#: (rank, entry) -> what one graph contributes; ``context`` is what the work needs besides the archive
Work = Callable[[Archive, Any, int, GraphEntry], T]

PARALLEL_BYTES = 16 << 20  # below this much graph data, forking costs more than it saves
MAX_WORKERS = 8


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
    if not hasattr(os, "fork"):
        return 1
    return max(1, min(workers, len(selection)))


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
    order. ``work`` must be a module-level function; what it returns crosses back by pickle,
    so it should be small. Where no worker can be forked the graphs are read in this process.
    ``meanwhile`` is what this process does while the workers read (a command's imports for
    its output: otherwise they would wait for the last graph); without workers it runs first."""
    count = workers_for(selection, workers)
    pipes = _start(archive, selection, work, context, count) if count > 1 else []
    finished = False
    try:
        if meanwhile is not None:
            meanwhile()
        if pipes:
            for index in range(len(selection)):
                yield _result(pipes[index % len(pipes)])
        else:
            for rank, entry in selection:
                with collector_paused():
                    result = work(archive, context, rank, entry)
                yield result
        finished = True
    finally:
        _stop(pipes, kill=not finished)  # after a failure, the graphs not yet read stay unread


def _start(archive: Archive, selection: list[tuple[int, GraphEntry]], work: Work, context: Any,
           count: int) -> list[_Worker]:  # fmt: skip
    """``count`` forked workers, worker ``w`` reading graphs ``w``, ``w + count``, ... of
    ``selection`` (they inherit the archive and the work with its context) and writing each
    result to its own pipe; none where a process cannot be forked."""
    import foundry.graphir.codec  # noqa: F401  imported once here, not again in every worker

    pipes: list[_Worker] = []
    try:
        for first in range(count):
            read_end, write_end = os.pipe()
            pid = os.fork()
            if pid == 0:  # the worker: it never returns
                for earlier in pipes:  # the parent's ends of the other workers' pipes
                    earlier.results.close()
                os.close(read_end)
                _serve(archive, selection[first::count], work, context, write_end)
            os.close(write_end)
            pipes.append(_Worker(pid, os.fdopen(read_end, "rb")))
    except OSError:
        _stop(pipes, kill=True)
        return []
    return pipes


class _Worker(NamedTuple):
    pid: int
    results: BinaryIO


def _serve(archive: Archive, share: list[tuple[int, GraphEntry]], work: Work, context: Any, fd: int) -> NoReturn:
    """A worker's life: each graph of its share read in turn, its result (or the error that
    stopped it, after which it reads no more) pickled to ``fd``; then it exits, as a forked
    child must, without running what the parent registered for its own exit."""
    code = 0
    try:
        with os.fdopen(fd, "wb") as out, collector_paused():
            for rank, entry in share:
                try:
                    outcome = (True, work(archive, context, rank, entry))
                except Exception as err:  # noqa: BLE001 - raised where the command waits for this graph
                    outcome = (False, err)
                out.write(_pickled(outcome))
                out.flush()
                if not outcome[0]:
                    break
    except BaseException:  # noqa: BLE001 - a pipe closed by the command (it stopped reading): nothing to say
        code = 1
    finally:
        os._exit(code)


def _pickled(outcome: tuple[bool, Any]) -> bytes:
    """``outcome`` as it crosses the pipe; one that cannot be pickled becomes the error saying so."""
    try:
        return pickle.dumps(outcome, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as err:  # noqa: BLE001 - the command raises it in its order, as any other error
        what = "result" if outcome[0] else f"error ({type(outcome[1]).__name__}: {outcome[1]})"
        return pickle.dumps((False, RuntimeError(f"a graph's {what} cannot be sent back: {err}")))


def _result(worker: _Worker) -> Any:
    """The next result of ``worker``, or the error that stopped it raised here."""
    try:
        ok, value = pickle.load(worker.results)
    except EOFError:
        raise RuntimeError(f"a worker reading graphs (pid {worker.pid}) stopped before its last graph") from None
    if not ok:
        raise value
    return value


def _stop(pipes: list[_Worker], *, kill: bool) -> None:
    """Close the workers' pipes and wait for them; ``kill``: stop first those still reading."""
    for worker in pipes:
        worker.results.close()
        if kill:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.pid, signal.SIGKILL)
    for worker in pipes:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(worker.pid, 0)
