"""TCP reassembly: ordering, loss, overlap, close, caps, accounting.

Ground truth is what `conversation()` put on the wire; `mangle()` perturbs it
the way captures go wrong.  Every test checks the stream events against the
truth byte for byte: data chunks must sit at their true offsets, gaps must
cover exactly what is missing, and nothing may be zero-filled.
"""

from __future__ import annotations

import random

import pytest
from helpers.pcapgen import ACK, FIN, PSH, RST, SYN, conversation, mangle, stream_bytes
from hypothesis import given, settings
from hypothesis import strategies as st

from kwinspect import model
from kwinspect.capture.packets import TcpSegment
from kwinspect.capture.tcp import (
    StreamClosed,
    StreamData,
    StreamGap,
    StreamIssue,
    StreamOpened,
    TcpReassembler,
)

C = model.Endpoint("10.0.0.1", 40000)
S = model.Endpoint("10.0.0.2", 9092)


def run(segments, reasm: TcpReassembler | None = None, finish: bool = True):
    r = reasm or TcpReassembler()
    evs = []
    for seg in segments:
        evs += r.feed(seg)
    if finish:
        evs += r.finish()
    return evs, r


class Direction:
    def __init__(self) -> None:
        self.pieces: list[tuple[int, str, bytes | int]] = []  # (offset, "data"|"gap", payload)
        self.pos = 0

    def add(self, ev) -> None:
        assert ev.offset == self.pos, "events of a direction must be contiguous"
        if isinstance(ev, StreamData):
            assert ev.data, "no empty data events"
            self.pieces.append((self.pos, "data", ev.data))
            self.pos += len(ev.data)
        else:
            assert ev.nbytes > 0
            self.pieces.append((self.pos, "gap", ev.nbytes))
            self.pos += ev.nbytes

    def data(self) -> bytes:
        return b"".join(p for _, k, p in self.pieces if k == "data")

    def gap_bytes(self) -> int:
        return sum(p for _, k, p in self.pieces if k == "gap")


def directions(evs) -> dict[tuple[int, model.Endpoint], Direction]:
    out: dict = {}
    for ev in evs:
        if isinstance(ev, StreamData | StreamGap):
            out.setdefault((ev.conn_id.serial, ev.src), Direction()).add(ev)
    return out


def check_against(d: Direction, truth: bytes, *, complete: bool = True) -> None:
    """Data chunks equal the truth at their offsets; with complete, the whole truth is covered."""
    for off, kind, p in d.pieces:
        if kind == "data":
            assert truth[off:off + len(p)] == p, f"wrong bytes at offset {off}"
    if complete:
        assert d.pos == len(truth)


def check_accounting(evs) -> None:
    closed = [e for e in evs if isinstance(e, StreamClosed)]
    opened = [e for e in evs if isinstance(e, StreamOpened)]
    assert len(closed) == len(opened)
    dirs = directions(evs)
    for c in closed:
        for s in c.stats:
            assert s.balanced(), s
            d = dirs.get((c.conn_id.serial, s.src))
            delivered = len(d.data()) if d else 0
            gaps = d.gap_bytes() if d else 0
            assert (delivered, gaps) == (s.delivered, s.gap_bytes)


MSGS = [("c", bytes(random.Random(1).randbytes(5000))), ("s", b"R" * 3000),
        ("c", b"second request" * 20), ("s", bytes(range(256)) * 40)]


def test_clean_connection():
    segs = conversation(C, S, MSGS, mss=1000)
    evs, r = run(segs)
    opened = [e for e in evs if isinstance(e, StreamOpened)]
    assert len(opened) == 1
    o = opened[0]
    assert (o.client, o.server, o.syn_seen) == (C, S, True)
    dirs = directions(evs)
    assert dirs[(0, C)].data() == stream_bytes(MSGS, "c")
    assert dirs[(0, S)].data() == stream_bytes(MSGS, "s")
    assert not any(isinstance(e, StreamGap | StreamIssue) for e in evs)
    closed = [e for e in evs if isinstance(e, StreamClosed)]
    assert [c.reason for c in closed] == ["fin"]
    # the close comes from feed(), not from finish()
    evs_nofinish, _ = run(segs, finish=False)
    assert isinstance(evs_nofinish[-1], StreamClosed)
    check_accounting(evs)
    assert r.open_connections() == 0 and r.buffered_bytes() == 0


def test_data_timestamps_are_those_of_the_completing_segment():
    segs = conversation(C, S, [("c", b"abcdef")], mss=3, close=None)
    swapped = segs[:3] + [segs[4], segs[3]] + segs[5:]
    evs, _ = run(swapped)
    data = [e for e in evs if isinstance(e, StreamData)]
    assert [d.data for d in data] == [b"abcdef"]
    assert data[0].ts == segs[3].ts  # the late first half completed it


@pytest.mark.parametrize("isn", [0xFFFFFFFF, 0xFFFFFF00, 0xFFFFF000, 0])
def test_sequence_wraparound(isn):
    segs = conversation(C, S, MSGS, mss=700, isn_client=isn, isn_server=isn - 5)
    evs, _ = run(mangle(segs, reorder=0.3, duplicate=0.2, seed=3))
    dirs = directions(evs)
    assert dirs[(0, C)].data() == stream_bytes(MSGS, "c")
    assert dirs[(0, S)].data() == stream_bytes(MSGS, "s")
    check_accounting(evs)


def test_connection_started_before_capture():
    segs = conversation(C, S, MSGS, mss=1000, handshake=False, close=None)
    evs, _ = run(segs)
    o = next(e for e in evs if isinstance(e, StreamOpened))
    assert (o.client, o.server, o.syn_seen, o.a, o.b) == (None, None, False, C, S)
    dirs = directions(evs)
    assert dirs[(0, C)].data() == stream_bytes(MSGS, "c")
    assert [e.reason for e in evs if isinstance(e, StreamClosed)] == ["end"]
    check_accounting(evs)


def test_syn_ack_first_names_roles():
    segs = conversation(C, S, [("c", b"x")])[1:]
    evs, _ = run(segs)
    o = next(e for e in evs if isinstance(e, StreamOpened))
    assert (o.client, o.server, o.syn_seen) == (C, S, True)


@pytest.mark.parametrize("seed", range(8))
def test_reorder_and_duplicates_lose_nothing(seed):
    segs = conversation(C, S, MSGS, mss=500)
    evs, _ = run(mangle(segs, reorder=0.4, duplicate=0.3, resegment=0.3, reorder_window=6,
                        seed=seed))
    dirs = directions(evs)
    assert dirs[(0, C)].data() == stream_bytes(MSGS, "c")
    assert dirs[(0, S)].data() == stream_bytes(MSGS, "s")
    assert not any(isinstance(e, StreamGap) for e in evs)
    check_accounting(evs)


@pytest.mark.parametrize("seed", range(8))
def test_lost_segments_become_exact_gaps(seed):
    segs = conversation(C, S, MSGS, mss=500)
    mangled = mangle(segs, drop=0.25, reorder=0.2, duplicate=0.1, seed=seed)
    evs, _ = run(mangled)
    dirs = directions(evs)
    for who, ep in (("c", C), ("s", S)):
        truth = stream_bytes(MSGS, who)
        d = dirs[(0, ep)]
        check_against(d, truth)
        # every byte whose segment survived is delivered; the others are in gaps
        dropped = sum(len(s.payload) for s in segs if s.src == ep and s.payload) - sum(
            len(s.payload) for s in {m.index: m for m in mangled if m.src == ep}.values())
        assert d.gap_bytes() == dropped
    assert not any(isinstance(e, StreamData) and not e.data for e in evs)
    check_accounting(evs)


def test_gap_is_declared_when_the_peer_acks_past_a_hole():
    segs = conversation(C, S, [("c", b"A" * 300)], mss=100, close=None)
    # handshake(3), data 100/100/100, server ACK
    lossy = segs[:4] + segs[5:]  # second data segment lost
    evs, _ = run(lossy, TcpReassembler(ack_gap_delay=0), finish=False)
    gaps = [e for e in evs if isinstance(e, StreamGap)]
    assert [(g.nbytes, g.offset, g.reason) for g in gaps] == [(100, 100, "acked")]
    assert directions(evs)[(0, C)].data() == b"A" * 200


def test_lost_tail_is_measured_from_the_peer_ack():
    segs = conversation(C, S, [("c", b"B" * 300)], mss=100, close=None)
    lossy = segs[:5] + segs[6:]  # the last data segment lost; the server's ACK survives
    evs, _ = run(lossy)
    gaps = [e for e in evs if isinstance(e, StreamGap)]
    assert [(g.nbytes, g.offset) for g in gaps] == [(100, 200)]
    check_accounting(evs)


def test_lost_data_before_fin():
    segs = conversation(C, S, [("c", b"F" * 200)], mss=100)
    # drop the client's second data segment and the server's data ACK
    lossy = [s for i, s in enumerate(segs) if i not in (4, 5)]
    evs, _ = run(lossy, TcpReassembler(ack_gap_delay=0), finish=False)
    assert [e.reason for e in evs if isinstance(e, StreamClosed)] == ["fin"]
    assert sum(e.nbytes for e in evs if isinstance(e, StreamGap)) == 100
    check_accounting(evs)


def test_overlap_conflict_first_copy_wins():
    segs = conversation(C, S, MSGS, mss=400)
    evs, _ = run(mangle(segs, conflict=0.3, seed=5))  # the bad copy comes second
    dirs = directions(evs)
    assert dirs[(0, C)].data() == stream_bytes(MSGS, "c")
    assert dirs[(0, S)].data() == stream_bytes(MSGS, "s")
    issues = [e.issue for e in evs if isinstance(e, StreamIssue)]
    assert issues and all(i.kind == model.TCP_OVERLAP_CONFLICT for i in issues)
    closed = next(e for e in evs if isinstance(e, StreamClosed))
    assert sum(s.conflicts for s in closed.stats) >= len(issues)
    check_accounting(evs)


def test_conflict_in_out_of_order_buffer():
    segs = conversation(C, S, [("c", b"0123456789" * 3)], mss=10, close=None, acks=False)
    d1, d2, d3 = segs[3:6]
    bad = d3._replace(payload=b"XXXXXXXXXX")
    evs, _ = run(segs[:3] + [d3, bad, d2, d1])
    assert directions(evs)[(0, C)].data() == b"0123456789" * 3
    assert any(isinstance(e, StreamIssue) and e.issue.kind == model.TCP_OVERLAP_CONFLICT
               for e in evs)


def test_snaplen_truncated_segments_become_gaps():
    segs = conversation(C, S, MSGS, mss=1000)
    cut = mangle(segs, truncate=0.5, seed=2)
    evs, _ = run(cut)
    dirs = directions(evs)
    missing = {ep: sum(s.missing for s in cut if s.src == ep) for ep in (C, S)}
    assert missing[C] + missing[S] > 0
    for who, ep in (("c", C), ("s", S)):
        check_against(dirs[(0, ep)], stream_bytes(MSGS, who))
        assert dirs[(0, ep)].gap_bytes() == missing[ep]
    assert any(isinstance(e, StreamGap) and e.reason == "snaplen" for e in evs)
    check_accounting(evs)


def test_rst_closes_and_flushes():
    segs = conversation(C, S, [("c", b"r" * 500)], mss=100, close="rst", acks=False)
    # lose one data segment: the RST must still flush the rest, with a gap
    evs, _ = run(segs[:4] + segs[5:], finish=False)
    closed = [e for e in evs if isinstance(e, StreamClosed)]
    assert [c.reason for c in closed] == ["rst"]
    d = directions(evs)[(0, C)]
    check_against(d, b"r" * 500, complete=False)
    assert d.gap_bytes() == 100 and len(d.data()) == 400
    check_accounting(evs)


def test_retransmission_after_close_does_not_reopen():
    segs = conversation(C, S, [("c", b"q" * 100)])
    late = segs[3]
    evs, r = run(segs + [late, segs[-2]], finish=False)
    assert len([e for e in evs if isinstance(e, StreamOpened)]) == 1
    assert r.stats.after_close_bytes == 100
    closed = next(e for e in evs if isinstance(e, StreamClosed))
    assert all(s.balanced() for s in closed.stats)


def test_port_reuse_gets_a_new_connection_id():
    first = conversation(C, S, [("c", b"one")])
    second = conversation(C, S, [("c", b"two")], isn_client=777_777, ts0=first[-1].ts + 1)
    evs, _ = run(first + second)
    opened = [e for e in evs if isinstance(e, StreamOpened)]
    assert [o.conn_id.serial for o in opened] == [0, 1]
    assert opened[0].conn_id != opened[1].conn_id
    dirs = directions(evs)
    assert dirs[(0, C)].data() == b"one" and dirs[(1, C)].data() == b"two"


def test_new_syn_without_close_ends_old_connection():
    first = conversation(C, S, [("c", b"one")], close=None)
    second = conversation(C, S, [("c", b"two")], isn_client=999, ts0=first[-1].ts + 1)
    evs, _ = run(first + second)
    assert [e.reason for e in evs if isinstance(e, StreamClosed)] == ["end", "fin"]
    assert directions(evs)[(1, C)].data() == b"two"


def test_idle_flush_uses_packet_time():
    segs = conversation(C, S, [("c", b"idle")], close=None)
    r = TcpReassembler(idle_timeout=60)
    evs, _ = run(segs, r, finish=False)
    assert r.flush_idle(segs[-1].ts + 59) == []
    out = r.flush_idle(segs[-1].ts + 61)
    assert [e.reason for e in out if isinstance(e, StreamClosed)] == ["idle"]
    assert r.open_connections() == 0
    # more traffic on the same 4-tuple: a new connection without SYN
    more = conversation(C, S, [("c", b"again")], handshake=False, close=None,
                        isn_client=segs[-1].seq, ts0=segs[-1].ts + 100)
    evs2, _ = run(more, r)
    o = next(e for e in evs2 if isinstance(e, StreamOpened))
    assert o.conn_id.serial == 1 and not o.syn_seen


def test_out_of_order_cap_skips_ahead_and_reports():
    cap = 10_000
    data = bytes(random.Random(9).randbytes(100_000))
    segs = conversation(C, S, [("c", data)], mss=1000, acks=False, close=None)
    lossy = segs[:3] + segs[4:]  # the first data segment is lost; no ACKs reveal it
    r = TcpReassembler(max_ooo_bytes=cap)
    evs = []
    for seg in lossy:
        evs += r.feed(seg)
        assert r.buffered_bytes() <= cap + 1000  # never more than the cap plus one segment
    evs += r.finish()
    d = directions(evs)[(0, C)]
    check_against(d, data)
    assert d.gap_bytes() == 1000
    assert any(isinstance(e, StreamIssue) and e.issue.kind == model.LIMIT_EXCEEDED for e in evs)
    assert any(isinstance(e, StreamGap) and e.reason == "buffer_cap" for e in evs)
    check_accounting(evs)


def test_total_buffer_cap_across_connections():
    r = TcpReassembler(max_ooo_bytes=1 << 30, max_total_buffered=20_000)
    evs = []
    truths = {}
    for k in range(5):
        c = model.Endpoint(f"10.0.1.{k + 1}", 50000 + k)
        data = bytes([k]) * 30_000
        truths[k] = data
        segs = conversation(c, S, [("c", data)], mss=1000, acks=False, close=None)
        for seg in segs[:3] + segs[4:]:
            evs += r.feed(seg)
            assert r.buffered_bytes() <= 20_000 + 1000
    evs += r.finish()
    for (serial, _src), d in directions(evs).items():
        check_against(d, truths[serial])
    check_accounting(evs)


def test_max_connections_evicts_least_recent():
    r = TcpReassembler(max_connections=3)
    evs = []
    for k in range(6):
        c = model.Endpoint("10.0.2.1", 1000 + k)
        evs += run(conversation(c, S, [("c", b"x")], close=None), r, finish=False)[0]
        assert r.open_connections() <= 3
    assert r.stats.evicted == 3
    evs += r.finish()
    check_accounting(evs)


def test_memory_bounded_on_long_lived_connection():
    """20k segments with steady reordering: buffers and the overlap window stay small."""
    r = TcpReassembler(overlap_check_bytes=4096)
    rnd = random.Random(4)
    seq = 1
    pending = []
    total = 0
    for i in range(20_000):
        payload = bytes([i & 0xFF]) * rnd.randint(1, 200)
        pending.append(TcpSegment(float(i), C, S, seq & 0xFFFFFFFF, 0, ACK | PSH, payload, i))
        seq += len(payload)
        total += len(payload)
        if len(pending) >= 3:
            rnd.shuffle(pending)
            for seg in pending:
                r.feed(seg)
            pending.clear()
        if i % 1000 == 999:
            h = next(iter(r._conns)).h0
            assert h.recent_bytes <= 4096 + 3 * 200 and len(h.ooo_s) <= 3  # + one drained run
    for seg in pending:
        r.feed(seg)
    r.finish()
    t = r.totals()
    assert t.delivered == total and t.gap_bytes == 0


def test_feeding_one_byte_segments():
    data = b"byte by byte reassembly " * 10
    segs = conversation(C, S, [("c", data), ("s", data[::-1])], mss=1)
    evs, _ = run(mangle(segs, reorder=0.5, reorder_window=10, seed=1))
    dirs = directions(evs)
    assert dirs[(0, C)].data() == data and dirs[(0, S)].data() == data[::-1]


def test_stray_rst_does_not_open_a_connection():
    evs, r = run([TcpSegment(1.0, C, S, 5, 0, RST, b"", 1)])
    assert evs == [] and r.stats.stray_segments == 1


def test_syn_with_data_and_fin_with_data():
    segs = [TcpSegment(1.0, C, S, 100, 0, SYN, b"tfo", 1),
            TcpSegment(1.1, S, C, 900, 104, SYN | ACK, b"", 2),
            TcpSegment(1.2, C, S, 104, 901, ACK | FIN, b"-end", 3),
            TcpSegment(1.3, S, C, 901, 109, ACK | FIN, b"", 4),
            TcpSegment(1.4, C, S, 109, 902, ACK, b"", 5)]
    evs, _ = run(segs, finish=False)
    assert directions(evs)[(0, C)].data() == b"tfo-end"
    assert [e.reason for e in evs if isinstance(e, StreamClosed)] == ["fin"]


def test_implausible_sequence_jump_is_dropped_and_counted():
    segs = conversation(C, S, [("c", b"ok")], close=None, acks=False)
    bogus = segs[-1]._replace(seq=(segs[-1].seq + (1 << 31) - 10) & 0xFFFFFFFF, payload=b"??")
    evs, _ = run(segs + [bogus])
    assert directions(evs)[(0, C)].data() == b"ok"
    closed = next(e for e in evs if isinstance(e, StreamClosed))
    cs = next(s for s in closed.stats if s.src == C)
    assert cs.dropped_bytes == 2 and cs.balanced()
    assert any(isinstance(e, StreamIssue) and e.issue.kind == "tcp_out_of_window" for e in evs)


@settings(max_examples=400, deadline=None)
@given(
    msgs=st.lists(st.tuples(st.sampled_from("cs"), st.binary(min_size=1, max_size=3000)),
                  min_size=1, max_size=6),
    mss=st.integers(1, 1500),
    isn=st.integers(0, 0xFFFFFFFF),
    drop=st.sampled_from([0.0, 0.1, 0.4]),
    dup=st.sampled_from([0.0, 0.3]),
    reorder=st.sampled_from([0.0, 0.3, 0.8]),
    truncate=st.sampled_from([0.0, 0.2]),
    reseg=st.sampled_from([0.0, 0.3]),
    close=st.sampled_from(["fin", "rst", None]),
    handshake=st.booleans(),
    cap=st.sampled_from([500, 4 << 20]),
    seed=st.integers(0, 1000),
)
def test_property_accounting_and_byte_exactness(msgs, mss, isn, drop, dup, reorder, truncate,
                                               reseg, close, handshake, cap, seed):
    segs = conversation(C, S, msgs, mss=mss, isn_client=isn, isn_server=isn ^ 0x5A5A5A5A,
                        close=close, handshake=handshake)
    mangled = mangle(segs, drop=drop, duplicate=dup, reorder=reorder, truncate=truncate,
                     resegment=reseg, seed=seed)
    evs, r = run(mangled, TcpReassembler(max_ooo_bytes=cap))
    check_accounting(evs)
    dirs = directions(evs)
    for who, ep in (("c", C), ("s", S)):
        truth = stream_bytes(msgs, who)
        d = dirs.get((0, ep))
        if d is None:
            continue
        # a direction starts at the first sequence number captured for it (after its SYN)
        m0 = next(m for m in mangled if m.src == ep)
        isn0 = isn if ep == C else isn ^ 0x5A5A5A5A
        base = ((m0.seq + (1 if m0.flags & SYN else 0)) - (isn0 + (1 if handshake else 0))
                ) & 0xFFFFFFFF
        if base > len(truth):
            continue
        check_against(d, truth[base:], complete=False)
        if not drop and not truncate and handshake and cap > 10_000:
            assert d.data() == truth
    assert r.buffered_bytes() == 0 and r.open_connections() == 0
    t = r.totals()
    assert t.payload_bytes == t.delivered + t.duplicate_bytes + t.late_bytes + t.dropped_bytes


def test_keepalive_probe_is_not_a_conflict():
    segs = conversation(C, S, [("c", b"hello")], close=None, acks=False)
    last = segs[-1]
    probe = last._replace(seq=(last.seq + 4) & 0xFFFFFFFF, payload=b"\x00", ts=last.ts + 60)
    evs, _ = run(segs + [probe])
    assert directions(evs)[(0, C)].data() == b"hello"
    assert not any(isinstance(e, StreamIssue) for e in evs)
    check_accounting(evs)


def test_ack_captured_before_its_data_reports_late_bytes():
    """Capture-side reordering (e.g. merged interfaces): the ACK overtakes the data it
    acknowledges.  The hole becomes a gap; the data, when it shows up, is counted as
    late and reported - never spliced into a stream that already moved on."""
    segs = conversation(C, S, [("c", b"A" * 300)], mss=100, close=None)
    reordered = segs[:4] + [segs[5], segs[6], segs[4]]  # data 2 after data 3 and the ACK
    evs, _ = run(reordered, TcpReassembler(ack_gap_delay=0))
    assert [(g.nbytes, g.reason) for g in evs if isinstance(g, StreamGap)] == [(100, "acked")]
    assert any(isinstance(e, StreamIssue) and e.issue.kind == "tcp_late_data" for e in evs)
    closed = next(e for e in evs if isinstance(e, StreamClosed))
    cs = next(s for s in closed.stats if s.src == C)
    assert cs.late_bytes == 100 and cs.balanced()


_EPS = [C, S, model.Endpoint("10.0.0.3", 5)]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2), st.integers(0, 0xFFFFFFFF),
                          st.integers(0, 0xFFFFFFFF), st.integers(0, 0xFF),
                          st.binary(max_size=40), st.integers(0, 50), st.floats(0, 1e4)),
                max_size=40),
       st.sampled_from([16, 1 << 20]))
def test_fuzz_arbitrary_segments(raw_segs, cap):
    """Garbage in (random seq/ack/flags/endpoints/timestamps): no exception, books balance."""
    r = TcpReassembler(max_ooo_bytes=cap, max_total_buffered=cap * 2, max_connections=2,
                       max_window=1 << 16)
    evs = []
    for k, (a, b, seq, ack, flags, payload, missing, ts) in enumerate(raw_segs):
        if a == b:
            continue
        evs += r.feed(TcpSegment(ts, _EPS[a], _EPS[b], seq, ack, flags, payload, k, missing))
        evs += r.flush_idle(ts)
    evs += r.finish()
    for e in evs:
        if isinstance(e, StreamClosed):
            assert all(s.balanced() for s in e.stats), e.stats
    t = r.totals()
    assert t.payload_bytes == t.delivered + t.duplicate_bytes + t.late_bytes + t.dropped_bytes
    assert r.buffered_bytes() == 0


def test_closed_connection_lingers_then_forgets():
    segs = conversation(C, S, [("c", b"bye")])
    r = TcpReassembler(closed_linger=30)
    evs, _ = run(segs, r, finish=False)
    assert r.open_connections() == 0 and len(r._closed) == 1
    # a retransmitted FIN inside the linger time is absorbed
    fin = next(s for s in segs if s.flags & FIN and s.src == C)
    assert r.feed(fin._replace(ts=fin.ts + 10)) == []
    # after it, the same 4-tuple opens a new (SYN-less) connection
    out = r.feed(fin._replace(ts=fin.ts + 100, flags=ACK | PSH, payload=b"new"))
    opened = [e for e in out if isinstance(e, StreamOpened)]
    assert len(opened) == 1 and opened[0].conn_id.serial == 1 and not opened[0].syn_seen
    assert len(r._closed) == 0


def test_closed_connections_expire_oldest_first_as_new_ones_open():
    """Each closed 4-tuple absorbs late segments for closed_linger seconds of packet time;
    its late-data row comes when a later segment finds it expired, whatever else closed
    in between (the expiry check remembers the oldest close time)."""
    c2, c3 = model.Endpoint("10.0.0.3", 40001), model.Endpoint("10.0.0.4", 40002)
    a = conversation(C, S, [("c", b"a")], ts0=1000.0)
    b = conversation(c2, S, [("c", b"b")], ts0=1020.0)
    r = TcpReassembler(closed_linger=30)
    run(a + b, r, finish=False)
    fin_a = next(s for s in a if s.flags & FIN and s.src == C)
    fin_b = next(s for s in b if s.flags & FIN and s.src == c2)

    def late_rows(out):
        return [e.issue.message for e in out if isinstance(e, StreamIssue) and e.issue.kind == "tcp_late_data"]

    # both linger: retransmitted data is absorbed as late bytes, no row yet
    assert r.feed(fin_a._replace(ts=1010.0, flags=ACK | PSH, payload=b"x")) == []
    assert r.feed(fin_b._replace(ts=1025.0, flags=ACK | PSH, payload=b"yy")) == []
    # a new connection at 1040: a (closed at ~1000) has expired, b (closed at ~1020) not
    out = r.feed(conversation(c3, S, [("c", b"c")], ts0=1040.0)[0])
    assert [m.split(": ")[0] for m in late_rows(out)] == [f"{C} <-> {S}"]
    assert r.feed(fin_b._replace(ts=1045.0, flags=ACK | PSH, payload=b"zz")) == []  # b still lingers
    out = r.feed(conversation(c3, S, [("c", b"c")], ts0=1060.0)[0]._replace(src=C, dst=S))
    assert [m.split(": ")[0] for m in late_rows(out)] == [f"{S} <-> {c2}"]  # (in canonical order)
    assert "2 segments" in late_rows(out)[0]


def test_conn_id_is_canonical_and_printable():
    a = TcpReassembler()
    b = TcpReassembler()
    segs = conversation(C, S, [("s", b"x")], handshake=False, close=None)
    ea, _ = run(segs, a)
    eb, _ = run([s for s in segs if s.src == S] + [s for s in segs if s.src == C], b)
    ida = next(e for e in ea if isinstance(e, StreamOpened)).conn_id
    idb = next(e for e in eb if isinstance(e, StreamOpened)).conn_id
    assert ida == idb and str(ida) == "10.0.0.1:40000<->10.0.0.2:9092#0"


def test_ack_gap_delay_absorbs_an_ack_captured_just_before_its_data():
    segs = conversation(C, S, [("c", b"A" * 300)], mss=100, close=None, dt=0.0001)
    reordered = segs[:4] + [segs[5], segs[6], segs[4]]
    evs, _ = run(reordered)  # default ack_gap_delay
    assert not any(isinstance(e, StreamGap | StreamIssue) for e in evs)
    assert directions(evs)[(0, C)].data() == b"A" * 300


def test_ack_gap_delay_declares_the_gap_later():
    segs = conversation(C, S, [("c", b"A" * 300), ("s", b"ok")], mss=100, close=None)
    lossy = segs[:4] + segs[5:]  # second data segment really lost
    r = TcpReassembler(ack_gap_delay=0.5)
    evs, _ = run(lossy, r, finish=False)
    assert not any(isinstance(e, StreamGap) for e in evs)  # still waiting (packet time)
    assert r.buffered_bytes() == 100
    out = r.flush_idle(lossy[-1].ts + 1.0)  # packet time moved on: the hole is declared
    gaps = [e for e in out if isinstance(e, StreamGap)]
    assert [(g.nbytes, g.offset, g.reason) for g in gaps] == [(100, 100, "acked")]
    assert r.open_connections() == 1 and r.buffered_bytes() == 0
    # the same happens on the connection's next segment
    r2 = TcpReassembler(ack_gap_delay=0.5)
    evs2, _ = run(lossy, r2, finish=False)
    later = segs[-1]._replace(ts=segs[-1].ts + 1.0)
    out2 = r2.feed(later)
    assert [(g.nbytes, g.reason) for g in out2 if isinstance(g, StreamGap)] == [(100, "acked")]


def test_closed_by_names_the_side_whose_fin_or_rst_came_first():
    # client FIN first (the generator's order)
    segs = conversation(C, S, MSGS[:2], mss=1000)
    closed = [e for e in run(segs)[0] if isinstance(e, StreamClosed)]
    assert [(c.reason, c.closed_by) for c in closed] == [("fin", C)]
    # the server's FIN first: swap the two FIN segments (and their timestamps)
    c_fin, s_fin = segs[-3], segs[-2]
    swapped = [*segs[:-3], s_fin._replace(ts=c_fin.ts), c_fin._replace(ts=s_fin.ts), segs[-1]]
    closed = [e for e in run(swapped)[0] if isinstance(e, StreamClosed)]
    assert [(c.reason, c.closed_by) for c in closed] == [("fin", S)]
    # a reset from the client
    segs = conversation(C, S, [("c", b"r" * 300)], mss=100, close="rst")
    closed = [e for e in run(segs, finish=False)[0] if isinstance(e, StreamClosed)]
    assert [(c.reason, c.closed_by) for c in closed] == [("rst", C)]
    # no FIN or RST in the capture: nobody closed it
    segs = conversation(C, S, MSGS[:2], mss=1000, close=None)
    closed = [e for e in run(segs)[0] if isinstance(e, StreamClosed)]
    assert [(c.reason, c.closed_by) for c in closed] == [("end", None)]


def test_holes_flushed_together_come_out_in_the_order_they_opened():
    """flush_idle declares the waiting holes of many connections at once: their gaps come
    in the order the holes opened, not in an order set by where objects sit in memory
    (the rows of a capture were not the same from one run to the next)."""
    from kwinspect.capture.tcp import StreamGap

    r = TcpReassembler(ack_gap_delay=0.5)
    opened = []
    for k in range(60):
        c = model.Endpoint(f"10.1.{k // 250}.{k % 250 + 1}", 40000 + k)
        s = model.Endpoint("10.0.0.2", 9092)
        # data [0, 100), a hole [100, 150), data [150, 200), then the broker acknowledges 200
        for seq, payload, src, dst, flags in ((1000, b"a" * 100, c, s, ACK), (1150, b"c" * 50, c, s, ACK),
                                              (5000, b"", s, c, ACK)):
            r.feed(TcpSegment(1.0 + k / 1000, src, dst, seq, 1200 if src is s else 5000, flags, payload, k))
        opened.append(c)
    gaps = [ev.src for ev in r.flush_idle(10.0) if isinstance(ev, StreamGap)]
    assert gaps == opened
