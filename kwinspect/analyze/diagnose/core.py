"""Findings, evidence and the small helpers every diagnostic analyzer shares.

A `Finding` is one problem (or one noteworthy fact) with the exchanges that show
it.  Evidence lists are bounded (`MAX_EVIDENCE`); `count` keeps the real number.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from kwinspect.model import ErrorRow, Exchange

INFO, WARNING, ERROR = "info", "warning", "error"
SEVERITIES = (INFO, WARNING, ERROR)
SEVERITY_RANK = {INFO: 0, WARNING: 1, ERROR: 2}

# Timestamps a storm window holds at most (every storm threshold is far below this).
MAX_WINDOW_EVENTS = 10_000
# Timestamps a storm window holds in a list before it takes a deque (cheap to pop from the
# front of, but ~600 bytes however few it holds).
SMALL_WINDOW = 32
# Evidence kept per finding; `Finding.count` still counts every occurrence.
MAX_EVIDENCE = 20


@dataclass(slots=True, frozen=True)
class Evidence:
    """Where to look: `kwinspect exchanges --filter 'correlation_id == N'` on this stream."""

    stream: str | None
    correlation_id: int | None
    api_name: str | None
    ts: float | None

    def as_dict(self) -> dict[str, Any]:
        return {"stream": self.stream, "correlation_id": self.correlation_id, "api_name": self.api_name,
                "ts": self.ts}


def evidence_of(item: Exchange | ErrorRow) -> Evidence:
    if isinstance(item, Exchange):
        ts = item.request_ts if item.request_ts is not None else item.response_ts
        return Evidence(item.stream, item.correlation_id, item.api_name, ts)
    return Evidence(item.stream, item.correlation_id, item.api_name, item.ts)


def ts_of(ex: Exchange) -> float | None:
    return ex.request_ts if ex.request_ts is not None else ex.response_ts


@dataclass
class Finding:
    """One diagnosis: what is wrong, how bad, and which exchanges show it."""

    kind: str
    severity: str
    title: str  # one line
    detail: str = ""
    evidence: list[Evidence] = field(default_factory=list)
    first_ts: float | None = None
    last_ts: float | None = None
    key: dict[str, Any] = field(default_factory=dict)  # what it is about: client_id, group, topic, ...
    count: int = 0  # occurrences (evidence may be truncated to MAX_EVIDENCE)

    def add(self, ev: Evidence | None, ts: float | None = None) -> Finding:
        self.count += 1
        if ev is not None and len(self.evidence) < MAX_EVIDENCE:
            self.evidence.append(ev)
        t = ts if ts is not None else (ev.ts if ev is not None else None)
        if t is not None:
            self.first_ts = t if self.first_ts is None else min(self.first_ts, t)
            self.last_ts = t if self.last_ts is None else max(self.last_ts, t)
        return self

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "severity": self.severity, "title": self.title, "detail": self.detail,
                "count": self.count, "first_ts": self.first_ts, "last_ts": self.last_ts,
                "key": dict(self.key), "evidence": [e.as_dict() for e in self.evidence]}


class FindingTable:
    """Base of the analyzers: ``self.findings`` keyed by (kind, ...), a finding made on first use."""

    findings: dict[tuple, Finding]

    def _add(self, key: tuple, severity: str, title: str, detail: str,
             ev: Evidence | Exchange | None, **kw: Any) -> Finding:
        f = self.findings.get(key)
        if f is None:
            f = self.findings[key] = Finding(key[0], severity, title, detail, key=kw)
        return f.add(ev if ev is None or isinstance(ev, Evidence) else evidence_of(ev))


def make(kind: str, severity: str, title: str, detail: str = "", evidence=(), **key: Any) -> Finding:
    f = Finding(kind, severity, title, detail, key=key)
    for ev in evidence:
        f.add(ev)
    return f


class Window:
    """Timestamps within the last `seconds`, to spot storms: N events in T seconds."""

    __slots__ = ("seconds", "times", "best")

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        # The one timestamp of a window that has seen one, a list of a few, a deque past
        # SMALL_WINDOW: a deque is ~600 bytes however short, and most windows (connection
        # churn: one per client host) see one to three events.
        self.times: deque[float] | list[float] | float | None = None
        self.best = 0  # most events ever inside one window

    def add(self, ts: float | None) -> int:
        times = self.times
        if times is None:
            if ts is None:
                return 0
            self.times = ts
            self.best = 1
            return 1
        cls = times.__class__
        if cls is not deque and cls is not list:
            if ts is None:
                return 1
            times = self.times = [times]
            cls = list
        elif ts is None:
            return len(times)
        times.append(ts)
        if cls is list:
            # what the deque's loop below pops, cut at once
            lim, n, k = ts - self.seconds, len(times), 0
            while k < n and (times[k] < lim or n - k > MAX_WINDOW_EVENTS):
                k += 1
            if k:
                del times[:k]
            if len(times) > SMALL_WINDOW:
                times = self.times = deque(times)
        else:
            while times and (times[0] < ts - self.seconds or len(times) > MAX_WINDOW_EVENTS):
                times.popleft()
        if len(times) > self.best:
            self.best = len(times)
        return len(times)


def name_of(topic: dict, topic_names: dict[str, str] | None = None) -> str | None:
    """A topic element's name: name/topic, or its topic id mapped to a name."""
    for k in ("name", "topic"):
        if isinstance(topic.get(k), str):
            return topic[k]
    tid = topic.get("topic_id")
    if isinstance(tid, str):
        return (topic_names or {}).get(tid, tid)
    return None


def client_label(ex: Exchange | ErrorRow) -> str:
    cid = getattr(ex, "client_id", None)
    return cid if cid else "(no client id)"


def range_text(rng: tuple[int, int] | None) -> str:
    return f"v{rng[0]}-v{rng[1]}" if rng else "no version of it"


def as_int(value: Any) -> int | None:
    """An int field of a (possibly partial) decode, or None when it is missing or of another type."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def as_str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def as_list(value: Any) -> list | tuple:
    """An array field of a (possibly partial or crafted) decode, or () for anything else."""
    return value if isinstance(value, (list, tuple)) else ()
