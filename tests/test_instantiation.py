"""PendingExec: a restored graph instantiated once, by whichever thread asks first.

This machine has no CUDA driver, so the instantiation is a function the test
passes in; the real one (the driver's cuGraphInstantiate) runs in the GPU tests
(tests/test_gpu_session.py, background instantiation)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from foundry.errors import DriverError, FoundryError
from foundry.runtime.instantiation import PendingExec


def test_two_threads_instantiate_a_graph_once():
    calls = []

    def slow(graph):
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

    def failing(graph):
        calls.append(graph)
        raise DriverError("cuGraphInstantiate failed: CUDA_ERROR_OUT_OF_MEMORY", found=2)

    pending = PendingExec("decode.bs8", SimpleNamespace(graph="g", exec=None), instantiate=failing)
    for _ in range(2):
        with pytest.raises(FoundryError, match="could not be instantiated: cuGraphInstantiate failed") as err:
            pending.ensure()
        assert err.value.path == "decode.bs8"
    assert calls == ["g"]  # not retried: the background thread's error is the one replays see
