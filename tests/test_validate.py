"""What a LOAD checks before it replays anything (foundry/runtime/sessions/validate.py),
on the H200 SAVE and archives edited from it: environment drift, stripped, missing or
altered images, pointers outside the region, the region record."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from foundry.archive import Archive
from foundry.archive.schema import ModuleState
from foundry.errors import DriftError
from foundry.graphir.regions import Region, RegionKind
from foundry.runtime.sessions.validate import check_environment, check_graph, check_region, start_module_check

from .archive_tools import write_archive
from .conftest import FIXTURES, SAVE_A


def test_environment_drift_is_named_by_field(pair):
    a, _ = pair
    recorded = a.catalog.environment
    check_environment(recorded, recorded)
    for field, value in (("gpu_name", "NVIDIA B200"), ("driver_version", "590.1"), ("torch_version", "2.12.0"),
                         ("cuda_version", "13.1"), ("compute_capability", "10.0")):  # fmt: skip
        with pytest.raises(DriftError) as err:
            check_environment(recorded, msgspec.structs.replace(recorded, **{field: value}))
        assert err.value.field == f"environment.{field}" and err.value.found == value
    # another machine of the same kind (UUID is not recorded) and another Python are fine
    check_environment(recorded, msgspec.structs.replace(recorded, python_version="3.13.0"))


def test_a_stripped_archive_is_refused(pair):
    a, _ = pair
    assert a.catalog.modules.state is ModuleState.STRIPPED
    with pytest.raises(DriftError) as err:
        start_module_check(a).result()
    assert err.value.field == "modules.state" and err.value.found == "stripped"


def _archive_with_module(root: Path, blob: bytes) -> Archive:
    return write_archive(root, [Archive.open(SAVE_A).graph(0, "sample.bs8")], like=SAVE_A, modules=(blob,))


def test_missing_and_altered_module_images_are_refused(tmp_path):
    blob = b"\x7fELF" + bytes(60)
    archive = _archive_with_module(tmp_path / "a", blob)
    start_module_check(archive).result()
    path = next((tmp_path / "a" / "modules").iterdir())
    path.write_bytes(blob[:-1] + b"\x01")
    with pytest.raises(DriftError, match="altered") as err:
        start_module_check(Archive.open(tmp_path / "a")).result()
    assert err.value.field == f"modules/{path.name}"
    path.write_bytes(blob[:-1])  # truncated: refused by its size at once, before any reading
    with pytest.raises(DriftError, match="another size than recorded") as err:
        start_module_check(Archive.open(tmp_path / "a"))
    assert err.value.field == f"modules/{path.name}" and (err.value.expected, err.value.found) == (64, 63)
    path.unlink()
    with pytest.raises(DriftError, match="missing"):
        start_module_check(Archive.open(tmp_path / "a")).result()


def test_graphs_must_name_archived_images_and_point_only_into_the_region(pair):
    a, _ = pair
    ir = a.graph(0, "decode.bs8")
    check_graph(ir, a)
    legacy = Archive.open(FIXTURES / "tiny-qwen3")  # saved before the hook: no module images
    with pytest.raises(DriftError, match="module image is not in the archive"):
        check_graph(legacy.graph(0, "decode.bs1"), legacy)
    ir.regions["host.0"] = Region("host.0", RegionKind.HOST, 0x7F0000000000, 4096)
    first = next(iter(ir.operands))
    ir.set_operands(msgspec.structs.replace(o, region="host.0", region_offset=0) if o == first else o
                    for o in ir.operands)  # fmt: skip
    with pytest.raises(DriftError, match="outside the deterministic region") as err:
        check_graph(ir, a)
    assert err.value.node == first.node and err.value.found == "host.0+0x0"


def test_region_checks(pair):
    a, _ = pair
    record = a.session(0).region
    assert check_region(record, record.base, record.size) is record
    with pytest.raises(DriftError) as err:
        check_region(record, record.base + (16 << 30), record.size)
    assert err.value.field == "region.base"
    assert check_region(record, record.base + (16 << 30), record.size, relocate=True) is record
    with pytest.raises(DriftError, match="smaller"):
        check_region(record, record.base, record.final_offset - 1)
    with pytest.raises(DriftError, match="no region record"):
        check_region(None, record.base, record.size)


@pytest.mark.parametrize(
    "text",
    [
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Thu Oct  2 19:29:10 UTC 2025\n"
        "GCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04)\n",
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (dvs-builder@U16)\n"
        "GCC version:  gcc version 13.2.0\n",
    ],
)
def test_driver_version_is_read_from_proc_for_both_kernel_modules(text):
    """The version a SAVE records and a LOAD compares: the driver's, not gcc's or the architecture's."""
    from foundry.runtime.sessions.environment import version_in_proc

    assert version_in_proc(text) == "580.159.04"
    assert version_in_proc("NVRM version: (no version)\n") is None


def test_a_load_hashes_the_images_on_a_thread_and_waits_for_it_before_restoring(tmp_path):
    from foundry.runtime.sessions.load import LoadSession
    from foundry.runtime.sessions.validate import start_module_check

    blob = b"\x7fELF" + bytes(60)
    archive = _archive_with_module(tmp_path / "a", blob)
    assert start_module_check(archive).result().seconds >= 0
    path = next((tmp_path / "a" / "modules").iterdir())
    path.write_bytes(blob[:-1] + b"\x01")
    altered = Archive.open(tmp_path / "a")
    session = LoadSession(altered)
    session.module_check = start_module_check(altered)  # what start() leaves running
    session._restore = lambda: pytest.fail("restored before the images' bytes were checked")
    with pytest.raises(DriftError, match="altered") as err:
        session.graph("sample.bs8", lambda: None)
    assert err.value.field == f"modules/{path.name}"
    path.unlink()
    with pytest.raises(DriftError, match="missing"):  # presence is checked at once, not on the thread
        start_module_check(Archive.open(tmp_path / "a"))


def test_the_module_check_keeps_the_bytes_of_the_images_asked_for_only(tmp_path):
    blobs = (b"\x7fELF" + bytes(60), b"\x7fELF" + bytes(90))
    archive = write_archive(tmp_path / "a", [Archive.open(SAVE_A).graph(0, "sample.bs8")], like=SAVE_A, modules=blobs)
    shas = sorted(b.sha256 for b in archive.catalog.modules.blobs)
    kept = start_module_check(archive, keep=frozenset(shas[:1])).result().data
    assert list(kept) == shas[:1] and kept[shas[0]] == archive.module(shas[0])
    assert start_module_check(archive).result().data == {}
    for victim in shas:  # one kept, one only hashed: either altered is refused
        path = tmp_path / "a" / "modules" / f"{victim}.bin"
        original = path.read_bytes()
        path.write_bytes(original[:-1] + b"\x01")
        with pytest.raises(DriftError, match="altered") as err:
            start_module_check(Archive.open(tmp_path / "a"), keep=frozenset(shas[:1])).result()
        assert err.value.field == f"modules/{victim}.bin"
        path.write_bytes(original)
