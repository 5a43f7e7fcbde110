"""JIT caches in archives (foundry/archive/jit_*.py, foundry/runtime/launch/jit.py): the
manifest (encode, decode, limits, version check), the install (atomic, contained, the
existing-file policy, four installers and a reader at once in real processes), host-code
opt-in, strip and verify, and how each cache variable is resolved. The caches are real
directories of files laid out as Triton, FlashInfer and the driver lay theirs out (the
compilers that would fill them need a GPU); the archives are real H200 SAVEs."""

from __future__ import annotations

import fcntl
import hashlib
import json
import multiprocessing
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import msgspec
import pytest
from click.testing import CliRunner

from foundry.archive import Archive
from foundry.archive.files import encode_record, sha256_hex
from foundry.archive.jit_caches import (
    READ_VARIABLES,
    SPECS,
    Cache,
    cache_environment,
    host_code_by_content,
    is_artefact,
    is_bookkeeping,
    is_host_code,
    made_on_first_use,
    user_settings,
)
from foundry.archive.jit_collect import Staged, attach, make_manifest, new_artefacts, stage
from foundry.archive.jit_install import INDEX_FILE, changed_since_install, install, install_directory
from foundry.archive.jit_manifest import JitLimits, check_manifest, encode_manifest, read_manifest
from foundry.archive.jit_schema import MANIFEST_FILE, JitManifest, JitState, JitVersions
from foundry.archive.jit_versions import distribution_versions, live_versions, toolkit_version
from foundry.archive.schema import CATALOG_FILE
from foundry.archive.strip import strip
from foundry.archive.verify import check_files
from foundry.cli import main
from foundry.errors import ArchiveError, CaptureError, DriftError, FoundryError, HookError
from foundry.runtime.launch import jit, launcher

from .archive_tools import edit_json
from .conftest import SAVE_A, load_script
from .hostile import saved_archive

CUBIN = b"\x7fELF\x02\x01\x01" + b"\0" * 11 + (190).to_bytes(2, "little") + b"device code" * 20
HOST_SO = b"\x7fELF\x02\x01\x01" + b"\0" * 11 + (62).to_bytes(2, "little") + b"host code" * 20
PICKLE = b"\x80\x04\x95" + b"pickled" * 10


def fill_caches(directory: Path) -> dict[str, bytes]:
    """Cache directories as the libraries leave them after compiling ("cache/path" -> bytes
    of every final artefact), with their temporary files, locks and logs beside."""
    triton = directory / "triton" / "KEY1"
    files = {
        "triton/KEY1/add_kernel.cubin": CUBIN,
        "triton/KEY1/add_kernel.json": b'{"name": "add_kernel"}',
        "triton/KEY1/add_kernel.ptx": b"// ptx",
        "triton/KEY1/__triton_launcher.so": HOST_SO,
        "inductor/fxgraph/ab/entry": PICKLE,
        "inductor/ab/cabcdef.py": b"def call(args): pass\n",
        "inductor/cd/kernel.best_config": b'{"num_warps": 4}',
        "flashinfer/.cache/flashinfer/0.6.15/90/cached_ops/norm/norm.so": HOST_SO,
        "flashinfer/.cache/flashinfer/0.6.15/90/cached_ops/norm/norm.cuda.o": HOST_SO,
        "flashinfer/.cache/flashinfer/0.6.15/90/cached_ops/norm/.ninja_log": b"# ninja log v5\n",
        "tvm-ffi/sgl_kernel_jit_x__arch_sm90__tvmffi_0.1.11/sgl_kernel_jit_x.so": HOST_SO,
        "cuda/ComputeCache/index": b"\x01\x02index",
        "cuda/ComputeCache/a/b/0123": CUBIN,
    }
    for relative, data in files.items():
        path = directory / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    group = {"child_paths": {n: str(triton / n) for n in ("add_kernel.cubin", "add_kernel.json", "add_kernel.ptx")}}
    (triton / "__grp__add_kernel.json").write_text(json.dumps(group))
    files["triton/KEY1/__grp__add_kernel.json"] = b"(relocated)"
    not_final = ["triton/KEY1/tmp.pid_7_abc/add_kernel.cubin", "triton/KEY1/lock", "inductor/locks/x.lock",
                 "flashinfer/.cache/flashinfer/0.6.15/90/flashinfer_jit.log",
                 "flashinfer/.cache/flashinfer/0.6.15/90/cached_ops/tmp/norm.lock",
                 "tvm-ffi/sgl_kernel_jit_x__arch_sm90__tvmffi_0.1.11/main.o",
                 "tvm-ffi/sgl_kernel_jit_x__arch_sm90__tvmffi_0.1.11/build.ninja",
                 "inductor/ab/cabcdef.o"]  # fmt: skip
    for relative in not_final:
        (directory / relative).parent.mkdir(parents=True, exist_ok=True)
        (directory / relative).write_bytes(b"x")
    os.symlink("/etc/passwd", directory / "triton" / "KEY1" / "link.json")
    return files


def loadable(root: Path) -> Path:
    """A SAVE that ``foundry run --mode load`` lets start (:func:`tests.hostile.saved_archive`:
    module images and warm-up bytes present), recorded with the torch installed here, if any."""
    saved_archive(root)
    try:
        here = metadata.version("torch")
    except metadata.PackageNotFoundError:
        return root
    edit_json(root / CATALOG_FILE, lambda c: c["environment"].update(torch_version=here))
    return root


def with_caches(tmp_path: Path, name: str = "a", *, complete: bool = False) -> tuple[Path, Path]:
    """A copy of a real SAVE with caches attached, and the directory they were filled in;
    ``complete``: one a LOAD can start from (:func:`loadable`)."""
    archive = tmp_path / name
    if complete:
        loadable(archive)
    else:
        shutil.copytree(SAVE_A, archive)
    filled = tmp_path / f"{name}-filled" / secrets.token_hex(16)
    fill_caches(filled)
    staging = tmp_path / f".{name}.jit"
    manifest = make_manifest(stage(filled, staging), cache_id=filled.name, saved_root=filled,
                             versions=JitVersions(**live_versions()))  # fmt: skip
    attach(archive, staging, manifest)
    return archive, filled


def opened(archive: Path) -> tuple[Archive, JitManifest]:
    arch = Archive.open(archive)
    return arch, read_manifest(arch.root, arch.catalog.jit)


def rewrite_manifest(archive: Path, edit) -> None:
    """Edit the manifest's JSON and re-seal it in the catalog (a hostile archive is
    consistent: it fails on the check it is about, not on a digest)."""
    path = archive / MANIFEST_FILE
    data = json.loads(path.read_text())
    edit(data)
    raw = json.dumps(data).encode()
    path.write_bytes(raw)
    catalog = json.loads((archive / CATALOG_FILE).read_text())
    catalog["jit"].update(sha256=sha256_hex(raw), size=len(raw))
    (archive / CATALOG_FILE).write_text(json.dumps(catalog))


# -- what counts, and how each library finds its cache ------------------------------


def test_final_artefacts_and_host_code_are_told_apart():
    triton, flashinfer, tvm, cuda = (SPECS[c] for c in (Cache.TRITON, Cache.FLASHINFER, Cache.TVM_FFI, Cache.CUDA))
    assert is_artefact(triton, "K/add.cubin") and not is_artefact(triton, "K/tmp.pid_1_x/add.cubin")
    assert not is_artefact(triton, "K/lock") and not is_artefact(triton, "K/x.lock")
    assert not is_artefact(SPECS[Cache.INDUCTOR], "ab/c.o") and is_artefact(flashinfer, "v/90/cached_ops/n/n.cuda.o")
    assert not is_artefact(flashinfer, "v/90/flashinfer_jit.log") and not is_artefact(flashinfer, "v/cached_ops/tmp/a")
    assert is_artefact(tvm, "m/m.so") and not is_artefact(tvm, "m/main.cpp") and not is_artefact(tvm, "m/build.ninja")
    assert not is_host_code(triton, "K/add.cubin", CUBIN) and is_host_code(triton, "K/__triton_launcher.so", HOST_SO)
    assert is_host_code(triton, "K/add.cubin", HOST_SO)  # a CPU ELF named like a cubin is host code by content
    assert is_host_code(SPECS[Cache.INDUCTOR], "fxgraph/ab/entry", PICKLE)  # no suffix: host unless known as data
    assert is_host_code(flashinfer, "v/90/generated/x.json", b"{}")  # ninja runs what its directory says
    assert not is_host_code(cuda, "ComputeCache/index", b"\x01\x02") and is_host_code(cuda, "x", b"#!/bin/sh\n")
    assert host_code_by_content(b"\x7fELF") and not host_code_by_content(b'{"a": 1}')


@pytest.mark.parametrize(
    ("cache", "environ", "expected", "by"),
    [
        (Cache.TRITON, {"HOME": "/h"}, "/h/.triton/cache", "default"),
        (Cache.TRITON, {"HOME": "/h", "TRITON_HOME": "/t"}, "/t/.triton/cache", "TRITON_HOME"),
        (Cache.TRITON, {"HOME": "/h", "TRITON_HOME": "/t", "TRITON_CACHE_DIR": "/c"}, "/c", "TRITON_CACHE_DIR"),
        (Cache.INDUCTOR, {"HOME": "/h", "TMPDIR": "/", "USER": "ann", "LOGNAME": "ann"}, "/torchinductor_ann",
         "default"),
        (Cache.INDUCTOR, {"TORCHINDUCTOR_CACHE_DIR": "~/i"}, "~/i", "TORCHINDUCTOR_CACHE_DIR"),  # not expanded
        (Cache.FLASHINFER, {"HOME": "/h"}, "/h/.cache/flashinfer", "default"),
        (Cache.FLASHINFER, {"HOME": "/h", "FLASHINFER_WORKSPACE_BASE": "/w"}, "/w/.cache/flashinfer",
         "FLASHINFER_WORKSPACE_BASE"),
        (Cache.TVM_FFI, {"HOME": "/h"}, "/h/.cache/tvm-ffi", "default"),
        (Cache.TVM_FFI, {"HOME": "/h", "TVM_FFI_CACHE_DIR": "~/t"}, "/h/t", "TVM_FFI_CACHE_DIR"),  # expanded
        (Cache.SGLANG, {"HOME": "/h"}, "/h/.cache/sglang", "default"),
        (Cache.SGLANG, {"HOME": "/h", "SGLANG_CACHE_DIR": "/s"}, "/s", "SGLANG_CACHE_DIR"),
        (Cache.DEEP_GEMM, {"HOME": "/h"}, "/h/.cache/deep_gemm", "default"),
        (Cache.DEEP_GEMM, {"HOME": "/h", "SGLANG_DG_CACHE_DIR": "/d"}, "/d", "SGLANG_DG_CACHE_DIR"),
        (Cache.TORCH_EXTENSIONS, {"HOME": "/h"}, "/h/.cache/torch_extensions", "default"),
        (Cache.TORCH_EXTENSIONS, {"HOME": "/h", "XDG_CACHE_HOME": "/x"}, "/x/torch_extensions", "XDG_CACHE_HOME"),
        (Cache.TORCH_EXTENSIONS, {"HOME": "/h", "XDG_CACHE_HOME": "/x", "TORCH_EXTENSIONS_DIR": "/e"}, "/e",
         "TORCH_EXTENSIONS_DIR"),
        (Cache.CUDA, {"HOME": "/h"}, "/h/.nv/ComputeCache", "default"),
        (Cache.CUDA, {"HOME": "/h", "CUDA_CACHE_PATH": "/n"}, "/n", "CUDA_CACHE_PATH"),
        (Cache.VLLM, {"HOME": "/h"}, "/h/.cache/vllm", "default"),
        (Cache.VLLM, {"HOME": ""}, "/.cache/vllm", "default"),  # os.path.expanduser's "~" with HOME empty: /
        (Cache.VLLM, {"HOME": "/h", "XDG_CACHE_HOME": "~/x"}, "/h/x/vllm", "XDG_CACHE_HOME"),  # expanded
        (Cache.VLLM, {"HOME": "/h", "XDG_CACHE_HOME": "/x", "VLLM_CACHE_ROOT": "~/v"}, "/h/v", "VLLM_CACHE_ROOT"),
        (Cache.VLLM, {"HOME": "/h", "XDG_CACHE_HOME": ""}, "None", "XDG_CACHE_HOME"),  # vLLM's then relative
    ],
)  # fmt: skip
def test_each_cache_variable_is_resolved_as_its_library_does(cache, environ, expected, by):
    resolved = SPECS[cache].resolve(environ)
    assert (str(resolved.path), resolved.by) == (expected, by)
    assert all(name in READ_VARIABLES for name in environ if name not in ("USER", "LOGNAME"))


def test_a_run_names_the_settings_it_replaces(tmp_path):
    environ = {"HOME": "/h", "TRITON_CACHE_DIR": "/mine/triton", "XDG_CACHE_HOME": "/x", "CUDA_CACHE_PATH": ""}
    assert {spec.cache for spec, _ in user_settings(environ)} == {Cache.TRITON, Cache.TORCH_EXTENSIONS, Cache.CUDA,
                                                                   Cache.VLLM}  # fmt: skip
    line = jit.replaced_settings(environ, tmp_path)
    assert line.startswith("foundry: JIT caches: this run replaces your settings: ") and "\n" not in line
    assert f"TRITON_CACHE_DIR=/mine/triton (Triton: /mine/triton) -> {tmp_path / 'triton'}" in line
    assert "XDG_CACHE_HOME=/x (torch C++ extensions: /x/torch_extensions)" in line
    assert "CUDA_CACHE_PATH= (the CUDA driver: set but empty)" in line
    assert jit.replaced_settings({"HOME": "/h"}, tmp_path) is None
    variables = cache_environment(tmp_path)
    assert variables["FLASHINFER_WORKSPACE_BASE"] == str(tmp_path / "flashinfer")  # its files: .cache/flashinfer below
    assert {SPECS[c].resolve(variables).path for c in Cache} == {SPECS[c].root(tmp_path / c.value) for c in Cache}


def test_versions_are_read_from_the_installed_environment(tmp_path):
    site = tmp_path / "site"
    for name in ("torch-2.11.0.dist-info", "triton-3.7.0.dist-info", "flashinfer_python-0.6.15.post1.dist-info",
                 "apache_tvm_ffi-0.1.11.dist-info", "sglang_kernel-0.4.5.dist-info", "vllm-0.25.1.dist-info",
                 "unrelated"):  # fmt: skip
        (site / name).mkdir(parents=True)
    (tmp_path / "cuda").mkdir()
    (tmp_path / "cuda" / "version.json").write_text('{"cuda": {"name": "CUDA SDK", "version": "13.0.48"}}')
    found = live_versions({"CUDA_HOME": str(tmp_path / "cuda"), "PATH": ""}, paths=[str(site)])
    assert found["torch"] == "2.11.0" and found["triton"] == "3.7.0" and found["flashinfer"] == "0.6.15.post1"
    assert found["tvm_ffi"] == "0.1.11" and found["sglang_kernel"] == "0.4.5" and found["cuda"] == "13.0.48"
    assert found["vllm"] == "0.25.1"
    assert found["python_abi"] and "msgspec" in distribution_versions()
    assert toolkit_version(tmp_path / "nowhere") is None


# -- the manifest -------------------------------------------------------------------


def test_a_save_s_caches_are_archived_without_temporaries_and_read_back(tmp_path):
    archive, filled = with_caches(tmp_path)
    arch, manifest = opened(archive)
    # no vLLM cache: written at version 1, as a Foundry before vLLM's cache reads it
    assert manifest.format_version == 1 and manifest.versions.vllm is None
    assert "vllm" not in json.loads((archive / MANIFEST_FILE).read_text())["versions"]
    assert arch.catalog.format_version == 2 and arch.catalog.jit.state is JitState.COMPLETE
    listed = {f"{e.cache}/{e.path}" for e in manifest.entries}
    expected = fill_caches(tmp_path / "again")  # the same layout: what counts is the final artefacts
    assert listed == {k.replace("flashinfer/.cache/flashinfer/", "flashinfer/") for k in expected}
    host = {f"{e.cache}/{e.path}" for e in manifest.entries if e.host_code}
    assert "triton/KEY1/__triton_launcher.so" in host and "inductor/fxgraph/ab/entry" in host
    assert "triton/KEY1/add_kernel.cubin" not in host and "cuda/ComputeCache/index" not in host
    for entry in manifest.entries:  # content-addressed, hashed as copied
        blob = (archive / "jit" / "blobs" / entry.sha256).read_bytes()
        assert hashlib.sha256(blob).hexdigest() == entry.sha256 and len(blob) == entry.size
    group = next(e for e in manifest.entries if e.path.endswith("__grp__add_kernel.json"))
    children = json.loads((archive / "jit" / "blobs" / group.sha256).read_text())["child_paths"]
    assert children == {"add_kernel.cubin": "KEY1/add_kernel.cubin", "add_kernel.json": "KEY1/add_kernel.json",
                        "add_kernel.ptx": "KEY1/add_kernel.ptx"}  # fmt: skip
    assert manifest.versions.gpu_arch == arch.catalog.environment.compute_capability
    assert msgspec.json.decode(encode_manifest(manifest), type=JitManifest) == msgspec.structs.replace(
        manifest, entries=tuple(sorted(manifest.entries, key=lambda e: (e.cache.value, e.path))))  # fmt: skip
    assert new_artefacts(filled, manifest) == []
    (filled / "triton" / "KEY2").mkdir()
    (filled / "triton" / "KEY2" / "new.cubin").write_bytes(CUBIN)
    assert new_artefacts(filled, manifest) == ["triton/KEY2/new.cubin"]


def test_versions_that_differ_are_refused_by_name():
    recorded = JitVersions(torch="2.11.0", triton="3.7.0", gpu_arch="9.0")
    jit.check_versions(recorded, {"torch": "2.11.0", "triton": "3.7.0", "flashinfer": "0.6.15"})  # None: not compared
    with pytest.raises(DriftError, match="built for another version") as err:
        jit.check_versions(recorded, {"torch": "2.11.0", "triton": "3.6.0"})
    assert (err.value.field, err.value.expected, err.value.found) == ("jit.versions.triton", "3.7.0", "3.6.0")
    with pytest.raises(DriftError) as err:
        jit.check_versions(recorded, {"triton": "3.7.0"})  # not installed now
    assert err.value.field == "jit.versions.torch" and err.value.found is None


def _entry(data: dict, index: int = 0) -> list:
    return data["entries"][index]


@pytest.mark.parametrize(
    ("edit", "message", "field"),
    [
        (lambda d: _entry(d).__setitem__(1, "../../etc/passwd"), "stay inside", "entries[0].path"),
        (lambda d: _entry(d).__setitem__(1, "/etc/passwd"), "stay inside", "entries[0].path"),
        (lambda d: _entry(d).__setitem__(1, "a\\..\\b"), "stay inside", "entries[0].path"),
        (lambda d: _entry(d).__setitem__(1, "a/\x1b[2Jb"), "stay inside", "entries[0].path"),
        (lambda d: _entry(d).__setitem__(1, "a//b"), "stay inside", "entries[0].path"),
        (lambda d: _entry(d).__setitem__(1, "/".join(["d"] * 40)), "stay inside", "entries[0].path"),
        (lambda d: _entry(d).__setitem__(3, 1 << 40), "larger than the reader accepts", "entries[0].size"),
        (lambda d: _entry(d).__setitem__(4, 0o4755), "more than permission bits", "entries[0].mode"),
        (lambda d: _entry(d).__setitem__(2, "ab" * 16), "not a sha256", "entries[0].sha256"),
        (lambda d: _entry(d).__setitem__(0, "ccache"), "Invalid enum value", "entries[0][0]"),
        (lambda d: d["entries"].append(list(_entry(d))), "listed twice", None),
        (lambda d: d.update(cache_id="../x"), "not a cache id", "cache_id"),
        (lambda d: d.update(format_version=7), "not a JIT manifest", "format_version"),
        (lambda d: _entry(d).__setitem__(0, "vllm"), "vLLM's cache in a JIT manifest of version 1", "format_version"),
        (lambda d: d["versions"].update(vllm="0.25.1"), "vLLM's cache in a JIT manifest of version 1",
         "format_version"),
        (lambda d: d.update(extra=1), "unknown field", None),
    ],
)  # fmt: skip
def test_hostile_manifests_are_refused_whole(tmp_path, edit, message, field):
    archive, _ = with_caches(tmp_path)

    def edit_and_keep_counts(data: dict) -> None:
        edit(data)
        catalog = json.loads((archive / CATALOG_FILE).read_text())
        catalog["jit"].update(files=len(data["entries"]), bytes=sum(e[3] for e in data["entries"]))
        (archive / CATALOG_FILE).write_text(json.dumps(catalog))

    rewrite_manifest(archive, edit_and_keep_counts)
    arch = Archive.open(archive)
    with pytest.raises(ArchiveError, match=message) as err:
        read_manifest(arch.root, arch.catalog.jit)
    if field is not None:
        assert err.value.field == field
    result = CliRunner().invoke(main, ["archive", "inspect", str(archive)])  # one line, exit 2
    assert result.exit_code == 2 and result.stderr.count("\n") == 1 and "Traceback" not in result.output


def test_a_host_code_file_marked_as_data_is_refused(tmp_path):
    archive, _ = with_caches(tmp_path)
    launcher_so = next(i for i, e in enumerate(opened(archive)[1].entries) if e.path.endswith(".so"))
    rewrite_manifest(archive, lambda d: d["entries"][launcher_so].__setitem__(5, False))
    arch = Archive.open(archive)
    with pytest.raises(ArchiveError, match="named like host code is marked as data"):
        read_manifest(arch.root, arch.catalog.jit)


def test_limits_and_the_catalog_seal_are_checked(tmp_path):
    archive, _ = with_caches(tmp_path)
    arch, manifest = opened(archive)
    with pytest.raises(ArchiveError, match="too many cache files"):
        check_manifest(manifest, limits=JitLimits(entries=3), source=archive)
    with pytest.raises(ArchiveError, match="caches are larger"):
        check_manifest(manifest, limits=JitLimits(total=100), source=archive)
    below = msgspec.structs.replace(manifest.entries[1], path=manifest.entries[1].path + "/below")
    bad = msgspec.structs.replace(manifest, entries=(*manifest.entries, below))
    with pytest.raises(ArchiveError, match="lies below another entry's file"):
        check_manifest(bad, limits=JitLimits(), source=archive)
    raw = (archive / MANIFEST_FILE).read_bytes()
    (archive / MANIFEST_FILE).write_bytes(raw.replace(b'"saved_root"', b'"saved_rooT"'))
    with pytest.raises(ArchiveError, match="does not match the catalog's sha256"):
        read_manifest(arch.root, arch.catalog.jit)
    catalog = json.loads((archive / CATALOG_FILE).read_text())
    catalog["format_version"] = 1  # an older reader would misread the jit field
    (archive / CATALOG_FILE).write_text(json.dumps(catalog))
    with pytest.raises(ArchiveError, match="fields of a later format version"):
        Archive.open(archive)


def test_a_manifest_that_is_a_link_is_refused(tmp_path):
    archive, _ = with_caches(tmp_path)
    real = archive / "jit" / "real.json"
    (archive / MANIFEST_FILE).rename(real)
    os.symlink(real, archive / MANIFEST_FILE)
    arch = Archive.open(archive)
    with pytest.raises(ArchiveError, match="symbolic link"):
        read_manifest(arch.root, arch.catalog.jit)


# -- installing ---------------------------------------------------------------------


# vLLM's cache as 0.25.1 lays it out (vllm/compilation/backends.py, compiler_interface.py, decorators.py,
# model_executor/models/registry.py): torch.compile's per-rank directory with Inductor's and Triton's inside
COMPILED = "torch_compile_cache/5f1e0c9a2b/rank_0_0"
VLLM_FILES = {
    f"{COMPILED}/backbone/computation_graph.py": b"class GraphModule: pass\n",
    f"{COMPILED}/backbone/cache_key_factors.json": b'{"env": {}}',
    f"{COMPILED}/inductor_cache/fxgraph/ab/entry": PICKLE,
    f"{COMPILED}/inductor_cache/ab/cabcdef.py": b"def call(args): pass\n",
    f"{COMPILED}/triton_cache/KEY1/add_kernel.cubin": CUBIN,
    f"{COMPILED}/triton_cache/KEY1/__triton_launcher.so": HOST_SO,
    "torch_compile_cache/torch_aot_compile/9f3c/rank_0_0/model": PICKLE,
    "modelinfos/vllm-model_executor-models-qwen3-Qwen3ForCausalLM.json": b'{"architectures": []}',
}


def test_vllms_cache_is_carried_with_the_triton_cache_inside_it_relocated(tmp_path):
    filled = tmp_path / "filled" / secrets.token_hex(16)
    cache = filled / Cache.VLLM.value
    for relative, data in VLLM_FILES.items():
        (cache / relative).parent.mkdir(parents=True, exist_ok=True)
        (cache / relative).write_bytes(data)
    kernel = cache / COMPILED / "triton_cache" / "KEY1"
    (kernel / "__grp__add_kernel.json").write_text(
        json.dumps({"child_paths": {"add_kernel.cubin": str(kernel / "add_kernel.cubin")}})
    )
    (kernel / "lock").write_bytes(b"")  # bookkeeping, left out
    archive = tmp_path / "a"
    shutil.copytree(SAVE_A, archive)
    staging = tmp_path / ".a.jit"
    versions = JitVersions(**{**live_versions(), "vllm": "0.25.1"})
    attach(archive, staging, make_manifest(stage(filled, staging), cache_id=filled.name, saved_root=filled,
                                           versions=versions))  # fmt: skip
    arch, manifest = opened(archive)
    entries = {e.path: e for e in manifest.entries if e.cache is Cache.VLLM}
    assert set(entries) == {*VLLM_FILES, f"{COMPILED}/triton_cache/KEY1/__grp__add_kernel.json"}
    host = {path for path, e in entries.items() if e.host_code}
    assert host == {f"{COMPILED}/backbone/computation_graph.py", f"{COMPILED}/inductor_cache/fxgraph/ab/entry",
                    f"{COMPILED}/inductor_cache/ab/cabcdef.py", f"{COMPILED}/triton_cache/KEY1/__triton_launcher.so",
                    "torch_compile_cache/torch_aot_compile/9f3c/rank_0_0/model"}  # fmt: skip
    assert manifest.versions.vllm == "0.25.1" and manifest.format_version == 2
    # vLLM's version keys only its cache: an SGLang SAVE made where vLLM is installed does not record it
    sglang_only = make_manifest(Staged([e for e in manifest.entries if e.cache is not Cache.VLLM]),
                                cache_id=filled.name, saved_root=filled, versions=versions)  # fmt: skip
    assert (sglang_only.versions.vllm, sglang_only.format_version) == (None, 1)
    assert "vllm" not in json.loads(encode_manifest(sglang_only))["versions"]
    data = install_directory(tmp_path / "root", manifest.cache_id, trust_host_code=False)
    install(archive, manifest, arch.catalog.jit.sha256, data, trust_host_code=False)
    installed = data / Cache.VLLM.value
    group = json.loads((installed / COMPILED / "triton_cache/KEY1/__grp__add_kernel.json").read_text())
    assert group["child_paths"]["add_kernel.cubin"] == str(installed / COMPILED / "triton_cache/KEY1/add_kernel.cubin")
    assert (installed / "modelinfos").is_dir() and not (installed / COMPILED / "backbone/computation_graph.py").exists()
    assert SPECS[Cache.VLLM].resolve(cache_environment(data)).path == installed  # where vLLM then looks
    with pytest.raises(DriftError, match="built for another version") as err:
        jit.check_versions(manifest.versions, {**live_versions(), "vllm": "0.26.0"})
    assert err.value.field == "jit.versions.vllm"


def test_an_install_is_isolated_per_trust_level_and_reused(tmp_path):
    archive, _ = with_caches(tmp_path)
    arch, manifest = opened(archive)
    root = tmp_path / "root"
    data = install_directory(root, manifest.cache_id, trust_host_code=False)
    report = install(archive, manifest, arch.catalog.jit.sha256, data, trust_host_code=False)
    host = [e for e in manifest.entries if e.host_code]
    assert report.installed == len(manifest.entries) - len(host) and report.left_out == len(host) > 0
    assert not list(data.rglob("*.so")) and not (data / "inductor" / "fxgraph").exists()  # no host code at all
    group = json.loads((data / "triton" / "KEY1" / "__grp__add_kernel.json").read_text())["child_paths"]
    assert group["add_kernel.cubin"] == str(data / "triton" / "KEY1" / "add_kernel.cubin")  # where Triton looks
    assert Path(group["add_kernel.cubin"]).read_bytes() == CUBIN
    assert install(archive, manifest, arch.catalog.jit.sha256, data, trust_host_code=False).reused
    trusted = install_directory(root, manifest.cache_id, trust_host_code=True)
    assert trusted != data
    report = install(archive, manifest, arch.catalog.jit.sha256, trusted, trust_host_code=True)
    assert report.installed == len(manifest.entries) and (trusted / INDEX_FILE).is_file()
    so = trusted / "triton" / "KEY1" / "__triton_launcher.so"
    assert so.read_bytes() == HOST_SO and so.stat().st_mode & 0o022 == 0  # no group or other write
    ninja_log = next(e for e in manifest.entries if e.path.endswith(".ninja_log"))
    placed = trusted / "flashinfer" / ".cache" / "flashinfer" / ninja_log.path
    assert placed.stat().st_mtime_ns == ninja_log.mtime_ns  # ninja compares it with its log


def test_a_different_file_already_in_place_is_kept_and_named(tmp_path):
    archive, _ = with_caches(tmp_path)
    arch, manifest = opened(archive)
    directory = install_directory(tmp_path / "root", manifest.cache_id, trust_host_code=True)
    mine = directory / "cuda" / "ComputeCache" / "index"
    mine.parent.mkdir(parents=True)
    mine.write_bytes(b"the driver's own index")
    same = directory / "triton" / "KEY1" / "add_kernel.json"
    same.parent.mkdir(parents=True)
    same.write_bytes(b'{"name": "add_kernel"}')
    report = install(archive, manifest, arch.catalog.jit.sha256, directory, trust_host_code=True)
    assert report.kept == ["cuda/ComputeCache/index"] and report.present == 1
    assert mine.read_bytes() == b"the driver's own index"  # never overwritten


def test_files_a_program_adds_or_rewrites_after_the_install_are_named(tmp_path):
    archive, _ = with_caches(tmp_path)
    arch, manifest = opened(archive)
    directory = install_directory(tmp_path / "root", manifest.cache_id, trust_host_code=True)
    install(archive, manifest, arch.catalog.jit.sha256, directory, trust_host_code=True)
    assert changed_since_install(directory, manifest, trust_host_code=True) == []  # groups rewritten, index its own
    new = directory / "triton" / "KEY2" / "mul_kernel.cubin"
    new.parent.mkdir(parents=True)
    new.write_bytes(CUBIN)
    (directory / "triton" / "KEY1" / "__triton_launcher.so").chmod(0o644)
    (directory / "triton" / "KEY1" / "__triton_launcher.so").write_bytes(HOST_SO)  # the same bytes, written anew
    (directory / "cuda" / "link").symlink_to("/etc/passwd")
    assert changed_since_install(directory, manifest, trust_host_code=True) == [
        "cuda/link",
        "triton/KEY1/__triton_launcher.so",
        "triton/KEY2/mul_kernel.cubin",
    ]
    # a directory installed without host code: the host-code entries a program wrote there are its own
    data = install_directory(tmp_path / "root", manifest.cache_id, trust_host_code=False)
    install(archive, manifest, arch.catalog.jit.sha256, data, trust_host_code=False)
    shutil.copy2(directory / "triton" / "KEY1" / "__triton_launcher.so", data / "triton" / "KEY1")
    assert changed_since_install(data, manifest, trust_host_code=False) == ["triton/KEY1/__triton_launcher.so"]


def test_the_files_flashinfer_makes_on_first_use_are_laid_down_empty_and_stay_unchanged_while_empty(tmp_path):
    flashinfer = SPECS[Cache.FLASHINFER]
    made = made_on_first_use(flashinfer, ["0.6/90/cached_ops/norm/norm.so", "0.6/90/cached_ops/norm/.ninja_log",
                                          "0.6/90/cached_ops/rope/rope.so", "0.6/90/generated/x.cu"])  # fmt: skip
    assert made == {"0.6/90/cached_ops/tmp/norm.lock", "0.6/90/cached_ops/tmp/rope.lock", "0.6/90/flashinfer_jit.log"}
    assert made_on_first_use(SPECS[Cache.TRITON], ["KEY/cached_ops/norm/a.so"]) == set()
    archive, _ = with_caches(tmp_path)
    arch, manifest = opened(archive)
    directory = install_directory(tmp_path / "root", manifest.cache_id, trust_host_code=True)
    workspace = directory / "flashinfer" / ".cache" / "flashinfer" / "0.6.15" / "90"
    report = install(archive, manifest, arch.catalog.jit.sha256, directory, trust_host_code=True)
    lock, log = workspace / "cached_ops" / "tmp" / "norm.lock", workspace / "flashinfer_jit.log"
    assert report.placed == 2 and lock.read_bytes() == b"" and log.read_bytes() == b""
    # what FlashInfer does at every load: its FileLock reopens the lock with truncation, its logger opens the log
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.close(fd)
    open(log, "a").close()
    assert changed_since_install(directory, manifest, trust_host_code=True) == []
    log.write_text("a warning\n")  # the log written: the program did more than find its builds
    assert changed_since_install(directory, manifest, trust_host_code=True) == [
        "flashinfer/.cache/flashinfer/0.6.15/90/flashinfer_jit.log"
    ]
    data = install_directory(tmp_path / "root", manifest.cache_id, trust_host_code=False)  # FlashInfer's is host code
    assert install(archive, manifest, arch.catalog.jit.sha256, data, trust_host_code=False).placed == 0
    assert not (data / "flashinfer").exists()


def test_a_failed_install_is_rolled_back(tmp_path):
    archive, _ = with_caches(tmp_path)
    arch, manifest = opened(archive)
    last = sorted(manifest.entries, key=lambda e: (e.cache.value, e.path))[-1]
    (archive / "jit" / "blobs" / last.sha256).write_bytes(b"damaged")
    directory = install_directory(tmp_path / "root", manifest.cache_id, trust_host_code=True)
    with pytest.raises(ArchiveError, match="not the size its record says"):
        install(archive, manifest, arch.catalog.jit.sha256, directory, trust_host_code=True)
    assert [p for p in directory.rglob("*") if p.is_file()] == []  # nothing half-installed, no index
    (archive / "jit" / "blobs" / last.sha256).write_bytes(b"x" * last.size)  # right size, wrong bytes
    with pytest.raises(ArchiveError, match="does not match its sha256"):
        install(archive, manifest, arch.catalog.jit.sha256, directory, trust_host_code=True)
    assert [p for p in directory.rglob("*") if p.is_file()] == []


def test_data_that_is_host_code_by_content_is_refused_at_install_and_verify(tmp_path):
    archive, _ = with_caches(tmp_path)
    arch, manifest = opened(archive)
    cubin = next(i for i, e in enumerate(manifest.entries) if e.path.endswith("add_kernel.cubin"))
    blob = archive / "jit" / "blobs" / sha256_hex(HOST_SO + b"!")
    blob.write_bytes(HOST_SO + b"!")

    def swap(data: dict) -> None:
        data["entries"][cubin][2], data["entries"][cubin][3] = sha256_hex(HOST_SO + b"!"), len(HOST_SO) + 1

    rewrite_manifest(archive, swap)
    catalog = json.loads((archive / CATALOG_FILE).read_text())
    catalog["jit"]["bytes"] += len(HOST_SO) + 1 - len(CUBIN)
    (archive / CATALOG_FILE).write_text(json.dumps(catalog))
    arch, manifest = opened(archive)
    with pytest.raises(ArchiveError, match="marked as data but is host code"):
        install(archive, manifest, arch.catalog.jit.sha256, tmp_path / "d", trust_host_code=False)
    with pytest.raises(ArchiveError, match="marked as data but is host code"):
        check_files(arch)


def test_an_install_refuses_a_directory_that_leads_elsewhere(tmp_path):
    archive, _ = with_caches(tmp_path)
    arch, manifest = opened(archive)
    directory = install_directory(tmp_path / "root", manifest.cache_id, trust_host_code=False)
    (directory / "triton").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, directory / "triton" / "KEY1")
    with pytest.raises(FoundryError, match="not a plain directory"):
        install(archive, manifest, arch.catalog.jit.sha256, directory, trust_host_code=False)
    assert list(outside.iterdir()) == []


def test_an_install_checks_free_space_first(tmp_path, monkeypatch):
    archive, _ = with_caches(tmp_path)
    arch, manifest = opened(archive)
    info = os.statvfs(tmp_path)
    # the file system's real free space, with the margin an install keeps raised above it
    monkeypatch.setattr("foundry.archive.jit_install.SPACE_MARGIN", info.f_bavail * info.f_frsize + 1)
    directory = tmp_path / "d"
    with pytest.raises(FoundryError, match="not enough free disk space"):
        install(archive, manifest, arch.catalog.jit.sha256, directory, trust_host_code=True)
    assert [p for p in directory.rglob("*") if p.is_file()] == []


def _installer(archive: str, directory: str, out: str) -> None:
    arch = Archive.open(archive)
    manifest = read_manifest(arch.root, arch.catalog.jit)
    report = install(Path(archive), manifest, arch.catalog.jit.sha256, Path(directory), trust_host_code=True)
    Path(out).write_text(json.dumps({"reused": report.reused, "installed": report.installed,
                                     "present": report.present, "kept": report.kept}))  # fmt: skip


def _reader(directory: str, expected: str, out: str, stop: str) -> None:
    """Reads every file it finds while the installers run: each must be whole."""
    want = json.loads(Path(expected).read_text())
    seen, bad = 0, []
    while not Path(stop).exists():
        for path in Path(directory).rglob("*"):
            if path.is_file() and not path.name.endswith(".tmp") and path.name != INDEX_FILE:
                relative = path.relative_to(directory).as_posix()
                if relative in want and hashlib.sha256(path.read_bytes()).hexdigest() != want[relative]:
                    bad.append(relative)
                seen += 1
    Path(out).write_text(json.dumps({"seen": seen, "bad": bad}))


def test_four_installers_and_a_reader_at_once_corrupt_nothing(tmp_path):
    archive, _ = with_caches(tmp_path)
    _, manifest = opened(archive)
    directory = install_directory(tmp_path / "root", manifest.cache_id, trust_host_code=True)
    expected = {}
    for e in manifest.entries:
        relative = SPECS[e.cache].root(Path(e.cache.value)).joinpath(e.path).as_posix()
        if e.form.value == "file":
            expected[relative] = e.sha256
    (tmp_path / "expected.json").write_text(json.dumps(expected))
    ctx = multiprocessing.get_context("spawn")
    stop = tmp_path / "stop"
    reader = ctx.Process(target=_reader, args=(str(directory), str(tmp_path / "expected.json"),
                                               str(tmp_path / "reader.json"), str(stop)))  # fmt: skip
    directory.mkdir(parents=True)
    reader.start()
    installers = [ctx.Process(target=_installer, args=(str(archive), str(directory), str(tmp_path / f"i{n}.json")))
                  for n in range(4)]  # fmt: skip
    for p in installers:
        p.start()
    for p in installers:
        p.join(120)
    time.sleep(0.2)
    stop.write_text("")
    reader.join(60)
    assert all(p.exitcode == 0 for p in [*installers, reader])
    reports = [json.loads((tmp_path / f"i{n}.json").read_text()) for n in range(4)]
    assert sum(r["installed"] for r in reports) == len(manifest.entries)  # each file written once
    assert sum(r["reused"] for r in reports) == 3 and all(not r["kept"] for r in reports)
    assert json.loads((tmp_path / "reader.json").read_text())["bad"] == []
    for relative, digest in expected.items():
        assert hashlib.sha256((directory / relative).read_bytes()).hexdigest() == digest
    assert not list(directory.rglob("*.tmp"))


# -- strip and verify -----------------------------------------------------------------


def test_verify_checks_the_cache_files(tmp_path):
    archive, _ = with_caches(tmp_path)
    arch, manifest = opened(archive)
    assert check_files(arch).jit == len(manifest.entries)
    result = CliRunner().invoke(main, ["archive", "verify", str(archive), "--json"])
    assert json.loads(result.stdout)["jit_files"] == len(manifest.entries)
    cubin = next(e for e in manifest.entries if e.path.endswith(".cubin"))
    blob = archive / "jit" / "blobs" / cubin.sha256
    blob.write_bytes(blob.read_bytes()[:-1] + b"?")
    result = CliRunner().invoke(main, ["archive", "verify", str(archive)])
    assert result.exit_code == 2 and "does not match its sha256" in result.stderr and result.stderr.count("\n") == 1
    blob.unlink()
    os.symlink("/etc/passwd", blob)
    result = CliRunner().invoke(main, ["archive", "verify", str(archive)])
    assert result.exit_code == 2 and "symbolic link" in result.stderr


def test_strip_drops_the_caches_atomically_and_says_so(tmp_path):
    archive, _ = with_caches(tmp_path)
    keep = tmp_path / "keep"
    shutil.copytree(archive, keep)
    _, manifest = opened(archive)
    blobs = {e.sha256 for e in manifest.entries}
    removed = strip(Archive.open(archive), caches_only=True)
    arch = Archive.open(archive)
    assert arch.catalog.jit.state is JitState.STRIPPED and removed["files"] == len(blobs)
    assert arch.catalog.modules == Archive.open(keep).catalog.modules  # only the caches went
    assert not any((archive / "jit" / "blobs").iterdir())
    assert read_manifest(arch.root, arch.catalog.jit) == manifest  # kept, for inspect
    assert check_files(arch).jit == 0
    lines: list[str] = []
    assert jit.load_caches(archive, trust_host_code=True, log=lines.append) == {}  # the user's own caches then
    assert lines == ["foundry: the archive's JIT caches were stripped: the program compiles what it needs"]
    # a strip killed after its commit left blobs: the next strip removes them
    for sha in blobs:
        shutil.copy(keep / "jit" / "blobs" / sha, archive / "jit" / "blobs" / sha)
    assert strip(Archive.open(archive), caches_only=True)["files"] == len(blobs)
    full = strip(Archive.open(keep))
    assert Archive.open(keep).catalog.jit.state is JitState.STRIPPED and full["files"] >= len(blobs)
    result = CliRunner().invoke(main, ["archive", "inspect", str(keep)])
    assert result.exit_code == 0 and "JIT caches: stripped" in result.stdout


def test_inspect_says_whether_an_archive_carries_host_code(tmp_path):
    archive, _ = with_caches(tmp_path)
    result = CliRunner().invoke(main, ["archive", "inspect", str(archive)])
    assert result.exit_code == 0
    assert "host code: yes: a LOAD installs it only with --trust-cached-code" in result.stdout
    assert "triton" in result.stdout and "flashinfer" in result.stdout
    data = json.loads(CliRunner().invoke(main, ["archive", "inspect", str(archive), "--json"]).stdout)
    caches = {row["cache"]: row for row in data["jit"]["caches"]}
    assert caches["flashinfer"]["host_files"] == caches["flashinfer"]["files"] == 3
    assert caches["cuda"]["host_files"] == 0 and data["jit"]["host_code"] is True
    plain = CliRunner().invoke(main, ["archive", "inspect", str(SAVE_A)])
    assert "JIT caches: none" in plain.stdout


def test_inspect_names_the_versions_the_caches_were_built_for_as_text(tmp_path):
    archive, _ = with_caches(tmp_path)
    rewrite_manifest(archive, lambda d: d["versions"].update(torch="2.11.0\x1b[2J", triton="[bold]3.7.0"))
    text = CliRunner().invoke(main, ["archive", "inspect", str(archive)]).stdout
    line = next(line for line in text.splitlines() if "built for" in line)
    assert "torch 2.11.0\\x1b[2J" in line and "triton [bold]3.7.0" in line and "\x1b" not in text  # text, escaped
    data = json.loads(CliRunner().invoke(main, ["archive", "inspect", str(archive), "--json"]).stdout)
    assert data["jit"]["versions"]["torch"] == "2.11.0\x1b[2J" and "vllm" not in data["jit"]["versions"]


# -- through the launcher -------------------------------------------------------------

# what the program sees, and the marker its session would write (opening one needs a GPU)
SEES = (
    "from foundry.runtime.sessions.marker import note_session; note_session('load')\n"
    "import json, os, sys; names = {n: os.environ.get(n) for n in ('TRITON_CACHE_DIR', 'FLASHINFER_WORKSPACE_BASE',"
    " 'CUDA_CACHE_PATH', 'FOUNDRY_MODE')}; json.dump({'env': names, 'pid': os.getpid()}, open(sys.argv[1], 'w'))"
)


def test_load_installs_and_points_the_engine_at_the_caches_host_code_only_when_trusted(tmp_path, with_hook, _jit_root):
    archive, _ = with_caches(tmp_path, complete=True)
    _, manifest = opened(archive)
    environ = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / "mine")}

    def load(*options: str) -> tuple[dict, str]:
        out = tmp_path / "seen.json"
        proc = subprocess.Popen([sys.executable, "-m", "foundry", "run", "--mode", "load", *options, "--archive",
                                 str(archive), "--", sys.executable, "-c", SEES, str(out)], env=environ,
                                stderr=subprocess.PIPE, text=True)  # fmt: skip
        err = proc.communicate(timeout=120)[1]
        assert proc.returncode == 0, err
        seen = json.loads(out.read_text())
        assert seen["pid"] == proc.pid  # the launcher became the program: no second process
        return seen["env"], err

    env, err = load()
    data = _jit_root / f"{manifest.cache_id}-data"
    assert env["TRITON_CACHE_DIR"] == str(data / "triton") and env["FOUNDRY_MODE"] == "load"
    assert env["CUDA_CACHE_PATH"] == str(data / "cuda")
    assert (data / "triton" / "KEY1" / "add_kernel.cubin").read_bytes() == CUBIN
    assert not list(data.rglob("*.so")) and "host code left out (--trust-cached-code installs them)" in err
    assert f"TRITON_CACHE_DIR={tmp_path / 'mine'} (Triton: {tmp_path / 'mine'}) -> {data / 'triton'}" in err
    assert "s from its start to the program's exec" in err and not (tmp_path / "mine").exists()
    env, err = load("--trust-cached-code")
    trusted = _jit_root / manifest.cache_id
    assert env["TRITON_CACHE_DIR"] == str(trusted / "triton")
    assert (trusted / "triton" / "KEY1" / "__triton_launcher.so").read_bytes() == HOST_SO
    env, err = load("--no-jit-caches")
    assert env["TRITON_CACHE_DIR"] == str(tmp_path / "mine")  # the user's own, untouched
    environ["FOUNDRY_JIT_ROOT"] = str(tmp_path / "elsewhere")
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "torch-0.0.1.dist-info").mkdir()
    environ["PYTHONPATH"] = str(tmp_path / "site")  # another torch first on the path
    if manifest.versions.torch is not None:
        proc = subprocess.run([sys.executable, "-m", "foundry", "run", "--mode", "load", "--archive", str(archive),
                               "--", "true"], env=environ, capture_output=True, text=True)  # fmt: skip
        assert proc.returncode == 2 and "jit.versions.torch" in proc.stderr and proc.stderr.count("\n") == 1


def test_jit_caches_installs_an_archive_s_builds_where_asked_for_a_plain_engine(tmp_path, _jit_root):
    archive, _ = with_caches(tmp_path)
    _, manifest = opened(archive)
    into = tmp_path / "my caches"  # a space: the shell lines quote it

    def cli(*args: str, source: Path = archive) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "foundry", "archive", "jit-caches", str(source), *args],
                              capture_output=True, text=True, timeout=120)  # fmt: skip

    proc = cli("--into", str(into))
    assert proc.returncode == 0, proc.stderr
    data = into / f"{manifest.cache_id}-data"  # one directory per archive and trust level, as under the JIT root
    assert f"export TRITON_CACHE_DIR={shlex.quote(str(data / 'triton'))}" in proc.stdout.splitlines()
    assert "host code left out (--trust-cached-code installs them)" in proc.stderr
    assert "at its first request where the LOAD skips its warm-ups" in proc.stderr
    assert (data / "triton" / "KEY1" / "add_kernel.cubin").read_bytes() == CUBIN and not list(into.rglob("*.so"))
    assert not list(_jit_root.iterdir())  # nothing in the LOADs' own directories
    shell = subprocess.run(["bash", "-c", 'eval "$(cat)" && printf %s "$TRITON_CACHE_DIR"'], input=proc.stdout,
                           capture_output=True, text=True, check=True)  # fmt: skip
    assert shell.stdout == str(data / "triton")
    trusted = json.loads(cli("--into", str(into), "--trust-cached-code", "--json").stdout)
    assert trusted["ok"] and trusted["environment"]["TRITON_CACHE_DIR"] == str(into / manifest.cache_id / "triton")
    assert (into / manifest.cache_id / "triton" / "KEY1" / "__triton_launcher.so").read_bytes() == HOST_SO
    assert cli("--into", str(into)).returncode == 0 and not list(data.rglob("*.so"))  # trust levels kept apart

    def refused(proc: subprocess.CompletedProcess, message: str) -> None:
        assert proc.returncode == 2 and message in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr

    refused(cli("--into", str(tmp_path / "b"), source=SAVE_A), "carries no JIT caches")
    refused(cli("--into", ""), "an empty path")
    assert cli().returncode == 2  # --into is required: never the LOADs' directories by default
    rewrite_manifest(archive, lambda d: d["versions"].update(torch="0.0.1"))  # built for another torch
    refused(cli("--into", str(tmp_path / "o")), "jit.versions.torch")
    assert not (tmp_path / "o").exists()
    strip(Archive.open(archive), caches_only=True)
    refused(cli("--into", str(tmp_path / "s")), "were stripped")


def test_plugin_only_load_installs_the_caches_before_the_engine_spawns(tmp_path, with_hook, _jit_root, monkeypatch):
    from foundry.integrations.common.config import PluginConfig
    from foundry.integrations.common.session import prepare_children

    archive, _ = with_caches(tmp_path)
    _, manifest = opened(archive)
    for name in ("FOUNDRY_MODE", "TRITON_CACHE_DIR", "LD_PRELOAD"):
        monkeypatch.delenv(name, raising=False)
    snapshot = dict(os.environ)
    try:
        prepare_children(PluginConfig(mode="load", archive=str(archive)))
        assert os.environ["TRITON_CACHE_DIR"] == str(_jit_root / f"{manifest.cache_id}-data" / "triton")
        prepare_children(PluginConfig(mode="load", archive=str(archive), trust_cached_code=True))
        assert os.environ["TRITON_CACHE_DIR"] == str(_jit_root / manifest.cache_id / "triton")
        assert (_jit_root / manifest.cache_id / "triton" / "KEY1" / "__triton_launcher.so").is_file()
    finally:
        os.environ.clear()
        os.environ.update(snapshot)


PROGRAM = r"""
import os, shutil, sys
mode, triton = os.environ["FOUNDRY_MODE"], os.environ["TRITON_CACHE_DIR"]
kernel = os.path.join(triton, "KEY1", "add_kernel.cubin")
if mode == "off":  # the priming run compiles
    os.makedirs(os.path.dirname(kernel), exist_ok=True)
    open(kernel, "wb").write(bytes.fromhex(sys.argv[2]))
    os.makedirs(os.path.join(triton, "KEY1", "tmp.pid_1_x"), exist_ok=True)
    open(os.path.join(triton, "KEY1", "lock"), "w").close()
else:  # a SAVE run finds what the priming run compiled, installed again
    assert open(kernel, "rb").read() == bytes.fromhex(sys.argv[2]), "not installed"
    assert not os.path.exists(os.path.join(triton, "KEY1", "lock"))
    if sys.argv[3] == "compile":
        open(os.path.join(triton, "KEY1", "another.cubin"), "wb").write(b"new")
    shutil.copytree(sys.argv[1], os.environ["FOUNDRY_ARCHIVE"])
open(os.path.join(os.path.dirname(os.environ["FOUNDRY_JIT_ROOT"]), "runs.txt"), "a").write(mode + " ")
"""


def test_a_save_primes_the_caches_then_saves_with_them_installed(tmp_path, with_hook, _jit_root):
    lines: list[str] = []
    config = launcher.RunConfig("save", tmp_path / "a", jit_caches=True)
    command = [sys.executable, "-c", PROGRAM, str(SAVE_A), CUBIN.hex(), "quiet"]
    assert launcher.run(config, command, save_runs=2, log=lines.append) == 0
    assert (_jit_root.parent / "runs.txt").read_text().split() == ["off", "save", "save"]
    arch, manifest = opened(tmp_path / "a")
    assert [(e.cache.value, e.path) for e in manifest.entries] == [("triton", "KEY1/add_kernel.cubin")]
    directory = _jit_root / manifest.cache_id
    assert Path(manifest.saved_root) == directory and (directory / INDEX_FILE).is_file()
    assert json.loads((directory / INDEX_FILE).read_text())["manifest_sha256"] == arch.catalog.jit.sha256
    assert any("priming run" in line for line in lines) and not list(tmp_path.glob(".a.jit"))
    # the SAVE's own machine LOADs it without installing again
    report = install(arch.root, manifest, arch.catalog.jit.sha256, directory, trust_host_code=True)
    assert report.reused
    again = launcher.RunConfig("save", tmp_path / "b", jit_caches=True)
    with pytest.raises(CaptureError, match="compiled what the priming run had not") as err:
        launcher.run(again, [*command[:-1], "compile"], save_runs=1, log=lines.append)
    assert err.value.found == ["triton/KEY1/another.cubin"]
    assert Archive.open(tmp_path / "b").catalog.jit is None  # kept without caches, said so
    assert len([d for d in _jit_root.iterdir() if d.is_dir()]) == 1  # the failed SAVE's directory is gone
    failing = launcher.RunConfig("save", tmp_path / "c", jit_caches=True)
    assert launcher.run(failing, [sys.executable, "-c", "raise SystemExit(3)"], log=lines.append) == 3
    assert not (tmp_path / "c").exists() and "foundry: the priming run failed (exit 3); nothing was saved" in lines


def test_a_save_without_the_hook_is_refused_before_its_priming_run(tmp_path, monkeypatch, _jit_root):
    # a checkout where `make -C native` never ran: the hook is found nowhere
    monkeypatch.setattr(launcher, "library_path", lambda: None)
    config = launcher.RunConfig("save", tmp_path / "a", jit_caches=True)
    ran = tmp_path / "ran"
    command = [sys.executable, "-c", f"open({str(ran)!r}, 'w').close()"]
    with pytest.raises(HookError, match=r"the native hook \(libfoundry_hook.so\) is not built: run `make"):
        launcher.run(config, command, save_runs=2, log=[].append)
    assert not ran.exists()  # the program never ran, not even as the priming run
    assert list(_jit_root.iterdir()) == [] and not (tmp_path / "a").exists()


# a JIT cache as the libraries keep one: what is missing is built, and each build differs
# (nvcc's anonymous-namespace ids, Inductor's timed tuning); SAVE runs find everything built
BUILDS = r"""
import os, secrets, shutil, sys
mode, triton = os.environ["FOUNDRY_MODE"], os.environ["TRITON_CACHE_DIR"]
for name, head in (("add_kernel.cubin", sys.argv[2]), ("__triton_launcher.so", sys.argv[3])):
    path = os.path.join(triton, "KEY1", name)
    if not os.path.exists(path):
        assert mode == "off", "a SAVE run built " + name
        os.makedirs(os.path.dirname(path), exist_ok=True)
        open(path, "wb").write(bytes.fromhex(head) + secrets.token_bytes(16))
if mode != "off":
    shutil.copytree(sys.argv[1], os.environ["FOUNDRY_ARCHIVE"])
"""


def test_a_save_from_a_seed_reuses_its_builds_host_code_only_when_trusted(tmp_path, with_hook, _jit_root):
    lines: list[str] = []
    command = [sys.executable, "-c", BUILDS, str(SAVE_A), CUBIN.hex(), HOST_SO.hex()]

    def saved(name: str, **options) -> dict[str, str]:
        config = launcher.RunConfig("save", tmp_path / name, jit_caches=True, **options)
        assert launcher.run(config, command, save_runs=1, log=lines.append) == 0
        _, manifest = opened(tmp_path / name)
        return {e.path: e.sha256 for e in manifest.entries}

    first = saved("a")
    assert set(first) == {"KEY1/add_kernel.cubin", "KEY1/__triton_launcher.so"}
    assert saved("plain").keys() == first.keys() and not set(saved("plain2").values()) & set(first.values())
    assert saved("b", jit_seed=tmp_path / "a", trust_cached_code=True) == first  # the same builds, both kept
    seeded = f"foundry: JIT caches: the priming run starts from the caches of {tmp_path / 'a'}: 2 files installed"
    assert Archive.open(tmp_path / "a").catalog.environment.compute_capability == "9.0"
    assert seeded in lines
    data_only = saved("c", jit_seed=tmp_path / "a")  # host code left out: built again
    assert data_only["KEY1/add_kernel.cubin"] == first["KEY1/add_kernel.cubin"]
    assert data_only["KEY1/__triton_launcher.so"] != first["KEY1/__triton_launcher.so"]
    assert any("1 files of host code left out, built again" in line for line in lines)
    for seed, why in ((SAVE_A, "has no JIT caches"), (tmp_path / "none", "no such archive")):
        config = launcher.RunConfig("save", tmp_path / "d", jit_caches=True, jit_seed=seed)
        with pytest.raises(FoundryError, match=why):
            launcher.run(config, [sys.executable, "-c", "raise SystemExit(9)"], log=lines.append)
        assert not (tmp_path / "d").exists()  # refused before the priming run
    before = set(_jit_root.iterdir())
    edit_json(tmp_path / "a" / CATALOG_FILE, lambda c: c["environment"].update(compute_capability="8.0"))
    config = launcher.RunConfig("save", tmp_path / "f", jit_caches=True, jit_seed=tmp_path / "a")
    with pytest.raises(CaptureError, match="built on another GPU") as err:  # SAVE_A ran on compute 9.0
        launcher.run(config, command, save_runs=1, log=lines.append)
    assert err.value.field == "environment.compute_capability" and err.value.found == "8.0"
    assert Archive.open(tmp_path / "f").catalog.jit is None and set(_jit_root.iterdir()) == before
    rewrite_manifest(tmp_path / "a", lambda m: m["versions"].update(triton="0.0.0-other"))
    config = launcher.RunConfig("save", tmp_path / "e", jit_caches=True, jit_seed=tmp_path / "a")
    with pytest.raises(DriftError, match="--jit-caches-from were built for another version") as err:
        launcher.run(config, command, save_runs=1, log=lines.append)
    assert err.value.field == "jit.versions.triton" and err.value.path == str(tmp_path / "a")
    assert set(_jit_root.iterdir()) == before  # refused before any directory was made


def test_a_seed_is_for_a_save_of_one_process_that_records_caches(tmp_path):
    cases = ((["--mode", "load"], "a LOAD"), (["--mode", "save", "--no-jit-caches"], "a SAVE with --no-jit-caches"),
             (["--mode", "save", "--world-size", "2"], "a SAVE of ranks"))  # fmt: skip
    for options, this in cases:
        result = CliRunner().invoke(main, ["run", *options, "--jit-caches-from", "/nonexistent", "--archive",
                                           str(tmp_path / "a"), "--", "true"])  # fmt: skip
        assert result.exit_code == 2 and "starts from another archive's" in result.output, options
        assert f"this is {this}" in result.output and "Traceback" not in result.output


def test_the_launcher_imports_little(tmp_path):
    code = ("import sys, foundry.cli, foundry.runtime.launch.launcher, foundry.runtime.launch.jit; "
            "print(' '.join(sorted(sys.modules)))")  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(proc.stdout.split())
    heavy = {"networkx", "rich", "foundry.graphir.graph", "foundry.backends.registry", "foundry.runtime.sessions.load",
             "foundry.archive.writer", "foundry.inspect.summary", "textual"}  # fmt: skip
    assert heavy.isdisjoint(loaded), sorted(heavy & loaded)


def test_a_load_s_checks_before_the_program_starts_import_no_distribution_metadata(tmp_path):
    # importing importlib.metadata cost a launcher 25 ms on the H200 test machine
    code = ("import sys; from pathlib import Path; from foundry.runtime.launch.precheck import check_load; "
            f"check_load(Path({str(loadable(tmp_path / 'a'))!r}), 0, [sys.executable, '-c', 'pass']); "
            "print(' '.join(sorted(sys.modules)))")  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(proc.stdout.split())
    assert "foundry.runtime.sessions.environment" in loaded and "importlib.metadata" not in loaded


def test_a_catalog_with_caches_is_written_at_version_two_and_without_at_one(tmp_path):
    archive, _ = with_caches(tmp_path)
    assert Archive.open(archive).catalog.format_version == 2 and Archive.open(SAVE_A).catalog.format_version == 1
    assert encode_record(Archive.open(archive).catalog).count(b'"jit"') == 1


def startup_benchmark():
    return load_script(SAVE_A.parents[2] / "bench" / "sglang_startup.py", "sglang_startup")


def test_the_benchmark_reads_the_launcher_s_line_and_starts_fresh_runs_with_nothing_installed(tmp_path, with_hook):
    bench = startup_benchmark()
    opens = "from foundry.runtime.sessions.marker import note_session; note_session('load')"
    proc = subprocess.run([sys.executable, "-m", "foundry", "run", "--mode", "load", "--archive",
                           str(loadable(tmp_path / "a")), "--", sys.executable, "-c", opens],
                          capture_output=True, text=True)  # fmt: skip
    found = bench.LAUNCHER_LINE.search(proc.stderr)
    assert proc.returncode == 0 and found and 0 < float(found.group(1)) < 30
    steps = dict(step.rsplit(" ", 2)[:2] for step in found.group(2).split(", "))
    assert list(steps) == ["start and imports", "archive checks", "environment and JIT caches"]
    assert sum(map(float, steps.values())) <= float(found.group(1)) + 0.02  # the start's clock ticks in 10 ms
    hook = bench.HOOK_LINE.search(proc.stderr)  # the hook's line, as the C side writes it, read by the benchmark
    assert hook and 0 < float(hook.group(1)) < 1000 and int(hook.group(2)) > 0, proc.stderr
    (tmp_path / "jit-root" / "some-archive").mkdir(parents=True)
    env = bench.fresh_environment(tmp_path / "scratch", tmp_path)
    assert not (tmp_path / "jit-root").exists() and env["FOUNDRY_JIT_ROOT"] == str(tmp_path / "jit-root")
    assert not {spec.variable for spec in SPECS.values()} & set(env)  # every cache variable unset


def test_the_benchmark_splits_an_import_run_and_names_the_compilers_it_saw(tmp_path):
    bench = startup_benchmark()
    # stand-ins for torch and SGLang, which a machine without a GPU may lack: the program itself runs unchanged
    for module in ("torch/__init__.py", "sglang/__init__.py", "sglang/srt/__init__.py",
                   "sglang/srt/entrypoints/__init__.py", "sglang/srt/entrypoints/engine.py"):  # fmt: skip
        (tmp_path / "stand-ins" / module).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "stand-ins" / module).write_text("")
    (tmp_path / "stand-ins" / "torch" / "__init__.py").write_text(
        "import time\ntime.sleep(0.2)\nclass cuda:\n    is_initialized = staticmethod(lambda: False)\n"
    )
    begun = time.time()
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "stand-ins")}
    found = bench.IMPORTED_LINE.search(subprocess.run([sys.executable, "-c", bench.IMPORT], capture_output=True,
                                                      text=True, check=True, env=env).stdout)  # fmt: skip
    assert found and begun < float(found.group(1)) <= float(found.group(2)) < time.time()
    assert 0.2 <= float(found.group(3)) <= float(found.group(2)) - float(found.group(1))  # torch's share
    assert 0 <= float(found.group(4)) < 0.1 and found.group(5, 6) == ("0", "0")  # a sleep takes no CPU; no CUDA
    source = tmp_path / "many.c"  # long enough to compile for the watch to see the compiler
    source.write_text("".join(f"int f{i}(int x) {{ return x * {i} + {i % 7}; }}\n" for i in range(4000)))
    with bench.CompilerWatch() as watch:
        subprocess.run(["gcc", "-O2", "-c", "-o", str(tmp_path / "many.o"), str(source)], check=True, cwd=tmp_path)
    assert "cc1" in watch.seen
    assert any(str(source) in c and f"(in {tmp_path})" in c for c in watch.commands.values())


def test_the_benchmark_counts_build_tools_and_bookkeeping_apart_from_builds():
    bench = startup_benchmark()
    assert bench.compiled({"compilers": ["cc1", "ninja", "nvcc"]}) == ["cc1", "nvcc"]
    base = "flashinfer/.cache/flashinfer/0.6.15.post1/90a"
    assert is_bookkeeping(f"{base}/cached_ops/tmp/norm.lock") and is_bookkeeping(f"{base}/flashinfer_jit.log")
    assert is_bookkeeping("triton/tmp.pid_12_34/kernel.cubin") and is_bookkeeping("tvm-ffi/mod/lock")
    assert not is_bookkeeping(f"{base}/cached_ops/norm/norm.so") and not is_bookkeeping("triton/ABC/kernel.cubin")


def test_the_benchmark_times_a_run_s_cpu_and_alternates_which_side_goes_first(tmp_path, monkeypatch):
    bench = startup_benchmark()
    before = bench.children_cpu_s()
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass"
    subprocess.run([sys.executable, "-c", burn], check=True)
    assert bench.children_cpu_s() - before >= 0.25
    # SGLang cannot start on this machine: a run here is a stand-in that says which side it was
    order = []
    monkeypatch.setattr(bench, "one_run", lambda args, kind, side, index: order.append((index, side)) or
                        {"kind": kind, "side": side, "index": index, "rc": 0, "compilers": []})  # fmt: skip
    with_caches(tmp_path, "archive")  # the benchmark's archive, with its JIT caches, as `save` leaves it
    args = bench.argparse.Namespace(work=tmp_path, kind="fresh", pairs=4, discard=False)
    assert bench.cmd_pairs(args) == 0
    assert order == [(1, "plain"), (1, "load"), (2, "load"), (2, "plain"), (3, "plain"), (3, "load"),
                     (4, "load"), (4, "plain")]  # fmt: skip
    lines = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [(r["index"], r["side"], r["first"]) for r in lines if r["index"] == 2] == [
        (2, "plain", False),
        (2, "load", True),
    ]


def test_a_benchmark_run_flushes_what_the_run_before_wrote_and_times_its_cpu(tmp_path):
    # a real run of the import kind: here torch and SGLang are missing, so the program ends at its first import
    bench = startup_benchmark()
    (tmp_path / "scratch").mkdir()
    args = bench.argparse.Namespace(work=tmp_path, kind="import")
    result = bench.one_run(args, "import", "plain", 1)
    assert result["sync_s"] >= 0 and 0 < result["cpu_s"] < 60
    assert Path(result["log"]).is_file()


def test_the_benchmark_summarises_a_fresh_series_whose_loads_added_no_file(capsys, tmp_path):
    """The fresh pairs of the H200 test machine at 7339eb7: no LOAD added a file to its caches."""
    bench = startup_benchmark()
    results = SAVE_A.parents[2] / "bench" / "results" / "sglang_startup-h200-2026-12-02-7339eb7.jsonl"
    assert bench.main(["summary", "--work", str(tmp_path / "work"), str(results)]) == 0
    assert not (tmp_path / "work").exists()  # a summary reads results only
    printed = capsys.readouterr().out
    assert "fresh   files LOADs added to or rewrote in the installed caches: 0; build outputs among them: 0" in printed
    assert "fresh   outputs identical in 3 of 3 LOADs" in printed and "LOAD []" in printed


def test_the_benchmark_summarises_warm_pairs_without_the_discarded_run(capsys):
    """The H200 test machine at c6651ce: 3 fresh and 3 warm pairs; the warm step's first plain
    run (compiling, 125 s to ready) is discarded, so the warm plain medians are warm starts."""
    bench = startup_benchmark()
    results = SAVE_A.parents[2] / "bench" / "results" / "sglang_startup-h200-2026-12-02-c6651ce.jsonl"
    assert bench.main(["summary", "--work", "unused", str(results)]) == 0
    printed = capsys.readouterr().out
    warm = re.search(r"^warm +ready_s +(\S+) \[(\S+)-(\S+)\] +(\S+) .* (\S+) s +(\d+)$", printed, re.M)
    assert warm is not None, printed
    assert warm.groups() == ("33.54", "31.27", "34.71", "29.90", "-4.04", "3")
    assert "warm    outputs identical in 3 of 3 LOADs" in printed


def test_the_benchmark_refuses_pairs_before_a_save(tmp_path, capsys):
    bench = startup_benchmark()
    assert bench.main(["pairs", "--work", str(tmp_path), "--kind", "import", "--pairs", "1"]) == 2
    said = capsys.readouterr().err
    assert said.count("\n") == 1 and "no such archive" in said and f"run `save --work {tmp_path}` first" in said
    assert not (tmp_path / "results.jsonl").exists()


def test_the_benchmark_splits_foundry_s_share_of_a_real_load_report(capsys):
    """A fresh LOAD's report from the H200 test machine (qwen3-8b, 36 decode graphs, at 7339eb7)."""
    bench = startup_benchmark()
    report = json.loads((SAVE_A.parent / "sglang-reports" / "qwen3-8b-fresh-load.json").read_text())
    found = bench.figures(report)
    parts = found["foundry_parts"]
    share = sum(parts[k] or 0 for k in bench.SHARE_PARTS)  # a LOAD of 7339eb7 started its session on opening
    assert abs(share - found["foundry_s"]) < 0.001  # the share is its opening, its graphs and its finish
    assert set(parts["start_s"]) == {"hook_and_modules", "cuda", "environment", "reserve", "region"}
    assert parts["graphs_s"] > parts["restore_s"] > 0 and parts["module_check_s"] > 0
    assert bench.figures({**report, "foundry": {}})["foundry_parts"] is None  # a plain run's report
    bench.print_share_parts("fresh", [{"foundry_parts": parts}, {"foundry_parts": None}])
    printed = capsys.readouterr().out
    assert printed.startswith("fresh   Foundry's share, medians of 1 LOADs (s): session_open_s 0.197; "
                              "session_start_s ?; graphs_s 0.261")  # fmt: skip
    assert "start_s (hook_and_modules 0.003, cuda 0.135," in printed and "finish_s (instantiation_wait 0.071" in printed
