"""Compare the reports of recipes/torch/symm_allreduce.py: baseline first, then SAVE, LOAD, ...

    python recipes/torch/compare_symm.py baseline.json save.json load.json [--moved load.json ...]

Checks, against the first report: the one-shot all-reduce's output and the
two-shot all-reduce's buffer (sha256). Reports named with ``--moved`` must also
have had their symmetric buffer at another address than the second report
(SAVE), so the LOAD was relocated rather than landing where SAVE was. Prints the
relocations each LOAD's session reported. Exit 0 when all hold, 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import msgspec

OUTPUTS = ("one_shot_sha256", "buffer_sha256")


class Relocated(msgspec.Struct, frozen=True):
    operands: int
    moved: int


class SessionPart(msgspec.Struct, frozen=True):
    relocations: dict[str, Relocated] | None = None


class Report(msgspec.Struct, frozen=True):
    """What this comparison reads of a report (other fields are left alone)."""

    one_shot_sha256: str
    buffer_sha256: str
    buffer_address: str
    session: SessionPart = SessionPart()


def read(path: Path) -> Report:
    try:
        return msgspec.json.decode(path.read_bytes(), type=Report)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as err:
        raise SystemExit(f"{path}: not a report of symm_allreduce.py ({err})") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+", type=Path)
    parser.add_argument("--moved", type=Path, action="append", default=[], help="a report whose buffer must have moved")
    args = parser.parse_args(argv)
    missing = [str(p) for p in [*args.reports, *args.moved] if not p.is_file()]
    if missing:
        print(f"missing reports (their runs failed?): {', '.join(missing)}", file=sys.stderr)
        return 2
    reports = {p: read(p) for p in [*args.reports, *args.moved]}
    base, save = reports[args.reports[0]], reports[args.reports[min(1, len(args.reports) - 1)]]
    ok = True
    for path, report in reports.items():
        differs = [k for k in OUTPUTS if getattr(report, k) != getattr(base, k)]
        line = f"{'DIFFERENT' if differs else 'identical'}  {path}"
        if differs:
            line += f" ({', '.join(differs)})"
        if path in args.moved:
            moved = report.buffer_address != save.buffer_address
            line += f"; buffer {save.buffer_address} -> {report.buffer_address}" + ("" if moved else " NOT MOVED")
            ok = ok and moved
        relocations = report.session.relocations
        if relocations:
            line += "\n  relocated: " + ", ".join(f"{region} {t.operands} ({t.moved} moved)"
                                                for region, t in sorted(relocations.items()))  # fmt: skip
        print(line)
        ok = ok and not differs
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
