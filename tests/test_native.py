"""The native hook on the CPU: it builds from its own sources with only the CUDA
headers, and its control API answers in a process without a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

NATIVE = Path(__file__).resolve().parent.parent / "native"
CUDA_HOME = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))


@pytest.fixture(scope="module")
def built(hook_library) -> Path:
    return hook_library


def exported(lib: Path) -> set[str]:
    out = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True).stdout
    return {line.split()[-1] for line in out.splitlines() if " T " in line}


# Every hooked driver entry point, under the symbol cuda.h makes callers link to.
DRIVER_NAMES = {
    "cuMemAlloc_v2", "cuMemFree_v2", "cuGetProcAddress_v2", "cuMemAllocAsync", "cuMemAllocManaged",
    "cuMemAllocPitch_v2", "cuMemAllocFromPoolAsync", "cuStreamBeginCapture_v2", "cuStreamEndCapture",
    "cuGraphInstantiateWithFlags", "cuGraphInstantiateWithParams", "cuModuleLoad", "cuModuleLoadData",
    "cuModuleLoadDataEx", "cuModuleLoadFatBinary", "cuLibraryLoadData", "cuLibraryLoadFromFile", "cuModuleUnload",
    "cuLibraryUnload", "cuIpcGetMemHandle", "cuIpcOpenMemHandle_v2", "cuIpcCloseMemHandle", "cuFuncSetCacheConfig",
    "cuKernelSetCacheConfig",
}  # fmt: skip

# A stand-in for libcuda.so.1 (no driver exists here): one entry point that succeeds.
FAKE_DRIVER = r"""
typedef int CUresult;
typedef void *CUmodule;
CUresult cuModuleLoadData(CUmodule *module, const void *image) { (void)image; *module = (CUmodule)0x1234; return 0; }
CUresult cuMemAllocAsync(unsigned long long *dptr, unsigned long size, void *stream) {
    (void)size; (void)stream; *dptr = 0x5678; return 0;
}
"""
# A program linked against it directly, as Triton's launcher is: it loads a PTX image,
# then asks the hook's registry (if one is loaded) how many images it recorded.
LINKED_PROGRAM = r"""
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
typedef int CUresult;
typedef void *CUmodule;
CUresult cuModuleLoadData(CUmodule *module, const void *image);
CUresult cuMemAllocAsync(unsigned long long *dptr, unsigned long size, void *stream);
int main(void) {
    CUmodule module = 0;
    CUresult rc = cuModuleLoadData(&module, ".version 8.0\n.target sm_90\n");
    int (*count)(size_t *) = (int (*)(size_t *))dlsym(RTLD_DEFAULT, "foundry_registry_count");
    size_t images = 0;
    if (count) count(&images);
    unsigned long long dptr = 0;
    CUresult alloc = cuMemAllocAsync(&dptr, 256, 0);
    int (*active)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "foundry_hook_active");
    printf("%d %p %zu %d %d\n", rc, (void *)module, images, alloc, active ? active() : -1);
    return 0;
}
"""


def _linked_program(tmp_path: Path, driver: str, program: str) -> dict[str, str]:
    """Build ``driver`` as a stand-in libcuda.so.1 and ``program`` linked against it, in
    ``tmp_path``; the environment that runs ``tmp_path/program`` on that driver."""
    (tmp_path / "driver.c").write_text(driver)
    (tmp_path / "program.c").write_text(program)
    subprocess.run(["cc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(tmp_path / "libcuda.so.1"),
                    str(tmp_path / "driver.c")], check=True)  # fmt: skip
    subprocess.run(["cc", "-o", str(tmp_path / "program"), str(tmp_path / "program.c"), f"-L{tmp_path}",
                    "-l:libcuda.so.1", "-ldl"], check=True)  # fmt: skip
    return {**os.environ, "LD_LIBRARY_PATH": str(tmp_path)}


def test_a_program_linked_against_libcuda_reaches_the_registry(built, tmp_path):
    """A module a library loads through its own link to libcuda is recorded (the
    driver is a stand-in built here: this machine has none)."""
    env = _linked_program(tmp_path, FAKE_DRIVER, LINKED_PROGRAM)
    plain = subprocess.run([str(tmp_path / "program")], env=env, capture_output=True, text=True, check=True)
    hooked = subprocess.run([str(tmp_path / "program")], env={**env, "LD_PRELOAD": str(built)}, capture_output=True,
                            text=True, check=True)  # fmt: skip
    assert plain.stdout.split() == ["0", "0x1234", "0", "0", "-1"]  # no hook: nothing recorded, the allocator runs
    assert hooked.stdout.split() == ["0", "0x1234", "1", "0", "1"]  # the hook saw the load, passed both on, is active
    assert hooked.stderr == ""
    save_env = {**env, "LD_PRELOAD": str(built), "FOUNDRY_MODE": "save", "FOUNDRY_HOOK_ECHO": "1"}
    saving = subprocess.run([str(tmp_path / "program")], env=save_env, capture_output=True, text=True, check=True)
    assert saving.stdout.split()[3] != "0"  # an allocator SAVE cannot route is refused ...
    assert "foundry hook: error: cuMemAllocAsync is not routed" in saving.stderr  # ... and says so on stderr


# A stand-in driver whose cache-preference calls succeed, except on handle 0x777; and a
# program linked against it (as Triton's launcher is) that sets preferences, then asks the hook.
CACHE_DRIVER = r"""
typedef int CUresult;
CUresult cuFuncSetCacheConfig(void *f, int config) { (void)config; return f == (void *)0x777 ? 1 : 0; }
CUresult cuKernelSetCacheConfig(void *k, int config, int device) { (void)k; (void)config; (void)device; return 0; }
CUresult cuFuncGetModule(void **module, void *f) {
    *module = f == (void *)0xabc ? (void *)0x55 : (void *)0x66;
    return 0;
}
CUresult cuModuleUnload(void *module) { (void)module; return 0; }
"""
CACHE_PROGRAM = r"""
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
typedef int CUresult;
CUresult cuFuncSetCacheConfig(void *f, int config);
CUresult cuKernelSetCacheConfig(void *k, int config, int device);
CUresult cuModuleUnload(void *module);
static void ask(void) {
    int (*query)(uint64_t, int32_t *) = (int (*)(uint64_t, int32_t *))dlsym(RTLD_DEFAULT, "foundry_cache_config");
    uint64_t handles[] = {0xabc, 0xdef, 0x777, 0x999};
    for (int i = 0; i < 4; i++) {
        int32_t config = -1;
        if (query) query(handles[i], &config);
        printf("%d ", config);
    }
}
int main(void) {
    cuFuncSetCacheConfig((void *)0xabc, 1);
    cuKernelSetCacheConfig((void *)0xdef, 2, 0);
    cuFuncSetCacheConfig((void *)0xabc, 3); /* the last setting wins */
    cuFuncSetCacheConfig((void *)0x777, 1); /* refused by the driver: not recorded */
    ask();
    cuModuleUnload((void *)0x55); /* 0xabc's module: its setting goes with it */
    ask();
    printf("\n");
    return 0;
}
"""


def test_the_hook_records_the_cache_preference_a_program_sets(built, tmp_path):
    """The driver cannot say which cache preference a function has; a LOAD that loads the
    function afresh must set it again, so the hook keeps what the program set (the
    driver is a stand-in built here: this machine has none)."""
    env = _linked_program(tmp_path, CACHE_DRIVER, CACHE_PROGRAM)
    plain = subprocess.run([str(tmp_path / "program")], env=env, capture_output=True, text=True, check=True)
    hooked = subprocess.run([str(tmp_path / "program")], env={**env, "LD_PRELOAD": str(built)}, capture_output=True,
                            text=True, check=True)  # fmt: skip
    assert plain.stdout.split() == ["-1"] * 8  # no hook: nothing to ask
    # the last setting; a kernel handle; refused; never set; then 0xabc's module unloaded
    assert hooked.stdout.split() == ["3", "2", "0", "0", "0", "2", "0", "0"]


def test_builds_with_warnings_as_errors_and_exports_only_its_api(built):
    assert exported(built) == {*DRIVER_NAMES,
        "dlsym", "foundry_hook_abi", "foundry_hook_active", "foundry_hook_config",
        "foundry_region_info", "foundry_region_trace", "foundry_counter", "foundry_events", "foundry_registry_count",
        "foundry_registry_entry", "foundry_registry_find", "foundry_registry_copy", "foundry_region_map_to",
        "foundry_region_reserve", "foundry_region_set_owner", "foundry_region_expect", "foundry_trace_diverges",
        "foundry_call_shifted", "foundry_graph_build", "foundry_graph_check", "foundry_graph_check_indexed",
        "foundry_graph_build_many", "foundry_ipc_export", "foundry_ipc_check", "foundry_ipc_open", "foundry_ipc_close",
        "foundry_ipc_zone", "foundry_ipc_unexport", "foundry_region_passthrough", "foundry_region_seal",
        "foundry_region_restore", "foundry_cache_config",
    }  # fmt: skip


def _query(lib: Path, **env: str) -> dict:
    code = (
        "import dataclasses, json\n"
        "from foundry.runtime.native.hook import Hook\n"
        "h = Hook.attach()\n"
        "print(json.dumps({'active': h.active(), 'region': dataclasses.asdict(h.region()),"
        " 'trace': h.trace(), 'counters': h.counters(), 'events': h.events(), 'images': h.image_count(),"
        " 'missing': h.find_image(0x1234, 'module')}))\n"
    )
    full = {**os.environ, "LD_PRELOAD": str(lib), **env}
    proc = subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_control_api_without_a_gpu(built):
    report = _query(built, FOUNDRY_MODE="save", FOUNDRY_REGION_BASE="0x500000000000")
    assert report["active"] is False  # nothing resolved a driver entry point: the hook stays inert
    assert report["region"]["mode"] == "save" and report["region"]["reserved"] is False
    assert report["region"]["size"] == 64 << 30 and report["trace"] == []
    assert set(report["counters"].values()) == {0}
    assert report["events"] == ["region: mode save, base 0x500000000000, size 68719476736, threads owner"]
    other = _query(built, FOUNDRY_MODE="save", FOUNDRY_REGION_THREADS="any")
    assert other["events"] == ["region: mode save, base 0x600000000000, size 68719476736, threads any"]
    assert report["images"] == 0 and report["missing"] is None


def test_bad_settings_are_reported_not_fatal(built):
    report = _query(built, FOUNDRY_MODE="load", FOUNDRY_REGION_BASE="not-a-number")
    assert report["region"]["mode"] == "load"
    assert report["events"][0] == "error: FOUNDRY_REGION_BASE=not-a-number is not a number; using 0x600000000000"
    threads = _query(built, FOUNDRY_MODE="load", FOUNDRY_REGION_THREADS="some")
    assert threads["events"][0] == "error: FOUNDRY_REGION_THREADS=some is neither owner nor any; using owner"


def _trace(*requests: int, granularity: int = 2 << 20) -> list:
    from foundry.runtime.native.hook import Allocation

    out, offset = [], 0
    for order, request in enumerate(requests):
        size = -(-request // granularity) * granularity
        out.append(Allocation(order, offset, size, request, False))
        offset += size
    return out


def test_trace_divergence_names_the_first_differing_allocation(built):
    from foundry.runtime.native.hook import Hook

    hook = Hook.open_library(built)
    save = _trace(4096, 1 << 21, 123, 1 << 30)
    assert hook.trace_diverges(save, save) is None
    assert hook.trace_diverges(save, save[:2]) is None  # a LOAD still in its warm-up
    assert hook.trace_diverges(save, _trace(4096, 1 << 21, 124, 1 << 30)) == 2  # same mapped size, other request
    assert hook.trace_diverges(save, _trace(4096, 1 << 22, 123)) == 1  # offsets shift from here on
    assert hook.trace_diverges(save, _trace(4096, 1 << 21, 123, 1 << 30, 8)) == 4  # one allocation too many
    assert hook.trace_diverges([], _trace(1)) == 0


def test_load_expectations_are_refused_outside_load_mode(built):
    code = (
        "from foundry.runtime.native.hook import Hook, Allocation\n"
        "h = Hook.attach()\n"
        "try:\n"
        "    h.expect([Allocation(0, 0, 2097152, 100, False)])\n"
        "except Exception as e:\n"
        "    print(type(e).__name__, e)\n"
    )
    for mode, expected in (("save", "HookError"), ("off", "HookError")):
        env = {**os.environ, "LD_PRELOAD": str(built), "FOUNDRY_MODE": mode}
        proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith(expected), proc.stdout


def test_call_shifted_runs_the_callback_and_propagates_its_errors(built):
    from foundry.errors import HookError
    from foundry.runtime.native.hook import Hook

    hook = Hook.open_library(built)
    calls = []
    hook.call_shifted(lambda: calls.append("ran"), shift=65_536, poison=1 << 20)
    assert calls == ["ran"]

    def fails() -> None:
        raise ValueError("from the callback")

    with pytest.raises(ValueError, match="from the callback"):
        hook.call_shifted(fails)
    for bad in ({"shift": 0}, {"shift": 2 << 20}, {"poison": 8 << 20}):
        with pytest.raises(HookError):
            hook.call_shifted(lambda: calls.append("bad"), **bad)
    assert calls == ["ran"]


def test_passed_through_captures_are_balanced(hook_library):
    from foundry.errors import HookError
    from foundry.runtime.native.hook import Hook

    hook = Hook.open_library(hook_library)
    with hook.passthrough(), hook.passthrough():  # nested: each level undone once
        pass
    with pytest.raises(HookError):  # one more end than begins is refused, and the count stays at zero
        hook._check(hook.lib.foundry_region_passthrough(0), "foundry_region_passthrough")
    with hook.passthrough():
        pass


def test_only_a_session_seals_its_region(built):
    """After SAVE's archive is written, or a LOAD's session finished, later allocations
    are the program's own (a server's requests): sealing is a session's, and refused
    where the hook is off."""
    code = (
        "from foundry.errors import HookError\n"
        "from foundry.runtime.native.hook import Hook\n"
        "h = Hook.attach()\n"
        "try:\n"
        "    h.seal()\n"
        "    print('sealed')\n"
        "except HookError as err:\n"
        "    print('refused', err)\n"
    )
    seen = {}
    for mode in ("save", "load", "off"):
        env = {**os.environ, "LD_PRELOAD": str(built), "FOUNDRY_MODE": mode}
        proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        seen[mode] = proc.stdout.strip()
    assert seen["save"] == "sealed"
    assert seen["load"] == "sealed"
    assert seen["off"].startswith("refused") and "foundry_region_seal" in seen["off"]


def _symbols(obj: Path) -> tuple[set[str], set[str]]:
    """The global symbols an object file defines, and those it needs from elsewhere."""
    out = subprocess.run(["nm", str(obj)], capture_output=True, text=True, check=True).stdout
    defined = {line.split()[-1] for line in out.splitlines() if len(line.split()) == 3 and line.split()[1] in "TDBR"}
    needed = {line.split()[-1] for line in out.splitlines() if len(line.split()) == 2 and line.split()[0] == "U"}
    return defined, needed


def test_the_units_depend_on_each_other_without_a_cycle(built):
    """Read from the built objects: the resolver (resolve.c) and the parsed
    environment (config.c) serve every unit, and no unit needs one that needs it
    back (interpose.c, region.c and ipc_driver.c once did, through the resolver)."""
    import networkx as nx

    objects = {obj.stem: _symbols(obj) for obj in built.parent.glob("*.o")}
    assert set(objects) == {source.stem for source in (NATIVE / "src").glob("*.c")}
    owner = {symbol: unit for unit, (defined, _) in objects.items() for symbol in defined}
    assert owner["fh_real"] == owner["fh_real_offer"] == "resolve" and owner["fh_env_mode"] == "config"
    graph = nx.DiGraph()
    graph.add_nodes_from(objects)
    graph.add_edges_from((unit, owner[s]) for unit, (_, needed) in objects.items() for s in needed
                         if s in owner and owner[s] != unit)  # fmt: skip
    assert {"region", "ipc_driver", "registry", "resolve"} <= set(graph.successors("interpose"))
    assert [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1] == []
    assert set(graph.successors("resolve")) == {"events"} and set(graph.successors("config")) == set()
