"""The compact store: rows equal the core's rows; full decodes come back from spilled frames."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kwinspect.analyze.filter import compile_filter
from kwinspect.analyze.render import message_json
from kwinspect.model import EXCHANGE_COLUMNS, Exchange
from kwinspect.run.files import dissect_file
from kwinspect.tui.indexer import Indexer
from kwinspect.tui.store import ExchangeStore, RowView
from kwinspect.tui.view import ViewSpec, compute_view

from .conftest import CAPTURES

PUBLIC = Path("/work/shared/captures-public")
FILES = sorted(CAPTURES.glob("*.pcap")) + sorted(PUBLIC.glob("*.pcap*"))


def _store(path, process: bool) -> tuple[ExchangeStore, Indexer]:
    store = ExchangeStore(spill=not process)
    ix = Indexer(store)
    if process:
        ix.index_files_in_process([path])
    else:
        ix.index_files([path])
    return store, ix


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_rows_and_redecoded_messages_match_the_core(path):
    expected = [e for e in dissect_file(path) if isinstance(e, Exchange)]
    store, ix = _store(path, process=False)
    assert ix.error is None
    assert len(store) == len(expected)
    for row, ex in enumerate(expected):
        assert store.row_dict(row) == ex.row()
        if ex.api_name != "SaslToken":  # (raw SASL tokens are not Kafka frames: nothing to tap)
            # every message the core decoded has its frame in the spill (the tap labels the
            # compiled loop's rows at the end of its batch: none may go to another row)
            assert [f is not None for f in store.frames(row)] == [ex.request is not None, ex.response is not None]
        req, resp = store.messages(row)
        if ex.request is not None and store.frames(row)[0] is not None:
            assert json.dumps(message_json(req), default=str) == json.dumps(message_json(ex.request), default=str)
        if ex.response is not None and ex.api_key is not None and store.frames(row)[1] is not None:
            got, want = message_json(resp), message_json(ex.response)
            if ex.status == "request_missing":  # the note on how it was decoded is worded by each side
                assert [i["kind"] for i in got.pop("issues")] == [i["kind"] for i in want.pop("issues")]
            assert json.dumps(got, default=str) == json.dumps(want, default=str)
    store.close()


def test_process_indexer_matches_thread_indexer():
    path = CAPTURES / "confluent-mock-transactions.pcap"
    a, _ = _store(path, process=False)
    b, ix = _store(path, process=True)
    assert ix.error is None
    assert len(a) == len(b) > 0 and a.error_count == b.error_count
    for row in range(len(a)):
        assert a.row_dict(row) == b.row_dict(row)
        assert a.frames(row) == b.frames(row)
    assert ix.dissector.connections  # the connection snapshot came back
    a.close()
    b.close()


def test_lazy_rows_filter_like_dicts():
    path = CAPTURES / "confluent-mock-errors.pcap"
    store, _ = _store(path, process=False)
    for expr in ('api == "Produce"', "error", "latency_ms > 50", 'topic ~ "errors.*"', "not (status == \"paired\")",
                 'client_id in ("errors-producer")', "request_ts > 0 and response_size >= 56"):
        flt = compile_filter(expr, EXCHANGE_COLUMNS)
        want = [r for r in range(len(store)) if flt(store.row_dict(r))]
        assert [r for r in range(len(store)) if flt(RowView(store, r))] == want, expr
        got = compute_view(store, ViewSpec(expr=expr), flt)
        assert got.rows.tolist() == want, expr
    store.close()


def test_sasl_frames_are_not_shown_raw():
    store = ExchangeStore(spill=False)
    ex = Exchange(stream="c->b", client="c", broker="b", api_key=36, api_name="SaslAuthenticate", api_version=2,
                  correlation_id=3, client_id="x", request_ts=1.0, response_ts=1.1, latency_ms=100.0,
                  request_size=10, response_size=10, status="paired")
    store.add_exchange(ex)
    assert not store.raw_visible(0)
    store.redact = False
    assert store.raw_visible(0)


def test_grouped_filter_evaluation_matches_row_by_row():
    """Above 1000 rows a filter runs once per distinct combination of the columns it reads."""
    from kwinspect.tui.store import compact
    from kwinspect.tui.view import referenced_columns

    base = [compact(e) for path in (CAPTURES / "confluent-mock-errors.pcap", CAPTURES / "tansu-errors.pcap")
            for e in dissect_file(path) if isinstance(e, Exchange)]
    store = ExchangeStore(spill=False)
    for k in range(120):
        for t in base:
            row = list(t)
            row[0] = f"{row[0]}#{k % 7}"  # a few more connections
            row[18] = len(store) + 1
            store.add_compact(tuple(row))
    assert len(store) > 1000
    assert referenced_columns('api == "Produce" and error') == {"api_name", "error_codes", "status"}
    assert referenced_columns("no_such_column > 1") is None
    for expr in ('api == "Produce"', "error", "not error and api_version >= 3", 'topic ~ "err.*"',
                 'client_id == "errors-producer" or status == "response_missing"', "latency_ms > 50",
                 'stream ~ "#3$"', "error_codes == 6", 'error_names == "NOT_LEADER_OR_FOLLOWER"',
                 "request_ts == null", "throttle_time_ms > 0 or response_size > 100"):
        flt = compile_filter(expr, EXCHANGE_COLUMNS)
        want = [r for r in range(len(store)) if flt(store.row_dict(r))]
        assert compute_view(store, ViewSpec(expr=expr), flt).rows.tolist() == want, expr
        both = compute_view(store, ViewSpec(expr=expr, errors_only=True), flt).rows.tolist()
        assert both == [r for r in want if store.has_error(r)], expr


def test_process_indexer_knows_each_connections_sasl_mechanism():
    """The detail view redacts SASL tokens by mechanism: every connection that did a
    SaslHandshake has the mechanism its client used (the scenario's manifest), and the
    SASL exchanges decode again redacted as the core redacted them."""
    path = CAPTURES / "tansu-sasl-plain-proxy.pcap"
    manifest = json.loads(path.with_name("tansu-sasl-plain-proxy.manifest.json").read_text())
    mechanisms = {s["mechanism"] for s in manifest["broker"]["sasl_sessions"]}
    expected = [e for e in dissect_file(path) if isinstance(e, Exchange)]
    store, ix = _store(path, process=True)
    assert ix.error is None and len(store) == len(expected)
    handshakes = {store.stream(r) for r in range(len(store)) if store.api_label(r) == "SaslHandshake"}
    assert len(handshakes) > 1
    assert {s: store.sasl_mechanisms.get(s) for s in handshakes} == dict.fromkeys(handshakes, *mechanisms)
    sasl_rows = [row for row, ex in enumerate(expected) if ex.api_name in ("SaslAuthenticate", "SaslToken")]
    assert sasl_rows
    for row in sasl_rows:
        req, resp = store.messages(row)
        if req is not None:
            want = message_json(expected[row].request)
            assert json.dumps(message_json(req), default=str) == json.dumps(want, default=str)
    store.close()
