"""A payload oracle for DeepEP dispatch and combine: every token says who sent it.

Each (source rank, token, expert) is encoded injectively into the first
``width`` elements of a token's hidden vector, as base-128 digits plus one:
integers up to 256 are exact in bf16, so the code survives the wire, and no
digit is 0, so an element never written is caught. After dispatch, every
received row must decode to a triplet routed to that expert, each exactly once;
after combine with weights 1/k (k a power of two) the output row decodes to its
own (rank, token). Checks work on plain nested lists (``tensor.tolist()``), so
the oracle needs no GPU to be tested.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

BASE = 128


@dataclass(frozen=True)
class Mismatch:
    where: str
    expected: object
    found: object


@dataclass(frozen=True)
class PayloadCode:
    ranks: int
    tokens: int  # per rank
    experts: int

    @property
    def width(self) -> int:
        """Hidden elements the code needs."""
        n, width = self.ranks * self.tokens * self.experts, 1
        while BASE**width < n:
            width += 1
        return width

    def encode(self, rank: int, token: int, expert: int) -> list[float]:
        if not (0 <= rank < self.ranks and 0 <= token < self.tokens and 0 <= expert < self.experts):
            raise ValueError(f"({rank}, {token}, {expert}) is outside the code's ranges")
        code = (rank * self.tokens + token) * self.experts + expert
        return [float(code // BASE**i % BASE + 1) for i in range(self.width)]

    def decode(self, values: list[float]) -> tuple[int, int, int] | None:
        """The triplet a row encodes, or None when it is no valid code."""
        digits = [v - 1 for v in values[: self.width]]
        if len(digits) < self.width or any(d != int(d) or not 0 <= d < BASE for d in digits):
            return None
        code = sum(int(d) * BASE**i for i, d in enumerate(digits))
        expert, rest = code % self.experts, code // self.experts
        token, rank = rest % self.tokens, rest // self.tokens
        return (rank, token, expert) if rank < self.ranks else None


def check_rows(expected: list[list[float]], actual: list[list[float]]) -> Mismatch | None:
    """The first element where two tensors (as nested lists) differ, or None."""
    if len(expected) != len(actual):
        return Mismatch("rows", len(expected), len(actual))
    for r, (want, got) in enumerate(zip(expected, actual, strict=True)):
        if len(want) != len(got):
            return Mismatch(f"row {r} length", len(want), len(got))
        for c, (x, y) in enumerate(zip(want, got, strict=True)):
            if x != y:
                return Mismatch(f"row {r} element {c}", x, y)
    return None


def check_dispatch(code: PayloadCode, received: dict[int, list[list[float]]],
                   routed: set[tuple[int, int, int]]) -> list[Mismatch]:  # fmt: skip
    """Every row an expert received decodes to a triplet routed to it, each exactly once."""
    problems: list[Mismatch] = []
    seen: Counter[tuple[int, int, int]] = Counter()
    for expert, rows in sorted(received.items()):
        for r, row in enumerate(rows):
            triplet = code.decode(row)
            if triplet is None or triplet[2] != expert:
                problems.append(Mismatch(f"expert {expert} row {r}", f"a token routed to expert {expert}", triplet))
            else:
                seen[triplet] += 1
    for triplet in sorted(routed - set(seen)):
        problems.append(Mismatch(f"expert {triplet[2]}", triplet, "missing"))
    for triplet, n in sorted(seen.items()):
        if n > 1 or triplet not in routed:
            problems.append(Mismatch(f"expert {triplet[2]}", "routed once" if triplet in routed else "not routed",
                                     f"{triplet} received {n}x"))  # fmt: skip
    return problems


def check_combine(code: PayloadCode, rank: int, combined: list[list[float]]) -> list[Mismatch]:
    """After combine with weights summing to one, row t of ``rank`` decodes to (rank, t, 0)
    when every expert returns its input (the payloads are encoded with expert 0)."""
    problems = []
    for t, row in enumerate(combined):
        triplet = code.decode(row)
        if triplet != (rank, t, 0):
            problems.append(Mismatch(f"rank {rank} token {t}", (rank, t, 0), triplet))
    return problems
