"""The ``custom-allreduce`` backend on SGLang 0.5.17's JIT all-reduce (``CustomAllReduceV2``).

Kernel names and parameter layouts are real: ``sglang_jit.txt`` holds the kernels nvcc
builds from the source in SGLang's wheel (``make_jit_kernel_names.py``). The graphs here
are built by hand around those kernels: a graph holding them is captured only on two or
more GPUs, which this machine lacks; their parameter bytes are what SGLang's host code
(``AllReduceKernel::run``) writes, for the workspace layout ``CustomAllReduceV2`` makes."""

from __future__ import annotations

import shutil
from collections import Counter

import pytest

from foundry.archive.schema import BackendState
from foundry.backends.base import ProcessFacts
from foundry.backends.custom_allreduce import CustomAllReduceBackend
from foundry.backends.custom_allreduce_abi import fields, jit_kernel, params_size, workspace_offsets
from foundry.errors import BackendError, FoundryError
from foundry.graphir.graph import GraphIR
from foundry.graphir.kernel import KernelIdentity, LaunchConfig, ParamLayout, ParamSlot
from foundry.graphir.nodes import KernelNode
from foundry.graphir.operands import Operand, OperandSite
from foundry.graphir.regions import Region, RegionKind

from .test_backends import kernel_names

MB = 1 << 20
# CustomAllReduceV2 at world size 2 on an H200 (sm90 config, 16 MiB cap): 2 x 2 push
# buffers of 16 MiB, a 16 MiB pull buffer, 64 pull semaphores of 128 bytes
PUSH, PULL, PULL_BLOCKS, PUSH_BLOCKS = 16 * MB, 16 * MB, 64, 132
SLAB = 4 * PUSH + PULL + 128 * PULL_BLOCKS
WORKSPACES = [0x7F0000000000, 0x7F0040000000]
TABLE = 0x600000200000  # graph_params, a tensor in the region
VMM = Region("vmm", RegionKind.VMM, 0x600000000000, 1 << 36)
INPUT, OUTPUT, COUNTER = 0x600010000000, 0x600010100000, 0x600000100000
ROWS = [[INPUT, 0x620000000000 + 0x10000000], [INPUT + 0x2000, 0x620000000000 + 0x10002000]]
INPUTS = [(INPUT, 8192), (INPUT + 0x2000, 8192)]  # what the two captured all-reduces registered, in one call


def v2_names() -> list[tuple[str, str]]:
    return [(n, p) for n, p in kernel_names("sglang_jit") if "all_reduce_kernel" in n]


def name_of(dtype: str = "13__nv_bfloat16", world: int = 2, mode: str = "graph", shot: int = 1) -> str:
    code = {"graph": 0, "eager": 1, "multicast": 2}
    for name, _ in v2_names():
        found = jit_kernel(KernelIdentity(name))
        if (found.world_size, found.mode, found.shot, found.pdl) == (world, mode, shot, True) and dtype in name:
            assert mode == "push" or f"PullModeE{code[mode]}E" in name
            return name
    raise AssertionError(f"no kernel {dtype} {world} {mode} {shot}")


def facts(**changes) -> dict:
    given = dict(rank=0, world_size=2, workspaces=WORKSPACES, workspace_bytes=SLAB, push_bytes=PUSH, pull_bytes=PULL,
                 num_pull_blocks=PULL_BLOCKS, num_push_blocks=PUSH_BLOCKS, multicast=False, graph_params=TABLE,
                 rows=ROWS, inputs=INPUTS, registrations=[2])  # fmt: skip
    given.update(changes)
    return CustomAllReduceBackend().facts(**given)


def process(**changes) -> ProcessFacts:
    found = facts(**changes)
    return ProcessFacts(found["rank"], found["world_size"], {"custom-allreduce": found})


def params_of(world: int = 2, rank: int = 0, row: int = 0, workspaces=WORKSPACES, multicast: int = 0
              ) -> tuple[bytes, dict[str, int]]:  # fmt: skip
    """AllReduceParams as AllReduceKernel::run fills it, and the pointer words by field."""
    values = {"input": INPUT, "output": OUTPUT, "num_elements": 4096, "rank": rank,
              "graph_params": TABLE + row * 8 * world, "push_counter": COUNTER, "pull_mc_workspace": multicast,
              "push_buffer_stride": PUSH}  # fmt: skip
    for name, (peer, offset) in workspace_offsets(world, PUSH, PULL).items():
        values[name] = workspaces[peer] + offset
    data = bytearray(params_size(world))
    for field in fields(world):
        data[field.offset : field.offset + field.size] = values[field.name].to_bytes(field.size, "little")
    return bytes(data), {f.name: values[f.name] for f in fields(world) if f.pointer}


def graph_of(name: str, params: bytes, pointers: dict[str, int]) -> GraphIR:
    """One node launching ``name`` with ``params``; its operands resolved as SAVE's lowering
    would, in a process of two ranks."""
    regions = [VMM, *CustomAllReduceBackend().regions_for(facts())]
    layout = {f.name: f for f in fields(jit_kernel(KernelIdentity(name)).world_size)}
    ir = GraphIR("decode.bs8", regions=regions)
    ir.add_nodes([KernelNode(0, KernelIdentity(name), LaunchConfig((64, 1, 1), (512, 1, 1)),
                             ParamLayout.of([ParamSlot(0, len(params))]), params)])  # fmt: skip
    operands = []
    for field_name, value in sorted(pointers.items(), key=lambda item: layout[item[0]].offset):
        region = next((r for r in regions if r.contains(value)), None)
        if region is not None:
            operands.append(Operand(0, OperandSite.PARAM, 0, layout[field_name].offset, value, region.name,
                                    value - region.base))  # fmt: skip
    ir.set_operands(operands)
    ir.check()
    return ir


def saved(**changes) -> BackendState:
    return CustomAllReduceBackend().record(process(**changes))


# -- recognition, on the kernels built from SGLang's source


def test_every_v2_kernel_is_claimed_and_nothing_else(registry):
    counts = Counter((m.backend, m.kind, m.requires) if (m := registry.recognise(KernelIdentity(name))) else None
                     for name, _ in kernel_names("sglang_jit"))  # fmt: skip
    # 8 instances x 7 kernels (push; graph, eager, multicast pulls of 1 and 2 shots); memcpy_kernel<16> not
    assert counts == Counter({("custom-allreduce", "custom-allreduce", None): 40,
                              ("custom-allreduce", "custom-allreduce", "multimem"): 16, None: 1})  # fmt: skip
    modes = Counter((k.world_size, k.mode, k.shot) for n, _ in v2_names() if (k := jit_kernel(KernelIdentity(n))))
    assert modes[(2, "push", 1)] == 4 and modes[(2, "graph", 2)] == 4 and modes[(8, "multicast", 1)] == 2


def test_the_parameter_is_allreduceparams_at_every_world_size():
    for name, params in v2_names():
        world = jit_kernel(KernelIdentity(name)).world_size
        assert params == f"0:{params_size(world)}", name
    assert [params_size(w) for w in (2, 4, 8)] == [104, 152, 248]
    arrays = [f.name for f in fields(2)][5:11]
    names = ("pull_workspaces", "push_workspaces", "pull_semaphores")
    assert arrays == [f"{name}[{r}]" for name in names for r in (0, 1)]


def test_legacy_kernels_stay_claimed_but_not_relocatable(registry):
    name = next(n for n, _ in kernel_names("sglang_kernel") if "cross_device_reduce_2stage" in n)
    match = registry.recognise(KernelIdentity(name))
    assert (match.kind, match.relocatable) == ("custom-allreduce", False)
    assert registry.recognise(KernelIdentity(name_of())).relocatable


# -- state, validation, relocation


def test_record_then_validate_the_same_process():
    params, pointers = params_of()
    backend = CustomAllReduceBackend()
    backend.validate(saved(), [graph_of(name_of(), params, pointers)], process())
    assert saved().record["rows"] == [*ROWS[0], *ROWS[1]]
    assert saved().record["inputs"] == [INPUT, 8192, INPUT + 0x2000, 8192]


@pytest.mark.parametrize("key, value", [
    ("world_size", 4), ("rank", 1), ("push_bytes", 8 * MB), ("num_push_blocks", 128), ("multicast", True),
    ("graph_params", TABLE + 0x1000), ("workspace_bytes", SLAB * 2),
])  # fmt: skip
def test_every_drift_is_refused_by_name(key, value):
    changes = {key: value}
    if key == "world_size":
        changes.update(workspaces=WORKSPACES * 2, rows=[row * 2 for row in ROWS])
    with pytest.raises(BackendError) as err:
        CustomAllReduceBackend().validate(saved(), [], process(**changes))
    assert err.value.field == f"custom-allreduce.{key}"


def test_the_table_registered_again_must_hold_saves_rows():
    backend = CustomAllReduceBackend()
    with pytest.raises(BackendError, match="number of graph inputs") as err:
        backend.validate(saved(), [], process(rows=ROWS[:1]))
    assert err.value.field == "custom-allreduce.rows"
    moved = [ROWS[0], [ROWS[1][0], ROWS[1][1] + 0x1000]]
    with pytest.raises(BackendError, match=r"row 1 of the graph pointer table.*rank 1's input") as err:
        backend.validate(saved(), [], process(rows=moved))
    assert err.value.field == "custom-allreduce.rows[1][1]"


def test_the_inputs_registered_again_must_be_saves_in_saves_calls():
    backend = CustomAllReduceBackend()
    with pytest.raises(BackendError, match="in other calls") as err:
        backend.validate(saved(), [], process(registrations=[1, 1]))
    assert err.value.field == "custom-allreduce.registrations"
    with pytest.raises(BackendError, match="graph input 1 registered with another size") as err:
        backend.validate(saved(), [], process(inputs=[INPUTS[0], (INPUT + 0x2000, 4096)]))
    assert err.value.field == "custom-allreduce.inputs[1]"


def test_before_the_graphs_the_table_is_not_compared_and_save_needs_it_given_after():
    """What only exists after capture is given with session.complete: the attach before the
    graphs is validated without it, and a SAVE that never completed records nothing."""
    backend = CustomAllReduceBackend()
    assert backend.after_graphs == ("rows", "inputs", "registrations")
    params, pointers = params_of()
    backend.validate(saved(), [graph_of(name_of(), params, pointers)], process(rows=None, inputs=None,
                                                                               registrations=None))  # fmt: skip
    with pytest.raises(BackendError, match=r"session\.complete") as err:
        saved(rows=None, inputs=None, registrations=None)
    assert err.value.expected == ["rows", "inputs", "registrations"]


def test_a_rank_given_the_other_ranks_part_is_refused():
    """Rank 1's graph (its kernels say rank 1, its workspace words are its own) in rank 0's process."""
    params, pointers = params_of(rank=1)
    with pytest.raises(BackendError, match="another rank") as err:
        CustomAllReduceBackend().validate(saved(), [graph_of(name_of(), params, pointers)], process())
    assert (err.value.field, err.value.node) == ("custom-allreduce.rank", 0)


def test_a_kernel_of_another_world_size_is_refused():
    params, pointers = params_of(world=4, workspaces=WORKSPACES * 2)
    ir = graph_of(name_of(world=4), params, pointers)
    with pytest.raises(BackendError, match="another world size") as err:
        CustomAllReduceBackend().validate(saved(), [ir], process())
    assert err.value.field == "custom-allreduce.world_size"


def test_a_workspace_word_outside_its_ranks_slab_is_refused():
    params, pointers = params_of(workspaces=WORKSPACES[::-1])  # peers' slabs swapped
    with pytest.raises(BackendError, match="pull_workspaces\\[0\\] is not rank 0's workspace") as err:
        CustomAllReduceBackend().validate(saved(), [graph_of(name_of(), params, pointers)], process())
    assert err.value.field == "custom-allreduce.pull_workspaces[0]"


def test_a_graph_reading_an_unregistered_row_is_refused_and_eager_kernels_read_none():
    params, pointers = params_of(row=2)
    backend = CustomAllReduceBackend()
    with pytest.raises(BackendError, match="had not registered") as err:
        backend.validate(saved(), [graph_of(name_of(), params, pointers)], process())
    assert err.value.field == "custom-allreduce.graph_params"
    backend.validate(saved(), [graph_of(name_of(mode="eager"), params, pointers)], process())
    backend.validate(saved(), [graph_of(name_of(mode="push"), params, pointers)], process())


def test_multicast_kernels_need_multicast():
    params, pointers = params_of()
    with pytest.raises(BackendError, match="multicast") as err:
        CustomAllReduceBackend().validate(saved(), [graph_of(name_of(mode="multicast"), params, pointers)], process())
    assert err.value.field == "custom-allreduce.multicast"


@pytest.mark.parametrize("mode", ["graph", "multicast"])
def test_a_multicast_workspace_is_refused_even_where_multicast_exists(mode):
    """SGLang passes its multicast address to every kernel once multicast exists, whatever
    the pull mode; that memory is bound to its multicast object and is not relocated."""
    params, pointers = params_of(multicast=0x7D0000000000 + 4 * PUSH)
    with pytest.raises(BackendError, match="multicast workspace") as err:
        CustomAllReduceBackend().validate(saved(multicast=True), [graph_of(name_of(mode=mode), params, pointers)],
                                          process(multicast=True))  # fmt: skip
    assert err.value.field == "custom-allreduce.pull_mc_workspace"


def test_a_graph_of_the_legacy_kernels_is_refused_at_load():
    name, layout = next(r for r in kernel_names("sglang_kernel") if "cross_device_reduce_1stage" in r[0])
    slots = [ParamSlot(*map(int, p.split(":"))) for p in layout.split(",")]
    ir = GraphIR("decode.bs1")
    ir.add_nodes([KernelNode(0, KernelIdentity(name), LaunchConfig((1, 1, 1), (512, 1, 1)), ParamLayout.of(slots),
                             bytes(slots[-1].offset + slots[-1].size))])  # fmt: skip
    with pytest.raises(BackendError, match="rank_data") as err:
        CustomAllReduceBackend().validate(saved(), [ir], process())
    assert err.value.field == "custom-allreduce.kernel"


def test_workspace_words_relocate_to_the_live_slabs():
    params, pointers = params_of()
    ir = graph_of(name_of(), params, pointers)
    live = process(workspaces=[0x7E0000000000, 0x7E0080000000])
    backend = CustomAllReduceBackend()
    moved = {o.offset: backend.relocate(o, live) for o in ir.operands if backend.owns(o.region)}
    layout = {f.name: f.offset for f in fields(2)}
    assert moved[layout["pull_workspaces[1]"]] == 0x7E0080000000 + 4 * PUSH
    assert moved[layout["pull_semaphores[0]"]] == 0x7E0000000000 + 4 * PUSH + PULL
    assert len(moved) == 6  # the workspace words; input, output, table row and counter are the region's
    with pytest.raises(BackendError, match="does not own"):
        backend.relocate(Operand(0, OperandSite.PARAM, 0, 0, 1, "car.ws9", 0), live)


def test_facts_refuse_a_table_row_of_another_width():
    with pytest.raises(BackendError, match="one address per rank") as err:
        facts(rows=[[1, 2, 3]])
    assert err.value.field == "custom-allreduce.world_size"
    with pytest.raises(BackendError, match="one address per rank") as err:  # before the graphs: no rows yet
        facts(workspaces=WORKSPACES[:1], rows=None, inputs=None, registrations=None)
    assert err.value.found == [1]


# -- through a LOAD session, on a real archive


def test_a_load_session_validates_the_table_when_completed_and_refuses_to_finish_without_it(tmp_path):
    """The state record goes through the archive's session file (a real H200 archive,
    re-sealed with the record added). The program attaches before its graphs, completes
    after them: the table is validated then, and a LOAD that restored graphs does not
    finish without it."""
    from foundry.errors import DriftError
    from foundry.runtime.sessions.load import LoadSession

    from .archive_tools import edit_json
    from .conftest import FIXTURES
    from .test_torch_symm_mem import started

    archive = tmp_path / "car"
    shutil.copytree(FIXTURES / "symm-mem-ws1", archive)
    state = saved()
    record = {"backend": state.backend, "version": state.version, "record": state.record}
    edit_json(archive / "rank0" / "session.json", lambda s: s.update(backends=[record]), root=archive)
    given = facts()
    before = {k: v for k, v in given.items() if k not in CustomAllReduceBackend.after_graphs}
    session = started(LoadSession(archive))
    with pytest.raises(FoundryError, match="not attached before"):
        session.complete("custom-allreduce", **given)
    session.attach("custom-allreduce", **before)
    with pytest.raises(BackendError, match="completed without") as err:
        session.complete("custom-allreduce", **before)
    assert err.value.field == "custom-allreduce.rows"
    with pytest.raises(BackendError, match="changed after its graphs") as err:
        session.complete("custom-allreduce", **{**given, "workspaces": WORKSPACES[::-1]})
    assert err.value.field == "custom-allreduce.workspaces"
    with pytest.raises(BackendError, match="row 0 of the graph pointer table") as err:
        session.complete("custom-allreduce", **{**given, "rows": [[ROWS[0][0], 0x630000000000], ROWS[1]]})
    assert err.value.field == "custom-allreduce.rows[0][1]"
    session.graphs = {}  # as if its graphs were restored
    with pytest.raises(DriftError, match="after its graphs") as err:
        session.finish()
    assert err.value.field == "backends.custom-allreduce"
    session.complete("custom-allreduce", **given)
    assert session.completed == {"custom-allreduce"}
