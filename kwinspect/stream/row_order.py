"""Rows in capture order, in bounded memory.

The dissector emits an exchange when its response completes, so a slow request comes
out after faster ones that started later. ``RowOrder`` holds rows back and hands them
on sorted by a key, the number of the packet where each row's story starts (for an
exchange, the packet holding the request's first byte; see ``Exchange.order`` and
``ErrorRow.order``), once the driver says no row still to come can have a smaller key.
That bound, the *watermark*, is the oldest packet holding bytes of a message not yet
emitted (``Dissector.watermark``); it only grows.

Rows with equal keys keep the order they were pushed in, so one process and ``--jobs``
(which pushes the same rows in the same order) give the same output.

Memory: at most ``max_rows`` rows are held when the driver asks for the ready ones;
past that the oldest are handed on early. Requests pending longer than
``MAX_WAIT_SECONDS`` of capture time stop holding rows back. In both cases a row that
comes later sorts before rows already handed on: the only way the output is not in
key order.
"""

from __future__ import annotations

from heapq import heappop, heappush
from typing import Any

__all__ = ["END", "MAX_HELD_ROWS", "MAX_WAIT_SECONDS", "WATERMARK_EVERY", "RowOrder"]

MAX_HELD_ROWS = 100_000  # rows held back at most (exchanges carry their decoded bodies)
MAX_WAIT_SECONDS = 60.0  # a request pending longer (capture time) no longer holds rows back
END = 1 << 62  # the key of rows found at the end of the input (after every packet)
# Packets between two releases, the same in every driver (so --jobs releases what one
# process does). Small, so rows wait little: rows held across many allocations cost the
# garbage collector more than the look at the connections that changed.
WATERMARK_EVERY = 64


class RowOrder:
    """A min-heap of (key, arrival, row)."""

    __slots__ = ("_heap", "_seq", "max_rows")

    def __init__(self, max_rows: int | None = None) -> None:
        self._heap: list[tuple[int, int, Any]] = []
        self._seq = 0
        self.max_rows = max_rows or MAX_HELD_ROWS  # read now: tests lower the module's value

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, key: int, row: Any) -> None:
        self._seq += 1
        heappush(self._heap, (key, self._seq, row))

    def pop_ready(self, watermark: int) -> list[Any]:
        """The rows whose key is below ``watermark``, in order; then, while more than
        ``max_rows`` are held, the oldest of the rest."""
        heap = self._heap
        out = []
        while heap and (heap[0][0] < watermark or len(heap) > self.max_rows):
            out.append(heappop(heap)[2])
        return out

    def pop_all(self) -> list[Any]:
        """Every row held, in order (the end of the input)."""
        heap = self._heap
        out = [heappop(heap)[2] for _ in range(len(heap))]
        return out
