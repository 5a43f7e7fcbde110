"""The graphs of a vLLM worker as the archive names them, and the inputs each one
was captured over.

A graph's name says its mode and vLLM's batch descriptor: ``full.t8.r8.u`` (V1, a
uniform decode batch of 8 tokens and 8 requests), ``full.t8.r8.u1`` (V2, one token
per request), ``piecewise.t512.p3`` (the fourth piece of the model for 512
tokens). A piecewise graph is only a piece of a forward: the next piece reads what
the previous one and the eager attention between them wrote. So SAVE records,
with each graph's outputs, the inputs vLLM passed (device tensors by address and
geometry, numbers by value), and LOAD refuses a graph whose live inputs are not
those, naming the graph and the input: a model split otherwise, or memory placed
otherwise, is found before anything is replayed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from foundry.errors import DriftError

OUT, INPUTS = "out", "inputs"  # the keys of the structure every graph's outputs are recorded as


def graph_name(mode: str, descriptor: Any, piece: int | None = None) -> str:
    """The archive name of one graph: its mode (``FULL``, ``PIECEWISE``), vLLM's batch
    descriptor (V1's ``BatchDescriptor`` or V2's ``BatchExecutionDescriptor``) and,
    for a piecewise graph, the piece's index."""
    name = f"{mode.lower()}.t{descriptor.num_tokens}"
    num_reqs = getattr(descriptor, "num_reqs", None)
    if num_reqs is not None:
        name += f".r{num_reqs}"
    if getattr(descriptor, "uniform", False) is True:
        name += ".u"
    uniform_tokens = getattr(descriptor, "uniform_token_count", None)
    if uniform_tokens is not None:
        name += f".u{uniform_tokens}"
    loras = getattr(descriptor, "num_active_loras", 0)
    if loras or getattr(descriptor, "has_lora", False):
        name += f".lora{loras}"
    if piece is not None:
        name += f".p{piece}"
    return name


def _is_device_tensor(value: Any) -> bool:
    return getattr(value, "is_cuda", False) is True and callable(getattr(value, "data_ptr", None))


def _input(value: Any) -> Any:
    if _is_device_tensor(value) or value is None or isinstance(value, bool | int | float):
        return value
    return None  # host tensors and objects: not compared


def graph_inputs(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """What a graph was captured over, in a shape the archive's output description takes."""
    return {"args": [_input(a) for a in args], "kwargs": {k: _input(v) for k, v in kwargs.items()}}


def _text(value: Any) -> str:
    if _is_device_tensor(value):
        dtype = str(value.dtype).removeprefix("torch.")
        return f"0x{value.data_ptr():x} {dtype}{list(value.shape)} stride {list(value.stride())}"
    return repr(value)


def _same(recorded: Any, live: Any) -> bool:
    if _is_device_tensor(recorded) or _is_device_tensor(live):
        return (_is_device_tensor(recorded) and _is_device_tensor(live) and recorded.data_ptr() == live.data_ptr()
                and tuple(recorded.shape) == tuple(live.shape) and tuple(recorded.stride()) == tuple(live.stride())
                and recorded.dtype == live.dtype)  # fmt: skip
    return type(recorded) is type(live) and recorded == live


def check_inputs(name: str, recorded: Mapping[str, Any] | None, live: Mapping[str, Any]) -> None:
    """Refuse a restored graph whose live inputs are not the ones SAVE captured it over."""
    if recorded is None:
        raise DriftError("the archive records no inputs for this graph (not saved by the vLLM plugin)",
                         field=f"vllm.graphs.{name}")  # fmt: skip
    saved_args, live_args = list(recorded.get("args", [])), list(live["args"])
    if len(saved_args) != len(live_args) or set(recorded.get("kwargs", {})) != set(live["kwargs"]):
        raise DriftError(f"vLLM calls graph {name} with other arguments than at SAVE", field=f"vllm.graphs.{name}",
                         expected=f"{len(saved_args)} args, kwargs {sorted(recorded.get('kwargs', {}))}",
                         found=f"{len(live_args)} args, kwargs {sorted(live['kwargs'])}")  # fmt: skip
    pairs = [(f"args[{i}]", a, b) for i, (a, b) in enumerate(zip(saved_args, live_args, strict=True))]
    pairs += [(f"kwargs.{k}", recorded["kwargs"][k], v) for k, v in sorted(live["kwargs"].items())]
    for where, saved, now in pairs:
        if not _same(saved, now):
            raise DriftError(f"graph {name} would read another input than at SAVE", field=f"vllm.graphs.{name}.{where}",
                             expected=_text(saved), found=_text(now))  # fmt: skip
