"""SAVE: capture each step, find its undefined bytes, lower it with the hook's exact
region and write the archive with images, device globals and the allocation trace."""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from foundry.archive.schema import AllocationRecord, ImageRecord, RegionRecord, RngRecord, WarmupBytes
from foundry.archive.writer import ArchiveWriter
from foundry.backends.base import ProcessFacts, backend_facts, completed_facts
from foundry.env import SAVE_ID, SAVE_REPLAY
from foundry.errors import CaptureError, FoundryError, HookError
from foundry.graphir.build import LiveFunctions, build
from foundry.graphir.cuda import cu
from foundry.graphir.graph import GraphIR
from foundry.graphir.regions import Region, RegionKind
from foundry.runtime.graphs.launch_plan import make_plan
from foundry.runtime.native.hook import Hook
from foundry.runtime.sessions.base import (
    CapturedGraph,
    RestoredGraph,
    Session,
    anchor_generator,
    check_active,
    init_cuda,
    start_checked,
)
from foundry.runtime.sessions.placement import between_phase, late_allocations

WARMUP_FILE = "warmup.bin"
# (stack shift, fill pattern) of the extra captures that find undefined parameter bytes:
# two shifts well beyond one launcher's frames, not multiples of a page or of each
# other, so no leftover lands at the same frame offset twice; two complementary patterns
PROBES = ((40_976, 0xA5), (90_128, 0x5A))


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
        warmup_bytes_until: str = "capture",
        overwrite: bool = False,
    ) -> None:
        super().__init__(device=device)
        self.path = Path(archive)
        self.rank, self.world_size, self.model = rank, world_size, dict(model or {})
        self.probes, self.keep_warmup_bytes, self.overwrite = probes, keep_warmup_bytes, overwrite
        if warmup_bytes_until not in ("capture", "finish"):
            raise FoundryError("warm-up bytes are kept up to the first capture or to finish()",
                               field="warmup_bytes_until", found=warmup_bytes_until)  # fmt: skip
        # "capture": the region's bytes from the warm-up's start to the first capture (a program
        # that warms up once); "finish": to finish(), for programs that warm up between captures
        self.warmup_bytes_until = warmup_bytes_until
        self.entries: list[tuple[GraphIR, dict[str, Any]]] = []
        self.warmup_start: tuple[int, int] | None = None  # (allocations, cursor) when the warm-up began
        self.warmup_end: tuple[int, int] | None = None
        self.anchor: Any = None  # the default generator registered with a graph (anchor_generator)
        self.warmups_between: list[tuple[int, int]] = []  # [first, end) allocation numbers of later warm-ups
        self.warmup_data: bytes | None = None
        self.generator_offset: int | None = None
        self.undefined_bytes = 0
        self.timings: dict[str, float] = {"capture_s": 0.0, "probe_s": 0.0, "lower_s": 0.0}
        self.notes: dict[str, str] = {}  # what the report says beside the timings
        self.attached: dict[str, tuple[Any, dict[str, Any]]] = {}  # backend name -> (backend, live facts)
        self.replay = SAVE_REPLAY.read()  # "rebuilt": the program replays graphs built from their IR
        self.live_functions = LiveFunctions()  # the functions lowering met, for those builds
        self.rebuilt_differences: dict[str, list[str]] = {}  # rebuilt graphs read back unlike their capture
        # the captures rebuilt graphs stand in for: each holds the memory pool its rebuilt graph
        # runs on, which the next capture shares (torch refuses a pool no live graph holds)
        self.rebuilt_captures: list[Any] = []

    def start(self) -> None:
        from foundry.archive.schema import CATALOG_FILE
        from foundry.runtime.sessions.environment import current_environment

        start_checked(self.mode)
        if (self.path / CATALOG_FILE).exists() and not self.overwrite:  # refuse before any work
            raise FoundryError("already holds an archive (pass --overwrite to replace it)", path=str(self.path))
        self.hook = Hook.attach()
        if self.hook.region().mode != "save":
            raise HookError("the hook is not in save mode (start the program with `foundry run --mode save`)")
        init_cuda(self.device)
        check_active(self.hook)
        self.hook.reserve()
        self.hook.set_owner()
        self.environment = current_environment(self.device)
        info = self.hook.region()
        self.region = Region(RegionKind.VMM.value, RegionKind.VMM, info.base, info.size)

    def attach(self, backend: str, **objects: Any) -> None:
        from foundry.backends.registry import BackendRegistry

        if self.warmup_end is not None:
            raise FoundryError("attach backends before the first graph()", field=backend)
        owner = BackendRegistry.discover().require(backend)
        self.attached[backend] = (owner, backend_facts(owner, objects))

    def complete(self, backend: str, **objects: Any) -> None:
        if backend not in self.attached:
            raise FoundryError("complete() of a backend that was not attached before the graphs", field=backend)
        owner, before = self.attached[backend]
        self.attached[backend] = (owner, completed_facts(owner, before, objects))

    def warmup(self, fn: Callable[[], Any]) -> None:
        if self.anchor is None:
            self.anchor = anchor_generator()
        info = self.hook.region()
        if self.warmup_start is None:  # warm-ups between captures (SGLang's) extend the first one
            self.warmup_start = (info.allocations, info.cursor)
        super().warmup(fn)
        if self.warmup_end is not None:  # its allocations are the warm-up's, the others between captures the program's
            self.warmups_between.append((info.allocations, self.hook.region().allocations))

    def graph(
        self, name: str, fn: Callable[[], Any], *, shape_key: int | None = None, runner: str | None = None
    ) -> CapturedGraph | RestoredGraph:
        from foundry.runtime.graphs.capture import describe_outputs, instantiate_flags
        from foundry.runtime.graphs.rng import measure_increment, philox_cells

        if self.warmup_end is None:
            self._begin_capturing()
        started = time.perf_counter()
        graph, outputs = self._capture(fn)
        self.timings["capture_s"] += time.perf_counter() - started
        ir = self._lower(graph, name)
        if self.probes:
            ir = self._mark_undefined(ir, name, fn)
        flags = instantiate_flags(graph)  # before a replay below would instantiate it (the same way)
        rng = None
        cells = philox_cells(ir)
        if cells is not None:
            rng = RngRecord(cells[1], cells[2], measure_increment(graph))
        description = describe_outputs(outputs, self.resolver)
        meta = {"shape_key": shape_key, "runner": runner, "outputs": description, "rng": rng,
                "instantiate_flags": flags}  # fmt: skip
        self.entries.append((ir, meta))
        if self.replay == "rebuilt":
            return self._rebuilt(graph, ir, outputs, flags, rng)
        return CapturedGraph(graph, outputs)

    def _rebuilt(self, capture: Any, ir: GraphIR, outputs: Any, flags: int, rng: RngRecord | None) -> RestoredGraph:
        """``ir`` built in this process, on the memory and functions its capture used, as a
        LOAD builds it (``FOUNDRY_SAVE_REPLAY=rebuilt``)."""
        if rng is not None:  # its generator cells would need the replay prologue a LOAD gives
            raise FoundryError(f"{SAVE_REPLAY.name}=rebuilt replays no graph that draws random numbers",
                               field=SAVE_REPLAY.name, found=ir.name)  # fmt: skip
        built = build(ir, self.live_functions, flags=flags)
        self.rebuilt_captures.append(capture)
        self._note_rebuilt_differences(ir, built.graph)
        return RestoredGraph(built, outputs)

    def _note_rebuilt_differences(self, ir: GraphIR, rebuilt: Any) -> None:
        """The rebuilt graph read back as a capture is, and compared with ``ir``: the first
        differences the report lists (none expected: node kinds, launches, attributes, edges
        and their kinds), then, where edges differ, each side's edges counted by kind."""
        from foundry.graphir.passes.diff import diff_graphs

        back = self._lower(rebuilt, ir.name)
        diff = diff_graphs(ir, back, listed=8)
        found = [f"node {n.label}: {', '.join(c.field for c in n.changes) or n.status.value}" for n in diff.nodes]
        found += [f"edge {c.a[0]}->{c.a[1]}: {c.kind_a} in the capture, {c.kind_b} rebuilt" for c in diff.edges_changed]
        found += [f"edge {src}->{dst} only in the capture" for src, dst in diff.edges_only_a]
        found += [f"edge {src}->{dst} only in the rebuilt graph" for src, dst in diff.edges_only_b]
        if diff.edge_count:
            found.append(f"edges by kind: capture {_edge_kinds(ir)}, rebuilt {_edge_kinds(back)}")
        if found:
            self.rebuilt_differences[ir.name] = found

    def _begin_capturing(self) -> None:
        import torch

        from foundry.graphir.lower import AddressResolver
        from foundry.runtime.code.images import HookImages

        if self.anchor is None:  # a program without a warm-up
            self.anchor = anchor_generator()
        torch.cuda.synchronize()
        info = self.hook.region()
        self.warmup_end = (info.allocations, info.cursor)
        generator = torch.cuda.default_generators[self.device]
        self.generator_offset = generator.get_offset()
        if self._keeps_warmup_bytes_until("capture"):
            self.warmup_data = self._dump_warmup(self.warmup_start[1], info)
        # a backend region inside the deterministic region (torch keeps its pointer tables in
        # caching-allocator memory) is the region's: vmm relocates it, the backend rebuilds its contents
        backend_regions = [
            r
            for owner, facts in self.attached.values()
            for r in owner.regions_for(facts)
            if r.base + r.size <= self.region.base or r.base >= self.region.base + self.region.size
        ]
        self.resolver = AddressResolver([self.region, *backend_regions])
        self.images = HookImages(self.hook)

    def _keeps_warmup_bytes_until(self, stage: str) -> bool:
        """Whether the warm-up's bytes are to be taken now, at ``stage`` (capture or finish)."""
        return self.keep_warmup_bytes and self.warmup_start is not None and self.warmup_bytes_until == stage

    def _dump_warmup(self, start: int, info: Any) -> bytes:
        """The region's bytes from ``start`` to the cursor, allocation by allocation: ranges
        the warm-up freed again are unmapped and stay zero."""
        buf = ctypes.create_string_buffer(info.cursor - start)
        for a in self.hook.trace():
            if a.freed or a.offset < start:
                continue
            dst = ctypes.addressof(buf) + a.offset - start
            cu("cuMemcpyDtoH", dst, info.base + a.offset, min(a.size, info.cursor - a.offset))
        return buf.raw

    def _lower(self, graph: Any, name: str) -> GraphIR:
        from foundry.graphir.lower import lower

        started = time.perf_counter()
        functions = self.live_functions if self.replay == "rebuilt" else None
        ir = lower(graph, name, resolver=self.resolver, images=self.images, functions=functions)
        self.timings["lower_s"] += time.perf_counter() - started
        return ir

    def _mark_undefined(self, ir: GraphIR, name: str, fn: Callable[[], Any]) -> GraphIR:
        from foundry.graphir.operands import WORD
        from foundry.graphir.passes.definedness import mark_host_words, mark_undefined
        from foundry.runtime.host_maps import host_ranges

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
        from foundry.runtime.code.module_globals import record_image

        if not hasattr(self, "hook"):
            raise FoundryError("finish() before start(): call session.start() before the first CUDA allocation")
        if not self.entries:
            raise CaptureError("no graph was captured; nothing to write", path=str(self.path))
        errors = self.hook.errors()
        if errors:
            raise CaptureError(
                "the hook reported a loss of determinism during SAVE; nothing was written",
                found=errors[:3],
            )
        missing = [(ir.name, node) for ir, _ in self.entries for node in ir.kernels() if node.kernel.image is None]
        if missing:
            graph, node = missing[0]
            kernels = sorted({n.kernel.short_name for _, n in missing})
            owners = sorted(set(self.images.misses.values()))  # what the driver named instead
            raise CaptureError(
                f"{len(missing)} kernel launches come from module images the hook did not record "
                f"({len(kernels)} kernels: {', '.join(kernels[:6])}; their owners: {', '.join(owners[:3])})",
                path=graph,
                node=node.id,
                kernel=node.kernel.name,
            )
        from foundry.graphir.passes.definedness import mark_alike
        from foundry.runtime.host_maps import host_ranges

        self._drop_early_warmup_bytes()
        if self._keeps_warmup_bytes_until("finish"):
            import torch

            torch.cuda.synchronize()  # the graph phase's last writes are in the bytes
            self.warmup_data = self._dump_warmup(self.warmup_start[1], self.hook.region())
            self.generator_offset = torch.cuda.default_generators[self.device].get_offset()  # as the bytes are
        self.undefined_bytes += mark_alike([ir for ir, _ in self.entries])
        save_id = SAVE_ID.read() if self.world_size > 1 else None
        if self.world_size > 1 and not save_id:
            raise FoundryError(f"a SAVE of several ranks needs {SAVE_ID.name}, the same in every rank's process",
                               field=SAVE_ID.name)  # fmt: skip
        writer = ArchiveWriter(
            self.path,
            environment=self.environment,
            world_size=self.world_size,
            model=self.model,
            overwrite=self.overwrite,
            save_id=save_id,  # several ranks: one process per rank, the catalog by whoever finishes last
        )
        records: list[ImageRecord] = []
        host = host_ranges(accessible=True)  # a device global holding one of these addresses is this process's own
        for sha256, image in sorted(self.images.used.items()):
            blob = self.hook.image_bytes(image)
            writer.add_module(blob, format=image.format)
            records.append(record_image(sha256, blob, image.kind, image.handle, host))
        rank = writer.rank(self.rank)
        planned = 0
        for ir, extra in self.entries:
            plan = make_plan(ir)
            planned += plan is not None
            rank.add_graph(ir, **extra, plan=plan)
        rank.add_images(records)
        for name, (owner, facts) in sorted(self.attached.items()):
            vmm = {RegionKind.VMM.value: {"base": self.region.base}}
            process = ProcessFacts(self.rank, self.world_size, {**vmm, name: facts})
            rank.add_backend_state(owner.record(process))
        rank.set_region(self._region_record(rank))
        rank.seal()
        committed = writer.commit() is not None
        self.hook.seal()  # what the program allocates from now on (a server's requests) is its own
        self.release_warmup_pool()
        return {
            "mode": "save",
            "archive": str(self.path),
            "graphs": len(self.entries),
            "committed": committed,  # False: another rank's process writes the catalog
            "plans": planned,
            "instantiate_flags": sorted({extra["instantiate_flags"] for _, extra in self.entries}),
            "replay": self.replay,
            "rebuilt_differences": self.rebuilt_differences,
            "images": len(records),
            "undefined_bytes": self.undefined_bytes,
            "written_globals": [g.name for r in records for g in r.globals if g.written],
            "counters": self.hook.counters(),
            "late_allocations": len(late_allocations(self.hook.trace())),
            **self.timings,
            **self.notes,
        }

    def _drop_early_warmup_bytes(self) -> None:
        """Bytes taken at the first capture miss what the program allocated between its
        captures: a LOAD restoring them would find that memory empty, so they are dropped
        and a LOAD must repeat the warm-up (``--warmup replay``); the report says why."""
        late = late_allocations(self.hook.trace())
        if late and self.warmup_data is not None and self.warmup_bytes_until == "capture":
            self.warmup_data = None
            self.notes["warmup_bytes"] = (
                f"dropped: {len(late)} allocations between captures came after the warm-up's bytes were taken at "
                "the first capture (a LOAD repeats the warm-up)"
            )

    def _region_record(self, rank: Any) -> RegionRecord:
        import hashlib

        import msgspec

        info = self.hook.region()
        warmups = self.warmups_between
        trace = tuple(
            AllocationRecord(a.order, a.offset, a.size, a.request, between_phase(a.phase, a.order, warmups))
            for a in self.hook.trace()
        )
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


def _edge_kinds(ir: GraphIR) -> dict[str, int]:
    return dict(sorted(ir.edge_kinds().items()))
