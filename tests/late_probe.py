"""Child program of the GPU tests of allocations between captures (run under `foundry run`, not collected).

    late_probe.py [--bytes-until capture|finish] [--grow BS] [--own-tables]

Warms each shape up right before capturing it, largest first, as SGLang does, and
each warm-up creates a table of its own the first time (as attention backends
create per-shape metadata lazily): those tables are allocated after the first
capture began (between captures), and the graphs read them. ``--grow BS`` makes
the table of shape BS one granule larger, so a LOAD's warm-up departs from SAVE's
trace. ``--own-tables``: the program creates each table itself right before the
shape's warm-up (as SGLang's capture loop creates an attention backend's buffers),
so they are its own allocations between captures, which a LOAD that skips the
warm-ups makes again. ``--bytes-until`` says when a SAVE takes the warm-up's bytes. Prints one
JSON line: every graph's output digest after a replay, the session report and the
hook's trace phases; a Foundry error is printed as ``{"error": ...}`` with exit
code 3.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys

SIZES = (64, 32, 16, 8)
WIDTH = 1024
TABLE = 12 << 20  # bytes per table beyond the shape's rows: over 10 MiB, so torch maps a segment for each


def open_session(bytes_until: str):
    from foundry.runtime.sessions.open import open_session as from_environment
    from foundry.runtime.sessions.save import SaveSession

    if os.environ.get("FOUNDRY_MODE") == "save":
        return SaveSession(os.environ["FOUNDRY_ARCHIVE"], warmup_bytes_until=bytes_until,
                           overwrite=os.environ.get("FOUNDRY_OVERWRITE") == "1")  # fmt: skip
    return from_environment()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bytes-until", choices=["capture", "finish"], default="capture")
    parser.add_argument("--grow", type=int, default=None)
    parser.add_argument("--own-tables", action="store_true")
    args = parser.parse_args()

    import torch

    from foundry.errors import FoundryError

    try:
        session = open_session(args.bytes_until)
        session.start()
        torch.manual_seed(0)
        weight = torch.randn(WIDTH, WIDTH, device="cuda")
        x = torch.randn(max(SIZES), WIDTH, device="cuda")
        tables: dict[int, torch.Tensor] = {}

        def step(bs: int) -> torch.Tensor:
            return ((x[:bs] @ weight) * tables[bs][:bs]).relu().sum(dim=1)

        def make_table(bs: int) -> None:
            if bs not in tables:  # the shape's own table, made on its first use
                rows = (TABLE + (2 << 20 if bs == args.grow else 0)) // (4 * WIDTH) + bs
                tables[bs] = torch.linspace(0.5, 1.5, rows * WIDTH, device="cuda").view(rows, WIDTH) * bs

        def warm(bs: int) -> None:
            make_table(bs)
            step(bs)

        graphs = {}
        for bs in SIZES:
            if args.own_tables:
                make_table(bs)
            session.warmup(lambda bs=bs: warm(bs))
            graphs[bs] = session.graph(f"late.bs{bs}", lambda bs=bs: step(bs), shape_key=bs, runner="late")
        report = session.finish()
        digests = {}
        for bs, graph in graphs.items():
            graph.replay()
            torch.cuda.synchronize()
            digests[str(bs)] = hashlib.sha256(graph.outputs.cpu().numpy().tobytes()).hexdigest()
        phases = {}
        if getattr(session, "hook", None) is not None:
            for a in session.hook.trace():
                phases[a.phase] = phases.get(a.phase, 0) + 1
        print(json.dumps({"outputs": digests, "report": report, "phases": phases}, default=str))
        return 0
    except FoundryError as err:
        print(json.dumps({"error": str(err), "field": err.field}))
        return 3


if __name__ == "__main__":
    sys.exit(main())
