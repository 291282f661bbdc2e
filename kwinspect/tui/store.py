"""The TUI's exchange index: compact columns for millions of exchanges.

An ``Exchange`` carries its request and response ``Message`` objects with full
bodies (record sets included): a few KiB each, far too much to keep a million
of them.  The store keeps only what the list, the filter and the other views
need, as typed ``array`` columns (about 100 bytes per exchange, strings
interned), and gets the full decode back on demand:

* capture files: the indexer taps the raw request/response frames on their way
  from the framing layer to the conversation and appends them to a temporary
  spill file; the store keeps (offset, length) per frame.  Selecting an
  exchange reads its two frames back and re-decodes them with
  ``decode_request`` / ``decode_response`` (plus the same SASL redaction the
  conversation applies), which also gives the hex view its bytes.
* live sources (and anything else whose frames were not tapped): the decoded
  ``Message`` objects of the most recent exchanges are kept in a bounded LRU.

Threads: one writer (the indexing worker) appends under ``lock``; the UI thread
reads single cells without the lock (array reads never see a torn value under
the GIL) and takes the lock only to copy columns for numpy work.
"""

from __future__ import annotations

import math
import os
import tempfile
import threading
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from kwinspect.model import (
    EXCHANGE_COLUMNS,
    REQUEST_MISSING,
    SEVERITY_INFO,
    STATUS_NO_RESPONSE_EXPECTED,
    STATUS_PAIRED,
    STATUS_REQUEST_MISSING,
    STATUS_RESPONSE_MISSING,
    ErrorRow,
    Exchange,
    Issue,
    Message,
)
from kwinspect.stream.redact import SECRET_APIS  # their frames' hex stays hidden

NAN = float("nan")
NONE_INT = -(2**63)  # "null" in the int64 columns
NONE_INT32 = -(2**31)  # "null" in the int32 columns (until a value needs the int64 form)
STATUSES = (STATUS_PAIRED, STATUS_NO_RESPONSE_EXPECTED, STATUS_RESPONSE_MISSING, STATUS_REQUEST_MISSING, "other")
_STATUS_INDEX = {s: i for i, s in enumerate(STATUSES)}



class Interner:
    """value <-> small int, so a million rows share a few hundred strings/tuples."""

    def __init__(self, first: Any = None) -> None:
        self.values: list[Any] = [first]
        self._index: dict[Any, int] = {first: 0}

    def __call__(self, value: Any) -> int:
        idx = self._index.get(value)
        if idx is None:
            idx = self._index[value] = len(self.values)
            self.values.append(value)
        return idx

    def get(self, value: Any) -> int | None:
        return self._index.get(value)

    def __getitem__(self, idx: int) -> Any:
        return self.values[idx]

    def __len__(self) -> int:
        return len(self.values)


def _opt_float(v: float | None) -> float:
    return NAN if v is None else float(v)


# Integer columns held as int32 while every value fits: 4 bytes an exchange instead of 8
# (their values are int32 on the wire, or packet and connection numbers). A value that does
# not fit, or that is the int32 null itself, turns the column into int64 for good.
WIDENING_COLUMNS = ("cid", "req_size", "resp_size", "throttle", "frame", "response_frame", "tcp_stream")


def null_of(col: array) -> int:
    """The null of an integer column: NONE_INT once it is int64, NONE_INT32 before."""
    return NONE_INT if col.typecode == "q" else NONE_INT32


def int_or_none(col: array, p: int) -> int | None:
    """Position ``p`` of an integer column, None for its null."""
    v = col[p]
    return None if v == null_of(col) else v


def _widened(col: array) -> array:
    """An int32 column as int64, its nulls NONE_INT."""
    import numpy as np

    out = array("q")
    if len(col):
        wide = np.frombuffer(col, dtype=np.int32).astype(np.int64)
        wide[wide == NONE_INT32] = NONE_INT
        out.frombytes(wide.tobytes())
    return out


def _back_float(v: float) -> float | None:
    return None if math.isnan(v) else v


@dataclass(slots=True)
class FrameRef:
    offset: int
    length: int


class FrameSpill:
    """Append-only temporary file of raw frames; deleted when closed.

    ``external=True``: another process (the indexing process) appends to
    ``path``; this side only reads, and unlinks the file in ``unlink()``.
    """

    def __init__(self, directory: str | None = None, *, external: bool = False) -> None:
        fd, self.path = tempfile.mkstemp(prefix="kwinspect-frames-", suffix=".bin", dir=directory)
        self.external = external
        self._w = None if external else os.fdopen(fd, "wb")
        if external:
            os.close(fd)
        self._r = open(self.path, "rb")  # noqa: SIM115 - kept open for the app's lifetime
        if not external:
            self.unlink()
        self.size = 0
        self._lock = threading.Lock()

    def unlink(self) -> None:
        try:
            os.unlink(self.path)  # POSIX: the file lives while it is open
        except OSError:
            pass

    def append(self, data: bytes) -> int:
        assert self._w is not None, "external spill: the indexing process writes it"
        off = self.size
        self._w.write(data)
        self.size += len(data)
        return off

    def flush(self) -> None:
        if self._w is not None:
            with self._lock:
                self._w.flush()

    def fileno(self) -> int:
        """The reading descriptor: a helper process given it reads frames with ``os.pread``
        (which leaves this side's file position alone), after the path is unlinked."""
        return self._r.fileno()

    def read(self, offset: int, length: int) -> bytes:
        with self._lock:
            if self._w is not None:
                self._w.flush()
            self._r.seek(offset)
            return self._r.read(length)

    def close(self) -> None:
        for f in (self._w, self._r):
            try:
                if f is not None:
                    f.close()
            except OSError:
                pass
        self.unlink()


class StreamEnds:
    """(client, broker) of each connection's stream index, read from its name (written
    ``client->broker``): a dict of 176k tuples of two strings cost about 40 MB. A stream
    named otherwise keeps its pair in ``odd``."""

    def __init__(self, strings: Interner) -> None:
        self.strings = strings
        self.ids = array("I")  # stream indexes in the order they were first seen
        self.odd: dict[int, tuple[str, str]] = {}
        self._seen = bytearray()  # 1 at each string index that is a stream here

    def __contains__(self, idx: int) -> bool:
        return idx < len(self._seen) and self._seen[idx] == 1

    def add(self, idx: int, client: str, broker: str) -> None:
        """Note a stream index the first time it is seen (later calls do nothing)."""
        seen = self._seen
        if idx < len(seen):
            if seen[idx]:
                return
        else:
            seen.extend(bytes(idx + 1 - len(seen) + 1024))
        seen[idx] = 1
        self.ids.append(idx)
        name = self.strings[idx]
        if type(name) is not str or name.partition("->") != (client, "->", broker):
            self.odd[idx] = (client, broker)

    def get(self, idx: int, default: tuple[str, str] | None = None) -> tuple[str, str] | None:
        odd = self.odd.get(idx)
        if odd is not None:
            return odd
        if idx not in self:
            return default
        client, _, broker = self.strings[idx].partition("->")
        return client, broker

    def __iter__(self) -> Iterator[int]:
        return iter(self.ids)

    def __len__(self) -> int:
        return len(self.ids)

    def items(self) -> Iterator[tuple[int, tuple[str, str]]]:
        for idx in self.ids:
            yield idx, self.get(idx)


_ERROR_INTS = ("code", "correlation_id", "partition", "frame", "response_frame", "tcp_stream", "order")
_ERROR_NAMES = ("kind", "name", "api_name", "stream")  # few distinct values, or the streams' own
_ERROR_TEXTS = ("topic", "path", "message")
MAX_SHARED_TEXTS = 100_000  # distinct topic/path/message texts kept once for all the rows that repeat them


class ErrorTable:
    """The error rows, packed in columns: about 115 bytes a row (a slotted ErrorRow with its
    ints, float and strings took about 280). ``table[i]``, slices and iteration make the
    ErrorRow objects again. A row whose values do not fit the columns is kept whole."""

    def __init__(self, strings: Interner) -> None:
        self.strings = strings  # the store's interner: kinds, error and api names, streams
        self.ts = array("d")
        self.retriable = array("b")  # -1 null
        self.ints = {name: array("q") for name in _ERROR_INTS}
        self.names = {name: array("I") for name in _ERROR_NAMES}
        self.texts: dict[str, list[str | None]] = {name: [] for name in _ERROR_TEXTS}
        self.whole: list[ErrorRow | None] = []  # a row kept as it came (values of other types)
        self._shared: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self.whole)

    def append(self, err: ErrorRow) -> None:
        if not _packs(err):
            self._append_whole(err)
            return
        strings, shared = self.strings, self._shared
        self.ts.append(NAN if err.ts is None else err.ts)
        self.retriable.append(-1 if err.retriable is None else int(err.retriable))
        ints = self.ints
        for name in _ERROR_INTS:
            v = getattr(err, name)
            ints[name].append(NONE_INT if v is None else v)
        names = self.names
        for name in _ERROR_NAMES:
            names[name].append(strings(getattr(err, name)))
        texts = self.texts
        for name in _ERROR_TEXTS:
            v = getattr(err, name)
            if v is not None:
                kept = shared.get(v)
                if kept is not None:
                    v = kept
                elif len(shared) < MAX_SHARED_TEXTS:
                    shared[v] = v
            texts[name].append(v)
        self.whole.append(None)

    def _append_whole(self, err: ErrorRow) -> None:
        self.ts.append(NAN)
        self.retriable.append(-1)
        for col in self.ints.values():
            col.append(NONE_INT)
        for col in self.names.values():
            col.append(0)
        for col in self.texts.values():
            col.append(None)
        self.whole.append(err)

    def _row(self, p: int) -> ErrorRow:
        whole = self.whole[p]
        if whole is not None:
            return whole
        ts = self.ts[p]
        retriable = self.retriable[p]
        strings = self.strings
        kw: dict[str, Any] = {name: strings[col[p]] for name, col in self.names.items()}
        for name, col in self.ints.items():
            v = col[p]
            kw[name] = None if v == NONE_INT else v
        for name, col in self.texts.items():
            kw[name] = col[p]
        kw["ts"] = None if math.isnan(ts) else ts
        kw["retriable"] = None if retriable < 0 else bool(retriable)
        return ErrorRow(**kw)

    def __getitem__(self, key: int | slice) -> Any:
        if isinstance(key, slice):
            return [self._row(p) for p in range(*key.indices(len(self)))]
        n = len(self)
        if key < 0:
            key += n
        if not 0 <= key < n:
            raise IndexError("error row out of range")
        return self._row(key)

    def __iter__(self) -> Iterator[ErrorRow]:
        for p in range(len(self)):
            yield self._row(p)

    def __delitem__(self, key: slice) -> None:
        for col in (self.ts, self.retriable, self.whole, *self.ints.values(), *self.names.values(),
                    *self.texts.values()):
            del col[key]

    def label_counts(self, kafka_error: str) -> dict[str, int]:
        """Rows per label: the error name for ``kafka_error`` rows that have one, else the kind."""
        counts: dict[int, int] = {}
        odd: dict[Any, int] = {}
        kinds, names = self.names["kind"], self.names["name"]
        kafka = self.strings.get(kafka_error)
        for p, whole in enumerate(self.whole):
            if whole is not None:
                label = whole.name if whole.kind == kafka_error and whole.name else whole.kind
                odd[label] = odd.get(label, 0) + 1
                continue
            idx = names[p] if kinds[p] == kafka and self.strings[names[p]] else kinds[p]
            counts[idx] = counts.get(idx, 0) + 1
        out: dict[Any, int] = {}
        for label, n in [*((self.strings[idx], n) for idx, n in counts.items()), *odd.items()]:
            out[label] = out.get(label, 0) + n
        return out


def _packs(err: ErrorRow) -> bool:
    """True when every value of the row fits ErrorTable's columns (always, from the dissector)."""
    for name in _ERROR_INTS:
        v = getattr(err, name)
        if v is not None and (type(v) is not int or not NONE_INT < v < 2**63):
            return False
    for name in (*_ERROR_NAMES, *_ERROR_TEXTS):
        v = getattr(err, name)
        if v is not None and type(v) is not str:
            return False
    return (err.ts is None or (type(err.ts) is float and err.ts == err.ts)) and (err.retriable is None or type(err.retriable) is bool) \
        and err.order is not None


def compact(ex: Exchange, refs: list[int] | tuple[int, ...] = (-1, -1, -1, -1)) -> tuple:
    """The part of an Exchange the store keeps, as a plain picklable tuple.

    ``refs`` = (request offset, request length, response offset, response length)
    of its frames in the spill file, -1 when not kept.
    """
    ts = ex.request_ts if ex.request_ts is not None else ex.response_ts
    return (ex.stream, ex.client, ex.broker, ts, ex.response_ts, ex.latency_ms, ex.client_id, ex.api_name,
            ex.api_key, ex.api_version, ex.correlation_id, ex.request_size, ex.response_size, ex.status,
            tuple(ex.error_codes), tuple(ex.error_names), tuple(ex.topics), ex.throttle_time_ms, ex.index,
            ex.long_poll, ex.frame, ex.response_frame, ex.tcp_stream, *refs)


class ExchangeStore:
    """Columns of exchanges plus the errors, with absolute row ids.

    Row ids are absolute and never reused; in live mode ``max_rows`` trims the
    oldest rows in chunks (``first`` is then the oldest id still held), which
    bounds memory however long the capture runs.
    """

    def __init__(self, *, redact: bool = True, values: str = "auto", max_rows: int | None = None,
                 max_errors: int = 200_000, lru_messages: int = 2_000, spill: bool = True) -> None:
        self.redact = redact
        self.values = values
        self.max_rows = max_rows
        self.max_errors = max_errors
        self.lock = threading.RLock()
        self.first = 0  # absolute id of the oldest row held
        self.total = 0  # rows ever added (absolute id of the next row)
        self.strings = Interner(None)  # streams, client ids, api names, error kinds (0 = null)
        self.tuples = Interner(())  # topic lists, error-name lists, error-code lists
        self.stream_ends = StreamEnds(self.strings)  # stream idx -> (client, broker)
        # ~98 bytes an exchange. The WIDENING_COLUMNS are int32 (NONE_INT32 null) until a
        # value needs int64 (NONE_INT null): read them with int_cell/null_of. The No. column
        # is the row id + 1; a response frame follows its request in the spill, so one
        # offset ("frames_off") places both (resp_off_odd: a row written otherwise).
        self.cols = {
            "ts": array("d"), "resp_ts": array("d"), "lat": array("d"),
            "stream": array("I"), "client_id": array("I"), "api_name": array("I"),
            "api_key": array("h"), "api_version": array("h"), "cid": array("i"),
            "req_size": array("i"), "resp_size": array("i"), "status": array("B"),
            "err_codes": array("I"), "err_names": array("I"), "topics": array("I"),
            "throttle": array("i"), "long_poll": array("b"),
            "frame": array("i"), "response_frame": array("i"), "tcp_stream": array("i"),
            "frames_off": array("q"), "req_len": array("i"), "resp_len": array("i"),
        }
        self.resp_off_odd: dict[int, int] = {}  # row id -> response frame offset, when not after the request
        self.errors = ErrorTable(self.strings)
        self.error_count = 0
        self.errors_dropped = 0
        self.spill: FrameSpill | None = FrameSpill() if spill else None
        self._messages: OrderedDict[int, tuple[Message | None, Message | None]] = OrderedDict()
        self._lru_cap = lru_messages
        self.topic_names: dict[str, str] = {}
        self.sasl_mechanisms: dict[str, str | None] = {}  # stream -> mechanism (for redaction)
        self.secret_streams: set[int] = set()  # streams that carried SASL or delegation tokens
        self.generation = 0  # bumped on every commit; views compare it to know about new rows
        # Diagnoser findings (Finding.as_dict), replaced as a whole by the indexer; bounded by the Diagnoser
        self.findings: list[dict[str, Any]] = []
        self.findings_examined = 0  # exchanges the Diagnoser had seen
        self.findings_generation = 0
        # the deliveries table (analyze.deliveries rows) once indexing has ended; bounded by its cap
        self.deliveries: list[dict[str, Any]] | None = None
        self.deliveries_note: str | None = None  # "truncated after N records ..." when it was

    # -- writing (the indexing worker) ----------------------------------------------------

    def set_findings(self, findings: list[dict[str, Any]], examined: int) -> None:
        with self.lock:
            self.findings = findings
            self.findings_examined = examined
            self.findings_generation += 1

    def set_deliveries(self, rows: list[dict[str, Any]], note: str | None) -> None:
        with self.lock:
            self.deliveries = rows
            self.deliveries_note = note

    def __len__(self) -> int:
        return self.total - self.first

    def add_exchange(self, ex: Exchange, frames: tuple[bytes | None, bytes | None] | None = None) -> int:
        """Append one exchange (spilling its frames when given); returns its absolute row id."""
        refs = [-1, -1, -1, -1]
        spill = self.spill
        if frames is not None and spill is not None:
            for n, frame in enumerate(frames):
                if frame is not None:
                    refs[2 * n] = spill.append(frame)
                    refs[2 * n + 1] = len(frame)
        row = self.add_compact(compact(ex, refs))
        if frames is None and (ex.request is not None or ex.response is not None):
            self._messages[row] = (ex.request, ex.response)
            if len(self._messages) > self._lru_cap:
                self._messages.popitem(last=False)
        return row

    def add_compact(self, t: tuple) -> int:
        """Append one row made by :func:`compact` (possibly in another process)."""
        (stream_name, client, broker, ts, resp_ts, lat, client_id, api_name, api_key, api_version, cid,
         req_size, resp_size, status, err_codes, err_names, topics, throttle, _index, long_poll,
         frame, response_frame, tcp_stream, req_off, req_len, resp_off, resp_len) = t
        c = self.cols
        stream = self.strings(stream_name)
        self.stream_ends.add(stream, client, broker)
        c["ts"].append(_opt_float(ts))
        c["resp_ts"].append(_opt_float(resp_ts))
        c["lat"].append(_opt_float(lat))
        c["stream"].append(stream)
        c["client_id"].append(self.strings(client_id))
        c["api_name"].append(self.strings(api_name))
        c["api_key"].append(-1 if api_key is None else api_key)
        if api_key in SECRET_APIS or api_name == "SaslToken":
            self.secret_streams.add(stream)
        c["api_version"].append(-1 if api_version is None else api_version)
        put = self._put_int
        put("cid", cid)
        put("req_size", req_size)
        put("resp_size", resp_size)
        c["status"].append(_STATUS_INDEX.get(status, len(STATUSES) - 1))
        c["err_codes"].append(self.tuples(err_codes) if err_codes else 0)
        c["err_names"].append(self.tuples(err_names) if err_names else 0)
        c["topics"].append(self.tuples(topics) if topics else 0)
        put("throttle", throttle)
        c["long_poll"].append(-1 if long_poll is None else int(long_poll))
        put("frame", frame)
        put("response_frame", response_frame)
        put("tcp_stream", tcp_stream)
        row = self.total
        # the spill holds an exchange's request then its response: one offset places both
        c["frames_off"].append(req_off if req_len >= 0 else resp_off)
        c["req_len"].append(req_len)
        c["resp_len"].append(resp_len)
        if resp_len >= 0 and req_len >= 0 and resp_off != req_off + req_len:
            self.resp_off_odd[row] = resp_off
        self.total += 1
        return row

    def _put_int(self, name: str, v: int | None) -> None:
        """Append to an integer column, turning it into int64 when the value needs it."""
        col = self.cols[name]
        if v is None:
            col.append(NONE_INT if col.typecode == "q" else NONE_INT32)
            return
        v = int(v)
        if col.typecode == "i":
            if v != NONE_INT32 and -(2**31) < v < 2**31:
                col.append(v)
                return
            col = self.cols[name] = _widened(col)
        col.append(v)

    def add_error(self, err: ErrorRow) -> None:
        self.error_count += 1
        if len(self.errors) >= self.max_errors:
            # keep the first half and a rolling tail: the start of trouble and the latest
            del self.errors[self.max_errors // 2: self.max_errors // 2 + self.max_errors // 10]
            self.errors_dropped += self.max_errors // 10
        self.errors.append(err)

    def add_events(self, events: Iterable[tuple[Any, Any]]) -> None:
        """Commit a batch of (event, frames) pairs under the lock."""
        with self.lock:
            for ev, frames in events:
                if isinstance(ev, Exchange):
                    self.add_exchange(ev, frames)
                elif isinstance(ev, ErrorRow):
                    self.add_error(ev)
            self.trim()
            self.generation += 1

    def trim(self) -> None:
        if self.max_rows is None or len(self) <= self.max_rows:
            return
        drop = max(len(self) - self.max_rows, self.max_rows // 10)
        for col in self.cols.values():
            del col[:drop]
        self.first += drop
        for row in [r for r in self.resp_off_odd if r < self.first]:
            del self.resp_off_odd[row]
        for row in [r for r in self._messages if r < self.first]:
            del self._messages[row]

    def close(self) -> None:
        if self.spill is not None:
            self.spill.close()

    # -- reading (UI thread) ------------------------------------------------------------

    def pos(self, row: int) -> int:
        return row - self.first

    def has(self, row: int) -> bool:
        return self.first <= row < self.total

    def cell(self, name: str, row: int) -> Any:
        return self.cols[name][row - self.first]

    def int_cell(self, name: str, row: int) -> int | None:
        """An integer column's value at a row, None for null."""
        return int_or_none(self.cols[name], row - self.first)

    def frame_refs(self, row: int) -> tuple[int, int, int, int]:
        """(request offset, its length, response offset, its length) in the spill; -1 lengths
        for frames not kept."""
        c = self.cols
        p = row - self.first
        off, req_len, resp_len = c["frames_off"][p], c["req_len"][p], c["resp_len"][p]
        resp_off = off + req_len if req_len >= 0 else off
        if resp_len >= 0 and req_len >= 0:
            resp_off = self.resp_off_odd.get(row, resp_off)
        return (off if req_len >= 0 else -1), req_len, (resp_off if resp_len >= 0 else -1), resp_len

    def status(self, row: int) -> str:
        return STATUSES[self.cols["status"][row - self.first]]

    def stream(self, row: int) -> str:
        return self.strings[self.cols["stream"][row - self.first]]

    def api_label(self, row: int) -> str:
        p = row - self.first
        name = self.strings[self.cols["api_name"][p]]
        if name:
            return name
        key = self.cols["api_key"][p]
        return f"api_key {key}" if key >= 0 else "(unknown)"

    def has_error(self, row: int) -> bool:
        p = row - self.first
        return bool(self.cols["err_codes"][p]) or self.cols["status"][p] >= 2

    def row_dict(self, row: int) -> dict[str, Any]:
        """The public `exchanges` row (EXCHANGE_COLUMNS), as Exchange.row() gives it."""
        view = RowView(self, row)
        return {col: view.get(col) for col in EXCHANGE_COLUMNS}

    def frames(self, row: int) -> tuple[bytes | None, bytes | None]:
        if self.spill is None or not self.has(row):
            return None, None
        req_off, req_len, resp_off, resp_len = self.frame_refs(row)
        return (self.spill.read(req_off, req_len) if req_len >= 0 else None,
                self.spill.read(resp_off, resp_len) if resp_len >= 0 else None)

    def messages(self, row: int) -> tuple[Message | None, Message | None]:
        """The fully decoded request and response of a row (re-decoded from its frames)."""
        kept = self._messages.get(row)
        if kept is not None:
            self._messages.move_to_end(row)
            return kept
        req_f, resp_f = self.frames(row)
        if req_f is None and resp_f is None:
            return None, None
        from kwinspect.protocol import decode_request, decode_response
        from kwinspect.stream.redact import redact_message

        p = row - self.first
        key, ver = self.cols["api_key"][p], self.cols["api_version"][p]
        req = decode_request(req_f) if req_f is not None else None
        resp = decode_response(resp_f, key, ver) if resp_f is not None and key >= 0 else None
        if resp is not None and req is None and self.status(row) == STATUS_REQUEST_MISSING:
            resp.issues.append(Issue(REQUEST_MISSING, "request not captured; response decoded with the api "
                                     "and version the dissector chose for it", severity=SEVERITY_INFO))
        if self.redact:
            mech = self.sasl_mechanisms.get(self.stream(row))
            if req is not None:
                redact_message(req.api_key, True, req.header, req.body, mech)
            if resp is not None:
                redact_message(key, False, resp.header, resp.body, mech)
        return req, resp

    def raw_visible(self, row: int) -> bool:
        """False for SASL and delegation-token exchanges while redacting: their raw bytes hold
        secrets (passwords, SCRAM proofs, OAuth tokens, token HMACs)."""
        if not self.redact:
            return True
        key = self.cell("api_key", row)
        if key < 0 and self.cell("stream", row) in self.secret_streams:
            return False  # an undecoded response on a connection that carries credentials
        return key not in SECRET_APIS and self.strings[self.cell("api_name", row)] != "SaslToken"


class RowView:
    """A lazy exchange row: ``get(col)`` computes one column, for the filter language.

    ``compile_filter`` predicates only call ``row.get(col)``, so a filter over a
    million rows never builds a million dicts.
    """

    __slots__ = ("s", "p", "row")

    def __init__(self, store: ExchangeStore, row: int) -> None:
        self.s = store
        self.row = row
        self.p = row - store.first

    def get(self, col: str, default: Any = None) -> Any:
        s, p = self.s, self.p
        c = s.cols
        if col == "api_name":
            return s.strings[c["api_name"][p]]
        if col == "latency_ms":
            return _back_float(c["lat"][p])
        if col == "status":
            return STATUSES[c["status"][p]]
        if col == "topics":
            return list(s.tuples[c["topics"][p]])
        if col == "error_codes":
            return list(s.tuples[c["err_codes"][p]])
        if col == "error_names":
            return list(s.tuples[c["err_names"][p]])
        if col == "stream":
            return s.strings[c["stream"][p]]
        if col in ("client", "broker"):
            ends = s.stream_ends.get(c["stream"][p], ("", ""))
            return ends[0] if col == "client" else ends[1]
        if col == "api_key":
            v = c["api_key"][p]
            return None if v < 0 else v
        if col == "api_version":
            v = c["api_version"][p]
            return None if v < 0 else v
        if col == "correlation_id":
            return int_or_none(c["cid"], p)
        if col == "client_id":
            return s.strings[c["client_id"][p]]
        if col == "request_ts":
            st = c["status"][p]
            return None if st == 3 else _back_float(c["ts"][p])
        if col == "response_ts":
            return _back_float(c["resp_ts"][p])
        if col == "request_size":
            return int_or_none(c["req_size"], p)
        if col == "response_size":
            return int_or_none(c["resp_size"], p)
        if col == "throttle_time_ms":
            return int_or_none(c["throttle"], p)
        if col == "long_poll":
            v = c["long_poll"][p]
            return None if v < 0 else bool(v)
        if col in ("frame", "response_frame", "tcp_stream"):
            return int_or_none(c[col], p)
        return default

    def __getitem__(self, col: str) -> Any:
        return self.get(col)
