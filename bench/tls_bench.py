"""TLS throughput (issue #19): kwinspect vs tshark decrypting the same capture with the
same key log.

    .venv/bin/python bench/tls_bench.py make /tmp/tlsbench      # record (root, tcpdump, tansu, openssl)
    .venv/bin/python bench/tls_bench.py time /tmp/tlsbench --runs 5

``make`` records a TLS 1.3 capture with the rig: kafka-python producers write
``--records`` records of ``--size`` bytes (acks=all, one partition, small batches so
there are many Produce requests) and a consumer reads them back, all over real TLS
(Python ssl) to rig.tlsproxy in front of tansu, the clients writing their secrets
with ``SSLContext.keylog_filename``; tcpdump captures the proxy port.  A TLS capture
cannot be made bigger by duplicating packets (records are bound to their keys), so
the traffic is recorded at the wanted size.  Writes DIR/tls.pcap, DIR/tls.keys,
DIR/port.

``time`` runs, each in a fresh process, ``/usr/bin/time -v``:

- ``kwinspect exchanges DIR/tls.pcap -F jsonl -q --tls-keylog DIR/tls.keys --kafka-ports P``
- ``tshark -r DIR/tls.pcap -o tls.keylog_file:DIR/tls.keys -d tls.port==P,kafka -Y kafka
  -T fields -e frame.number -e kafka.request_key -e kafka.correlation_id``
  (``tls.port``, not ``tcp.port``: with ``-d tcp.port==P,kafka`` tshark hands the
  encrypted TCP payload to the Kafka dissector and prints no Kafka line at all; the
  decrypted data goes to the dissector a ``tls.port`` Decode As names)

and reports, per command, the median wall time, CPU (user+sys), peak RSS, and MB/s of
the capture file (file bytes / median wall).  ``--tshark PATH`` picks the tshark
(default: the one on PATH; e.g. a wrapper that runs a newer tshark).
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import shutil
import ssl
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)


def make(out: str, records: int, size: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    from rig.tansu import TansuBroker, free_port
    from rig.tcpdump import Tcpdump
    from rig.tlsproxy import TlsProxy, make_self_signed

    os.makedirs(out, exist_ok=True)
    cert, key = make_self_signed(out)
    keylog = os.path.join(out, "tls.keys")
    pcap = os.path.join(out, "tls.pcap")
    for p in (keylog, pcap):
        if os.path.exists(p):
            os.unlink(p)

    def ctx() -> ssl.SSLContext:
        c = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        c.check_hostname = False
        c.verify_mode = ssl.CERT_NONE
        c.keylog_filename = keylog
        return c

    broker_port = free_port()
    with TlsProxy(("127.0.0.1", broker_port), cert, key) as proxy:
        tb = TansuBroker(broker_port, advertised_port=proxy.port, log_path=os.path.join(out, "tansu.log"))
        tb.start()
        try:
            bootstrap = f"127.0.0.1:{proxy.port}"
            topic = "tls-bench"
            admin = AdminClient({"bootstrap.servers": bootstrap, "security.protocol": "SSL",
                                 "ssl.ca.location": cert, "ssl.endpoint.identification.algorithm": "none"})
            for fut in admin.create_topics([NewTopic(topic, 1, 1)]).values():
                fut.result(15)
            del admin
            gc.collect()
            common = {"security_protocol": "SSL", "ssl_context": ctx()}
            value = (b"0123456789abcdef" * (size // 16 + 1))[:size]
            with Tcpdump(pcap, [proxy.port]):
                p = KafkaProducer(bootstrap_servers=bootstrap, client_id="tls-bench-producer", acks="all",
                                  linger_ms=0, batch_size=4 * size, **common)
                futs = [p.send(topic, key=f"k{i}".encode(), value=value, partition=0) for i in range(records)]
                p.flush(60)
                for f in futs:
                    f.get(30)
                p.close(5)
                c = KafkaConsumer(bootstrap_servers=bootstrap, client_id="tls-bench-consumer",
                                  auto_offset_reset="earliest", enable_auto_commit=False,
                                  max_partition_fetch_bytes=64 * size, **common)
                tp = TopicPartition(topic, 0)
                c.assign([tp])
                c.seek_to_beginning(tp)
                got, deadline = 0, time.monotonic() + 120
                while got < records and time.monotonic() < deadline:
                    got += sum(len(v) for v in c.poll(timeout_ms=200).values())
                c.close()
                time.sleep(0.5)
            if got < records:
                raise SystemExit(f"consumed {got} of {records}")
        finally:
            tb.stop()
    with open(os.path.join(out, "port"), "w") as f:
        f.write(str(proxy.port))
    print(f"{pcap}: {os.path.getsize(pcap):,} bytes; key log {keylog}; broker port {proxy.port}")


def _measure(cmd: list[str]) -> tuple[float, float, int, int]:
    """(wall s, cpu s, max RSS KiB, stdout lines) of one run under /usr/bin/time -v."""
    res = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"{cmd[0]} failed ({res.returncode}): {res.stderr[-2000:]}")
    err = res.stderr

    def field(name: str) -> str:
        m = re.search(rf"^\s*{re.escape(name)}: (.+)$", err, re.M)
        assert m, (name, err[-1500:])
        return m.group(1).strip()

    wall = 0.0
    for part in field("Elapsed (wall clock) time (h:mm:ss or m:ss)").split(":"):
        wall = wall * 60 + float(part)
    cpu = float(field("User time (seconds)")) + float(field("System time (seconds)"))
    return wall, cpu, int(field("Maximum resident set size (kbytes)")), res.stdout.count("\n")


def timing(out: str, runs: int, tshark: str) -> None:
    pcap, keys = os.path.join(out, "tls.pcap"), os.path.join(out, "tls.keys")
    with open(os.path.join(out, "port")) as f:
        port = f.read().strip()
    size = os.path.getsize(pcap)
    cmds = {
        "kwinspect exchanges": [sys.executable, "-m", "kwinspect.cli", "exchanges", pcap, "-F", "jsonl", "-q",
                                "--tls-keylog", keys, "--kafka-ports", port],
        "tshark": [*tshark.split(), "-r", pcap, "-o", f"tls.keylog_file:{keys}", "-d", f"tls.port=={port},kafka",
                   "-Y", "kafka", "-T", "fields", "-e", "frame.number", "-e", "kafka.request_key",
                   "-e", "kafka.correlation_id"],
    }
    print(f"capture {pcap}: {size / 1e6:.1f} MB, load average {os.getloadavg()[0]:.1f}")
    print(f"{'command':22} {'wall s':>8} {'cpu s':>8} {'MB/s':>7} {'RSS MB':>7} {'lines':>8}   (median of {runs})")
    for name, cmd in cmds.items():
        rows = [_measure(cmd) for _ in range(runs)]
        wall = statistics.median(r[0] for r in rows)
        cpu = statistics.median(r[1] for r in rows)
        print(f"{name:22} {wall:8.2f} {cpu:8.2f} {size / 1e6 / wall:7.1f} {max(r[2] for r in rows) / 1024:7.0f} "
              f"{rows[0][3]:8,}   walls: {', '.join(f'{r[0]:.2f}' for r in rows)}")
    print(f"load average after: {os.getloadavg()[0]:.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("out")
    m.add_argument("--records", type=int, default=4000)
    m.add_argument("--size", type=int, default=1024)
    t = sub.add_parser("time")
    t.add_argument("out")
    t.add_argument("--runs", type=int, default=5)
    t.add_argument("--tshark", default=shutil.which("tshark") or "tshark")
    args = ap.parse_args()
    if args.cmd == "make":
        make(args.out, args.records, args.size)
    else:
        timing(args.out, args.runs, args.tshark)


if __name__ == "__main__":
    main()
