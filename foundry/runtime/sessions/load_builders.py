"""LOAD's builders: every graph rebuilt from its IR (node by node through cuda-bindings,
from a template per topology, or by the hook's native builder), or from the launch
plans SAVE made; either way handed to the program as a :class:`RestoredGraph`."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, wait
from functools import partial
from typing import Any

from foundry.archive.reader import Archive
from foundry.archive.schema import GraphEntry, PlanKernel
from foundry.archive.schema import Session as SessionRecord
from foundry.backends.registry import BackendRegistry
from foundry.graphir.cuda import cu
from foundry.graphir.graph import GraphIR
from foundry.graphir.kernel import KernelIdentity
from foundry.graphir.operands import Operand
from foundry.graphir.regions import RegionKind
from foundry.runtime.native.hook import Hook
from foundry.runtime.sessions.base import RestoredGraph
from foundry.runtime.sessions.load_region import RegionRestore
from foundry.runtime.sessions.validate import check_claim, check_image


def restored(entry: GraphEntry, built: Any, base_of: Callable[[str], int | None], live_base: int | None,
             instantiate: Callable[[Any, int], Any] | None = None) -> RestoredGraph:  # fmt: skip
    """A built graph with its outputs as tensors and its generator cells, as the program
    gets it; one not yet instantiated is instantiated by ``instantiate`` when first needed."""
    from foundry.runtime.graphs.instantiation import PendingExec
    from foundry.runtime.graphs.rng import PhiloxReplay
    from foundry.runtime.graphs.tensors import outputs_at

    return RestoredGraph(
        built,
        None if entry.outputs is None else outputs_at(entry.outputs, base_of),
        PhiloxReplay(entry.rng, live_base) if entry.rng else None,
        None if instantiate is None else PendingExec(entry.name, built, instantiate, entry.flags),
    )


def binding_report(functions: Any) -> dict[str, Any]:
    """How LOAD bound its kernels: images found live, images loaded from the archive,
    device globals restored."""
    return {"bound_live": len(functions.bound_live), "loaded_images": len(functions.loaded),
            "images_from_check": functions.from_check,
            "restored_globals": functions.restored_globals,
            "binding_s": {k: round(v, 4) for k, v in functions.seconds.items()}}  # fmt: skip


class IrBuilder:
    """Graphs built from their IR: natively where asked and the graph allows it, else
    from their topology's template, else node by node."""

    def __init__(self, hook: Hook, archive: Archive, record: SessionRecord, *, native: bool,
                 moved_from: tuple[int, int] | None, images: dict[str, bytes] | None = None) -> None:  # fmt: skip
        from foundry.runtime.code.binding import ArchiveFunctions

        self.hook, self.native = hook, native
        # SAVE's region range when LOAD relocates: restored globals must not point there; ``images``: checked
        # bytes the module check kept (a LOAD that expected launch plans, relocated after all)
        self.functions = ArchiveFunctions(hook, archive, {r.sha256: r for r in record.images}, moved_from=moved_from,
                                          checked=images)  # fmt: skip
        self.templates: dict[str, Any] = {}
        self.applied: set[int] = set()  # functions whose attributes the native builder set
        self.native_timing: dict[str, float] = {}

    def build_all(self, entries: tuple[GraphEntry, ...], irs: list[GraphIR], relocate: Callable[[Operand], int] | None,
                  base_of: Callable[[GraphIR], Callable[[str], int | None]], live_base: int | None, *,
                  progress: bool) -> dict[str, RestoredGraph]:  # fmt: skip
        """Every graph, by name; ``base_of(ir)`` places its regions for its outputs."""
        graphs: dict[str, RestoredGraph] = {}
        with _Progress(progress, len(irs)) as advance:
            for entry, ir in zip(entries, irs, strict=True):
                built = self.build_one(entry, ir, relocate)
                graphs[entry.name] = restored(entry, built, base_of(ir), live_base)
                advance()
        return graphs

    def build_one(self, entry: GraphEntry, ir: GraphIR, relocate: Callable[[Operand], int] | None) -> Any:
        """Build one graph: natively if asked and possible, else from its topology's template."""
        from foundry.graphir.build import build, build_member
        from foundry.runtime.graphs import native_build

        flags = entry.flags
        if self.native and native_build.supported(ir):
            return native_build.build_native(self.hook.lib, ir, self.functions, relocate=relocate,
                                             applied=self.applied, timing=self.native_timing, flags=flags)  # fmt: skip
        template = self.templates.get(entry.topology) if entry.topology else None
        if template:
            return build_member(template, ir, self.functions, relocate=relocate, flags=flags)
        built = build(ir, self.functions, relocate=relocate, flags=flags)
        if entry.topology and built.handles is not None and not built.events:
            self.templates[entry.topology] = built
        return built


def check_plans(archive: Archive, record: SessionRecord, registry: BackendRegistry, recorded: set[str]) -> None:
    """Every launch plan's kernels name images the archive holds and are claimed only
    with their backend's state (``recorded``): refused before any GPU work."""
    known = {b.sha256 for b in archive.catalog.modules.blobs}
    for entry in record.graphs:
        assert entry.plan is not None  # LoadSession._plans_apply
        for kernel in entry.plan.kernels:
            identity = KernelIdentity(kernel.name, kernel.image)
            check_image(identity, known, path=entry.name)
            check_claim(identity, registry, recorded, graph=entry.name)


PlanFiles = list[tuple[str, bytes, Any]]  # (graph name, the plan file's bytes, its LaunchPlan record)


def plan_images(entries: tuple[GraphEntry, ...]) -> frozenset[str]:
    """The images the launch plans of ``entries`` bind (each entry has a plan)."""
    return frozenset(kernel.image for entry in entries for kernel in entry.plan.kernels)


def read_plans(archive: Archive, rank: int, entries: tuple[GraphEntry, ...]) -> PlanFiles:
    """Every graph's launch plan file, read and checked against its record."""
    return [(e.name, archive.rank_blob(rank, e.plan.file, sha256=e.plan.sha256, size=e.plan.size, what="launch plan"),
             e.plan) for e in entries if e.plan is not None]  # fmt: skip


class PlanBuilder:
    """Graphs built from SAVE's launch plans by the hook's native builder, at SAVE's base
    and with nothing to patch: the archived images load on a thread while the plans
    are read (or taken from ``plans``, read on a thread from the session's start) and the
    region mapped, from ``images`` (the session's module check kept their checked bytes)
    where it holds them. ``background``: left for the caller to instantiate."""

    def __init__(self, hook: Hook, archive: Archive, rank: int, record: SessionRecord, *, threads: int,
                 background: bool, plans: Future[PlanFiles] | None = None,
                 images: dict[str, bytes] | None = None) -> None:  # fmt: skip
        from foundry.runtime.code.binding import ArchiveFunctions

        self.hook, self.archive, self.rank, self.record = hook, archive, rank, record
        self.threads, self.background, self.plans = threads, background, plans
        self.functions = ArchiveFunctions(hook, archive, {r.sha256: r for r in record.images}, checked=images)
        self._applied: set[int] = set()
        self.report: dict[str, Any] = {"functions_s": 0.0}  # seconds binding kernels (finding live images, loading)
        self.mapped = 0.0  # when the region was mapped (time.perf_counter)

    def _function(self, kernel: PlanKernel) -> int:
        from foundry.graphir.build import apply_attributes

        begun = time.perf_counter()
        handle = self.functions.function(KernelIdentity(kernel.name, kernel.image))
        apply_attributes(handle, kernel.attrs, self._applied)
        self.report["functions_s"] += time.perf_counter() - begun
        return handle

    def build(self, region: RegionRestore) -> dict[str, RestoredGraph]:
        """Every graph, by name; on any failure nothing built or loaded stays behind."""
        from foundry.graphir.build import BuiltGraph
        from foundry.runtime.graphs.instantiation import in_context

        built = self._build(region)
        base_of = partial(_region_base_at_save, region.record.base)
        instantiate = in_context(cu("cuCtxGetCurrent")) if self.background else None
        return {
            entry.name: restored(entry, BuiltGraph(graph, graph_exec, []), base_of, region.record.base, instantiate)
            for entry, (graph, graph_exec) in zip(self.record.graphs, built, strict=True)
        }

    def _build(self, region: RegionRestore) -> list[tuple[Any, Any]]:
        import torch

        from foundry.graphir.build import BuiltGraph
        from foundry.runtime.graphs.launch_plan import build_plans

        entries, record = self.record.graphs, region.record
        bounds = (record.base, record.base + record.final_offset)  # plans are used only at SAVE's base
        built: list[tuple[Any, Any]] = []
        prefetching = None
        try:
            # the archived images load on threads while the plans are read and the region mapped,
            # in the context torch makes current here (it may not be yet on this thread)
            begun = time.perf_counter()
            torch.cuda.synchronize()
            synced = time.perf_counter()
            prefetching = self.functions.prefetch_ahead(plan_images(entries))
            ahead, self.plans = self.plans, None
            plans = read_plans(self.archive, self.rank, entries) if ahead is None else ahead.result()
            read = time.perf_counter()
            region.map(overlap=True)
            self.mapped = time.perf_counter()
            # where map_s goes: the GPU's queue drained, the plans read and checked (or waited for), the region mapped
            self.report.update(sync_s=synced - begun, plans_read_s=read - synced, region_map_s=self.mapped - read,
                               plans_bytes=sum(len(data) for _, data, _ in plans))  # fmt: skip
            prefetched, prefetch_s = prefetching.result()
            self.report.update(prefetch_s=prefetch_s, prefetch_wait_s=time.perf_counter() - self.mapped,
                               prefetched_images=prefetched)  # fmt: skip
            built = build_plans(self.hook.lib, plans, self._function, bounds, threads=self.threads,
                                instantiate=not self.background,
                                flags=[e.flags for e in entries if e.plan is not None])  # fmt: skip
            region.finish()
        except BaseException:
            if prefetching is not None:
                wait([prefetching])  # its loads are released below
            region.finish(quiet=True)  # the first error is the one to report
            for graph, graph_exec in built:  # what a failed LOAD built goes with it
                BuiltGraph(graph, graph_exec, []).destroy()
            self.functions.release()
            raise
        return built


def _region_base_at_save(base: int, name: str) -> int | None:
    """Where a region starts in a LOAD built from plans: the deterministic region at SAVE's base."""
    return base if name == RegionKind.VMM else None


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
