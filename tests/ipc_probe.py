"""Child program of the IPC GPU tests (run with the hook preloaded, not collected).

    ipc_probe.py export DIR      # rank 0: a tensor in its region, its handle written to DIR
    ipc_probe.py import DIR      # rank 1: open rank 0's handle twice, read it, close twice
    ipc_probe.py take-zone DIR   # rank 1, with the import zone's address reserved first

Two processes on one GPU, each with its own deterministic region. The exporter
writes ``handle.bin`` (the 64 bytes cuIpcGetMemHandle returned) and
``export.json`` (the tensor's address and checksum), then waits for ``done``.
The importer prints one JSON line: the addresses it got, what it read, and the
hook's counters and events.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

N = 1 << 20


def main() -> int:
    role, work = sys.argv[1], Path(sys.argv[2])
    import torch
    from cuda.bindings import driver

    from foundry.runtime.graphs.tensors import tensor_at
    from foundry.runtime.native.hook import Hook

    torch.cuda.init()
    hook = Hook.attach()
    if role == "export":
        x = torch.arange(N, dtype=torch.float32, device="cuda")
        torch.cuda.synchronize()
        err, handle = driver.cuIpcGetMemHandle(x.data_ptr())
        again_err, again = driver.cuIpcGetMemHandle(x.data_ptr())
        (work / "handle.bin").write_bytes(bytes(handle.reserved))
        same = int(again_err) == 0 and bytes(again.reserved) == bytes(handle.reserved)
        _, start, _ = driver.cuMemGetAddressRange(x.data_ptr())
        report = json.dumps({"status": int(err), "same_handle_again": same, "address": x.data_ptr(),
                             "allocation": int(start), "sum": float(x.sum().item()),
                             "region": hook.region().base})  # fmt: skip
        (work / "export.tmp").write_text(report)
        (work / "export.tmp").replace(work / "export.json")  # whole, or not there
        deadline = time.time() + 120
        while not (work / "done").exists() and time.time() < deadline:
            time.sleep(0.1)
        return 0

    if role == "take-zone":
        torch.cuda.synchronize()
        driver.cuMemAddressReserve(1 << 30, 1 << 30, 0x700000000000, 0)
    torch.empty(16, device="cuda")  # this process's region exists before it imports
    raw = driver.CUipcMemHandle()
    raw.reserved = (work / "handle.bin").read_bytes()
    result: dict = {}
    err, first = driver.cuIpcOpenMemHandle(raw, driver.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
    result["open_status"] = int(err)
    if int(err) == 0:
        err2, second = driver.cuIpcOpenMemHandle(raw, driver.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
        result.update(first=int(first), second=int(second), second_status=int(err2))
        peer = tensor_at(int(first), torch.float32, (N,))
        result["sum"] = float(peer.sum().item())
        result["close1"] = int(driver.cuIpcCloseMemHandle(first)[0])
        result["sum_after_one_close"] = float(tensor_at(int(first), torch.float32, (N,)).sum().item())
        result["close2"] = int(driver.cuIpcCloseMemHandle(first)[0])
        result["close3"] = int(driver.cuIpcCloseMemHandle(first)[0])  # nothing left to close
    result.update(counters=hook.counters(), events=hook.events()[-6:])
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
