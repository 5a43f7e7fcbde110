"""DeepEP on the CPU: the payload oracle the two-GPU run checks dispatch and combine
with, on synthetic tensors (nested lists), and the deepep-nvl backend's state."""

from __future__ import annotations

import sys
from pathlib import Path

import msgspec
import pytest

from foundry.backends.base import ProcessFacts
from foundry.backends.deepep_nvl import DeepEPNvlBackend
from foundry.errors import BackendError

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "recipes" / "deepep"))
from oracle import PayloadCode, check_combine, check_dispatch, check_rows

CODE = PayloadCode(ranks=2, tokens=300, experts=16)


def test_the_code_is_injective_and_exact_in_bf16():
    seen = set()
    for rank in range(CODE.ranks):
        for token in range(CODE.tokens):
            for expert in range(CODE.experts):
                row = CODE.encode(rank, token, expert)
                assert all(1 <= v <= 128 and v == int(v) for v in row)  # bf16 holds integers to 256 exactly
                assert CODE.decode(row) == (rank, token, expert)
                seen.add(tuple(row))
    assert len(seen) == CODE.ranks * CODE.tokens * CODE.experts and CODE.width == 2
    assert CODE.decode([0.0] * CODE.width) is None  # an element never written


def dispatched(routed):
    received = {}
    for rank, token, expert in sorted(routed):
        received.setdefault(expert, []).append(CODE.encode(rank, token, expert))
    return received


ROUTED = {(r, t, (t * 7 + r) % 16) for r in range(2) for t in range(300)} | {
    (r, t, (t * 3 + 5 + r) % 16) for r in range(2) for t in range(300)
}


def test_a_correct_dispatch_passes():
    assert check_dispatch(CODE, dispatched(ROUTED), ROUTED) == []


def test_a_single_corrupted_element_is_caught():
    received = dispatched(ROUTED)
    received[3][5][1] += 1  # one element of one row
    problems = check_dispatch(CODE, received, ROUTED)
    assert problems and any(p.found == "missing" for p in problems)


def test_rows_swapped_between_tokens_are_caught():
    received = dispatched(ROUTED)
    rows = received[3]
    rows[0], rows[1] = rows[1], list(rows[1])  # a token delivered twice, another lost
    problems = check_dispatch(CODE, received, ROUTED)
    assert any("received 2x" in str(p.found) for p in problems) and any(p.found == "missing" for p in problems)


def test_combine_and_elementwise_checks():
    combined = [CODE.encode(1, t, 0) for t in range(300)]
    assert check_combine(CODE, 1, combined) == []
    broken = [list(row) for row in combined]
    broken[17][0] = 0.0
    (problem,) = check_combine(CODE, 1, broken)
    assert problem.where == "rank 1 token 17"
    assert check_rows(combined, combined) is None
    assert check_rows(combined, broken).where == "row 17 element 0"


def facts(**changes):
    backend = DeepEPNvlBackend()
    base = backend.facts(num_nvl_bytes=1 << 30, num_rdma_bytes=0, use_fabric=False, rank=0, world_size=2,
                         experts_per_rank=8, buffers={"deepep.nvl": 0x600100000000})  # fmt: skip
    base.update(changes)
    return ProcessFacts(0, 2, {"deepep-nvl": base})


def test_deepep_state_is_recorded_and_drift_refused_by_name():
    backend = DeepEPNvlBackend()
    state = backend.record(facts())
    backend.validate(state, [], facts())
    for key, value in (("num_nvl_bytes", 1 << 29), ("world_size", 4), ("rank", 1), ("experts_per_rank", 4),
                       ("num_rdma_bytes", 1 << 20)):  # fmt: skip
        with pytest.raises(BackendError) as err:
            backend.validate(state, [], facts(**{key: value}))
        assert err.value.field == f"deepep-nvl.{key}"
    with pytest.raises(BackendError, match="buffer") as err:
        backend.validate(state, [], facts(buffers={"deepep.nvl": 0x600200000000}))
    assert err.value.field == "deepep-nvl.buffers.deepep.nvl"


def test_fabric_handles_are_refused_at_save():
    with pytest.raises(BackendError, match="use_fabric=False") as err:
        DeepEPNvlBackend().record(facts(use_fabric=True))
    assert err.value.field == "deepep-nvl.use_fabric"


NAMES = Path(__file__).resolve().parent / "fixtures" / "kernel_names" / "deepep.txt"


def _graph_of(kernel_name: str):
    """A one-node graph launching ``kernel_name`` (its real mangled name from the fixture)."""
    from foundry.graphir.graph import GraphIR
    from foundry.graphir.kernel import KernelIdentity, LaunchConfig, ParamLayout, ParamSlot
    from foundry.graphir.nodes import KernelNode

    line = next(row for row in NAMES.read_text().splitlines() if row.startswith(kernel_name + "\t"))
    slots = [ParamSlot(*map(int, p.split(":"))) for p in line.split("\t")[1].split(",")]
    size = slots[-1].offset + slots[-1].size
    ir = GraphIR("moe")
    ir.add_nodes([KernelNode(0, KernelIdentity(kernel_name), LaunchConfig((1, 1, 1), (32, 1, 1)),
                             ParamLayout.of(slots), bytes(size))])  # fmt: skip
    return ir


def test_a_kernel_on_the_rdma_buffer_needs_one_in_the_live_process():
    """Low-latency kernels take DeepEP's RDMA buffer (NVSHMEM): a live Buffer without
    one is refused naming it; intranode kernels need none."""
    backend = DeepEPNvlBackend()
    rdma = {"deepep.nvl": 0x600100000000, "deepep.rdma": 0x7F0000000000}
    low_latency = next(r.split("\t")[0] for r in NAMES.read_text().splitlines() if "12internode_ll8dispatch" in r)
    intranode = next(r.split("\t")[0] for r in NAMES.read_text().splitlines() if "9intranode8dispatch" in r)
    state = backend.record(facts())
    backend.validate(state, [_graph_of(intranode)], facts())
    with pytest.raises(BackendError, match="RDMA buffer") as err:
        backend.validate(state, [_graph_of(low_latency)], facts())
    assert err.value.field == "deepep-nvl.buffers.deepep.rdma" and err.value.node == 0
    with_rdma = backend.record(facts(num_rdma_bytes=1 << 20, buffers=rdma))
    backend.validate(with_rdma, [_graph_of(low_latency)], facts(num_rdma_bytes=1 << 20, buffers=rdma))


def test_the_rdma_buffer_is_a_region_of_the_backend_and_must_not_move():
    """NVSHMEM maps the RDMA buffer outside the deterministic region (on the H200 test
    machine a low-latency dispatch's pointer resolved to ``alloc.0`` and LOAD refused it):
    SAVE resolves such pointers to ``deepep.rdma``, which the backend owns and LOAD
    accepts only at SAVE's address."""
    from foundry.graphir.lower import AddressResolver

    backend = DeepEPNvlBackend()
    rdma = {"deepep.nvl": 0x600100000000, "deepep.rdma": 0x7F0000000000}
    saved = facts(num_rdma_bytes=1 << 20, buffers=rdma)
    regions = backend.regions_for(saved.backend_facts("deepep-nvl"))
    assert [(r.name, r.base, r.size) for r in regions] == [("deepep.rdma", 0x7F0000000000, 1 << 20)]
    resolver = AddressResolver(regions, query_driver=False)
    region, offset = resolver.resolve(0x7F0000000900)
    assert (region.name, offset) == ("deepep.rdma", 0x900) and backend.owns(region.name)
    assert resolver.resolve(0x7F0000000000 + (1 << 20)) is None  # past the buffer: not the backend's
    assert backend.regions_for(facts().backend_facts("deepep-nvl")) == []  # no RDMA buffer, no region
    state = backend.record(saved)
    moved = facts(num_rdma_bytes=1 << 20, buffers={**rdma, "deepep.rdma": 0x7F0000200000})
    with pytest.raises(BackendError, match="not where SAVE saw it") as err:
        backend.validate(state, [], moved)
    assert err.value.field == "deepep-nvl.buffers.deepep.rdma"


def test_nvshmem_settings_are_compared_when_there_is_an_rdma_buffer():
    backend = DeepEPNvlBackend()
    settings = {"NVSHMEM_DISABLE_P2P": "0", "NVSHMEM_MAX_TEAMS": "7"}
    rdma = {"deepep.nvl": 0x600100000000, "deepep.rdma": 0x7F0000000000}

    def with_rdma(nvshmem):
        return ProcessFacts(0, 2, {"deepep-nvl": backend.facts(
            num_nvl_bytes=1 << 30, num_rdma_bytes=1 << 20, use_fabric=False, rank=0, world_size=2,
            experts_per_rank=8, buffers=rdma, nvshmem=nvshmem)})  # fmt: skip

    state = backend.record(with_rdma(settings))
    assert state.version == 2 and state.record["nvshmem.NVSHMEM_MAX_TEAMS"] == "7"
    backend.validate(state, [], with_rdma(settings))
    with pytest.raises(BackendError, match="NVSHMEM_DISABLE_P2P") as err:
        backend.validate(state, [], with_rdma({**settings, "NVSHMEM_DISABLE_P2P": "1"}))
    assert err.value.field == "deepep-nvl.nvshmem.NVSHMEM_DISABLE_P2P" and err.value.found == "1"
    # without an RDMA buffer NVSHMEM holds nothing of DeepEP's: its settings are not compared
    plain = backend.record(facts(nvshmem=settings))
    backend.validate(plain, [], facts(nvshmem={}))
    with pytest.raises(BackendError, match="another version"):
        backend.validate(msgspec.structs.replace(plain, version=1), [], facts())


# -- the two-GPU recipe's own checks (recipes/deepep/ep2.py), without DeepEP ------------------

import ep2  # noqa: E402  (recipes/deepep is on the path above)


def ideal_receipt(rank: int, step: int) -> dict[int, list[list[float]]]:
    """What ``rank``'s experts receive when dispatch is exact (rows in any order)."""
    received = {e: [] for e in range(rank * ep2.LOCAL_EXPERTS, (rank + 1) * ep2.LOCAL_EXPERTS)}
    for r, t, e in sorted(ep2.routed_to(rank, step), reverse=True):
        received[e].append(ep2.token_row(r, t, e))
    return received


def test_routing_reaches_every_expert_from_both_ranks_and_moves_each_step():
    for step in range(ep2.REPLAYS):
        routed = ep2.routed_to(0, step) | ep2.routed_to(1, step)
        assert len(routed) == ep2.WORLD * ep2.TOKENS  # top-1: every token once
        assert {e for _, _, e in routed} == set(range(ep2.EXPERTS))
        assert {r for r, _, _ in ep2.routed_to(0, step)} == {0, 1}
    assert ep2.routing(0, 0) != ep2.routing(0, 1)


def test_the_recipe_passes_an_exact_receipt_and_catches_a_wrong_element_anywhere_in_a_row():
    received = ideal_receipt(1, 3)
    assert ep2.check_received(1, 3, received) == []
    expert = next(e for e, rows in received.items() if rows)
    received[expert][0][ep2.HIDDEN - 1] += 1  # past the code: only the element-by-element check sees it
    (problem,) = ep2.check_received(1, 3, received)
    assert f"expert {expert} row 0" in problem.where and f"element {ep2.HIDDEN - 1}" in problem.where
    stale = ideal_receipt(1, 2)  # the previous step's rows: routed elsewhere now
    assert ep2.check_received(1, 3, stale)


def write_report(path, replays, problems=()):
    rows = [{"recv_count": [1, 2, 3, 4], "received_sha256": {"4": "ab"}, "combined_sha256": f"c{i}",
             "problems": list(problems) if i == 1 else []} for i in range(replays)]  # fmt: skip
    path.write_text(msgspec.json.encode({"replays": rows}).decode())
    return path


def test_compare_wants_every_replay_equal_and_every_oracle_passed(tmp_path, capsys):
    a, b = write_report(tmp_path / "a.json", 8), write_report(tmp_path / "b.json", 8)
    assert ep2.compare([a, b]) == 0 and capsys.readouterr().out.count("identical") == 2
    assert ep2.compare([a, write_report(tmp_path / "c.json", 7)]) == 1
    assert ep2.compare([a, write_report(tmp_path / "d.json", 8, ["expert 4 row 0: expected x, found y"])]) == 1
    (tmp_path / "e.json").write_text("{}")
    assert ep2.compare([a, tmp_path / "e.json"]) == 2


def test_compare_refuses_a_report_with_a_malformed_replay(tmp_path, capsys):
    a = write_report(tmp_path / "a.json", 8)
    (tmp_path / "b.json").write_text('{"replays": [{"problems": []}]}')
    assert ep2.compare([a, tmp_path / "b.json"]) == 2
    assert "not a report of this recipe" in capsys.readouterr().out
