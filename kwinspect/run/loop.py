"""The one loop that drives a Dissector: read packets, feed them, hand on the rows.

Every front end that reads packets runs it: capture files (run/files.py), the TUI
indexer, live capture (run/live.py) and each Spark connection (--jobs workers are fed
batches by one reader instead, run/split.py, and call the same Dissector API)::

    loop = PacketLoop(Dissector(config))
    for row in loop.run(packets):   # Exchange / ErrorRow values in capture order
        ...

What differs between them is a hook, not a copy of the loop:

- ``feed(raw)``: how a packet reaches the dissector (``feed_packet`` unless overridden);
- ``label(event)``: what is held for an event (the TUI attaches its raw frames the
  moment the event completes; ``label_batches=True``: a label may be made at the end of
  the compiled loop's batch instead, in completion order, which spares the loop a return
  per packet that completes rows);
- ``collect``/``mark``: where completed rows and watermarks go (ordered here with
  stream/row_order.RowOrder, or elsewhere: a Spark connection keeps them);
- ``tick(count)``: every 1024 packets (progress, cancel; True abandons the run:
  no more packets are read and the dissector is not finished);
- ``ordered=False``: rows in completion order (live capture), ``eager=True``: rows
  released as soon as they are in order (a pipe read as it arrives).

A ``None`` in ``packets`` is an idle tick from a live source: ready rows are
released and ``None`` is passed on, so the consumer can flush its output.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from kwinspect.capture.readers import PacketSource, RecordChunk
from kwinspect.dissect import Dissector
from kwinspect.model import ErrorRow
from kwinspect.stream.row_order import END, WATERMARK_EVERY, RowOrder

# consecutive unparseable records (checked per 1024) after which a capture is given up
MAX_UNPARSEABLE_RUN = 64 * 1024
TICK_EVERY = 1024  # packets between two tick() calls (a power of two: the test is a mask)
_END = object()  # the end of the packets


class PacketLoop:
    """Drive ``dissector`` over packets; ``run()`` yields what ``label`` made of each row."""

    def __init__(self, dissector: Dissector, *, label: Callable[[Any], Any] | None = None,
                 tick: Callable[[int], bool | None] | None = None, ordered: bool = True,
                 eager: bool = False, stop_unparseable: bool = True, name: str = "the capture",
                 label_batches: bool = False) -> None:
        self.dissector = dissector
        self.label = label
        self.label_batches = label_batches
        self.on_tick = tick
        self.ordered = ordered
        self.eager = eager
        self.stop_unparseable = stop_unparseable
        self.name = name  # for the row that says why reading stopped
        self.count = 0  # packets read
        self.rows = RowOrder()
        self.out: list[Any] = []  # rows released, handed on by run()

    # -- hooks --------------------------------------------------------------------------

    def feed(self, raw: Any) -> None:
        self.dissector.feed_packet(raw)

    def collect(self, pos: Any) -> None:
        """The dissector has rows: hold them (or hand them on) under ``pos`` when they
        carry no packet of their own."""
        label, push = self.label, self.rows.push
        events = self.dissector.drain()
        if not self.ordered:
            self.out.extend(events if label is None else map(label, events))
            return
        for ev in events:
            push(ev.order or pos, ev if label is None else label(ev))

    def _collect_marked(self, base: int, marks: list[int]) -> None:
        """collect() for the rows of a batch of packets fed by feed_chunk with ``marks``:
        each row under its own packet's position, ``base + marks[i]``, as collect(pos) at
        that packet would have filed it."""
        events = self.dissector.drain()
        label = self.label
        if label is not None:  # (label_batches: made now, in completion order as collect does)
            self.rows.push_keyed([(ev.order or base + k, label(ev)) for k, ev in zip(marks, events, strict=True)])
            return
        self.rows.push_keyed([(ev.order or base + k, ev) for k, ev in zip(marks, events, strict=True)])

    def mark(self, ts: float) -> None:
        """WATERMARK_EVERY packets went by: release the rows no row still to come precedes."""
        if self.ordered:
            self.out.extend(self.rows.pop_ready(self.dissector.watermark(ts)))

    def tick(self, count: int) -> bool:
        """Every TICK_EVERY packets; True abandons the run (nothing more is yielded)."""
        return bool(self.on_tick(count)) if self.on_tick is not None else False

    def end(self) -> None:
        """Input ended: finish the dissector and release everything held."""
        self.dissector.finish()
        self.collect(END)
        if self.ordered:
            self.out.extend(self.rows.pop_all())

    # -- the loop -------------------------------------------------------------------------

    def run(self, packets: Iterable[Any]) -> Iterator[Any]:
        for batch in self.batches(packets):
            if batch is None:
                yield None
            else:
                yield from batch

    def batches(self, packets: Iterable[Any]) -> Iterator[list[Any] | None]:
        """run() a list at a time: the rows released together (never an empty list), and
        None for an idle tick. The same rows at the same moments as run(); a consumer that
        takes them per list (the CLI's writers) saves a generator step per row."""
        d = self.dissector
        feed = d.feed_packet if type(self).feed is PacketLoop.feed else self.feed
        # A capture file's reader and a dissector with the compiled packet loop: the records
        # of the reader's buffer are fed in C (Dissector.feed_chunk), which comes back here
        # at every packet where this loop acts (rows, watermark, tick); anything else, one
        # packet at a time. Both give the same rows, counters and ticks.
        chunked = type(self).feed is PacketLoop.feed and isinstance(packets, PacketSource) and d.takes_chunks
        # Rows in order and released only at watermarks: the compiled loop need not come
        # back at every packet that completes rows (~300k times on a busy capture), only
        # at the watermark or tick, with the packet of each row in ``marks``
        # (_collect_marked files them as collect would have, packet by packet).
        marks: list[int] | None = None
        if (chunked and self.ordered and not self.eager and (self.label is None or self.label_batches)
                and type(self).collect is PacketLoop.collect):
            marks = []
        items = iter(packets.records() if chunked else packets)
        feed_chunk = d.feed_chunk
        collect, mark, out = self.collect, self.mark, self.out
        eager = self.eager and self.ordered
        pstats = d.parser.stats
        bad_before = bad_run = 0
        count = self.count
        pending = d.pending  # the same list for the whole run (Dissector.pending)
        chunk = None  # a RecordChunk being fed
        while True:
            if chunk is not None:
                # up to the next packet where a watermark or a tick is due
                taken = feed_chunk(chunk, min(WATERMARK_EVERY - count % WATERMARK_EVERY,
                                              TICK_EVERY - (count & (TICK_EVERY - 1))), marks)
                if not taken:
                    chunk = None
                    continue
                if marks:
                    self._collect_marked(count, marks)
                    marks.clear()
                count += taken
                last = chunk  # .ts: the last record's
            else:
                raw = next(items, _END)
                if raw is _END:
                    break
                if raw is None:  # a live source is idle: hand on what is ready, then the tick
                    d.idle()  # (TLS connections waiting for a growing key log look at it again)
                    if pending:
                        collect(count)
                    self.mark(d.last_ts)
                    if out:
                        self.out = []
                        yield out
                        out = self.out
                    yield None
                    continue
                if type(raw) is RecordChunk:
                    chunk = raw
                    continue
                feed(raw)
                count += 1
                last = raw
            if pending:  # most packets complete no row
                collect(count)
                if eager:
                    mark(last.ts)
                if out:
                    self.out = []
                    yield out
                    out = self.out
            if count % WATERMARK_EVERY == 0:
                mark(last.ts)
                if out:
                    self.out = []
                    yield out
                    out = self.out
            if count & (TICK_EVERY - 1) == 0:
                self.count = count
                if self.tick(count):
                    return  # abandoned (cancelled, or handed to another reader)
                if self.stop_unparseable:
                    # a long run of records that are no packet at all (a gzip of zeros
                    # inflates to billions of empty records): stop instead of running for minutes
                    bad = pstats.unparseable
                    bad_run = bad_run + TICK_EVERY if bad - bad_before == TICK_EVERY else 0
                    bad_before = bad
                    if bad_run >= MAX_UNPARSEABLE_RUN:
                        self.rows.push(count, ErrorRow(kind="corrupt_capture", message=(
                            f"{self.name}: {bad_run:,} records in a row are not packets "
                            f"that can be parsed; reading stopped after {count:,} records")))
                        break
        self.count = count
        self.end()
        out = self.out
        if out:
            self.out = []
            yield out
