"""Fetch sessions, metadata storms, error bursts and partition leader changes.

Kinds:
- ``fetch_session_reset`` (info) / ``fetch_session_churn`` (warning): Fetch answered
  FETCH_SESSION_ID_NOT_FOUND (70) or INVALID_FETCH_SESSION_EPOCH (71); churn when
  ``FETCH_SESSION_CHURN_COUNT`` or more within ``FETCH_SESSION_CHURN_WINDOW_S`` for one
  client and broker (the broker's session cache is too small or sessions are evicted).
- ``offset_out_of_range`` (warning): Fetch/ListOffsets partitions answered OFFSET_OUT_OF_RANGE.
- ``metadata_storm`` (warning): ``METADATA_STORM_COUNT`` or more Metadata requests from one
  client within ``METADATA_STORM_WINDOW_S`` seconds.
- ``leadership_errors`` (info) / ``error_burst`` (warning): responses carrying
  NOT_LEADER_OR_FOLLOWER, UNKNOWN_TOPIC_OR_PARTITION, LEADER_NOT_AVAILABLE, NOT_COORDINATOR,
  COORDINATOR_NOT_AVAILABLE, FENCED/UNKNOWN_LEADER_EPOCH, NOT_ENOUGH_REPLICAS(_AFTER_APPEND);
  a burst is ``ERROR_BURST_COUNT`` or more of one error within ``ERROR_BURST_WINDOW_S``.
  The explanation starts with the broker's own description of the code (errors_table),
  then what clients do about that kind of error (``_ERROR_HINTS``).
- ``leader_change`` (info) / ``leader_flapping`` (warning): the leader of a partition in
  Metadata responses changed; flapping when it changed ``LEADER_FLAP_COUNT`` or more times
  within ``LEADER_FLAP_WINDOW_S``.
"""

from __future__ import annotations

from collections import OrderedDict

from kwinspect.analyze.diagnose.core import (
    INFO,
    WARNING,
    Evidence,
    Finding,
    FindingTable,
    Window,
    as_int,
    as_list,
    client_label,
    evidence_of,
    name_of,
    ts_of,
)
from kwinspect.model import ErrorRow, Exchange, plural
from kwinspect.protocol.errors import error_description, error_name
from kwinspect.protocol.schema.api_keys import ApiKey

FETCH = int(ApiKey.FETCH)
LIST_OFFSETS = int(ApiKey.LIST_OFFSETS)
METADATA = int(ApiKey.METADATA)
FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH, OFFSET_OUT_OF_RANGE = 70, 71, 1
LEADERSHIP_ERRORS = {6, 3, 5, 16, 15, 74, 76, 19, 20}  # see the module docstring; 76 = UNKNOWN_LEADER_EPOCH
ISR_ERRORS = {19, 20}  # NOT_ENOUGH_REPLICAS(_AFTER_APPEND): about the in-sync replicas, not leadership
_ERROR_HINTS = {
    "isr": "The partition has fewer in-sync replicas than its min.insync.replicas, so acks=all writes are "
           "refused (or written but not acknowledged): a follower is down or lagging. Producers retry; "
           "lasting, it means under-replicated partitions.",
    "leadership": "Clients get these while leadership or coordinators move, or for topics that do not exist "
                  "(yet); they refresh metadata and retry. A few are normal; many point at an unstable "
                  "cluster or a misconfigured topic name.",
}

FETCH_SESSION_CHURN_COUNT = 3
FETCH_SESSION_CHURN_WINDOW_S = 60.0
METADATA_STORM_COUNT = 20
METADATA_STORM_WINDOW_S = 10.0
ERROR_BURST_COUNT = 5
ERROR_BURST_WINDOW_S = 10.0
LEADER_FLAP_COUNT = 3
LEADER_FLAP_WINDOW_S = 60.0
MAX_KEYS = 100_000


class FetchMetadataAnalyzer(FindingTable):
    def __init__(self, topic_names: dict[str, str]) -> None:
        self.topic_names = topic_names
        self.findings: dict[tuple, Finding] = {}
        self.windows: OrderedDict[tuple, Window] = OrderedDict()
        self.leaders: OrderedDict[tuple, tuple[int, int | None, Evidence]] = OrderedDict()  # (cluster, topic, part)
        self.sessions: dict[str, int] = {}  # stream -> current fetch session id (for the timeline/detail)

    def _window(self, key: tuple, seconds: float) -> Window:
        w = self.windows.get(key)
        if w is None:
            if len(self.windows) >= MAX_KEYS:
                self.windows.popitem(last=False)
            w = self.windows[key] = Window(seconds)
        return w

    def on_exchange(self, ex: Exchange) -> None:
        key = ex.api_key
        if key != METADATA and key != FETCH:
            return  # (before making anything: most exchanges are neither)
        ev = evidence_of(ex)
        ts = ts_of(ex)
        client = client_label(ex)
        if ex.api_key == METADATA and ex.request is not None:
            w = self._window(("metadata", client), METADATA_STORM_WINDOW_S)
            n = w.add(ts)
            if n >= METADATA_STORM_COUNT:
                f = self._add(("metadata_storm", client), WARNING, "",
                              "A client refreshing metadata this often is chasing something: leaders moving, "
                              "a topic that does not exist, or errors that make it refresh on every retry. "
                              "It also loads the brokers/controller.", ev, client_id=ex.client_id)
                f.title = (f"{client}: metadata storm ({w.best} Metadata requests within "
                           f"{METADATA_STORM_WINDOW_S:.0f} s)")
                f.count = w.best
            self._leaders(ex, ev, ts)
        if ex.api_key == FETCH:
            body = ex.response.body if ex.response is not None else None
            if not isinstance(body, dict):
                body = None
            if body and as_int(body.get("session_id")):
                self.sessions[ex.stream] = body["session_id"]
            code = (body or {}).get("error_code")
            if code in (FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH):
                w = self._window(("session", client, ex.broker), FETCH_SESSION_CHURN_WINDOW_S)
                n = w.add(ts)
                req = ex.request.body if ex.request is not None else {}
                self._add(("fetch_session_reset", client, ex.broker), INFO,
                          f"{client}: fetch session reset by {ex.broker} ({error_name(code)})",
                          f"The broker no longer had the client's incremental fetch session (session id "
                          f"{(req or {}).get('session_id')}, epoch {(req or {}).get('session_epoch')}); the client "
                          "falls back to a full fetch request.", ev, client_id=ex.client_id, broker=ex.broker)
                if n >= FETCH_SESSION_CHURN_COUNT:
                    f = self._add(("fetch_session_churn", client, ex.broker), WARNING, "",
                                  "Fetch sessions keep getting lost, so every fetch sends the full partition "
                                  "list. Brokers evict sessions when max.incremental.fetch.session.cache.slots "
                                  "is exhausted (too many consumers) or when the client sends a wrong epoch.",
                                  ev, client_id=ex.client_id, broker=ex.broker)
                    f.title = (f"{client}: fetch session churn ({w.best} session errors from {ex.broker} within "
                               f"{FETCH_SESSION_CHURN_WINDOW_S:.0f} s)")
                    f.count = w.best

    def on_error(self, err: ErrorRow) -> None:
        if err.kind != "kafka_error" or err.code is None:
            return
        if err.code == OFFSET_OUT_OF_RANGE and err.api_name in ("Fetch", "ListOffsets"):
            ev = Evidence(err.stream, err.correlation_id, err.api_name, err.ts)
            self._add(("offset_out_of_range", err.topic, err.partition), WARNING,
                      f"{err.api_name} of {err.topic}[{err.partition}] answered OFFSET_OUT_OF_RANGE",
                      "The consumer asked for an offset outside the log (deleted by retention, or a commit "
                      "beyond the end); it will reset according to auto.offset.reset, skipping or re-reading "
                      "records.", ev, topic=err.topic, partition=err.partition)
            return
        if err.code not in LEADERSHIP_ERRORS:
            return
        ev = Evidence(err.stream, err.correlation_id, err.api_name, err.ts)
        name = err.name or error_name(err.code)
        said = error_description(err.code)
        hint = _ERROR_HINTS["isr" if err.code in ISR_ERRORS else "leadership"]
        f = self._add(("leadership_errors", name, err.api_name), INFO, "",
                      f"{name}: {said} {hint}" if said else hint, ev, error=name, api_name=err.api_name)
        topics = f.key.setdefault("topics", [])
        if err.topic and err.topic not in topics and len(topics) < 20:
            topics.append(err.topic)
        f.title = f"{plural(f.count, name + ' error')} in {err.api_name} responses" + (
            f" (topics: {', '.join(topics[:5])})" if topics else "")
        w = self._window(("burst", name), ERROR_BURST_WINDOW_S)
        n = w.add(err.ts)
        if n >= ERROR_BURST_COUNT:
            bf = self._add(("error_burst", name), WARNING, "",
                           "Many clients or requests hit the same leadership/metadata error at once: a broker "
                           "going down, a leader election, a deleted topic, or a client producing to a topic "
                           "that does not exist.", ev, error=name)
            bf.title = f"burst of {name}: {w.best} within {ERROR_BURST_WINDOW_S:.0f} s"
            bf.count = w.best

    def _leaders(self, ex: Exchange, ev: Evidence, ts: float | None) -> None:
        body = ex.response.body if ex.response is not None else None
        if not isinstance(body, dict):
            return
        # partitions of two clusters in one capture must not look like one partition changing leaders
        cluster = body.get("cluster_id") if isinstance(body.get("cluster_id"), str) else None
        for t in as_list(body.get("topics")):
            if not isinstance(t, dict) or t.get("error_code"):
                continue
            topic = name_of(t, self.topic_names)
            for p in as_list(t.get("partitions")):
                if not isinstance(p, dict) or p.get("error_code"):
                    continue
                part, leader, epoch = as_int(p.get("partition_index")), as_int(p.get("leader_id")), \
                    as_int(p.get("leader_epoch"))
                if leader is None or leader < 0:
                    continue
                lkey = (cluster, topic, part)
                prev = self.leaders.get(lkey)
                if prev is None:
                    if len(self.leaders) >= MAX_KEYS:
                        self.leaders.popitem(last=False)
                    self.leaders[lkey] = (leader, epoch, ev)
                    continue
                if prev[0] == leader:
                    self.leaders[lkey] = (leader, epoch, ev)  # the latest answer with the old leader
                    continue
                if isinstance(epoch, int) and isinstance(prev[1], int) and epoch >= 0 and epoch < prev[1]:
                    continue  # a stale answer from a broker that has not caught up yet
                self.leaders[lkey] = (leader, epoch, ev)
                f = self._add(("leader_change", cluster, topic, part), INFO, "",
                              "The partition's leader moved (broker restart, controlled shutdown, preferred "
                              "leader election, reassignment). Clients see NOT_LEADER_OR_FOLLOWER until they "
                              "refresh metadata.", prev[2], topic=topic, partition=part, cluster_id=cluster)
                f.add(ev)
                f.count -= 1  # one change, two pieces of evidence
                f.title = f"leader of {topic}[{part}] changed {f.count} time(s), now broker {leader}"
                w = self._window(("leader", cluster, topic, part), LEADER_FLAP_WINDOW_S)
                n = w.add(ts)
                if n >= LEADER_FLAP_COUNT:
                    ff = self._add(("leader_flapping", cluster, topic, part), WARNING, "",
                                   "Leadership of this partition keeps moving: a broker flapping (crash loop, "
                                   "ZooKeeper/KRaft session loss) or repeated reassignments.", ev, topic=topic,
                                   partition=part)
                    ff.title = f"leader of {topic}[{part}] flapping: {w.best} changes within " \
                               f"{LEADER_FLAP_WINDOW_S:.0f} s"
                    ff.count = w.best

    def results(self) -> list[Finding]:
        return list(self.findings.values())
