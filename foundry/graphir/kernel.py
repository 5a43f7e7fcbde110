"""What a kernel node launches and how: identity, launch config, parameter layout."""

from __future__ import annotations

import functools
import re
from typing import Annotated, Literal, NamedTuple

import msgspec

from foundry.errors import IRError
from foundry.graphir.demangle import demangle
from foundry.graphir.limits import (
    DIM,
    I32,
    MAX_ATTRIBUTES,
    MAX_NAME,
    MAX_PARAMS,
    SHA256,
    U32,
    Name,
    at_most,
    is_fraction,
    is_int,
    is_uint,
)


class KernelIdentity(msgspec.Struct, frozen=True, gc=False, forbid_unknown_fields=True):
    """The kernel as code: its entry name (mangled, as the driver reports it)
    and, once the module registry knows it, the sha256 of the module image
    that holds it.

    ``image`` is ``None`` when the image was not recorded (lowering without the
    native hook); such a node can be inspected but not restored. The demangled
    name is derived, not stored: it is a pure function of ``name``.
    """

    name: Annotated[str, at_most(MAX_NAME)]
    image: SHA256 | None = None

    @property
    def demangled(self) -> str:
        return demangle(self.name)

    @property
    def short_name(self) -> str:
        """The qualified name without return type, arguments or template
        arguments (``at::native::reduce_kernel<...>``), for tables."""
        return short_kernel_name(self.demangled)

    @property
    def across_builds(self) -> str:
        """The mangled name with nvcc's per-compilation anonymous-namespace ids masked: equal
        for the same kernel compiled twice, as a JIT compiler does on every machine."""
        return _ANONYMOUS_NAMESPACE_ID.sub("_GLOBAL__N__*_", self.name)


# nvcc names an anonymous namespace after its file and an id drawn anew at each compilation
# (``_GLOBAL__N__2e61af97_7_cuda_cu_b52d24f4``): two builds of one source differ there alone
_ANONYMOUS_NAMESPACE_ID = re.compile(r"_GLOBAL__N__[0-9a-f]{8}_")


def _opening(text: str, close: str, open_: str) -> int | None:
    """Index of the bracket that matches the final ``close`` of ``text``."""
    depth = 0
    for i in range(len(text) - 1, -1, -1):
        depth += {close: 1, open_: -1}.get(text[i], 0)
        if depth == 0:
            return i
    return None


def _without_arguments(demangled: str) -> str:
    """The signature without its final argument list."""
    text = demangled.strip()
    if text.endswith(")"):
        start = _opening(text, ")", "(")
        text = text[:start] if start is not None else text
    return text


def _split_top_level(inner: str) -> list[str]:
    args, depth, current = [], 0, []
    for ch in inner:
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        if ch == "," and depth == 0:
            args.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
    args.append("".join(current).strip())
    return args


def template_args(demangled: str) -> list[str]:
    """Top-level template arguments of the kernel itself
    (``['c10::BFloat16', '16', '2', 'true', 'false']``), or ``[]``."""
    text = _without_arguments(demangled)
    start = _opening(text, ">", "<") if text.endswith(">") else None
    return [] if start is None else _split_top_level(text[start + 1 : -1])


def parameter_types(demangled: str) -> list[str] | None:
    """The kernel's parameter types from its demangled signature
    (``['long', 'at::PhiloxCudaState', ...]``); None when the name carries none
    (``extern "C"`` kernels such as Triton's)."""
    text = demangled.strip()
    start = _opening(text, ")", "(") if text.endswith(")") else None
    if start is None:
        return None
    inner = text[start + 1 : -1].strip()
    return [] if inner in ("", "void") else _split_top_level(inner)


@functools.cache
def short_kernel_name(demangled: str) -> str:
    """Shorten a demangled kernel signature to its qualified name."""
    text = _without_arguments(demangled)
    out, depth = [], 0
    for ch in text:  # collapse template arguments
        if ch == "<":
            if depth == 0:
                out.append("<...>")
            depth += 1
        elif ch == ">":
            depth = max(depth - 1, 0)
        elif depth == 0:
            out.append(ch)
    name = "".join(out).strip()
    if name.startswith("void "):  # kernels return void; the type says nothing
        name = name[len("void ") :]
    return name.replace("(anonymous namespace)", "(anon)")


class ParamSlot(NamedTuple):
    """One kernel parameter in the device-side layout (``cuFuncGetParamInfo``)."""

    offset: int
    size: int

    @property
    def end(self) -> int:
        return self.offset + self.size


class ParamLayout(msgspec.Struct, frozen=True, gc=False, forbid_unknown_fields=True):
    """Offsets and sizes of every parameter, in ordinal order.

    Stored as two integer columns: a graph holds thousands of kernel nodes and
    tuples of ints decode far faster than one record per parameter.
    """

    offsets: Annotated[tuple[U32, ...], at_most(MAX_PARAMS)] = ()
    sizes: Annotated[tuple[U32, ...], at_most(MAX_PARAMS)] = ()

    @classmethod
    def of(cls, slots: list[ParamSlot] | tuple[ParamSlot, ...]) -> ParamLayout:
        return cls(tuple(s.offset for s in slots), tuple(s.size for s in slots))

    @property
    def slots(self) -> tuple[ParamSlot, ...]:
        return tuple(ParamSlot(o, s) for o, s in zip(self.offsets, self.sizes, strict=False))

    @property
    def size(self) -> int:
        """Bytes of the device-side parameter buffer."""
        return max((o + s for o, s in zip(self.offsets, self.sizes, strict=False)), default=0)

    def slot_at(self, offset: int) -> int | None:
        """Index of the parameter that holds byte ``offset``, if any."""
        for index, (start, size) in enumerate(zip(self.offsets, self.sizes, strict=False)):
            if start <= offset < start + size:
                return index
        return None

    def check(self) -> None:
        """Raise :class:`IRError` unless slots are ordered and do not overlap."""
        if len(self.offsets) != len(self.sizes):
            raise IRError("parameter offsets and sizes differ in number")
        end = 0
        for index, (offset, size) in enumerate(zip(self.offsets, self.sizes, strict=True)):
            if offset < 0 or size <= 0:
                raise IRError(f"parameter {index} has offset {offset} and size {size}")
            if offset < end:
                raise IRError(f"parameter {index} at offset {offset} overlaps parameter {index - 1}")
            end = offset + size


#: A launch attribute's value: a scalar, a tuple (cluster dims), or a named
#: record (the access policy window).
AttributeValue = int | float | Annotated[tuple[int, ...], at_most(3)] | Annotated[dict[Name, int | float], at_most(5)]


class LaunchAttribute(msgspec.Struct, frozen=True, gc=False, array_like=True, forbid_unknown_fields=True):
    """A kernel node attribute that differs from its default (``CUlaunchAttributeID``).
    Only the attributes lowering records exist, each with the shape and range of its
    driver field (:data:`ATTRIBUTES`): a NaN address or an unknown name is refused when
    the graph is decoded."""

    name: Name
    value: AttributeValue

    def __post_init__(self) -> None:
        value = self.value
        key = None if type(value) is dict else (self.name, type(value), value)  # the type: 1.0 == 1
        if key in _ACCEPTED:  # a graph gives thousands of kernels the same few attributes
            return
        check = ATTRIBUTES.get(self.name)
        if check is None:
            raise ValueError(f"unknown launch attribute {self.name!r}")
        if not check(value):
            raise ValueError(f"launch attribute {self.name!r} has a value out of its range: {value!r}")
        if key is not None:
            if len(_ACCEPTED) >= 4096:  # bounded, whatever an archive holds
                _ACCEPTED.clear()
            _ACCEPTED.add(key)


#: Launch attributes already found in range, by name, value type and value.
_ACCEPTED: set[tuple[str, type, object] | None] = set()


def _access_policy_window(value: AttributeValue) -> bool:
    return (
        isinstance(value, dict)
        and value.keys() == {"base_ptr", "num_bytes", "hit_ratio", "hit_prop", "miss_prop"}
        and is_uint(value["base_ptr"], 63)  # as U64 fields: below 2**63
        and is_uint(value["num_bytes"], 63)
        and is_fraction(value["hit_ratio"])
        and value["hit_prop"] in (0, 1, 2)  # CUaccessProperty
        and value["miss_prop"] in (0, 1, 2)
        and not any(type(value[k]) is bool for k in ("hit_prop", "miss_prop"))
    )


def _uints(count: int, bits: int):
    return lambda v: isinstance(v, tuple) and len(v) == count and all(is_uint(x, bits) for x in v)


#: Every launch attribute lowering records, and whether a value fits its driver field.
ATTRIBUTES = {
    "access_policy_window": _access_policy_window,
    "cooperative": lambda v: v in (0, 1) and type(v) is int,
    "cluster_dim": _uints(3, 32),
    "cluster_scheduling_policy": lambda v: is_uint(v, 32),
    "priority": lambda v: is_int(v, 32),
    "mem_sync_domain_map": _uints(2, 8),
    "mem_sync_domain": lambda v: is_uint(v, 32),
    "preferred_shared_memory_carveout": lambda v: is_uint(v, 32),
    "device_updatable": lambda v: v in (0, 1) and type(v) is int,
    "preferred_cluster_dim": _uints(3, 32),  # a substitute cluster, a multiple of cluster_dim
    "nvlink_util_centric_scheduling": lambda v: v in (0, 1) and type(v) is int,
}
#: Attributes only graph format version 4 holds (an older Foundry refuses them by name).
ATTRIBUTES_SINCE_4 = frozenset({"preferred_cluster_dim", "nvlink_util_centric_scheduling"})


#: The function attributes a LOAD re-applies: two ``CUfunction_attribute`` values and the
#: cache preference (``CUfunc_cache``, set by ``cuFuncSetCacheConfig``).
FuncAttributeName = Literal["max_dynamic_shared_size_bytes", "preferred_shared_memory_carveout", "cache_config"]


#: ``CUfunc_cache``: no preference, prefer shared memory, prefer L1, equal.
CACHE_CONFIGS = frozenset({0, 1, 2, 3})


class FuncAttribute(msgspec.Struct, frozen=True, gc=False, array_like=True, forbid_unknown_fields=True):
    """A function attribute a LOAD must re-apply before instantiation
    (dynamic shared memory above 48 KiB, carveout, cache preference)."""

    name: FuncAttributeName
    value: I32

    def __post_init__(self) -> None:
        check_func_attribute(self.name, self.value)


def check_func_attribute(name: str, value: int) -> None:
    """Refuse a cache preference the driver does not define (``ValueError``, for msgspec)."""
    if name == "cache_config" and value not in CACHE_CONFIGS:
        raise ValueError(f"cache_config {value} is no CUfunc_cache value (0-3)")


class LaunchConfig(msgspec.Struct, frozen=True, gc=False, forbid_unknown_fields=True):
    """Grid, block, dynamic shared memory and non-default node attributes."""

    grid: tuple[DIM, DIM, DIM]
    block: tuple[DIM, DIM, DIM]
    shared_mem: U32 = 0
    attributes: Annotated[tuple[LaunchAttribute, ...], at_most(MAX_ATTRIBUTES)] = ()

    def describe(self) -> str:
        text = f"grid={self.grid} block={self.block} smem={self.shared_mem}"
        for attr in self.attributes:
            text += f" {attr.name}={attr.value}"
        return text
