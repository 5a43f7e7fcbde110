"""Child program of the SAVE/LOAD GPU test (run under LD_PRELOAD, not collected by pytest).

    saveload_probe.py save DIR   capture a small torch program, write DIR/archive and DIR/expected.bin
    saveload_probe.py load DIR   a fresh process: same inputs, no capture; restore, replay, print the output

Both print one JSON line: what they produced and what the hook counted.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path


def inputs():
    import torch

    torch.manual_seed(0)
    x = torch.randn(64, 512, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(512, 512, device="cuda", dtype=torch.bfloat16)
    return x, w


def save(out: Path) -> dict:
    import torch

    from foundry.archive import ArchiveWriter
    from foundry.archive.schema import RegionRecord
    from foundry.graphir.lower import AddressResolver, lower
    from foundry.graphir.regions import Region, RegionKind
    from foundry.runtime.code.images import HookImages
    from foundry.runtime.graphs.capture import capture, describe_outputs
    from foundry.runtime.native.hook import Hook
    from foundry.runtime.sessions.environment import current_environment

    x, w = inputs()
    graph, result = capture(lambda: torch.relu(x @ w).float().sum(-1) * 0.5 + 1)
    hook = Hook.attach()
    info = hook.region()
    resolver = AddressResolver([Region("vmm", RegionKind.VMM, info.base, info.size)])
    images = HookImages(hook)
    ir = lower(graph, "step", resolver=resolver, images=images)
    writer = ArchiveWriter(out / "archive", environment=current_environment(), model={"model": "relu-mm-sum"})
    for image in images.used.values():
        writer.add_module(hook.image_bytes(image), format=image.format)
    rank = writer.rank(0)
    rank.add_graph(ir, outputs=describe_outputs(result, resolver))
    trace = json.dumps([[a.order, a.offset, a.size, a.request] for a in hook.trace()]).encode()
    rank.set_region(
        RegionRecord(info.base, info.size, info.cursor, info.allocations, hashlib.sha256(trace).hexdigest())
    )
    rank.seal()
    writer.commit()
    graph.replay()
    torch.cuda.synchronize()
    expected = result.cpu().numpy().tobytes()
    (out / "expected.bin").write_bytes(expected)
    return {"output_sha256": hashlib.sha256(expected).hexdigest(), "nodes": len(ir), "images": len(images.used),
            "counters": hook.counters(), "region": vars(info)}  # fmt: skip


def load(out: Path) -> dict:
    import ctypes

    import torch

    from foundry.archive import Archive
    from foundry.errors import HookError
    from foundry.graphir.build import build
    from foundry.graphir.cuda import cu
    from foundry.runtime.code.binding import ArchiveFunctions
    from foundry.runtime.native.hook import Hook

    inputs()  # the same allocations, in the same order, as SAVE made before capturing
    hook = Hook.attach()
    archive = Archive.open(out / "archive")
    record = archive.session(0).region
    info = hook.region()
    if info.base != record.base:
        raise HookError("region base differs from SAVE's", expected=hex(record.base), found=hex(info.base))
    hook.map_to(record.final_offset)
    functions = ArchiveFunctions(hook, archive)
    entry = archive.entries(0)[0]
    built = build(archive.graph(0, entry), functions)
    built.launch(torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    spec = entry.outputs
    size = 4 * int(torch.tensor(spec.shape).prod())
    buf = ctypes.create_string_buffer(size)
    cu("cuMemcpyDtoH", ctypes.addressof(buf), record.base + spec.region_offset + 4 * spec.storage_offset, size)
    return {"output_sha256": hashlib.sha256(buf.raw).hexdigest(), "counters": hook.counters(),
            "bound_live": len(functions.bound_live), "loaded": len(functions.loaded),
            "reserve": [vars(a) for a in hook.trace() if a.reserve]}  # fmt: skip


def main(mode: str, out: str) -> int:
    report = (save if mode == "save" else load)(Path(out))
    print(json.dumps(report, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
