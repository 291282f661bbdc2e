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
    # 6.4 KB before (two empty deques per direction were ~1.5 KB of it)
    assert per_conn < 3000, per_conn


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
