"""The driver: packets -> TCP streams -> frames -> exchanges and errors.

IO-free: it is fed packets (or TCP segments) with their timestamps and hands
back ``Exchange`` and ``ErrorRow`` values in capture order, so the offline CLI,
live capture, the TUI and Spark executors all run this same code.

    d = Dissector(DissectConfig(kafka_ports={9092}))
    for raw in packets: d.feed_packet(raw); handle(d.drain())
    d.finish(); handle(d.drain())

Front ends do not drive it by hand: kwinspect.run.loop.PacketLoop is the one loop
(files, --jobs workers, the TUI indexer, live capture). What a front end injects
(shared state, the set of proven brokers, a frame tap, an idle-check schedule)
goes through the constructor; nothing outside this module touches its private state.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, MutableSet
from dataclasses import dataclass, field
from heapq import heapify, heappop, heappush
from typing import TYPE_CHECKING, Any

from kwinspect import core
from kwinspect.capture import fastpath
from kwinspect.capture.keylog import KeyLog
from kwinspect.capture.packets import IP4_HEADER, TCP_HEADER, PacketParser, TcpSegment
from kwinspect.capture.readers import RawPacket, RecordChunk
from kwinspect.capture.tcp import (
    StreamClosed,
    StreamData,
    StreamGap,
    StreamIssue,
    StreamOpened,
    TcpReassembler,
)
from kwinspect.model import (
    NOT_KAFKA,
    TCP_GAP,
    TLS_DECRYPT_FAILED,
    TLS_DECRYPTED,
    TLS_STREAM,
    Endpoint,
    ErrorRow,
    Exchange,
    plural,
    stream_name,
)
from kwinspect.stream import conversation, detect, row_order
from kwinspect.stream.conversation import Conversation, SharedState
from kwinspect.stream.framing import (
    DEFAULT_MAX_FRAME_SIZE,
    Frame,
    FrameSplitter,
    FramingIssue,
    RequestValidator,
    ResponseValidator,
    Skipped,
)

if TYPE_CHECKING:  # imported where a TLS connection is first decrypted: cryptography costs every start ~14 ms
    from kwinspect.capture.tls import TlsSession

_new = tuple.__new__  # a TcpSegment without the namedtuple's Python-level __new__
_cdriver = core.load("kwinspect._cdriver")
# The compiled per-segment path (``_cdriver.c`` beside this module), or None: one in-order
# segment of a decided Kafka connection through feed_segment, TcpReassembler.feed,
# _on_data and FrameSplitter.feed, on the same objects' fields; it declines (None,
# nothing changed) whatever is not that ordinary case, and the Python path takes it.
segment_fastpath = _cdriver.segment if _cdriver is not None else None
# The compiled packet loop (``_cdriver.feed_chunk``), or None: the records of a reader's
# buffer (capture.readers.RecordChunk), each taken as feed_packet takes a RawPacket.
# (getattr: an extension built before stage 4a, not rebuilt after an update, keeps its
# per-segment path and loses only the loop, instead of failing the import)
chunk_fastpath = getattr(_cdriver, "feed_chunk", None)
DEFAULT_KAFKA_PORTS = frozenset({9092})
# Segments held, all connections together, by connections not yet known to carry Kafka
# (each holds up to stream.detect.DETECT_BUFFER bytes while it waits for an answer).
# A flood of connections that never decide would otherwise hold ~170 bytes per tiny
# segment on top of each connection; past this the oldest is given up as not Kafka.
MAX_HELD_SEGMENTS = 250_000

Event = Exchange | ErrorRow
# What a connection that carried no payload shares with every other (read-only: a SYN flood
# makes hundreds of thousands of them, and their own empty dicts and lists were ~500 bytes
# each); the first use puts a dict or list of its own in place (_on_data, _hold, _close...).
class _SharedDict(dict):
    """A dict no one may change (it is shared); pickled (--jobs workers) as a plain dict. Not
    exactly a dict, so the compiled driver declines it and the Python path puts a dict of
    the connection's own in its place."""

    __slots__ = ()

    def _read_only(self, *_args, **_kwargs):
        raise TypeError("a shared read-only dict: assign a dict of its own instead")

    __setitem__ = __delitem__ = __ior__ = clear = pop = popitem = setdefault = update = _read_only

    def __reduce__(self):
        return (dict, (dict(self),))


_NO_BYTES: Any = _SharedDict(to_broker=0, to_client=0)
_NO_MAPPING: Any = _SharedDict()
# on_frame(stream, direction, frame): every complete Kafka frame, before it is decoded
# (direction "request" or "response"); the TUI keeps them for its hex view.
FrameHook = Callable[[str, str, bytes], None]


@dataclass
class DissectConfig:
    """How to read a capture (the CLI's common flags)."""

    kafka_ports: frozenset[int] = DEFAULT_KAFKA_PORTS  # broker ports known up front
    detect: bool = True  # also find Kafka on any other port
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    redact: bool = True
    max_in_flight: int = 10_000
    idle_timeout: float = 600.0  # seconds of capture time before an idle connection is flushed
    # Closed connections whose ConnectionInfo (and conversation state) stays in
    # `Dissector.connections`; older ones are dropped so memory does not grow
    # with capture length. Their packets stay counted.
    keep_closed_connections: int = 10_000
    # TLS key material (NSS key log lines, pcapng Decryption Secrets Blocks): with
    # secrets in it, TLS connections are decrypted and decoded like plaintext ones.
    # None or empty: a TLS connection is reported (tls_stream) and counted, as before.
    tls_keys: KeyLog | None = None
    # Produce exchanges' bodies decoded only when something reads them (SharedState.defer_bodies):
    # for the commands that read none (exchanges, summary); the output is the same either way
    defer_bodies: bool = False


@dataclass(slots=True)  # (slots: the compiled driver reads kind, broker, bytes, packets per segment)
class ConnectionInfo:
    """What the summary and the TUI show about one TCP connection."""

    stream: str
    a: Endpoint
    b: Endpoint
    client: Endpoint | None = None
    broker: Endpoint | None = None
    kind: str = "undecided"  # kafka | tls | not_kafka | undecided
    first_ts: float | None = None
    last_ts: float | None = None
    syn_seen: bool = False
    # payload bytes per direction; until the first byte a shared read-only mapping of zeros
    bytes: dict[str, int] = field(default_factory=lambda: _NO_BYTES)
    gap_bytes: int = 0
    closed: str | None = None
    closed_by: str | None = None  # "client" | "broker": whose FIN or RST came first (fin/rst only)
    conversation: Conversation | None = None
    accounting: dict[str, dict[str, int]] = field(default_factory=lambda: _NO_MAPPING)  # (set at close)
    packets: int = 0  # captured packets (TCP segments, IP fragments included) of this connection
    tcp_stream: int | None = None  # tshark's tcp.stream number
    # TLS connections: e.g. "TLS 1.3, TLS_AES_128_GCM_SHA256 (decrypted)", or why it was not
    # decrypted; None for plaintext ones
    tls: str | None = None
    tls_decrypted: bool = False
    # TLS bytes per direction ("to_broker"/"to_client"): handshake, change_cipher_spec,
    # alert, application_data, undecryptable, buffered (they sum to the bytes sent)
    tls_bytes: dict[str, dict[str, int]] = field(default_factory=lambda: _NO_MAPPING)


class _ConnectionState:
    """The driver's state for one TCP connection (ConnectionInfo is what it shows)."""

    __slots__ = ("info", "held", "held_bytes", "splitters", "req_validator", "decided", "start", "tls",
                 "tls_client", "tls_held")

    def __init__(self, info: ConnectionInfo) -> None:
        self.info = info
        # (src, "data"|"gap", payload, ts, packet number) until decided (an empty tuple
        # until the first, and once decided: most connections of a flood hold nothing)
        self.held: list[tuple[Endpoint, str, Any, float, int]] | tuple = ()
        self.held_bytes = 0
        self.splitters: dict[Endpoint, FrameSplitter] = _NO_MAPPING  # a dict of its own once Kafka
        self.req_validator: RequestValidator | None = None
        self.decided = False
        self.start = 0  # the packet its oldest message still to come starts at, as last recorded (watermark)
        self.tls: TlsSession | None = None  # decrypting: the connection's TLS, fed its raw bytes
        self.tls_client: Endpoint | None = None  # the ClientHello's sender
        # decrypted data held while the other direction waits for its key (a growing key
        # log), so both directions reach framing in packet order: (src, plain, ts, pkt)
        self.tls_held: list[tuple[Endpoint, list[bytes], float, int]] | tuple = ()


@dataclass(slots=True)  # (slots: the compiled driver counts in it per packet)
class DissectStats:
    packets: int = 0
    tcp_packets: int = 0
    kafka_bytes: int = 0
    non_kafka_bytes: int = 0
    connections: int = 0
    kafka_connections: int = 0


class Dissector:
    """Feed packets, pull exchanges and errors.

    What front ends inject, all optional:

    - ``shared``: the topic-name and broker tables (Spark gives each connection's
      dissector a view of the capture-wide ones);
    - ``known_brokers``: the set of broker endpoints proven on some connection, which
      decides the direction of a connection on an undeclared port (--jobs workers
      record every question asked of it);
    - ``conversation_class``: the per-connection state (workers record lookups);
    - ``on_frame``: a tap on every complete frame (FrameHook);
    - ``on_close``: called with a connection's ConnectionInfo when it has closed and
      emitted its last rows;
    - ``keep_conversations=False``: a closed connection keeps only a
      ConversationSummary, not its Conversation (the TUI, with 100k+ connections);
    - ``idle_checks=False``: no idle flushes of its own; the caller calls
      ``flush_idle(ts)`` on its own schedule (Spark: the capture-wide one).
    """

    # The fields the compiled packet loop and per-segment driver (_cdriver.c) read or
    # write at every packet are slots, read at their member offsets; the rest stays in
    # the instance dict (kept, so subclasses and everything else work as before).
    __slots__ = ("stats", "parser", "tcp", "on_frame", "next_idle_check", "_events", "_dirty", "_last_ts",
                 "_conns", "_conn_by_tuple", "_hot_pair", "_hot_info", "_hot_cid", "_hot_conn",
                 "__dict__", "__weakref__")

    # in-order data goes straight to _on_data, without a StreamData per segment; a
    # subclass that watches every TCP event (--jobs workers) turns this off
    direct_data = True

    def __init__(self, config: DissectConfig | None = None, *, shared: SharedState | None = None,
                 known_brokers: MutableSet[Endpoint] | None = None,
                 conversation_class: type[Conversation] = Conversation, on_frame: FrameHook | None = None,
                 on_close: Callable[[ConnectionInfo], None] | None = None, keep_conversations: bool = True, idle_checks: bool = True) -> None:
        self.config = config or DissectConfig()
        self.parser = PacketParser()
        # the compiled packet fast path (capture/fastpath.py), None for the Python one
        self._c_segment = fastpath.tcp_segment
        self.tcp = TcpReassembler(idle_timeout=self.config.idle_timeout)
        if self.direct_data:
            self.tcp.data_sink = self._on_data
        # the compiled per-segment path, for the methods it is the twin of (a subclass that
        # changes one of them, or watches every TCP event, keeps the Python path)
        self._c_driver = self._c_driver_state = None
        cls = type(self)
        # the compiled packet loop over capture records (feed_chunk): the same, and a class
        # that keeps feed_packet as it is
        self._c_loop = self._c_loop_state = None
        if (segment_fastpath is not None and self._c_segment is not None and self.direct_data
                and cls.feed_segment is Dissector.feed_segment and cls._on_data is Dissector._on_data):
            self._c_driver = segment_fastpath
            self._c_driver_state = (self, self.tcp, deque, Frame, FrameSplitter)
            if chunk_fastpath is not None and cls.feed_packet is Dissector.feed_packet:
                self._c_loop = chunk_fastpath
                self._c_loop_state = (self, self.tcp, deque, Frame, FrameSplitter, RawPacket, TcpSegment,
                                      self.feed_segment, self._frames_to_conversation, self.flush_idle,
                                      self._feed_packet_python, conversation)
        self.conversation_class = conversation_class
        self.on_frame = on_frame
        self.on_close = on_close
        self.keep_conversations = keep_conversations
        self.idle_checks = idle_checks
        self.shared = shared if shared is not None else SharedState()
        if self.config.defer_bodies:
            self.shared.defer_bodies = True
        # TLS key material: the configured key log, plus secrets met in the capture
        self.tls_keys: KeyLog | None = self.config.tls_keys
        # TLS connections waiting for a secret a growing (watched) key log may still bring
        self._tls_waiting: dict[_ConnectionState, None] = {}
        self.stats = DissectStats()
        self.connections: dict[Any, ConnectionInfo] = {}
        self._conns: dict[Any, _ConnectionState] = {}
        # Dissector.watermark: connections whose data moved since the last look, and a
        # heap of (start packet, serial, connection), an entry valid while it is the
        # connection's recorded start (older ones are dropped when they reach the top)
        self._dirty: set[_ConnectionState] = set()
        self._starts: list[tuple[int, int, _ConnectionState]] = []
        self._start_serial = 0
        self._events: list[Event] = []
        self._last_ts = 0.0
        # capture time of the next idle flush: callers that skip advance() for speed
        # (--jobs workers) compare a packet's time with it first
        self.next_idle_check = 0.0 if idle_checks else float("inf")
        # broker endpoints proven on other connections
        self.known_brokers: MutableSet[Endpoint] = known_brokers if known_brokers is not None else set()
        self._closed_order: deque = deque()  # closed connection ids, oldest first
        # undecided connections holding segments, oldest first (MAX_HELD_SEGMENTS)
        self._undecided: dict[_ConnectionState, None] = {}
        self._held_segments = 0
        self._given_up = 0  # connections given up because of MAX_HELD_SEGMENTS
        self._pruned_packets = {"kafka": 0, "non_kafka": 0}  # of closed connections dropped from memory
        # No silent loss: every packet is counted once, see packet_counts().
        self._conn_by_tuple: dict[tuple[Endpoint, Endpoint], ConnectionInfo] = {}
        self._stray_packets = 0  # TCP segments the reassembler ignored (e.g. RST of an unknown connection)
        self._direct_segments = 0  # segments fed with feed_segment() rather than feed_packet()
        self._parser_issues_seen = 0  # parser issues already reported as ErrorRows
        # The last lookups of _conn_by_tuple and _conns, reused while the next segment has
        # the same endpoint objects / the next event the same ConnId object (hashing them
        # costs more per packet than all of framing a 1500-byte segment); reset whenever
        # an entry is added or removed.
        self._hot_pair: tuple | None = None
        self._hot_info: ConnectionInfo | None = None
        self._hot_cid: Any = None
        self._hot_conn: _ConnectionState | None = None

    # -- input ------------------------------------------------------------------------

    def feed_packet(self, raw) -> None:
        self.stats.packets += 1
        parser = self.parser
        pstats = parser.stats
        # PacketParser.parse's fast path inlined (a call less per packet, no issues to
        # look for): Ethernet, IPv4 without options or fragments, TCP, nothing cut.
        # Everything else takes parse, which re-checks everything.
        c_segment = self._c_segment
        if c_segment is not None:  # the compiled core's fast path (capture/_cpackets.c)
            seg = c_segment(raw, parser.endpoints, TcpSegment)
            if seg is not None:
                pstats.packets += 1
                pstats.tcp += 1
                # (the compiled driver's call is a method of its own: more locals here put
                # CPython 3.11's frame-stack chunk boundary where an out-of-memory fails
                # the call without a MemoryError, tests/fuzz_regressions/test_element_floods.py)
                if self._c_driver is None or not self._feed_segment_compiled(seg):
                    self.feed_segment(seg, 1)
                return
        self._feed_packet_python(raw)

    @property
    def takes_chunks(self) -> bool:
        """feed_chunk runs (the compiled core is there and feed_packet is this class's own)."""
        return self._c_loop is not None

    def feed_chunk(self, chunk: RecordChunk, limit: int, marks: list[int] | None = None) -> int:
        """Feed the records of ``chunk`` (a reader's buffer, readers.RecordChunk) one by one
        exactly as ``feed_packet`` feeds the RawPacket each would have been, in C, until
        ``limit`` records were taken or one left rows (``pending``), whichever comes first.
        With a ``marks`` list it does not stop at rows: for each row a record left it
        appends the records taken so far (``marks[i]`` is the packet of ``pending[i]``,
        counted from the call's first) and goes on to ``limit``.
        Returns how many were taken (0: no whole record left in the chunk); ``chunk.ts`` is
        the last one's timestamp, and the chunk's counters say what the reader handed out.
        Only when ``takes_chunks``."""
        return self._c_loop(self._c_loop_state, chunk, limit, marks)

    def _feed_packet_python(self, raw: RawPacket) -> None:
        """feed_packet for a packet the compiled packet parser declined (or without it)."""
        parser = self.parser
        pstats = parser.stats
        ts, linktype, data, _wire, index = raw
        if linktype == 1 and data[12:14] == b"\x08\x00" and len(data) >= 54:
            vihl, _tos, total, _id, frag, _ttl, proto, _sum, src, dst = IP4_HEADER(data, 14)
            if vihl == 0x45 and proto == 6 and not frag & 0x3FFF and 40 <= total <= len(data) - 14:
                sport, dport, seq, ack, doff, flags = TCP_HEADER(data, 34)
                hl = (doff >> 4) * 4
                if 20 <= hl <= total - 20:
                    pstats.packets += 1
                    pstats.tcp += 1
                    cache = parser.endpoints
                    a = cache.get((src, sport)) or parser.endpoint(src, sport)
                    b = cache.get((dst, dport)) or parser.endpoint(dst, dport)
                    self.feed_segment(_new(TcpSegment, (ts, a, b, seq, ack, flags, data[34 + hl:14 + total],
                                                        index, 0)), 1)
                    return
        tcp_before = pstats.tcp
        seg = parser.parse(raw)
        self.report_parser_issues(raw.ts)
        if seg is not None:
            # a reassembled IP datagram stands for all of its fragment packets
            n = pstats.tcp - tcp_before
            self.feed_segment(seg, n if n > 1 else 1)

    def _feed_segment_compiled(self, seg: TcpSegment) -> bool:
        """feed_segment's ordinary case in C (_cdriver.c): False when it declined (nothing
        changed; feed_segment takes the segment)."""
        done = self._c_driver(self._c_driver_state, seg, 1)
        if done is None:
            return False
        if done is not True:  # the connection's splitter has frames ready
            self._frames_to_conversation(done, seg.src)
        if seg.ts >= self.next_idle_check:
            self.flush_idle(seg.ts)
        return True

    def add_tls_secrets(self, secrets_type: int, data: bytes) -> None:
        """Key material found in the capture (a pcapng Decryption Secrets Block; readers call
        it through ``PacketSource.on_secrets``): used with the configured key log."""
        if self.tls_keys is None:
            self.tls_keys = KeyLog()
        elif self.tls_keys is self.config.tls_keys:
            # the configured key log may be shared (several runs, --jobs): add to a copy
            self.tls_keys = self.tls_keys.copy()
        self.tls_keys.add_dsb(secrets_type, data)

    def idle(self) -> None:
        """The packet source is idle or busy for a while (a live capture's tick): TLS
        connections waiting for their key look at the key log again (it may have grown;
        KeyLog.refresh reads it at most a few times a second)."""
        if self._tls_waiting:
            self._tls_retry()

    def report_parser_issues(self, ts: float | None) -> None:
        """Malformed packets, unknown link types, incomplete IP datagrams: errors rows too
        (called after each packet the parser parsed; a caller that runs the parser itself,
        like a --jobs worker, calls it the same way)."""
        if len(self.parser.issues) <= self._parser_issues_seen:
            return
        pkt = self.stats.packets
        for issue in self.parser.issues[self._parser_issues_seen:]:
            self._events.append(ErrorRow(kind=issue.kind, message=issue.message, ts=ts, frame=pkt or None,
                                         order=pkt))
        self._parser_issues_seen = len(self.parser.issues)

    def feed_segment(self, seg: TcpSegment, _packets: int = 0) -> None:
        """Feed one TCP segment (``_packets``: how many captured packets it stands for;
        0 = fed directly, not through feed_packet, counted as one)."""
        # The compiled driver (_cdriver.c, called by feed_packet) is the twin of this method
        # and of _on_data for in-order segments of decided Kafka connections, on these same
        # fields: stats (tcp_packets, kafka_bytes, packets), _last_ts, _hot_pair/_hot_info,
        # _conn_by_tuple, _hot_cid/_hot_conn, _conns, _dirty; a connection state's info,
        # decided, tls, splitters; a ConnectionInfo's kind, broker, bytes, last_ts, packets.
        self.stats.tcp_packets += 1
        ts = seg.ts
        self._last_ts = ts
        if not _packets:
            self._direct_segments += 1
            _packets = 1
        tstats = self.tcp.stats
        stray_before = tstats.stray_segments
        events = self.tcp.feed(seg)
        if events:
            on_tcp = self._on_tcp
            for ev in events:
                on_tcp(ev)
        src, dst = seg.src, seg.dst
        hot = self._hot_pair
        # (either direction: both look up the same sorted key; replies alternate with requests)
        if hot is not None and (hot[0] is src and hot[1] is dst or hot[0] is dst and hot[1] is src):
            info = self._hot_info
        else:
            info = self._conn_by_tuple.get((src, dst) if src <= dst else (dst, src))
            self._hot_pair, self._hot_info = (src, dst), info
        if info is None or tstats.stray_segments != stray_before:
            self._stray_packets += _packets
        else:
            info.packets += _packets
        if ts >= self.next_idle_check:
            self.flush_idle(ts)

    def advance(self, ts: float) -> None:
        """Capture time passes without a segment for this dissector: a TCP segment of a
        connection another dissector decodes went by (--jobs workers see every packet).
        Idle connections are flushed at the same packets as when every segment is fed."""
        self._last_ts = ts
        if ts >= self.next_idle_check:
            self.flush_idle(ts)

    def flush_idle(self, ts: float) -> None:
        """Close the connections idle for ``config.idle_timeout`` at capture time ``ts``
        (and, with idle checks on, schedule the next check a minute later)."""
        if self.idle_checks:
            self.next_idle_check = ts + 60.0
        for ev in self.tcp.flush_idle(ts):
            self._on_tcp(ev)

    def finish(self) -> None:
        """End of input: flush reassembly, framing and every in-flight request."""
        if self._tls_waiting:
            self._tls_retry(force=True)  # a last look at a growing key log
        self.parser.finish()
        self.report_parser_issues(self._last_ts)
        if self.parser.issues_dropped:
            self._events.append(ErrorRow(
                kind="limit_exceeded", ts=self._last_ts,
                message=f"{self.parser.issues_dropped} more packet-level issues not listed "
                        f"(first {self.parser.max_issues} shown; the summary counts every packet)",
                order=self.stats.packets))
            self.parser.issues_dropped = 0
        for events in self.tcp.finishing():  # (one connection at a time: bounded memory)
            for ev in events:
                self._on_tcp(ev)
        for conn_id in list(self._conns):
            self._close(conn_id, self._last_ts, "end")
        if self._given_up > 1:
            self._events.append(ErrorRow(
                kind="limit_exceeded", ts=self._last_ts, order=self.stats.packets,
                message=f"{self._given_up - 1:,} more connections were given up as not Kafka while "
                        f"undecided (more than {MAX_HELD_SEGMENTS:,} segments held; the first one is listed)"))
            self._given_up = 1

    def watermark(self, now: float, max_wait: float | None = None) -> int:
        """The smallest ``order`` a row still to come can have (stream/row_order.py): the
        packet of the first byte of the oldest message not yet emitted (held before the
        connection was decided, buffered in a splitter, or a request waiting for its
        answer, unless it completed more than ``max_wait`` seconds before ``now``), else
        the next packet. Looks only at the connections that got data since the last call
        (and at the oldest one), so it costs little however many are open."""
        since = now - (row_order.MAX_WAIT_SECONDS if max_wait is None else max_wait)
        for conn in self._dirty:
            self._record_start(conn, since)
        self._dirty.clear()
        heap = self._starts
        while heap:
            pkt, _serial, conn = heap[0]
            if conn.start == pkt:
                fresh = self._conn_start(conn, since)  # its oldest request may have gone stale
                if fresh == pkt:
                    return pkt
                heappop(heap)
                conn.start = 0
                self._record_start(conn, since, fresh)
            else:
                heappop(heap)  # superseded by a later start, or the connection closed
        return self.stats.packets + 1

    @staticmethod
    def _conn_start(conn: _ConnectionState, since: float) -> int:
        tls = conn.tls
        if tls is not None and tls.waiting:  # records queued until the key log has their key
            tag = tls.first_waiting_tag()
            pkts = [tag[1]] if tag is not None else []
            if conn.tls_held:
                pkts.append(conn.tls_held[0][3])
            if pkts:
                return min(pkts)
        if not conn.decided:
            return conn.held[0][4] if conn.held else 0
        low = 0
        for splitter in conn.splitters.values():
            pkt = splitter.first_buffered_packet()
            if pkt and (not low or pkt < low):
                low = pkt
        conv = conn.info.conversation
        if conv is not None:
            pkt = conv.oldest_pending_packet(since)
            if pkt and (not low or pkt < low):
                low = pkt
        return low

    def _record_start(self, conn: _ConnectionState, since: float, fresh: int | None = None) -> None:
        # (closed connections never get here: _close drops them from _dirty and zeroes start)
        if fresh is None:
            fresh = self._conn_start(conn, since)
        if fresh != conn.start:
            conn.start = fresh
            if fresh:
                self._start_serial += 1
                heappush(self._starts, (fresh, self._start_serial, conn))
                if len(self._starts) > 2 * len(self._conns) + 1024:  # mostly superseded entries
                    self._starts = [e for e in self._starts if e[2].start == e[0]]
                    heapify(self._starts)

    @property
    def last_ts(self) -> float:
        """Capture time of the last packet fed (or passed with advance())."""
        return self._last_ts

    @property
    def has_events(self) -> bool:
        """Rows are waiting for drain() (most packets complete none)."""
        return bool(self._events)

    @property
    def pending(self) -> list[Event]:
        """The list drain() empties, always the same object: a driving loop holds it and
        tests its truthiness per packet, which costs less than has_events' call.
        Read-only: take the rows with drain()."""
        return self._events

    def drain(self) -> list[Event]:
        """The rows completed since the last call, in the order they completed."""
        events = self._events[:]
        self._events.clear()
        return events

    def connection(self, a: Endpoint, b: Endpoint) -> ConnectionInfo | None:
        """The connection between two endpoints (either order), if it is still known."""
        return self._conn_by_tuple.get((a, b) if a <= b else (b, a))

    def packet_counts(self) -> dict[str, int]:
        """Where every packet went (no silent loss); after finish() the parts sum to ``packets``.

        ``kafka``: packets of connections decoded as Kafka; ``non_kafka``: packets of
        other TCP connections (TLS, not Kafka, no payload to decide on) and TCP
        segments that belong to no connection; ``not_tcp``: parsed fine but not TCP
        (ARP, UDP, ICMP, ...); ``unparseable``: malformed or cut headers, unknown link
        types, IP fragments that never completed; ``fragments_pending``: IP fragments
        still waiting for their datagram (0 after finish()).
        """
        kafka, non_kafka = self._pruned_packets["kafka"], self._pruned_packets["non_kafka"]
        for info in self.connections.values():
            if info.kind == "kafka":
                kafka += info.packets
            else:
                non_kafka += info.packets
        ps = self.parser.stats
        return {
            "packets": ps.packets + self._direct_segments,
            "kafka": kafka,
            "non_kafka": non_kafka + self._stray_packets,
            "not_tcp": ps.other,
            "unparseable": ps.unparseable,
            "fragments_pending": ps.fragments_pending,
        }

    def byte_counts(self) -> dict[str, int]:
        """Where the captured TCP payload bytes went (capture.tcp.DirectionStats summed):
        ``payload`` = ``delivered`` + ``duplicate`` + ``late`` + ``dropped`` + ``buffered``.
        ``late`` counts bytes for a range already given up as a gap and bytes arriving
        after their connection closed; ``gap`` counts bytes lost from the stream."""
        t = self.tcp.totals()
        return {"payload": t.payload_bytes, "delivered": t.delivered,
                "duplicate": t.duplicate_bytes, "late": t.late_bytes, "dropped": t.dropped_bytes,
                "buffered": t.buffered, "gap": t.gap_bytes,
                "ignored_closes": self.tcp.stats.ignored_closes}

    def packet_accounting_error(self) -> str | None:
        """None when every packet is counted exactly once, else what does not add up."""
        c = self.packet_counts()
        parts = c["kafka"] + c["non_kafka"] + c["not_tcp"] + c["unparseable"] + c["fragments_pending"]
        if parts != c["packets"]:
            return f"packet counts do not add up: {c}"
        return None

    # -- TCP events -------------------------------------------------------------------

    def _on_tcp(self, ev) -> None:
        if type(ev) is StreamData or isinstance(ev, StreamData):
            self._on_data(ev.conn_id, ev.src, ev.dst, ev.data, ev.ts)
        elif isinstance(ev, StreamGap):
            self._on_gap(ev.conn_id, ev.src, ev.dst, ev.nbytes, ev.ts)
        elif isinstance(ev, StreamOpened):
            self._open(ev)
        elif isinstance(ev, StreamClosed):
            if ev.closed_by is not None:
                self._note_closer(ev.conn_id, ev.closed_by)
            self._close(ev.conn_id, ev.ts, ev.reason)
        elif isinstance(ev, StreamIssue):
            conn = self._conns.get(ev.conn_id)
            # after-close bytes are reported once the connection is closed: name it still
            info = conn.info if conn else self.connections.get(ev.conn_id)
            stream = info.stream if info else None
            pkt = self.stats.packets
            self._events.append(ErrorRow(kind=ev.issue.kind, message=ev.issue.message, ts=ev.ts, stream=stream,
                                         frame=pkt or None, tcp_stream=info.tcp_stream if info else None,
                                         order=pkt))

    def _open(self, ev: StreamOpened) -> _ConnectionState:
        a, b = ev.a, ev.b
        info = ConnectionInfo(stream="", a=a, b=b, first_ts=ev.ts, syn_seen=ev.syn_seen,
                              tcp_stream=ev.tcp_stream)
        conn = _ConnectionState(info)
        self._conns[ev.conn_id] = conn
        self.connections[ev.conn_id] = info
        self._conn_by_tuple[(ev.conn_id.a, ev.conn_id.b)] = info
        self._hot_pair = self._hot_cid = None
        self.stats.connections += 1
        ports = self.config.kafka_ports
        client, server = ev.client, ev.server
        if client is None or server is None:
            if b.port in ports and a.port not in ports:
                client, server = a, b
            elif a.port in ports and b.port not in ports:
                client, server = b, a
        info.client, info.broker = client, server
        # (named once: the two endpoints' texts cost more than the rest of an open)
        info.stream = stream_name(client, server) if server is not None else f"{a}<->{b}"
        return conn

    def _on_data(self, conn_id, src: Endpoint, dst: Endpoint, data: bytes, ts: float) -> None:
        if conn_id is self._hot_cid:
            conn = self._hot_conn
        else:
            conn = self._conns.get(conn_id)
            self._hot_cid, self._hot_conn = conn_id, conn
        if conn is None:
            return
        self._dirty.add(conn)
        info = conn.info
        info.last_ts = ts
        if info.broker is not None:
            counts = info.bytes
            if type(counts) is not dict:  # its first payload (the compiled driver declines until then)
                info.bytes = counts = {"to_broker": 0, "to_client": 0}
            counts["to_broker" if dst == info.broker else "to_client"] += len(data)
        if info.kind in ("tls", "not_kafka"):
            self.stats.non_kafka_bytes += len(data)
            return
        if conn.tls is not None:
            self._tls_data(conn, src, data, ts, self.stats.packets)
            return
        if not conn.decided:
            self._hold(conn, (src, "data", data, ts, self.stats.packets))
            conn.held_bytes += len(data)
            self._decide(conn, src, data, ts)
            if self._held_segments > MAX_HELD_SEGMENTS:
                self._give_up_oldest(ts)
            return
        self.stats.kafka_bytes += len(data)
        splitter = conn.splitters[src]
        splitter.feed(data, ts, self.stats.packets)
        if splitter.ready:  # most segments of large frames complete none: nothing to drain
            self._frames_to_conversation(conn, src)

    def _on_plain(self, conn: _ConnectionState, src: Endpoint, data: bytes, ts: float, pkt: int) -> None:
        """Decrypted TLS application data: what plaintext TCP payload goes through."""
        if conn.info.kind in ("tls", "not_kafka"):
            self.stats.non_kafka_bytes += len(data)
            return
        if not conn.decided:
            self._hold(conn, (src, "data", data, ts, pkt))
            conn.held_bytes += len(data)
            self._decide(conn, src, data, ts)
            if self._held_segments > MAX_HELD_SEGMENTS:
                self._give_up_oldest(ts)
            return
        self.stats.kafka_bytes += len(data)
        splitter = conn.splitters[src]
        splitter.feed(data, ts, pkt)
        if splitter.ready:
            self._frames_to_conversation(conn, src)

    def _on_gap(self, conn_id, src: Endpoint, dst: Endpoint, nbytes: int, ts: float) -> None:
        conn = self._conns.get(conn_id)
        if conn is None:
            return
        self._dirty.add(conn)
        conn.info.gap_bytes += nbytes
        if conn.info.kind in ("tls", "not_kafka"):
            return
        pkt = self.stats.packets
        self._events.append(ErrorRow(kind=TCP_GAP, message=f"{plural(nbytes, 'byte')} lost from {src} to {dst}",
                                     ts=ts, stream=conn.info.stream, frame=pkt or None,
                                     tcp_stream=conn.info.tcp_stream, order=pkt))
        if conn.tls is not None:
            # TLS records cannot be found again after a gap: that direction is not decrypted further
            conn.tls.gap(src == conn.tls_client, nbytes)
            self._tls_issues(conn, ts, pkt)
            return
        if not conn.decided:
            self._hold(conn, (src, "gap", nbytes, ts, pkt))
            if self._held_segments > MAX_HELD_SEGMENTS:
                self._give_up_oldest(ts)
            return
        conn.splitters[src].gap(nbytes, ts, pkt)
        self._frames_to_conversation(conn, src)

    # -- deciding what a connection carries ------------------------------------------

    def _decide(self, conn: _ConnectionState, src: Endpoint, data: bytes, ts: float) -> None:
        info = conn.info
        cfg = self.config
        verdict = detect.decide((info.a, info.b), self._first_bytes(conn), client=info.client, broker=info.broker,
                                syn_seen=info.syn_seen, kafka_ports=cfg.kafka_ports, detect=cfg.detect,
                                known_brokers=self.known_brokers, held_bytes=conn.held_bytes,
                                max_frame_size=cfg.max_frame_size)
        kind = verdict.kind
        if kind == detect.UNDECIDED:
            return
        if kind == detect.TLS and conn.tls is None and self.tls_keys and not info.tls:
            self._start_tls(conn, ts)
            return
        if kind != detect.KAFKA:
            message = verdict.message
            if kind == detect.TLS and not self.tls_keys:
                message = f"{message} (no key log given: --tls-keylog FILE decrypts it)"
            self._set_kind(conn, kind, ts, message)
            return
        client, broker = verdict.client, verdict.broker
        if client != info.client or broker != info.broker:
            info.client, info.broker = client, broker
            info.stream = stream_name(client, broker)
        self._start_kafka(conn, ts)

    def _first_bytes(self, conn: _ConnectionState) -> tuple[bytes, bytes]:
        """What side a and side b of the connection sent first: each up to its first gap,
        at least 64 bytes when it sent that many (detection needs no more)."""
        a = conn.info.a
        out = (bytearray(), bytearray())
        done = [False, False]
        for s, kind, payload, _ts, _pkt in conn.held:
            i = 0 if s == a else 1
            if done[i]:
                continue
            if kind == "gap":
                done[i] = True
            else:
                out[i].extend(payload)
                done[i] = len(out[i]) >= 64
            if done[0] and done[1]:
                break
        return bytes(out[0]), bytes(out[1])

    def _hold(self, conn: _ConnectionState, entry: tuple) -> None:
        if conn.held:
            conn.held.append(entry)
        else:
            self._undecided[conn] = None
            conn.held = [entry]
        self._held_segments += 1

    def _release_held(self, conn: _ConnectionState) -> None:
        if conn.held:
            self._held_segments -= len(conn.held)
            self._undecided.pop(conn, None)

    def _give_up_oldest(self, ts: float) -> None:
        while self._held_segments > MAX_HELD_SEGMENTS and self._undecided:
            victim = next(iter(self._undecided))
            self._given_up += 1
            self._set_kind(victim, "not_kafka", ts, None if self._given_up > 1 else (
                f"more than {MAX_HELD_SEGMENTS:,} segments are held by connections not yet known to carry "
                "Kafka (a flood of connections?): the oldest are given up as not Kafka, this one first; "
                "name the broker ports with --kafka-ports to decode them"))

    def _set_kind(self, conn: _ConnectionState, kind: str, ts: float, message: str | None) -> None:
        conn.info.kind = kind
        if kind == "tls" and conn.info.tls is None:
            conn.info.tls = "TLS: not decrypted: no key material"
        conn.decided = True
        self.stats.non_kafka_bytes += conn.held_bytes
        self._release_held(conn)
        conn.held = ()
        if message:
            pkt = self.stats.packets
            self._events.append(ErrorRow(kind=TLS_STREAM if kind == "tls" else NOT_KAFKA, message=message,
                                         ts=ts, stream=conn.info.stream, frame=pkt or None,
                                         tcp_stream=conn.info.tcp_stream, order=pkt))

    # -- TLS ----------------------------------------------------------------------

    def _start_tls(self, conn: _ConnectionState, ts: float) -> None:
        """A TLS handshake with key material configured: decrypt, and decide on the plaintext."""
        info = conn.info
        first = self._first_bytes(conn)
        hello = [len(f) > 5 and f[0] == 0x16 and f[5] == 1 for f in first]
        if hello[0] == hello[1]:
            info.tls = "TLS: not decrypted: handshake not captured (no ClientHello)"
            self._set_kind(conn, "tls", ts, f"{detect.TLS_MESSAGE} (handshake not captured: no ClientHello)")
            return
        client, server = (info.a, info.b) if hello[0] else (info.b, info.a)
        if client != info.client or server != info.broker:
            info.client, info.broker = client, server
            info.stream = stream_name(client, server)
        # here, not at the top (see TYPE_CHECKING above)
        from kwinspect.capture.tls import TlsSession

        conn.tls = TlsSession(self.tls_keys)
        conn.tls_client = client
        info.tls = "TLS"
        self._release_held(conn)  # the held ciphertext is decrypted below; plaintext is held anew
        held, conn.held, conn.held_bytes = conn.held, (), 0
        for src, kind, payload, hts, hpkt in held:
            if conn.tls is None:
                self.stats.non_kafka_bytes += len(payload) if kind == "data" else 0
            elif kind == "data":
                self._tls_data(conn, src, payload, hts, hpkt)
            else:
                conn.tls.gap(src == client, payload)
                self._tls_issues(conn, hts, hpkt)

    def _tls_data(self, conn: _ConnectionState, src: Endpoint, data: bytes, ts: float, pkt: int) -> None:
        tls = conn.tls
        plain = tls.feed(src == conn.tls_client, data, (ts, pkt))
        if tls.failure is not None:
            self._tls_failed(conn, ts)
            return
        self._tls_issues(conn, ts, pkt)
        if tls.waiting or conn.tls_held:
            # a direction waits for its key: hold what the other one gave until it is back
            if plain:
                if conn.tls_held:
                    conn.tls_held.append((src, plain, ts, pkt))
                else:
                    conn.tls_held = [(src, plain, ts, pkt)]
            if conn not in self._tls_waiting:
                self._tls_waiting[conn] = None
                self._tls_retry()
        elif plain:
            self._tls_plain(conn, src, plain, ts, pkt)

    def _tls_retry(self, force: bool = False) -> None:
        """Read what the (growing) key log gained; resume the connections waiting for it."""
        keys = self.tls_keys
        if keys is None or not keys.refresh(force):
            return
        for conn in list(self._tls_waiting):
            self._tls_resume(conn)

    def _tls_resume(self, conn: _ConnectionState) -> None:
        tls = conn.tls
        if tls is None:
            self._tls_waiting.pop(conn, None)
            return
        info = conn.info
        client = conn.tls_client
        server = info.b if client == info.a else info.a
        resumed = [(client if from_client else server, plain, ts, pkt)
                   for from_client, (ts, pkt), plain in tls.resume()]
        ts = info.last_ts
        if tls.waiting and tls.failure is None:  # still waiting (for the other direction's key)
            conn.tls_held = [*conn.tls_held, *resumed]
            conn.tls_held.sort(key=lambda e: e[3])
            return
        ready = [*conn.tls_held, *resumed]
        conn.tls_held = ()
        ready.sort(key=lambda e: e[3])  # both directions, in packet order (stable: in order within one)
        for src, plain, ts, pkt in ready:
            if conn.tls is None:
                break
            self._tls_plain(conn, src, plain, ts, pkt)
        if conn.tls is not None:
            self._tls_issues(conn, ts, ready[-1][3] if ready else self.stats.packets)
        if conn.tls is not None and tls.failure is not None:
            self._tls_failed(conn, ts)
        self._tls_waiting.pop(conn, None)
        if conn.info.closed is None:  # (closed ones are off the watermark's books)
            self._dirty.add(conn)

    def _tls_plain(self, conn: _ConnectionState, src: Endpoint, plain: list[bytes], ts: float, pkt: int) -> None:
        tls = conn.tls
        if plain:
            info = conn.info
            if not info.tls_decrypted:
                info.tls_decrypted = True
                info.tls = f"{tls.describe()} (decrypted)"
                self._events.append(ErrorRow(kind=TLS_DECRYPTED, message=f"{tls.describe()}: decrypted with the key log",
                                             ts=ts, stream=info.stream, frame=pkt or None,
                                             tcp_stream=info.tcp_stream, order=pkt))
            for chunk in plain:
                self._on_plain(conn, src, chunk, ts, pkt)

    def _tls_issues(self, conn: _ConnectionState, ts: float, pkt: int) -> None:
        for message in conn.tls.pop_issues():
            self._events.append(ErrorRow(kind=TLS_DECRYPT_FAILED, message=message, ts=ts, stream=conn.info.stream,
                                         frame=pkt or None, tcp_stream=conn.info.tcp_stream, order=pkt))

    def _tls_failed(self, conn: _ConnectionState, ts: float) -> None:
        """The connection cannot be decrypted (no key, handshake not captured, unsupported
        suite, nothing decrypted): a TLS connection not decoded, with the reason."""
        tls, info = conn.tls, conn.info
        self._tls_waiting.pop(conn, None)
        self._keep_tls_bytes(conn)
        conn.tls = None
        reason = tls.failure or "no application data decrypted"
        info.tls = f"{tls.describe()}: not decrypted: {reason}"
        if not conn.decided:
            self._set_kind(conn, "tls", ts, f"{detect.TLS_MESSAGE} ({tls.describe()}: {reason})")

    @staticmethod
    def _keep_tls_bytes(conn: _ConnectionState) -> None:
        tls = conn.tls
        if tls is not None:
            conn.info.tls_bytes = {"to_broker": tls.accounting(True), "to_client": tls.accounting(False)}

    def _start_kafka(self, conn: _ConnectionState, ts: float) -> None:
        info = conn.info
        info.kind = "kafka"
        conn.decided = True
        self.known_brokers.add(info.broker)
        self.stats.kafka_connections += 1
        conv = self.conversation_class(info.client, info.broker, shared=self.shared, redact=self.config.redact,
                                       max_in_flight=self.config.max_in_flight, tcp_stream=info.tcp_stream)
        info.conversation = conv
        conn.req_validator = RequestValidator(known_kafka=True)
        held_client = any(s == info.client for s, *_ in conn.held)
        conn.splitters = {
            info.client: FrameSplitter(conn.req_validator, max_frame_size=self.config.max_frame_size,
                                       synced=info.syn_seen or held_client),
            info.broker: FrameSplitter(ResponseValidator(conv.pending_correlation_ids),
                                       max_frame_size=self.config.max_frame_size, synced=info.syn_seen)}
        self._release_held(conn)
        held, conn.held = conn.held, ()
        for src, kind, payload, hts, hpkt in held:
            if kind == "data":
                self.stats.kafka_bytes += len(payload)
                conn.splitters[src].feed(payload, hts, hpkt)
            else:
                conn.splitters[src].gap(payload, hts, hpkt)
            self._frames_to_conversation(conn, src)

    # -- frames -> conversation -----------------------------------------------------

    def _frames_to_conversation(self, conn: _ConnectionState, src: Endpoint, events: list[Event] | None = None,
                                i: int = 0) -> None:
        """The events of src's splitter to the conversation; or ``events`` from ``events[i]``
        on, already taken from the splitter (the compiled loop walked those before in C)."""
        info = conn.info
        conv = info.conversation
        from_client = src == info.client
        walked = events is not None  # the compiled loop's walk just stopped at events[i]: Python's
        if events is None:  # (the compiled loop hands events over only without a hook)
            events = conn.splitters[src].events()
            if self.on_frame is not None:
                # the hook sees every frame of the batch first, then they are decoded (a hook
                # keeps frames; it must not cost the frames their compiled path below)
                on_frame, stream = self.on_frame, conv.stream
                direction = "request" if from_client else "response"
                for ev in events:
                    if type(ev) is Frame:
                        on_frame(stream, direction, ev[0])
        # the ordinary frames in C (stream/_cconv.c); it stops at the first event it leaves
        # to the Python below
        walk = conversation.compiled_frames
        n = len(events)
        while i < n:
            if walk is not None and not walked:
                i = walk(conv, events, i, from_client, conn.req_validator, self._events)
                if i > n:
                    return  # all taken, and the conversation's rows moved (what pop_events does)
                if i == n:
                    break
            walked = False
            ev = events[i]
            i += 1
            if type(ev) is Frame:
                data, _offset, ts_first, ts_last, pkt_first, pkt_last = ev
                conv.frame_packets = (pkt_first, pkt_last)
                if from_client:
                    conv.on_request(data, ts_first, ts_last)
                    if conv.last_correlation_id is not None:
                        conn.req_validator.last_correlation_id = conv.last_correlation_id
                else:
                    conv.on_response(data, ts_first, ts_last)
            elif isinstance(ev, FramingIssue):
                self._events.append(ErrorRow(kind=ev.kind, message=ev.message, ts=ev.ts, stream=info.stream,
                                             frame=ev.pkt or None, tcp_stream=info.tcp_stream, order=ev.pkt))
            elif isinstance(ev, Skipped):
                pass  # every skip is also announced by a FramingIssue; the bytes are in the accounting
        self._events.extend(conv.pop_events())

    def _note_closer(self, conn_id, endpoint: Endpoint) -> None:
        conn = self._conns.get(conn_id)
        if conn is not None:
            info = conn.info
            info.closed_by = ("client" if endpoint == info.client else
                              "broker" if endpoint == info.broker else None)

    def _close(self, conn_id, ts: float, reason: str) -> None:
        self._hot_cid = None
        conn = self._conns.pop(conn_id, None)
        if conn is None:
            return
        self._dirty.discard(conn)
        conn.start = 0  # everything it held is emitted below
        info = conn.info
        info.closed = reason
        if conn.tls is not None:
            if conn in self._tls_waiting:
                self._tls_retry(force=True)  # a last look at the key log before giving up
                if conn.tls is not None and conn.tls.waiting:
                    conn.tls.give_up()  # the connection ended before the key log had its key
                    self._tls_waiting.pop(conn, None)
        if conn.tls is not None:
            self._tls_issues(conn, ts, self.stats.packets)
            self._keep_tls_bytes(conn)
            if not conn.decided and not conn.held or conn.tls.failure is not None:
                self._tls_failed(conn, ts)
        if not conn.decided and conn.held:
            verdict = detect.decide_at_end(self._first_bytes(conn), self.config.max_frame_size)
            self._set_kind(conn, verdict.kind, ts, verdict.message)
        for src, splitter in conn.splitters.items():
            splitter.finish()
            if splitter.ready:  # (nothing left: the conversation has no rows pending either)
                self._frames_to_conversation(conn, src)
            if type(info.accounting) is not dict:
                info.accounting = {}
            info.accounting["to_broker" if src == info.client else "to_client"] = splitter.accounting()
        if info.conversation is not None:
            info.conversation.close(ts, self.stats.packets)
            self._events.extend(info.conversation.pop_events())
            if not self.keep_conversations:
                info.conversation = info.conversation.summary()
        if self.on_close is not None:
            self.on_close(info)
        self._closed_order.append(conn_id)
        while len(self._closed_order) > self.config.keep_closed_connections:
            old_id = self._closed_order.popleft()
            old = self.connections.pop(old_id, None)
            if old is not None:
                self._pruned_packets["kafka" if old.kind == "kafka" else "non_kafka"] += old.packets
                key = (getattr(old_id, "a", None), getattr(old_id, "b", None))
                if self._conn_by_tuple.get(key) is old:
                    # late retransmissions for this 4-tuple now count as segments of no
                    # connection (non-Kafka) instead of vanishing with the pruned info
                    del self._conn_by_tuple[key]
                    self._hot_pair = None
