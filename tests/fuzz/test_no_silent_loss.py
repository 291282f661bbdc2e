"""No silent loss: every packet of a capture is counted as part of a Kafka stream, another
TCP stream, not TCP, or unparseable, and the summary shows those counts."""

from __future__ import annotations

import io
import json
import struct

from fuzz import harness
from helpers.pcapgen import Frame, build_frames, conversation, write_pcap

from kwinspect.analyze.summary import SummaryBuilder, render_summary
from kwinspect.cli import main
from kwinspect.dissect import DissectConfig
from kwinspect.run.files import FileRun, dissect_files

ETH = b"\x02\x00\x00\x00\x00\x02" + b"\x02\x00\x00\x00\x00\x01"


def _kafka_frames() -> bytes:
    req = struct.pack(">hhih", 18, 0, 1, 1) + b"c"
    resp = struct.pack(">ih", 1, 0) + struct.pack(">i", 0)
    return struct.pack(">i", len(req)) + req, struct.pack(">i", len(resp)) + resp


def _capture(path) -> dict[str, int]:
    req, resp = _kafka_frames()
    kafka = conversation(("10.0.0.1", 40000), ("10.0.0.2", 9092), [("c", req), ("s", resp)])
    http = conversation(("10.0.0.1", 40001), ("10.0.0.3", 80),
                        [("c", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"), ("s", b"HTTP/1.1 200 OK\r\n\r\n")],
                        ts0=1_700_000_001.0)
    # a Kafka request big enough to travel in three IPv4 fragments
    big = struct.pack(">hhih", 18, 0, 2, 1) + b"c" + b"\x00" * 1200
    frag = conversation(("10.0.0.5", 40002), ("10.0.0.2", 9092),
                        [("c", struct.pack(">i", len(big)) + big)], ts0=1_700_000_002.0,
                        handshake=False, close=None, acks=False)
    frames = build_frames(kafka) + build_frames(http)
    frag_frames = build_frames(frag, fragment_size=512)
    assert len(frag_frames) == 3
    frames += frag_frames
    ts = 1_700_000_003.0
    arp = ETH + b"\x08\x06" + bytes(28)
    udp_ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 28, 0, 0, 64, 17, 0, b"\x0a\0\0\x01", b"\x0a\0\0\x02")
    udp = ETH + b"\x08\x00" + udp_ip + struct.pack("!HHHH", 5353, 5353, 8, 0)
    cut = ETH + b"\x08\x00" + b"\x45\x00"  # IPv4 header cut after 2 bytes
    lone_fragment = build_frames(conversation(("10.0.0.7", 40003), ("10.0.0.2", 9092),
                                              [("c", b"x" * 1200)], handshake=False, close=None,
                                              acks=False, ts0=ts), fragment_size=512)[:1]
    frames += [Frame(ts, arp, len(arp)), Frame(ts, udp, len(udp)), Frame(ts, cut, len(cut))]
    frames += lone_fragment  # never completed: unparseable at the end
    frames.sort(key=lambda f: f.ts)
    write_pcap(path, frames)
    return {"packets": len(frames), "kafka": len(kafka) + 3, "non_kafka": len(http),
            "not_tcp": 2, "unparseable": 2, "fragments_pending": 0}


def test_every_packet_is_counted_once(tmp_path):
    path = tmp_path / "mixed.pcap"
    expected = _capture(path)
    run = FileRun()
    list(dissect_files([path], DissectConfig(), run=run))
    assert run.dissector.packet_counts() == expected
    assert run.dissector.packet_accounting_error() is None


def test_summary_shows_the_packet_counts(tmp_path, capsys):
    path = tmp_path / "mixed.pcap"
    expected = _capture(path)
    assert main(["summary", str(path), "-F", "json", "-q"]) == 0
    assert json.loads(capsys.readouterr().out)["packets"] == expected
    assert main(["summary", str(path), "-q"]) == 0
    out = capsys.readouterr().out
    assert (f"{expected['packets']} packets: {expected['kafka']} Kafka, {expected['non_kafka']} other TCP, "
            f"2 not TCP, 2 unparseable") in out


def test_summary_without_counts_renders_as_before():
    from rich.console import Console

    buf = io.StringIO()
    render_summary(SummaryBuilder().build(), Console(file=buf, width=120))
    assert "packets:" not in buf.getvalue()


def test_counts_hold_on_every_real_capture():
    for path in harness.capture_paths():
        with open(path, "rb") as f:
            d = harness.run_dissector(f.read(), DissectConfig(), outputs=False)
        if d is None:
            continue
        assert harness.dissect_accounting_error(d) is None, path
        c = d.packet_counts()
        assert c["packets"] > 0 and c["fragments_pending"] == 0, (path, c)


def test_unparseable_packets_are_reported_as_errors(tmp_path, capsys):
    path = tmp_path / "mixed.pcap"
    _capture(path)
    assert main(["errors", str(path), "-F", "jsonl", "-q"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    kinds = [r["kind"] for r in rows]
    assert "ip_fragment_incomplete" in kinds, kinds  # the lone fragment
    assert any(k in ("truncated_packet", "malformed_packet") for k in kinds), kinds  # the cut header


def test_packets_of_pruned_connections_stay_counted(tmp_path):
    # closed connections beyond keep_closed_connections are dropped from memory; a late
    # retransmission for one of them must still be counted once
    from kwinspect.capture.packets import ACK, PSH
    from kwinspect.dissect import Dissector

    req, resp = _kafka_frames()
    segs = []
    for i in range(5):
        segs += conversation(("10.0.0.1", 40000 + i), ("10.0.0.2", 9092), [("c", req), ("s", resp)],
                             ts0=1_700_000_000.0 + i)
    first_data = next(s for s in segs if s.payload)
    segs.append(first_data._replace(ts=1_700_000_010.0, flags=ACK | PSH))  # late copy
    d = Dissector(DissectConfig(keep_closed_connections=2))
    for s in segs:
        d.feed_segment(s)
    d.finish()
    assert len(d.connections) == 2
    c = d.packet_counts()
    assert c["packets"] == len(segs)
    assert d.packet_accounting_error() is None, c
