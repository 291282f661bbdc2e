"""``--jobs N`` for the offline commands: TCP connections shared out over worker processes.

Every worker reads the whole capture (reading and the header peek cost ~10% of a
one-process run) and hands only the packets of its own connections to its own
``Dissector``, so each connection is reassembled, framed and decoded by exactly one
worker. The owner of a connection is decided from its 4-tuple in the packet-parser
stage (the parser's fast path, or a full parse for anything else: VLANs, IPv6,
fragments) by ``_Router``: by default a new connection goes to the worker with the
fewest captured bytes so far (every worker counts every packet, so all agree without
talking to each other; on the reference capture this split 72/76 MB where crc32 of
the 4-tuple split 1:2), or ``mode="hash"``: crc32 of the 4-tuple. Every worker sees every packet's timestamp
(``Dissector.advance``), so idle connections are flushed at the same packets as with
one process. Every worker parses every packet, so the parser's counters (not TCP,
unparseable, fragments) are whole in each; worker 0's are used.

The main process merges the workers' events by (packet position, phase, first packet
of the connection, worker order): the order one process emits them in. Phases: events
of the packet's own connection, then idle flushes, then at the end of input the
connections in the order they were opened, then the readers' issues.

What crosses connections, and how the result stays identical to ``--jobs 1``:

- ``SharedState.topic_names`` (topic id -> name, learned from Metadata responses)
  labels an exchange's ``topics``, error rows and record-set issue rows when a body
  names topics by id (Fetch v13+, Produce v13). Workers record every topic-id lookup an
  exchange made with its answer. The main process keeps the global ``SharedState``,
  learning from Metadata / FindCoordinator / DescribeCluster exchanges in capture
  order (their bodies always travel), and re-checks each recorded answer against it.
  When one differs (the name was learned on another worker's connection), the main
  process rebuilds that exchange and its error rows with ``Conversation.emit`` and
  the global state: the same code, with the state one process would have had.
  The consumer sees ``run.dissector.shared`` as of the events it is handed, as with
  one process (all events of a packet are settled before any is handed on).
- ``broker_id`` (``SharedState.brokers``) is recomputed in the main process for every
  exchange; the exchange ``index`` is renumbered in merge order.
- ``Dissector.known_brokers`` (a broker endpoint proven on another connection decides
  the direction of a connection on an undeclared port): workers record each test and
  its answer. If one differs from the global answer, the parallel run is abandoned and
  the capture is read again by one process, skipping the events already handed on
  (identical up to there). Declaring the broker ports (``--kafka-ports``) or capturing
  the handshakes avoids those tests.

Known difference: connections flushed as idle (no packet for ``idle_timeout``) at the
same packet by different workers come out in the order they were opened, not in the
order of their last packet.
"""

from __future__ import annotations

import copy
import heapq
import multiprocessing as mp
import os
import pickle
import threading
import traceback
import zlib
from collections import deque
from collections.abc import Iterator
from operator import itemgetter
from typing import Any

from kwinspect.capture.packets import SYN
from kwinspect.capture.readers import open_capture
from kwinspect.capture.tcp import StreamOpened, TcpStreamNumbers, endpoint_key
from kwinspect.dissect import ConnectionInfo, DissectConfig, Dissector, Event
from kwinspect.model import STATUS_PAIRED, Endpoint, ErrorRow, Exchange
from kwinspect.protocol.schema.api_keys import ApiKey
from kwinspect.run.files import FileRun, ProgressFn, _merged, dissect_files
from kwinspect.run.loop import PacketLoop
from kwinspect.stream.conversation import (
    DESCRIBE_CLUSTER,
    FIND_COORDINATOR,
    METADATA,
    Conversation,
    SharedState,
)
from kwinspect.stream.row_order import END, RowOrder

PRODUCE = int(ApiKey.PRODUCE)
FETCH = int(ApiKey.FETCH)
API_VERSIONS = int(ApiKey.API_VERSIONS)
LEARN_APIS = frozenset({METADATA, FIND_COORDINATOR, DESCRIBE_CLUSTER})
BATCH_PACKETS = 2048  # packets between two messages from a worker (a multiple of WATERMARK_EVERY)
PUMP_BYTES = 64 << 20  # how far (pickled bytes) a worker may run ahead of the merge
MAX_ROUTES = 1_000_000
# A worker keeps the connections it owns and a shadow of the others until they are
# decided, so with N workers a flood of connections costs about N times what one
# process holds (1M SYNs: 1.7 GiB per worker, 858 MiB in one process). Past this many
# connections open at once (own + shadow) the run goes on in one process instead.
MAX_OPEN_CONNECTIONS = 50_000
VIRTUAL_CHARGE = 64 << 10  # bytes a new connection counts for before it has any  # 4-tuples whose owner is remembered (~150 bytes each, both directions)
PHASE_PACKET, PHASE_IDLE, PHASE_FINISH, PHASE_CLOSE, PHASE_ISSUES, PHASE_MARK = 0, 1, 2, 3, 8, 9

DROP = object()  # what a ``render`` function returns for an event the consumer does not want
# A worker with more than this times its fair share of the bytes leaves rendering to the main
# process (which then shares a core with the lighter workers): with 3 busy connections on 2
# workers (capture b) one worker has twice the other's work, and the main process has room.
# Not when the events carry their bodies (records): unpickling those costs the main process
# more than rendering costs the worker.
RENDER_SHARE = 1.15


# ---------------------------------------------------------------------------
# Worker side
# ---------------------------------------------------------------------------


class _TrackingNames(dict):
    """topic id -> name that logs each lookup (id, answer) while ``log`` is a list."""

    __slots__ = ("log",)

    def __init__(self) -> None:
        super().__init__()
        self.log: list | None = None

    def __bool__(self) -> bool:  # `topic_names or {}` must keep this dict even when empty
        return True

    def _look(self, tid: Any) -> Any:
        value = dict.get(self, tid)
        if self.log is not None:
            self.log.append((tid, value))
        return value

    def get(self, tid: Any, default: Any = None) -> Any:
        value = self._look(tid)
        return default if value is None else value

    def __getitem__(self, tid: Any) -> Any:
        value = self._look(tid)
        if value is None:
            raise KeyError(tid)
        return value

    def __contains__(self, tid: Any) -> bool:
        return self._look(tid) is not None


class _TrackedConversation(Conversation):
    """Marks each exchange whose labels looked up topic ids: ("grp", n, lookups, ...)."""

    def emit(self, req, resp, req_first, req_last, resp_first, resp_last, status, api_label=None,
              packets=(0, 0, 0, 0)) -> None:
        names = self.shared.topic_names
        log: list = []
        names.log = log
        n = len(self._events)
        try:
            super().emit(req, resp, req_first, req_last, resp_first, resp_last, status, api_label, packets)
        finally:
            names.log = None
        if log:
            self._events.insert(n, ("grp", len(self._events) - n, tuple(log), self.client, self.broker,
                                    (req_first, req_last, resp_first, resp_last, status, api_label, packets),
                                    self.tcp_stream))


class _RecordingSet(set):
    """Dissector.known_brokers that leaves ("kb+", ep) / ("kb?", ep, answer) in the event list
    (not while ``quiet``: the worker's shadow dissector shares the set)."""

    def __init__(self) -> None:
        super().__init__()
        self.dissector: _WorkerDissector | None = None
        self.quiet = False

    def __contains__(self, ep: Any) -> bool:
        answer = set.__contains__(self, ep)
        if not self.quiet:
            self.dissector.note(("kb?", ep, answer))
        return answer

    def add(self, ep: Any) -> None:
        set.add(self, ep)
        if not self.quiet:
            self.dissector.note(("kb+", ep))


class _WorkerDissector(Dissector):
    """A Dissector that tags each event with (phase, first packet of its connection)."""

    direct_data = False  # _on_tcp sees every TCP event, to tag what each one emits

    def __init__(self, config: DissectConfig | None) -> None:
        known = _RecordingSet()
        super().__init__(config, shared=SharedState(topic_names=_TrackingNames()), known_brokers=known,
                         conversation_class=_TrackedConversation)
        known.dissector = self
        self.pos = 0
        self.phase = PHASE_PACKET
        self.first_pos: dict[Any, int] = {}
        self.tags: list[tuple[int, int]] = []
        self._depth = 0
        self.reports_parser_issues = True

    def note(self, item: tuple) -> None:
        """A record for the main process among the events (see _RecordingSet)."""
        self._events.append(item)

    def flush_idle(self, ts: float) -> None:
        self.phase = PHASE_IDLE
        super().flush_idle(ts)

    def finish(self) -> None:
        self.phase = PHASE_FINISH
        super().finish()

    def report_parser_issues(self, ts: float | None) -> None:
        # Every worker parses every packet the fast path does not take, so each has the
        # same parser issues: worker 0 reports them, the others only mark them seen.
        if self.reports_parser_issues:
            super().report_parser_issues(ts)
        else:
            self._parser_issues_seen = len(self.parser.issues)
            self.parser.issues_dropped = 0

    def _pad_tags(self) -> None:
        """Events appended outside a connection's handling (parser issues): they come
        first among the events of their packet, as in Dissector.feed_packet / finish."""
        missing = len(self._events) - len(self.tags)
        if missing > 0:
            self.tags.extend([(self.phase, -1)] * missing)

    def _tagged(self, fn, conn_id, *args) -> None:
        if self._depth == 0:
            self._pad_tags()
        self._depth += 1
        n = len(self._events)
        try:
            fn(*args)
        finally:
            self._depth -= 1
        added = len(self._events) - n
        if added and self._depth == 0:
            self.tags.extend([(self.phase, self.first_pos.get(conn_id, self.pos))] * added)

    def _on_tcp(self, ev) -> None:
        if type(ev) is StreamOpened:
            self.first_pos.setdefault(ev.conn_id, self.pos)
        self._tagged(super()._on_tcp, ev.conn_id, ev)

    def _close(self, conn_id, ts: float, reason: str) -> None:
        if self._depth == 0 and self.phase == PHASE_FINISH:
            self.phase = PHASE_CLOSE  # Dissector.finish's own loop after the reassembler's
        self._tagged(super()._close, conn_id, conn_id, ts, reason)

    def pop_tagged(self) -> tuple[list, list]:
        self._pad_tags()
        events, tags = self.drain(), self.tags
        self.tags = []
        return events, tags


class _ConversationStub:
    """What a merged ConnectionInfo keeps of its conversation (the stream name)."""

    __slots__ = ("stream",)

    def __init__(self, stream: str) -> None:
        self.stream = stream



class _RecordSetSummary:
    """What ``summary`` reads of a RecordSet (count and size), and what
    ``Conversation.emit`` reads (its issues), without the record bytes."""

    __slots__ = ("batches", "issues", "record_count", "size")

    def __init__(self, rs: Any, size: int | None = None, issues: list | None = None) -> None:
        self.batches = ()
        if size is None:
            self.issues = list(rs.issues)  # before record_count, which may decode (and add issues)
            self.record_count = rs.record_count
            self.size = rs.size
        else:
            self.record_count, self.size, self.issues = rs, size, issues or []

    def __reduce__(self) -> tuple[Any, tuple[int, int, list]]:
        return _RecordSetSummary, (self.record_count, self.size, self.issues)


def _without_record_bytes(node: Any) -> Any:
    """A copy of a decoded body with every RecordSet replaced by a _RecordSetSummary."""
    if type(node) is dict:
        return {k: _without_record_bytes(v) for k, v in node.items()}
    if type(node) is list:
        return [_without_record_bytes(v) for v in node]
    if hasattr(node, "batches") and hasattr(node, "issues"):
        return _RecordSetSummary(node)
    return node


def _for_rebuild(ev: Any, bodies: bool | str) -> Any:
    """An exchange the main process may rebuild with Conversation.emit: its messages as
    emit reads them (record sets as their issues, counts and sizes: the main process
    needs no record bytes unless the consumer wants the bodies)."""
    if bodies is True or type(ev) is not Exchange:
        return ev
    for attr in ("request", "response"):
        msg = getattr(ev, attr)
        if msg is not None and isinstance(msg.body, dict) and msg.api_key in (PRODUCE, FETCH):
            msg = copy.copy(msg)
            msg.body = _without_record_bytes(msg.body)
            msg.raw_body = None
            setattr(ev, attr, msg)
    return ev


def _record_set_summaries(api_key: int, body: Any) -> dict:
    """A Produce request / Fetch response body cut down to what iter_record_sets reads."""
    key_t, key_p = ("topic_data", "partition_data") if api_key == PRODUCE else ("responses", "partitions")
    topics = []
    for t in body.get(key_t) or ():
        if not isinstance(t, dict):
            continue
        parts = []
        for part in t.get(key_p) or ():
            rs = part.get("records") if isinstance(part, dict) else None
            if rs is not None and hasattr(rs, "batches"):
                light = {k: part[k] for k in ("index", "partition_index") if k in part}
                light["records"] = _RecordSetSummary(rs)
                parts.append(light)
        light_t = {k: t[k] for k in ("name", "topic", "topic_id") if k in t}
        light_t[key_p] = parts
        topics.append(light_t)
    return {key_t: topics}


def _lighten(ev: Any, bodies: bool | str) -> Any:
    """What travels between processes: ``bodies=False`` no messages, ``"summary"`` only
    what the summary reads (ApiVersions requests, record-set counts and sizes); the bodies
    of Metadata-like exchanges always (the main process learns from them)."""
    if bodies is True or type(ev) is not Exchange or ev.api_key in LEARN_APIS:
        return ev
    if bodies == "summary":
        if ev.api_key == API_VERSIONS:
            ev.response = None
            return ev
        if ev.api_key in (PRODUCE, FETCH):
            msg = ev.request if ev.api_key == PRODUCE else ev.response
            if msg is not None and isinstance(msg.body, dict):
                msg = copy.copy(msg)
                msg.body = _record_set_summaries(ev.api_key, msg.body)
                msg.raw_body = None
                msg.header = {}  # the summary reads neither, and they cost unpickling time
                msg.issues = []
            ev.request, ev.response = (msg, None) if ev.api_key == PRODUCE else (None, msg)
            return ev
    ev.request = ev.response = None
    return ev


def _worker(paths: list[str], config: DissectConfig | None, jobs: int, me: int, out, bodies: bool | str,
            mode: str = "balance", render: Any = None) -> None:
    try:
        _work(paths, config, jobs, me, out, bodies, mode, render)
    except BaseException:  # noqa: BLE001 - reported to the main process, which raises
        out.send(("error", traceback.format_exc()))
    finally:
        out.close()


class _Router:
    """Which worker owns a connection, the same answer in every worker.

    Keys are (source ip, destination ip, source port, destination port) bytes, as they
    sit at offset 26 of an Ethernet/IPv4 frame; both directions are stored on first
    sight. ``balance`` (the default) gives a new connection to the worker with the
    fewest captured bytes so far, counting each connection the mean bytes per connection
    when it is assigned (every worker counts every packet, so all agree);
    ``hash`` uses crc32 of the 4-tuple.
    """

    def __init__(self, jobs: int, mode: str) -> None:
        self.jobs = jobs
        self.mode = mode
        self.owners: dict[bytes, int] = {}
        self.load = [0] * jobs
        self.connections = 0

    def assign(self, key: bytes, rkey: bytes) -> int:
        if self.mode == "hash" or len(self.owners) >= MAX_ROUTES:
            # past MAX_ROUTES, new connections are hashed and not remembered (every
            # worker passes the limit at the same packet, so all still agree)
            w = zlib.crc32(key if key <= rkey else rkey) % self.jobs
            if self.mode == "hash" and len(self.owners) < MAX_ROUTES:
                self.owners[key] = self.owners[rkey] = w
            return w
        load = self.load
        w = load.index(min(load))
        # A new connection is charged the mean bytes per connection so far up front: the
        # producer's connections to every broker open within a millisecond, when they
        # have no bytes yet, and would otherwise all go to the same worker.
        load[w] += max(VIRTUAL_CHARGE, sum(load) // max(1, self.connections))
        self.connections += 1
        self.owners[key] = self.owners[rkey] = w
        return w


def _reverse_key(key: bytes) -> bytes:
    """The key of the other direction: (dst ip, src ip, dst port, src port)."""
    n = len(key)
    half = (n - 4) // 2
    return key[half:2 * half] + key[:half] + key[n - 2:] + key[n - 4:n - 2]


class _CaptureStreams:
    """tcp.stream numbers across the whole capture, in a worker that reassembles only some
    connections. Every worker keeps the same numbering (``numbers``, keyed by 4-tuple
    bytes): its own connections' TcpReassembler asks it through ``see`` (for the packet
    being fed, ``key``), and the worker loop feeds it the first packet of each direction
    and every SYN of the other workers' connections. So the numbers are one process's."""

    __slots__ = ("numbers", "key")

    def __init__(self) -> None:
        self.numbers = TcpStreamNumbers()
        self.key = b""

    def _see_key(self, key: bytes, rkey: bytes, flags: int, seq: int) -> int | None:
        return self.numbers.see(key if key <= rkey else rkey, 0 if key <= rkey else 1, flags, seq)

    def see(self, _conn_key: Any, _side: int, flags: int, seq: int) -> int | None:
        """TcpReassembler's call, about the segment of the packet being fed."""
        return self._see_key(self.key, _reverse_key(self.key), flags, seq)

    def other(self, key: bytes, flags: int, seq: int) -> None:
        """A packet of a connection another worker owns: numbered when it is a SYN or the
        first of its direction (no set of seen directions: a flood would make it big)."""
        rkey = _reverse_key(key)
        if not flags & SYN and self.numbers.knows_direction(key, rkey):
            return
        self._see_key(key, rkey, flags, seq)


def _seg_keys(seg) -> tuple[bytes, bytes]:
    a, b = endpoint_key(seg.src), endpoint_key(seg.dst)
    return a[:-2] + b[:-2] + a[-2:] + b[-2:], b[:-2] + a[:-2] + b[-2:] + a[-2:]


class _WorkerLoop(PacketLoop):
    """One worker's run of the packet loop: every packet is routed (its own connections
    to its dissector, the others only counted, and shown to the shadow until decided),
    and the rows go to the main process, tagged, with the watermarks, unordered."""

    def __init__(self, d: _WorkerDissector, config: DissectConfig | None, jobs: int, me: int, out,
                 bodies: bool | str, mode: str, render: Any, sources: list) -> None:
        super().__init__(d, stop_unparseable=False)
        self.d = d
        self.me, self.jobs, self.out_pipe, self.bodies, self.render = me, jobs, out, bodies, render
        self.sources = sources
        self.streams = _CaptureStreams()
        d.tcp.streams = self.streams  # type: ignore[assignment]
        d.reports_parser_issues = me == 0
        self.router = _Router(jobs, mode)
        self.balance = mode != "hash"
        # The shadow sees the other workers' connections only until it has decided what they
        # carry, so that this worker's set of proven broker endpoints (shared with the shadow)
        # is the whole capture's, as one process has it. Its events are dropped.
        self.known = d.known_brokers
        self.shadow = Dissector(config, known_brokers=self.known)
        self.decided: set[bytes] = set()
        self.items: list = []
        self.seq = 0
        self.pos = 0
        self.last_ts: float | None = None
        self.keep = 0  # events still to ship with their bodies (a group the main process may rebuild)
        self.abandoned = False  # too many connections: the main process reads with one process

    def to_shadow(self, raw, key: bytes, rkey: bytes) -> None:
        shadow, known = self.shadow, self.known
        known.quiet = True
        try:
            spst = shadow.parser.stats
            before = spst.tcp
            seg = shadow.parser.parse(raw)
            if seg is None:
                return
            shadow.feed_segment(seg, _packets=max(1, spst.tcp - before))
            info = shadow.connection(seg.src, seg.dst)
            if info is not None and info.kind != "undecided" and key:
                self.decided.add(key)
                self.decided.add(rkey)
        finally:
            known.quiet = False
            shadow.drain()

    def feed(self, raw) -> None:
        d, shadow, router = self.d, self.shadow, self.router
        owners, load, me = router.owners, router.load, self.me
        parser = d.parser
        pst = parser.stats
        self.pos = pos = self.pos + 1
        d.pos = pos
        d.phase = PHASE_PACKET
        data = raw.data
        # The parser's fast path (Ethernet, IPv4 without options or fragments, TCP):
        # the owner comes from the header bytes, and the packets of other workers
        # are only counted, as the parser would count them.
        if (raw.linktype == 1 and len(data) >= 54 and data[12] == 8 and data[13] == 0
                and data[14] == 0x45 and data[23] == 6 and not (data[20] & 0x3F or data[21])
                and 40 <= (total := (data[16] << 8) | data[17]) <= len(data) - 14
                and 20 <= (data[46] >> 4) * 4 <= total - 20):
            key = data[26:38]
            w = owners.get(key)
            if w is None:
                rkey = data[30:34] + data[26:30] + data[36:38] + data[34:36]
                w = router.assign(key, rkey)
            if self.balance:
                load[w] += len(data)
            ts = raw.ts
            self.last_ts = ts
            if w == me:
                self.streams.key = key
                d.feed_packet(raw)
                if ts >= shadow.next_idle_check:
                    shadow.advance(ts)
            else:
                self.streams.other(key, data[47], int.from_bytes(data[38:42], "big"))
                d.stats.packets += 1
                pst.packets += 1
                pst.tcp += 1
                if ts >= d.next_idle_check:
                    d.advance(ts)
                if key in self.decided and not data[47] & 0x02:  # SYN: the 4-tuple starts over
                    if ts >= shadow.next_idle_check:
                        shadow.advance(ts)
                else:
                    self.to_shadow(raw, key, data[30:34] + data[26:30] + data[36:38] + data[34:36])
        else:
            d.stats.packets += 1
            tcp_before = pst.tcp
            seg = parser.parse(raw)
            d.report_parser_issues(raw.ts)  # as Dissector.feed_packet does
            if seg is not None:
                key, rkey = _seg_keys(seg)
                w = owners.get(key)
                if w is None:
                    w = router.assign(key, rkey)
                if self.balance:
                    load[w] += len(data)
                self.last_ts = seg.ts
                if w == me:
                    self.streams.key = key
                    d.feed_segment(seg, _packets=max(1, pst.tcp - tcp_before))
                    shadow.advance(seg.ts)
                else:
                    self.streams.other(key, seg.flags, seg.seq)
                    d.advance(seg.ts)
                    if key in self.decided and not seg.flags & 0x02:
                        shadow.advance(seg.ts)
                    else:
                        self.to_shadow(raw, key, rkey)
            else:
                self.to_shadow(raw, b"", b"")  # IP fragments: the shadow needs every one

    def collect(self, _pos: Any) -> None:
        d, items, bodies, render = self.d, self.items, self.bodies, self.render
        names = d.shared.topic_names
        load, me, jobs = self.router.load, self.me, self.jobs
        events, tags = d.pop_tagged()
        pos = d.pos
        for ev, (phase, order) in zip(events, tags, strict=True):
            self.seq += 1
            seq = self.seq
            row_key = getattr(ev, "order", 0) or pos  # where the row sorts (stream/row_order.py)
            if type(ev) is tuple and ev[0] == "grp":
                self.keep = ev[1]
            elif self.keep:
                self.keep -= 1
                ev = _for_rebuild(ev, bodies)
            elif type(ev) is tuple:
                pass
            elif render is not None and not (type(ev) is Exchange and ev.api_key in LEARN_APIS):
                # The row's final text (the main process only merges and writes it), or a
                # count of events the consumer does not want (kept for the fallback's skip).
                # A render that looked up topic ids may differ from one with the global
                # names: that event goes to the main process as it is.
                names.log = log = []
                try:
                    text = render(ev, names, bodies is True or load[me] * jobs <= sum(load) * RENDER_SHARE)
                finally:
                    names.log = None
                if log:
                    text = None
                if text is DROP:
                    last = items[-1] if items else None
                    if last is not None and last[0][0] == pos and type(last[1]) is int and last[2] == row_key:
                        items[-1] = (last[0], last[1] + 1, row_key)
                    else:
                        items.append(((pos, phase, order, seq), 1, row_key))
                    continue
                ev = text if text is not None else _lighten(ev, bodies)
            else:
                ev = _lighten(ev, bodies)
            items.append(((pos, phase, order, seq), ev, row_key))

    def mark(self, ts: float) -> None:
        # nothing more at or before pos; no row still to come sorts below the watermark
        self.items.append(((self.pos, PHASE_MARK, 0, self.seq), None, self.d.watermark(ts)))

    def tick(self, count: int) -> bool:
        if count % BATCH_PACKETS == 0:
            open_now = self.d.tcp.open_connections() + self.shadow.tcp.open_connections()
            if open_now > MAX_OPEN_CONNECTIONS:
                self.out_pipe.send(("fallback", f"more than {MAX_OPEN_CONNECTIONS:,} TCP connections "
                                                f"open at once (worker {self.me})"))
                self.abandoned = True
                return True
            self.ship()
        return False

    def ship(self) -> None:
        self.out_pipe.send(("items", self.items, sum(s.stats.file_bytes for s in self.sources)))
        self.items = []

    def end(self) -> None:
        d = self.d
        if self.last_ts is not None:
            d.advance(self.last_ts)  # advance() is only called when an idle check is due
        d.pos = END
        d.finish()
        self.collect(END)


def _work(paths: list[str], config: DissectConfig | None, jobs: int, me: int, out, bodies: bool | str,
          mode: str = "balance", render: Any = None) -> None:
    sources = [open_capture(p) for p in paths]
    d = _WorkerDissector(config)
    loop = _WorkerLoop(d, config, jobs, me, out, bodies, mode, render, sources)

    def on_secrets(secrets_type: int, data: bytes) -> None:  # pcapng Decryption Secrets Blocks
        d.add_tls_secrets(secrets_type, data)
        loop.shadow.add_tls_secrets(secrets_type, data)

    for src in sources:
        src.on_secrets = on_secrets
    try:
        for _ in loop.run(_merged(sources)):
            pass  # a worker's rows go to the main process, in loop.items
        if loop.abandoned:
            return
        issues = []
        if me == 0:
            for path, src in zip(paths, sources, strict=True):
                for issue in src.issues:
                    issues.append((path, issue))
                    loop.seq += 1
                    loop.items.append(((END, PHASE_ISSUES, 0, loop.seq),
                                       ErrorRow(kind=issue.kind, message=f"{path}: {issue.message}", path=None),
                                       END))
        loop.ship()
        counts = d.packet_counts()
        counts.update({"tcp_" + k: v for k, v in d.byte_counts().items()})  # of its connections
        conns = []
        for conn_id, info in d.connections.items():
            if info.conversation is not None:
                info.conversation = _ConversationStub(info.conversation.stream)
            conns.append((d.first_pos.get(conn_id, 0), conn_id.serial, info))
        if os.environ.get("KWINSPECT_JOBS_DEBUG"):
            import resource
            import sys

            ru = resource.getrusage(resource.RUSAGE_SELF)
            print(f"kwinspect job {me}: cpu {ru.ru_utime + ru.ru_stime:.2f} s, packets {loop.pos}, "
                  f"kafka packets {counts['kafka']}, events {loop.seq}, load {loop.router.load}", file=sys.stderr)
        out.send(("done", counts, conns, issues))
    finally:
        for src in sources:
            src.close()


# ---------------------------------------------------------------------------
# Main process
# ---------------------------------------------------------------------------


class _Fallback(Exception):
    """A cross-connection decision differs from one process's: read again with one process."""


class MergedDissector:
    """What FileRun.dissector offers the commands after a parallel run: the global
    SharedState (as of the events handed on), packet_counts() and connections."""

    def __init__(self, bodies: bool | str) -> None:
        self.shared = SharedState()
        self.connections: dict[Any, ConnectionInfo] = {}
        self._known: set[Endpoint] = set()
        self._bodies = bodies
        self._endpoints: dict[str, Endpoint] = {}
        self._counts: list[dict[str, int] | None] = []
        self._conns: list[tuple[int, int, int, ConnectionInfo]] = []
        self.rebuilt = 0  # exchanges relabelled with the global state (for tests and benchmarks)

    # -- end of the run ------------------------------------------------------------
    def final(self, worker: int, counts: dict[str, int], conns: list) -> None:
        while len(self._counts) <= worker:
            self._counts.append(None)
        self._counts[worker] = counts
        self._conns.extend((first, w_serial, worker, info) for first, w_serial, info in conns)

    def settle_connections(self) -> None:
        self._conns.sort(key=lambda c: (c[0], c[2], c[1]))
        self.connections = {i: c[3] for i, c in enumerate(self._conns)}

    def packet_counts(self) -> dict[str, int]:
        counts = [c for c in self._counts if c is not None]
        if not counts:
            return {"packets": 0, "kafka": 0, "non_kafka": 0, "not_tcp": 0, "unparseable": 0,
                    "fragments_pending": 0}
        first = counts[0]
        return {
            "packets": first["packets"],
            "kafka": sum(c["kafka"] for c in counts),
            "non_kafka": sum(c["non_kafka"] for c in counts),
            "not_tcp": first["not_tcp"],
            "unparseable": first["unparseable"],
            "fragments_pending": first["fragments_pending"],
        }

    packet_accounting_error = Dissector.packet_accounting_error  # over the merged packet_counts()

    def byte_counts(self) -> dict[str, int]:
        """Dissector.byte_counts() summed over the workers (each reassembles its connections)."""
        out: dict[str, int] = {}
        for c in self._counts:
            for k, v in (c or {}).items():
                if k.startswith("tcp_"):
                    out[k[4:]] = out.get(k[4:], 0) + v
        return out

    # -- settling one packet's events ----------------------------------------------
    def _endpoint(self, text: str) -> Endpoint:
        ep = self._endpoints.get(text)
        if ep is None:
            host, _sep, port = text.rpartition(":")
            ep = self._endpoints[text] = Endpoint(host[1:-1] if host.startswith("[") else host, int(port))
        return ep

    def _learn(self, ex: Exchange) -> None:
        if ex.status == STATUS_PAIRED and ex.api_key in LEARN_APIS and ex.response is not None:
            self.shared.learn(ex.api_key, ex.response.body)

    def _number(self, ex: Exchange) -> None:
        shared = self.shared
        shared.exchange_counter += 1
        ex.index = shared.exchange_counter
        ex.broker_id = shared.broker_id_for(self._endpoint(ex.broker))

    def _strip(self, ex: Any) -> None:
        _lighten(ex, self._bodies)

    def settle(self, batch: list) -> list[tuple[int, Any]]:
        """The events of one packet position (``(event, row key)`` pairs), in order, with
        the global state applied, as ``(row key, item)`` for the RowOrder. Rows rendered
        by the workers (str, or a list of them for one event) are passed on; an int item
        stands for that many events the workers left out (see ``_released``)."""
        out: list[tuple[int, Any]] = []
        i = 0
        n = len(batch)
        while i < n:
            ev, key = batch[i]
            i += 1
            t = type(ev)
            if t is str or t is list or t is int:  # rendered rows, the rows of one event, left out
                out.append((key, ev))
                continue
            if t is tuple:
                tag = ev[0]
                if tag == "kb+":
                    self._known.add(ev[1])
                elif tag == "kb?":
                    if (ev[1] in self._known) != ev[2]:
                        raise _Fallback(f"known broker {ev[1]}")
                else:  # "grp": an exchange (and its error rows) labelled with topic-id lookups
                    _tag, count, lookups, client, broker, args, tcp_stream = ev
                    group = [g for g, _k in batch[i:i + count]]
                    i += count
                    ex = group[0]
                    self._learn(ex)
                    names = self.shared.topic_names
                    if all(names.get(tid) == answer for tid, answer in lookups):
                        self._number(ex)
                    else:
                        conv = Conversation(client, broker, shared=self.shared, tcp_stream=tcp_stream)
                        req_first, req_last, resp_first, resp_last, status, api_label, packets = args
                        conv.emit(ex.request, ex.response, req_first, req_last, resp_first, resp_last,
                                   status, api_label, packets)
                        group = conv.pop_events()
                        self.rebuilt += 1
                    self._strip(group[0])
                    out.extend((g.order or key, g) for g in group)
                continue
            if t is Exchange:
                self._learn(ev)
                self._number(ev)
            out.append((key, ev))
        return out


class _Pump:
    """Drains one worker's pipe into memory on a thread, up to ``limit`` bytes ahead of
    the merge. Without it a worker could run ahead of the slowest one only by a pipe
    buffer, and the workers would take turns whenever the heavy connections move from
    one to the other (on the 2 GB input that made --jobs 2 slower than one process)."""

    def __init__(self, conn, limit: int) -> None:
        self.conn = conn
        self.limit = limit
        self.used = 0
        self.queue: deque[bytes | None] = deque()
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._run, daemon=True, name="kwinspect-jobs-pump")
        self.thread.start()

    def _run(self) -> None:
        conn, cond = self.conn, self.cond
        while True:
            try:
                data = conn.recv_bytes()
            except (EOFError, OSError):
                data = None
            with cond:
                while data is not None and self.used > self.limit:
                    cond.wait()
                if data is not None:
                    self.used += len(data)
                self.queue.append(data)
                cond.notify_all()
            if data is None:
                return

    def close(self) -> None:
        with self.cond:
            self.limit = 1 << 62  # let a thread waiting for room finish
            self.cond.notify_all()

    def get(self) -> bytes | None:
        with self.cond:
            while not self.queue:
                self.cond.wait()
            data = self.queue.popleft()
            if data is not None:
                self.used -= len(data)
                self.cond.notify_all()
            return data


def _receive(pump: _Pump, worker: int, merged: MergedDissector, progress: list) -> Iterator[tuple]:
    loads = pickle.loads
    while True:
        data = pump.get()
        if data is None:
            raise RuntimeError(f"--jobs worker {worker} ended without a result")
        msg = loads(data)
        kind = msg[0]
        if kind == "items":
            if worker == 0:
                progress[0] = msg[2]
            yield from msg[1]
        elif kind == "fallback":
            raise _Fallback(msg[1])
        elif kind == "done":
            merged.final(worker, msg[1], msg[2])
            if worker == 0:
                progress[1] = msg[3]
            return
        else:
            raise RuntimeError(f"--jobs worker {worker} failed:\n{msg[1]}")


def dissect_files_parallel(paths, config: DissectConfig | None = None, run: FileRun | None = None,
                           progress: ProgressFn | None = None, *, jobs: int = 2,
                           bodies: bool | str = True, mode: str = "balance",
                           render: Any = None) -> Iterator[Event | str]:
    """``run.files.dissect_files`` over ``jobs`` worker processes: the same events in
    the same order. ``bodies=False``: exchanges come without request/response messages
    (for consumers that only read the columns; Metadata-like ones keep theirs);
    ``bodies="summary"``: only what ``kwinspect summary`` reads (see ``_lighten``).
    Both save shipping decoded bodies between processes.

    ``render(event, topic_names, text)``, called in the workers: the event's output text
    (a str is yielded in its place; a list: each str in it; only when ``text`` is true),
    ``DROP`` (the consumer does not want it: nothing is yielded) or None (the event is
    yielded). Events whose output
    may depend on other workers' connections (Metadata-like exchanges, exchanges
    relabelled with global topic names, renders that looked up a topic id) are never
    rendered, and with one process (or after a fallback) nothing is: the consumer must
    take both. The ``index`` of exchanges yielded beside rendered rows is not one
    process's (rendered and dropped exchanges are not counted)."""
    run = run if run is not None else FileRun()
    paths = [os.fspath(p) for p in paths]
    if jobs <= 1:
        yield from dissect_files(paths, config, run=run, progress=progress)
        return
    run.paths = paths
    for p in paths:  # unreadable input fails here, before anything is yielded, as with one process
        open_capture(p).close()
    run.total_bytes = sum(os.path.getsize(p) for p in paths if os.path.isfile(p))
    merged = MergedDissector(bodies)
    run.dissector = merged  # type: ignore[assignment]
    ctx = mp.get_context("fork")
    procs, pipes = [], []
    pumps: list[_Pump] = []
    released = [0]  # events of one process handed on (rendered lists and left-out ones count as theirs)
    try:
        for i in range(jobs):
            r, w = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_worker, args=(paths, config, jobs, i, w, bodies, mode, render), daemon=True,
                            name=f"kwinspect-job-{i}")
            p.start()
            w.close()
            procs.append(p)
            pipes.append(r)
        prog: list = [0, []]
        pumps.extend(_Pump(r, PUMP_BYTES) for r in pipes)
        streams = [_receive(pump, i, merged, prog) for i, pump in enumerate(pumps)]
        batch: list = []
        batch_pos = None
        done_bytes = 0
        rows = RowOrder()  # rows in capture order, as dissect_files does
        watermark = None  # the lowest of the workers' watermarks at batch_pos
        for key, ev, row_key in heapq.merge(*streams, key=itemgetter(0)):
            if key[0] != batch_pos:
                if batch:
                    for k, item in merged.settle(batch):
                        rows.push(k, item)
                    batch = []
                if watermark is not None:
                    yield from _released(rows.pop_ready(watermark), released)
                    watermark = None
                batch_pos = key[0]
                if progress is not None and prog[0] != done_bytes:
                    done_bytes = prog[0]
                    progress(done_bytes, run.total_bytes)
            if ev is not None:
                batch.append((ev, row_key))
            elif watermark is None or row_key < watermark:  # a worker's mark: row_key is its watermark
                watermark = row_key
        for k, item in merged.settle(batch):
            rows.push(k, item)
        yield from _released(rows.pop_all(), released)
        merged.settle_connections()
        run.issues.extend(prog[1])
    except _Fallback:
        _stop(procs)
        for n, ev in enumerate(dissect_files(paths, config, run=run, progress=progress)):
            if n >= released[0]:
                yield ev
        return
    finally:
        _stop(procs)
        for pump in pumps:
            pump.close()
    if progress is not None:
        progress(run.total_bytes, run.total_bytes)


def _released(items: list, count: list[int]) -> Iterator[Any]:
    """The rows of the items a RowOrder released; ``count[0]`` counts the events of one
    process they stand for (a fallback skips that many), as each is handed on."""
    for item in items:
        t = type(item)
        if t is int:  # events the workers left out (the consumer did not want them)
            count[0] += item
            continue
        if t is list:  # the rows (records) of one event
            yield from item
            count[0] += 1
            continue
        yield item
        count[0] += 1


def _stop(procs: list) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(5)
    procs.clear()
