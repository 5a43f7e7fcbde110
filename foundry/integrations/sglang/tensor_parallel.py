"""The SGLang plugin at ``--tp-size N``: what each rank's session is told of its communicators.

Each scheduler process is one rank (its ``tp_rank``), with its own ``rank<N>/`` in the
archive. NCCL (torch.distributed's, and SGLang's PyNccl, whose all-reduce graphs capture)
runs with the ``nccl-ipc`` backend's settings, set before SGLang makes its communicators,
so that its buffers come from the deterministic region and its peer memory from the
hook's import zone; the communicator is attached as ``nccl-ipc`` when the graph phase
begins.

SGLang 0.5.17's custom all-reduce (``CustomAllReduceV2``, one for the TP group) is
attached as ``custom-allreduce`` then too, and completed once SGLang has registered its
graphs' inputs (``_register_graph_inputs``, when the capture loop's ``graph_capture``
context ends): a SAVE notes each registration's inputs; a LOAD, which captured nothing,
hands SGLang SAVE's inputs for each registration, so that SGLang's own code exchanges
the IPC handles and fills the pointer table, and the backend proves the table SAVE's.
Its workspace is torch symmetric memory, outside the region: the backend relocates it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from foundry.backends.nccl_ipc import PINNED_ENV
from foundry.errors import FoundryError

CUSTOM_ALLREDUCE = "custom-allreduce"


@dataclass
class CustomAllReduceNotes:
    """A scheduler's ``CustomAllReduceV2`` and what it registered."""

    handles: dict[int, Any] = field(default_factory=dict)  # id(symmetric tensor) -> its rendezvous handle
    communicator: Any = None
    inputs: list[tuple[int, int]] = field(default_factory=list)  # (address, bytes), in registration order
    registrations: list[int] = field(default_factory=list)  # inputs per registration call
    recorded: dict[str, Any] | None = None  # LOAD: SAVE's custom-allreduce record
    # a refusal raised while SGLang builds its communicators, which SGLang catches (it then
    # goes on without custom all-reduce): raised again when the graph phase begins (keeping_refusal)
    refusal: FoundryError | None = None


def pin_nccl() -> None:
    """NCCL's buffers in the region and no registration behind Foundry's back; read by
    NCCL when SGLang makes its communicators, after the scheduler starts."""
    os.environ.update(PINNED_ENV)


def attach_nccl(session: Any, rank: int, world_size: int) -> None:
    import torch

    hook = session.hook
    session.attach("nccl-ipc", world_size=world_size, rank=rank,
                   nccl_version=".".join(map(str, torch.cuda.nccl.version())), region_base=hook.region().base,
                   import_zone=hook.import_zone(), peers=[r for r in range(world_size) if r != rank])  # fmt: skip


def communicator_facts(notes: CustomAllReduceNotes, *, complete: bool) -> dict[str, Any]:
    """The ``custom-allreduce`` facts of the noted communicator (its table's rows, inputs
    and registrations only when ``complete``)."""
    ca = notes.communicator
    handle = notes.handles.get(id(ca._symm_tensor))
    if handle is None:
        raise FoundryError("the custom all-reduce's workspace was not made where the plugin notes it",
                           field="sglang.custom_all_reduce")  # fmt: skip
    facts: dict[str, Any] = {
        "rank": ca.rank, "world_size": ca.world_size,
        "workspaces": [int(handle.buffer_ptrs[r]) for r in range(ca.world_size)],
        "workspace_bytes": int(ca._symm_tensor.numel()), "push_bytes": int(ca.max_push_size),
        "pull_bytes": int(ca.max_pull_size), "num_pull_blocks": int(ca.config.num_pull_blocks),
        "num_push_blocks": int(ca.config.num_push_blocks), "multicast": int(ca.mc_base_ptr) != 0,
        "graph_params": int(ca.graph_params.data_ptr()),
    }  # fmt: skip
    if complete:
        rows = ca.graph_params[: ca._graph_counter].cpu().tolist()
        facts.update(rows=rows, inputs=list(notes.inputs), registrations=list(notes.registrations))
    return facts


@contextlib.contextmanager
def keeping_refusal(notes: CustomAllReduceNotes) -> Iterator[None]:
    """Around the plugin's hooks inside ``CustomAllReduceV2``'s constructor, which SGLang
    calls in a ``try`` that logs and goes on: the first refusal is kept for :func:`raise_refusal`."""
    try:
        yield
    except FoundryError as err:
        notes.refusal = notes.refusal or err
        raise


def note_communicator(notes: CustomAllReduceNotes, ca: Any) -> None:
    if getattr(ca, "disabled", True):
        return
    if notes.communicator is not None:
        raise FoundryError("a second custom all-reduce in one scheduler; the plugin persists the TP group's only",
                           field="sglang.custom_all_reduce")  # fmt: skip
    notes.communicator = ca
    # SGLang hands its multicast address to every kernel once torch's symmetric memory has
    # one, and multicast memory is not relocated: refused at SAVE too, not only at LOAD
    multicast = int(getattr(ca, "mc_base_ptr", 0) or 0)
    if multicast:
        raise FoundryError("the custom all-reduce has NVLink multicast memory, which Foundry does not relocate: "
                           "start the server with TORCH_SYMM_MEM_DISABLE_MULTICAST=1",
                           field="sglang.custom_all_reduce.multicast", found=hex(multicast))  # fmt: skip


def raise_refusal(notes: CustomAllReduceNotes) -> None:
    """The refusal SGLang caught while building its communicators, if any."""
    if notes.refusal is not None:
        raise notes.refusal


def register_inputs(notes: CustomAllReduceNotes, ca: Any, mode: str) -> None:
    """Stands in for ``CustomAllReduceV2._register_graph_inputs``: SAVE notes the inputs
    its graphs' all-reduces read, LOAD hands SGLang SAVE's for the same call; either way
    SGLang registers them through its cudaIpc path, which the hook serves at SAVE's
    addresses. Never its VMM path, which the region's memory would select (it is made
    with cuMemCreate): that maps peers where the driver chooses."""
    if ca is not notes.communicator:
        raise FoundryError("graph inputs registered by a custom all-reduce the plugin did not note",
                           field="sglang.custom_all_reduce")  # fmt: skip
    if mode == "load":
        ca._graph_inputs[:] = _saved_inputs(notes, ca)
    inputs = [(int(ptr), int(size)) for ptr, size in ca._graph_inputs]
    if inputs:
        ca._register_graph_inputs_ipc()
    notes.inputs.extend(inputs)
    # empty calls counted too: a LOAD registers each call's inputs at the same point of its start-up
    notes.registrations.append(len(inputs))


def _saved_inputs(notes: CustomAllReduceNotes, ca: Any) -> list[tuple[int, int]]:
    if ca._graph_inputs:
        raise FoundryError("a LOAD's custom all-reduce was handed graph inputs to register (a graph was captured)",
                           field="sglang.custom_all_reduce", found=len(ca._graph_inputs))  # fmt: skip
    recorded = notes.recorded or {}
    counts, flat = recorded.get("registrations", []), recorded.get("inputs", [])
    call = len(notes.registrations)
    if call >= len(counts):
        return []  # SAVE registered nothing more: the backend's check of the table says the rest
    start = sum(counts[:call])
    return [(flat[2 * i], flat[2 * i + 1]) for i in range(start, start + counts[call])]
