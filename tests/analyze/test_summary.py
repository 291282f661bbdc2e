"""The summary counts what a hand-built capture holds, and renders on one screen."""

from __future__ import annotations

import io
import json
import re

import numpy as np
import pytest
from rich.console import Console

from kwinspect.analyze.summary import SummaryBuilder, guess_library, render_summary, summarize
from kwinspect.model import ErrorRow, Exchange, Message, RecordRow

T = 1_704_164_645.0


def ex(n, api_key, api, version, *, client="10.0.0.1:40001", broker="10.0.1.1:9092",
       client_id="app", latency=2.0, status="paired", codes=(), topics=(), req_body=None,
       resp_body=None, ts=None, broker_id=None):
    ts = T + n if ts is None else ts
    return Exchange(
        stream=f"{client}->{broker}", client=client, broker=broker, api_key=api_key,
        api_name=api, api_version=version, correlation_id=n, client_id=client_id,
        request_ts=ts, response_ts=None if latency is None else ts + latency / 1000,
        latency_ms=latency, request_size=10, response_size=10, status=status,
        error_codes=list(codes), topics=list(topics), broker_id=broker_id,
        request=Message(True, api_key, version, {}, req_body) if req_body is not None else None,
        response=Message(False, api_key, version, {}, resp_body) if resp_body is not None else None,
    )


METADATA_BROKERS = {"brokers": [
    {"node_id": 1, "host": "10.0.1.1", "port": 9092, "rack": None},
    {"node_id": 2, "host": "10.0.1.2", "port": 9092, "rack": None},
    {"node_id": 3, "host": "10.0.1.3", "port": 9092, "rack": None},
]}


def capture():
    java = "10.0.0.1:40001"
    rdk = "10.0.0.2:50001"
    items = [
        ex(0, 18, "ApiVersions", 3, client=java, client_id="producer-1",
           req_body={"client_software_name": "apache-kafka-java", "client_software_version": "3.7.0"}),
        ex(1, 3, "Metadata", 12, client=java, client_id="producer-1", resp_body=METADATA_BROKERS,
           latency=4.0),
        ex(2, 0, "Produce", 9, client=java, client_id="producer-1", topics=["orders"], latency=10.0),
        ex(3, 0, "Produce", 9, client=java, client_id="producer-1", topics=["orders"], latency=30.0,
           codes=[6]),
        ex(4, 0, "Produce", 3, client=java, client_id="producer-1", topics=["orders"],
           latency=None, status="no_response_expected"),
        ex(5, 18, "ApiVersions", 2, client=rdk, broker="10.0.1.2:9092", client_id="rdkafka",
           req_body={}),
        ex(6, 1, "Fetch", 12, client=rdk, broker="10.0.1.2:9092", client_id="rdkafka",
           topics=["orders", "audit"], latency=500.0),
        ex(7, 1, "Fetch", 12, client="10.0.0.2:50002", broker="10.0.1.2:9092",
           client_id="rdkafka", topics=["audit"], latency=None, status="response_missing"),
        ErrorRow("kafka_error", 6, "NOT_LEADER_OR_FOLLOWER", True, "Produce", 3, "orders", 0,
                 ts=T + 3.01, stream=f"{java}->10.0.1.1:9092"),
        ErrorRow("response_missing", api_name="Fetch", correlation_id=7, message="no response",
                 ts=T + 7, stream="10.0.0.2:50002->10.0.1.2:9092"),
        ErrorRow("tls_stream", message="TLS ClientHello", ts=T - 5,
                 stream="10.0.0.9:1->10.0.1.1:9093"),
        ErrorRow("partial_batch", message="fetch cut at max bytes", ts=T + 6.5,
                 stream=f"{rdk}->10.0.1.2:9092"),
        RecordRow("produce", "orders", 0, 0, T, "create_time", "k1", "utf8", "hello", "utf8",
                  [{"key": "h", "value": "AAE=", "value_encoding": "base64"}], "none", 2, True,
                  1, 0, 0, False, False, None, 2, None),
        RecordRow("fetch", "audit", 0, 0, T, "create_time", None, None, "AAECAw==", "base64",
                  [], "none", 2, True, None, None, None, False, False, None, 6, None),
        RecordRow("fetch", "orders", 0, 0, T, "create_time", None, None, "0a0b", "hex",
                  [], "none", 2, True, None, None, None, False, False, None, 6, None),
    ]
    return items


def test_counts_by_hand():
    s = summarize(capture(), sources=["x.pcap"])
    assert s.first_ts == T - 5 and s.last_ts == pytest.approx(T + 7)
    assert s.exchanges == 8
    assert s.statuses == {"paired": 6, "no_response_expected": 1, "response_missing": 1}
    assert s.connections == 4  # java, rdk 50001, rdk 50002, the TLS one
    assert s.tls_connections == 1
    assert s.records == 3

    brokers = {b["address"]: b for b in s.brokers}
    assert brokers["10.0.1.1:9092"]["id"] == 1  # learned from the Metadata response
    assert brokers["10.0.1.2:9092"]["id"] == 2
    assert brokers["10.0.1.2:9092"]["connections"] == 2
    assert brokers["10.0.1.3:9092"]["seen"] is False  # advertised, never contacted
    assert [b["address"] for b in s.brokers] == ["10.0.1.1:9092", "10.0.1.2:9092", "10.0.1.3:9092"]

    clients = {(c["client_id"], c["address"]): c for c in s.clients}
    java = clients[("producer-1", "10.0.0.1")]
    assert java["library"] == "Java client (Apache Kafka) 3.7.0"
    assert java["software"] == [{"name": "apache-kafka-java", "version": "3.7.0"}]
    assert java["requests"] == 5 and java["connections"] == 1
    rdk = clients[("rdkafka", "10.0.0.2")]
    assert rdk["library"] == "librdkafka?"  # ApiVersions v2 carries no software name
    assert rdk["connections"] == 2

    apis = {a["api"]: a for a in s.apis}
    assert [a["api"] for a in s.apis][0] == "Produce"
    assert apis["Produce"]["versions"] == [3, 9] and apis["Produce"]["count"] == 3
    assert apis["Produce"]["errors"] == 1
    # errors are Kafka error codes only; the Fetch never answered is counted apart
    assert apis["Fetch"]["errors"] == 0 and apis["Fetch"]["unanswered"] == 1
    assert apis["Produce"]["unanswered"] == 0
    assert apis["Produce"]["p50_ms"] == np.percentile([10.0, 30.0], 50, method="inverted_cdf")
    assert apis["Produce"]["max_ms"] == 30.0
    assert apis["Fetch"]["p99_ms"] == 500.0 and apis["Fetch"]["latency_count"] == 1

    assert s.kafka_errors == [{"name": "NOT_LEADER_OR_FOLLOWER", "code": 6, "retriable": True,
                               "count": 1, "apis": ["Produce"]}]
    kinds = [a["kind"] for a in s.anomalies]
    assert kinds == ["response_missing", "tls_stream", "partial_batch"]  # info kinds last
    assert s.anomalies[-1]["info"] is True

    topics = {t["topic"]: t for t in s.topics}
    # orders: "k1"+"hello"+"h"+2 bytes (base64 AAE=) = 2+5+1+2 = 10, plus hex 0a0b = 2
    assert topics["orders"]["bytes"] == 12
    assert topics["orders"]["produce_records"] == 1 and topics["orders"]["fetch_records"] == 1
    assert topics["orders"]["requests"] == 4
    assert topics["audit"]["bytes"] == 4 and topics["audit"]["requests"] == 2
    assert [t["topic"] for t in s.topics] == ["orders", "audit"]


@pytest.mark.parametrize("feed", ["add", "add_events"])
@pytest.mark.parametrize("groups", [None, 1, 2])
def test_repeated_exchanges_count_like_the_first(monkeypatch, groups, feed):
    """Most exchanges repeat one seen before (same status, connection, client, api,
    version, error or not, topics): they are counted per group and added before the
    summary is read. Counted by hand; also with the group cache forced to restart at
    every new group (1, 2)."""
    if groups is not None:
        monkeypatch.setattr("kwinspect.analyze.summary.MAX_EXCHANGE_GROUPS", groups)
    java, rdk = "10.0.0.1:40001", "10.0.0.2:50001"
    items = []
    for n in range(3):
        items.append(ex(n, 0, "Produce", 9, client=java, client_id="p", topics=["orders"],
                        latency=1.0 + n, broker_id=1))
        items.append(ex(10 + n, 1, "Fetch", 12, client=rdk, broker="10.0.1.2:9092", client_id="c",
                        topics=["orders", "audit", "orders"], codes=[0, 6] if n else [0]))
    items.append(ex(20, 0, "Produce", 9, client=java, client_id="p", topics=["orders"],
                    latency=9.0, broker_id=2))  # a repeat: the last broker id wins
    items.append(ex(21, 1, "Fetch", 12, client=rdk, broker="10.0.1.2:9092", client_id="c",
                    topics=["audit"], latency=None, status="response_missing"))
    items.append(ex(22, 1, "Fetch", 12, client=rdk, broker="10.0.1.2:9092", client_id="c",
                    topics=["audit"], latency=None, status="response_missing"))
    if feed == "add":
        s = summarize(items, sources=["x.pcap"])
    else:  # `kwinspect summary`'s batches, with an error row and a latency for an unknown api among them
        b = SummaryBuilder()
        batch = [*items[:4], ErrorRow("tls_stream", message="TLS", ts=T + 30,
                                      stream="10.0.0.9:1->10.0.1.1:9092")]
        b.add_events(batch)
        b.add_events(items[4:])
        s = b.build(sources=["x.pcap"])
        assert s.tls_connections == 1 and s.last_ts == T + 30
    assert s.exchanges == 9
    assert s.statuses == {"paired": 7, "response_missing": 2}
    assert [(a["api"], a["count"], a["errors"], a["unanswered"], a["latency_count"]) for a in s.apis] == [
        ("Fetch", 5, 2, 2, 3), ("Produce", 4, 0, 0, 4)]
    assert {b["address"]: (b["id"], b["requests"]) for b in s.brokers} == {
        "10.0.1.1:9092": (2, 4), "10.0.1.2:9092": (None, 5)}
    assert {(c["client_id"], c["requests"]) for c in s.clients} == {("p", 4), ("c", 5)}
    assert [(t["topic"], t["requests"]) for t in s.topics] == [("orders", 7), ("audit", 5)]
    # read twice (a partial summary, then the result): the repeats are added once
    b = SummaryBuilder()
    for item in items:
        b.add(item)
    b.partial()
    assert b.build(sources=["x.pcap"]).exchanges == 9


def test_as_dict_is_json():
    d = summarize(capture()).as_dict()
    text = json.dumps(d)
    back = json.loads(text)
    assert back["capture"]["first"] == "2024-01-02T03:04:00.000000Z"
    assert back["connections"] == {"total": 4, "tls": 1, "not_kafka": 0}
    assert set(back) >= {"brokers", "clients", "apis", "kafka_errors", "anomalies", "topics"}


def _render(summary, width=120, height=50):
    buf = io.StringIO()
    console = Console(file=buf, width=width, height=height, force_terminal=True,
                      color_system="standard")
    render_summary(summary, console)
    return buf.getvalue()


def test_render_fits_one_screen_and_names_everything():
    out = re.sub(r"\x1b\[[0-9;]*m", "", _render(summarize(capture(), sources=["x.pcap"])))
    lines = out.splitlines()
    assert len(lines) <= 60
    assert max(len(line) for line in lines) <= 120
    for needle in ("x.pcap", "10.0.1.1:9092", "producer-1", "Java client", "librdkafka?", "Produce",
                   "v3,v9", "NOT_LEADER_OR_FOLLOWER", "tls_stream", "partial_batch (normal)",
                   "orders", "response missing"):
        assert needle in out, needle


def test_render_escapes_wire_strings():
    items = [ex(0, 0, "Produce", 9, client_id="evil\x1b]52;c;ZXZpbA==\x07", topics=["t\x1b[2J"])]
    items.append(ErrorRow("decode_error", message="bad \x1b[31mbytes\r", ts=T))
    out = _render(summarize(items))
    body = re.sub(r"\x1b\[[0-9;]*m", "", out)
    assert "\x1b" not in body and "\x07" not in body and "\r" not in body
    assert "\\x1b]52" in body


def busy_capture():
    """Long lists everywhere: 40 clients and brokers, 20 APIs, 30 topics, 12 errors."""
    items = []
    for i in range(40):
        api_key = i % 20
        items.append(ex(i, api_key, f"Api{api_key}", 1, client=f"10.0.{i}.1:1",
                        broker=f"10.1.{i}.1:9092", client_id=f"c{i}", topics=[f"t{i % 30}"]))
        items.append(ErrorRow("kafka_error", 100 + i % 12, f"ERR_{i % 12}", False, "Api1", ts=T))
        items.append(ErrorRow(f"anomaly_{i % 9}", message="x", ts=T))
    return items


@pytest.mark.parametrize(("width", "height"), [(80, 24), (120, 40), (120, 60), (200, 50)])
def test_busy_capture_fits_the_screen(width, height):
    out = re.sub(r"\x1b\[[0-9;]*m", "", _render(summarize(busy_capture()), width, height))
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= width
    # Fits (tiny terminals get the smallest lists, two rows each, and may scroll a little).
    assert len(lines) <= max(height, 45)
    assert "… and" in out and "more" in out


def test_many_clients_are_cut_with_a_count():
    items = [ex(i, 3, "Metadata", 12, client=f"10.0.{i}.1:1", client_id=f"c{i}") for i in range(40)]
    buf = io.StringIO()
    render_summary(summarize(items), Console(file=buf, width=120), max_rows=6)
    assert "… and 34 more" in buf.getvalue()


def test_empty_capture_renders():
    out = _render(SummaryBuilder().build())
    assert "0 exchanges" in out


@pytest.mark.parametrize(
    ("name", "version", "client_id", "expected"),
    [
        ("apache-kafka-java", "3.7.0", None, "Java client (Apache Kafka) 3.7.0"),
        ("librdkafka", "2.3.0", None, "librdkafka 2.3.0"),
        ("confluent-kafka-python", "2.16.1-rdkafka-2.16.0", None,
         "librdkafka 2.16.0 (confluent-kafka-python 2.16.1)"),
        ("confluent-kafka-go", None, None, "librdkafka via confluent-kafka-go"),
        ("kafka-python", "2.0.2", None, "kafka-python 2.0.2"),
        ("someclient", None, None, "someclient"),
        (None, None, "rdkafka", "librdkafka?"),
        (None, None, "kafka-python-2.0.2", "kafka-python?"),
        (None, None, "consumer-mygroup-1", "Java client?"),
        (None, None, "producer-12", "Java client?"),
        (None, None, "my-service", None),
        (None, None, None, None),
    ],
)
def test_guess_library(name, version, client_id, expected):
    assert guess_library(name, version, client_id) == expected
