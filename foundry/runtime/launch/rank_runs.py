"""The later runs of a SAVE made by several processes, one rank each.

A SAVE runs its program more than once to find the parameter bytes the runs
disagree on (:mod:`foundry.runtime.launch.merge`). With several ranks the runs
need every rank at once (the ranks talk to each other), so every rank's
``foundry run`` makes them together: it waits until the first run is committed
(``.committed.<id>``), runs its rank again into one archive the ranks share
beside the first (``.DIR.run<N>``, SAVE id ``<id>.run<N>``), waits until that is
committed too, and whichever launcher then takes the first archive's lock marks
every rank's graphs; the others find ``.merged.<id>.run<N>`` and return.

A rank whose run fails leaves ``.failed.<id>`` in the first archive. Every other
launcher then stops its own program (it would wait for a peer that is gone),
removes the shared archive and returns non-zero; the first archive stays as the
first run wrote it, without the cross-run marks. No launcher waits longer than
:data:`WAIT_S` for the others.
"""

from __future__ import annotations

import fcntl
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from foundry.archive.files import atomic_write
from foundry.archive.rank_parts import LOCK_FILE, check_id_form, committed_marker, failed_marker
from foundry.env import SAVE_ID
from foundry.errors import FoundryError

WAIT_S = 600.0  # how long a rank's launcher waits for the other ranks' runs
POLL_S = 0.2

# start(stop) runs the program and returns its exit code, stopping it once stop() is true
Start = Callable[[Callable[[], bool]], int]


def save_id() -> str:
    """This SAVE's id, shared by every rank's launcher ("" when none was given)."""
    return SAVE_ID.read() or ""


def run_id(run_index: int) -> str:
    """The SAVE id of run ``run_index`` (2, 3, ...)."""
    return f"{save_id()}.run{run_index}"


def check_run_ids(save_runs: int) -> None:
    """Refuse, before anything runs, an id too long to name the later runs."""
    for run_index in range(2, save_runs + 1):
        check_id_form(run_id(run_index))


def failed(first: Path) -> Path:
    return failed_marker(first, save_id())


def note_failure(first: Path) -> None:
    """Tell the other ranks' launchers that this SAVE failed."""
    first.mkdir(parents=True, exist_ok=True)
    atomic_write(failed(first), b"")


def save_again(first: Path, shared: Path, rank: int, run_index: int, start: Start, log: Callable[[str], None]) -> int:
    """SAVE run ``run_index`` of this rank into ``shared``, then the merge (by one launcher)."""
    from foundry.runtime.launch.merge import merge_saves

    merged = first / f".merged.{run_id(run_index)}"
    try:
        _wait_for(committed_marker(first, save_id()), "every rank's first SAVE run", first)
        log(f"foundry: SAVE run {run_index}, rank {rank} (every rank again, to find bytes the runs disagree on)")
        code = start(failed(first).exists)
        if code != 0:
            note_failure(first)
            log(f"foundry: SAVE run {run_index} of rank {rank} ended with {code}; {first} holds the first run's "
                "archive without the cross-run marks")  # fmt: skip
            shutil.rmtree(shared, ignore_errors=True)
            return code
        _wait_for(committed_marker(shared, run_id(run_index)), f"every rank's SAVE run {run_index}", first,
                  merged)  # fmt: skip
        with open(first / LOCK_FILE, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if failed(first).exists():  # the launcher that took the lock first could not merge
                raise FoundryError(f"another rank's launcher failed to merge SAVE run {run_index}",
                                   path=str(failed(first)))  # fmt: skip
            if merged.exists():
                log(f"foundry: run {run_index} was merged by another rank's launcher")
                return 0
            stats = merge_saves(first, shared)
            atomic_write(merged, b"")
    except FoundryError:
        note_failure(first)
        shutil.rmtree(shared, ignore_errors=True)
        raise
    shutil.rmtree(shared, ignore_errors=True)
    log(f"foundry: merged run {run_index} of every rank: {stats['undefined_bytes']} undefined parameter bytes "
        f"in {stats['graphs']} graphs")  # fmt: skip
    return 0


def _wait_for(marker: Path, what: str, first: Path, done: Path | None = None) -> None:
    """Wait until ``marker`` (or ``done``) exists; refuse when another rank failed or
    after :data:`WAIT_S`."""
    deadline = time.monotonic() + WAIT_S
    while not marker.exists() and not (done is not None and done.exists()):
        if failed(first).exists():
            raise FoundryError(f"another rank's SAVE failed before {what} finished; {first} holds the first run's "
                               "archive without the cross-run marks", path=str(failed(first)))  # fmt: skip
        if time.monotonic() > deadline:
            raise FoundryError(f"{what} did not finish within {WAIT_S:.0f} s; {first} holds the first run's "
                               "archive without the cross-run marks", path=str(marker))  # fmt: skip
        time.sleep(POLL_S)
