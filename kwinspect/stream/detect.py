"""Protocol detection: is a TCP connection Kafka, TLS or something else, and
which side is the broker.  Sans-IO: it looks at the first bytes each side sent.

Two functions make up the API:

* :func:`classify_direction` - what the first bytes one side sent look like:
  ``TLS``, ``KAFKA_REQUEST`` (the side is a Kafka client), ``KAFKA_RESPONSE``
  (the side is a broker answering), ``NOT_KAFKA``, or ``UNKNOWN`` (not enough
  bytes yet: call again with more).
* :func:`decide_connection` - combines both directions with the configured
  Kafka ports into a :class:`ConnectionVerdict`: ``kind`` (``"kafka"``,
  ``"tls"``, ``"not_kafka"``, ``"undecided"``) and ``broker_side`` (0 or 1,
  the index of the side that is the broker, or None).

Rules for the broker side, in order: a configured port (when exactly one side
uses one); else the side that *receives* well-formed Kafka request headers;
else, for TLS, the side that received the ClientHello; else unknown.  Kafka is
detected on any port from request headers alone; responses alone count only
on a configured port or when their correlation ids match requests seen from
the other side, because "int32 length + int32" fits too many protocols.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import NamedTuple

from kwinspect.model import NOT_KAFKA as NOT_KAFKA_ISSUE
from kwinspect.model import TLS_STREAM
from kwinspect.protocol.peek import (
    MIN_REQUEST_HEADER,
    peek_request_header,
    plausible_header,
)
from kwinspect.stream.framing import (
    DEFAULT_MAX_FRAME_SIZE,
    Frame,
    FrameSplitter,
    RequestValidator,
)

# classify_direction results
TLS = "tls"
KAFKA_REQUEST = "kafka_request"
KAFKA_RESPONSE = "kafka_response"
UNKNOWN = "unknown"
NOT_KAFKA = "not_kafka"

# decide_connection kinds
KIND_KAFKA = "kafka"
KIND_TLS = "tls"
KIND_NOT_KAFKA = "not_kafka"
KIND_UNDECIDED = "undecided"

# Mid-stream hunting gives up (NOT_KAFKA) after this many bytes without a request.
MID_STREAM_SCAN_LIMIT = 256 * 1024
# How many leading request frames are read for correlation ids.
MAX_PEEKED_FRAMES = 64

_TLS_CONTENT_TYPES = (0x16,)  # handshake; a connection starts with one


def is_tls_start(data: bytes | bytearray | memoryview) -> bool:
    """True when ``data`` starts with a TLS handshake record (0x16 0x03 0x00-0x04).

    As a Kafka size prefix those bytes would mean a frame of about 369 MB,
    above any sane limit, so the test cannot mistake a Kafka stream for TLS.
    """
    return len(data) >= 3 and data[0] == 0x16 and data[1] == 0x03 and data[2] <= 0x04


def tls_handshake_type(data: bytes | bytearray | memoryview) -> int | None:
    """The handshake message type of a leading TLS record (1 ClientHello, 2 ServerHello)."""
    if is_tls_start(data) and len(data) >= 6:
        return data[5]
    return None


def request_correlation_ids(
    data: bytes | bytearray | memoryview, *, known_kafka: bool = False, limit: int = MAX_PEEKED_FRAMES
) -> list[int]:
    """Correlation ids of the leading well-formed requests in ``data`` (in order).

    Stops at the first frame that is incomplete or not a plausible request.
    """
    out: list[int] = []
    pos, n = 0, len(data)
    while len(out) < limit and n - pos >= 4:
        size = int.from_bytes(data[pos : pos + 4], "big", signed=True)
        if size < MIN_REQUEST_HEADER or pos + 4 + size > n:
            break
        peek = peek_request_header(data[pos + 4 : pos + 4 + size])
        if peek is None or not plausible_header(peek, known_kafka=known_kafka):
            break
        out.append(peek.correlation_id)
        pos += 4 + size
    return out


def _first_request(
    data: bytes | bytearray | memoryview, final: bool, known_kafka: bool, max_frame_size: int
) -> str:
    """KAFKA_REQUEST, NOT_KAFKA (as a request) or UNKNOWN (need more bytes)."""
    n = len(data)
    size = int.from_bytes(data[0:4], "big", signed=True)
    if size < MIN_REQUEST_HEADER:
        return NOT_KAFKA
    have = n - 4
    if have < MIN_REQUEST_HEADER:
        return NOT_KAFKA if final else UNKNOWN
    cid_len = int.from_bytes(data[12:14], "big", signed=True)
    need = MIN_REQUEST_HEADER + max(cid_len, 0)
    if need > size:
        return NOT_KAFKA
    if have < need:
        return NOT_KAFKA if final else UNKNOWN
    peek = peek_request_header(data[4 : 4 + need])
    if peek is None or not plausible_header(peek, known_kafka=known_kafka):
        return NOT_KAFKA
    return KAFKA_REQUEST


def _response_chain(
    data: bytes | bytearray | memoryview,
    final: bool,
    max_frame_size: int,
    correlation_ids: Collection[int] | None,
) -> str:
    """KAFKA_RESPONSE when ``data`` starts with response-shaped frames."""
    n = len(data)
    if n < 8:
        return NOT_KAFKA if final else UNKNOWN
    cid = int.from_bytes(data[4:8], "big", signed=True)
    if correlation_ids:
        return KAFKA_RESPONSE if cid in correlation_ids else NOT_KAFKA
    # No requests to match: every leading frame must chain (sane sizes,
    # non-negative correlation ids) up to the end of what we hold.
    pos = 0
    frames = 0
    while frames < MAX_PEEKED_FRAMES:
        if n - pos < 4:
            break
        size = int.from_bytes(data[pos : pos + 4], "big", signed=True)
        if size < 4 or size > max_frame_size:
            return NOT_KAFKA
        if n - pos >= 8 and int.from_bytes(data[pos + 4 : pos + 8], "big", signed=True) < 0:
            return NOT_KAFKA
        if pos + 4 + size > n:
            break
        pos += 4 + size
        frames += 1
    if frames == 0 or (pos < n and n - pos < 4 and not final):
        return UNKNOWN if not final else (KAFKA_RESPONSE if frames else NOT_KAFKA)
    return KAFKA_RESPONSE


def classify_direction(
    data: bytes | bytearray | memoryview,
    *,
    final: bool = False,
    mid_stream: bool = False,
    known_kafka: bool = False,
    correlation_ids: Collection[int] | None = None,
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
) -> str:
    """Classify the first bytes one side of a connection sent.

    ``data``: the leading bytes of the direction (as many as are at hand).
    ``final``: no more bytes will come, so decide instead of answering UNKNOWN.
    ``mid_stream``: the capture started inside the connection, so ``data`` may
    start inside a frame; requests are then searched for (resync) within the
    first ``MID_STREAM_SCAN_LIMIT`` bytes.
    ``correlation_ids``: correlation ids of requests the other side sent; a
    response is recognised when its correlation id is one of them.  Without
    them, response-shaped data (sane sizes, non-negative correlation ids,
    frames that chain) is classified KAFKA_RESPONSE, which is weak evidence.

    Returns one of TLS, KAFKA_REQUEST, KAFKA_RESPONSE, NOT_KAFKA, UNKNOWN.
    Never raises on any bytes.
    """
    n = len(data)
    if n == 0:
        return UNKNOWN
    if n < 3 and data[0] == 0x16 and (n == 1 or data[1] == 0x03) and not final:
        return UNKNOWN
    if is_tls_start(data):
        return TLS
    if mid_stream:
        return _classify_mid_stream(data, final, known_kafka, correlation_ids, max_frame_size)
    if n < 4:
        return NOT_KAFKA if final else UNKNOWN
    size = int.from_bytes(data[0:4], "big", signed=True)
    if size < 4 or size > max_frame_size:
        return NOT_KAFKA
    if correlation_ids and n >= 8 and int.from_bytes(data[4:8], "big", signed=True) in correlation_ids:
        # answers a request of the other side; checked first because a
        # response with a small correlation id also parses as a request
        return KAFKA_RESPONSE
    as_request = _first_request(data, final, known_kafka, max_frame_size)
    if as_request == KAFKA_REQUEST:
        return KAFKA_REQUEST
    as_response = _response_chain(data, final, max_frame_size, correlation_ids)
    if as_response == KAFKA_RESPONSE:
        return KAFKA_RESPONSE
    if as_request == UNKNOWN or as_response == UNKNOWN:
        return UNKNOWN
    return NOT_KAFKA


def _classify_mid_stream(
    data: bytes | bytearray | memoryview,
    final: bool,
    known_kafka: bool,
    correlation_ids: Collection[int] | None,
    max_frame_size: int,
) -> str:
    window = bytes(data[:MID_STREAM_SCAN_LIMIT])
    sp = FrameSplitter(RequestValidator(known_kafka=known_kafka), synced=False, max_frame_size=max_frame_size)
    sp.feed(window, 0.0)
    done = final or len(data) >= MID_STREAM_SCAN_LIMIT
    if done:
        sp.finish()
    for ev in sp.events():
        if isinstance(ev, Frame):
            return KAFKA_REQUEST
    if correlation_ids:
        ids = set(correlation_ids)

        def matches(payload: memoryview) -> bool:
            return len(payload) >= 4 and int.from_bytes(payload[0:4], "big", signed=True) in ids

        matches.min_payload = 4  # type: ignore[attr-defined]
        rs = FrameSplitter(matches, synced=False, max_frame_size=max_frame_size)
        rs.feed(window, 0.0)
        if done:
            rs.finish()
        if any(isinstance(ev, Frame) for ev in rs.events()):
            return KAFKA_RESPONSE
    return NOT_KAFKA if done else UNKNOWN


class ConnectionVerdict(NamedTuple):
    """What a connection carries and which side is the broker."""

    kind: str  # KIND_KAFKA | KIND_TLS | KIND_NOT_KAFKA | KIND_UNDECIDED
    broker_side: int | None  # 0 or 1 (index into the sides), None when unknown
    reason: str  # why, in words, for reports and logs
    directions: tuple[str, str]  # classify_direction of what side 0 and side 1 sent

    @property
    def decided(self) -> bool:
        return self.kind != KIND_UNDECIDED

    @property
    def issue_kind(self) -> str | None:
        """The anomaly to report for the connection: ``tls_stream``, ``not_kafka`` or None."""
        return {KIND_TLS: TLS_STREAM, KIND_NOT_KAFKA: NOT_KAFKA_ISSUE}.get(self.kind)


def _frame_heads(data: bytes | bytearray | memoryview, max_frame_size: int, head: int = 512) -> list[bytes]:
    """Payload heads of the leading complete frames of sane size in ``data``."""
    out: list[bytes] = []
    pos, n = 0, len(data)
    while len(out) < MAX_PEEKED_FRAMES and n - pos >= 4:
        size = int.from_bytes(data[pos : pos + 4], "big", signed=True)
        if size < 4 or size > max_frame_size or pos + 4 + size > n:
            break
        out.append(bytes(data[pos + 4 : pos + 4 + min(size, head)]))
        pos += 4 + size
    return out


def _answers(responder: list[bytes], requester: list[bytes]) -> int:
    """How many of ``responder``'s frames carry, in request order, the
    correlation ids of ``requester``'s request-shaped frames."""
    cids = []
    for h in requester:
        peek = peek_request_header(h)
        if peek is not None and plausible_header(peek, known_kafka=True):
            cids.append(peek.correlation_id)
    j = count = 0
    for h in responder:
        cid = int.from_bytes(h[0:4], "big", signed=True)
        try:
            k = cids.index(cid, j)
        except ValueError:
            continue
        count += 1
        j = k + 1
    return count


def decide_connection(
    ports: Sequence[int],
    first_bytes: Sequence[bytes | bytearray | memoryview],
    kafka_ports: Collection[int] = (),
    *,
    initiator: int | None = None,
    final: bool = False,
    mid_stream: bool = False,
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
) -> ConnectionVerdict:
    """Decide what a connection carries and which of its two sides is the broker.

    ``ports[i]`` is side i's TCP port and ``first_bytes[i]`` the leading bytes
    side i *sent* (either may be empty).  ``kafka_ports`` are the configured
    broker ports (``--kafka-ports``; empty means auto-detect only).
    ``initiator`` is the side that sent the SYN, when it was captured.
    ``final``: no more bytes will come for either side.  ``mid_stream``: the
    capture started inside the connection.

    Evidence for the broker side, strongest first: a configured port used by
    exactly one side; responses, i.e. frames of one side whose leading int32s
    are, in order, the correlation ids of the other side's requests; the only
    side that receives request-shaped frames; the side that did not initiate
    the connection.  (A response often also parses as a request - e.g. a
    Produce response with correlation id 2 reads as "Produce v2" - which is
    why answers outrank request shapes.)

    While the verdict's kind is ``"undecided"``, call again with more bytes.
    Never raises on any bytes.
    """
    kafka_ports = set(kafka_ports)
    b0, b1 = first_bytes[0], first_bytes[1]
    heads = (_frame_heads(b0, max_frame_size), _frame_heads(b1, max_frame_size))
    answers = (_answers(heads[0], heads[1]), _answers(heads[1], heads[0]))
    c0 = classify_direction(b0, final=final, mid_stream=mid_stream, max_frame_size=max_frame_size)
    c1 = classify_direction(b1, final=final, mid_stream=mid_stream, max_frame_size=max_frame_size)
    classes = [c0, c1]

    port_sides = [i for i in (0, 1) if ports[i] in kafka_ports]
    by_port: int | None = port_sides[0] if len(port_sides) == 1 else None

    by_traffic: int | None = None
    traffic_reason = ""
    if answers[0] != answers[1]:
        by_traffic = 0 if answers[0] > answers[1] else 1
        traffic_reason = "side that answers the other side's Kafka requests"
    else:
        req_sides = [i for i in (0, 1) if classes[i] == KAFKA_REQUEST]
        if len(req_sides) == 1:
            by_traffic = 1 - req_sides[0]
            traffic_reason = "side that receives Kafka request headers"
        elif len(req_sides) == 2 and initiator in (0, 1):
            by_traffic = 1 - initiator
            traffic_reason = "side that accepted the connection (both directions look like requests)"
    if by_traffic is not None and (answers[by_traffic] or classes[by_traffic] == KAFKA_REQUEST):
        classes[by_traffic] = KAFKA_RESPONSE  # the broker's frames are responses, whatever they look like
    verdict_classes = (classes[0], classes[1])

    # TLS first: nothing inside can be decoded.
    if TLS in classes:
        side = by_port
        reason = f"configured port {ports[by_port]}" if by_port is not None else ""
        if side is None:
            for i in (0, 1):
                t = tls_handshake_type(first_bytes[i])
                if t == 1:  # ClientHello: the other side is the server
                    side, reason = 1 - i, "side that received the TLS ClientHello"
                    break
                if t == 2:
                    side, reason = i, "side that sent the TLS ServerHello"
                    break
        if side is None and initiator in (0, 1):
            side, reason = 1 - initiator, "side that accepted the connection"
        return ConnectionVerdict(KIND_TLS, side, "TLS handshake" + (f"; broker: {reason}" if reason else ""), verdict_classes)

    kafka_seen = by_traffic is not None or KAFKA_REQUEST in classes or any(answers)
    if by_port is not None:
        if kafka_seen or KAFKA_RESPONSE in classes:
            kind = KIND_KAFKA
        elif NOT_KAFKA in classes and (final or UNKNOWN not in classes):
            kind = KIND_NOT_KAFKA
        elif final:
            kind = KIND_KAFKA  # configured port, no payload to contradict it
        else:
            kind = KIND_UNDECIDED
        reason = f"configured port {ports[by_port]}"
        if by_traffic is not None and by_traffic != by_port:
            reason += " (but requests flow the other way)"
        return ConnectionVerdict(kind, by_port, reason, verdict_classes)

    if by_traffic is not None:
        return ConnectionVerdict(KIND_KAFKA, by_traffic, traffic_reason, verdict_classes)

    # Both ports configured (e.g. broker to broker) and nothing else decides.
    if len(port_sides) == 2:
        side = 1 - initiator if initiator in (0, 1) else None
        if side is not None or final:
            return ConnectionVerdict(KIND_KAFKA, side, "both ports configured", verdict_classes)
        return ConnectionVerdict(KIND_UNDECIDED, None, "both ports configured; waiting for requests", verdict_classes)

    if KAFKA_REQUEST in classes:  # both sides request-shaped, no answers, no SYN
        if final:
            return ConnectionVerdict(KIND_KAFKA, None, "Kafka requests both ways; broker side unknown", verdict_classes)
        return ConnectionVerdict(KIND_UNDECIDED, None, "Kafka request headers both ways; waiting for answers", verdict_classes)

    side = 1 - initiator if initiator in (0, 1) else None
    if all(c == NOT_KAFKA for c in classes) or (NOT_KAFKA in classes and (final or UNKNOWN not in classes)):
        return ConnectionVerdict(KIND_NOT_KAFKA, side, "no Kafka request headers in either direction", verdict_classes)
    if final:
        if not any(len(b) for b in first_bytes):
            return ConnectionVerdict(KIND_UNDECIDED, side, "no payload in either direction", verdict_classes)
        reason = "no Kafka request headers in either direction"
        if KAFKA_RESPONSE in classes:
            reason += " (response-shaped frames only: configure --kafka-ports to decode them)"
        return ConnectionVerdict(KIND_NOT_KAFKA, side, reason, verdict_classes)
    return ConnectionVerdict(KIND_UNDECIDED, None, "waiting for more bytes", verdict_classes)
