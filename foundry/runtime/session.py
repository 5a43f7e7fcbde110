"""SAVE and LOAD sessions: how a program persists its CUDA graphs and gets them back.

The program runs the same code in every mode; the session decides what
``graph()`` does::

    session = open_session()             # FOUNDRY_MODE / FOUNDRY_ARCHIVE, as `foundry run` sets them
    session.start()                      # before the first CUDA allocation
    ... allocate weights, caches, static inputs ...
    session.warmup(run_every_shape_once)
    graphs = {bs: session.graph(f"decode.bs{bs}", steps[bs], shape_key=bs) for bs in sizes}
    report = session.finish()            # SAVE: write the archive; LOAD: what was restored
    graphs[8].replay(); graphs[8].outputs

- ``off``: a plain capture, for baselines.
- ``save``: capture (twice: the second lower on a poisoned stack, which finds
  the parameter bytes nobody defined), lower to IR with exact regions from the
  hook, and at ``finish`` write the archive with images, device globals, the
  allocation trace and, if asked, the warm-up's bytes.
- ``load``: no capture. The first ``graph()`` checks the warm-up repeated SAVE's
  allocations, maps the region up to SAVE's final offset, binds kernels to
  images, rebuilds every graph (one template per topology) and instantiates it.
"""

from __future__ import annotations

import ctypes
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from foundry.archive.reader import Archive
from foundry.archive.schema import (
    AllocationRecord,
    GraphEntry,
    ImageRecord,
    RegionRecord,
    RngRecord,
    WarmupBytes,
)
from foundry.archive.writer import ArchiveWriter
from foundry.cuda import cu
from foundry.errors import CaptureError, DriftError, FoundryError, HookError
from foundry.graphir.graph import GraphIR
from foundry.graphir.regions import Region, RegionKind
from foundry.runtime.hook import Allocation, Hook

MODES = ("off", "save", "load")
WARMUP_MODES = ("replay", "restore")
BUILDERS = ("python", "native")  # native: foundry.runtime.native_build (not yet validated on a GPU)
WARMUP_FILE = "warmup.bin"
# (stack shift, fill pattern) of the extra captures that find undefined parameter bytes
PROBES = ((40_976, 0xA5), (90_128, 0x5A))


def _init_cuda(device: int) -> None:
    """Create and make current the primary context, as torch would, without allocating."""
    import torch

    torch.cuda.set_device(device)
    torch.cuda.synchronize()


def _check_active(hook: Hook) -> None:
    if not hook.active():
        raise HookError("the native hook is loaded but CUDA did not resolve its entry points through it")


def _anchor_generator() -> Any:
    """Register the default generator with a graph now, so its seed/offset cells are
    allocated at the same point of the trace in SAVE (where the first capture would
    allocate them) and in LOAD (which never captures)."""
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

    def __init__(self, built: Any, outputs: Any, rng: Any = None) -> None:
        self.built = built
        self.outputs = outputs
        self.rng = rng

    def replay(self) -> None:
        import torch

        if self.rng is not None:
            self.rng.prologue()
        self.built.launch(torch.cuda.current_stream().cuda_stream)


class Session:
    """Mode ``off``: the program's own capture, nothing persisted."""

    mode = "off"

    def __init__(self, *, device: int = 0) -> None:
        self.device = device
        self.pool: Any = None

    def start(self) -> None:
        _init_cuda(self.device)

    def warmup(self, fn: Callable[[], Any]) -> None:
        import torch

        fn()
        torch.cuda.synchronize()

    def graph(
        self, name: str, fn: Callable[[], Any], *, shape_key: int | None = None, runner: str | None = None
    ) -> CapturedGraph | RestoredGraph:
        graph, outputs = self._capture(fn)
        return CapturedGraph(graph, outputs)

    def finish(self) -> dict[str, Any]:
        return {"mode": self.mode}

    def _capture(self, fn: Callable[[], Any]) -> tuple[Any, Any]:
        import torch

        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph(keep_graph=True)
        with torch.cuda.graph(graph, pool=self.pool):
            outputs = fn()
        torch.cuda.synchronize()
        return graph, outputs


class SaveSession(Session):
    """Mode ``save``: capture, lower and write the archive at :meth:`finish`."""

    mode = "save"

    def __init__(
        self,
        archive: str | Path,
        *,
        device: int = 0,
        rank: int = 0,
        world_size: int = 1,
        model: dict[str, str] | None = None,
        probes: int = len(PROBES),
        keep_warmup_bytes: bool = True,
    ) -> None:
        super().__init__(device=device)
        self.path = Path(archive)
        self.rank, self.world_size, self.model = rank, world_size, dict(model or {})
        self.probes, self.keep_warmup_bytes = probes, keep_warmup_bytes
        self.entries: list[tuple[GraphIR, dict[str, Any]]] = []
        self.warmup_start: tuple[int, int] | None = None  # (allocations, cursor) when the warm-up began
        self.warmup_end: tuple[int, int] | None = None
        self.warmup_data: bytes | None = None
        self.generator_offset: int | None = None
        self.undefined_bytes = 0
        self.timings: dict[str, float] = {"capture_s": 0.0, "probe_s": 0.0, "lower_s": 0.0}

    def start(self) -> None:
        from foundry.runtime.environment import current_environment

        self.hook = Hook.attach()
        if self.hook.region().mode != "save":
            raise HookError("the hook is not in save mode (start the program with `foundry run --mode save`)")
        _init_cuda(self.device)
        _check_active(self.hook)
        self.hook.reserve()
        self.hook.set_owner()
        self.environment = current_environment(self.device)
        info = self.hook.region()
        self.region = Region("vmm", RegionKind.VMM, info.base, info.size)

    def warmup(self, fn: Callable[[], Any]) -> None:
        info = self.hook.region()
        self.warmup_start = (info.allocations, info.cursor)
        super().warmup(fn)

    def graph(
        self, name: str, fn: Callable[[], Any], *, shape_key: int | None = None, runner: str | None = None
    ) -> CapturedGraph:
        from foundry.runtime.capture import describe_outputs
        from foundry.runtime.rng import measure_increment, philox_cells

        if self.warmup_end is None:
            self._begin_capturing()
        started = time.perf_counter()
        graph, outputs = self._capture(fn)
        self.timings["capture_s"] += time.perf_counter() - started
        ir = self._lower(graph, name)
        if self.probes:
            ir = self._mark_undefined(ir, name, fn)
        rng = None
        cells = philox_cells(ir)
        if cells is not None:
            rng = RngRecord(cells[1], cells[2], measure_increment(graph))
        description = describe_outputs(outputs, self.resolver)
        self.entries.append((ir, {"shape_key": shape_key, "runner": runner, "outputs": description, "rng": rng}))
        return CapturedGraph(graph, outputs)

    def _begin_capturing(self) -> None:
        import torch

        from foundry.graphir.lower import AddressResolver
        from foundry.runtime.images import HookImages

        self.anchor = _anchor_generator()
        torch.cuda.synchronize()
        info = self.hook.region()
        self.warmup_end = (info.allocations, info.cursor)
        generator = torch.cuda.default_generators[self.device]
        self.generator_offset = generator.get_offset()
        if self.keep_warmup_bytes and self.warmup_start is not None:
            start = self.warmup_start[1]
            buf = ctypes.create_string_buffer(info.cursor - start)
            cu("cuMemcpyDtoH", ctypes.addressof(buf), info.base + start, info.cursor - start)
            self.warmup_data = buf.raw
        self.resolver = AddressResolver([self.region])
        self.images = HookImages(self.hook)

    def _lower(self, graph: Any, name: str) -> GraphIR:
        from foundry.graphir.lower import lower

        started = time.perf_counter()
        ir = lower(graph, name, resolver=self.resolver, images=self.images)
        self.timings["lower_s"] += time.perf_counter() - started
        return ir

    def _mark_undefined(self, ir: GraphIR, name: str, fn: Callable[[], Any]) -> GraphIR:
        from foundry.graphir.operands import WORD
        from foundry.runtime.definedness import host_ranges, mark_host_words, mark_undefined

        started = time.perf_counter()
        count = 0
        for shift, pattern in PROBES[: self.probes]:
            probe: list[GraphIR] = []

            def capture_again(probe: list[GraphIR] = probe) -> None:
                graph, _ = self._capture(fn)
                probe.append(self._lower(graph, name))

            self.hook.call_shifted(capture_again, shift=shift, pattern=pattern)
            ir, count = mark_undefined(ir, probe[0])
        ir, words = mark_host_words(ir, host_ranges())
        self.undefined_bytes += count + WORD * words
        self.timings["probe_s"] += time.perf_counter() - started
        return ir

    def finish(self) -> dict[str, Any]:
        from foundry.runtime.module_globals import record_image

        errors = self.hook.errors()
        if errors:
            raise CaptureError(
                "the hook reported a loss of determinism during SAVE; nothing was written", found=errors[:3]
            )
        for ir, _ in self.entries:
            for node in ir.kernels():
                if node.kernel.image is None:
                    raise CaptureError(
                        "a kernel's module image was not recorded by the hook",
                        path=ir.name,
                        node=node.id,
                        kernel=node.kernel.name,
                    )
        writer = ArchiveWriter(
            self.path, environment=self.environment, world_size=self.world_size, model=self.model, overwrite=True
        )
        records: list[ImageRecord] = []
        for sha256, image in sorted(self.images.used.items()):
            blob = self.hook.image_bytes(image)
            writer.add_module(blob, format=image.format)
            records.append(record_image(sha256, blob, image.kind, image.handle))
        rank = writer.rank(self.rank)
        for ir, extra in self.entries:
            rank.add_graph(ir, **extra)
        rank.add_images(records)
        rank.set_region(self._region_record(rank))
        rank.seal()
        writer.commit()
        return {
            "mode": "save",
            "archive": str(self.path),
            "graphs": len(self.entries),
            "images": len(records),
            "undefined_bytes": self.undefined_bytes,
            "written_globals": [g.name for r in records for g in r.globals if g.written],
            "counters": self.hook.counters(),
            **self.timings,
        }

    def _region_record(self, rank: Any) -> RegionRecord:
        import hashlib

        import msgspec

        info = self.hook.region()
        trace = tuple(AllocationRecord(a.order, a.offset, a.size, a.request, a.phase) for a in self.hook.trace())
        warm = None
        if self.warmup_data is not None and self.warmup_start is not None:
            sha = rank.add_file(WARMUP_FILE, self.warmup_data)
            warm = WarmupBytes(
                WARMUP_FILE,
                sha,
                self.warmup_start[1],
                len(self.warmup_data),
                self.warmup_start[0],
                self.generator_offset or 0,
            )
        allocations, offset = self.warmup_end or (info.allocations, info.cursor)
        return RegionRecord(
            base=info.base,
            size=info.size,
            final_offset=info.cursor,
            allocations=info.allocations,
            trace_sha256=hashlib.sha256(msgspec.json.encode(trace)).hexdigest(),
            warmup_allocations=allocations,
            warmup_offset=offset,
            trace=trace,
            warmup_bytes=warm,
        )


class LoadSession(Session):
    """Mode ``load``: restore the archive's graphs instead of capturing."""

    mode = "load"

    def __init__(
        self,
        archive: str | Path,
        *,
        device: int = 0,
        rank: int = 0,
        warmup: str = "replay",
        progress: bool | None = None,
        builder: str = "python",
    ) -> None:
        super().__init__(device=device)
        if warmup not in WARMUP_MODES:
            raise FoundryError("unknown warm-up mode", field="warmup", expected=WARMUP_MODES, found=warmup)
        self.archive = Archive.open(archive)
        self.rank = rank
        self.record = self.archive.session(rank)
        self.warmup_mode = warmup
        if warmup == "restore" and (self.record.region is None or self.record.region.warmup_bytes is None):
            raise DriftError("the archive kept no warm-up bytes to restore", field="region.warmup_bytes")
        self.progress = sys.stderr.isatty() if progress is None else progress
        self.builder = builder
        if builder not in BUILDERS:
            raise FoundryError("unknown graph builder", field="builder", expected=BUILDERS, found=builder)
        self.graphs: dict[str, RestoredGraph] | None = None
        self.report: dict[str, Any] = {"mode": "load", "archive": str(archive), "warmup": warmup}

    def start(self) -> None:
        from foundry.runtime.environment import current_environment
        from foundry.runtime.validate import check_environment, check_modules, check_region

        self.hook = Hook.attach()
        if self.hook.region().mode != "load":
            raise HookError("the hook is not in load mode (start the program with `foundry run --mode load`)")
        check_modules(self.archive)
        _init_cuda(self.device)
        _check_active(self.hook)
        check_environment(self.archive.catalog.environment, current_environment(self.device))
        try:
            self.hook.reserve()
        except HookError as err:
            raise DriftError(
                "the region's base address is taken in this process", field="region.base", found=err.found
            ) from None
        info = self.hook.region()
        region = check_region(self.record.region, info.base, info.size)
        self.hook.set_owner()
        self.expected = [
            Allocation(a.order, a.offset, a.size, a.request, False, False, a.phase)
            for a in region.trace[: self._expected_count(region)]
        ]
        self.hook.expect(self.expected)

    def _expected_count(self, region: RegionRecord) -> int:
        if self.warmup_mode == "restore":
            return region.warmup_bytes.allocations if region.warmup_bytes else 0
        return region.warmup_allocations

    def warmup(self, fn: Callable[[], Any]) -> None:
        if self.warmup_mode == "replay":
            super().warmup(fn)

    def graph(
        self, name: str, fn: Callable[[], Any], *, shape_key: int | None = None, runner: str | None = None
    ) -> RestoredGraph:
        if self.graphs is None:
            self.graphs = self._restore()
        if name not in self.graphs:
            raise DriftError(
                "the archive has no graph of this name", field="graphs", found=name, expected=sorted(self.graphs)[:8]
            )
        return self.graphs[name]

    def finish(self) -> dict[str, Any]:
        self.report["counters"] = self.hook.counters()
        return self.report

    # -- restoring --------------------------------------------------------------

    def _restore(self) -> dict[str, RestoredGraph]:
        import torch

        started = time.perf_counter()
        if self.warmup_mode == "replay":  # SAVE allocated the generator's cells after its warm-up
            self.anchor = _anchor_generator()
        torch.cuda.synchronize()
        region = self.record.region
        assert region is not None  # checked in start()
        self._check_trace()
        self.hook.map_to(region.final_offset)
        if self.warmup_mode == "restore":
            self._restore_warmup_bytes(region)
        mapped = time.perf_counter()
        graphs = self._build_all(region)
        torch.cuda.synchronize()
        self.report.update(
            map_s=mapped - started,
            build_s=time.perf_counter() - mapped,
            restore_s=time.perf_counter() - started,
            graphs=len(graphs),
        )
        return graphs

    def _check_trace(self) -> None:
        actual = self.hook.trace()
        index = self.hook.trace_diverges(self.expected, actual)
        if index is not None:
            got = actual[index]
            want = self.expected[index] if index < len(self.expected) else None
            raise DriftError(
                f"allocation #{index} diverges from SAVE's warm-up trace",
                field="region.trace",
                expected=None if want is None else f"{want.request} bytes at offset {want.offset}",
                found=f"{got.request} bytes at offset {got.offset}",
            )
        if len(actual) != len(self.expected):
            raise DriftError(
                "the warm-up made fewer allocations than SAVE's",
                field="region.trace",
                expected=len(self.expected),
                found=len(actual),
            )

    def _restore_warmup_bytes(self, region: RegionRecord) -> None:
        import torch

        warm = region.warmup_bytes
        assert warm is not None
        data = self.archive.rank_blob(self.rank, warm.file, sha256=warm.sha256, size=warm.size, what="warm-up bytes")
        buf = ctypes.create_string_buffer(data, len(data))
        cu("cuMemcpyHtoD", region.base + warm.offset, ctypes.addressof(buf), len(data))
        torch.cuda.default_generators[self.device].set_offset(warm.generator_offset)

    def _build_all(self, region: RegionRecord) -> dict[str, RestoredGraph]:
        from foundry.graphir.build import build, build_member
        from foundry.runtime import native_build
        from foundry.runtime.functions import ArchiveFunctions
        from foundry.runtime.rng import PhiloxReplay
        from foundry.runtime.tensors import outputs_at
        from foundry.runtime.validate import check_graph

        records = {r.sha256: r for r in self.record.images}
        applied: set[int] = set()  # functions whose attributes the native builder set
        functions = ArchiveFunctions(self.hook, self.archive, records)
        templates: dict[str, Any] = {}
        graphs: dict[str, RestoredGraph] = {}
        entries = self.record.graphs
        with _Progress(self.progress, len(entries)) as advance:
            for entry in entries:
                ir = self.archive.graph(self.rank, entry)
                check_graph(ir, self.archive)
                if self.builder == "native" and native_build.supported(ir):
                    built = native_build.build_native(self.hook.lib, ir, functions, applied=applied)
                else:
                    template = templates.get(entry.topology) if entry.topology else None
                    built = build_member(template, ir, functions) if template else build(ir, functions)
                    if entry.topology and template is None and built.handles is not None and not built.events:
                        templates[entry.topology] = built
                graphs[entry.name] = RestoredGraph(
                    built,
                    self._outputs(entry, region, outputs_at),
                    PhiloxReplay(entry.rng, region.base) if entry.rng else None,
                )
                advance()
        self.report.update(
            builder=self.builder,
            templates=len(templates),
            bound_live=len(functions.bound_live),
            loaded_images=len(functions.loaded),
            restored_globals=functions.restored_globals,
        )
        return graphs

    @staticmethod
    def _outputs(entry: GraphEntry, region: RegionRecord, outputs_at: Callable[..., Any]) -> Any:
        return None if entry.outputs is None else outputs_at(entry.outputs, region.base)


class _Progress:
    """A progress bar on a terminal; nothing otherwise."""

    def __init__(self, enabled: bool, total: int) -> None:
        self.enabled = enabled and total > 1
        self.total = total

    def __enter__(self) -> Callable[[], None]:
        if not self.enabled:
            return lambda: None
        from rich.progress import Progress

        self.bar = Progress(transient=True)
        self.bar.start()
        task = self.bar.add_task("restoring graphs", total=self.total)
        return lambda: self.bar.advance(task)

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            self.bar.stop()


def open_session(*, device: int = 0, model: dict[str, str] | None = None, **kwargs: Any) -> Session:
    """The session ``foundry run`` asked for (``FOUNDRY_MODE``, ``FOUNDRY_ARCHIVE``,
    ``FOUNDRY_RANK``, ``FOUNDRY_LOAD_WARMUP``, ``FOUNDRY_BUILDER``); mode ``off`` when none."""
    mode = os.environ.get("FOUNDRY_MODE", "off") or "off"
    if mode not in MODES:
        raise FoundryError("unknown mode", field="FOUNDRY_MODE", expected=MODES, found=mode)
    if mode == "off":
        return Session(device=device)
    archive = os.environ.get("FOUNDRY_ARCHIVE")
    if not archive:
        raise FoundryError(f"FOUNDRY_ARCHIVE must name the archive in mode {mode}", field="FOUNDRY_ARCHIVE")
    rank = int(os.environ.get("FOUNDRY_RANK", "0"))
    if mode == "save":
        return SaveSession(archive, device=device, rank=rank, model=model, **kwargs)
    warmup = os.environ.get("FOUNDRY_LOAD_WARMUP", "replay")
    builder = os.environ.get("FOUNDRY_BUILDER", "python")
    return LoadSession(archive, device=device, rank=rank, warmup=warmup, builder=builder, **kwargs)
