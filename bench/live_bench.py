"""How much Kafka traffic `kwinspect live` keeps up with, on loopback, without drops.

    sudo .venv/bin/python bench/live_bench.py --rates 5,10,20,40 --seconds 15
    sudo .venv/bin/python bench/live_bench.py --rss --rates 10 --seconds 180
    sudo .venv/bin/python bench/live_bench.py --pin --rates 4,6 --seconds 30   # live on one core

The load: real Kafka conversations taken from the project's captures (the
client->broker and broker->client byte streams of every Kafka connection that
starts with its handshake), replayed by a generator process at a paced rate
over a few long-lived loopback connections, like real clients: the client
writes each request frame on its own (TCP_NODELAY), the server answers with
the recorded responses once it has read the requests, then the next
conversation follows on the same connection.  So the live process sees real
frames, pairing and decoding of every API in those captures.

For each target rate, `kwinspect live -i lo --bpf 'tcp port P' -t exchanges
-F jsonl -o /dev/null` runs while the generator sends and is stopped with
SIGINT (as Ctrl-C) 0.5 s after it; the summary's packets, bytes and kernel
drops are reported (rates are over the generator's sending time).  With --rss the live
process's VmRSS is sampled every 5 s.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = sys.executable
PROFILES = {
    "small": ["captures/confluent-mock-produce-consume.pcap", "captures/kafka-python-mock-group.pcap",
              "captures/confluent-mock-transactions.pcap"],
    "large": ["captures/netns-mtu1500-produce-consume.pcap", "captures/confluent-mock-codecs.pcap"],
}


def _frames(stream: bytes) -> list[bytes]:
    out, i = [], 0
    while i + 4 <= len(stream):
        n = int.from_bytes(stream[i:i + 4], "big")
        out.append(stream[i:i + 4 + n])
        i += 4 + n
    return out


def conversations(paths: list[str]) -> list[tuple[list[bytes], bytes]]:
    """(request frames, response bytes) of every Kafka connection seen from its SYN."""
    from kwinspect.capture.packets import PacketParser
    from kwinspect.capture.readers import open_capture
    from kwinspect.capture.tcp import StreamData, StreamOpened, TcpReassembler

    convs = []
    for path in paths:
        ports = set(json.load(open(os.path.join(ROOT, path.replace(".pcap", ".manifest.json"))))["kafka_ports"])
        parser, tcp = PacketParser(), TcpReassembler()
        data: dict = {}
        clients: dict = {}
        with open_capture(os.path.join(ROOT, path)) as src:
            for raw in src:
                seg = parser.parse(raw)
                if seg is None:
                    continue
                for ev in tcp.feed(seg):
                    if isinstance(ev, StreamOpened) and ev.client is not None and ev.server.port in ports:
                        clients[ev.conn_id] = ev.client
                    elif isinstance(ev, StreamData) and ev.conn_id in clients:
                        key = (ev.conn_id, ev.src == clients[ev.conn_id])
                        data[key] = data.get(key, b"") + ev.data
        for cid in clients:
            req, resp = data.get((cid, True), b""), data.get((cid, False), b"")
            if req and resp:
                convs.append((_frames(req), resp))
    return convs


def _recv_exactly(sock: socket.socket, n: int) -> bool:
    while n > 0:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            return False
        n -= len(chunk)
    return True


def generate(port: int, profile: str, rate_mb: float, seconds: float, connections: int = 2) -> dict:
    """Replay conversations at ~rate_mb MB/s (both directions) for `seconds`.

    Like real clients, each of `connections` long-lived connections carries one
    conversation after another: the request frames (one write each), then the
    recorded responses once the server has read the requests.
    """
    convs = conversations(PROFILES[profile])
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", port))
    srv.listen(128)
    lock = threading.Lock()
    state = {"bytes": 0, "rounds": 0}
    t0 = time.monotonic()

    def serve(conn: socket.socket) -> None:
        i = 0
        while True:
            reqs, resp = convs[i % len(convs)]
            i += 1
            if not _recv_exactly(conn, sum(len(f) for f in reqs)):
                break
            conn.sendall(resp)
        conn.close()

    def accept() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    def client() -> None:
        c = socket.create_connection(("127.0.0.1", port))
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        i = 0
        while time.monotonic() - t0 < seconds:
            reqs, resp = convs[i % len(convs)]
            i += 1
            for f in reqs:
                c.sendall(f)
            _recv_exactly(c, len(resp))
            with lock:
                state["bytes"] += sum(len(f) for f in reqs) + len(resp)
                state["rounds"] += 1
                ahead = state["bytes"] / (rate_mb * 1e6) - (time.monotonic() - t0)
            if ahead > 0:
                time.sleep(ahead)
        c.close()

    threading.Thread(target=accept, daemon=True).start()
    clients = [threading.Thread(target=client) for _ in range(connections)]
    for t in clients:
        t.start()
    for t in clients:
        t.join()
    srv.close()
    return {"connections": connections, "rounds": state["rounds"], "payload_bytes": state["bytes"],
            "seconds": time.monotonic() - t0}


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def _on_cpu(cpu: int | None):
    """preexec_fn pinning a child to one CPU (None: leave it to the scheduler)."""
    return None if cpu is None else (lambda: os.sched_setaffinity(0, {cpu}))


def run_one(profile: str, rate: float, seconds: float, rss: bool, table: str, pin: bool = False) -> dict:
    port = _free_port()
    err = tempfile.NamedTemporaryFile("w+", suffix=".stderr", delete=False)
    live = subprocess.Popen([PY, "-m", "kwinspect.cli", "live", "-i", "lo", "--bpf", f"tcp port {port}",
                             "--kafka-ports", str(port), "-t", table, "-F", "jsonl", "-o", os.devnull,
                             ], stderr=err, cwd=ROOT, preexec_fn=_on_cpu(1 if pin else None))
    while "listening on" not in open(err.name).read():
        if live.poll() is not None:
            raise SystemExit(open(err.name).read())
        time.sleep(0.05)
    samples: list[tuple[float, int]] = []
    stop = threading.Event()

    def sample() -> None:
        t0 = time.monotonic()
        while not stop.wait(5.0 if rss else 1.0):
            try:
                samples.append((round(time.monotonic() - t0), _rss_kb(live.pid)))
            except OSError:
                return
    st = threading.Thread(target=sample, daemon=True)
    st.start()
    gen = subprocess.run([PY, __file__, "--generate", str(port), profile, str(rate), str(seconds)],
                         capture_output=True, text=True, cwd=ROOT, preexec_fn=_on_cpu(0 if pin else None))
    time.sleep(0.5)  # the last packets reach the socket
    live.send_signal(signal.SIGINT)  # stopped like a user stops it, once the load is over
    live.wait()
    stop.set()
    text = open(err.name).read()
    os.unlink(err.name)
    g = json.loads(gen.stdout.strip().splitlines()[-1])
    m = re.search(r"([\d,]+) packets captured \(([\d.]+) MB\), ([\d,]+) received by filter, ([\d,]+) dropped"
                  r" by kernel, ([\d,]+) left unread", text)
    late = re.search(r"([\d,]+) of them were read after the stop", text)
    ex = re.search(r"([\d,]+) exchanges", text)
    num = lambda s: int(s.replace(",", ""))  # noqa: E731
    res = {
        "profile": profile, "target_MBps": rate, "seconds": round(g["seconds"], 1),
        "rounds": g["rounds"],
        "packets": num(m.group(1)), "captured_MB": float(m.group(2)), "dropped": num(m.group(4)),
        "unread": num(m.group(5)), "read_after_stop": num(late.group(1)) if late else 0,
        "exchanges": num(ex.group(1)) if ex else None,
    }
    res["pkts_per_s"] = round(res["packets"] / g["seconds"])
    # kept up: nothing dropped, nothing left, and at most ~0.5 s of traffic queued at the end
    res["kept_up"] = (res["dropped"] == 0 and res["unread"] == 0
                      and res["read_after_stop"] <= 0.5 * res["pkts_per_s"])
    res["MB_per_s"] = round(res["captured_MB"] / g["seconds"], 1)
    if samples:
        res["rss_MB"] = [(t, round(kb / 1024, 1)) for t, kb in samples]
    return res


def capture_only(profile: str, rate: float, seconds: float) -> dict:
    """The capture layer alone (LiveCapture.read, no dissector): what the socket side can take."""
    from kwinspect.capture.live import LiveCapture

    port = _free_port()
    cap = LiveCapture("lo", f"tcp port {port}").open()
    gen = subprocess.Popen([PY, __file__, "--generate", str(port), profile, str(rate), str(seconds)],
                           stdout=subprocess.PIPE, text=True, cwd=ROOT)
    t0 = time.monotonic()
    n = 0
    while gen.poll() is None:
        n += len(cap.read(0.2))
    n += len(cap.read(0.2))
    g = json.loads(gen.stdout.read().strip().splitlines()[-1])
    received, dropped = cap.kernel_stats()
    cap.close()
    el = g["seconds"]
    return {"profile": profile, "mode": "capture-only", "target_MBps": rate, "packets": n,
            "pkts_per_s": round(n / el), "MB_per_s": round(cap.counters.bytes / el / 1e6, 1),
            "received": received, "dropped": dropped, "wall_s": round(time.monotonic() - t0, 1)}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--generate":
        port, profile, rate, seconds = sys.argv[2:6]
        print(json.dumps(generate(int(port), profile, float(rate), float(seconds))))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", choices=list(PROFILES), default="small")
    ap.add_argument("--rates", default="2,5,10,20", help="target MB/s (payload, both directions), comma-separated")
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--table", default="exchanges", choices=("exchanges", "records", "errors", "none"))
    ap.add_argument("--rss", action="store_true", help="sample the live process's RSS every 5 s")
    ap.add_argument("--pin", action="store_true",
                    help="the live process alone on CPU 1, the generator on CPU 0 (live on one core)")
    ap.add_argument("--capture-only", action="store_true",
                    help="measure the capture layer alone (no decoding), in this process")
    args = ap.parse_args()
    for rate in (float(r) for r in args.rates.split(",")):
        if args.capture_only:
            print(json.dumps(capture_only(args.profile, rate, args.seconds)), flush=True)
            continue
        print(json.dumps(run_one(args.profile, rate, args.seconds, args.rss, args.table, args.pin)), flush=True)


if __name__ == "__main__":
    main()
