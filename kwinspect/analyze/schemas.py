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
    # stats (also: api_name, api_version, broker, client_id, topic, partition)
    "interval_start": TIMESTAMP_TYPE,
    "interval_s": pa.float64(),
    "series": pa.string(),
    "group_id": pa.string(),
    "le_ms": pa.float64(),
    "amount": pa.float64(),
    # deliveries (also topic, partition, offset, key, key_encoding, producer_*, sequence above)
    "value_digest": pa.string(),
    "value_size": pa.int64(),
    "producer_client_id": pa.string(),
    "produce_ts": TIMESTAMP_TYPE,
    "ack_ts": TIMESTAMP_TYPE,
    "produce_attempts": pa.int32(),
    "error": pa.string(),
    "times_fetched": pa.int64(),
    "first_fetch_ts": TIMESTAMP_TYPE,
    "fetch_clients": pa.list_(pa.string()),
    "fetch_groups": pa.list_(pa.string()),
    "fetch_streams": pa.list_(pa.string()),
    "fetch_correlation_ids": pa.list_(pa.int32()),
    "fetch_after_ms": pa.list_(pa.float64()),
    "commit_group": pa.string(),
    "commit_offset": pa.int64(),
    "commit_ts": TIMESTAMP_TYPE,
    "produce_to_ack_ms": pa.float64(),
    "ack_to_first_fetch_ms": pa.float64(),
    "end_to_end_ms": pa.float64(),
    "committed_after_ms": pa.float64(),
    "produce_stream": pa.string(),
    "produce_correlation_id": pa.int32(),
}


def table_schema(columns: tuple[str, ...]) -> pa.Schema:
    """The explicit Arrow schema of a table with these columns (in this order)."""
    return pa.schema([pa.field(c, ARROW_TYPES[c]) for c in columns])
