"""What a kernel node launches and how: identity, launch config, parameter layout."""

from __future__ import annotations

import msgspec

from foundry.errors import IRError


class KernelIdentity(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The kernel as code: its entry name and, once the module registry knows it,
    the sha256 of the module image that holds it.

    ``image`` is ``None`` when the image was not recorded (lowering without the
    native hook); such a node can be inspected but not restored.
    """

    name: str
    demangled: str
    image: str | None = None

    @property
    def short_name(self) -> str:
        """The qualified name without return type, arguments or template
        arguments (``at::native::reduce_kernel<...>``), for tables."""
        return short_kernel_name(self.demangled or self.name)


def short_kernel_name(demangled: str) -> str:
    """Shorten a demangled kernel signature to its qualified name."""
    text = demangled.strip()
    if text.endswith(")"):  # drop the argument list: the group matching the final ')'
        depth = 0
        for i in range(len(text) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(text[i], 0)
            if depth == 0:
                text = text[:i]
                break
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


class ParamSlot(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    """One kernel parameter in the device-side layout (``cuFuncGetParamInfo``)."""

    offset: int
    size: int

    @property
    def end(self) -> int:
        return self.offset + self.size


class ParamLayout(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Offsets and sizes of every parameter, in ordinal order."""

    slots: tuple[ParamSlot, ...] = ()

    @property
    def size(self) -> int:
        """Bytes of the device-side parameter buffer."""
        return max((s.end for s in self.slots), default=0)

    def slot_at(self, offset: int) -> int | None:
        """Index of the parameter that holds byte ``offset``, if any."""
        for index, slot in enumerate(self.slots):
            if slot.offset <= offset < slot.end:
                return index
        return None

    def check(self) -> None:
        """Raise :class:`IRError` unless slots are ordered and do not overlap."""
        end = 0
        for index, slot in enumerate(self.slots):
            if slot.offset < 0 or slot.size <= 0:
                raise IRError(f"parameter {index} has offset {slot.offset} and size {slot.size}")
            if slot.offset < end:
                raise IRError(f"parameter {index} at offset {slot.offset} overlaps parameter {index - 1}")
            end = slot.end


#: A launch attribute's value: a scalar, a tuple (cluster dims), or a named
#: record (the access policy window).
AttributeValue = int | float | tuple[int, ...] | dict[str, int | float]


class LaunchAttribute(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    """A kernel node attribute that differs from its default (``CUlaunchAttributeID``)."""

    name: str
    value: AttributeValue


class FuncAttribute(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    """A function attribute a LOAD must re-apply before instantiation
    (dynamic shared memory above 48 KiB, carveout, cluster requirements)."""

    name: str
    value: int


class LaunchConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Grid, block, dynamic shared memory and non-default node attributes."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_mem: int = 0
    attributes: tuple[LaunchAttribute, ...] = ()

    def describe(self) -> str:
        text = f"grid={self.grid} block={self.block} smem={self.shared_mem}"
        for attr in self.attributes:
            text += f" {attr.name}={attr.value}"
        return text
