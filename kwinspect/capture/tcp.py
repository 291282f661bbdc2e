"""TCP reassembly: segments in, ordered per-direction byte streams out.  IO-free.

    r = TcpReassembler()
    for seg in segments:                 # capture.packets.TcpSegment, in capture order
        for ev in r.feed(seg): ...
        # now and then: r.flush_idle(seg.ts)
    for ev in r.finish(): ...

Events, per connection: one StreamOpened, then StreamData / StreamGap /
StreamIssue in stream order for each direction, then one StreamClosed.

Rules
- Sequence numbers are unwrapped to unbounded integers relative to the
  direction's next expected byte, so wrap-around at 2**32 is invisible.
- Out-of-order segments wait in a per-direction buffer; retransmissions and
  overlaps are trimmed: the first copy of a byte wins, and a later copy that
  differs is reported (`tcp_overlap_conflict`), never substituted.
- Lost data is never zero-filled: it becomes a StreamGap with its length, when
  (a) the peer acknowledges bytes the capture never held (data after the
  hole is buffered, or the FIN is) and they do not appear within
  `ack_gap_delay` seconds of packet time, (b) a buffer cap is reached, or (c) the connection
  closes / idles out / the input ends and a hole remains below the highest
  sequence number seen (or acknowledged by the peer).
- A connection without a SYN in the capture starts at the first sequence
  number seen in each direction; client/server are then unknown (None).
- Memory is bounded: out-of-order bytes per direction (`max_ooo_bytes`), in
  total (`max_total_buffered`), the number of live connections
  (`max_connections`) and the per-direction window kept to compare
  retransmitted bytes (`overlap_check_bytes`).  Closed connections are
  forgotten after `closed_linger` seconds of packet time.

Stream numbers: every connection also gets tshark's `tcp.stream` index
(StreamOpened.tcp_stream, see TcpStreamNumbers), so rows can point at it in Wireshark.

Accounting, per direction (DirectionStats, available on StreamClosed.stats):
    payload_bytes == delivered + duplicate_bytes + late_bytes + dropped_bytes + buffered
    delivered + gap_bytes == end - start     (the sequence space the capture saw)
`payload_bytes` is every captured payload byte fed for that direction.
"""

from __future__ import annotations

import socket
from bisect import bisect_right
from collections import OrderedDict, deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

from kwinspect import core, model

from .packets import ACK, FIN, RST, SYN, TcpSegment

__all__ = [
    "ConnId",
    "DirectionStats",
    "ReassemblerStats",
    "StreamClosed",
    "StreamData",
    "StreamEvent",
    "StreamGap",
    "StreamIssue",
    "StreamOpened",
    "TcpReassembler",
    "TcpStreamNumbers",
]

TCP_LATE_DATA = "tcp_late_data"
TCP_PORT_REUSE = "tcp_port_reuse"
TCP_OUT_OF_WINDOW = "tcp_out_of_window"
TCP_IGNORED_CLOSE = "tcp_ignored_close"  # a RST or FIN no real receiver would accept
MAX_TCP_STREAMS = 1_000_000  # 4-tuples whose stream numbers are remembered (see TcpStreamNumbers)

_MASK = 0xFFFFFFFF
_HALF = 1 << 31
_WRAP = 1 << 32


class ConnId(NamedTuple):
    """Stable id of one TCP connection: endpoints in canonical (sorted) order plus
    a serial number in the order connections were first seen (like tshark's tcp.stream).
    A 4-tuple reused after close gets a new serial."""

    a: model.Endpoint
    b: model.Endpoint
    serial: int

    def __str__(self) -> str:
        return f"{self.a}<->{self.b}#{self.serial}"


@dataclass(slots=True)
class StreamOpened:
    conn_id: ConnId
    client: model.Endpoint | None  # known when the SYN or SYN-ACK was seen
    server: model.Endpoint | None
    a: model.Endpoint  # source of the first segment seen
    b: model.Endpoint  # its destination
    ts: float
    syn_seen: bool
    tcp_stream: int | None = None  # tshark's tcp.stream of the opening segment (TcpStreamNumbers)


@dataclass(slots=True)
class StreamData:
    conn_id: ConnId
    src: model.Endpoint
    dst: model.Endpoint
    data: bytes
    ts: float  # timestamp of the segment that completed this data
    offset: int = 0  # offset of data[0] from the direction's first byte


@dataclass(slots=True)
class StreamGap:
    conn_id: ConnId
    src: model.Endpoint
    dst: model.Endpoint
    nbytes: int
    ts: float
    offset: int = 0  # stream offset where the lost bytes start
    reason: str = ""  # "acked" | "buffer_cap" | "close" | "end" | "idle" | ...


@dataclass(slots=True)
class StreamClosed:
    conn_id: ConnId
    ts: float
    reason: str  # "fin" | "rst" | "idle" | "end"
    stats: tuple[DirectionStats, ...] = ()
    # the endpoint whose FIN or RST came first: the side that ended the conversation
    # (None for idle/end); a client closing with requests in flight abandoned them
    closed_by: model.Endpoint | None = None


@dataclass(slots=True)
class StreamIssue:
    conn_id: ConnId
    issue: model.Issue
    ts: float


StreamEvent = StreamOpened | StreamData | StreamGap | StreamClosed | StreamIssue


class TcpStreamNumbers:
    """tshark's ``tcp.stream`` numbers: one per TCP conversation, from 0, in the order of
    each one's first packet, counting every TCP connection of the capture (not only Kafka
    ones, also a lone SYN or RST).

    tshark (4.0, packet-tcp.c) starts a stream at the first packet of a 4-tuple, and a
    new one on the same 4-tuple at a SYN without ACK whose sequence number differs from
    the base its sender's direction already has (that direction's first SYN, else its
    first packet's sequence number minus one). It never forgets a 4-tuple; this keeps
    ``max_streams`` of them and numbers no stream beyond (None).

    ``see(key, side, flags, seq)`` must be called at least for the first packet of each
    direction of each 4-tuple and for every SYN; more calls change nothing. ``key`` is
    any value naming the 4-tuple regardless of direction, ``side`` (0 or 1) the
    direction. TcpReassembler calls it at those points only (not per segment); the
    ``--jobs`` workers call it for the packets of other workers' connections.
    """

    __slots__ = ("_recs", "count", "max_streams")

    # One int per 4-tuple (memory: a million of them is ~150 MB with their keys): the
    # stream number + 1 in the low 21 bits (0: beyond max_streams), then each side's
    # base + 1 in 33 bits (0: that side not seen yet).
    _NUM_BITS = 21
    _NUM_MASK = (1 << 21) - 1
    _BASE_BITS = 33
    _BASE_MASK = (1 << 33) - 1

    def __init__(self, max_streams: int = MAX_TCP_STREAMS) -> None:
        if max_streams >= self._NUM_MASK:
            raise ValueError(f"max_streams must be below {self._NUM_MASK}")
        self._recs: dict = {}  # key -> packed record (see above)
        self.count = 0  # streams numbered so far
        self.max_streams = max_streams

    def see(self, key, side: int, flags: int, seq: int) -> int | None:
        """The stream number of this packet (None beyond ``max_streams``)."""
        shift = self._NUM_BITS + side * self._BASE_BITS
        rec = self._recs.get(key)
        if rec is not None:
            base = (rec >> shift) & self._BASE_MASK
            number = (rec & self._NUM_MASK) - 1
            if not base:
                base = (seq if flags & SYN else (seq - 1) & _MASK) + 1
                self._recs[key] = rec | base << shift
                return number if number >= 0 else None
            if flags & (SYN | ACK) != SYN or seq + 1 == base:
                return number if number >= 0 else None
        elif len(self._recs) >= self.max_streams:
            return None
        # the first packet of a 4-tuple, or a new connection on one tshark already knows
        number = None
        if self.count < self.max_streams:
            number = self.count
            self.count += 1
        base = (seq if flags & SYN else (seq - 1) & _MASK) + 1
        self._recs[key] = (0 if number is None else number + 1) | base << shift
        return number

    def known(self) -> int:
        """How many 4-tuples are remembered (at most ``max_streams``)."""
        return len(self._recs)

    def knows_direction(self, key: bytes, rkey: bytes) -> bool:
        """True when the direction ``key`` (``rkey``: the other one) has been seen: a packet
        of it that is not a SYN would change nothing."""
        if key <= rkey:
            rec = self._recs.get(key)
            shift = self._NUM_BITS
        else:
            rec = self._recs.get(rkey)
            shift = self._NUM_BITS + self._BASE_BITS
        return rec is not None and bool((rec >> shift) & self._BASE_MASK)


# The compiled twin of TcpStreamNumbers (_cstreams.c beside this module: the same answers in
# ~40 bytes per 4-tuple instead of ~150), or None for the pure-Python core.
_cstreams = core.load("kwinspect.capture._cstreams")


def new_stream_numbers(max_streams: int = MAX_TCP_STREAMS) -> TcpStreamNumbers:
    """A TcpStreamNumbers, compiled when the core is (keys: ``pair_key`` values only)."""
    if _cstreams is not None:
        return _cstreams.StreamNumbers(max_streams)
    return TcpStreamNumbers(max_streams)


def pair_key(a: model.Endpoint, b: model.Endpoint) -> bytes:
    """A compact key for the 4-tuple of ``a`` and ``b`` in this order (TcpStreamNumbers)."""
    return endpoint_key(a) + endpoint_key(b)


_EP_BYTES: dict[model.Endpoint, bytes] = {}


def endpoint_key(ep: model.Endpoint) -> bytes:
    """The packed address and port of an endpoint, as they are in the packet (cached)."""
    key = _EP_BYTES.get(ep)
    if key is None:
        if len(_EP_BYTES) > 100_000:
            _EP_BYTES.clear()
        fam = socket.AF_INET6 if ":" in ep.ip else socket.AF_INET
        key = _EP_BYTES[ep] = socket.inet_pton(fam, ep.ip) + ep.port.to_bytes(2, "big")
    return key


@dataclass(slots=True)
class DirectionStats:
    src: model.Endpoint
    dst: model.Endpoint
    segments: int = 0
    payload_bytes: int = 0  # captured payload bytes fed (what the capture holds)
    missing_bytes: int = 0  # bytes the snaplen cut (they end up inside gaps)
    delivered: int = 0  # bytes emitted as StreamData
    gap_bytes: int = 0  # bytes emitted as StreamGap
    gaps: int = 0
    duplicate_bytes: int = 0  # retransmitted / overlapping copies (first copy won)
    late_bytes: int = 0  # arrived after their range was declared a gap, or before the start
    dropped_bytes: int = 0  # outside the plausible window, not placed (reported)
    buffered: int = 0  # held out of order right now
    conflicts: int = 0  # overlapping copies whose bytes differed
    start: int = 0  # unwrapped sequence number of the first stream byte
    end: int = 0  # unwrapped sequence number after the last byte delivered or gapped

    def balanced(self) -> bool:
        """True when both accounting identities hold (see module docstring)."""
        return (self.payload_bytes == self.delivered + self.duplicate_bytes + self.late_bytes
                + self.dropped_bytes + self.buffered
                and self.delivered + self.gap_bytes == self.end - self.start)


@dataclass(slots=True)
class ReassemblerStats:
    connections: int = 0
    closed: int = 0
    segments: int = 0
    after_close_bytes: int = 0  # payload for connections already closed (retransmissions)
    stray_segments: int = 0  # RST / empty segments for unknown connections (ignored)
    evicted: int = 0  # connections closed early because of max_connections
    cap_skips: int = 0  # times a buffer cap forced a gap
    ignored_closes: int = 0  # RSTs / FINs outside the receiver's window (connection went on)
    totals: DirectionStats = field(default_factory=lambda: DirectionStats(
        model.Endpoint("*", 0), model.Endpoint("*", 0)))


# (TcpReassembler._close adds them up written out: keep the two lists the same)
_SUM_FIELDS = ("segments", "payload_bytes", "missing_bytes", "delivered", "gap_bytes", "gaps",
               "duplicate_bytes", "late_bytes", "dropped_bytes", "conflicts")


class _Half:
    """One direction of a connection (the bytes `src` sends)."""

    __slots__ = ("src", "dst", "st", "started", "syn_seen", "isn", "nxt", "ooo_s", "ooo_d",
                 "recent", "recent_bytes", "recent_gaps", "fin_at", "fin_done", "max_end",
                 "peer_ack", "issue_count", "hole_since", "hole_limit")

    def __init__(self, src: model.Endpoint, dst: model.Endpoint) -> None:
        self.src = src
        self.dst = dst
        self.st = DirectionStats(src, dst)
        self.started = False
        self.syn_seen = False
        self.isn = -1
        self.nxt = 0
        # sorted starts of buffered chunks (non-overlapping) and the chunks: lists of their
        # own while something is buffered, else the shared empty tuple (most directions
        # never hold a byte out of order, and two empty lists were 112 bytes each)
        self.ooo_s: list[int] | tuple = ()
        self.ooo_d: list[bytes] | tuple = ()
        # created on first use: an empty deque is ~380 bytes, and a SYN flood makes
        # hundreds of thousands of halves that never carry a byte
        self.recent: deque[tuple[int, bytes]] | None = None  # delivered tail, for overlap checks
        self.recent_bytes = 0
        self.recent_gaps: deque[tuple[int, int]] | None = None  # the last 32 gaps
        self.fin_at: int | None = None
        self.fin_done = False
        self.max_end = 0
        self.peer_ack: int | None = None
        self.issue_count = 0
        self.hole_since: float | None = None  # when the peer first acked past a hole
        self.hole_limit = 0

    def start_at(self, seq: int) -> None:
        self.started = True
        self.nxt = seq
        self.max_end = seq
        self.st.start = seq
        self.st.end = seq

    def unwrap(self, seq32: int) -> int:
        d = (seq32 - self.nxt) & _MASK
        if d >= _HALF:
            d -= _WRAP
        return self.nxt + d


class _TcpConnection:
    __slots__ = ("cid", "h0", "h1", "client", "server", "syn_seen", "last_ts", "closed", "closed_by",
                 "close_reason", "after_close_bytes", "after_close_segments", "stream")

    def __init__(self, cid: ConnId, h0: _Half, h1: _Half, ts: float) -> None:
        self.cid = cid
        self.stream: int | None = None  # tshark's tcp.stream
        self.h0 = h0
        self.h1 = h1
        self.client: model.Endpoint | None = None
        self.server: model.Endpoint | None = None
        self.syn_seen = False
        self.last_ts = ts
        self.closed = False
        self.closed_by: model.Endpoint | None = None
        self.close_reason = ""
        # payload that arrived for this 4-tuple after it closed (reported when forgotten)
        self.after_close_bytes = 0
        self.after_close_segments = 0


class _Embryo:
    """A connection that has seen one bare SYN (no ACK, no data) and nothing since: what a
    _TcpConnection and its two _Halves would hold after that SYN, in about a tenth of their
    memory (a SYN flood makes hundreds of thousands of them). It keeps its place in the
    reassembler's LRU order; its next segment, an eviction, an idle flush or the end of
    input turn it into the _TcpConnection it stands for (TcpReassembler._wake) first."""

    __slots__ = ("cid", "src", "dst", "last_ts", "isn", "stream")

    def __init__(self, cid: ConnId, src: model.Endpoint, dst: model.Endpoint, ts: float, isn: int,
                 stream: int | None) -> None:
        self.cid = cid
        self.src = src  # the SYN's sender: the client
        self.dst = dst
        self.last_ts = ts
        self.isn = isn
        self.stream = stream


class TcpReassembler:
    """Per-connection, per-direction TCP reassembly.  IO-free; feed it segments in capture order.

    Parameters (defaults in brackets):
      max_ooo_bytes [4 MiB]: out-of-order bytes buffered per direction; beyond
          it the direction skips ahead to its buffered data (gap + issue).
      max_ooo_segments [16384]: out-of-order chunks buffered per direction, the
          same way: each chunk costs a list insert and ~80 bytes of objects, so
          millions of tiny out-of-order segments must not pass under the byte cap.
      max_total_buffered [256 MiB]: out-of-order bytes across all connections;
          beyond it the direction holding most is skipped ahead.
      max_connections [100_000]: live connections; beyond it the least
          recently active one is closed (reason "idle", with an issue). (200,000
          until issue 22's stage 7: a SYN flood then held ~430 MB; docs/limits.md)
      idle_timeout [600 s]: used by flush_idle(now).
      closed_linger [120 s]: how long a closed connection's 4-tuple absorbs
          retransmissions before a new segment opens a new connection.
      max_window [1 GiB]: a segment starting further than this beyond the next
          expected byte is implausible (bogus sequence number): dropped, counted, reported.
      overlap_check_bytes [16 KiB]: delivered bytes kept per direction to
          compare against retransmitted copies (conflict detection).
      max_issues_per_direction [20]: StreamIssue events per direction (counters keep counting).
      ack_gap_delay [0.002 s]: when the peer acknowledges bytes the capture lacks, wait
          this much packet time (checked on the connection's next segments) before
          declaring them a gap, so an ACK captured just before its data (merged
          interfaces, multi-queue NICs) does not cost data.  0 = declare at once.
    """

    # Slots, not an instance dict: the compiled driver (_cdriver.c) reads a dozen of these
    # per segment, at their offsets instead of by dict lookups.
    __slots__ = (
        "_buffered_total", "_buffering", "_closed", "_closed_front_ts", "_conns", "_dirs", "_embryos", "_holes",
        "_hot_a",
        "_hot_ab", "_hot_b", "_hot_ba", "_last_conn", "_last_evicted", "_serial", "ack_gap_delay",
        "closed_linger", "data_sink", "idle_timeout", "max_connections", "max_issues_per_direction",
        "max_ooo_bytes", "max_ooo_segments", "max_total_buffered", "max_window", "overlap_check_bytes",
        "stats", "streams",
    )

    def __init__(self, *, max_ooo_bytes: int = 4 << 20, max_total_buffered: int = 256 << 20,
                 max_connections: int = 100_000, idle_timeout: float = 600.0,
                 closed_linger: float = 120.0, max_window: int = 1 << 30,
                 overlap_check_bytes: int = 16 << 10, max_issues_per_direction: int = 20,
                 ack_gap_delay: float = 0.002, max_ooo_segments: int = 16384) -> None:
        self.max_ooo_bytes = max_ooo_bytes
        self.max_ooo_segments = max_ooo_segments
        self.max_total_buffered = max_total_buffered
        self.max_connections = max_connections
        self.idle_timeout = idle_timeout
        self.closed_linger = closed_linger
        self.max_window = max_window
        self.overlap_check_bytes = overlap_check_bytes
        self.max_issues_per_direction = max_issues_per_direction
        self.ack_gap_delay = ack_gap_delay
        self.stats = ReassemblerStats()
        self._dirs: dict[tuple[model.Endpoint, model.Endpoint], tuple[_TcpConnection, _Half, _Half]] = {}
        # LRU order; keyed by the _TcpConnection itself (identity hash: cheaper than hashing a ConnId)
        self._conns: OrderedDict[_TcpConnection | _Embryo, None] = OrderedDict()
        # connections that saw one bare SYN only, by their canonical 4-tuple (also in _conns,
        # not in _dirs: a segment for one misses _dirs and wakes it in _lookup_new)
        self._embryos: dict[tuple[model.Endpoint, model.Endpoint], _Embryo] = {}
        self._closed: OrderedDict[tuple[model.Endpoint, model.Endpoint], tuple[_TcpConnection, float]] = (
            OrderedDict())
        # the close time of _closed's first (oldest) entry, None when not known: most new
        # connections find it still lingering without making an iterator over _closed
        self._closed_front_ts: float | None = None
        self._buffered_total = 0
        # Halves holding out-of-order bytes / waiting out ack_gap_delay. Dicts, not sets:
        # iteration in insertion order, so the rows of a flush (and the direction the total
        # cap skips first, among equals) do not depend on where objects sit in memory.
        self._buffering: dict[_Half, None] = {}
        self._holes: dict[_Half, None] = {}
        self._serial = 0
        self.streams = new_stream_numbers()  # tshark's tcp.stream numbers (see StreamOpened.tcp_stream)
        # Optional callable(conn_id, src, dst, data, ts): takes the data of an in-order
        # segment instead of a StreamData event when no event of that segment comes
        # before it (so the order of everything stays the same), sparing an event
        # object per segment.  The Dissector sets it.
        self.data_sink = None
        # The connection of the last lookup, by the identity of its endpoint objects (the
        # parser hands out the same ones per address): both directions of it skip hashing
        # two endpoints per segment.  _close forgets it.
        self._hot_a: model.Endpoint | None = None
        self._hot_b: model.Endpoint | None = None
        self._hot_ab: tuple[_TcpConnection, _Half, _Half] | None = None
        self._hot_ba: tuple[_TcpConnection, _Half, _Half] | None = None
        self._last_conn: _TcpConnection | None = None  # already last in the LRU order
        self._last_evicted: tuple[ConnId, float] | None = None  # for the row counting the rest

    # ------------------------------------------------------------------ public
    def feed(self, seg: TcpSegment) -> list[StreamEvent]:
        """Process one segment; returns the events it caused (often one StreamData, or none)."""
        # The compiled driver (kwinspect/_cdriver.c) is the twin of the in-order branch
        # below, on these same fields: stats.segments, _hot_a/_hot_b/_hot_ab/_hot_ba,
        # _dirs, _last_conn, _conns, max_window, overlap_check_bytes, _buffered_total,
        # max_total_buffered, data_sink; a connection's last_ts and cid; a half's started,
        # nxt, max_end, ooo_s, recent, recent_bytes, fin_at, hole_since, peer_ack and st.
        # A change to them changes the C too (tests/test_core.py compares both cores'
        # state after every packet).
        out: list[StreamEvent] = []
        self.stats.segments += 1
        src = seg.src
        dst = seg.dst
        if src is self._hot_a and dst is self._hot_b:
            entry = self._hot_ab
        elif src is self._hot_b and dst is self._hot_a:
            entry = self._hot_ba
        else:
            entry = self._dirs.get((src, dst))
            if entry is None:
                entry = self._lookup_new(seg, out)
                if entry is None:
                    return out
            else:
                self._hot_a, self._hot_b, self._hot_ab = src, dst, entry
                self._hot_ba = (entry[0], entry[2], entry[1])
        conn, h, p = entry
        ts = seg.ts
        if ts > conn.last_ts:
            conn.last_ts = ts
        if conn is not self._last_conn:
            self._conns.move_to_end(conn)
            self._last_conn = conn
        flags = seg.flags
        seq = seg.seq
        st = h.st
        st.segments += 1
        if flags & (RST | FIN) and not self._close_acceptable(conn, h, p, seg, out):
            flags &= ~(RST | FIN)  # the segment's data and ACK still count; its close does not
        if flags & SYN:
            if not h.started:
                self._see(conn, h, flags, seq)
                h.syn_seen = True
                h.isn = seq
                h.start_at(seq + 1)
                if not conn.syn_seen or conn.client is None:
                    conn.syn_seen = True
                    if flags & ACK:
                        conn.server, conn.client = h.src, h.dst
                    else:
                        conn.client, conn.server = h.src, h.dst
            elif not flags & ACK and conn.closed is False and self._reused(conn, h, flags, seq):
                # a new connection on the same 4-tuple without a close we saw
                self._issue(conn, h, ts, out, TCP_PORT_REUSE,
                            "new SYN on a 4-tuple whose connection was not closed",
                            model.SEVERITY_WARNING)
                self._close(conn, ts, "end", out)
                entry = self._lookup_new(seg, out)
                if entry is None:
                    return out
                conn, h, p = entry
                st = h.st
                st.segments += 1
                h.syn_seen = True
                h.isn = seq
                h.start_at(seq + 1)
                conn.syn_seen = True
                conn.client, conn.server = h.src, h.dst
            seq = (seq + 1) & _MASK
        elif not h.started:
            self._see(conn, h, flags, seq)
            h.start_at(seq)  # the capture began after this direction's SYN
        payload = seg.payload
        missing = seg.missing
        if payload or missing:
            nxt = h.nxt
            d = (seq - nxt) & _MASK  # h.unwrap(seq) - nxt, inlined (twice per segment)
            if d >= _HALF:
                d -= _WRAP
            n = len(payload)
            data_sink = self.data_sink
            if not d and not missing and not h.ooo_s and n <= self.max_window:
                # the common case, _place + _deliver inlined: in order, nothing buffered
                st.payload_bytes += n
                e = nxt + n
                if e > h.max_end:
                    h.max_end = e
                if data_sink is not None and not out:
                    data_sink(conn.cid, h.src, h.dst, payload, ts)
                else:
                    out.append(StreamData(conn.cid, h.src, h.dst, payload, ts, nxt - st.start))
                recent = h.recent
                if recent is None:
                    recent = h.recent = deque()
                recent.append((nxt, payload))
                kept = h.recent_bytes + n
                keep = self.overlap_check_bytes
                while len(recent) > 1 and kept - len(recent[0][1]) >= keep:
                    kept -= len(recent.popleft()[1])
                h.recent_bytes = kept
                h.nxt = e
                st.delivered += n
                if e > st.end:
                    st.end = e
            else:
                self._place(conn, h, nxt + d, payload, missing, ts, out)
        if flags & ACK and p.started:
            a = (seg.ack - p.nxt) & _MASK  # p.unwrap(seg.ack), inlined
            if a >= _HALF:
                a -= _WRAP
            a += p.nxt
            peer_ack = p.peer_ack
            if peer_ack is None or a > peer_ack:
                if a - p.nxt <= self.max_window:
                    p.peer_ack = a
                    if p.ooo_s and a >= p.ooo_s[0]:
                        # the peer has received the hole's bytes: the capture lost them
                        self._acked_hole(conn, p, a, ts, out)
                    elif p.fin_at is not None and a > p.fin_at > p.nxt:
                        # the peer acknowledged the FIN: the bytes before it were lost
                        self._acked_hole(conn, p, p.fin_at, ts, out)
                    if p.fin_at is not None:
                        self._check_fin(p)
        if flags & FIN and h.fin_at is None:
            if conn.closed_by is None:
                conn.closed_by = src
            h.fin_at = h.unwrap((seq + len(payload) + seg.missing) & _MASK)
            if h.fin_at > h.max_end:
                h.max_end = h.fin_at
        if h.fin_at is not None:
            self._check_fin(h)
        if h.hole_since is not None or p.hole_since is not None:
            for x in (h, p):
                if x.hole_since is not None:
                    self._hole_timer(conn, x, ts, out)
        if flags & RST:
            if conn.closed_by is None:
                conn.closed_by = src
            self._close(conn, ts, "rst", out)
        elif h.fin_done and p.fin_done:
            self._close(conn, ts, "fin", out)
        if self._buffered_total > self.max_total_buffered:
            self._enforce_total(ts, out)
        return out

    def flush_idle(self, now: float) -> list[StreamEvent]:
        """Close connections with no segment for idle_timeout seconds before `now` (packet time)."""
        out: list[StreamEvent] = []
        for h in list(self._holes):
            entry = self._dirs.get((h.src, h.dst))
            if entry is None or h.hole_since is None:
                self._holes.pop(h, None)
            else:
                self._hole_timer(entry[0], h, now, out)
        limit = now - self.idle_timeout
        while self._conns:
            conn = next(iter(self._conns))
            if conn.last_ts >= limit:
                break
            if type(conn) is _Embryo:
                conn = self._wake(conn)
            self._close(conn, now, "idle", out)
        self._expire_closed(now, out)
        return out

    def finish(self) -> list[StreamEvent]:
        """End of input: flush every connection (remaining holes become gaps), reason "end"."""
        return [ev for events in self.finishing() for ev in events]

    def finishing(self) -> Iterator[list[StreamEvent]]:
        """finish(), one connection at a time: the events of each as it closes (the caller
        handles them before the next is closed: a SYN flood's 100,000 live connections,
        closed all at once, made ~80 MB of events and books first)."""
        for conn in sorted(self._conns, key=lambda c: c.cid.serial):
            out: list[StreamEvent] = []
            if type(conn) is _Embryo:
                conn = self._wake(conn)
            self._close(conn, conn.last_ts, "end", out)
            yield out
        out = []
        for conn, ts in self._closed.values():
            self._report_after_close(conn, ts, out)
        self._closed.clear()
        self._closed_front_ts = None
        more = self.stats.evicted - self.max_issues_per_direction
        if more > 0 and self._last_evicted is not None:
            cid, ts = self._last_evicted
            out.append(StreamIssue(cid, model.Issue(
                model.LIMIT_EXCEEDED, f"{more} more connections were closed early because more "
                f"than {self.max_connections} were live (not listed one by one)"), ts))
            self._last_evicted = None
        yield out

    def totals(self) -> DirectionStats:
        """Counters summed over every direction seen so far (open and closed)."""
        t = DirectionStats(self.stats.totals.src, self.stats.totals.dst)
        for f in _SUM_FIELDS:
            setattr(t, f, getattr(self.stats.totals, f))
        for conn in self._conns:
            if type(conn) is _Embryo:
                t.segments += 1  # its SYN; every other counter of it is 0
                continue
            for h in (conn.h0, conn.h1):
                for f in _SUM_FIELDS:
                    setattr(t, f, getattr(t, f) + getattr(h.st, f))
        t.buffered = self._buffered_total
        return t

    def open_connections(self) -> int:
        return len(self._conns)

    def buffered_bytes(self) -> int:
        return self._buffered_total

    # ------------------------------------------------------------------ connections
    def _see(self, conn: _TcpConnection, h: _Half, flags: int, seq: int) -> int | None:
        cid = conn.cid
        return self.streams.see(pair_key(cid.a, cid.b), 0 if h.src == cid.a else 1, flags, seq)

    def _reused(self, conn: _TcpConnection, h: _Half, flags: int, seq: int) -> bool:
        """A SYN without ACK on a direction already under way: a new connection on this
        4-tuple when tshark would start a new tcp.stream (its sequence number differs from
        the direction's base)."""
        number = self._see(conn, h, flags, seq)
        if number is not None:
            return number != conn.stream
        return h.syn_seen and seq != h.isn  # beyond the numbered streams

    def _lookup_new(self, seg: TcpSegment, out: list[StreamEvent]
                    ) -> tuple[_TcpConnection, _Half, _Half] | None:
        src, dst = seg.src, seg.dst
        canon = (src, dst) if src <= dst else (dst, src)
        if self._embryos:
            emb = self._embryos.get(canon)
            if emb is not None:  # its second segment: the connection it stands for goes on
                conn = self._wake(emb)
                self._conns[conn] = None  # (feed moves it to the end anyway)
                self._last_conn = conn
                self._dirs[(conn.h0.src, conn.h0.dst)] = (conn, conn.h0, conn.h1)
                self._dirs[(conn.h1.src, conn.h1.dst)] = (conn, conn.h1, conn.h0)
                return self._dirs[(src, dst)]
        side = 0 if src == canon[0] else 1
        if self._closed:
            self._expire_closed(seg.ts, out)
            lc = self._closed.get(canon)
            if lc is not None:
                if not (seg.flags & SYN and not seg.flags & ACK):
                    # retransmission / late segment of a closed connection
                    self.streams.see(pair_key(*canon), side, seg.flags, seg.seq)
                    conn = lc[0]
                    h = conn.h0 if conn.h0.src == src else conn.h1
                    n = len(seg.payload)
                    if n:
                        h.st.payload_bytes += n
                        h.st.late_bytes += n
                        self.stats.totals.payload_bytes += n
                        self.stats.totals.late_bytes += n
                        self.stats.after_close_bytes += n
                        conn.after_close_bytes += n
                        conn.after_close_segments += 1
                    return None
                del self._closed[canon]
                self._closed_front_ts = None  # it may have been the oldest
                self._report_after_close(lc[0], seg.ts, out)
        if seg.flags & RST and not seg.payload:
            self.stats.stray_segments += 1
            self.streams.see(pair_key(*canon), side, seg.flags, seg.seq)  # tshark numbers it all the same
            return None
        if len(self._conns) >= self.max_connections:
            victim = next(iter(self._conns))
            if type(victim) is _Embryo:
                victim = self._wake(victim)
            self.stats.evicted += 1
            if self.stats.evicted <= self.max_issues_per_direction:  # a flood: rows capped
                self._issue(victim, victim.h0, seg.ts, out, model.LIMIT_EXCEEDED,
                            f"more than {self.max_connections} live connections: "
                            "closing the least recently active one")
            self._last_evicted = (victim.cid, seg.ts)
            self._close(victim, seg.ts, "idle", out)
        cid = ConnId(canon[0], canon[1], self._serial)
        self._serial += 1
        self.stats.connections += 1
        flags = seg.flags
        if flags & (SYN | ACK | RST | FIN) == SYN and not seg.payload and not seg.missing:
            # a bare SYN (a new connection, or one of a flood): a compact record until its
            # next segment; feed has nothing more to do with this one (_wake does it later)
            stream = self.streams.see(pair_key(*canon), side, flags, seg.seq)
            emb = _Embryo(cid, src, dst, seg.ts, seg.seq, stream)
            self._conns[emb] = None
            self._embryos[canon] = emb
            self._last_conn = None  # the last in the LRU order is now the embryo
            out.append(StreamOpened(cid, src, dst, src, dst, seg.ts, True, stream))
            return None
        h0 = _Half(src, dst)
        h1 = _Half(dst, src)
        conn = _TcpConnection(cid, h0, h1, seg.ts)
        conn.stream = self.streams.see(pair_key(*canon), side, seg.flags, seg.seq)
        self._conns[conn] = None
        self._last_conn = conn
        self._dirs[(src, dst)] = entry = (conn, h0, h1)
        self._dirs[(dst, src)] = (conn, h1, h0)
        client = server = None
        if seg.flags & SYN:
            if seg.flags & ACK:
                client, server = dst, src
            else:
                client, server = src, dst
        out.append(StreamOpened(cid, client, server, src, dst, seg.ts, bool(seg.flags & SYN), conn.stream))
        return entry

    def _wake(self, emb: _Embryo) -> _TcpConnection:
        """The _TcpConnection an embryo stands for, as feed would have left it after the
        SYN; the embryo leaves _conns and _embryos (the caller places the connection)."""
        del self._conns[emb]
        cid = emb.cid
        del self._embryos[(cid.a, cid.b)]
        src, dst = emb.src, emb.dst
        h = _Half(src, dst)
        conn = _TcpConnection(cid, h, _Half(dst, src), emb.last_ts)
        conn.stream = emb.stream
        h.st.segments = 1
        h.syn_seen = True
        h.isn = emb.isn
        h.start_at(emb.isn + 1)
        conn.syn_seen = True
        conn.client, conn.server = src, dst
        return conn

    def _close(self, conn: _TcpConnection, ts: float, reason: str, out: list[StreamEvent]) -> None:
        if conn.closed:
            return
        for h in (conn.h0, conn.h1):
            if not h.started:
                continue
            # everything up to the highest sequence number seen; beyond it, what the
            # peer acknowledged (a lost tail).  max_end already covers a seen FIN, and
            # the ACK of a FIN is one higher than the data, so a known FIN caps it.
            limit = h.max_end
            if h.peer_ack is not None and h.peer_ack > limit and h.fin_at is None:
                limit = h.peer_ack
            self._skip_to(conn, h, limit, ts, out, reason if reason != "fin" else "close")
        conn.closed = True
        conn.close_reason = reason
        cid = conn.cid
        self._hot_a = self._hot_b = self._hot_ab = self._hot_ba = self._last_conn = None
        self._conns.pop(conn, None)
        self._dirs.pop((conn.h0.src, conn.h0.dst), None)
        self._dirs.pop((conn.h1.src, conn.h1.dst), None)
        tot = self.stats.totals
        holes = self._holes
        for h in (conn.h0, conn.h1):
            h.recent = None
            h.recent_bytes = 0
            h.hole_since = None
            if holes:
                holes.pop(h, None)
            # _SUM_FIELDS written out: once per direction of every connection, where
            # getattr/setattr by name cost more than the rest of the close
            st = h.st
            tot.segments += st.segments
            tot.payload_bytes += st.payload_bytes
            tot.missing_bytes += st.missing_bytes
            tot.delivered += st.delivered
            tot.gap_bytes += st.gap_bytes
            tot.gaps += st.gaps
            tot.duplicate_bytes += st.duplicate_bytes
            tot.late_bytes += st.late_bytes
            tot.dropped_bytes += st.dropped_bytes
            tot.conflicts += st.conflicts
        self.stats.closed += 1
        if reason in ("fin", "rst"):
            canon = (cid.a, cid.b)
            closed = self._closed
            if not closed:
                self._closed_front_ts = ts
            elif canon in closed:
                self._closed_front_ts = None  # it may have been the oldest
            closed[canon] = (conn, ts)
            closed.move_to_end(canon)
            while len(closed) > self.max_connections:
                self._closed_front_ts = None
                self._report_after_close(closed.popitem(last=False)[1][0], ts, out)
        out.append(StreamClosed(cid, ts, reason, (conn.h0.st, conn.h1.st),
                                conn.closed_by if reason in ("fin", "rst") else None))

    def _expire_closed(self, now: float, out: list[StreamEvent]) -> None:
        closed = self._closed
        limit = now - self.closed_linger
        front = self._closed_front_ts
        if front is not None and front >= limit:
            return  # the oldest closed connection still lingers
        while closed:
            k, (c, t) = next(iter(closed.items()))
            if t >= limit:
                self._closed_front_ts = t
                return
            del closed[k]
            self._report_after_close(c, now, out)
        self._closed_front_ts = None

    def _report_after_close(self, conn: _TcpConnection, ts: float, out: list[StreamEvent]) -> None:
        """One row for the bytes a closed connection absorbed (counted as late_bytes)."""
        if conn.after_close_bytes:
            out.append(StreamIssue(conn.cid, model.Issue(
                TCP_LATE_DATA,
                f"{conn.cid.a} <-> {conn.cid.b}: {model.plural(conn.after_close_bytes, 'byte')} in "
                f"{model.plural(conn.after_close_segments, 'segment')} arrived after the connection closed "
                f"({conn.close_reason}); not delivered, counted as late",
                severity=model.SEVERITY_WARNING), ts))
            conn.after_close_bytes = conn.after_close_segments = 0

    def _close_acceptable(self, conn: _TcpConnection, h: _Half, p: _Half, seg: TcpSegment,
                          out: list[StreamEvent]) -> bool:
        """Would the receiver accept this RST / FIN (RFC 5961 / RFC 9293 3.10.7)?

        The receiver's RCV.NXT is not on the wire; a capture sees both directions, so
        it lies between what the receiver acknowledged of `h` (h.peer_ack) and what
        `h` is known to have sent (h.max_end).  A RST must fall in that range (a
        real stack demands RCV.NXT exactly and answers anything else in its window
        with a challenge ACK: never a close).  A FIN must not end before the bytes
        the receiver already has (an old or forged FIN) nor beyond the plausible window.
        A direction seen for the first time (capture started mid-connection, or a
        RST answering a SYN) is judged by its ACK against the peer's sequence space.
        """
        flags = seg.flags
        if not h.started:
            # nothing of h known yet: the ACK must fit the peer's byte stream
            if not flags & ACK or not p.started:
                return True
            a = p.unwrap(seg.ack)
            lo = p.st.start - 1  # a RST answering a SYN acknowledges ISN + 1 = start
            hi = max(p.max_end, p.peer_ack or 0) + 1  # + 1: a FIN is acknowledged too
            if lo <= a <= hi:
                return True
            what = "RST" if flags & RST else "FIN"
            self.stats.ignored_closes += 1
            self._issue(conn, h, seg.ts, out, TCP_IGNORED_CLOSE,
                        f"{what} acknowledges sequence number {seg.ack}, outside what the peer "
                        "sent; ignored (no receiver would accept it)")
            return False
        s = h.unwrap(seg.seq)
        lo = h.nxt if h.peer_ack is None else min(h.nxt, h.peer_ack)
        hi = max(h.max_end, h.peer_ack or 0)
        if h.fin_at is not None:
            hi = max(hi, h.fin_at + 1)
        if flags & RST:
            if lo <= s <= hi:
                return True
            why = (f"RST at sequence number {seg.seq} is {s - hi} bytes beyond" if s > hi else
                   f"RST at sequence number {seg.seq} is {lo - s} bytes before")
            self.stats.ignored_closes += 1
            self._issue(conn, h, seg.ts, out, TCP_IGNORED_CLOSE,
                        f"{why} the receiver's window; ignored, the connection goes on")
            return False
        # a FIN comes after every byte its sender sent, so it never ends before the bytes
        # the capture already delivered in order (the receiver's RCV.NXT is at least there
        # unless the data were lost behind the capture point, and then it is retransmitted)
        fin = s + len(seg.payload) + seg.missing
        lo = h.nxt
        if h.fin_at is not None or (fin >= lo and fin - h.nxt <= self.max_window):
            return True
        self.stats.ignored_closes += 1
        self._issue(conn, h, seg.ts, out, TCP_IGNORED_CLOSE,
                    f"FIN at stream offset {fin - h.st.start} comes before bytes the receiver "
                    f"already has (offset {lo - h.st.start}) or far beyond them; ignored")
        return False

    # ------------------------------------------------------------------ data
    def _issue(self, conn: _TcpConnection, h: _Half, ts: float, out: list[StreamEvent], kind: str,
               message: str, severity: str = model.SEVERITY_WARNING, offset: int | None = None
               ) -> None:
        h.issue_count += 1
        if h.issue_count <= self.max_issues_per_direction:
            out.append(StreamIssue(conn.cid, model.Issue(
                kind, f"{h.src} -> {h.dst}: {message}", offset=offset, severity=severity), ts))

    def _deliver(self, conn: _TcpConnection, h: _Half, data: bytes, ts: float,
                 out: list[StreamEvent]) -> None:
        n = len(data)
        out.append(StreamData(conn.cid, h.src, h.dst, data, ts, h.nxt - h.st.start))
        if h.recent is None:
            h.recent = deque()
        h.recent.append((h.nxt, data))
        h.recent_bytes += n
        keep = self.overlap_check_bytes
        while len(h.recent) > 1 and h.recent_bytes - len(h.recent[0][1]) >= keep:
            h.recent_bytes -= len(h.recent.popleft()[1])
        h.nxt += n
        st = h.st
        st.delivered += n
        if h.nxt > st.end:
            st.end = h.nxt

    def _gap(self, conn: _TcpConnection, h: _Half, n: int, ts: float, out: list[StreamEvent],
             reason: str) -> None:
        st = h.st
        out.append(StreamGap(conn.cid, h.src, h.dst, n, ts, h.nxt - st.start, reason))
        if h.recent_gaps is None:
            h.recent_gaps = deque(maxlen=32)
        h.recent_gaps.append((h.nxt, h.nxt + n))
        h.nxt += n
        st.gap_bytes += n
        st.gaps += 1
        if h.nxt > st.end:
            st.end = h.nxt

    def _old_bytes(self, conn: _TcpConnection, h: _Half, s: int, data: bytes, ts: float,
                   out: list[StreamEvent]) -> None:
        """Classify payload that lies entirely below nxt: duplicate, late, or conflicting."""
        e = s + len(data)
        st = h.st
        late = 0
        if s < st.start:  # before the first byte we delivered (capture started mid-stream)
            late += min(e, st.start) - s
        for gs, ge in h.recent_gaps or ():
            lo, hi = max(s, gs), min(e, ge)
            if lo < hi:
                late += hi - lo
        late = min(late, len(data))
        if late:
            if not st.late_bytes:
                self._issue(conn, h, ts, out, TCP_LATE_DATA,
                            f"{model.plural(late, 'byte')} arrived for a range already reported as a gap or "
                            "before the stream's first byte (capture reordering, or a "
                            "buffer cap gave up on them); not delivered, counted as late",
                            model.SEVERITY_INFO, offset=s - st.start)
            st.late_bytes += late
        st.duplicate_bytes += len(data) - late
        if len(data) == 1 and s == h.nxt - 1:
            return  # a keep-alive probe carries one arbitrary byte: not a conflict
        for cs, cd in h.recent or ():  # first copy wins; report a differing copy
            ce = cs + len(cd)
            lo, hi = max(s, cs), min(e, ce)
            if lo < hi and data[lo - s:hi - s] != cd[lo - cs:hi - cs]:
                st.conflicts += 1
                self._issue(conn, h, ts, out, model.TCP_OVERLAP_CONFLICT,
                            f"retransmitted bytes at stream offset {lo - st.start} differ from "
                            "the copy already delivered (first copy kept)",
                            offset=lo - st.start)
                break

    def _place(self, conn: _TcpConnection, h: _Half, s: int, data: bytes, missing: int, ts: float,
               out: list[StreamEvent]) -> None:
        st = h.st
        n = len(data)
        st.payload_bytes += n
        st.missing_bytes += missing
        e = s + n
        if e + missing > h.max_end:
            if e + missing - h.nxt > self.max_window:
                st.dropped_bytes += n
                self._issue(conn, h, ts, out, TCP_OUT_OF_WINDOW,
                            f"segment of {n} bytes lies {s - h.nxt} bytes beyond the next "
                            "expected byte; dropped")
                return
            h.max_end = e + missing
        nxt = h.nxt
        if s == nxt and not h.ooo_s:  # the common case: in order, nothing buffered
            if n:
                self._deliver(conn, h, data, ts, out)
            if missing:  # the snaplen cut this segment: its tail is known lost
                self._gap(conn, h, missing, ts, out, "snaplen")
            return
        if e <= nxt:
            self._old_bytes(conn, h, s, data, ts, out)
            return
        if s < nxt:
            self._old_bytes(conn, h, s, data[:nxt - s], ts, out)
            data = data[nxt - s:]
            s = nxt
        if n:
            self._insert(conn, h, s, data, ts, out)
        self._drain(conn, h, ts, out)
        if h.ooo_s:
            if h.st.buffered > self.max_ooo_bytes or len(h.ooo_s) > self.max_ooo_segments:
                self.stats.cap_skips += 1
                self._issue(conn, h, ts, out, model.LIMIT_EXCEEDED,
                            f"more than {self.max_ooo_bytes} bytes or {self.max_ooo_segments} segments "
                            "out of order; skipping the hole before them")
                while h.ooo_s and (h.st.buffered > self.max_ooo_bytes
                                   or len(h.ooo_s) > self.max_ooo_segments):
                    self._skip_to(conn, h, h.ooo_s[0], ts, out, "buffer_cap")
            elif h.peer_ack is not None and h.ooo_s and h.peer_ack >= h.ooo_s[0]:
                self._acked_hole(conn, h, h.peer_ack, ts, out)

    def _insert(self, conn: _TcpConnection, h: _Half, s: int, data: bytes, ts: float,
                out: list[StreamEvent]) -> None:
        """Add [s, s+len) to the out-of-order buffer, keeping only bytes not yet buffered."""
        starts, chunks = h.ooo_s, h.ooo_d
        e = s + len(data)
        j = bisect_right(starts, s) - 1
        if j < 0:
            j = 0
        cur = s
        pieces: list[tuple[int, bytes]] = []
        st = h.st
        conflict_at = -1
        while cur < e:
            if j < len(starts) and starts[j] < e:
                cs = starts[j]
                cd = chunks[j]
                ce = cs + len(cd)
                if ce <= cur:
                    j += 1
                    continue
                if cs > cur:
                    pieces.append((cur, data[cur - s:cs - s]))
                    cur = cs
                hi = min(ce, e)
                if conflict_at < 0 and data[cur - s:hi - s] != cd[cur - cs:hi - cs]:
                    conflict_at = cur
                st.duplicate_bytes += hi - cur
                cur = hi
                j += 1
            else:
                pieces.append((cur, data[cur - s:] if cur > s else data))
                cur = e
        if conflict_at >= 0:
            st.conflicts += 1
            self._issue(conn, h, ts, out, model.TCP_OVERLAP_CONFLICT,
                        f"overlapping segment bytes at stream offset {conflict_at - st.start} "
                        "differ from the copy already buffered (first copy kept)",
                        offset=conflict_at - st.start)
        if not pieces:
            return
        if not starts:
            self._buffering[h] = None
            h.ooo_s = starts = []
            h.ooo_d = chunks = []
        for ps, pd in pieces:
            i = bisect_right(starts, ps)
            starts.insert(i, ps)
            chunks.insert(i, pd)
            st.buffered += len(pd)
            self._buffered_total += len(pd)

    def _drain(self, conn: _TcpConnection, h: _Half, ts: float, out: list[StreamEvent]) -> None:
        """Deliver buffered chunks that are now contiguous with nxt (as one StreamData)."""
        starts, chunks = h.ooo_s, h.ooo_d
        if not starts or starts[0] > h.nxt:
            return
        parts = []
        nxt = h.nxt
        k = 0
        total = 0
        while k < len(starts) and starts[k] <= nxt:
            cs, cd = starts[k], chunks[k]
            total += len(cd)
            ce = cs + len(cd)
            if ce > nxt:
                parts.append(cd[nxt - cs:] if cs < nxt else cd)
                nxt = ce
            else:  # cannot happen with trimmed inserts; keep the books straight anyway
                h.st.duplicate_bytes += len(cd)
            k += 1
        del starts[:k]
        del chunks[:k]
        h.st.buffered -= total
        self._buffered_total -= total
        if not starts:
            self._buffering.pop(h, None)
        if parts:
            self._deliver(conn, h, parts[0] if len(parts) == 1 else b"".join(parts), ts, out)

    def _skip_to(self, conn: _TcpConnection, h: _Half, limit: int, ts: float, out: list[StreamEvent],
                 reason: str) -> None:
        """Give up on holes below `limit`: gaps for them, buffered data delivered in order."""
        while h.nxt < limit or (h.ooo_s and h.ooo_s[0] <= h.nxt):
            if h.ooo_s and h.ooo_s[0] <= h.nxt:
                self._drain(conn, h, ts, out)
                continue
            nxt_chunk = h.ooo_s[0] if h.ooo_s else limit
            self._gap(conn, h, min(nxt_chunk, limit) - h.nxt, ts, out, reason)
        self._check_fin(h)

    def _acked_hole(self, conn: _TcpConnection, h: _Half, limit: int, ts: float,
                    out: list[StreamEvent]) -> None:
        """The peer acknowledged bytes below `limit` that the capture does not hold.
        Declare them lost now, or - with ack_gap_delay - once that much packet time has
        passed without them showing up (an ACK may be captured before its data when
        interfaces are merged)."""
        if h.fin_at is not None and limit > h.fin_at:
            limit = h.fin_at  # the ACK of a FIN is one above the last data byte
        if self.ack_gap_delay <= 0:
            self._skip_to(conn, h, limit, ts, out, "acked")
            return
        if h.hole_since is None:
            h.hole_since = ts
            self._holes[h] = None
        if limit > h.hole_limit:
            h.hole_limit = limit

    def _hole_timer(self, conn: _TcpConnection, h: _Half, now: float, out: list[StreamEvent]) -> None:
        limit = h.hole_limit if h.fin_at is None else min(h.hole_limit, h.fin_at)
        if h.nxt >= limit:  # the hole was filled after all
            h.hole_since = None
            self._holes.pop(h, None)
        elif now - h.hole_since >= self.ack_gap_delay:
            h.hole_since = None
            self._holes.pop(h, None)
            self._skip_to(conn, h, limit, now, out, "acked")

    def _check_fin(self, h: _Half) -> None:
        if h.fin_at is not None and not h.fin_done and h.nxt >= h.fin_at and not h.ooo_s:
            h.fin_done = True

    def _enforce_total(self, ts: float, out: list[StreamEvent]) -> None:
        while self._buffered_total > self.max_total_buffered and self._buffering:
            h = max(self._buffering, key=lambda x: x.st.buffered)
            entry = self._dirs.get((h.src, h.dst))
            if entry is None:  # pragma: no cover - closed halves never keep buffers
                self._buffering.pop(h, None)
                continue
            conn = entry[0]
            self.stats.cap_skips += 1
            self._issue(conn, h, ts, out, model.LIMIT_EXCEEDED,
                        f"more than {self.max_total_buffered} bytes buffered out of order "
                        "across connections; skipping this direction's holes")
            self._skip_to(conn, h, h.ooo_s[-1] if h.ooo_s else h.nxt, ts, out, "buffer_cap")
