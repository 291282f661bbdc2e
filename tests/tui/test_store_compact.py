"""The store's packed layout gives back exactly what went in: int32 columns that have to
widen, error rows, stream ends and frame offsets; and what it costs a row."""

from __future__ import annotations

import dataclasses
import pickle
import tracemalloc
from pathlib import Path

import pytest

from kwinspect.model import EXCHANGE_COLUMNS, ErrorRow, Exchange
from kwinspect.run.files import dissect_file
from kwinspect.tui.indexer import error_fields
from kwinspect.tui.store import ExchangeStore, compact
from kwinspect.tui.view import ViewSpec, compute_view

from .conftest import CAPTURES

PUBLIC = Path("/work/shared/captures-public")
FILES = sorted(CAPTURES.glob("*.pcap")) + sorted(PUBLIC.glob("*.pcap*"))
BASE = CAPTURES / "confluent-mock-produce-consume.pcap"


def _events(path: Path) -> tuple[list[Exchange], list[ErrorRow]]:
    events = list(dissect_file(path))
    return ([e for e in events if isinstance(e, Exchange)], [e for e in events if isinstance(e, ErrorRow)])


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_error_rows_come_back_as_the_core_made_them(path):
    _exchanges, errors = _events(path)
    store = ExchangeStore(spill=False)
    for err in errors:
        store.add_error(err)
    assert len(store.errors) == len(errors)
    assert list(store.errors) == errors
    assert store.errors[: len(errors) // 2] == errors[: len(errors) // 2]
    store.close()


def test_odd_values_round_trip_and_widen_the_column():
    """Values the int32 columns cannot hold (out of range, or the int32 null itself) turn the
    column into int64; every row, the earlier ones too, reads back as it went in."""
    exchanges, _ = _events(BASE)
    store = ExchangeStore(spill=False)
    want = []
    odd = {"correlation_id": -(2**31), "request_size": 2**31 + 5, "response_size": None,
           "throttle_time_ms": -(2**40), "frame": 2**40, "response_frame": None, "tcp_stream": 2**31}
    for i, ex in enumerate(exchanges[:50]):
        if i == 20:
            ex = dataclasses.replace(ex, **odd)
        store.add_exchange(ex)
        want.append(ex.row())
    assert [store.row_dict(r) for r in range(len(store))] == want
    assert store.row_dict(20)["request_size"] == 2**31 + 5 and store.row_dict(20)["correlation_id"] == -(2**31)
    # the filters read the widened columns as the row does
    got = compute_view(store, ViewSpec(), _pred("request_size > 2147483647")).matched.tolist()
    assert got == [20]
    store.close()


def _pred(expr: str):
    from kwinspect.analyze.filter import compile_filter

    return compile_filter(expr, EXCHANGE_COLUMNS)


def test_odd_error_rows_and_stream_names_are_kept_whole():
    store = ExchangeStore(spill=False)
    rows = [
        ErrorRow(kind="kafka_error", code=2**70, name="X", ts=float("nan"), stream="a->b"),  # too wide, NaN
        ErrorRow(kind="tcp_gap", retriable=1, message="m"),  # an int where a bool goes
        ErrorRow(kind="kafka_error", code=3, name="", api_name="Fetch", partition=-(2**63) + 1, stream=None),
    ]
    for r in rows:
        store.add_error(r)
    got = list(store.errors)
    assert len(got) == 3 and got[0].code == 2**70 and got[0].ts != got[0].ts
    assert got[1] == rows[1] and type(got[1].retriable) is int
    assert got[2] == rows[2]
    # labels per row: the error name when it has one, else the kind
    assert store.errors.label_counts("kafka_error") == {"X": 1, "tcp_gap": 1, "kafka_error": 1}
    # a stream whose name is not "client->broker" keeps its own ends
    exchanges, _ = _events(BASE)
    ex = dataclasses.replace(exchanges[0], stream="x->y->z", client="x->y", broker="z")
    store.add_exchange(ex)
    assert store.row_dict(0) == ex.row()
    store.close()


def test_frames_placed_apart_in_the_spill_are_read_back():
    """The store keeps one spill offset per row and expects the response right after the
    request; a row written otherwise keeps its response offset aside."""
    exchanges, _ = _events(BASE)
    store = ExchangeStore(spill=True)
    spill = store.spill
    req, resp = b"R" * 10, b"S" * 7
    spill.append(b"junk")
    req_off = spill.append(req)
    spill.append(b"gap")
    store.add_compact(compact(exchanges[0], (req_off, 10, spill.append(resp), 7)))
    store.add_compact(compact(exchanges[1], (-1, -1, spill.append(resp), 7)))
    store.add_compact(compact(exchanges[2], (spill.append(req), 10, -1, -1)))
    o = spill.append(req)
    spill.append(resp)
    store.add_compact(compact(exchanges[3], (o, 10, o + 10, 7)))
    assert [store.frames(r) for r in range(4)] == [(req, resp), (None, resp), (req, None), (req, resp)]
    store.close()


def _copies(n_conns: int) -> tuple[list[tuple], list[tuple]]:
    """Compact exchange rows and error rows of the shipped capture, its connections moved to
    a new client address per copy (as bench/make_big_capture.py does)."""
    exchanges, errors = _events(BASE)
    rows, errs = [], []
    streams = sorted({e.stream for e in exchanges})
    per_copy = len(streams)
    for k in range(n_conns // per_copy):
        host = f"10.{k >> 16 & 255}.{k >> 8 & 255}.{k & 255}"
        for ex in exchanges:
            client = f"{host}:{ex.client.rsplit(':', 1)[1]}"
            stream = f"{client}->{ex.broker}"
            rows.append((stream, client, ex.broker, *compact(ex, (k * 100, 50, k * 100 + 50, 30))[3:-4],
                         k * 100, 50, k * 100 + 50, 30))
        for err in errors:
            if err.stream is not None:
                client = f"{host}:{err.stream.split('->')[0].rsplit(':', 1)[1]}"
                errs.append(dataclasses.replace(err, stream=f"{client}->{err.stream.split('->')[1]}"))
    return rows, errs


def test_memory_per_exchange_is_bounded():
    """What a row costs the app, its connection's name and its share of error rows included,
    on rows shaped like the 1M-exchange benchmark capture's (about 6 exchanges and 3 error
    rows a connection), fed as the indexing process sends them (pickled batches of tuples):
    under 210 bytes an exchange (356 before the packed layout)."""
    rows, errs = _copies(6_000)
    batches = [pickle.dumps((rows[i:i + 2_000], [error_fields(e) for e in errs[i // 2:(i + 2_000) // 2]]))
               for i in range(0, len(rows), 2_000)]
    store = ExchangeStore(spill=False, max_errors=10**9)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for batch in batches:
            got_rows, got_errs = pickle.loads(batch)
            for t in got_rows:
                store.add_compact(t)
            for t in got_errs:
                store.add_error(ErrorRow(*t))
        del got_rows, got_errs
        grown = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    per = grown / len(rows)
    assert len(store) == len(rows) and 0 < len(store.errors) <= len(errs)
    assert per < 210, f"{per:.0f} bytes an exchange ({len(store.errors) / len(rows):.2f} error rows each)"
    store.close()
