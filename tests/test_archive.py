"""Archive v1: writing, reading, commit order, atomic files, the bundled sample."""

from __future__ import annotations

import json
import os
import stat

import pytest

from foundry.archive import Archive, ArchiveWriter, files
from foundry.archive.files import atomic_write, sha256_hex
from foundry.archive.outputs import DictValue, IntValue, SeqValue, TensorSpec
from foundry.archive.sample import sample_path
from foundry.archive.schema import CATALOG_FILE, BackendState, ModuleState
from foundry.errors import ArchiveError

from .conftest import FIXTURES


def write_copy(source: Archive, path, **kwargs) -> Archive:
    writer = ArchiveWriter(path, environment=source.catalog.environment, model=dict(source.catalog.model), **kwargs)
    rank = writer.rank(0)
    for entry in source.entries(0):
        rank.add_graph(source.graph(0, entry), shape_key=entry.shape_key, runner=entry.runner, outputs=entry.outputs)
    rank.seal()
    writer.commit()
    return Archive.open(path)


def test_rewriting_an_archive_reproduces_every_graph_file(tmp_path):
    source = Archive.open(FIXTURES / "tiny-qwen3")
    copy = write_copy(source, tmp_path / "copy")
    for a, b in zip(source.entries(0), copy.entries(0), strict=True):
        assert (a.name, a.sha256, a.size, a.fingerprint, a.nodes, a.outputs) == (
            b.name,
            b.sha256,
            b.size,
            b.fingerprint,
            b.nodes,
            b.outputs,
        )
    assert copy.catalog.environment == source.catalog.environment
    assert copy.catalog.modules.state is ModuleState.ABSENT


def test_instantiation_flags_are_written_only_when_set_and_need_session_format_6(tmp_path):
    source = Archive.open(FIXTURES / "compiled-triton")
    for flags, version in ((9, 6), (0, source.session(0).format_version)):
        writer = ArchiveWriter(tmp_path / f"f{flags}", environment=source.catalog.environment)
        writer.rank(0).add_graph(source.graph(0, "compiled.fused"), instantiate_flags=flags)
        writer.rank(0).seal()
        writer.commit()
        session = tmp_path / f"f{flags}" / "rank0" / "session.json"
        written = json.loads(session.read_text())
        assert written["format_version"] == version
        assert ("instantiate_flags" in written["graphs"][0]) == bool(flags)
        assert (Archive.open(tmp_path / f"f{flags}").entries(0)[0].instantiate_flags or 0) == flags


def test_sample_archive_is_the_tiny_qwen3_fixture():
    sample = Archive.open(sample_path())
    fixture = Archive.open(FIXTURES / "tiny-qwen3")
    assert [e.sha256 for e in sample.entries(0)] == [e.sha256 for e in fixture.entries(0)]
    assert sample.catalog.environment.gpu_name == "NVIDIA H200"


def test_archive_is_invisible_until_the_catalog_is_written(tmp_path):
    source = Archive.open(FIXTURES / "compiled-triton")
    writer = ArchiveWriter(tmp_path / "a", environment=source.catalog.environment, world_size=2)
    writer.rank(0).add_graph(source.graph(0, "compiled.fused"))
    writer.rank(0).seal()
    with pytest.raises(ArchiveError, match="catalog is missing"):
        Archive.open(tmp_path / "a")  # a SAVE killed here leaves nothing that opens
    with pytest.raises(ArchiveError, match="before every rank is sealed"):
        writer.commit()
    writer.rank(1).add_graph(source.graph(0, "compiled.fused"))
    writer.rank(1).seal()
    writer.commit()
    assert Archive.open(tmp_path / "a").ranks == [0, 1]


def test_existing_archive_is_never_replaced_silently(tmp_path):
    source = Archive.open(FIXTURES / "compiled-triton")
    write_copy(source, tmp_path / "a")
    before = (tmp_path / "a" / CATALOG_FILE).read_bytes()
    with pytest.raises(ArchiveError, match="already holds an archive"):
        ArchiveWriter(tmp_path / "a", environment=source.catalog.environment)
    assert (tmp_path / "a" / CATALOG_FILE).read_bytes() == before
    stale = tmp_path / "a" / "rank0" / "graphs" / "stale.msgpack"
    stale.write_bytes(b"old")
    write_copy(source, tmp_path / "a", overwrite=True)
    assert not stale.exists()


def test_a_rank_s_graphs_are_written_with_one_directory_sweep_and_one_sync(tmp_path, monkeypatch):
    """Writing n graphs reads and syncs their directory once, not n times (vLLM saves about
    2,000 graphs a rank); a killed writer's temporary of any graph is still swept, and each
    directory synced before the session that names its files."""
    source = Archive.open(FIXTURES / "tiny-qwen3")
    ir = source.graph(0, source.entries(0)[0])
    graphs = tmp_path / "a" / "rank0" / "graphs"
    graphs.mkdir(parents=True)
    killed = graphs / ".decode.bs3.msgpack.host.999999999.x.tmp"  # no such pid: a killed writer's
    killed.write_bytes(b"part")
    elsewhere = graphs / ".decode.bs3.msgpack.elsewhere.1.x.tmp"  # another host's: not ours to judge
    elsewhere.write_bytes(b"part")
    monkeypatch.setattr("foundry.archive.files._HOST", "host")
    scans, syncs, events = [], [], []
    real_scandir, real_fsync_dir = os.scandir, files._fsync_dir
    monkeypatch.setattr(files.os, "scandir", lambda path: scans.append(str(path)) or real_scandir(path))
    monkeypatch.setattr(files, "_fsync_dir", lambda d: (syncs.append(d), events.append(f"sync {d.name}"),
                                                        real_fsync_dir(d)))  # fmt: skip
    real_write = files.atomic_write

    def write(path, data, **options):
        events.append(f"write {path.name}")
        real_write(path, data, **options)

    monkeypatch.setattr("foundry.archive.writer.atomic_write", write)  # the session's and the catalog's
    writer = ArchiveWriter(tmp_path / "a", environment=source.catalog.environment)
    rank = writer.rank(0)
    for i in range(40):
        ir.name = f"decode.bs{i}"  # one graph under 40 names
        rank.add_graph(ir)
    rank.seal()
    writer.commit()
    assert scans.count(str(graphs)) == 1 and syncs.count(graphs) == 1
    assert events.index("sync graphs") < events.index("write session.json")
    assert not killed.exists() and elsewhere.exists()
    assert len(Archive.open(tmp_path / "a").entries(0)) == 40


def test_sealed_rank_takes_no_more_graphs(tmp_path):
    source = Archive.open(FIXTURES / "compiled-triton")
    writer = ArchiveWriter(tmp_path / "a", environment=source.catalog.environment)
    rank = writer.rank(0)
    ir = source.graph(0, "compiled.fused")
    rank.add_graph(ir)
    with pytest.raises(ArchiveError, match="already has a graph"):
        rank.add_graph(ir)
    rank.seal()
    with pytest.raises(ArchiveError, match="already sealed"):
        rank.add_graph(ir)
    with pytest.raises(ArchiveError, match="rank out of range"):
        writer.rank(1)


def test_graph_names_must_be_safe_file_names(tmp_path):
    source = Archive.open(FIXTURES / "compiled-triton")
    ir = source.graph(0, "compiled.fused")
    ir.name = "../escape"
    writer = ArchiveWriter(tmp_path / "a", environment=source.catalog.environment)
    with pytest.raises(ArchiveError, match="graph names are"):
        writer.rank(0).add_graph(ir)


def test_outputs_backend_state_and_modules_round_trip(tmp_path):
    source = Archive.open(FIXTURES / "compiled-triton")
    writer = ArchiveWriter(tmp_path / "a", environment=source.catalog.environment)
    outputs = DictValue(
        {"logits": TensorSpec("bfloat16", (2, 8), (8, 1), region="alloc.0", region_offset=0), "n": IntValue(3)}
    )
    rank = writer.rank(0)
    rank.add_graph(source.graph(0, "compiled.fused"), outputs=SeqValue("tuple", (outputs,)))
    rank.add_backend_state(BackendState("torch-symm-mem", 1, {"world_size": 1, "dtype": "bfloat16", "ranks": [0]}))
    digest = writer.add_module(b"\x7fELF fake cubin")
    rank.seal()
    writer.commit()
    archive = Archive.open(tmp_path / "a")
    assert archive.entries(0)[0].outputs == SeqValue("tuple", (outputs,))
    assert archive.session(0).backends[0].record["ranks"] == [0]
    assert archive.catalog.modules.state is ModuleState.COMPLETE
    assert archive.module(digest) == b"\x7fELF fake cubin"
    assert digest == sha256_hex(b"\x7fELF fake cubin")


def test_unknown_output_dtype_is_refused(tmp_path):
    source = Archive.open(FIXTURES / "compiled-triton")
    writer = ArchiveWriter(tmp_path / "a", environment=source.catalog.environment)
    with pytest.raises(ArchiveError, match="unknown tensor dtype"):
        writer.rank(0).add_graph(source.graph(0, "compiled.fused"), outputs=TensorSpec("float13", (1,), (1,)))


def test_atomic_write_leaves_no_temporary_and_readable_permissions(tmp_path):
    target = tmp_path / "d" / "f.json"
    atomic_write(target, b"one")
    atomic_write(target, b"two")
    assert target.read_bytes() == b"two"
    assert [p.name for p in target.parent.iterdir()] == ["f.json"]
    assert stat.S_IMODE(target.stat().st_mode) & 0o044 == 0o044


def test_catalog_records_environment_without_gpu_uuid():
    catalog = json.loads((FIXTURES / "tiny-qwen3" / CATALOG_FILE).read_text())
    env = catalog["environment"]
    assert env["gpu_name"] == "NVIDIA H200" and env["compute_capability"] == "9.0"
    assert not any("uuid" in key.lower() for key in env)


def test_a_session_is_written_at_the_lowest_version_that_holds_it(tmp_path):
    import json

    from foundry.archive.schema import GlobalRecord, ImageRecord

    source = Archive.open(FIXTURES / "tiny-qwen3")
    table = GlobalRecord("ncclDevFuncTable", 16, False, "0" * 64, loader_words=(0, 8))
    for name, images, version in (("plain", [ImageRecord("ab" * 32, True)], 1),
                                  ("loader", [ImageRecord("ab" * 32, True, (table,))], 2)):  # fmt: skip
        writer = ArchiveWriter(tmp_path / name, environment=source.catalog.environment)
        writer.rank(0).add_images(images)
        writer.rank(0).seal()
        writer.commit()
        session = tmp_path / name / "rank0" / "session.json"
        assert json.loads(session.read_text())["format_version"] == version
        assert Archive.open(tmp_path / name).session(0).images == tuple(images)


def test_a_launch_plan_setting_a_cache_preference_needs_session_format_6():
    from foundry.archive.schema import GraphEntry, LaunchPlan, PlanKernel, session_version

    def entry(attrs) -> GraphEntry:
        plan = LaunchPlan("plans/g.fgb", "0" * 64, 1, (PlanKernel("1" * 64, "k", attrs),))
        return GraphEntry("g", "graphs/g.fgraph", "2" * 64, 1, "f", 1, plan=plan)

    assert session_version([], [entry((("cache_config", 1),))]) == 6
    assert session_version([], [entry((("max_dynamic_shared_size_bytes", 65536),))]) == 1
