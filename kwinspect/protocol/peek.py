"""Cheap request-header reads for framing resync and protocol detection.

Stdlib only, sans-IO.  Nothing here raises on bad bytes: a header that does not
parse is ``None`` and an implausible one is ``False``.

A Kafka request payload (the frame without its 4-byte size prefix) starts with
the request header::

    int16  api_key
    int16  api_version
    int32  correlation_id
    int16  client_id length (-1 = null), then that many UTF-8 bytes
    [tagged fields]   only in header v2 (flexible versions)

The client id is a classic nullable string even in header v2, so the first
``header_size_v1`` bytes can be read without knowing whether the version is
flexible.
"""

from __future__ import annotations

from typing import NamedTuple

from kwinspect.protocol.apis import API_NAMES, version_range

_MAX_KNOWN_API_KEY = max(API_NAMES) if API_NAMES else 0

# A connection already known to carry Kafka may use API keys or versions newer
# than our tables.  These bounds keep "newer" from meaning "anything".
NEW_API_KEY_LIMIT = 255  # api keys up to this are accepted on a known-Kafka connection
NEW_VERSION_SLACK = 4  # versions up to (highest known + this) on a known-Kafka connection
MAX_UNKNOWN_KEY_VERSION = 20  # version bound for api keys we have no table for

# Smallest request header: api_key, api_version, correlation_id, client_id length.
MIN_REQUEST_HEADER = 10


class RequestHeaderPeek(NamedTuple):
    """The fixed part of a request header (v1 layout)."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    header_size_v1: int  # bytes up to and including the client id


def peek_request_header(buf: bytes | bytearray | memoryview, offset: int = 0) -> RequestHeaderPeek | None:
    """Read api key, version, correlation id and client id at ``buf[offset:]``.

    ``buf`` holds a request payload (no size prefix).  Returns ``None`` when the
    bytes are too short, the client id length is below -1 or runs past the end
    of ``buf``, or the client id is not valid UTF-8.  Only the header bytes are
    touched; the body may be absent (a prefix of the payload is enough).
    """
    try:
        end = len(buf)
        if offset < 0 or end - offset < MIN_REQUEST_HEADER:
            return None
        head = bytes(buf[offset : offset + MIN_REQUEST_HEADER])
        api_key = int.from_bytes(head[0:2], "big", signed=True)
        api_version = int.from_bytes(head[2:4], "big", signed=True)
        correlation_id = int.from_bytes(head[4:8], "big", signed=True)
        n = int.from_bytes(head[8:10], "big", signed=True)
        start = offset + MIN_REQUEST_HEADER
        if n == -1:
            client_id = None
            n = 0
        elif n < 0 or start + n > end:
            return None
        else:
            client_id = bytes(buf[start : start + n]).decode("utf-8")
        return RequestHeaderPeek(api_key, api_version, correlation_id, client_id, MIN_REQUEST_HEADER + n)
    except (UnicodeDecodeError, TypeError, ValueError):
        return None


def plausible_header(peek: RequestHeaderPeek, *, known_kafka: bool = False) -> bool:
    """The checks of :func:`plausible_request` on an already peeked header."""
    key, version = peek.api_key, peek.api_version
    if key < 0 or version < 0 or peek.correlation_id < 0:
        return False
    rng = version_range(key)
    if rng is not None:
        lo, hi = rng
        if known_kafka:
            hi += NEW_VERSION_SLACK
        if not lo <= version <= hi:
            return False
    elif not (known_kafka and key <= NEW_API_KEY_LIMIT and version <= MAX_UNKNOWN_KEY_VERSION):
        return False
    cid = peek.client_id
    return cid is None or cid.isprintable()


def plausible_request(payload: bytes | bytearray | memoryview, *, known_kafka: bool = False) -> bool:
    """Whether ``payload`` (or a prefix of it) starts like a Kafka request.

    True when the header parses, the api key is one our tables know and the
    version is within its known range, the client id is null or printable
    UTF-8 (the empty string is allowed), and the correlation id is not
    negative.  With ``known_kafka=True`` (the connection already carried
    Kafka) keys we have no table for, up to ``NEW_API_KEY_LIMIT``, and versions
    up to ``NEW_VERSION_SLACK`` above the known highest are accepted too,
    because brokers keep adding APIs and versions.
    """
    peek = peek_request_header(payload)
    return peek is not None and plausible_header(peek, known_kafka=known_kafka)
