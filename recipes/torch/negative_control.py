"""Alter one kernel parameter word of an archive and re-seal it, for the negative control.

    python recipes/torch/negative_control.py ARCHIVE [--graph decode.bs8] [--last] [--epsilon 0.1]

Finds the first kernel of the graph whose parameters hold the RMSNorm epsilon
(float32 1e-6), or with ``--last`` the last one (the final norm, on the logits
path), changes it to ``--epsilon`` (0.1) and re-seals the archive as a SAVE would
have written it, the graph's launch plan dropped (a LOAD builds that graph from
its IR). A LOAD of the result must be reported different by compare.py. For
SGLang's dummy weights use ``--last``: there each layer adds to the residual
stream less than bf16 resolves, so an altered first norm leaves the outputs as
they were. At the qwen3-8b shape ``--epsilon 1e30`` is the value shown to change
the outputs (docs/validation.md).
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

EPS = struct.pack("<f", 1e-6)


def alter(ir: GraphIR, *, last: bool = False, epsilon: float = 0.1) -> None:
    kernels = list(ir.kernels())
    for node in reversed(kernels) if last else kernels:
        at = node.params.find(EPS)
        if at >= 0:
            params = node.params[:at] + struct.pack("<f", epsilon) + node.params[at + len(EPS) :]
            ir.replace_node(msgspec.structs.replace(node, params=params))
            print(f"altered node {node.id} ({node.kernel.short_name}) param byte {at}: 1e-6 -> {epsilon:g}")
            return
    raise SystemExit("no kernel holds the epsilon")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("archive", type=Path)
    parser.add_argument("--graph", default="decode.bs8")
    parser.add_argument("--last", action="store_true", help="alter the last kernel holding the epsilon")
    parser.add_argument("--epsilon", type=float, default=0.1, help="the value written (default 0.1)")
    args = parser.parse_args()
    edit_graph(args.archive, args.graph, lambda ir: alter(ir, last=args.last, epsilon=args.epsilon))
    return 0


if __name__ == "__main__":
    sys.exit(main())
