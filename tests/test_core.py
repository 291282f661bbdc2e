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
