"""FrameSplitter: framing, resync after gaps, limits, and byte accounting.

Oracles we did not write: request/response frames encoded by kafka-python's
protocol classes, and the TCP payloads of the public captures in
../shared/captures-public (extracted here with dpkt directly).
"""

from __future__ import annotations

import random
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from kafka.protocol.consumer import HeartbeatRequest
from kafka.protocol.metadata import ApiVersionsRequest, MetadataRequest
from kafka.protocol.producer import ProduceRequest, ProduceResponse

from kwinspect.model import OVERSIZED_FRAME, RESYNC, TRUNCATED_FRAME
from kwinspect.protocol.peek import peek_request_header, plausible_request
from kwinspect.stream.framing import (
    SKIP_LOST,
    SKIP_OVERSIZED,
    SKIP_RESYNC,
    SKIP_TRUNCATED,
    Frame,
    FrameSplitter,
    FramingIssue,
    RequestValidator,
    ResponseValidator,
    Skipped,
)

CAPTURES = Path(__file__).resolve().parents[3] / "shared" / "captures-public"

# ---------------------------------------------------------------------------
# kafka-python built frames (with the 4-byte size prefix)
# ---------------------------------------------------------------------------

_T = ProduceRequest.TopicProduceData
_P = _T.PartitionProduceData
_RT = ProduceResponse.TopicProduceResponse
_RP = _RT.PartitionProduceResponse


def kp_request(rng: random.Random, cid: int, client_id: str | None = "kwinspect-test") -> tuple[bytes, int, int]:
    """One kafka-python encoded request: (framed bytes, api_key, api_version)."""
    kind = rng.randrange(5)
    if kind == 0:
        v = rng.choice([1, 4, 9, 12])
        req = MetadataRequest[v](topics=None if v >= 1 else [], allow_auto_topic_creation=False) if v >= 4 else MetadataRequest[v](topics=[])
    elif kind == 1:
        v = 3
        req = ApiVersionsRequest[v](client_software_name="kw", client_software_version="1.0")
    elif kind == 2:
        v = 4
        req = HeartbeatRequest[v](group_id="group-a", generation_id=rng.randrange(100), member_id="m-1", group_instance_id=None)
    else:
        v = rng.choice([3, 7, 9])
        nrec = rng.choice([0, 10, 300, 3000, 20000])
        records = rng.randbytes(nrec)
        req = ProduceRequest[v](
            transactional_id=None,
            acks=1,
            timeout_ms=30000,
            topic_data=[_T(name="orders", partition_data=[_P(index=rng.randrange(8), records=records)])],
        )
    req.with_header(correlation_id=cid, client_id=client_id)
    data = bytes(req.encode(framed=True, header=True))
    return data, req.API_KEY, v


def kp_produce_response(rng: random.Random, cid: int) -> bytes:
    v = rng.choice([3, 7, 8])
    parts = [
        _RP(index=i, error_code=rng.choice([0, 0, 6]), base_offset=rng.randrange(1 << 40), log_append_time_ms=-1, log_start_offset=0)
        for i in range(rng.randrange(1, 30))
    ]
    resp = ProduceResponse[v](responses=[_RT(name="orders", partition_responses=parts)], throttle_time_ms=0)
    resp.with_header(correlation_id=cid)
    return bytes(resp.encode(framed=True, header=True))


def request_stream(seed: int, n: int = 40) -> tuple[bytes, list[tuple[int, bytes]]]:
    """A request direction: concatenated frames and [(offset, payload)]."""
    rng = random.Random(seed)
    out = bytearray()
    frames = []
    cid = rng.randrange(1000)
    for _ in range(n):
        data, _k, _v = kp_request(rng, cid)
        frames.append((len(out), data[4:]))
        out += data
        cid += rng.choice([1, 1, 1, 7])
    return bytes(out), frames


def response_stream(seed: int, n: int = 40) -> tuple[bytes, list[tuple[int, bytes]], list[int]]:
    rng = random.Random(seed)
    out = bytearray()
    frames = []
    cids = []
    cid = rng.randrange(1 << 20)
    for _ in range(n):
        data = kp_produce_response(rng, cid)
        frames.append((len(out), data[4:]))
        cids.append(cid)
        out += data
        cid += 1
    return bytes(out), frames, cids


def run(sp: FrameSplitter, ops) -> list:
    """Apply ('data', bytes, ts) / ('gap', n, ts) ops, finish, return events."""
    events = []
    for op in ops:
        if op[0] == "data":
            sp.feed(op[1], op[2])
        else:
            sp.gap(op[1], op[2])
        events.extend(sp.events())
        assert sp.accounting_error() is None, sp.accounting_error()
    sp.finish()
    events.extend(sp.events())
    sp.check_accounting()
    return events


def frames_of(events) -> list[tuple[int, bytes]]:
    return [(e.offset, e.data) for e in events if isinstance(e, Frame)]


def check_event_sums(sp: FrameSplitter, events) -> None:
    assert sum(4 + len(e.data) for e in events if isinstance(e, Frame)) == sp.frame_bytes
    assert sum(e.nbytes for e in events if isinstance(e, Skipped)) == sp.skipped_bytes
    assert sp.frame_bytes + sp.skipped_bytes + sp.gap_bytes + sp.tail_bytes == sp.fed_bytes + sp.gap_bytes


# ---------------------------------------------------------------------------
# Happy path
# ---------------------------------------------------------------------------


def test_kafka_python_requests_whole_and_byte_by_byte():
    stream, expected = request_stream(1, n=12)
    whole = FrameSplitter(RequestValidator())
    ev_whole = run(whole, [("data", stream, 5.0)])
    assert frames_of(ev_whole) == expected
    assert all(e.ts_first == e.ts_last == 5.0 for e in ev_whole if isinstance(e, Frame))

    bytewise = FrameSplitter(RequestValidator())
    ev_bytes = run(bytewise, [("data", stream[i : i + 1], float(i)) for i in range(len(stream))])
    assert frames_of(ev_bytes) == expected
    for e in ev_bytes:
        assert isinstance(e, Frame)
        # ts of the data holding the first byte of the prefix / the last byte
        assert e.ts_first == float(e.offset)
        assert e.ts_last == float(e.offset + 4 + len(e.data) - 1)
    check_event_sums(bytewise, ev_bytes)
    assert bytewise.skipped_bytes == bytewise.tail_bytes == 0
    assert bytewise.frame_bytes == len(stream)


def test_frames_carry_the_headers_kafka_python_encoded():
    rng = random.Random(7)
    sp = FrameSplitter(RequestValidator())
    sent = []
    for cid in range(30):
        data, key, ver = kp_request(rng, cid, client_id=rng.choice(["c", None, "", "producer-ü"]))
        sent.append((key, ver, cid))
        sp.feed(data, 0.0)
    sp.finish()
    got = []
    for e in sp.events():
        peek = peek_request_header(e.data)
        assert peek is not None and plausible_request(e.data)
        got.append((peek.api_key, peek.api_version, peek.correlation_id))
    assert got == sent


def test_responses_split_and_timestamps_per_chunk():
    stream, expected, _ = response_stream(3, n=10)
    sp = FrameSplitter(ResponseValidator())
    chunks = [stream[i : i + 100] for i in range(0, len(stream), 100)]
    ev = run(sp, [("data", c, float(k)) for k, c in enumerate(chunks)])
    assert frames_of(ev) == expected
    for e in ev:
        assert e.ts_first == float(e.offset // 100)
        assert e.ts_last == float((e.offset + 3 + len(e.data)) // 100)


def test_tail_of_an_unfinished_frame_is_counted_not_lost():
    stream, expected = request_stream(4, n=3)
    cut = stream[:-5]
    sp = FrameSplitter(RequestValidator())
    ev = run(sp, [("data", cut, 1.0)])
    assert frames_of(ev) == expected[:2]
    assert sp.tail_bytes == len(cut) - expected[2][0]
    assert any(isinstance(e, FramingIssue) and e.kind == TRUNCATED_FRAME for e in ev)


# ---------------------------------------------------------------------------
# Resync: mid-stream starts and gaps
# ---------------------------------------------------------------------------


def test_mid_stream_start_recovers_every_following_frame():
    stream, expected = request_stream(5, n=8)
    first_two = expected[2][0]
    for k in range(1, first_two + 1, 3):
        sp = FrameSplitter(RequestValidator(), synced=False, start_offset=k)
        ev = run(sp, [("data", stream[k:], 1.0)])
        want = [f for f in expected if f[0] >= k]
        assert frames_of(ev) == want, k
        assert sp.skipped_bytes == want[0][0] - k
        check_event_sums(sp, ev)


def test_gap_inside_a_frame_lands_on_the_next_frame_by_its_size():
    stream, expected = request_stream(6, n=6)
    # cut the middle of frame 2 (its size prefix was seen)
    o2, p2 = expected[2]
    a, b = o2 + 10, o2 + 4 + len(p2) - 3
    sp = FrameSplitter(RequestValidator())
    ev = run(sp, [("data", stream[:a], 1.0), ("gap", b - a, 2.0), ("data", stream[b:], 3.0)])
    assert frames_of(ev) == expected[:2] + expected[3:]
    skipped = [e for e in ev if isinstance(e, Skipped)]
    assert [(s.offset, s.nbytes, s.reason) for s in skipped] == [(o2, 10, SKIP_TRUNCATED), (b, 3, SKIP_TRUNCATED)]
    assert sp.gap_bytes == b - a
    assert not any(isinstance(e, FramingIssue) and e.kind == RESYNC for e in ev)


def test_gap_across_a_boundary_hunts_for_the_next_frame():
    stream, expected = request_stream(8, n=6)
    a = expected[1][0] + 7
    b = expected[3][0] + 5  # the size prefix of frame 3 is lost
    sp = FrameSplitter(RequestValidator())
    ev = run(sp, [("data", stream[:a], 1.0), ("gap", b - a, 2.0), ("data", stream[b:], 3.0)])
    assert frames_of(ev) == expected[:1] + expected[4:]
    assert sp.skipped_bytes == 7 + (expected[4][0] - b)
    assert any(isinstance(e, FramingIssue) and e.kind == RESYNC for e in ev)
    check_event_sums(sp, ev)


def test_response_resync_uses_pending_correlation_ids():
    stream, expected, cids = response_stream(9, n=12)
    seen: set[int] = set()
    validator = ResponseValidator(pending=lambda: set(cids) - seen)
    sp = FrameSplitter(validator)
    a = expected[4][0] + 9
    b = expected[6][0] + 2
    events = []
    for op in [("data", stream[:a], 1.0), ("gap", b - a, 2.0), ("data", stream[b:], 3.0)]:
        (sp.feed if op[0] == "data" else sp.gap)(op[1], op[2])
        for e in sp.events():
            if isinstance(e, Frame):
                seen.add(int.from_bytes(e.data[:4], "big"))
            events.append(e)
    sp.finish()
    events += sp.events()
    sp.check_accounting()
    assert frames_of(events) == expected[:4] + expected[7:]


# ---------------------------------------------------------------------------
# Mangled segments (drop, duplicate, reorder, truncate start)
# ---------------------------------------------------------------------------


def segment(stream: bytes, rng: random.Random, lo: int = 1, hi: int = 1500) -> list[tuple[int, float, bytes]]:
    segs, pos, t = [], 0, 0.0
    while pos < len(stream):
        n = rng.randint(lo, hi)
        segs.append((pos, t, stream[pos : pos + n]))
        pos += n
        t += 0.001
    return segs


def mangle(segs, rng: random.Random, drop=0.05, dup=0.05, swap=0.05, cut_start=True):
    out = list(segs)
    if cut_start and rng.random() < 0.5:
        out = out[rng.randint(1, max(1, len(out) // 10)) :]
    out = [s for s in out if rng.random() >= drop]
    out += [s for s in out if rng.random() < dup]
    for i in range(len(out) - 1):
        if rng.random() < swap:
            out[i], out[i + 1] = out[i + 1], out[i]
    # a retransmission that overlaps two segments
    if len(out) > 3:
        s = rng.choice(out)
        out.append((s[0] + len(s[2]) // 2, s[1], s[2][len(s[2]) // 2 :]))
    return out


def reassemble(segs, total: int):
    """Test-side TCP reassembly: in-order data and gaps, like a reassembler emits."""
    ops, nxt = [], 0
    for seq, ts, data in sorted(segs, key=lambda s: (s[0], -len(s[2]))):
        end = seq + len(data)
        if end <= nxt:
            continue
        if seq > nxt:
            ops.append(("gap", seq - nxt, ts))
            nxt = seq
        ops.append(("data", data[nxt - seq :], ts))
        nxt = end
    return ops, nxt


def received_ranges(ops):
    ranges, pos = [], 0
    for op in ops:
        if op[0] == "gap":
            pos += op[1]
        else:
            if ranges and ranges[-1][1] == pos:
                ranges[-1][1] = pos + len(op[1])
            else:
                ranges.append([pos, pos + len(op[1])])
            pos += len(op[1])
    return ranges


def fully_received(expected, ranges):
    return [f for f in expected if any(a <= f[0] and f[0] + 4 + len(f[1]) <= b for a, b in ranges)]


def check_recovered(got, expected, ranges, min_payload):
    """No invented frames, in order, and every fully received frame recovered -
    except one whose chain evidence a gap cut: followed, before the gap, by a
    piece of the next frame too short to check (0 < piece < 4 + min_payload)."""
    assert set(got) <= set(expected), "a frame that was never sent"
    assert got == sorted(set(got))
    for f in fully_received(expected, ranges):
        end = f[0] + 4 + len(f[1])
        b = next(b for a, b in ranges if a <= f[0] and end <= b)
        if not 0 < b - end < 4 + min_payload:
            assert f in got, (f[0], len(f[1]), ranges)


@pytest.mark.parametrize("seed", range(12))
def test_mangled_request_streams_recover_all_received_frames(seed):
    stream, expected = request_stream(100 + seed, n=40)
    rng = random.Random(seed)
    ops, covered = reassemble(mangle(segment(stream, rng), rng), len(stream))
    sp = FrameSplitter(RequestValidator())
    ev = run(sp, ops)
    got = frames_of(ev)
    check_recovered(got, expected, received_ranges(ops), RequestValidator.min_payload)
    check_event_sums(sp, ev)
    # every byte the capture spans is a frame, skipped, lost or tail
    assert sp.frame_bytes + sp.skipped_bytes + sp.gap_bytes + sp.tail_bytes == covered


@pytest.mark.parametrize("seed", range(6))
def test_mangled_response_streams_recover_all_received_frames(seed):
    stream, expected, cids = response_stream(200 + seed, n=40)
    rng = random.Random(seed)
    ops, covered = reassemble(mangle(segment(stream, rng, 1, 400), rng), len(stream))
    answered: set[int] = set()
    sp = FrameSplitter(ResponseValidator(pending=lambda: set(cids) - answered))
    ev = []
    for op in ops:
        (sp.feed if op[0] == "data" else sp.gap)(op[1], op[2])
        for e in sp.events():
            ev.append(e)
            if isinstance(e, Frame):
                answered.add(int.from_bytes(e.data[:4], "big"))
    sp.finish()
    ev += sp.events()
    sp.check_accounting()
    got = frames_of(ev)
    check_recovered(got, expected, received_ranges(ops), ResponseValidator.min_payload)
    assert sp.frame_bytes + sp.skipped_bytes + sp.gap_bytes + sp.tail_bytes == covered


# ---------------------------------------------------------------------------
# Limits
# ---------------------------------------------------------------------------


def test_oversized_frame_is_reported_and_skipped_as_it_streams():
    rng = random.Random(11)
    small = [kp_request(rng, i)[0] for i in range(3)]
    big = ProduceRequest[7](
        transactional_id=None, acks=1, timeout_ms=1, topic_data=[_T(name="t", partition_data=[_P(index=0, records=rng.randbytes(50_000))])]
    )
    big.with_header(correlation_id=3, client_id="big")
    big_b = bytes(big.encode(framed=True, header=True))
    stream = small[0] + small[1] + big_b + small[2]
    limit = 4096
    for chunk in (1, 512, len(stream)):
        sp = FrameSplitter(RequestValidator(), max_frame_size=limit)
        ev = run(sp, [("data", stream[i : i + chunk], 0.0) for i in range(0, len(stream), chunk)])
        assert [d for _o, d in frames_of(ev)] == [small[0][4:], small[1][4:], small[2][4:]]
        big_at = len(small[0]) + len(small[1])
        assert [e for e in ev if isinstance(e, Skipped)] == [Skipped(big_at, len(big_b), SKIP_OVERSIZED)]
        assert [e.kind for e in ev if isinstance(e, FramingIssue)] == [OVERSIZED_FRAME]
        # never buffered the big frame: at most one legal frame (or judging prefix) + one chunk
        if chunk < len(stream):
            assert sp.peak_buffered <= max(len(s) for s in small) + sp.peek_bytes + chunk
            assert sp.peak_buffered < limit


def test_hostile_2gb_size_prefix_never_allocates():
    header = b"\x00\x00\x00\x07\x00\x00\x00\x01\x00\x01x"  # Produce v7, cid 1, client "x"
    prefix = b"\x7f\xff\xff\xff" + header
    chunk = bytes(64 * 1024)
    tracemalloc.start()
    try:
        sp = FrameSplitter(RequestValidator())
        sp.feed(prefix, 0.0)
        for _ in range(160):  # 10 MiB of the claimed 2 GiB
            sp.feed(chunk, 0.0)
        _cur, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * 1024 * 1024
    assert sp.peak_buffered <= len(chunk) + len(prefix)
    sp.finish()
    ev = sp.events()
    assert ev[0].kind == OVERSIZED_FRAME
    skipped = [e for e in ev if isinstance(e, Skipped)]
    assert [(s.offset, s.reason) for s in skipped] == [(0, SKIP_OVERSIZED)]
    assert skipped[0].nbytes == sp.skipped_bytes == sp.fed_bytes
    assert [e.kind for e in ev if isinstance(e, FramingIssue)] == [OVERSIZED_FRAME, TRUNCATED_FRAME]
    sp.check_accounting()


def test_negative_or_garbage_size_resyncs_instead_of_skipping():
    stream, expected = request_stream(12, n=4)
    bad = b"\xff\xff\xff\xf0" + b"garbage!"
    sp = FrameSplitter(RequestValidator())
    ev = run(sp, [("data", stream[: expected[2][0]] + bad + stream[expected[2][0] :], 0.0)])
    want = expected[:2] + [(o + len(bad), d) for o, d in expected[2:]]
    assert frames_of(ev) == want
    assert [(e.offset, e.nbytes, e.reason) for e in ev if isinstance(e, Skipped)] == [(expected[2][0], len(bad), SKIP_RESYNC)]


def test_hunting_through_garbage_keeps_the_buffer_small():
    rng = random.Random(13)
    garbage = rng.randbytes(2_000_000)
    stream, expected = request_stream(13, n=3)
    sp = FrameSplitter(RequestValidator(), synced=False)
    ev = run(sp, [("data", (garbage + stream)[i : i + 65536], 0.0) for i in range(0, len(garbage) + len(stream), 65536)])
    got = frames_of(ev)
    assert got[-3:] == [(o + len(garbage), d) for o, d in expected]
    assert sp.peak_buffered < 2 * 65536 + 1024


# ---------------------------------------------------------------------------
# Properties
# ---------------------------------------------------------------------------

ops_strategy = st.lists(
    st.one_of(
        st.tuples(st.just("data"), st.binary(min_size=1, max_size=300), st.floats(0, 10)),
        st.tuples(st.just("gap"), st.integers(1, 5000), st.floats(0, 10)),
    ),
    max_size=30,
)


def _frames_blob(payloads) -> bytes:
    return b"".join(len(p).to_bytes(4, "big") + p for p in payloads)


def _request_frame(key: int, version: int, cid: int, client: bytes, body: bytes) -> bytes:
    payload = key.to_bytes(2, "big") + version.to_bytes(2, "big") + cid.to_bytes(4, "big") + len(client).to_bytes(2, "big") + client + body
    return len(payload).to_bytes(4, "big") + payload


# valid requests, near misses (Produce v16, negative cid) and garbage, mixed
mixed_stream = st.lists(
    st.one_of(
        st.builds(_request_frame, st.sampled_from([0, 1, 3, 18]), st.integers(0, 4), st.integers(0, 50), st.sampled_from([b"c", b"", b"producer-1"]), st.binary(max_size=60)),
        st.builds(_request_frame, st.just(0), st.just(16), st.integers(0, 50), st.just(b"x"), st.binary(max_size=20)),
        st.binary(max_size=40),
    ),
    max_size=12,
).map(b"".join)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops_strategy, synced=st.booleans(), kind=st.sampled_from(["req", "resp", "none"]), limit=st.sampled_from([64, 1 << 20]))
def test_property_any_bytes_any_gaps_no_exception_and_accounting(ops, synced, kind, limit):
    validator = {"req": RequestValidator(), "resp": ResponseValidator(), "none": None}[kind]
    sp = FrameSplitter(validator, synced=synced, max_frame_size=limit)
    ev = run(sp, ops)
    check_event_sums(sp, ev)
    assert sp.fed_bytes == sum(len(o[1]) for o in ops if o[0] == "data")
    assert sp.gap_bytes == sum(o[1] for o in ops if o[0] == "gap")
    assert sp.peak_buffered <= limit + 4 + 300 + sp.peek_bytes


@settings(max_examples=150, deadline=None)
@given(
    blob=st.one_of(
        st.binary(max_size=2000),
        st.lists(st.binary(max_size=200), max_size=10).map(_frames_blob),
        mixed_stream,
    ),
    cuts=st.lists(st.integers(0, 2000), max_size=20),
    gap_at=st.one_of(st.none(), st.tuples(st.integers(0, 2000), st.integers(1, 500))),
    synced=st.booleans(),
    budgets=st.tuples(st.sampled_from([None, 0, 50, 700]), st.sampled_from([None, 0, 1, 3])),
)
# frames then a bad size in one feed: the hunt must learn the last frame's
# correlation id (1) whether or not a chunk ended right before the bad size
@example(
    blob=b"\x00\x00\x00\x03" + bytes(14) + b"\x0b" + bytes(7) + b"\x01" + bytes(3)
    + b"\x80\x00\x00\x00\x0b" + bytes(7) + b"\x01" + bytes(3),
    cuts=[30],
    gap_at=None,
    synced=True,
    budgets=(None, None),
)
def test_property_chunking_does_not_change_the_events(blob, cuts, gap_at, synced, budgets):
    def ops_for(pieces):
        ops = []
        if gap_at is None:
            return [("data", p, 0.0) for p in pieces if p]
        g, n = gap_at
        pos = 0
        for p in pieces:
            if pos <= g < pos + len(p):
                ops += [("data", p[: g - pos], 0.0), ("gap", n, 0.0), ("data", p[g - pos :], 0.0)]
            else:
                ops.append(("data", p, 0.0))
            pos += len(p)
        if g >= pos:
            ops.append(("gap", n, 0.0))
        return [o for o in ops if o[0] == "gap" or o[1]]

    bounds = sorted({c for c in cuts if 0 < c < len(blob)})
    pieces = [blob[a:b] for a, b in zip([0, *bounds], [*bounds, len(blob)], strict=True)]
    def splitter():
        return FrameSplitter(
            RequestValidator(), synced=synced, max_frame_size=150, max_hunt_bytes=budgets[0], max_hunt_candidates=budgets[1]
        )

    one = run(splitter(), ops_for([blob]))
    many = run(splitter(), ops_for(pieces))
    assert one == many


@settings(max_examples=100, deadline=None)
@given(payloads=st.lists(st.binary(max_size=300), max_size=15), data=st.data())
def test_property_valid_frames_come_back_exactly(payloads, data):
    blob = _frames_blob(payloads)
    cuts = sorted(set(data.draw(st.lists(st.integers(0, len(blob)), max_size=40))))
    pieces = [blob[a:b] for a, b in zip([0, *cuts], [*cuts, len(blob)], strict=True)]
    sp = FrameSplitter(None)
    ev = run(sp, [("data", p, 0.0) for p in pieces if p])
    assert [e.data for e in ev] == payloads


# ---------------------------------------------------------------------------
# Public captures (real traffic from other projects)
# ---------------------------------------------------------------------------


def read_tcp_directions(path: Path) -> dict[tuple, list[tuple[int, float, bytes, bool]]]:
    """{(src, sport, dst, dport): [(seq, ts, payload, syn)]} straight from dpkt."""
    import socket

    import dpkt

    with path.open("rb") as fh:
        try:
            reader = dpkt.pcap.Reader(fh)
        except ValueError:
            fh.seek(0)
            reader = dpkt.pcapng.Reader(fh)
        out: dict[tuple, list] = {}
        for ts, buf in reader:
            eth = dpkt.ethernet.Ethernet(buf)  # also unwraps 802.1Q VLAN tags
            ip = eth.data
            if not isinstance(ip, dpkt.ip.IP | dpkt.ip6.IP6) or not isinstance(ip.data, dpkt.tcp.TCP):
                continue
            tcp = ip.data
            fam = socket.AF_INET if isinstance(ip, dpkt.ip.IP) else socket.AF_INET6
            key = (socket.inet_ntop(fam, ip.src), tcp.sport, socket.inet_ntop(fam, ip.dst), tcp.dport)
            out.setdefault(key, []).append((tcp.seq, float(ts), bytes(tcp.data), bool(tcp.flags & dpkt.tcp.TH_SYN)))
    return out


def direction_segments(segs):
    """Relative-sequence (seq, ts, payload) list and whether the SYN was seen."""
    syn = [s for s in segs if s[3]]
    isn = (syn[0][0] + 1) if syn else min(s[0] for s in segs if s[2])
    return [(((s[0] - isn) & 0xFFFFFFFF), s[1], s[2]) for s in segs if s[2]], bool(syn)


def public_captures():
    if not CAPTURES.is_dir():
        return []
    return sorted(p for p in CAPTURES.iterdir() if p.suffix in (".pcap", ".pcapng"))


needs_captures = pytest.mark.skipif(not CAPTURES.is_dir(), reason=f"public captures not found at {CAPTURES}")


@needs_captures
@pytest.mark.parametrize("path", public_captures(), ids=lambda p: p.name)
def test_public_captures_frame_without_loss(path):
    total_frames = 0
    for (_src, sport, _dst, dport), segs in read_tcp_directions(path).items():
        rel, _syn = direction_segments(segs) if any(s[2] for s in segs) else ([], False)
        if not rel:
            continue
        ops, covered = reassemble(rel, 0)
        to_broker = dport in (9092, 36333)
        validator = RequestValidator() if to_broker else ResponseValidator()
        sp = FrameSplitter(validator)
        ev = run(sp, ops)
        assert sp.skipped_bytes == sp.gap_bytes == sp.tail_bytes == 0, (sport, dport, ev)
        assert sp.frame_bytes == covered
        for e in ev:
            assert isinstance(e, Frame)
            if to_broker:
                assert plausible_request(e.data), e
        total_frames += sp.frames
    assert total_frames >= 1


@needs_captures
@pytest.mark.parametrize("seed", range(4))
def test_public_captures_mangled_recover_frames_after_gaps(seed):
    rng = random.Random(seed)
    checked = 0
    for path in public_captures():
        for (_s, _sp, _d, dport), segs in read_tcp_directions(path).items():
            if dport not in (9092, 36333) or not any(s[2] for s in segs):
                continue
            rel, _ = direction_segments(segs)
            ops, _ = reassemble(rel, 0)
            stream = b"".join(o[1] for o in ops if o[0] == "data")
            if any(o[0] == "gap" for o in ops):
                continue
            clean = FrameSplitter(RequestValidator())
            expected = frames_of(run(clean, [("data", stream, 0.0)]))
            # re-cut into small segments so drops land inside and between frames
            mops, covered = reassemble(mangle(segment(stream, rng, 5, 60), rng, drop=0.08), len(stream))
            sp = FrameSplitter(RequestValidator())
            ev = run(sp, mops)
            got = frames_of(ev)
            check_recovered(got, expected, received_ranges(mops), RequestValidator.min_payload)
            assert sp.frame_bytes + sp.skipped_bytes + sp.gap_bytes + sp.tail_bytes == covered
            checked += 1
    assert checked >= 5


def test_hunt_is_bounded_and_a_gap_gives_a_new_chance():
    # request-shaped but implausible (Produce v16) candidates every 4 bytes
    adversarial = b"\x00\x00\x00\x10" * 50_000
    stream, expected = request_stream(14, n=3)
    sp = FrameSplitter(RequestValidator(), synced=False, max_hunt_candidates=1000)
    ev = run(sp, [("data", adversarial, 0.0), ("data", stream, 1.0), ("gap", 10, 2.0), ("data", stream, 3.0)])
    lost = [e for e in ev if isinstance(e, FramingIssue) and "until the next gap" in e.message]
    assert len(lost) == 1
    # everything before the gap was skipped (the frames in it too), then resync
    after = len(adversarial) + len(stream) + 10
    assert frames_of(ev) == [(o + after, d) for o, d in expected]
    reasons = {e.reason for e in ev if isinstance(e, Skipped)}
    assert reasons == {SKIP_RESYNC, SKIP_LOST}
    check_event_sums(sp, ev)


def test_next_event_pulls_one_at_a_time():
    stream, expected = request_stream(15, n=4)
    sp = FrameSplitter(RequestValidator())
    sp.feed(stream, 0.0)
    got = []
    while (e := sp.next_event()) is not None:
        got.append((e.offset, e.data))
    assert got == expected
    assert sp.next_event() is None and sp.events() == []


@pytest.mark.parametrize("budget", ["bytes", "candidates"])
def test_hunt_budget_is_positional_whatever_the_chunking(budget):
    rng = random.Random(16)
    # near misses (Produce v16) make the validator work; random bytes rarely do
    garbage = _request_frame(0, 16, 1, b"x", b"") * 60 if budget == "candidates" else rng.randbytes(1000)
    stream = b"".join(_request_frame(3, 1, cid, b"c", b"\x00\x00\x00\x00") for cid in range(2, 6))
    blob = garbage + stream
    kw = {"max_hunt_bytes": 500} if budget == "bytes" else {"max_hunt_candidates": 20}
    kw["max_frame_size"] = 64  # so no position reads as a size worth waiting for
    results = []
    for chunk in (1, 7, 333, len(blob)):
        sp = FrameSplitter(RequestValidator(), synced=False, **kw)
        ev = run(sp, [("data", blob[i : i + chunk], 0.0) for i in range(0, len(blob), chunk)])
        results.append(ev)
        lost = [e for e in ev if isinstance(e, FramingIssue)]
        assert len(lost) == 1 and "until the next gap" in lost[0].message
        skipped = [(e.offset, e.reason) for e in ev if isinstance(e, Skipped)]
        assert skipped == [(0, SKIP_RESYNC), (lost[0].offset, SKIP_LOST)]
        if budget == "bytes":
            assert lost[0].offset == 500
        assert frames_of(ev) == []
    assert all(r == results[0] for r in results)
    # without the budget the frames after the garbage are found
    free = FrameSplitter(RequestValidator(), synced=False, max_frame_size=64)
    assert [d for _o, d in frames_of(run(free, [("data", blob, 0.0)]))] == [f[4:] for f in _split(stream)]


def _split(blob: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos < len(blob):
        n = int.from_bytes(blob[pos : pos + 4], "big")
        out.append(blob[pos : pos + 4 + n])
        pos += 4 + n
    return out


@needs_captures
@pytest.mark.parametrize("seed", range(4))
def test_public_captures_mangled_response_directions(seed):
    """Broker->client directions, with the pending correlation ids a conversation would give."""
    rng = random.Random(1000 + seed)
    checked = 0
    for path in public_captures():
        dirs = read_tcp_directions(path)
        for (_src, sport, _dst, _dport), segs in dirs.items():
            if sport not in (9092, 36333) or not any(s[2] for s in segs):
                continue
            rel, _ = direction_segments(segs)
            ops, _ = reassemble(rel, 0)
            if any(o[0] == "gap" for o in ops):
                continue
            stream = b"".join(o[1] for o in ops if o[0] == "data")
            expected = frames_of(run(FrameSplitter(ResponseValidator()), [("data", stream, 0.0)]))
            cids = {int.from_bytes(d[:4], "big") for _o, d in expected}
            answered: set[int] = set()
            sp = FrameSplitter(ResponseValidator(pending=lambda cids=cids, answered=answered: cids - answered))
            mops, covered = reassemble(mangle(segment(stream, rng, 5, 60), rng, drop=0.08), len(stream))
            ev = []
            for op in mops:
                (sp.feed if op[0] == "data" else sp.gap)(op[1], op[2])
                for e in sp.events():
                    ev.append(e)
                    if isinstance(e, Frame):
                        answered.add(int.from_bytes(e.data[:4], "big"))
            sp.finish()
            ev += sp.events()
            sp.check_accounting()
            got = frames_of(ev)
            check_recovered(got, expected, received_ranges(mops), ResponseValidator.min_payload)
            assert sp.frame_bytes + sp.skipped_bytes + sp.gap_bytes + sp.tail_bytes == covered
            checked += 1
    assert checked >= 5
