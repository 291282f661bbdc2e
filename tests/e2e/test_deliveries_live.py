"""`kwinspect deliveries` on fresh rig captures, against the clients' own logs.

Each scenario of rig.deliveries_scenarios runs once (real brokers, real
confluent-kafka clients, tcpdump on lo); its manifest holds what the producers'
delivery reports said and what each consumer received. Every logged record must be
one row at the logged offset, every receipt a fetch of that row by that consumer,
and the duplicate, double-fetch and unread-partition scenarios must be findings
naming the offsets the logs imply.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict

import pytest

from rig.deliveries_scenarios import SCENARIOS, unavailable_reason
from tests.helpers.deliveries_oracle import check_against_manifest, check_no_unlogged_rows

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("rig")]

_RUNS: dict = {}


@pytest.fixture
def run(rig, tmp_path_factory):
    def get(name: str):
        why = unavailable_reason(name)
        if why:
            pytest.skip(why)
        if name not in _RUNS:
            workdir = str(tmp_path_factory.mktemp("deliveries"))
            m = SCENARIOS[name](rig, workdir)
            _RUNS[name] = (m, os.path.join(workdir, m.pcap))
        return _RUNS[name]
    return get


def _deliveries(capsys, pcap: str, ports: list[int], *extra: str) -> list[dict]:
    from kwinspect.cli import main

    assert main(["deliveries", "-q", "-F", "jsonl", pcap, "--kafka-ports", ",".join(map(str, ports)), *extra]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def _problems(capsys, pcap: str, ports: list[int]) -> list[dict]:
    return _deliveries(capsys, pcap, ports, "--problems")


def _originals(m) -> dict[int, int]:
    """Offset the producer logged -> the offset where a consumer received the same record first."""
    logged = {(r.partition, r.offset) for r in m.produced}
    first: dict[tuple, int] = {}
    for r in m.consumed:
        if (r.partition, r.offset) not in logged:
            first.setdefault((r.partition, r.key, r.key_encoding, r.value, r.value_encoding), r.offset)
    return {r.offset: first[k] for r in m.produced
            if (k := (r.partition, r.key, r.key_encoding, r.value, r.value_encoding)) in first}


def test_clean_run_every_record_once_fetched_once_and_committed(run, capsys):
    m, pcap = run("deliveries-clean")
    rows = _deliveries(capsys, pcap, m.kafka_ports)
    check_against_manifest(rows, m)
    check_no_unlogged_rows(rows, m)
    assert len(rows) == len(m.produced) == len(m.consumed)
    group = m.group_ids[0]
    for row in rows:
        assert (row["times_fetched"], row["fetch_groups"], row["commit_group"]) == (1, [group], group)
    assert _problems(capsys, pcap, m.kafka_ports) == []


def test_lost_produce_response_is_a_retry_duplicate_naming_both_offsets(run, capsys):
    m, pcap = run("deliveries-retry-duplicate")
    assert m.admin[0]["dropped"], "the proxy lost no response"
    originals = _originals(m)
    assert originals, "the consumer received no record twice: the broker did not write the retry twice"
    rows = _deliveries(capsys, pcap, m.kafka_ports)
    check_against_manifest(rows, m)
    check_no_unlogged_rows(rows, m, allowed={(m.topics[0]["name"], 0, o) for o in originals.values()})
    (f,) = [f for f in _problems(capsys, pcap, m.kafka_ports) if f["kind"] == "retry_duplicate"]
    assert f["severity"] == "warning" and f["key"]["client_id"] == "retry-producer"
    assert {d["offset"]: d["original_offset"] for d in f["key"]["duplicates"]} == originals
    # the evidence: the Produce the proxy lost the answer to, and the retry
    assert len(f["evidence"]) == 2 and {e["api_name"] for e in f["evidence"]} == {"Produce"}


def test_consumer_killed_before_commit_makes_its_group_fetch_twice(run, capsys):
    m, pcap = run("deliveries-crash-before-commit")
    rows = _deliveries(capsys, pcap, m.kafka_ports)
    check_against_manifest(rows, m)
    check_no_unlogged_rows(rows, m)
    by_client = defaultdict(set)
    for r in m.consumed:
        by_client[r.client_id].add(r.offset)
    twice = sorted(by_client["crash-consumer"] & by_client["survivor-consumer"])
    assert len(twice) == 10
    group = m.group_ids[0]
    (f,) = [f for f in _problems(capsys, pcap, m.kafka_ports) if f["kind"] == "fetched_twice"]
    assert (f["key"]["group_id"], f["key"]["offsets"]) == (group, twice)
    assert f["key"]["client_ids"] == ["crash-consumer", "survivor-consumer"]
    assert "No OffsetCommit in the capture covered them before the repeat" in f["detail"]
    for row in rows:
        assert row["fetch_clients"] == ["crash-consumer", "survivor-consumer"]
        assert row["commit_group"] == group and row["commit_ts"] > row["first_fetch_ts"]


def test_partition_nobody_reads_is_reported_with_its_offsets(run, capsys):
    m, pcap = run("deliveries-unread-partition")
    rows = _deliveries(capsys, pcap, m.kafka_ports)
    check_against_manifest(rows, m)
    check_no_unlogged_rows(rows, m)
    unread = sorted(r.offset for r in m.produced if r.partition == 1)
    assert [r["offset"] for r in rows if r["times_fetched"] == 0] == unread
    problems = _problems(capsys, pcap, m.kafka_ports)
    assert [(f["kind"], f["key"]["partition"], f["key"]["offsets"]) for f in problems] == [
        ("record_not_fetched", 1, unread)]
