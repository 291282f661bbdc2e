"""The ``summary`` report: one screen about a capture.

Build it by streaming the dissector's output through a :class:`SummaryBuilder`
(``add(item)`` takes an ``Exchange``, ``ErrorRow`` or ``RecordRow``), then
``build()`` a :class:`Summary`.  Render it with :func:`render_summary` (rich,
every wire-derived string escaped) or ``Summary.as_dict()`` for
``--format json``.

Library guess: ApiVersions v3+ requests carry ``client_software_name`` and
``client_software_version`` (KIP-511); that names the client library exactly.
Older clients (and brokers that only answer ApiVersions v0-v2, which makes the
client fall back) leave it out; then the default ``client_id`` of the common
libraries gives a weaker guess, shown with a trailing ``?``.
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kwinspect.analyze.connection_counts import NOT_KAFKA, SEEN, TLS, ConnectionCounts, host_of
from kwinspect.analyze.connection_counts import TLS_DECRYPTED as TLS_DECRYPTED_BIT
from kwinspect.analyze.latency import LatencyStats, api_label
from kwinspect.analyze.richtables import fit_to_width
from kwinspect.analyze.termsafe import term_safe
from kwinspect.model import (
    KAFKA_ERROR,
    PARTIAL_BATCH,
    STATUS_RESPONSE_MISSING,
    TLS_DECRYPTED,
    ErrorRow,
    Exchange,
    RecordRow,
    plural,
)
from kwinspect.protocol.schema.api_keys import ApiKey
from kwinspect.stream.labels import record_volumes

METADATA = int(ApiKey.METADATA)
API_VERSIONS = int(ApiKey.API_VERSIONS)
DESCRIBE_CLUSTER = int(ApiKey.DESCRIBE_CLUSTER)
PRODUCE = int(ApiKey.PRODUCE)
FETCH = int(ApiKey.FETCH)
# exchange groups SummaryBuilder keeps (see add_exchange): memory stays bounded on captures
# of 100k connections; past it the groups start again (slower, same counts)
MAX_EXCHANGE_GROUPS = 10_000
# exchanges whose bodies the summary reads beyond counts (client software, advertised
# brokers) or that teach the broker ids: never folded into a --jobs worker's partial summary
BODY_APIS = frozenset({API_VERSIONS, METADATA, DESCRIBE_CLUSTER, int(ApiKey.FIND_COORDINATOR)})

# Anomaly kinds that describe normal behaviour; listed, but not as problems.
INFO_KINDS = frozenset({PARTIAL_BATCH, TLS_DECRYPTED})
# Anomaly kinds that mark a whole connection as something other than Kafka.
_TLS, _NOT_KAFKA = "tls_stream", "not_kafka"


# ---------------------------------------------------------------------------
# Library guess
# ---------------------------------------------------------------------------

_SOFTWARE = (
    # (pattern on client_software_name, label); first match wins.
    (re.compile(r"^apache-kafka-java$"), "Java client (Apache Kafka)"),
    (re.compile(r"^librdkafka$"), "librdkafka"),
    (re.compile(r"^confluent-kafka-(\w+)$"), "librdkafka via confluent-kafka-{1}"),
    (re.compile(r"^(node-rdkafka|rdkafka-ruby|rust-rdkafka|php-rdkafka)$"), "librdkafka via {0}"),
    (re.compile(r"rdkafka"), "librdkafka via {0}"),
    (re.compile(r"^kafka-python$"), "kafka-python"),
    (re.compile(r"^aiokafka$"), "aiokafka (Python)"),
    (re.compile(r"^(sarama|ibm-sarama)$", re.I), "Sarama (Go)"),
    (re.compile(r"^(kgo|franz-go)$"), "franz-go (Go)"),
    (re.compile(r"^(kafka-go|segmentio)"), "kafka-go (Go)"),
    (re.compile(r"^kafkajs$", re.I), "KafkaJS (Node.js)"),
)

_CLIENT_ID_HINTS = (
    (re.compile(r"^rdkafka$"), "librdkafka?"),
    (re.compile(r"^kafka-python"), "kafka-python?"),
    (re.compile(r"^aiokafka"), "aiokafka?"),
    (re.compile(r"^(producer|consumer|adminclient)-\d+$|^consumer-.+-\d+$"), "Java client?"),
    (re.compile(r"^sarama$"), "Sarama (Go)?"),
    (re.compile(r"^kgo$"), "franz-go (Go)?"),
    (re.compile(r"^kafkajs$"), "KafkaJS?"),
)


def guess_library(software_name: str | None, software_version: str | None = None,
                  client_id: str | None = None) -> str | None:
    """A human label for the client library, or None when nothing hints at one.

    >>> guess_library("apache-kafka-java", "3.7.0")
    'Java client (Apache Kafka) 3.7.0'
    >>> guess_library("confluent-kafka-python", "2.3.1-rdkafka-2.3.0")
    'librdkafka 2.3.0 (confluent-kafka-python 2.3.1)'
    >>> guess_library(None, None, "rdkafka")
    'librdkafka?'
    """
    if software_name:
        # confluent-kafka-python/go/dotnet report "2.3.0-rdkafka-2.3.0": name the
        # engine first, the binding after it.
        m = re.match(r"^(.*?)-rdkafka-(.+)$", software_version or "")
        if m and "rdkafka" not in software_name:
            return f"librdkafka {m.group(2)} ({software_name} {m.group(1)})"
        version = f" {software_version}" if software_version else ""
        for rx, label in _SOFTWARE:
            m = rx.search(software_name)
            if m:
                return label.format(software_name, *m.groups()) + version
        return software_name + version
    if client_id:
        for rx, label in _CLIENT_ID_HINTS:
            if rx.search(client_id):
                return label
    return None


# ---------------------------------------------------------------------------
# The summary value
# ---------------------------------------------------------------------------


def _iso(ts: float | None) -> str | None:
    if ts is None or not math.isfinite(ts):
        return None
    try:
        return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    except (OverflowError, OSError, ValueError):
        return None


@dataclass
class Summary:
    first_ts: float | None = None
    last_ts: float | None = None
    exchanges: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    connections: int = 0
    tls_connections: int = 0
    tls_decrypted_connections: int = 0
    not_kafka_connections: int = 0
    brokers: list[dict[str, Any]] = field(default_factory=list)
    clients: list[dict[str, Any]] = field(default_factory=list)
    apis: list[dict[str, Any]] = field(default_factory=list)
    kafka_errors: list[dict[str, Any]] = field(default_factory=list)
    anomalies: list[dict[str, Any]] = field(default_factory=list)
    topics: list[dict[str, Any]] = field(default_factory=list)
    records: int = 0
    sources: list[str] = field(default_factory=list)
    interrupted: bool = False
    # where every packet went (Dissector.packet_counts()): packets, kafka, non_kafka,
    # not_tcp, unparseable, fragments_pending; None when not known
    packet_counts: dict[str, int] | None = None
    # where the captured TCP payload bytes went (Dissector.byte_counts()); None when not known
    byte_counts: dict[str, int] | None = None

    @property
    def duration_s(self) -> float | None:
        if self.first_ts is None or self.last_ts is None:
            return None
        return self.last_ts - self.first_ts

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: timestamps as ISO-8601 UTC strings, plain lists and dicts."""
        return {
            "sources": list(self.sources),
            "interrupted": self.interrupted,
            "capture": {
                "first": _iso(self.first_ts),
                "last": _iso(self.last_ts),
                "duration_s": self.duration_s,
            },
            "exchanges": self.exchanges,
            "statuses": dict(self.statuses),
            "connections": {
                "total": self.connections,
                "tls": self.tls_connections,
                "not_kafka": self.not_kafka_connections,
                # only when some were (older outputs stay as they were)
                **({"tls_decrypted": self.tls_decrypted_connections} if self.tls_decrypted_connections else {}),
            },
            "brokers": [dict(b) for b in self.brokers],
            "clients": [dict(c) for c in self.clients],
            "apis": [dict(a) for a in self.apis],
            "kafka_errors": [dict(e) for e in self.kafka_errors],
            "anomalies": [dict(a) for a in self.anomalies],
            "topics": [dict(t) for t in self.topics],
            "records": self.records,
            "packets": dict(self.packet_counts) if self.packet_counts is not None else None,
            "tcp_bytes": dict(self.byte_counts) if self.byte_counts is not None else None,
        }


# ---------------------------------------------------------------------------
# Builder
# ---------------------------------------------------------------------------


def _payload_len(text: str | None, encoding: str | None) -> int:
    """Bytes on the wire of a key/value the records table shows as text."""
    if text is None:
        return 0
    if encoding == "base64":
        pad = len(text) - len(text.rstrip("="))
        return max(0, len(text) * 3 // 4 - pad)
    if encoding == "hex":
        return len(text) // 2
    return len(text.encode("utf-8", "surrogatepass"))


class _TopicAcc:
    __slots__ = ("produce_records", "fetch_records", "bytes", "requests")

    def __init__(self) -> None:
        self.produce_records = 0
        self.fetch_records = 0
        self.bytes = 0
        self.requests = 0


class SummaryBuilder:
    """Streams exchanges, error rows and record rows into a :class:`Summary`.

    Memory: counters per broker/client/api/topic plus the latency values of
    paired exchanges (one float each, for exact percentiles).
    """

    def __init__(self, top: int = 10) -> None:
        self.top = top
        self._first: float | None = None
        self._last: float | None = None
        self._exchanges = 0
        self._statuses: Counter[str] = Counter()
        # each connection's broker, clients, client software, TLS: a few bytes a connection
        self._conns = ConnectionCounts()
        self._broker_reqs: Counter[str] = Counter()
        self._broker_ids: dict[str, int] = {}
        self._advertised: dict[int, str] = {}  # node id -> "host:port" from Metadata
        self._client_reqs: Counter[tuple[str | None, str]] = Counter()
        self._api_counts: Counter[str] = Counter()
        self._api_versions: dict[str, set[int]] = defaultdict(set)
        self._api_errors: Counter[str] = Counter()
        self._api_unanswered: Counter[str] = Counter()
        self._latency = LatencyStats("api", keep_total=False)  # (the summary shows no total row)
        self._kafka_errors: dict[tuple[str | None, int | None], dict[str, Any]] = {}
        self._anomalies: dict[str, dict[str, Any]] = {}
        self._topics: dict[str, _TopicAcc] = defaultdict(_TopicAcc)
        self._records = 0
        # exchange groups (see add_exchange): key -> [repeats not yet counted, what they count]
        self._groups: dict[tuple, list] = {}
        self._repeats = 0

    # -- feeding ----------------------------------------------------------
    def add(self, item: Exchange | ErrorRow | RecordRow) -> None:
        if isinstance(item, Exchange):
            self.add_exchange(item)
        elif isinstance(item, ErrorRow):
            self.add_error(item)
        elif isinstance(item, RecordRow):
            self.add_record(item)
        else:
            raise TypeError(f"cannot summarize {type(item).__name__}")

    def add_event(self, item: Exchange | ErrorRow, topic_names: Any = None) -> None:
        """What ``kwinspect summary`` adds per event: the event, and for Produce requests
        and Fetch responses the records and bytes of their record sets, counted from the
        batch headers (``topic_names``: topic id -> name, for bodies naming topics by id)."""
        self._add_events((item,), topic_names, True)

    def add_events(self, events: Iterable[Exchange | ErrorRow], topic_names: Any = None) -> None:
        """``add_event`` for each event of a batch (``kwinspect summary``'s loop)."""
        self._add_events(events, topic_names, True)

    def _add_events(self, events: Iterable[Any], topic_names: Any, volumes: bool) -> None:
        """Every event path comes here, a batch at a time (a fifth of the summary's CPU on
        small exchanges was calls per exchange). Most exchanges repeat one seen before in
        everything the counters look at (status, connection, client, api, version, error or
        not, topics): such a repeat only bumps its group's count, which _settle() adds to
        the counters before anything reads them. The first of each group takes the whole
        path (_count_exchange), so every counter's keys keep the order of their first
        occurrence. Timestamps, latency, broker id (last one wins) and bodies are per
        exchange; with ``volumes``, a Produce request's or Fetch response's records and
        bytes, from the batch headers."""
        groups, isfinite = self._groups, math.isfinite
        first, last = self._first, self._last
        accs = self._topics
        paired, apis = [], []
        for ex in events:
            if not isinstance(ex, Exchange):  # error and record rows
                self._first, self._last = first, last
                self.add(ex)
                first, last = self._first, self._last
                continue
            ts = ex.request_ts  # (the capture's span: written out twice, no loop per exchange)
            if ts is not None and isfinite(ts):
                first = ts if first is None or ts < first else first
                last = ts if last is None or ts > last else last
            ts = ex.response_last_ts
            if ts is None:
                ts = ex.response_ts
            if ts is not None and isfinite(ts):
                first = ts if first is None or ts < first else first
                last = ts if last is None or ts > last else last
            api = ex.api_name or api_label(ex)
            topics = ex.topics
            codes = ex.error_codes
            erred = bool(codes and any(codes))
            key = (ex.status, ex.tcp_stream, ex.stream, ex.broker, ex.client_id, ex.client, api, ex.api_version,
                   erred, tuple(topics) if topics else ())
            group = groups.get(key)
            if group is not None:
                group[0] += 1
                self._repeats += 1
            else:
                if len(groups) >= MAX_EXCHANGE_GROUPS:
                    self._settle()
                    groups.clear()
                groups[key] = [0, self._count_exchange(ex, api, erred)]
            if ex.broker_id is not None:
                self._broker_ids[ex.broker or "(unknown)"] = ex.broker_id
            paired.append(ex)
            apis.append(api)
            api_key = ex.api_key
            if api_key == PRODUCE:
                msg = ex.request
            elif api_key == FETCH:
                msg = ex.response
            else:
                if api_key == API_VERSIONS or api_key == METADATA or api_key == DESCRIBE_CLUSTER:
                    self._learn_from_bodies(ex)
                continue
            if not volumes:
                continue
            produce = api_key == PRODUCE
            for topic, records, size in record_volumes(api_key, msg, topic_names):
                acc = accs[topic]
                if produce:
                    acc.produce_records += records
                else:
                    acc.fetch_records += records
                acc.bytes += size
                self._records += records
        self._first, self._last = first, last
        self._latency.add_labelled(paired, apis)

    def add_all(self, items: Iterable[Exchange | ErrorRow | RecordRow]) -> SummaryBuilder:
        for item in items:
            self.add(item)
        return self

    def _seen(self, ts: float | None) -> None:
        if ts is None or not math.isfinite(ts):
            return
        if self._first is None or ts < self._first:
            self._first = ts
        if self._last is None or ts > self._last:
            self._last = ts

    def add_exchange(self, ex: Exchange) -> None:
        self._add_events((ex,), None, False)

    def _count_exchange(self, ex: Exchange, api: str, erred: bool) -> tuple:
        """Count the first exchange of a group (``erred``: it has a Kafka error code);
        returns what _settle needs to count its repeats."""
        self._exchanges += 1
        status = ex.status
        self._statuses[status] += 1
        broker = ex.broker or "(unknown)"
        ckey = self._conns.exchange(ex.tcp_stream, ex.stream, broker, ex.client_id, ex.client)
        self._broker_reqs[broker] += 1
        self._client_reqs[ckey] += 1
        self._api_counts[api] += 1
        if ex.api_version is not None:
            self._api_versions[api].add(ex.api_version)
        # errors: Kafka error codes only; a request never answered is counted apart
        if erred:
            self._api_errors[api] += 1
        unanswered = status == STATUS_RESPONSE_MISSING
        if unanswered:
            self._api_unanswered[api] += 1
        topics = ex.topics
        distinct = ()
        if topics:
            accs = self._topics
            distinct = tuple(t for t in dict.fromkeys(topics) if t is not None)
            for t in distinct:
                accs[t].requests += 1
        return (status, broker, ckey, api, erred, unanswered, distinct)

    def _settle(self) -> None:
        """Add the repeats add_exchange only counted per group to the counters."""
        if not self._repeats:
            return
        accs = self._topics
        for group in self._groups.values():
            n = group[0]
            if not n:
                continue
            group[0] = 0
            status, broker, ckey, api, erred, unanswered, distinct = group[1]
            self._exchanges += n
            self._statuses[status] += n
            self._broker_reqs[broker] += n
            self._client_reqs[ckey] += n
            self._api_counts[api] += n
            if erred:
                self._api_errors[api] += n
            if unanswered:
                self._api_unanswered[api] += n
            for t in distinct:
                accs[t].requests += n
        self._repeats = 0

    def _learn_from_bodies(self, ex: Exchange) -> None:
        req = ex.request
        if ex.api_key == API_VERSIONS and req is not None and isinstance(req.body, dict):
            name = req.body.get("client_software_name")
            version = req.body.get("client_software_version")
            if name:
                self._conns.software(ex.tcp_stream, ex.stream, str(name), str(version) if version else None)
        resp = ex.response
        if ex.api_key in (METADATA, DESCRIBE_CLUSTER) and resp is not None and isinstance(resp.body, dict):
            for b in resp.body.get("brokers") or ():
                if not isinstance(b, dict):
                    continue
                node = b.get("node_id", b.get("broker_id"))
                host, port = b.get("host"), b.get("port")
                if isinstance(node, int) and host is not None and port is not None:
                    self._advertised[node] = f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"

    def add_error(self, err: ErrorRow) -> None:
        self._seen(err.ts)
        if err.stream:
            bits = SEEN
            if err.kind == _TLS:
                bits |= TLS
            elif err.kind == TLS_DECRYPTED:
                bits |= TLS_DECRYPTED_BIT
            elif err.kind == _NOT_KAFKA:
                bits |= NOT_KAFKA
            self._conns.flag(err.tcp_stream, err.stream, bits)
        if err.kind == KAFKA_ERROR:
            key = (err.name, err.code)
            e = self._kafka_errors.get(key)
            if e is None:
                e = self._kafka_errors[key] = {
                    "name": err.name, "code": err.code, "retriable": err.retriable,
                    "count": 0, "apis": set(),
                }
            e["count"] += 1
            if err.api_name:
                e["apis"].add(err.api_name)
            return
        a = self._anomalies.get(err.kind)
        if a is None:
            a = self._anomalies[err.kind] = {
                "kind": err.kind, "count": 0, "example": err.message, "stream": err.stream,
                "info": err.kind in INFO_KINDS,
            }
        a["count"] += 1

    def add_record(self, rec: RecordRow) -> None:
        self._records += 1
        topic = rec.topic if rec.topic is not None else "(unknown)"
        acc = self._topics[topic]
        if rec.direction == "fetch":
            acc.fetch_records += 1
        else:
            acc.produce_records += 1
        n = _payload_len(rec.key, rec.key_encoding) + _payload_len(rec.value, rec.value_encoding)
        for h in rec.headers or ():
            n += len(str(h.get("key") or "").encode("utf-8", "surrogatepass"))
            n += _payload_len(h.get("value"), h.get("value_encoding"))
        acc.bytes += n

    def add_topic_volume(self, topic: str, direction: str, records: int, nbytes: int) -> None:
        """Count records/bytes known in bulk (e.g. from batch headers) without RecordRows."""
        acc = self._topics[topic]
        if direction == "fetch":
            acc.fetch_records += records
        else:
            acc.produce_records += records
        acc.bytes += nbytes
        self._records += records

    # -- partial summaries (--jobs) ----------------------------------------
    def partial(self) -> dict[str, Any]:
        """This builder's counts, to merge into another with :meth:`merge_partial`. Only
        for a builder fed what :class:`SummaryFold` takes: its broker ids are left out
        (the merge is given them)."""
        self._settle()
        return {
            "first": self._first, "last": self._last, "exchanges": self._exchanges,
            "statuses": dict(self._statuses), "connections": self._conns.part(),
            "broker_reqs": dict(self._broker_reqs), "client_reqs": dict(self._client_reqs),
            "api_counts": dict(self._api_counts), "api_versions": dict(self._api_versions),
            "api_errors": dict(self._api_errors), "api_unanswered": dict(self._api_unanswered),
            "latency": self._latency.parts(), "kafka_errors": self._kafka_errors,
            "anomalies": self._anomalies,
            "topics": {t: (a.produce_records, a.fetch_records, a.bytes, a.requests) for t, a in self._topics.items()},
            "records": self._records,
        }

    def merge_partial(self, part: dict[str, Any], broker_ids: dict[str, int | None]) -> None:
        """Add another builder's :meth:`partial`. Exact when every key whose place follows
        its first occurrence was already added here in capture order (``SummaryFold``),
        so only counts, sets and latency values are added; ``broker_ids``: the id the last
        of its exchanges to each broker had (None: none, the id here stays)."""
        self._settle()
        self._seen(part["first"])
        self._seen(part["last"])
        self._exchanges += part["exchanges"]
        self._statuses.update(part["statuses"])
        self._conns.merge(part["connections"])
        self._broker_reqs.update(part["broker_reqs"])
        for broker, bid in broker_ids.items():
            if bid is not None:
                self._broker_ids[broker] = bid
        self._client_reqs.update(part["client_reqs"])
        self._api_counts.update(part["api_counts"])
        for api, versions in part["api_versions"].items():
            self._api_versions[api] |= versions
        self._api_errors.update(part["api_errors"])
        self._api_unanswered.update(part["api_unanswered"])
        self._latency.merge_parts(part["latency"])
        for key, e in part["kafka_errors"].items():
            mine = self._kafka_errors.get(key)
            if mine is None:
                self._kafka_errors[key] = {**e, "apis": set(e["apis"])}
            else:
                mine["count"] += e["count"]
                mine["apis"] |= e["apis"]
        for kind, a in part["anomalies"].items():
            mine = self._anomalies.get(kind)
            if mine is None:
                self._anomalies[kind] = dict(a)
            else:
                mine["count"] += a["count"]
        for topic, (produced, fetched, nbytes, requests) in part["topics"].items():
            acc = self._topics[topic]
            acc.produce_records += produced
            acc.fetch_records += fetched
            acc.bytes += nbytes
            acc.requests += requests
        self._records += part["records"]

    # -- result -----------------------------------------------------------
    def build(self, sources: Iterable[str] = (), interrupted: bool = False,
              packet_counts: dict[str, int] | None = None,
              byte_counts: dict[str, int] | None = None) -> Summary:
        self._settle()
        id_by_addr = {addr: node for node, addr in self._advertised.items()}
        broker_conns, client_conns, software_by_client = self._conns.per_broker_and_client()
        brokers = []
        for addr, conns in broker_conns.items():
            bid = self._broker_ids.get(addr, id_by_addr.get(addr))
            brokers.append({
                "address": addr, "id": bid, "connections": conns,
                "requests": self._broker_reqs[addr], "seen": True,
            })
        for node, addr in sorted(self._advertised.items()):
            if addr not in broker_conns:
                brokers.append({"address": addr, "id": node, "connections": 0, "requests": 0,
                                "seen": False})
        brokers.sort(key=lambda b: (not b["seen"], b["id"] if b["id"] is not None else 1 << 31,
                                    b["address"]))

        clients = []
        for ckey, conns in client_conns.items():
            client_id, host = ckey
            sws = sorted(software_by_client.get(ckey, ()), key=lambda s: (s[0] or "", s[1] or ""))
            if sws:
                library = ", ".join(filter(None, (guess_library(n, v) for n, v in sws)))
                software = [{"name": n, "version": v} for n, v in sws]
            else:
                library = guess_library(None, None, client_id)
                software = []
            clients.append({
                "client_id": client_id, "address": host, "connections": conns,
                "requests": self._client_reqs[ckey], "library": library, "software": software,
            })
        clients.sort(key=lambda c: (-c["requests"], c["client_id"] or "", c["address"]))

        lat = {s.group: s for s in self._latency.stats(include_total=False)}
        apis = []
        for api, count in self._api_counts.most_common():
            s = lat.get(api)
            apis.append({
                "api": api, "count": count, "versions": sorted(self._api_versions.get(api, ())),
                "errors": self._api_errors.get(api, 0),
                "unanswered": self._api_unanswered.get(api, 0),
                "latency_count": s.count if s else 0,
                "long_polls": s.long_polls if s else 0,
                "p50_ms": s.p50_ms if s else None, "p95_ms": s.p95_ms if s else None,
                "p99_ms": s.p99_ms if s else None, "max_ms": s.max_ms if s else None,
            })

        kafka_errors = sorted(
            ({**e, "apis": sorted(e["apis"])} for e in self._kafka_errors.values()),
            key=lambda e: (-e["count"], e["name"] or ""),
        )
        anomalies = sorted(self._anomalies.values(), key=lambda a: (a["info"], -a["count"], a["kind"]))
        topics = [
            {"topic": t, "records": a.produce_records + a.fetch_records,
             "produce_records": a.produce_records, "fetch_records": a.fetch_records,
             "bytes": a.bytes, "requests": a.requests}
            for t, a in self._topics.items()
        ]
        topics.sort(key=lambda t: (-t["bytes"], -t["records"], -t["requests"], t["topic"]))
        return Summary(
            first_ts=self._first, last_ts=self._last, exchanges=self._exchanges,
            statuses=dict(self._statuses), connections=self._conns.count(SEEN),
            tls_connections=self._conns.count(TLS),
            tls_decrypted_connections=self._conns.count(TLS_DECRYPTED_BIT),
            not_kafka_connections=self._conns.count(NOT_KAFKA),
            brokers=brokers, clients=clients, apis=apis, kafka_errors=kafka_errors,
            anomalies=[dict(a) for a in anomalies], topics=topics, records=self._records,
            sources=list(sources), interrupted=interrupted,
            packet_counts=dict(packet_counts) if packet_counts is not None else None,
            byte_counts=dict(byte_counts) if byte_counts is not None else None,
        )


def summarize(items: Iterable[Exchange | ErrorRow | RecordRow], **build_kwargs: Any) -> Summary:
    return SummaryBuilder().add_all(items).build(**build_kwargs)


def record_set_volumes(item: Any, topic_names: Any = None) -> list[tuple[str, str, int, int]]:
    """(topic, "produce"/"fetch", records, bytes) of each record set of a Produce request
    or Fetch response, from the batch headers; nothing for other events."""
    if not isinstance(item, Exchange) or item.api_key not in (PRODUCE, FETCH):
        return []
    produce = item.api_key == PRODUCE
    msg = item.request if produce else item.response
    direction = "produce" if produce else "fetch"
    return [(topic, direction, records, size) for topic, records, size in record_volumes(item.api_key, msg, topic_names)]


class SummaryFold:
    """A ``--jobs`` worker's part of the summary (run/parallel.py ``fold``): the events
    whose part does not depend on their place in capture order are counted here and
    merged at the end (:meth:`SummaryBuilder.merge_partial`); the others go to the main
    process, which adds them in capture order: the exchanges whose bodies the summary
    reads (``BODY_APIS``), and an event with a key whose place in the output is where it
    first occurred (a status, an API, a client, a Kafka error, an anomaly kind)
    unless an event with that key that sorts before it was already sent. So the first
    of each key in capture order is always added by the main process, in its place."""

    def __init__(self) -> None:
        self.builder = SummaryBuilder()
        self.first: dict[tuple, int] = {}  # key -> row key of the earliest event with it sent on
        # (status, client id, client, api name, api key) of an exchange -> the row key from
        # which exchanges like it are folded: the latest `first` of its keys when it was
        # worked out (`first` only goes down, so this only errs towards sending one on)
        self._fold_from: dict[tuple, int] = {}

    @staticmethod
    def _order_keys(item: Any) -> tuple | None:
        if isinstance(item, Exchange):
            # clients with equal counts and names (None and "") keep their first occurrence's order
            return (("status", item.status), ("client", item.client_id, host_of(item.client)),
                    ("api", api_label(item)))
        if isinstance(item, ErrorRow):
            if item.kind == KAFKA_ERROR:
                return (("kafka_error", item.name, item.code),)
            return (("anomaly", item.kind),)
        return None

    def prepare(self, item: Any, topic_names: Any, row_key: int) -> tuple | None:
        """A plan for :meth:`commit`, or None: the event goes to the main process.
        ``row_key``: where the event sorts in capture order (stream/row_order.py)."""
        like = None
        if type(item) is Exchange:
            if item.api_key in BODY_APIS:
                return None
            like = (item.status, item.client_id, item.client, item.api_name, item.api_key)
            start = self._fold_from.get(like)
            if start is not None and row_key >= start:
                return item, record_set_volumes(item, topic_names)
        keys = self._order_keys(item)
        if keys is None:
            return None
        first = self.first
        fold = True
        for k in keys:
            r = first.get(k)
            if r is None or row_key < r:
                first[k] = row_key
                fold = False
        if like is not None:
            self._fold_from[like] = max(first[k] for k in keys)
        return (item, record_set_volumes(item, topic_names)) if fold else None

    def commit(self, plan: tuple) -> None:
        # one at a time: a batch of them would keep their bodies (record sets of a
        # whole Fetch each) alive until it is counted
        item, volumes = plan
        self.builder.add(item)
        for volume in volumes:
            self.builder.add_topic_volume(*volume)

    def partial(self) -> dict[str, Any]:
        return self.builder.partial()


# ---------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------


def _ms(v: float | None) -> str:
    if v is None:
        return "-"
    if v >= 100:
        return f"{v:,.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def _bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:,.0f} {unit}" if unit == "B" else f"{size:,.1f} {unit}"
        size /= 1024
    return f"{n} B"  # pragma: no cover


def _duration(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 120:
        return f"{s:.3f} s"
    m, sec = divmod(int(s), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m{sec:02d}s" if h else f"{m}m{sec:02d}s"


def _more(n_total: int, shown: int) -> str | None:
    return f"… and {n_total - shown} more" if n_total > shown else None


def _pair(left: Any, right: Any, side_by_side: bool) -> list[Any]:
    if not side_by_side:
        return [left, right]
    from rich.table import Table

    grid = Table.grid(padding=(0, 4))
    grid.add_row(left, right)
    return [grid]


def _rows_for_screen(console: Any, side_by_side: bool) -> int:
    """How many rows each list may show so the report fits the terminal's height."""
    if not console.is_terminal:
        return 8
    sections = 4 if side_by_side else 6  # vertical blocks: tables or pairs of tables
    overhead = 3 + sections * 4 + 4  # header lines; title+header+rule+"more" each; extra API rows
    return max(2, min(8, (console.height - overhead) // sections))


def _packet_line(c: dict[str, int]) -> Any:
    """No silent loss: every packet is in exactly one of these counts."""
    from rich.text import Text

    line = Text()
    line.append(f"{c.get('packets', 0):,} packets", style="bold")
    line.append(f": {c.get('kafka', 0):,} Kafka, {c.get('non_kafka', 0):,} other TCP, "
                f"{c.get('not_tcp', 0):,} not TCP")
    bad = c.get("unparseable", 0) + c.get("fragments_pending", 0)
    line.append(f", {bad:,} unparseable", style="yellow" if bad else None)
    return line


def _byte_line(c: dict[str, int]) -> Any:
    """No silent loss of bytes: payload = delivered + retransmitted + late + dropped (+ held)."""
    from rich.text import Text

    line = Text()
    line.append(f"{c.get('payload', 0):,} TCP bytes", style="bold")
    line.append(f": {c.get('delivered', 0):,} delivered, {c.get('duplicate', 0):,} resent")
    late, dropped = c.get("late", 0), c.get("dropped", 0)
    line.append(f", {late:,} late", style="yellow" if late else None)
    line.append(f", {dropped:,} dropped", style="yellow" if dropped else None)
    if c.get("buffered"):
        line.append(f", {c['buffered']:,} held")
    gap = c.get("gap", 0)
    line.append(f", {gap:,} lost", style="yellow" if gap else None)
    if c.get("ignored_closes"):
        line.append(f"\n{c['ignored_closes']:,} RST/FIN ignored (outside the receiver's window)",
                    style="yellow")
    return line


def render_summary(summary: Summary, console: Any = None, max_rows: int | None = None) -> None:
    """Print the one-screen report.  Every wire-derived string is term_safe'd.

    ``max_rows`` caps each list (brokers, clients, errors, ...; APIs get four
    more); by default it is chosen from the terminal's height, 8 off a terminal.
    """
    from rich import box
    from rich.console import Console, Group
    from rich.table import Table
    from rich.text import Text

    console = console or Console(highlight=False)
    side_by_side = console.width >= 150
    if max_rows is None:
        max_rows = _rows_for_screen(console, side_by_side)
    S = term_safe  # noqa: N806 - short alias for readability below

    def table(title: str, *cols: tuple[str, str]) -> Table:
        t = Table(title=title, title_justify="left", title_style="bold", box=box.SIMPLE_HEAD,
                  header_style="dim", pad_edge=False, show_edge=False, expand=False)
        for name, justify in cols:
            t.add_column(name, justify=justify, no_wrap=True, overflow="ellipsis")
        return t

    parts: list[Any] = []
    head = Text()
    head.append("Capture ", style="bold")
    if summary.sources:
        more = f" (+{len(summary.sources) - 3} more)" if len(summary.sources) > 3 else ""
        room = max(12, console.width - len("Capture ") - len(more))
        shown = ", ".join("(standard input)" if src == "-" else S(src, 4096) for src in summary.sources[:3])
        # a long path is cut from the left: the file name is the part that tells them apart
        head.append(("…" + shown[-(room - 1):] if len(shown) > room else shown) + more)
    parts.append(head)
    span = Text(f"{_iso(summary.first_ts) or '-'} → {_iso(summary.last_ts) or '-'}  "
                f"({_duration(summary.duration_s)})")
    if summary.interrupted:
        span.append("  [interrupted: partial results]", style="bold yellow")
    parts.append(span)
    st = summary.statuses
    line = Text()
    line.append(plural(summary.exchanges, "exchange"), style="bold")
    line.append(f" ({st.get('paired', 0):,} paired")
    for key, label in (("no_response_expected", "no response expected"),
                       ("response_missing", "response missing"),
                       ("request_missing", "request missing")):
        if st.get(key):
            line.append(f", {st[key]:,} {label}", style=None if key == "no_response_expected" else "yellow")
    line.append(f")  {plural(summary.connections, 'connection')}")
    if summary.tls_connections:
        line.append(f" ({summary.tls_connections} TLS, not decoded)", style="yellow")
    if summary.tls_decrypted_connections:
        line.append(f" ({summary.tls_decrypted_connections} TLS, decrypted)")
    if summary.not_kafka_connections:
        line.append(f" ({summary.not_kafka_connections} not Kafka)")
    parts.append(line)
    if summary.records:
        # counted from batch headers: nothing was decompressed (errors --records checks that);
        # a line of its own, so the line above fits in 80 columns
        parts.append(Text(f"{plural(summary.records, 'record')} (counted from batch headers, not decoded)"))
    if summary.packet_counts is not None:
        parts.append(_packet_line(summary.packet_counts))
    if summary.byte_counts is not None:
        parts.append(_byte_line(summary.byte_counts))

    # Brokers and clients side by side.
    bt = table("Brokers", ("id", "right"), ("address", "left"), ("conns", "right"), ("requests", "right"))
    for b in summary.brokers[:max_rows]:
        bt.add_row(
            "-" if b["id"] is None else str(b["id"]), Text(S(b["address"], 40)),
            str(b["connections"]) if b["seen"] else "advertised", f"{b['requests']:,}",
            style=None if b["seen"] else "dim",
        )
    if (m := _more(len(summary.brokers), max_rows)) is not None:
        bt.add_row("", m, "", "")
    ct = table("Clients", ("client_id", "left"), ("address", "left"), ("library", "left"),
               ("conns", "right"), ("requests", "right"))
    for c in summary.clients[:max_rows]:
        cid = c["client_id"]
        ct.add_row(
            Text(S(cid, 30)) if cid is not None else Text("(none)", style="dim"),
            Text(S(c["address"], 40)), Text(S(c["library"] or "-", 48)), str(c["connections"]),
            f"{c['requests']:,}",
        )
    if (m := _more(len(summary.clients), max_rows)) is not None:
        ct.add_row(m, "", "", "", "")
    parts.extend(_pair(bt, ct, side_by_side))

    # below 100 columns the versions give way to the numbers (`exchanges` lists them)
    with_versions = console.width >= 100
    at = table("APIs (latency in ms, nearest-rank)", ("api", "left"),
               *((("versions", "left"),) if with_versions else ()),
               ("count", "right"), ("errors", "right"), ("unanswered", "right"), ("p50", "right"),
               ("p95", "right"), ("p99", "right"), ("max", "right"))
    api_rows = max_rows + 4
    for a in summary.apis[:api_rows]:
        versions = ",".join(f"v{v}" for v in a["versions"]) or "-"
        at.add_row(
            Text(S(a["api"], 32)), *((Text(S(versions, 24)),) if with_versions else ()), f"{a['count']:,}",
            Text(f"{a['errors']:,}", style="red" if a["errors"] else "dim"),
            Text(f"{a['unanswered']:,}", style="yellow" if a["unanswered"] else "dim"),
            _ms(a["p50_ms"]), _ms(a["p95_ms"]), _ms(a["p99_ms"]), _ms(a["max_ms"]),
        )
    if (m := _more(len(summary.apis), api_rows)) is not None:
        at.add_row(m, *([""] * (len(at.columns) - 1)))
    parts.append(at)
    polled = [(a["api"], a["long_polls"]) for a in summary.apis if a.get("long_polls")]
    if polled:
        what = ", ".join(f"{S(api, 32)}: {plural(n, 'long poll')}" for api, n in polled)
        parts.append(Text(f"{what} (waited for data, got none) left out of the latency figures",
                          style="dim"))

    et = table("Kafka errors", ("error", "left"), ("code", "right"), ("count", "right"),
               ("apis", "left"))
    for e in summary.kafka_errors[:max_rows]:
        name = S(e["name"] or "?", 36) + (" (retriable)" if e["retriable"] else "")
        et.add_row(Text(name, style="red"), "" if e["code"] is None else str(e["code"]),
                   f"{e['count']:,}", Text(S(",".join(e["apis"]), 30)))
    if not summary.kafka_errors:
        et.add_row(Text("none", style="green"), "", "", "")
    if (m := _more(len(summary.kafka_errors), max_rows)) is not None:
        et.add_row(m, "", "", "")
    nt = table("Anomalies", ("kind", "left"), ("count", "right"), ("example", "left"))
    for a in summary.anomalies[:max_rows]:
        nt.add_row(
            Text(S(a["kind"], 28) + (" (normal)" if a["info"] else ""),
                 style="dim" if a["info"] else "yellow"),
            f"{a['count']:,}", Text(S(a["example"] or "", 50)),
        )
    if not summary.anomalies:
        nt.add_row(Text("none", style="green"), "", "")
    if (m := _more(len(summary.anomalies), max_rows)) is not None:
        nt.add_row(m, "", "")
    parts.extend(_pair(et, nt, side_by_side))

    tables = [bt, ct, at, et, nt]
    if summary.topics:
        tt = table("Top topics", ("topic", "left"), ("bytes", "right"), ("records", "right"),
                   ("produced", "right"), ("fetched", "right"), ("requests", "right"))
        for t in summary.topics[:max_rows]:
            tt.add_row(Text(S(t["topic"], 48)), _bytes(t["bytes"]) if t["records"] else "-",
                       f"{t['records']:,}", f"{t['produce_records']:,}",
                       f"{t['fetch_records']:,}", f"{t['requests']:,}")
        if (m := _more(len(summary.topics), max_rows)) is not None:
            tt.add_row(m, "", "", "", "", "")
        parts.append(tt)
        tables.append(tt)
    for t in tables:
        fit_to_width(t, console.width)
    console.print(Group(*parts))


__all__ = ["INFO_KINDS", "Summary", "SummaryBuilder", "SummaryFold", "guess_library", "record_set_volumes",
           "render_summary", "summarize"]
