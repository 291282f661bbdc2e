"""Cut .gz captures deliver every whole packet zlib can recover; `-` reads standard input.

The oracle for cut files is zlib's own decompressobj (not our reader): whatever it
recovers from the cut bytes is parsed with dpkt's readers, and kwinspect must
deliver exactly those packets (and possibly one cut packet after them).
"""

from __future__ import annotations

import gzip
import io
import os
import subprocess
import sys
import zlib
from pathlib import Path

import dpkt
import pytest

from kwinspect.capture.readers import open_capture

ROOT = Path(__file__).resolve().parents[2]
PCAP = ROOT / "captures" / "tansu-produce-consume.pcap"
_PUBLIC = [Path(__file__).resolve().parents[k] / "shared" / "captures-public" for k in (3, 4)]
PUBLIC_NG = next((p for p in _PUBLIC if p.is_dir()), _PUBLIC[0]) / "ntop_nDPI__kafka.pcapng"
KWINSPECT = [sys.executable, "-m", "kwinspect.cli"]


def _oracle_packets(cut: bytes) -> list[bytes]:
    """Whole packets in what zlib recovers from `cut`, read by dpkt."""
    out = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(cut)
    reader_cls = dpkt.pcapng.Reader if out[:4] == b"\x0a\x0d\x0d\x0a" else dpkt.pcap.Reader
    pkts = []
    try:
        for _ts, data in reader_cls(io.BytesIO(out)):
            pkts.append(bytes(data))
    except (dpkt.NeedData, dpkt.UnpackError, ValueError, struct_error):
        pass
    return pkts


struct_error = __import__("struct").error


def _ours(cut: bytes) -> list[bytes]:
    src = open_capture(io.BytesIO(cut))
    with src:
        return [raw.data for raw in src]


@pytest.mark.parametrize("path", [PCAP, PUBLIC_NG], ids=["pcap", "pcapng"])
def test_cut_gzip_delivers_every_whole_packet(path):
    if not path.exists():
        pytest.skip(f"{path} is absent")
    gz = gzip.compress(path.read_bytes())
    checked = 0
    for k in range(1, 40):
        cut = gz[:len(gz) * k // 40]
        try:
            want = _oracle_packets(cut)
        except (zlib.error, ValueError, dpkt.NeedData):
            continue  # the cut falls inside the gzip or capture header
        if not want:
            continue
        got = _ours(cut)
        # every whole packet zlib recovers, in order; at most one cut packet after them
        assert got[:len(want)] == want, f"cut at {len(cut)} of {len(gz)}"
        assert len(got) - len(want) <= 1
        checked += 1
    assert checked > 25


def test_concatenated_gzip_members_are_one_capture():
    raw = PCAP.read_bytes()
    half = len(raw) // 2
    both = gzip.compress(raw[:half]) + gzip.compress(raw[half:])
    assert _ours(both) == _ours(raw)


def _run(args: list[str], stdin) -> bytes:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(KWINSPECT + args, stdin=stdin, stdout=subprocess.PIPE, check=True,
                          env=env, cwd=ROOT).stdout


@pytest.mark.parametrize("table", ["exchanges", "errors"])
def test_stdin_pipe_equals_the_file(table):
    want = _run([table, "-q", "-F", "jsonl", str(PCAP)], subprocess.DEVNULL)
    assert want.count(b"\n") >= 1
    with PCAP.open("rb") as f:
        assert _run([table, "-q", "-F", "jsonl", "-"], f) == want
    gz = subprocess.Popen(["gzip", "-c", str(PCAP)], stdout=subprocess.PIPE)
    try:
        assert _run([table, "-q", "-F", "jsonl", "-"], gz.stdout) == want
    finally:
        gz.stdout.close()
        gz.wait()


def test_stdin_is_read_as_it_arrives():
    # the first exchanges come out while the writer still holds the pipe open:
    # nothing waits for the end of the input (or for a megabyte of it)
    raw = PCAP.read_bytes()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(KWINSPECT + ["exchanges", "-q", "-F", "jsonl", "-"], cwd=ROOT, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        proc.stdin.write(raw)  # all packets, but no EOF yet
        proc.stdin.flush()
        # exchanges are emitted when their response arrives: the first line must
        # appear although stdin is still open (readline blocks until it does)
        first = proc.stdout.readline()
        assert first.startswith(b"{")
        assert proc.poll() is None  # still running: it did not need the end of input
    finally:
        proc.stdin.close()
        proc.stdout.read()
        proc.wait(timeout=60)


def test_stdin_pcapng_gzip_pipe_equals_the_file():
    if not PUBLIC_NG.exists():
        pytest.skip(f"{PUBLIC_NG} is absent")
    want = _run(["exchanges", "-q", "-F", "jsonl", str(PUBLIC_NG)], subprocess.DEVNULL)
    assert want
    gz = subprocess.Popen(["gzip", "-c", str(PUBLIC_NG)], stdout=subprocess.PIPE)
    try:
        assert _run(["exchanges", "-q", "-F", "jsonl", "-"], gz.stdout) == want
    finally:
        gz.stdout.close()
        gz.wait()
