"""Filters select exactly the rows we expect, written out by hand per expression."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kwinspect.analyze.filter import FilterError, compile_filter, filter_rows
from kwinspect.model import (
    ERROR_COLUMNS,
    EXCHANGE_COLUMNS,
    RECORD_COLUMNS,
    ErrorRow,
    Exchange,
    RecordRow,
)

T = 1_704_164_645.0  # 2024-01-02T03:04:05Z


def ex(n, api, *, latency=None, status="paired", codes=(), topics=(), client_id="app",
       ts=None, version=1):
    return Exchange(
        stream=f"10.0.0.1:{n}->10.0.0.2:9092", client=f"10.0.0.1:{n}", broker="10.0.0.2:9092",
        api_key={"Produce": 0, "Fetch": 1, "Metadata": 3}.get(api), api_name=api,
        api_version=version, correlation_id=n, client_id=client_id,
        request_ts=ts, response_ts=None, latency_ms=latency, request_size=10,
        response_size=None, status=status, error_codes=list(codes),
        error_names=["X"] * len(codes), topics=list(topics),
    )


EXCHANGES = {
    1: ex(1, "Produce", latency=60.0, topics=["orders.eu", "audit"], ts=T),
    2: ex(2, "Produce", latency=50.0, topics=["payments"], ts=T + 1),
    3: ex(3, "Fetch", latency=500.0, codes=[6], topics=["orders.us"], client_id="x", ts=T + 2),
    4: ex(4, "Metadata", latency=None, status="response_missing", client_id=None, ts=T + 3),
    5: ex(5, "Produce", latency=None, status="no_response_expected", topics=["orders"],
          client_id="x", ts=None),
    6: ex(6, None, latency=1.5, client_id="", version=None, ts=T + 4),
    7: ex(7, "Fetch", latency=0.0, codes=[0], topics=[], ts=T + 5),
}


def select(expr, rows=EXCHANGES, columns=EXCHANGE_COLUMNS):
    f = compile_filter(expr, columns)
    return {k for k, r in rows.items() if f(r.row() if hasattr(r, "row") else r)}


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ('api == "Produce" and latency_ms > 50', {1}),
        ('api == "Produce" and latency_ms >= 50', {1, 2}),
        ('topic ~ "orders.*"', {1, 3, 5}),
        ('topic ~ "^orders\\."', {1, 3}),
        ('topics ~ "^orders$"', {5}),
        ("error", {3, 4}),
        ("not error", {1, 2, 5, 6, 7}),
        ('client_id == "x"', {3, 5}),
        ('client_id != "x"', {1, 2, 4, 6, 7}),
        ("client_id == null", {4}),
        ("client_id != null", {1, 2, 3, 5, 6, 7}),
        ("client_id", {1, 2, 3, 5, 7}),  # bare column: not null, not empty
        ("latency_ms", {1, 2, 3, 6}),  # 0.0 is falsy, null is falsy
        ("latency_ms < 10", {6, 7}),
        ("latency_ms != 60", {2, 3, 4, 5, 6, 7}),
        ('api == null', {6}),
        ('api in ("Fetch", "Metadata")', {3, 4, 7}),
        ('API_NAME == "Fetch" || latency_ms == 1.5', {3, 6, 7}),
        ('not (api == "Produce" or api == "Fetch")', {4, 6}),
        ('api == "Produce" and (latency_ms > 55 or status == "no_response_expected")', {1, 5}),
        ("error_codes == 6", {3}),
        ("error_codes == 0", {7}),
        ("error_codes", {3, 7}),
        ("topics == null", {4, 6, 7}),
        ('topic == "audit"', {1}),
        ('topic != "audit"', {2, 3, 4, 5, 6, 7}),
        ('request_ts >= "2024-01-02T03:04:07Z"', {3, 4, 6, 7}),
        ('request_ts < "2024-01-02T03:04:06+00:00"', {1}),
        ("request_ts > 1704164648.5", {6, 7}),
        ("request_ts == null", {5}),
        ("api_version == null", {6}),
        ("correlation_id > 2 && correlation_id <= 4", {3, 4}),
        ('status !~ "^paired$"', {4, 5}),
        ('client_id ~ "(?i)^X$"', {3, 5}),
        ("true", set(EXCHANGES)),
        ("false", set()),
        ("! error and ! (latency_ms > 1)", {5, 7}),
        ('api == "produce"', set()),  # values are case-sensitive
        ("latency_ms > -1", {1, 2, 3, 6, 7}),
    ],
)
def test_exchange_filters(expr, expected):
    assert select(expr) == expected


RECORDS = {
    1: RecordRow("produce", "orders", 0, 5, T, "create_time", "k1", "utf8", "v", "utf8",
                 [{"key": "trace-id", "value": "abc", "value_encoding": "utf8"}], "none", 2,
                 True, 7, 0, 1, False, False, None, 1, "s"),
    2: RecordRow("fetch", "orders", 1, None, None, None, None, None, None, None, [], "zstd", 2,
                 False, None, None, None, True, True, "commit", 2, "s"),
    3: RecordRow("fetch", "audit", 0, 9, T + 1, "log_append_time", "", "utf8", "AAE=", "base64",
                 [], "gzip", 1, None, None, None, None, False, False, None, 3, "s"),
}


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("error", {2}),  # crc_ok false; unknown (None) is not an error
        ("not crc_ok", {2, 3}),
        ("crc_ok == false", {2}),
        ("crc_ok == null", {3}),
        ('topic == "orders" and direction == "fetch"', {2}),
        ("is_control", {2}),
        ('headers ~ "trace"', {1}),
        ('headers ~ "^abc$"', {1}),
        ("headers", {1}),
        ("headers == null", {2, 3}),
        ('value == null', {2}),
        ('key == ""', {3}),
        ('value_encoding == "base64"', {3}),
        ("offset >= 5", {1, 3}),
        ('compression in ("zstd", "gzip")', {2, 3}),
    ],
)
def test_record_filters(expr, expected):
    assert select(expr, RECORDS, RECORD_COLUMNS) == expected


ERRORS = {
    1: ErrorRow("kafka_error", 6, "NOT_LEADER_OR_FOLLOWER", True, "Produce", 4, "orders", 0),
    2: ErrorRow("tcp_gap", message="1460 bytes lost", ts=T),
    3: ErrorRow("kafka_error", 35, "UNSUPPORTED_VERSION", False, "ApiVersions", 0),
}


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("error", {1, 2, 3}),
        ('kind != "kafka_error"', {2}),
        ("retriable", {1}),
        ("retriable == false", {3}),
        ('api == "Produce"', {1}),
        ('name ~ "VERSION"', {3}),
        ("code in (6, 35)", {1, 3}),
        ('message ~ "lost"', {2}),
        ('ts > "2024-01-01"', {2}),
    ],
)
def test_error_filters(expr, expected):
    assert select(expr, ERRORS, ERROR_COLUMNS) == expected


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("latncy_ms > 50", "unknown column 'latncy_ms' at column 1 (did you mean latency_ms?)"),
        ('api == "Produce" and latency_ms >', "expected a value after '>' at column 34"),
        ('api == "Produce" and lat == 1', "unknown column 'lat' at column 22"),
        ("latency_ms ==", "expected a value after '==' at column 14"),
        ('api = "Fetch"', "'=' is not an operator; use '==' to compare at column 5"),
        ('(api == "Fetch"', "expected ')' to close the '(' at column 1, got the end of the expression at column 16"),
        ('api == "Fetch")', "unmatched ')' at column 15"),
        ('api == "Fetch', "unterminated string at column 8"),
        ('latency_ms > "slow"', "column 'latency_ms' holds numbers, got \"slow\" at column 14"),
        ("api == Produce", "expected a value after '==' at column 8"),
        ('topic ~ "(unclosed"', "bad regular expression \"(unclosed\": missing ), unterminated subpattern at column 10"),
        ("latency_ms ~ \"5\"", "'~' matches text, but column 'latency_ms' holds number at column 12"),
        ("error == true", "'error' is a condition, not a column at column 7 (use it alone (error, not error) or compare error_codes, error_names or kind)"),
        ("api and", "expected a condition after 'and' at column 8"),
        ("", "empty filter expression at column 1"),
        ("latency_ms > 5 $", "unexpected character '$' at column 16"),
        ("latency_ms > 12ms", "bad number '12m' at column 14"),
        ("latency_ms < null", "null can only be compared with == or !=, not '<' at column 12"),
        ('request_ts > "yesterday"', 'cannot read "yesterday" as a timestamp at column 14 (use ISO-8601 like "2024-01-02T03:04:05Z" or epoch seconds)'),
        ("api latency_ms", "expected an operator after 'api' at column 5 (one of == != < <= > >= ~ !~ in)"),
    ],
)
def test_bad_expressions_give_one_line_messages(expr, message):
    with pytest.raises(FilterError) as err:
        compile_filter(expr, EXCHANGE_COLUMNS)
    assert str(err.value) == message
    assert "\n" not in str(err.value)


def test_error_position_and_caret():
    with pytest.raises(FilterError) as err:
        compile_filter('api == "Produce" and latency_ms >', EXCHANGE_COLUMNS)
    assert err.value.position == 34
    assert err.value.caret().splitlines()[1] == " " * 33 + "^"


def test_column_types_are_checked_per_table():
    compile_filter('topic == "x"', RECORD_COLUMNS)  # a real column on records
    with pytest.raises(FilterError, match="unknown column 'latency_ms'"):
        compile_filter("latency_ms > 1", RECORD_COLUMNS)
    with pytest.raises(FilterError, match="did you mean api_name"):
        compile_filter('api_key == "Produce"', EXCHANGE_COLUMNS)
    with pytest.raises(FilterError, match="true/false"):
        compile_filter("crc_ok == 1", RECORD_COLUMNS)


def test_string_escapes_and_quotes():
    rows = {1: {"client_id": 'a"b'}, 2: {"client_id": "a\\b"}, 3: {"client_id": "tab\there"}}
    cols = ("client_id",)
    assert select('client_id == "a\\"b"', rows, cols) == {1}
    assert select("client_id == 'a\"b'", rows, cols) == {1}
    assert select('client_id == "a\\\\b"', rows, cols) == {2}
    assert select('client_id == "tab\\there"', rows, cols) == {3}
    assert select('client_id ~ "\\t"', rows, cols) == {3}


def test_filter_rows_takes_model_objects():
    f = compile_filter('api == "Fetch"', EXCHANGE_COLUMNS)
    got = [e.correlation_id for e in filter_rows(EXCHANGES.values(), f)]
    assert got == [3, 7]
    assert len(list(filter_rows(EXCHANGES.values(), None))) == len(EXCHANGES)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list('ab_=!<>~()"\' .,-019andornotinulltrue')), max_size=30))
def test_arbitrary_input_either_compiles_or_raises_filter_error(expr):
    try:
        f = compile_filter(expr, EXCHANGE_COLUMNS)
    except FilterError as e:
        assert "\n" not in str(e)
        return
    for r in EXCHANGES.values():
        assert f(r.row()) in (True, False)


@settings(max_examples=200, deadline=None)
@given(st.floats(-1e6, 1e6, allow_nan=False), st.sampled_from(["<", "<=", ">", ">=", "==", "!="]))
def test_numeric_comparisons_match_python(threshold, op):
    import operator

    py = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
          "==": operator.eq, "!=": operator.ne}[op]
    expected = {k for k, r in EXCHANGES.items()
                if (r.latency_ms is not None and py(r.latency_ms, threshold))
                or (op == "!=" and r.latency_ms is None)}
    assert select(f"latency_ms {op} {threshold!r}") == expected


# --- fields of decoded keys and values (value.order_id) ---------------------------

def test_field_paths_need_schemas_and_reach_into_decoded_values():
    from kwinspect.model import RECORD_COLUMNS

    fields = {"value.order_id": "integer", "key.customer": "text", "value.customer.name": "text"}
    flt = compile_filter('value.order_id == 7 and key.customer == "bob"', RECORD_COLUMNS, fields)
    row = {"value": '{"order_id": 7}', "value_encoding": "avro",
           "key": '{"customer": "bob"}', "key_encoding": "protobuf"}
    assert flt(row)
    assert not flt({**row, "value": '{"order_id": 8}'})
    # raw (not decoded) values have no fields, even when their text looks like JSON
    assert not flt({**row, "value_encoding": "utf8"})
    assert compile_filter("value.customer.name == null", RECORD_COLUMNS, fields)(
        {"value": "x", "value_encoding": "base64"})
    with pytest.raises(FilterError, match="need --schemas"):
        compile_filter("value.order_id == 7", RECORD_COLUMNS)
    with pytest.raises(FilterError, match="did you mean value.order_id"):
        compile_filter("value.orderid == 7", RECORD_COLUMNS, fields)
    with pytest.raises(FilterError, match="holds text"):
        compile_filter("key.customer == 7", RECORD_COLUMNS, fields)
    with pytest.raises(FilterError, match="only for key and value in the records table"):
        compile_filter("topic.x == 1", RECORD_COLUMNS, fields)
    # a registry: any path (kind any) beyond the cached schemas' fields
    assert compile_filter('value.other == "a"', RECORD_COLUMNS, {**fields, "*": "any"})(
        {"value": '{"other": "a"}', "value_encoding": "json_schema"})
