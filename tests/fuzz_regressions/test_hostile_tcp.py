"""Forged RSTs and FINs do not end a connection; bytes after a close are reported.

The captures come from hostile_tcp.py: 11 ApiVersions exchanges on one connection
(the expected count is what the generator put on the wire), with forged segments
injected after the first exchange.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fuzz_regressions import hostile_tcp

from kwinspect.capture.packets import ACK, RST
from kwinspect.capture.tcp import StreamClosed, TcpReassembler

ROOT = Path(__file__).resolve().parents[2]


def _kw(*args: str) -> list[dict]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-m", "kwinspect.cli", *args, "-q", "-F", "jsonl"],
                         capture_output=True, check=True, env=env, cwd=ROOT).stdout
    return [json.loads(line) for line in out.splitlines()]


@pytest.fixture(scope="module")
def captures(tmp_path_factory):
    return hostile_tcp.write_all(tmp_path_factory.mktemp("hostile"))


@pytest.mark.parametrize("name", ["forged-rst", "forged-fins"])
def test_forged_close_does_not_end_the_conversation(captures, name):
    exchanges = _kw("exchanges", str(captures[name]))
    assert len(exchanges) == hostile_tcp.EXCHANGES
    assert all(e["status"] == "paired" for e in exchanges)
    errors = _kw("errors", str(captures[name]))
    ignored = [e for e in errors if e["kind"] == "tcp_ignored_close"]
    assert len(ignored) == (1 if name == "forged-rst" else 2)
    assert "ignored" in ignored[0]["message"]


def test_bytes_after_close_are_reported(captures):
    _segs, late = hostile_tcp.data_after_close()
    errors = _kw("errors", str(captures["data-after-close"]))
    rows = [e for e in errors if e["kind"] == "tcp_late_data"]
    assert len(rows) == 1 and f"{late} bytes" in rows[0]["message"]
    assert rows[0]["stream"]  # named although the connection had closed
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    summary = json.loads(subprocess.run(
        [sys.executable, "-m", "kwinspect.cli", "summary", "-q", "-F", "json",
         str(captures["data-after-close"])], capture_output=True, check=True, env=env).stdout)
    assert summary["tcp_bytes"]["late"] == late
    t = summary["tcp_bytes"]
    assert t["payload"] == t["delivered"] + t["duplicate"] + t["late"] + t["dropped"] + t["buffered"]


def test_in_window_rst_still_closes():
    # the RST a real stack sends (at its next sequence number) closes as before
    segs = hostile_tcp._base()
    k = hostile_tcp._after_first_exchange(segs)
    ref = segs[k - 1]
    rst = ref._replace(seq=(ref.seq + len(ref.payload)) & 0xFFFFFFFF, flags=RST | ACK,
                       payload=b"", ts=ref.ts + 0.0001)
    r = TcpReassembler()
    closes = [e for s in segs[:k] + [rst] for e in r.feed(s) if isinstance(e, StreamClosed)]
    assert [c.reason for c in closes] == ["rst"]


def test_rst_answering_a_syn_closes():
    # connection refused: the first server segment is a RST|ACK acknowledging the SYN
    syn = hostile_tcp._base()[0]
    rst = syn._replace(src=syn.dst, dst=syn.src, seq=0, ack=(syn.seq + 1) & 0xFFFFFFFF,
                       flags=RST | ACK, ts=syn.ts + 0.001)
    r = TcpReassembler()
    closes = [e for s in (syn, rst) for e in r.feed(s) if isinstance(e, StreamClosed)]
    assert [c.reason for c in closes] == ["rst"]
    forged = rst._replace(ack=(syn.seq + 5000) & 0xFFFFFFFF)
    r = TcpReassembler()
    closes = [e for s in (syn, forged) for e in r.feed(s) if isinstance(e, StreamClosed)]
    assert closes == [] and r.stats.ignored_closes == 1


def test_issue_flood_is_capped_per_stream_with_a_count_row(captures):
    # 2,000 zero-length frames: the first 100 decode_error rows, then one row counting the rest
    errors = _kw("errors", str(captures["zero-length-frames"]))
    decode = [e for e in errors if e["kind"] == "decode_error"]
    assert len(decode) == 100
    more = [e for e in errors if e["kind"] == "limit_exceeded"]
    assert len(more) == 1 and more[0]["message"].startswith("1900 more decode_error rows")
    assert more[0]["stream"] == decode[0]["stream"]
    exchanges = _kw("exchanges", str(captures["zero-length-frames"]))
    assert [e["status"] for e in exchanges] == ["paired", "paired"]  # the good ones around it


def test_gzip_of_zeros_stops_after_a_bounded_run(tmp_path):
    # a pcap header, then 64 MiB of zeros (64 KiB gzipped): 4 million empty records
    import gzip
    import struct

    path = tmp_path / "zeros.pcap.gz"
    with gzip.open(path, "wb") as f:
        f.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1))
        for _ in range(64):
            f.write(bytes(1 << 20))
    assert path.stat().st_size < 200_000
    errors = _kw("errors", str(path))
    stop = [e for e in errors if e["kind"] == "corrupt_capture"]
    assert len(stop) == 1 and "reading stopped" in stop[0]["message"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    summary = json.loads(subprocess.run(
        [sys.executable, "-m", "kwinspect.cli", "summary", "-q", "-F", "json", str(path)],
        capture_output=True, check=True, env=env).stdout)
    assert summary["packets"]["packets"] <= 70_000  # of 4,194,304 records
    assert summary["packets"]["unparseable"] == summary["packets"]["packets"]


def test_framing_issue_flood_is_capped_per_direction():
    import struct

    from kwinspect.stream.framing import FrameSplitter, FramingIssue, RequestValidator

    req = struct.pack(">hhih", 18, 0, 1, 1) + b"c" + bytes(100)  # ApiVersions v0, padded
    frame = struct.pack(">i", len(req)) + req
    splitter = FrameSplitter(RequestValidator(known_kafka=True), max_frame_size=64, synced=True)
    splitter.feed(frame * 300, 1.0)
    splitter.finish()
    issues = [e for e in splitter.events() if isinstance(e, FramingIssue)]
    kinds = [i.kind for i in issues]
    assert kinds.count("oversized_frame") == 100
    assert kinds[-1] == "limit_exceeded" and issues[-1].message.startswith("200 more oversized_frame")
