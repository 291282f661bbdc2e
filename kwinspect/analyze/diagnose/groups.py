"""Consumer groups: a timeline per group, rebalances, lost members, heartbeat and commit errors, lag.

Kinds:
- ``group_rebalance`` (info): a group went through generations; the timeline says who joined.
- ``rebalance_storm`` (warning): ``REBALANCE_STORM_COUNT`` or more new generations of one
  group within ``REBALANCE_STORM_WINDOW_S`` seconds.
- ``member_lost`` (warning): a member of generation N is missing from a later generation
  and never sent LeaveGroup: it crashed, hung or hit its session timeout. For KIP-848 groups
  (ConsumerGroupHeartbeat): a member stopped heartbeating without leaving (member epoch
  -1/-2) and, ``KIP848_LOST_INTERVALS`` heartbeat intervals or more later, another member's
  assignment changed (the coordinator removed it and moved its partitions).
- ``heartbeat_error`` (info for REBALANCE_IN_PROGRESS, the normal signal to rejoin;
  warning for UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION, FENCED_INSTANCE_ID, ...).
- ``group_error`` (warning): JoinGroup/SyncGroup/LeaveGroup errors other than the normal
  MEMBER_ID_REQUIRED and REBALANCE_IN_PROGRESS steps.
- ``offset_commit_failed`` (warning): OffsetCommit partitions answered with an error.
- ``offset_commit_rewind`` (warning): a group committed an offset below its previous commit
  for the same partition (records will be consumed again).
- ``commit_beyond_high_watermark`` (warning): an offset committed above the partition's
  high watermark seen in Fetch responses.
- ``consumer_lag_growing`` (warning): for a group's partition (Fetch requests of the group's
  clients: lag = high watermark - fetch offset), the last lag is at least ``LAG_WARN_RECORDS``
  and larger than ``LAG_MIN_SAMPLES`` samples earlier: the consumer is falling behind.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

from kwinspect.analyze.diagnose.core import (
    INFO,
    WARNING,
    Evidence,
    Finding,
    FindingTable,
    Window,
    as_int,
    as_list,
    as_str,
    evidence_of,
    name_of,
    ts_of,
)
from kwinspect.model import STATUS_PAIRED, Exchange, plural
from kwinspect.protocol.decode import decode_struct
from kwinspect.protocol.errors import error_description, error_name
from kwinspect.protocol.schema.api_keys import ApiKey

FETCH = int(ApiKey.FETCH)
OFFSET_COMMIT = int(ApiKey.OFFSET_COMMIT)
OFFSET_FETCH = int(ApiKey.OFFSET_FETCH)
JOIN_GROUP = int(ApiKey.JOIN_GROUP)
HEARTBEAT = int(ApiKey.HEARTBEAT)
LEAVE_GROUP = int(ApiKey.LEAVE_GROUP)
SYNC_GROUP = int(ApiKey.SYNC_GROUP)
CONSUMER_GROUP_HEARTBEAT = int(ApiKey.CONSUMER_GROUP_HEARTBEAT)  # KIP-848
REBALANCE_IN_PROGRESS, MEMBER_ID_REQUIRED = 27, 79

# Rebalance storm: this many new generations of one group within this many seconds.
REBALANCE_STORM_COUNT = 5
REBALANCE_STORM_WINDOW_S = 60.0
# Bounded state per group and overall.
MAX_TIMELINE_EVENTS = 1000
MAX_GROUPS = 10_000
MAX_LAG_SAMPLES = 200  # per (group or client, topic, partition)
MAX_LAG_KEYS = 100_000
# KIP-848: a member is lost when another member's assignment changes at least this many of its
# heartbeat intervals after the member's last heartbeat (and it never left with epoch -1/-2).
KIP848_LOST_INTERVALS = 3
MAX_MEMBERS = 10_000
# Growing lag: at least this many records behind, and more than LAG_MIN_SAMPLES fetches ago.
LAG_WARN_RECORDS = 1000
LAG_MIN_SAMPLES = 3


@dataclass
class GroupEvent:
    """One step in a group's life, for the TUI's timeline."""

    ts: float | None
    kind: str  # join | sync | heartbeat | leave | commit | offset_fetch
    member_id: str | None
    client_id: str | None
    generation: int | None
    error: str | None
    evidence: Evidence
    details: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"ts": self.ts, "kind": self.kind, "member_id": self.member_id, "client_id": self.client_id,
                "generation": self.generation, "error": self.error, "evidence": self.evidence.as_dict(),
                "details": self.details}


@dataclass
class Generation:
    generation: int
    ts: float | None
    protocol: str | None = None
    leader: str | None = None
    members: dict[str, dict[str, Any]] = field(default_factory=dict)  # member id -> {client_id, subscription}
    assignment: dict[str, Any] = field(default_factory=dict)  # member id -> decoded assignment
    evidence: list[Evidence] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"generation": self.generation, "ts": self.ts, "protocol": self.protocol, "leader": self.leader,
                "members": self.members, "assignment": self.assignment,
                "evidence": [e.as_dict() for e in self.evidence]}


@dataclass
class GroupTimeline:
    """Everything seen about one group: events in order, generations, commits, lag."""

    group_id: str
    events: deque = field(default_factory=lambda: deque(maxlen=MAX_TIMELINE_EVENTS))
    generations: OrderedDict = field(default_factory=OrderedDict)  # generation id -> Generation
    left: set = field(default_factory=set)  # member ids that sent LeaveGroup
    member_clients: dict = field(default_factory=dict)  # member id -> client id
    # KIP-848 members: member id -> {client_id, epoch, assignment, last_ts, last_ev, interval_ms, left}
    members848: dict = field(default_factory=dict)
    epoch_bumps: deque = field(default_factory=lambda: deque(maxlen=MAX_TIMELINE_EVENTS))  # (ts, member, ev)
    clients: set = field(default_factory=set)
    commits: dict = field(default_factory=dict)  # (topic, partition) -> (offset, ts, Evidence)
    lag: dict = field(default_factory=dict)  # (topic, partition) -> deque[(ts, fetch_offset, high_watermark, Evidence)]

    def as_dict(self) -> dict[str, Any]:
        return {"group_id": self.group_id, "clients": sorted(self.clients),
                "events": [e.as_dict() for e in self.events],
                "generations": [g.as_dict() for g in self.generations.values()],
                "left": sorted(self.left), "member_clients": dict(self.member_clients),
                "members_kip848": {m: {k: (v.as_dict() if isinstance(v, Evidence) else v) for k, v in info.items()}
                                   for m, info in self.members848.items()},
                "commits": [{"topic": t, "partition": p, "offset": o, "ts": ts}
                            for (t, p), (o, ts, _ev) in sorted(self.commits.items(), key=str)],
                "lag": [{"topic": t, "partition": p,
                         "samples": [{"ts": ts, "position": pos, "high_watermark": hw,
                                      "lag": None if hw is None or pos is None else max(0, hw - pos),
                                      "evidence": ev.as_dict()}
                                     for ts, pos, hw, ev in samples]}
                        for (t, p), samples in sorted(self.lag.items(), key=str)]}


def _decode_protocol(name: str, data: Any) -> Any:
    """ConsumerProtocolSubscription/Assignment bytes: version int16, then the struct."""
    if not isinstance(data, bytes | bytearray) or len(data) < 2:
        return None
    version = int.from_bytes(data[:2], "big", signed=True)
    value, issues = decode_struct(name, version, bytes(data[2:]))
    if value is None or any(i.severity == "error" for i in issues):
        return {"undecodable": True, "version": version}
    out = dict(value)
    out.pop("user_data", None)
    return out


class GroupAnalyzer(FindingTable):
    def __init__(self, topic_names: dict[str, str]) -> None:
        self.topic_names = topic_names
        self.groups: OrderedDict[str, GroupTimeline] = OrderedDict()
        self.client_group: dict[str, str] = {}  # client id -> group (to attach fetch positions to a group)
        self.findings: dict[tuple, Finding] = {}
        self.storm_windows: dict[str, Window] = {}
        self.high_watermarks: dict[tuple[str | None, int], tuple[int, Evidence]] = {}

    def _group(self, gid: str) -> GroupTimeline:
        g = self.groups.get(gid)
        if g is None:
            if len(self.groups) >= MAX_GROUPS:
                self.groups.popitem(last=False)
            g = self.groups[gid] = GroupTimeline(gid)
        return g

    def on_exchange(self, ex: Exchange) -> None:
        k = ex.api_key
        if k == FETCH:
            self._fetch(ex)
            return
        if k == CONSUMER_GROUP_HEARTBEAT:
            self._consumer_group_heartbeat(ex)
            return
        if k not in (OFFSET_COMMIT, OFFSET_FETCH, JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP):
            return
        req = ex.request.body if ex.request is not None else None
        resp = ex.response.body if ex.response is not None and ex.status == STATUS_PAIRED else None
        if not isinstance(req, dict) or not isinstance(req.get("group_id"), str):
            return
        gid = req["group_id"]
        g = self._group(gid)
        ev = evidence_of(ex)
        ts = ts_of(ex)
        if ex.client_id:
            g.clients.add(ex.client_id)
            self.client_group[ex.client_id] = gid
        if not isinstance(resp, dict):
            resp = None
        code = as_int(resp.get("error_code", 0)) if resp else None
        err = error_name(code) if code else None
        member = as_str(req.get("member_id"))
        gen = as_int(req.get("generation_id", req.get("generation_id_or_member_epoch")))
        if member and ex.client_id and len(g.member_clients) < MAX_TIMELINE_EVENTS:
            g.member_clients[member] = ex.client_id
        details: dict[str, Any] = {}
        if k == JOIN_GROUP:
            kind = "join"
            protos = [p for p in as_list(req.get("protocols")) if isinstance(p, dict)]
            details["protocols"] = [p.get("name") for p in protos]
            if req.get("protocol_type") == "consumer" and protos:
                details["subscription"] = _decode_protocol("ConsumerProtocolSubscription", protos[0].get("metadata"))
            if resp and code == 0:
                gen = as_int(resp.get("generation_id"))
                member = as_str(resp.get("member_id")) or member
                if member and ex.client_id:
                    g.member_clients[member] = ex.client_id
                details["leader"] = resp.get("leader")
                details["protocol"] = resp.get("protocol_name")
                gobj = g.generations.get(gen)
                if gobj is None and isinstance(gen, int):
                    gobj = g.generations[gen] = Generation(gen, ts, as_str(resp.get("protocol_name")),
                                                           as_str(resp.get("leader")))
                    if len(g.generations) > MAX_TIMELINE_EVENTS:
                        g.generations.popitem(last=False)
                    self._new_generation(g, gen, ev, ts)
                if gobj is not None and member is not None:
                    if len(gobj.evidence) < 20:
                        gobj.evidence.append(ev)
                    mine = gobj.members.setdefault(member, {"client_id": ex.client_id,
                                                            "subscription": details.get("subscription")})
                    mine["client_id"] = mine.get("client_id") or ex.client_id
                    for m in as_list(resp.get("members")):
                        if isinstance(m, dict) and as_str(m.get("member_id")):
                            info = gobj.members.setdefault(m["member_id"], {"client_id": None})
                            if req.get("protocol_type") == "consumer":
                                info["subscription"] = _decode_protocol("ConsumerProtocolSubscription",
                                                                        m.get("metadata"))
                    details["members"] = sorted(gobj.members)
            elif code not in (None, 0, MEMBER_ID_REQUIRED, REBALANCE_IN_PROGRESS):
                self._group_error(g, ex, err, ev)
        elif k == SYNC_GROUP:
            kind = "sync"
            for a in as_list(req.get("assignments")):
                if isinstance(a, dict) and as_str(a.get("member_id")):
                    details.setdefault("assignments", {})[a["member_id"]] = _decode_protocol(
                        "ConsumerProtocolAssignment", a.get("assignment"))
            gobj = g.generations.get(gen)
            if gobj is not None and details.get("assignments"):
                gobj.assignment.update(details["assignments"])
            if resp and code == 0:
                mine = _decode_protocol("ConsumerProtocolAssignment", resp.get("assignment"))
                details["assignment"] = mine
                if gobj is not None and member:
                    gobj.assignment.setdefault(member, mine)
            elif code not in (None, 0, REBALANCE_IN_PROGRESS):
                self._group_error(g, ex, err, ev)
        elif k == HEARTBEAT:
            kind = "heartbeat"
            if code:
                sev = INFO if code == REBALANCE_IN_PROGRESS else WARNING
                why = ("The coordinator started a rebalance; the member must rejoin (normal when members come, "
                       "go or time out)." if code == REBALANCE_IN_PROGRESS else
                       "The coordinator no longer knows this member or generation: it was removed (session "
                       "timeout, long processing pauses) and must rejoin, losing its partitions meanwhile.")
                self._add(("heartbeat_error", gid, err), sev, f"group {gid}: heartbeat answered {err}", why, ev,
                          group_id=gid, error=err)
        elif k == LEAVE_GROUP:
            kind = "leave"
            leavers = [member] if member else [as_str(m.get("member_id")) for m in as_list(req.get("members"))
                                               if isinstance(m, dict)]
            g.left.update(x for x in leavers if x)
            details["members"] = leavers
            if code not in (None, 0):
                self._group_error(g, ex, err, ev)
        elif k == OFFSET_COMMIT:
            kind = "commit"
            offsets = {}
            for t in as_list(req.get("topics")):
                if not isinstance(t, dict):
                    continue
                topic = name_of(t, self.topic_names)
                for p in as_list(t.get("partitions")):
                    if isinstance(p, dict) and as_int(p.get("committed_offset")) is not None:
                        offsets[(topic, as_int(p.get("partition_index")))] = p["committed_offset"]
            details["offsets"] = [{"topic": t, "partition": p, "offset": o} for (t, p), o in offsets.items()]
            failed = []
            for t in as_list((resp or {}).get("topics")):
                topic = name_of(t, self.topic_names) if isinstance(t, dict) else None
                for p in as_list(t.get("partitions")) if isinstance(t, dict) else []:
                    if isinstance(p, dict) and as_int(p.get("error_code")):
                        failed.append((topic, p.get("partition_index"), error_name(p["error_code"])))
            if failed:
                err = failed[0][2]
                self._add(("offset_commit_failed", gid, err), WARNING,
                          f"group {gid}: offset commit failed with {err}",
                          "The committed positions were not stored: after a restart or rebalance the group "
                          "re-reads from the previous commit (duplicates downstream). Commits during a "
                          "rebalance fail with REBALANCE_IN_PROGRESS/ILLEGAL_GENERATION.", ev, group_id=gid,
                          error=err)
            elif resp is not None:
                for (topic, part), off in offsets.items():
                    prev = g.commits.get((topic, part))
                    if prev is not None and off < prev[0]:
                        f = self._add(("offset_commit_rewind", gid, topic, part), WARNING,
                                      f"group {gid} committed {topic}[{part}] at {off}, below its earlier "
                                      f"commit {prev[0]}",
                                      "The group's committed position went backwards: a consumer seeked back or "
                                      "reset (auto.offset.reset after OFFSET_OUT_OF_RANGE), or two members "
                                      "both committed for the partition around a rebalance. Records between the "
                                      "two offsets will be consumed again.", prev[2], group_id=gid, topic=topic,
                                      partition=part, offset=off, previous=prev[0])
                        f.add(ev)
                    if prev is not None or len(g.commits) < MAX_LAG_KEYS:
                        g.commits[(topic, part)] = (off, ts, ev)
                    hw = self.high_watermarks.get((topic, part))
                    if hw is not None and off > hw[0]:
                        f = self._add(("commit_beyond_high_watermark", gid, topic, part), WARNING,
                                      f"group {gid} committed {topic}[{part}] at {off}, above the high "
                                      f"watermark {hw[0]}",
                                      "A committed offset beyond the end of the log: the consumer will get "
                                      "OFFSET_OUT_OF_RANGE and reset (auto.offset.reset), skipping or re-reading "
                                      "data. Usually an application committing offsets it computed itself.",
                                      hw[1], group_id=gid, topic=topic, partition=part)
                        f.add(ev)
        else:
            kind = "offset_fetch"
        g.events.append(GroupEvent(ts, kind, member, ex.client_id, gen if isinstance(gen, int) else None, err, ev,
                                   details))

    def _consumer_group_heartbeat(self, ex: Exchange) -> None:
        """KIP-848: membership, epochs and assignments all travel in ConsumerGroupHeartbeat."""
        req = ex.request.body if ex.request is not None else None
        resp = ex.response.body if ex.response is not None and ex.status == STATUS_PAIRED else None
        if not isinstance(req, dict) or not isinstance(req.get("group_id"), str):
            return
        resp = resp if isinstance(resp, dict) else None
        g = self._group(req["group_id"])
        ev, ts = evidence_of(ex), ts_of(ex)
        if ex.client_id:
            g.clients.add(ex.client_id)
            self.client_group[ex.client_id] = g.group_id
        member = as_str(resp.get("member_id") if resp else None) or as_str(req.get("member_id"))
        req_epoch = as_int(req.get("member_epoch"))
        code = as_int(resp.get("error_code")) if resp else None
        if not member:
            return
        info = g.members848.get(member)
        if info is None:
            if len(g.members848) >= MAX_MEMBERS:
                return
            info = g.members848[member] = {"client_id": ex.client_id, "epoch": None, "assignment": None,
                                           "last_ts": None, "last_ev": None, "interval_ms": None, "left": False}
            g.member_clients.setdefault(member, ex.client_id)
        info["client_id"] = info["client_id"] or ex.client_id
        if req_epoch in (-1, -2):
            info["left"] = True
            g.left.add(member)
            g.events.append(GroupEvent(ts, "leave", member, ex.client_id, None, None, ev))
            return
        info["last_ts"], info["last_ev"] = ts, ev
        if code:
            err = error_name(code)
            g.events.append(GroupEvent(ts, "heartbeat", member, ex.client_id, info["epoch"], err, ev))
            self._add(("heartbeat_error", g.group_id, err), WARNING,
                      f"group {g.group_id}: ConsumerGroupHeartbeat answered {err}",
                      "The coordinator rejected this member's heartbeat (FENCED_MEMBER_EPOCH: it acted on a stale "
                      "epoch; UNKNOWN_MEMBER_ID: it was removed, e.g. after its session timeout). It must rejoin "
                      "with epoch 0 and loses its partitions meanwhile.", ev, group_id=g.group_id, error=err)
            return
        if not resp:
            return
        if as_int(resp.get("heartbeat_interval_ms")):
            info["interval_ms"] = resp["heartbeat_interval_ms"]
        epoch = as_int(resp.get("member_epoch"))
        details: dict[str, Any] = {}
        if req_epoch == 0:
            details["subscribed_topics"] = req.get("subscribed_topic_names")
        assignment = resp.get("assignment")
        if isinstance(assignment, dict):
            parts = []
            for t in as_list(assignment.get("topic_partitions")):
                if isinstance(t, dict):
                    parts.append({"topic": name_of(t, self.topic_names), "partitions": t.get("partitions")})
            info["assignment"] = details["assignment"] = parts
        if epoch is not None and epoch != info["epoch"]:
            if info["epoch"] is not None and epoch > info["epoch"]:
                g.epoch_bumps.append((ts, member, ev))
            info["epoch"] = epoch
            details["member_epoch"] = epoch
        if details:
            g.events.append(GroupEvent(ts, "join" if req_epoch == 0 else "assignment", member, ex.client_id,
                                       epoch, None, ev, details))

    def _kip848_lost(self, g: GroupTimeline) -> list[Finding]:
        out = []
        for mid, info in g.members848.items():
            if info["left"] or info["last_ts"] is None:
                continue
            quiet = KIP848_LOST_INTERVALS * (info["interval_ms"] or 5000) / 1000.0
            later = next(((ts, m, ev) for ts, m, ev in g.epoch_bumps
                          if m != mid and ts is not None and ts > info["last_ts"] + quiet), None)
            if later is None:
                continue
            f = Finding("member_lost", WARNING,
                        f"group {g.group_id}: member {mid} ({info['client_id'] or 'client unknown'}) stopped "
                        "heartbeating without leaving; its partitions moved to other members",
                        f"KIP-848 group: the member's last ConsumerGroupHeartbeat was {later[0] - info['last_ts']:.1f} s "
                        "before another member's assignment changed, and it never left (member epoch -1). It "
                        "crashed, was killed, or lost the network, and the coordinator removed it after the "
                        "session timeout (group.consumer.session.timeout.ms).",
                        key={"group_id": g.group_id, "member_id": mid, "client_id": info["client_id"],
                             "protocol": "consumer (KIP-848)"})
            f.add(info["last_ev"])
            f.add(later[2])
            out.append(f)
        return out

    def _group_error(self, g: GroupTimeline, ex: Exchange, err: str | None, ev: Evidence) -> None:
        said = error_description(err)
        self._add(("group_error", g.group_id, ex.api_name, err), WARNING,
                  f"group {g.group_id}: {ex.api_name} answered {err}",
                  (f"{err}: {said} " if said else "") +
                  "The group coordinator refused a membership step; members cannot consume until they "
                  "rejoin successfully (NOT_COORDINATOR / COORDINATOR_NOT_AVAILABLE: coordinator moved or "
                  "loading; UNKNOWN_MEMBER_ID / ILLEGAL_GENERATION: the member was removed; "
                  "INCONSISTENT_GROUP_PROTOCOL: members disagree on the assignor).", ev,
                  group_id=g.group_id, api_name=ex.api_name, error=err)

    def _new_generation(self, g: GroupTimeline, gen: int, ev: Evidence, ts: float | None) -> None:
        w = self.storm_windows.setdefault(g.group_id, Window(REBALANCE_STORM_WINDOW_S))
        n = w.add(ts)
        f = self._add(("group_rebalance", g.group_id), INFO, f"group {g.group_id}: generations seen",
                      "", ev, group_id=g.group_id)
        f.title = f"group {g.group_id}: {plural(f.count, 'generation')} seen (rebalances)"
        f.detail = ("Each JoinGroup round makes a new generation: members join, the leader assigns partitions "
                    "(SyncGroup). See the group timeline for members, subscriptions and assignments.")
        if n >= REBALANCE_STORM_COUNT:
            sf = self._add(("rebalance_storm", g.group_id), WARNING,
                           f"group {g.group_id}: rebalance storm ({n} generations in "
                           f"{REBALANCE_STORM_WINDOW_S:.0f} s)",
                           "The group keeps rebalancing, so consumption stops over and over. Typical causes: "
                           "members exceeding max.poll.interval.ms, session timeouts from GC or network "
                           "pauses, crash-looping members, or rolling restarts without static membership.",
                           ev, group_id=g.group_id)
            sf.title = f"group {g.group_id}: rebalance storm ({w.best} generations within " \
                       f"{REBALANCE_STORM_WINDOW_S:.0f} s)"
            sf.count = w.best

    def _fetch(self, ex: Exchange) -> None:
        req = ex.request.body if ex.request is not None else None
        resp = ex.response.body if ex.response is not None and ex.status == STATUS_PAIRED else None
        if not req or not resp:
            return
        positions = {}
        for t in as_list(req.get("topics")):
            if isinstance(t, dict):
                topic = name_of(t, self.topic_names)
                for p in as_list(t.get("partitions")):
                    if isinstance(p, dict):
                        positions[(topic, as_int(p.get("partition")))] = as_int(p.get("fetch_offset"))
        gid = self.client_group.get(ex.client_id or "")
        g = self.groups.get(gid) if gid else None
        ev = evidence_of(ex)
        for t in as_list(resp.get("responses")):
            if not isinstance(t, dict):
                continue
            topic = name_of(t, self.topic_names)
            for p in as_list(t.get("partitions")):
                if not isinstance(p, dict) or p.get("error_code"):
                    continue
                part, hw = as_int(p.get("partition_index")), as_int(p.get("high_watermark"))
                if hw is None or hw < 0:
                    continue
                if (topic, part) in self.high_watermarks or len(self.high_watermarks) < MAX_LAG_KEYS:
                    self.high_watermarks[(topic, part)] = (hw, ev)
                if g is not None:
                    samples = g.lag.get((topic, part))
                    if samples is None and len(g.lag) < MAX_LAG_KEYS:
                        samples = g.lag[(topic, part)] = deque(maxlen=MAX_LAG_SAMPLES)
                    if samples is not None:
                        samples.append((ts_of(ex), positions.get((topic, part)), hw, ev))

    def results(self) -> list[Finding]:
        out = list(self.findings.values())
        for g in self.groups.values():
            out.extend(self._lag(g))
            out.extend(self._kip848_lost(g))
            gens = list(g.generations.values())
            for a, b in zip(gens, gens[1:], strict=False):
                if not a.members or not b.members:
                    continue
                # Only a generation whose full member list we saw (the leader's JoinGroup response) can
                # tell who is missing.
                if len(b.members) <= 1 and len(a.members) <= 1:
                    continue
                for mid, info in a.members.items():
                    if mid in b.members or mid in g.left:
                        continue
                    info = dict(info, client_id=info.get("client_id") or g.member_clients.get(mid))
                    f = Finding("member_lost", WARNING,
                                f"group {g.group_id}: member {mid} ({info.get('client_id') or 'client unknown'}) "
                                f"dropped out between generation {a.generation} and {b.generation} "
                                "without LeaveGroup",
                                "The member stopped heartbeating and was removed after its session timeout "
                                "(a crashed or killed consumer, a long GC or processing pause, a network "
                                "partition). Its partitions were unconsumed until the rebalance finished.",
                                key={"group_id": g.group_id, "member_id": mid, "client_id": info.get("client_id"),
                                     "from_generation": a.generation, "to_generation": b.generation})
                    for ev in (a.evidence[:3] + b.evidence[:3]):
                        f.add(ev)
                    out.append(f)
        return out

    def _lag(self, g: GroupTimeline) -> list[Finding]:
        out = []
        for (topic, part), samples in g.lag.items():
            lags = [(ev, hw - pos) for _ts, pos, hw, ev in samples if isinstance(pos, int) and isinstance(hw, int)]
            if len(lags) <= LAG_MIN_SAMPLES:
                continue
            (_, before), (_, last) = lags[-1 - LAG_MIN_SAMPLES], lags[-1]
            if last >= LAG_WARN_RECORDS and last > before:
                f = Finding("consumer_lag_growing", WARNING,
                            f"group {g.group_id}: lag on {topic}[{part}] grew from {before} to {last} records",
                            f"Over the last {LAG_MIN_SAMPLES} fetches the distance between the high watermark "
                            "and the consumer's fetch position kept the consumer at least "
                            f"{LAG_WARN_RECORDS} records behind and growing: it consumes slower than producers "
                            "write (slow processing, too few partitions/consumers, small fetch sizes).",
                            key={"group_id": g.group_id, "topic": topic, "partition": part, "lag": last,
                                 "lag_before": before})
                for ev, _lag in lags[-1 - LAG_MIN_SAMPLES:]:
                    f.add(ev)
                f.count = 1
                out.append(f)
        return out

    def timelines(self) -> list[GroupTimeline]:
        return list(self.groups.values())
