"""Listing the device globals of module images, on images nvcc builds here (CPU only:
nvcc compiles without a GPU). SAVE uses the list to record and LOAD to check or
restore what the application wrote; an image it cannot read is 'unknown'."""

from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from foundry.runtime.module_globals import ZSTD_MAGIC, global_names

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
    from foundry.runtime.module_globals import _keep_loader_words, _record, loader_words, without_loader_words

    code = (0x7F00_0000_1000).to_bytes(8, "little")
    table_a = code + (5).to_bytes(8, "little")  # a code address, then data
    table_b = (0x7F00_0000_9000).to_bytes(8, "little") + (5).to_bytes(8, "little")
    assert loader_words(table_a, table_b) == (0,)
    assert without_loader_words(table_a, (0,)) == without_loader_words(table_b, (0,)) == bytes(8) + table_a[8:]
    untouched = _record("ops", table_b, table_a, (0,))  # the live copy: only its code addresses differ
    assert not untouched.written and untouched.value is None and untouched.loader_words == (0,)
    written = _record("ops", table_b[:8] + (9).to_bytes(8, "little"), table_a, (0,))
    assert written.written and written.sha256 != untouched.sha256
    fresh = (0x7F00_0000_5000).to_bytes(8, "little") + (5).to_bytes(8, "little")
    assert _keep_loader_words(written, fresh) == fresh[:8] + (9).to_bytes(8, "little")
    plain = GlobalRecord("scale", 4, True, "0" * 64, b"\x03\0\0\0")
    assert _keep_loader_words(plain, bytes(4)) == b"\x03\0\0\0"
    assert without_loader_words(b"ab", plain.loader_words) == b"ab"
