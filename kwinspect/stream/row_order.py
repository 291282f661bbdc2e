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

from bisect import bisect_left
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
    """(key, arrival, row) entries, sorted when rows are asked for.

    Rows arrive nearly in key order and are asked for every few dozen packets: appending
    them and sorting at a release (timsort merges the sorted rest and the new run in
    about linear time) costs less than a heap push and pop per row, and (key, arrival)
    being unique, gives the same order."""

    __slots__ = ("_held", "_seq", "max_rows")

    def __init__(self, max_rows: int | None = None) -> None:
        self._held: list[tuple[int, int, Any]] = []
        self._seq = 0
        self.max_rows = max_rows or MAX_HELD_ROWS  # read now: tests lower the module's value

    def __len__(self) -> int:
        return len(self._held)

    def push(self, key: int, row: Any) -> None:
        self._seq += 1
        self._held.append((key, self._seq, row))

    def push_keyed(self, keyed: list[tuple[int, Any]]) -> None:
        """push(key, row) for each (key, row) of ``keyed``, in that order."""
        seq = self._seq
        self._held.extend([(key, seq := seq + 1, row) for key, row in keyed])
        self._seq = seq

    def pop_ready(self, watermark: int) -> list[Any]:
        """The rows whose key is below ``watermark``, in order; then, while more than
        ``max_rows`` are held, the oldest of the rest."""
        held = self._held
        if not held:
            return []
        held.sort()  # (key, arrival) is unique: rows are never compared
        # (watermark,) sorts before every entry of that key: the first one not ready
        cut = max(bisect_left(held, (watermark,)), len(held) - self.max_rows)
        out = [entry[2] for entry in held[:cut]]
        del held[:cut]
        return out

    def pop_all(self) -> list[Any]:
        """Every row held, in order (the end of the input)."""
        held = self._held
        held.sort()
        out = [entry[2] for entry in held]
        held.clear()
        return out
