"""The `stats` table in Spark: the Parquet `kwinspect stats -o x.parquet` writes reads in
Spark with its documented types, and the pivot docs/columns.md shows gives pandas' numbers."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from kwinspect.analyze.stats import STATS_COLUMNS
from kwinspect.cli import main

# one worker holds the local Spark session (tests/spark/conftest.py) for every module
# that needs it: a second session start costs a JVM and its warm-up again
pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("spark-session")]

CAPTURE = Path(__file__).resolve().parents[2] / "captures" / "confluent-mock-produce-consume.pcap"


def test_spark_reads_the_stats_parquet_and_pivots_it(spark, tmp_path):
    from pyspark.sql import functions as F

    out = tmp_path / "stats.parquet"
    assert main(["stats", "-q", str(CAPTURE), "-i", "100ms", "-o", str(out)]) == 0
    df = spark.read.parquet(str(out))
    assert tuple(df.columns) == STATS_COLUMNS
    types = dict(df.dtypes)
    assert types["interval_start"] == "timestamp" and types["amount"] == "double"
    assert types["partition"] == "int" and types["le_ms"] == "double"
    wide = df.groupBy("interval_start").pivot("series").agg(F.sum("amount")).toPandas()
    pdf = pd.read_parquet(out)
    want = pdf.pivot_table(index="interval_start", columns="series", values="amount", aggfunc="sum")
    assert wide["requests"].sum() == want["requests"].sum() == 51  # summary's exchanges
    assert wide["produced_records"].sum() == want["produced_records"].sum() == 30  # the manifest's
