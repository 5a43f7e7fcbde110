"""Listing the device globals of module images, on images nvcc builds here (CPU only:
nvcc compiles without a GPU). SAVE uses the list to record and LOAD to check or
restore what the application wrote; an image it cannot read is 'unknown'."""

from __future__ import annotations

import shutil
import struct
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from foundry.errors import CaptureError, DriftError
from foundry.runtime.code.module_globals import ZSTD_MAGIC, global_names

SOURCE = r"""
__device__ int scale;
__device__ float table[4] = {1, 2, 3, 4};
__constant__ int limits[2];
extern "C" __global__ void scaled(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] * scale * table[i % 4] + limits[0];
}
"""
EXPECTED = [("limits", 8), ("scale", 4), ("table", 16)]
NVCC = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    if not Path(NVCC).is_file():
        pytest.skip("nvcc is not installed here")
    work = tmp_path_factory.mktemp("nvcc")
    (work / "k.cu").write_text(SOURCE)

    def make(name: str, *flags: str) -> bytes:
        subprocess.run([NVCC, *flags, "-o", str(work / name), str(work / "k.cu")], check=True, capture_output=True)
        return (work / name).read_bytes()

    return make


def test_globals_of_a_cubin(build):
    assert global_names(build("k.cubin", "-cubin", "-arch=sm_90")) == EXPECTED


def test_globals_of_a_compressed_multi_arch_fatbin(build):
    image = build("k.fatbin", "-fatbin", "-gencode", "arch=compute_90,code=sm_90",
                  "-gencode", "arch=compute_80,code=sm_80", "-Xfatbin=-compress-all")  # fmt: skip
    assert ZSTD_MAGIC in image  # the members really are compressed, as torch's are on the H200
    assert global_names(image) == EXPECTED


def test_a_compressed_fatbin_without_zstandard_is_refused_naming_the_fix(build, monkeypatch):
    """Without the zstandard module a SAVE would record torch's compressed images as having
    unknown globals, and every LOAD would refuse their fresh copies: it refuses at once."""
    image = build("k3.fatbin", "-fatbin", "-arch=sm_90", "-Xfatbin=-compress-all")
    monkeypatch.setitem(sys.modules, "zstandard", None)  # as if it were not installed
    with pytest.raises(CaptureError, match=r"zstd-compressed fatbin.*pip install 'foundry\[gpu\]'"):
        global_names(image)


def test_images_that_cannot_be_read_are_unknown(build):
    ptx_only = build("k.ptx.fatbin", "-fatbin", "-gencode", "arch=compute_90,code=compute_90")
    assert global_names(ptx_only) is None  # a PTX-only image: the JIT decides, nothing to list
    cubin = build("k2.cubin", "-cubin", "-arch=sm_90")
    assert global_names(cubin[:200]) is None  # truncated
    assert global_names(b"\x00" * 64) is None
    fatbin = bytearray(build("k2.fatbin", "-fatbin", "-arch=sm_90", "-Xfatbin=-compress-all"))
    at = fatbin.index(ZSTD_MAGIC)
    fatbin[at + 8 : at + 24] = bytes(16)  # damage the compressed stream
    assert global_names(bytes(fatbin)) is None
    assert global_names(struct.pack("<IHHQ", 0xBA55ED50, 1, 16, 1 << 40)) is None  # claims more than it has


def test_words_the_loader_fills_are_left_out_of_comparison_and_restore():
    """Two fresh loads of one image disagree exactly on the code addresses the loader
    wrote (a function-pointer table); those words are neither compared nor restored."""
    from foundry.archive.schema import GlobalRecord
    from foundry.runtime.code.module_globals import _keep_loader_words, _record, loader_words, without_words

    code = (0x7F00_0000_1000).to_bytes(8, "little")
    table_a = code + (5).to_bytes(8, "little")  # a code address, then data
    table_b = (0x7F00_0000_9000).to_bytes(8, "little") + (5).to_bytes(8, "little")
    assert loader_words(table_a, table_b) == (0,)
    assert without_words(table_a, (0,)) == without_words(table_b, (0,)) == bytes(8) + table_a[8:]
    untouched = _record("ops", table_b, table_a, (0,))  # the live copy: only its code addresses differ
    assert not untouched.written and untouched.value is None and untouched.loader_words == (0,)
    written = _record("ops", table_b[:8] + (9).to_bytes(8, "little"), table_a, (0,))
    assert written.written and written.sha256 != untouched.sha256
    fresh = (0x7F00_0000_5000).to_bytes(8, "little") + (5).to_bytes(8, "little")
    assert _keep_loader_words(written, fresh) == fresh[:8] + (9).to_bytes(8, "little")
    plain = GlobalRecord("scale", 4, True, "0" * 64, b"\x03\0\0\0")
    assert _keep_loader_words(plain, bytes(4)) == b"\x03\0\0\0"
    assert without_words(b"ab", plain.loader_words) == b"ab"


def test_a_refused_global_names_the_words_that_differ():
    """LOAD's refusal of a live global says where SAVE's bytes and the live ones part
    (loader words excluded), so a per-process value reads as such."""
    from foundry.runtime.code.module_globals import _first_differences, _record

    words = [1, 0x7F00_0000_1000, 3, 0x6000_0000_0000, 5]
    saved = b"".join(w.to_bytes(8, "little") for w in words)
    record = _record("state", saved, bytes(len(saved)), (8,))
    live = bytearray(saved)
    live[8:16] = (0x7F00_0000_2000).to_bytes(8, "little")  # a loader word: not reported
    live[24:32] = (0x6000_4000_0000).to_bytes(8, "little")
    expected, found = _first_differences(record, bytes(live))
    assert expected == {"+0x18": "0x600000000000"} and found == {"+0x18": "0x600040000000"}
    assert _first_differences(record, None) == (None, "unreadable")
    unwritten = _record("zeros", bytes(16), bytes(16), ())  # SAVE kept no bytes: only the live hash
    assert _first_differences(unwritten, b"\x01" * 16)[1].startswith("sha256 ")


def test_words_holding_host_addresses_are_the_processs_own(monkeypatch):
    """NVSHMEM's device state held three pinned-host addresses that a LOAD's process
    mapped elsewhere (seen on the H200 test machine). SAVE lists such words; LOAD
    bound to the live copy wants a host address of its own there and SAVE's bytes
    everywhere else; a fresh copy, which no initialisation of this process filled,
    is refused. Reading the live global needs a GPU, so this test hands check_live
    the bytes the driver would return (``_read_global`` replaced)."""
    from foundry.archive.schema import ImageRecord
    from foundry.errors import DriftError
    from foundry.graphir.regions import AddressRanges
    from foundry.runtime.code import module_globals as mg

    save_host = AddressRanges([(0x7FFC_0000_0000, 0x7FFD_0000_0000),
                               (0x40_0000, 0x200_0000)])  # a heap at a few MiB (no PIE, no randomisation)  # fmt: skip
    live_host = AddressRanges([(0x7F19_0000_0000, 0x7F1A_0000_0000)])

    def state(pinned: int, heap: int) -> bytes:  # 0x1000000: a size that lies inside that heap
        return b"".join(w.to_bytes(8, "little") for w in (2, pinned, heap, 0x1000000))

    saved = state(0x7FFC_CFF2_1E00, 0x6000_0000_0000)
    record = mg._record("nvshmemi_device_state_d", saved, bytes(32), (), save_host)  # the size is data
    assert record.host_words == (8,) and record.written and record.value == saved
    image = ImageRecord("ab" * 32, True, (record,))
    monkeypatch.setattr(mg, "host_ranges", lambda accessible=False: live_host)
    reads = {}
    monkeypatch.setattr(mg, "_read_global", lambda kind, handle, name: reads[name])
    reads["nvshmemi_device_state_d"] = state(0x7F19_EBF2_1E00, 0x6000_0000_0000)
    mg.check_live(image, "module", 1)  # this process's own pinned address: accepted
    reads["nvshmemi_device_state_d"] = state(0x7F19_EBF2_1E00, 0x6000_4000_0000)
    with pytest.raises(DriftError, match="differs from SAVE's") as err:
        mg.check_live(image, "module", 1)  # the heap word is compared by value
    assert err.value.expected == {"+0x10": "0x600000000000"} and err.value.found == {"+0x10": "0x600040000000"}
    reads["nvshmemi_device_state_d"] = state(0x1234, 0x6000_0000_0000)
    with pytest.raises(DriftError, match="holds none of this process") as err:
        mg.check_live(image, "module", 1)
    assert err.value.field == "nvshmemi_device_state_d" and err.value.found == {"+0x8": "0x1234"}
    with pytest.raises(DriftError, match="fresh copy cannot") as err:
        mg.restore_fresh(image, image.sha256, 1)
    assert err.value.field == "nvshmemi_device_state_d"
    assert mg._record("plain", saved, bytes(32), (), []).host_words is msgspec.UNSET  # no host ranges given


def test_a_session_with_host_words_is_written_at_version_3():
    from foundry.archive.schema import GlobalRecord, ImageRecord, session_version

    def image(**words):
        return ImageRecord("cd" * 32, True, (GlobalRecord("g", 8, True, "0" * 64, bytes(8), **words),))

    assert [session_version([image()]), session_version([image(loader_words=(0,))]),
            session_version([image(host_words=(0,))])] == [1, 2, 3]  # fmt: skip


def test_host_words_come_from_host_accessible_ranges_only():
    """The CUDA driver reserves device addresses in the host's map without access
    (``---p``); a global holding a region address stays compared by value."""
    from foundry.runtime.code.module_globals import _record
    from foundry.runtime.host_maps import host_ranges

    maps = ("600000000000-600400000000 ---p 00000000 00:00 0\n"
            "7ffccff00000-7ffccff40000 rw-s 00000000 00:05 12 /dev/nvidiactl\n")  # fmt: skip
    assert host_ranges(maps).ranges == [(0x600000000000, 0x600400000000), (0x7FFCCFF00000, 0x7FFCCFF40000)]
    assert host_ranges(maps, accessible=True).ranges == [(0x7FFCCFF00000, 0x7FFCCFF40000)]
    value = b"".join(w.to_bytes(8, "little") for w in (0x6000_0000_1000, 0x7FFC_CFF2_1E00))
    assert _record("state", value, bytes(16), (), host_ranges(maps, accessible=True)).host_words == (8,)


def test_a_short_or_resized_global_is_still_reported(monkeypatch):
    from foundry.archive.schema import ImageRecord
    from foundry.errors import DriftError
    from foundry.runtime.code import module_globals as mg

    scale = mg._record("scale", b"\x03\0\0\0", bytes(4), ())  # 4 bytes: a padded word
    assert mg._first_differences(scale, b"\x05\0\0\0") == ({"+0x0": "0x3"}, {"+0x0": "0x5"})
    assert mg._first_differences(scale, bytes(8)) == ("4 bytes", "8 bytes")
    monkeypatch.setattr(mg, "_read_global", lambda kind, handle, name: bytes(8))  # the driver's answer, no GPU here
    with pytest.raises(DriftError, match="another size") as err:
        mg.check_live(ImageRecord("ef" * 32, True, (scale,)), "module", 1)
    assert (err.value.field, err.value.expected, err.value.found) == ("scale", 4, 8)


def test_a_relocating_load_refuses_restored_globals_that_point_into_the_old_region():
    from foundry.archive.schema import GlobalRecord, ImageRecord
    from foundry.runtime.code.module_globals import restore_fresh

    base = 0x600000000000
    pointer = GlobalRecord("table", 16, True, "0" * 64, (base + 0x1000).to_bytes(8, "little") + bytes(8))
    record = ImageRecord("ab" * 32, globals_known=True, globals=(pointer,))
    with pytest.raises(DriftError, match="moved") as err:
        restore_fresh(record, record.sha256, 0, moved_from=(base, base + (1 << 30)))
    assert err.value.field == "table"
    with pytest.raises(DriftError, match="unknown"):
        restore_fresh(ImageRecord("cd" * 32, globals_known=False), "cd" * 32, 0)
    assert restore_fresh(ImageRecord("ef" * 32, globals_known=True), "ef" * 32, 0) == []
