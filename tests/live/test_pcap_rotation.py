"""The -w writer of `kwinspect live`: rotation by size (-C), time (-G), ring (-W).

Rotation follows packet timestamps, so it is tested with synthetic packets.
Oracles: dpkt's pcap reader (what other tools see) and our own reader (what
`kwinspect exchanges FILES` sees: the same timestamps, bit for bit, as the
live path fed to the dissector).
"""

from __future__ import annotations

import glob
import os
import random

import dpkt
import pytest

from kwinspect.capture.live import PcapRotator, capture_filter
from kwinspect.capture.readers import RawPacket, open_capture


def _packets(n: int, start: float = 1_795_000_000.0, step_us: int = 250_000, size: int = 1000,
             seed: int = 1) -> list[RawPacket]:
    rnd = random.Random(seed)
    sec0 = int(start)
    out = []
    for i in range(n):
        us = i * step_us + rnd.randrange(1000)
        sec, usec = divmod(us, 1_000_000)
        data = bytes(rnd.randrange(256) for _ in range(rnd.randrange(60, size)))
        # the live path's timestamp: sec + usec / 1e6 (capture/live.py)
        out.append(RawPacket(sec0 + sec + usec / 1_000_000, 1, data, len(data) + 7, i + 1))
    return out


def _read_all(files: list[str]) -> list[tuple[float, bytes, int]]:
    got = []
    for path in files:
        with open_capture(path) as src:
            got.extend((raw.ts, raw.data, raw.wire_len) for raw in src)
    return got


def test_single_file_round_trips_exactly(tmp_path):
    pkts = _packets(200)
    w = PcapRotator(str(tmp_path / "one.pcap"), 1)
    for p in pkts:
        w.write(p)
    w.close()
    assert w.kept == [str(tmp_path / "one.pcap")]
    assert _read_all(w.kept) == [(p.ts, p.data, p.wire_len) for p in pkts]  # same floats, bit for bit
    with open(w.kept[0], "rb") as fh:
        r = dpkt.pcap.Reader(fh)
        assert r.datalink() == 1
        assert [buf for _ts, buf in r] == [p.data for p in pkts]


def test_size_rotation_never_exceeds_the_limit(tmp_path):
    pkts = _packets(300, size=1500)
    w = PcapRotator(str(tmp_path / "cap.pcap"), 1, max_bytes=20_000)
    for p in pkts:
        w.write(p)
    w.close()
    files = sorted(glob.glob(str(tmp_path / "cap-*.pcap")))
    assert files == w.kept and len(files) > 5
    assert all(os.path.getsize(f) <= 20_000 for f in files)
    assert _read_all(files) == [(p.ts, p.data, p.wire_len) for p in pkts]


def test_time_rotation_with_strftime_names_and_ring(tmp_path):
    pkts = _packets(100, step_us=250_000)  # 25 s of packets
    pattern = str(tmp_path / "k-%Y%m%d-%H%M%S.pcap")
    w = PcapRotator(pattern, 1, every=5.0, max_files=3)
    for p in pkts:
        w.write(p)
    w.close()
    assert len(w.files) == 5  # 25 s in 5 s periods
    assert len(w.kept) == 3 and w.removed == w.files[:2]
    assert sorted(os.listdir(tmp_path)) == sorted(os.path.basename(f) for f in w.kept)
    got = _read_all(w.kept)
    assert got == [(p.ts, p.data, p.wire_len) for p in pkts][-len(got):]
    for path in w.kept:  # every file spans less than one period
        ts = [t for t, _d, _w in _read_all([path])]
        assert ts[-1] - ts[0] < 5.0


def test_empty_session_leaves_a_valid_empty_capture(tmp_path):
    w = PcapRotator(str(tmp_path / "e.pcap"), 1)
    w.close()
    assert _read_all([str(tmp_path / "e.pcap")]) == []


@pytest.mark.parametrize("ports, expected", [
    (None, "tcp"),
    ([9092], "tcp and (port 9092)"),
    ([9092, 19092, 19093, 19094], "tcp and (port 9092 or portrange 19092-19094)"),
    ([1, 2], "tcp and (port 1 or port 2)"),
])
def test_capture_filter(ports, expected):
    assert capture_filter(ports) == expected
