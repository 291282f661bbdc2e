"""A cut `.pcap.gz` / `.pcapng.gz` delivers every whole packet before the cut.

Oracles: zlib's own decompressobj (what a cut gzip stream still holds) and dpkt's
pcap/pcapng readers over the uncompressed original (the packet bytes).
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import dpkt
import pytest

from kwinspect.capture.readers import open_capture

CAPTURES = Path(__file__).resolve().parents[2] / "captures"
PUBLIC = Path(__file__).resolve().parents[3] / "shared" / "captures-public"


def dpkt_packets(path: Path) -> list[bytes]:
    with open(path, "rb") as f:
        head = f.read(4)
        f.seek(0)
        reader = dpkt.pcapng.Reader(f) if head == b"\x0a\x0d\x0d\x0a" else dpkt.pcap.Reader(f)
        return [bytes(buf) for _ts, buf in reader]


def whole_packets_in(data: bytes, original: list[bytes]) -> int:
    """How many of the original packets lie wholly inside `data` (a prefix of the file)."""
    # the original file's own layout: find each packet's bytes in order and its end offset
    pos = 0
    n = 0
    for pkt in original:
        at = data.find(pkt, pos)
        if at < 0:
            break
        pos = at + len(pkt)
        n += 1
    return n


@pytest.mark.parametrize("path", [CAPTURES / "netns-mtu1500-produce-consume.pcap",
                                  CAPTURES / "tansu-produce-consume.pcap",
                                  PUBLIC / "ntop_nDPI__kafka.pcapng"], ids=lambda p: p.name)
@pytest.mark.parametrize("fraction", [0.1, 0.3, 0.5, 0.75, 0.95])
def test_every_whole_packet_before_the_cut(tmp_path, path, fraction):
    if not path.exists():
        pytest.skip(f"{path} not here")
    original = dpkt_packets(path)
    gz = gzip.compress(path.read_bytes())
    cut = gz[: int(len(gz) * fraction)]
    recoverable = zlib.decompressobj(wbits=31).decompress(cut)
    want = whole_packets_in(recoverable, original)
    assert want > 0 or fraction < 0.2
    dest = tmp_path / (path.name + ".gz")
    dest.write_bytes(cut)
    with open_capture(dest) as source:
        got = [bytes(p.data) for p in source]
        issues = [i.kind for i in source.issues]
    assert got[:want] == original[:want]
    assert len(got) >= want
    assert issues  # the cut is reported, never silent


def test_concatenated_members_read_as_one(tmp_path):
    path = CAPTURES / "tansu-produce-consume.pcap"
    raw = path.read_bytes()
    half = len(raw) // 2
    dest = tmp_path / "two-members.pcap.gz"
    dest.write_bytes(gzip.compress(raw[:half]) + gzip.compress(raw[half:]))
    with open_capture(dest) as source:
        got = [bytes(p.data) for p in source]
        assert not source.issues
    assert got == dpkt_packets(path)
