"""The columns of the `deliveries` table, apart from the analysis that fills them, so
the output tables (export/tables.py) name them without importing that analysis and
the diagnosis it reports through (every command's start would pay for both)."""

from __future__ import annotations

DELIVERY_COLUMNS = (
    "topic", "partition", "offset", "key", "key_encoding", "value_digest", "value_size",
    "producer_client_id", "producer_id", "producer_epoch", "sequence", "produce_ts", "ack_ts",
    "produce_attempts", "error", "times_fetched", "first_fetch_ts", "fetch_clients", "fetch_groups",
    "fetch_streams", "fetch_correlation_ids", "fetch_after_ms", "commit_group", "commit_offset",
    "commit_ts", "produce_to_ack_ms", "ack_to_first_fetch_ms", "end_to_end_ms", "committed_after_ms",
    "produce_stream", "produce_correlation_id",
)
DELIVERY_TIMESTAMP_COLUMNS = frozenset({"produce_ts", "ack_ts", "first_fetch_ts", "commit_ts"})
DELIVERY_LIST_COLUMNS = frozenset({"fetch_clients", "fetch_groups", "fetch_streams", "fetch_correlation_ids",
                                   "fetch_after_ms"})
