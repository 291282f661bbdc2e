"""Property: for any rows, jsonl, csv and parquet read back by pandas agree."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kwinspect.export import write_rows
from kwinspect.model import EXCHANGE_COLUMNS, RECORD_COLUMNS, Exchange, RecordRow
from tests.export.rows import TEXT_COLUMNS, canonical_frame, canonical_model

# Any text but lone surrogates (those get a documented replacement, tested elsewhere).
text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)
maybe_text = st.none() | text
ts = st.none() | st.integers(0, 4_102_444_800_000_000).map(lambda us: us / 1e6)
i32 = st.integers(-(2**31), 2**31 - 1)

exchange = st.builds(
    Exchange,
    stream=text, client=text, broker=text,
    api_key=st.none() | st.integers(-1, 100), api_name=maybe_text,
    api_version=st.none() | st.integers(0, 20), correlation_id=st.none() | i32,
    client_id=maybe_text, request_ts=ts, response_ts=ts,
    # Realistic latencies; pandas' JSON parser cannot read subnormal doubles such as 5e-324.
    latency_ms=st.none() | st.just(0.0) | st.floats(1e-6, 1e7),
    request_size=st.none() | st.integers(0, 2**31), response_size=st.none() | st.integers(0, 2**31),
    status=st.sampled_from(["paired", "no_response_expected", "response_missing", "request_missing"]),
    error_codes=st.lists(st.integers(-1, 120), max_size=3),
    error_names=st.lists(text, max_size=3), topics=st.lists(text, max_size=3),
    throttle_time_ms=st.none() | i32,
)


def _exact(fmt: str) -> dict:
    """The round trip is of exact values: CSV without its formula guard (tested in test_csv_injection)."""
    return {"exact": True} if fmt == "csv" else {}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(exchange, min_size=1, max_size=5))
def test_three_formats_agree(rows):
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        for fmt in ("jsonl", "csv", "parquet"):
            write_rows(rows, "exchanges", fmt, d / f"x.{fmt}", **_exact(fmt))
        j = canonical_frame(pd.read_json(d / "x.jsonl", lines=True, dtype=False, precise_float=True))
        c = canonical_frame(pd.read_csv(d / "x.csv", keep_default_na=False, na_values=[""],
                                        dtype={k: str for k in EXCHANGE_COLUMNS if k in TEXT_COLUMNS}))
        p = canonical_frame(pd.read_parquet(d / "x.parquet"))
    expected = canonical_model(rows)
    assert j == expected
    assert p == expected
    # CSV cannot tell "" from null (documented); compare with that one difference.
    assert c == [{k: (None if v == "" else v) for k, v in r.items()} for r in expected]


header = st.fixed_dictionaries({
    "key": text, "value": maybe_text, "value_encoding": st.sampled_from(["utf8", "base64", None]),
})
record = st.builds(
    RecordRow,
    direction=st.sampled_from(["produce", "fetch"]), topic=maybe_text,
    # Up to 2**53: pandas reads an int column holding nulls as float64 (see
    # test_big_ints_are_exact for larger values read the exact way).
    partition=st.none() | i32, offset=st.none() | st.integers(-1, 2**53),
    timestamp=ts, timestamp_type=st.sampled_from(["create_time", "log_append_time", None]),
    key=maybe_text, key_encoding=st.sampled_from(["utf8", "base64", "hex", None]),
    value=maybe_text, value_encoding=st.sampled_from(["utf8", "base64", "hex", None]),
    headers=st.lists(header, max_size=3), compression=st.sampled_from(["none", "gzip", "zstd"]),
    magic=st.integers(0, 2), crc_ok=st.none() | st.booleans(),
    producer_id=st.none() | st.integers(-1, 2**53), producer_epoch=st.none() | st.integers(-1, 32767),
    sequence=st.none() | i32, is_transactional=st.booleans(), is_control=st.booleans(),
    control_type=st.sampled_from([None, "commit", "abort"]), correlation_id=st.none() | i32,
    stream=maybe_text,
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(record, min_size=1, max_size=5))
def test_three_formats_agree_on_records(rows):
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        for fmt in ("jsonl", "csv", "parquet"):
            write_rows(rows, "records", fmt, d / f"r.{fmt}", **_exact(fmt))
        j = canonical_frame(pd.read_json(d / "r.jsonl", lines=True, dtype=False, precise_float=True))
        c = canonical_frame(pd.read_csv(d / "r.csv", keep_default_na=False, na_values=[""],
                                        dtype={k: str for k in RECORD_COLUMNS if k in TEXT_COLUMNS}))
        p = canonical_frame(pd.read_parquet(d / "r.parquet"))
    expected = canonical_model(rows)
    assert j == expected
    assert p == expected
    assert c == [{k: (None if v == "" else v) for k, v in r.items()} for r in expected]


def test_big_ints_are_exact_when_read_the_exact_way(tmp_path):
    """Values above 2**53 survive: Parquet and CSV via pandas' nullable dtypes, jsonl via json."""
    import json

    big = 2**62 + 1
    rows = [RecordRow("produce", None, None, off, None, None, None, None, None, None, [], "none",
                      2, None, pid, None, None, False, False, None, None, None)
            for off, pid in ((None, None), (big, big - 2))]
    for fmt in ("jsonl", "csv", "parquet"):
        write_rows(rows, "records", fmt, tmp_path / f"b.{fmt}")
    p = pd.read_parquet(tmp_path / "b.parquet", dtype_backend="numpy_nullable")
    c = pd.read_csv(tmp_path / "b.csv", dtype_backend="numpy_nullable", keep_default_na=False,
                    na_values=[""])
    j = [json.loads(line) for line in (tmp_path / "b.jsonl").read_text().splitlines()]
    for df in (p, c):
        assert df["offset"][1] == big and df["producer_id"][1] == big - 2
        assert df["offset"].isna()[0]
    assert j[1]["offset"] == big and j[1]["producer_id"] == big - 2
