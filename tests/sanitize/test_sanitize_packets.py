"""Packet headers: rebuilt unchanged, they are the bytes an independent encoder wrote.

tests/helpers/pcapgen.py builds link, IP and TCP headers byte by byte, for every
link type kwinspect reads, VLAN tags, IPv4 and IPv6 (with zero checksums); parsing
such a frame and building it again with the same addresses, numbers and payload
must give the same bytes but for the checksums, and changing the addresses must
give what pcapgen builds for the changed segment.  tshark checks the checksums.
"""

from __future__ import annotations

import collections
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.pcapgen import (
    LINKTYPE_ETHERNET,
    LINKTYPE_IPV4,
    LINKTYPE_IPV6,
    LINKTYPE_LINUX_SLL,
    LINKTYPE_LINUX_SLL2,
    LINKTYPE_LOOP,
    LINKTYPE_NULL,
    LINKTYPE_RAW,
    build_frames,
    conversation,
)

from kwinspect.model import Endpoint
from kwinspect.sanitize import packets as pk
from kwinspect.sanitize.pseudonyms import Pseudonyms
from tests.sanitize.test_sanitize_captures import ENV

ROOT = Path(__file__).resolve().parents[2]

LINKTYPES = [LINKTYPE_ETHERNET, LINKTYPE_LINUX_SLL, LINKTYPE_LINUX_SLL2, LINKTYPE_NULL, LINKTYPE_LOOP,
             LINKTYPE_RAW]


def _segments(v6: bool):
    client, server = (("fd00::1", 40000), ("fd00::2", 9092)) if v6 else (("10.0.0.1", 40000), ("10.0.0.2", 9092))
    return conversation(client, server, [("c", b"request" * 50), ("s", b"response" * 40)], mss=100)


def _without_checksums(data: bytes, p: pk.Packet) -> bytes:
    out = bytearray(data)
    if p.version == 4:
        out[p.ip_offset + 10:p.ip_offset + 12] = b"\0\0"
    out[p.tcp_offset + 16:p.tcp_offset + 18] = b"\0\0"
    return bytes(out)


def _same(frame_data: bytes, linktype: int) -> bytes:
    p = pk.parse(linktype, frame_data)
    assert p is not None
    return _without_checksums(pk.build(p, linktype, src=p.src, dst=p.dst, seq=p.seq, ack=p.ack, payload=p.payload,
                                       map_sack=None, map_link=lambda mac: mac), p)


@pytest.mark.parametrize(("linktype", "v6"), [(lt, v6) for lt in LINKTYPES for v6 in (False, True)]
                         + [(LINKTYPE_IPV4, False), (LINKTYPE_IPV6, True)])
def test_a_packet_rebuilt_unchanged_is_the_same_bytes(linktype, v6):
    for frame in build_frames(_segments(v6), linktype, vlan=(100,) if linktype == LINKTYPE_ETHERNET else ()):
        assert _same(frame.data, linktype) == frame.data


@pytest.mark.parametrize("v6", [False, True], ids=["ipv4", "ipv6"])
def test_new_addresses_and_numbers_are_what_pcapgen_builds(v6):
    segments = _segments(v6)
    ps = Pseudonyms(b"k")
    changed = [seg._replace(src=Endpoint(ps.ip(seg.src.ip), seg.src.port),
                            dst=Endpoint(ps.ip(seg.dst.ip), seg.dst.port),
                            seq=(seg.seq + 7) & 0xFFFFFFFF, ack=(seg.ack + 9) & 0xFFFFFFFF,
                            payload=seg.payload[::-1]) for seg in segments]
    for frame, want in zip(build_frames(segments, LINKTYPE_RAW), build_frames(changed, LINKTYPE_RAW), strict=True):
        p = pk.parse(LINKTYPE_RAW, frame.data)
        got = pk.build(p, LINKTYPE_RAW, src=ps.ip(p.src), dst=ps.ip(p.dst), seq=p.seq + 7, ack=p.ack + 9,
                       payload=p.payload[::-1], map_sack=None, map_link=lambda mac: mac)
        assert _without_checksums(got, p) == want.data


def test_addresses_map_consistently_and_hosts_follow_them():
    ps = Pseudonyms(b"k")
    a, b = ps.ip("127.0.0.1"), ps.ip("10.9.8.7")
    assert (ps.ip("127.0.0.1"), ps.ip("10.9.8.7")) == (a, b) and a != b
    assert ps.host("127.0.0.1") == a and ps.host("/127.0.0.1") == "/" + a
    assert ps.host("kafka-1.internal.example").endswith(".invalid")
    assert "::1" not in ps.ip("::1")


TSHARK = shutil.which("tshark")


@pytest.mark.skipif(TSHARK is None, reason="tshark checks the checksums")
@pytest.mark.parametrize("name", ["tansu-produce-consume.pcap", "tansu-ipv6-produce-consume.pcap"])
def test_tshark_finds_every_checksum_right(tmp_path, name):
    out = tmp_path / "out.pcap"
    proc = subprocess.run([sys.executable, "-m", "kwinspect", "sanitize", str(ROOT / "captures" / name),
                           "-o", str(out)], capture_output=True, text=True, env=ENV, timeout=300)
    assert proc.returncode == 0, proc.stderr
    fields = subprocess.run([TSHARK, "-r", str(out), "-o", "ip.check_checksum:TRUE", "-o", "tcp.check_checksum:TRUE",
                             "-T", "fields", "-e", "ip.checksum.status", "-e", "tcp.checksum.status"],
                            capture_output=True, text=True, timeout=300, check=True).stdout
    statuses = collections.Counter(fields.splitlines())
    good = "1\t1" if "ipv6" not in name else "\t1"
    assert statuses == {good: sum(statuses.values())}, statuses
