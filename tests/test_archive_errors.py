"""Every archive check, each hit on purpose with the archive re-sealed so that
earlier integrity checks pass, and each asserting its own message."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import msgspec
import pytest
from click.testing import CliRunner

from foundry.archive import Archive
from foundry.archive.schema import CATALOG_FILE
from foundry.cli import main
from foundry.errors import ArchiveError

from .archive_tools import edit_graph, edit_json, graph_file, reseal


def open_all(path, *, deep=True):
    archive = Archive.open(path)
    for rank, entry in archive.select():
        archive.graph(rank, entry, deep=deep)
    return archive


def catalog(path):
    return path / CATALOG_FILE


def session(path, rank=0):
    return path / f"rank{rank}" / "session.json"


def test_missing_path_and_plain_file(tmp_path):
    with pytest.raises(ArchiveError, match="no such archive"):
        Archive.open(tmp_path / "nope")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ArchiveError, match="an archive is a directory"):
        Archive.open(tmp_path / "file")


def test_catalog_missing_or_not_decodable(archive_copy):
    path = archive_copy("compiled-triton")
    catalog(path).write_text("{not json")
    with pytest.raises(ArchiveError, match="cannot be decoded") as err:
        Archive.open(path)
    assert err.value.path.endswith(CATALOG_FILE)
    catalog(path).unlink()
    with pytest.raises(ArchiveError, match="catalog is missing"):
        Archive.open(path)


@pytest.mark.parametrize(
    ("edit", "message", "field"),
    [
        (lambda c: c.update(format="something-else"), "not a Foundry file of this kind", "format"),
        (lambda c: c.update(format_version=3), "written by a newer Foundry", "format_version"),
        (lambda c: c.update(format_version=0), "unsupported format version", "format_version"),
        (lambda c: c.update(format_version="1"), "Expected `int | null`, got `str`", "format_version"),
        (lambda c: c.update(surprise=True), "unknown field `surprise`", None),
        (lambda c: c.update(world_size="one"), "Expected `int`, got `str`", "world_size"),
        (lambda c: c.update(world_size=2), "ranks must be 0..world_size-1", "ranks"),
        (lambda c: c["ranks"][0].update(session="../../etc/passwd"), "stay inside the archive", "ranks[0].session"),
        (lambda c: c["ranks"][0].update(sha256="abc"), "not a sha256", "ranks[0].sha256"),
        (lambda c: c["modules"].update(blobs=[{"sha256": "0" * 64, "size": 1}]), "'absent' but blobs", "modules"),
    ],
)
def test_catalog_checks(archive_copy, edit, message, field):
    path = archive_copy("compiled-triton")
    edit_json(catalog(path), edit)
    with pytest.raises(ArchiveError, match=message) as err:
        open_all(path)
    if field:
        assert err.value.field == field


def test_session_altered_after_commit(archive_copy):
    path = archive_copy("compiled-triton")
    edit_json(session(path), lambda s: s["graphs"][0].update(runner="edited"))
    with pytest.raises(ArchiveError, match="session does not match the catalog's sha256"):
        open_all(path)


def _wide_global(s: dict) -> dict:
    """The first recorded device global of at least 16 bytes in a real H200 SAVE's session."""
    return next(g for image in s["images"] for g in image["globals"] if g["size"] >= 16)


TRITON, GLOBALS = "compiled-triton", "saveload-a"  # GLOBALS: a real H200 SAVE whose session records device globals


@pytest.mark.parametrize(
    ("fixture", "edit", "message"),
    [
        (TRITON, lambda s: s.update(rank=3), "session belongs to another rank"),
        (TRITON, lambda s: s["graphs"].append(dict(s["graphs"][0])), "graph name used twice"),
        (TRITON, lambda s: s["graphs"][0].update(sha256="F" * 64), "not a sha256"),
        (TRITON, lambda s: s["graphs"][0].update(file="../../foundry-archive.json"), "stay inside the archive"),
        (TRITON, lambda s: s["graphs"][0].update(file="/etc/passwd"), "stay inside the archive"),
        (TRITON, lambda s: s.update(format_version=9), "written by a newer Foundry"),
        (TRITON, lambda s: s["graphs"][0].update(outputs={"type": "pickle", "value": "x"}),
         "Invalid value 'pickle'"),
        (TRITON,
         lambda s: s["graphs"][0].update(outputs={"type": "tensor", "dtype": "float13", "shape": [], "stride": []}),
         "unknown tensor dtype"),
        (GLOBALS, lambda s: _wide_global(s).update(host_words=[4]), "not an 8-byte word inside the global"),
        (GLOBALS, lambda s: _wide_global(s).update(loader_words=[_wide_global(s)["size"] - 4]),
         "not an 8-byte word inside the global"),
        (GLOBALS, lambda s: _wide_global(s).update(host_words=[-8]), "not an 8-byte word inside the global"),
        (GLOBALS, lambda s: _wide_global(s).update(size=_wide_global(s)["size"] + 8, value="AAAA"),
         "differ from its size"),
        (GLOBALS, lambda s: _wide_global(s).update(host_words=[0]), "holds fields of format version 3"),
        (TRITON, lambda s: s["graphs"][0].update(instantiate_flags=9), "holds fields of format version 6"),
        (TRITON, lambda s: s.update(format_version=6) or s["graphs"][0].update(instantiate_flags=4),
         "holds flags a LOAD does not give"),
        (TRITON, lambda s: s.update(format_version=6) or s["graphs"][0].update(instantiate_flags=-1),
         "Expected `int` >= 0"),
    ],
)  # fmt: skip
def test_session_checks(archive_copy, fixture, edit, message):
    path = archive_copy(fixture)
    edit_json(session(path), edit, root=path)
    with pytest.raises(ArchiveError, match=message):
        open_all(path)


def test_graph_bytes_flipped_without_reseal(archive_copy):
    path = archive_copy("compiled-triton")
    target = graph_file(path, "compiled.fused")
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x01
    target.write_bytes(bytes(data))
    with pytest.raises(ArchiveError, match="graph does not match its sha256"):
        open_all(path)
    target.write_bytes(bytes(data) + b"\x00")
    with pytest.raises(ArchiveError, match="graph file size differs"):
        open_all(path)


def test_truncated_graph_resealed_fails_to_decode(archive_copy):
    path = archive_copy("compiled-triton")
    target = graph_file(path, "compiled.fused")
    target.write_bytes(target.read_bytes()[:1000])
    reseal(path)
    with pytest.raises(ArchiveError, match=r"cannot be decoded|Input data was truncated"):
        open_all(path)


def test_operand_tampering_is_caught_by_the_deep_check(archive_copy):
    path = archive_copy("symm-mem-ws1")

    def bump(ir):
        ops = list(ir.operands)
        ops[0] = msgspec.structs.replace(ops[0], value=ops[0].value + 64, region_offset=ops[0].region_offset + 64)
        ir.set_operands(ops)

    edit_graph(path, "symm.allreduce", bump)
    open_all(path, deep=False)  # structure is intact: offline views still work
    with pytest.raises(ArchiveError, match="disagrees with the node's bytes") as err:
        open_all(path)
    assert err.value.node == 0


def test_graph_name_must_match_its_entry(archive_copy):
    path = archive_copy("compiled-triton")
    edit_graph(path, "compiled.fused", lambda ir: setattr(ir, "name", "other"))
    edit_json(session(path), lambda s: s["graphs"][0].update(name="compiled.fused"), root=path)
    with pytest.raises(ArchiveError, match="disagrees with its session entry"):
        open_all(path)


def test_symlinked_graph_is_refused(archive_copy, tmp_path):
    path = archive_copy("compiled-triton")
    target = graph_file(path, "compiled.fused")
    inside = target.with_name("real.msgpack")
    target.rename(inside)
    target.symlink_to(inside.name)
    with pytest.raises(ArchiveError, match="symbolic link; archives hold plain files only"):
        open_all(path)
    outside = tmp_path / "outside.msgpack"
    inside.rename(outside)
    target.unlink()
    target.symlink_to(outside)
    with pytest.raises(ArchiveError, match="path leaves the archive"):
        open_all(path)


def test_a_graph_directory_linked_out_of_the_archive_is_refused(archive_copy, tmp_path):
    path = archive_copy("compiled-triton")
    graphs = graph_file(path, "compiled.fused").parent
    graphs.rename(tmp_path / "elsewhere")  # the same files, outside, reached through a directory link
    graphs.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ArchiveError, match="path leaves the archive"):
        open_all(path)


def test_a_graph_linked_to_itself_or_named_past_the_file_system_s_limit_is_one_refusal(archive_copy, tmp_path):
    path = archive_copy("compiled-triton")
    target = graph_file(path, "compiled.fused")
    target.unlink()
    target.symlink_to(target.name)  # a loop of one link
    with pytest.raises(ArchiveError, match="path cannot be followed") as err:
        open_all(path)
    assert err.value.field.endswith(".file")
    result = CliRunner().invoke(main, ["archive", "inspect", str(path)])
    assert result.exit_code == 2 and "path cannot be followed" in result.output
    long_name = archive_copy("compiled-triton", "long")  # a name over 255 bytes: lstat cannot read it
    edit_json(long_name / "rank0" / "session.json", lambda d: d["graphs"][0].update(file="graphs/" + "a" * 300),
              root=long_name)  # fmt: skip
    with pytest.raises(ArchiveError) as err:
        open_all(long_name)
    assert not isinstance(err.value, OSError) and err.value.path is not None


def test_fifo_is_refused_without_blocking(archive_copy):
    path = archive_copy("compiled-triton")
    target = graph_file(path, "compiled.fused")
    target.unlink()
    os.mkfifo(target)
    with pytest.raises(ArchiveError, match="not a regular file"):
        open_all(path)


def test_oversized_files_are_refused_unread(archive_copy):
    path = archive_copy("compiled-triton")
    target = graph_file(path, "compiled.fused")
    with open(target, "wb") as f:
        f.truncate(3 << 30)  # sparse: 3 GiB claimed, nothing read
    with pytest.raises(ArchiveError, match="larger than the reader accepts"):
        open_all(path)
    with open(catalog(path), "wb") as f:
        f.truncate(64 << 20)
    with pytest.raises(ArchiveError, match="larger than the reader accepts"):
        Archive.open(path)


def test_module_blob_is_checked(archive_copy):
    path = archive_copy("compiled-triton")
    blob = b"\x7fELF cubin"
    from foundry.archive.files import sha256_hex

    digest = sha256_hex(blob)
    (path / "modules").mkdir()
    (path / "modules" / f"{digest}.bin").write_bytes(blob + b"!")
    edit_json(
        catalog(path), lambda c: c.update(modules={"state": "complete", "blobs": [{"sha256": digest, "size": 10}]})
    )
    archive = Archive.open(path)
    with pytest.raises(ArchiveError, match="module image does not match its sha256"):
        archive.module(digest)


def test_cli_reports_one_line_and_exit_2(archive_copy):
    path = archive_copy("compiled-triton")
    edit_json(catalog(path), lambda c: c.update(format_version=3))
    runner = CliRunner()
    for args in (
        ["archive", "inspect", str(path)],
        ["graph", "lint", str(path)],
        ["archive", "diff", str(path), str(path)],
    ):
        result = runner.invoke(main, args)
        assert result.exit_code == 2, result.output
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("foundry: error: ")
        assert "written by a newer Foundry" in lines[0] and CATALOG_FILE in lines[0]
        assert "Traceback" not in result.output


def test_cli_json_error_is_machine_readable(archive_copy):
    path = archive_copy("compiled-triton")
    edit_json(catalog(path), lambda c: c.update(world_size="one"))
    result = CliRunner().invoke(main, ["archive", "inspect", str(path), "--json"])
    assert result.exit_code == 2
    payload = json.loads(result.stdout)  # the one JSON object on stdout, where scripts read; nothing on stderr
    assert payload["ok"] is False and payload["error"]["field"] == "world_size"
    assert result.stderr == ""


SWAPPED_IN = r"""
import os, pathlib, sys
from foundry.archive.files import read_bounded
from foundry.errors import ArchiveError
path, regular = pathlib.Path(sys.argv[1]), sys.argv[2]
os.mkfifo(path)
# the race, made certain: whatever the reader asks about the path by name sees the regular file
# it checked a moment ago; only the FIFO is there when it opens it
real_lstat, real_stat = os.lstat, os.stat
os.lstat = lambda p, *a, **k: real_lstat(regular) if str(p) == str(path) else real_lstat(p, *a, **k)
os.stat = lambda p, *a, **k: real_stat(regular) if str(p) == str(path) else real_stat(p, *a, **k)
pathlib.Path.lstat = lambda self: os.lstat(self)
try:
    read_bounded(path, 1 << 20, what="graph")
except ArchiveError as err:
    print(err)
"""


def test_a_fifo_swapped_in_after_any_check_by_name_is_refused_unblocked(tmp_path):
    """The reader checks what it opened, not the name it looked at before."""
    regular = tmp_path / "regular"
    regular.write_bytes(b"x")
    proc = subprocess.run([sys.executable, "-c", SWAPPED_IN, str(tmp_path / "graph"), str(regular)],
                          capture_output=True, text=True, timeout=20)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "not a regular file" in proc.stdout


SWAPPING = r"""
import os, sys, threading
from pathlib import Path
from foundry.archive.files import read_bounded
from foundry.errors import ArchiveError
root = Path(sys.argv[1])
target, regular, fifo = root / "graph", root / "regular", root / "fifo"
stop = threading.Event()
def swap():  # the FIFO and a regular file take turns under the reader's name
    while not stop.is_set():
        regular.write_bytes(b"graph bytes")
        os.replace(regular, target)
        os.mkfifo(fifo)
        os.replace(fifo, target)
thread = threading.Thread(target=swap)
thread.start()
outcomes = {"read": 0, "refused": 0}
for _ in range(1000):
    try:
        assert read_bounded(target, 1 << 20, what="graph") == b"graph bytes"
        outcomes["read"] += 1
    except ArchiveError as err:
        assert "not a regular file" in str(err) or "missing" in str(err), err
        outcomes["refused"] += 1
stop.set()
thread.join()
print(outcomes["read"] + outcomes["refused"])
"""


def test_a_reader_racing_a_fifo_swap_never_blocks(tmp_path):
    proc = subprocess.run([sys.executable, "-c", SWAPPING, str(tmp_path)], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1000"]
