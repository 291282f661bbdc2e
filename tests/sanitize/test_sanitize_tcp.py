"""TCP behaviour survives sanitizing: retransmissions, reordering, lost segments, resets.

Real captures are mangled the way real captures go wrong (tests/helpers/pcapgen.mangle:
duplicated, re-segmented, reordered and dropped segments), sanitized, and tshark's TCP
analysis of both files (its expert messages: retransmissions, previous segment not
captured, duplicate ACKs, ACKed unseen segments, resets) must be the same, as must the
requests kwinspect finds.
"""

from __future__ import annotations

import collections
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.pcapgen import mangle, write_pcap

from kwinspect.capture.packets import PacketParser
from kwinspect.capture.readers import open_capture
from tests.sanitize.test_sanitize_captures import ENV, SECRET, requests_of, rows

ROOT = Path(__file__).resolve().parents[2]
TSHARK = shutil.which("tshark")

pytestmark = pytest.mark.skipif(TSHARK is None, reason="tshark is the oracle for these tests")


def tcp_analysis(path: Path) -> collections.Counter:
    out = subprocess.run([TSHARK, "-r", str(path), "-T", "fields", "-e", "_ws.expert.message"],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    found = collections.Counter()
    for line in out.splitlines():
        for message in filter(None, line.split(",")):
            if not message.startswith("Malformed"):  # Kafka-level, not TCP (see below)
                found[re.sub(r"\s*\(#\d+\)", "", message).strip()] += 1
    return found


def segments_of(path: Path):
    parser, segs = PacketParser(), []
    with open_capture(path) as source:
        for raw in source:
            seg = parser.parse(raw)
            if seg is not None:
                segs.append(seg)
    return segs


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("name", ["tansu-produce-consume.pcap", "netns-mtu1500-produce-consume.pcap"])
def test_tcp_analysis_and_requests_are_unchanged(tmp_path, name, seed):
    mangled = tmp_path / "mangled.pcap"
    write_pcap(mangled, mangle(segments_of(ROOT / "captures" / name), duplicate=0.05, resegment=0.05,
                               reorder=0.05, drop=0.02, seed=seed))
    out = tmp_path / "sanitized.pcap"
    # a fixed secret: the same client ports every run (with a random one, a port now and
    # then maps onto one tshark gives to another dissector, whose expert messages differ)
    proc = subprocess.run([sys.executable, "-m", "kwinspect", "sanitize", str(mangled), "-o", str(out),
                           "--secret", SECRET, "--report", str(tmp_path / "r.json")], capture_output=True,
                          text=True, env=ENV, timeout=300)
    assert proc.returncode == 0, proc.stderr
    before = tcp_analysis(mangled)
    assert sum(v for k, v in before.items() if "retransmission" in k or "not captured" in k or "Duplicate ACK" in k) > 0, before
    assert tcp_analysis(out) == before
    assert requests_of(rows("exchanges", out)) == requests_of(rows("exchanges", mangled))
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["packets"]["written"] == report["packets"]["read"]  # nothing left out, nothing added
