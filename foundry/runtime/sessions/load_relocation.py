"""Where a LOAD's operands point in this process: each region's owner (the vmm
region's backend, or a backend the program attached), the live value it gives every
operand, and the report of what moved."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from foundry.backends.base import Backend, ProcessFacts
from foundry.backends.vmm import VmmBackend
from foundry.errors import DriftError
from foundry.graphir.graph import GraphIR
from foundry.graphir.operands import Operand, OperandSite
from foundry.graphir.regions import RegionKind


class Relocation:
    """Operand owners for one LOAD: ``backends`` are those whose state the archive
    records, ``attached`` (the session's, filled by ``attach``) the live facts of those
    the program attached."""

    def __init__(self, backends: Sequence[Backend], attached: Mapping[str, dict[str, Any]], rank: int,
                 world_size: int) -> None:  # fmt: skip
        self.backends, self.attached = backends, attached
        self.rank, self.world_size = rank, world_size
        self._owners: dict[str, Backend | None] = {}  # region name -> its backend in this process

    def live_facts(self, live_base: int | None) -> ProcessFacts:
        """This process as backends see it, the region at ``live_base`` (None: not reserved yet)."""
        vmm = {} if live_base is None else {RegionKind.VMM.value: {"base": live_base}}
        return ProcessFacts(self.rank, self.world_size, {**vmm, **self.attached})

    def owner(self, region: str) -> Backend | None:
        """The backend that places ``region`` in this process: vmm, or an attached backend.
        Asked per operand while restoring, after every attach: looked up once per region."""
        if region not in self._owners:
            owners = (VmmBackend(), *self.backends)
            self._owners[region] = next((owner for owner in owners if owner.owns(region) and (
                owner.name == RegionKind.VMM or owner.name in self.attached)), None)  # fmt: skip
        return self._owners[region]

    def relocation(self, live: ProcessFacts, *, moved: bool) -> Callable[[Operand], int] | None:
        """Every operand's live value, through the backend that owns its region; None
        when nothing moves (the region at SAVE's base, no backends attached)."""
        if not moved and not self.attached:
            return None

        def relocate(operand: Operand) -> int:
            owner = self.owner(operand.region)
            if owner is None:
                raise DriftError("no backend owns this pointer's region", found=operand.location(), node=operand.node)
            return owner.relocate(operand, live)

        return relocate

    def report(self, irs: list[GraphIR], live: ProcessFacts) -> dict[str, dict[str, Any]]:
        """Per region: the backend that placed it, its operands in the restored graphs and
        how many of them hold another value than at SAVE (a region moves as a whole)."""
        report: dict[str, dict[str, Any]] = {}
        for ir in irs:
            counts = Counter(o.region for o in ir.operands if o.resolved)
            for name, count in counts.items():
                owner, live_base = self.owner(name), self.region_base(ir, name, live)
                if owner is None:  # refused by the build, naming the operand
                    continue
                tally = report.setdefault(name, {"backend": owner.name, "operands": 0, "moved": 0})
                tally["operands"] += count
                tally["moved"] += count if live_base != ir.regions[name].base else 0
        return report

    def region_base(self, ir: GraphIR, name: str, live: ProcessFacts) -> int | None:
        """Where region ``name`` of ``ir`` starts in this process: its start at SAVE, relocated
        by its owner like any pointer to it; None when no owner places it here."""
        owner, region = self.owner(name), ir.regions.get(name)
        if owner is None or region is None:
            return None
        return owner.relocate(Operand(-1, OperandSite.PARAM, -1, 0, region.base, name, 0), live)
