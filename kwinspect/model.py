"""Plain values that flow between the layers.

Everything here is a dataclass or a small constant table: no IO, no third-party
imports, so the sans-IO core (protocol/, stream/) and every front end can share it.
Timestamps are float seconds since the epoch, as pcap files give them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from operator import attrgetter
from typing import Any, NamedTuple

# ---------------------------------------------------------------------------
# Issues: the single way every layer reports a problem.  Nothing raises on bad
# input; it returns what it could make of it plus a list of these.
# ---------------------------------------------------------------------------

# Issue kinds used across layers (the `errors` table's anomaly kinds).
DECODE_ERROR = "decode_error"
UNKNOWN_API_KEY = "unknown_api_key"
UNSUPPORTED_VERSION = "unsupported_version"
TRAILING_BYTES = "trailing_bytes"
CRC_MISMATCH = "crc_mismatch"
DECOMPRESSION_FAILED = "decompression_failed"
LIMIT_EXCEEDED = "limit_exceeded"
PARTIAL_BATCH = "partial_batch"  # informational: a fetch cut at max bytes
TCP_GAP = "tcp_gap"
TCP_OVERLAP_CONFLICT = "tcp_overlap_conflict"
TRUNCATED_PACKET = "truncated_packet"
TRUNCATED_FRAME = "truncated_frame"
OVERSIZED_FRAME = "oversized_frame"
RESYNC = "resync"
TLS_STREAM = "tls_stream"
TLS_DECRYPTED = "tls_decrypted"  # informational: a TLS connection decrypted with the key log
TLS_DECRYPT_FAILED = "tls_decrypt_failed"  # a TLS record failed authentication (or its framing broke)
NOT_KAFKA = "not_kafka"
REQUEST_MISSING = "request_missing"
RESPONSE_MISSING = "response_missing"
DUPLICATE_CORRELATION_ID = "duplicate_correlation_id"
OUT_OF_ORDER_RESPONSE = "out_of_order_response"
VERSION_NOT_ADVERTISED = "version_not_advertised"
KAFKA_ERROR = "kafka_error"

def plural(n: int, noun: str, nouns: str | None = None) -> str:
    """``1 byte``, ``2 bytes``: every count a message shows goes through here."""
    return f"{n:,} {noun if n == 1 else (nouns or noun + 's')}"


SEVERITY_INFO = "info"
SEVERITY_WARNING = "warning"
SEVERITY_ERROR = "error"


@dataclass(slots=True)
class Issue:
    """A problem found while decoding; never an exception.

    `offset` is a byte offset into whatever the reporting layer was given
    (a frame, a record batch, a stream direction); `path` is the field path
    where decoding stopped, e.g. ``topic_data[0].partition_data[1].records``.
    """

    kind: str
    message: str
    offset: int | None = None
    path: str | None = None
    severity: str = SEVERITY_ERROR

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "message": self.message,
            "offset": self.offset,
            "path": self.path,
            "severity": self.severity,
        }


# ---------------------------------------------------------------------------
# Decoded protocol messages
# ---------------------------------------------------------------------------


@dataclass(slots=True)
class Message:
    """One decoded request or response (header + body).

    `body` is a dict of snake_case field names; it holds what could be decoded
    even when `issues` says decoding stopped early.  When the body could not be
    decoded at all (unknown api key, response without its request), `body` is
    None and `raw_body` keeps the bytes.
    """

    is_request: bool
    api_key: int | None
    api_version: int | None
    header: dict[str, Any]
    body: dict[str, Any] | None
    issues: list[Issue] = field(default_factory=list)
    raw_body: bytes | None = None
    size: int = 0  # frame size without the 4-byte length prefix
    # version whose schema was actually used; differs from api_version when an
    # unsupported version was decoded best-effort with the nearest known one.
    decoded_version: int | None = None

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return Message, _MESSAGE_FIELDS(self)  # see Exchange.__reduce__

    @property
    def correlation_id(self) -> int | None:
        return self.header.get("correlation_id")

    @property
    def ok(self) -> bool:
        return not any(i.severity == SEVERITY_ERROR for i in self.issues)


# ---------------------------------------------------------------------------
# Addresses and connections
# ---------------------------------------------------------------------------


class Endpoint(NamedTuple):
    ip: str
    port: int

    def __str__(self) -> str:  # "10.0.0.1:9092", "[::1]:9092"
        return f"[{self.ip}]:{self.port}" if ":" in self.ip else f"{self.ip}:{self.port}"


def stream_name(client: Endpoint, broker: Endpoint) -> str:
    """The `stream` column: one TCP connection, written client first."""
    return f"{client}->{broker}"


# ---------------------------------------------------------------------------
# Rows of the public tables (defined in docs/columns.md).  Column order is the order
# of the *_COLUMNS tuples; exporters must use them, not dict order.
# ---------------------------------------------------------------------------

EXCHANGE_COLUMNS = (
    "stream", "client", "broker", "api_key", "api_name", "api_version",
    "correlation_id", "client_id", "request_ts", "response_ts", "latency_ms",
    "request_size", "response_size", "status", "error_codes", "error_names",
    "topics", "throttle_time_ms", "long_poll", "frame", "response_frame", "tcp_stream",
)

RECORD_COLUMNS = (
    "direction", "topic", "partition", "offset", "timestamp", "timestamp_type",
    "key", "key_encoding", "value", "value_encoding", "headers", "compression",
    "magic", "crc_ok", "producer_id", "producer_epoch", "sequence",
    "is_transactional", "is_control", "control_type", "correlation_id", "stream",
    "frame", "response_frame", "tcp_stream", "key_schema_id", "value_schema_id", "value_format",
)

ERROR_COLUMNS = (
    "kind", "code", "name", "retriable", "api_name", "correlation_id", "topic",
    "partition", "path", "message", "ts", "stream", "frame", "response_frame", "tcp_stream",
)

# A paired Fetch is a long poll when its response carries no record bytes and it took at
# least this fraction of the request's max_wait_ms: the broker held it waiting for data,
# so its latency is the consumer's wait, not the broker's speed.
LONG_POLL_FRACTION = 0.5

STATUS_PAIRED = "paired"
STATUS_NO_RESPONSE_EXPECTED = "no_response_expected"
STATUS_RESPONSE_MISSING = "response_missing"
STATUS_REQUEST_MISSING = "request_missing"


@dataclass(slots=True)
class Exchange:
    """A request and its response on one connection: the unit users reason about."""

    stream: str
    client: str
    broker: str
    api_key: int | None
    api_name: str | None
    api_version: int | None
    correlation_id: int | None
    client_id: str | None
    request_ts: float | None
    response_ts: float | None  # first byte of the response
    latency_ms: float | None  # request's last byte -> response's first byte
    request_size: int | None
    response_size: int | None
    status: str
    error_codes: list[int] = field(default_factory=list)
    error_names: list[str] = field(default_factory=list)
    topics: list[str] = field(default_factory=list)
    throttle_time_ms: int | None = None
    # Not exported as columns; kept for views that need them.
    response_last_ts: float | None = None  # last byte of the response
    request: Message | None = None
    response: Message | None = None
    broker_id: int | None = None
    index: int = 0  # order of the exchange within the whole capture
    # A Fetch that waited for data and got none (see LONG_POLL_FRACTION); None for other apis.
    # Last, so the positional order of the fields above stays as it was.
    long_poll: bool | None = None
    # Wireshark cross-references: the numbers of the packets holding the request's /
    # response's last byte, where Wireshark shows the decoded message, and tshark's
    # tcp.stream of the connection.
    frame: int | None = None
    response_frame: int | None = None
    tcp_stream: int | None = None
    order: int = 0  # not a column: the packet holding the first byte of the request (else response)

    def row(self) -> dict[str, Any]:
        return {c: getattr(self, c) for c in EXCHANGE_COLUMNS}

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # The class and its field values: unpickling calls __init__ (C-level argument
        # passing) instead of the slots dataclass's per-field __setstate__ loop, about
        # twice as fast; --jobs ships exchanges between processes this way.
        return Exchange, _EXCHANGE_FIELDS(self)


@dataclass(slots=True)
class RecordRow:
    """One Kafka record as seen on the wire (a row of the `records` table)."""

    direction: str  # "produce" | "fetch"
    topic: str | None
    partition: int | None
    offset: int | None
    timestamp: float | None  # seconds since the epoch (record timestamps are ms)
    timestamp_type: str | None  # "create_time" | "log_append_time"
    key: str | None
    key_encoding: str | None  # "utf8" | "base64" | "hex" | None for null
    value: str | None
    value_encoding: str | None
    headers: list[dict[str, Any]]
    compression: str  # "none" | "gzip" | "snappy" | "lz4" | "zstd"
    magic: int
    crc_ok: bool | None
    producer_id: int | None
    producer_epoch: int | None
    sequence: int | None
    is_transactional: bool
    is_control: bool
    control_type: str | None
    correlation_id: int | None
    stream: str | None
    frame: int | None = None  # the exchange's (see Exchange)
    response_frame: int | None = None
    tcp_stream: int | None = None
    # Schema Registry framing (analyze/schema_values.py; null unless schemas are given)
    key_schema_id: int | None = None
    value_schema_id: int | None = None
    value_format: str | None = None  # "avro" | "protobuf" | "json"

    def row(self) -> dict[str, Any]:
        return {c: getattr(self, c) for c in RECORD_COLUMNS}


@dataclass(slots=True)
class ErrorRow:
    """A Kafka error code found in a response, or an anomaly (a row of `errors`)."""

    kind: str
    code: int | None = None
    name: str | None = None
    retriable: bool | None = None
    api_name: str | None = None
    correlation_id: int | None = None
    topic: str | None = None
    partition: int | None = None
    path: str | None = None
    message: str | None = None
    ts: float | None = None
    stream: str | None = None
    frame: int | None = None  # the request's packet for rows about an exchange, else where it was found
    response_frame: int | None = None
    tcp_stream: int | None = None
    order: int = 0  # not a column: the packet at `ts`, where the row sits in capture order

    def row(self) -> dict[str, Any]:
        return {c: getattr(self, c) for c in ERROR_COLUMNS}


_EXCHANGE_FIELDS = attrgetter(*(f.name for f in fields(Exchange)))
_MESSAGE_FIELDS = attrgetter(*(f.name for f in fields(Message)))
