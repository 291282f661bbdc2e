"""`frame`, `response_frame` and `tcp_stream` land on the row in Wireshark.

The oracle is tshark itself: with the Kafka dissector on every broker port, the packet
where tshark shows a Kafka request (``kafka.request_key`` present) or response (absent)
with a given correlation id, and its ``tcp.stream``, must be the numbers kwinspect prints.
Every shipped and public capture is checked, multi-segment requests included
(netns-mtu1500 has produce requests over several 1500-byte packets), and several files
read as one number packets like ``mergecap`` (by time) does.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PUBLIC = ROOT.parent / "shared" / "captures-public"
CAPTURES = sorted((ROOT / "captures").glob("*.pcap")) + sorted(PUBLIC.glob("*.pcap*"))
TSHARK = shutil.which("tshark")

pytestmark = pytest.mark.skipif(TSHARK is None, reason="tshark is the oracle for these tests")


def keylog(path: Path) -> Path | None:
    """A TLS capture's key log (NAME.keys), if it ships one: both tools get it."""
    keys = path.with_suffix(".keys")
    return keys if keys.is_file() else None


def kwinspect(table: str, *paths: Path | str, jobs: int = 1) -> list[dict]:
    keys = [a for p in paths if (k := keylog(Path(p))) for a in ("--tls-keylog", str(k))]
    proc = subprocess.run([sys.executable, "-m", "kwinspect", table, "-F", "jsonl", "-j", str(jobs),
                           *keys, *map(str, paths)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


def tshark_view(path: Path, ports: set[str], tls_ports: set[str] = frozenset()) -> tuple[set, set, dict[int, int]]:
    """(requests, responses, tcp.stream by frame): messages as (tcp.stream, correlation id, frame)."""
    cmd = [TSHARK, "-r", str(path), "-T", "fields", "-E", "separator=|", "-e", "frame.number",
           "-e", "tcp.stream", "-e", "kafka.correlation_id", "-e", "kafka.request_key"]
    for port in sorted(ports - tls_ports):
        cmd += ["-d", f"tcp.port=={port},kafka"]
    for port in sorted(tls_ports):  # Kafka inside TLS, decrypted with NAME.keys or a pcapng's secrets
        cmd += ["-d", f"tls.port=={port},kafka"]
    keys = keylog(path)
    if keys is not None:
        cmd += ["-o", f"tls.keylog_file:{keys}"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=True).stdout
    requests, responses, streams = set(), set(), {}
    for line in out.splitlines():
        frame, stream, cids, keys = line.split("|")
        if not stream:
            continue
        streams[int(frame)] = int(stream)
        # one direction per packet: all of its Kafka messages are requests or all responses
        for cid in filter(None, cids.split(",")):
            (requests if keys else responses).add((int(stream), int(cid), int(frame)))
    return requests, responses, streams


def check_against_tshark(path: Path, rows: list[dict]) -> Counter:
    ports = {row["broker"].rsplit(":", 1)[1] for row in rows}
    decrypted = {e["stream"] for e in kwinspect("errors", path) if e["kind"] == "tls_decrypted"} if rows else set()
    tls_ports = {row["broker"].rsplit(":", 1)[1] for row in rows if row["stream"] in decrypted}
    requests, responses, streams = tshark_view(path, ports, tls_ports)
    seen = Counter()
    for row in rows:
        sid, cid = row["tcp_stream"], row["correlation_id"]
        assert sid is not None, row
        if row["frame"] is not None:
            assert streams.get(row["frame"]) == sid, (path.name, row)
        if cid is None:  # raw SASL tokens (handshake v0) are not Kafka messages to tshark
            assert row["api_name"] == "SaslToken", row
            continue
        if row["status"] != "request_missing":
            assert (sid, cid, row["frame"]) in requests, (path.name, "request", row)
            seen["request"] += 1
        else:
            assert row["frame"] is None
        if row["response_frame"] is not None:
            assert (sid, cid, row["response_frame"]) in responses, (path.name, "response", row)
            seen["response"] += 1
        else:
            assert row["status"] != "paired", row
    return seen


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: p.name)
def test_frame_and_tcp_stream_equal_tsharks(path):
    rows = kwinspect("exchanges", path)
    seen = check_against_tshark(path, rows)
    if rows:
        assert seen["request"] > 0
    if any(r["status"] == "paired" and r["api_name"] != "SaslToken" for r in rows):
        assert seen["response"] > 0


def test_multi_segment_requests_point_at_their_last_packet():
    path = ROOT / "captures" / "netns-mtu1500-produce-consume.pcap"
    rows = kwinspect("exchanges", path)
    big = [r for r in rows if r["request_size"] > 1500]
    assert big, "the capture has requests larger than one packet"
    check_against_tshark(path, big)


def test_errors_and_records_rows_carry_their_exchanges_numbers():
    path = ROOT / "captures" / "confluent-mock-errors.pcap"
    exchanges = {(r["tcp_stream"], r["correlation_id"]): r for r in kwinspect("exchanges", path)}
    kafka_errors = [r for r in kwinspect("errors", path) if r["kind"] == "kafka_error"]
    assert kafka_errors
    for err in kafka_errors:
        ex = exchanges[(err["tcp_stream"], err["correlation_id"])]
        assert (err["frame"], err["response_frame"]) == (ex["frame"], ex["response_frame"])
    path = ROOT / "captures" / "confluent-mock-produce-consume.pcap"
    exchanges = {(r["tcp_stream"], r["correlation_id"]): r for r in kwinspect("exchanges", path)}
    records = kwinspect("records", path)
    assert records
    for rec in records:
        ex = exchanges[(rec["tcp_stream"], rec["correlation_id"])]
        assert (rec["frame"], rec["response_frame"]) == (ex["frame"], ex["response_frame"])


def test_several_files_are_numbered_as_one_merged_capture(tmp_path):
    """Split a capture into its odd and even packets: read together, the numbers are the
    original's (tshark's on the unsplit file)."""
    dpkt = pytest.importorskip("dpkt")
    path = ROOT / "captures" / "confluent-mock-produce-consume.pcap"
    with path.open("rb") as f:
        reader = dpkt.pcap.Reader(f)
        link, packets = reader.datalink(), list(reader)
    parts = []
    for k in range(2):
        out = tmp_path / f"part{k}.pcap"
        with out.open("wb") as f:
            writer = dpkt.pcap.Writer(f, linktype=link, nano=False)
            for ts, buf in packets[k::2]:
                writer.writepkt(buf, ts)
        parts.append(out)
    rows = kwinspect("exchanges", *parts)
    assert len(rows) == len(kwinspect("exchanges", path))
    check_against_tshark(path, rows)


def test_jobs_give_the_same_numbers():
    path = ROOT / "captures" / "confluent-mock-transactions.pcap"
    one = [(r["frame"], r["response_frame"], r["tcp_stream"]) for r in kwinspect("exchanges", path)]
    two = [(r["frame"], r["response_frame"], r["tcp_stream"]) for r in kwinspect("exchanges", path, jobs=2)]
    assert one == two
