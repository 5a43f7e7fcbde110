"""Typed records of the JIT caches an archive carries (``jit/manifest.json``, and the
catalog's ``jit`` entry that seals it); ``docs/archive-format.md`` describes them."""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

import msgspec

from foundry.archive.jit_caches import Cache
from foundry.graphir.limits import I64, U32, U64

JIT_FORMAT = "foundry-jit"
JIT_VERSIONS_READ = (1, 2)  # a manifest is written at the lowest version that holds it
VLLM_SINCE = 2  # vLLM's cache (entries and ``versions.vllm``) came with version 2
MANIFEST_FILE = "jit/manifest.json"
BLOB_DIR = "jit/blobs"


class JitState(StrEnum):
    COMPLETE = "complete"  # every entry's blob is under jit/blobs/
    STRIPPED = "stripped"  # the blobs were removed (the manifest stays, for inspect)


class JitIndex(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The catalog's seal on the caches: the manifest's digest and what it holds."""

    state: JitState
    sha256: str  # of jit/manifest.json
    size: U64
    files: U32
    bytes: U64
    host_code: bool  # some entry is host code (installed only when the user trusts it)


class JitVersions(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """What the cached files were built for; a LOAD refuses another value, naming the
    field. None: not installed at SAVE (not compared)."""

    python_abi: str | None = None
    torch: str | None = None
    triton: str | None = None
    cuda: str | None = None  # the CUDA toolkit (nvcc) JIT builds used
    flashinfer: str | None = None
    sglang_kernel: str | None = None
    tvm_ffi: str | None = None
    vllm: str | None = None  # only with vLLM's cache in the manifest (version 2)
    gpu_arch: str | None = None  # compute capability, as the catalog's environment records it


class Form(StrEnum):
    FILE = "file"  # installed as archived
    TRITON_GROUP = "triton-group"  # Triton's __grp__ file: child paths archived relative to the cache


class JitEntry(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    """One file: ``[cache, path, sha256, size, mode, host_code, mtime_ns, form]``; the
    blob is ``jit/blobs/<sha256>``, the path relative to the cache's directory."""

    cache: Cache
    path: str
    sha256: str
    size: U64
    mode: U32  # permission bits; installed without group or other write
    host_code: bool
    mtime_ns: I64  # restored at install: ninja compares it with its log and its inputs
    form: Form = Form.FILE


class JitManifest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``jit/manifest.json``: every cache file the SAVE's priming run left, and what keys them."""

    format: str
    format_version: int
    cache_id: str  # 32 hex digits: names the per-archive directory a LOAD installs into
    saved_root: str  # that directory on the SAVE machine (ninja's paths are absolute)
    versions: JitVersions
    entries: tuple[JitEntry, ...]


class GroupFile(msgspec.Struct, frozen=True):
    """Triton's ``__grp__<name>.json``: the files of one compiled kernel by absolute path."""

    child_paths: dict[str, str]


def lowest_version(versions: JitVersions, entries: Iterable[JitEntry]) -> int:
    """The lowest manifest version that holds ``versions`` and ``entries``."""
    vllm = versions.vllm is not None or any(e.cache is Cache.VLLM for e in entries)
    return VLLM_SINCE if vllm else 1
