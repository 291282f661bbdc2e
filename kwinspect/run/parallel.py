"""``--jobs N`` for the offline commands: TCP connections shared out over worker processes.

One reader process (run/split.py) reads the capture once, with the compiled reader
and header peek when built, decides which worker owns each TCP connection, and hands
each worker only the packets of its own connections, in batches, with what keeps the
worker in step with one process: the packet numbers, the idle checks that fall on
other workers' packets (so idle connections are flushed at the same packets), a mark
every ``WATERMARK_EVERY`` packets (where every worker sends its watermark), the
tcp.stream number of each packet, the broker endpoints proven on other connections
(its shadow Dissector sees every connection until decided) and the packet parser's
rows (malformed packets, to worker 0). The parser's counters (not TCP, unparseable,
fragments) are the reader's, whole. Each worker reassembles, frames and decodes its
own connections with its own ``Dissector``, driven here through its public API.

The workers run the code one process runs: the reader sends the plain packets of a
pcap file (most of them) as runs of consecutive packets, as the file's own records
(for a regular file, their offsets: the worker reads them from the file), and a worker
feeds a run to its Dissector's compiled packet loop (``Dissector.feed_chunk``, which
stops at each packet that leaves rows) numbered from the run's first packet; only the
rest travels one item per packet. Its conversations are plain ``Conversation``s, so
their exchanges take the compiled walk as one process's do (the topic-id lookups the
main process checks are logged by the names mapping, ``_TrackingNames``). On two cores
the reader, the workers and the main process share the cores, so what the parallel
path adds to one process's CPU (the reader's pass over the file, the workers' tagging
and pickling of their rows, the merge) is what decides the speed-up
(docs/benchmarks.md, "--jobs (stage 6)").

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
  the global state: the same code, with the state one process would have had. Only
  lookups the worker could not answer need that (an exchange travels with its bodies
  then): when every id had a name in the worker, the worker renders (or folds) the row
  itself and sends the lookups, which the main process checks (``"chk"``); a topic id
  is unique in a cluster, so a name that differs (an id named differently on another
  connection) sends the run to one process.
  The consumer sees ``run.dissector.shared`` as of the events it is handed, as with
  one process (all events of a packet are settled before any is handed on).
- ``broker_id`` (``SharedState.brokers``) is recomputed in the main process for every
  exchange; the exchange ``index`` is renumbered in merge order.
- ``Dissector.known_brokers`` (a broker endpoint proven on another connection decides
  the direction of a connection on an undeclared port): the reader's shadow adds each
  endpoint at the packet one process would, and every worker gets it there. Workers
  still record each test and its answer; if one differed from the global answer, the
  parallel run would be abandoned and the capture read again by one process, skipping
  the events already handed on (identical up to there).

Partial results (``fold``, used by ``summary``): a worker counts the events whose part
of the result does not depend on their place in capture order and sends its partial
result at the end; the main process merges them (analyze/summary.py).

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
import struct
import threading
import traceback
from collections import deque
from collections.abc import Iterator
from operator import itemgetter
from typing import Any

from kwinspect.capture.packets import TcpSegment
from kwinspect.capture.readers import RawPacket, RecordChunk, open_capture
from kwinspect.capture.tcp import StreamOpened
from kwinspect.dissect import ConnectionInfo, DissectConfig, Dissector, Event
from kwinspect.model import STATUS_PAIRED, Endpoint, ErrorRow, Exchange
from kwinspect.protocol.schema.api_keys import ApiKey
from kwinspect.run.files import FileRun, ProgressFn, dissect_files
from kwinspect.run.procs import die_with_parent
from kwinspect.run.split import (
    MSG_BATCH,
    MSG_END,
    MSG_FALLBACK,
    TAG_ADVANCE,
    TAG_BROKER,
    TAG_MARK,
    TAG_PACKET,
    TAG_ROWS,
    TAG_RUN,
    TAG_SECRETS,
    TAG_SEGMENT,
    read_and_split,
)
from kwinspect.run.split import gather_spans as _gather
from kwinspect.run.split import map_file as _map_file
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
PUMP_BYTES = 64 << 20  # how far (pickled bytes) a worker may run ahead of the merge
INPUT_BYTES = 32 << 20  # how far (pickled bytes) the reader may run ahead of a worker
# A worker keeps the connections it owns and the reader a shadow of every connection
# until it is decided, so a flood of connections costs the reader about what one
# process holds (1M SYNs: 858 MiB in one process). Past this many connections open at
# once (in a worker, or in the reader's shadow) the run goes on in one process instead.
MAX_OPEN_CONNECTIONS = 50_000
PHASE_PACKET, PHASE_IDLE, PHASE_FINISH, PHASE_CLOSE, PHASE_ISSUES, PHASE_MARK = 0, 1, 2, 3, 8, 9

DROP = object()  # what a ``render`` function returns for an event the consumer does not want
RESTART = object()  # yielded (with a ``fold``) when the run goes on in one process: start over
# A worker with more than this times its fair share of the bytes leaves rendering to the main
# process (which then shares a core with the lighter workers): with 3 busy connections on 2
# workers (capture b) one worker has twice the other's work, and the main process has room.
# Not when the events carry their bodies (records): unpickling those costs the main process
# more than rendering costs the worker.
RENDER_SHARE = 1.15


# ---------------------------------------------------------------------------
# Worker side
# ---------------------------------------------------------------------------


MISS = type("_Miss", (), {"__slots__": ()})()  # a topic id the compiled walk must not label (not a str)


class _TrackingNames(dict):
    """topic id -> name that logs each lookup (id, answer) while ``log`` is a list (the
    Python ``emit``, a render, a fold).

    Otherwise the lookup is the compiled conversation walk's (stream/_cconv.c, through the
    labels' own ``get``): a name found is logged in ``walk`` (the worker has the main
    process check it), and a miss answers ``MISS``, which is not a str, so the compiled
    labels decline the exchange and it goes through ``emit`` (logged, and sent to the main
    process to be labelled with the global names)."""

    __slots__ = ("log", "walk")

    def __init__(self) -> None:
        super().__init__()
        self.log: list | None = None
        self.walk: list = []

    def __bool__(self) -> bool:  # `topic_names or {}` must keep this dict even when empty
        return True

    def _look(self, tid: Any) -> Any:
        value = dict.get(self, tid)
        if self.log is not None:
            self.log.append((tid, value))
        elif value is None:
            return MISS
        else:
            self.walk.append((tid, value))
        return value

    def get(self, tid: Any, default: Any = None) -> Any:
        value = self._look(tid)
        return default if value is None else value  # (MISS is kept: the walk must decline)

    def __getitem__(self, tid: Any) -> Any:
        value = self._look(tid)
        if value is None:
            raise KeyError(tid)
        return value

    def __contains__(self, tid: Any) -> bool:
        return self._look(tid) is not None


def _tracked_conversation(*args: Any, **kwargs: Any) -> Conversation:
    """A worker's Conversation: a plain one (its exchanges take the compiled walk, which only
    takes a Conversation of that very class), whose Python ``emit`` marks each exchange
    whose labels looked up topic ids: ("grp", n, lookups, ...)."""
    conv = Conversation(*args, **kwargs)
    plain_emit = conv.emit

    def emit(req, resp, req_first, req_last, resp_first, resp_last, status, api_label=None,
             packets=(0, 0, 0, 0)) -> None:
        names = conv.shared.topic_names
        log: list = []
        names.log = log
        n = conv.events_held()
        try:
            plain_emit(req, resp, req_first, req_last, resp_first, resp_last, status, api_label, packets)
        finally:
            names.log = None
        if log:
            conv.insert_event(n, ("grp", conv.events_held() - n, tuple(log), conv.client, conv.broker,
                                  (req_first, req_last, resp_first, resp_last, status, api_label, packets),
                                  conv.tcp_stream))

    conv.emit = emit  # type: ignore[method-assign]
    return conv


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

    # In-order data still goes straight to _on_data (no StreamData per segment): it only
    # happens while the packet's own segment is fed, so what it emits is the packet's
    # own connection's (see _pad_tags); every other TCP event goes through _on_tcp.

    def __init__(self, config: DissectConfig | None) -> None:
        known = _RecordingSet()
        super().__init__(config, shared=SharedState(topic_names=_TrackingNames()), known_brokers=known,
                         conversation_class=_tracked_conversation)  # type: ignore[arg-type]
        known.dissector = self
        self._pos: Any = 0
        self.phase = PHASE_PACKET
        self.first_pos: dict[Any, int] = {}
        self.tags: list[tuple[int, int]] = []
        self._depth = 0
        self.finish_rows: list = []  # the reader's parser rows at the end of input (worker 0)

    @property
    def pos(self) -> Any:
        """The packet being handled (or END): while a run of packets is fed through the
        compiled packet loop (``pos`` set to None), the one it is at (``stats.packets``)."""
        return self._pos if self._pos is not None else self.stats.packets

    @pos.setter
    def pos(self, value: Any) -> None:
        self._pos = value

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
        # The reader parses every packet this worker's fast path would not take and
        # reports their issues itself (to worker 0, at their packet); at the end the
        # parser's last rows come from it too, where Dissector.finish reports them.
        if self.finish_rows:
            for row in self.finish_rows:
                self.note(row)
            self.finish_rows = []
        super().report_parser_issues(ts)

    def _pad_tags(self) -> None:
        """Events appended outside _tagged: while a packet is fed, its in-order data's
        (only this packet's connection has events at this packet, so any order above the
        parser rows' -1 keeps them after those, as in Dissector.feed_packet); otherwise
        (at the end: TLS retries, parser rows) they come first, as in Dissector.finish."""
        missing = len(self._events) - len(self.tags)
        if missing > 0:
            self.tags.extend([(self.phase, 0 if self.phase == PHASE_PACKET else -1)] * missing)

    def note_rows(self, rows: list) -> None:
        """The reader's parser rows of the packet being handled: first among its events."""
        self._pad_tags()
        self._events.extend(rows)
        self.tags.extend([(self.phase, -1)] * len(rows))

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
            msg.body = _records_light(msg.api_key, msg.is_request, msg.body)
            msg.raw_body = None
            setattr(ev, attr, msg)
    return ev


def _records_light(api_key: int, is_request: bool, body: dict) -> Any:
    """``_without_record_bytes(body)`` for a Produce or Fetch body, without walking every
    node: the schema puts record sets only in a Produce request's
    ``topic_data[].partition_data[].records`` and a Fetch response's
    ``responses[].partitions[].records``, so only the dicts on the way to them are copied
    (the rest is shared: it is pickled, never changed). A body of another shape takes
    the walk."""
    if is_request != (api_key == PRODUCE):
        return body  # a Produce response or a Fetch request: no record sets
    key_t, key_p = ("topic_data", "partition_data") if api_key == PRODUCE else ("responses", "partitions")
    topics = body.get(key_t)
    if type(topics) is not list:
        return _without_record_bytes(body)
    light_topics = []
    for t in topics:
        parts = t.get(key_p) if type(t) is dict else None
        if type(parts) is not list:
            return _without_record_bytes(body)
        light_parts = []
        for part in parts:
            if type(part) is not dict:
                return _without_record_bytes(body)
            rs = part.get("records")
            if rs is not None and hasattr(rs, "batches") and hasattr(rs, "issues"):
                part = dict(part)
                part["records"] = _RecordSetSummary(rs)
            light_parts.append(part)
        light = dict(t)
        light[key_p] = light_parts
        light_topics.append(light)
    light_body = dict(body)
    light_body[key_t] = light_topics
    return light_body


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


def _worker(inp, out, config: DissectConfig | None, jobs: int, me: int, bodies: bool | str,
            render: Any = None, fold: Any = None, parent_pid: int | None = None) -> None:
    if parent_pid is not None:
        die_with_parent(parent_pid)
    pump = None
    try:
        pump = _Pump(inp, INPUT_BYTES)
        _work(pump, out, config, jobs, me, bodies, render, fold)
    except BaseException:  # noqa: BLE001 - reported to the main process, which raises
        out.send(("error", traceback.format_exc()))
    finally:
        if pump is not None:
            pump.close()
        out.close()


class _GivenStreams:
    """The tcp.stream numbers of a worker's TcpReassembler: the reader numbers every packet
    of the capture (run/split.py) and sends the number with it; ``see`` is only ever asked
    about the packet being fed. In a run of packets (TAG_RUN), the number of the packet
    ``stats.packets`` is at ``run_record + stats.packets - run_first`` in ``numbers``."""

    __slots__ = ("number", "numbers", "run_first", "run_record", "stats")

    def __init__(self, stats: Any) -> None:
        self.number: int | None = None
        self.numbers: Any = None  # a run's numbers (int32, -1 for None) while one is fed
        self.run_first = self.run_record = 0
        self.stats = stats

    def see(self, _key: Any, _side: int, _flags: int, _seq: int) -> int | None:
        if self.numbers is not None:
            number = self.numbers[self.run_record + self.stats.packets - self.run_first]
            return None if number < 0 else number
        return self.number


class _Worker:
    """One worker: feeds its dissector the items of the reader's batches (its own packets,
    and the marks, idle checks and notices every worker gets), and sends the rows to the
    main process, tagged, with the watermarks, unordered. ``fold`` (see
    dissect_files_parallel) takes the events it can into a partial result instead."""

    def __init__(self, d: _WorkerDissector, jobs: int, me: int, out, bodies: bool | str, render: Any,
                 fold: Any) -> None:
        self.d = d
        self.me, self.jobs, self.out_pipe, self.bodies, self.render = me, jobs, out, bodies, render
        self.fold = fold
        self.broker_last: dict[str, tuple] = {}  # broker -> merge key of its last folded exchange
        self.streams = _GivenStreams(d.stats)
        d.tcp.streams = self.streams  # type: ignore[assignment]
        self.load = [0] * jobs  # the router's bytes per worker, as of the last batch
        self.items: list = []
        self.seq = 0
        self.keep = 0  # events still to ship with their bodies (a group the main process may rebuild)
        # topic-id lookups (id, name) answered here, for the main process to check after the
        # event being handled (see _found)
        self.check: tuple = ()
        self.progress = 0
        self.fed = 0  # packets (segments) the reader gave this worker
        self.map: Any = None  # the map of the capture file, when the reader sends file offsets

    def batch(self, items: list, records: bytes = b"", numbers: bytes = b"", layout: tuple | None = None) -> None:
        d = self.d
        stats = d.stats
        feed_packet, feed_segment = d.feed_packet, d.feed_segment
        pending = d.pending  # the same list for the whole run (Dissector.pending)
        streams = self.streams
        known = d.known_brokers
        new = tuple.__new__
        chunked = d.takes_chunks
        nums = memoryview(numbers).cast("i") if numbers else None
        offsets = None
        if type(records) is str:  # the runs are at these offsets of the capture file
            records, offsets = self._read_runs(records, items)
        for it in items:
            tag = it[0]
            d.pos = pos = it[1]
            d.phase = PHASE_PACKET
            if tag == TAG_RUN:
                offset = it[3] if offsets is None else next(offsets)
                self.feed_run(pos, it[2], records, offset, nums, it[4], it[5], layout, chunked)
                continue
            if tag == TAG_PACKET:
                stats.packets = pos - 1  # feed_packet counts it: the packet's number in the capture
                streams.number = it[7]
                feed_packet(new(RawPacket, it[2:7]))
                self.fed += 1
            elif tag == TAG_MARK:
                stats.packets = pos
                if pending:
                    self.collect()
                self.mark(it[2])
                continue
            elif tag == TAG_SEGMENT:
                stats.packets = pos
                streams.number = it[4]
                feed_segment(new(TcpSegment, it[2]), it[3])
                self.fed += 1
            elif tag == TAG_ADVANCE:
                stats.packets = pos
                d.advance(it[2])
            elif tag == TAG_BROKER:
                known.quiet = True  # not a decision of this worker's: the main process knows it
                try:
                    known.add(it[2])
                finally:
                    known.quiet = False
            elif tag == TAG_ROWS:
                d.note_rows(it[2])
            elif tag == TAG_SECRETS:
                d.add_tls_secrets(it[2], it[3])
            if pending:
                self.collect()

    def _read_runs(self, path: str, items: list) -> tuple[bytes, Iterator[int]]:
        """This batch's runs, one after the other, and where each is in them: copied once
        out of the map of the capture file (``gather``), only this worker's records (the
        other workers' runs between them are not read; a ``pread`` of the stretch that
        holds them read every worker's)."""
        spans = [(it[3], it[5]) for it in items if it[0] == TAG_RUN]
        if not spans:
            return b"", iter(())
        if self.map is None:
            self.map = _map_file(path)
        end = max(off + n for off, n in spans)
        if end > len(self.map):
            raise RuntimeError(f"--jobs: {path} is shorter than when it was read ({len(self.map)} bytes, "
                               f"a record ends at {end})")
        offsets = []
        at = 0
        for _off, n in spans:
            offsets.append(at)
            at += n
        return _gather(self.map, spans), iter(offsets)

    def feed_run(self, first: int, count: int, records: bytes, offset: int, numbers: Any, record: int,
                 nbytes: int, layout: tuple, chunked: bool) -> None:
        """Packets ``first`` .. ``first + count - 1``, pcap records at ``offset`` of ``records``:
        through the compiled packet loop (Dissector.feed_chunk), which stops at each packet
        that leaves rows (collected there), exactly as feed_packet would take them."""
        d = self.d
        stats = d.stats
        pending = d.pending
        streams = self.streams
        chunk = RecordChunk(records, offset, layout, first - 1)
        stats.packets = first - 1  # counted by the loop: each packet's number in the capture
        streams.numbers, streams.run_first, streams.run_record = numbers, first, record
        d.pos = None  # the packet the loop is at (stats.packets)
        try:
            if not chunked:  # (no compiled packet loop: one RawPacket each)
                self._feed_records(chunk, count)
            left = count if chunked else 0
            while left:
                taken = d.feed_chunk(chunk, left)
                if not taken:
                    raise RuntimeError(f"--jobs: a run of {count} packets from {first} was cut")
                left -= taken
                if pending:
                    self.collect()
                d.phase = PHASE_PACKET  # (an idle flush inside the loop set it)
        finally:
            streams.numbers = None
        if chunked and chunk.pos != offset + nbytes:
            raise RuntimeError(f"--jobs: the run of {count} packets from {first} is not where the reader saw it")
        self.fed += count

    def _feed_records(self, chunk: RecordChunk, count: int) -> None:
        """feed_run without the compiled core: the records as RawPackets, one by one."""
        d = self.d
        _kind, big, nano, rec_len, linktype = chunk.layout
        unpack = struct.Struct((">" if big else "<") + "IIII").unpack_from
        div = 1e9 if nano else 1e6
        buf, pos = chunk.buf, chunk.pos
        for i in range(count):
            sec, frac, caplen, wire = unpack(buf, pos)
            data = buf[pos + rec_len:pos + rec_len + caplen]
            pos += rec_len + caplen
            d.feed_packet(RawPacket(sec + frac / div, linktype, data, max(wire, caplen),
                                    chunk.index + i + 1))
            if d.pending:
                self.collect()
            d.phase = PHASE_PACKET

    def _fold(self, ev: Any, names: _TrackingNames, key: tuple, row_key: int) -> bool:
        """True when the fold took the event (it did not look up a topic id: its part
        of the result is the same with the main process's names)."""
        names.log = log = []
        try:
            plan = self.fold.prepare(ev, names, row_key)
        finally:
            names.log = None
        if plan is None or (log and not self._found(log)):
            return False
        self.fold.commit(plan)
        if type(ev) is Exchange:
            last = self.broker_last.get(ev.broker)
            if last is None or key > last:
                self.broker_last[ev.broker] = key
        return True

    def _found(self, lookups: list | tuple) -> bool:
        """True (and the lookups kept for the main process to check) when every topic id
        looked up had a name here. Topic ids are unique in a cluster, so the global names
        give the same answers; if they do not (an id named differently on another
        connection), the main process goes on in one process. A lookup this worker could
        not answer may have been learned on another worker's connection: that event goes
        to the main process as it is (it may be relabelled there)."""
        for _tid, answer in lookups:
            if answer is None:
                return False
        self.check += tuple(lookups)
        return True

    def _left_out(self, pos: Any, phase: int, order: int, seq: int, row_key: Any) -> None:
        """A count of events the consumer does not get (kept for the fallback's skip)."""
        items = self.items
        last = items[-1] if items else None
        if last is not None and last[0][0] == pos and type(last[1]) is int and last[2] == row_key:
            items[-1] = (last[0], last[1] + 1, row_key)
        else:
            items.append(((pos, phase, order, seq), 1, row_key))

    def collect(self) -> None:
        d, items, bodies, render, fold = self.d, self.items, self.bodies, self.render, self.fold
        names = d.shared.topic_names
        load, me, jobs = self.load, self.me, self.jobs
        events, tags = d.pop_tagged()
        pos = d.pos
        for ev, (phase, order) in zip(events, tags, strict=True):
            self.seq += 1
            seq = self.seq
            row_key = getattr(ev, "order", 0) or pos  # where the row sorts (stream/row_order.py)
            if self.check:  # after the exchange of a group whose lookups were all answered
                items.append(((pos, phase, order, seq), ("chk", self.check), row_key))
                self.check = ()
            if type(ev) is tuple and ev[0] == "grp":
                if self._found(ev[2]):
                    continue  # its events go on as any other, checked by the main process
                self.keep = ev[1]
            elif self.keep:
                self.keep -= 1
                ev = _for_rebuild(ev, bodies)
            elif type(ev) is tuple:
                pass
            elif type(ev) is Exchange and ev.api_key in LEARN_APIS:
                ev = _lighten(ev, bodies)
            elif fold is not None and self._fold(ev, names, (pos, phase, order, seq), row_key):
                continue  # not counted for a fallback's skip: with a fold, a fallback starts over
            elif render is not None:
                # The row's final text (the main process only merges and writes it), or a
                # count of events the consumer does not want (kept for the fallback's skip).
                # A render that looked up topic ids may differ from one with the global
                # names: that event goes to the main process as it is.
                names.log = log = []
                try:
                    text = render(ev, names, bodies is True or load[me] * jobs <= sum(load) * RENDER_SHARE)
                finally:
                    names.log = None
                if log and not self._found(log):
                    text = None
                if text is DROP:
                    self._left_out(pos, phase, order, seq, row_key)
                    continue
                ev = text if text is not None else _lighten(ev, bodies)
            else:
                ev = _lighten(ev, bodies)
            items.append(((pos, phase, order, seq), ev, row_key))
        walked = names.walk
        if walked and events:  # names the compiled walk found: checked after this packet's events
            self.check += tuple(walked)
            walked.clear()
        if self.check:  # the last event's: checked in the same packet's batch, before its rows go
            items.append(((pos, phase, order, seq), ("chk", self.check), row_key))
            self.check = ()

    def mark(self, ts: float) -> None:
        # nothing more at or before pos; no row still to come sorts below the watermark
        self.items.append(((self.d.pos, PHASE_MARK, 0, self.seq), None, self.d.watermark(ts)))

    def ship(self) -> None:
        self.out_pipe.send(("items", self.items, self.progress))
        self.items = []

    def end(self, last_ts: float | None, packets: int, parser_rows: list) -> None:
        d = self.d
        d.pos = packets
        d.stats.packets = packets
        if last_ts is not None:
            d.advance(last_ts)  # the time of the capture's last TCP packet, for the closing rows
        d.finish_rows = parser_rows
        d.pos = END
        d.finish()
        self.collect()


def _work(pump: _Pump, out, config: DissectConfig | None, jobs: int, me: int, bodies: bool | str,
          render: Any = None, fold: Any = None) -> None:
    d = _WorkerDissector(config)
    worker = _Worker(d, jobs, me, out, bodies, render, fold)
    _work_on(worker, pump, out, config, jobs, me, fold)


def _work_on(worker: _Worker, pump: _Pump, out, config: DissectConfig | None, jobs: int, me: int,
             fold: Any) -> None:
    d = worker.d
    loads = pickle.loads
    while True:
        data = pump.get()
        if data is None:
            raise RuntimeError("--jobs reader ended without a result")
        msg = loads(data)
        kind = msg[0]
        if kind == MSG_BATCH:
            _kind, worker.load, worker.progress, items, records, numbers, layout = msg
            worker.batch(items, records, numbers, layout)
            if d.tcp.open_connections() > MAX_OPEN_CONNECTIONS:
                out.send(("fallback", f"more than {MAX_OPEN_CONNECTIONS:,} TCP connections open at once "
                                      f"(worker {me})"))
                return
            worker.ship()
        elif kind == MSG_END:
            _kind, last_ts, packets, parser_rows, issues, reader_counts = msg
            worker.end(last_ts, packets, parser_rows)
            for path, issue in issues:  # worker 0's: the readers' issues (truncated files and the like)
                worker.seq += 1
                worker.items.append(((END, PHASE_ISSUES, 0, worker.seq),
                                     ErrorRow(kind=issue.kind, message=f"{path}: {issue.message}", path=None),
                                     END))
            worker.ship()
            counts = d.packet_counts()
            counts.update({"tcp_" + k: v for k, v in d.byte_counts().items()})  # of its connections
            counts.update(reader_counts)  # the parser's counters are the reader's, whole
            counts["fed"] = worker.fed
            conns = []
            for conn_id, info in d.connections.items():
                if info.conversation is not None:
                    info.conversation = _ConversationStub(info.conversation.stream)
                conns.append((d.first_pos.get(conn_id, 0), conn_id.serial, info))
            if os.environ.get("KWINSPECT_JOBS_DEBUG"):
                import resource
                import sys

                ru = resource.getrusage(resource.RUSAGE_SELF)
                print(f"kwinspect job {me}: cpu {ru.ru_utime + ru.ru_stime:.2f} s, packets {d.stats.tcp_packets}, "
                      f"kafka packets {counts['kafka']}, events {worker.seq}, load {worker.load}", file=sys.stderr)
            partial = (fold.partial(), worker.broker_last) if fold is not None else None
            out.send(("done", counts, conns, [(p, i) for p, i in issues], partial))
            return
        elif kind == MSG_FALLBACK:
            out.send(("fallback", msg[1]))
            return
        else:
            raise RuntimeError(f"--jobs reader failed:\n{msg[1]}")


def _reader(paths: list[str], config: DissectConfig | None, jobs: int, mode: str, outs: list,
            max_open: int) -> None:
    read_and_split(paths, config, jobs, mode, outs, max_open)



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
        # the broker table after each change, with the merge key of the exchange that
        # changed it (a folded exchange's broker id is worked out from it at the end)
        self._broker_history: list[tuple[tuple, dict]] = [((), {})]
        self._ids_given: dict[str, set[int]] = {}  # broker -> the ids exchanges handed on carried
        self._raw_partials: list[tuple[Any, dict[str, tuple]]] = []
        # the workers' partial results with the broker id one process would have given each
        # broker's last exchange among them (see dissect_files_parallel's ``fold``)
        self.partials: list[tuple[Any, dict[str, int | None]]] = []

    # -- end of the run ------------------------------------------------------------
    def final(self, worker: int, counts: dict[str, int], conns: list, partial: Any = None) -> None:
        while len(self._counts) <= worker:
            self._counts.append(None)
        self._counts[worker] = counts
        self._conns.extend((first, w_serial, worker, info) for first, w_serial, info in conns)
        if partial is not None:
            self._raw_partials.append(partial)

    def settle_partials(self) -> None:
        """The broker id of each broker's last folded exchange, as one process gives it."""
        for partial, last_keys in self._raw_partials:
            self.partials.append((partial, {b: self._broker_id_at(b, k) for b, k in last_keys.items()}))
        self._raw_partials = []

    def _broker_id_at(self, broker: str, key: tuple) -> int | None:
        """The broker id the summary keeps for ``broker`` from exchanges folded up to merge
        key ``key``: the last one's, when every id the broker had until then is that one
        or None. Anything else (an id that changed, or was lost) depends on which exchange
        came last in capture order: the run goes on in one process."""
        ep = self._endpoint(broker)
        state = SharedState()
        ids = []
        for at, brokers in self._broker_history:
            if at and at >= key:
                break
            state.brokers = brokers
            ids.append(state.broker_id_for(ep))
        folded = {i for i in ids if i is not None}  # ids some folded exchange may have had
        given = self._ids_given.get(broker, set())
        # None as the last one's: the summary keeps an id handed on if there is one, but
        # cannot tell whether a folded exchange had one of the earlier ids
        if len(folded | given) > 1 or (ids[-1] is None and folded and not given):
            raise _Fallback(f"broker id of {broker} changed during the capture")
        return ids[-1]

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

    def packets_fed(self) -> list[int]:
        """TCP packets (segments) the reader handed each worker: each packet goes to one."""
        return [c["fed"] if c is not None else 0 for c in self._counts]

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

    def _learn(self, ex: Exchange, key: tuple) -> None:
        if ex.status == STATUS_PAIRED and ex.api_key in LEARN_APIS and ex.response is not None:
            self.shared.learn(ex.api_key, ex.response.body)
            if self.shared.brokers != self._broker_history[-1][1]:
                self._broker_history.append((key, dict(self.shared.brokers)))

    def _number(self, ex: Exchange) -> None:
        shared = self.shared
        shared.exchange_counter += 1
        ex.index = shared.exchange_counter
        ex.broker_id = bid = shared.broker_id_for(self._endpoint(ex.broker))
        if bid is not None:
            given = self._ids_given.get(ex.broker)
            if given is None:
                self._ids_given[ex.broker] = {bid}
            elif bid not in given:
                given.add(bid)

    def _strip(self, ex: Any) -> None:
        _lighten(ex, self._bodies)

    def settle(self, batch: list) -> list[tuple[int, Any]]:
        """The events of one packet position (``(event, row key, merge key)``), in order, with
        the global state applied, as ``(row key, item)`` for the RowOrder. Rows rendered
        by the workers (str, or a list of them for one event) are passed on; an int item
        stands for that many events the workers left out (see ``_released``)."""
        out: list[tuple[int, Any]] = []
        i = 0
        n = len(batch)
        while i < n:
            ev, key, mkey = batch[i]
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
                elif tag == "chk":  # topic names a worker used, as the global state must have them
                    names = self.shared.topic_names
                    for tid, answer in ev[1]:
                        if names.get(tid) != answer:
                            raise _Fallback(f"topic id {tid} named differently on two connections")
                else:  # "grp": an exchange (and its error rows) labelled with topic-id lookups
                    _tag, count, lookups, client, broker, args, tcp_stream = ev
                    group = [g for g, _k, _m in batch[i:i + count]]
                    i += count
                    ex = group[0]
                    self._learn(ex, batch[i - count][2])
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
                self._learn(ev, mkey)
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
            merged.final(worker, msg[1], msg[2], msg[4])
            if worker == 0:
                progress[1] = msg[3]
            return
        else:
            raise RuntimeError(f"--jobs worker {worker} failed:\n{msg[1]}")


def dissect_files_parallel(paths, config: DissectConfig | None = None, run: FileRun | None = None,
                           progress: ProgressFn | None = None, *, jobs: int = 2,
                           bodies: bool | str = True, mode: str = "balance",
                           render: Any = None, fold: Any = None) -> Iterator[Event | str]:
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
    process's (rendered and dropped exchanges are not counted).

    ``fold``, a partial result each worker keeps (``analyze.summary.SummaryFold``):
    ``prepare(event, topic_names, row_key)`` -> a plan, or None when the event must go to the
    main process (its part of the result depends on its place in capture order, or on
    other workers' connections); ``commit(plan)`` takes it in; ``partial()`` is what
    the worker sends at the end. Events the workers took are not yielded; at the end
    ``run.dissector.partials`` holds each worker's ``partial()`` with the broker id one
    process would have given the last exchange to each broker it took
    (``MergedDissector._broker_id_at``). If the run has to go on in one process, a
    ``RESTART`` is yielded first: forget what was yielded, every event follows."""
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
        inputs = []
        for i in range(jobs):
            r_in, w_in = ctx.Pipe(duplex=False)
            r, w = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_worker, args=(r_in, w, config, jobs, i, bodies, render, fold, os.getpid()),
                            daemon=True,
                            name=f"kwinspect-job-{i}")
            p.start()
            r_in.close()
            w.close()
            procs.append(p)
            pipes.append(r)
            inputs.append(w_in)
        reader = ctx.Process(target=read_and_split,
                             args=(paths, config, jobs, mode, inputs, MAX_OPEN_CONNECTIONS, os.getpid()),
                             daemon=True, name="kwinspect-job-reader")
        reader.start()
        procs.append(reader)
        for w_in in inputs:
            w_in.close()
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
                batch.append((ev, row_key, key))
            elif watermark is None or row_key < watermark:  # a worker's mark: row_key is its watermark
                watermark = row_key
        for k, item in merged.settle(batch):
            rows.push(k, item)
        yield from _released(rows.pop_all(), released)
        merged.settle_connections()
        merged.settle_partials()
        run.issues.extend(prog[1])
    except _Fallback:
        _stop(procs)
        if fold is not None:
            yield RESTART  # the workers' partial results are lost: every event follows
            released[0] = 0
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
    if os.environ.get("KWINSPECT_JOBS_DEBUG"):
        import resource
        import sys

        ru = resource.getrusage(resource.RUSAGE_SELF)
        print(f"kwinspect main: cpu {ru.ru_utime + ru.ru_stime:.2f} s (start-up included)", file=sys.stderr)


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
