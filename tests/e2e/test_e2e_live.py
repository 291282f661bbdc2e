"""End-to-end: real brokers, real clients, tcpdump, then kwinspect vs. the ground truth.

Every scenario of rig.scenarios runs once per session (brokers are
session fixtures in tests/conftest.py) and is checked by rig.verify
(pairing, records, offsets, timestamps, codecs, producer state, errors, latency,
anomalies), by tshark as an independent oracle, and for the demo scenario through
the CLI's jsonl output.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime

import pytest

from rig import verify
from rig.scenarios import SCENARIOS

# xdist_group keeps these on one worker where pytest-xdist can group (its loadgroup
# does not with pytest >= 9, which changed how node ids are stored), so every
# scenario is one test item that runs every check: a scenario never runs twice,
# whichever worker gets it, and the failure message lists every failing check.
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("rig")]

NAMES = list(SCENARIOS)


def _capture_problems(m, pcap) -> list[str]:
    problems = []
    if os.path.getsize(pcap) <= 24:
        problems.append("empty capture")
    stats = m.capture.get("stats", {})
    if stats.get("dropped_by_kernel", 0):
        problems.append(f"tcpdump dropped packets: {stats}")
    if not m.kafka_ports or m.broker.get("kind") not in {"librdkafka-mock", "tansu"}:
        problems.append(f"manifest lacks ports or broker kind: {m.broker}")
    if not m.clients:
        problems.append("no client recorded in the manifest")
    return problems


def _mtu_problems(m, pcap, d) -> list[str]:
    """The namespace variant really splits Kafka frames over many <=1500-byte packets."""
    import dpkt

    problems = []
    if m.capture.get("mtu") != 1500:
        problems.append(f"capture MTU is {m.capture.get('mtu')}, not 1500")
    with open(pcap, "rb") as fh:
        biggest = max(len(buf) for _ts, buf in dpkt.pcap.Reader(fh))
    if biggest > 1514:
        problems.append(f"a {biggest}-byte packet in a 1500-MTU capture")
    if not any((ex.request_size or 0) > 20000 or (ex.response_size or 0) > 20000
               for ex in d.exchanges):
        problems.append("no Kafka frame larger than 20 KB, so nothing was split")
    return problems


@pytest.mark.parametrize("name", NAMES)
def test_scenario(scenario_run, name):
    """Run the scenario with real brokers and clients; kwinspect's decode must match."""
    m, pcap, d = scenario_run(name)
    report: dict[str, list[str]] = {"capture": _capture_problems(m, pcap)}
    for check, fn in verify.CHECKS.items():
        report[check] = fn(m, d)
    if verify.tshark_path() is not None:
        report["tshark"] = verify.check_against_tshark(m, d, pcap)
    if name.startswith("netns-"):
        report["mtu"] = _mtu_problems(m, pcap, d)
    if name == "confluent-mock-produce-consume":
        report["cli"] = _cli_problems(m, pcap)
    failed = {k: v for k, v in report.items() if v}
    assert not failed, f"{name}: checks failed: {', '.join(failed)}\n" + "\n".join(
        f"[{k}] {line}" for k, v in failed.items() for line in v[:10])


def _cli(*args: str) -> list[dict]:
    res = subprocess.run([sys.executable, "-m", "kwinspect.cli", *args], capture_output=True,
                         text=True, timeout=120)
    if res.returncode != 0:
        raise AssertionError(f"kwinspect {' '.join(args)} exited {res.returncode}: "
                             f"{res.stderr[-2000:]}")
    return [json.loads(line) for line in res.stdout.splitlines() if line.strip()]


def _ts_ms(value) -> int | None:
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return round(value * 1000)
    return round(datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp() * 1000)


def _cli_problems(m, pcap) -> list[str]:
    """`kwinspect records|exchanges|errors --format jsonl` agree with the manifest."""
    problems: list[str] = []
    ports = ",".join(str(p) for p in m.kafka_ports)
    rows = _cli("records", pcap, "--format", "jsonl", "--kafka-ports", ports)
    produced = {(r["topic"], r["partition"], r["offset"], r["key"], r["value"]): r
                for r in rows if r["direction"] == "produce"}
    fetched = {(r["topic"], r["partition"], r["offset"], r["key"], r["value"])
               for r in rows if r["direction"] == "fetch"}
    for t in m.produced:
        k = (t.topic, t.partition, t.offset, t.key, t.value)
        row = produced.get(k)
        if row is None:
            problems.append(f"record {k} missing from `kwinspect records`")
            continue
        if [(h["key"], h["value"]) for h in row["headers"]] != \
                [(h["key"], h["value"]) for h in t.headers]:
            problems.append(f"record {k}: headers {row['headers']} != {t.headers}")
        if _ts_ms(row["timestamp"]) != t.timestamp_ms:
            problems.append(f"record {k}: timestamp {row['timestamp']} != {t.timestamp_ms} ms")
    for t in m.consumed:
        if (t.topic, t.partition, t.offset, t.key, t.value) not in fetched:
            problems.append(f"consumed record {t.topic}[{t.partition}]@{t.offset} missing "
                            "from `kwinspect records`")
    exchanges = _cli("exchanges", pcap, "--format", "jsonl", "--kafka-ports", ports)
    missing = set(m.expected_apis) - {e["api_name"] for e in exchanges}
    if missing:
        problems.append(f"`kwinspect exchanges` lacks {sorted(missing)}")
    errors = _cli("errors", pcap, "--format", "jsonl", "--kafka-ports", ports)
    names = {(e["api_name"], e["name"]) for e in errors if e["kind"] == "kafka_error"}
    for exp in m.expected_errors:
        if (exp.api, exp.error) not in names:
            problems.append(f"{exp.api} {exp.error} not in `kwinspect errors`")
    return problems
