"""The compiled core gives exactly what the pure-Python core gives.

The Python path is the reference. Here both run, in one process (tests/helpers/cores.py),
over every shipped and public capture (the CLI outputs byte for byte), over generated and
mutated capture files (packets, reader counters and issues, parser segments, counters and
issues, Dissector rows and packet books), and the packaging: which core `--version`
reports, KWINSPECT_PURE, and setup.py building exactly the modules kwinspect.core lists.
"""

from __future__ import annotations

import io
import os
import random
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.cores import compiled_available, python_core, require_compiled
from helpers.pcapgen import LINKTYPES, conversation, mangle, write_pcap, write_pcapng
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kwinspect import core
from kwinspect.capture.packets import PacketParser
from kwinspect.capture.readers import CaptureFormatError, open_capture
from kwinspect.dissect import DissectConfig, Dissector
from kwinspect.model import Endpoint
from tests.golden.pin_outputs import captures
from tests.golden.pin_outputs import run as run_cli

ROOT = Path(__file__).resolve().parents[1]
C4 = Endpoint("10.0.0.1", 40000)
S4 = Endpoint("10.0.0.2", 9092)
C6 = Endpoint("fd00::1", 40000)
S6 = Endpoint("fd00::2", 9092)

# the CLI outputs compared on every capture (the golden pins hold the rest of the 21)
COMMANDS = [
    ["summary"],
    ["summary", "-F", "json"],
    ["exchanges", "-F", "jsonl"],
    ["records", "-F", "jsonl"],
    ["errors", "-F", "jsonl"],
    ["decode"],
]


@pytest.fixture(autouse=True)
def _compiled():
    require_compiled()


# -- every capture, as the CLI prints it ------------------------------------------------------


@pytest.mark.parametrize("capture", captures(), ids=lambda p: p.name)
def test_cli_outputs_are_identical_on_every_capture(capture):
    for command in COMMANDS:
        compiled = run_cli(command, capture)
        with python_core():
            python = run_cli(command, capture)
        assert compiled == python, (command, capture.name)


# -- the readers ----------------------------------------------------------------------------


def _read(data: bytes, stop_after: int | None = None):
    """Everything a reader reports about `data`: packets, counters, issues (or the open error)."""
    try:
        src = open_capture(io.BytesIO(data))
    except CaptureFormatError as exc:
        return ("not a capture", str(exc))
    packets = []
    with src:
        it = iter(src)
        for raw in it:
            packets.append(tuple(raw))
            if stop_after is not None and len(packets) >= stop_after:
                it.close()  # a consumer that stops early (a cancelled run): counters of what it got
                break
    return packets, repr(src.stats), [(i.kind, i.message, i.offset) for i in src.issues]


def _both_read(data: bytes, stop_after: int | None = None):
    compiled = _read(data, stop_after)
    with python_core():
        python = _read(data, stop_after)
    return compiled, python


def _messages(n: int, pad: int) -> list[tuple[str, bytes]]:
    out = []
    for cid in range(n):
        payload = (18).to_bytes(2, "big") + (0).to_bytes(2, "big") + cid.to_bytes(4, "big") + b"\x00\x01c" + b"x" * pad
        out += [("c", len(payload).to_bytes(4, "big") + payload), ("s", (4 + 12).to_bytes(4, "big") + cid.to_bytes(4, "big") + bytes(12))]
    return out


def _capture_file(fmt: str, linktype: str, v6: bool, n: int, pad: int, mss: int, drop: float,
                  truncate: float, seed: int, byteorder: str, nano: bool, snaplen: int) -> bytes:
    c, s = (C6, S6) if v6 else (C4, S4)
    segs = mangle(conversation(c, s, _messages(n, pad), mss=mss), drop=drop, truncate=truncate, seed=seed)
    buf = io.BytesIO()
    lt = LINKTYPES[linktype]
    if fmt == "pcap":
        write_pcap(buf, segs, linktype=lt, byteorder=byteorder, nano=nano, snaplen=snaplen)
    else:
        write_pcapng(buf, segs, interfaces=((lt, 9 if nano else 6), (lt, 6, 17)), byteorder=byteorder)
    return buf.getvalue()


def _mutate(data: bytes, rng: random.Random, flips: int, cut: bool) -> bytes:
    b = bytearray(data)
    for _ in range(flips):
        if b:
            b[rng.randrange(len(b))] = rng.choice((0, 0xFF, 0x7F, 0x80, rng.randrange(256)))
    if cut and b:
        del b[rng.randrange(len(b)):]
    return bytes(b)


capture_files = st.builds(
    _capture_file, fmt=st.sampled_from(["pcap", "pcapng"]),
    linktype=st.sampled_from(["ethernet", "ethernet", "sll", "sll2", "raw", "null", "loop"]),
    v6=st.booleans(), n=st.integers(1, 5), pad=st.integers(0, 4000), mss=st.sampled_from([100, 1460, 9000]),
    drop=st.sampled_from([0.0, 0.2]), truncate=st.sampled_from([0.0, 0.3]), seed=st.integers(0, 100),
    byteorder=st.sampled_from(["<", ">"]), nano=st.booleans(), snaplen=st.sampled_from([262144, 96]))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=capture_files, mseed=st.integers(0, 2**32), flips=st.integers(0, 12), cut=st.booleans(),
       stop=st.one_of(st.none(), st.integers(1, 40)))
def test_readers_are_identical(data, mseed, flips, cut, stop):
    data = _mutate(data, random.Random(mseed), flips, cut)
    compiled, python = _both_read(data, stop)
    assert compiled == python


def test_readers_are_identical_across_chunk_boundaries():
    """Records crossing the reader's 1 MiB chunks (the compiled scan stops there and hands
    the record to Python), in both formats and byte orders."""
    for fmt in ("pcap", "pcapng"):
        for order in ("<", ">"):
            data = _capture_file(fmt, "ethernet", False, 500, 7000, 1460, 0.0, 0.0, 1, order, False, 262144)
            assert len(data) > 3 << 20  # several chunks
            compiled, python = _both_read(data)
            assert compiled == python
            assert len(compiled[0]) > 1000
            compiled, python = _both_read(data, stop_after=777)
            assert compiled == python


@pytest.mark.parametrize("capture", captures(), ids=lambda p: p.name)
def test_readers_are_identical_on_every_capture(capture):
    data = capture.read_bytes()
    compiled, python = _both_read(data)
    assert compiled == python


# -- the packet parser and the driver --------------------------------------------------------


def _parse_all(packets):
    parser = PacketParser()
    segs = [parser.parse(raw) for raw in packets]
    parser.finish()
    return ([None if s is None else tuple(s) for s in segs], repr(parser.stats),
            [(i.kind, i.message) for i in parser.issues])


def _dissect_all(packets):
    d = Dissector(DissectConfig(kafka_ports=frozenset({9092})))
    rows = []
    for raw in packets:
        d.feed_packet(raw)
        rows += [e.row() for e in d.drain()]
    d.finish()
    rows += [e.row() for e in d.drain()]
    return rows, d.packet_counts(), d.byte_counts(), repr(d.parser.stats), d.packet_accounting_error()


def _packets_of(data: bytes):
    try:
        with open_capture(io.BytesIO(data)) as src:
            return list(src)
    except CaptureFormatError:
        return []


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=capture_files, flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 80),
                                                     st.integers(0, 255)), max_size=10))
def test_parser_and_dissector_are_identical(data, flips):
    packets = _packets_of(data)
    for k, off, byte in flips:  # mangled link, IP and TCP headers
        if packets:
            i = k % len(packets)
            raw = packets[i]
            b = bytearray(raw.data)
            if off < len(b):
                b[off] = byte
            packets[i] = raw._replace(data=bytes(b[: max(0, len(b) - k % 7)] if k % 5 == 0 else b))
    compiled = (_parse_all(packets), _dissect_all(packets))
    with python_core():
        python = (_parse_all(packets), _dissect_all(packets))
    assert compiled == python


@pytest.mark.parametrize("capture", captures(), ids=lambda p: p.name)
def test_parser_is_identical_on_every_capture(capture):
    packets = _packets_of(capture.read_bytes())
    compiled = _parse_all(packets)
    with python_core():
        python = _parse_all(packets)
    assert compiled == python


def test_the_compiled_parser_takes_ordinary_packets():
    """Not a vacuous equality: the compiled path does return segments (IPv4 and IPv6, each
    link type it knows), and leaves new endpoints and odd packets to Python."""
    from kwinspect.capture import fastpath
    from kwinspect.capture.packets import TcpSegment

    for linktype in ("ethernet", "sll", "sll2", "raw"):
        for v6 in (False, True):
            packets = _packets_of(_capture_file("pcap", linktype, v6, 2, 10, 1460, 0.0, 0.0, 1, "<", False, 262144))
            parser = PacketParser()
            first = parser.parse(packets[0])  # the endpoints become known
            assert fastpath.tcp_segment(packets[0], {}, TcpSegment) is None  # unknown endpoints: Python's
            seg = fastpath.tcp_segment(packets[1], parser.endpoints, TcpSegment)
            assert seg is not None and tuple(seg) == tuple(parser.parse(packets[1])), (linktype, v6)
            assert seg.src is first.dst or seg.src is first.src
            cut = packets[1]._replace(data=packets[1].data[:-1])  # the snaplen cut it: Python's
            assert fastpath.tcp_segment(cut, parser.endpoints, TcpSegment) is None


def test_scanners_refuse_bad_arguments():
    from kwinspect.capture import fastpath
    from kwinspect.capture.readers import RawPacket

    with pytest.raises(ValueError):
        fastpath.scan_pcap(b"", 5, False, False, 16, 1, 0, RawPacket, 10)
    with pytest.raises(ValueError):
        fastpath.scan_pcap(b"", 0, False, False, 8, 1, 0, RawPacket, 10)
    with pytest.raises(TypeError):
        fastpath.scan_pcap(b"", 0, False, False, 16, 1, 0, dict, 10)
    with pytest.raises(TypeError):
        fastpath.scan_pcapng(b"", 0, False, ((1, "x", 0),), 0, RawPacket, 10)
    # a record claiming 4 GiB with a few bytes present: nothing allocated, Python's to report
    rec = (0).to_bytes(4, "little") * 2 + (0xFFFFFFFF).to_bytes(4, "little") * 2 + b"abc"
    assert fastpath.scan_pcap(rec, 0, False, False, 16, 1, 0, RawPacket, 10) == ([], 0, 0, 0)


# -- the decoder ---------------------------------------------------------------------------
# Frame-by-frame equality of the compiled decoder with the generated Python one (and with the
# reference) on every capture frame, generated and mutated frames: tests/protocol/test_decode_fast.py.


def _clean_produce_request() -> bytes:
    from tests.protocol.test_decode_fast import RECORD_BATCH

    return (struct.pack(">hhih", 0, 3, 7, 1) + b"c" + struct.pack(">hhii", -1, 1, 1000, 1) + struct.pack(">h", 1)
            + b"t" + struct.pack(">iii", 1, 0, len(RECORD_BATCH)) + RECORD_BATCH)


def test_the_compiled_decoder_takes_clean_frames(monkeypatch):
    """Not a vacuous equality: with the compiled core, a clean frame is decoded (record set
    included) without the generated Python decoder or the Python record-set parser."""
    from kwinspect.protocol import decode, fastdecode, records

    frame = _clean_produce_request()
    with python_core():
        want = decode.decode_request(frame)

    def boom(*_args, **_kwargs):
        raise AssertionError("the Python path was called")

    decode.clear_caches()
    monkeypatch.setattr(fastdecode, "build", boom)
    monkeypatch.setattr(records, "_v2_batch", boom)  # what parse_record_set reads each batch with
    monkeypatch.setattr(decode, "decode_request_reference", boom)
    got = decode.decode_request(frame)
    decode.clear_caches()
    assert got.body["topic_data"][0]["partition_data"][0]["records"].to_json() == \
        want.body["topic_data"][0]["partition_data"][0]["records"].to_json()
    assert (got.header, got.size, got.issues) == (want.header, want.size, want.issues)


def test_the_compiled_decoder_refuses_bad_programs():
    from kwinspect.protocol import compiled

    for bad in [(), (0, None, None, 0, 0, 0, 10), (1, (0, (), (), None, ()), (0, ("a",), ((99, 0, 0, 0, 0, None),),
                                                                               None, ()), 0, 0, 0, 10),
                (1, (0, (), (), None, ()), (0, ("a",), ((13, 0, 0, 13, 1, None),), None, ()), 0, 0, 0, 10),
                (1, (0, (), (), None, ()), (1, (), (), None, ()), 0, 0, 0, 10)]:
        with pytest.raises((TypeError, ValueError)):
            compiled.compile_program(bad)
    program = compiled.compile_program((0, None, (0, ("a",), ((4, 0, 0, 0, 0, None),), None, ()), 0, 0, 0, 10))
    with pytest.raises(ValueError):
        compiled.decode_request(program, b"")
    with pytest.raises(TypeError):
        compiled.decode_struct(program, bytearray(4))
    assert compiled.decode_struct(program, b"\x00\x00\x00\x07") == {"a": 7}
    assert compiled.decode_struct(program, b"\x00\x00\x07") is None  # short: the reference's
    # an array claiming 2**31-1 elements in 8 bytes: nothing allocated, the reference's to report
    array = compiled.compile_program((0, None, (0, ("a",), ((13, 0, 0, 4, 4, None),), None, ()), 0, 0, 0, 10 ** 6))
    assert compiled.decode_struct(array, b"\x7f\xff\xff\xff" + b"\x00" * 8) is None


# -- packaging: which core runs -------------------------------------------------------------


def _version(env_extra: dict[str, str]) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **env_extra}
    env.pop("KWINSPECT_PURE", None) if "KWINSPECT_PURE" not in env_extra else None
    res = subprocess.run([sys.executable, "-m", "kwinspect", "--version"], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=60)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def test_version_says_which_core_runs():
    assert compiled_available()
    assert re.fullmatch(r"kwinspect \S+, core: compiled", _version({}))
    assert _version({"KWINSPECT_PURE": "1"}).endswith("core: python (KWINSPECT_PURE is set)")
    assert _version({"KWINSPECT_PURE": "0"}).endswith("core: compiled")


def test_setup_builds_the_modules_the_core_lists():
    text = (ROOT / "setup.py").read_text()
    built = tuple(re.findall(r'Extension\("([\w.]+)"', text))
    assert built == core.EXTENSIONS
    for name in built:
        source = ROOT / (name.replace(".", "/").rsplit("/", 1)[0]) / (name.rsplit(".", 1)[1] + ".c")
        assert source.is_file(), source


def test_every_tcp_flags_byte_and_ip_header_length():
    """The header fields the compiled parser copies or judges, over all their values."""
    packets = _packets_of(_capture_file("pcap", "ethernet", False, 2, 10, 1460, 0.0, 0.0, 1, "<", False, 262144))
    base = packets[3]
    variants = []
    for flags in range(256):
        b = bytearray(base.data)
        b[47] = flags
        variants.append(base._replace(data=bytes(b)))
    for vihl in range(0x40, 0x50):  # IPv4 header lengths, options included (data shifts, still parsed)
        b = bytearray(base.data)
        b[14] = vihl
        variants.append(base._replace(data=bytes(b)))
    for doff in range(256):  # TCP data offsets
        b = bytearray(base.data)
        b[46] = doff
        variants.append(base._replace(data=bytes(b)))
    compiled = _parse_all(packets[:3] + variants)
    with python_core():
        python = _parse_all(packets[:3] + variants)
    assert compiled == python


# -- the per-segment driver (kwinspect/_cdriver.c) ---------------------------------------------
# The compiled driver takes in-order segments of decided Kafka connections and declines the
# rest, which the Python path takes: a mangled conversation mixes the two on every
# connection, so these compare the two cores where the state passes from one to the other.


def _state(d: Dissector) -> list:
    """Everything the per-segment path writes, for every open connection: the reassembler's
    halves and books, the splitter's position, held parts and books, the connection's counts."""
    out = [d.stats.tcp_packets, d.stats.kafka_bytes, d.stats.non_kafka_bytes, d.last_ts,
           repr(d.tcp.stats), repr(d.tcp.totals())]
    for conn, _ in d.tcp._conns.items():
        if not hasattr(conn, "h0"):  # a connection that saw one bare SYN only (tcp._Embryo)
            out.append((str(conn.cid), conn.src, conn.dst, conn.last_ts, conn.isn, conn.stream))
            continue
        for h in (conn.h0, conn.h1):
            out.append((str(conn.cid), h.started, h.nxt, h.max_end, h.peer_ack, h.fin_at, h.hole_since,
                        h.recent_bytes, list(h.recent or ()), list(h.ooo_s), repr(h.st), conn.last_ts))
    for cid, cs in d._conns.items():
        info = cs.info
        out.append((str(cid), info.kind, dict(info.bytes), info.packets, info.last_ts, cs.decided,
                    cs in d._dirty))
        for src, sp in cs.splitters.items():
            out.append((str(src), sp.accounting(), sp.accounting_error(), sp._state, sp._base, sp._pos,
                        bytes(sp._buf), sp._need_off, sp._parts_len, list(sp._parts), list(sp._part_chunks),
                        list(sp._chunks), sp._last_frame, sp.frames, sp.peak_buffered, list(sp.ready)))
    return out


# states kept per run at most: a snapshot copies every buffer, so one after each of 100k
# packets (7-byte segments of 20 KB frames) held gigabytes and took minutes
MAX_STATES = 500
MAX_PACKETS = 5000  # per generated capture (_adversarial)


def _drive(packets, config: DissectConfig | None = None, every_packet: bool = False):
    """Rows, books and (every_packet) the state after each packet of one Dissector run (after
    every k-th packet when there are more than MAX_STATES, the last packet always)."""
    d = Dissector(config or DissectConfig(kafka_ports=frozenset({9092})))
    rows, states = [], []
    stride = max(1, -(-len(packets) // MAX_STATES))
    for i, raw in enumerate(packets, 1):
        d.feed_packet(raw)
        rows += [(e.row(), e.order) for e in d.drain()]  # order: the packet of a frame's first byte
        if every_packet and (i % stride == 0 or i == len(packets)):
            states.append(_state(d))
    d.finish()
    rows += [(e.row(), e.order) for e in d.drain()]
    books = [(info.stream, info.kind, info.client, info.broker, info.bytes, info.gap_bytes, info.packets,
              info.accounting, info.closed, info.closed_by, info.first_ts, info.last_ts, info.tcp_stream)
             for info in d.connections.values()]
    for info in d.connections.values():  # the splitters' identity, both cores
        for acc in info.accounting.values():
            assert acc["frame_bytes"] + acc["skipped_bytes"] + acc["tail_bytes"] + acc["buffered_bytes"] \
                == acc["fed_bytes"], acc
    b = d.byte_counts()  # the reassembler's identity
    assert b["payload"] == b["delivered"] + b["duplicate"] + b["late"] + b["dropped"] + b["buffered"], b
    return rows, d.packet_counts(), b, books, d.packet_accounting_error(), states


def _kafka_messages(n: int, pad: int, rng: random.Random, crafted: float) -> list[tuple[str, bytes]]:
    """Produce-shaped requests and their responses; `crafted`: the share whose size prefix lies
    (negative, past the frame size limit, short or long by a few bytes)."""
    out = []
    for cid, (who, msg) in enumerate(_messages(n, pad)):
        if rng.random() < crafted:
            size = rng.choice((-1, -(1 << 31), 0x7FFFFFFF, 200 * 1024 * 1024, len(msg) - 4 + rng.choice((-3, -1, 1, 9))))
            msg = size.to_bytes(4, "big", signed=True) + msg[4:]
        if rng.random() < 0.3 and out:  # two frames in one send: several per segment
            out[-1] = (out[-1][0], out[-1][1] + msg) if out[-1][0] == who else out[-1]
        out.append((who, msg))
        _ = cid
    return out


def _adversarial(seed: int, n: int, pad: int, mss: int, drop: float, duplicate: float, reorder: float,
                 truncate: float, resegment: float, conflict: float, crafted: float, rsts: int,
                 handshake: bool, isn: int, conns: int) -> list:
    """RawPackets of `conns` interleaved Kafka connections, mangled like real captures go wrong,
    with forged RSTs and flipped flags."""
    from kwinspect.capture.packets import ACK, RST, TcpSegment

    rng = random.Random(seed)
    streams = []
    for k in range(conns):
        c = Endpoint(f"10.0.{k}.1", 40000 + k)
        segs = conversation(c, S4, _kafka_messages(n, pad, rng, crafted), mss=mss, isn_client=isn + k * 7919,
                            handshake=handshake, close=rng.choice(("fin", "rst", None)), ts0=1_700_000_000.0 + k / 7)
        segs = mangle(segs, drop=drop, duplicate=duplicate, reorder=reorder, truncate=truncate,
                      resegment=resegment, conflict=conflict, seed=seed + k)
        for _ in range(rsts):  # forged RSTs: in window, out of window, acking nothing sent
            if segs:
                s = rng.choice(segs)
                seq = (s.seq + rng.choice((0, 1, -1, 1 << 20, rng.randrange(1 << 32)))) & 0xFFFFFFFF
                segs.insert(rng.randrange(len(segs) + 1), s._replace(flags=RST | (ACK if rng.random() < 0.5 else 0),
                                                                     seq=seq, payload=b""))
        for _ in range(rng.randrange(3)):  # a flipped flag bit somewhere
            if segs:
                i = rng.randrange(len(segs))
                segs[i] = segs[i]._replace(flags=segs[i].flags ^ (1 << rng.randrange(6)))
        streams.append(segs)
    merged: list[TcpSegment] = []
    # interleaved in a random order, each connection's own order kept; a capture may end
    # anywhere, and past MAX_PACKETS (7-byte segments of 20 KB frames make 200k) an
    # example costs minutes without reaching anything new
    while any(streams) and len(merged) < MAX_PACKETS:
        merged.append(rng.choice([s for s in streams if s]).pop(0))
    buf = io.BytesIO()
    write_pcap(buf, merged)
    return _packets_of(buf.getvalue())


adversarial_tcp = st.builds(
    _adversarial, seed=st.integers(0, 2**31), n=st.integers(1, 12), pad=st.sampled_from([0, 30, 700, 3000, 20000]),
    mss=st.sampled_from([7, 100, 536, 1460, 9000]), drop=st.sampled_from([0.0, 0.0, 0.05, 0.2]),
    duplicate=st.sampled_from([0.0, 0.1, 0.3]), reorder=st.sampled_from([0.0, 0.1, 0.4]),
    truncate=st.sampled_from([0.0, 0.0, 0.1]), resegment=st.sampled_from([0.0, 0.1, 0.3]),
    conflict=st.sampled_from([0.0, 0.1]), crafted=st.sampled_from([0.0, 0.0, 0.2]), rsts=st.integers(0, 2),
    handshake=st.booleans(), isn=st.sampled_from([1000, 0xFFFFFF00, 0xFFFFFFFF - 5000]), conns=st.integers(1, 3))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(packets=adversarial_tcp, small_frames=st.booleans())
def test_driver_is_identical_on_adversarial_tcp(packets, small_frames):
    """Reordered, lost, duplicated, overlapping and conflicting segments, snaplen cuts, forged
    RSTs, flipped flags and lying size prefixes: the same rows, packet and byte books,
    connection books, and the same state after every packet."""
    config = DissectConfig(kafka_ports=frozenset({9092}), max_frame_size=4096 if small_frames else 100 << 20)
    compiled = _drive(packets, config, every_packet=True)
    with python_core():
        python = _drive(packets, config, every_packet=True)
    assert compiled == python


@pytest.mark.parametrize("capture", captures(), ids=lambda p: p.name)
def test_driver_state_is_identical_on_every_capture(capture):
    packets = _packets_of(capture.read_bytes())
    compiled = _drive(packets, every_packet=len(packets) < 5000)
    with python_core():
        python = _drive(packets, every_packet=len(packets) < 5000)
    assert compiled == python


def test_the_compiled_driver_takes_ordinary_segments(monkeypatch):
    """Not a vacuous equality: with the compiled core, the in-order segments of a clean
    conversation (whole frames, and frames larger than a segment) mostly never reach the
    Python reassembler or splitter; the handshake, detection and close do."""
    from kwinspect import dissect
    from kwinspect.capture.tcp import TcpReassembler
    from kwinspect.stream.framing import FrameSplitter

    packets = _packets_of(_capture_file("pcap", "ethernet", False, 40, 3000, 1460, 0.0, 0.0, 1, "<", False, 262144))
    calls = {"tcp": 0, "splitter": 0, "driver": 0, "taken": 0}
    real = dissect.segment_fastpath

    def counting(name, fn):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return wrapper

    def driver(state, seg, packets):
        calls["driver"] += 1
        done = real(state, seg, packets)
        calls["taken"] += done is not None
        return done

    monkeypatch.setattr(dissect, "segment_fastpath", driver)
    monkeypatch.setattr(TcpReassembler, "feed", counting("tcp", TcpReassembler.feed))
    monkeypatch.setattr(FrameSplitter, "feed", counting("splitter", FrameSplitter.feed))
    rows = _drive(packets)[0]
    assert len([r for r, _order in rows if r.get("api_key") == 18]) == 40, rows[:3]  # every exchange decoded
    assert calls["driver"] == len(packets) - 1  # (the first packet brings new endpoints: the parser's Python)
    # 40 requests of 3 segments (the first starts a frame, the second is inside it, the
    # third completes it), 40 one-segment responses, 80 ACKs: only the handshake, the first
    # request (detection) and the close take the Python path (246 packets: 6 measured)
    assert calls["taken"] >= len(packets) - 10, calls
    assert calls["tcp"] == len(packets) - calls["taken"], calls
    assert calls["splitter"] <= 2, calls


def test_the_compiled_driver_refuses_bad_arguments():
    from kwinspect import dissect

    d = Dissector()
    seg = (1.0, S4, C4, 0, 0, 0x10, b"", 1, 0)
    with pytest.raises(TypeError):
        dissect.segment_fastpath(None, seg, 1)
    with pytest.raises(ValueError):
        dissect.segment_fastpath((d,), seg, 1)
    with pytest.raises(ValueError):
        dissect.segment_fastpath(d._c_driver_state, seg, 0)
    with pytest.raises(TypeError):
        dissect.segment_fastpath((d, d.tcp, dict, dict, dict), seg, 1)
    # a segment of no connection, odd field types: declined, nothing changed
    before = _state(d)
    assert dissect.segment_fastpath(d._c_driver_state, seg, 1) is None
    assert dissect.segment_fastpath(d._c_driver_state, (1, S4, C4, 0, 0, 0x10, b"", 1, 0), 1) is None
    assert dissect.segment_fastpath(d._c_driver_state, (1.0, S4, C4, 0, 0, 0x10, bytearray(), 1, 0), 1) is None
    assert dissect.segment_fastpath(d._c_driver_state, (1.0, S4, C4, 1 << 40, 0, 0x10, b"", 1, 0), 1) is None
    assert _state(d) == before
