"""The backend contract.

A backend owns one family of communicator kernels (or, for ``vmm``, one kind
of memory). Its life has four steps; this contract version defines all four,
and a backend says which it implements:

1. **recognise** (offline): from a kernel's identity, say whether it is one of
   this backend's kernels, its kind (``symm-allreduce``, ``nccl-allreduce``,
   ...) and the role of each parameter (the ABI). Lint and inspect count kinds.
   A backend whose kernels need its recorded state at LOAD (``needs_state``, the
   default) has LOAD refuse a graph that runs them without that state.
2. **record** (SAVE): write the communicator state into a versioned
   :class:`~foundry.archive.schema.BackendState` in the rank's session.
3. **validate** (LOAD, before any replay): compare the live communicator with
   that record and with the graphs; raise :class:`BackendError` naming the
   field that drifted (world size, rank, dtype, capacity, group, pointer
   inventory, graph layout).
4. **relocate** (LOAD): give the live value of every operand in the regions
   the backend owns.

Steps 2-4 raise :class:`BackendError` until a backend implements them, so an
archive that needs them is refused by name rather than restored wrongly.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any, ClassVar, Protocol

import msgspec

from foundry.archive.schema import BackendState
from foundry.errors import BackendError
from foundry.graphir.graph import GraphIR
from foundry.graphir.kernel import KernelIdentity
from foundry.graphir.operands import Operand

#: Version of this contract. A backend declares the version it was written for;
#: the registry refuses any other.
CONTRACT_VERSION = 1

KIND_PATTERN = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")


class ParamRole(msgspec.Struct, frozen=True, array_like=True):
    """What one kernel parameter is to its backend (``buffer_ptrs``, ``numel``, ...)."""

    index: int
    role: str
    pointer: bool = False


class KernelMatch(msgspec.Struct, frozen=True):
    """A backend's claim on a kernel.

    ``requires`` names a capability the kernel needs at LOAD beyond the
    backend itself (``multimem`` for NVLink multicast kernels).
    """

    backend: str
    kind: str
    abi: tuple[ParamRole, ...] = ()
    requires: str | None = None
    relocatable: bool = False


class LiveState(Protocol):
    """What a LOAD process tells backends about itself (implemented by the runtime)."""

    rank: int
    world_size: int

    def backend_facts(self, backend: str) -> dict[str, Any]:
        """Live communicator facts for ``backend`` (buffer addresses, sizes, dtype, group)."""
        ...


class SaveState(Protocol):
    """What a SAVE process tells backends so they can record their state."""

    rank: int
    world_size: int

    def backend_facts(self, backend: str) -> dict[str, Any]: ...


class ProcessFacts:
    """A process as backends see it: its rank, world size and each backend's facts
    (implements :class:`SaveState` and :class:`LiveState`)."""

    def __init__(self, rank: int, world_size: int, facts: dict[str, dict[str, Any]]) -> None:
        self.rank, self.world_size, self.facts = rank, world_size, facts

    def backend_facts(self, backend: str) -> dict[str, Any]:
        return self.facts.get(backend, {})


class Backend(ABC):
    """Base class of every backend, built-in or third-party (see module docstring)."""

    name: ClassVar[str]
    contract: ClassVar[int] = CONTRACT_VERSION
    kinds: ClassVar[frozenset[str]] = frozenset()
    description: ClassVar[str] = ""
    #: Region names, or prefixes ending in ``*`` (``symm.*``, ``ipc.peer*``), whose operands this backend relocates.
    regions: ClassVar[tuple[str, ...]] = ()
    state_version: ClassVar[int] = 1
    #: Whether the kernels this backend claims read state its record describes (a
    #: communicator's buffers, ranks, capacity): LOAD refuses a graph that runs them
    #: unless SAVE recorded this backend's state. True unless a backend says otherwise,
    #: so a third party's collective kernels are never restored unvalidated.
    needs_state: ClassVar[bool] = True
    #: Facts the program can give only once its graphs exist (a pointer table it fills after
    #: capture). It attaches the rest before its first graph and everything again, these
    #: included, with ``session.complete(name, **objects)``: SAVE records them then, LOAD
    #: validates them then and refuses to finish without them. ``validate`` skips what
    #: is absent (the attach before the graphs).
    after_graphs: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def recognise(self, kernel: KernelIdentity) -> KernelMatch | None:
        """Claim ``kernel`` if it is one of this backend's, else ``None``."""

    def implements(self) -> tuple[str, ...]:
        """The contract steps this backend implements, for ``foundry backends list``."""
        steps = ["recognise"]
        for step in ("record", "validate", "relocate"):
            if getattr(type(self), step) is not getattr(Backend, step):
                steps.append(step)
        return tuple(steps)

    def record(self, save: SaveState) -> BackendState:
        raise BackendError(f"backend {self.name!r} cannot record communicator state yet")

    def validate(self, state: BackendState, graphs: list[GraphIR], live: LiveState) -> None:
        raise BackendError(f"backend {self.name!r} cannot validate a LOAD yet")

    def relocate(self, operand: Operand, live: LiveState) -> int:
        raise BackendError(f"backend {self.name!r} cannot relocate operands yet")

    def facts(self, **objects: Any) -> dict[str, Any]:
        """Live facts from the program's own objects (a rendezvous handle, a communicator),
        given to ``session.attach(name, **objects)`` in SAVE and in LOAD."""
        raise BackendError(f"backend {self.name!r} takes no program objects", found=sorted(objects))

    def regions_for(self, facts: dict[str, Any]) -> list[Any]:
        """The named regions SAVE's lowering resolves this backend's operands against."""
        return []

    def owns(self, region: str) -> bool:
        """Whether operands in ``region`` are this backend's to relocate."""
        return any(region == p or (p.endswith("*") and region.startswith(p[:-1])) for p in self.regions)

    def match(self, kind: str, abi: tuple[ParamRole, ...] = (), requires: str | None = None) -> KernelMatch:
        """A :class:`KernelMatch` for this backend (helper for ``recognise``)."""
        # a kernel that needs more than the backend (multicast, NVSHMEM) keeps pointers it cannot relocate
        relocatable = "relocate" in self.implements() and requires is None
        return KernelMatch(self.name, kind, abi, requires, relocatable)


def roles(*names: str, pointers: tuple[str, ...] = ()) -> tuple[ParamRole, ...]:
    """An ABI from parameter role names in ordinal order; ``pointers`` marks pointer roles."""
    return tuple(ParamRole(i, name, name in pointers) for i, name in enumerate(names))


def backend_facts(backend: Backend, objects: dict[str, Any]) -> dict[str, Any]:
    """``backend.facts(**objects)``, with a wrong or missing object refused by name."""
    try:
        return backend.facts(**objects)
    except (TypeError, AttributeError, KeyError) as err:
        raise BackendError(
            f"backend {backend.name!r} cannot read the objects it was given: {err}",
            field=backend.name,
            found=sorted(objects),
        ) from None


def completed_facts(backend: Backend, before: dict[str, Any], objects: dict[str, Any]) -> dict[str, Any]:
    """``backend``'s facts given again once the graphs exist (``session.complete``): only its
    ``after_graphs`` may differ from those attached before, against which the graphs were
    lowered and relocated."""
    if not backend.after_graphs:
        raise BackendError(f"backend {backend.name!r} takes no facts after the graphs", field=backend.name)
    facts = backend_facts(backend, objects)
    missing = [key for key in backend.after_graphs if facts.get(key) is None]
    if missing:
        raise BackendError(f"{backend.name} was completed without what it needs after the graphs",
                           field=f"{backend.name}.{missing[0]}", expected=list(backend.after_graphs))  # fmt: skip
    for key in sorted(before):
        if key not in backend.after_graphs and facts.get(key) != before[key]:
            raise BackendError(f"{backend.name}'s facts changed after its graphs were captured",
                               field=f"{backend.name}.{key}", expected=before[key], found=facts.get(key))  # fmt: skip
    return facts


def require_state_version(backend: Backend, state: BackendState) -> None:
    """Refuse a state record written by another version of ``backend``'s record format."""
    if state.version != backend.state_version:
        raise BackendError("state record of another version", field=f"{backend.name}.version",
                           expected=backend.state_version, found=state.version)  # fmt: skip


def require_same(backend: str, what: str, keys: Iterable[str], recorded: dict[str, Any], live: dict[str, Any]) -> None:
    """Refuse, naming the first key whose live value differs from the recorded one
    (``what`` is the thing compared: "the live NCCL communicator")."""
    for key in keys:
        if live.get(key) != recorded.get(key):
            raise BackendError(
                f"{what} differs from SAVE's in {key}",
                field=f"{backend}.{key}",
                expected=recorded.get(key),
                found=live.get(key),
            )
