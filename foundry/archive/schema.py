"""Typed records of archive format v1 (see ``docs/archive-format.md``).

Every record refuses unknown fields; readers check ``format`` and
``format_version`` before decoding the rest, so a newer archive is refused
by its version, not by the first field this version does not know.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import Annotated, Literal

import msgspec

from foundry.archive.jit_schema import JitIndex
from foundry.archive.outputs import OutputValue
from foundry.graphir.kernel import FuncAttributeName, check_func_attribute
from foundry.graphir.limits import I32, I64, U32, U64, at_most

ARCHIVE_FORMAT = "foundry-archive"
SESSION_FORMAT = "foundry-session"
# of the catalog: 2 adds ``jit`` (the JIT caches); written at the lowest version that holds its content
FORMAT_VERSION = 2
# of sessions: 2 adds ``GlobalRecord.loader_words``, 3 ``GlobalRecord.host_words``, 4
# ``LaunchPlan.graph_sha256``, 5 the allocation phase ``between``. A session is written at the
# lowest version that holds its content, so an archive without them stays readable by older Foundry.
SESSION_VERSION = 6

# Counts a session may hold, checked before the elements are decoded: at least 4x the largest
# real archives (vLLM's ~2,000 piecewise graphs per rank on 8 ranks; SGLang's MoE preset, 52
# graphs; SAVE traces of tens of allocations, sessions of 1,700 device globals).
MAX_WORLD_SIZE = 65_536  # ranks of an archive (their sessions together: files.Limits.sessions)
MAX_ARCHIVE_GRAPHS = 65_536  # graphs of all ranks together (checked as sessions are read)
MAX_GRAPHS = 16_384  # graphs of one rank
MAX_TRACE = 262_144  # allocations of one rank's region
MAX_IMAGES = 65_536  # module images of one rank, and blobs of an archive
MAX_GLOBALS = 65_536  # device globals of one image
MAX_BACKENDS = 256  # state records of one rank

CATALOG_FILE = "foundry-archive.json"
PLAN_SUFFIX = ".fgb"


class Environment(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What a LOAD must match. The GPU is compared by model and compute
    capability, never by UUID, so another machine of the same kind qualifies."""

    gpu_name: str
    compute_capability: str
    driver_version: str
    cuda_version: str
    torch_version: str | None = None
    cuda_bindings_version: str | None = None
    python_version: str | None = None


class RankEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    rank: U32
    session: str
    sha256: str


class ModuleState(StrEnum):
    ABSENT = "absent"  # this SAVE did not record module images (lowering without the hook)
    STRIPPED = "stripped"  # images were recorded and removed to keep the archive small
    COMPLETE = "complete"  # every image a kernel node names is under modules/


class ModuleBlob(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    sha256: str
    size: U64
    format: str = "unknown"  # cubin, fatbin, ptx, unknown


class ModuleIndex(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    state: ModuleState
    blobs: Annotated[tuple[ModuleBlob, ...], at_most(MAX_IMAGES)] = ()


class Catalog(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``foundry-archive.json``: written last, after every rank's session is sealed."""

    format: str
    format_version: int
    tool_version: str
    created: str
    environment: Environment
    world_size: int
    ranks: Annotated[tuple[RankEntry, ...], at_most(MAX_WORLD_SIZE)]
    modules: ModuleIndex
    model: dict[str, str] = {}
    jit: JitIndex | None = None  # the JIT caches the archive carries (``jit/``), version 2


def catalog_version(catalog: Catalog | None) -> int:
    """The lowest catalog format version that holds ``catalog`` (None: a new one, without caches)."""
    return 2 if catalog is not None and catalog.jit is not None else 1


class AllocationRecord(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    """One region allocation: call order, offset, mapped size, bytes asked for, phase
    (``late``: between captures, in a warm-up; ``between``: between captures, the program's
    own; see foundry.runtime.sessions.placement)."""

    order: U64
    offset: U64
    size: U64
    request: U64
    phase: Literal["warmup", "capture", "late", "between"]


class WarmupBytes(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The region bytes the warm-up left, dumped before the first capture so a LOAD
    may restore them instead of repeating the warm-up (``rank<N>/<file>``)."""

    file: str
    sha256: str
    offset: U64  # region offset of the first byte (the cursor when the warm-up began)
    size: U64
    allocations: U64  # allocations made before the warm-up began
    generator_offset: U64  # the default generator's philox offset when the first capture began


class RegionRecord(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The deterministic region of one rank as the native hook left it."""

    base: U64
    size: U64
    final_offset: U64
    allocations: U64
    trace_sha256: str
    warmup_allocations: U64 = 0  # allocations before the first capture: what a LOAD repeats
    warmup_offset: U64 = 0  # the cursor when the first capture began
    trace: Annotated[tuple[AllocationRecord, ...], at_most(MAX_TRACE)] = ()
    warmup_bytes: WarmupBytes | None = None


class GlobalRecord(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A device global of a module image, as SAVE found it."""

    name: str
    size: int
    written: bool  # differs from the image's initial value: the application set it
    sha256: str  # of SAVE's bytes, the loader's words zeroed
    value: bytes | None = None  # SAVE's bytes, kept when written
    # byte offsets of the 8-byte words the module loader fills with code addresses (a table of
    # device function pointers, such as NCCL's ncclDevFuncTable): they differ with every load
    # of the image, so they are neither compared nor restored; unset (not written) when none
    loader_words: tuple[int, ...] | msgspec.UnsetType = msgspec.UNSET
    # byte offsets of the 8-byte words that held an address mapped in SAVE's host process
    # (NVSHMEM's device state points at its pinned host buffers): each process's own
    # initialisation writes its own, so LOAD wants a host address there, not SAVE's value;
    # unset (not written) when none
    host_words: tuple[int, ...] | msgspec.UnsetType = msgspec.UNSET


class ImageRecord(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What SAVE knows of one module image its graphs use."""

    sha256: str
    globals_known: bool  # False: the image's globals could not be listed (e.g. compressed fatbin)
    globals: Annotated[tuple[GlobalRecord, ...], at_most(MAX_GLOBALS)] = ()


def session_version(
    images: Sequence[ImageRecord], graphs: Sequence[GraphEntry] = (), region: RegionRecord | None = None
) -> int:
    """The lowest session format version that holds these image records, graph entries and region."""
    if any(g.instantiate_flags or _plan_sets_cache_config(g) for g in graphs):
        return 6
    if region is not None and any(a.phase == "between" for a in region.trace):
        return 5
    if any(g.plan is not None and g.plan.graph_sha256 is not None for g in graphs):
        return 4
    if any(g.host_words for image in images for g in image.globals):
        return 3
    return 2 if any(g.loader_words for image in images for g in image.globals) else 1


def _plan_sets_cache_config(entry: GraphEntry) -> bool:
    return entry.plan is not None and any(name == "cache_config" for k in entry.plan.kernels for name, _ in k.attrs)


class RngRecord(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A graph that draws philox random numbers: where its seed and offset cells
    are and how far one replay advances the generator's offset."""

    seed_offset: U64  # region offsets of the int64 cells
    offset_offset: U64
    increment: U64


class PlanKernel(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    """Entry ``i`` of a launch plan's function table: the kernel a packed node with
    func ``i`` launches, and the function attributes SAVE recorded for it."""

    image: str
    name: str
    attrs: tuple[tuple[FuncAttributeName, I32], ...] = ()

    def __post_init__(self) -> None:
        for name, value in self.attrs:
            check_func_attribute(name, value)


class LaunchPlan(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A graph packed for the native builder (``rank<N>/plans/<name>.fgb``, the format of
    ``native/src/graph_build.c`` with kernel funcs indexing ``kernels``), so a LOAD at
    SAVE's base builds it without decoding the IR. Written only for graphs whose
    operands all lie in the deterministic region; dropped when a graph is rewritten."""

    file: str
    sha256: str
    size: U64
    kernels: tuple[PlanKernel, ...]
    # the graph file it was packed from: a graph changed after SAVE without its plan is
    # refused on reading, since a LOAD from plans never decodes the graph (None: session
    # format 3 and older, whose plans only `foundry archive verify` can compare)
    graph_sha256: str | None = None


class GraphEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One graph of a rank: its file, integrity and identity."""

    name: str
    file: str
    sha256: str
    size: U64
    fingerprint: str
    nodes: U32
    shape_key: I64 | None = None
    runner: str | None = None
    outputs: OutputValue | None = None
    topology: str | None = None  # graphs with the same key share a LOAD template
    rng: RngRecord | None = None
    plan: LaunchPlan | None = None
    # the flags the driver reported for the program's own graph (torch's on the H200 test
    # machine: auto-free on launch), so that LOAD's graph runs as that one did; unset when 0
    instantiate_flags: U64 | msgspec.UnsetType = msgspec.UNSET

    @property
    def flags(self) -> int:
        """The instantiation flags a LOAD gives this graph (0 when SAVE recorded none)."""
        return self.instantiate_flags or 0

    def __post_init__(self) -> None:
        if self.instantiate_flags and self.instantiate_flags & ~INSTANTIATE_FLAGS:
            raise ValueError(f"instantiate_flags 0x{self.instantiate_flags:x} holds flags a LOAD does not give "
                             f"(at most 0x{INSTANTIATE_FLAGS:x}: auto-free on launch, node priorities)")  # fmt: skip


#: ``CUgraphInstantiate_flags`` a LOAD instantiates with when SAVE saw them: auto-free on
#: launch (1) and per-node priorities (8); upload (2) and device launch (4) are not restored.
INSTANTIATE_FLAGS = 0x1 | 0x8


StateValue = str | I64 | float | bool | None | list[str | I64]


class BackendState(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A backend's versioned record of its communicator state at SAVE."""

    backend: str
    version: I32
    record: dict[str, StateValue]


class Session(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``rank<N>/session.json``: the per-rank graph-session catalog."""

    format: str
    format_version: int
    rank: U32
    graphs: Annotated[tuple[GraphEntry, ...], at_most(MAX_GRAPHS)]
    region: RegionRecord | None = None
    backends: Annotated[tuple[BackendState, ...], at_most(MAX_BACKENDS)] = ()
    images: Annotated[tuple[ImageRecord, ...], at_most(MAX_IMAGES)] = ()
