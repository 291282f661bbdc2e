"""Ports and addresses in a sanitized capture: mapped consistently, each mode as the user sees it.

Oracles: the packets' own header fields, read back by kwinspect's capture parser
(not the sanitize code) and by tshark (`tcp.port`, `kafka.port`, `kafka.host`);
tshark's Kafka dissector finding the same requests; and, for the prefix-preserving
mapping, the shared prefix length of two addresses computed here from their bits.
"""

from __future__ import annotations

import ipaddress
import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from helpers.pcapgen import conversation, write_pcap
from hypothesis import given, settings
from hypothesis import strategies as st

from kwinspect.sanitize.pseudonyms import prefix_preserving
from tests.sanitize.test_sanitize_captures import ENV, SECRET, rows, tshark_requests
from tests.sanitize.test_sanitize_options import (
    _api_versions_v3_request,
    _api_versions_v3_response,
    _frame,
    sanitize,
)
from tests.sanitize.test_sanitize_tcp import segments_of

ROOT = Path(__file__).resolve().parents[2]
TSHARK = shutil.which("tshark")
CAPTURES = ["tansu-produce-consume.pcap", "netns-mtu1500-produce-consume.pcap", "tansu-ipv6-produce-consume.pcap"]
needs_tshark = pytest.mark.skipif(TSHARK is None, reason="tshark is the oracle")


def _pairs(original: Path, out: Path):
    """(original segment, sanitized segment), packet for packet (nothing was left out)."""
    before, after = segments_of(original), segments_of(out)
    assert len(before) == len(after) > 0
    return list(zip(before, after, strict=True))


def _brokers(path: Path) -> set[tuple[str, int]]:
    return {(ep.rsplit(":", 1)[0].strip("[]"), int(ep.rsplit(":", 1)[1])) for ep in
            (r["broker"] for r in rows("exchanges", path))}


@pytest.mark.parametrize("name", CAPTURES)
def test_client_ports_are_mapped_broker_ports_kept(tmp_path, name):
    capture = ROOT / "captures" / name
    out, report = tmp_path / "out.pcap", tmp_path / "r.json"
    proc = sanitize(str(capture), "-o", str(out), "--secret", SECRET, "--report", str(report))
    assert proc.returncode == 0, proc.stderr
    broker_ports = {port for _ip, port in _brokers(capture)}
    clients: dict[int, int] = {}  # original client port -> sanitized client port
    for a, b in _pairs(capture, out):
        for pa, pb, broker_side in ((a.src.port, b.src.port, a.src.port in broker_ports),
                                    (a.dst.port, b.dst.port, a.dst.port in broker_ports)):
            if broker_side:
                assert pb == pa  # tells Wireshark which packets are Kafka
            else:
                assert pb != pa and pb not in broker_ports and pb >= 32768
                assert clients.setdefault(pa, pb) == pb  # the same port, the same pseudonym
    assert len(set(clients.values())) == len(clients) > 1  # no two connections on one 4-tuple
    # and kwinspect sees as many connections as before; the report counts one port per connection
    connections = len({r["stream"] for r in rows("exchanges", capture)})
    assert len({r["stream"] for r in rows("exchanges", out)}) == connections
    assert json.loads(report.read_text())["replaced"]["tcp_port"] == connections


def test_keep_ports_keeps_every_port(tmp_path):
    capture = ROOT / "captures" / "tansu-produce-consume.pcap"
    for flags in (["--keep-ports"], ["--ports", "keep"]):
        out = tmp_path / "kept.pcap"
        assert sanitize(str(capture), "-o", str(out), *flags).returncode == 0
        assert all((a.src.port, a.dst.port) == (b.src.port, b.dst.port) for a, b in _pairs(capture, out))


def _tshark_fields(path: Path, ports: set[int], *fields: str) -> list[list[str]]:
    cmd = [TSHARK, "-r", str(path), "-T", "fields", "-E", "separator=|"]
    for p in sorted(ports):
        cmd += ["-d", f"tcp.port=={p},kafka"]
    for f in fields:
        cmd += ["-e", f]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=True)
    return [line.split("|") for line in proc.stdout.splitlines()]


@needs_tshark
def test_all_ports_mapped_in_packets_and_in_kafka_bodies(tmp_path):
    capture = ROOT / "captures" / "tansu-produce-consume.pcap"
    out, report, mapping = tmp_path / "all.pcap", tmp_path / "r.json", tmp_path / "m.json"
    proc = sanitize(str(capture), "-o", str(out), "--ports", "all", "--secret", SECRET,
                    "--report", str(report), "--mapping", str(mapping))
    assert proc.returncode == 0, proc.stderr
    (broker,) = {port for _ip, port in _brokers(capture)}
    # the broker port as the sanitized packets carry it
    (new_broker,) = {b.dst.port for a, b in _pairs(capture, out) if a.dst.port == broker}
    assert new_broker != broker
    # tshark, told where Kafka now is (as docs/sanitize.md says), finds the same requests
    original = tshark_requests([TSHARK], capture, {str(broker)})
    assert original
    assert tshark_requests([TSHARK], out, {str(new_broker)}) == original

    # broker ports inside Metadata / FindCoordinator bodies: the port the packets use
    def body_ports(path: Path, port: int) -> list[int]:
        return [int(v) for row in _tshark_fields(path, {port}, "kafka.port") for v in row[0].split(",") if v]

    before, after = body_ports(capture, broker), body_ports(out, new_broker)
    assert len(after) == len(before) > 0 and set(before) == {broker}
    assert set(after) == {new_broker}
    # tshark reads only some of them (not Metadata v12's): `kwinspect decode` reads them all
    before, after = decoded_ports(capture), decoded_ports(out)
    assert len(after) == len(before) >= 6 and set(before) == {broker} and set(after) == {new_broker}
    replaced = json.loads(report.read_text())["replaced"]
    assert replaced["port"] == len(before)
    assert replaced["tcp_port"] == 2 * len({r["stream"] for r in rows("exchanges", capture)})
    assert json.loads(mapping.read_text())["port"][str(broker)] == str(new_broker)


def decoded_ports(path: Path) -> list[int]:
    """Every ``port`` field of every decoded message (`kwinspect decode`)."""
    proc = subprocess.run([sys.executable, "-m", "kwinspect", "decode", str(path)], capture_output=True,
                          text=True, env=ENV, timeout=300)
    assert proc.returncode == 0, proc.stderr
    found = []

    def walk(x):
        if isinstance(x, dict):
            for k, v in x.items():
                if k == "port" and type(v) is int:
                    found.append(v)
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    for line in proc.stdout.splitlines():
        walk(json.loads(line))
    return found


# --------------------------------------------------------------------------- prefix-preserving


def _shared(a: int, b: int, width: int) -> int:
    return width - (a ^ b).bit_length()


def _related(width: int):
    """Addresses that share prefixes of every length: a base with some low bits changed."""
    top = (1 << width) - 1
    return st.integers(0, top).flatmap(lambda base: st.lists(
        st.integers(0, width).flatmap(lambda k: st.integers(0, (1 << k) - 1).map(lambda low: base ^ low)),
        min_size=2, max_size=24, unique=True))


@pytest.mark.parametrize("width", [32, 128])
@settings(max_examples=60, deadline=None)
@given(data=st.data(), secret=st.binary(min_size=1, max_size=32))
def test_prefix_preserving_keeps_exactly_the_shared_prefix(width, data, secret):
    ints = data.draw(_related(width))
    kind = ipaddress.IPv4Address if width == 32 else ipaddress.IPv6Address
    mapped = [int(prefix_preserving(kind(i), secret)) for i in ints]
    assert len(set(mapped)) == len(ints)  # one-to-one on the sample
    for i in range(len(ints)):
        for j in range(i + 1, len(ints)):
            assert _shared(mapped[i], mapped[j], width) == _shared(ints[i], ints[j], width)


def test_prefix_preserving_depends_on_the_secret():
    a = ipaddress.IPv4Address("10.1.2.3")
    assert prefix_preserving(a, b"one") == prefix_preserving(a, b"one") != prefix_preserving(a, b"two")


def test_prefix_mode_on_a_capture_keeps_subnets(tmp_path):
    broker = ("10.1.2.4", 9092)
    clients = ["10.1.2.3", "10.1.2.77", "10.1.9.5", "10.200.0.1", "192.168.7.7"]
    segments = []
    for n, ip in enumerate(clients):
        messages = [("c", _frame(_api_versions_v3_request(1, b"kwinspect-test"))),
                    ("s", _frame(_api_versions_v3_response(1)))]
        segments += conversation((ip, 40000 + n), broker, messages, ts0=1_700_000_000.0 + n)
    capture = tmp_path / "subnets.pcap"
    write_pcap(capture, segments)
    out = tmp_path / "out.pcap"
    proc = sanitize(str(capture), "-o", str(out), "--addresses", "prefix")
    assert proc.returncode == 0, proc.stderr
    seen: dict[str, str] = {}
    for a, b in _pairs(capture, out):
        for x, y in ((a.src.ip, b.src.ip), (a.dst.ip, b.dst.ip)):
            assert seen.setdefault(x, y) == y
    assert len(set(seen.values())) == len(seen) == len(clients) + 1
    assert not set(seen) & set(seen.values())
    originals = list(seen)
    for i in range(len(originals)):
        for j in range(i + 1, len(originals)):
            x, y = (int(ipaddress.ip_address(v)) for v in (originals[i], originals[j]))
            u, v = (int(ipaddress.ip_address(seen[w])) for w in (originals[i], originals[j]))
            assert _shared(u, v, 32) == _shared(x, y, 32)
    data = out.read_bytes()
    assert not any(ipaddress.ip_address(o).packed in data or o.encode() in data for o in originals)


@needs_tshark
@pytest.mark.parametrize("name", ["tansu-produce-consume.pcap", "tansu-ipv6-produce-consume.pcap"])
def test_prefix_mode_maps_host_literals_like_the_packets(tmp_path, name):
    capture = ROOT / "captures" / name
    out = tmp_path / "out.pcap"
    assert sanitize(str(capture), "-o", str(out), "--addresses", "prefix").returncode == 0
    brokers = {port for _ip, port in _brokers(capture)}  # kept: the default maps client ports only
    hosts_before = [h.strip("[]") for row in _tshark_fields(capture, brokers, "kafka.host")
                    for h in row[0].split(",") if h]
    assert hosts_before and all(ipaddress.ip_address(h) for h in hosts_before)  # address literals
    hosts_after = Counter(h.strip("[]") for row in _tshark_fields(out, brokers, "kafka.host")
                          for h in row[0].split(",") if h)
    packet_addresses = {x for _a, b in _pairs(capture, out) for x in (b.src.ip, b.dst.ip)}
    assert sum(hosts_after.values()) == len(hosts_before)
    assert set(hosts_after) <= packet_addresses
    assert not set(hosts_after) & set(hosts_before)


def test_keep_addresses(tmp_path):
    capture = ROOT / "captures" / "tansu-produce-consume.pcap"
    out = tmp_path / "kept.pcap"
    assert sanitize(str(capture), "-o", str(out), "--addresses", "keep").returncode == 0
    assert all((a.src.ip, a.dst.ip) == (b.src.ip, b.dst.ip) for a, b in _pairs(capture, out))
