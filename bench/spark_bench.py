"""Benchmark of `kwinspect pipeline` (Spark) against the single-process exporters.

Builds a multi-hundred-MB set of rotated capture files from a shipped capture
(real frames): copy k moves the client side to its own address 10.a.b.c and
starts span/8 after copy k-1, so about eight copies are in flight at any time;
the packets, in time order, are cut into files of --file-mb like `tcpdump -C`,
in the middle of connections.  Then it times:

  * single process: dissect_files + the Parquet exporter (exchanges, errors)
  * the pipeline on local[1] and local[2] (`kwinspect pipeline`, a fresh JVM each)

and prints rows/s (exchanges + errors rows) and MB/s.  Never run by `make test`.

    .venv/bin/python bench/spark_bench.py --mb 300
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import socket
import struct
import subprocess
import sys
import time

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


def pipeline(files_dir: str, out_dir: str, cores: int, extra: list[str]) -> dict:
    cmd = [os.path.join(ROOT, ".venv", "bin", "kwinspect"), "pipeline", files_dir, "-o", out_dir,
           "--overwrite", "--master", f"local[{cores}]", "--conf", "spark.ui.enabled=false",
           "--conf", "spark.driver.memory=2g", "-q", *extra]
    t = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.monotonic() - t
    if proc.returncode:
        raise SystemExit(f"pipeline failed: {proc.stderr[-3000:]}")
    m = re.search(r"tables: (.*)", proc.stdout)
    counts = dict((k, int(v)) for k, v in (p.rsplit(" ", 1) for p in m.group(1).split(", ")))
    inner = float(re.search(r"time: ([0-9.]+) s", proc.stdout).group(1))
    return {"seconds": wall, "pipeline_seconds": inner, **counts, "stdout": proc.stdout}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, default=300, help="total size of the generated files")
    ap.add_argument("--file-mb", type=int, default=40, help="rotation size (tcpdump -C)")
    ap.add_argument("--work", default="/tmp/kwinspect-spark-bench")
    ap.add_argument("--cores", default="1,2")
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
    for cores in (int(c) for c in args.cores.split(",")):
        r = pipeline(os.path.join(args.work, "in"), os.path.join(args.work, f"out{cores}"), cores, extra)
        results[f"pipeline local[{cores}]"] = r
        print(f"local[{cores}]: {r['seconds']:.1f} s wall ({r['pipeline_seconds']:.1f} s in the pipeline), "
              f"{r['exchanges'] + r['errors']:,} rows", flush=True)
        print(r.pop("stdout"), flush=True)
    print("\n| run | wall s | rows | rows/s | MB/s |\n|---|---|---|---|---|")
    for name, r in results.items():
        rows = r["exchanges"] + r["errors"]
        print(f"| {name} | {r['seconds']:.1f} | {rows:,} | {rows / r['seconds']:,.0f} | "
              f"{total / 1e6 / r['seconds']:.2f} |")
    with open(os.path.join(args.work, "results.json"), "w") as f:
        json.dump(results, f, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
