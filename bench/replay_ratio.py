"""Replay time of a captured graph vs the same graph rebuilt from its IR, in one process.

    python bench/replay_ratio.py [--config qwen3-0.6b] [--batches 1,8,64,256] [--out FILE]

bench/cold_start.py compares replays across processes: a plain capture against
a LOAD. This bench removes the process from the comparison. It captures the
recipe's decode graphs (no hook), lowers each, and times in the same process
and on the same memory, interleaved:

- ``torch``: the captured ``torch.cuda.CUDAGraph``;
- ``reinstantiated``: torch's own graph instantiated again with no flags (torch gives its
  graphs auto-free on launch, as the driver reports): what the flags alone change;
- ``rebuilt``: the graph built from its IR (:func:`foundry.graphir.build.build`) and
  instantiated with torch's flags, as a LOAD does;
- ``packed``: rebuilt with every device allocation its operands point into copied, side by
  side, into one fresh ``cuMemAlloc``: the layout a LOAD gets when it maps everything
  SAVE allocated after its own cursor as one piece;
- ``reloaded``: the same, with every kernel from a fresh load of its module image, as a
  LOAD binds kernels it finds no live copy of (only with the hook preloaded:
  ``LD_PRELOAD`` set to
  :func:`foundry.runtime.native.hook.library_path`, which records the images).

Each is timed twice, as CUDA events around one launch:

- on an idle stream, which counts the host's launch of the graph;
- behind a sleep kernel, so that the GPU's execution alone is timed.

It also compares the graphs themselves: node kinds, edges and kernel launch
attributes of torch's graph against the rebuilt one. Writes JSON; prints a table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "recipes" / "torch"))


def structure(handle) -> dict:
    """Node kinds, edge count and kernel launch attributes of a live graph."""
    from foundry.graphir.cuda import cu
    from foundry.graphir.lower import _read_attributes

    count = cu("cuGraphGetNodes", handle, 0)[1]
    nodes = cu("cuGraphGetNodes", handle, count)[0][:count]
    types = [str(cu("cuGraphNodeGetType", n)).rsplit(".", 1)[-1] for n in nodes]
    kinds = Counter(types)
    attributes = Counter()
    for node, kind in zip(nodes, types, strict=True):
        if "KERNEL" in kind:
            for name, value in _read_attributes(node).items():
                attributes[f"{name}={value}"] += 1
    edges = cu("cuGraphGetEdges", handle, 0)[-1]
    return {"kinds": dict(kinds), "edges": int(edges), "attributes": dict(attributes)}


class ReloadedFunctions:
    """Kernels from a fresh ``cuLibraryLoadData`` of the image the hook recorded, one load per image."""

    def __init__(self, hook, images) -> None:
        self.hook, self.images = hook, images
        self.libraries: dict[str, int] = {}

    def function(self, kernel) -> int:
        import ctypes

        from foundry.graphir.cuda import cu, driver, handle_value

        if kernel.image not in self.libraries:
            data = ctypes.create_string_buffer(self.hook.image_bytes(self.images.used[kernel.image]))
            self.libraries[kernel.image] = handle_value(
                cu("cuLibraryLoadData", ctypes.addressof(data), None, None, 0, None, None, 0)
            )
        library = driver().CUlibrary(self.libraries[kernel.image])
        return handle_value(cu("cuKernelGetFunction", cu("cuLibraryGetKernel", library, kernel.name.encode())))


def packed(ir):
    """Copy every device region ``ir`` points into, side by side, into one allocation
    (kept for the process's life); return a relocation onto the copies."""
    from foundry.graphir.cuda import cu
    from foundry.graphir.regions import RegionKind

    align = 2 << 20
    regions = [r for r in ir.regions.values() if r.kind is not RegionKind.HOST and r.size]
    offsets, total = {}, 0
    for region in regions:
        offsets[region.name] = total
        total += (region.size + align - 1) // align * align
    base = int(cu("cuMemAlloc", total))
    for region in regions:
        cu("cuMemcpyDtoD", base + offsets[region.name], region.base, region.size)

    def relocate(operand):
        if operand.region in offsets:
            return base + offsets[operand.region] + operand.region_offset
        return operand.value

    return relocate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="qwen3-0.6b")
    parser.add_argument("--batches", default="1,8,64,256")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "replay_ratio.json")
    args = parser.parse_args(argv)

    import torch
    from decoder import CONFIGS, Decoder
    from timing import median_ms

    from foundry.errors import HookError
    from foundry.graphir.build import LiveFunctions, build
    from foundry.graphir.cuda import cu, driver
    from foundry.graphir.lower import AddressResolver, graph_handle, lower
    from foundry.runtime.code.images import HookImages
    from foundry.runtime.graphs.capture import capture, instantiate_flags
    from foundry.runtime.native.hook import Hook

    try:
        hook = Hook.attach()
    except HookError:
        hook = None
    images = HookImages(hook) if hook else None
    reloaded = ReloadedFunctions(hook, images) if hook else None

    batches = [int(b) for b in args.batches.split(",")]
    model = Decoder(CONFIGS[args.config], max(batches))
    ids = torch.zeros(max(batches), dtype=torch.long, device="cuda")
    pos = torch.zeros(max(batches), dtype=torch.long, device="cuda")
    resolver, functions = AddressResolver(), LiveFunctions()
    stream = driver().CUstream(torch.cuda.current_stream().cuda_stream)
    rows = {}
    for bs in batches:
        graph, _ = capture(lambda bs=bs: model.step(ids[:bs], pos[:bs]))
        ir = lower(graph, f"decode.bs{bs}", resolver=resolver, functions=functions, images=images)
        raw = graph_handle(graph)
        flags = instantiate_flags(graph)
        again = cu("cuGraphInstantiate", raw, 0)
        rebuilt = build(ir, functions, flags=flags)
        launches = {
            "torch": graph.replay,
            "reinstantiated": lambda again=again: cu("cuGraphLaunch", again, stream),
            "rebuilt": lambda e=rebuilt.exec: cu("cuGraphLaunch", e, stream),
        }
        relocate = packed(ir)
        moved = build(ir, functions, relocate=relocate, flags=flags)
        launches["packed"] = lambda e=moved.exec: cu("cuGraphLaunch", e, stream)
        if reloaded is not None and all(k.kernel.image for k in ir.kernels()):
            fresh = build(ir, reloaded, flags=flags)
            launches["reloaded"] = lambda e=fresh.exec: cu("cuGraphLaunch", e, stream)
        for launch in launches.values():  # warm: first launches upload the graph
            for _ in range(3):
                launch()
        torch.cuda.synchronize()
        row = {"nodes": len(ir), "flags": flags, "torch_graph": structure(raw),
               "rebuilt_graph": structure(rebuilt.graph)}  # fmt: skip
        for busy in (False, True):
            timed = {name: [] for name in launches}
            for _ in range(3):  # interleaved rounds: drift in clocks hits every variant alike
                for name, launch in launches.items():
                    timed[name].append(median_ms(launch, busy=busy, repeats=args.repeats))
            row["busy" if busy else "idle"] = {name: statistics.median(t) for name, t in timed.items()}
        rows[bs] = row
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"config": args.config, "rows": rows}, indent=1) + "\n")
    print(f"{'bs':>4} {'nodes':>6} {'stream':>6} {'torch ms':>9} {'reinst. x':>9} {'rebuilt x':>9} "
          f"{'packed x':>9} {'reloaded x':>10}  same graph")  # fmt: skip
    nan = float("nan")
    for bs, row in rows.items():
        same = row["torch_graph"] == row["rebuilt_graph"]
        for stream_state in ("idle", "busy"):
            t = row[stream_state]
            print(f"{bs:>4} {row['nodes']:>6} {stream_state:>6} {t['torch']:9.3f} "
                  f"{t['reinstantiated'] / t['torch']:9.3f} {t['rebuilt'] / t['torch']:9.3f} "
                  f"{t['packed'] / t['torch']:9.3f} {t.get('reloaded', nan) / t['torch']:10.3f}  {same}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
