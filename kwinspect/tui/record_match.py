"""Filters on decoded record keys and values (``value.order_id == 7``) over exchanges.

The TUI lists exchanges, but a field path names a field of one record.  An
exchange matches such a filter when at least one of its records does: the
whole expression is evaluated once per record, on the exchange's own columns
plus that record's ``key``/``value`` (and their encodings), so
``value.order_id == 7 and key.customer == "bob"`` means the same record, and
``api == "Fetch" and value.order_id == 7`` still reads the exchange's api.
Exchanges without records (everything but Produce requests and Fetch
responses) never match a filter that names a field.

Records come from the same code as the records tab (``exchange_records``): the
exchange's frames are read back from the spill file and decoded again, then the
keys and values are decoded with the schemas.  That is far slower than a
column filter, so it runs only in the view's thread worker (never on the UI
thread), only on Produce/Fetch rows the other conditions left
(``ExchangeRecordFilter.api_keys``), and checks for cancellation every few rows
(``check_every``).  What it decoded is kept in a ``RecordCache`` (a bounded
LRU of each exchange's keys and values as text), so the next filter on the
same capture reads no frame again.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

from kwinspect.analyze.filter import CompiledFilter, FilterError, compile_filter
from kwinspect.model import EXCHANGE_COLUMNS, RecordRow
from kwinspect.protocol.schema.api_keys import ApiKey

PRODUCE = int(ApiKey.PRODUCE)
FETCH = int(ApiKey.FETCH)
CACHE_CHARS = 32 << 20  # characters of keys and values the cache holds, all exchanges together
CHECK_EVERY = 16  # exchanges between two cancellation/progress checks (each may decode a big Fetch)

# what a record contributes to a filter row; the rest of the row is the exchange's
RECORD_FIELDS = ("key", "key_encoding", "value", "value_encoding")
Projection = tuple[Any, Any, Any, Any]


def exchange_records(store: Any, row: int, schemas: Any = None, req: Any = None,
                     resp: Any = None) -> Iterator[RecordRow]:
    """The records of one exchange of ``store`` as the records tab shows them (lazily,
    keys/values decoded with ``schemas`` when given); none for other apis.
    ``req``/``resp``: its decoded messages when the caller has them already."""
    from kwinspect.analyze.record_rows import iter_records_from_fetch, iter_records_from_produce

    key = store.cell("api_key", row)
    if key not in (PRODUCE, FETCH):
        return iter(())
    if req is None and resp is None:
        req, resp = store.messages(row)
    if key == PRODUCE and req is not None and req.body:
        rows = iter_records_from_produce(req.body, resp.body if resp is not None else None,
                                         values=store.values)
    elif key == FETCH and resp is not None and resp.body:
        rows = iter_records_from_fetch(resp.body, values=store.values, topic_names=store.topic_names,
                                       request_body=req.body if req is not None else None)
    else:
        return iter(())
    return schemas.apply(rows) if schemas is not None else rows


def project(rec: RecordRow) -> Projection:
    return rec.key, rec.key_encoding, rec.value, rec.value_encoding


class RecordCache:
    """Each exchange's records as (key, key_encoding, value, value_encoding), most
    recently used kept, at most ``max_chars`` characters of keys and values in all
    (an exchange bigger than a quarter of that is not kept).  Shared by the filter
    worker and the extend worker, hence the lock."""

    def __init__(self, max_chars: int = CACHE_CHARS) -> None:
        self.max_chars = max_chars
        self.chars = 0
        self._rows: OrderedDict[int, tuple[list[Projection], int]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, row: int) -> list[Projection] | None:
        with self._lock:
            hit = self._rows.get(row)
            if hit is None:
                return None
            self._rows.move_to_end(row)
            return hit[0]

    def put(self, row: int, records: list[Projection]) -> None:
        size = sum(len(v) for rec in records for v in (rec[0], rec[2]) if isinstance(v, str))
        if size > self.max_chars // 4:
            return
        with self._lock:
            old = self._rows.pop(row, None)
            if old is not None:
                self.chars -= old[1]
            self._rows[row] = (records, size)
            self.chars += size
            while self.chars > self.max_chars and self._rows:
                _row, (_recs, n) = self._rows.popitem(last=False)
                self.chars -= n


class RecordView:
    """A filter row: the exchange's columns (a store ``RowView``) with one record's
    key, value and encodings."""

    __slots__ = ("exchange", "record")

    def __init__(self, exchange: Any, record: Projection) -> None:
        self.exchange = exchange
        self.record = record

    def get(self, col: str, default: Any = None) -> Any:
        if col in RECORD_FIELDS:
            return self.record[RECORD_FIELDS.index(col)]
        return self.exchange.get(col, default)


class ExchangeRecordFilter:
    """A filter naming key/value fields, applied to exchanges (see the module doc)."""

    api_keys = (PRODUCE, FETCH)  # the only exchanges with records: the view masks the rest out first
    check_every = CHECK_EVERY

    def __init__(self, compiled: CompiledFilter, schemas: Any, cache: RecordCache) -> None:
        self.compiled = compiled
        self.expr = compiled.expr
        self.schemas = schemas
        self.cache = cache

    def records(self, store: Any, row: int) -> list[Projection]:
        """The (key, key_encoding, value, value_encoding) of every record of ``row``."""
        cached = self.cache.get(row)
        if cached is not None:
            return cached
        try:
            records = [project(rec) for rec in exchange_records(store, row, self.schemas)]
        except Exception:  # noqa: BLE001 - an exchange that cannot be decoded has no records to match
            records = []
        self.cache.put(row, records)
        return records

    def __call__(self, view: Any) -> bool:
        """``view``: the store's RowView of an exchange (its ``s`` and ``row``)."""
        compiled = self.compiled
        return any(compiled(RecordView(view, rec)) for rec in self.records(view.s, view.row))

    def matching(self, exchange_row: dict[str, Any], records: list[RecordRow]) -> list[int]:
        """Indexes of the records (as the records tab lists them) that match."""
        return [i for i, rec in enumerate(records)
                if self.compiled(RecordView(exchange_row, project(rec)))]


class RecordFiltering:
    """The app's filter compiler: the filter language over exchanges, plus key/value
    fields when there are schemas.  The schemas' field list is built once."""

    def __init__(self, schemas: Any = None) -> None:
        self.schemas = schemas
        self.cache = RecordCache()
        self._fields: dict[str, str] | None = None
        self._lock = threading.Lock()

    def fields(self) -> dict[str, str] | None:
        """``{"value.order_id": "integer", ...}`` of the schemas (None without schemas)."""
        if self.schemas is None:
            return None
        with self._lock:
            if self._fields is None:
                self._fields = self.schemas.field_kinds()
            return self._fields

    def compile(self, expr: str) -> CompiledFilter | ExchangeRecordFilter | None:
        """The predicate of ``expr`` (None for an empty one); raises FilterError."""
        if not expr.strip():
            return None
        compiled = compile_filter(expr, EXCHANGE_COLUMNS, fields=self.fields(), record_paths=True)
        if not compiled.paths:
            return compiled
        return ExchangeRecordFilter(compiled, self.schemas, self.cache)


__all__ = ["ExchangeRecordFilter", "FilterError", "RecordCache", "RecordFiltering", "exchange_records"]
