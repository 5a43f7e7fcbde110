"""Speculative decoding under the SGLang plugin: which algorithms it persists,
with the graph runners each captures, and what it refuses, by field, before
anything is allocated.

SGLang 0.5.17 runs every algorithm through a V2 worker in the scheduler's
process, on the target's GPU. Those the plugin persists:

- ``EAGLE`` (``NEXTN`` is its alias), ``EAGLE3`` and ``STANDALONE``
  (``EAGLEWorkerV2`` / ``StandaloneWorkerV2``): a draft model runner of its own
  beside the target's, sharing the target's request-to-token pool and KV
  allocator, with a KV pool of its own sized from the target's pool
  configuration (the pinned budget). Graphs: ``target_verify`` (target),
  ``draft_decode`` (draft, when more than one step is drafted) and
  ``draft_extend`` (draft).
- ``NGRAM``: no draft model (drafts come from a host-side n-gram trie); only the
  target's ``target_verify`` graphs.

Refused: ``DFLASH`` and ``DSPARK`` (a draft runner that verifies, ragged verify
graphs), ``FROZEN_KV_MTP`` (its own graph runner), algorithms registered by
other plugins, multi-layer EAGLE (one draft model runner per step) and adaptive
speculation (graphs for every candidate number of steps, under the same names).
"""

from __future__ import annotations

from typing import Any

from foundry.errors import FoundryError

# algorithm (as ServerArgs resolved it) -> the graph runner phases it captures
PERSISTED = {
    "EAGLE": ("target_verify", "draft_decode", "draft_extend"),
    "EAGLE3": ("target_verify", "draft_decode", "draft_extend"),
    "STANDALONE": ("target_verify", "draft_decode", "draft_extend"),
    "NGRAM": ("target_verify",),
}
ALIASES = {"NEXTN": "EAGLE"}  # resolved by ServerArgs before a scheduler starts; accepted unresolved too
# switches that add graph runners or model runners the plugin has not been checked against
_REFUSED_SWITCHES = {
    "enable_multi_layer_eagle": "multi-layer EAGLE (a draft model runner per step) is not persisted",
    "speculative_adaptive": "adaptive speculation captures graphs for every candidate number of steps under "
    "the same names; it is not persisted",
}


def algorithm(server_args: Any) -> str | None:
    """The speculative algorithm a server runs (upper case, aliases resolved), or None."""
    name = getattr(server_args, "speculative_algorithm", None)
    if not name:
        return None
    upper = str(name).upper()
    return ALIASES.get(upper, upper)


def check_speculative(server_args: Any) -> None:
    """Refuse, by field, speculative decoding the plugin does not persist."""
    name = algorithm(server_args)
    if name is None:
        return
    if name not in PERSISTED:
        raise FoundryError("this speculative algorithm's graphs are not persisted",
                           field="sglang.speculative_algorithm", expected=sorted(PERSISTED),
                           found=server_args.speculative_algorithm)  # fmt: skip
    for switch, why in _REFUSED_SWITCHES.items():
        if getattr(server_args, switch, False):
            raise FoundryError(why, field=f"sglang.{switch}", found=True)


def model_runners(server_args: Any) -> tuple[str, ...]:
    """The model runners a scheduler of this server holds: the target's, and the
    draft model's where the algorithm has one."""
    name = algorithm(server_args)
    return ("target",) if name is None or name == "NGRAM" else ("target", "draft")
