"""Decoded messages as plain JSON-ready values (for `kwinspect decode` and the TUI)."""

from __future__ import annotations

from typing import Any

from kwinspect.model import Exchange, Message
from kwinspect.protocol.records import render_bytes


def jsonable(value: Any, values: str = "auto") -> Any:
    """Bytes rendered per --values, record sets as batches with records, the rest as is."""
    if isinstance(value, dict):
        return {str(k): jsonable(v, values) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v, values) for v in value]
    if isinstance(value, bytes | bytearray | memoryview):
        text, encoding = render_bytes(bytes(value), values)
        return {"bytes": text, "encoding": encoding, "size": len(value)}
    if hasattr(value, "to_json") and hasattr(value, "batches"):
        return value.to_json(values)
    return value


def message_json(msg: Message | None, values: str = "auto") -> dict[str, Any] | None:
    if msg is None:
        return None
    out: dict[str, Any] = {
        "size": msg.size,
        "header": jsonable(msg.header, values),
        "body": jsonable(msg.body, values),
        "issues": [i.as_dict() for i in msg.issues],
    }
    if msg.decoded_version is not None and msg.decoded_version != msg.api_version:
        out["decoded_as_version"] = msg.decoded_version
    if msg.raw_body is not None:
        out["raw_body"] = jsonable(msg.raw_body, "hex")
    return out


def exchange_json(ex: Exchange, values: str = "auto") -> dict[str, Any]:
    """One line of `kwinspect decode`: the exchange's columns plus both messages in full."""
    row = ex.row()
    row["request"] = message_json(ex.request, values)
    row["response"] = message_json(ex.response, values)
    return row
