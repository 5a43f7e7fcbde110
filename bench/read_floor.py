"""The floor the offline commands are measured against: a script that reads every graph
file of an archive and decodes its MessagePack, and does nothing else (no checks, no
types, no hashes, no output).

    python bench/read_floor.py ARCHIVE

``bench/inspect_lint.py`` and ``bench/tui_first_paint.py`` run it, in a fresh
interpreter, in the same run as what they time, and report their figures as ratios to it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import msgspec


def main(argv: list[str] | None = None) -> int:
    root = Path((argv or sys.argv[1:])[0])
    files = sorted(root.glob("rank*/graphs/*.msgpack"))
    for path in files:
        msgspec.msgpack.decode(path.read_bytes())
    print(f"{len(files)} graph files decoded")
    return 0


if __name__ == "__main__":
    sys.exit(main())
