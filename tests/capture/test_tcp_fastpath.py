"""TcpReassembler.feed's inlined in-order path against the feed it replaced: the same events
and counters for in-order, reordered, duplicated, lost, cut and garbage segments."""

from __future__ import annotations

from helpers.pcapgen import conversation, mangle
from hypothesis import given, settings
from hypothesis import strategies as st

from kwinspect import model
from kwinspect.capture.packets import ACK, FIN, RST, SYN, TcpSegment
from kwinspect.capture.tcp import _MASK, TCP_PORT_REUSE, StreamData, StreamEvent, TcpReassembler

C = model.Endpoint("10.0.0.1", 40000)
S = model.Endpoint("10.0.0.2", 9092)
_EPS = [C, S, model.Endpoint("10.0.0.3", 5)]


class ReferenceReassembler(TcpReassembler):
    """TcpReassembler with the feed of before the in-order path was inlined."""

    def feed(self, seg: TcpSegment) -> list[StreamEvent]:
        """Process one segment; returns the events it caused (often one StreamData, or none)."""
        out: list[StreamEvent] = []
        self.stats.segments += 1
        entry = self._dirs.get((seg.src, seg.dst))
        if entry is None:
            entry = self._lookup_new(seg, out)
            if entry is None:
                return out
        conn, h, p = entry
        ts = seg.ts
        if ts > conn.last_ts:
            conn.last_ts = ts
        self._conns.move_to_end(conn)
        flags = seg.flags
        seq = seg.seq
        st = h.st
        st.segments += 1
        if flags & (RST | FIN) and not self._close_acceptable(conn, h, p, seg, out):
            flags &= ~(RST | FIN)  # added with RST/FIN validation, after the fast path
        if flags & SYN:
            if not h.started:
                self._see(conn, h, flags, seq)  # added with tcp.stream numbers, after the fast path
                h.syn_seen = True
                h.isn = seq
                h.start_at(seq + 1)
                if not conn.syn_seen or conn.client is None:
                    conn.syn_seen = True
                    if flags & ACK:
                        conn.server, conn.client = h.src, h.dst
                    else:
                        conn.client, conn.server = h.src, h.dst
            elif not flags & ACK and conn.closed is False and self._reused(conn, h, flags, seq):
                # (tshark's rule for a new tcp.stream, added with the stream numbers)
                # a new connection on the same 4-tuple without a close we saw
                self._issue(conn, h, ts, out, TCP_PORT_REUSE,
                            "new SYN on a 4-tuple whose connection was not closed",
                            model.SEVERITY_WARNING)
                self._close(conn, ts, "end", out)
                entry = self._lookup_new(seg, out)
                if entry is None:
                    return out
                conn, h, p = entry
                st = h.st
                st.segments += 1
                h.syn_seen = True
                h.isn = seq
                h.start_at(seq + 1)
                conn.syn_seen = True
                conn.client, conn.server = h.src, h.dst
            seq = (seq + 1) & _MASK
        elif not h.started:
            self._see(conn, h, flags, seq)
            h.start_at(seq)  # the capture began after this direction's SYN
        payload = seg.payload
        if payload or seg.missing:
            self._place(conn, h, h.unwrap(seq), payload, seg.missing, ts, out)
        if flags & ACK and p.started:
            a = p.unwrap(seg.ack)
            if p.peer_ack is None or a > p.peer_ack:
                if a - p.nxt <= self.max_window:
                    p.peer_ack = a
                    if p.ooo_s and a >= p.ooo_s[0]:
                        # the peer has received the hole's bytes: the capture lost them
                        self._acked_hole(conn, p, a, ts, out)
                    elif p.fin_at is not None and a > p.fin_at > p.nxt:
                        # the peer acknowledged the FIN: the bytes before it were lost
                        self._acked_hole(conn, p, p.fin_at, ts, out)
                    self._check_fin(p)
        if flags & FIN and h.fin_at is None:
            if conn.closed_by is None:  # added with closed_by, after the fast path
                conn.closed_by = seg.src
            h.fin_at = h.unwrap((seq + len(payload) + seg.missing) & _MASK)
            if h.fin_at > h.max_end:
                h.max_end = h.fin_at
        if h.fin_at is not None:
            self._check_fin(h)
        if h.hole_since is not None or p.hole_since is not None:
            for x in (h, p):
                if x.hole_since is not None:
                    self._hole_timer(conn, x, ts, out)
        if flags & RST:
            if conn.closed_by is None:
                conn.closed_by = seg.src
            self._close(conn, ts, "rst", out)
        elif h.fin_done and p.fin_done:
            self._close(conn, ts, "fin", out)
        if self._buffered_total > self.max_total_buffered:
            self._enforce_total(ts, out)
        return out


def _books(r: TcpReassembler) -> tuple:
    t = r.totals()
    halves = [(h.nxt, h.max_end, h.peer_ack, h.recent_bytes, tuple(h.recent or ()), h.fin_at, h.fin_done, h.st)
              if hasattr(conn, "h0") else (conn.cid, conn.isn, conn.last_ts)  # (a bare SYN's tcp._Embryo)
              for conn in r._conns for h in ((conn.h0, conn.h1) if hasattr(conn, "h0") else (None,))]
    return t, r.stats, r.buffered_bytes(), halves


def _same(segments, **kw) -> None:
    new, ref = TcpReassembler(**kw), ReferenceReassembler(**kw)
    for seg in segments:
        assert new.feed(seg) == ref.feed(seg)
        assert _books(new) == _books(ref)
        assert new.flush_idle(seg.ts) == ref.flush_idle(seg.ts)
    assert new.finish() == ref.finish()
    assert _books(new) == _books(ref)
    # with a data sink: what it is handed, then the events, is what the events were
    sunk, ref = TcpReassembler(**kw), ReferenceReassembler(**kw)
    handed: list = []
    sunk.data_sink = lambda cid, src, dst, data, ts: handed.append(("data", cid, src, dst, data, ts))
    for seg in segments:
        handed.clear()
        got = handed + [_plain(e) for e in sunk.feed(seg)]
        assert got == [_plain(e) for e in ref.feed(seg)]
        assert _books(sunk) == _books(ref)
    assert sunk.finish() == ref.finish()


def _plain(ev):
    if isinstance(ev, StreamData):
        return ("data", ev.conn_id, ev.src, ev.dst, ev.data, ev.ts)
    return ev


@settings(max_examples=300, deadline=None)
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
    kw=st.sampled_from([{}, {"max_ooo_bytes": 500}, {"overlap_check_bytes": 64}, {"ack_gap_delay": 0},
                        {"max_window": 700}]),
    seed=st.integers(0, 1000),
)
def test_mangled_conversations_as_the_reference(msgs, mss, isn, drop, dup, reorder, truncate, reseg,
                                                close, handshake, kw, seed):
    segs = conversation(C, S, msgs, mss=mss, isn_client=isn, isn_server=isn ^ 0x5A5A5A5A,
                        close=close, handshake=handshake)
    _same(mangle(segs, drop=drop, duplicate=dup, reorder=reorder, truncate=truncate,
                 resegment=reseg, seed=seed), **kw)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2), st.integers(0, 0xFFFFFFFF),
                          st.integers(0, 0xFFFFFFFF), st.integers(0, 0xFF),
                          st.binary(max_size=40), st.integers(0, 3), st.floats(0, 1e4)),
                max_size=40),
       st.sampled_from([8, 1 << 16]))
def test_arbitrary_segments_as_the_reference(raw_segs, window):
    segs = []
    seqs = {}
    for k, (a, b, seq, ack, flags, payload, missing, ts) in enumerate(raw_segs):
        if a == b:
            continue
        if k % 2:  # half of them continue their direction in order, to reach the inlined path
            seq = seqs.get((a, b), seq)
            missing = 0
        seqs[(a, b)] = (seq + len(payload) + missing + bool(flags & SYN)) & _MASK
        segs.append(TcpSegment(ts, _EPS[a], _EPS[b], seq, ack, flags, payload, k, missing))
    _same(segs, max_connections=2, max_window=window, max_ooo_bytes=64, max_total_buffered=128)
