"""Stand-in engine distributions for the plugins' registration tests: SGLang and vLLM
import the GPU build of torch, which this machine cannot hold, so these tests patch
modules that only have the shape the hook tables name."""

from __future__ import annotations

import collections
from pathlib import Path

from foundry.integrations.common.hookpoints import HookPoint


def fake_engine(root: Path, name: str, version: str, points: tuple[HookPoint, ...], *,
                leave_out: str | None = None) -> Path:  # fmt: skip
    """A distribution ``name`` at ``version`` under ``root``: its metadata, and modules holding
    a class method or module function for every hook point (but ``leave_out``), each returning
    "original"."""
    dist = root / f"{name}-{version}.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    owners: dict[str, dict[str, list[HookPoint]]] = collections.defaultdict(lambda: collections.defaultdict(list))
    for point in points:
        if point.target != leave_out:
            owners[point.module][point.owner.removeprefix(point.module).lstrip(".")].append(point)
    for module, by_owner in owners.items():
        path = root.joinpath(*module.split(".")).with_suffix(".py")
        for parent in [path.parent, *path.parent.parents]:
            if parent == root:
                break
            parent.mkdir(parents=True, exist_ok=True)
            (parent / "__init__.py").touch()
        body = []
        for owner, held in by_owner.items():
            indent = "    " if owner else ""  # "": module functions
            if owner:
                body.append(f"class {owner}:")
            for p in held:
                body.append(f"{indent}def {p.attribute}({', '.join(p.parameters)}, *args, **kwargs):\n"
                            f"{indent}    return 'original'")  # fmt: skip
        path.write_text("\n".join(body) + "\n")
    return root
