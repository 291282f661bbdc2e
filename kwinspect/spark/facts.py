"""What each connection tells the cross-connection tables, and the reducers that join it.

No pyspark here (this runs on executors).  `stats` and `deliveries` are not
per-connection tables: a minute's latency percentiles take the latencies of every
connection, a consumer's lag takes high watermarks from Fetches to one broker and
commits sent to another, a produced record is fetched on other connections.  So
stage 2 emits *facts* (rows of the wide EVENT_SCHEMA, `table` saying which kind),
each with its place in capture order, and Spark brings together what belongs
together (kwinspect.spark.joins); the functions below then do, per group, exactly
what the single-process code does, with its own classes:

* ``stats_reduce``: the observations of one (interval, series, dimensions) key, in
  capture order, through a ``TrafficStats`` -> its rows;
* ``lag_replay``: the offset facts of one (topic, partition), in capture order,
  through a ``LagTracker`` -> consumer/fetch lag observations;
* ``commit_sweep``: the acknowledged records and the commits of one (topic,
  partition), in capture order -> the first commit that covered each record;
* ``delivery_rows``: one record with its joined fetches, failed attempts and
  commit -> its row, made by the single-process ``Delivery``.

Capture order here is the order the single-process table commands see the rows in:
by the packet holding the request's first byte (``Exchange.order``, which
stream/row_order.py sorts by), as a capture-wide position, then as emitted.
"""

from __future__ import annotations

import bisect
import math
import pickle
from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa

from kwinspect.analyze.deliveries import (
    GROUP_APIS,
    OFFSET_COMMIT,
    TXN_OFFSET_COMMIT,
    Delivery,
    Fetch,
    commits_of,
    fill_groups,
    group_named,
    link_key,
    new_delivery,
    produce_errors,
    raw_value,
)
from kwinspect.analyze.delivery_columns import DELIVERY_COLUMNS, DELIVERY_TIMESTAMP_COLUMNS
from kwinspect.analyze.lag import LagTracker, OffsetFact, lag_facts
from kwinspect.analyze.record_rows import INTERNAL_TOPICS, records_from_exchange
from kwinspect.analyze.schemas import ARROW_TYPES
from kwinspect.analyze.stats import (
    DIMENSIONS,
    FAMILIES,
    STATS_COLUMNS,
    Observation,
    SeriesObserver,
    TrafficStats,
    refused_attempt,
)
from kwinspect.model import STATUS_PAIRED, Exchange
from kwinspect.protocol.errors import error_name
from kwinspect.protocol.schema.api_keys import ApiKey

PRODUCE, FETCH = int(ApiKey.PRODUCE), int(ApiKey.FETCH)

STATS_INTERVAL_S = 60.0  # the pipeline's stats table: per minute, as `kwinspect stats -i 1m`
# The pipeline has no label cap: Spark aggregates in bounded memory whatever the number
# of distinct values (the single-process cap, --max-labels, guards one process's memory).
NO_LABEL_CAP = 1 << 62
# families observed per exchange on its connection; lag takes every connection's facts
# (lag_replay), connections the refusals' look-up of brokers seen elsewhere
LOCAL_FAMILIES = tuple(f for f in FAMILIES if f != "lag")

# Columns the facts add to EVENT_SCHEMA (o_*: an observation or an offset fact)
FACT_FIELDS = [
    ("o_series", pa.string()), ("o_interval", pa.int64()), ("o_ts", pa.float64()), ("o_value", pa.float64()),
    ("o_api_name", pa.string()), ("o_api_version", pa.int32()), ("o_broker", pa.string()),
    ("o_client_id", pa.string()), ("o_topic", pa.string()), ("o_partition", pa.int32()),
    ("o_group_id", pa.string()), ("o_offset", pa.int64()), ("o_seq", pa.int64()), ("o_sub", pa.int32()),
    ("o_blob", pa.binary()),  # deliveries: an acknowledged record's own columns (pickled)
]
OBS_COLUMNS = ("o_series", "o_interval", "o_ts", "o_value", "o_api_name", "o_api_version", "o_broker",
               "o_client_id", "o_topic", "o_partition", "o_group_id")
DIM_COLUMNS = tuple(f"o_{d}" for d in DIMENSIONS)
ORDER_COLUMNS = ("p_kts", "p_file", "p_rng", "p_idx", "o_seq", "o_sub")
FACT_SCHEMA = pa.schema(FACT_FIELDS + [("p_kts", pa.float64()), ("p_file", pa.int32()), ("p_rng", pa.int32()),
                                       ("p_idx", pa.int64())])
OBS_SCHEMA = pa.schema([f for f in FACT_SCHEMA if f.name in (*OBS_COLUMNS, *ORDER_COLUMNS)])
# the stats rows as staged: interval_start in int64 microseconds (made a timestamp in Spark)
STATS_STAGE_SCHEMA = pa.schema([(c, pa.int64() if c == "interval_start" else ARROW_TYPES[c])
                                for c in STATS_COLUMNS])
DELIVERIES_STAGE_SCHEMA = pa.schema([(c, pa.int64() if c in DELIVERY_TIMESTAMP_COLUMNS else ARROW_TYPES[c])
                                     for c in DELIVERY_COLUMNS])
COMMIT_SCHEMA = pa.schema([("o_topic", pa.string()), ("o_partition", pa.int32()), ("o_offset", pa.int64()),
                           ("commit_group", pa.string()), ("commit_offset", pa.int64()),
                           ("commit_ts", pa.float64())])
# an acknowledged record's columns that travel in o_blob
BLOB_FIELDS = ("topic", "partition", "offset", "key", "key_encoding", "value_digest", "value_size",
               "producer_client_id", "producer_id", "producer_epoch", "sequence", "produce_ts", "ack_ts",
               "produce_stream", "produce_correlation_id")


def interval_of(ts: float) -> int:
    return math.floor(ts / STATS_INTERVAL_S)


class ConnFacts:
    """The facts of one connection's exchanges and closes, added to an EventBuffer.

    ``add(table, pos, seq, sub, **columns)`` is the buffer's writer (ConnRun's)."""

    def __init__(self, add: Any, *, stats: bool, kafka_ports: frozenset[int], deliveries: bool = False,
                 values: str = "auto") -> None:
        self.add = add
        self.stats = stats
        self.deliveries = deliveries
        self.values = values
        self.kafka_ports = kafka_ports
        self.observer = SeriesObserver(NO_LABEL_CAP, LOCAL_FAMILIES)
        self.brokers_seen: set[str] = set()

    def exchange(self, ex: Exchange, names: Any, order: tuple, seq: int, drain_pos: tuple) -> None:
        if self.deliveries:
            self._delivery_facts(ex, names, order, seq)
        if not self.stats:
            return
        sub = 0
        for obs in self.observer.exchange(ex, names):
            self._obs("obs", obs, order, seq, sub)
            sub += 1
        ts = ex.request_ts if ex.request_ts is not None else ex.response_ts  # the observer's
        sample_ts = ex.response_ts if ex.response_ts is not None else ex.request_ts
        for f in lag_facts(ex, names):
            self.add("lagfact", order, seq, sub, o_series=f.kind, o_topic=f.topic, o_partition=f.partition,
                     o_offset=f.offset, o_group_id=f.group_id, o_client_id=ex.client_id, o_ts=ts,
                     o_value=sample_ts)
            sub += 1
        if ex.broker and ex.broker not in self.brokers_seen:  # refusals look these up
            self.brokers_seen.add(ex.broker)
            self.add("bseen", drain_pos, seq, 0, o_broker=ex.broker)

    def closed(self, info: Any, pos: tuple, seq: int) -> None:
        """A connection's on_close: opened/closed counts, or a refusal candidate."""
        if not self.stats:
            return
        if info.kind == "kafka":
            for sub, obs in enumerate(self.observer.connection(info, self.kafka_ports)):
                self._obs("obs", obs, pos, seq, sub)
            if info.broker is not None:
                self.add("bseen", pos, seq, 0, o_broker=str(info.broker))
        elif (info.client is not None and info.broker is not None and info.first_ts is not None
              and refused_attempt(info)):
            # counted when the broker was seen before, anywhere in the capture (joins)
            self.add("refusal", pos, seq, 0, o_series="connections_refused", o_ts=info.first_ts,
                     o_interval=interval_of(info.first_ts), o_value=1.0, o_broker=str(info.broker),
                     o_offset=1 if info.broker.port in self.kafka_ports else 0)

    def _delivery_facts(self, ex: Exchange, names: Any, order: tuple, seq: int) -> None:
        """What DeliveryTracker.add takes from an exchange, as rows: acknowledged records
        (d_ack), failed attempts (d_fail), the Produce request itself (d_req), fetched
        offsets (d_fetch), groups named (d_group), accepted commits (d_commit)."""
        if ex.request is None and ex.response is None:
            return
        add = self.add
        who = {"o_client_id": ex.client_id, "m_port": ex.correlation_id, "m_value": ex.stream}
        sub = 0
        if ex.api_key == PRODUCE and ex.request is not None:
            errors, failed_as = produce_errors(ex, names)
            acked = False
            for row in records_from_exchange(ex, values="auto", topic_names=names):
                if row.is_control or row.topic in INTERNAL_TOPICS:
                    continue
                sub += 1
                if row.offset is None:
                    code = errors.get((row.topic, row.partition))
                    why = error_name(code) if code else failed_as
                    if why is not None:
                        add("d_fail", order, seq, sub, m_key=_link_text(link_key(row, raw_value(row))),
                            o_series=why, o_ts=ex.request_ts, **who)
                    continue
                acked = True
                d, raw = new_delivery(ex, row, self.values)
                add("d_ack", order, seq, sub, o_topic=row.topic, o_partition=row.partition, o_offset=row.offset,
                    m_key=_link_text(link_key(row, raw)), o_ts=ex.request_ts,
                    o_blob=pickle.dumps(tuple(getattr(d, f) for f in BLOB_FIELDS)), **who)
            add("d_req", order, seq, 0, o_ts=ex.request_ts, o_offset=int(acked), **who)
        elif ex.api_key == FETCH and ex.response is not None:
            ts = ex.response_ts if ex.response_ts is not None else ex.request_ts
            for row in records_from_exchange(ex, values="hex", topic_names=names):
                if row.offset is None or row.is_control:
                    continue
                sub += 1
                add("d_fetch", order, seq, sub, o_topic=row.topic, o_partition=row.partition, o_offset=row.offset,
                    o_ts=ts, **who)
        if ex.api_key in GROUP_APIS:
            group = group_named(ex)
            if group and ex.client_id:
                add("d_group", order, seq, 0, o_client_id=ex.client_id, o_group_id=group)
            if ex.api_key in (OFFSET_COMMIT, TXN_OFFSET_COMMIT) and group and ex.status == STATUS_PAIRED:
                ts = ex.response_ts if ex.response_ts is not None else ex.request_ts
                for topic, index, committed in commits_of(ex, names):
                    sub += 1
                    add("d_commit", order, seq, sub, o_topic=topic, o_partition=index, o_offset=committed,
                        o_group_id=group, o_ts=ts)

    def _obs(self, table: str, obs: Observation, pos: tuple, seq: int, sub: int) -> None:
        self.add(table, pos, seq, sub, o_series=obs.series, o_ts=obs.ts, o_interval=interval_of(obs.ts),
                 o_value=float(obs.value), **dict(zip(DIM_COLUMNS, obs.dims, strict=True)))


# ---------------------------------------------------------------------------
# Reducers (run inside Spark tasks, on rows Spark grouped and sorted)
# ---------------------------------------------------------------------------


def _rows(batches: Iterable[pa.RecordBatch]) -> Iterator[dict[str, Any]]:
    for b in batches:
        yield from b.to_pylist()


def _groups(rows: Iterator[dict[str, Any]], key: tuple[str, ...]) -> Iterator[list[dict[str, Any]]]:
    """Runs of consecutive rows with equal ``key`` columns (Spark sorted them so)."""
    run: list[dict[str, Any]] = []
    current: tuple | None = None
    for r in rows:
        k = tuple(r[c] for c in key)
        if run and k != current:
            yield run
            run = []
        current = k
        run.append(r)
    if run:
        yield run


def _batch(rows: list[dict[str, Any]], schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(rows, schema=schema)


def stats_reduce(batches: Iterable[pa.RecordBatch], batch_rows: int = 4096) -> Iterator[pa.RecordBatch]:
    """Observations sorted by (interval, series, dimensions, capture order) -> stats rows.

    Each key's observations go through a TrafficStats of their own, in capture order:
    the counters summed, the newest gauge kept, the latency rows (count, sum, buckets,
    nearest-rank percentiles, max) made by the single-process code itself."""
    out: list[dict[str, Any]] = []
    key = ("o_interval", "o_series", *DIM_COLUMNS)
    for run in _groups(_rows(batches), key):
        stats = TrafficStats(STATS_INTERVAL_S, label_cap=NO_LABEL_CAP)
        stats.take(Observation(r["o_series"], r["o_ts"], tuple(r[c] for c in DIM_COLUMNS), r["o_value"])
                   for r in run)
        for row in stats.rows():
            row["interval_start"] = _micros(row["interval_start"])
            out.append(row)
        if len(out) >= batch_rows:
            yield _batch(out, STATS_STAGE_SCHEMA)
            out = []
    if out:
        yield _batch(out, STATS_STAGE_SCHEMA)


def _micros(seconds: float) -> int:
    return round(seconds * 1_000_000)


def lag_replay(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Offset facts sorted by (topic, partition, capture order) -> lag observations.

    One LagTracker per partition, fed each exchange's facts together, as
    LagTracker.add feeds them in one process (a partition's lag never depends on
    another partition's facts)."""
    out: list[dict[str, Any]] = []
    for part in _groups(_rows(batches), ("o_topic", "o_partition")):
        tracker = LagTracker(max_keys=NO_LABEL_CAP)
        observer = SeriesObserver(NO_LABEL_CAP, ("lag",))
        for ex_facts in _groups(iter(part), ("p_kts", "p_file", "p_rng", "p_idx", "o_seq")):
            first = ex_facts[0]
            facts = [OffsetFact(r["o_series"], r["o_topic"], r["o_partition"], r["o_offset"], r["o_group_id"])
                     for r in ex_facts]
            samples = tracker.add_facts(facts, first["o_value"], first["o_client_id"])
            for sub, obs in enumerate(observer.lag_observations(samples, first["o_ts"], first["o_client_id"])):
                out.append({"o_series": obs.series, "o_interval": interval_of(obs.ts), "o_ts": obs.ts,
                            "o_value": float(obs.value), **dict(zip(DIM_COLUMNS, obs.dims, strict=True)),
                            **{c: first[c] for c in ("p_kts", "p_file", "p_rng", "p_idx", "o_seq")},
                            "o_sub": first["o_sub"] * 1000 + sub})
        if len(out) >= 4096:
            yield _batch(out, OBS_SCHEMA)
            out = []
    if out:
        yield _batch(out, OBS_SCHEMA)


def _link_text(link: Any) -> str:
    """A link key as a join key: a (producer id, epoch, topic, partition, sequence) or a fingerprint."""
    return link.hex() if isinstance(link, bytes) else repr(link)


def commit_sweep(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Acknowledged records (table d_ack) and commits (d_commit) of each (topic, partition),
    sorted by capture order -> (topic, partition, offset, the first commit covering it).

    DeliveryTracker's rule: a commit of offset C covers, in offset order, the records
    acknowledged before it from its partition's commit frontier up to C; a record
    acknowledged below the frontier (out of offset order) is passed by without one.
    Only the frontier and the records above it are held."""
    out: list[dict[str, Any]] = []
    for part in _groups(_rows(batches), ("o_topic", "o_partition")):
        frontier: int | None = None  # the highest offset the frontier has passed
        waiting: list[int] = []  # offsets above the frontier, sorted
        for r in part:
            if r["table"] == "d_ack":
                off = r["o_offset"]
                if frontier is not None and off < frontier:
                    continue  # inserted below the frontier: never covered
                bisect.insort(waiting, off)
                continue
            committed = r["o_offset"]
            i = 0
            while i < len(waiting) and waiting[i] < committed:
                out.append({"o_topic": r["o_topic"], "o_partition": r["o_partition"], "o_offset": waiting[i],
                            "commit_group": r["o_group_id"], "commit_offset": committed, "commit_ts": r["o_ts"]})
                i += 1
            if i:
                frontier = waiting[i - 1]
                del waiting[:i]
            if len(out) >= 4096:
                yield _batch(out, COMMIT_SCHEMA)
                out = []
    if out:
        yield _batch(out, COMMIT_SCHEMA)


class _Request:
    """What DeliveryTracker's mirror test reads of the acknowledging exchange."""

    __slots__ = ("client_id", "correlation_id", "stream", "request_ts")

    def __init__(self, client_id, correlation_id, stream, request_ts) -> None:
        self.client_id, self.correlation_id, self.stream, self.request_ts = \
            client_id, correlation_id, stream, request_ts


def delivery_rows(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """One joined row per acknowledged record -> its deliveries row.

    In: o_blob (the record's own columns), extra_attempts (later acknowledgments at
    the same offset that were not the same request), the failed attempts linked to it
    (fail_n, fail_errors, the last one's client/correlation id/time/stream), its fetches
    in capture order (client, correlation id, stream, time, group then, group named
    last), its commit.  The Delivery of the single-process tracker makes the row."""
    from kwinspect.spark.connection import clean_value

    out: list[dict[str, Any]] = []
    for r in _rows(batches):
        d = Delivery()
        for name, value in zip(BLOB_FIELDS, pickle.loads(r["o_blob"]), strict=True):
            setattr(d, name, value)
        d.produce_attempts += r["extra_attempts"] or 0
        if r["fail_n"]:
            last = (r["fail_client_id"], r["fail_correlation_id"], r["fail_ts"], r["fail_stream"])
            d.add_failures((r["fail_n"], r["fail_errors"], None, last),
                           _Request(d.producer_client_id, d.produce_correlation_id, d.produce_stream, d.produce_ts))
        final_group: dict[str, str | None] = {}
        for f in r["fetches"] or ():
            d.add_fetch(Fetch(f["client_id"], f["group_then"], f["ts"], f["stream"], f["correlation_id"]))
            final_group[f["client_id"] or ""] = f["group_last"]
        d.commit_group, d.commit_offset, d.commit_ts = r["commit_group"], r["commit_offset"], r["commit_ts"]
        row = fill_groups(d.row(), final_group.get)
        out.append({c: clean_value(c, row[c]) for c in DELIVERY_COLUMNS})
        if len(out) >= 4096:
            yield _batch(out, DELIVERIES_STAGE_SCHEMA)
            out = []
    if out:
        yield _batch(out, DELIVERIES_STAGE_SCHEMA)
