"""Hostile archives: truncated, bit-flipped, wrong-version, path-traversing,
oversized and garbage files. Every one must give a FoundryError (one clear
message) from every offline command, never another exception, a crash or a hang."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from foundry.archive import Archive
from foundry.archive.schema import CATALOG_FILE
from foundry.cli import main
from foundry.errors import FoundryError
from foundry.graphir.passes.export import export
from foundry.inspect.archive_diff import diff_archives
from foundry.inspect.lint import lint
from foundry.inspect.summary import summarize

from .archive_tools import reseal
from .conftest import FIXTURES

SOURCES = ("compiled-triton", "symm-mem-ws1")
FUZZ = settings(
    max_examples=int(os.environ.get("FOUNDRY_FUZZ_EXAMPLES", "100")),
    deadline=5000,
    suppress_health_check=[HealthCheck.too_slow],
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=30,
)
hostile_paths = st.sampled_from(
    ["../../etc/passwd", "/etc/passwd", "graphs/../../../x", "", "a\x00b", "..", "graphs\\..\\x", "rank0/../../x"]
) | st.text(max_size=40)


def consume(path: Path, registry) -> None:
    """Everything the offline commands do with an archive."""
    archive = Archive.open(path)
    summarize(archive, registry)
    lint(archive, registry)
    for rank, entry in archive.select():
        export(archive.graph(rank, entry), "graphml")
    diff_archives(archive, Archive.open(FIXTURES / path.name))


def files_of(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def run_case(source: str, mutate, registry, *, resealed: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / source
        shutil.copytree(FIXTURES / source, path)
        mutate(path)
        if resealed:  # a mutation that broke the JSON the helper walks leaves the archive as mutated
            with contextlib.suppress(ValueError, KeyError, TypeError, AttributeError, OSError):
                reseal(path, graphs=True)
        try:
            consume(path, registry)
        except FoundryError as err:
            assert str(err)  # one readable line
            assert "\n" not in str(err).strip() or len(str(err)) < 2000


@FUZZ
@given(source=st.sampled_from(SOURCES), which=st.integers(0, 10), cut=st.floats(0, 1), resealed=st.booleans())
def test_truncated_files(registry, source, which, cut, resealed):
    def mutate(path):
        target = files_of(path)[which % len(files_of(path))]
        data = target.read_bytes()
        target.write_bytes(data[: int(len(data) * cut)])

    run_case(source, mutate, registry, resealed=resealed)


@FUZZ
@given(
    source=st.sampled_from(SOURCES),
    which=st.integers(0, 10),
    flips=st.lists(st.tuples(st.floats(0, 1), st.integers(0, 7)), min_size=1, max_size=8),
    resealed=st.booleans(),
)
def test_bit_flips(registry, source, which, flips, resealed):
    def mutate(path):
        target = files_of(path)[which % len(files_of(path))]
        data = bytearray(target.read_bytes())
        for where, bit in flips:
            data[min(int(len(data) * where), len(data) - 1)] ^= 1 << bit
        target.write_bytes(bytes(data))

    run_case(source, mutate, registry, resealed=resealed)


@FUZZ
@given(source=st.sampled_from(SOURCES), version=json_values, in_session=st.booleans())
def test_wrong_versions(registry, source, version, in_session):
    def mutate(path):
        target = path / ("rank0/session.json" if in_session else CATALOG_FILE)
        data = json.loads(target.read_text())
        data["format_version"] = version
        target.write_text(json.dumps(data))

    run_case(source, mutate, registry, resealed=True)


@FUZZ
@given(source=st.sampled_from(SOURCES), hostile=hostile_paths, field=st.sampled_from(["session", "graph"]))
def test_path_traversal(registry, source, hostile, field):
    def mutate(path):
        if field == "session":
            cat = json.loads((path / CATALOG_FILE).read_text())
            cat["ranks"][0]["session"] = hostile
            (path / CATALOG_FILE).write_text(json.dumps(cat))
        else:
            session = json.loads((path / "rank0/session.json").read_text())
            session["graphs"][0]["file"] = hostile
            (path / "rank0/session.json").write_text(json.dumps(session))
            reseal(path, graphs=False)

    run_case(source, mutate, registry, resealed=False)


@FUZZ
@given(source=st.sampled_from(SOURCES), which=st.integers(0, 10), extra=st.integers(1, 1 << 20))
def test_oversized_files(registry, source, which, extra):
    limits = {"foundry-archive.json": 16 << 20, "session.json": 64 << 20}

    def mutate(path):
        target = files_of(path)[which % len(files_of(path))]
        size = limits.get(target.name, 2 << 30) + extra
        with open(target, "r+b") as f:
            f.truncate(size)  # sparse: claims the size without writing it

    run_case(source, mutate, registry, resealed=False)


@FUZZ
@given(source=st.sampled_from(SOURCES), document=json_values, target=st.sampled_from(["catalog", "session"]))
def test_garbage_json_documents(registry, source, document, target):
    def mutate(path):
        (path / (CATALOG_FILE if target == "catalog" else "rank0/session.json")).write_text(json.dumps(document))

    run_case(source, mutate, registry, resealed=target == "session")


@FUZZ
@given(source=st.sampled_from(SOURCES), blob=st.binary(max_size=4096))
def test_garbage_graph_resealed(registry, source, blob):
    def mutate(path):
        for graph in (path / "rank0" / "graphs").iterdir():
            graph.write_bytes(blob)

    run_case(source, mutate, registry, resealed=True)


def test_deep_nesting_is_refused_cleanly(registry, archive_copy):
    path = archive_copy("compiled-triton")
    session = json.loads((path / "rank0/session.json").read_text())
    session["graphs"][0]["outputs"] = "NEST"
    depth = 5000
    nested = '{"type":"seq","container":"list","items":[' * depth + '{"type":"none"}' + "]}" * depth
    (path / "rank0/session.json").write_text(json.dumps(session).replace('"NEST"', nested))
    reseal(path, graphs=False)
    result = CliRunner().invoke(main, ["archive", "inspect", str(path)])
    assert result.exit_code == 2
    assert result.stderr.startswith("foundry: error: ") and "Traceback" not in result.output


@settings(max_examples=25, deadline=10000)
@given(
    source=st.sampled_from(SOURCES), which=st.integers(0, 10), flips=st.lists(st.floats(0, 1), min_size=1, max_size=4)
)
def test_cli_never_crashes(source, which, flips):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / source
        shutil.copytree(FIXTURES / source, path)
        target = files_of(path)[which % len(files_of(path))]
        data = bytearray(target.read_bytes())
        for where in flips:
            data[min(int(len(data) * where), len(data) - 1)] ^= 0x5A
        target.write_bytes(bytes(data))
        reseal_ok = True
        try:
            reseal(path)
        except (ValueError, KeyError, TypeError, AttributeError, OSError):
            reseal_ok = False
        runner = CliRunner()
        for args in (["archive", "inspect", str(path)], ["graph", "lint", str(path)], ["archive", "verify", str(path)]):
            result = runner.invoke(main, args)
            assert result.exit_code in (0, 1, 2), (args, reseal_ok, result.output)
            assert "Traceback" not in result.output and "internal error" not in result.output
