"""Write one rank's allocation trace of an archive as JSON rows ``[order, offset, size, request, phase]``.

    python scripts/region_trace.py ARCHIVE OUT.json [--rank R]

The form of ``tests/fixtures/traces/*.json``: what the CPU tests of a LOAD's placement read.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from foundry.archive.reader import Archive


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("archive", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--rank", type=int, default=0)
    args = parser.parse_args(argv)
    region = Archive.open(args.archive).session(args.rank).region
    if region is None:
        print(f"region_trace.py: {args.archive} rank {args.rank} has no region record", file=sys.stderr)
        return 2
    rows = [[a.order, a.offset, a.size, a.request, a.phase] for a in region.trace]
    record = {"base": region.base, "final_offset": region.final_offset, "warmup_allocations": region.warmup_allocations,
              "warmup_offset": region.warmup_offset, "trace": rows}  # fmt: skip
    args.out.write_text(json.dumps(record) + "\n")
    phases: dict[str, int] = {}
    for row in rows:
        phases[row[4]] = phases.get(row[4], 0) + 1
    print(json.dumps({"allocations": len(rows), "phases": phases, "final_offset": region.final_offset}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
