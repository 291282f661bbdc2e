"""The Prometheus endpoint of `kwinspect live --metrics`, fed offline from captures (the live
path is tests/live/test_live_metrics.py): scraped over HTTP and parsed with
prometheus_client's own text parser, its totals equal `kwinspect summary -F json` and the
rig's manifests; and a crafted capture of many topics and client ids keeps the label
sets capped without losing a count."""

from __future__ import annotations

import datetime as dt
import json
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("prometheus_client")

from helpers.pcapgen import conversation, write_pcap  # noqa: E402
from kafka.record.default_records import DefaultRecordBatchBuilder  # noqa: E402
from kio.schema.errors import ErrorCode  # noqa: E402
from kio.schema.produce.v9 import request as p_req  # noqa: E402
from kio.schema.produce.v9 import response as p_resp  # noqa: E402
from kio.static.primitive import i16, i32, i32Timedelta, i64  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from stream.kio_frames import request_frame, response_frame  # noqa: E402

from kwinspect.cli import main  # noqa: E402
from kwinspect.dissect import DissectConfig  # noqa: E402
from kwinspect.export.metrics import MetricsExporter, parse_listen  # noqa: E402
from kwinspect.run.files import FileRun, dissect_files  # noqa: E402

CAPTURES = Path(__file__).resolve().parents[2] / "captures"


def _scrape(exporter: MetricsExporter, openmetrics: bool = False) -> dict[str, list]:
    host, port = exporter.address
    req = urllib.request.Request(f"http://{host}:{port}/metrics")
    if openmetrics:
        req.add_header("Accept", "application/openmetrics-text; version=1.0.0")
    with urllib.request.urlopen(req, timeout=10) as resp:
        text = resp.read().decode("utf-8")
        ctype = resp.headers.get("Content-Type", "")
    if openmetrics:
        assert ctype.startswith("application/openmetrics-text"), ctype
        from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_parse

        return {f.name: f.samples for f in om_parse(text)}
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def _feed(pcap: Path, exporter: MetricsExporter, ports: list[int]) -> None:
    run = FileRun(on_close=exporter.add_connection)
    config = DissectConfig(kafka_ports=frozenset(ports) | {9092})
    for ev in dissect_files([pcap], config, run=run):
        exporter.add(ev, run.dissector.shared.topic_names)


def _by(samples: list, name: str, label: str) -> dict:
    out: Counter = Counter()
    for s in samples:
        if s.name == name:
            out[s.labels[label]] += s.value
    return dict(out)


@pytest.fixture
def exporter():
    e = MetricsExporter(kafka_ports=frozenset())
    e.serve("127.0.0.1", 0)
    yield e
    e.close()


@pytest.mark.parametrize("pcap", ["confluent-mock-produce-consume.pcap", "confluent-mock-errors.pcap",
                                  "confluent-mock-broker-down.pcap", "tansu-consumer-group.pcap"])
def test_scrape_equals_summary_and_manifest(pcap, capsys, exporter):
    path = CAPTURES / pcap
    manifest = json.loads(path.with_suffix(".manifest.json").read_text())
    ports = manifest["kafka_ports"]
    _feed(path, exporter, ports)
    capsys.readouterr()
    assert main(["summary", "-q", "-F", "json", str(path), "--kafka-ports", ",".join(map(str, ports))]) == 0
    summary = json.loads(capsys.readouterr().out)
    m = _scrape(exporter)
    requests = m["kwinspect_requests"]
    assert _by(requests, "kwinspect_requests_total", "api") == {a["api"]: a["count"] for a in summary["apis"]}
    assert _by(requests, "kwinspect_requests_total", "broker") == \
        {b["address"]: b["requests"] for b in summary["brokers"] if b["requests"]}
    errors = _by(m["kwinspect_request_errors"], "kwinspect_request_errors_total", "api")
    assert errors == {a["api"]: a["errors"] for a in summary["apis"] if a["errors"]}
    hist = m["kwinspect_request_duration_seconds"]
    assert _by(hist, "kwinspect_request_duration_seconds_count", "api") == \
        {a["api"]: a["latency_count"] for a in summary["apis"] if a["latency_count"]}
    bounds = sorted({s.labels["le"] for s in hist if s.name.endswith("_bucket")}, key=float)
    assert bounds[:3] == ["0.0001", "0.00025", "0.0005"] and bounds[-2:] == ["10.0", "+Inf"]
    want = Counter((r["topic"], str(r["partition"])) for r in manifest["produced"] if not r.get("delivery_error"))
    got: Counter = Counter()
    for s in m["kwinspect_produced_records"]:
        if s.name == "kwinspect_produced_records_total":
            got[(s.labels["topic"], s.labels["partition"])] += s.value
    if "errors" not in pcap:  # (the errors scenario's producer retries: the wire has more)
        assert dict(got) == dict(want)
    assert sum(got.values()) == sum(t["produce_records"] for t in summary["topics"])
    # base units: the produced bytes are the summary's topic bytes (with the fetched ones)
    produced = sum(s.value for s in m["kwinspect_produced_bytes"] if s.name.endswith("_total"))
    fetched = sum(s.value for s in m["kwinspect_fetched_bytes"] if s.name.endswith("_total"))
    assert produced + fetched == sum(t["bytes"] for t in summary["topics"])
    assert not [n for n in m if n.endswith("_created")]


def test_openmetrics_scrape_and_capture_counters(capsys):
    counts = {"packets": 123, "dropped_packets": 4, "received_packets": 130}
    e = MetricsExporter(capture=lambda: counts)
    e.serve("127.0.0.1", 0)
    try:
        path = CAPTURES / "confluent-mock-broker-down.pcap"
        _feed(path, e, json.loads(path.with_suffix(".manifest.json").read_text())["kafka_ports"])
        m = _scrape(e, openmetrics=True)
        assert [s.value for s in m["kwinspect_capture_dropped_packets"]
                if s.name == "kwinspect_capture_dropped_packets_total"] == [4]
        counts["dropped_packets"] = 9  # read at each scrape
        m = _scrape(e, openmetrics=True)
        assert [s.value for s in m["kwinspect_capture_dropped_packets"]
                if s.name == "kwinspect_capture_dropped_packets_total"] == [9]
        refused = [s for s in m["kwinspect_connections_refused"] if s.name.endswith("_total")]
        assert refused and all(s.value >= 1 for s in refused)
    finally:
        e.close()


def _many_topics_capture(path: Path, n: int) -> None:
    """One connection, n Produce requests (kio + kafka-python encoders), each to its own topic
    and with its own client id, 2 records each."""
    msgs = []
    for i in range(n):
        b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                      producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
        b.append(0, timestamp=1_700_000_000_000, key=None, value=b"v", headers=[])
        b.append(1, timestamp=1_700_000_000_000, key=None, value=b"w", headers=[])
        topic = f"topic-{i:04d}"
        req = p_req.ProduceRequest(
            transactional_id=None, acks=i16(-1), timeout=i32Timedelta.parse(dt.timedelta(seconds=1)),
            topic_data=(p_req.TopicProduceData(name=topic, partition_data=(
                p_req.PartitionProduceData(index=i32(i % 7), records=bytes(b.build())),)),))
        resp = p_resp.ProduceResponse(
            responses=(p_resp.TopicProduceResponse(name=topic, partition_responses=(
                p_resp.PartitionProduceResponse(index=i32(i % 7), error_code=ErrorCode(0), base_offset=i64(0),
                                                log_append_time=None, log_start_offset=i64(0),
                                                record_errors=(), error_message=None),)),),
            throttle_time=i32Timedelta.parse(dt.timedelta(0)))
        for who, frame in (("c", request_frame(req, i, client_id=f"client-{i}")), ("s", response_frame(resp, i))):
            msgs.append((who, len(frame).to_bytes(4, "big") + frame))
    write_pcap(path, conversation(("10.0.0.1", 40000), ("10.0.0.2", 9092), msgs, ts0=1_700_000_000.0))


def test_many_topics_stay_capped_and_nothing_is_lost(tmp_path):
    n, cap = 400, 25
    path = tmp_path / "many-topics.pcap"
    _many_topics_capture(path, n)
    e = MetricsExporter(label_cap=cap)
    e.serve("127.0.0.1", 0)
    try:
        _feed(path, e, [9092])
        m = _scrape(e)
    finally:
        e.close()
    produced = [s for s in m["kwinspect_produced_records"] if s.name.endswith("_total")]
    topics = {s.labels["topic"] for s in produced}
    assert len(topics) == cap + 1 and "(other)" in topics
    assert sum(s.value for s in produced) == 2 * n  # folded into (other), not dropped
    requests = [s for s in m["kwinspect_requests"] if s.name.endswith("_total")]
    clients = {s.labels["client_id"] for s in requests}
    assert len(clients) == cap + 1 and "(other)" in clients
    assert sum(s.value for s in requests) == n


def test_series_per_metric_are_capped_too(tmp_path):
    """Per-label caps multiply (topic x partition); the cap on label sets per metric holds."""
    path = tmp_path / "many-topics.pcap"
    _many_topics_capture(path, 120)
    e = MetricsExporter(label_cap=1000, max_series=30)
    e.serve("127.0.0.1", 0)
    try:
        _feed(path, e, [9092])
        m = _scrape(e)
    finally:
        e.close()
    produced = [s for s in m["kwinspect_produced_records"] if s.name.endswith("_total")]
    assert len(produced) == 31
    assert sum(s.value for s in produced) == 240
    assert {"topic": "(other)", "partition": "(other)"} in [s.labels for s in produced]


def test_stats_table_caps_the_same_capture(tmp_path, capsys):
    path = tmp_path / "many-topics.pcap"
    _many_topics_capture(path, 60)
    out = tmp_path / "s.jsonl"
    assert main(["stats", "-q", str(path), "--max-labels", "10", "--series", "volume", "-o", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len({r["topic"] for r in rows}) == 11
    assert sum(r["amount"] for r in rows if r["series"] == "produced_records") == 120
    assert "(other)" in capsys.readouterr().err


@pytest.mark.parametrize("text,want", [("9464", ("127.0.0.1", 9464)), (":9464", ("127.0.0.1", 9464)),
                                       ("0.0.0.0:9464", ("0.0.0.0", 9464)), ("[::1]:0", ("::1", 0)),
                                       ("localhost:8000", ("localhost", 8000))])
def test_parse_listen(text, want):
    assert parse_listen(text) == want


@pytest.mark.parametrize("text", ["", "host:", "x:99999", "[::1]9464", "nine"])
def test_parse_listen_rejects(text):
    with pytest.raises(ValueError):
        parse_listen(text)


@pytest.mark.parametrize("args", [["--metrics", "nope"], ["--max-labels", "5"],
                                  ["--metrics", "9464", "--max-labels", "0"]])
def test_live_metrics_usage_errors(args, capsys):
    assert main(["live", "-i", "lo", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kwinspect: ") and err.count("\n") == 1


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_mangled_captures_never_break_the_exporter_or_the_stats(tmp_path, seed):
    """Dropped, duplicated, reordered, cut packets of real captures: the exporter and the
    stats table take whatever the dissector makes of them, and count every exchange."""
    from helpers.pcapgen import mangle

    from kwinspect.analyze.stats import TrafficStats
    from kwinspect.capture.packets import PacketParser
    from kwinspect.capture.readers import open_capture
    from kwinspect.model import Exchange

    parser = PacketParser()
    segs = []
    for name in ("confluent-mock-produce-consume.pcap", "tansu-consumer-group.pcap"):
        with open_capture(CAPTURES / name) as src:
            segs += [s for s in map(parser.parse, src) if s is not None]
    segs.sort(key=lambda s: s.ts)
    path = tmp_path / "mangled.pcap"
    write_pcap(path, mangle(segs, drop=0.05, duplicate=0.05, reorder=0.1, seed=seed))
    e = MetricsExporter(label_cap=5)
    stats = TrafficStats(0.1, label_cap=5)
    e.serve("127.0.0.1", 0)
    exchanges = 0
    try:
        run = FileRun(on_close=lambda info: (e.add_connection(info), stats.add_connection(info)))
        for ev in dissect_files([path], DissectConfig(), run=run):
            e.add(ev, run.dissector.shared.topic_names)
            if isinstance(ev, Exchange):
                exchanges += 1
                stats.add(ev, run.dissector.shared.topic_names)
        m = _scrape(e)
    finally:
        e.close()
    assert exchanges > 0
    assert sum(s.value for s in m["kwinspect_requests"] if s.name.endswith("_total")) == exchanges
    assert sum(r["amount"] for r in stats.rows() if r["series"] == "requests") == exchanges


def test_wire_values_a_counter_cannot_take_are_left_out(exporter):
    """A hostile response can carry a negative throttle_time_ms (an int32 on the wire): a
    Prometheus counter cannot go down, so it is not counted, and nothing raises."""
    from kwinspect.model import Exchange

    ex = Exchange(stream="a->b", client="10.0.0.1:1", broker="10.0.0.2:9092", api_key=1, api_name="Fetch",
                  api_version=12, correlation_id=1, client_id="c", request_ts=1_700_000_000.0,
                  response_ts=1_700_000_000.5, latency_ms=500.0, request_size=10, response_size=10,
                  status="paired", throttle_time_ms=-5, long_poll=True)
    exporter.add(ex)
    m = _scrape(exporter)
    assert [s.value for s in m["kwinspect_requests"] if s.name.endswith("_total")] == [1]
    assert [s.value for s in m["kwinspect_fetch_long_polls"] if s.name.endswith("_total")] == [1]
    assert [s.value for s in m["kwinspect_fetch_long_poll_wait_seconds"] if s.name.endswith("_total")] == [0.5]
    assert not [s for s in m.get("kwinspect_throttle_seconds", []) if s.name.endswith("_total")]
