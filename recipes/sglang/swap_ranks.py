"""Negative control for a multi-rank archive: give each rank the other's part.

Swaps the session files the catalog names for ranks 0 and 1 (their hashes with them)
and re-seals it, as a SAVE that wrote them crossed would have. Every hash still
matches, so a LOAD must refuse because a session belongs to another rank (field
``rank``), not because the archive looks damaged.

    python3 recipes/sglang/swap_ranks.py ARCHIVE
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from foundry.archive.schema import CATALOG_FILE
from tests.archive_tools import reseal


def swap(root: Path) -> None:
    catalog = json.loads((root / CATALOG_FILE).read_text())
    ranks = catalog["ranks"]
    if len(ranks) != 2:
        raise SystemExit(f"swap_ranks: {root} holds {len(ranks)} ranks, not 2")
    first, second = ranks
    first["session"], second["session"] = second["session"], first["session"]
    (root / CATALOG_FILE).write_text(json.dumps(catalog, indent=1))
    reseal(root, graphs=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("archive", type=Path)
    swap(parser.parse_args().archive)
    return 0


if __name__ == "__main__":
    sys.exit(main())
