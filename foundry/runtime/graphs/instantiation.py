"""Instantiating restored graphs behind the program's back.

The driver's instantiation is the largest part of a LOAD (about 9.6 ms per
1,850-node graph on the H200 test machine) and it serialises: more threads do
not shorten it. With ``--instantiate background`` LOAD returns its graphs built
but not yet instantiated, and one thread instantiates them in archive order
while the program goes on (loading weights, starting its server). A graph
replayed before its turn is instantiated on the spot by the replaying thread;
the two never instantiate the same graph, and an error is raised at that
graph's replay, naming it. ``wait()`` joins the thread and raises the first
error, so that a session's report counts every instantiation.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from foundry.errors import FoundryError
from foundry.graphir.cuda import cu


def in_context(context: Any) -> Callable[[Any, int], Any]:
    """Instantiate (graph, flags) in ``context``, the session's, whatever the calling thread
    has current (a replay may come from a thread that never entered it)."""

    def instantiate(graph: Any, flags: int) -> Any:
        cu("cuCtxPushCurrent", context)
        try:
            return cu("cuGraphInstantiate", graph, flags)
        finally:
            cu("cuCtxPopCurrent")

    return instantiate


class PendingExec:
    """One built graph's instantiation: done once, by whichever thread asks first.

    ``instantiate`` makes the exec from the graph and ``flags`` (:func:`in_context` on a GPU)."""

    def __init__(self, name: str, built: Any, instantiate: Callable[[Any, int], Any], flags: int = 0) -> None:
        self.name = name
        self.built = built  # a BuiltGraph whose exec is None until instantiated
        self.flags = flags
        self.error: FoundryError | None = None
        self._instantiate = instantiate
        self._lock = threading.Lock()

    def ensure(self) -> None:
        """Instantiate now unless done; raise the error the instantiation met, if any."""
        if self.built.exec is None:
            with self._lock:
                if self.built.exec is None and self.error is None:
                    try:
                        self.built.exec = self._instantiate(self.built.graph, self.flags)
                    except FoundryError as err:
                        self.error = err
        if self.error is not None:
            raise FoundryError(f"the graph could not be instantiated: {self.error.message}", path=self.name)


class BackgroundInstantiation:
    """Instantiate ``pending`` on one thread, in order. The thread is not a daemon: a
    program that exits without ``finish()`` waits for it rather than tearing the
    driver down under an instantiation."""

    def __init__(self, pending: Sequence[PendingExec]) -> None:
        self.pending = list(pending)
        self.started = time.perf_counter()
        self.finished: float | None = None
        self._failure: BaseException | None = None  # what stopped the thread, other than a graph's own error
        self._thread = threading.Thread(target=self._run, name="foundry-instantiate")
        self._thread.start()

    def _run(self) -> None:
        try:
            for item in self.pending:
                with contextlib.suppress(FoundryError):  # kept on the item: its replay and wait() raise it
                    item.ensure()
        except BaseException as err:  # noqa: BLE001 - handed to wait(), which raises it
            self._failure = err
        finally:
            self.finished = time.perf_counter()

    def wait(self) -> float:
        """Join the thread and raise what stopped it or the first instantiation error;
        return when it finished (``time.perf_counter``)."""
        self._thread.join()
        if self._failure is not None:
            raise self._failure
        for item in self.pending:
            item.ensure()
        assert self.finished is not None  # set in _run's finally
        return self.finished
