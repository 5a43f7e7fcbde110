"""DeepEP's communication buffer built for Foundry: NVL buffers over CUDA IPC, no fabric.

DeepEP's runtime allocates its NVL buffer with ``cudaMalloc`` (so inside the
deterministic region) and shares it with ``cudaIpcGetMemHandle`` /
``cudaIpcOpenMemHandle``, which the hook turns into Foundry handles mapped at the
same peer addresses in SAVE and LOAD (``native/src/ipc_driver.c``). Fabric
handles (multi-node NVLink, ``allow_mnnvl`` / ``use_fabric``) name memory the
hook cannot place, so :func:`nvl_buffer` turns them off and refuses a DeepEP
whose ``Buffer`` cannot be told to.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from foundry.errors import FoundryError

# the Buffer parameters that choose fabric handles, in the DeepEP versions that have them
FABRIC_PARAMETERS = ("allow_mnnvl", "use_fabric")


def check_buffer_parameters(parameters: Iterable[str]) -> None:
    """Refuse a ``deep_ep.Buffer`` that offers no way to turn fabric handles off."""
    if not set(FABRIC_PARAMETERS) & set(parameters):
        raise FoundryError("this DeepEP's Buffer cannot be told to avoid fabric handles (no allow_mnnvl or "
                           "use_fabric parameter); Foundry needs its NVL buffers over CUDA IPC",
                           field="deep_ep.Buffer", expected=list(FABRIC_PARAMETERS))  # fmt: skip


def nvl_buffer(group: Any, num_nvl_bytes: int, num_rdma_bytes: int = 0, *, experts_per_rank: int,
               session: Any = None, **kwargs: Any) -> Any:  # fmt: skip
    """``deep_ep.Buffer(group, num_nvl_bytes, num_rdma_bytes, **kwargs)`` with fabric
    handles off; attached to ``session`` as ``deepep-nvl`` when one is given."""
    import inspect

    for name in FABRIC_PARAMETERS:
        if kwargs.get(name):
            raise FoundryError(f"{name}=True would share DeepEP's buffers through fabric handles, which a LOAD "
                               "cannot restore", field=f"deep_ep.{name}")  # fmt: skip
    try:
        import deep_ep
    except ImportError as err:
        raise FoundryError(f"DeepEP cannot be imported: {err}", field="deep_ep") from None
    parameters = inspect.signature(deep_ep.Buffer.__init__).parameters
    check_buffer_parameters(parameters)
    off = {name: False for name in FABRIC_PARAMETERS if name in parameters}
    buffer = deep_ep.Buffer(group, num_nvl_bytes, num_rdma_bytes, **{**kwargs, **off})
    if session is not None:
        session.attach("deepep-nvl", **buffer_facts(buffer, experts_per_rank))
    return buffer


def buffer_facts(buffer: Any, experts_per_rank: int) -> dict[str, Any]:
    """What the ``deepep-nvl`` backend records of a built buffer."""
    import torch

    buffers = {"deepep.nvl": buffer.get_local_buffer_tensor(torch.uint8).data_ptr()}
    if buffer.num_rdma_bytes:
        buffers["deepep.rdma"] = buffer.get_local_buffer_tensor(torch.uint8, use_rdma_buffer=True).data_ptr()
    return {
        "num_nvl_bytes": buffer.num_nvl_bytes,
        "num_rdma_bytes": buffer.num_rdma_bytes,
        "use_fabric": False,
        "rank": buffer.rank,
        "world_size": buffer.group_size,
        "experts_per_rank": experts_per_rank,
        "buffers": buffers,
    }
