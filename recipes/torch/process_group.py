"""One process per GPU on this host, in a NCCL process group: the recipes' shared set-up."""

from __future__ import annotations

import os


def start_group(rank: int, world_size: int, port: str) -> None:
    """This process on GPU ``rank``, in a NCCL process group of ``world_size`` on this host."""
    import torch
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", port)
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world_size, device_id=torch.device("cuda", rank))
