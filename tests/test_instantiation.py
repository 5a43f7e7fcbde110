"""PendingExec and BackgroundInstantiation: a restored graph instantiated once, by
whichever thread asks first; the background thread's errors reach its waiter.

This machine has no CUDA driver, so the instantiation is a function the test
passes in; the real one (the driver's cuGraphInstantiate, in the session's
context) runs in the GPU tests (tests/test_gpu_session.py, background instantiation)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from foundry.errors import DriverError, FoundryError
from foundry.runtime.graphs.instantiation import BackgroundInstantiation, PendingExec


def test_two_threads_instantiate_a_graph_once():
    calls = []

    def slow(graph, flags):
        calls.append(graph)
        time.sleep(0.05)  # the second thread arrives while the first instantiates
        return f"exec of {graph}"

    built = SimpleNamespace(graph="g", exec=None)
    pending = PendingExec("decode.bs1", built, instantiate=slow)
    threads = [threading.Thread(target=pending.ensure) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == ["g"] and built.exec == "exec of g"
    pending.ensure()  # done: no second call
    assert calls == ["g"]


def test_a_failed_instantiation_is_raised_at_every_replay_naming_the_graph():
    calls = []

    def failing(graph, flags):
        calls.append(graph)
        raise DriverError("cuGraphInstantiate failed: CUDA_ERROR_OUT_OF_MEMORY", found=2)

    pending = PendingExec("decode.bs8", SimpleNamespace(graph="g", exec=None), instantiate=failing)
    for _ in range(2):
        with pytest.raises(FoundryError, match="could not be instantiated: cuGraphInstantiate failed") as err:
            pending.ensure()
        assert err.value.path == "decode.bs8"
    assert calls == ["g"]  # not retried: the background thread's error is the one replays see


def test_the_graph_is_instantiated_with_the_flags_save_recorded():
    seen = []
    built = SimpleNamespace(graph="g", exec=None)
    PendingExec("decode.bs1", built, lambda graph, flags: seen.append(flags) or "exec", flags=9).ensure()
    assert seen == [9] and built.exec == "exec"


def _pending(names, instantiate):
    return [PendingExec(name, SimpleNamespace(graph=name, exec=None), instantiate) for name in names]


def test_the_background_thread_instantiates_every_graph_in_order():
    order = []
    pending = _pending(["decode.bs1", "decode.bs2", "sample.bs8"], lambda graph, flags: order.append(graph) or graph)
    background = BackgroundInstantiation(pending)
    finished = background.wait()
    assert order == ["decode.bs1", "decode.bs2", "sample.bs8"]
    assert [p.built.exec for p in pending] == order and finished >= background.started


def test_wait_raises_a_graph_error_and_what_stopped_the_thread():
    def fails_on_bs2(graph, flags):
        if graph == "decode.bs2":
            raise DriverError("cuGraphInstantiate failed: CUDA_ERROR_INVALID_VALUE", found=1)
        return graph

    background = BackgroundInstantiation(_pending(["decode.bs1", "decode.bs2", "decode.bs4"], fails_on_bs2))
    with pytest.raises(FoundryError, match="could not be instantiated") as err:
        background.wait()
    assert err.value.path == "decode.bs2"
    assert background.pending[2].built.exec == "decode.bs4"  # the thread went on past the failed graph

    def broken(graph, flags):
        raise RuntimeError("Failed to dlopen libcuda.so.1")

    stopped = BackgroundInstantiation(_pending(["decode.bs1"], broken))
    with pytest.raises(RuntimeError, match="dlopen"):
        stopped.wait()
    assert stopped.finished is not None
