"""The summary's connection counts: exact per TCP connection, in a few bytes a connection.

Frames are encoded by kio (an encoder we did not write); the connection count's oracle is
tshark's own ``tcp.stream`` numbering of the same capture when tshark is installed.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import subprocess
import tracemalloc

import pytest
from helpers.pcapgen import conversation, write_pcap
from kio.schema.api_versions.v3 import request as av_req
from kio.schema.api_versions.v3 import response as av_resp
from kio.schema.errors import ErrorCode
from kio.static.primitive import i16, i32Timedelta
from stream.kio_frames import request_frame, response_frame

from kwinspect.analyze import summary
from kwinspect.analyze.summary import SummaryBuilder
from kwinspect.cli import main
from kwinspect.model import Exchange

TSHARK = shutil.which("tshark")
BROKER = ("10.0.1.1", 9092)


def _api_versions(cid: int, client_id: str, software: str) -> list[tuple[str, bytes]]:
    req = av_req.ApiVersionsRequest(client_software_name=software, client_software_version="1.0")
    resp = av_resp.ApiVersionsResponse(
        error_code=ErrorCode(0), throttle_time=i32Timedelta.parse(dt.timedelta(0)),
        api_keys=(av_resp.ApiVersion(api_key=i16(18), min_version=i16(0), max_version=i16(3)),))
    frames = [("c", request_frame(req, cid, client_id)), ("s", response_frame(resp, cid))]
    return [(who, len(f).to_bytes(4, "big") + f) for who, f in frames]


def _capture(path) -> None:
    """Three TCP connections to one broker; the first two on the same address pair (the
    client reused its port after closing), the third from another port; each begins with
    ApiVersions v3 naming the client software."""
    segs = []
    t = 1_700_000_000.0
    for port, isn, client_id, software in ((40000, 1000, "app", "lib-a"), (40000, 9_000_000, "app", "lib-b"),
                                           (40001, 1000, "other", "lib-c")):
        segs += conversation(("10.0.0.5", port), BROKER, _api_versions(1, client_id, software),
                             isn_client=isn, isn_server=isn + 500_000, ts0=t)
        t += 1.0
    write_pcap(path, segs)


def _summary(capsys, path, *extra: str) -> dict:
    assert main(["summary", "-q", "-F", "json", "--kafka-ports", "9092", *extra, str(path)]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("jobs", [[], ["-j", "2"]], ids=["one-process", "jobs2"])
def test_a_reused_address_pair_is_a_second_connection(tmp_path, capsys, jobs):
    path = tmp_path / "reuse.pcap"
    _capture(path)
    got = _summary(capsys, path, *jobs)
    assert got["connections"]["total"] == 3
    if TSHARK:  # the oracle: tshark numbers the reused pair as a new tcp.stream too
        out = subprocess.run([TSHARK, "-r", str(path), "-T", "fields", "-e", "tcp.stream"],
                             capture_output=True, text=True, check=True).stdout
        assert len(set(out.split())) == got["connections"]["total"]
    (broker,) = got["brokers"]
    assert broker["connections"] == 3
    clients = {(c["client_id"], c["address"]): c for c in got["clients"]}
    assert clients[("app", "10.0.0.5")]["connections"] == 2
    # each connection's own ApiVersions named its software: both of app's are listed
    assert [s["name"] for s in clients[("app", "10.0.0.5")]["software"]] == ["lib-a", "lib-b"]
    assert clients[("other", "10.0.0.5")]["connections"] == 1
    assert [s["name"] for s in clients[("other", "10.0.0.5")]["software"]] == ["lib-c"]


def _exchange(n: int, *, tcp_stream: int | None, client_id: str = "app", port: int | None = None) -> Exchange:
    client = f"10.0.{n >> 16 & 255}.{n >> 8 & 255}:{port if port is not None else 1024 + (n & 255)}"
    broker = "10.0.1.1:9092"
    return Exchange(
        stream=f"{client}->{broker}", client=client, broker=broker, api_key=3, api_name="Metadata",
        api_version=12, correlation_id=1, client_id=client_id, request_ts=1.0 + n, response_ts=1.001 + n,
        latency_ms=1.0, request_size=10, response_size=10, status="paired", error_codes=[], topics=[],
        tcp_stream=tcp_stream)


def test_a_client_id_that_changes_within_a_connection_counts_it_once_per_client():
    b = SummaryBuilder()
    for client_id in ("first", "second", "first"):
        b.add(_exchange(7, tcp_stream=3, client_id=client_id, port=5000))
    s = b.build().as_dict()
    assert s["connections"]["total"] == 1
    assert [br["connections"] for br in s["brokers"]] == [1]
    assert sorted((c["client_id"], c["connections"], c["requests"]) for c in s["clients"]) == [
        ("first", 1, 2), ("second", 1, 1)]


def test_memory_per_connection_is_a_few_bytes(monkeypatch):
    """Connections of one exchange each: past the bounded caches, each further connection
    adds a few bytes to the builder (its slot, and the exchange's latency values), where
    keeping each connection's name in six sets and dicts cost over 600 bytes."""
    monkeypatch.setattr(summary, "MAX_EXCHANGE_GROUPS", 100)  # its cache's bounded noise, small
    n = 60_000
    b = SummaryBuilder()
    tracemalloc.start()
    try:
        for i in range(2 * n):
            b.add(_exchange(i, tcp_stream=i))
            if i == n:
                base = tracemalloc.get_traced_memory()[0]
        grown = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert b.build().as_dict()["connections"]["total"] == 2 * n
    assert grown / n < 64, f"{grown / n:.0f} bytes a connection"
