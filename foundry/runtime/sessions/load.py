"""LOAD: restore an archive's graphs instead of capturing them, after checking
everything that could make them wrong."""

from __future__ import annotations

import ctypes
import sys
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import wait
from functools import partial
from pathlib import Path
from typing import Any

from foundry.archive.reader import Archive
from foundry.archive.schema import GraphEntry, PlanKernel, RegionRecord
from foundry.backends.base import ProcessFacts
from foundry.env import BUILDERS, INSTANTIATE_MODES, WARMUP_MODES
from foundry.errors import DriftError, FoundryError, HookError
from foundry.graphir.cuda import cu
from foundry.graphir.graph import GraphIR
from foundry.graphir.kernel import KernelIdentity
from foundry.graphir.regions import RegionKind
from foundry.runtime.native.hook import Allocation, Hook
from foundry.runtime.sessions.base import (
    RestoredGraph,
    Session,
    anchor_generator,
    check_active,
    init_cuda,
)
from foundry.runtime.sessions.validate import check_claim, check_claims, check_relocation


class LoadSession(Session):
    """Mode ``load``: restore the archive's graphs instead of capturing."""

    mode = "load"

    def __init__(
        self,
        archive: str | Path | Archive,
        *,
        device: int = 0,
        rank: int = 0,
        warmup: str = "replay",
        progress: bool | None = None,
        builder: str = "python",
        relocate: bool = False,
        build_threads: int = 1,
        instantiate: str = "now",
    ) -> None:
        super().__init__(device=device)
        if warmup not in WARMUP_MODES:
            raise FoundryError("unknown warm-up mode", field="warmup", expected=WARMUP_MODES, found=warmup)
        self.archive = archive if isinstance(archive, Archive) else Archive.open(archive)  # opened by a caller
        self.rank = rank
        self.record = self.archive.session(rank)
        self.warmup_mode = warmup
        self.relocate = relocate  # a region at another base than SAVE's is rebased (not yet GPU-validated)
        if relocate:
            check_relocation(warmup)
        if warmup == "restore" and (self.record.region is None or self.record.region.warmup_bytes is None):
            raise DriftError("the archive kept no warm-up bytes to restore", field="region.warmup_bytes")
        self.progress = sys.stderr.isatty() if progress is None else progress
        self.builder = builder
        if not 1 <= build_threads <= 64:
            raise FoundryError("build threads must be 1-64", field="build_threads", found=build_threads)
        self.build_threads = build_threads
        if builder not in BUILDERS:
            raise FoundryError("unknown graph builder", field="builder", expected=BUILDERS, found=builder)
        if instantiate not in INSTANTIATE_MODES:
            raise FoundryError("unknown instantiation mode", field="instantiate", expected=INSTANTIATE_MODES,
                               found=instantiate)  # fmt: skip
        if instantiate == "background" and builder != "native":
            raise FoundryError("background instantiation needs the native builder (--builder native)",
                               field="instantiate")  # fmt: skip
        self.instantiate = instantiate
        self.instantiation: Any = None  # a BackgroundInstantiation while graphs instantiate behind the program
        self._warmup_copy: Any = None  # the thread restoring the warm-up bytes while graphs are built
        self._restore_started = 0.0
        self.backends = self._require_backends()
        self.attached: dict[str, dict[str, Any]] = {}  # backend name -> live facts
        self.live_base: int | None = None  # the region's base in this process, once start() reserved it
        self.graphs: dict[str, RestoredGraph] | None = None
        self.report: dict[str, Any] = {"mode": "load", "archive": str(self.archive.root), "warmup": warmup}
        self.native_timing: dict[str, float] = {}
        self._owners: dict[str, Any] = {}  # region name -> its backend in this process (see _owner)

    def _check_claims(self, graphs: list[GraphIR]) -> None:
        """Refuse a graph running kernels whose backend's state SAVE did not record."""
        check_claims(graphs, self.registry, (backend.name for backend, _ in self.backends))

    def _require_backends(self) -> list[Any]:
        """Every backend whose state the archive records must be installed and able to
        validate and relocate; refused by name otherwise (before any GPU work)."""
        from foundry.backends.registry import BackendRegistry

        self.registry = BackendRegistry.discover()
        backends = []
        for state in self.record.backends:
            backend = self.registry.require(state.backend)
            missing = [step for step in ("validate", "relocate") if step not in backend.implements()]
            if missing:
                raise DriftError(f"backend {state.backend!r} cannot {' or '.join(missing)} yet; this archive "
                                 "needs it", field=f"backends.{state.backend}")  # fmt: skip
            backends.append((backend, state))
        return backends

    def start(self) -> None:
        from foundry.runtime.sessions.environment import current_environment
        from foundry.runtime.sessions.validate import check_environment, check_modules, check_region

        self.hook = Hook.attach()
        if self.hook.region().mode != "load":
            raise HookError("the hook is not in load mode (start the program with `foundry run --mode load`)")
        check_modules(self.archive)
        init_cuda(self.device)
        check_active(self.hook)
        check_environment(self.archive.catalog.environment, current_environment(self.device))
        try:
            self.hook.reserve()
        except HookError as err:
            hint = "" if self.relocate else "; pass --region-base to load it elsewhere"
            raise DriftError(
                f"the region cannot be reserved at its base (taken in this process, or refused by the driver){hint}",
                field="region.base",
                found=err.found,
            ) from None
        info = self.hook.region()
        region = check_region(self.record.region, info.base, info.size, relocate=self.relocate)
        self.live_base = info.base
        self.report["relocated_by"] = info.base - region.base
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

    def attach(self, backend: str, **objects: Any) -> None:
        from foundry.backends.base import backend_facts

        if not hasattr(self, "hook"):
            raise FoundryError("attach() before start(): start the session, then attach its communicators",
                               field=backend)  # fmt: skip
        if self.graphs is not None:
            raise FoundryError("attach backends before the first graph()", field=backend)
        owner, state = next(((b, s) for b, s in self.backends if b.name == backend), (None, None))
        if owner is None:
            raise DriftError(f"the archive records no state for backend {backend!r}", field=f"backends.{backend}")
        facts = backend_facts(owner, objects)
        # identity and capacity are refused now, before the warm-up allocates against the
        # archive's trace; what the graphs need of the communicator is checked at restore
        live = self._live_facts()
        live.facts[backend] = facts
        owner.validate(state, [], live)
        self.attached[backend] = facts

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
        if not hasattr(self, "hook"):
            raise FoundryError("finish() before start(): call session.start() before the first CUDA allocation")
        if self.instantiation is not None:  # every instantiation counted, or its error raised
            self.report["instantiated_s"] = self.instantiation.wait() - self._restore_started
        self.report["counters"] = self.hook.counters()
        return self.report

    # -- restoring --------------------------------------------------------------

    def _restore(self) -> dict[str, RestoredGraph]:
        if self._plans_apply():
            return self._restore_from_plans()
        import torch

        started = time.perf_counter()
        irs = [self.archive.graph(self.rank, entry) for entry in self.record.graphs]
        decoded = time.perf_counter()
        self._check_claims(irs)  # refusals that need no GPU work come first
        self._validate_backends(irs)
        region = self.record.region
        assert region is not None  # checked in start()
        self._map_region(region)
        mapped = time.perf_counter()
        graphs = self._build_all(region, irs)
        if self.instantiate == "background":  # only launch plans leave instantiation for later
            self.report["instantiate"] = "now: no launch plans apply (relocation or backend state)"
        torch.cuda.synchronize()
        self.report.update(
            decode_s=decoded - started,
            map_s=mapped - started,
            build_s=time.perf_counter() - mapped,
            restore_s=time.perf_counter() - started,
            graphs=len(graphs),
        )
        return graphs

    def _plans_apply(self) -> bool:
        """LOAD builds from SAVE's launch plans when asked for the native builder and
        nothing needs patching: the region at SAVE's base, no backend state, a plan for
        every graph."""
        region = self.record.region
        return (
            self.builder == "native"
            and not self.backends
            and region is not None
            and self.live_base == region.base
            and bool(self.record.graphs)
            and all(entry.plan is not None for entry in self.record.graphs)
        )

    def _restore_from_plans(self) -> dict[str, RestoredGraph]:
        import torch

        from foundry.graphir.build import BuiltGraph, apply_attributes
        from foundry.runtime.code.binding import ArchiveFunctions
        from foundry.runtime.graphs.instantiation import BackgroundInstantiation, in_context
        from foundry.runtime.graphs.launch_plan import build_plans
        from foundry.runtime.sessions.validate import check_image

        started = self._restore_started = time.perf_counter()
        region = self.record.region
        assert region is not None  # checked in start()
        entries = self.record.graphs
        known = {b.sha256 for b in self.archive.catalog.modules.blobs}
        recorded = {backend.name for backend, _ in self.backends}
        for entry in entries:
            assert entry.plan is not None  # _plans_apply
            for kernel in entry.plan.kernels:
                identity = KernelIdentity(kernel.name, kernel.image)
                check_image(identity, known, path=entry.name)
                check_claim(identity, self.registry, recorded, graph=entry.name)
        functions = ArchiveFunctions(self.hook, self.archive, {r.sha256: r for r in self.record.images})
        applied: set[int] = set()
        resolving = [0.0]  # seconds spent binding kernels (finding live images, loading archived ones)

        def function(kernel: PlanKernel) -> int:
            begun = time.perf_counter()
            handle = functions.function(KernelIdentity(kernel.name, kernel.image))
            apply_attributes(handle, kernel.attrs, applied)
            resolving[0] += time.perf_counter() - begun
            return handle

        bounds = (region.base, region.base + region.final_offset)  # plans are used only at SAVE's base
        background = self.instantiate == "background"
        built: list[tuple[Any, Any]] = []
        prefetching = None
        try:
            # the archived images load on threads while the plans are read and the region mapped,
            # in the context torch makes current here (it may not be yet on this thread)
            torch.cuda.synchronize()
            prefetching = functions.prefetch_ahead({k.image for e in entries for k in e.plan.kernels})
            plans = [(e.name, self.archive.rank_blob(self.rank, e.plan.file, sha256=e.plan.sha256, size=e.plan.size,
                                                     what="launch plan"), e.plan) for e in entries]  # fmt: skip
            self._map_region(region, overlap=True)
            mapped = time.perf_counter()
            prefetched, prefetch_s = prefetching.result()
            waited = time.perf_counter() - mapped
            built = build_plans(self.hook.lib, plans, function, bounds, threads=self.build_threads,
                                instantiate=not background)  # fmt: skip
            self._finish_warmup_bytes()
        except BaseException:
            if prefetching is not None:
                wait([prefetching])  # its loads are released below
            self._finish_warmup_bytes(quiet=True)  # the first error is the one to report
            for graph, graph_exec in built:  # what a failed LOAD built goes with it
                BuiltGraph(graph, graph_exec, []).destroy()
            functions.release()
            raise
        base_of = partial(_region_base_at_save, region.base)
        instantiate = in_context(cu("cuCtxGetCurrent")) if background else None
        graphs = {
            entry.name: self._restored(entry, BuiltGraph(graph, graph_exec, []), base_of, instantiate)
            for entry, (graph, graph_exec) in zip(entries, built, strict=True)
        }
        if background:
            self.instantiation = BackgroundInstantiation([g.pending for g in graphs.values() if g.pending])
        torch.cuda.synchronize()
        self.report.update(
            builder="native-plans",
            build_threads=self.build_threads,
            instantiate=self.instantiate,
            functions_s=resolving[0],
            prefetch_s=prefetch_s,
            prefetch_wait_s=waited,
            prefetched_images=prefetched,
            map_s=mapped - started,
            build_s=time.perf_counter() - mapped,
            restore_s=time.perf_counter() - started,
            graphs=len(graphs),
            **_binding_report(functions),
        )
        return graphs

    def _restored(self, entry: GraphEntry, built: Any, base_of: Callable[[str], int | None],
                  instantiate: Callable[[Any], Any] | None = None) -> RestoredGraph:  # fmt: skip
        """A built graph with its outputs as tensors and its generator cells, as the program
        gets it; one not yet instantiated is instantiated by ``instantiate`` when first needed."""
        from foundry.runtime.graphs.instantiation import PendingExec
        from foundry.runtime.graphs.rng import PhiloxReplay
        from foundry.runtime.graphs.tensors import outputs_at

        return RestoredGraph(
            built,
            None if entry.outputs is None else outputs_at(entry.outputs, base_of),
            PhiloxReplay(entry.rng, self.live_base) if entry.rng else None,
            None if instantiate is None else PendingExec(entry.name, built, instantiate),
        )

    def _map_region(self, region: RegionRecord, *, overlap: bool = False) -> None:
        """Check the warm-up's allocations against SAVE's, then map the region up to SAVE's
        final offset (and restore the warm-up's bytes when asked: with ``overlap``, on a
        thread while the graphs are built; :meth:`_finish_warmup_bytes` joins it)."""
        import torch

        if self.warmup_mode == "replay":  # SAVE allocated the generator's cells after its warm-up
            self.anchor = anchor_generator()
        torch.cuda.synchronize()
        self._check_trace()
        begun = time.perf_counter()
        self.hook.map_to(region.final_offset)
        self.report["map_to_s"] = time.perf_counter() - begun
        if self.warmup_mode != "restore":
            return
        if not overlap:
            self._restore_warmup_bytes(region)
            return
        from concurrent.futures import ThreadPoolExecutor

        context = cu("cuCtxGetCurrent")
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="foundry-warmup")
        self._warmup_copy = pool.submit(self._restore_warmup_bytes, region, context)
        pool.shutdown(wait=False)

    def _finish_warmup_bytes(self, *, quiet: bool = False) -> None:
        """Wait for the warm-up bytes a thread restores, if one does, and raise its error
        unless ``quiet``."""
        if self._warmup_copy is None:
            return
        copy, self._warmup_copy = self._warmup_copy, None
        error = copy.exception()
        if error is not None and not quiet:
            raise error

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

    def _restore_warmup_bytes(self, region: RegionRecord, context: Any = None) -> None:
        import torch

        warm = region.warmup_bytes
        assert warm is not None
        if context is not None:  # another thread: the driver's current context is per thread
            cu("cuCtxSetCurrent", context)
        begun = time.perf_counter()
        data = self.archive.rank_blob(self.rank, warm.file, sha256=warm.sha256, size=warm.size, what="warm-up bytes")
        read = time.perf_counter()
        # the driver reads straight from the bytes object (alive until the call returns): no copy
        cu("cuMemcpyHtoD", region.base + warm.offset, ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value,
           len(data))  # fmt: skip
        torch.cuda.default_generators[self.device].set_offset(warm.generator_offset)
        self.report.update(warmup_bytes=len(data), warmup_read_s=read - begun,
                           warmup_copy_s=time.perf_counter() - read)  # fmt: skip

    def _build_all(self, region: RegionRecord, irs: list[GraphIR]) -> dict[str, RestoredGraph]:
        from foundry.runtime.code.binding import ArchiveFunctions
        from foundry.runtime.sessions.validate import check_graph

        begun = time.perf_counter()
        records = {r.sha256: r for r in self.record.images}
        applied: set[int] = set()  # functions whose attributes the native builder set
        moved_from = None if self.live_base == region.base else (region.base, region.base + region.final_offset)
        functions = ArchiveFunctions(self.hook, self.archive, records, moved_from=moved_from)
        owned = [backend for backend, _ in self.backends]
        bound = time.perf_counter()
        for ir in irs:
            check_graph(ir, self.archive, lambda name: any(b.owns(name) for b in owned))
        relocate = self._relocation(moved_from is not None)
        if relocate is not None:
            self.report["relocations"] = self._relocation_report(irs)
        templates: dict[str, Any] = {}
        graphs: dict[str, RestoredGraph] = {}
        checked = time.perf_counter()
        with _Progress(self.progress, len(irs)) as advance:
            for entry, ir in zip(self.record.graphs, irs, strict=True):
                built = self._build_one(entry, ir, functions, relocate, templates, applied)
                graphs[entry.name] = self._restored(entry, built, partial(self._region_base, ir))
                advance()
        self.report.update(
            images_s=bound - begun,
            checks_s=checked - bound,
            native_timing=self.native_timing,
            builder=self.builder,
            templates=len(templates),
            **_binding_report(functions),
        )
        return graphs

    def _build_one(self, entry: GraphEntry, ir: GraphIR, functions: Any, relocate: Any, templates: dict[str, Any],
                   applied: set[int]) -> Any:  # fmt: skip
        """Build one graph: natively if asked and possible, else from its topology's template."""
        from foundry.graphir.build import build, build_member
        from foundry.runtime.graphs import native_build

        if self.builder == "native" and native_build.supported(ir):
            return native_build.build_native(self.hook.lib, ir, functions, relocate=relocate, applied=applied,
                                             timing=self.native_timing)  # fmt: skip
        template = templates.get(entry.topology) if entry.topology else None
        if template:
            return build_member(template, ir, functions, relocate=relocate)
        built = build(ir, functions, relocate=relocate)
        if entry.topology and built.handles is not None and not built.events:
            templates[entry.topology] = built
        return built

    def _owner(self, region: str) -> Any:
        """The backend that places ``region`` in this process: vmm, or an attached backend.
        Asked per operand while restoring, after every attach: looked up once per region."""
        from foundry.backends.vmm import VmmBackend

        if region not in self._owners:
            owners = (VmmBackend(), *(backend for backend, _ in self.backends))
            self._owners[region] = next((owner for owner in owners if owner.owns(region) and (
                owner.name == RegionKind.VMM or owner.name in self.attached)), None)  # fmt: skip
        return self._owners[region]

    def _relocation(self, moved: bool) -> Callable[[Any], int] | None:
        """Every operand's live value, through the backend that owns its region; None
        when nothing moves (the region at SAVE's base, no backends attached)."""
        if not moved and not self.attached:
            return None
        live = self._live_facts()

        def relocate(operand: Any) -> int:
            owner = self._owner(operand.region)
            if owner is None:
                raise DriftError("no backend owns this pointer's region", found=operand.location(), node=operand.node)
            return owner.relocate(operand, live)

        return relocate

    def _relocation_report(self, irs: list[GraphIR]) -> dict[str, dict[str, Any]]:
        """Per region: the backend that placed it, its operands in the restored graphs and
        how many of them hold another value than at SAVE (a region moves as a whole)."""
        report: dict[str, dict[str, Any]] = {}
        for ir in irs:
            counts = Counter(o.region for o in ir.operands if o.resolved)
            for name, count in counts.items():
                owner, live_base = self._owner(name), self._region_base(ir, name)
                if owner is None:  # refused by the build, naming the operand
                    continue
                tally = report.setdefault(name, {"backend": owner.name, "operands": 0, "moved": 0})
                tally["operands"] += count
                tally["moved"] += count if live_base != ir.regions[name].base else 0
        return report

    def _region_base(self, ir: GraphIR, name: str) -> int | None:
        """Where region ``name`` of ``ir`` starts in this process: its start at SAVE, relocated
        by its owner like any pointer to it; None when no owner places it here."""
        from foundry.graphir.operands import Operand, OperandSite

        owner, region = self._owner(name), ir.regions.get(name)
        if owner is None or region is None:
            return None
        return owner.relocate(Operand(-1, OperandSite.PARAM, -1, 0, region.base, name, 0), self._live_facts())

    def _live_facts(self) -> ProcessFacts:
        vmm = {} if self.live_base is None else {RegionKind.VMM.value: {"base": self.live_base}}
        return ProcessFacts(self.rank, self.archive.catalog.world_size, {**vmm, **self.attached})

    def _validate_backends(self, graphs: list[GraphIR]) -> None:
        live = self._live_facts()
        for backend, state in self.backends:
            if backend.name not in self.attached:
                raise DriftError(f"the archive records state for backend {backend.name!r}, which the program did "
                                 "not attach (session.attach)", field=f"backends.{backend.name}")  # fmt: skip
            backend.validate(state, graphs, live)


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


def _binding_report(functions: Any) -> dict[str, Any]:
    """How LOAD bound its kernels: images found live, images loaded from the archive,
    device globals restored."""
    return {"bound_live": len(functions.bound_live), "loaded_images": len(functions.loaded),
            "restored_globals": functions.restored_globals,
            "binding_s": {k: round(v, 4) for k, v in functions.seconds.items()}}  # fmt: skip
