"""Child program of the registry's GPU test (run under LD_PRELOAD, not collected by pytest).

Runs the fixture programs with the hook in SAVE mode, lowers their graphs with
the module registry, writes archives with the images they use, and prints as
JSON what the registry recorded and what the archives hold.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from collections import Counter
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def main(out: str, keys: list[str]) -> int:
    spec = importlib.util.spec_from_file_location("make_fixtures", FIXTURES / "make_fixtures.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)

    from foundry.archive import Archive
    from foundry.runtime.code.images import HookImages
    from foundry.runtime.native.hook import Hook

    hook = Hook.attach()
    report: dict = {"programs": {}}
    for key in keys:
        images = HookImages(hook)
        program = module.PROGRAMS[key](images=images)
        path = module.write(program, Path(out) / program.name)
        archive = Archive.open(path)
        kernels = [k for g in program.graphs for k in g.ir.kernels()]
        report["programs"][key] = {
            "kernels": len(kernels),
            "with_image": sum(k.kernel.image is not None for k in kernels),
            "without_image": sorted({k.kernel.name[:80] for k in kernels if k.kernel.image is None})[:10],
            "images": [
                {
                    "sha256": i.sha256[:16],
                    "size": i.size,
                    "kind": i.kind,
                    "format": i.format,
                    "copied": i.copied,
                    "bytes_match": hashlib.sha256(hook.image_bytes(i)).hexdigest() == i.sha256,
                }
                for i in images.used.values()
            ],
            "module_state": archive.catalog.modules.state.value,
            "blobs": len(archive.catalog.modules.blobs),
        }
    everything = hook.images()
    report["registry"] = {
        "entries": len(everything),
        "by_kind_format": dict(
            Counter(f"{i.kind}/{i.format}/{'copied' if i.copied else 'in-place'}" for i in everything)
        ),
        "bytes": sum(i.size for i in everything),
    }
    report["counters"] = hook.counters()
    report["errors"] = [e for e in hook.events() if e.startswith("error")]
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2].split(",")))
