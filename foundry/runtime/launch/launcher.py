"""``foundry run``: start a program with the native hook and a SAVE/LOAD session configured.

The program itself opens the session (:func:`foundry.runtime.sessions.open.open_session`);
the launcher sets ``LD_PRELOAD`` and the ``FOUNDRY_*`` variables, and for a LOAD
checks the archive before anything starts, taking the region base and size SAVE used.

A SAVE runs with address-space randomisation off and ``PYTHONHASHSEED=0``:
launchers leave return addresses and heap pointers in the unused bytes of
kernel parameters, and with a fixed layout two SAVEs leave the same ones, so
their fingerprints agree (see :mod:`foundry.graphir.passes.definedness`). The second
run of a SAVE pads the environment by a few KiB, which moves the initial stack
and the heap: every leftover that depends on the layout then differs between
the runs and is marked undefined. Without the pad the runs differ only by the
length of their archive paths, which the stack's 16-byte alignment can absorb
(seen on the H200 test machine: two SAVEs then differed in leftover stack words).
Each later run also has glibc fill fresh and freed heap blocks with its own byte
(``MALLOC_PERTURB_``, with glibc's per-thread cache off, which would hand small
blocks back unfilled), so a leftover from the heap differs between the runs even
where the layout moved nothing: cuDNN's kernel parameters held 24 such bytes that
three unperturbed runs of one SAVE agreed on and another SAVE's runs did not.

A LOAD replaces the launcher with the program (``exec``): no second Python process
waits beside it, and the launcher's own imports stay few (no IR, no backends, no
sessions) so that it adds little to the program's start-up; it says how long it took,
from its process's start to the exec, and in which steps (its interpreter's start and
imports, the archive's checks, the environment with the JIT caches). JIT caches
(:mod:`.jit`): a SAVE records them with a priming run first, a LOAD installs them
before the program starts.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import NoReturn

from foundry.archive.rank_parts import PART_FILE, check_save_id, read_part
from foundry.archive.reader import Archive
from foundry.archive.schema import CATALOG_FILE
from foundry.env import RunEnvironment
from foundry.errors import DriftError, FoundryError, HookError
from foundry.runtime.launch import rank_runs
from foundry.runtime.native.hook import LIBRARY, build_hint, library_path
from foundry.runtime.sessions.base import Laps
from foundry.runtime.sessions.marker import read_marker


@dataclass(frozen=True)
class RunConfig:
    """What ``foundry run`` was asked for (its command-line options)."""

    mode: str
    archive: Path
    region_base: int | None = None
    region_size: int | None = None
    warmup: str = "replay"
    rank: int = 0
    world_size: int = 1  # SAVE: ranks in the archive (one process each; FOUNDRY_SAVE_ID shared when > 1)
    fixed_layout: bool = True  # SAVE: no address-space randomisation, fixed hash seed
    builder: str = "python"  # LOAD: python (cuda-bindings) or native (the hook's builder)
    build_threads: int = 1  # LOAD, native builder: threads that build (and instantiate, unless in the background)
    instantiate: str = "now"  # LOAD, native builder: now, or on a thread behind the program (background)
    overwrite: bool = False  # SAVE: replace an archive already at the path
    layout_pad: int = 0  # SAVE: bytes of padding in the environment (moves the stack and heap)
    first_run: Path | None = None  # SAVE runs after the first: its archive (sizes that must not be profiled again)
    region_threads: str = "owner"  # which threads may allocate in the region: owner or any
    save_id: str | None = None  # SAVE of several ranks: FOUNDRY_SAVE_ID for this run (default: inherited)
    heap_fill: int = 0  # SAVE runs after the first: MALLOC_PERTURB_, the byte glibc fills heap blocks with
    session_marker: Path | None = None  # the file the program's session writes when opened (the first run's)
    session_pid: int | None = None  # LOAD: the process that becomes the program; its hook checks the marker
    jit_caches: bool = False  # SAVE: record the JIT caches (a priming run first); LOAD: install the archive's
    trust_cached_code: bool = False  # LOAD, and SAVE from a seed: install the caches' host code too (code from
    # the archive runs)
    jit_seed: Path | None = None  # SAVE: the archive whose caches the priming run starts from (its builds reused)
    cache_env: tuple[tuple[str, str], ...] = ()  # SAVE runs: the cache variables of the SAVE's own caches


ADDR_NO_RANDOMIZE = 0x0040000
LAYOUT_PAD = 5000  # > one page and not a multiple of 16: every stack address moves, low bytes included
# MALLOC_PERTURB_ of SAVE runs 2, 3, ...: glibc writes the byte into freed blocks and its
# complement into allocated ones. None of them is 0x00 or 0xff, and runs 2-6 share neither
# (later runs start over: each run is compared with the first, which has no fill of ours)
HEAP_FILLS = (0x5A, 0xC3, 0x96, 0x17, 0x2D)
TCACHE_COUNT = "glibc.malloc.tcache_count"


def _no_randomization() -> None:
    """Runs in the child before exec: the new program gets a fixed address-space layout."""
    libc = ctypes.CDLL(None, use_errno=True)
    current = libc.personality(0xFFFFFFFF)
    if current == -1 or libc.personality(current | ADDR_NO_RANDOMIZE) == -1:
        raise OSError(ctypes.get_errno(), "personality(ADDR_NO_RANDOMIZE) failed")


def preexec(config: RunConfig) -> Callable[[], None] | None:
    """What the child runs before exec, or None."""
    return _no_randomization if config.mode == "save" and config.fixed_layout else None


def hook_library() -> Path:
    """The built hook, or a HookError saying what to run to build it."""
    lib = library_path()
    if lib is None:
        raise HookError(f"the native hook ({LIBRARY}) is not built: {build_hint()}")
    return lib


def environment(config: RunConfig, base_env: dict[str, str] | None = None,
                archive: Archive | None = None) -> dict[str, str]:  # fmt: skip
    """The child's environment: the hook preloaded and the session described
    (:class:`foundry.env.RunEnvironment`). A LOAD reads its region from ``archive``
    (opened here when not given)."""
    env = dict(os.environ if base_env is None else base_env)
    lib = hook_library()
    base, size, relocate = config.region_base, config.region_size, False
    if config.mode == "load":
        base, size, relocate = _load_region(config, archive or Archive.open(config.archive))
    preload = [str(lib), *[p for p in env.get("LD_PRELOAD", "").split(":") if p and Path(p).name != LIBRARY]]
    env = _run_environment(config, base, size, relocate).apply(env)
    env.update(config.cache_env)
    env["LD_PRELOAD"] = ":".join(preload)
    if config.mode == "save" and config.fixed_layout:
        env["PYTHONHASHSEED"] = "0"
    if config.heap_fill:
        # glibc fills a block only on its way through the arena; its per-thread cache hands
        # small blocks back as they were freed, so the cache is turned off for this run
        env["MALLOC_PERTURB_"] = str(config.heap_fill)
        tunables = [t for t in env.get("GLIBC_TUNABLES", "").split(":") if t and not t.startswith(TCACHE_COUNT)]
        env["GLIBC_TUNABLES"] = ":".join([*tunables, f"{TCACHE_COUNT}=0"])
    return env


def _load_region(config: RunConfig, archive: Archive) -> tuple[int, int, bool]:
    """A LOAD's region: SAVE's base and size, or (``--region-base``) another base, which
    relocates. ``(base, size, relocate)``."""
    region = archive.session(config.rank).region
    if region is None:
        raise DriftError("the archive has no region record (it was not saved with the hook)", field="region")
    relocate = config.region_base is not None and config.region_base != region.base
    if relocate:
        from foundry.runtime.sessions.validate import check_relocation  # only here: it imports the IR

        check_relocation(config.warmup, saved_base=region.base, live_base=config.region_base)
    return (config.region_base if relocate else region.base), config.region_size or region.size, relocate


def _run_environment(config: RunConfig, base: int | None, size: int | None, relocate: bool) -> RunEnvironment:
    """What the child is told: the session, the region, and this SAVE run's own settings."""
    return RunEnvironment(
        mode=config.mode,
        archive=config.archive.resolve(),
        rank=config.rank,
        world_size=config.world_size,
        load_warmup=config.warmup,
        builder=config.builder,
        build_threads=config.build_threads,
        instantiate=config.instantiate,
        relocate=relocate,
        overwrite=config.overwrite,
        save_id=config.save_id,  # None: the launcher's own (every rank's launcher shares one)
        save_first_run=None if config.first_run is None else config.first_run.resolve(),
        layout_pad=config.layout_pad,
        region_base=base,
        region_size=size,
        region_threads=config.region_threads,
        hook_echo=True,  # the hook's refusals reach stderr, also in processes no session reads
        session_marker=config.session_marker,
        session_pid=config.session_pid,
    )


def _start(command: list[str], config: RunConfig, stop: Callable[[], bool] | None = None,
           env: dict[str, str] | None = None) -> int:  # fmt: skip
    """Run the program; its exit code. With ``stop``, it is polled while the program
    runs, and once true the program is terminated (killed after 10 s). ``env``: this
    environment instead of the configuration's."""
    import subprocess

    try:
        child = subprocess.Popen(command, env=environment(config) if env is None else env,
                                 preexec_fn=None if env is not None else preexec(config))  # fmt: skip
    except FileNotFoundError:
        raise FoundryError("command not found", found=command[0]) from None
    except OSError as err:
        raise FoundryError(f"cannot start the program: {err.strerror or err}", found=command[0]) from None
    except subprocess.SubprocessError as err:  # preexec failed: the kernel refused a fixed layout
        raise FoundryError(f"cannot start the program with a fixed address-space layout ({err}); "
                           "pass --keep-aslr to start it without") from None  # fmt: skip
    try:
        while True:
            try:
                return child.wait(timeout=None if stop is None else 0.2)
            except subprocess.TimeoutExpired:
                if stop is not None and stop():
                    child.terminate()
                    try:
                        return child.wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        child.kill()
                        return child.wait()
    except BaseException:  # the launcher interrupted: the program does not outlive it
        child.kill()
        child.wait()
        raise


def run(config: RunConfig, command: list[str], *, save_runs: int = 2, log: Callable[[str], None] = print,
        replace_process: bool = False) -> int:  # fmt: skip
    """Run ``command`` under the hook; a SAVE runs it ``save_runs`` times in fresh
    processes and marks in the archive every parameter byte the runs disagree on
    (:func:`foundry.runtime.launch.merge.merge_saves`); with several ranks, every rank's
    launcher does so together. Returns the exit code. A LOAD with ``replace_process``
    (``foundry run``) becomes the program instead and does not return."""
    if config.mode == "load":  # refused now, in one line, not from inside the program after its start-up
        from foundry.runtime.launch.precheck import check_load

        laps = Laps({"start and imports": seconds_since_start()})  # where the launcher's time goes, by step
        archive = check_load(config.archive, config.rank, command, config.warmup)
        laps.mark("archive checks")
        return _load(config, archive, command, log, replace_process, laps)
    if config.mode == "save":  # refused now, not after a priming run of minutes
        hook_library()
    if config.mode == "save" and config.jit_caches:
        from foundry.runtime.launch import jit

        again = partial(run, command=command, save_runs=save_runs, log=log)
        return jit.save_with_caches(config, lambda c: again(c), partial(_start_plain, command, config), log)
    if config.mode == "save" and (config.archive / CATALOG_FILE).exists() and not config.overwrite:
        raise FoundryError("already holds an archive (pass --overwrite to replace it)", path=str(config.archive))
    ranks = config.mode == "save" and config.world_size > 1
    if ranks:  # refused now, not after the program ran
        check_save_id(config.archive, rank_runs.save_id())
        rank_runs.check_run_ids(save_runs)
    with tempfile.TemporaryDirectory(prefix="foundry-run-") as scratch:
        marked = dataclasses.replace(config, session_marker=Path(scratch) / "session.json")
        # one rank of several: stopped when another rank's SAVE fails (it would wait for a peer that is gone)
        code = _start(command, marked, rank_runs.failed(config.archive).exists if ranks else None)
        opened = read_marker(marked.session_marker)
    if opened is not None and opened.get("refused"):  # the session said why in one line; nothing to add
        return code
    if ranks and code != 0:
        rank_runs.note_failure(config.archive)
        log(f"foundry: rank {config.rank}'s SAVE ended with {code}; the other ranks' launchers stop theirs")
    if config.mode == "save" and code != 0 and (config.archive / CATALOG_FILE).is_file() and save_runs > 1:
        log(
            f"foundry: the program exited with {code} after writing {config.archive}; no further SAVE run "
            "was made, so the archive lacks the cross-run marks (a server stopped by a signal: --save-runs 1)"
        )
    if config.mode != "save" or code != 0:
        return code
    # one rank of several: its part of this SAVE is written; the catalog comes with the last rank to finish
    written = config.archive / (CATALOG_FILE if config.world_size == 1 else f"rank{config.rank}/{PART_FILE}")
    if written.is_file() and config.world_size > 1 and read_part(written).save_id != rank_runs.save_id():
        raise FoundryError("the program finished, but its rank's part belongs to an earlier SAVE",
                           path=str(written))  # fmt: skip
    if not written.is_file() and opened is None:
        raise FoundryError("the program exited 0 but never opened a SAVE session: it wrote no archive (does it "
                           "call foundry.runtime.open_session()?)", path=str(config.archive))  # fmt: skip
    if not written.is_file():
        raise FoundryError("the program opened a SAVE session but wrote no archive (does it call finish()?)",
                           path=str(config.archive))  # fmt: skip
    for run_index in range(2, save_runs + 1):
        if config.world_size == 1:
            code = _save_again(config, command, run_index, save_runs, log)
        else:
            again = _later_run(config, run_index, rank_runs.run_id(run_index))
            code = rank_runs.save_again(config.archive, again.archive, config.rank, run_index,
                                        partial(_start, command, again), log)  # fmt: skip
        if code != 0:
            return code
    return 0


#: Why a LOAD whose program exited 0 fails; the hook says the same (native/src/session_check.c).
NO_LOAD_SESSION = (
    "the program exited 0 but never opened a LOAD session: nothing was restored (does it call "
    "foundry.runtime.open_session()?)"
)


def _load(config: RunConfig, archive: Archive, command: list[str], log: Callable[[str], None],
          replace_process: bool, laps: Laps) -> int:  # fmt: skip
    """A LOAD of ``archive`` (opened and checked once, for all the launcher reads): its JIT
    caches installed, then the program, in this process when ``replace_process``. The marker's
    directory is removed here unless the program took this process over (its hook removes it then)."""
    scratch = Path(tempfile.mkdtemp(prefix="foundry-run-"))
    marker = scratch / "session.json"
    try:
        # the hook in the process that becomes the program fails it when it exits 0 without a session
        config = dataclasses.replace(
            config, session_marker=marker, session_pid=os.getpid() if replace_process else None
        )
        env = environment(config, archive=archive)
        if config.jit_caches:
            from foundry.runtime.launch import jit

            env.update(jit.load_caches(archive, trust_host_code=config.trust_cached_code, log=log))
        laps.mark("environment and JIT caches")
        if replace_process:
            _exec(command, env, log, laps.into)
        code = _start(command, config, env=env)
        opened = read_marker(marker)
    finally:
        marker.unlink(missing_ok=True)
        scratch.rmdir()
    if code == 0 and opened is None:
        raise FoundryError(NO_LOAD_SESSION, found=" ".join(command)[:200])
    return code


def launcher_line(steps: dict[str, float | None]) -> str:
    """``foundry: launcher: T s from its start to the program's exec (step S s, ...)``."""
    split = ", ".join(f"{name} {_seconds(value)} s" for name, value in steps.items())
    return f"foundry: launcher: {_seconds(seconds_since_start())} s from its start to the program's exec ({split})"


def _seconds(value: float | None) -> str:
    return "?" if value is None else f"{value:.3f}"


def _exec(command: list[str], env: dict[str, str], log: Callable[[str], None],
          steps: dict[str, float | None]) -> NoReturn:  # fmt: skip
    """Become the program, saying how long the launcher took, by step."""
    log(launcher_line(steps))
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(command[0], command, env)
    except FileNotFoundError:
        raise FoundryError("command not found", found=command[0]) from None
    except OSError as err:
        raise FoundryError(f"cannot start the program: {err.strerror or err}", found=command[0]) from None
    raise AssertionError("unreachable")  # pragma: no cover


def seconds_since_start() -> float | None:
    """How long this process has run, from the kernel's record of its start (in clock
    ticks, 10 ms on most systems); None where /proc does not say."""
    try:
        stat = Path("/proc/self/stat").read_text()
        started = int(stat[stat.rindex(")") + 2 :].split()[19]) / os.sysconf("SC_CLK_TCK")
        return time.clock_gettime(time.CLOCK_BOOTTIME) - started
    except (OSError, ValueError, IndexError):
        return None


def _start_plain(command: list[str], config: RunConfig, variables: dict[str, str]) -> int:
    """The program as a plain run (``FOUNDRY_MODE=off``, no hook) with ``variables``: a
    SAVE's priming run."""
    env = RunEnvironment(mode="off").apply(variables)
    preload = [p for p in env.get("LD_PRELOAD", "").split(":") if p and Path(p).name != LIBRARY]
    env["LD_PRELOAD"] = ":".join(preload)
    return _start(command, config, env=env)


def _later_run(config: RunConfig, run_index: int, save_id: str | None = None) -> RunConfig:
    """The configuration of SAVE run ``run_index``: its own archive beside the first,
    its layout moved a page or more further than the run before, its heap filled
    with a byte of its own."""
    extra = config.archive.parent / f".{config.archive.name}.run{run_index}"
    pad = LAYOUT_PAD * (run_index - 1) + 24 * run_index
    fill = HEAP_FILLS[(run_index - 2) % len(HEAP_FILLS)]
    return RunConfig(**{**config.__dict__, "archive": extra, "overwrite": True, "layout_pad": pad,
                        "first_run": config.archive, "save_id": save_id, "heap_fill": fill,
                        "session_marker": None})  # fmt: skip


def _save_again(config: RunConfig, command: list[str], run_index: int, save_runs: int,
                log: Callable[[str], None]) -> int:  # fmt: skip
    """One process: run the program again and mark what the two archives disagree on."""
    import shutil

    from foundry.runtime.launch.merge import merge_saves

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
