"""Alter one kernel parameter word of an archive and re-seal it, for the negative control.

    python recipes/torch/negative_control.py ARCHIVE [--graph decode.bs8] [--last]

Finds the first kernel of the graph whose parameters hold the RMSNorm epsilon
(float32 1e-6), or with ``--last`` the last one (the final norm, on the logits
path), changes it to 0.1 and re-seals the archive as a SAVE would have written
it. A LOAD of the result must be reported different by compare.py. For SGLang's
dummy weights use ``--last``: there each layer adds to the residual stream less
than bf16 resolves, so an altered first norm leaves the outputs as they were.
"""

from __future__ import annotations

import argparse
import struct
import sys
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from foundry.graphir.graph import GraphIR
from tests.archive_tools import edit_graph

EPS, ALTERED = struct.pack("<f", 1e-6), struct.pack("<f", 0.1)


def alter(ir: GraphIR, *, last: bool = False) -> None:
    kernels = list(ir.kernels())
    for node in reversed(kernels) if last else kernels:
        at = node.params.find(EPS)
        if at >= 0:
            params = node.params[:at] + ALTERED + node.params[at + len(EPS) :]
            ir.replace_node(msgspec.structs.replace(node, params=params))
            print(f"altered node {node.id} ({node.kernel.short_name}) param byte {at}: 1e-6 -> 0.1")
            return
    raise SystemExit("no kernel holds the epsilon")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("archive", type=Path)
    parser.add_argument("--graph", default="decode.bs8")
    parser.add_argument("--last", action="store_true", help="alter the last kernel holding the epsilon")
    args = parser.parse_args()
    edit_graph(args.archive, args.graph, lambda ir: alter(ir, last=args.last))
    return 0


if __name__ == "__main__":
    sys.exit(main())
