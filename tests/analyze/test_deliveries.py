"""`kwinspect deliveries` on the shipped captures, against what their clients logged.

The oracle is each capture's manifest (tests/helpers/deliveries_oracle.py): the
producers' delivery-report offsets and the consumers' receipts.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rig.manifest import Manifest
from tests.helpers.deliveries_oracle import (
    acknowledged,
    allowed_unlogged,
    check_against_manifest,
    check_no_unlogged_rows,
    check_scenario,
    deliveries_rows,
)

ROOT = Path(__file__).resolve().parents[2]
CAPTURES = ROOT / "captures"
MANIFESTS = sorted(CAPTURES.glob("*.manifest.json"))


def _load(name: str) -> tuple[Manifest, Path, list[str]]:
    m = Manifest.read(CAPTURES / f"{name}.manifest.json")
    pcap = CAPTURES / m.pcap
    keys = CAPTURES / f"{name}.keys"
    return m, pcap, (["--tls-keylog", str(keys)] if keys.exists() else [])


@pytest.mark.parametrize("manifest", MANIFESTS, ids=lambda p: p.name.removesuffix(".manifest.json"))
def test_every_logged_record_is_one_row_at_its_offset_and_every_receipt_a_fetch_of_it(capsys, manifest):
    m, pcap, extra = _load(manifest.name.removesuffix(".manifest.json"))
    rows = deliveries_rows(capsys, pcap, m.kafka_ports, *extra)
    check_against_manifest(rows, m)
    check_no_unlogged_rows(rows, m, allowed_unlogged(m))
    assert len(rows) >= len(acknowledged(m))


@pytest.mark.parametrize("name", ["deliveries-clean", "deliveries-retry-duplicate",
                                  "deliveries-crash-before-commit", "deliveries-unread-partition",
                                  "deliveries-consumer-seek"])
def test_shipped_deliveries_scenarios_give_their_findings(capsys, name):
    """The committed captures of rig/deliveries_scenarios.py, checked as the e2e test checks a fresh run."""
    m, pcap, _ = _load(name)
    rows = deliveries_rows(capsys, pcap, m.kafka_ports)
    check_scenario(m, rows, deliveries_rows(capsys, pcap, m.kafka_ports, "--problems"))


def test_times_fetched_and_commits_follow_the_consumer_group(capsys):
    m, pcap, _ = _load("confluent-mock-produce-consume")
    rows = deliveries_rows(capsys, pcap, m.kafka_ports)
    consumed = {(r.topic, r.partition, r.offset) for r in m.consumed}
    for row in rows:
        at = (row["topic"], row["partition"], row["offset"])
        assert row["times_fetched"] == (1 if at in consumed else 0)
        if row["times_fetched"]:
            assert row["fetch_groups"] == ["demo-group"]
            assert row["end_to_end_ms"] >= row["produce_to_ack_ms"] >= 0
            assert row["fetch_after_ms"] == [row["ack_to_first_fetch_ms"]]
        # a commit covers the record only with an offset above it, and never before it was read
        if row["commit_ts"] is not None:
            assert row["commit_offset"] > row["offset"] and row["commit_group"] == "demo-group"
            assert row["commit_ts"] >= row["first_fetch_ts"]
            assert row["committed_after_ms"] >= 0


def test_the_commits_are_the_ones_the_exchanges_table_shows(capsys):
    """The oracle for commit columns: the OffsetCommit exchanges of the same capture, decoded."""
    from kwinspect.cli import main

    m, pcap, _ = _load("kafka-python-mock-group")
    ports = ",".join(map(str, m.kafka_ports))
    assert main(["decode", "-q", str(pcap), "--kafka-ports", ports, "-f", 'api == "OffsetCommit"']) == 0
    commits = []
    for line in capsys.readouterr().out.splitlines():
        ex = json.loads(line)
        errors = {(t["name"], p["partition_index"]) for t in ex["response"]["body"]["topics"]
                  for p in t["partitions"] if p["error_code"]}
        for t in ex["request"]["body"]["topics"]:
            for p in t["partitions"]:
                if (t["name"], p["partition_index"]) not in errors:
                    commits.append((ex["response_ts"], t["name"], p["partition_index"], p["committed_offset"]))
    assert commits
    rows = deliveries_rows(capsys, pcap, m.kafka_ports)
    for row in rows:
        covering = sorted(c for c in commits if c[1:3] == (row["topic"], row["partition"]) and c[3] > row["offset"])
        if covering:
            assert (row["commit_ts"], row["commit_offset"]) == (covering[0][0], covering[0][3])
        else:
            assert row["commit_ts"] is None


def test_failed_attempts_are_counted_with_their_errors(capsys):
    """confluent-mock-errors: the mock answered two Produce requests with NOT_LEADER_OR_FOLLOWER then
    NOT_ENOUGH_REPLICAS (the manifest's expected errors); the producer's 5 records landed on the third."""
    m, pcap, _ = _load("confluent-mock-errors")
    expected = [e.error for e in m.expected_errors if e.api == "Produce"]
    assert expected == ["NOT_LEADER_OR_FOLLOWER", "NOT_ENOUGH_REPLICAS"]
    rows = deliveries_rows(capsys, pcap, m.kafka_ports)
    assert len(rows) == 5
    assert {(r["produce_attempts"], r["error"]) for r in rows} == {(3, ", ".join(expected))}


def test_formats_read_back_with_pandas_and_filter(capsys, tmp_path):
    import pandas as pd

    from kwinspect.cli import main

    m, pcap, _ = _load("confluent-mock-produce-consume")
    ports = ",".join(map(str, m.kafka_ports))
    rows = deliveries_rows(capsys, pcap, m.kafka_ports)
    for fmt in ("csv", "parquet"):
        out = tmp_path / f"d.{fmt}"
        assert main(["deliveries", "-q", str(pcap), "--kafka-ports", ports, "-o", str(out)]) == 0
        df = pd.read_csv(out) if fmt == "csv" else pd.read_parquet(out)
        assert list(df["offset"]) == [r["offset"] for r in rows]
        assert list(df["times_fetched"]) == [r["times_fetched"] for r in rows]
    df = pd.read_parquet(tmp_path / "d.parquet")
    assert str(df["ack_ts"].dtype) == "datetime64[us, UTC]"
    assert [list(x) for x in df["fetch_groups"]] == [r["fetch_groups"] for r in rows]
    unread = deliveries_rows(capsys, pcap, m.kafka_ports, "-f", "times_fetched == 0")
    assert unread == [r for r in rows if r["times_fetched"] == 0]


def test_max_records_truncates_and_says_so(capsys):
    from kwinspect.cli import main

    m, pcap, _ = _load("confluent-mock-produce-consume")
    ports = ",".join(map(str, m.kafka_ports))
    assert main(["deliveries", "-q", "-F", "jsonl", str(pcap), "--kafka-ports", ports, "--max-records", "7"]) == 0
    out, err = capsys.readouterr()
    assert len(out.splitlines()) == 7
    assert "truncated after 7 records: 23 more acknowledged records not tracked" in err
    with pytest.raises(SystemExit) as exit_:
        main(["deliveries", "-q", str(pcap), "--kafka-ports", ports, "--max-records", "0"])
    assert exit_.value.code == 2 and "--max-records must be at least 1" in capsys.readouterr().err


def test_values_hex_renders_keys_as_hex(capsys):
    m, pcap, _ = _load("confluent-mock-produce-consume")
    rows = deliveries_rows(capsys, pcap, m.kafka_ports, "--values", "hex")
    keys = {(r.topic, r.partition, r.offset): r.key for r in m.produced}
    for row in rows:
        want = keys[(row["topic"], row["partition"], row["offset"])]
        assert row["key"] == (None if want is None else want.encode().hex())
        assert row["key_encoding"] == (None if want is None else "hex")


def test_table_fits_80_columns_and_problems_need_a_text_format(capsys, monkeypatch):
    from kwinspect.cli import main

    monkeypatch.setenv("COLUMNS", "80")
    m, pcap, _ = _load("confluent-mock-produce-consume")
    ports = ",".join(map(str, m.kafka_ports))
    assert main(["deliveries", "-q", "-F", "table", str(pcap), "--kafka-ports", ports]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 + 30 and max(len(line) for line in lines) <= 80
    assert lines[0].split()[:3] == ["topic", "partition", "offset"]
    assert main(["deliveries", "-q", "--problems", "-F", "csv", str(pcap)]) == 2
    assert "--problems writes findings" in capsys.readouterr().err
