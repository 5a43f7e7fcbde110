"""LOAD's region: the warm-up's allocations checked against SAVE's, the region mapped
up to SAVE's final offset with holes for SAVE's allocations between captures (which
the warm-ups repeated then make again, checked), and (``--warmup restore``) the bytes
SAVE's warm-up left copied back, on a thread while the graphs are built when asked.
Those bytes are read and checked on a thread of their own from the session's start:
an engine sets up its model and KV pool before the graph phase that needs them."""

from __future__ import annotations

import ctypes
import time
from concurrent.futures import Future
from typing import Any

from foundry.archive.reader import Archive
from foundry.archive.schema import RegionRecord
from foundry.errors import DriftError
from foundry.graphir.cuda import cu
from foundry.runtime.native.hook import Allocation, Hook
from foundry.runtime.sessions.base import anchor_generator
from foundry.runtime.sessions.placement import LATE, RestorePlan, check_followed, restore_plan
from foundry.runtime.threads import on_thread


class RegionRestore:
    """One LOAD's region in this process, once the hook reserved it. Timings go to
    ``report``, the session's."""

    def __init__(self, hook: Hook, archive: Archive, rank: int, device: int, record: RegionRecord, warmup: str,
                 report: dict[str, Any]) -> None:  # fmt: skip
        self.hook, self.archive, self.rank, self.device = hook, archive, rank, device
        self.record, self.warmup, self.report = record, warmup, report
        self.expected = [
            Allocation(a.order, a.offset, a.size, a.request, False, False, a.phase)
            for a in record.trace[: self._expected_count()]
        ]
        self.anchor: Any = None  # the default generator registered with a graph, kept while the session lives
        self._copy: Future[None] | None = None  # the thread restoring the warm-up bytes while graphs are built
        self._read: Future[bytes] | None = None  # the thread reading them since prefetch()
        self.placement: RestorePlan | None = None  # how map() restored the region
        self._restored_at = 0  # allocations the trace held right after the restore
        # (--warmup restore) region ranges the program makes again after the bytes were copied
        # (SAVE's between allocations, the blocks an integration names): copied again at finish
        self.again: list[tuple[int, int]] = []
        self._kept: bytes | None = None  # the warm-up bytes, held for that second copy

    def _expected_count(self) -> int:
        if self.warmup == "restore":
            return self.record.warmup_bytes.allocations if self.record.warmup_bytes else 0
        return self.record.warmup_allocations

    def prefetch(self) -> None:
        """(``--warmup restore``) Read and check the warm-up bytes on a thread from now on; the
        restore takes them (:meth:`warmup_data`), or the thread's error. They stay in host
        memory until then."""
        if self.warmup != "restore" or self.record.warmup_bytes is None or self._read is not None:
            return
        self._read = on_thread("foundry-warmup-read", self._read_bytes)

    def _read_bytes(self) -> bytes:
        warm = self.record.warmup_bytes
        assert warm is not None
        begun = time.perf_counter()
        data = self.archive.rank_blob(self.rank, warm.file, sha256=warm.sha256, size=warm.size, what="warm-up bytes")
        self.report["warmup_read_s"] = time.perf_counter() - begun
        return data

    def warmup_data(self) -> bytes:
        """The warm-up bytes, checked: the prefetched ones (waited for), else read now."""
        read, self._read = self._read, None  # taken once: the bytes are freed after the copy
        return self._read_bytes() if read is None else read.result()

    def expect(self) -> None:
        """From now until :meth:`map`, every allocation must repeat SAVE's warm-up, in order."""
        self.hook.expect(self.expected)

    def map(self, *, overlap: bool = False) -> None:
        """Check the warm-up's allocations against SAVE's, then map the region up to SAVE's
        final offset (and restore the warm-up's bytes when asked: with ``overlap``, on a
        thread while the graphs are built; :meth:`finish` joins it)."""
        import torch

        if self.anchor is None:  # a program without a warm-up: SAVE registered it before its first capture
            self.anchor = anchor_generator()
        torch.cuda.synchronize()
        self.check_trace()
        begun = time.perf_counter()
        self._restore_region()
        self.report["map_to_s"] = time.perf_counter() - begun
        if self.warmup != "restore":
            return
        if not overlap:
            self._restore_bytes()
            return
        context = cu("cuCtxGetCurrent")
        self._copy = on_thread("foundry-warmup", self._restore_bytes, context)

    def _restore_region(self) -> None:
        """Map SAVE's ranges up to its final offset; a LOAD repeating the warm-ups leaves
        SAVE's allocations between captures to them (:mod:`foundry.runtime.sessions.placement`)."""
        info = self.hook.region()
        self.placement = restore_plan(self.record.trace, info.cursor, self.record.final_offset,
                                      warmups_repeated=self.warmup == "replay")  # fmt: skip
        late = [Allocation(a.order, a.offset, a.size, a.request, False, False, LATE) for a in self.placement.late]
        self.hook.restore(list(self.placement.ranges), self.placement.final_offset, late,
                          follow=self.placement.follow)  # fmt: skip
        self._restored_at = self.hook.region().allocations
        self.report["late_allocations"] = len(late)

    def check_followed(self, *, complete: bool = False) -> None:
        """Refuse a LOAD whose allocations since the restore left SAVE's late ones (a
        divergence the hook logged), or, once ``complete``, made fewer of them."""
        if self.placement is None or not self.placement.follow:
            return
        info = self.hook.region()
        if not info.diverged and not (complete and info.late_made < info.late_expected):
            return
        live = [a for a in self.hook.trace()[self._restored_at :] if a.phase == LATE]
        check_followed(self.placement, live, complete=complete)
        raise DriftError("an allocation departed from SAVE's trace after the restore", field="region.trace",
                         found=self.hook.errors()[-1:])  # fmt: skip

    def finish(self, *, quiet: bool = False) -> None:
        """Wait for the warm-up bytes a thread restores, if one does, and raise its error
        unless ``quiet``."""
        if self._copy is None:
            return
        copy, self._copy = self._copy, None
        error = copy.exception()
        if error is not None and not quiet:
            raise error

    def check_trace(self) -> None:
        """Refuse a warm-up whose allocations left SAVE's trace, naming the first that did."""
        actual = self.hook.trace()
        index = self.hook.trace_diverges(self.expected, actual)
        if index is not None:
            got = actual[index]
            want = self.expected[index] if index < len(self.expected) else None
            raise DriftError(
                f"allocation #{index} diverges from SAVE's warm-up trace",
                field="region.trace",
                expected=None if want is None else f"{want.request} bytes at offset {want.offset}",
                found=f"{got.request} bytes at offset {got.offset}",
            )
        if len(actual) != len(self.expected):
            raise DriftError(
                "the warm-up made fewer allocations than SAVE's",
                field="region.trace",
                expected=len(self.expected),
                found=len(actual),
            )

    def _restore_bytes(self, context: Any = None) -> None:
        import torch

        warm = self.record.warmup_bytes
        assert warm is not None and self.placement is not None
        if context is not None:  # another thread: the driver's current context is per thread
            cu("cuCtxSetCurrent", context)
        begun = time.perf_counter()
        data = self.warmup_data()
        read = time.perf_counter()
        holes = [(a.offset, a.size) for a in self.placement.late]  # not mapped yet: the program makes them
        for offset, size in outside(warm.offset, len(data), holes):
            self._copy_back(data, offset, size)
        if holes or self.again:
            self._kept = data
        torch.cuda.default_generators[self.device].set_offset(warm.generator_offset)
        self.report.update(warmup_bytes=len(data), warmup_wait_s=read - begun,
                           warmup_copy_s=time.perf_counter() - read)  # fmt: skip

    def _copy_back(self, data: bytes, offset: int, size: int) -> None:
        """SAVE's bytes of region ``[offset, offset + size)``, which ``data`` holds from the
        warm-up's offset on. The driver reads straight from the bytes object (alive until
        the call returns): no copy."""
        warm = self.record.warmup_bytes
        assert warm is not None
        start = ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value
        cu("cuMemcpyHtoD", self.record.base + offset, start + offset - warm.offset, size)

    def restore_again(self) -> None:
        """(``--warmup restore``, at finish) SAVE's bytes into what the program made again after
        the first copy: its between allocations and the ranges in :attr:`again`, as far as
        the warm-up's bytes reach (memory below them held the program's own bytes at SAVE
        as well, and no LOAD restores it)."""
        data, self._kept = self._kept, None
        if data is None or self.placement is None:
            return
        warm = self.record.warmup_bytes
        assert warm is not None
        end = warm.offset + len(data)
        ranges = [*self._filled_holes(), *self.again]
        for offset, size in ranges:
            first, last = max(offset, warm.offset), min(offset + size, end)
            if first < last:
                self._copy_back(data, first, last - first)
        self.report["restored_again"] = len(ranges)

    def _filled_holes(self) -> list[tuple[int, int]]:
        """``(offset, size)`` of SAVE's between allocations the program made again and still
        holds (one it freed again is unmapped: nothing to copy into)."""
        assert self.placement is not None
        held = {a.offset for a in self.hook.trace()[self._restored_at :] if not a.freed}
        return [(a.offset, a.size) for a in self.placement.late if a.offset in held]


def outside(start: int, size: int, holes: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``(offset, size)`` spans of ``[start, start + size)`` that none of ``holes`` (ascending,
    disjoint ``(offset, size)``) covers."""
    spans, at, end = [], start, start + size
    for offset, length in holes:
        if offset > at:
            spans.append((at, min(offset, end) - at))
        at = max(at, offset + length)
    if at < end:
        spans.append((at, end - at))
    return [(o, n) for o, n in spans if n > 0]
