"""One Kafka connection: pair requests with responses and keep protocol state.

Sans-IO: it is fed request and response frames (payload plus capture
timestamps) and emits ``Exchange`` and ``ErrorRow`` values through
``pop_events()``.  Responses carry no api key, so each is decoded with the api
key and version of the in-flight request with the same correlation id.

Latency is measured from the request's last byte to the response's first byte
(what the broker and network cost, not how long the client took to write);
``response_last_ts`` gives time to last byte for large responses.

Packet numbers: before handing a frame to ``on_request`` / ``on_response`` the caller
may set ``frame_packets`` to the numbers of the packets that held its first and last
bytes (the driver does; 0 = unknown). Rows get Wireshark's cross-references from them
(``frame``, ``response_frame``: the last bytes' packets, where Wireshark shows the
decoded message) and their place in capture order (``order``: the packet holding the
request's first byte; for error rows the packet at their ``ts``).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from kwinspect.core import load
from kwinspect.model import (
    DECODE_ERROR,
    DUPLICATE_CORRELATION_ID,
    KAFKA_ERROR,
    LIMIT_EXCEEDED,
    LONG_POLL_FRACTION,
    OUT_OF_ORDER_RESPONSE,
    REQUEST_MISSING,
    RESPONSE_MISSING,
    STATUS_NO_RESPONSE_EXPECTED,
    STATUS_PAIRED,
    STATUS_REQUEST_MISSING,
    STATUS_RESPONSE_MISSING,
    VERSION_NOT_ADVERTISED,
    Endpoint,
    ErrorRow,
    Exchange,
    Issue,
    Message,
    stream_name,
)
from kwinspect.protocol import compiled, decode_request, decode_response
from kwinspect.protocol.apis import API_NAMES, api_name
from kwinspect.protocol.decode import DeferredMessage, decode_response_header
from kwinspect.protocol.peek import peek_request_header, plausible_header
from kwinspect.protocol.schema.api_keys import ApiKey
from kwinspect.stream import labels
from kwinspect.stream.framing import Frame
from kwinspect.stream.labels import (
    iter_record_sets,
    message_topics,
    response_errors,
    topics_of,
)
from kwinspect.stream.redact import (
    SASL_HANDSHAKE,
    SECRET_APIS,
    describe_sasl_token,
    redact_message,
)

PRODUCE = int(ApiKey.PRODUCE)
FETCH = int(ApiKey.FETCH)
METADATA = int(ApiKey.METADATA)
FIND_COORDINATOR = int(ApiKey.FIND_COORDINATOR)
API_VERSIONS = int(ApiKey.API_VERSIONS)
DESCRIBE_CLUSTER = int(ApiKey.DESCRIBE_CLUSTER)
SASL_API_NAME = "SaslToken"  # raw SASL tokens after SaslHandshake v0 carry no Kafka header

DEFAULT_MAX_IN_FLIGHT = 10_000
# In-flight requests keep their decoded bodies while their frames total at most this
# many bytes (over all connections); past it a request is kept as its frame and decoded
# again when its exchange is emitted. Decoded bodies cost up to ~45x their frame bytes
# (crafted arrays of tiny elements), so this bounds what waiting requests hold.
PENDING_DECODED_BYTES = 4 << 20
MAX_ORPHAN_CANDIDATES = 64  # api/versions tried on a response whose request was not captured
# Issue rows (anything but the broker's own error codes) of one kind listed per stream; the
# rest are counted and reported in one row when the stream ends (a flood of 500,000 broken
# frames must not become 500,000 rows)
MAX_ISSUES_PER_KIND = 100
MAX_SHARED_ADVERTISED = 1024  # distinct ApiVersions answers SharedState shares (see same_advertised)


@dataclass(slots=True)  # (slots: the compiled walk counts in it per exchange)
class SharedState:
    """What one connection learns that labels others: broker ids and topic names."""

    brokers: dict[int, tuple[str, int]] = field(default_factory=dict)  # node id -> (host, port)
    topic_names: dict[str, str] = field(default_factory=dict)  # topic id -> name
    exchange_counter: int = 0
    # frame bytes of the in-flight requests whose decoded bodies are kept (PENDING_DECODED_BYTES)
    pending_bytes: int = 0
    # broker_id_for's answers, valid while `brokers` equals the copy they were worked out
    # from (asked once per exchange; `brokers` may be mutated or replaced by anyone)
    _broker_ids: dict = field(default_factory=dict, repr=False, compare=False)
    _brokers_seen: dict | None = field(default=None, repr=False, compare=False)
    # advertised-range maps (ApiVersions) by content: every connection to a broker gets
    # the same answer, and thousands of closed connections keep theirs (see same_advertised)
    _advertised_maps: dict = field(default_factory=dict, repr=False, compare=False)
    # with the compiled core: Produce exchanges are scanned, their bodies decoded only when read
    # (protocol/decode.py's DeferredMessage), for the commands that read none (DissectConfig)
    defer_bodies: bool = field(default=False, repr=False, compare=False)

    def same_advertised(self, advertised: dict[int, tuple[int, int]]) -> dict[int, tuple[int, int]]:
        """One shared dict for every equal advertised-range map (they are never mutated);
        up to MAX_SHARED_ADVERTISED distinct maps, then the map itself."""
        key = tuple(advertised.items())
        mine = self._advertised_maps.get(key)
        if mine is not None:
            return mine
        if len(self._advertised_maps) < MAX_SHARED_ADVERTISED:
            self._advertised_maps[key] = advertised
        return advertised

    def broker_id_for(self, endpoint: Endpoint) -> int | None:
        brokers = self.brokers
        if brokers != self._brokers_seen:
            self._brokers_seen = dict(brokers)
            self._broker_ids = {}
        ids = self._broker_ids
        if endpoint in ids:
            return ids[endpoint]
        nid = ids[endpoint] = self._broker_id_for(endpoint)
        return nid

    def _broker_id_for(self, endpoint: Endpoint) -> int | None:
        exact = [nid for nid, (host, port) in self.brokers.items() if port == endpoint.port and host == endpoint.ip]
        if len(exact) == 1:
            return exact[0]
        by_port = [nid for nid, (_h, port) in self.brokers.items() if port == endpoint.port]
        return by_port[0] if len(by_port) == 1 else None

    def learn(self, api_key: int, body: dict[str, Any] | None) -> None:
        if not body:
            return
        if api_key == METADATA:
            for b in body.get("brokers") or []:
                self._broker(b.get("node_id"), b.get("host"), b.get("port"))
            for t in body.get("topics") or []:
                tid, name = t.get("topic_id"), t.get("name")
                if isinstance(tid, str) and isinstance(name, str) and tid != "AAAAAAAAAAAAAAAAAAAAAA":
                    self.topic_names[tid] = name
        elif api_key == FIND_COORDINATOR:
            if body.get("error_code") == 0 and "node_id" in body:
                self._broker(body.get("node_id"), body.get("host"), body.get("port"))
            for c in body.get("coordinators") or []:
                if c.get("error_code") == 0:
                    self._broker(c.get("node_id"), c.get("host"), c.get("port"))
        elif api_key == DESCRIBE_CLUSTER:
            for b in body.get("brokers") or []:
                self._broker(b.get("broker_id"), b.get("host"), b.get("port"))

    def _broker(self, node_id, host, port) -> None:
        if isinstance(node_id, int) and node_id >= 0 and isinstance(host, str) and isinstance(port, int):
            self.brokers[node_id] = (host, port)


@dataclass(slots=True)
class _Pending:
    message: Message
    ts_first: float
    ts_last: float
    no_response_expected: bool
    pkt_first: int = 0  # packet numbers of its first and last bytes
    pkt_last: int = 0
    frame: bytes | None = None  # set when the body was not kept: decoded again when it is emitted
    counted: int = 0  # bytes it counts in SharedState.pending_bytes


_NO_PACKETS = (0, 0, 0, 0)


class FrameBackedRequest(Message):
    """A request whose body is decoded from its frame each time it is read, never kept:
    what an exchange holds for a request that waited as bytes (PENDING_DECODED_BYTES), so
    a capture of huge unanswered requests never holds their decoded bodies at once."""

    __slots__ = ("_frame", "_redact", "_mechanism")

    def __init__(self, msg: Message, frame: bytes, redact: bool, mechanism: str | None) -> None:
        self._frame, self._redact, self._mechanism = frame, redact, mechanism
        super().__init__(msg.is_request, msg.api_key, msg.api_version, msg.header, None, msg.issues,
                         msg.raw_body, msg.size, msg.decoded_version)

    @property  # type: ignore[override]
    def body(self) -> dict[str, Any] | None:
        msg = decode_request(self._frame)
        if self._redact:
            redact_message(msg.api_key, True, msg.header, msg.body, self._mechanism)
        return msg.body

    @body.setter
    def body(self, _value: Any) -> None:
        pass  # decoded from the frame on each read


@dataclass(frozen=True)
class ConversationSummary:
    """What is shown about a connection's Kafka conversation once it has ended: kept in
    place of the Conversation (its pending maps and protocol state) where thousands of
    closed connections stay listed (the TUI)."""

    stream: str
    client_software: tuple[str, str] | None = None
    sasl_mechanism: str | None = None
    advertised: dict[int, tuple[int, int]] | None = None
    requests: int = 0


class Conversation:
    """Request/response pairing and protocol state for one TCP connection."""

    # The fields the compiled walk (_cconv.c) reads or writes at every frame are slots, read
    # at their member offsets; the rest stays in the instance dict (kept for subclasses).
    __slots__ = ("client", "broker", "stream", "tcp_stream", "shared", "max_in_flight", "frame_packets",
                 "_client_text", "_broker_text", "_pending", "_events", "advertised", "_sasl_raw",
                 "_sasl_pending", "_api_versions_seen", "last_correlation_id", "requests", "responses",
                 "_closed", "__dict__", "__weakref__")

    def summary(self) -> ConversationSummary:
        # (advertised is shared with other connections, never mutated: not copied)
        return ConversationSummary(self.stream, self.client_software, self.sasl_mechanism,
                                   self.advertised or None, self.requests)

    def __init__(self, client: Endpoint, broker: Endpoint, *, shared: SharedState | None = None,
                 redact: bool = True, max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
                 tcp_stream: int | None = None) -> None:
        self.client = client
        self.tcp_stream = tcp_stream  # tshark's tcp.stream of the connection, for the rows
        self.frame_packets = (0, 0)  # set by the caller: packets of the next frame's first and last bytes
        self.broker = broker
        self.stream = stream_name(client, broker)
        self._client_text, self._broker_text = str(client), str(broker)  # once, not per exchange
        self.shared = shared or SharedState()
        self.redact = redact
        self.max_in_flight = max_in_flight
        self._pending: OrderedDict[int, _Pending] = OrderedDict()
        self._events: list[Exchange | ErrorRow] = []
        # protocol state
        self.advertised: dict[int, tuple[int, int]] | None = None  # from ApiVersions
        self.client_software: tuple[str, str] | None = None
        self.sasl_mechanism: str | None = None
        self._sasl_raw = False  # after a successful SaslHandshake v0
        self._sasl_pending: list[tuple[bytes, float, float, tuple[int, int]]] = []
        self._api_versions_seen: set[tuple[int, int]] = set()
        self.last_correlation_id: int | None = None
        self.requests = 0
        self.responses = 0
        self._issue_counts: dict[str, int] = {}  # issue rows per kind (see MAX_ISSUES_PER_KIND)
        self._closed_ts: float | None = None
        self._closed = False

    # -- what the framing layer needs ------------------------------------------------

    def pending_correlation_ids(self) -> set[int]:
        return set(self._pending)

    def events_held(self) -> int:
        """Events emitted and not yet taken by pop_events."""
        return len(self._events)

    def insert_event(self, index: int, item: Any) -> None:
        """Put ``item`` among the events not yet taken, at ``index`` (a ``--jobs`` worker marks
        the exchanges whose labels looked up topic ids, run/parallel.py)."""
        self._events.insert(index, item)

    def pop_events(self) -> list[Exchange | ErrorRow]:
        # (stream/_cconv.c does this when every event is an Exchange and _closed is False)
        events, self._events = self._events, []
        counts = self._issue_counts
        kept: list[Exchange | ErrorRow] | None = None
        for i, ev in enumerate(events):
            if type(ev) is ErrorRow and ev.kind != KAFKA_ERROR:
                n = counts.get(ev.kind, 0) + 1
                counts[ev.kind] = n
                if n > MAX_ISSUES_PER_KIND:
                    if kept is None:
                        kept = events[:i]
                    continue
            if kept is not None:
                kept.append(ev)
        if kept is not None:
            events = kept
        if self._closed:
            self._closed = False
            for kind, n in counts.items():
                if n > MAX_ISSUES_PER_KIND:
                    events.append(ErrorRow(
                        kind=LIMIT_EXCEEDED, ts=self._closed_ts, stream=self.stream,
                        message=f"{n - MAX_ISSUES_PER_KIND} more {kind} rows on this stream not "
                                f"listed (the first {MAX_ISSUES_PER_KIND} are)"))
        return events

    # -- requests ----------------------------------------------------------------------

    def on_request(self, frame: bytes, ts_first: float, ts_last: float) -> None:
        # stream/_cconv.c is the twin of this method's usual case, on these same fields:
        # requests, _sasl_raw, last_correlation_id, _api_versions_seen, advertised, _pending
        # (_Pending's fields), max_in_flight, shared.pending_bytes. A change to them changes
        # the C too (tests/stream/test_conversation_compiled.py compares the state).
        self.requests += 1
        pkts = self.frame_packets
        if self._sasl_raw and not self._looks_like_request(frame):
            self._sasl_pending.append((frame, ts_first, ts_last, pkts))
            return
        self._sasl_raw = False
        msg = decode_request(frame)
        cid = msg.header.get("correlation_id")
        api_key = msg.api_key
        if api_key is None or cid is None:
            self._anomaly(DECODE_ERROR, ts_last, message=_issue_text(msg.issues) or "undecodable request",
                          frame=pkts[1], order=pkts[1])
            return
        self.last_correlation_id = cid
        body = msg.body
        self._api_versions_seen.add((api_key, msg.api_version))
        # once per request: the usual answers (an advertised version, an api without secrets)
        # without a call; the calls decide the rest
        advertised = self.advertised
        if advertised is not None and api_key != API_VERSIONS:
            rng = advertised.get(api_key)
            if rng is None or not rng[0] <= msg.api_version <= rng[1]:
                self._check_advertised(msg, ts_last, pkts[1])
        if api_key == SASL_HANDSHAKE and body:
            self.sasl_mechanism = body.get("mechanism")
        if self.redact and api_key in SECRET_APIS:
            redact_message(api_key, True, msg.header, body, self.sasl_mechanism)
        if api_key == API_VERSIONS and body and body.get("client_software_name"):
            self.client_software = (body["client_software_name"], body.get("client_software_version", ""))
        no_resp = api_key == PRODUCE and bool(body) and body.get("acks") == 0
        if cid in self._pending:
            older = self._pending.pop(cid)
            self._anomaly(DUPLICATE_CORRELATION_ID, ts_last, api=msg.api_key, cid=cid,
                          message=f"correlation id {cid} reused while an earlier request was in flight",
                          frame=pkts[1], order=pkts[1])
            self._emit_unanswered(older)
        shared = self.shared
        if shared.pending_bytes + len(frame) <= PENDING_DECODED_BYTES:
            shared.pending_bytes += len(frame)
            pending = _Pending(msg, ts_first, ts_last, no_resp, pkts[0], pkts[1], None, len(frame))
        else:  # keep the bytes, not the decoded body (header, issues and size stay)
            msg.body = {}
            pending = _Pending(msg, ts_first, ts_last, no_resp, pkts[0], pkts[1], bytes(frame))
        self._pending[cid] = pending
        while len(self._pending) > self.max_in_flight:
            _cid, oldest = self._pending.popitem(last=False)
            self._emit_unanswered(oldest)

    def _looks_like_request(self, frame: bytes) -> bool:
        peek = peek_request_header(frame)
        return peek is not None and plausible_header(peek) and peek.api_key != SASL_HANDSHAKE

    def _check_advertised(self, msg: Message, ts: float, pkt: int = 0) -> None:
        if self.advertised is None or msg.api_key == API_VERSIONS:
            return
        rng = self.advertised.get(msg.api_key)
        if rng is None or not rng[0] <= msg.api_version <= rng[1]:
            where = f"v{rng[0]}-v{rng[1]}" if rng else "no version of it"
            name = api_name(msg.api_key) or f"api key {msg.api_key} (unknown)"
            self._anomaly(VERSION_NOT_ADVERTISED, ts, api=msg.api_key, cid=msg.correlation_id,
                          message=f"{name} v{msg.api_version} used, broker advertised {where}",
                          frame=pkt, order=pkt)

    # -- responses -----------------------------------------------------------------------

    def on_response(self, frame: bytes, ts_first: float, ts_last: float) -> None:
        # stream/_cconv.c is the twin of this method's usual case and of emit's for it, on
        # these same fields: responses, _sasl_raw, _sasl_pending, _pending, _events, stream,
        # _client_text, _broker_text, tcp_stream, broker, shared (topic_names, pending_bytes,
        # exchange_counter, brokers, _brokers_seen, _broker_ids), and Exchange's fields.
        self.responses += 1
        pkts = self.frame_packets
        if (self._sasl_raw or self._sasl_pending) and not self._pending_has(frame):
            self._on_sasl_response(frame, ts_first, ts_last, pkts)
            return
        cid = int.from_bytes(frame[:4], "big", signed=True) if len(frame) >= 4 else None
        if cid is None or cid not in self._pending:
            self._on_orphan_response(frame, cid, ts_first, ts_last, pkts)
            return
        # Everything queued before this request (arrival order: requests sharing a
        # segment share a timestamp) was skipped by the broker.
        skipped = []
        for other_cid in self._pending:
            if other_cid == cid:
                break
            skipped.append(other_cid)
        pending = self._pending.pop(cid)
        for other_cid in skipped:
            other = self._pending.pop(other_cid)
            if not other.no_response_expected:
                self._anomaly(OUT_OF_ORDER_RESPONSE, ts_first, api=other.message.api_key, cid=other_cid,
                              message=f"response to correlation id {cid} arrived before the one to {other_cid}",
                              frame=other.pkt_last, response_frame=pkts[1], order=pkts[0])
            self._emit_unanswered(other)
        req = pending.message if pending.frame is None else self._request_of(pending)
        if pending.counted:  # what _request_of does first, inlined for the usual request
            self.shared.pending_bytes -= pending.counted
            pending.counted = 0
        resp = decode_response(frame, req.api_key, req.api_version)
        self._after_response(req, resp)
        n = len(self._events)
        self.emit(req, resp, pending.ts_first, pending.ts_last, ts_first, ts_last, STATUS_PAIRED,
                   packets=(pending.pkt_first, pending.pkt_last, pkts[0], pkts[1]))
        if pending.frame is not None:
            self._frame_backed(pending, n)

    def _request_of(self, pending: _Pending) -> Message:
        """The request of a pending entry leaving the in-flight set, decoded again (and
        redacted) when only its bytes were kept."""
        if pending.counted:
            self.shared.pending_bytes -= pending.counted
            pending.counted = 0
        if pending.frame is None:
            return pending.message
        msg = decode_request(pending.frame)
        if self.redact:
            redact_message(msg.api_key, True, msg.header, msg.body, self.sasl_mechanism)
        return msg

    def _frame_backed(self, pending: _Pending, n: int) -> None:
        """After emit of a request that waited as bytes: its exchange (the first one from
        event ``n`` on) keeps the frame instead of the decoded body."""
        if pending.frame is None:
            return
        for ev in self._events[n:]:
            if type(ev) is Exchange and ev.request is not None:
                ev.request = FrameBackedRequest(ev.request, pending.frame, self.redact, self.sasl_mechanism)
                return

    def oldest_pending_packet(self, since: float) -> int:
        """The packet of the first byte of the oldest request still waiting for its answer
        and completed at or after ``since`` (capture time; older ones no longer count), 0
        when none: the exchange it becomes sorts there (see stream/row_order.py)."""
        for pending in self._pending.values():  # arrival order: the oldest first
            if pending.ts_last >= since:
                return pending.pkt_first
        for _frame, _ts_first, ts_last, pkts in self._sasl_pending:
            if ts_last >= since:
                return pkts[0]
        return 0

    def _pending_has(self, frame: bytes) -> bool:
        return len(frame) >= 4 and int.from_bytes(frame[:4], "big", signed=True) in self._pending

    def _after_response(self, req: Message, resp: Message) -> None:
        body = resp.body
        self.shared.learn(req.api_key, body)
        if not body:
            return
        if req.api_key == API_VERSIONS and body.get("error_code") == 0:
            # a body cut short by a decode error holds partial entries: keep the complete ones
            # (a loop, not a generator per entry: every connection's first answer)
            advertised = {}
            for k in body.get("api_keys") or ():
                if isinstance(k, dict):
                    key, lo, hi = k.get("api_key"), k.get("min_version"), k.get("max_version")
                    if isinstance(key, int) and isinstance(lo, int) and isinstance(hi, int):
                        advertised[key] = (lo, hi)
            self.advertised = self.shared.same_advertised(advertised)
        elif req.api_key == SASL_HANDSHAKE and req.api_version == 0 and body.get("error_code") == 0:
            self._sasl_raw = True
        if self.redact and req.api_key in SECRET_APIS:  # redact_message's own first test
            redact_message(req.api_key, False, resp.header, body, self.sasl_mechanism)

    def _on_sasl_response(self, frame: bytes, ts_first: float, ts_last: float, pkts: tuple[int, int]) -> None:
        """Raw SASL tokens (handshake v0): pair the oldest client token with this one."""
        if not self._sasl_pending:
            self._anomaly(REQUEST_MISSING, ts_first, message="SASL token from the broker with no client token",
                          response_frame=pkts[1], order=pkts[0])
            return
        req_frame, rts_first, rts_last, rpkts = self._sasl_pending.pop(0)
        mech = self.sasl_mechanism
        req = Message(True, None, None, {}, describe_sasl_token(req_frame, mech, True, self.redact),
                      size=len(req_frame))
        resp = Message(False, None, None, {}, describe_sasl_token(frame, mech, False, self.redact),
                       size=len(frame))
        self.emit(req, resp, rts_first, rts_last, ts_first, ts_last, STATUS_PAIRED, api_label=SASL_API_NAME,
                   packets=(rpkts[0], rpkts[1], pkts[0], pkts[1]))

    def _on_orphan_response(self, frame: bytes, cid: int | None, ts_first: float, ts_last: float,
                            pkts: tuple[int, int] = (0, 0)) -> None:
        """A response whose request was not captured: decode what can be known."""
        candidates = sorted(self._api_versions_seen)
        if len(candidates) > MAX_ORPHAN_CANDIDATES:
            # a connection that used hundreds of api/versions would make every orphan response
            # cost hundreds of decodes (hostile captures); more than a few fit rarely anyway
            candidates = []
        resp = None
        for api_key, version in candidates:
            trial = decode_response(frame, api_key, version)
            if not trial.issues:
                if resp is not None:  # more than one fits: ambiguous, do not guess
                    resp = None
                    break
                resp = trial
        if resp is None:
            header, _pos, issues = decode_response_header(frame)
            reason = ("its request was not captured (the capture probably started mid-connection), "
                      "so the api key and version needed to decode the body are unknown")
            issues.append(Issue(REQUEST_MISSING, reason, offset=0, severity="warning"))
            raw = bytes(frame[4:])
            if self.redact and any(k in SECRET_APIS for k, _v in self._api_versions_seen):
                # an undecoded body on a connection that carries credentials may hold them
                raw = None
                issues.append(Issue("redacted", "raw body withheld: this connection carries SASL or "
                                    "delegation-token secrets (--no-redact shows it)", severity="info"))
            resp = Message(False, None, None, header, None, issues, raw_body=raw, size=len(frame))
        else:
            resp.issues.append(Issue(REQUEST_MISSING, "request not captured; body decoded as the only "
                                     "api/version this connection used that fits", severity="info"))
            if self.redact:
                redact_message(resp.api_key, False, resp.header, resp.body, self.sasl_mechanism)
        self._anomaly(REQUEST_MISSING, ts_first, api=resp.api_key, cid=cid,
                      message="response without a captured request", response_frame=pkts[1], order=pkts[0])
        self.emit(None, resp, None, None, ts_first, ts_last, STATUS_REQUEST_MISSING,
                   packets=(0, 0, pkts[0], pkts[1]))

    # -- ending ----------------------------------------------------------------------------

    def close(self, ts: float | None = None, pkt: int = 0) -> None:
        """Connection closed or capture ended (``pkt``: the packet number then): whatever
        is still in flight is unanswered."""
        for pending in list(self._pending.values()):
            self._emit_unanswered(pending, ts, pkt)
        self._pending.clear()
        for req_frame, rts_first, rts_last, rpkts in self._sasl_pending:
            req = Message(True, None, None, {}, describe_sasl_token(req_frame, self.sasl_mechanism, True,
                                                                   self.redact), size=len(req_frame))
            self.emit(req, None, rts_first, rts_last, None, None, STATUS_RESPONSE_MISSING, api_label=SASL_API_NAME,
                       packets=(rpkts[0], rpkts[1], 0, 0))
        self._sasl_pending.clear()
        self._closed, self._closed_ts = True, ts  # the next pop_events counts suppressed rows

    def _emit_unanswered(self, pending: _Pending, ts: float | None = None, pkt: int = 0) -> None:
        status = STATUS_NO_RESPONSE_EXPECTED if pending.no_response_expected else STATUS_RESPONSE_MISSING
        if status == STATUS_RESPONSE_MISSING:
            self._anomaly(RESPONSE_MISSING, ts if ts is not None else pending.ts_last,
                          api=pending.message.api_key, cid=pending.message.correlation_id,
                          message="request never answered in the capture",
                          frame=pending.pkt_last, order=pkt if ts is not None else pending.pkt_last)
        n = len(self._events)
        self.emit(self._request_of(pending), None, pending.ts_first, pending.ts_last, None, None, status,
                   packets=(pending.pkt_first, pending.pkt_last, 0, 0))
        self._frame_backed(pending, n)

    # -- building rows -----------------------------------------------------------------------

    def emit(self, req: Message | None, resp: Message | None, req_first, req_last, resp_first, resp_last,
              status: str, api_label: str | None = None, packets: tuple[int, int, int, int] = _NO_PACKETS) -> None:
        """One exchange and its error rows; ``packets``: the numbers of the packets holding the
        request's first and last and the response's first and last bytes (0 = none/unknown)."""
        # Called once per exchange: locals instead of repeated attribute lookups, and
        # nothing built for error rows when there are none (the common case).
        ref = req or resp
        api_key = ref.api_key if ref else None
        name = api_label or (API_NAMES.get(api_key) if api_key is not None else None)
        cid = ref.header.get("correlation_id") if ref else None  # Message.correlation_id, inlined
        body = resp.body if resp else None
        shared = self.shared
        names = shared.topic_names
        # the record sets whose issues become rows: (request's, response's); None: Python finds them
        req_sets = resp_sets = None
        if api_key is not None:
            compiled = labels.compiled_exchange  # C: every label of the pair in one call, or None
            found = compiled(api_key, req.body if req else None, body, names or {}) if compiled else None
            if found is not None:
                errors, topics, req_sets, resp_sets = found
            else:
                # a cleanly decoded Produce/Fetch body takes the walk guided by the schema
                errors = response_errors(api_key, body, not resp.issues, names) if body else []
                topics = message_topics(api_key, req.body, True, not req.issues, names) if req else []
                if not topics and body:
                    topics = topics_of(body, names)
        else:
            errors = []
            topics = []
        throttle = body.get("throttle_time_ms") if body else None
        # rounded to the microsecond: pcap timestamps resolve no finer (epoch floats carry noise below it)
        latency = (round((resp_first - req_last) * 1000.0, 3)
                   if req_last is not None and resp_first is not None else None)
        long_poll = None
        if api_key == FETCH and latency is not None and req is not None and body and req.body:
            wait = req.body.get("max_wait_ms")
            long_poll = (isinstance(wait, int) and wait > 0 and latency >= LONG_POLL_FRACTION * wait
                         and not fetch_carried_records(body, names))
        shared.exchange_counter += 1
        events = self._events
        stream = self.stream
        req_pfirst, req_plast, resp_pfirst, resp_plast = packets
        frame, response_frame, tcp_stream = req_plast or None, resp_plast or None, self.tcp_stream
        events.append(Exchange(
            stream, self._client_text, self._broker_text, api_key, name,
            ref.api_version if ref else None, cid,
            req.header.get("client_id") if req else None,
            req_last, resp_first, latency,
            req.size if req else None, resp.size if resp else None,
            status,
            [e["code"] for e in errors] if errors else [], [e["name"] for e in errors] if errors else [],
            topics, throttle if isinstance(throttle, int) else None,
            resp_last, req, resp,
            shared.broker_id_for(self.broker), shared.exchange_counter, long_poll,
            frame, response_frame, tcp_stream, req_pfirst if req is not None else resp_pfirst,
        ))
        ts = resp_first if resp_first is not None else req_last
        order = resp_pfirst if resp_first is not None else req_plast
        for e in errors:
            events.append(ErrorRow(
                kind=KAFKA_ERROR, code=e["code"], name=e["name"], retriable=e["retriable"], api_name=name,
                correlation_id=cid, topic=e["topic"], partition=e["partition"], path=e["path"],
                message=e["message"] or (f"group {e['group']}" if e.get("group") else None),
                ts=ts, stream=stream, frame=frame, response_frame=response_frame, tcp_stream=tcp_stream,
                order=order))
        if req_sets is not None and not (req_sets or resp_sets or (req is not None and req.issues)
                                         or (resp is not None and resp.issues)):
            return  # the C found no troubled record set, and neither message has issues
        for msg, sets in ((req, req_sets), (resp, resp_sets)):
            if msg is None:
                continue
            # batch-level problems (CRC, cut batches); no decompression; only Produce and Fetch carry records
            if sets is None and (api_key == PRODUCE or api_key == FETCH) and msg.body:
                sets = iter_record_sets(api_key, msg.body, names)
            if sets:
                for topic, partition, rs in sets:
                    if rs.issues:
                        for issue in rs.issues:
                            if issue.severity != "info":
                                events.append(ErrorRow(
                                    kind=issue.kind, api_name=name, correlation_id=cid, topic=topic,
                                    partition=partition, path=issue.path, message=issue.message, ts=ts,
                                    stream=stream, frame=frame, response_frame=response_frame,
                                    tcp_stream=tcp_stream, order=order))
            if msg.issues:
                for issue in msg.issues:
                    # info issues are notes, not problems; request_missing was reported as an anomaly
                    if issue.severity == "info" or issue.kind == REQUEST_MISSING:
                        continue
                    events.append(ErrorRow(
                        kind=issue.kind, api_name=name, correlation_id=cid, path=issue.path,
                        message=issue.message, ts=ts, stream=stream, frame=frame,
                        response_frame=response_frame, tcp_stream=tcp_stream, order=order))

    def _anomaly(self, kind: str, ts: float | None, *, api: int | None = None, cid: int | None = None,
                 message: str | None = None, frame: int = 0, response_frame: int = 0, order: int = 0) -> None:
        self._events.append(ErrorRow(kind=kind, api_name=api_name(api) if api is not None else None,
                                     correlation_id=cid, message=message, ts=ts, stream=self.stream,
                                     frame=frame or None, response_frame=response_frame or None,
                                     tcp_stream=self.tcp_stream, order=order))


def fetch_carried_records(body: dict, names: dict[str, str]) -> bool:
    """A Fetch response body holds a record set with bytes in it (not a long poll)."""
    return any(rs.size for _t, _p, rs in iter_record_sets(1, body, names))


def _issue_text(issues: list[Issue]) -> str:
    return "; ".join(f"{i.kind}: {i.message}" for i in issues)


# -- the compiled twin (stream/_cconv.c) --------------------------------------------------------
#
# The facade: the C walk over a splitter's events, or None without the extension (or with
# KWINSPECT_PURE=1; tests set it to None for the Python core).
# compiled_frames(conversation, events, start, from_client, validator, sink) takes the
# ordinary frames from events[start] on (what on_request / on_response do for them, the
# driver's validator line included) and returns the index of the first event it left to
# Python; len(events) + 1 when it took them all and did pop_events' work too (the rows were
# all Exchanges: moved to the end of the list `sink`).

_c = load("kwinspect.stream._cconv")
if _c is not None:
    try:
        _c.configure(Conversation, SharedState, _Pending, Exchange, Frame, _Pending.__slots__,
                     tuple(Exchange.__dataclass_fields__), compiled.exchange_decoder, labels,
                     fetch_carried_records, round, API_NAMES, SECRET_APIS, float(LONG_POLL_FRACTION),
                     STATUS_PAIRED, PENDING_DECODED_BYTES)
        _c.configure_deferred(compiled.exchange_scanner, DeferredMessage)
    except TypeError:  # Exchange or _Pending no longer what the C fills (their fields changed): Python
        _c = None
compiled_frames = _c.frames if _c is not None else None
