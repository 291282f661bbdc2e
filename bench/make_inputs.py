"""Reference inputs for bench/run.py, made with the real-traffic rig and cached under bench/data/.

    .venv/bin/python bench/make_inputs.py            # make whatever is missing
    .venv/bin/python bench/make_inputs.py --force a  # remake one

(a) ``a-produce-fetch-mtu1500.pcap``: about 150 MB of Produce/Fetch traffic on a
    1500-MTU loopback (network namespace, TSO/GSO/GRO off, see
    rig/netns.py): five confluent-kafka producers, one per codec
    (none, gzip, snappy, lz4, zstd), write ~75 MB of part-compressible values
    to the 3-broker librdkafka mock cluster while a consumer group fetches
    them back. Requests and fetch responses span many 1448-byte segments.
(b) ``b-small-produce.pcap``: about 400k small Produce requests with their
    responses (confluent-kafka with batch.num.messages=1, linger.ms=0, acks=1,
    pipelined) against the mock cluster, captured on the host loopback.
(c) ``c-repeated-a.pcap``: (a) written ``--repeat`` times (default 14, ~2 GB),
    each copy shifted in time by the span of (a) and with the client side
    moved to its own address 127.1.K.1 (IP checksums recomputed, TCP checksums
    adjusted), so every copy is a new set of connections: for memory behaviour.

Each input gets a ``NAME.json`` next to it (kafka ports, how it was made,
tcpdump's counters). Needs root and tcpdump; (a) needs namespaces (ip, ethtool).
Do not commit bench/data/ (it is gitignored).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import struct
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data")
sys.path.insert(0, os.path.dirname(HERE))

INPUTS = {
    "a": "a-produce-fetch-mtu1500.pcap",
    "b": "b-small-produce.pcap",
    "c": "c-repeated-a.pcap",
}
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
WORDS = ("order", "payment", "customer", "shipped", "invoice", "kafka", "broker", "topic",
         "partition", "offset", "status", "amount", "currency", "EUR", "USD", "created", "updated",
         "warehouse", "berlin", "lisbon", "tokyo", "quantity", "sku", "discount", "true", "false")


def path_of(key: str) -> str:
    return os.path.join(DATA, INPUTS[key])


def meta_of(key: str) -> dict:
    with open(path_of(key)[:-5] + ".json") as f:
        return json.load(f)


def _write_meta(key: str, meta: dict) -> None:
    with open(path_of(key)[:-5] + ".json", "w") as f:
        json.dump(meta, f, indent=2)


def _value(rng: random.Random, size: int) -> bytes:
    """JSON-ish text, half words (compressible), half random hex (not)."""
    parts = []
    n = 0
    while n < size:
        if rng.random() < 0.5:
            w = rng.choice(WORDS)
        else:
            w = rng.getrandbits(64).to_bytes(8, "big").hex()
        parts.append(w)
        n += len(w) + 1
    return " ".join(parts).encode()[:size]


# ---------------------------------------------------------------------------
# (a): inside the namespace
# ---------------------------------------------------------------------------


def _pace(t0: float, done: float, rate: float) -> None:
    """Sleep so that `done` units since `t0` do not run ahead of `rate` per second
    (tcpdump drops packets when a loaded 2-core box cannot keep up)."""
    ahead = done / rate - (time.monotonic() - t0)
    if ahead > 0.01:
        time.sleep(ahead)


def _inner_a(out: str, produce_mb: float, rate_mb_s: float = 6.0) -> int:
    from confluent_kafka import Consumer, Producer

    from rig.mock_cluster import MockCluster
    from rig.tcpdump import Tcpdump

    rng = random.Random(1)
    with MockCluster(3) as mc:
        topic = "bench-a"
        partitions = 30  # the mock keeps ~5 MB per partition; stay well below it
        mc.create_topic(topic, partitions, 1)
        # 1500-byte frames: a small snap length gives the kernel ring many frames (it sizes
        # frames by the snap length), and a 256 MiB buffer rides out a loaded machine.
        td = Tcpdump(out, mc.ports, snaplen=2048, buffer_kib=262144)
        td.start()
        t0 = time.monotonic()
        consumed = [0, 0]
        stop = threading.Event()

        def consume() -> None:
            c = Consumer({"bootstrap.servers": mc.bootstrap_servers, "group.id": "bench-a-group",
                          "client.id": "bench-consumer", "auto.offset.reset": "earliest",
                          "fetch.max.bytes": 4 << 20, "max.partition.fetch.bytes": 1 << 20})
            c.subscribe([topic])
            idle = 0.0
            while True:
                msgs = c.consume(500, 0.2)
                for m in msgs:
                    if m.error() is None:
                        consumed[0] += 1
                        consumed[1] += len(m.value() or b"")
                if msgs:
                    idle = 0.0
                elif stop.is_set():
                    idle += 0.2
                    if idle >= 2.0:
                        break
            c.close()

        th = threading.Thread(target=consume)
        th.start()
        per_codec = int(produce_mb * 1e6 / len(CODECS))
        produced = 0
        producers = []
        for codec in CODECS:
            producers.append((codec, Producer({"bootstrap.servers": mc.bootstrap_servers,
                                              "client.id": f"bench-producer-{codec}",
                                              "compression.type": codec, "linger.ms": 5, "acks": 1,
                                              "batch.size": 256 * 1024,
                                              "queue.buffering.max.kbytes": 32 * 1024})))
        sent = dict.fromkeys(CODECS, 0)
        i = 0
        while any(v < per_codec for v in sent.values()):
            for codec, p in producers:
                if sent[codec] >= per_codec:
                    continue
                size = rng.choice((200, 1000, 1000, 4000, 16000))
                val = _value(rng, size)
                while True:
                    try:
                        p.produce(topic, key=f"k{i}".encode(), value=val, headers=[("codec", codec.encode())])
                        break
                    except BufferError:
                        p.poll(0.05)
                p.poll(0)
                sent[codec] += size
                produced += 1
                i += 1
            _pace(t0, sum(sent.values()), rate_mb_s * 1e6)
        for _codec, p in producers:
            p.flush(60)
        del producers
        stop.set()
        th.join(120)
        stats = td.stop(drain=0.7)
        meta = {"kafka_ports": mc.ports, "produced_records": produced, "consumed_records": consumed[0],
                "value_bytes_produced": sum(sent.values()), "tcpdump": stats,
                "seconds": round(time.monotonic() - t0, 1), "mtu": 1500, "codecs": list(CODECS)}
    with open(out + ".inner.json", "w") as f:
        json.dump(meta, f)
    return 0


def make_a(produce_mb: float) -> None:
    from rig.netns import NetNamespace, unavailable_reason

    why = unavailable_reason()
    if why:
        raise SystemExit(f"(a) needs a network namespace: {why}")
    out = path_of("a")
    with NetNamespace() as ns:
        info = ns.describe()
        cmd = [*ns.prefix, sys.executable, os.path.abspath(__file__), "--inner-a", out,
               "--produce-mb", str(produce_mb)]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        if res.returncode != 0:
            raise SystemExit(f"(a) failed:\n{res.stderr[-3000:]}")
    with open(out + ".inner.json") as f:
        meta = json.load(f)
    os.unlink(out + ".inner.json")
    meta.update(netns=info, what="produce/fetch, 5 codecs, 1500-MTU netns loopback, librdkafka mock cluster",
                bytes=os.path.getsize(out))
    _write_meta("a", meta)


# ---------------------------------------------------------------------------
# (b): small produce requests on the host loopback
# ---------------------------------------------------------------------------


def make_b(requests: int, rate: float = 4000.0) -> None:
    from confluent_kafka import Producer

    from rig.mock_cluster import MockCluster
    from rig.tcpdump import Tcpdump

    out = path_of("b")
    rng = random.Random(2)
    with MockCluster(3) as mc:
        topic = "bench-b"
        mc.create_topic(topic, 6, 1)
        td = Tcpdump(out, mc.ports, snaplen=65600, buffer_kib=262144)
        td.start()
        t0 = time.monotonic()
        delivered = [0]

        def dr(err, _msg) -> None:
            if err is None:
                delivered[0] += 1

        p = Producer({"bootstrap.servers": mc.bootstrap_servers, "client.id": "bench-small-producer",
                      "linger.ms": 0, "batch.num.messages": 1, "acks": 1, "compression.type": "none",
                      "queue.buffering.max.messages": 200_000, "enable.idempotence": False})
        vals = [_value(rng, rng.choice((40, 80, 120))) for _ in range(64)]
        for i in range(requests):
            while True:
                try:
                    p.produce(topic, key=f"k{i % 1000}".encode(), value=vals[i & 63], on_delivery=dr)
                    break
                except BufferError:
                    p.poll(0.01)
            if i & 255 == 0:
                p.poll(0)
                _pace(t0, i, rate)
        p.flush(300)
        del p
        import gc

        gc.collect()
        stats = td.stop(drain=0.7)
        meta = {"kafka_ports": mc.ports, "produced_records": requests, "delivered": delivered[0],
                "tcpdump": stats, "seconds": round(time.monotonic() - t0, 1),
                "what": "small produce requests (batch.num.messages=1), host loopback, librdkafka mock cluster",
                "bytes": os.path.getsize(out), "mtu": "host loopback (65536)"}
    _write_meta("b", meta)


# ---------------------------------------------------------------------------
# (c): (a) repeated with shifted timestamps and client addresses
# ---------------------------------------------------------------------------


def _csum_fold(x: int) -> int:
    while x >> 16:
        x = (x & 0xFFFF) + (x >> 16)
    return x


def _adjust(csum: int, old: bytes, new: bytes) -> int:
    """RFC 1624 incremental update: HC' = ~(~HC + ~m + m')."""
    s = ~csum & 0xFFFF
    for i in range(0, len(old), 2):
        s += ~((old[i] << 8) | old[i + 1]) & 0xFFFF
        s += (new[i] << 8) | new[i + 1]
    return ~_csum_fold(s) & 0xFFFF


def make_c(repeat: int) -> None:
    src = path_of("a")
    meta_a = meta_of("a")
    ports = set(meta_a["kafka_ports"])
    with open(src, "rb") as f:
        head = f.read(24)
        magic, = struct.unpack("<I", head[:4])
        if magic not in (0xA1B2C3D4, 0xA1B23C4D):
            raise SystemExit("(c): (a) must be a little-endian pcap")
        linktype, = struct.unpack("<I", head[20:24])
        if linktype != 1:
            raise SystemExit("(c): (a) must be Ethernet")
        body = f.read()
    nano = magic == 0xA1B23C4D
    div = 1_000_000_000 if nano else 1_000_000
    # index the records once
    recs = []
    pos = 0
    hdr = struct.Struct("<IIII")
    while pos + 16 <= len(body):
        s, frac, incl, _orig = hdr.unpack_from(body, pos)
        recs.append((pos, s * div + frac, incl))
        pos += 16 + incl
    t_first, t_last = recs[0][1], recs[-1][1]
    span = t_last - t_first + div  # one second between copies
    out = path_of("c")
    lo = socket.inet_aton("127.0.0.1")
    with open(out + ".part", "wb") as w:
        w.write(head)
        for k in range(repeat):
            new_ip = socket.inet_aton(f"127.1.{k + 1}.1")
            shift = k * span
            chunk = bytearray()
            for pos, t, incl in recs:
                data = bytearray(body[pos + 16:pos + 16 + incl])
                t2 = t + shift
                if k and len(data) >= 54 and data[12:14] == b"\x08\x00" and data[23] == 6:
                    ihl = (data[14] & 0x0F) * 4
                    sport, dport = struct.unpack_from("!HH", data, 14 + ihl)
                    # the client side is the one not on a broker port
                    off = 26 if sport not in ports and data[26:30] == lo else (
                        30 if dport not in ports and data[30:34] == lo else None)
                    if off is not None:
                        data[off:off + 4] = new_ip
                        ipc = struct.unpack_from("!H", data, 24)[0]
                        struct.pack_into("!H", data, 24, _adjust(ipc, lo, new_ip))
                        tcs_off = 14 + ihl + 16
                        if len(data) >= tcs_off + 2:
                            tcs = struct.unpack_from("!H", data, tcs_off)[0]
                            struct.pack_into("!H", data, tcs_off, _adjust(tcs, lo, new_ip))
                chunk += hdr.pack(t2 // div, t2 % div, incl, struct.unpack_from("<I", body, pos + 12)[0])
                chunk += data
            w.write(chunk)
    os.replace(out + ".part", out)
    _write_meta("c", {"kafka_ports": sorted(ports), "repeat": repeat, "source": INPUTS["a"],
                      "bytes": os.path.getsize(out),
                      "what": f"(a) x{repeat}, shifted timestamps, client address 127.1.K.1 per copy"})


def ensure(keys: list[str], *, force: tuple[str, ...] = (), produce_mb: float = 75.0,
           requests: int = 400_000, repeat: int = 14, log=print) -> None:
    os.makedirs(DATA, exist_ok=True)
    for key in keys:
        if key in force or not (os.path.exists(path_of(key)) and os.path.exists(path_of(key)[:-5] + ".json")):
            if key == "c":
                ensure(["a"], produce_mb=produce_mb, log=log)
            log(f"making ({key}) {INPUTS[key]} ...")
            t0 = time.monotonic()
            {"a": lambda: make_a(produce_mb), "b": lambda: make_b(requests), "c": lambda: make_c(repeat)}[key]()
            log(f"  ({key}) {os.path.getsize(path_of(key)) / 1e6:.0f} MB in {time.monotonic() - t0:.0f} s")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("inputs", nargs="*", help="a, b and/or c (default: all)")
    ap.add_argument("--force", nargs="*", default=[], choices=["a", "b", "c"])
    ap.add_argument("--produce-mb", type=float, default=75.0, help="(a): MB of values produced (default 75)")
    ap.add_argument("--requests", type=int, default=400_000, help="(b): produce requests (default 400k)")
    ap.add_argument("--repeat", type=int, default=14, help="(c): copies of (a) (default 14, ~2 GB)")
    ap.add_argument("--inner-a", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.inner_a:
        return _inner_a(args.inner_a, args.produce_mb)
    bad = [k for k in args.inputs if k not in INPUTS]
    if bad:
        ap.error(f"unknown input(s) {bad}: choose from a, b, c")
    ensure(args.inputs or ["a", "b", "c"], force=tuple(args.force), produce_mb=args.produce_mb,
           requests=args.requests, repeat=args.repeat)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
