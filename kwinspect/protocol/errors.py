"""Kafka error codes: name and whether a client may retry."""

from __future__ import annotations

from kwinspect.protocol.schema.errors_table import ERROR_CODES, ERROR_DESCRIPTIONS


def error_name(code: int) -> str:
    """'UNKNOWN_TOPIC_OR_PARTITION' for 3; 'UNKNOWN_ERROR_CODE_<n>' for codes newer than our table."""
    entry = ERROR_CODES.get(code)
    return entry[0] if entry else f"UNKNOWN_ERROR_CODE_{code}"


_CODE_OF_NAME = {name: code for code, (name, _retriable) in ERROR_CODES.items()}


def error_description(code: int | str | None) -> str | None:
    """The broker's own description of an error code or name ("Messages are rejected since
    there are fewer in-sync replicas than required." for 19, NOT_ENOUGH_REPLICAS), None
    when unknown."""
    if isinstance(code, str):
        code = _CODE_OF_NAME.get(code)
    return ERROR_DESCRIPTIONS.get(code) if code is not None else None


def is_retriable(code: int) -> bool | None:
    entry = ERROR_CODES.get(code)
    return entry[1] if entry else None
