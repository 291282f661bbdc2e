"""End-to-end: real brokers, real clients, tcpdump, then kwinspect vs. the ground truth.

Every scenario of kwinspect.testing.scenarios runs once per session (brokers are
session fixtures in tests/conftest.py); each check below is a separate test so
a failure names the scenario and the aspect (pairing, records, errors, ...).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime

import pytest

from kwinspect.testing import verify
from kwinspect.testing.scenarios import SCENARIOS

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("rig")]

NAMES = list(SCENARIOS)


def _report(problems: list[str]) -> str:
    shown = problems[:15]
    more = f"\n... and {len(problems) - 15} more" if len(problems) > 15 else ""
    return "\n".join(shown) + more


@pytest.mark.parametrize("name", NAMES)
def test_capture_is_complete(scenario_run, name):
    """tcpdump lost nothing and the manifest describes the run."""
    m, pcap, _d = scenario_run(name)
    assert os.path.getsize(pcap) > 24, "empty capture"
    stats = m.capture.get("stats", {})
    assert stats.get("dropped_by_kernel", 0) == 0, f"tcpdump dropped packets: {stats}"
    assert m.kafka_ports and m.broker.get("kind") in {"librdkafka-mock", "tansu"}
    assert m.clients, "no client recorded"
    if name.startswith("netns-"):
        assert m.capture.get("mtu") == 1500


@pytest.mark.parametrize("check", list(verify.CHECKS))
@pytest.mark.parametrize("name", NAMES)
def test_decode_matches_manifest(scenario_run, name, check):
    m, _pcap, d = scenario_run(name)
    problems = verify.CHECKS[check](m, d)
    assert not problems, f"{name}/{check}:\n{_report(problems)}"


@pytest.mark.parametrize("name", NAMES)
def test_tshark_oracle(scenario_run, name):
    """Wireshark finds the same requests kwinspect does, and the APIs the manifest expects."""
    if verify.tshark_path() is None:
        pytest.skip("tshark not installed")
    m, pcap, d = scenario_run(name)
    problems = verify.check_against_tshark(m, d, pcap)
    assert not problems, f"{name}/tshark:\n{_report(problems)}"


def test_mtu1500_segments_are_small(scenario_run):
    """The namespace variant really splits Kafka frames over many <=1500-byte packets."""
    import dpkt

    m, pcap, d = scenario_run("netns-mtu1500-produce-consume")
    sizes = []
    with open(pcap, "rb") as fh:
        for _ts, buf in dpkt.pcap.Reader(fh):
            sizes.append(len(buf))
    assert max(sizes) <= 1514
    big = [ex for ex in d.exchanges if (ex.request_size or 0) > 20000
           or (ex.response_size or 0) > 20000]
    assert big, "no Kafka frame larger than 20 KB, so nothing was split"


def _cli(*args: str) -> list[dict]:
    res = subprocess.run([sys.executable, "-m", "kwinspect.cli", *args], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    return [json.loads(line) for line in res.stdout.splitlines() if line.strip()]


def _ts_ms(value) -> int | None:
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return round(value * 1000)
    return round(datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp() * 1000)


def test_cli_records_exchanges_errors(scenario_run):
    """`kwinspect records|exchanges|errors --format jsonl` on a fresh demo-like capture."""
    m, pcap, _d = scenario_run("confluent-mock-produce-consume")
    ports = ",".join(str(p) for p in m.kafka_ports)
    rows = _cli("records", pcap, "--format", "jsonl", "--kafka-ports", ports)
    produced = {(r["topic"], r["partition"], r["offset"], r["key"], r["value"]): r
                for r in rows if r["direction"] == "produce"}
    fetched = {(r["topic"], r["partition"], r["offset"], r["key"], r["value"])
               for r in rows if r["direction"] == "fetch"}
    for t in m.produced:
        k = (t.topic, t.partition, t.offset, t.key, t.value)
        assert k in produced, f"record {k} missing from `kwinspect records`"
        row = produced[k]
        assert [(h["key"], h["value"]) for h in row["headers"]] == \
            [(h["key"], h["value"]) for h in t.headers]
        assert _ts_ms(row["timestamp"]) == t.timestamp_ms
    for t in m.consumed:
        assert (t.topic, t.partition, t.offset, t.key, t.value) in fetched
    exchanges = _cli("exchanges", pcap, "--format", "jsonl", "--kafka-ports", ports)
    apis = {e["api_name"] for e in exchanges}
    assert set(m.expected_apis) <= apis, sorted(set(m.expected_apis) - apis)
    errors = _cli("errors", pcap, "--format", "jsonl", "--kafka-ports", ports)
    names = {(e["api_name"], e["name"]) for e in errors if e["kind"] == "kafka_error"}
    for exp in m.expected_errors:
        assert (exp.api, exp.error) in names, f"{exp.api} {exp.error} not in `kwinspect errors`"
