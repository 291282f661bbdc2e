"""Arrow types of the public tables' columns: the one source for every Parquet writer.

Shared by the single-process exporters (export/writers.py) and the Spark
pipeline (spark/), which may not import each other.  Integers are widened
(int32 for int16 wire fields) so a surprising value never makes a writer fail;
timestamps are ``timestamp[us, tz=UTC]``.
"""

from __future__ import annotations

import pyarrow as pa

TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")
HEADER_TYPE = pa.struct(
    [("key", pa.string()), ("value", pa.string()), ("value_encoding", pa.string())]
)

ARROW_TYPES: dict[str, pa.DataType] = {
    # exchanges
    "stream": pa.string(),
    "client": pa.string(),
    "broker": pa.string(),
    "api_key": pa.int32(),
    "api_name": pa.string(),
    "api_version": pa.int32(),
    "correlation_id": pa.int32(),
    "client_id": pa.string(),
    "request_ts": TIMESTAMP_TYPE,
    "response_ts": TIMESTAMP_TYPE,
    "latency_ms": pa.float64(),
    "request_size": pa.int64(),
    "response_size": pa.int64(),
    "status": pa.string(),
    "error_codes": pa.list_(pa.int32()),
    "error_names": pa.list_(pa.string()),
    "topics": pa.list_(pa.string()),
    "throttle_time_ms": pa.int32(),
    "long_poll": pa.bool_(),
    "frame": pa.int64(),
    "response_frame": pa.int64(),
    "tcp_stream": pa.int64(),
    # records
    "direction": pa.string(),
    "topic": pa.string(),
    "partition": pa.int32(),
    "offset": pa.int64(),
    "timestamp": TIMESTAMP_TYPE,
    "timestamp_type": pa.string(),
    "key": pa.string(),
    "key_encoding": pa.string(),
    "value": pa.string(),
    "value_encoding": pa.string(),
    "headers": pa.list_(HEADER_TYPE),
    "compression": pa.string(),
    "magic": pa.int32(),
    "crc_ok": pa.bool_(),
    "producer_id": pa.int64(),
    "producer_epoch": pa.int32(),
    "sequence": pa.int32(),
    "is_transactional": pa.bool_(),
    "is_control": pa.bool_(),
    "control_type": pa.string(),
    "key_schema_id": pa.int64(),
    "value_schema_id": pa.int64(),
    "value_format": pa.string(),
    # errors
    "kind": pa.string(),
    "code": pa.int32(),
    "name": pa.string(),
    "retriable": pa.bool_(),
    "path": pa.string(),
    "message": pa.string(),
    "ts": TIMESTAMP_TYPE,
    # latency
    "by": pa.string(),
    "group": pa.string(),
    "count": pa.int64(),
    "mean_ms": pa.float64(),
    "p50_ms": pa.float64(),
    "p95_ms": pa.float64(),
    "p99_ms": pa.float64(),
    "max_ms": pa.float64(),
    "long_polls": pa.int64(),
}


def table_schema(columns: tuple[str, ...]) -> pa.Schema:
    """The explicit Arrow schema of a table with these columns (in this order)."""
    return pa.schema([pa.field(c, ARROW_TYPES[c]) for c in columns])
