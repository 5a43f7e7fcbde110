"""LOAD: restore an archive's graphs instead of capturing them, after checking
everything that could make them wrong.

The session checks and sequences; its parts do the work: the region
(:mod:`.load_region`), where operands point (:mod:`.load_relocation`) and the
builders (:mod:`.load_builders`)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from concurrent.futures import Future
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from foundry.archive.reader import Archive
from foundry.archive.schema import RegionRecord
from foundry.backends.base import Backend, ProcessFacts
from foundry.env import BUILDERS, INSTANTIATE_MODES, WARMUP_MODES
from foundry.errors import DriftError, FoundryError, HookError
from foundry.graphir.graph import GraphIR
from foundry.runtime.native.hook import Hook
from foundry.runtime.sessions.base import (
    Laps,
    RestoredGraph,
    Session,
    anchor_generator,
    check_active,
    init_cuda,
    start_checked,
)
from foundry.runtime.sessions.load_region import RegionRestore
from foundry.runtime.sessions.load_relocation import Relocation
from foundry.runtime.sessions.validate import (
    CheckedImages,
    check_claims,
    check_relocation,
    check_warmup_restorable,
    required_backends,
)
from foundry.runtime.threads import on_thread

if TYPE_CHECKING:
    from foundry.backends.registry import BackendRegistry


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
        if warmup == "restore":
            check_warmup_restorable(self.record.region, self.archive.catalog.model)
        self.progress = sys.stderr.isatty() if progress is None else progress
        self._check_builder(builder, build_threads, instantiate)
        self.builder, self.build_threads, self.instantiate = builder, build_threads, instantiate
        self.instantiation: Any = None  # a BackgroundInstantiation while graphs instantiate behind the program
        self._restore_started = 0.0
        self._registry: BackendRegistry | None = None
        self._discovering: Future[list[Any]] | None = None  # the backends' entry points, read on a thread
        self.backends = self._require_backends()
        self.attached: dict[str, dict[str, Any]] = {}  # backend name -> live facts
        self.completed: set[str] = set()  # backends given their facts after the graphs (Backend.after_graphs)
        self.relocation = Relocation([backend for backend, _ in self.backends], self.attached, rank,
                                     self.archive.catalog.world_size)  # fmt: skip
        self.live_base: int | None = None  # the region's base in this process, once start() reserved it
        self.region_restore: RegionRestore | None = None  # once start() reserved the region
        self._plans_read: Future[Any] | None = None  # the launch plans, read on a thread from start()
        self.module_check: Future[CheckedImages] | None = None  # start()'s check of the images' bytes, on a thread
        self.checked_images: dict[str, bytes] = {}  # its bytes of the plans' images, by sha256, until the restore
        self.graphs: dict[str, RestoredGraph] | None = None
        self.report: dict[str, Any] = {"mode": "load", "archive": str(self.archive.root), "warmup": warmup}

    @staticmethod
    def _check_builder(builder: str, build_threads: int, instantiate: str) -> None:
        if not 1 <= build_threads <= 64:
            raise FoundryError("build threads must be 1-64", field="build_threads", found=build_threads)
        if builder not in BUILDERS:
            raise FoundryError("unknown graph builder", field="builder", expected=BUILDERS, found=builder)
        if instantiate not in INSTANTIATE_MODES:
            raise FoundryError("unknown instantiation mode", field="instantiate", expected=INSTANTIATE_MODES,
                               found=instantiate)  # fmt: skip
        if instantiate == "background" and builder != "native":
            raise FoundryError("background instantiation needs the native builder (--builder native)",
                               field="instantiate")  # fmt: skip

    def _check_claims(self, graphs: list[GraphIR]) -> None:
        """Refuse a graph running kernels whose backend's state SAVE did not record."""
        check_claims(graphs, self.registry, self._recorded())

    def _recorded(self) -> set[str]:
        """The backends whose state the archive records."""
        return {backend.name for backend, _ in self.backends}

    def _require_backends(self) -> list[tuple[Backend, Any]]:
        """Every backend whose state the archive records must be installed and able to
        validate and relocate; refused by name otherwise (before any GPU work). Where it
        records none, the installed packages' entry points are read on a thread (every
        package's metadata, on the program's path at its start otherwise), and the
        backends they name are loaded at the restore's claim checks, on its thread (a
        backend's imports would race the program's on another)."""
        from foundry.backends.registry import BackendRegistry, registered

        if not self.record.backends:
            self._discovering = on_thread("foundry-backends", registered)
            return []
        self._registry = BackendRegistry.discover()
        return required_backends(self.record, self._registry)

    @property
    def registry(self) -> BackendRegistry:
        """The installed backends, loaded from the entry points read on a thread where the
        archive records no backend state."""
        if self._registry is None:
            from foundry.backends.registry import BackendRegistry

            assert self._discovering is not None  # _require_backends() started it
            self._registry = BackendRegistry.load(self._discovering.result())
        return self._registry

    def start(self) -> None:
        from foundry.runtime.sessions.environment import current_environment
        from foundry.runtime.sessions.validate import check_environment, check_region, start_module_check

        laps = Laps(self.report.setdefault("start_s", {}))  # the session's start on the program's path, by step
        start_checked(self.mode)
        self.hook = Hook.attach()
        if self.hook.region().mode != "load":
            raise HookError("the hook is not in load mode (start the program with `foundry run --mode load`)")
        # the images' bytes: waited for before a restore, and kept where launch plans load them
        self.module_check = start_module_check(self.archive, keep=self._plan_images())
        laps.mark("hook_and_modules")
        init_cuda(self.device)
        check_active(self.hook)
        laps.mark("cuda")
        check_environment(self.archive.catalog.environment, current_environment(self.device))
        laps.mark("environment")
        self._reserve()
        laps.mark("reserve")
        info = self.hook.region()
        region = check_region(self.record.region, info.base, info.size, relocate=self.relocate)
        self.live_base = info.base
        self.report["relocated_by"] = info.base - region.base
        self.hook.set_owner()
        self.region_restore = RegionRestore(self.hook, self.archive, self.rank, self.device, region, self.warmup_mode,
                                            self.report)  # fmt: skip
        self.region_restore.prefetch()
        self._prefetch_plans()
        self.region_restore.expect()
        laps.mark("region")

    def _prefetch_plans(self) -> None:
        """(``--builder native``) Read and check the launch plans on a thread from now on: an
        engine loads its model before the graph phase that needs them. Whether they apply
        is known at the first ``graph()``; unused, they are dropped."""
        from foundry.runtime.sessions.load_builders import read_plans

        if self._plans_possible():
            self._plans_read = on_thread("foundry-plans-read", read_plans, self.archive, self.rank, self.record.graphs)

    def _plan_images(self) -> frozenset[str]:
        """The images the launch plans bind, where LOAD may build from them (their bytes are
        kept from the module check); none otherwise."""
        from foundry.runtime.sessions.load_builders import plan_images

        return plan_images(self.record.graphs) if self._plans_possible() else frozenset()

    def _plans_possible(self) -> bool:
        """What :meth:`_plans_apply` knows before the region is reserved: the native builder
        asked for, no backend state, a plan for every graph."""
        graphs = self.record.graphs
        return (self.builder == "native" and not self.backends and bool(graphs)
                and all(entry.plan is not None for entry in graphs))  # fmt: skip

    def _reserve(self) -> None:
        try:
            self.hook.reserve()
        except HookError as err:
            hint = "" if self.relocate else "; pass --region-base to load it elsewhere"
            raise DriftError(
                f"the region cannot be reserved at its base (taken in this process, or refused by the driver){hint}",
                field="region.base",
                found=err.found,
            ) from None

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

    def complete(self, backend: str, **objects: Any) -> None:
        from foundry.backends.base import completed_facts

        owner, state = next(((b, s) for b, s in self.backends if b.name == backend), (None, None))
        if owner is None or backend not in self.attached:
            raise FoundryError("complete() of a backend that was not attached before the graphs", field=backend)
        facts = completed_facts(owner, self.attached[backend], objects)
        live = self._live_facts()
        live.facts[backend] = facts
        owner.validate(state, [], live)  # the graphs were validated at restore; these facts are new
        self.attached[backend] = facts
        self.completed.add(backend)

    def warmup(self, fn: Callable[[], Any]) -> None:
        if self.region_restore is not None and self.region_restore.anchor is None:  # where SAVE registered it
            self.region_restore.anchor = anchor_generator()
        if self.warmup_mode == "replay":
            super().warmup(fn)

    def graph(
        self, name: str, fn: Callable[[], Any], *, shape_key: int | None = None, runner: str | None = None
    ) -> RestoredGraph:
        if self.graphs is None:
            self._wait_for_module_check()
            self.graphs = self._restore()
        elif self.region_restore is not None:  # the warm-ups since made SAVE's late allocations again
            self.region_restore.check_followed()
        if name not in self.graphs:
            raise DriftError(
                "the archive has no graph of this name", field="graphs", found=name, expected=sorted(self.graphs)[:8]
            )
        return self.graphs[name]

    def restore_again_at_finish(self, ranges: list[tuple[int, int]]) -> None:
        """(``--warmup restore``) Region ``(offset, size)`` ranges the program makes again during
        its graph phase, after the warm-up bytes were copied (say a buffer an engine creates
        between captures): :meth:`finish` copies SAVE's bytes into them again. Before the
        first ``graph()``."""
        if self.region_restore is None or self.graphs is not None:
            raise FoundryError("restore_again_at_finish() between start() and the first graph()")
        self.region_restore.again = sorted(ranges)

    def finish(self) -> dict[str, Any]:
        if not hasattr(self, "hook"):
            raise FoundryError("finish() before start(): call session.start() before the first CUDA allocation")
        laps = Laps(self.report.setdefault("finish_s", {}))
        unfinished = [b for b, _ in self.backends if b.after_graphs and b.name not in self.completed]
        if unfinished and self.graphs is not None:
            raise DriftError(f"backend {unfinished[0].name!r} needs facts the program gives after its graphs "
                             "(session.complete), which it did not give", field=f"backends.{unfinished[0].name}",
                             expected=list(unfinished[0].after_graphs))  # fmt: skip
        self._wait_for_module_check()  # a session that restored nothing still refuses a damaged archive
        self.checked_images.clear()  # kept for a restore that did not come
        if self.instantiation is not None:  # every instantiation counted, or its error raised
            self.report["instantiated_s"] = self.instantiation.wait() - self._restore_started
        laps.mark("instantiation_wait")
        if self.graphs is not None and self.region_restore is not None:
            self.region_restore.check_followed(complete=True)
            self.region_restore.restore_again()
            self.hook.seal()  # what the program allocates from now on is its own
        laps.mark("trace_and_seal")
        self.release_warmup_pool()
        self.report["counters"] = self.hook.counters()
        return self.report

    def _wait_for_module_check(self) -> None:
        if self.module_check is not None:
            checked = self.module_check.result()  # or its refusal
            self.report["module_check_s"] = checked.seconds
            self.checked_images = checked.data
            self.report["images_kept_bytes"] = sum(len(data) for data in checked.data.values())
            self.module_check = None

    # -- restoring --------------------------------------------------------------

    def _restore(self) -> dict[str, RestoredGraph]:
        try:
            return self._restore_from_plans() if self._plans_apply() else self._restore_from_ir()
        finally:
            self.checked_images.clear()  # the images are loaded, or never will be from these bytes

    def _restore_from_ir(self) -> dict[str, RestoredGraph]:
        import torch

        started = time.perf_counter()
        irs = [self.archive.graph(self.rank, entry) for entry in self.record.graphs]
        decoded = time.perf_counter()
        self._check_claims(irs)  # refusals that need no GPU work come first
        self._validate_backends(irs)
        assert self.region_restore is not None  # start() made it
        self.region_restore.map()
        mapped = time.perf_counter()
        graphs = self._build_all(self.region_restore.record, irs)
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
        return self._plans_possible() and region is not None and self.live_base == region.base

    def _restore_from_plans(self) -> dict[str, RestoredGraph]:
        import torch

        from foundry.runtime.graphs.instantiation import BackgroundInstantiation
        from foundry.runtime.sessions.load_builders import PlanBuilder, binding_report, check_plans

        started = self._restore_started = time.perf_counter()
        assert self.region_restore is not None  # start() made it
        check_plans(self.archive, self.record, self.registry, self._recorded())
        background = self.instantiate == "background"
        ahead, self._plans_read = self._plans_read, None
        plans = PlanBuilder(self.hook, self.archive, self.rank, self.record, threads=self.build_threads, plans=ahead,
                            background=background, images=self.checked_images)  # fmt: skip
        graphs = plans.build(self.region_restore)
        if background:
            self.instantiation = BackgroundInstantiation([g.pending for g in graphs.values() if g.pending])
        torch.cuda.synchronize()
        self.report.update(
            builder="native-plans",
            build_threads=self.build_threads,
            instantiate=self.instantiate,
            **plans.report,
            map_s=plans.mapped - started,
            build_s=time.perf_counter() - plans.mapped,
            restore_s=time.perf_counter() - started,
            graphs=len(graphs),
            **binding_report(plans.functions),
        )
        return graphs

    def _build_all(self, region: RegionRecord, irs: list[GraphIR]) -> dict[str, RestoredGraph]:
        from foundry.runtime.sessions.load_builders import IrBuilder, binding_report
        from foundry.runtime.sessions.validate import check_graph

        begun = time.perf_counter()
        moved_from = None if self.live_base == region.base else (region.base, region.base + region.final_offset)
        builder = IrBuilder(self.hook, self.archive, self.record, native=self.builder == "native",
                            moved_from=moved_from, images=self.checked_images)  # fmt: skip
        owned = [backend for backend, _ in self.backends]
        bound = time.perf_counter()
        for ir in irs:
            check_graph(ir, self.archive, lambda name: any(b.owns(name) for b in owned))
        live = self._live_facts()
        relocate = self.relocation.relocation(live, moved=moved_from is not None)
        if relocate is not None:
            self.report["relocations"] = self.relocation.report(irs, live)
        checked = time.perf_counter()
        graphs = builder.build_all(self.record.graphs, irs, relocate,
                                   lambda ir: partial(self.relocation.region_base, ir, live=live), self.live_base,
                                   progress=self.progress)  # fmt: skip
        self.report.update(
            images_s=bound - begun,
            checks_s=checked - bound,
            native_timing=builder.native_timing,
            builder=self.builder,
            templates=len(builder.templates),
            **binding_report(builder.functions),
        )
        return graphs

    def _relocation_report(self, irs: list[GraphIR]) -> dict[str, dict[str, Any]]:
        """Per region: its backend, its operands and how many of them moved (see
        :meth:`Relocation.report`)."""
        return self.relocation.report(irs, self._live_facts())

    def _live_facts(self) -> ProcessFacts:
        return self.relocation.live_facts(self.live_base)

    def _validate_backends(self, graphs: list[GraphIR]) -> None:
        live = self._live_facts()
        for backend, state in self.backends:
            if backend.name not in self.attached:
                raise DriftError(f"the archive records state for backend {backend.name!r}, which the program did "
                                 "not attach (session.attach)", field=f"backends.{backend.name}")  # fmt: skip
            backend.validate(state, graphs, live)
