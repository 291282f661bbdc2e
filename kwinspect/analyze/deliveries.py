"""The deliveries table: follow every acknowledged record from its Produce to its Fetches and commit.

One row per produced record a ProduceResponse acknowledged: topic, partition, offset
(the response's base offset plus the record's place in its batch, as the records
table computes it), key, a digest of the value (never the value's bytes), the
producer's id/epoch/sequence, when it was sent and acknowledged, joined with every
Fetch response that returned that offset and the first OffsetCommit (or
TxnOffsetCommit) that covered it.

    tracker = DeliveryTracker()
    for ev in dissect_files(paths, config):
        tracker.add(ev, topic_names)
    for row in tracker.rows():
        ...
    for finding in tracker.findings():  # analyze.diagnose Findings
        ...

The records are walked with ``analyze.record_rows`` (the records table's code), once
per Produce request and once per Fetch response.

Linking rules (docs/columns.md, deliveries):

- A Fetch returned an offset when the offset is among its response's records (records
  below the request's fetch offset are left out, as the consumer drops them).  The
  consumer's group is the group its client id last named in a group request
  (JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit, OffsetFetch,
  ConsumerGroupHeartbeat, TxnOffsetCommit), when one did.
- An OffsetCommit covers offset N of a partition when it committed an offset > N and
  the broker answered it without error for that partition.
- A produce attempt that failed (an error for the partition, or no response before the
  connection or capture ended) is linked to the record acknowledged later by the same
  producer id, epoch, partition and sequence, or, for producers without a producer id,
  by topic, partition, key, value and record timestamp (what a retry re-sends).

Memory is bounded: about 550 bytes per tracked record and 120 per listed fetch (values
are kept as digests, keys up to ``MAX_KEY_CHARS`` characters), at most ``max_records`` records (default
``MAX_TRACKED_RECORDS``); records acknowledged after that are counted, not tracked
(``truncated``), and the output says so.
"""

from __future__ import annotations

import base64
import bisect
import hashlib
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from kwinspect.analyze.diagnose.core import (
    INFO,
    WARNING,
    Evidence,
    Finding,
    as_int,
    as_list,
    as_str,
    name_of,
)
from kwinspect.analyze.record_rows import INTERNAL_TOPICS, records_from_exchange
from kwinspect.model import STATUS_PAIRED, STATUS_RESPONSE_MISSING, Exchange, plural
from kwinspect.protocol.errors import error_name
from kwinspect.protocol.records import render_bytes
from kwinspect.protocol.schema.api_keys import ApiKey

PRODUCE = int(ApiKey.PRODUCE)
FETCH = int(ApiKey.FETCH)
OFFSET_COMMIT = int(ApiKey.OFFSET_COMMIT)
TXN_OFFSET_COMMIT = int(ApiKey.TXN_OFFSET_COMMIT)
# requests whose body names the group of the client that sends them
GROUP_APIS = frozenset(int(k) for k in (
    ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP, ApiKey.HEARTBEAT, ApiKey.LEAVE_GROUP, ApiKey.OFFSET_COMMIT,
    ApiKey.OFFSET_FETCH, ApiKey.CONSUMER_GROUP_HEARTBEAT, ApiKey.TXN_OFFSET_COMMIT))

# Records tracked at most (about 550 bytes each); later acknowledged records are only counted.
MAX_TRACKED_RECORDS = 200_000
# Fetches listed per record (times_fetched counts them all).
MAX_FETCHES_LISTED = 16
# Keys longer than this are cut (the digest covers the value only).
MAX_KEY_CHARS = 256
# Failed produce attempts remembered until a retry is acknowledged (oldest forgotten first).
MAX_PENDING_FAILURES = 100_000
# Offsets named in one finding's key.
MAX_OFFSETS_NAMED = 100
NO_RESPONSE = "no response"
# A request seen twice, with the same client id and correlation id, on two connections within this
# many seconds is one request seen on both legs of a proxy (a capture of the client's and the
# broker's side): counted once. (A client's own retry waits for a timeout, and gets a new id.)
MIRROR_WINDOW_S = 1.0
MAX_RECENT_REQUESTS = 10_000
DIGEST_CHARS = 16  # hex characters of SHA-256 kept as value_digest


def value_digest(value: bytes | None) -> str | None:
    """The `value_digest` column: the first 16 hex digits of the value's SHA-256 (null for a null value)."""
    if value is None:
        return None
    return hashlib.sha256(value).hexdigest()[:DIGEST_CHARS]


def _raw(text: str | None, encoding: str | None) -> bytes | None:
    """The bytes a records-table cell rendered with ``--values auto`` stands for."""
    if text is None:
        return None
    if encoding == "base64":
        try:
            return base64.b64decode(text)
        except ValueError:
            return text.encode("utf-8", "surrogatepass")
    return text.encode("utf-8", "surrogatepass")


class Fetch:
    """One Fetch response that returned a tracked record."""

    __slots__ = ("client_id", "group", "ts", "stream", "correlation_id")

    def __init__(self, client_id, group, ts, stream, correlation_id) -> None:
        self.client_id, self.group, self.ts = client_id, group, ts
        self.stream, self.correlation_id = stream, correlation_id


class Delivery:
    """A tracked record: its produce, acknowledgment, fetches and first covering commit."""

    __slots__ = ("topic", "partition", "offset", "key", "key_encoding", "value_digest", "value_size",
                 "producer_client_id", "producer_id", "producer_epoch", "sequence", "produce_ts",
                 "ack_ts", "produce_attempts", "error", "times_fetched", "fetches", "commit_group",
                 "commit_offset", "commit_ts", "produce_stream", "produce_correlation_id", "failed_ev")

    def __init__(self) -> None:
        self.times_fetched = 0
        self.fetches: list[Fetch] | None = None
        self.commit_group = self.commit_offset = self.commit_ts = None
        self.produce_attempts = 1
        self.error = None
        self.failed_ev: Evidence | None = None

    def row(self) -> dict[str, Any]:
        fetches = self.fetches or []
        first = fetches[0].ts if fetches else None
        ack, sent = self.ack_ts, self.produce_ts
        return {
            "topic": self.topic, "partition": self.partition, "offset": self.offset, "key": self.key,
            "key_encoding": self.key_encoding, "value_digest": self.value_digest,
            "value_size": self.value_size, "producer_client_id": self.producer_client_id,
            "producer_id": self.producer_id, "producer_epoch": self.producer_epoch, "sequence": self.sequence,
            "produce_ts": sent, "ack_ts": ack, "produce_attempts": self.produce_attempts, "error": self.error,
            "times_fetched": self.times_fetched, "first_fetch_ts": first,
            "fetch_clients": [f.client_id for f in fetches], "fetch_groups": [f.group for f in fetches],
            "fetch_streams": [f.stream for f in fetches],
            "fetch_correlation_ids": [f.correlation_id for f in fetches],
            "fetch_after_ms": [_ms(ack, f.ts) for f in fetches],
            "commit_group": self.commit_group, "commit_offset": self.commit_offset, "commit_ts": self.commit_ts,
            "produce_to_ack_ms": _ms(sent, ack), "ack_to_first_fetch_ms": _ms(ack, first),
            "end_to_end_ms": _ms(sent, first), "committed_after_ms": _ms(first if first is not None else ack,
                                                                        self.commit_ts),
            "produce_stream": self.produce_stream, "produce_correlation_id": self.produce_correlation_id,
        }

    def produce_evidence(self) -> Evidence:
        return Evidence(self.produce_stream, self.produce_correlation_id, "Produce", self.produce_ts)

    def add_fetch(self, fetch: Fetch) -> bool:
        """Count a Fetch that returned the record (listed up to MAX_FETCHES_LISTED); False for
        a Fetch already listed from the other leg of a proxy (same client and correlation
        id on another connection, within MIRROR_WINDOW_S)."""
        fetches = self.fetches
        if fetches:
            # (_near written out in a plain loop: with the list full, this ran a generator and
            # a call per listed fetch for every record a Fetch returned again)
            cid, client_id, stream, ts = fetch.correlation_id, fetch.client_id, fetch.stream, fetch.ts
            for f in fetches:
                if (f.correlation_id == cid and f.client_id == client_id and f.stream != stream
                        and ts is not None and f.ts is not None and abs(f.ts - ts) <= MIRROR_WINDOW_S):
                    return False
        self.times_fetched += 1
        if self.fetches is None:
            self.fetches = []
        if len(self.fetches) < MAX_FETCHES_LISTED:
            self.fetches.append(fetch)
        return True

    def add_failures(self, failed: tuple | None, ex: Any) -> None:
        """The failed attempts pending for this record's link key when it was acknowledged
        by ``ex``: (count, errors, first evidence, (client id, correlation id, time, stream)
        of the last one), as DeliveryTracker keeps them; the last one is not an attempt of
        its own when it was ``ex`` seen on a proxy's other leg."""
        if failed is not None and is_mirror(failed[3], ex):
            failed = None if failed[0] == 1 else (failed[0] - 1, failed[1], failed[2], failed[3])
        if failed is not None:
            self.produce_attempts += failed[0]
            self.error, self.failed_ev = failed[1], failed[2]


def new_delivery(ex: Exchange, row: Any, values: str = "auto") -> tuple[Delivery, bytes | None]:
    """The Delivery of a record row (walked with ``values="auto"``) a ProduceResponse
    acknowledged, and the value's bytes (for the link key). The key is rendered with
    ``values`` and cut at MAX_KEY_CHARS; the value is kept as a digest."""
    raw = _raw(row.value, row.value_encoding)
    d = Delivery()
    d.topic, d.partition, d.offset = row.topic, row.partition, row.offset
    key, key_encoding = row.key, row.key_encoding
    if values != "auto" and key is not None:  # rows are walked in auto mode: bytes recoverable
        key, key_encoding = render_bytes(_raw(key, key_encoding), values)
    if key is not None and len(key) > MAX_KEY_CHARS:
        key = key[:MAX_KEY_CHARS]
    d.key, d.key_encoding = key, key_encoding
    d.value_digest = value_digest(raw)
    d.value_size = None if raw is None else len(raw)
    d.producer_client_id = ex.client_id
    d.producer_id, d.producer_epoch, d.sequence = row.producer_id, row.producer_epoch, row.sequence
    d.produce_ts, d.ack_ts = ex.request_ts, ex.response_ts
    d.produce_stream, d.produce_correlation_id = ex.stream, ex.correlation_id
    return d, raw


def record_fingerprint(row: Any, raw: bytes | None) -> bytes:
    """What a retry of a record re-sends: topic, partition, key, timestamp and value."""
    h = hashlib.blake2b(digest_size=12)
    for part in (row.topic, row.partition, row.key_encoding, row.key, row.timestamp):
        h.update(repr(part).encode("utf-8", "surrogatepass"))
        h.update(b"\0")
    h.update(b"-" if raw is None else raw)
    return h.digest()


def link_key(row: Any, raw: bytes | None) -> Any:
    """What links a failed produce attempt to the record acknowledged on a retry: producer
    id, epoch, topic, partition and sequence, or without them the record's fingerprint."""
    if row.producer_id is not None and row.sequence is not None and row.sequence >= 0:
        return (row.producer_id, row.producer_epoch, row.topic, row.partition, row.sequence)
    return record_fingerprint(row, raw)


def raw_value(row: Any) -> bytes | None:
    """The bytes of a record row's value (walked with ``values="auto"``)."""
    return _raw(row.value, row.value_encoding)


def merge_errors(errors: str | None, why: str) -> str:
    """The errors of a record's failed attempts, in order, each once."""
    if errors is None:
        return why
    return errors if why in errors.split(", ") else f"{errors}, {why}"


def produce_errors(ex: Exchange, names: Mapping[str, str] | None) -> tuple[dict, str | None]:
    """(topic, partition) -> error code of a Produce exchange's response, and why records
    without an offset failed when no error names it (NO_RESPONSE, or None)."""
    answered = ex.status == STATUS_PAIRED and ex.response is not None
    errors = _produce_errors(ex.response.body, names) if answered else {}  # type: ignore[union-attr]
    return errors, NO_RESPONSE if ex.status == STATUS_RESPONSE_MISSING else None


def group_named(ex: Exchange) -> str | None:
    """The group a group request names (OffsetFetch v8+: its only group), else None."""
    body = ex.request.body if ex.request is not None else None
    if not isinstance(body, dict):
        return None
    group = as_str(body.get("group_id"))
    if group is None:  # OffsetFetch v8+: a list of groups
        groups = [as_str(g.get("group_id")) for g in as_list(body.get("groups")) if isinstance(g, dict)]
        group = groups[0] if len(groups) == 1 else None
    return group


def commits_of(ex: Exchange, names: Mapping[str, str] | None) -> Iterator[tuple[Any, Any, int]]:
    """(topic, partition, committed offset) of an OffsetCommit the broker accepted, per partition."""
    body = ex.request.body if ex.request is not None else None
    if not isinstance(body, dict):
        return
    failed = set()
    resp = ex.response.body if ex.response is not None else None
    for t in as_list((resp or {}).get("topics")):
        if isinstance(t, dict):
            for p in as_list(t.get("partitions")):
                if isinstance(p, dict) and as_int(p.get("error_code")):
                    failed.add((name_of(t, names), as_int(p.get("partition_index"))))
    for t in as_list(body.get("topics")):
        if not isinstance(t, dict):
            continue
        topic = name_of(t, names)
        for p in as_list(t.get("partitions")):
            if not isinstance(p, dict):
                continue
            index, committed = as_int(p.get("partition_index")), as_int(p.get("committed_offset"))
            if committed is None or (topic, index) in failed:
                continue
            yield topic, index, committed


def fill_groups(row: dict[str, Any], group_of: Callable[[str], str | None]) -> dict[str, Any]:
    """A row's fetch_groups: a fetch made before its client named a group gets the group
    the client named last (``group_of(client_id or "")``)."""
    if row["fetch_groups"]:
        row["fetch_groups"] = [g if g is not None else group_of(c or "")
                               for g, c in zip(row["fetch_groups"], row["fetch_clients"], strict=True)]
    return row


def _ms(a: float | None, b: float | None) -> float | None:
    """Milliseconds from a to b, to the microsecond (timestamps are pcap microseconds)."""
    if a is None or b is None:
        return None
    return round((b - a) * 1000.0, 3)


class _Partition:
    """The tracked records of one partition, by offset, and what consumers did with it."""

    __slots__ = ("by_offset", "offsets", "committed_upto", "max_fetched", "max_fetched_ev")

    def __init__(self) -> None:
        self.by_offset: dict[int, Delivery] = {}
        self.offsets: list[int] = []  # sorted
        self.committed_upto = 0  # offsets[:committed_upto] have their first covering commit
        self.max_fetched: int | None = None  # highest offset any Fetch returned
        self.max_fetched_ev: Evidence | None = None


def _fetch_evidence(ex: Exchange) -> Evidence:
    return Evidence(ex.stream, ex.correlation_id, ex.api_name or "Fetch",
                    ex.response_ts if ex.response_ts is not None else ex.request_ts)


class DeliveryTracker:
    """Feed every event in capture order with `add`; then `rows()` and `findings()`."""

    def __init__(self, max_records: int = MAX_TRACKED_RECORDS, values: str = "auto") -> None:
        """``values``: how the key column is rendered (the records table's ``--values``)."""
        self.max_records = max(0, max_records)
        self.values = values
        self.tracked = 0
        self.truncated = 0  # acknowledged records not tracked (past max_records)
        self.order: list[Delivery] = []  # in acknowledgment (capture) order
        self.partitions: dict[tuple[str | None, int | None], _Partition] = {}
        self.client_group: dict[str, str] = {}
        # link key -> (failed attempts, their errors, the first one, (client id, correlation id, time, stream)
        # of the last one)
        self.pending_failures: OrderedDict[Any, tuple[int, str, Evidence, tuple]] = OrderedDict()
        self.fingerprints: dict[bytes, Delivery] = {}  # non-idempotent records: what a retry re-sends
        self.duplicates: list[tuple[Delivery, Delivery]] = []
        self.skips: list[tuple[str | None, str | None, int | None, int, int, Evidence]] = []
        self.positions: dict[tuple[str, Any, Any], int] = {}  # (stream, topic, partition) -> next offset
        self.fetched_topics: set[str | None] = set()
        self.fetches = 0
        # (client id, correlation id) of recent Produce requests -> (request time, stream, acknowledged)
        self.recent_produces: OrderedDict[tuple, tuple[float | None, str, bool]] = OrderedDict()

    # -- events ----------------------------------------------------------------------
    def add(self, ev: Any, topic_names: Mapping[str, str] | None = None) -> None:
        if not isinstance(ev, Exchange) or ev.request is None and ev.response is None:
            return
        key = ev.api_key
        if key == PRODUCE:
            self._produce(ev, topic_names)
        elif key == FETCH:
            self._fetch(ev, topic_names)
        if key in GROUP_APIS:
            self._group_request(ev, topic_names)

    def _produce(self, ex: Exchange, names: Mapping[str, str] | None) -> None:
        if ex.request is None:
            return
        errors, failed_as = produce_errors(ex, names)
        mirror = self._mirror_of(ex)  # the same request on the proxy's other leg, seen first
        acked = False
        for row in records_from_exchange(ex, values="auto", topic_names=names):
            if row.is_control or row.topic in INTERNAL_TOPICS:
                continue
            if row.offset is None:
                code = errors.get((row.topic, row.partition))
                why = error_name(code) if code else failed_as
                # a leg that lost the answer the other leg carried is not an attempt of its own
                if why is not None and not (mirror is not None and mirror[2]):
                    self._failed_attempt(ex, row, why)
                continue
            acked = True
            self._acknowledged(ex, row)
        key = (ex.client_id, ex.correlation_id)
        self.recent_produces.pop(key, None)
        self.recent_produces[key] = (ex.request_ts, ex.stream, acked or bool(mirror and mirror[2]))
        while len(self.recent_produces) > MAX_RECENT_REQUESTS:
            self.recent_produces.popitem(last=False)

    def _mirror_of(self, ex: Exchange) -> tuple[float | None, str, bool] | None:
        prev = self.recent_produces.get((ex.client_id, ex.correlation_id))
        if prev is None or prev[1] == ex.stream or not _near(prev[0], ex.request_ts):
            return None
        return prev

    def _acknowledged(self, ex: Exchange, row: Any) -> None:
        part = self.partitions.get((row.topic, row.partition))
        seen = part.by_offset.get(row.offset) if part is not None else None
        if seen is None and self.tracked >= self.max_records:
            self.truncated += 1
            return
        if part is None:
            part = self.partitions[(row.topic, row.partition)] = _Partition()
        if seen is not None:
            # acknowledged again at the same offset: the same request on a proxy's other leg, or an
            # idempotent producer's retry the broker recognised (it answers with the first offset)
            if (seen.produce_correlation_id, seen.producer_client_id) != (ex.correlation_id, ex.client_id) \
                    or not _near(seen.produce_ts, ex.request_ts):
                seen.produce_attempts += 1
            return
        d, raw = new_delivery(ex, row, self.values)
        d.add_failures(self.pending_failures.pop(link_key(row, raw), None), ex)
        if row.producer_id is None:
            fp = record_fingerprint(row, raw)
            first = self.fingerprints.get(fp)
            if first is None:
                self.fingerprints[fp] = d
            elif first.offset != d.offset:
                self.duplicates.append((first, d))
        self.tracked += 1
        self.order.append(d)
        part.by_offset[row.offset] = d
        if not part.offsets or row.offset > part.offsets[-1]:
            part.offsets.append(row.offset)
        else:  # out of order: keep the list sorted; the commit frontier moves over it
            i = bisect.bisect_left(part.offsets, row.offset)
            part.offsets.insert(i, row.offset)
            if i < part.committed_upto:
                part.committed_upto += 1

    def _failed_attempt(self, ex: Exchange, row: Any, why: str) -> None:
        link = link_key(row, raw_value(row))
        ev = Evidence(ex.stream, ex.correlation_id, "Produce", ex.request_ts)
        last = (ex.client_id, ex.correlation_id, ex.request_ts, ex.stream)
        prev = self.pending_failures.pop(link, None)
        if prev is None:
            self.pending_failures[link] = (1, why, ev, last)
        else:  # the errors of every failed attempt, in order, each once
            self.pending_failures[link] = (prev[0] + 1, merge_errors(prev[1], why), prev[2], last)
        while len(self.pending_failures) > MAX_PENDING_FAILURES:
            self.pending_failures.popitem(last=False)

    def _fetch(self, ex: Exchange, names: Mapping[str, str] | None) -> None:
        if ex.response is None:
            return
        self.fetches += 1
        group = self.client_group.get(ex.client_id or "")
        ev = _fetch_evidence(ex)
        ts = ev.ts
        stream = ex.stream
        # where this connection's consumer stood, per partition, before this request
        if ex.request is not None:
            for topic, partition, start in _fetch_starts(ex.request.body, names):
                self.fetched_topics.add(topic)
                pos_key = (stream, topic, partition)
                before = self.positions.get(pos_key)
                if before is not None and start > before:
                    self._skipped(ex, topic, partition, before, start)
                self.positions[pos_key] = start
        # (only offsets, topics and partitions are read: "auto" takes the compiled rows,
        # where "hex" rendered every key and value in Python)
        for row in records_from_exchange(ex, values="auto", topic_names=names):
            off = row.offset
            if off is None:
                continue
            pos_key = (stream, row.topic, row.partition)
            if off + 1 > self.positions.get(pos_key, -1):
                self.positions[pos_key] = off + 1
            part = self.partitions.get((row.topic, row.partition))
            if part is None or row.is_control:
                continue
            if part.max_fetched is None or off > part.max_fetched:
                part.max_fetched, part.max_fetched_ev = off, ev
            d = part.by_offset.get(off)
            if d is None:
                continue
            d.add_fetch(Fetch(ex.client_id, group, ts, stream, ex.correlation_id))
        if len(self.positions) > 4 * MAX_PENDING_FAILURES:  # bounded: forget the oldest positions
            for k in list(self.positions)[:MAX_PENDING_FAILURES]:
                del self.positions[k]

    def _skipped(self, ex: Exchange, topic, partition, before: int, start: int) -> None:
        part = self.partitions.get((topic, partition))
        if part is None:
            return
        lo = bisect.bisect_left(part.offsets, before)
        hi = bisect.bisect_left(part.offsets, start)
        if hi > lo and len(self.skips) < 10_000:
            self.skips.append((ex.stream, ex.client_id, topic, partition, before, start,
                               _fetch_evidence(ex)))

    def _group_request(self, ex: Exchange, names: Mapping[str, str] | None) -> None:
        group = group_named(ex)
        if group and ex.client_id and (ex.client_id in self.client_group or len(self.client_group) < 100_000):
            self.client_group[ex.client_id] = group
        if ex.api_key in (OFFSET_COMMIT, TXN_OFFSET_COMMIT) and group and ex.status == STATUS_PAIRED:
            self._commit(ex, group, names)

    def _commit(self, ex: Exchange, group: str, names: Mapping[str, str] | None) -> None:
        ts = ex.response_ts if ex.response_ts is not None else ex.request_ts
        for topic, index, committed in commits_of(ex, names):
            part = self.partitions.get((topic, index))
            if part is None:
                continue
            i = part.committed_upto
            offsets = part.offsets
            while i < len(offsets) and offsets[i] < committed:
                d = part.by_offset[offsets[i]]
                d.commit_group, d.commit_offset, d.commit_ts = group, committed, ts
                i += 1
            part.committed_upto = i

    # -- results -----------------------------------------------------------------------
    def rows(self) -> Iterator[dict[str, Any]]:
        """The table's rows, in acknowledgment order; fetches made before a client named its
        group get the group it named later."""
        for d in self.order:
            yield fill_groups(d.row(), self.client_group.get)

    def truncation_note(self) -> str | None:
        if not self.truncated:
            return None
        return (f"truncated after {plural(self.max_records, 'record')}: {plural(self.truncated, 'more acknowledged record')} "
                "not tracked (--max-records; docs/limits.md)")

    def findings(self) -> list[Finding]:
        out: list[Finding] = []
        out += self._unfetched()
        out += self._duplicate_findings()
        out += self._double_fetches()
        out += self._retried()
        out += self._skip_findings()
        if self.truncated:
            out.append(Finding("deliveries_truncated", INFO, self.truncation_note() or "",
                               "Findings about records cover the tracked records only.",
                               key={"max_records": self.max_records, "not_tracked": self.truncated},
                               count=self.truncated))
        return out

    def _unfetched(self) -> list[Finding]:
        if not self.fetches:  # a capture without consumers says nothing about consumption
            return []
        out = []
        for (topic, partition), part in self.partitions.items():
            lost = [part.by_offset[o] for o in part.offsets if not part.by_offset[o].times_fetched]
            if not lost:
                continue
            past = [d for d in lost if part.max_fetched is not None and d.offset < part.max_fetched]
            rest = [d for d in lost if not (part.max_fetched is not None and d.offset < part.max_fetched)]
            where = f"{topic}[{partition}]"
            if past:
                f = Finding("delivery_gap", WARNING,
                            f"{where}: {plural(len(past), 'acknowledged record')} never fetched, though a consumer "
                            f"fetched the partition past them (offsets {_ranges([d.offset for d in past])})",
                            "The broker acknowledged these records and a consumer later read the partition beyond "
                            "them without receiving them: a consumer skipped them (a seek, auto.offset.reset to "
                            "latest, a commit ahead of what it read) or they were fetched on a connection the "
                            "capture missed. The evidence is the Produce of the first such record and the Fetch "
                            "that returned the highest offset.",
                            key={"topic": topic, "partition": partition,
                                 "offsets": [d.offset for d in past][:MAX_OFFSETS_NAMED],
                                 "fetched_up_to": part.max_fetched})
                f.add(past[0].produce_evidence())
                f.add(part.max_fetched_ev)
                f.count = len(past)
                out.append(f)
            if rest:
                read = topic in self.fetched_topics
                f = Finding("record_not_fetched", INFO,
                            f"{where}: {plural(len(rest), 'acknowledged record')} not fetched within the capture "
                            f"(offsets {_ranges([d.offset for d in rest])})",
                            ("No Fetch in the capture returned them, and none read the partition past them: "
                             "a slow consumer, or " if read else "No consumer fetched this topic in the capture: ")
                            + ("no consumer assigned this partition." if read else
                               "nothing reads it, or its consumers were not captured."),
                            key={"topic": topic, "partition": partition,
                                 "offsets": [d.offset for d in rest][:MAX_OFFSETS_NAMED]})
                for d in rest[:2]:
                    f.add(d.produce_evidence())
                f.count = len(rest)
                out.append(f)
        return out

    def _duplicate_findings(self) -> list[Finding]:
        by_part: dict[tuple, list[tuple[Delivery, Delivery]]] = {}
        for first, dup in self.duplicates:
            by_part.setdefault((first.topic, first.partition, dup.producer_client_id), []).append((first, dup))
        out = []
        for (topic, partition, client), pairs in by_part.items():
            f = Finding("retry_duplicate", WARNING,
                        f"{topic}[{partition}]: {plural(len(pairs), 'record')} written twice by "
                        f"{client or '(no client id)'} (offsets {_ranges([b.offset for _a, b in pairs])} repeat "
                        f"{_ranges([a.offset for a, _b in pairs])})",
                        "The same key, value and record timestamp were acknowledged at two offsets from a "
                        "producer without idempotence: a retry of a batch the broker had already written (its "
                        "response was lost or timed out). Consumers see the records twice. Enable "
                        "enable.idempotence (the broker then drops such retries).",
                        key={"topic": topic, "partition": partition, "client_id": client,
                             "duplicates": [{"offset": b.offset, "original_offset": a.offset}
                                            for a, b in pairs][:MAX_OFFSETS_NAMED]})
            _add_each_once(f, (d.produce_evidence() for pair in pairs for d in pair))
            f.count = len(pairs)
            out.append(f)
        return out

    def _double_fetches(self) -> list[Finding]:
        by_key: dict[tuple, list[tuple[Delivery, Fetch, Fetch]]] = {}
        for d in self.order:
            if d.times_fetched < 2 or not d.fetches:
                continue
            firsts: dict[str, Fetch] = {}
            for fe in d.fetches:
                group = fe.group if fe.group is not None else self.client_group.get(fe.client_id or "")
                who = f"group {group}" if group else f"consumer {fe.client_id or '(no client id)'} (no group)"
                if who in firsts:
                    by_key.setdefault((who, group, d.topic, d.partition), []).append((d, firsts[who], fe))
                    break
                firsts[who] = fe
        out = []
        for (who, group, topic, partition), hits in by_key.items():
            offsets = [d.offset for d, _a, _b in hits]
            commits = [d for d, _a, b in hits if d.commit_ts is not None and d.commit_ts <= b.ts]
            detail = ("The same records reached the same consumer group twice: after a rebalance (a member "
                      "left or crashed before committing, and the partition's next owner started from the last "
                      "commit) or a commit that was lost or came late. Consumers must be idempotent, or commit "
                      "more often. The evidence lists the first and the repeated Fetch of each record. ")
            detail += (f"{plural(len(commits), 'record')} had been committed before the repeat." if commits else
                       "No OffsetCommit in the capture covered them before the repeat.")
            f = Finding("fetched_twice", WARNING,
                        f"{topic}[{partition}]: {plural(len(hits), 'record')} fetched twice by {who} "
                        f"(offsets {_ranges(offsets)})", detail,
                        key={"topic": topic, "partition": partition, "group_id": group,
                             "client_ids": sorted({c for _d, a, b in hits for c in (a.client_id, b.client_id) if c}),
                             "offsets": offsets[:MAX_OFFSETS_NAMED]})
            _add_each_once(f, (Evidence(fe.stream, fe.correlation_id, "Fetch", fe.ts)
                               for _d, first, repeat in hits for fe in (first, repeat)))
            f.count = len(hits)
            out.append(f)
        return out

    def _retried(self) -> list[Finding]:
        by_producer: dict[tuple, list[Delivery]] = {}
        for d in self.order:
            if d.error is not None:
                by_producer.setdefault((d.producer_client_id, d.producer_id, d.topic, d.partition), []).append(d)
        out = []
        for (client, pid, topic, partition), ds in by_producer.items():
            errors = list(dict.fromkeys(e for d in ds for e in (d.error or "").split(", ") if e))
            who = f"{client or '(no client id)'}" + (f" (producer id {pid})" if pid is not None else "")
            f = Finding("produce_retried", INFO,
                        f"{topic}[{partition}]: {plural(len(ds), 'record')} from {who} failed first "
                        f"({', '.join(errors)}) and were acknowledged on a retry (offsets "
                        f"{_ranges([d.offset for d in ds])})",
                        "A Produce attempt failed (an error for the partition, or no response before its "
                        "connection or the capture ended) and a later attempt with the same producer id, epoch and "
                        "sequence (or, without a producer id, the same key, value and timestamp) was "
                        "acknowledged. The evidence is the failed attempt and the acknowledged one.",
                        key={"topic": topic, "partition": partition, "client_id": client, "producer_id": pid,
                             "errors": errors,
                             "records": [{"offset": d.offset, "sequence": d.sequence, "attempts": d.produce_attempts}
                                         for d in ds][:MAX_OFFSETS_NAMED]})
            seen = set()
            for d in ds:
                for ev in (d.failed_ev, d.produce_evidence()):
                    if ev is not None and ev not in seen:
                        seen.add(ev)
                        f.add(ev)
            f.count = len(ds)
            out.append(f)
        return out

    def _skip_findings(self) -> list[Finding]:
        out = []
        for stream, client, topic, partition, before, start, ev in self.skips:
            part = self.partitions[(topic, partition)]
            lo = bisect.bisect_left(part.offsets, before)
            hi = bisect.bisect_left(part.offsets, start)
            skipped = part.offsets[lo:hi]
            f = Finding("offsets_skipped", WARNING,
                        f"{topic}[{partition}]: consumer {client or '(no client id)'} jumped from offset {before} "
                        f"to {start}, over {plural(len(skipped), 'acknowledged record')}",
                        "On this connection the consumer's next Fetch asked for an offset beyond the records it "
                        "had received, and acknowledged records lie in between: it skipped them (a seek, an "
                        "offset reset after OFFSET_OUT_OF_RANGE, or a position taken from a commit ahead of "
                        "what it read).",
                        key={"topic": topic, "partition": partition, "client_id": client, "stream": stream,
                             "from_offset": before, "to_offset": start,
                             "offsets": skipped[:MAX_OFFSETS_NAMED]})
            f.add(ev)
            f.count = len(skipped)
            out.append(f)
        return out


def _near(a: float | None, b: float | None) -> bool:
    return a is not None and b is not None and abs(a - b) <= MIRROR_WINDOW_S


def is_mirror(last: tuple, ex: Any) -> bool:
    """Was the last failed attempt (client id, correlation id, time, stream) ``ex`` on another leg?"""
    client_id, cid, ts, stream = last
    return client_id == ex.client_id and cid == ex.correlation_id and stream != ex.stream and _near(ts, ex.request_ts)


def _add_each_once(finding: Finding, evidence: Iterable[Evidence]) -> None:
    """Evidence in order, each once (a record's produce, or a Fetch, may stand in several pairs)."""
    for ev in dict.fromkeys(evidence):
        finding.add(ev)


def _ranges(offsets: list[int], most: int = 6) -> str:
    """``0-4, 7, 9-10``: offsets as ranges, at most ``most`` of them, then how many more."""
    offs = sorted(set(offsets))
    spans: list[tuple[int, int]] = []
    for o in offs:
        if spans and o == spans[-1][1] + 1:
            spans[-1] = (spans[-1][0], o)
        else:
            spans.append((o, o))
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans[:most])
    if len(spans) > most:
        text += f", ... ({len(spans) - most} more ranges)"
    return text


def _produce_errors(body: Any, names: Mapping[str, str] | None) -> dict[tuple[Any, Any], int]:
    """(topic, partition) -> the ProduceResponse's non-zero error code."""
    out: dict[tuple[Any, Any], int] = {}
    for t in as_list((body or {}).get("responses") if isinstance(body, dict) else None):
        if not isinstance(t, dict):
            continue
        topic = name_of(t, names)
        for p in as_list(t.get("partition_responses")):
            if isinstance(p, dict):
                code = as_int(p.get("error_code"))
                if code:
                    out[(topic, as_int(p.get("index")))] = code
    return out


def _fetch_starts(body: Any, names: Mapping[str, str] | None) -> Iterator[tuple[Any, int, int]]:
    """(topic, partition, fetch_offset) of every partition a Fetch request asks for."""
    if not isinstance(body, dict):
        return
    for t in as_list(body.get("topics")):
        if not isinstance(t, dict):
            continue
        topic = name_of(t, names)
        for p in as_list(t.get("partitions")):
            if isinstance(p, dict):
                partition, start = as_int(p.get("partition")), as_int(p.get("fetch_offset"))
                if partition is not None and start is not None and start >= 0:
                    yield topic, partition, start
