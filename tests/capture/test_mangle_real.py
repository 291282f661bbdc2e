"""Real captures, mangled: the reassembled streams must stay consistent with the clean ones.

The clean reassembly of a real capture is the reference (it is itself checked
against tshark and the sockets elsewhere).  After dropping, duplicating,
reordering, truncating and re-segmenting its packets, every delivered byte must
sit at the same sequence position with the same value, lost bytes must be gaps,
and the books must balance.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.pcapgen import mangle

from kwinspect.capture.packets import PacketParser
from kwinspect.capture.readers import open_capture
from kwinspect.capture.tcp import StreamClosed, StreamData, StreamGap, TcpReassembler

PROJECT = Path(__file__).resolve().parents[2] / "captures"
_MASK = 0xFFFFFFFF


def _segments(path: Path):
    parser = PacketParser()
    with open_capture(path) as src:
        segs = [s for s in map(parser.parse, src) if s is not None]
    if src.issues:  # e.g. a capture being rewritten right now: not a stable reference
        pytest.skip(f"{path.name} does not read cleanly: {src.issues[0].message}")
    return segs


def _streams(segs):
    """{(a, b, src): (start_seq32, [(offset, bytes)], gap_bytes, span, stats)}"""
    r = TcpReassembler()
    evs = []
    for s in segs:
        evs += r.feed(s)
    evs += r.finish()
    out = {}
    data: dict = {}
    gaps: dict = {}
    for e in evs:
        if isinstance(e, StreamData):
            data.setdefault((e.conn_id.a, e.conn_id.b, e.src), []).append((e.offset, e.data))
        elif isinstance(e, StreamGap):
            k = (e.conn_id.a, e.conn_id.b, e.src)
            gaps[k] = gaps.get(k, 0) + e.nbytes
        elif isinstance(e, StreamClosed):
            for st in e.stats:
                k = (e.conn_id.a, e.conn_id.b, st.src)
                assert st.balanced(), st
                out[k] = (st.start & _MASK, data.get(k, []), gaps.get(k, 0),
                          st.end - st.start, st)
    return out


def _flat(start: int, chunks) -> dict[int, bytes]:
    return {(start + off) & _MASK: d for off, d in chunks}


def _byte_at(clean_start: int, clean_bytes: bytes, seq: int, n: int) -> bytes:
    off = (seq - clean_start) & _MASK
    return clean_bytes[off:off + n]


def _captures() -> list[Path]:
    files = sorted(PROJECT.glob("*.pcap"))
    public = Path(__file__).resolve().parents[3] / "shared" / "captures-public"
    files += sorted(public.glob("*.pcap*"))
    return files


CAPTURES = _captures()


@pytest.mark.skipif(not CAPTURES, reason="no real captures found (captures/ and "
                    "../shared/captures-public are both absent)")
@pytest.mark.parametrize("path", CAPTURES, ids=[p.name for p in CAPTURES])
def test_mangled_real_capture_stays_consistent(path):
    segs = _segments(path)
    clean = _streams(segs)
    clean_bytes = {k: b"".join(d for _, d in v[1]) for k, v in clean.items()}
    for seed, kw in enumerate([
        {"reorder": 0.5, "duplicate": 0.3, "resegment": 0.3},
        {"drop": 0.2, "reorder": 0.3},
        {"truncate": 0.3, "duplicate": 0.2},
        {"drop": 0.1, "duplicate": 0.1, "reorder": 0.2, "truncate": 0.1, "resegment": 0.1},
    ]):
        mangled = mangle(segs, seed=seed, **kw)
        got = _streams(mangled)
        lossless = not kw.get("drop") and not kw.get("truncate")
        for k, (start, chunks, gap, span, _st) in got.items():
            if k not in clean:
                continue  # e.g. a connection whose only segments were dropped
            cstart = clean[k][0]
            cb = clean_bytes[k]
            if clean[k][2]:
                continue  # the clean stream has gaps itself: offsets are not comparable
            for seq, d in _flat(start, chunks).items():
                assert _byte_at(cstart, cb, seq, len(d)) == d, (path.name, k, seed)
            if lossless and start == cstart:
                assert b"".join(d for _, d in chunks) == cb and gap == 0, (path.name, k, seed)
            if start == cstart:
                # a lost FIN can make the peer's ACK of it look like one more data byte
                assert span <= len(cb) + 1, (path.name, k, seed)
