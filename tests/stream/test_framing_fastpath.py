"""FrameSplitter.feed's fast paths (frames sliced straight out of a chunk; no timestamp entry
for a chunk inside a frame) against the feed they replaced: same events, timestamps included,
same counters, for any bytes, chunking, timestamps and gaps."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kwinspect.stream.framing import _NORMAL, FrameSplitter, RequestValidator, ResponseValidator
from tests.stream.test_framing import _frames_blob, mixed_stream


class ReferenceSplitter(FrameSplitter):
    """FrameSplitter with the feed of before the fast paths."""

    def feed(self, data, ts: float, pkt: int = 0) -> None:
        if self._finished or not data:
            return
        n = len(data)
        buf = self._buf
        self._chunks.append((self._base + len(buf), ts, pkt))  # pkt: added with packet numbers
        buf += data
        self.fed_bytes += n
        if self._base + len(buf) < self._need_off:
            held = len(buf) - self._pos
            if held > self.peak_buffered:
                self.peak_buffered = held
            return
        self._process(_NORMAL)


def _state(sp: FrameSplitter) -> tuple:
    return (sp.accounting(), sp.frames, sp.resyncs, sp.peak_buffered, sp.offset, sp.synced, sp._last_frame)


def _run(sp: FrameSplitter, ops) -> list:
    out = []
    for op in ops:
        pkt = op[3] if len(op) > 3 else 0
        if op[0] == "data":
            sp.feed(op[1], op[2], pkt)
        else:
            sp.gap(op[1], op[2], pkt)
        out.append((sp.events(), _state(sp)))
        assert sp.accounting_error() is None
    sp.finish()
    out.append((sp.events(), _state(sp)))
    return out


def _ops(blob: bytes, cuts: list[int], gaps: dict[int, int], kinds: list[int]) -> list:
    bounds = sorted({c for c in cuts if 0 < c < len(blob)} | {g for g in gaps if 0 < g < len(blob)})
    ops = []
    ts = 1.0
    for i, (a, b) in enumerate(zip([0, *bounds], [*bounds, len(blob)], strict=True)):
        if a in gaps:
            ops.append(("gap", gaps[a], ts, 2 * i + 1))
        piece = blob[a:b]
        kind = kinds[i % len(kinds)] if kinds else 0
        # bytes take the fast path; bytearray and memoryview the general one
        data = piece if kind == 0 else bytearray(piece) if kind == 1 else memoryview(piece)
        ops.append(("data", data, ts, 2 * i + 2))  # packet numbers: frames must carry the right ones
        ts += 0.5
    return ops


frames_or_garbage = st.one_of(
    st.lists(st.binary(max_size=120), max_size=12).map(_frames_blob),
    mixed_stream,
    st.lists(st.one_of(st.lists(st.binary(max_size=80), max_size=4).map(_frames_blob), st.binary(max_size=9)),
             max_size=6).map(b"".join),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(blob=frames_or_garbage, cuts=st.lists(st.integers(0, 1500), max_size=25),
       gaps=st.dictionaries(st.integers(0, 1500), st.integers(1, 300), max_size=3),
       kinds=st.lists(st.integers(0, 2), max_size=4), synced=st.booleans(),
       kind=st.sampled_from(["req", "resp", "none"]), limit=st.sampled_from([40, 150, 1 << 20]))
def test_fast_feed_is_the_reference_feed(blob, cuts, gaps, kinds, synced, kind, limit):
    def make(cls):
        validator = {"req": RequestValidator(), "resp": ResponseValidator(), "none": None}[kind]
        return cls(validator, synced=synced, max_frame_size=limit)

    ops = _ops(blob, cuts, gaps, kinds)
    assert _run(make(FrameSplitter), ops) == _run(make(ReferenceSplitter), ops)


def test_a_segment_of_whole_frames_then_part_of_one():
    frames = _frames_blob([b"a" * 10, b"b" * 3])
    nxt = (20).to_bytes(4, "big") + b"c" * 20
    ops = [("data", frames + nxt[:9], 1.0), ("data", nxt[9:15], 2.0), ("data", nxt[15:], 3.0)]
    got = _run(FrameSplitter(None), ops)
    assert got == _run(ReferenceSplitter(None), ops)
    frames_out = [e for evs, _ in got for e in evs]
    assert [(f.data, f.offset, f.ts_first, f.ts_last) for f in frames_out] == [
        (b"a" * 10, 0, 1.0, 1.0), (b"b" * 3, 14, 1.0, 1.0), (b"c" * 20, 21, 1.0, 3.0)]


big_frames = st.lists(st.binary(min_size=0, max_size=3000), min_size=1, max_size=6).map(_frames_blob)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(blob=st.one_of(big_frames, st.tuples(big_frames, st.binary(max_size=40)).map(b"".join)),
       seg=st.integers(1, 700), cuts=st.lists(st.integers(0, 20000), max_size=6),
       gaps=st.dictionaries(st.integers(0, 20000), st.integers(1, 2000), max_size=2),
       kinds=st.lists(st.integers(0, 2), max_size=3), synced=st.booleans(),
       kind=st.sampled_from(["req", "resp", "none"]))
def test_frames_spanning_many_chunks_are_the_reference_frames(blob, seg, cuts, gaps, kinds, synced, kind):
    """Chunks inside a frame of known size are held aside and joined once the frame is
    complete: same frames, timestamps, counters and peak as copying every chunk into the
    buffer, also when a gap or the end cuts such a frame, or a chunk is not bytes."""
    def make(cls):
        validator = {"req": RequestValidator(), "resp": ResponseValidator(), "none": None}[kind]
        return cls(validator, synced=synced)

    ops = _ops(blob, [*range(seg, len(blob), seg), *cuts], gaps, kinds)
    assert _run(make(FrameSplitter), ops) == _run(make(ReferenceSplitter), ops)


def test_a_frame_in_many_segments_is_joined_once():
    payload = bytes(range(256)) * 40
    nxt = (7).to_bytes(4, "big") + b"tail..."
    blob = len(payload).to_bytes(4, "big") + payload + nxt
    ops = [("data", blob[i : i + 1448], 1.0 + i) for i in range(0, len(blob), 1448)]
    sp = FrameSplitter(None)
    got = _run(sp, ops)
    assert got == _run(ReferenceSplitter(None), ops)
    frames = [e for evs, _ in got for e in evs]
    assert [(f.data, f.offset, f.ts_first, f.ts_last) for f in frames] == [
        (payload, 0, 1.0, 1.0 + 1448 * (len(blob) // 1448)), (b"tail...", 4 + len(payload), frames[1].ts_first,
                                                             frames[1].ts_last)]
    assert sp.peak_buffered > 6 * 1448  # the chunks held aside count as buffered
