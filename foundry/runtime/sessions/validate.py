"""What a LOAD checks before it replays anything.

Each check raises :class:`foundry.errors.DriftError` naming the field that
differs, what the archive recorded and what the live process has. These run
on the CPU too (the tests edit real archives and compare the messages).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from typing import TYPE_CHECKING, NamedTuple

from foundry.archive.reader import Archive
from foundry.archive.schema import Environment, RegionRecord
from foundry.errors import ArchiveError, DriftError
from foundry.graphir.graph import GraphIR
from foundry.graphir.kernel import KernelIdentity
from foundry.graphir.operands import OperandSite
from foundry.graphir.regions import RegionKind
from foundry.runtime.sessions.presence import check_modules_present
from foundry.runtime.threads import on_thread

if TYPE_CHECKING:
    from foundry.archive.schema import BackendState
    from foundry.archive.schema import Session as SessionRecord
    from foundry.backends.base import Backend
    from foundry.backends.registry import BackendRegistry

# fields a LOAD must match; the GPU by model and capability, never by UUID
ENVIRONMENT_FIELDS = ("gpu_name", "compute_capability", "driver_version", "cuda_version", "torch_version")


def check_environment(recorded: Environment, live: Environment) -> None:
    for name in ENVIRONMENT_FIELDS:
        want, have = getattr(recorded, name), getattr(live, name)
        if want != have:
            raise DriftError(
                "the archive was saved in another environment", field=f"environment.{name}", expected=want, found=have
            )


class CheckedImages(NamedTuple):
    """What the module check found: its seconds, and the bytes it read and hashed of the
    images the LOAD asked it to keep (by sha256; else none)."""

    seconds: float
    data: dict[str, bytes]


def start_module_check(archive: Archive, *, keep: frozenset[str] = frozenset()) -> Future[CheckedImages]:
    """Every image a graph names is in the archive, whole and unaltered: the images'
    presence is checked now, their reading and hashing (released from the interpreter
    lock) on a thread beside the program. The future gives the thread's seconds or raises
    the refusal: a LOAD waits for it before it restores a graph. ``keep``: images whose
    checked bytes stay in memory for the LOAD that loads them (read and hashed once, not
    again at the graph phase)."""
    check_modules_present(archive)

    def timed() -> CheckedImages:
        begun = time.perf_counter()
        data = check_module_bytes(archive, keep=keep)
        return CheckedImages(time.perf_counter() - begun, data)

    return on_thread("foundry-module-check", timed)


def check_module_bytes(archive: Archive, *, keep: frozenset[str] = frozenset()) -> dict[str, bytes]:
    """Each module image's bytes hash to its name; returns the bytes of those in ``keep``."""
    kept: dict[str, bytes] = {}
    for blob in archive.catalog.modules.blobs:
        try:
            if blob.sha256 in keep:
                kept[blob.sha256] = archive.module(blob.sha256)
            else:  # hashed as it is read, not held
                archive.check_module(blob.sha256, blob.size)
        except ArchiveError as err:
            raise DriftError(
                "a module image was altered", field=f"modules/{blob.sha256}.bin", expected=blob.sha256, found=err.found
            ) from None
    return kept


def check_image(kernel: KernelIdentity, known: set[str], *, path: str, node: int | None = None) -> None:
    """A restorable kernel names an image the archive holds (``known``: their sha256s)."""
    if kernel.image is None or kernel.image not in known:
        raise DriftError("a kernel's module image is not in the archive", path=path, node=node, kernel=kernel.name,
                         found=kernel.image)  # fmt: skip


def check_graph(ir: GraphIR, archive: Archive, owned: Callable[[str], bool] = lambda region: False) -> None:
    """A restorable graph names its images and points only into the region or into
    regions an attached backend owns (``owned``)."""
    known = {b.sha256 for b in archive.catalog.modules.blobs}
    for node in ir.kernels():
        check_image(node.kernel, known, path=ir.name, node=node.id)
    for operand in ir.operands:
        if operand.region != RegionKind.VMM and not owned(operand.region):
            site = f"param byte {operand.offset}" if operand.site is OperandSite.PARAM else operand.site.value
            raise DriftError(
                f"a pointer ({site}) lies outside the deterministic region, so LOAD cannot guarantee its target",
                path=ir.name,
                node=operand.node,
                found=operand.location(),
            )


def check_region(record: RegionRecord | None, base: int, size: int, *, relocate: bool = False) -> RegionRecord:
    """The archive's region record, if the live region can stand in for it: at SAVE's
    base, or (``relocate``) anywhere, its operands then rebased by the vmm backend."""
    if record is None:
        raise DriftError("the archive has no region record (it was not saved with the hook)", field="region")
    if base != record.base and not relocate:
        raise DriftError(
            "the live region is at another base than SAVE's",
            field="region.base",
            expected=hex(record.base),
            found=hex(base),
        )
    if size < record.final_offset:
        raise DriftError(
            "the live region is smaller than SAVE's final offset",
            field="region.size",
            expected=record.final_offset,
            found=size,
        )
    return record


#: An engine integration's verdict on skipping its warm-ups, in the catalog's model record
#: under ``<engine>.warmup_skip`` ("safe", or why not).
WARMUP_VERDICT_SUFFIX = ".warmup_skip"


def check_warmup_restorable(region: RegionRecord | None, model: Mapping[str, str]) -> None:
    """A LOAD restoring the warm-ups' bytes needs SAVE to have kept them; the refusal
    quotes the verdict an engine integration recorded on why it did not."""
    if region is not None and region.warmup_bytes is not None:
        return
    verdicts = {key: value for key, value in sorted(model.items()) if key.endswith(WARMUP_VERDICT_SUFFIX)}
    raise DriftError("the archive kept no warm-up bytes to restore (LOAD with --warmup replay)",
                     field="region.warmup_bytes", found=verdicts or None)  # fmt: skip


def check_relocation(warmup: str, *, saved_base: int | None = None, live_base: int | None = None) -> None:
    """A LOAD whose region lies at another base than SAVE's (``saved_base``, ``live_base``
    when known) must replay the warm-up: restored warm-up bytes can hold pointers into
    SAVE's region, which nothing rebases."""
    if warmup == "restore":
        raise DriftError(
            "restored warm-up bytes can hold pointers into SAVE's region; relocating needs --warmup replay",
            field="region.base",
            expected=None if saved_base is None else hex(saved_base),
            found=None if live_base is None else hex(live_base),
        )


def check_claim(kernel: KernelIdentity, registry: BackendRegistry, recorded: Iterable[str], *, graph: str,
                node: int | None = None) -> None:  # fmt: skip
    """A kernel a backend claims and whose state that backend needs at LOAD
    (``Backend.needs_state``) is restored only when SAVE recorded that backend's state
    (``recorded``: the backends it did): otherwise it would run against whatever the
    live process has at those addresses. Refused naming the backend."""
    match = registry.recognise(kernel)
    if match is None or not registry.backends[match.backend].needs_state or match.backend in set(recorded):
        return
    raise DriftError(
        f"the graph runs {match.kind} kernels, but SAVE recorded no {match.backend!r} state "
        f"(attach the communicator with session.attach({match.backend!r}, ...) in SAVE and LOAD)",
        path=graph,
        node=node,
        kernel=kernel.name if node is None else None,
    )


def required_backends(record: SessionRecord, registry: BackendRegistry) -> list[tuple[Backend, BackendState]]:
    """Every backend whose state the archive records, installed and able to validate and
    relocate; refused by name otherwise (before any GPU work)."""
    backends = []
    for state in record.backends:
        backend = registry.require(state.backend)
        missing = [step for step in ("validate", "relocate") if step not in backend.implements()]
        if missing:
            raise DriftError(f"backend {state.backend!r} cannot {' or '.join(missing)} yet; this archive "
                             "needs it", field=f"backends.{state.backend}")  # fmt: skip
        backends.append((backend, state))
    return backends


def check_claims(graphs: Iterable[GraphIR], registry: BackendRegistry, recorded: Iterable[str]) -> None:
    """:func:`check_claim` for every kernel node of ``graphs``."""
    names = set(recorded)
    for ir in graphs:
        for node in ir.kernels():  # the registry recognises each kernel name once
            check_claim(node.kernel, registry, names, graph=ir.name, node=node.id)
