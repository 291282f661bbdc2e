"""Real traffic: sockets on loopback, captured by tcpdump (or dumpcap), read back by us.

The sockets are the ground truth: what the client sent must come out of the
reassembler as the client's stream, byte for byte, and the same for the server.
tshark's "follow tcp" is a second, independent oracle for the same files.
Only loopback addresses are used.  Needs root (or CAP_NET_RAW) and tcpdump.
"""

from __future__ import annotations

import gzip
import random
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from kwinspect.capture.packets import FIN, PacketParser
from kwinspect.capture.readers import open_capture
from kwinspect.capture.tcp import StreamClosed, StreamData, StreamGap, StreamOpened, TcpReassembler

TCPDUMP = shutil.which("tcpdump")
pytestmark = pytest.mark.skipif(TCPDUMP is None, reason="tcpdump is not installed "
                                "(apt-get install tcpdump); these tests capture real traffic")


def _chunks(rnd: random.Random, data: bytes):
    i = 0
    while i < len(data):
        n = rnd.choice([1, 7, 100, 1500, 9000, 70000])
        yield data[i:i + n]
        i += n


def _talk(host: str, port: int, srv: socket.socket, conns: int, seed: int) -> list[dict]:
    """Run `conns` sequential connections; return what each side sent."""
    rnd = random.Random(seed)
    truth = []

    def serve(expect: int, reply: bytes, box: dict) -> None:
        s, _ = srv.accept()
        with s:
            got = b""
            while len(got) < expect:
                b = s.recv(65536)
                if not b:
                    break
                got += b
            box["received"] = got
            for ch in _chunks(rnd, reply):
                s.sendall(ch)
            s.shutdown(socket.SHUT_WR)
            while s.recv(65536):
                pass

    for k in range(conns):
        req = rnd.randbytes(rnd.choice([1, 5000, 300_000]))
        rep = rnd.randbytes(rnd.choice([0, 2000, 200_000])) + b"end-%d" % k
        box: dict = {}
        t = threading.Thread(target=serve, args=(len(req), rep, box))
        t.start()
        fam = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(fam, socket.SOCK_STREAM) as c:
            c.connect((host, port))
            cport = c.getsockname()[1]
            for ch in _chunks(rnd, req):
                c.sendall(ch)
            got = b""
            while True:
                b = c.recv(65536)
                if not b:
                    break
                got += b
        t.join(10)
        assert box["received"] == req and got == rep  # the sockets agree with themselves
        truth.append({"client_port": cport, "c": req, "s": rep})
    return truth


def _fin_count(path: Path) -> int:
    n = 0
    try:
        with open_capture(path) as src:
            p = PacketParser()
            for raw in src:
                seg = p.parse(raw)
                if seg is not None and seg.flags & FIN:
                    n += 1
    except Exception:  # noqa: BLE001 - the file may still be empty
        return 0
    return n


def capture(tmp_path: Path, name: str, *, host: str = "127.0.0.1", iface: str = "lo",
            extra: tuple[str, ...] = (), conns: int = 3, seed: int = 0,
            ) -> tuple[Path, list[dict], int]:
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    srv = socket.socket(fam, socket.SOCK_STREAM)
    srv.bind((host, 0))
    srv.listen(4)
    port = srv.getsockname()[1]
    out = tmp_path / name
    cmd = [TCPDUMP, "-i", iface, "-U", "--immediate-mode", "-B", "65536", "-s", "0", *extra,
           "-w", str(out), f"tcp port {port}"]
    ready = "listening on"
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
        while line and ready not in line:
            line = proc.stderr.readline()
        if ready not in line:
            pytest.fail(f"tcpdump did not start (needs root or CAP_NET_RAW): {line!r}")
        truth = _talk(host, port, srv, conns, seed)
        # wait until the capture holds both FINs of every connection (no time asserted)
        for _ in range(200):
            if _fin_count(out) >= 2 * conns:
                break
            time.sleep(0.05)
    finally:
        srv.close()
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            err = ""
    m = re.search(r"(\d+) packets? dropped by kernel", err or "")
    dropped = int(m.group(1)) if m else 0
    return out, truth, dropped


def reassemble(path: Path):
    parser = PacketParser()
    r = TcpReassembler()
    evs = []
    with open_capture(path) as src:
        for raw in src:
            seg = parser.parse(raw)
            if seg is not None:
                evs += r.feed(seg)
        issues = src.issues
    evs += r.finish()
    return evs, parser, issues


def streams(evs) -> dict[int, dict]:
    out: dict[int, dict] = {}
    for e in evs:
        if isinstance(e, StreamOpened):
            out[e.conn_id.serial] = {"opened": e, "data": {}, "gaps": 0, "closed": None}
        elif isinstance(e, StreamData):
            d = out[e.conn_id.serial]["data"]
            d[e.src.port] = d.get(e.src.port, b"") + e.data
        elif isinstance(e, StreamGap):
            out[e.conn_id.serial]["gaps"] += e.nbytes
        elif isinstance(e, StreamClosed):
            out[e.conn_id.serial]["closed"] = e
    return out


def check_exact(evs, truth, dropped: int = 0) -> None:
    """Streams equal what the sockets sent.  If the kernel dropped packets on the
    capture side (tcpdump says so), the lost bytes must show up as gaps instead."""
    if dropped:
        check_offsets(evs, truth)
        return
    got = streams(evs)
    assert len(got) == len(truth)
    for st_, t in zip(sorted(got.values(), key=lambda s: s["opened"].ts), truth, strict=True):
        o = st_["opened"]
        assert o.syn_seen and o.client.port == t["client_port"]
        assert st_["data"].get(o.client.port, b"") == t["c"]
        assert st_["data"].get(o.server.port, b"") == t["s"]
        assert st_["gaps"] == 0
        assert st_["closed"].reason == "fin"
        assert all(s.balanced() for s in st_["closed"].stats)


@pytest.mark.parametrize(("host", "extra", "linktype"), [
    ("127.0.0.1", (), 1),
    ("::1", (), 1),
    ("127.0.0.1", ("--time-stamp-precision=nano",), 1),
])
def test_loopback_ethernet(tmp_path, host, extra, linktype):
    path, truth, dropped = capture(tmp_path, "lo.pcap", host=host, extra=extra)
    evs, parser, issues = reassemble(path)
    assert issues == []
    with open_capture(path) as src:
        assert src.linktype == linktype
    check_exact(evs, truth, dropped)
    assert parser.stats.unparseable == 0 and parser.stats.check()


@pytest.mark.parametrize("dlt", ["LINUX_SLL2", "LINUX_SLL"])
def test_any_interface_cooked(tmp_path, dlt):
    path, truth, dropped = capture(tmp_path, "any.pcap", iface="any", extra=("-y", dlt), seed=1)
    with open_capture(path) as src:
        assert src.linktype == {"LINUX_SLL2": 276, "LINUX_SLL": 113}[dlt]
    evs, _, _ = reassemble(path)
    check_exact(evs, truth, dropped)


def test_wireshark_pcapng_two_interfaces_and_gzip(tmp_path):
    """Two real captures (Ethernet on lo, cooked v2 on any) merged by Wireshark's mergecap
    into one pcapng with two interface blocks of different link types."""
    mergecap = shutil.which("mergecap")
    if mergecap is None:
        pytest.skip("mergecap (wireshark-common) is not installed; pcapng is covered synthetically")
    p1, t1, d1 = capture(tmp_path, "a.pcap", seed=2, conns=2)
    p2, t2, d2 = capture(tmp_path, "b.pcap", iface="any", extra=("-y", "LINUX_SLL2"), seed=5,
                         conns=2)
    merged = tmp_path / "merged.pcapng"
    subprocess.run([mergecap, "-F", "pcapng", "-w", str(merged), str(p1), str(p2)], check=True,
                   capture_output=True)
    with open_capture(merged) as src:
        assert src.format == "pcapng"
        kinds = {r.linktype for r in src}
        assert kinds == {1, 276} and len(src.stats.interfaces) == 2
    evs, _, issues = reassemble(merged)
    assert issues == []
    check_exact(evs, t1 + t2, d1 + d2)
    gz = tmp_path / "merged.bin"  # detection is by content, not by the name
    gz.write_bytes(gzip.compress(merged.read_bytes()))
    evs2, _, _ = reassemble(gz)
    check_exact(evs2, t1 + t2, d1 + d2)


def check_offsets(evs, truth) -> None:
    """Every delivered chunk sits at its true offset; delivered + gaps = what was sent."""
    got = streams(evs)
    by_port = {t["client_port"]: t for t in truth}
    for st_ in got.values():
        o = st_["opened"]
        if not o.syn_seen:
            continue  # the SYN itself was lost: offsets are relative to the first seen byte
        t = by_port[o.client.port]
        for s in st_["closed"].stats:
            assert s.balanced()
            want = t["c"] if s.src.port == t["client_port"] else t["s"]
            assert s.delivered + s.gap_bytes == len(want)
    for e in evs:
        if isinstance(e, StreamData) and got[e.conn_id.serial]["opened"].syn_seen:
            t = next(t for t in truth if t["client_port"] in (e.src.port, e.dst.port))
            want = t["c"] if e.src.port == t["client_port"] else t["s"]
            assert want[e.offset:e.offset + len(e.data)] == e.data


def test_snaplen_cut_capture_reports_gaps_and_keeps_offsets(tmp_path):
    path, truth, dropped = capture(tmp_path, "snap.pcap", extra=("-s", "120"), seed=3)
    evs, parser, issues = reassemble(path)
    assert parser.stats.truncated > 0
    assert any(i.kind == "snaplen_truncated" for i in issues)
    check_offsets(evs, truth)
    assert sum(e.nbytes for e in evs if isinstance(e, StreamGap)) > 0


def test_tshark_follow_agrees(tmp_path):
    tshark = shutil.which("tshark")
    if tshark is None:
        pytest.skip("tshark is not installed (second oracle)")
    path, truth, dropped = capture(tmp_path, "follow.pcap", conns=1, seed=4)
    out = subprocess.run([tshark, "-r", str(path), "-q", "-z", "follow,tcp,raw,0"],
                         capture_output=True, text=True, check=True).stdout
    node0, node1 = bytearray(), bytearray()
    for line in out.splitlines():
        if not line.strip() or line.startswith(("=", "Follow", "Filter", "Node")):
            continue
        (node1 if line.startswith("\t") else node0).extend(bytes.fromhex(line.strip()))
    evs, _, _ = reassemble(path)
    s = next(iter(streams(evs).values()))
    o = s["opened"]
    assert s["data"].get(o.client.port, b"") == node0 == truth[0]["c"]
    assert s["data"].get(o.server.port, b"") == node1 == truth[0]["s"]

