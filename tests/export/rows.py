"""Hand-built model rows with awkward values, and a canonical form for comparing
what pandas reads back from each format (the oracle is pandas, not our code)."""

from __future__ import annotations

import json
import math
from typing import Any

import pandas as pd

from kwinspect.model import ErrorRow, Exchange, RecordRow

# Timestamps are built from whole microseconds, so the expected value is exact.
T0_US = 1_704_164_645_123_456  # 2024-01-02T03:04:05.123456Z
NASTY = 'a,b "quoted"\nnew\tline \x1b[2J\x07 \u202eevil\u202c é 日本'

TS_COLUMNS = {"request_ts", "response_ts", "timestamp", "ts"}
LIST_COLUMNS = {"error_codes", "error_names", "topics", "headers"}
# Text columns: read as str from CSV so "123" or "NA" stay text.
TEXT_COLUMNS = {
    "stream", "client", "broker", "api_name", "client_id", "status", "direction", "topic",
    "timestamp_type", "key", "key_encoding", "value", "value_encoding", "compression",
    "control_type", "kind", "name", "path", "message",
}


def us(n: int) -> float:
    return (T0_US + n) / 1e6


def make_exchanges() -> list[Exchange]:
    base = dict(stream="10.0.0.1:50000->10.0.0.2:9092", client="10.0.0.1:50000",
                broker="10.0.0.2:9092", request_size=120, response_size=64)
    return [
        Exchange(**base, api_key=0, api_name="Produce", api_version=9, correlation_id=1,
                 client_id="producer-1", request_ts=us(0), response_ts=us(1500),
                 latency_ms=1.5, status="paired", topics=["orders.v1", "payments"],
                 throttle_time_ms=0),
        Exchange(**base, api_key=1, api_name="Fetch", api_version=12, correlation_id=2,
                 client_id=NASTY, request_ts=us(2_000_001), response_ts=us(2_500_999),
                 latency_ms=500.998, status="paired", error_codes=[6, 0],
                 error_names=["NOT_LEADER_OR_FOLLOWER", "NONE"], topics=["orders.v1"],
                 throttle_time_ms=12),
        Exchange(**base, api_key=0, api_name="Produce", api_version=3, correlation_id=3,
                 client_id=None, request_ts=us(3_000_000), response_ts=None, latency_ms=None,
                 status="no_response_expected", topics=[]),
        Exchange(**base, api_key=99, api_name=None, api_version=None, correlation_id=None,
                 client_id="NA", request_ts=None, response_ts=us(4_000_000),
                 latency_ms=float("nan"), status="request_missing"),
        Exchange(**base, api_key=3, api_name="Metadata", api_version=12, correlation_id=2**31 - 1,
                 client_id="", request_ts=us(5_000_000), response_ts=us(5_000_100),
                 latency_ms=0.1, status="paired", topics=["123", "null"]),
    ]


def make_records() -> list[RecordRow]:
    common = dict(compression="zstd", magic=2, producer_id=2**40, producer_epoch=0,
                  is_transactional=False, stream="10.0.0.1:50000->10.0.0.2:9092")
    return [
        RecordRow(direction="produce", topic="orders.v1", partition=0, offset=2**40 + 7,
                  timestamp=us(-1_000), timestamp_type="create_time", key="k1",
                  key_encoding="utf8", value=NASTY, value_encoding="utf8",
                  headers=[{"key": "trace", "value": "abc", "value_encoding": "utf8"},
                           {"key": "bin", "value": "AAEC", "value_encoding": "base64"}],
                  crc_ok=True, sequence=5, is_control=False, control_type=None,
                  correlation_id=1, **common),
        RecordRow(direction="fetch", topic="orders.v1", partition=3, offset=None,
                  timestamp=None, timestamp_type=None, key=None, key_encoding=None,
                  value=None, value_encoding=None, headers=[], crc_ok=False, sequence=None,
                  is_control=True, control_type="commit", correlation_id=2, **common),
        RecordRow(direction="fetch", topic="t,1", partition=1, offset=0, timestamp=us(10),
                  timestamp_type="log_append_time", key="", key_encoding="utf8",
                  value="42", value_encoding="utf8",
                  headers=[{"key": "h", "value": None, "value_encoding": None}],
                  crc_ok=None, sequence=-1, is_control=False, control_type=None,
                  correlation_id=None, **common),
    ]


def make_errors() -> list[ErrorRow]:
    return [
        ErrorRow(kind="kafka_error", code=6, name="NOT_LEADER_OR_FOLLOWER", retriable=True,
                 api_name="Produce", correlation_id=4, topic="orders.v1", partition=0,
                 path="responses[0].partition_responses[0].error_code", message=None,
                 ts=us(7), stream="s"),
        ErrorRow(kind="tcp_gap", message=f"1460 bytes lost {NASTY}", ts=us(8), stream="s"),
        ErrorRow(kind="decode_error", retriable=False, ts=None),
    ]


ROWS = {"exchanges": make_exchanges, "records": make_records, "errors": make_errors}


def _is_missing(v: Any) -> bool:
    if v is None:
        return True
    try:
        return bool(pd.isna(v)) if not isinstance(v, list | dict | tuple) else False
    except (TypeError, ValueError):
        return False


def _ts_us(v: Any) -> int | None:
    if _is_missing(v):
        return None
    t = pd.Timestamp(v)
    assert t.tz is not None and t.utcoffset().total_seconds() == 0, f"not UTC: {v!r}"
    return int(t.value // 1000)  # .value is nanoseconds whatever the unit


def _list(v: Any) -> list[Any] | None:
    if v is None or (not hasattr(v, "__len__") and _is_missing(v)):
        return None
    if isinstance(v, str):
        v = json.loads(v)
    out = []
    for x in list(v):
        if isinstance(x, dict):
            out.append({k: (None if _is_missing(x.get(k)) else x.get(k))
                        for k in ("key", "value", "value_encoding")})
        else:
            out.append(x.item() if hasattr(x, "item") else x)
    return out


def _scalar(v: Any) -> Any:
    if _is_missing(v):
        return None
    if hasattr(v, "item"):
        v = v.item()
    if v in ("true", "false") and isinstance(v, str):
        return v == "true"
    if isinstance(v, float) and v.is_integer() and not isinstance(v, bool):
        return int(v)  # pandas turns int columns with nulls into float
    return v


def canonical_frame(df: pd.DataFrame, text_columns: set[str] = TEXT_COLUMNS) -> list[dict[str, Any]]:
    """Rows as plain Python values: timestamps as int microseconds, lists as lists."""
    rows = []
    for rec in df.to_dict("records"):
        row = {}
        for c, v in rec.items():
            if c in TS_COLUMNS:
                row[c] = _ts_us(v)
            elif c in LIST_COLUMNS:
                row[c] = _list(v)
            elif c in text_columns:
                row[c] = None if _is_missing(v) else str(v)
            else:
                row[c] = _scalar(v)
        rows.append(row)
    return rows


def canonical_model(items: list[Any]) -> list[dict[str, Any]]:
    """The expected canonical rows, straight from the model objects."""
    out = []
    for item in items:
        row = {}
        for c, v in item.row().items():
            if c in TS_COLUMNS:
                row[c] = None if v is None else round(v * 1e6)
            elif c in LIST_COLUMNS:
                row[c] = _list(v)
            elif isinstance(v, float) and math.isnan(v):
                row[c] = None
            elif c in TEXT_COLUMNS:
                row[c] = v
            else:
                row[c] = _scalar(v)
        out.append(row)
    return out
