"""`kwinspect live --metrics` against a real broker on loopback, with a real producer.

The endpoint is scraped with plain HTTP GETs while the capture runs and parsed with
prometheus_client's own text parser. Oracles: `kwinspect summary -F json` of the pcap
the same run wrote with -w, and the producer's delivery reports (rig manifest).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections import Counter

import pytest
from live.test_live_capture import LiveProc, needs_capture

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("live")]
pytest.importorskip("prometheus_client")

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

PY = sys.executable


def _scrape(url: str) -> dict[str, list]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.status == 200
        text = resp.read().decode("utf-8")
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def _totals(metrics: dict[str, list], family: str, label: str) -> dict[str, float]:
    out: Counter = Counter()
    for s in metrics.get(family, ()):
        if s.name == family + "_total":
            out[s.labels[label]] += s.value
    return dict(out)


def _url(proc: LiveProc, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = re.search(r"metrics on (http://\S+/metrics)", proc.stderr())
        if m:
            return m.group(1)
        if proc.proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.proc.kill()
    raise AssertionError(f"no metrics endpoint: {proc.stderr()[-2000:]}")


def _settled(url: str, timeout: float = 20.0) -> dict[str, list]:
    """Scrape until the request counts stop moving (the producer has closed its connections)."""
    last, stable_since = None, time.monotonic()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = _scrape(url)
        now = (_totals(m, "kwinspect_requests", "api"), _totals(m, "kwinspect_connections_closed", "broker"))
        if now != last:
            last, stable_since = now, time.monotonic()
        elif time.monotonic() - stable_since > 1.5:
            return m
        time.sleep(0.25)
    raise AssertionError("the metrics never settled")


@needs_capture
def test_scrapes_grow_during_the_run_and_end_at_the_summary(tmp_path):
    from rig.manifest import Manifest
    from rig.mock_cluster import MockCluster
    from rig.scenarios import ck_produce, standard_items

    work = str(tmp_path)
    pcap = os.path.join(work, "m.pcap")
    with MockCluster(3) as mc:
        ports = ",".join(str(p) for p in mc.ports)
        topic = "metrics-orders"
        mc.create_topic(topic, 3, 1)
        live = LiveProc(work, "m", "-i", "lo", "--kafka-ports", ports, "--metrics", "127.0.0.1:0", "-w", pcap)
        try:
            live.wait_listening()
            url = _url(live)
            m = Manifest(scenario="live-metrics", description="kwinspect live --metrics test")
            ck_produce(m, mc.bootstrap_servers, "metrics-producer-1", standard_items(topic, 30, size=200))
            first = _scrape(url)
            ck_produce(m, mc.bootstrap_servers, "metrics-producer-2", standard_items(topic, 30, size=200))
            second = _scrape(url)
            final = _settled(url)
        finally:
            rc = live.interrupt()
    assert rc == 0, live.stderr()[-2000:]
    produce_1 = _totals(first, "kwinspect_requests", "api").get("Produce", 0)
    produce_2 = _totals(second, "kwinspect_requests", "api").get("Produce", 0)
    assert 0 < produce_1 < produce_2, (produce_1, produce_2)

    res = subprocess.run([PY, "-m", "kwinspect.cli", "summary", "-q", "-F", "json", pcap, "--kafka-ports", ports],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["exchanges"] > 0
    assert _totals(final, "kwinspect_requests", "api") == {a["api"]: a["count"] for a in summary["apis"]}
    assert _totals(final, "kwinspect_requests", "broker") == \
        {b["address"]: b["requests"] for b in summary["brokers"] if b["requests"]}
    assert _totals(final, "kwinspect_request_errors", "api") == \
        {a["api"]: a["errors"] for a in summary["apis"] if a["errors"]}
    # every connection started after the capture did: each was opened (and closed) in the scrape
    opened = _totals(final, "kwinspect_connections_opened", "broker")
    assert opened == {b["address"]: b["connections"] for b in summary["brokers"] if b["connections"]}
    assert _totals(final, "kwinspect_connections_closed", "broker") == opened
    counts = Counter()
    for s in final["kwinspect_request_duration_seconds"]:
        if s.name.endswith("_count"):
            counts[s.labels["api"]] += s.value
    assert dict(counts) == {a["api"]: a["latency_count"] for a in summary["apis"] if a["latency_count"]}
    # the producers' own delivery reports, per partition
    produced = Counter()
    for s in final["kwinspect_produced_records"]:
        if s.name.endswith("_total"):
            produced[(s.labels["topic"], int(s.labels["partition"]))] += s.value
    assert dict(produced) == dict(Counter((r.topic, r.partition) for r in m.produced if r.delivery_error is None))
    assert len(m.produced) == 60
    # the kernel's drop counter, the same the stderr summary reports
    dropped = [s.value for s in final["kwinspect_capture_dropped_packets"] if s.name.endswith("_total")]
    line = next(x for x in live.stderr().splitlines() if "dropped by kernel" in x)
    assert dropped == [float(re.search(r"([\d,]+) dropped by kernel", line).group(1).replace(",", ""))]
    # --metrics without -F/-o: no rows
    assert os.path.getsize(live.out) == 0
