"""The output tables, defined once: their columns, their value conventions, and how
their rows are made from the Dissector's events.

Every front end takes its tables from here: the table commands and their --jobs
workers (cli), `kwinspect live`'s sinks (run/live_session.py), the TUI's export and
the Spark pipeline. The writers (export/writers.py) turn the rows into jsonl, csv,
Parquet and terminal tables with the conventions below.

    for row in rows_of("records", event, values="auto", topic_names=names):
        ...
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from kwinspect.analyze.delivery_columns import (
    DELIVERY_COLUMNS,
    DELIVERY_LIST_COLUMNS,
    DELIVERY_TIMESTAMP_COLUMNS,
)
from kwinspect.analyze.latency import LATENCY_COLUMNS
from kwinspect.analyze.record_rows import records_from_exchange
from kwinspect.analyze.stats import STATS_COLUMNS
from kwinspect.model import (
    ERROR_COLUMNS,
    EXCHANGE_COLUMNS,
    RECORD_COLUMNS,
    ErrorRow,
    Exchange,
    RecordRow,
)
from kwinspect.protocol.schema.api_keys import ApiKey

if TYPE_CHECKING:  # imported by the commands that read schemas, not by every start
    from kwinspect.analyze.schema_values import SchemaValues

# The capture tables, plus `latency`, `stats` and `deliveries` (not capture tables:
# the rows of `kwinspect latency`, `stats` and `deliveries`, made from the exchanges)
TABLES: dict[str, tuple[str, ...]] = {
    "exchanges": EXCHANGE_COLUMNS,
    "records": RECORD_COLUMNS,
    "errors": ERROR_COLUMNS,
    "latency": LATENCY_COLUMNS,
    "stats": STATS_COLUMNS,
    "deliveries": DELIVERY_COLUMNS,
}
CAPTURE_TABLES = ("exchanges", "records", "errors")

# Value conventions of the text formats and Parquet: these columns hold epoch seconds
# (written as ISO-8601 UTC with microseconds, a Parquet timestamp[us, UTC]) ...
TIMESTAMP_COLUMNS = (frozenset({"request_ts", "response_ts", "timestamp", "ts", "interval_start"})
                     | DELIVERY_TIMESTAMP_COLUMNS)
# ... and these lists (a JSON array; in a CSV cell, the array as compact JSON text)
LIST_COLUMNS = frozenset({"error_codes", "error_names", "topics", "headers"}) | DELIVERY_LIST_COLUMNS

# the exchanges whose records the records table expands
PRODUCE, FETCH = int(ApiKey.PRODUCE), int(ApiKey.FETCH)


def records_of(ex: Exchange, values: str, topic_names: Mapping[str, str] | None = None,
               issues: list | None = None, new_issues_only: bool = False,
               schemas: SchemaValues | None = None) -> Iterator[RecordRow]:
    """The records table rows of one exchange (a Produce request's or a Fetch response's
    records); ``issues`` gets the problems of their record batches once the rows are
    exhausted (``new_issues_only``: only those decoding the records found). With
    ``schemas``, keys and values in the Schema Registry wire format are decoded as
    the rows are made (and their problems join ``issues``)."""
    rows = records_from_exchange(ex, values=values, topic_names=topic_names, issues=issues,
                                 new_issues_only=new_issues_only)
    return rows if schemas is None else schemas.apply(rows, issues)


def record_error_rows(ex: Exchange, values: str, topic_names: Mapping[str, str] | None,
                      schemas: SchemaValues | None = None) -> list[ErrorRow]:
    """`errors --records`: decode the exchange's record batches and make rows of the
    problems only decoding finds (the batch-level ones are already the exchange's own
    error rows)."""
    issues: list = []
    for _row in records_of(ex, values, topic_names, issues, new_issues_only=True, schemas=schemas):
        pass
    ts = ex.response_ts if ex.api_key == FETCH else ex.request_ts
    return [ErrorRow(kind=i.kind, api_name=ex.api_name, correlation_id=ex.correlation_id, path=i.path,
                     message=i.message, ts=ts, stream=ex.stream, frame=ex.frame, response_frame=ex.response_frame,
                     tcp_stream=ex.tcp_stream, order=ex.order)
            for i in issues if i.severity != "info"]


def problem_kinds(issues: list) -> tuple[str, ...]:
    """The kinds of the record-batch problems worth a line at the end of `records`."""
    return tuple(i.kind for i in issues if i.severity != "info")


def rows_of(table: str, ev: Any, *, values: str, topic_names: Mapping[str, str] | None,
            issues: list | None = None, record_errors: bool = False,
            schemas: SchemaValues | None = None) -> Iterable[Any]:
    """The rows ``table`` makes of one event of the Dissector (none for most pairs):
    an exchange is an `exchanges` row and carries `records` rows; an error row is an
    `errors` row, and with ``record_errors`` (`errors --records`) a Produce/Fetch
    exchange adds the problems of its records. ``issues`` gets the record-batch
    problems of a `records` expansion; ``schemas`` decodes Schema Registry keys and values."""
    if table == "exchanges":
        return (ev,) if isinstance(ev, Exchange) else ()
    if table == "errors":
        if isinstance(ev, ErrorRow):
            return (ev,)
        if record_errors and isinstance(ev, Exchange) and ev.api_key in (PRODUCE, FETCH):
            return record_error_rows(ev, values, topic_names, schemas)
        return ()
    if table == "records":
        return records_of(ev, values, topic_names, issues, schemas=schemas) if isinstance(ev, Exchange) else ()
    raise ValueError(f"unknown table {table!r}; tables: {', '.join(CAPTURE_TABLES)}")
