"""Benchmark of `kwinspect pipeline` (Spark) against the single-process exporters.

Builds a multi-hundred-MB set of rotated capture files from a shipped capture
(real frames): copy k moves the client side to its own address 10.a.b.c and
starts span/8 after copy k-1, so about eight copies are in flight at any time;
the packets, in time order, are cut into files of --file-mb like `tcpdump -C`,
in the middle of connections.  Then it times:

  * single process: dissect_files + the Parquet exporter (exchanges, errors)
  * the pipeline on local[1], local[2] and a Spark standalone cluster of two
    workers with one core each, started on loopback from the pyspark installation
    (`kwinspect pipeline`, a fresh driver JVM each; the workers run this Python,
    kwinspect's sources travel with the job)

and prints rows/s (exchanges + errors rows) and MB/s.  Spark start-up is reported
apart from the work: the pipeline's own split (starting the JVM and context), and
the wall time of the same command on a near-empty capture (start-up, the fixed
cost of every stage, executor launch on the cluster, JVM shutdown).  Never run by
`make test`.

    .venv/bin/python bench/spark_bench.py --mb 300
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import dpkt

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = os.path.join(ROOT, "captures", "netns-mtu1500-produce-consume.pcap")


def _ip_checksum(header: bytes) -> int:
    total = sum(struct.unpack(f"!{len(header) // 2}H", header))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def make_files(source: str, out_dir: str, total_mb: int, file_mb: int) -> list[str]:
    """Rotated pcap files of about total_mb, cut every file_mb (reused when already there)."""
    stamp = os.path.join(out_dir, f".done-{os.path.basename(source)}-{total_mb}-{file_mb}")
    if os.path.exists(stamp):
        return sorted(glob.glob(os.path.join(out_dir, "rot-*.pcap")))
    os.makedirs(out_dir, exist_ok=True)
    for old in glob.glob(os.path.join(out_dir, "rot-*.pcap")) + glob.glob(os.path.join(out_dir, ".done-*")):
        os.remove(old)
    with open(source, "rb") as f:
        reader = dpkt.pcap.Reader(f)
        linktype = reader.datalink()
        packets = [(ts, bytes(buf)) for ts, buf in reader]
    if linktype != dpkt.pcap.DLT_EN10MB:
        raise SystemExit(f"only Ethernet sources are supported (linktype {linktype})")
    brokers = set()
    templates = []
    for _ts, buf in packets:
        ip = dpkt.ethernet.Ethernet(buf).data
        if isinstance(ip, dpkt.ip.IP) and isinstance(ip.data, dpkt.tcp.TCP):
            if ip.data.flags & dpkt.tcp.TH_SYN and ip.data.flags & dpkt.tcp.TH_ACK:
                brokers.add((ip.src, ip.data.sport))
    for ts, buf in packets:
        ip = dpkt.ethernet.Ethernet(buf).data
        if not (isinstance(ip, dpkt.ip.IP) and isinstance(ip.data, dpkt.tcp.TCP)):
            continue
        off = 26 if (ip.src, ip.data.sport) not in brokers else 30
        templates.append((ts, bytearray(buf), off, (buf[14] & 0x0F) * 4))
    t0 = templates[0][0]
    span = templates[-1][0] - t0 + 0.001
    copy_bytes = sum(16 + len(b) for _ts, b, _o, _i in templates)
    copies = max(1, total_mb * 1_000_000 // copy_bytes)
    # every copy's records, then one time-ordered stream cut into files
    records: list[tuple[float, bytes]] = []
    for k in range(copies):
        client = socket.inet_aton(f"10.{(k >> 16) & 255}.{(k >> 8) & 255}.{(k & 255) or 1}")
        shift = k * span / 8
        for ts, buf, off, ihl in templates:
            buf[off:off + 4] = client
            buf[24:26] = b"\0\0"
            buf[24:26] = _ip_checksum(bytes(buf[14:14 + ihl])).to_bytes(2, "big")
            records.append((ts + shift, bytes(buf)))
    records.sort(key=lambda r: r[0])
    limit = file_mb * 1_000_000
    n = 0
    out = None
    size = 0
    for ts, buf in records:
        if out is None or size >= limit:
            if out is not None:
                out.close()
            out = open(os.path.join(out_dir, f"rot-{n:03d}.pcap"), "wb")  # noqa: SIM115
            out.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 262144, linktype))
            size, n = 24, n + 1
        sec = int(ts)
        out.write(struct.pack("<IIII", sec, int(round((ts - sec) * 1e6)) % 1_000_000, len(buf), len(buf)))
        out.write(buf)
        size += 16 + len(buf)
    if out is not None:
        out.close()
    open(stamp, "w").close()
    return sorted(glob.glob(os.path.join(out_dir, "rot-*.pcap")))


def single_process(files: list[str], out_dir: str) -> dict:
    sys.path.insert(0, ROOT)
    from kwinspect.export.writers import ParquetWriter
    from kwinspect.model import ErrorRow, Exchange
    from kwinspect.run.files import dissect_files

    os.makedirs(out_dir, exist_ok=True)
    t = time.monotonic()
    n = {"exchanges": 0, "errors": 0}
    with ParquetWriter("exchanges", os.path.join(out_dir, "exchanges.parquet")) as wx, \
            ParquetWriter("errors", os.path.join(out_dir, "errors.parquet")) as we:
        for ev in dissect_files(files):
            if isinstance(ev, Exchange):
                wx.write(ev)
                n["exchanges"] += 1
            elif isinstance(ev, ErrorRow):
                we.write(ev)
                n["errors"] += 1
    return {"seconds": time.monotonic() - t, **n}


TINY = os.path.join(ROOT, "captures", "tansu-errors.pcap")  # the start-up baseline's input


def pipeline(inputs: str, out_dir: str, master: str, extra: list[str]) -> dict:
    # this interpreter and whatever kwinspect it imports (PYTHONPATH included)
    cmd = [sys.executable, "-m", "kwinspect.cli", "pipeline", inputs, "-o", out_dir,
           "--overwrite", "--master", master, "--conf", "spark.ui.enabled=false",
           "--conf", "spark.driver.memory=2g", "-q", *extra]
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    t = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.monotonic() - t
    if proc.returncode:
        raise SystemExit(f"pipeline failed: {proc.stderr[-3000:]}")
    m = re.search(r"tables: (.*)", proc.stdout)
    counts = dict((k, int(v)) for k, v in (p.rsplit(" ", 1) for p in m.group(1).split(", ")))
    m = re.search(r"time: ([0-9.]+) s \(Spark start-up ([0-9.]+) s", proc.stdout)
    return {"seconds": wall, "pipeline_seconds": float(m.group(1)), "startup_seconds": float(m.group(2)),
            **counts, "stdout": proc.stdout}


def start_standalone(work: str, workers: int, memory: str):
    """A master and `workers` one-core workers from this pyspark, running this Python."""
    import pyspark

    sys.path.insert(0, ROOT)
    from rig.spark_cluster import start_cluster

    d = os.path.join(work, "cluster")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    return start_cluster(Path(os.path.dirname(pyspark.__file__)), Path(d), sys.executable, workers=workers,
                         cores=1, memory=memory)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, default=300, help="total size of the generated files")
    ap.add_argument("--file-mb", type=int, default=40, help="rotation size (tcpdump -C)")
    ap.add_argument("--work", default="/tmp/kwinspect-spark-bench")
    ap.add_argument("--masters", default="local[1],local[2],standalone",
                    help="comma-separated: local[N] and/or standalone (2 one-core workers)")
    ap.add_argument("--skip-single", action="store_true")
    ap.add_argument("--split-mb", type=int, default=None, help="pass --split-mb to the pipeline")
    args = ap.parse_args(argv)

    files = make_files(SOURCE, os.path.join(args.work, "in"), args.mb, args.file_mb)
    total = sum(os.path.getsize(f) for f in files)
    print(f"input: {len(files)} files, {total / 1e6:.0f} MB", flush=True)
    results = {}
    if not args.skip_single:
        r = single_process(files, os.path.join(args.work, "single"))
        results["single process"] = r
        print(f"single process: {r['seconds']:.1f} s, {r['exchanges'] + r['errors']:,} rows", flush=True)
    extra = ["--split-mb", str(args.split_mb)] if args.split_mb else []
    for name in args.masters.split(","):
        cluster = None
        if name == "standalone":
            cluster = start_standalone(args.work, 2, "2g")
            master, label = cluster.url, "pipeline, standalone 2 workers x 1 core"
            conf = ["--conf", "spark.executor.memory=1536m"]
        else:
            master, label, conf = name, f"pipeline {name}", []
        try:
            base = pipeline(TINY, os.path.join(args.work, "tiny"), master, conf)
            r = pipeline(os.path.join(args.work, "in"), os.path.join(args.work, "out"), master, conf + extra)
        finally:
            if cluster is not None:
                cluster.stop()
        r["baseline_seconds"] = base["seconds"]
        results[label] = r
        print(f"{label}: {r['seconds']:.1f} s wall ({r['pipeline_seconds']:.1f} s in the pipeline, "
              f"of which {r['startup_seconds']:.1f} s Spark start-up); near-empty capture: "
              f"{base['seconds']:.1f} s wall; {r['exchanges'] + r['errors']:,} rows", flush=True)
        print(r.pop("stdout"), flush=True)
    print("\n| run | wall s | start-up s | near-empty run s | rows | rows/s | MB/s |\n|---|---|---|---|---|---|---|")
    for name, r in results.items():
        rows = r["exchanges"] + r["errors"]
        print(f"| {name} | {r['seconds']:.1f} | {r.get('startup_seconds', 0):.1f} | "
              f"{r.get('baseline_seconds', 0):.1f} | {rows:,} | {rows / r['seconds']:,.0f} | "
              f"{total / 1e6 / r['seconds']:.2f} |")
    with open(os.path.join(args.work, "results.json"), "w") as f:
        json.dump(results, f, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
