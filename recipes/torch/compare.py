"""Compare the reports of recipes/torch/run.py: baseline first, then SAVE, SAVE2, LOAD, ...

    python recipes/torch/compare.py baseline.json save.json save2.json load.json [--json]

Checks, against the first report: greedy token ids for every batch size and
prompt set, the final logits' sha256, the seeded sampling draws and the eager
``torch.rand`` after them. Also checks that the two prompt sets decode to
different tokens (the comparison can tell outputs apart). Exit 0 when all
match, 1 with the first differences listed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def differences(base: dict, other: dict) -> list[str]:
    found = []
    if base["decode"].keys() != other["decode"].keys():
        return [f"different runs: {sorted(base['decode'])[:3]} vs {sorted(other['decode'])[:3]}"]
    for key, want in base["decode"].items():
        have = other["decode"][key]
        if have["tokens"] != want["tokens"]:
            step = next(i for i, (a, b) in enumerate(zip(want["tokens"], have["tokens"], strict=True)) if a != b)
            found.append(f"{key}: token ids differ from step {step}")
        if have["final_logits_sha256"] != want["final_logits_sha256"]:
            found.append(f"{key}: final logits differ")
    if other["sampling"]["draws"] != base["sampling"]["draws"]:
        found.append("seeded sampling draws differ")
    if other["sampling"]["eager_rand_sha256"] != base["sampling"]["eager_rand_sha256"]:
        found.append("eager torch.rand after sampling differs")
    return found


def prompts_distinguishable(report: dict) -> list[str]:
    """Keys whose two prompt sets gave identical tokens (the check would be blind there)."""
    by_batch: dict[str, list] = {}
    for key, value in report["decode"].items():
        by_batch.setdefault(key.split(".")[0], []).append(value["tokens"])
    return [bs for bs, runs in by_batch.items() if len(runs) > 1 and all(r == runs[0] for r in runs)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+", type=Path)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    missing = [str(p) for p in args.reports if not p.is_file()]
    if missing:
        print(f"missing reports (their runs failed?): {', '.join(missing)}", file=sys.stderr)
    paths = [p for p in args.reports if p.is_file()]
    if not paths or paths[0] != args.reports[0]:
        return 2
    reports = [json.loads(p.read_text()) for p in paths]
    base = reports[0]
    result = {"baseline": str(args.reports[0]), "compared": {}, "blind": prompts_distinguishable(base)}
    for path, report in zip(paths[1:], reports[1:], strict=True):
        result["compared"][str(path)] = differences(base, report)
    ok = not missing and not result["blind"] and not any(result["compared"].values())
    steps = len(next(iter(base["decode"].values()))["tokens"])
    if args.json:
        print(json.dumps({"ok": ok, **result}, indent=1))
    else:
        print(f"{len(base['decode'])} decode runs x {steps} steps; sampling {len(base['sampling']['draws'])} replays")
        for path, diffs in result["compared"].items():
            print(f"{'identical' if not diffs else 'DIFFERENT'}  {path}" + "".join(f"\n  - {d}" for d in diffs[:10]))
        if result["blind"]:
            print(f"prompt sets indistinguishable at {result['blind']}: the comparison cannot tell outputs apart")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
