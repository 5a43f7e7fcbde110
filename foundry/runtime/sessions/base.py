"""SAVE and LOAD sessions: how a program persists its CUDA graphs and gets them back.

The program runs the same code in every mode; the session decides what
``graph()`` does::

    session = open_session()             # the mode and archive `foundry run` set (foundry.env)
    session.start()                      # before the first CUDA allocation
    ... allocate weights, caches, static inputs ...
    session.warmup(run_every_shape_once)
    graphs = {bs: session.graph(f"decode.bs{bs}", steps[bs], shape_key=bs) for bs in sizes}
    report = session.finish()            # SAVE: write the archive; LOAD: what was restored
    graphs[8].replay(); graphs[8].outputs

- ``off``: a plain capture, for baselines (this module's :class:`Session`, the
  base of the other two; :func:`foundry.runtime.sessions.open.open_session` opens
  the one ``foundry run`` asked for).
- ``save``: :class:`foundry.runtime.sessions.save.SaveSession` — capture (and capture
  again over perturbed leftovers, to find the parameter bytes nobody defined),
  lower with the hook's exact region, and at ``finish`` write the archive.
- ``load``: :class:`foundry.runtime.sessions.load.LoadSession` — no capture. The first
  ``graph()`` checks the warm-up repeated SAVE's allocations, maps the region up
  to SAVE's final offset, binds kernels to images, rebuilds and instantiates
  every graph.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from foundry.env import launched
from foundry.errors import HookError, NoGpuError
from foundry.runtime.native.hook import Hook
from foundry.runtime.sessions.marker import note_session


class Laps:
    """Seconds between successive marks, by name, into a report's dict: where a step's
    time goes (a session's start, a launcher's)."""

    def __init__(self, into: dict[str, Any]) -> None:
        self.into = into
        self._last = time.perf_counter()

    def mark(self, name: str) -> None:
        now = time.perf_counter()
        self.into[name] = now - self._last
        self._last = now


def require_cuda() -> None:
    """Refuse SAVE/LOAD where torch cannot reach a CUDA GPU, naming which part is missing
    (torch, a CUDA build of it, a GPU), before anything of the program's touches CUDA."""
    try:
        import torch
    except ImportError:
        raise NoGpuError("SAVE/LOAD needs a CUDA GPU and torch with CUDA; torch is not installed here") from None
    if torch.version.cuda is None:
        raise NoGpuError(f"SAVE/LOAD needs a CUDA GPU; torch {torch.__version__} here is a CPU-only build")
    if not torch.cuda.is_available():
        raise NoGpuError(f"SAVE/LOAD needs a CUDA GPU; torch {torch.__version__} (CUDA {torch.version.cuda}) "
                         "sees none here")  # fmt: skip


def start_checked(mode: str) -> None:
    """What every SAVE and LOAD session's ``start()`` does first: refuse where torch has no
    CUDA GPU. Started by `foundry run`, that is one line on stderr and exit status 2 (the
    program's own traceback would bury it), noted for the launcher; otherwise
    :class:`NoGpuError`."""
    try:
        require_cuda()
    except NoGpuError as err:
        note_session(mode, refused=str(err))
        if launched():
            print(f"foundry: error: {err}", file=sys.stderr, flush=True)
            raise SystemExit(2) from None
        raise


def init_cuda(device: int) -> None:
    """Create and make current the primary context, as torch would, without allocating."""
    import torch

    torch.cuda.set_device(device)
    torch.cuda.synchronize()


def check_active(hook: Hook) -> None:
    if not hook.active():
        raise HookError("the native hook is loaded but CUDA did not resolve its entry points through it")


def anchor_generator() -> Any:
    """Register the default generator with a graph now, so its seed/offset cells are
    allocated at the same point of the trace in SAVE (where the first capture would
    allocate them) and in LOAD (which never captures): at the first warm-up, before it
    runs, or else before the first capture. Before the warm-up, because a LOAD that
    skips it must make the same allocations of the program's pool up to there."""
    import torch

    anchor = torch.cuda.CUDAGraph()
    anchor.register_generator_state(torch.cuda.default_generators[torch.cuda.current_device()])
    return anchor


class CapturedGraph:
    """A graph captured in this process (modes off and save)."""

    def __init__(self, graph: Any, outputs: Any) -> None:
        self.graph = graph
        self.outputs = outputs

    def replay(self) -> None:
        self.graph.replay()


class RestoredGraph:
    """A graph rebuilt from an archive; replays like ``torch.cuda.CUDAGraph``."""

    def __init__(self, built: Any, outputs: Any, rng: Any = None, pending: Any = None) -> None:
        self.built = built
        self.outputs = outputs
        self.rng = rng
        self.pending = pending  # a PendingExec when instantiation happens behind the program
        self.first_replay: Callable[[], None] | None = None  # called once, before the first replay

    def replay(self) -> None:
        import torch

        if self.first_replay is not None:
            self.first_replay, noted = None, self.first_replay
            noted()
        if self.pending is not None:
            self.pending.ensure()
        if self.rng is not None:
            self.rng.prologue()
        self.built.launch(torch.cuda.current_stream().cuda_stream)


class Session:
    """Mode ``off``: the program's own capture, nothing persisted."""

    mode = "off"

    def __init__(self, *, device: int = 0) -> None:
        if self.mode != "off":  # `foundry run` learns that the program opened its session
            note_session(self.mode)
        self.device = device
        self.pool: Any = None
        self.warmup_pool: Any = None  # torch's MemPool of the warm-ups, from the first one on

    def start(self) -> None:
        init_cuda(self.device)

    def warmup(self, fn: Callable[[], Any]) -> None:
        """Run ``fn``, the program's eager warm-up, with this thread's allocations in a pool of
        their own: what the warm-ups allocate and free never moves the program's own
        allocations between captures, so those land alike whether a LOAD repeats the
        warm-ups or skips them (``foundry.runtime.sessions.placement``)."""
        import torch

        if self.warmup_pool is None:
            self.warmup_pool = torch.cuda.MemPool()
        with torch.cuda.use_mem_pool(self.warmup_pool):
            fn()
        torch.cuda.synchronize()

    def release_warmup_pool(self) -> None:
        """Once the graph phase is over: the warm-ups' pool goes, and torch hands back the
        memory it cached for them (blocks a warm-up kept stay), so the program's later work
        is not short of it."""
        self.warmup_pool = None

    def graph(
        self, name: str, fn: Callable[[], Any], *, shape_key: int | None = None, runner: str | None = None
    ) -> CapturedGraph | RestoredGraph:
        graph, outputs = self._capture(fn)
        return CapturedGraph(graph, outputs)

    def attach(self, backend: str, **objects: Any) -> None:
        """Tell the session about a communicator a backend owns (SAVE records it, LOAD
        validates and relocates against it); a plain capture needs nothing."""

    def complete(self, backend: str, **objects: Any) -> None:
        """Attach ``backend`` again once the graphs exist, with the facts only they give
        (its ``after_graphs``: a pointer table filled after capture)."""

    def finish(self) -> dict[str, Any]:
        return {"mode": self.mode}

    def _capture(self, fn: Callable[[], Any]) -> tuple[Any, Any]:
        import torch

        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph(keep_graph=True)
        with capturing(graph, self.pool):
            outputs = fn()
        torch.cuda.synchronize()
        return graph, outputs


_capture_stream: Any = None


@contextmanager
def capturing(graph: Any, pool: Any) -> Iterator[None]:
    """``torch.cuda.graph`` without its ``empty_cache()``. Handing the allocator's
    cached blocks back to the driver before each capture makes the next eager
    warm-up (engines warm each shape up right before capturing it) allocate afresh:
    a late allocation that a LOAD, which never captures and so never empties the
    cache, would not make again. Captures on one side stream, as torch does."""
    global _capture_stream
    import torch

    torch.cuda.synchronize()
    if _capture_stream is None:
        _capture_stream = torch.cuda.Stream()
    _capture_stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(_capture_stream):
        graph.capture_begin(pool=pool)
        try:
            yield
        finally:
            graph.capture_end()
    torch.cuda.current_stream().wait_stream(_capture_stream)
