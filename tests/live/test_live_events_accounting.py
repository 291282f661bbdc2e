"""live_events keeps the Dissector's packet accounting whole while closed connections are dropped.

A live session used to prune closed connections from ``dissector.connections`` by hand,
which lost their packets from ``packet_counts()`` and left stale 4-tuple entries; the
Dissector's own ``keep_closed_connections`` bound now does it, as offline.
"""

from __future__ import annotations

import json
import os
import threading
from types import SimpleNamespace

from kwinspect.capture.readers import open_capture
from kwinspect.dissect import DissectConfig, Dissector
from kwinspect.run.live import StopWhen, live_events

CAPTURE = os.path.join(os.path.dirname(__file__), "..", "..", "captures", "tansu-produce-consume.pcap")


class _ReplayCapture:
    """What live_events needs of a LiveCapture, replaying a capture file in batches."""

    def __init__(self, path: str) -> None:
        with open_capture(path) as src:
            self._packets = list(src)
        self.counters = SimpleNamespace(packets=0)

    def read(self, _wait: float, limit: int):
        batch = self._packets[:min(limit, 100)]
        del self._packets[:len(batch)]
        self.counters.packets += len(batch)
        return batch

    def kernel_stats(self) -> None:
        pass


def test_every_packet_is_counted_when_closed_connections_are_dropped():
    with open(CAPTURE[:-5] + ".manifest.json") as f:
        ports = frozenset(json.load(f)["kafka_ports"])
    capture = _ReplayCapture(CAPTURE)
    total = len(capture._packets)
    d = Dissector(DissectConfig(kafka_ports=ports, keep_closed_connections=2))
    stop = StopWhen(threading.Event(), count=total)
    events = [ev for ev in live_events(capture, d, stop, tick=0.0, drain=0) if ev is not None]
    assert events
    counts = d.packet_counts()
    assert counts["packets"] == total
    assert counts["kafka"] + counts["non_kafka"] + counts["not_tcp"] + counts["unparseable"] == total
    assert counts["kafka"] > 0 and len(d.connections) <= 2 < 15  # the capture has 15 connections
