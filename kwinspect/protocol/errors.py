"""Kafka error codes: name and whether a client may retry."""

from __future__ import annotations

from kwinspect.protocol.schema.errors_table import ERROR_CODES


def error_name(code: int) -> str:
    """'UNKNOWN_TOPIC_OR_PARTITION' for 3; 'UNKNOWN_ERROR_CODE_<n>' for codes newer than our table."""
    entry = ERROR_CODES.get(code)
    return entry[0] if entry else f"UNKNOWN_ERROR_CODE_{code}"


def is_retriable(code: int) -> bool | None:
    entry = ERROR_CODES.get(code)
    return entry[1] if entry else None
