"""End to end on the project's real captures: `kwinspect exchanges|records|errors
--format jsonl|csv|parquet -o FILE` give the documented columns and the same rows,
and `--filter` keeps exactly the rows the same predicate picks in pandas."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from kwinspect.cli import main
from kwinspect.model import ERROR_COLUMNS, EXCHANGE_COLUMNS, RECORD_COLUMNS
from tests.export.rows import TEXT_COLUMNS, canonical_frame

CAPTURES = Path(__file__).resolve().parents[2] / "captures"
COLUMNS = {"exchanges": EXCHANGE_COLUMNS, "records": RECORD_COLUMNS, "errors": ERROR_COLUMNS}
PCAPS = ["confluent-mock-codecs.pcap", "confluent-mock-errors.pcap", "tansu-admin.pcap"]




@pytest.mark.parametrize("pcap", PCAPS)
@pytest.mark.parametrize("table", sorted(COLUMNS))
def test_cli_formats_agree_on_real_captures(tmp_path, pcap, table):
    path = CAPTURES / pcap
    if not path.exists():
        pytest.skip(f"{pcap} not in captures/")
    cols = list(COLUMNS[table])
    frames = {}
    for fmt in ("jsonl", "csv", "parquet"):
        out = tmp_path / f"{table}.{fmt}"
        assert main([table, str(path), "--format", fmt, "-o", str(out)]) == 0
        if fmt == "jsonl":
            frames[fmt] = pd.read_json(out, lines=True, dtype=False, precise_float=True) \
                if out.stat().st_size else pd.DataFrame(columns=cols)
        elif fmt == "csv":
            frames[fmt] = pd.read_csv(out, keep_default_na=False, na_values=[""],
                                      dtype={c: str for c in cols if c in TEXT_COLUMNS})
        else:
            frames[fmt] = pd.read_parquet(out)
    for fmt, df in frames.items():
        assert list(df.columns) == cols, fmt
    parquet = canonical_frame(frames["parquet"])
    assert canonical_frame(frames["jsonl"]) == parquet
    blank = [{c: (None if v == "" and c in TEXT_COLUMNS else v) for c, v in r.items()} for r in parquet]
    assert canonical_frame(frames["csv"]) == blank
    if table == "exchanges" or (table == "records" and "admin" not in pcap):
        assert len(parquet) > 0


def test_cli_filter_selects_the_rows_pandas_selects(tmp_path):
    path = CAPTURES / "confluent-mock-errors.pcap"
    if not path.exists():
        pytest.skip("capture missing")
    everything, some = tmp_path / "all.parquet", tmp_path / "some.parquet"
    assert main(["exchanges", str(path), "-o", str(everything)]) == 0
    expr = 'api == "Produce" or error_codes == 3 or (latency_ms > 0.05 and topic ~ "^errors")'
    assert main(["exchanges", str(path), "-o", str(some), "--filter", expr]) == 0
    df = pd.read_parquet(everything)
    lat = df["latency_ms"]
    mask = (
        (df["api_name"] == "Produce")
        | df["error_codes"].map(lambda a: 3 in list(a))
        | ((lat > 0.05) & df["topics"].map(lambda a: any(t.startswith("errors") for t in a)))
    )
    expected = df[mask]
    got = pd.read_parquet(some)
    assert 0 < len(got) < len(df)
    assert got["correlation_id"].tolist() == expected["correlation_id"].tolist()
    assert got["stream"].tolist() == expected["stream"].tolist()
