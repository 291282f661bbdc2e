"""Filters on decoded record keys and values (``value.order_id == 7``) over exchanges.

The TUI lists exchanges, but a field path names a field of one record.  An
exchange matches such a filter when at least one of its records does: the
whole expression is evaluated once per record, on the exchange's own columns
plus that record's ``key``/``value`` (and their encodings), so
``value.order_id == 7 and key.customer == "bob"`` means the same record, and
``api == "Fetch" and value.order_id == 7`` still reads the exchange's api.
Exchanges without records (everything but Produce requests and Fetch
responses) never match a filter that names a field.

Records come from the same code as the records tab (``records_of_messages``):
the exchange's frames are read back from the spill file and decoded again, then
the keys and values are decoded with the schemas.  That is far slower than a
column filter, and pure Python: in a thread of the app it would hold the GIL
the UI needs.  So for capture files (frames in the indexing process's spill
file) it runs in a helper process, ``python -m kwinspect.tui.match_proc``
(``MatchProcess``), started at the first such filter and kept for the app's
life: the view's thread worker sends it the candidate rows in chunks (their
frame offsets and the exchange columns the expression reads) and waits on the
pipe, which releases the GIL; between chunks it reports progress and stops if
the filter was replaced.  The helper reads the frames itself with ``os.pread``
on the spill file's descriptor, which it inherits.  Live feeds (no frames,
decoded messages in the store's LRU) and a helper that failed fall back to
matching in the worker thread.  Only Produce/Fetch rows the other conditions
left are candidates (``ExchangeRecordFilter.api_keys``).  What was decoded is
kept in a ``RecordCache`` (a bounded LRU of each exchange's keys and values as
text) on the side that decoded it, so the next filter reads no frame again.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from kwinspect.analyze.filter import CompiledFilter, FilterError, compile_filter, tokenize
from kwinspect.model import EXCHANGE_COLUMNS, RecordRow
from kwinspect.protocol.schema.api_keys import ApiKey

PRODUCE = int(ApiKey.PRODUCE)
FETCH = int(ApiKey.FETCH)
CACHE_CHARS = 32 << 20  # characters of keys and values the cache holds, all exchanges together
CHECK_EVERY = 16  # exchanges between two cancellation/progress checks (each may decode a big Fetch)
CHUNK = 64  # exchanges per request to the matching process

# what a record contributes to a filter row; the rest of the row is the exchange's
RECORD_FIELDS = ("key", "key_encoding", "value", "value_encoding")
Projection = tuple[Any, Any, Any, Any]


def exchange_records(store: Any, row: int, schemas: Any = None, req: Any = None,
                     resp: Any = None) -> Iterator[RecordRow]:
    """The records of one exchange of ``store`` as the records tab shows them (lazily,
    keys/values decoded with ``schemas`` when given); none for other apis.
    ``req``/``resp``: its decoded messages when the caller has them already."""
    key = store.cell("api_key", row)
    if key not in (PRODUCE, FETCH):
        return iter(())
    if req is None and resp is None:
        req, resp = store.messages(row)
    return records_of_messages(key, req, resp, store.values, store.topic_names, schemas)


def records_of_messages(api_key: int, req: Any, resp: Any, values: str, topic_names: Any,
                        schemas: Any = None) -> Iterator[RecordRow]:
    """The records of a Produce request or a Fetch response, decoded messages given."""
    from kwinspect.analyze.record_rows import iter_records_from_fetch, iter_records_from_produce

    if api_key == PRODUCE and req is not None and req.body:
        rows = iter_records_from_produce(req.body, resp.body if resp is not None else None,
                                         values=values)
    elif api_key == FETCH and resp is not None and resp.body:
        rows = iter_records_from_fetch(resp.body, values=values, topic_names=topic_names,
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


def columns_read(expr: str) -> tuple[str, ...]:
    """The exchange columns an expression may read (aliases and the ``error`` shorthand
    resolved), so that only those are sent along with each row."""
    names = {str(tok.value).lower() for tok in tokenize(expr) if tok.kind == "IDENT" and "." not in tok.value}
    if "api" in names:
        names.add("api_name")
    if "topic" in names:
        names.add("topics")
    if "error" in names:
        names.update(("error_codes", "status"))
    return tuple(c for c in EXCHANGE_COLUMNS if c in names)


class ExchangeRecordFilter:
    """A filter naming key/value fields, applied to exchanges (see the module doc)."""

    api_keys = (PRODUCE, FETCH)  # the only exchanges with records: the view masks the rest out first

    def __init__(self, compiled: CompiledFilter, schemas: Any, cache: RecordCache,
                 process: Callable[[], MatchProcess | None] | None = None) -> None:
        self.compiled = compiled
        self.expr = compiled.expr
        self.schemas = schemas
        self.cache = cache
        self.process = process  # the app's matching process, when its frames can be read there

    def match_rows(self, store: Any, ids: np.ndarray,
                   check: Callable[[int, int], None] | None = None) -> np.ndarray:
        """The row ids of ``ids`` that match: in the matching process when there is one
        (this thread then waits on its pipe), else here, one row at a time."""
        proc = self.process() if self.process is not None else None
        if proc is not None:
            try:
                return proc.match_rows(self.expr, store, ids, columns_read(self.expr), check)
            except MatchProcessError:
                pass  # matched here instead (slower for the UI, same answer)
        from kwinspect.tui.store import RowView

        view = RowView(store, store.first)
        keep = np.zeros(len(ids), dtype=bool)
        for n, row in enumerate(ids.tolist()):
            if n % CHECK_EVERY == 0 and check is not None:
                check(n, len(ids))
            view.row = row
            view.p = row - store.first
            if view.p < 0:
                continue
            keep[n] = self(view)
        return ids[keep]

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
    fields when there are schemas.  The schemas' field list is built once.  Owns the
    matching process (``process()``), started when a filter first needs it."""

    def __init__(self, schemas: Any = None, store: Any = None) -> None:
        self.schemas = schemas
        self.store = store
        self.cache = RecordCache()
        self._fields: dict[str, str] | None = None
        self._lock = threading.Lock()
        self._process: MatchProcess | None = None
        self._process_failed = False

    def process(self) -> MatchProcess | None:
        """The matching process, for a store whose frames another process spilled (capture
        files); None for live feeds, or after it failed once."""
        spill = getattr(self.store, "spill", None)
        if spill is None or not spill.external or self._process_failed:
            return None
        with self._lock:
            if self._process is None:
                try:
                    self._process = MatchProcess(spill.fileno(), self.schemas, self.store.values)
                except (OSError, MatchProcessError):
                    self._process_failed = True
                    return None
            if not self._process.alive():
                self._process_failed = True
                return None
            return self._process

    def close(self) -> None:
        if self._process is not None:
            self._process.close()

    def fields(self) -> dict[str, str] | None:
        """``{"value.order_id": "integer", ...}`` of the schemas (None without schemas)."""
        if self.schemas is None:
            return None
        with self._lock:
            if self._fields is None:
                try:
                    self._fields = self.schemas.field_kinds()
                except Exception as exc:  # noqa: BLE001 - a broken source: said in the filter bar
                    raise FilterError(f"the schemas' fields could not be listed: {exc}") from None
            return self._fields

    def compile(self, expr: str) -> CompiledFilter | ExchangeRecordFilter | None:
        """The predicate of ``expr`` (None for an empty one); raises FilterError."""
        if not expr.strip():
            return None
        compiled = compile_filter(expr, EXCHANGE_COLUMNS, fields=self.fields(), record_paths=True)
        if not compiled.paths:
            return compiled
        return ExchangeRecordFilter(compiled, self.schemas, self.cache, self.process)


# --------------------------------------------------------------------------- the matching process


class MatchProcessError(Exception):
    """The matching process is gone or answered nonsense."""


class MatchProcess:
    """App side of ``python -m kwinspect.tui.match_proc``: one request at a time (a lock),
    each a chunk of candidate rows; the answer is the rows that match."""

    def __init__(self, spill_fd: int, schemas: Any, values: str) -> None:
        source = getattr(schemas, "source", None)  # the SchemaValues' source pickles; its decoders do not
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kwinspect.tui.match_proc"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, pass_fds=(spill_fd,))
        self._lock = threading.Lock()
        try:
            self._send((spill_fd, source, values))
        except OSError as exc:
            self.close()
            raise MatchProcessError(str(exc)) from None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def _send(self, obj: Any) -> None:
        pickle.dump(obj, self.proc.stdin, protocol=pickle.HIGHEST_PROTOCOL)
        self.proc.stdin.flush()

    def request(self, expr: str, topic_names: dict[str, str], items: list[tuple]) -> list[int]:
        with self._lock:
            try:
                self._send((expr, topic_names, items))
                answer = pickle.load(self.proc.stdout)  # noqa: S301 - our own child process
            except (OSError, ValueError, EOFError, pickle.UnpicklingError) as exc:
                # (ValueError: its pipe was closed, the app is closing)
                raise MatchProcessError(f"matching process: {exc}") from None
        if not isinstance(answer, list):
            raise MatchProcessError(f"matching process: {answer!r}"[:200])
        return answer

    def match_rows(self, expr: str, store: Any, ids: np.ndarray, columns: tuple[str, ...],
                   check: Callable[[int, int], None] | None = None) -> np.ndarray:
        from kwinspect.tui.store import RowView

        keep: list[int] = []
        view = RowView(store, store.first)
        rows = ids.tolist()
        for start in range(0, len(rows), CHUNK):
            if check is not None:
                check(start, len(rows))
            items = []
            for row in rows[start:start + CHUNK]:
                if not store.has(row):
                    continue  # dropped (live mode) since the ids were taken
                view.row, view.p = row, row - store.first
                p = view.p
                c = store.cols
                items.append((row, c["api_key"][p], c["api_version"][p], *store.frame_refs(row),
                              {col: view.get(col) for col in columns}))
            if items:
                keep.extend(self.request(expr, dict(store.topic_names), items))
        return np.asarray(keep, dtype=np.int64)

    def close(self) -> None:
        proc = self.proc
        try:
            if proc.stdin is not None:
                proc.stdin.close()  # the process ends at the end of its input
        except OSError:
            pass
        try:
            proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


class FrameMatcher:
    """The matching process's side: frames read with ``os.pread`` from the spill file,
    decoded, their records' keys and values kept in a RecordCache."""

    def __init__(self, spill_fd: int, schemas: Any, values: str) -> None:
        self.fd = spill_fd
        self.schemas = schemas
        self.values = values
        self.cache = RecordCache()
        self.filters: dict[str, CompiledFilter] = {}
        self.fields = schemas.field_kinds() if schemas is not None else None

    def compiled(self, expr: str) -> CompiledFilter:
        flt = self.filters.get(expr)
        if flt is None:
            if len(self.filters) > 64:
                self.filters.clear()
            flt = self.filters[expr] = compile_filter(expr, EXCHANGE_COLUMNS, fields=self.fields,
                                                      record_paths=True)
        return flt

    def records(self, item: tuple, topic_names: dict[str, str]) -> list[Projection]:
        row, api_key, api_version, req_off, req_len, resp_off, resp_len, _cols = item
        cached = self.cache.get(row)
        if cached is not None:
            return cached
        from kwinspect.protocol import decode_request, decode_response

        try:
            req = decode_request(os.pread(self.fd, req_len, req_off)) if req_len >= 0 else None
            resp = (decode_response(os.pread(self.fd, resp_len, resp_off), api_key, api_version)
                    if resp_len >= 0 else None)
            records = [project(rec) for rec in records_of_messages(api_key, req, resp, self.values,
                                                                   topic_names, self.schemas)]
        except Exception:  # noqa: BLE001 - an exchange that cannot be decoded has no records to match
            records = []
        self.cache.put(row, records)
        return records

    def match(self, expr: str, topic_names: dict[str, str], items: list[tuple]) -> list[int]:
        flt = self.compiled(expr)
        return [item[0] for item in items
                if any(flt(RecordView(item[7], rec)) for rec in self.records(item, topic_names))]


__all__ = ["ExchangeRecordFilter", "FilterError", "FrameMatcher", "MatchProcess", "RecordCache",
           "RecordFiltering", "exchange_records", "records_of_messages"]
