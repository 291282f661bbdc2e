"""`kwinspect pipeline --tls-keylog FILE` (issue #19): the key material reaches the
executors (the config, with its key log, is broadcast), and so do the secrets of a
pcapng's Decryption Secrets Blocks (read by the stage-1 readers, merged on the driver);
the tables equal the single-process exporters' on the shipped TLS captures."""

from __future__ import annotations

import os
import shutil

import pyarrow.parquet as pq
import pytest

from kwinspect import cli
from kwinspect.spark.pipeline import PipelineOptions, run_pipeline
from tests.spark.compare import compare, single_process_tables

# one worker holds the local Spark session (tests/spark/conftest.py) for every module
# that needs it: a second session start costs a JVM and its warm-up again
pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("spark-session")]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CAPTURES = os.path.join(ROOT, "captures")
KEYED = ["tansu-tls12-keylog", "tansu-tls13-keylog"]


def _config(keys: list[str]):
    """The DissectConfig `kwinspect pipeline --tls-keylog K ...` builds."""
    argv = ["pipeline", "-o", "unused"]
    for k in keys:
        argv += ["--tls-keylog", k]
    args = cli.build_parser().parse_args([*argv, "in.pcap"])
    return cli._config(args)  # noqa: SLF001 - the CLI's own wiring


@pytest.fixture(scope="module")
def tls_inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("tlsin")
    for name in KEYED:
        shutil.copy(os.path.join(CAPTURES, f"{name}.pcap"), d / f"{name}.pcap")
    keys = tmp_path_factory.mktemp("keys") / "all.keys"
    keys.write_text("".join(open(os.path.join(CAPTURES, f"{n}.keys")).read() for n in KEYED))
    return str(d), sorted(str(p) for p in d.iterdir()), str(keys)


@pytest.fixture(scope="module")
def keylog_run(spark, tls_inputs, tmp_path_factory):
    """One pipeline run over both keyed captures, and the single-process tables (the three
    comparisons below share them: a Spark run costs far more than a comparison)."""
    inputs, paths, keys = tls_inputs
    config = _config([keys])
    base = tmp_path_factory.mktemp("keylog")
    expected = single_process_tables(paths, str(base / "single"), config)
    out = str(base / "out")
    result = run_pipeline(PipelineOptions(inputs=[inputs], output=out, records=True, stats=False, config=config,
                                          split_bytes=8 << 10, partitions=2), spark=spark)
    return expected, out, result


@pytest.mark.parametrize("table", ["exchanges", "records", "errors"])
def test_keylog_tables_equal_single_process(keylog_run, table):
    expected, out, result = keylog_run
    ok, message = compare(expected[table], out, table)
    assert ok, message
    if table == "exchanges":  # decrypted: Kafka from inside TLS, not tls_stream rows
        names = {r["api_name"] for r in pq.read_table(expected["exchanges"]).to_pylist()}
        assert {"Produce", "Fetch"} <= names
        assert result.counts["exchanges"] == pq.read_metadata(expected["exchanges"]).num_rows
    if table == "errors":
        kinds = {r["kind"] for r in pq.read_table(expected["errors"]).to_pylist()}
        assert "tls_decrypted" in kinds and "tls_stream" not in kinds


def test_decryption_secrets_block_reaches_the_executors(spark, tmp_path):
    """tansu-tls13-dsb.pcap carries its key log inside (no --tls-keylog)."""
    d = tmp_path / "in"
    d.mkdir()
    shutil.copy(os.path.join(CAPTURES, "tansu-tls13-dsb.pcap"), d / "tansu-tls13-dsb.pcap")
    paths = [str(d / "tansu-tls13-dsb.pcap")]
    expected = single_process_tables(paths, str(tmp_path / "single"))
    out = str(tmp_path / "out")
    run_pipeline(PipelineOptions(inputs=[str(d)], output=out, records=True, stats=False, partitions=2), spark=spark)
    for table in ("exchanges", "records", "errors"):
        ok, message = compare(expected[table], out, table)
        assert ok, (table, message)
    names = {r["api_name"] for r in pq.read_table(expected["exchanges"]).to_pylist()}
    assert {"Produce", "Fetch"} <= names
    # no secret of the key log in the written tables
    secrets = [ln.split()[2] for ln in open(os.path.join(CAPTURES, "tansu-tls13-keylog.keys"))
               if ln.strip() and not ln.startswith("#")]
    for root, _dirs, files in os.walk(out):
        for f in files:
            data = open(os.path.join(root, f), "rb").read()
            assert all(bytes.fromhex(s) not in data and s.encode() not in data for s in secrets)
