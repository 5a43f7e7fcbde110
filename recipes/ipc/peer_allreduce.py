"""Two processes on one GPU add each other's buffers through deterministic peer memory.

    FOUNDRY_SAVE_ID=s1 foundry run --mode save --rank R --world-size 2 --save-runs 1 --archive A -- \\
        python recipes/ipc/peer_allreduce.py --rank R --exchange DIR --out R.json      # both ranks at once
    foundry run --mode load --rank R --archive A -- \\
        python recipes/ipc/peer_allreduce.py --rank R --exchange DIR2 --out R.json

Each rank fills a buffer in its region, shares it with ``cuIpcGetMemHandle`` (a
Foundry handle, through the hook), opens the peer's with ``cuIpcOpenMemHandle``
(mapped in the import zone at the same address in every run) and captures
``out = mine + peer`` through the session, the ``nccl-ipc`` backend naming the
peer's memory. The handles travel through files in ``--exchange`` (a fresh
directory per run), with the buffer's offset inside its allocation (the open
returns the allocation's start); both ranks wait for each other before they exit, so the
exporter's memory outlives the importer's replays. The report holds the output's
sha256, whether it equals the expected sum, and the peer's address.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

N = 1 << 20
WAIT_S = 120


def wait_for(path: Path) -> None:
    deadline = time.time() + WAIT_S
    while not path.exists():
        if time.time() > deadline:
            raise SystemExit(f"the peer did not write {path.name} within {WAIT_S} s")
        time.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, choices=[0, 1], required=True)
    parser.add_argument("--exchange", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    from foundry.backends.nccl_ipc import PINNED_ENV  # the NCCL settings the nccl-ipc backend checks

    os.environ.update(PINNED_ENV)

    import torch
    from cuda.bindings import driver

    from foundry.archive.files import atomic_write
    from foundry.runtime.graphs.tensors import tensor_at
    from foundry.runtime.native.hook import Hook
    from foundry.runtime.sessions.open import open_session

    rank, peer_rank = args.rank, 1 - args.rank
    args.exchange.mkdir(parents=True, exist_ok=True)
    session = open_session(model={"recipe": "peer-allreduce"})
    session.start()
    mine = torch.arange(N, dtype=torch.float32, device="cuda") * (rank + 1)
    out = torch.empty_like(mine)
    torch.cuda.synchronize()
    err, handle = driver.cuIpcGetMemHandle(mine.data_ptr())
    err2, start, _ = driver.cuMemGetAddressRange(mine.data_ptr())
    if int(err) or int(err2):
        raise SystemExit(f"cuIpcGetMemHandle failed: {err} / {err2}")
    inside = mine.data_ptr() - int(start)  # the caching allocator's block within the allocation
    atomic_write(args.exchange / f"handle{rank}.bin", bytes(handle.reserved) + inside.to_bytes(8, "little"))
    wait_for(args.exchange / f"handle{peer_rank}.bin")
    blob = (args.exchange / f"handle{peer_rank}.bin").read_bytes()
    raw = driver.CUipcMemHandle()
    raw.reserved = blob[:64]
    err, peer_start = driver.cuIpcOpenMemHandle(raw, driver.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
    if int(err):
        raise SystemExit(f"cuIpcOpenMemHandle failed: {err}")
    peer_ptr = int(peer_start) + int.from_bytes(blob[64:72], "little")
    peer = tensor_at(peer_ptr, torch.float32, (N,))
    hook = Hook.attach()
    session.attach("nccl-ipc", world_size=2, rank=rank, nccl_version="none", region_base=hook.region().base,
                   import_zone=hook.import_zone(), peers=[peer_rank])  # fmt: skip

    def step() -> torch.Tensor:
        torch.add(mine, peer, out=out)
        return out

    session.warmup(step)
    graph = session.graph("peer.allreduce", step)
    report = {"session": session.finish()}
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    expected = torch.arange(N, dtype=torch.float32, device="cuda") * (rank + 1 + peer_rank + 1)
    data = out.detach().cpu().numpy().tobytes()
    report.update(out_sha256=hashlib.sha256(data).hexdigest(), correct=bool(torch.equal(out, expected)),
                  peer_address=hex(peer_ptr), counters=hook.counters())  # fmt: skip
    args.out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    atomic_write(args.exchange / f"done{rank}", b"")
    wait_for(args.exchange / f"done{peer_rank}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
