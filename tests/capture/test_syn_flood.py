"""A SYN flood: memory per SYN-only connection is small, eviction rows are capped.

No wall-clock assertions: memory is measured with tracemalloc, work by counting rows.
"""

from __future__ import annotations

import gc
import tracemalloc

from kwinspect.capture.packets import SYN, TcpSegment
from kwinspect.dissect import Dissector
from kwinspect.model import Endpoint

SERVER = Endpoint("10.99.0.2", 9092)


def _syns(n: int) -> list[TcpSegment]:
    return [TcpSegment(1.0 + i * 1e-6, Endpoint(f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}",
                                                 1000 + i % 50000), SERVER, i, 0, SYN, b"", i + 1, 0)
            for i in range(n)]


def test_memory_per_syn_only_connection_is_small():
    segs = _syns(5001)
    d = Dissector()
    d.feed_segment(segs[0])
    gc.collect()
    tracemalloc.start()
    try:
        for s in segs[1:]:
            d.feed_segment(s)
        gc.collect()
        used, _peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    per_conn = used / 5000
    assert d.tcp.open_connections() == 5001
    # 6.4 KB before (two empty deques per direction were ~1.5 KB of it), 2.8 KB before a
    # bare SYN's connection was a compact record and its empty dicts and lists shared (~1.1 KB)
    assert per_conn < 1300, per_conn


def test_eviction_rows_are_capped_and_counted():
    d = Dissector()
    d.tcp.max_connections = 100
    rows = []
    for s in _syns(1100):
        d.feed_segment(s)
        rows += d.drain()
    d.finish()
    rows += d.drain()
    limit = [r for r in rows if r.kind == "limit_exceeded"]
    cap = d.tcp.max_issues_per_direction
    assert len(limit) == cap + 1
    assert limit[-1].message.startswith(f"{1000 - cap} more connections were closed early")
    assert d.tcp.stats.evicted == 1000
    assert d.packet_accounting_error() is None


def test_undecided_connections_hold_a_bounded_number_of_segments(monkeypatch):
    """Connections that never show whether they carry Kafka (no handshake captured, no
    answer) hold their segments while they wait; all together at most MAX_HELD_SEGMENTS,
    past which the oldest are given up as not Kafka: one row says why, one counts the rest."""
    import kwinspect.dissect as dissect_module
    from kwinspect.capture.packets import ACK, PSH

    monkeypatch.setattr(dissect_module, "MAX_HELD_SEGMENTS", 1000)
    server = Endpoint("10.99.0.2", 7000)
    clients = [Endpoint(f"10.1.{i >> 8}.{i & 255}", 2000 + i) for i in range(500)]
    d = Dissector()
    rows = []
    for r in range(8):
        for i, c in enumerate(clients):
            d.feed_segment(TcpSegment(1.0 + r + i * 1e-4, c, server, 1000 + 7 * r, 0, ACK | PSH,
                                      b"\x00\x00\x00\x05abc", 0, 0))
            rows += d.drain()
    given_up = [r for r in rows if r.kind == "not_kafka"]
    assert len(given_up) == 1 and "more than 1,000 segments" in given_up[0].message
    d.finish()
    rows = d.drain()
    (summary,) = [r for r in rows if r.kind == "limit_exceeded"]
    more = int(summary.message.split()[0].replace(",", ""))
    assert 375 - 1 <= more < 500  # 4,000 segments held at most 1,000: 3,000 given up, 8 per connection
    assert d.stats.kafka_connections == 0 and d.packet_accounting_error() is None
    assert d.byte_counts()["delivered"] == d.stats.non_kafka_bytes == 500 * 8 * 7
