"""`kwinspect live` against a real broker on loopback, with real clients.

Oracles: (1) the same session decoded offline from the pcap files `live -w`
wrote (`kwinspect exchanges|records FILES`) must give exactly the rows that
were printed live, and (2) what the clients know (delivery reports with
offsets, consumed records) must be in the live rows.  The live processes are
stopped the way a user stops them: SIGINT (Ctrl-C).
"""

from __future__ import annotations

import glob
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("live")]

PY = sys.executable


def _unavailable() -> str | None:
    if sys.platform != "linux":
        return "live capture is Linux-only (AF_PACKET)"
    if os.geteuid() != 0:
        return "needs root (AF_PACKET capture on lo)"
    try:
        import scapy  # noqa: F401
    except ImportError:
        return "scapy is not installed (pip install 'kwinspect[live]')"
    return None


needs_capture = pytest.mark.skipif(_unavailable() is not None, reason=_unavailable() or "")


class LiveProc:
    """`kwinspect live ...` as a subprocess; stdout and stderr into files."""

    def __init__(self, workdir: str, name: str, *args: str) -> None:
        self.out = os.path.join(workdir, f"{name}.stdout")
        self.err = os.path.join(workdir, f"{name}.stderr")
        with open(self.out, "wb") as o, open(self.err, "wb") as e:
            self.proc = subprocess.Popen([PY, "-m", "kwinspect.cli", "live", *args], stdout=o, stderr=e,
                                         cwd=os.getcwd())

    def wait_listening(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if "listening on" in self.stderr():
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.proc.kill()
        raise AssertionError(f"kwinspect live did not start: rc={self.proc.poll()} {self.stderr()[-2000:]}")

    def interrupt(self, timeout: float = 60.0) -> int:
        self.proc.send_signal(signal.SIGINT)
        return self.wait(timeout)

    def wait(self, timeout: float = 60.0) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"kwinspect live did not stop: {self.stderr()[-2000:]}") from None

    def stderr(self) -> str:
        with open(self.err, encoding="utf-8", errors="replace") as f:
            return f.read()

    def rows(self, path: str | None = None) -> list[dict]:
        with open(path or self.out, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]


def _offline(table: str, files: list[str], ports: str) -> list[dict]:
    res = subprocess.run([PY, "-m", "kwinspect.cli", table, *files, "-F", "jsonl", "-q", "--kafka-ports", ports],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    return [json.loads(line) for line in res.stdout.splitlines() if line.strip()]


def _as_set(rows: list[dict]) -> list[str]:
    """Rows as a sorted multiset: live shows rows as they complete, the offline commands
    in capture order (docs/cli.md), so the same rows come in another order."""
    return sorted(json.dumps(r, sort_keys=True) for r in rows)


def _packets_in(files: list[str]) -> int:
    import dpkt  # an independent reader for what we wrote

    n = 0
    for path in files:
        with open(path, "rb") as fh:
            n += sum(1 for _ in dpkt.pcap.Reader(fh))
    return n


def _summary_number(stderr: str, what: str) -> int:
    for line in stderr.splitlines():
        line = line.strip()
        if what in line:
            for part in line.split(","):
                if what in part:
                    return int(part.strip().split()[0].replace(",", ""))
    raise AssertionError(f"no '{what}' in the summary: {stderr[-1500:]}")


@needs_capture
def test_live_matches_offline_and_client_truth(tmp_path):
    """Produce and consume with confluent-kafka while three live captures run; compare."""
    from kwinspect.capture.live import capture_filter
    from kwinspect.dissect import DissectConfig
    from kwinspect.run.live import LiveEventSource
    from rig.manifest import Manifest
    from rig.mock_cluster import MockCluster
    from rig.scenarios import ck_consume, ck_produce, standard_items

    work = str(tmp_path)
    with MockCluster(3) as mc:
        ports = ",".join(str(p) for p in mc.ports)
        topic = "live-orders"
        mc.create_topic(topic, 3, 1)
        # A: exchanges, -w with size rotation (small, so the session spans several files)
        a = LiveProc(work, "a", "-i", "lo", "--kafka-ports", ports, "-t", "exchanges", "-F", "jsonl",
                     "-w", os.path.join(work, "a.pcap"), "-C", "0.01",
                     "--also", f"errors={os.path.join(work, 'a-errors.jsonl')}",
                     "--also", f"records={os.path.join(work, 'a-records.jsonl')}")
        # B: records to a file, one pcap
        b = LiveProc(work, "b", "-i", "lo", "--kafka-ports", ports, "-t", "records",
                     "-o", os.path.join(work, "b.jsonl"), "-w", os.path.join(work, "b.pcap"))
        # C: the TUI's event source, in this process
        src = LiveEventSource("lo", DissectConfig(kafka_ports=frozenset(mc.ports) | {9092}),
                              bpf=capture_filter(mc.ports), write=os.path.join(work, "c.pcap"))
        end = object()
        q = src.start(end=end)
        got_c: list = []

        def drain() -> None:
            while (ev := q.get()) is not end:
                got_c.append(ev)
        t = threading.Thread(target=drain)
        t.start()
        try:
            a.wait_listening()
            b.wait_listening()
            m = Manifest(scenario="live", description="kwinspect live test")
            ck_produce(m, mc.bootstrap_servers, "live-producer", standard_items(topic, 40, size=3000),
                       codec="lz4", acks="all")
            ck_consume(m, mc.bootstrap_servers, "live-consumer", expected=40, topics=[topic],
                       group_id=f"live-group-{os.getpid()}", linger=0.3)
            time.sleep(0.8)  # let the last responses and FINs reach the sockets
        finally:
            rc_a = a.interrupt()
            rc_b = b.interrupt()
            src.stop()
            t.join(10)
    assert (rc_a, rc_b) == (0, 0), (a.stderr()[-1500:], b.stderr()[-1500:])
    assert src.error is None
    assert src.capture.counters.kernel_dropped == 0

    # -- A: exchanges live == offline from the rotated files ---------------------------
    files_a = sorted(glob.glob(os.path.join(work, "a-*.pcap")))
    assert len(files_a) >= 2, f"-C 0.01 should have rotated: {files_a}"
    assert all(os.path.getsize(f) <= 10_000 or _packets_in([f]) == 1 for f in files_a)
    err_a = a.stderr()
    assert _summary_number(err_a, "dropped by kernel") == 0, err_a
    assert _summary_number(err_a, "packets captured") == _packets_in(files_a)
    live_ex = a.rows()
    assert live_ex, err_a
    assert _as_set(live_ex) == _as_set(_offline("exchanges", files_a, ports))
    # --also: the other tables of the same session, at the same time
    assert _as_set(a.rows(os.path.join(work, "a-errors.jsonl"))) == _as_set(_offline("errors", files_a, ports))
    assert _as_set(a.rows(os.path.join(work, "a-records.jsonl"))) == _as_set(_offline("records", files_a, ports))

    # -- B: records live == offline -----------------------------------------------------
    live_rec = b.rows(os.path.join(work, "b.jsonl"))
    assert _as_set(live_rec) == _as_set(_offline("records", [os.path.join(work, "b.pcap")], ports))

    # -- C: the TUI source saw the same exchanges as A ------------------------------------
    from kwinspect.export.writers import normalize_row
    from kwinspect.model import EXCHANGE_COLUMNS, Exchange

    c_rows = [json.loads(json.dumps(normalize_row(ev, EXCHANGE_COLUMNS), default=str))
              for ev in got_c if isinstance(ev, Exchange)]
    assert [(r["stream"], r["correlation_id"], r["api_name"], r["status"]) for r in c_rows] == \
        [(r["stream"], r["correlation_id"], r["api_name"], r["status"]) for r in live_ex]
    assert _as_set(c_rows) == _as_set(_offline("exchanges", [os.path.join(work, "c.pcap")], ports))

    # -- ground truth: what the clients know ---------------------------------------------
    assert len(m.produced) == 40 and len(m.consumed) == 40
    produced = {(r["topic"], r["partition"], r["offset"], r["key"], r["value"]): r
                for r in live_rec if r["direction"] == "produce"}
    fetched = {(r["topic"], r["partition"], r["offset"], r["key"], r["value"])
               for r in live_rec if r["direction"] == "fetch"}
    for t_ in m.produced:
        k = (t_.topic, t_.partition, t_.offset, t_.key, t_.value)
        assert k in produced, f"produced record {k} not printed live"
        assert [(h["key"], h["value"]) for h in produced[k]["headers"]] == \
            [(h["key"], h["value"]) for h in t_.headers]
        assert produced[k]["compression"] == "lz4"
    for t_ in m.consumed:
        assert (t_.topic, t_.partition, t_.offset, t_.key, t_.value) in fetched
    apis = {r["api_name"] for r in live_ex}
    assert {"ApiVersions", "Metadata", "Produce", "Fetch", "FindCoordinator", "JoinGroup",
            "SyncGroup", "OffsetCommit", "LeaveGroup"} <= apis, apis
    # The mock answers everything, but the consumer closes with long-poll fetches (and
    # maybe a metadata refresh) in flight: those are the only unanswered requests, and
    # they come out as response_missing when the capture stops.
    bad = [r for r in live_ex if r["status"] != "paired"
           and not (r["client_id"] == "live-consumer" and r["api_name"] in ("Fetch", "Metadata", "Heartbeat")
                    and r["status"] == "response_missing")]
    assert not bad, bad[:3]


def _tcp_chatter(port: int, stop: threading.Event) -> threading.Thread:
    """A plain TCP sender on loopback until `stop` (traffic for --count)."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", port))
    srv.listen()

    def run() -> None:
        cli = socket.create_connection(("127.0.0.1", port))
        conn, _ = srv.accept()
        try:
            while not stop.is_set():
                cli.sendall(b"x" * 100)
                conn.recv(4096)
                time.sleep(0.005)
        finally:
            cli.close()
            conn.close()
            srv.close()
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@needs_capture
def test_count_stops_after_n_packets_and_writes_them(tmp_path):
    port = _free_port()
    pcap = str(tmp_path / "c.pcap")
    p = LiveProc(str(tmp_path), "count", "-i", "lo", "--bpf", f"tcp port {port}", "-c", "25", "-w", pcap,
                 "-t", "errors", "-F", "jsonl")
    p.wait_listening()
    stop = threading.Event()
    t = _tcp_chatter(port, stop)
    try:
        rc = p.wait(60)
    finally:
        stop.set()
        t.join(5)
    assert rc == 0, p.stderr()
    assert "--count 25 packets reached" in p.stderr()
    assert _packets_in([pcap]) == 25
    # Not Kafka: the connection is reported as such, not decoded into exchanges.
    kinds = {r["kind"] for r in p.rows()}
    assert kinds <= {"not_kafka"}, kinds


@needs_capture
def test_duration_stops_cleanly_without_traffic(tmp_path):
    pcap = str(tmp_path / "d.pcap")
    port = _free_port()  # nothing listens there: no packet matches
    p = LiveProc(str(tmp_path), "dur", "-i", "lo", "--bpf", f"tcp port {port}", "--duration", "0.5",
                 "-w", pcap)
    rc = p.wait(60)
    assert rc == 0, p.stderr()
    assert "--duration 0.5 s reached" in p.stderr()
    assert os.path.getsize(pcap) == 24  # a valid, empty pcap file
    assert open(p.out).read() == ""


def test_no_such_interface_is_one_line_and_exit_1():
    res = subprocess.run([PY, "-m", "kwinspect.cli", "live", "-i", "kwnope0", "--duration", "1"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 1
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "kwnope0: no such interface" in lines[0], res.stderr
    assert res.stdout == ""


def _setpriv() -> str | None:
    import shutil

    return shutil.which("setpriv")


@pytest.mark.skipif(os.geteuid() != 0 or _setpriv() is None,
                    reason="needs root and setpriv to run the CLI as an unprivileged user")
def test_not_permitted_is_one_line_and_exit_1():
    # nobody, no capabilities: socket(AF_PACKET) fails with EPERM
    res = subprocess.run([_setpriv(), "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                          "--inh-caps=-all", PY, "-m", "kwinspect.cli", "live", "-i", "lo", "--duration", "1"],
                         capture_output=True, text=True, timeout=60, cwd="/")
    if "No module named" in res.stderr:
        pytest.skip(f"kwinspect is not importable as nobody: {res.stderr.strip()[-200:]}")
    assert res.returncode == 1, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "lo: capture not permitted" in lines[0], res.stderr


def test_bad_capture_filter_is_a_usage_error():
    if _unavailable() and "scapy" in (_unavailable() or ""):
        pytest.skip("scapy is not installed")
    res = subprocess.run([PY, "-m", "kwinspect.cli", "live", "-i", "lo", "--bpf", "tcp port"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert "bad capture filter" in res.stderr


@needs_capture
def test_sigterm_stops_cleanly(tmp_path):
    port = _free_port()
    p = LiveProc(str(tmp_path), "term", "-i", "lo", "--bpf", f"tcp port {port}", "-w", str(tmp_path / "t.pcap"))
    p.wait_listening()
    p.proc.terminate()
    assert p.wait(60) == 0, p.stderr()
    assert "terminated (SIGTERM)" in p.stderr()
    assert os.path.getsize(tmp_path / "t.pcap") == 24


@needs_capture
def test_any_interface_sees_each_loopback_packet_once(tmp_path):
    """-i any: cooked (SLL) frames, and loopback traffic once, not twice (in and out)."""
    import dpkt

    port = _free_port()
    pcap = str(tmp_path / "any.pcap")
    p = LiveProc(str(tmp_path), "any", "-i", "any", "--bpf", f"tcp port {port}", "-w", pcap, "-t", "none")
    p.wait_listening()
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", port))
    srv.listen()
    c = socket.create_connection(("127.0.0.1", port))
    a, _ = srv.accept()
    for _ in range(20):
        c.sendall(b"y" * 100)
        a.recv(1000)
    c.sendall(b"z" * 200_000)
    got = 0
    while got < 200_000:
        got += len(a.recv(1 << 20))
    c.close()
    a.close()
    srv.close()
    time.sleep(0.3)
    assert p.interrupt() == 0, p.stderr()
    with open(pcap, "rb") as fh:
        r = dpkt.pcap.Reader(fh)
        assert r.datalink() == 113  # LINKTYPE_LINUX_SLL
        small = payload = 0
        for _ts, buf in r:
            tcp = dpkt.sll.SLL(buf).data.data
            small += tcp.data[:1] == b"y"
            payload += len(tcp.data)
    assert (small, payload) == (20, 202_000)
