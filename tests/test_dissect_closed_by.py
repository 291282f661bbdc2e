"""ConnectionInfo.closed_by against tshark: the side whose FIN or RST the capture shows first."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess

import pytest

from kwinspect.dissect import DissectConfig
from kwinspect.run.files import FileRun, dissect_files

CAPTURES = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "captures", "*.pcap")))
TSHARK = shutil.which("tshark")


def _first_closer_by_tshark(path: str) -> dict[frozenset, str]:
    """{frozenset of the two "ip:port" ends: "ip:port" of the first FIN/RST sender}."""
    out = subprocess.run(
        [TSHARK, "-r", path, "-Y", "tcp.flags.fin == 1 || tcp.flags.reset == 1", "-T", "fields",
         "-e", "ip.src", "-e", "ipv6.src", "-e", "tcp.srcport", "-e", "ip.dst", "-e", "ipv6.dst",
         "-e", "tcp.dstport"], capture_output=True, text=True, check=True).stdout
    first: dict[frozenset, str] = {}
    for line in out.splitlines():
        s4, s6, sport, d4, d6, dport = line.split("\t")
        src = f"[{s6}]:{sport}" if s6 else f"{s4}:{sport}"
        dst = f"[{d6}]:{dport}" if d6 else f"{d4}:{dport}"
        first.setdefault(frozenset((src, dst)), src)
    return first


@pytest.mark.skipif(TSHARK is None, reason="tshark is the oracle here (make sysdeps installs it)")
@pytest.mark.parametrize("path", CAPTURES, ids=os.path.basename)
def test_closed_by_is_the_first_fin_or_rst_sender(path):
    with open(path[:-5] + ".manifest.json") as f:
        ports = frozenset(json.load(f)["kafka_ports"])
    run = FileRun()
    from rig.verify import keylog_of

    keys = None
    if keylog_of(path):  # TLS captures ship their key log
        from kwinspect.capture.keylog import KeyLog

        keys = KeyLog()
        keys.add_file(keylog_of(path))
    for _ in dissect_files([path], DissectConfig(kafka_ports=ports, tls_keys=keys), run):
        pass
    truth = _first_closer_by_tshark(path)
    checked = 0
    for info in run.dissector.connections.values():
        if info.kind != "kafka" or info.closed not in ("fin", "rst"):
            continue
        sender = truth.get(frozenset((str(info.client), str(info.broker))))
        if sender is None:  # port reuse: tshark's key is not unique per connection
            continue
        assert info.closed_by == ("client" if sender == str(info.client) else "broker"), info.stream
        checked += 1
    assert checked or not truth


def test_a_broker_set_down_closes_its_connections():
    path = next(p for p in CAPTURES if "broker-down" in p)
    run = FileRun()
    for _ in dissect_files([path], DissectConfig(kafka_ports=frozenset({36627, 42723, 41257})), run):
        pass
    by = [info.closed_by for info in run.dissector.connections.values() if info.kind == "kafka"]
    assert "broker" in by and "client" in by
