"""Kafka traffic as time series: what `kwinspect stats` counts per interval, and what
`kwinspect live --metrics` exports to Prometheus.

Both take their numbers from one place, :class:`SeriesObserver`: an exchange (or a
closed connection) becomes a few observations ``(series, ts, dims, value)``. The
`stats` table sums them per interval (:class:`TrafficStats`); the metrics endpoint
adds them to Prometheus counters, gauges and histograms (export/metrics.py). So
the two agree by construction, and a capture's per-interval counts add up to what
`kwinspect summary` reports for it.

Dimensions (``DIMENSIONS``, the table's columns of the same names): api_name,
api_version, broker, client_id, topic, partition, group_id. Each series has its own
(``SERIES``); ``--by`` keeps a subset, the others are summed over (null).
Label values from the wire are bounded (:class:`LabelCap`): past a cap of distinct
values, new ones are counted as ``(other)``, so a capture of a million topics
cannot make a million series.
"""

from __future__ import annotations

import math
import re
from array import array
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from kwinspect.analyze.lag import CONSUMER_LAG, LagSample, LagTracker
from kwinspect.analyze.latency import PERCENTILES, api_label, nearest_rank
from kwinspect.model import STATUS_PAIRED, STATUS_RESPONSE_MISSING, Exchange
from kwinspect.protocol.schema.api_keys import ApiKey
from kwinspect.stream.labels import iter_record_sets

PRODUCE, FETCH = int(ApiKey.PRODUCE), int(ApiKey.FETCH)

DIMENSIONS = ("api_name", "api_version", "broker", "client_id", "topic", "partition", "group_id")
# --by names -> dimensions
BY_NAMES = {"api": "api_name", "version": "api_version", "broker": "broker", "client": "client_id",
            "topic": "topic", "partition": "partition", "group": "group_id"}

STATS_COLUMNS = ("interval_start", "interval_s", "series", *DIMENSIONS, "le_ms", "amount")

# Latency histogram bounds, ms (upper bounds, "less than or equal"), shared by the stats
# table's latency_bucket rows and the Prometheus histogram (in seconds there). From
# 0.1 ms (loopback) to 10 s (a long poll's ceiling); the count row is the +Inf bucket.
LATENCY_BUCKETS_MS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0,
                      1000.0, 2500.0, 5000.0, 10000.0)

COUNTER, GAUGE, LATENCY = "counter", "gauge", "latency"
_REQ_DIMS = ("api_name", "api_version", "broker", "client_id")
_TP = ("topic", "partition")


@dataclass(frozen=True, slots=True)
class Series:
    """One observed series: how it adds up, its dimensions, its --series family, its meaning."""

    name: str
    kind: str  # COUNTER (summed), GAUGE (last value of the interval), LATENCY (histogram)
    dims: tuple[str, ...]
    family: str
    help: str


SERIES: dict[str, Series] = {s.name: s for s in (
    Series("requests", COUNTER, _REQ_DIMS, "requests", "exchanges (requests), any status"),
    Series("errors", COUNTER, _REQ_DIMS, "requests", "exchanges whose response carried a Kafka error code"),
    Series("unanswered", COUNTER, _REQ_DIMS, "requests",
           "requests never answered in the capture (status response_missing)"),
    Series("latency", LATENCY, ("api_name", "broker"), "latency",
           "latency of paired exchanges, long polls left out, ms"),
    Series("long_polls", COUNTER, ("api_name", "broker"), "latency",
           "Fetches that waited for data and got none (not in the latency figures)"),
    Series("long_poll_wait_ms", COUNTER, ("api_name", "broker"), "latency",
           "the time long polls waited, ms"),
    Series("produced_records", COUNTER, _TP, "volume", "records in Produce requests (batch headers)"),
    Series("produced_bytes", COUNTER, _TP, "volume", "record-set bytes in Produce requests"),
    Series("fetched_records", COUNTER, _TP, "volume", "records in Fetch responses (batch headers)"),
    Series("fetched_bytes", COUNTER, _TP, "volume", "record-set bytes in Fetch responses"),
    Series("throttled", COUNTER, _REQ_DIMS, "throttle", "responses with throttle_time_ms above 0"),
    Series("throttle_time_ms", COUNTER, _REQ_DIMS, "throttle", "throttle_time_ms of the responses, summed"),
    Series("connections_opened", COUNTER, ("broker",), "connections",
           "Kafka connections whose SYN was captured"),
    Series("connections_closed", COUNTER, ("broker",), "connections",
           "Kafka connections closed by FIN or RST"),
    Series("connections_refused", COUNTER, ("broker",), "connections",
           "connection attempts a broker refused (SYN answered by RST)"),
    Series("consumer_lag", GAUGE, ("group_id", "topic", "partition"), "lag",
           "high watermark minus the group's committed offset, records"),
    Series("fetch_lag", GAUGE, ("client_id", "topic", "partition"), "lag",
           "high watermark minus the fetch position of the client's Fetch, records"),
)}
FAMILIES = tuple(dict.fromkeys(s.family for s in SERIES.values()))
# the rows a latency observation makes in the stats table, in this order
LATENCY_ROWS = ("latency_count", "latency_sum_ms", "latency_bucket",
                *(f"latency_p{p}_ms" for p in PERCENTILES), "latency_max_ms")
ROW_SERIES = tuple(r for s in SERIES for r in (LATENCY_ROWS if s == "latency" else (s,)))
_ORDER = {name: i for i, name in enumerate(ROW_SERIES)}

OTHER = "(other)"
DEFAULT_LABEL_CAP = 1000  # distinct values per wire-derived dimension


class LabelCap:
    """Distinct values of one dimension, at most ``limit``: later new values become
    ``(other)`` (``overflowed`` counts how many observations were folded)."""

    __slots__ = ("limit", "seen", "overflowed")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.seen: set[Any] = set()
        self.overflowed = 0

    def __call__(self, value: Any, other: Any = OTHER) -> Any:
        if value is None or value in self.seen:
            return value
        if len(self.seen) < self.limit:
            self.seen.add(value)
            return value
        self.overflowed += 1
        return other


class Observation(NamedTuple):
    series: str
    ts: float
    dims: tuple  # values in DIMENSIONS order, None where the series has no such dimension
    value: float


def _dims(api_name: Any = None, api_version: Any = None, broker: Any = None, client_id: Any = None,
          topic: Any = None, partition: Any = None, group_id: Any = None) -> tuple:
    return (api_name, api_version, broker, client_id, topic, partition, group_id)


class SeriesObserver:
    """Turns exchanges and closed connections into observations, label values capped.

    ``families`` limits the work to some --series families (all by default)."""

    def __init__(self, label_cap: int = DEFAULT_LABEL_CAP, families: Iterable[str] = FAMILIES) -> None:
        self.families = frozenset(families)
        self.caps = {d: LabelCap(label_cap) for d in ("api_name", "api_version", "broker", "client_id",
                                                      "topic", "group_id")}
        # (topic, partition) pairs: past the cap, a topic's new partitions are counted without one
        self.partitions = LabelCap(label_cap * 10)
        self.lag = LagTracker()
        self._kafka_brokers: set[str] = set()
        self._last_ts = 0.0

    def overflowed(self) -> dict[str, int]:
        """Observations whose label value went to ``(other)``, per dimension (only those with some)."""
        out = {d: c.overflowed for d, c in self.caps.items() if c.overflowed}
        if self.partitions.overflowed:
            out["partition"] = self.partitions.overflowed
        return out

    def _tp(self, topic: str | None, partition: Any) -> tuple[str, int | None]:
        t = self.caps["topic"](topic if topic is not None else "(unknown)")
        p = partition if type(partition) is int else None
        if t == OTHER or p is None:
            return t, None
        return t, p if self.partitions((t, p), None) is not None else None

    def exchange(self, ex: Exchange, topic_names: Mapping[str, str] | None = None) -> list[Observation]:
        ts = ex.request_ts if ex.request_ts is not None else ex.response_ts
        if ts is None or not math.isfinite(ts):
            ts = self._last_ts  # (never seen in practice: every exchange has one of the two)
        self._last_ts = ts
        caps = self.caps
        fam = self.families
        api = caps["api_name"](api_label(ex))  # (api keys and versions are wire values too)
        version = caps["api_version"](ex.api_version, None)
        broker = caps["broker"](ex.broker or "(unknown)")
        if ex.broker and len(self._kafka_brokers) < 10_000:  # refused connections are told by these
            self._kafka_brokers.add(ex.broker)
        client_id = caps["client_id"](ex.client_id)
        req = _dims(api, version, broker, client_id)
        out: list[Observation] = []
        add = out.append
        if "requests" in fam:
            add(Observation("requests", ts, req, 1))
            if any(ex.error_codes):
                add(Observation("errors", ts, req, 1))
            if ex.status == STATUS_RESPONSE_MISSING:
                add(Observation("unanswered", ts, req, 1))
        lat = ex.latency_ms
        if "latency" in fam and ex.status == STATUS_PAIRED and lat is not None and math.isfinite(lat):
            ab = _dims(api, broker=broker)
            if ex.long_poll:
                add(Observation("long_polls", ts, ab, 1))
                add(Observation("long_poll_wait_ms", ts, ab, max(0.0, lat)))  # (counters never go down)
            else:
                add(Observation("latency", ts, ab, lat))
        if "throttle" in fam and ex.throttle_time_ms and ex.throttle_time_ms > 0:  # (a wire int32)
            add(Observation("throttled", ts, req, 1))
            add(Observation("throttle_time_ms", ts, req, ex.throttle_time_ms))
        if "volume" in fam and ex.api_key in (PRODUCE, FETCH):
            produce = ex.api_key == PRODUCE
            msg = ex.request if produce else ex.response
            when = ts if produce or ex.response_ts is None else ex.response_ts  # fetched: when it flowed
            what = ("produced_records", "produced_bytes") if produce else ("fetched_records", "fetched_bytes")
            for topic, part, rs in iter_record_sets(ex.api_key, msg.body if msg else None, topic_names):
                t, p = self._tp(topic, part)
                d = _dims(topic=t, partition=p)
                add(Observation(what[0], when, d, rs.record_count))
                add(Observation(what[1], when, d, rs.size))
        if "lag" in fam:
            out += self.lag_observations(self.lag.add(ex, topic_names), ts, client_id)
        return out

    def lag_observations(self, samples: Iterable[LagSample], ts: float, client_id: str | None
                         ) -> list[Observation]:
        """Lag samples -> observations (``ts``: the exchange's, for samples without one;
        ``client_id``: the exchange's, as capped)."""
        out = []
        for s in samples:
            t, p = self._tp(s.topic, s.partition)
            when = s.ts if s.ts is not None else ts
            if s.kind == CONSUMER_LAG:
                out.append(Observation("consumer_lag", when, _dims(topic=t, partition=p,
                                                                   group_id=self.caps["group_id"](s.group_id)),
                                       s.lag))
            else:
                out.append(Observation("fetch_lag", when, _dims(client_id=client_id, topic=t, partition=p),
                                       s.lag))
        return out

    def connection(self, info: Any, kafka_ports: frozenset[int] = frozenset()) -> list[Observation]:
        """The observations of one closed connection (a dissector ``ConnectionInfo``, from
        its ``on_close`` hook): opened when its SYN was captured, closed on FIN/RST
        (not at the capture's end), refused when a broker answered the SYN with RST."""
        if ("connections" not in self.families or info.client is None or info.broker is None
                or info.first_ts is None):
            return []
        broker_addr = str(info.broker)
        last = info.last_ts if info.last_ts is not None else info.first_ts
        if info.kind == "kafka":
            if len(self._kafka_brokers) < 10_000:
                self._kafka_brokers.add(broker_addr)
            d = _dims(broker=self.caps["broker"](broker_addr))
            out = []
            if info.syn_seen:
                out.append(Observation("connections_opened", info.first_ts, d, 1))
            if info.closed in ("fin", "rst"):
                out.append(Observation("connections_closed", last, d, 1))
            return out
        if refused_attempt(info) and (broker_addr in self._kafka_brokers or info.broker.port in kafka_ports):
            return [Observation("connections_refused", info.first_ts,
                                _dims(broker=self.caps["broker"](broker_addr)), 1)]
        return []


def refused_attempt(info: Any) -> bool:
    """A connection attempt a broker refused, if its endpoint is a broker: a SYN answered
    by the broker with RST, no byte either way (``connections_refused`` counts it when
    the endpoint was seen as a Kafka broker before, or its port is a --kafka-ports one)."""
    return (info.kind == "undecided" and info.syn_seen and info.closed == "rst"
            and info.closed_by == "broker" and not any(info.bytes.values()))


# ---------------------------------------------------------------------------
# The stats table
# ---------------------------------------------------------------------------

_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(us|µs|ms|s|m|h)?\s*$")
_UNIT_S = {"us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}
MIN_INTERVAL_S = 0.001


def parse_interval(text: str) -> float:
    """'100ms', '1s', '10s', '1m', '1h', '2.5' (seconds) -> seconds. ValueError when it is not one."""
    m = _DURATION.match(text)
    if not m:
        raise ValueError(f"not a duration: {text!r} (e.g. 100ms, 1s, 10s, 1m)")
    seconds = float(m.group(1)) * _UNIT_S[m.group(2)]
    if seconds < MIN_INTERVAL_S:
        raise ValueError(f"interval {text!r} is below {MIN_INTERVAL_S * 1000:g} ms")
    return seconds


def by_dimensions(names: Iterable[str]) -> frozenset[str]:
    """--by names (api, version, broker, client, topic, partition, group, or 'none'; or the
    column names: api_name, client_id, ...) -> dimensions."""
    out = set()
    for name in names:
        if name == "none":
            continue
        if name in DIMENSIONS:  # the column names work too
            out.add(name)
            continue
        if name not in BY_NAMES:
            raise ValueError(f"cannot group by {name!r} (expected some of {', '.join(BY_NAMES)}, or none)")
        out.add(BY_NAMES[name])
    return frozenset(out)


class TrafficStats:
    """Observations summed per interval: ``add(exchange)``, ``add_connection(info)``, then ``rows()``.

    ``interval`` in seconds; intervals are aligned on multiples of it since the epoch
    (a 1 s interval starts on a whole second). ``by``: the dimensions kept (default
    all); ``families``: the --series families counted (default all).

    Memory: one entry per (interval, series, dimension values) with data, plus one
    float per paired exchange for the exact percentiles.
    """

    def __init__(self, interval: float = 1.0, by: Iterable[str] | None = None,
                 families: Iterable[str] = FAMILIES, label_cap: int = DEFAULT_LABEL_CAP,
                 kafka_ports: frozenset[int] = frozenset()) -> None:
        self.interval = interval
        keep = frozenset(DIMENSIONS if by is None else by)
        self._mask = tuple(d in keep for d in DIMENSIONS)
        self._all_dims = all(self._mask)
        self.observer = SeriesObserver(label_cap, families)
        self.kafka_ports = kafka_ports
        self._sums: dict[tuple, float] = {}  # (interval, series, dims) -> sum (counters)
        self._last: dict[tuple, tuple[float, float]] = {}  # gauges: -> (ts, value) of the newest
        self._lat: dict[tuple, array] = {}  # latency: -> latencies, ms

    def _masked(self, dims: tuple) -> tuple:
        return dims if self._all_dims else tuple(v if k else None for v, k in zip(dims, self._mask, strict=True))

    def _key(self, obs: Observation) -> tuple:
        return (math.floor(obs.ts / self.interval), obs.series, self._masked(obs.dims))

    def take(self, observations: Iterable[Observation]) -> None:
        """Count observations (in capture order: a gauge keeps the newest, ties the later)."""
        for obs in observations:
            kind = SERIES[obs.series].kind
            key = self._key(obs)
            if kind == COUNTER:
                self._sums[key] = self._sums.get(key, 0) + obs.value
            elif kind == LATENCY:
                vals = self._lat.get(key)
                if vals is None:
                    vals = self._lat[key] = array("d")
                vals.append(obs.value)
            else:  # GAUGE: the newest value of the interval, per full set of dimension values
                full = (key[0], obs.series, obs.dims)
                old = self._last.get(full)
                if old is None or obs.ts >= old[0]:
                    self._last[full] = (obs.ts, obs.value)

    def add(self, ex: Exchange, topic_names: Mapping[str, str] | None = None) -> None:
        self.take(self.observer.exchange(ex, topic_names))

    def add_connection(self, info: Any) -> None:
        self.take(self.observer.connection(info, self.kafka_ports))

    def __len__(self) -> int:
        return len(self._sums) + len(self._last) + len(self._lat)

    def rows(self) -> Iterator[dict[str, Any]]:
        """Rows in STATS_COLUMNS order, made one at a time (only the sorted keys are held):
        by interval, then series (the ROW_SERIES order; the rows of one latency histogram,
        count to max, together), then dimension values."""
        gauges: dict[tuple, float] = {}  # a gauge summed over the dimensions --by leaves out
        for (idx, series, dims), (_ts, amount) in self._last.items():
            key = (idx, series, self._masked(dims))
            gauges[key] = gauges.get(key, 0) + amount
        entries: list[tuple[tuple, int, tuple]] = []
        for source, table in enumerate((self._sums, gauges, self._lat)):
            for key in table:
                idx, series, dims = key
                order = _ORDER["latency_count" if series == "latency" else series]
                entries.append(((idx, order, _dims_order(dims)), source, key))
        entries.sort(key=lambda e: e[0])
        for _sort, source, key in entries:
            idx, series, dims = key
            if source == 0:
                yield self._row(idx, series, dims, self._sums[key])
            elif source == 1:
                yield self._row(idx, series, dims, gauges[key])
            else:
                yield from self._latency_rows(idx, dims, self._lat[key])

    def used_columns(self) -> tuple[str, ...]:
        """The columns a terminal table of the rows needs: the time, the series, the
        dimensions (and le_ms) some row has a value in, the amount."""
        used = set()
        for table in (self._sums, self._last, self._lat):
            for _idx, _series, dims in table:
                used.update(i for i, v in enumerate(self._masked(dims)) if v is not None)
        return ("interval_start", "series", *(DIMENSIONS[i] for i in sorted(used)),
                *(("le_ms",) if self._lat else ()), "amount")

    def _row(self, idx: int, series: str, dims: tuple, amount: float, le: float | None = None) -> dict[str, Any]:
        if type(amount) is float and amount.is_integer() and series not in _FLOAT_SERIES:
            amount = int(amount)
        return {"interval_start": round(idx * self.interval, 6), "interval_s": self.interval,
                "series": series, **dict(zip(DIMENSIONS, dims, strict=True)), "le_ms": le, "amount": amount}

    def _latency_rows(self, idx: int, dims: tuple, vals: array) -> list[dict[str, Any]]:
        s = sorted(vals)
        out = [self._row(idx, "latency_count", dims, len(s)),
               self._row(idx, "latency_sum_ms", dims, round(math.fsum(s), 3))]
        i = 0
        for bound in LATENCY_BUCKETS_MS:  # cumulative, as Prometheus buckets
            while i < len(s) and s[i] <= bound:
                i += 1
            out.append(self._row(idx, "latency_bucket", dims, i, bound))
        for p in PERCENTILES:
            out.append(self._row(idx, f"latency_p{p}_ms", dims, nearest_rank(s, p)))
        out.append(self._row(idx, "latency_max_ms", dims, s[-1]))
        return out


def _dims_order(dims: tuple) -> tuple:
    """Dimension values sortable whatever they hold: nulls last, ints as numbers."""
    return tuple((v is None, v) if type(v) is int else (v is None, "" if v is None else str(v)) for v in dims)


# series whose amount is a measurement (kept a float even when whole)
_FLOAT_SERIES = frozenset({"latency_sum_ms", "latency_max_ms", "long_poll_wait_ms",
                           *(f"latency_p{p}_ms" for p in PERCENTILES)})

__all__ = ["BY_NAMES", "DIMENSIONS", "FAMILIES", "LATENCY_BUCKETS_MS", "OTHER", "ROW_SERIES", "SERIES",
           "STATS_COLUMNS", "LabelCap", "Observation", "Series", "SeriesObserver", "TrafficStats",
           "by_dimensions", "parse_interval", "refused_attempt"]
