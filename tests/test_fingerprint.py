"""Fingerprints and topology keys (foundry/graphir/fingerprint.py) on graphs the H200
SAVE captured: undefined bytes left out, parameters ignored by the topology, edges not."""

from __future__ import annotations

import msgspec

from foundry.graphir.fingerprint import fingerprint, topology_key
from foundry.graphir.graph import Edge, EdgeData


def test_undefined_bytes_are_marked_and_left_out_of_the_fingerprint(pair):
    a, _ = pair
    ir = a.graph(0, "decode.bs1")
    marked = [n for n in ir.kernels() if n.undefined]
    assert marked, "the H200 SAVE marked no undefined bytes"
    node = marked[0]
    offset, _ = node.undefined[0]
    flipped = bytearray(node.params)
    flipped[offset] ^= 0xFF
    before = fingerprint(ir)
    ir.replace_node(msgspec.structs.replace(node, params=bytes(flipped)))
    assert fingerprint(ir) == before  # an undefined byte does not count
    defined = next(i for i in range(len(node.params)) if all(not o <= i < o + n for o, n in node.undefined))
    flipped[defined] ^= 0xFF
    ir.replace_node(msgspec.structs.replace(node, params=bytes(flipped)))
    assert fingerprint(ir) != before  # a defined one does


def test_topology_keys_ignore_parameters_but_not_edges(pair):
    a, _ = pair
    ir = a.graph(0, "decode.bs1")
    key = topology_key(ir)
    node = ir.kernels()[3]
    ir.replace_node(msgspec.structs.replace(node, params=bytes(len(node.params))))
    assert topology_key(ir) == key
    ir.add_edges([Edge(0, len(ir) - 1, EdgeData())])
    assert topology_key(ir) != key
