"""Graphs read in worker processes (foundry/inspect/fanout.py): the same summary and the same
lint report as in one process, the first failing graph's error (in selection order) raised
as it is, and on the command line one line and exit 2, never a traceback."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from foundry.archive import Archive, ArchiveWriter
from foundry.errors import ArchiveError
from foundry.inspect import fanout
from foundry.inspect.lint import Expectation, lint
from foundry.inspect.summary import summarize

from .conftest import FIXTURES


@pytest.fixture(scope="module")
def many(tmp_path_factory) -> Path:
    """Twelve real graphs (the tiny Qwen3 fixture's, under new names) on two ranks."""
    source = Archive.open(FIXTURES / "tiny-qwen3")
    root = tmp_path_factory.mktemp("fanout") / "many"
    writer = ArchiveWriter(root, environment=source.catalog.environment, world_size=2, model={"model": "many"})
    for r in (0, 1):
        rank = writer.rank(r)
        for i in range(6):
            entry = source.entries(0)[i % 3]
            ir = source.graph(0, entry)
            ir.name = f"g{i}"
            rank.add_graph(ir, shape_key=i)
        rank.seal()
    writer.commit()
    return root


def test_workers_give_what_one_process_gives(many, registry):
    archive = Archive.open(many)
    one = summarize(archive, registry, workers=1)
    two = summarize(archive, registry, workers=2)
    assert fanout.workers_for(archive.select(), 2) == 2
    assert two.to_dict() == one.to_dict() and [g.name for g in two.graphs] == [g.name for g in one.graphs]
    expect = [Expectation("kernel", 155), Expectation("memset", 0)]
    l1 = lint(archive, registry, expectations=expect, workers=1)
    l2 = lint(archive, registry, expectations=expect, workers=3)
    assert l2.to_dict() == l1.to_dict() and len(l2.graphs) == 12 and l2.findings  # the sample's warnings


@pytest.fixture(scope="module")
def collectives(tmp_path_factory) -> Path:
    """Four copies of the real symmetric-memory graph (two all-reduces) on one rank."""
    source = Archive.open(FIXTURES / "symm-mem-ws1")
    root = tmp_path_factory.mktemp("fanout") / "symm"
    writer = ArchiveWriter(root, environment=source.catalog.environment, model={"model": "symm"})
    rank = writer.rank(0)
    for i in range(4):
        ir = source.graph(0, source.entries(0)[0])
        ir.name = f"symm{i}"
        rank.add_graph(ir)
    rank.seal()
    writer.commit()
    return root


def test_backends_discovered_while_the_workers_read_count_the_same_collectives(collectives, registry):
    archive = Archive.open(collectives)
    calls = []

    def discover():
        calls.append(os.getpid())
        return registry

    one = summarize(archive, registry, workers=1)
    two = summarize(archive, discover, workers=2)
    assert calls == [os.getpid()]  # once, in this process: the workers never see the backends
    assert two.to_dict() == one.to_dict() and two.collectives == {"symm-allreduce": 8}


def test_the_first_failing_graph_in_order_is_the_error(many, registry, tmp_path):
    root = tmp_path / "damaged"
    shutil.copytree(many, root)
    archive = Archive.open(root)
    selection = archive.select()
    for rank, name in ((1, "g4"), (0, "g3")):  # two damaged graphs; rank 0's comes first in order
        entry = next(e for r, e in selection if (r, e.name) == (rank, name))
        path = archive.graph_path(rank, entry)
        data = path.read_bytes()
        path.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    for workers in (1, 2):
        with pytest.raises(ArchiveError, match="does not match its sha256") as err:
            summarize(Archive.open(root), registry, workers=workers)
        assert err.value.path.endswith("rank0/graphs/g3.msgpack") and err.value.field == "sha256"


def test_only_large_selections_fork(many):
    selection = Archive.open(many).select()
    assert fanout.workers_for(selection) == 1  # a few MB: forking would cost more than it saves
    big = [(r, msgspec.structs.replace(e, size=fanout.PARALLEL_BYTES)) for r, e in selection]
    assert fanout.workers_for(big) == min(fanout.cores(), fanout.MAX_WORKERS, len(big))
    assert fanout.workers_for(selection[:1], 4) == 1


def test_a_damaged_graph_read_by_a_worker_is_one_line_and_exit_2(many, tmp_path, monkeypatch):
    root = tmp_path / "damaged"
    shutil.copytree(many, root)
    archive = Archive.open(root)
    rank, entry = archive.select()[7]
    path = archive.graph_path(rank, entry)
    path.write_bytes(path.read_bytes()[:-3])
    code = ("import sys\nfrom foundry.inspect import fanout\nfanout.PARALLEL_BYTES = 0\n"  # workers for any size
            "from foundry.cli import main\nsys.argv = ['foundry', *sys.argv[1:]]\nmain()\n")  # fmt: skip
    for argv in (
        ("archive", "inspect", str(root)),
        ("graph", "lint", str(root)),
        ("graph", "lint", str(root), "--json"),
    ):
        proc = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and "Traceback" not in proc.stdout + proc.stderr, proc.stderr
        said = proc.stdout if "--json" in argv else proc.stderr
        assert "graph file size differs from its session entry" in said and "g1.msgpack" in said


def test_where_no_worker_can_start_the_graphs_are_read_here(many, registry, monkeypatch):
    """STAND-IN: a process at its limit of processes (or of memory to fork) is refused a worker
    with OSError; this one is not, so the refusal is stood in for, at the second worker."""
    forks = []

    def refuse_the_second():
        if forks:
            raise OSError(11, "Resource temporarily unavailable")
        forks.append(real_fork())
        return forks[-1]

    real_fork = os.fork
    archive = Archive.open(many)
    expected = summarize(archive, registry, workers=1).to_dict()
    monkeypatch.setattr(os, "fork", refuse_the_second)
    assert summarize(archive, registry, workers=2).to_dict() == expected
    with pytest.raises(ChildProcessError):  # the one worker started was stopped and waited for
        os.waitpid(forks[0], os.WNOHANG)
