"""`kwinspect diagnose`: find interop problems in a capture and point at the exchanges that show them.

A streaming analyzer: feed it every ``Exchange`` and ``ErrorRow`` in capture order,
then ask for findings (any time; asking does not change the state)::

    d = Diagnoser()
    for ev in dissect_files(paths, config):
        d.add(ev)
    for f in d.findings():            # sorted: errors first, then warnings, then info
        print(f.severity, f.title, [(e.stream, e.correlation_id) for e in f.evidence])
    for g in d.group_timelines():     # consumer groups: events, generations, commits, lag
        ...

Every rule, threshold and kind is documented in docs/diagnose.md and in the module
docstrings of negotiation, producers, groups, fetch and connections.  State is bounded
per key (see the MAX_* constants in each module).
"""

from __future__ import annotations

from typing import Any

from kwinspect.analyze.diagnose.connections import ConnectionAnalyzer
from kwinspect.analyze.diagnose.core import (
    ERROR,
    INFO,
    MAX_EVIDENCE,
    SEVERITIES,
    SEVERITY_RANK,
    WARNING,
    Evidence,
    Finding,
    as_list,
)
from kwinspect.analyze.diagnose.fetch import FetchMetadataAnalyzer
from kwinspect.analyze.diagnose.groups import Generation, GroupAnalyzer, GroupEvent, GroupTimeline
from kwinspect.analyze.diagnose.negotiation import NegotiationAnalyzer
from kwinspect.analyze.diagnose.producers import ProducerAnalyzer
from kwinspect.model import ErrorRow, Exchange
from kwinspect.protocol.schema.api_keys import ApiKey

__all__ = [
    "ERROR", "INFO", "MAX_EVIDENCE", "SEVERITIES", "WARNING", "Diagnoser", "Evidence", "Finding",
    "GroupEvent", "GroupTimeline", "Generation", "diagnose", "sort_findings",
]

METADATA = int(ApiKey.METADATA)
NIL_TOPIC_ID = "AAAAAAAAAAAAAAAAAAAAAA"


class Diagnoser:
    """Feed events with `add`; read `findings()` and `group_timelines()` whenever you like."""

    def __init__(self, deliveries: bool = False) -> None:
        """``deliveries``: also follow every record (analyze.deliveries: decodes the records of
        every Produce and Fetch) and add the findings of that join."""
        self.topic_names: dict[str, str] = {}
        self.negotiation = NegotiationAnalyzer()
        self.producers = ProducerAnalyzer(self.topic_names)
        self.groups = GroupAnalyzer(self.topic_names)
        self.fetch = FetchMetadataAnalyzer(self.topic_names)
        self.connections = ConnectionAnalyzer()
        self.negotiation.closed_by = self.connections.closed_by  # filled by connection_ended
        self.exchanges = 0
        self.deliveries = None
        if deliveries:
            from kwinspect.analyze.deliveries import DeliveryTracker

            self.deliveries = DeliveryTracker()

    def add(self, event: Exchange | ErrorRow | Any) -> None:
        """An Exchange or ErrorRow (anything else is ignored, so a mixed stream can be fed as is)."""
        if isinstance(event, Exchange):
            self.exchanges += 1
            if event.api_key == METADATA and event.response is not None:
                self._learn_topics(event.response.body)
            for a in (self.negotiation, self.producers, self.groups, self.fetch, self.connections):
                a.on_exchange(event)
            if self.deliveries is not None:
                self.deliveries.add(event, self.topic_names)
        elif isinstance(event, ErrorRow):
            self.fetch.on_error(event)
            self.connections.on_error(event)

    def connection_ended(self, stream: str, reason: str, closed_by: str | None = None) -> None:
        """Optional: how a connection ended (``fin``, ``rst``, ``idle``, ``end``) and which side's
        FIN/RST came first (``client``, ``broker``), e.g. from the dissector's
        ``ConnectionInfo.closed`` / ``closed_by``; findings about requests in flight then say so."""
        if len(self.connections.ended) < 1_000_000:
            self.connections.ended[stream] = reason
            if closed_by is not None:
                self.connections.closed_by[stream] = closed_by

    def connections_ended(self, infos, kafka_ports=frozenset()) -> None:
        """Tell the analyzers about every connection of a capture at its end: ``infos`` are the
        dissector's ``ConnectionInfo`` objects (``Dissector.connections.values()``). Adds what
        `connection_ended` does for each Kafka connection, and finds brokers that refused
        connection attempts (SYN answered by RST, on a broker address or a ``kafka_ports`` port)
        or closed connections the clients had to reopen (``broker_unavailable``)."""
        infos = list(infos)
        brokers = {str(i.broker) for i in infos if i.kind == "kafka" and i.broker is not None}
        attempts = self.connections.attempts
        for info in infos:
            conv = info.conversation
            if conv is not None and info.closed:
                self.connection_ended(conv.stream, info.closed, info.closed_by)
            if info.client is None or info.broker is None or info.first_ts is None:
                continue
            broker = str(info.broker)
            refused = (info.kind == "undecided" and info.syn_seen and info.closed == "rst"
                       and info.closed_by == "broker" and not any(info.bytes.values())
                       and (broker in brokers or info.broker.port in kafka_ports))
            if (conv is not None or refused) and len(attempts) < 1_000_000:
                host = str(info.client).rsplit(":", 1)[0]
                stream = conv.stream if conv is not None else f"{info.client}->{info.broker}"
                attempts.append((host, broker, info.first_ts, info.last_ts or info.first_ts, stream, refused))

    def add_all(self, events) -> Diagnoser:
        for ev in events:
            self.add(ev)
        return self

    def _learn_topics(self, body: dict | None) -> None:
        for t in as_list((body or {}).get("topics")):
            if isinstance(t, dict):
                tid, name = t.get("topic_id"), t.get("name")
                if isinstance(tid, str) and isinstance(name, str) and tid != NIL_TOPIC_ID:
                    self.topic_names[tid] = name

    def findings(self, min_severity: str = INFO) -> list[Finding]:
        """Every finding so far, most severe first, then by time."""
        floor = SEVERITY_RANK[min_severity]
        out: list[Finding] = []
        out += self.negotiation.results()
        out += self.producers.results()
        out += self.groups.results()
        out += self.fetch.results()
        out += self.connections.results()
        if self.deliveries is not None:
            out += self.deliveries.findings()
        return sort_findings([f for f in out if SEVERITY_RANK[f.severity] >= floor])

    def group_timelines(self) -> list[GroupTimeline]:
        """One timeline per consumer group: events, generations (members, subscriptions,
        assignments), commits, and lag samples per partition from Fetch high watermarks."""
        return self.groups.timelines()


def sort_findings(findings: list[Finding]) -> list[Finding]:
    """Most severe first, then by time; each finding's evidence by time."""
    for f in findings:
        f.evidence.sort(key=lambda e: e.ts if e.ts is not None else 0.0)
    findings.sort(key=lambda f: (-SEVERITY_RANK[f.severity], f.first_ts if f.first_ts is not None else 0.0, f.kind))
    return findings


def diagnose(events, min_severity: str = INFO) -> list[Finding]:
    """Convenience: findings for an iterable of events."""
    return Diagnoser().add_all(events).findings(min_severity)
