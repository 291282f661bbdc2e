"""Consumer lag as the wire shows it: high watermarks, committed offsets, fetch positions.

A Fetch response tells the high watermark of each partition it answers for (the
offset the next produced record will get); the Fetch request beside it tells where
the consumer reads from (``fetch_offset``); OffsetCommit requests and OffsetFetch
responses tell a group's committed offset. Lag is the difference:

* **consumer lag** of a group: the newest high watermark seen for the partition
  minus the group's newest committed offset (OffsetCommit request or OffsetFetch
  response, whichever came last);
* **fetch lag** of a fetching client: the high watermark in a Fetch response minus
  the ``fetch_offset`` of the same partition in its request (records the consumer
  still had to read when the broker answered).

Both need the capture to show the pieces; a partition whose high watermark or
commit was never captured has no lag. Memory: one entry per (topic, partition) and
per (group, topic, partition) seen, each capped (``max_keys``).

    from kwinspect.analyze.lag import LagTracker, offset_facts
    facts = offset_facts(exchange, topic_names)   # what one exchange says about offsets
    tracker = LagTracker()
    for sample in tracker.add(exchange, topic_names):
        sample.kind, sample.group_id, sample.topic, sample.partition, sample.lag
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from kwinspect.model import STATUS_PAIRED, Exchange
from kwinspect.protocol.schema.api_keys import ApiKey

FETCH = int(ApiKey.FETCH)
OFFSET_COMMIT = int(ApiKey.OFFSET_COMMIT)
OFFSET_FETCH = int(ApiKey.OFFSET_FETCH)

HIGH_WATERMARK = "high_watermark"  # a Fetch response's partition high watermark
FETCH_POSITION = "fetch_position"  # a Fetch request's fetch_offset
COMMITTED = "committed"  # a group's committed offset (OffsetCommit request, OffsetFetch response)

CONSUMER_LAG = "consumer_lag"
FETCH_LAG = "fetch_lag"
MAX_KEYS = 100_000  # partitions and (group, partition)s remembered; past it new ones are not


class OffsetFact(NamedTuple):
    """One offset an exchange states: ``kind`` is HIGH_WATERMARK, FETCH_POSITION or
    COMMITTED; ``group_id`` only for COMMITTED."""

    kind: str
    topic: str
    partition: int
    offset: int
    group_id: str | None = None


class LagSample(NamedTuple):
    """A lag the capture shows at ``ts``: ``kind`` CONSUMER_LAG (per group, ``client_id``
    None) or FETCH_LAG (per fetching client, ``group_id`` None)."""

    kind: str
    ts: float | None
    group_id: str | None
    client_id: str | None
    topic: str
    partition: int
    lag: int


def _topic(t: dict, names: Mapping[str, str] | None) -> str | None:
    name = t.get("name") or t.get("topic")
    if not name and isinstance(t.get("topic_id"), str):
        name = (names or {}).get(t["topic_id"], t["topic_id"])
    return name if isinstance(name, str) else None


def _dicts(value: Any) -> list[dict]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _offsets(topics: Any, names: Mapping[str, str] | None, part_key: str, offset_key: str,
             kind: str, group: str | None = None) -> list[OffsetFact]:
    out = []
    for t in _dicts(topics):
        name = _topic(t, names)
        if name is None:
            continue
        for p in _dicts(t.get("partitions")):
            part, off = p.get(part_key), p.get(offset_key)
            if type(part) is int and type(off) is int and off >= 0:
                out.append(OffsetFact(kind, name, part, off, group))
    return out


def offset_facts(ex: Exchange, topic_names: Mapping[str, str] | None = None) -> list[OffsetFact]:
    """Every offset one exchange states (high watermarks and fetch positions of a Fetch,
    committed offsets of an OffsetCommit request or OffsetFetch response). Offsets below
    0 (Kafka's "none") are left out, as are partitions whose error code is set."""
    req = ex.request.body if ex.request is not None and isinstance(ex.request.body, dict) else None
    resp = ex.response.body if ex.response is not None and isinstance(ex.response.body, dict) else None
    key = ex.api_key
    if key == FETCH:
        out = _offsets((req or {}).get("topics"), topic_names, "partition", "fetch_offset", FETCH_POSITION)
        for t in _dicts((resp or {}).get("responses")):
            name = _topic(t, topic_names)
            for p in _dicts(t.get("partitions")) if name is not None else ():
                part, hwm = p.get("partition_index"), p.get("high_watermark")
                if type(part) is int and type(hwm) is int and hwm >= 0 and not p.get("error_code"):
                    out.append(OffsetFact(HIGH_WATERMARK, name, part, hwm))
        return out
    if key == OFFSET_COMMIT and req is not None and isinstance(req.get("group_id"), str):
        if resp is not None and (resp.get("error_code") or _any_partition_error(resp)):
            return []  # the broker refused (part of) the commit: not the group's offset
        return _offsets(req.get("topics"), topic_names, "partition_index", "committed_offset",
                        COMMITTED, req["group_id"])
    if key == OFFSET_FETCH and resp is not None:
        out = []
        if isinstance((req or {}).get("group_id"), str):  # v0-v7: one group, named in the request
            out += _offsets(resp.get("topics"), topic_names, "partition_index", "committed_offset",
                            COMMITTED, req["group_id"])  # type: ignore[index]
        for g in _dicts(resp.get("groups")):  # v8+: several groups, each named in the response
            if isinstance(g.get("group_id"), str):
                out += _offsets(g.get("topics"), topic_names, "partition_index", "committed_offset",
                                COMMITTED, g["group_id"])
        return out
    return []


def lag_facts(ex: Exchange, topic_names: Mapping[str, str] | None = None) -> list[OffsetFact]:
    """The offset facts LagTracker.add takes from an exchange: those of a paired Fetch,
    OffsetCommit or OffsetFetch (``offset_facts``), none for anything else."""
    if ex.api_key not in (FETCH, OFFSET_COMMIT, OFFSET_FETCH) or ex.status != STATUS_PAIRED:
        return []
    return offset_facts(ex, topic_names)


def _any_partition_error(resp: dict) -> bool:
    return any(p.get("error_code") for t in _dicts(resp.get("topics")) for p in _dicts(t.get("partitions")))


class LagTracker:
    """Follows high watermarks and committed offsets through a capture (in capture
    order) and says, exchange by exchange, which lags it shows."""

    def __init__(self, max_keys: int = MAX_KEYS) -> None:
        self.max_keys = max_keys
        self.high_watermarks: dict[tuple[str, int], int] = {}
        self.committed: dict[tuple[str, int], dict[str, int]] = {}  # (topic, partition) -> group -> offset
        self._groups = 0

    def add(self, ex: Exchange, topic_names: Mapping[str, str] | None = None) -> list[LagSample]:
        facts = lag_facts(ex, topic_names)
        if not facts:
            return []
        return self.add_facts(facts, ex.response_ts if ex.response_ts is not None else ex.request_ts,
                              ex.client_id)

    def add_facts(self, facts: list[OffsetFact], ts: float | None, client_id: str | None) -> list[LagSample]:
        """The samples of one exchange's offset facts (``lag_facts``), sampled at ``ts``.

        The facts of different partitions never meet, so a caller may feed each
        partition's facts apart (the Spark pipeline does, partition by partition)."""
        out: list[LagSample] = []
        positions = {(f.topic, f.partition): f.offset for f in facts if f.kind == FETCH_POSITION}
        changed: set[tuple[str, int]] = set()
        for f in facts:
            tp = (f.topic, f.partition)
            if f.kind == HIGH_WATERMARK:
                if tp in self.high_watermarks or len(self.high_watermarks) < self.max_keys:
                    self.high_watermarks[tp] = f.offset
                    changed.add(tp)
                pos = positions.get(tp)
                if pos is not None:
                    out.append(LagSample(FETCH_LAG, ts, None, client_id, f.topic, f.partition,
                                         max(0, f.offset - pos)))
            elif f.kind == COMMITTED:
                groups = self.committed.get(tp)
                if groups is None:
                    if len(self.committed) >= self.max_keys:
                        continue
                    groups = self.committed[tp] = {}
                if f.group_id not in groups:
                    if self._groups >= self.max_keys:
                        continue
                    self._groups += 1
                groups[f.group_id] = f.offset  # type: ignore[index]
                hwm = self.high_watermarks.get(tp)
                if hwm is not None:
                    out.append(LagSample(CONSUMER_LAG, ts, f.group_id, None, f.topic, f.partition,
                                         max(0, hwm - f.offset)))
        for tp in changed:  # a new high watermark moves every group's lag on the partition
            for group, committed in self.committed.get(tp, {}).items():
                out.append(LagSample(CONSUMER_LAG, ts, group, None, tp[0], tp[1],
                                     max(0, self.high_watermarks[tp] - committed)))
        return out


__all__ = ["COMMITTED", "CONSUMER_LAG", "FETCH_LAG", "FETCH_POSITION", "HIGH_WATERMARK", "LagSample",
           "LagTracker", "OffsetFact", "lag_facts", "offset_facts"]
