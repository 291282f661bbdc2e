"""Stage 2 of the pipeline: one TCP 4-tuple at a time through the unchanged sans-IO core.

No pyspark here.  A Spark task gets the segments of several connections,
sorted by (connection, capture position); ``dissect_partition`` runs one
``Dissector`` per connection (4-tuple) and emits Arrow batches of the
exchanges, records and errors rows, plus bookkeeping rows.

What the single-process path shares between connections, and how it is
reproduced here (see docs/pipeline.md, "Exactly the single-process result"):

* Topic ids -> names (Metadata responses) and the broker endpoints proven on
  other connections (detection of Kafka on unusual ports) are looked up *as of
  the current capture position*: ``AsOfNames`` / ``AsOfBrokers`` answer from
  this connection's own learning plus a broadcast table of what every other
  connection learned, and at which position.  Pass 1 runs with an empty table
  and records what each connection learned and looked up; connections whose
  lookups could have been answered differently are run again (pass 2) with the
  full table.
* Idle flushing: the single-process Dissector checks for idle connections at
  the first segment (of any connection) at least 60 s after the previous check.
  That schedule is computed once for the whole capture (``idle_checks``) and
  replayed in each connection at the same capture positions.
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from itertools import groupby
from operator import itemgetter
from typing import Any, NamedTuple

import pyarrow as pa

from kwinspect.analyze.schemas import ARROW_TYPES
from kwinspect.capture.packets import TcpSegment
from kwinspect.dissect import DissectConfig, Dissector
from kwinspect.export.tables import CAPTURE_TABLES, LIST_COLUMNS, TABLES, TIMESTAMP_COLUMNS, rows_of
from kwinspect.model import Endpoint, ErrorRow, Exchange
from kwinspect.protocol.schema.api_keys import ApiKey
from kwinspect.run.loop import PacketLoop
from kwinspect.spark.facts import FACT_FIELDS, ConnFacts
from kwinspect.stream.conversation import SharedState
from kwinspect.stream.labels import iter_record_sets

# The capture tables collect() writes itself (records need their exchange's capture time;
# exchanges feed the topic volume); any other one is taken from export.tables.rows_of.
OTHER_CAPTURE_TABLES = tuple(t for t in CAPTURE_TABLES if t not in ("exchanges", "records", "errors"))
PRODUCE = int(ApiKey.PRODUCE)
FETCH = int(ApiKey.FETCH)

Pos = tuple[float, int, int, int]  # (merge timestamp, file rank, range, packet number)
END_POS: Pos = (math.inf, (1 << 31) - 1, (1 << 31) - 1, (1 << 62))
IDLE_CHECK_EVERY = 60.0  # Dissector.feed_segment checks for idle connections this often (capture time)
PRUNE_EVERY = 4096  # segments between two prunings of a connection's packet positions (ConnRun.fed)

_ROW_COLUMNS: list[str] = []
for _cols in (TABLES[t] for t in CAPTURE_TABLES):
    for _c in _cols:
        if _c not in _ROW_COLUMNS:
            _ROW_COLUMNS.append(_c)
# Packet numbers and tcp.stream count the whole capture in order; a task sees one
# connection's segments, so it cannot know them: null here (docs/pipeline.md).
CAPTURE_WIDE_COLUMNS = frozenset({"frame", "response_frame", "tcp_stream"})


def _staging_type(c: str) -> pa.DataType:
    return pa.int64() if c in TIMESTAMP_COLUMNS else ARROW_TYPES[c]


# The one wide schema stage 2 emits: `table` says which of the tables a row belongs
# to ("exchanges", "records", "errors", "volume", or pass-1 bookkeeping: "learn",
# "lookup", "known", "known_lookup", "conn_counts"); timestamps are int64 microseconds.
EVENT_SCHEMA = pa.schema(
    [("table", pa.string()), ("conn", pa.string())]
    + [(c, _staging_type(c)) for c in _ROW_COLUMNS]
    + [("cap_ts", pa.int64()),  # records: capture time of their exchange (for partitioning)
       ("p_kts", pa.float64()), ("p_file", pa.int32()), ("p_rng", pa.int32()), ("p_idx", pa.int64()),
       ("m_key", pa.string()), ("m_value", pa.string()), ("m_port", pa.int32()),
       ("m_records", pa.int64()), ("m_bytes", pa.int64())]
    + FACT_FIELDS  # stats and deliveries facts (kwinspect.spark.facts)
)
_META_COLUMNS = ("cap_ts", "p_kts", "p_file", "p_rng", "p_idx", "m_key", "m_value", "m_port", "m_records",
                 "m_bytes", *(name for name, _type in FACT_FIELDS))

# ---------------------------------------------------------------------------
# Values exactly as the single-process Parquet exporter writes them
# ---------------------------------------------------------------------------

_MIN_US = -62135596800 * 1_000_000
_MAX_US = 253402300799 * 1_000_000 + 999_999
_SURROGATE = re.compile("[\ud800-\udfff]")


def ts_micros(ts: Any) -> int | None:
    """Epoch seconds -> whole microseconds, null outside years 1..9999 (export.writers.ts_to_micros)."""
    if ts is None:
        return None
    try:
        if not math.isfinite(ts):
            return None
        us = round(ts * 1_000_000)
    except (TypeError, ValueError, OverflowError):
        return None
    if us < _MIN_US or us > _MAX_US:
        return None
    return us


def _scalar(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, bytes | bytearray | memoryview):
        return bytes(v).hex()
    if isinstance(v, str) and _SURROGATE.search(v):
        return _SURROGATE.sub(lambda m: f"\\u{ord(m.group(0)):04x}", v)
    return v


def _list(v: Any) -> list[Any] | None:
    if v is None:
        return None
    out = []
    for x in v:
        if isinstance(x, Mapping):
            out.append({"key": _scalar(x.get("key")), "value": _scalar(x.get("value")),
                        "value_encoding": _scalar(x.get("value_encoding"))})
        else:
            out.append(_scalar(x))
    return out


def clean_value(column: str, v: Any) -> Any:
    if column in TIMESTAMP_COLUMNS:
        return ts_micros(v)
    if column in LIST_COLUMNS:
        return _list(v)
    return _scalar(v)


class EventBuffer:
    """Rows of EVENT_SCHEMA collected column-wise, handed out as record batches."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.cols: dict[str, list[Any]] = {f.name: [] for f in EVENT_SCHEMA}
        self.n = 0

    def add(self, table: str, conn: str, row: Mapping[str, Any] | None = None, **meta: Any) -> None:
        cols = self.cols
        cols["table"].append(table)
        cols["conn"].append(conn)
        row = row or {}
        for c in _ROW_COLUMNS:
            cols[c].append(clean_value(c, row[c]) if c in row and c not in CAPTURE_WIDE_COLUMNS else None)
        for c in _META_COLUMNS:
            cols[c].append(meta.get(c))
        self.n += 1

    def batch(self) -> pa.RecordBatch:
        out = pa.RecordBatch.from_arrays(
            [pa.array(self.cols[f.name], type=f.type) for f in EVENT_SCHEMA], schema=EVENT_SCHEMA)
        self._reset()
        return out


def _pos_meta(pos: Pos) -> dict[str, Any]:
    kts = pos[0] if math.isfinite(pos[0]) else None
    return {"p_kts": kts, "p_file": pos[1], "p_rng": pos[2], "p_idx": pos[3]}


def pos_of(kts: float | None, file: int, rng: int, idx: int) -> Pos:
    return (math.inf if kts is None else kts, file, rng, idx)


# ---------------------------------------------------------------------------
# Cross-connection state, as of the current capture position
# ---------------------------------------------------------------------------

# name table: topic id -> sorted [(pos, name, conn)]; brokers: (ip, port) -> sorted [(pos, conn)]
GlobalNames = dict[str, list[tuple[Pos, str, str]]]
GlobalBrokers = dict[tuple[str, int], list[tuple[Pos, str]]]


def compact_names(entries: list[tuple[Pos, str, str]]) -> list[tuple[Pos, str, str]]:
    """Sorted learn entries of one topic id -> the few that decide every as-of answer.

    "The latest entry at or before P from a connection other than C" has the same
    name for the whole run of consecutive same-name entries as long as the run
    holds an entry of some other connection before P: the run's first entry, or
    the first entry of a different connection than the first's, is enough.
    """
    out: list[tuple[Pos, str, str]] = []
    i, n = 0, len(entries)
    while i < n:
        name = entries[i][1]
        j = i
        second = None
        while j < n and entries[j][1] == name:
            if second is None and entries[j][2] != entries[i][2]:
                second = entries[j]
            j += 1
        out.append(entries[i])
        if second is not None:
            out.append(second)
        i = j
    return out


def compact_brokers(entries: list[tuple[Pos, str]]) -> list[tuple[Pos, str]]:
    """Sorted (pos, conn) of one endpoint -> the first entry and the first of another connection."""
    if not entries:
        return entries
    out = [entries[0]]
    for e in entries[1:]:
        if e[1] != entries[0][1]:
            out.append(e)
            break
    return out


class AsOfNames(dict):
    """SharedState.topic_names for one connection: its own learning plus everyone else's up to now.

    Stores (pos, name) internally; only get / [] / in / bool are used by the core.
    """

    def __init__(self, run: ConnRun, table: GlobalNames) -> None:
        super().__init__()
        self._run = run
        self._table = table

    def __bool__(self) -> bool:
        return True

    def __setitem__(self, tid: str, name: str) -> None:
        run = self._run
        dict.__setitem__(self, tid, (run.pos, name))
        runs = run.learned.setdefault(tid, [])
        if runs and runs[-1][0] == name:
            runs[-1][2] = run.pos  # same name again: extend the run
        else:
            runs.append([name, run.pos, run.pos])

    def _resolve(self, tid: Any) -> str | None:
        run = self._run
        local = dict.get(self, tid)
        if isinstance(tid, str):  # what pass 1 answered, and until where (for the re-run decision)
            key = (tid, None if local is None else local[1])
            prev = run.lookups.get(key)
            if prev is None or prev < run.pos:
                run.lookups[key] = run.pos
        best = local
        for pos, name, conn in reversed(self._table.get(tid, ())):
            if conn == run.conn or pos > run.pos:
                continue
            if best is None or pos > best[0]:
                best = (pos, name)
            break
        return None if best is None else best[1]

    def get(self, tid: Any, default: Any = None) -> Any:
        name = self._resolve(tid)
        return default if name is None else name

    def __getitem__(self, tid: Any) -> str:
        name = self._resolve(tid)
        if name is None:
            raise KeyError(tid)
        return name

    def __contains__(self, tid: Any) -> bool:
        return self._resolve(tid) is not None


class AsOfBrokers(set):
    """Dissector.known_brokers for one connection, as of the current capture position."""

    def __init__(self, run: ConnRun, table: GlobalBrokers) -> None:
        super().__init__()
        self._run = run
        self._table = table

    def add(self, ep: Endpoint) -> None:
        self._run.known_added.append((self._run.pos, ep))
        set.add(self, ep)

    def __contains__(self, ep: Any) -> bool:
        run = self._run
        key = (ep.ip, ep.port)
        local = set.__contains__(self, ep)
        if not local:  # answers True locally stay True with more knowledge
            run.known_lookups.add((key, run.pos))
            return any(conn != run.conn and pos <= run.pos for pos, conn in self._table.get(key, ()))
        return True


# ---------------------------------------------------------------------------
# The idle-check schedule of the whole capture
# ---------------------------------------------------------------------------


def idle_checks(ts: Any, positions: Callable[[int], Pos]) -> list[tuple[Pos, float]]:
    """Where Dissector.feed_segment runs flush_idle: (position, segment ts) for every check.

    `ts` holds every TCP segment's timestamp in capture order (a numpy array);
    `positions(i)` gives the i-th segment's position.  Mirrors the Dissector:
    a check at the first segment whose ts >= the previous check's ts + 60 s.
    """
    import numpy as np

    ts = np.asarray(ts, dtype=np.float64)
    n = len(ts)
    out: list[tuple[Pos, float]] = []
    if n == 0:
        return out
    pm = np.maximum.accumulate(ts)
    nxt = 0.0
    i = 0
    if ts[0] < nxt:  # timestamps before 1970: walk to the first one >= 0
        i = int(np.searchsorted(pm, nxt, "left"))
    while i < n:
        out.append((positions(i), float(ts[i])))
        nxt = float(ts[i]) + IDLE_CHECK_EVERY
        if nxt > pm[i]:
            i = int(np.searchsorted(pm, nxt, "left"))
        else:  # timestamps went backwards before i: scan
            j = i + 1
            while j < n and ts[j] < nxt:
                j += 1
            i = j
    return out


# ---------------------------------------------------------------------------
# One connection (4-tuple)
# ---------------------------------------------------------------------------


class PosSegment(NamedTuple):
    """One TCP segment of a task's input, with its place in the whole capture."""

    ts: float
    pos: Pos
    seg: TcpSegment


class ConnRun(PacketLoop):
    """The packet loop (run/loop.py) over the segments of one 4-tuple, fed in capture
    order: each segment goes to the connection's Dissector between the capture-wide
    idle checks that fall before and at it, and the rows go to ``events`` (an
    EventBuffer, ordered later by their positions); ``run()`` yields True whenever
    rows were added, so the caller can cut a batch."""

    def __init__(self, conn: str, config: DissectConfig, events: EventBuffer, *, values: str,
                 want_records: bool, checks: list[tuple[Pos, float]] | None,
                 names: GlobalNames, brokers: GlobalBrokers, meta: bool, stats: bool = False,
                 deliveries: bool = False) -> None:
        self.conn = conn
        self.events = events
        self.meta = meta
        self.values = values
        self.want_records = want_records
        self.pos: Pos = (-math.inf, 0, 0, 0)
        self.learned: dict[str, list[list[Any]]] = {}  # topic id -> runs [name, first pos, last pos]
        self.lookups: dict[tuple[str, str | None], Pos] = {}  # (topic id, answer) -> last position
        self.known_added: list[tuple[Pos, Endpoint]] = []
        self.known_lookups: set[tuple[tuple[str, int], Pos]] = set()  # answered False locally
        self.decisions: list[tuple[Pos, Endpoint, Endpoint]] = []  # Kafka found: (pos, client, broker)
        self._decided: set[int] = set()
        self.names = AsOfNames(self, names)
        # facts for the cross-connection tables, and where each exchange sits in capture
        # order: this connection's segments are its packets 1, 2, ... (packet numbers end
        # up only in the capture-wide columns, left null here), and `fed` maps them back
        # to capture positions (pruned below the dissector's watermark, so it stays small)
        self.facts = (ConnFacts(self._fact, stats=stats, kafka_ports=config.kafka_ports, deliveries=deliveries,
                                values=values) if stats or deliveries else None)
        self.fed: list[Pos] = []
        self.fed_base = 1
        self.prune_at = PRUNE_EVERY
        self.seq = 0
        # with `checks`, the capture-wide idle-check schedule replaces the dissector's own
        self.d = Dissector(config, shared=SharedState(topic_names=self.names),
                           known_brokers=AsOfBrokers(self, brokers), idle_checks=checks is None,
                           on_close=self._closed if self.facts is not None else None)
        super().__init__(self.d, ordered=False, stop_unparseable=False)
        self.checks = checks
        self.ci = 0
        self.started = False

    def _run_checks(self, upto: Pos, inclusive: bool) -> None:
        checks = self.checks
        if checks is None:
            return
        if not self.started:
            self.ci = bisect.bisect_left(checks, (upto,))  # checks before the first segment: nothing open
            self.started = True
        n = len(checks)
        d = self.d
        while self.ci < n and (checks[self.ci][0] < upto or (inclusive and checks[self.ci][0] == upto)):
            if d.tcp.open_connections() == 0:  # nothing to flush until the next own segment
                self.ci = (bisect.bisect_right(checks, (upto, math.inf)) if inclusive
                           else bisect.bisect_left(checks, (upto,)))
                break
            pos, ts = checks[self.ci]
            self.ci += 1
            self.pos = pos
            d.flush_idle(ts)  # what Dissector.feed_segment does at a check
            self.collect(pos)

    def feed(self, item: PosSegment) -> None:
        pos, seg = item.pos, item.seg
        self._run_checks(pos, inclusive=False)
        self.pos = pos
        d = self.d
        if self.facts is not None:
            self.fed.append(pos)
            # the Dissector numbers packets in feed_packet; fed segments here, this run numbers
            # them (its packet count), so that Exchange.order names this connection's packet
            d.stats.packets = self.fed_base + len(self.fed) - 1
        kafka_before = d.stats.kafka_connections
        d.feed_segment(seg)
        if d.stats.kafka_connections != kafka_before:
            for info in d.connections.values():
                if info.kind == "kafka" and id(info) not in self._decided:
                    self._decided.add(id(info))
                    self.decisions.append((pos, info.client, info.broker))
        self.collect(pos)  # before the checks at this position, which flush under their own
        self._run_checks(pos, inclusive=True)
        if self.facts is not None and len(self.fed) >= self.prune_at:  # after the segment is in
            self._prune()
            self.prune_at = len(self.fed) + PRUNE_EVERY

    def end(self) -> None:
        if self.checks is not None and self.d.tcp.open_connections():
            self._run_checks(END_POS, inclusive=False)
        self.pos = END_POS
        self.d.finish()
        self.collect(END_POS)
        if self.meta:
            self._emit_meta()

    def _prune(self) -> None:
        """Forget the positions of packets before the oldest message still pending."""
        keep_from = self.d.watermark(self.pos[0] if math.isfinite(self.pos[0]) else 0.0, max_wait=math.inf)
        drop = min(len(self.fed), max(0, keep_from - self.fed_base))
        if drop:
            del self.fed[:drop]
            self.fed_base += drop

    def order_pos(self, order: int) -> Pos:
        """The capture position of this connection's packet number ``order`` (Exchange.order)."""
        i = order - self.fed_base
        if 0 <= i < len(self.fed):
            return self.fed[i]
        return self.pos  # a row found at a check or the end: where it was found

    def _fact(self, table: str, pos: Pos, seq: int, sub: int, **columns: Any) -> None:
        # the end of the input sorts last: +inf, not null (which Spark sorts first)
        self.events.add(table, self.conn, None, p_kts=pos[0], p_file=pos[1], p_rng=pos[2], p_idx=pos[3],
                        o_seq=seq, o_sub=sub, **columns)

    def _closed(self, info: Any) -> None:
        self.seq += 1
        self.facts.closed(info, self.pos, self.seq)  # type: ignore[union-attr]

    def collect(self, _pos: object) -> None:
        """The dissector's rows into the EventBuffer, at ``self.pos``."""
        out, conn = self.events, self.conn
        if not self.d.has_events:
            return
        self.out.append(True)
        facts = self.facts
        for ev in self.d.drain():
            if isinstance(ev, Exchange):
                out.add("exchanges", conn, ev.row())
                if facts is not None:
                    self.seq += 1
                    facts.exchange(ev, self.names, self.order_pos(ev.order), self.seq, self.pos)
                self._volume(ev)
                if self.want_records:
                    cap = ts_micros(ev.request_ts if ev.api_key == PRODUCE else ev.response_ts)
                    for rec in rows_of("records", ev, values=self.values, topic_names=self.names):
                        out.add("records", conn, rec.row(), cap_ts=cap)
            elif isinstance(ev, ErrorRow):
                out.add("errors", conn, ev.row())
            for table in OTHER_CAPTURE_TABLES:  # any further per-event table, as its exporter makes it
                for row in rows_of(table, ev, values=self.values, topic_names=self.names):
                    out.add(table, conn, row.row())

    def _volume(self, ex: Exchange) -> None:
        if ex.api_key == PRODUCE:
            msg, direction, ts = ex.request, "produce", ex.request_ts
        elif ex.api_key == FETCH:
            msg, direction, ts = ex.response, "fetch", ex.response_ts
        else:
            return
        if msg is None or not msg.body:
            return
        for topic, _partition, rs in iter_record_sets(ex.api_key, msg.body, self.names):
            self.events.add("volume", self.conn, {"topic": topic, "direction": direction, "ts": ts},
                         m_records=rs.record_count, m_bytes=rs.size)

    def _emit_meta(self) -> None:
        out, conn = self.events, self.conn
        for tid, runs in self.learned.items():
            for name, first, last in runs:
                out.add("learn", conn, m_key=tid, m_value=name, **_pos_meta(first))
                if last != first:
                    out.add("learn", conn, m_key=tid, m_value=name, **_pos_meta(last))
        for (tid, answer), pos in self.lookups.items():
            out.add("lookup", conn, m_key=tid, m_value=answer, **_pos_meta(pos))
        for pos, ep in self.known_added:
            out.add("known", conn, m_key=ep.ip, m_port=ep.port, **_pos_meta(pos))
        for (ip, port), pos in self.known_lookups:
            out.add("known_lookup", conn, m_key=ip, m_port=port, **_pos_meta(pos))
        for pos, client, broker in self.decisions:
            out.add("decision", conn, m_key=client.ip, m_port=client.port, m_value=str(broker),
                    **_pos_meta(pos))
        st = self.d.stats
        out.add("conn_counts", conn, m_records=st.connections, m_port=st.kafka_connections, m_bytes=st.kafka_bytes)


def dissect_partition(batches: Iterable[pa.RecordBatch], *, config: DissectConfig, values: str,
                      want_records: bool, checks: list[tuple[Pos, float]] | None, names: GlobalNames,
                      brokers: GlobalBrokers, meta: bool, stats: bool = False, deliveries: bool = False,
                      batch_rows: int = 4096
                      ) -> Iterator[pa.RecordBatch]:
    """Segments sorted by (conn, kts, file, rng, idx) in; EVENT_SCHEMA batches out."""
    out = EventBuffer()
    for conn, items in groupby(_segments(batches), key=itemgetter(0)):
        run = ConnRun(conn, config, out, values=values, want_records=want_records, checks=checks,
                      names=names, brokers=brokers, meta=meta, stats=stats, deliveries=deliveries)
        for _added in run.run(item for _conn, item in items):
            if out.n >= batch_rows:
                yield out.batch()
    if out.n:
        yield out.batch()


def _segments(batches: Iterable[pa.RecordBatch]) -> Iterator[tuple[str, PosSegment]]:
    """(connection, segment) for each row of the task's sorted input."""
    for b in batches:
        c = b.to_pydict()
        conns, kts, files, rngs, idxs = c["conn"], c["kts"], c["file"], c["rng"], c["idx"]
        tss, sips, sports, dips, dports = c["ts"], c["src_ip"], c["src_port"], c["dst_ip"], c["dst_port"]
        seqs, acks, flags, payloads, missing = c["seq"], c["ack"], c["flags"], c["payload"], c["missing"]
        for i in range(b.num_rows):
            seg = TcpSegment(tss[i], Endpoint(sips[i], sports[i]), Endpoint(dips[i], dports[i]),
                             seqs[i], acks[i], flags[i], payloads[i], idxs[i], missing[i] or 0)
            yield conns[i], PosSegment(tss[i], pos_of(kts[i], files[i], rngs[i], idxs[i]), seg)
