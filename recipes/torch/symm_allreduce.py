"""A matmul and torch symmetric-memory all-reduces (one-shot and two-shot), SAVEd and LOADed.

    python recipes/torch/symm_allreduce.py --out R.json                      # baseline
    foundry run --mode save --archive A -- python recipes/torch/symm_allreduce.py --out S.json
    foundry run --mode load --archive A --region-base 0x600400000000 -- \\
        python recipes/torch/symm_allreduce.py --out L.json --move-buffer

World size 1 on one GPU (torch symmetric memory works there; NCCL sets up the
group), or ``--rank R --world-size N`` in N processes, one per GPU (``foundry run
--rank R --world-size N`` with a shared ``FOUNDRY_SAVE_ID`` for a SAVE). The
program attaches its rendezvous handle to the session, so SAVE records the
torch-symm-mem state and LOAD validates and relocates against the
live handle. ``--move-buffer`` allocates another symmetric buffer first, so the
LOAD's buffer lives at another address than SAVE's; ``--buffer-rows`` and
``--buffer-dtype`` size and type the symmetric buffer (the drift tests LOAD with
a smaller or differently typed one). The report holds the outputs' sha256 and
the buffer's address.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed._symmetric_memory as symm_mem

sys.path.insert(0, str(Path(__file__).resolve().parent))
from process_group import start_group

from foundry.runtime.sessions.open import open_session

NUMEL = 16 * 256


def digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes()).hexdigest()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--move-buffer", action="store_true", help="put the symmetric buffer at another address")
    parser.add_argument("--buffer-rows", type=int, default=16, help="the symmetric buffer holds ROWS x 256 elements")
    parser.add_argument("--buffer-dtype", choices=["bfloat16", "float32"], default="bfloat16")
    parser.add_argument("--rank", type=int, default=0, help="this process's rank (one process per GPU)")
    parser.add_argument("--world-size", type=int, default=1)
    args = parser.parse_args(argv)
    if not 0 <= args.rank < args.world_size:
        parser.error("--rank must be below --world-size")
    if args.buffer_rows * 256 < NUMEL:
        parser.error(f"--buffer-rows must be at least {NUMEL // 256}")

    session = open_session(device=args.rank, model={"recipe": "symm-allreduce"})
    session.start()
    start_group(args.rank, args.world_size, "29531")
    group = dist.group.WORLD.group_name
    spare = symm_mem.empty(NUMEL * 4, dtype=torch.bfloat16, device="cuda") if args.move_buffer else None
    dtype = getattr(torch, args.buffer_dtype)
    buf = symm_mem.empty(args.buffer_rows * 256, dtype=dtype, device="cuda")
    handle = symm_mem.rendezvous(buf, group)
    session.attach("torch-symm-mem", handle=handle, group=group, dtype=args.buffer_dtype)
    gen = torch.Generator(device="cuda").manual_seed(args.rank)  # each rank its own inputs
    x = torch.randn(16, 256, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16, generator=gen)

    def step():
        buf[:NUMEL].copy_((x @ w).flatten())
        one_shot = torch.ops.symm_mem.one_shot_all_reduce(buf, "sum", group)
        torch.ops.symm_mem.two_shot_all_reduce_(buf, "sum", group)
        return one_shot, buf

    session.warmup(step)
    graph = session.graph("symm.allreduce", step, runner="collective")
    report = {"session": session.finish()}
    buf.zero_()
    graph.replay()
    torch.cuda.synchronize()
    one_shot, out = graph.outputs
    report.update(one_shot_sha256=digest(one_shot), buffer_sha256=digest(out), buffer_address=hex(buf.data_ptr()),
                  spare=spare is not None)  # fmt: skip
    args.out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
