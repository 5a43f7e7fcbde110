"""Compare recorded SGLang runs: identical output ids and logprobs, prompts told apart.

    python recipes/sglang/compare.py REFERENCE.json OTHER.json [...]

Exit 0 when every run equals the reference (and the reference's 16 outputs are
pairwise different, so the comparison can tell prompts apart), 1 otherwise.
Under speculative decoding the counts SGLang reported per prompt (verify steps,
drafts proposed and accepted) must be equal too, and each run's accept rate is
printed; ``--min-accept-rate 0.5`` also fails a run that accepted fewer drafts.
Where the runs recorded SGLang's start-up timings, a table follows: the
scheduler's end-to-end start, the CUDA graph time per phase, how many times
less graph time each run spent than the reference, and the whole run's seconds
(start, the 16 prompts, shut-down), with the seconds until the server took requests
and the first batch's seconds where recorded: JIT compiling moved out of start-up
into the first eager prefill shows there.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path


def differences(reference: dict, other: dict) -> list[str]:
    """Every prompt whose output ids or logprobs differ, naming the first differing step;
    the wave and the prefill walk too where either run sent them; and every
    prompt whose speculative counts differ."""
    found = _list_differences(reference["outputs"], other["outputs"], "prompt")
    for key, label in (("wave", "wave prompt"), ("prefill_walk", "prefill walk prompt")):
        if reference.get(key) is not None or other.get(key) is not None:
            found += _list_differences(reference.get(key) or [], other.get(key) or [], label)
    return found + _spec_differences(reference["outputs"], other["outputs"])


def _spec_differences(reference: list[dict], other: list[dict]) -> list[str]:
    found = []
    for i, (a, b) in enumerate(zip(reference, other, strict=False)):
        spec_a, spec_b = a.get("spec") or {}, b.get("spec") or {}
        keys = [k for k in sorted(set(spec_a) | set(spec_b)) if spec_a.get(k) != spec_b.get(k)]
        if keys:
            said = ", ".join(f"{k} {spec_a.get(k)} vs {spec_b.get(k)}" for k in keys)
            found.append(f"prompt {i}: speculative counts differ ({said})")
    return found


def acceptance(run: dict) -> tuple[int, int, int] | None:
    """A run's speculative totals over its prompts: verify steps, drafts accepted, drafts
    proposed; None where it recorded none."""
    specs = [o["spec"] for o in run["outputs"] if isinstance(o.get("spec"), dict)]
    if not specs:
        return None
    total = [sum(int(s.get(k) or 0) for s in specs) for k in ("spec_verify_ct", "spec_num_correct_drafts",
                                                                "spec_num_proposed_drafts")]  # fmt: skip
    return total[0], total[1], total[2]


def acceptance_lines(paths: list[str], runs: list[dict]) -> list[str]:
    """One line per run that decoded speculatively: its verify steps and accept rate."""
    lines = []
    for path, run in zip(paths, runs, strict=True):
        totals = acceptance(run)
        if totals is not None:
            steps, accepted, proposed = totals
            rate = f"{accepted / proposed:.3f}" if proposed else "-"
            lines.append(f"speculative: {steps} verify steps, {accepted} of {proposed} drafts accepted "
                         f"(rate {rate})  {path}")  # fmt: skip
    return lines


def _list_differences(reference: list[dict], other: list[dict], label: str) -> list[str]:
    if len(reference) != len(other):
        return [f"{len(other)} {label} outputs, not {len(reference)}"]
    found = []
    for i, (a, b) in enumerate(zip(reference, other, strict=True)):
        if a["output_ids"] != b["output_ids"]:
            pairs = enumerate(zip(a["output_ids"], b["output_ids"], strict=False))
            step = next((k for k, (x, y) in pairs if x != y), min(len(a["output_ids"]), len(b["output_ids"])))
            found.append(f"{label} {i}: output ids differ from step {step}")
        elif a["logprobs"] != b["logprobs"]:
            lps = enumerate(zip(a["logprobs"], b["logprobs"], strict=False))
            step = next((k for k, (x, y) in lps if x != y), min(len(a["logprobs"]), len(b["logprobs"])))
            found.append(f"{label} {i}: logprobs differ from step {step}")
    return found


def startup_table(paths: list[str], runs: list[dict]) -> list[str]:
    """One line per run that recorded SGLang's start-up timings (see module docstring)."""
    timed = [(p, r) for p, r in zip(paths, runs, strict=True) if r.get("startup")]
    if not timed:
        return []
    reference = sum(timed[0][1]["startup"]["cuda_graph"].values())
    lines = ["start-up (s): scheduler_e2e, cuda graphs by phase, graph time vs the first; the whole run"]
    for path, run in timed:
        startup = run["startup"]
        graphs = sum(startup["cuda_graph"].values())
        phases = ", ".join(f"{phase} {seconds:.2f}" for phase, seconds in sorted(startup["cuda_graph"].items())
                           if seconds)  # fmt: skip
        ratio = f"{reference / graphs:.1f}x less" if graphs else "none spent"
        whole = f"; run {run['wall_s']:.1f}" if isinstance(run.get("wall_s"), (int, float)) else ""
        if isinstance(run.get("ready_s"), (int, float)) and run.get("batch_s"):
            whole += f", ready {run['ready_s']:.1f}, first batch {run['batch_s'][0]:.1f}"
        lines.append(f"  {startup['scheduler_e2e']:7.2f}  graphs {graphs:6.2f} ({phases or '-'}); {ratio}{whole}  "
                     f"{path}")  # fmt: skip
        split = (run.get("foundry") or {}).get("sglang_seconds")
        if split:  # under the plugin: SGLang's eager warm-ups apart from capturing or restoring
            loops = split.get("capture_loop_s")  # both of the above happen inside the loops
            loops = "" if loops is None else f"; capture loops {loops:.2f}, the phase outside them {graphs - loops:.2f}"
            lines.append(f"           of which SGLang's warm-up forwards {split.get('warmup_forwards_s', 0):.2f}, "
                         f"Foundry's graphs {split.get('graphs_s', 0):.2f}{loops}")  # fmt: skip
    return lines


def replay_lines(paths: list[str], runs: list[dict], graphs: str = "sglang_graphs") -> list[str]:
    """For each LOAD: how many restored graphs the engine replayed, and which it never did
    (``graphs``: the plugin report's list of the graphs it restored)."""
    lines = []
    for path, run in zip(paths, runs, strict=True):
        report = run.get("foundry") or {}
        if report.get("mode") != "load" or "replayed" not in report:
            continue
        restored, replayed = report.get(graphs, []), set(report["replayed"])
        idle = [name for name in restored if name not in replayed]
        lines.append(f"replayed {len(replayed)} of {len(restored)} restored graphs"
                     f"{'; never: ' + ', '.join(idle[:8]) if idle else ''}  {path}")  # fmt: skip
    return lines


def main(argv: list[str]) -> int:
    """Compare recorded SGLang runs (see the module docstring)."""
    usage = __doc__.strip().splitlines()[2]
    args, min_rate = list(argv), None
    if "--min-accept-rate" in args:
        at = args.index("--min-accept-rate")
        try:
            min_rate = float(args[at + 1])
        except (IndexError, ValueError):
            print("compare.py: --min-accept-rate takes a number between 0 and 1", file=sys.stderr)
            return 2
        if not 0 <= min_rate <= 1:
            print("compare.py: --min-accept-rate takes a number between 0 and 1", file=sys.stderr)
            return 2
        del args[at : at + 2]
    return compare(args, (startup_table, replay_lines, acceptance_lines), "recipes/sglang/run.py", usage,
                   min_accept_rate=min_rate)  # fmt: skip


def compare(argv: list[str], tables: tuple[Callable[[list[str], list[dict]], list[str]], ...], recipe: str,
            usage: str, *, min_accept_rate: float | None = None) -> int:  # fmt: skip
    """The runs ``argv`` names compared with the first (an engine's ``main``): the verdict
    per run, then each of ``tables``' lines; 0 when all are identical and the reference's
    prompts pairwise different (and, with ``min_accept_rate``, every run accepted at least
    that share of its drafts), 1 otherwise, 2 when a report cannot be read."""
    if len(argv) < 2:
        print(usage.strip(), file=sys.stderr)
        return 2
    try:
        runs = [json.loads(Path(p).read_text()) for p in argv]
    except (OSError, ValueError) as err:
        print(f"compare.py: cannot read a report: {err}", file=sys.stderr)
        return 2
    for path, run in zip(argv, runs, strict=True):
        if not isinstance(run, dict) or not isinstance(run.get("outputs"), list):
            print(f"compare.py: {path} is not a report of {recipe} (no outputs)", file=sys.stderr)
            return 2
    reference = runs[0]
    ids = [tuple(o["output_ids"]) for o in reference["outputs"]]
    distinct = len(set(ids)) == len(ids)
    print(f"{len(ids)} prompts x {len(ids[0]) if ids else 0} tokens; pairwise different: {distinct}")
    ok = distinct
    for path, run in zip(argv[1:], runs[1:], strict=True):
        found = differences(reference, run)
        ok &= not found
        print(f"{'identical' if not found else 'DIFFERENT'}  {path}")
        for line in found[:8]:
            print(f"  - {line}")
    for table in tables:
        for line in table(argv, runs):
            print(line)
    if min_accept_rate is not None:
        ok &= _accept_rates_hold(argv, runs, min_accept_rate)
    return 0 if ok else 1


def _accept_rates_hold(paths: list[str], runs: list[dict], minimum: float) -> bool:
    held = True
    for path, run in zip(paths, runs, strict=True):
        totals = acceptance(run)
        rate = totals[1] / totals[2] if totals and totals[2] else None
        if rate is None or rate < minimum:
            held = False
            print(f"accept rate {'not recorded' if rate is None else f'{rate:.3f}'}, below {minimum}  {path}")
    return held


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
