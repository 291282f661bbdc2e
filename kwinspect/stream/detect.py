"""Protocol detection: is a TCP connection Kafka, TLS or something else, and
which side is the broker.  Sans-IO: the rules look only at the first bytes each
side sent and at facts the driver (kwinspect/dissect.py) knows; the driver holds
a connection's bytes while :func:`decide` answers ``undecided``, and asks again
with more.

Two functions make up the API:

* :func:`decide` - while the connection is open: a :class:`Verdict` with the
  ``kind`` (``"kafka"``, ``"tls"``, ``"not_kafka"`` or ``"undecided"``), the
  client and broker endpoints for ``"kafka"``, and the message of the error row
  the driver reports for ``"tls"`` / ``"not_kafka"``.
* :func:`decide_at_end` - the connection ended while still undecided: always
  ``"not_kafka"``, with a message that says whether it looked like Kafka.

The rules of :func:`decide`, in order:

1. A TLS handshake record at the start of either side: ``tls``.
2. The broker endpoint the driver already knows (the SYN's receiver, or the only
   side on a configured Kafka port) is on a configured port: ``kafka``.
3. Detection off (``--no-detect``): ``not_kafka``, without an error row.
4. An endpoint proven to be a broker on another connection, when the other side
   is not one too, is the broker: ``kafka``.
5. The side whose first bytes start a plausible request (size prefix within the
   frame limit, a header whose api key and version our tables know, printable
   client id) is the client.  With the SYN seen only the SYN sender is tried,
   and one request proves it; without it, the other side must have answered
   with the same correlation id (wait while it has sent fewer than 8 bytes).
6. Give up (``not_kafka``) once more than :data:`DETECT_BUFFER` bytes are held,
   or, with the SYN seen, once the client has sent :data:`MIN_REQUEST_START`
   bytes that are not a request; else ``undecided``.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import NamedTuple

from kwinspect.model import Endpoint
from kwinspect.protocol.peek import peek_request_header, plausible_header

# Verdict kinds (the ConnectionInfo.kind values)
KAFKA = "kafka"
TLS = "tls"
NOT_KAFKA = "not_kafka"
UNDECIDED = "undecided"

# How much of an undecided connection (both sides) is held while deciding whether it is Kafka.
DETECT_BUFFER = 64 * 1024
# A size prefix and a request header up to the client id length: what rule 5 needs to tell.
MIN_REQUEST_START = 14

TLS_MESSAGE = "TLS handshake: the stream is encrypted and cannot be decoded"
NO_REQUEST_MESSAGE = "no Kafka request header where a request should start"
UNCLEAR_BROKER_MESSAGE = ("looks like Kafka, but with no handshake and no reply in the capture it is not clear "
                          "which side is the broker; name the broker port with --kafka-ports to decode it")
ENDED_MESSAGE = "connection ended before any Kafka request was seen"


class Verdict(NamedTuple):
    """What a connection carries, and for Kafka which endpoint is which."""

    kind: str  # KAFKA | TLS | NOT_KAFKA | UNDECIDED
    client: Endpoint | None = None  # for KAFKA
    broker: Endpoint | None = None  # for KAFKA
    message: str | None = None  # the error row to report for TLS / NOT_KAFKA; None: no row


_UNDECIDED = Verdict(UNDECIDED)


def is_tls_start(data: bytes | bytearray | memoryview) -> bool:
    """True when ``data`` starts with a TLS handshake record (0x16 0x03 0x00-0x04).

    As a Kafka size prefix those bytes would mean a frame of about 369 MB,
    above any sane limit, so the test cannot mistake a Kafka stream for TLS.
    """
    return len(data) >= 3 and data[0] == 0x16 and data[1] == 0x03 and data[2] <= 0x04


def request_at_start(first: bytes | bytearray | memoryview, max_frame_size: int) -> int | None:
    """The correlation id of a plausible request at the start of ``first``, else None."""
    if len(first) < MIN_REQUEST_START:
        return None
    size = int.from_bytes(first[:4], "big", signed=True)
    peek = peek_request_header(first, 4)
    if 0 < size <= max_frame_size and peek is not None and plausible_header(peek):
        return peek.correlation_id
    return None


def decide(
    sides: tuple[Endpoint, Endpoint],
    first: tuple[bytes, bytes],
    *,
    client: Endpoint | None,
    broker: Endpoint | None,
    syn_seen: bool,
    kafka_ports: Collection[int],
    detect: bool,
    known_brokers: Collection[Endpoint],
    held_bytes: int,
    max_frame_size: int,
) -> Verdict:
    """Decide what an open connection carries (the rules are in the module docstring).

    ``sides``: the connection's two endpoints; ``first[i]``: the leading bytes
    ``sides[i]`` sent, up to its first gap (at least 64 when it sent that many).
    ``client`` / ``broker``: what the driver knows before looking at bytes (the
    SYN's sender and receiver, else the sides of the one configured port), None
    when unknown.  ``syn_seen``: the connection's handshake was captured.
    ``known_brokers``: endpoints proven to be brokers on other connections (only
    looked up as rule 4 needs, in the order it needs).  ``held_bytes``: the
    payload bytes of both sides held so far.  Never raises on any bytes.
    """
    a, b = sides
    if is_tls_start(first[0]) or is_tls_start(first[1]):
        return Verdict(TLS, message=TLS_MESSAGE)
    if broker is not None and broker.port in kafka_ports:
        return Verdict(KAFKA, client, broker)
    if not detect:
        return Verdict(NOT_KAFKA)
    for side, other in ((a, b), (b, a)):
        if side in known_brokers and other not in known_brokers:
            return Verdict(KAFKA, other, side)

    def first_of(ep: Endpoint | None) -> bytes:
        return first[0] if ep == a else first[1] if ep == b else b""

    for cand in ((client,) if syn_seen else (a, b)):
        server = b if cand == a else a
        cid = request_at_start(first_of(cand), max_frame_size)
        if cid is None:
            continue
        if not syn_seen:
            reply = first_of(server)
            if len(reply) < 8:
                break  # wait for the other side
            if int.from_bytes(reply[4:8], "big", signed=True) != cid:
                continue
        return Verdict(KAFKA, cand, server)
    client_bytes = len(first_of(client)) if syn_seen and client else 0
    if held_bytes > DETECT_BUFFER or client_bytes >= MIN_REQUEST_START:
        return Verdict(NOT_KAFKA, message=NO_REQUEST_MESSAGE)
    return _UNDECIDED


def decide_at_end(first: tuple[bytes, bytes], max_frame_size: int) -> Verdict:
    """The verdict on a connection that ended undecided (``first`` as for :func:`decide`)."""
    if any(request_at_start(f, max_frame_size) is not None for f in first):
        return Verdict(NOT_KAFKA, message=UNCLEAR_BROKER_MESSAGE)
    return Verdict(NOT_KAFKA, message=ENDED_MESSAGE)
