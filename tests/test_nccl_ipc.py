"""The nccl-ipc backend's record and validate steps: NCCL's addresses are proven
identical rather than patched, so its buffers must come from the region (pinned
NCCL settings), the region must sit at SAVE's base and the communicator match."""

from __future__ import annotations

import pytest

from foundry.backends.base import ProcessFacts
from foundry.backends.nccl_ipc import PINNED_ENV, NcclIpcBackend
from foundry.errors import BackendError
from foundry.graphir.operands import Operand, OperandSite

BASE = 0x600000000000


def process(base: int = BASE, **changes) -> ProcessFacts:
    backend = NcclIpcBackend()
    env = {**PINNED_ENV, **changes.pop("env", {})}
    facts = backend.facts(world_size=2, rank=0, nccl_version="2.27.5", env=env)
    facts.update(changes)
    return ProcessFacts(0, 2, {"nccl-ipc": facts, "vmm": {"base": base}})


def test_record_and_validate_the_same_communicator():
    backend = NcclIpcBackend()
    state = backend.record(process())
    assert state.record["region_base"] == BASE and state.record["env.NCCL_CUMEM_ENABLE"] == "0"
    backend.validate(state, [], process())
    peer = Operand(3, OperandSite.PARAM, 0, 8, 0x7F0000001000, "ipc.peer1", 0x1000)
    assert backend.owns("ipc.peer1") and backend.owns("nccl.work") and not backend.owns("vmm")
    assert backend.relocate(peer, process()) == 0x7F0000001000  # proven identical, not patched
    assert set(backend.implements()) == {"recognise", "record", "validate", "relocate"}


@pytest.mark.parametrize("key", list(PINNED_ENV))
def test_save_refuses_nccl_settings_that_let_buffers_escape_the_region(key):
    with pytest.raises(BackendError, match=f"{key}=") as err:
        NcclIpcBackend().record(process(env={key: "1"}))
    assert err.value.field == f"nccl-ipc.env.{key}"


@pytest.mark.parametrize(("change", "field"), [
    ({"world_size": 4}, "nccl-ipc.world_size"),
    ({"rank": 1}, "nccl-ipc.rank"),
    ({"nccl_version": "2.28.0"}, "nccl-ipc.nccl_version"),
])  # fmt: skip
def test_another_communicator_is_refused_by_name(change, field):
    backend = NcclIpcBackend()
    state = backend.record(process())
    with pytest.raises(BackendError, match="differs from SAVE's") as err:
        backend.validate(state, [], process(**change))
    assert err.value.field == field


def test_a_moved_region_is_refused_because_nccl_keeps_pointers_in_its_own_state():
    backend = NcclIpcBackend()
    state = backend.record(process())
    with pytest.raises(BackendError, match="in region_base") as err:
        backend.validate(state, [], process(base=BASE + (16 << 30)))
    assert err.value.expected == BASE


def test_load_with_other_nccl_settings_is_refused():
    backend = NcclIpcBackend()
    state = backend.record(process())
    with pytest.raises(BackendError, match="another NCCL_LOCAL_REGISTER"):
        backend.validate(state, [], process(env={"NCCL_LOCAL_REGISTER": "1"}))


def test_peers_in_the_import_zone_are_named_regions_and_the_zone_must_not_move():
    backend = NcclIpcBackend()
    zone = (0x700000000000, 64 << 30, 8)
    facts = backend.facts(world_size=2, rank=0, nccl_version="none", env=dict(PINNED_ENV), import_zone=zone, peers=[1])
    regions = backend.regions_for(facts)
    assert [(r.name, r.base, r.size) for r in regions] == [("ipc.peer1", 0x700000000000 + (64 << 30), 64 << 30)]
    assert all(backend.owns(r.name) for r in regions)

    def live(**changes) -> ProcessFacts:
        return ProcessFacts(0, 2, {"nccl-ipc": {**facts, **changes}, "vmm": {"base": BASE}})

    state = backend.record(live())
    backend.validate(state, [], live())
    with pytest.raises(BackendError, match="in import_zone") as err:
        backend.validate(state, [], live(import_zone=[0x710000000000, 64 << 30, 8]))
    assert err.value.field == "nccl-ipc.import_zone"
    with pytest.raises(BackendError, match="in peers"):
        backend.validate(state, [], live(peers=[]))
    with pytest.raises(BackendError, match="no slot in the import zone"):
        backend.facts(world_size=2, rank=0, nccl_version="none", import_zone=zone, peers=[8])


def test_a_record_of_the_format_before_the_import_zone_is_refused_by_its_version():
    """Version 1 records had no import zone or peers: refused as an older record, not
    blamed on the live communicator."""
    import msgspec

    backend = NcclIpcBackend()
    state = backend.record(process())
    old = {k: v for k, v in state.record.items() if k not in ("import_zone", "peers")}
    with pytest.raises(BackendError, match="state record of another version") as err:
        backend.validate(msgspec.structs.replace(state, version=1, record=old), [], process())
    assert err.value.field == "nccl-ipc.version"
