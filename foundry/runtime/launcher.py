"""``foundry run``: start a program with the native hook and a SAVE/LOAD session configured.

The program itself opens the session (:func:`foundry.runtime.session.open_session`);
the launcher sets ``LD_PRELOAD`` and the ``FOUNDRY_*`` variables, and for a LOAD
checks the archive before anything starts, taking the region base and size SAVE used.

A SAVE runs with address-space randomisation off and ``PYTHONHASHSEED=0``:
launchers leave return addresses and heap pointers in the unused bytes of
kernel parameters, and with a fixed layout two SAVEs leave the same ones, so
their fingerprints agree (see :mod:`foundry.runtime.definedness`). The second
run of a SAVE pads the environment by a few KiB, which moves the initial stack
and the heap: every leftover that depends on the layout then differs between
the runs and is marked undefined. Without the pad the runs differ only by the
length of their archive paths, which the stack's 16-byte alignment can absorb
(seen on the H200 test machine: two SAVEs then differed in leftover stack words).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from foundry.archive.rank_parts import PART_FILE, check_save_id, read_part
from foundry.archive.reader import Archive
from foundry.archive.schema import CATALOG_FILE
from foundry.errors import DriftError, FoundryError, HookError
from foundry.runtime.hook import LIBRARY, library_path


@dataclass(frozen=True)
class RunConfig:
    mode: str
    archive: Path
    region_base: int | None = None
    region_size: int | None = None
    warmup: str = "replay"
    rank: int = 0
    world_size: int = 1  # SAVE: ranks in the archive (one process each; FOUNDRY_SAVE_ID shared when > 1)
    fixed_layout: bool = True  # SAVE: no address-space randomisation, fixed hash seed
    builder: str = "python"  # LOAD: python (cuda-bindings) or native (the hook's builder)
    build_threads: int = 1  # LOAD, native builder: threads that build and instantiate
    overwrite: bool = False  # SAVE: replace an archive already at the path
    layout_pad: int = 0  # SAVE: bytes of padding in the environment (moves the stack and heap)
    first_run: Path | None = None  # SAVE runs after the first: its archive (sizes that must not be profiled again)
    region_threads: str = "owner"  # which threads may allocate in the region: owner or any
    save_id: str | None = None  # SAVE of several ranks: FOUNDRY_SAVE_ID for this run (default: inherited)


ADDR_NO_RANDOMIZE = 0x0040000
LAYOUT_PAD = 5000  # > one page and not a multiple of 16: every stack address moves, low bytes included


def _no_randomization() -> None:
    """Runs in the child before exec: the new program gets a fixed address-space layout."""
    libc = ctypes.CDLL(None, use_errno=True)
    current = libc.personality(0xFFFFFFFF)
    if current == -1 or libc.personality(current | ADDR_NO_RANDOMIZE) == -1:
        raise OSError(ctypes.get_errno(), "personality(ADDR_NO_RANDOMIZE) failed")


def preexec(config: RunConfig) -> Callable[[], None] | None:
    """What the child runs before exec, or None."""
    return _no_randomization if config.mode == "save" and config.fixed_layout else None


def environment(config: RunConfig, base_env: dict[str, str] | None = None) -> dict[str, str]:
    """The child's environment: the hook preloaded and the session described."""
    env = dict(os.environ if base_env is None else base_env)
    lib = library_path()
    if lib is None:
        raise HookError(f"the native hook ({LIBRARY}) is not built: install the package where CUDA headers exist, "
                        "or run `make -C native`")  # fmt: skip
    base, size = config.region_base, config.region_size
    if config.mode == "load":
        region = Archive.open(config.archive).session(config.rank).region
        if region is None:
            raise DriftError("the archive has no region record (it was not saved with the hook)", field="region")
        relocate = base is not None and base != region.base
        if relocate and config.warmup == "restore":
            raise DriftError("restored warm-up bytes can hold pointers into SAVE's region, so a LOAD at another "
                             "base needs --warmup replay", field="region.base", expected=hex(region.base),
                             found=hex(base))  # fmt: skip
        env["FOUNDRY_RELOCATE"] = "1" if relocate else "0"
        base, size = (base if relocate else region.base), size or region.size
    preload = [str(lib), *[p for p in env.get("LD_PRELOAD", "").split(":") if p and Path(p).name != LIBRARY]]
    env.update(
        LD_PRELOAD=":".join(preload),
        FOUNDRY_MODE=config.mode,
        FOUNDRY_ARCHIVE=str(config.archive.resolve()),
        FOUNDRY_LOAD_WARMUP=config.warmup,
        FOUNDRY_RANK=str(config.rank),
        FOUNDRY_WORLD_SIZE=str(config.world_size),
        FOUNDRY_BUILDER=config.builder,
        FOUNDRY_BUILD_THREADS=str(config.build_threads),
        FOUNDRY_OVERWRITE="1" if config.overwrite else "0",
        FOUNDRY_HOOK_ECHO="1",  # the hook's refusals reach stderr, also in processes no session reads
        FOUNDRY_REGION_THREADS=config.region_threads,
    )
    if config.mode == "save" and config.fixed_layout:
        env["PYTHONHASHSEED"] = "0"
    if config.layout_pad:
        env["FOUNDRY_LAYOUT_PAD"] = "." * config.layout_pad
    else:
        env.pop("FOUNDRY_LAYOUT_PAD", None)
    if config.first_run is not None:
        env["FOUNDRY_SAVE_FIRST_RUN"] = str(config.first_run.resolve())
    else:
        env.pop("FOUNDRY_SAVE_FIRST_RUN", None)
    if config.save_id is not None:
        env["FOUNDRY_SAVE_ID"] = config.save_id
    if base is not None:
        env["FOUNDRY_REGION_BASE"] = hex(base)
    if size is not None:
        env["FOUNDRY_REGION_SIZE"] = str(size)
    return env


def _start(command: list[str], config: RunConfig) -> int:
    import subprocess

    try:
        return subprocess.run(command, env=environment(config), preexec_fn=preexec(config)).returncode
    except FileNotFoundError:
        raise FoundryError("command not found", found=command[0]) from None
    except OSError as err:
        raise FoundryError(f"cannot start the program: {err.strerror or err}", found=command[0]) from None
    except subprocess.SubprocessError as err:  # preexec failed: the kernel refused a fixed layout
        raise FoundryError(f"cannot start the program with a fixed address-space layout ({err}); "
                           "pass --keep-aslr to start it without") from None  # fmt: skip


def run(config: RunConfig, command: list[str], *, save_runs: int = 2, log: Callable[[str], None] = print) -> int:
    """Run ``command`` under the hook; a SAVE runs it ``save_runs`` times in fresh
    processes and marks in the archive every parameter byte the runs disagree on
    (:func:`foundry.runtime.definedness.merge_saves`); with several ranks, every rank's
    launcher does so together. Returns the exit code."""
    if config.mode == "save" and (config.archive / CATALOG_FILE).exists() and not config.overwrite:
        raise FoundryError("already holds an archive (pass --overwrite to replace it)", path=str(config.archive))
    if config.mode == "save" and config.world_size > 1:  # refused now, not after the program ran
        check_save_id(config.archive, os.environ.get("FOUNDRY_SAVE_ID", ""))
    code = _start(command, config)
    if config.mode == "save" and code != 0 and (config.archive / CATALOG_FILE).is_file() and save_runs > 1:
        log(
            f"foundry: the program exited with {code} after writing {config.archive}; no further SAVE run "
            "was made, so the archive lacks the cross-run marks (a server stopped by a signal: --save-runs 1)"
        )
    if config.mode != "save" or code != 0:
        return code
    # one rank of several: its part of this SAVE is written; the catalog comes with the last rank to finish
    written = config.archive / (CATALOG_FILE if config.world_size == 1 else f"rank{config.rank}/{PART_FILE}")
    if written.is_file() and config.world_size > 1 and read_part(written).save_id != os.environ.get("FOUNDRY_SAVE_ID"):
        raise FoundryError("the program finished, but its rank's part belongs to an earlier SAVE",
                           path=str(written))  # fmt: skip
    if not written.is_file():
        raise FoundryError("the program finished but wrote no archive (does it open a session and call finish()?)",
                           path=str(config.archive))  # fmt: skip
    for run_index in range(2, save_runs + 1):
        again = _save_again if config.world_size == 1 else _save_ranks_again
        code = again(config, command, run_index, save_runs, log)
        if code != 0:
            return code
    return 0


def _later_run(config: RunConfig, run_index: int, save_id: str | None = None) -> RunConfig:
    """The configuration of SAVE run ``run_index``: its own archive beside the first,
    its layout moved a page or more further than the run before."""
    extra = config.archive.parent / f".{config.archive.name}.run{run_index}"
    pad = LAYOUT_PAD * (run_index - 1) + 24 * run_index
    return RunConfig(**{**config.__dict__, "archive": extra, "overwrite": True, "layout_pad": pad,
                        "first_run": config.archive, "save_id": save_id})  # fmt: skip


def _save_again(config: RunConfig, command: list[str], run_index: int, save_runs: int,
                log: Callable[[str], None]) -> int:  # fmt: skip
    """One process: run the program again and mark what the two archives disagree on."""
    import shutil

    from foundry.runtime.definedness import merge_saves

    again = _later_run(config, run_index)
    log(f"foundry: SAVE run {run_index} of {save_runs} (a fresh process, to find bytes the runs disagree on)")
    try:
        code = _start(command, again)
        if code != 0:
            log(f"foundry: SAVE run {run_index} failed (exit {code}); {config.archive} holds the first run's "
                "archive without the cross-run marks")  # fmt: skip
            return code
        stats = merge_saves(config.archive, again.archive)
        log(f"foundry: merged run {run_index}: {stats['undefined_bytes']} undefined parameter bytes "
            f"in {stats['graphs']} graphs")  # fmt: skip
    finally:
        shutil.rmtree(again.archive, ignore_errors=True)
    return 0


def _save_ranks_again(config: RunConfig, command: list[str], run_index: int, save_runs: int,
                      log: Callable[[str], None]) -> int:  # fmt: skip
    """One rank of several: every rank's launcher runs its rank again, together, into one
    shared archive under the SAVE id with ``.run<N>`` added; once that archive is
    committed, whichever launcher takes the lock first marks every rank's graphs in
    the first archive (the others find it done)."""
    import fcntl
    import shutil

    from foundry.archive.files import atomic_write
    from foundry.archive.rank_parts import LOCK_FILE
    from foundry.runtime.definedness import merge_saves

    save_id = os.environ.get("FOUNDRY_SAVE_ID", "")
    again = _later_run(config, run_index, f"{save_id}.run{run_index}")
    # the first run is complete only once every rank sealed its part (later runs may read its catalog)
    _wait_for(config.archive / f".committed.{save_id}", "every rank's first SAVE run", config)
    log(f"foundry: SAVE run {run_index} of {save_runs}, rank {config.rank} (fresh processes, every rank again, "
        "to find bytes the runs disagree on)")  # fmt: skip
    code = _start(command, again)
    if code != 0:
        log(f"foundry: SAVE run {run_index} of rank {config.rank} failed (exit {code}); {config.archive} holds "
            "the first run's archive without the cross-run marks")  # fmt: skip
        return code
    merged = config.archive / f".merged.{again.save_id}"
    _wait_for(again.archive / f".committed.{again.save_id}", f"every rank's SAVE run {run_index}", config, merged)
    with open(config.archive / LOCK_FILE, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if merged.exists():
            log(f"foundry: run {run_index} was merged by another rank's launcher")
            return 0
        stats = merge_saves(config.archive, again.archive)
        atomic_write(merged, b"")
    shutil.rmtree(again.archive, ignore_errors=True)
    log(f"foundry: merged run {run_index} of every rank: {stats['undefined_bytes']} undefined parameter bytes "
        f"in {stats['graphs']} graphs")  # fmt: skip
    return 0


RANKS_WAIT_S = 600.0  # how long a rank's launcher waits for the other ranks' runs to finish


def _wait_for(marker: Path, what: str, config: RunConfig, done: Path | None = None) -> None:
    """Wait until ``marker`` (or ``done``) exists; refuse, naming what, after RANKS_WAIT_S."""
    import time

    deadline = time.monotonic() + RANKS_WAIT_S
    while not marker.exists() and not (done is not None and done.exists()):
        if time.monotonic() > deadline:
            raise FoundryError(f"{what} did not finish within {RANKS_WAIT_S:.0f} s; {config.archive} holds the "
                               "first run's archive without the cross-run marks", path=str(marker))  # fmt: skip
        time.sleep(0.2)
