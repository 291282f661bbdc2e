"""Decoded messages as plain JSON-ready values (for `kwinspect decode` and the TUI)."""

from __future__ import annotations

from typing import Any

from kwinspect.model import Exchange, Message
from kwinspect.protocol.records import render_bytes


def jsonable(value: Any, values: str = "auto", lazy: bool = False) -> Any:
    """Bytes rendered per --values, record sets as batches with records, the rest as is.
    ``lazy``: records are made while the JSON is written (``records.LazyJsonArray``)."""
    if isinstance(value, dict):
        return {str(k): jsonable(v, values, lazy) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v, values, lazy) for v in value]
    if isinstance(value, bytes | bytearray | memoryview):
        text, encoding = render_bytes(bytes(value), values)
        return {"bytes": text, "encoding": encoding, "size": len(value)}
    if hasattr(value, "to_json") and hasattr(value, "batches"):
        return value.to_json(values, lazy=lazy) if lazy else value.to_json(values)
    return value


def message_json(msg: Message | None, values: str = "auto", lazy: bool = False) -> dict[str, Any] | None:
    if msg is None:
        return None
    out: dict[str, Any] = {
        "size": msg.size,
        "header": jsonable(msg.header, values),
        "body": jsonable(msg.body, values, lazy),
        "issues": [i.as_dict() for i in msg.issues],
    }
    if msg.decoded_version is not None and msg.decoded_version != msg.api_version:
        out["decoded_as_version"] = msg.decoded_version
    if msg.raw_body is not None:
        out["raw_body"] = jsonable(msg.raw_body, "hex")
    return out


def exchange_json(ex: Exchange, values: str = "auto", lazy: bool = False) -> dict[str, Any]:
    """One line of `kwinspect decode`: the exchange's columns plus both messages in full."""
    row = ex.row()
    row["request"] = message_json(ex.request, values, lazy)
    row["response"] = message_json(ex.response, values, lazy)
    return row
