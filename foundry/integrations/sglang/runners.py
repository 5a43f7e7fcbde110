"""Which of SGLang's graph runners a backend captures for, which model runner it
belongs to, and the archive names of its graphs.

SGLang 0.5.17 captures every full graph through one backend class
(``FullCudaGraphBackend``), built by each graph runner for itself. A scheduler
can hold two model runners: the target's and, under speculative decoding, a
draft model's (``ModelRunner.is_draft_worker``). A runner is named by the phase
SGLang's own start-up timings use for it:

- ``decode``: the target's ``DecodeCudaGraphRunner`` without speculative decoding;
- ``target_verify``: the same runner when speculative decoding is on (it captures
  in ``ForwardMode.TARGET_VERIFY``, the draft tokens of every request at once);
- ``draft_decode``: ``EAGLEDraftCudaGraphRunner``, the draft model's steps
  (EAGLE, EAGLE3, NEXTN and STANDALONE, when more than one step is drafted);
- ``draft_extend``: ``EAGLEDraftExtendCudaGraphRunner``, the draft model over
  the tokens the target accepted;
- ``prefill`` and ``draft_prefill``: ``PrefillCudaGraphRunner`` of either model.

Any other runner (DFLASH's and DSPARK's draft verify, frozen-KV MTP's,
multi-layer EAGLE's, a diffusion model's decode) is refused by name: the plugin
has not been checked against what its graphs read.
"""

from __future__ import annotations

from typing import Any

from foundry.errors import FoundryError

# graph runner class -> phase, where the class alone decides it
_DRAFT_RUNNERS = {"EAGLEDraftCudaGraphRunner": "draft_decode", "EAGLEDraftExtendCudaGraphRunner": "draft_extend"}
KNOWN_RUNNERS = ("DecodeCudaGraphRunner", "PrefillCudaGraphRunner", *_DRAFT_RUNNERS)
PHASES = ("decode", "target_verify", "draft_decode", "draft_extend", "prefill", "draft_prefill")
PREFILL_PHASES = ("prefill", "draft_prefill")  # shapes are token counts, not batch sizes
ROLES = ("target", "draft")


def role_of(model_runner: Any) -> str:
    """``draft`` for a speculative draft model's runner, ``target`` otherwise."""
    return "draft" if getattr(model_runner, "is_draft_worker", False) else "target"


def phase_of(cuda_graph_runner: Any) -> str:
    """The phase a graph runner captures (see the module docstring); refused by name
    when the plugin does not persist its graphs."""
    kind = type(cuda_graph_runner).__name__
    draft = role_of(getattr(cuda_graph_runner, "model_runner", None)) == "draft"
    if kind in _DRAFT_RUNNERS:
        return _DRAFT_RUNNERS[kind]
    if kind == "PrefillCudaGraphRunner":
        return "draft_prefill" if draft else "prefill"
    if kind == "DecodeCudaGraphRunner" and not draft:
        mode = getattr(cuda_graph_runner, "capture_forward_mode", None)
        mode = getattr(mode, "name", mode)
        if getattr(cuda_graph_runner, "ragged_verify_mode", False):
            raise FoundryError("ragged verify graphs (one per token count) are not persisted",
                               field="sglang.graph_runner", found=f"{kind} ({mode}, ragged)")  # fmt: skip
        if mode == "DECODE":
            return "decode"
        if mode == "TARGET_VERIFY":
            return "target_verify"
        found = f"{kind} ({mode})"
    else:
        found = f"{kind} of the draft model" if kind == "DecodeCudaGraphRunner" else kind
    raise FoundryError("the graphs of this graph runner are not persisted", field="sglang.graph_runner",
                       expected=list(KNOWN_RUNNERS), found=found)  # fmt: skip


def graph_name(phase: str, shape_key: Any) -> str:
    """The archive name of one captured shape: ``decode.bs8``, ``target_verify.bs8``,
    ``draft_decode.bs8``, ``prefill.t512``, ..."""
    size = getattr(shape_key, "size", shape_key)
    name = f"{phase}.{'t' if phase in PREFILL_PHASES else 'bs'}{size}"
    stream = getattr(shape_key, "stream_idx", None)
    variant = getattr(shape_key, "variant_label", None)
    if stream is not None:
        name += f".s{stream}"
    if variant:
        name += "." + "".join(c if c.isalnum() or c in "._-" else "_" for c in str(variant))
    return name
