"""DeepEP low-latency dispatch and combine over two ranks, captured, SAVEd and LOADed.

    python recipes/deepep/ep2.py --rank R --out B.rR.json            # R = 0 and 1, together
    FOUNDRY_SAVE_ID=ep2 foundry run --region-threads any --mode save --rank R --world-size 2 --archive A -- \\
        python recipes/deepep/ep2.py --rank R --out S.rR.json
    foundry run --region-threads any --mode load --rank R --archive A -- \\
        python recipes/deepep/ep2.py --rank R --out L.rR.json
    python recipes/deepep/ep2.py --compare B.r0.json S.r0.json L.r0.json

One graph holds a small MoE layer's communication, as an engine captures it: a
``deep_ep.Buffer`` in low-latency mode built by
``foundry.integrations.deepep.nvl_buffer`` (NVLink between the two GPUs, an NVL
buffer opened over CUDA IPC, fabric handles off), the low-latency dispatch of
16 bf16 tokens of hidden 2048 (top-1 over 8 experts, 4 per rank), the experts
returning their input, and the low-latency combine. Each of the replays after
capture (or restore) routes the tokens anew, and every one is checked by the
payload oracle (``oracle.py``): each row an expert received decodes to a token
routed to it, once, and equals that token's row element by element; the
combined rows equal the tokens sent. DeepEP places received rows by atomics, so
the report digests them per expert in sorted order; the combined output is
digested as it is. ``--compare`` checks that reports agree replay by replay and
that every replay passed the oracle.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "torch"))
from oracle import Mismatch, PayloadCode, check_dispatch, check_rows
from process_group import start_group

TOKENS, HIDDEN, EXPERTS, WORLD = 16, 2048, 8, 2
LOCAL_EXPERTS = EXPERTS // WORLD
REPLAYS = 8
NVL_BYTES = 1 << 26
CODE = PayloadCode(ranks=WORLD, tokens=TOKENS, experts=EXPERTS)


def routing(rank: int, step: int) -> list[int]:
    """The expert of each of ``rank``'s tokens at replay ``step``: every expert, on both
    ranks, gets tokens from both ranks, and the pattern moves with every step."""
    return [(3 * t + 5 * rank + step) % EXPERTS for t in range(TOKENS)]


def token_row(rank: int, token: int, expert: int) -> list[float]:
    """A token's hidden vector: the code of (rank, token, expert), then a pattern of small
    integers (exact in bf16) that depends on all three, so a row copied from the wrong
    token or only in part differs element by element."""
    code = CODE.encode(rank, token, expert)
    return code + [float((7 * rank + 3 * token + expert + j) % 61 + 1) for j in range(HIDDEN - len(code))]


def routed_to(rank: int, step: int) -> set[tuple[int, int, int]]:
    """Every (source rank, token, expert) that step ``step`` routes to ``rank``'s experts."""
    local = range(rank * LOCAL_EXPERTS, (rank + 1) * LOCAL_EXPERTS)
    return {(r, t, e) for r in range(WORLD) for t, e in enumerate(routing(r, step)) if e in local}


def check_received(rank: int, step: int, received: dict[int, list[list[float]]]) -> list[Mismatch]:
    """The oracle on what ``rank``'s experts received, then each row against its token's row."""
    problems = check_dispatch(CODE, received, routed_to(rank, step))
    for expert, rows in sorted(received.items()):
        for r, row in enumerate(rows):
            triplet = CODE.decode(row)
            mismatch = check_rows([token_row(*triplet)], [row]) if triplet else None
            if mismatch is not None:
                problems.append(Mismatch(f"expert {expert} row {r} ({triplet}) {mismatch.where}", mismatch.expected,
                                         mismatch.found))  # fmt: skip
    return problems


def digest(tensor) -> str:
    import torch

    return hashlib.sha256(tensor.contiguous().cpu().view(torch.uint8).numpy().tobytes()).hexdigest()


def sorted_digest(rows: list[list[float]]) -> str:
    return hashlib.sha256(json.dumps(sorted(rows)).encode()).hexdigest()


def import_deep_ep():
    """``deep_ep`` built from source for the installed torch (``build_deep_ep.sh``); the
    published sgl-deep-ep wheels are built for torch 2.13-2.15, and with torch 2.11 their
    extension misread tensors (its dispatch refused a contiguous 2-D bf16 input as not
    one). Its NCCL device-API backend, which only DeepEP's elastic buffers use, was
    compiled against NCCL 2.30 headers while torch 2.11 loads NCCL 2.28: so the
    extension is loaded with lazy binding (two NCCL functions stay unbound until an
    elastic buffer calls them), DeepEP's check that the loaded NCCL is the one it was
    built with is skipped, and ``EP_NCCL_ROOT_DIR`` names torch's NCCL, where DeepEP's
    start-up looks for NCCL (its build recorded the build machine's path). The
    low-latency buffer here uses NVSHMEM, not NCCL. The extension names
    ``libnvshmem_host.so.3``: the one installed with torch (3.4.5) is loaded first."""
    import ctypes

    for entry in sys.path:
        host = Path(entry or ".") / "nvidia" / "nvshmem" / "lib" / "libnvshmem_host.so.3"
        if host.is_file():
            ctypes.CDLL(str(host), mode=ctypes.RTLD_GLOBAL)
            os.environ.setdefault("EP_NCCL_ROOT_DIR", str(host.parent.parent.parent / "nccl"))
            break
    os.environ.setdefault("EP_SUPPRESS_NCCL_CHECK", "1")
    flags = sys.getdlopenflags()
    sys.setdlopenflags(os.RTLD_LAZY)
    try:
        import deep_ep
    finally:
        sys.setdlopenflags(flags)
    return deep_ep


def run(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist

    from foundry.integrations.deepep import buffer_facts, nvl_buffer
    from foundry.runtime.sessions.open import open_session

    session = open_session(device=args.rank, model={"recipe": "deepep-ep2"})
    session.start()
    start_group(args.rank, WORLD, "29561")
    deep_ep = import_deep_ep()
    rdma_bytes = deep_ep.Buffer.get_low_latency_rdma_size_hint(TOKENS, HIDDEN, WORLD, EXPERTS)
    # fabric handles off, attached to the session as deepep-nvl (SAVE records it, LOAD validates it)
    buffer = nvl_buffer(dist.group.WORLD, NVL_BYTES, rdma_bytes, experts_per_rank=LOCAL_EXPERTS, session=session,
                        low_latency_mode=True, num_qps_per_rank=LOCAL_EXPERTS,
                        allow_nvlink_for_low_latency_mode=True, explicitly_destroy=True)  # fmt: skip
    addresses = buffer_facts(buffer, LOCAL_EXPERTS)["buffers"]

    def inputs(step: int) -> tuple[list[list[float]], list[int]]:
        experts = routing(args.rank, step)
        return [token_row(args.rank, t, e) for t, e in enumerate(experts)], experts

    rows, experts = inputs(0)
    x = torch.tensor(rows, dtype=torch.bfloat16, device="cuda")
    topk_idx = torch.tensor([[e] for e in experts], dtype=deep_ep.topk_idx_t, device="cuda")
    weights = torch.ones(TOKENS, 1, dtype=torch.float32, device="cuda")

    def layer():
        recv_x, recv_count, handle, _, _ = buffer.low_latency_dispatch(x, topk_idx, TOKENS, EXPERTS, use_fp8=False)
        combined, _, _ = buffer.low_latency_combine(recv_x, topk_idx, weights, handle)
        return recv_x, recv_count, combined

    session.warmup(layer)
    graph = session.graph("ep.dispatch_combine", layer, shape_key=TOKENS, runner="moe")
    report = {"session": session.finish(), "addresses": {k: hex(v) for k, v in addresses.items()}, "replays": []}
    for step in range(args.replays):
        rows, experts = inputs(step)
        x.copy_(torch.tensor(rows, dtype=torch.bfloat16))
        topk_idx.copy_(torch.tensor([[e] for e in experts], dtype=deep_ep.topk_idx_t))
        dist.barrier()  # both ranks' inputs are in place before either dispatches
        graph.replay()
        torch.cuda.synchronize()
        recv_x, recv_count, combined = graph.outputs
        counts = recv_count.cpu().tolist()
        received = {args.rank * LOCAL_EXPERTS + i: recv_x[i, : counts[i]].float().cpu().tolist()
                    for i in range(LOCAL_EXPERTS)}  # fmt: skip
        problems = check_received(args.rank, step, received)
        combined_rows = combined.float().cpu().tolist()
        mismatch = check_rows(rows, combined_rows)
        if mismatch is not None:
            problems.append(Mismatch(f"combined {mismatch.where}", mismatch.expected, mismatch.found))
        report["replays"].append({
            "recv_count": counts,
            "received_sha256": {str(e): sorted_digest(r) for e, r in received.items()},
            "combined_sha256": digest(combined),
            "problems": [f"{p.where}: expected {p.expected}, found {p.found}" for p in problems[:8]],
        })  # fmt: skip
    report["oracle_ok"] = all(not r["problems"] for r in report["replays"])
    args.out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    print(json.dumps({"rank": args.rank, "replays": len(report["replays"]), "oracle_ok": report["oracle_ok"]}))
    sys.stdout.flush()
    # no teardown: destroying NCCL's communicator with captured graphs alive hung on the H200 test
    # machine, and DeepEP's buffer and NVSHMEM go with the process
    os._exit(0 if report["oracle_ok"] else 1)


class Replay(msgspec.Struct):
    """What ``--compare`` reads of one replay in a report."""

    recv_count: list[int]
    received_sha256: dict[str, str]
    combined_sha256: str
    problems: list[str]


class Report(msgspec.Struct):
    replays: list[Replay]


def compare(paths: list[Path]) -> int:
    """0 when every report passed the oracle on every replay and all agree with the first."""
    reports = []
    for path in paths:
        try:
            reports.append((path, msgspec.json.decode(path.read_bytes(), type=Report).replays))
        except (OSError, msgspec.DecodeError, msgspec.ValidationError) as err:
            print(f"{path}: not a report of this recipe ({err})")
            return 2
    first_path, first = reports[0]
    failed = False
    for path, replays in reports:
        bad = [(i, r.problems) for i, r in enumerate(replays) if r.problems]
        same = [(a.recv_count, a.received_sha256, a.combined_sha256) == (b.recv_count, b.received_sha256,
                b.combined_sha256) for a, b in zip(first, replays, strict=False)]  # fmt: skip
        differs: list[object] = [i for i, ok in enumerate(same) if not ok]
        if len(replays) != len(first):
            differs.append(f"{len(replays)} replays, {first_path.name} has {len(first)}")
        verdict = "identical" if not differs and not bad else "DIFFERENT"
        failed |= verdict != "identical"
        notes = (f"; differs at replay {differs}" if differs else "") + (f"; {bad[0][1][:2]}" if bad else "")
        print(f"{verdict:9}  {path}: {len(replays)} replays, oracle {'passed' if not bad else 'FAILED'}{notes}")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, choices=range(WORLD), default=0)
    parser.add_argument("--out", type=Path, help="where to write the JSON report")
    parser.add_argument("--replays", type=int, default=REPLAYS, help="replays after capture or restore")
    parser.add_argument("--compare", type=Path, nargs="+", metavar="REPORT", help="compare reports instead")
    args = parser.parse_args(argv)
    if args.compare:
        return compare(args.compare)
    if args.out is None:
        parser.error("--out is required to run")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
