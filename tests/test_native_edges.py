"""The native builder's edges on the CPU, against a stand-in libcuda.so.1 built here (this
machine has no driver): the stand-in treats a batch of edges as the H200 test machine's
driver 580 did, giving every edge of one cuGraphAddDependencies call the first edge's
data. The builder adds each kind of edge in a call of its own, and refuses a graph whose
edges read back otherwise (another kind, one lost, one added), naming the first that differs."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from foundry.archive import Archive
from foundry.runtime.graphs.native_build import pack

from .conftest import FIXTURES
from .test_native_build import NumberedFunctions, fake_attribute

STAND_IN = r"""
#include <stdint.h>
#include <stdlib.h>
typedef int CUresult;
typedef void *H;
typedef struct { unsigned char from_port, to_port, type, reserved[5]; } edge_data;
#define MAX_EDGES 64
static H from_[MAX_EDGES], to_[MAX_EDGES];
static edge_data data_[MAX_EDGES];
static size_t edges_;
static uintptr_t next_node = 0x1000;
int stand_in_calls; /* cuGraphAddDependencies_v2 calls since the graph was created */
static CUresult node(H *out) { *out = (H)next_node++; return 0; }
CUresult cuCtxGetCurrent(H *ctx) { *ctx = (H)0x10; return 0; }
CUresult cuCtxSetCurrent(H ctx) { return 0; }
CUresult cuGraphCreate(H *graph, unsigned flags) { *graph = (H)0x20; edges_ = stand_in_calls = 0; return 0; }
CUresult cuGraphDestroy(H graph) { return 0; }
CUresult cuGraphExecDestroy(H exec) { return 0; }
CUresult cuGraphAddKernelNode_v2(H *out, H g, const H *d, size_t n, const void *p) { return node(out); }
CUresult cuGraphKernelNodeSetAttribute(H n, int id, const void *v) { return 0; }
CUresult cuGraphAddMemcpyNode(H *out, H g, const H *d, size_t n, const void *p, H c) { return node(out); }
CUresult cuGraphAddMemsetNode(H *out, H g, const H *d, size_t n, const void *p, H c) { return node(out); }
CUresult cuGraphAddEmptyNode(H *out, H g, const H *d, size_t n) { return node(out); }
CUresult cuGraphAddDependencies_v2(H g, const H *from, const H *to, const edge_data *data, size_t n) {
    stand_in_calls++;
    for (size_t i = 0; i < n && edges_ < MAX_EDGES; i++, edges_++) {
        from_[edges_] = from[i], to_[edges_] = to[i], data_[edges_] = data[0]; /* the first edge's data */
        if (getenv("STAND_IN_LOSES_PLAIN") && data_[edges_].type == 0) data_[edges_].type = 1;
    }
    if (getenv("STAND_IN_DROPS_ONE") && stand_in_calls == 2 && edges_) edges_--; /* the plain call's last */
    if (getenv("STAND_IN_ADDS_AN_EDGE") && stand_in_calls == 1 && edges_ < MAX_EDGES) { /* one of its own */
        edge_data odd = {7, 7, 7, {0}};
        from_[edges_] = from[0], to_[edges_] = to[0], data_[edges_++] = odd;
    }
    return 0;
}
CUresult cuGraphGetEdges_v2(H g, H *from, H *to, edge_data *data, size_t *n) {
    size_t k = *n < edges_ ? *n : edges_;
    for (size_t i = 0; from && i < k; i++) from[i] = from_[i], to[i] = to_[i], data[i] = data_[i];
    *n = from ? k : edges_;
    return 0;
}
CUresult cuGraphInstantiateWithFlags(H *exec, H g, unsigned long long flags) { *exec = (H)0x30; return 0; }
"""

# run in a process of its own, so that the hook's dlopen of libcuda.so.1 finds the stand-in
BUILD = r"""
import ctypes, json, sys
stand_in = ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)
hook = ctypes.CDLL(sys.argv[2])
desc = open(sys.argv[3], "rb").read()
graph, graph_exec, err = ctypes.c_uint64(), ctypes.c_uint64(), ctypes.create_string_buffer(256)
status = hook.foundry_graph_build(desc, ctypes.c_size_t(len(desc)), ctypes.c_uint64(0), ctypes.byref(graph),
                                  ctypes.byref(graph_exec), err, 256)
calls = ctypes.c_int.in_dll(stand_in, "stand_in_calls").value
print(json.dumps({"status": status, "err": err.value.decode(), "calls": calls}))
"""


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("stand-in-driver")
    (work / "driver.c").write_text(STAND_IN)
    subprocess.run(["cc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(work / "libcuda.so.1"),
                    str(work / "driver.c")], check=True)  # fmt: skip
    return work / "libcuda.so.1"


def mixed_chain(tmp_path: Path) -> Path:
    """sample.bs8 (a chain 0 -> 1 -> ... -> 7) packed, its edges alternately programmatic
    and plain, the first programmatic, as in SGLang's decode graphs."""
    ir = Archive.open(FIXTURES / "saveload-a").graph(0, "sample.bs8")
    desc = pack(ir, NumberedFunctions(), attribute_bytes=fake_attribute)
    edges = b"".join(struct.pack("<IIBBBB", i, i + 1, *((1, 0, 1) if i % 2 == 0 else (0, 0, 0)), 0) for i in range(7))
    path = tmp_path / "mixed.fgb"
    path.write_bytes(desc[: len(desc) - 7 * 12] + edges)
    return path


def build(stand_in: Path, hook_library: Path, desc: Path, **env: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", BUILD, str(stand_in), str(hook_library), str(desc)],
                          env={**os.environ, "LD_LIBRARY_PATH": str(stand_in.parent), **env},
                          capture_output=True, text=True, check=True)  # fmt: skip
    return json.loads(proc.stdout)


def test_each_kind_of_edge_is_added_in_a_call_of_its_own(stand_in, hook_library, tmp_path):
    result = build(stand_in, hook_library, mixed_chain(tmp_path))
    assert result == {"status": 0, "err": "", "calls": 2}  # programmatic, then plain: both kept


def test_edges_read_back_with_another_kind_are_refused_naming_it(stand_in, hook_library, tmp_path):
    result = build(stand_in, hook_library, mixed_chain(tmp_path), STAND_IN_LOSES_PLAIN="1")
    assert result["status"] != 0
    assert result["err"] == (
        "edge 1 -> 2 came back with ports 0 -> 0, type 1, described with ports 0 -> 0, type 0 "
        "(7 edges in all, 7 described)"
    )


def test_an_edge_the_driver_added_is_refused(stand_in, hook_library, tmp_path):
    # the driver fills at most the count it is given: the builder counts the edges first
    result = build(stand_in, hook_library, mixed_chain(tmp_path), STAND_IN_ADDS_AN_EDGE="1")
    assert result["status"] != 0
    assert result["err"] == ("the driver added an edge 0 -> 1 (ports 7 -> 7, type 7) (8 edges in all, 7 described)")


def test_an_edge_the_driver_lost_is_refused_naming_it(stand_in, hook_library, tmp_path):
    result = build(stand_in, hook_library, mixed_chain(tmp_path), STAND_IN_DROPS_ONE="1")
    assert result["status"] != 0
    assert result["err"] == "the driver lost edge 5 -> 6 (ports 0 -> 0, type 0) (6 edges in all, 7 described)"
