"""The Spark pipeline's tables equal the single-process exporters' output, row for row.

One pipeline run covers the corpus as one capture: every shipped capture,
one of them rotated into pieces in the middle of its long-lived connections
(and with a 25-minute pause, so idle flushing happens), one as .pcap.gz and
one as pcapng, with byte ranges small enough that the big pieces are split
into several read tasks.  The same packets go through `dissect_files` and
the Parquet exporter; rows are compared as multisets on the table columns
(Exchange.index, the global order, is not a column).
"""

from __future__ import annotations

import glob
import gzip
import os
import shutil
import subprocess
import sys
from collections import defaultdict

import dpkt
import pyarrow.parquet as pq
import pytest

from kwinspect.capture.packets import PacketParser
from kwinspect.capture.readers import open_capture
from kwinspect.spark.fragments import conn_key
from kwinspect.spark.pipeline import PipelineError, PipelineOptions, run_pipeline
from tests.spark.compare import compare, read_pipeline_table, single_process_tables

# one worker holds the local Spark session (tests/spark/conftest.py) for every module
# that needs it: a second session start costs a JVM and its warm-up again
pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("spark-session")]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CAPTURES = os.path.join(ROOT, "captures")
ROTATED = "netns-mtu1500-produce-consume.pcap"  # the most packets, connections open throughout
GZIPPED = "tansu-admin.pcap"
PCAPNG = "kafka-python-mock-group.pcap"
TRUNCATED = "tansu-errors.pcap"  # cut inside its last record: a reader issue row
PIECES = 4
PAUSE = 1500.0  # seconds added after the second piece: longer than the idle timeout
# rotated too: its producer, consumers and group coordinator talk on several connections,
# which the deliveries table joins across the pieces
ROTATED_DELIVERIES = "deliveries-crash-before-commit.pcap"
DELIVERY_PIECES = 3


def _packets(path):
    with open(path, "rb") as f:
        r = dpkt.pcap.Reader(f)
        return r.datalink(), r.snaplen, [(ts, bytes(buf)) for ts, buf in r]


def _write_pcap(path, linktype, snaplen, packets):
    with open(path, "wb") as f:
        w = dpkt.pcap.Writer(f, snaplen=snaplen, linktype=linktype)
        for ts, buf in packets:
            w.writepkt(buf, ts=ts)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """(pipeline input dir, the equivalent single-process file list, rotated piece paths)."""
    base = tmp_path_factory.mktemp("corpus")
    inputs, whole = base / "in", base / "whole"
    inputs.mkdir()
    whole.mkdir()
    names = sorted(os.path.basename(p) for p in glob.glob(os.path.join(CAPTURES, "*.pcap")))
    assert ROTATED in names and ROTATED_DELIVERIES in names and len(names) >= 10, names
    expected_paths = []
    pieces = []
    for name in names:
        src = os.path.join(CAPTURES, name)
        if name == ROTATED:
            linktype, snaplen, pkts = _packets(src)
            cut = [len(pkts) * i // PIECES for i in range(PIECES + 1)]
            pkts = [(ts + (PAUSE if i >= cut[2] else 0.0), buf) for i, (ts, buf) in enumerate(pkts)]
            _write_pcap(whole / name, linktype, snaplen, pkts)
            expected_paths.append(str(whole / name))
            for k in range(PIECES):
                piece = inputs / f"{name}.rot{k:02d}.pcap"
                _write_pcap(piece, linktype, snaplen, pkts[cut[k]:cut[k + 1]])
                pieces.append(str(piece))
        elif name == ROTATED_DELIVERIES:
            shutil.copy(src, whole / name)
            expected_paths.append(str(whole / name))
            linktype, snaplen, pkts = _packets(src)
            cut = [len(pkts) * i // DELIVERY_PIECES for i in range(DELIVERY_PIECES + 1)]
            for k in range(DELIVERY_PIECES):
                _write_pcap(inputs / f"{name}.rot{k:02d}.pcap", linktype, snaplen, pkts[cut[k]:cut[k + 1]])
        elif name == GZIPPED:
            dest = inputs / (name + ".gz")
            with open(src, "rb") as f, gzip.open(dest, "wb") as g:
                g.write(f.read())
            expected_paths.append(str(dest))
        elif name == PCAPNG:
            linktype, _snaplen, pkts = _packets(src)
            dest = inputs / (name + "ng")
            with open(dest, "wb") as f:
                w = dpkt.pcapng.Writer(f, snaplen=262144, linktype=linktype)
                for ts, buf in pkts:
                    w.writepkt(buf, ts=ts)
            expected_paths.append(str(dest))
        elif name == TRUNCATED:
            with open(src, "rb") as f:
                data = f.read()
            (inputs / name).write_bytes(data[:-37])
            expected_paths.append(str(inputs / name))
        else:
            shutil.copy(src, inputs / name)
            expected_paths.append(str(inputs / name))
    return str(inputs), sorted(expected_paths), pieces


@pytest.fixture(scope="module")
def expected(corpus, tmp_path_factory):
    _inputs, paths, _pieces = corpus
    return single_process_tables(paths, str(tmp_path_factory.mktemp("single")))


@pytest.fixture(scope="module")
def pipeline_out(spark, corpus, tmp_path_factory):
    inputs, _paths, _pieces = corpus
    out = str(tmp_path_factory.mktemp("pipe") / "out")
    result = run_pipeline(PipelineOptions(inputs=[inputs], output=out, records=True, deliveries=True,
                                          split_bytes=16 << 10, partitions=2), spark=spark)
    return out, result


def test_rotation_splits_long_lived_connections(corpus):
    """The test input really has connections spanning several files (else it proves little)."""
    _inputs, _paths, pieces = corpus
    seen = defaultdict(set)
    for k, piece in enumerate(pieces):
        parser = PacketParser()
        with open_capture(piece) as src:
            for raw in src:
                seg = parser.parse(raw)
                if seg is not None and seg.payload:
                    seen[conn_key(seg.src.ip, seg.src.port, seg.dst.ip, seg.dst.port)].add(k)
    assert max(len(v) for v in seen.values()) >= 3
    assert sum(1 for v in seen.values() if len(v) >= 2) >= 2


def test_reads_were_split_into_byte_ranges(pipeline_out, corpus):
    _out, result = pipeline_out
    assert result.tasks > result.files + 10  # the big pieces were read by several tasks each
    assert result.segments > 1000


@pytest.mark.parametrize("table", ["exchanges", "records", "errors"])
def test_tables_equal_single_process(pipeline_out, expected, table):
    out, _result = pipeline_out
    ok, message = compare(expected[table], out, table)
    assert ok, message


@pytest.fixture(scope="module")
def expected_stats(corpus, tmp_path_factory):
    """`kwinspect stats -i 1m -F parquet` of the same files read as one capture."""
    from kwinspect.cli import main

    _inputs, paths, _pieces = corpus
    path = str(tmp_path_factory.mktemp("single-stats") / "stats.parquet")
    assert main(["stats", *paths, "-i", "1m", "-F", "parquet", "-o", path]) == 0
    return path


def test_stats_equal_single_process(pipeline_out, expected_stats):
    """Per-minute stats across connections: percentiles of every connection's latencies,
    consumer lag from Fetches and commits on different connections, the newest gauge."""
    out, result = pipeline_out
    ok, message = compare(expected_stats, out, "stats")
    assert ok, message
    rows = pq.read_table(expected_stats).to_pylist()
    series = {r["series"] for r in rows}
    assert {"latency_p99_ms", "consumer_lag", "fetch_lag", "long_polls", "connections_opened"} <= series
    assert result.counts["stats"] == len(rows)
    # the minutes hold latencies of several connections (else no cross-connection percentile)
    assert any(r["series"] == "latency_count" and r["amount"] >= 20 for r in rows)


@pytest.fixture(scope="module")
def expected_deliveries(corpus, tmp_path_factory):
    """`kwinspect deliveries -F parquet` of the same files read as one capture."""
    from kwinspect.cli import main

    _inputs, paths, _pieces = corpus
    path = str(tmp_path_factory.mktemp("single-deliveries") / "deliveries.parquet")
    assert main(["deliveries", *paths, "-F", "parquet", "-o", path]) == 0
    return path


def test_deliveries_equal_single_process(pipeline_out, expected_deliveries):
    """Records acknowledged on one connection, fetched on others (twice, after the crash),
    committed on yet another, retried after errors, seen on both legs of a proxy."""
    out, result = pipeline_out
    ok, message = compare(expected_deliveries, out, "deliveries")
    assert ok, message
    rows = pq.read_table(expected_deliveries).to_pylist()
    assert result.counts["deliveries"] == len(rows) > 300
    assert any(r["error"] and r["produce_attempts"] > 1 for r in rows)  # failed attempts linked
    assert any(r["times_fetched"] >= 2 for r in rows)
    assert any(r["commit_ts"] is not None for r in rows) and any(r["commit_ts"] is None for r in rows)
    assert {"deliveries-crash-group", "deliveries-clean-group"} <= {g for r in rows for g in r["fetch_groups"]}


def test_corpus_exercises_the_hard_cases(expected):
    """Idle flushing and topic ids resolved from Metadata are in the compared rows."""
    errors = pq.read_table(expected["errors"]).to_pylist()
    exchanges = pq.read_table(expected["exchanges"]).to_pylist()
    assert any(e["kind"] == "response_missing" for e in errors)
    assert any(TRUNCATED in (e["message"] or "")
               and e["ts"] is None for e in errors)  # the reader issue of the cut file
    assert len(exchanges) > 400 and any(x["api_name"] == "Fetch" and x["topics"] for x in exchanges)


def test_summary_counts(pipeline_out, expected):
    out, result = pipeline_out
    for table in ("exchanges", "records", "errors"):
        assert result.counts[table] == pq.read_metadata(expected[table]).num_rows
    assert result.kafka_connections > 50
    text = "\n".join(result.lines())
    assert "exchanges" in text and out in text


def _nearest_rank(values, q):
    values = sorted(values)
    import math

    return values[max(1, math.ceil(q * len(values))) - 1]


def test_latency_aggregate_matches_exchanges(pipeline_out, expected):
    out, _result = pipeline_out
    groups = defaultdict(list)
    long_polls = defaultdict(int)
    for x in pq.read_table(expected["exchanges"]).to_pylist():
        if x["status"] == "paired" and x["latency_ms"] is not None:
            t = x["request_ts"] or x["response_ts"]
            key = (t.replace(second=0, microsecond=0), x["api_name"], x["broker"], x["client_id"])
            if x["long_poll"]:
                long_polls[key] += 1
                groups.setdefault(key, [])
            else:
                groups[key].append(x["latency_ms"])
    assert sum(long_polls.values()) > 0, "the corpus has long-polled Fetches"
    got = {}
    for path in glob.glob(os.path.join(out, "latency_by_minute", "*.parquet")):
        for r in pq.read_table(path).to_pylist():
            got[(r["minute"], r["api_name"], r["broker"], r["client_id"])] = r
    assert set(got) == set(groups)
    for key, values in groups.items():
        row = got[key]
        assert row["count"] == len(values)
        assert row["long_polls"] == long_polls[key]
        if not values:  # long polls only
            assert row["p50_ms"] is None and row["mean_ms"] is None
            continue
        assert row["p50_ms"] == _nearest_rank(values, 0.5)
        assert row["p99_ms"] == _nearest_rank(values, 0.99)
        assert row["max_ms"] == max(values)
        # to microseconds (Spark rounds half up on the decimal value, Python on the binary one)
        assert round(row["mean_ms"], 3) == row["mean_ms"]
        assert abs(row["mean_ms"] - sum(values) / len(values)) <= 0.0005 + 1e-9


def test_error_and_volume_aggregates(pipeline_out, expected):
    out, _result = pipeline_out
    counts = [r for p in glob.glob(os.path.join(out, "error_counts", "*.parquet"))
              for r in pq.read_table(p).to_pylist()]
    assert sum(r["count"] for r in counts) == pq.read_metadata(expected["errors"]).num_rows
    volume = [r for p in glob.glob(os.path.join(out, "topic_volume", "*.parquet"))
              for r in pq.read_table(p).to_pylist()]
    records = pq.read_table(expected["records"]).to_pylist()
    produced = sum(r["records"] for r in volume if r["direction"] == "produce")
    assert produced == sum(1 for r in records if r["direction"] == "produce")
    assert all(r["bytes"] > 0 for r in volume)


def test_tables_are_partitioned_by_date_and_api(pipeline_out):
    out, _result = pipeline_out
    dirs = os.listdir(os.path.join(out, "exchanges"))
    assert any(d.startswith("date=") for d in dirs)
    assert glob.glob(os.path.join(out, "exchanges", "date=*", "api=Fetch"))
    assert read_pipeline_table(out, "exchanges").num_rows > 0


def test_existing_output_needs_overwrite(spark, pipeline_out, corpus, tmp_path):
    out, _result = pipeline_out
    with pytest.raises(PipelineError, match="--overwrite"):
        run_pipeline(PipelineOptions(inputs=[corpus[0]], output=out), spark=spark)


def test_failed_run_leaves_no_table(spark, tmp_path):
    bad = tmp_path / "bad.pcap"
    bad.write_bytes(b"this is not a capture at all")
    out = tmp_path / "out"
    with pytest.raises(PipelineError, match="not a pcap or pcapng capture"):
        run_pipeline(PipelineOptions(inputs=[str(bad)], output=str(out)), spark=spark)
    assert sorted(os.listdir(tmp_path)) == ["bad.pcap"]  # no DIR, no temporary sibling left


def test_cli_overwrite_replaces_the_directory(spark, tmp_path):
    from kwinspect.cli import main

    out = tmp_path / "out"
    out.mkdir()
    (out / "stale.txt").write_text("from an earlier run")
    small = os.path.join(CAPTURES, "tansu-errors.pcap")
    assert main(["pipeline", small, "-o", str(out), "-q"]) == 1  # exists, no --overwrite
    assert (out / "stale.txt").exists()
    assert main(["pipeline", small, "-o", str(out), "--overwrite", "--master", "local[2]", "-q"]) == 0
    assert not (out / "stale.txt").exists()
    assert sorted(p for p in os.listdir(out) if not p.startswith((".", "_"))) == [
        "error_counts", "errors", "exchanges", "latency_by_minute", "stats", "topic_volume"]
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_missing_java_is_one_line(tmp_path):
    env = dict(os.environ, PATH="/nonexistent", JAVA_HOME="")
    proc = subprocess.run([sys.executable, "-m", "kwinspect.cli", "pipeline", os.path.join(CAPTURES, GZIPPED),
                           "-o", str(tmp_path / "o")], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.strip().count("\n") == 0 and "Java" in proc.stderr, proc.stderr
