"""A serving process's session, as every engine plugin sets it up and ends it.

- :func:`prepare_children`: without ``foundry run``, the processes the engine
  spawns get the hook preloaded and the session described in ``FOUNDRY_*``
  variables (a SAVE also turns address-space randomisation off for them);
- :func:`open_session`, :func:`start_session`: SAVE or LOAD opened (a LOAD's live
  server compared with SAVE's by field), and started before the process's first CUDA
  allocation: at once, or where the engine has made CUDA's context itself;
- :func:`pinned_budget`: the KV cache (and any other pool sized from free memory)
  sized as at SAVE instead of profiled again;
- :func:`check_restored`: a LOAD restored every archived graph and captured none;
- :func:`write_report`, :func:`note_replay`: the session's report, and each
  restored graph's first replay, for the recipes;
- :func:`says_refusals`: a hook's Foundry error is said in one line, then raised.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from foundry.env import OVERWRITE, SAVE_FIRST_RUN
from foundry.errors import DriftError, FoundryError
from foundry.integrations.common.config import PluginConfig
from foundry.integrations.common.drift import check_fields


def say(message: str) -> None:
    """One line on stderr: engines load plugins before they configure their logging."""
    print(f"foundry: {message}", file=sys.stderr, flush=True)


def _said(line: str) -> None:
    """A launcher's line (it starts with ``foundry: ``) said as the plugins say theirs."""
    say(line.removeprefix("foundry: "))


def says_refusals(who: Callable[[], str]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A hook's Foundry error stops the engine's process (the engine logs it with a
    traceback); the log also gets one line, ``foundry: WHO refused: ...`` for drift
    or ``foundry: WHO failed: ...`` otherwise (``who()`` names the process)."""

    def decorate(hook: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(hook)
        def run(*args: Any, **kwargs: Any) -> Any:
            try:
                return hook(*args, **kwargs)
            except FoundryError as err:
                say(f"{who()} {'refused' if isinstance(err, DriftError) else 'failed'}: {err}")
                raise

        return run

    return decorate


def prepare_children(config: PluginConfig, extra: Mapping[str, str] | None = None) -> None:
    """Without ``foundry run``: preload the hook into the processes the engine spawns and
    describe the session to them (spawned processes inherit this environment), with
    ``extra`` variables the engine needs for it; a LOAD installs the archive's JIT caches
    first and points the engine's cache variables at them, as ``foundry run`` does."""
    from foundry.runtime.launch import launcher

    run = launcher.RunConfig(config.mode, Path(config.archive or ""), config.region_base, config.region_size,
                             config.warmup)  # fmt: skip
    env = launcher.environment(run)  # built from os.environ: what it dropped, this process drops too
    if config.mode == "load" and config.jit_caches:
        from foundry.runtime.launch import jit

        env.update(jit.load_caches(run.archive, trust_host_code=config.trust_cached_code, log=_said))
    for key in set(os.environ) - set(env):
        del os.environ[key]
    os.environ.update(env)
    os.environ.update(extra or {})
    if config.mode == "save":
        launcher.preexec(run)()  # no address-space randomisation, inherited by every child


def start_session(config: PluginConfig, **options: Any) -> Any:
    """The process's SAVE or LOAD session (:func:`open_session`), started: the region reserved."""
    session = open_session(config, **options)
    session.start()
    return session


def open_session(
    config: PluginConfig,
    *,
    device: int,
    rank: int,
    live: dict[str, str],
    check_archive: Callable[[Any, dict[str, Any]], None] | None = None,
    **save_options: Any,
) -> Any:
    """The process's SAVE or LOAD session, checked but not started (nothing of CUDA's touched
    yet). SAVE records ``live`` in the archive's catalog; LOAD refuses an archive whose record
    differs, by field, after ``check_archive(archive, load options)`` accepted it. A LOAD's
    report says where its opening went, by step (``open_s``)."""
    from foundry.runtime.sessions.base import Laps

    opened: dict[str, float] = {}
    laps = Laps(opened)  # from before the sessions' modules are imported: the first open pays for them
    from foundry.runtime.sessions.load import LoadSession
    from foundry.runtime.sessions.open import load_options
    from foundry.runtime.sessions.save import SaveSession

    laps.mark("modules")
    if config.mode == "save":
        session: Any = SaveSession(config.archive, device=device, rank=rank, model=live, overwrite=OVERWRITE.read(),
                                   **save_options)  # fmt: skip
    else:
        from foundry.archive.reader import Archive

        options = load_options()
        archive = Archive.open(config.archive)
        laps.mark("archive")
        if check_archive is not None:  # before the session, which would refuse less clearly
            check_archive(archive, options)
        session = LoadSession(archive, device=device, rank=rank, **options)
        laps.mark("session")  # its options checked, the backends it needs discovered (else read on a thread)
        check_fields(session.archive.catalog.model, live)
        laps.mark("engine_record")
        session.report["open_s"] = opened
    return session


def pinned_budget(session: Any, mode: str, profiled: int, key: str, engine: str, what: str = "the KV cache") -> int:
    """The KV budget to use: SAVE records what it profiled (a later run of a SAVE takes
    the first run's, so both allocate alike); LOAD takes SAVE's, refusing when less
    memory is free now, so the KV cache and every later allocation land where they did.
    Any other size an engine derives from free memory (``what``: a hybrid model's state
    pool, say) is pinned the same way."""
    first_run = SAVE_FIRST_RUN.read() if mode == "save" else None
    if mode == "save" and not first_run:
        session.model[key] = str(profiled)
        return profiled
    if first_run:
        from foundry.archive.reader import Archive

        recorded = Archive.open(first_run).catalog.model.get(key)
        session.model[key] = str(recorded)
    else:
        recorded = session.archive.catalog.model.get(key)
    if recorded is None:
        raise DriftError(f"the archive records no size for {what} (not saved by the {engine} plugin)", field=key)
    if profiled < int(recorded):
        raise DriftError(f"less GPU memory is free for {what} than at SAVE", field=key,
                         expected=int(recorded), found=profiled)  # fmt: skip
    return int(recorded)


def check_restored(session: Any, names: list[str], report: dict[str, Any], field: str) -> None:
    """A LOAD asked for every archived graph (``names``: the ones it installed) and
    captured none."""
    archived = [entry.name for entry in session.record.graphs]
    missing = sorted(set(archived) - set(names))
    if missing:
        raise DriftError("the server did not ask for every archived graph (another batch-size list?)",
                         field=field, expected=archived[:8], found=missing[:8])  # fmt: skip
    captures = report.get("counters", {}).get("stream_captures", 0)
    if captures:
        raise DriftError("the LOAD captured graphs", field="stream_captures", found=captures)


def write_report(path: Path | None, report: dict[str, Any]) -> None:
    """The session's report as JSON at ``path`` (the engine's report variable), if set."""
    if path is not None:
        with open(path, "w") as handle:
            json.dump(report, handle, indent=1, default=str)


def note_replay(path: Path | None, name: str) -> None:
    """A restored graph's first replay, appended to the report's path + ``.replays``
    (the engine replays after the report is written): the proof that it ran."""
    if path is not None:
        with open(f"{path}.replays", "a") as handle:
            handle.write(name + "\n")
