"""JIT caches around ``foundry run``: recorded by a SAVE, installed for a LOAD.

**SAVE** (:func:`save_with_caches`). Every cache variable
(:mod:`foundry.archive.jit_caches`) points at a directory of the SAVE's own,
``<root>/<cache_id>`` (:func:`jit_root`). The program runs once as a plain program
first (the priming run, ``FOUNDRY_MODE=off``, not archived), filling those caches;
their final artefacts are staged content-addressed, the directory is emptied and the
staged files installed into it again, exactly as a LOAD that trusts the archive installs
them. Only then come the SAVE's usual runs, with the caches as they will be installed,
so the allocation trace a LOAD is compared with is that of a run that compiled nothing.
A SAVE run that still compiles something is refused, naming the file; otherwise the
staged files are attached to the archive, the catalog last. A SAVE from a seed
(``--jit-caches-from``) installs another archive's caches before the priming run, as a
LOAD installs them: the priming run then builds only what they lack. Builds are not
reproducible (nvcc draws a new anonymous-namespace id each time, Inductor's tuning picks
by timing), so a second SAVE that is to be compared with a first must reuse its builds.

**LOAD** (:func:`load_caches`). The manifest's versions are compared with this
environment's, the entries installed (host code only with ``--trust-cached-code``) into
the archive's directory (:func:`foundry.archive.jit_install.install_directory`) and the
cache variables pointed there, replacing any the user set (said in one line). In plugin-only
mode the engine plugin does the same before the engine spawns its processes.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from foundry.archive.jit_caches import SPECS, cache_environment, user_settings, xdg_cache_home
from foundry.archive.jit_collect import attach, make_manifest, new_artefacts, stage
from foundry.archive.jit_install import install, install_directory, reindex
from foundry.archive.jit_manifest import encode_manifest, read_manifest
from foundry.archive.jit_schema import JitManifest, JitState, JitVersions
from foundry.archive.jit_versions import live_versions
from foundry.archive.reader import Archive
from foundry.archive.schema import CATALOG_FILE
from foundry.env import JIT_ROOT
from foundry.errors import CaptureError, DriftError, FoundryError

Log = Callable[[str], None]


def jit_root(environ: Mapping[str, str] | None = None) -> Path:
    """Where archives' caches go: ``FOUNDRY_JIT_ROOT``, else ``$XDG_CACHE_HOME/foundry/jit``
    (``~/.cache/foundry/jit``)."""
    env = os.environ if environ is None else environ
    return JIT_ROOT.read(env) or xdg_cache_home(env) / "foundry" / "jit"


def replaced_settings(environ: Mapping[str, str], directory: Path) -> str | None:
    """One line naming every cache setting of the user's this run replaces, where the
    library would have kept its cache, and where it keeps it now; None when there is none."""
    found = user_settings(environ)
    if not found:
        return None
    parts = []
    for spec, resolved in found:
        where = "set but empty" if resolved.path is None else str(resolved.path)
        parts.append(f"{resolved.by}={environ.get(resolved.by, '')} ({spec.library}: {where}) -> "
                     f"{spec.root(directory / spec.cache.value)}")  # fmt: skip
    return "foundry: JIT caches: this run replaces your settings: " + "; ".join(parts)


# -- LOAD -------------------------------------------------------------------------


def load_caches(source: Path | Archive, *, trust_host_code: bool, log: Log,
                environ: Mapping[str, str] | None = None) -> dict[str, str]:  # fmt: skip
    """Install the caches of the archive (at a path, or already open) and return the variables
    that point the engine at them (nothing when the archive carries none)."""
    env = os.environ if environ is None else environ
    archive = source if isinstance(source, Archive) else Archive.open(source)
    jit = archive.catalog.jit
    if jit is None:
        return {}
    if jit.state is JitState.STRIPPED:
        log("foundry: the archive's JIT caches were stripped: the program compiles what it needs")
        return {}
    manifest = read_manifest(archive.root, jit)
    check_versions(manifest.versions, live_versions(env))
    directory = install_directory(jit_root(env), manifest.cache_id, trust_host_code=trust_host_code)
    report = install(archive.root, manifest, jit.sha256, directory, trust_host_code=trust_host_code)
    done = "already installed" if report.reused else f"{report.installed} installed, {report.present} in place"
    left = f"; {report.placed} empty locks and logs laid down where the libraries expect them" if report.placed else ""
    if report.left_out:
        # the engine builds them itself: at its warm-ups, or at its first request where a LOAD skips them
        left += (f"; {report.left_out} files of host code left out (--trust-cached-code installs them), which "
                 "the engine builds itself, at its first request where the LOAD skips its warm-ups")  # fmt: skip
    log(f"foundry: JIT caches of the archive in {directory}: {jit.files} files ({done}){left}")
    if report.kept:
        log(f"foundry: JIT caches: {len(report.kept)} files already in {directory} differ from the archive's "
            f"and are kept (the engine wrote them; first: {report.kept[0]})")  # fmt: skip
    line = replaced_settings(env, directory)
    if line:
        log(line)
    return cache_environment(directory)


LOAD_REFUSAL = "the archive's JIT caches were built for another version (--no-jit-caches LOADs without them)"
SEED_REFUSAL = ("the JIT caches of --jit-caches-from were built for another version (a SAVE without "
                "--jit-caches-from builds its own)")  # fmt: skip


def check_versions(recorded: JitVersions, live: Mapping[str, str | None], *, refusal: str = LOAD_REFUSAL,
                   path: Path | None = None) -> None:  # fmt: skip
    """Refuse (``refusal``, at ``path``), naming the field, a version of this environment other
    than the one the caches were built with (``gpu_arch``: compared by the session with the live GPU)."""
    for name in recorded.__struct_fields__:
        want = getattr(recorded, name)
        if want is None or name == "gpu_arch":
            continue
        if live.get(name) != want:
            raise DriftError(refusal, path=None if path is None else str(path), field=f"jit.versions.{name}",
                             expected=want, found=live.get(name))  # fmt: skip


# -- SAVE -------------------------------------------------------------------------

# start(command, env) runs the program once with exactly this environment; its exit code
StartPlain = Callable[[dict[str, str]], int]


def save_with_caches(config: Any, save: Callable[[Any], int], start_plain: StartPlain, log: Log,
                     environ: Mapping[str, str] | None = None) -> int:  # fmt: skip
    """A SAVE whose archive carries the JIT caches: the priming run, the caches staged and
    installed again, ``save(config)`` (the SAVE's usual runs, with the caches in place),
    then the caches attached. ``config`` is the launcher's ``RunConfig``. Returns the exit code."""
    env = dict(os.environ if environ is None else environ)
    if config.world_size > 1:
        if config.jit_seed is not None:
            raise FoundryError("JIT caches are recorded for SAVEs of one process only; a SAVE of several ranks "
                               "starts from no archive's", field="--jit-caches-from")  # fmt: skip
        log("foundry: JIT caches are recorded for SAVEs of one process only; this SAVE records none")
        return save(replace(config, jit_caches=False))
    if (config.archive / CATALOG_FILE).exists() and not config.overwrite:
        raise FoundryError("already holds an archive (pass --overwrite to replace it)", path=str(config.archive))
    seed = None if config.jit_seed is None else open_seed(config.jit_seed, env)  # refused before anything is made
    cache_id = secrets.token_hex(16)
    directory = jit_root(env) / cache_id
    directory.mkdir(parents=True)
    staging = config.archive.parent / f".{config.archive.name}.jit"
    shutil.rmtree(staging, ignore_errors=True)
    variables = cache_environment(directory)
    attached = False
    try:
        if seed is not None:
            seed_caches(seed, directory, trust_host_code=config.trust_cached_code, log=log)
        line = replaced_settings(env, directory)
        if line:
            log(line)
        log(f"foundry: JIT caches: a priming run first (the program as a plain run), its caches in {directory}")
        code = start_plain({**env, **variables})
        if code != 0:
            log(f"foundry: the priming run failed (exit {code}); nothing was saved")
            return code
        staged = stage(directory, staging)
        manifest = make_manifest(staged, cache_id=cache_id, saved_root=directory,
                                 versions=JitVersions(**live_versions(env)))  # fmt: skip
        _empty(directory)
        digest = _digest(manifest)
        install(staging, manifest, digest, directory, trust_host_code=True)
        megabytes = sum(e.size for e in manifest.entries) / 2**20
        log(f"foundry: JIT caches: {len(manifest.entries)} files ({megabytes:.1f} MiB) kept of the priming run "
            f"({staged.skipped} temporary or intermediate left out), installed again for the SAVE's runs")  # fmt: skip
        code = save(replace(config, jit_caches=False, cache_env=tuple(sorted(variables.items()))))
        if code != 0:
            return code
        if seed is not None:
            check_seed_gpu(seed[0], config.archive)
        compiled = new_artefacts(directory, manifest)
        if compiled:
            raise CaptureError(f"the SAVE's runs compiled what the priming run had not ({len(compiled)} files); "
                               f"{config.archive} is kept without JIT caches", field="jit",
                               found=compiled[:4])  # fmt: skip
        index = attach(config.archive, staging, manifest)
        reindex(directory, index.sha256, trust_host_code=True, files=index.files)
        attached = True
        host = sum(e.host_code for e in manifest.entries)
        log(f"foundry: JIT caches in the archive: {index.files} files, {index.bytes / 2**20:.1f} MiB "
            f"({host} of them host code)")  # fmt: skip
        return 0
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if not attached:
            shutil.rmtree(directory, ignore_errors=True)
            Path(f"{directory}.lock").unlink(missing_ok=True)


def open_seed(seed: Path, environ: Mapping[str, str]) -> tuple[Archive, JitManifest]:
    """The archive at ``seed`` and its caches' manifest, for a priming run to start from;
    refused when it carries none, or caches built for another version."""
    archive = Archive.open(seed)
    jit = archive.catalog.jit
    if jit is None or jit.state is JitState.STRIPPED:
        state = "none" if jit is None else "stripped"
        raise FoundryError("has no JIT caches for the priming run to start from", field="--jit-caches-from",
                           path=str(seed), found=state)  # fmt: skip
    manifest = read_manifest(archive.root, jit)
    check_versions(manifest.versions, live_versions(environ), refusal=SEED_REFUSAL, path=seed)
    return archive, manifest


def seed_caches(seed: tuple[Archive, JitManifest], directory: Path, *, trust_host_code: bool, log: Log) -> None:
    """Install the seed's caches into ``directory`` (host code only when trusted)."""
    archive, manifest = seed
    jit = archive.catalog.jit
    report = install(archive.root, manifest, jit.sha256, directory, trust_host_code=trust_host_code)
    left = (f"; {report.left_out} files of host code left out, built again (--trust-cached-code installs them)"
            if report.left_out else "")  # fmt: skip
    log(f"foundry: JIT caches: the priming run starts from the caches of {archive.root}: {report.installed} "
        f"files installed{left}")  # fmt: skip


def check_seed_gpu(seed: Archive, saved: Path) -> None:
    """Refuse caches built on another kind of GPU than the one the SAVE ran on: the
    archive would carry builds its LOADs cannot use (the launcher sees no GPU; the
    SAVE's own record says which it was)."""
    built, ran = seed.catalog.environment, Archive.open(saved).catalog.environment
    if built.compute_capability != ran.compute_capability:
        raise CaptureError(f"the caches of --jit-caches-from were built on another GPU; {saved} is kept without "
                           "JIT caches", field="environment.compute_capability", path=str(seed.root),
                           expected=ran.compute_capability, found=built.compute_capability)  # fmt: skip


def _digest(manifest: Any) -> str:
    return hashlib.sha256(encode_manifest(manifest)).hexdigest()


def _empty(directory: Path) -> None:
    """Remove what the priming run left in ``directory``, keeping the directory."""
    for spec in SPECS.values():
        shutil.rmtree(directory / spec.cache.value, ignore_errors=True)
    for leftover in directory.iterdir():
        if leftover.is_dir() and not leftover.is_symlink():
            shutil.rmtree(leftover)
        else:
            leftover.unlink()
