"""Capture readers: formats, byte orders, resolutions, gzip, truncation, oracles."""

from __future__ import annotations

import gzip
import io
import struct

import dpkt
import pytest
from helpers import pcapgen
from helpers.pcapgen import Frame, conversation, to_bytes, write_pcap, write_pcapng
from hypothesis import given, settings
from hypothesis import strategies as st

from kwinspect import model
from kwinspect.capture.readers import CaptureFormatError, RawPacket, open_capture

MSGS = [("c", b"hello kafka" * 50), ("s", bytes(range(256)) * 9), ("c", b"x")]


def _segs():
    return conversation(("10.1.2.3", 40000), ("10.9.8.7", 9092), MSGS, mss=700)


def _read(data: bytes) -> tuple[list[RawPacket], object]:
    src = open_capture(io.BytesIO(data))
    with src:
        pkts = list(src)
    return pkts, src


@pytest.mark.parametrize("byteorder", ["<", ">"])
@pytest.mark.parametrize("nano", [False, True])
@pytest.mark.parametrize("gz", [False, True])
def test_pcap_variants_roundtrip(byteorder, nano, gz):
    frames = pcapgen.build_frames(_segs(), pcapgen.LINKTYPE_ETHERNET)
    # timestamps with sub-microsecond parts only survive in nanosecond files
    for k, fr in enumerate(frames):
        fr.ts = 1_700_000_000 + k * 0.25 + (0.000000123 if nano else 0.000001)
    data = to_bytes(write_pcap, frames, pcapgen.LINKTYPE_ETHERNET, byteorder=byteorder,
                    nano=nano, gz=gz)
    pkts, src = _read(data)
    assert [p.data for p in pkts] == [f.data for f in frames]
    assert [p.index for p in pkts] == list(range(1, len(frames) + 1))
    assert all(p.linktype == 1 and p.wire_len == len(p.data) for p in pkts)
    for p, f in zip(pkts, frames, strict=True):
        assert p.ts == pytest.approx(f.ts, abs=1e-9 if nano else 1e-6)
    assert src.stats.format == "pcap" and src.stats.compressed == gz
    assert src.stats.packets == len(frames)
    assert src.issues == []


def test_pcap_matches_dpkt_reader():
    """dpkt's own reader is an independent oracle for our fast path."""
    data = to_bytes(write_pcap, _segs(), pcapgen.LINKTYPE_LINUX_SLL2)
    ours, _ = _read(data)
    theirs = list(dpkt.pcap.Reader(io.BytesIO(data)))
    assert [(round(p.ts, 6), p.data) for p in ours] == [(round(float(t), 6), d) for t, d in theirs]


@pytest.mark.parametrize("byteorder", ["<", ">"])
@pytest.mark.parametrize("gz", [False, True])
def test_pcapng_multiple_interfaces(byteorder, gz):
    segs = _segs()
    a = pcapgen.build_frames(segs[::2], pcapgen.LINKTYPE_ETHERNET, vlan=(7,), iface=0)
    b = pcapgen.build_frames(segs[1::2], pcapgen.LINKTYPE_LINUX_SLL2, iface=1)
    c = pcapgen.build_frames(segs[:3], pcapgen.LINKTYPE_RAW, iface=2)
    frames = sorted(a + b + c, key=lambda f: f.ts)
    ifaces = [(pcapgen.LINKTYPE_ETHERNET, 6), (pcapgen.LINKTYPE_LINUX_SLL2, 9),
              (pcapgen.LINKTYPE_RAW, 0x80 | 20)]
    data = to_bytes(write_pcapng, frames, ifaces, byteorder=byteorder, gz=gz)
    pkts, src = _read(data)
    lts = {0: 1, 1: 276, 2: 101}
    assert [(p.linktype, p.data) for p in pkts] == [(lts[f.iface], f.data) for f in frames]
    for p, f in zip(pkts, frames, strict=True):
        assert p.ts == pytest.approx(f.ts, abs=1e-6)
    assert [lt for lt, _ in src.stats.interfaces] == [1, 276, 101]
    assert src.stats.interfaces[1][1] == pytest.approx(1e-9)
    assert src.stats.interfaces[2][1] == pytest.approx(2 ** -20)
    assert src.issues == []


def test_pcapng_two_sections_change_byte_order():
    segs = _segs()
    f1 = pcapgen.build_frames(segs[:4], pcapgen.LINKTYPE_ETHERNET)
    f2 = pcapgen.build_frames(segs[4:], pcapgen.LINKTYPE_LINUX_SLL)
    data = to_bytes(write_pcapng, f1, byteorder="<") + to_bytes(
        write_pcapng, f2, [(pcapgen.LINKTYPE_LINUX_SLL, 6)], byteorder=">")
    pkts, src = _read(data)
    assert [p.data for p in pkts] == [f.data for f in f1 + f2]
    assert [p.linktype for p in pkts] == [1] * 4 + [113] * len(f2)
    assert src.issues == []


@pytest.mark.parametrize("fmt", ["pcap", "pcapng"])
def test_snaplen_truncated_records(fmt):
    segs = [s._replace(payload=s.payload[:10], missing=len(s.payload) - 10)
            if len(s.payload) > 10 else s for s in _segs()]
    frames = pcapgen.build_frames(segs, pcapgen.LINKTYPE_ETHERNET)
    writer = write_pcap if fmt == "pcap" else write_pcapng
    pkts, src = _read(to_bytes(writer, frames))
    cut = [p for p in pkts if p.wire_len > len(p.data)]
    assert len(cut) == sum(1 for s in segs if s.missing) > 0
    assert [p.wire_len for p in pkts] == [f.wire_len for f in frames]
    assert src.stats.snaplen_truncated == len(cut)
    assert any(i.kind == "snaplen_truncated" for i in src.issues)


@pytest.mark.parametrize("fmt", ["pcap", "pcapng"])
@pytest.mark.parametrize("gz", [False, True])
def test_file_cut_mid_record_is_reported_not_fatal(fmt, gz):
    frames = pcapgen.build_frames(_segs(), pcapgen.LINKTYPE_ETHERNET)
    writer = write_pcap if fmt == "pcap" else write_pcapng
    full = to_bytes(writer, frames)
    whole, _ = _read(full)
    header = 24 if fmt == "pcap" else 28 + 32  # file header (+ IDB with its option)
    boundaries = [header]  # file offsets where a record ends
    for f in frames:
        rec = 16 + len(f.data) if fmt == "pcap" else 32 + len(f.data) + (-len(f.data)) % 4
        boundaries.append(boundaries[-1] + rec)
    assert boundaries[-1] == len(full)
    # cut at every byte of the first three records and at some later points
    cuts = list(range(header + 1, header + 3 * 120)) + list(range(header, len(full), 97))
    for cut in cuts:
        data = full[:cut]
        if gz:
            data = gzip.compress(full)[: max(30, cut * len(gzip.compress(full)) // len(full))]
        pkts, src = _read(data)
        n = len(pkts)
        assert n <= len(whole)
        # every complete packet is intact; a partial last one is a prefix of the real one
        for p, w in zip(pkts, whole, strict=False):
            assert w.data.startswith(p.data) and p.index == w.index
        truncated = any(i.kind == model.TRUNCATED_PACKET for i in src.issues)
        if gz:
            assert truncated, (cut, src.issues)  # a cut gzip stream is always reported
        elif cut in boundaries:
            assert not truncated and n == boundaries.index(cut), (cut, src.issues)
        else:
            assert truncated, (cut, src.issues)


@pytest.mark.parametrize("content", [
    b"", b"hello world, this is text\n", b"\x00" * 100, b"\xd4\xc3\xb2",
    gzip.compress(b"not a capture at all", mtime=0), b"\x0a\x0d\x0d\x0a\x1c\x00\x00\x00\x99\x99\x99\x99",
])
def test_not_a_capture_raises_one_clear_error(content, tmp_path):
    p = tmp_path / "notcap.pcap"
    p.write_bytes(content)
    with pytest.raises(CaptureFormatError) as ei:
        open_capture(p)
    assert str(p) in str(ei.value) and "\n" not in str(ei.value)
    with pytest.raises(CaptureFormatError):
        open_capture(io.BytesIO(content))


def test_missing_file_is_a_format_error(tmp_path):
    with pytest.raises(CaptureFormatError):
        open_capture(tmp_path / "nope.pcap")


def test_detection_by_magic_not_name(tmp_path):
    frames = pcapgen.build_frames(_segs(), pcapgen.LINKTYPE_ETHERNET)
    p = tmp_path / "capture.txt"
    write_pcapng(p, frames, gz=True)
    with open_capture(p) as src:
        assert src.format == "pcapng" and src.compressed
        assert len(list(src)) == len(frames)


def test_corrupt_length_stops_with_issue():
    frames = pcapgen.build_frames(_segs(), pcapgen.LINKTYPE_ETHERNET)
    data = bytearray(to_bytes(write_pcap, frames))
    # third record's caplen -> absurd
    off = 24
    for f in frames[:2]:
        off += 16 + len(f.data)
    data[off + 8:off + 12] = (0x7FFFFFFF).to_bytes(4, "little")
    pkts, src = _read(bytes(data))
    assert len(pkts) == 2
    assert any(i.kind == "corrupt_capture" for i in src.issues)


def test_pcapng_unknown_blocks_skipped_and_simple_packet_block():
    frames = pcapgen.build_frames(_segs()[:3], pcapgen.LINKTYPE_ETHERNET)
    data = to_bytes(write_pcapng, frames)
    # append a custom block (type 0xBAD) and a Simple Packet Block
    import struct
    custom = struct.pack("<II", 0xBAD, 16) + b"abcd" + struct.pack("<I", 16)
    pkt = frames[0].data
    pad = (-len(pkt)) % 4
    spb = struct.pack("<III", 3, 16 + len(pkt) + pad, len(pkt)) + pkt + b"\0" * pad + \
        struct.pack("<I", 16 + len(pkt) + pad)
    pkts, src = _read(data + custom + spb)
    assert len(pkts) == 4 and pkts[3].data == pkt and pkts[3].ts == pkts[2].ts
    assert src.stats.skipped_blocks == 1


def test_public_captures_match_tshark(tshark_frames):
    for path, rows in tshark_frames.items():
        with open_capture(path) as src:
            pkts = list(src)
        assert len(pkts) == len(rows), path
        for p, row in zip(pkts, rows, strict=True):
            assert (p.wire_len, len(p.data)) == (int(row["frame.len"]),
                                                 int(row["frame.cap_len"])), path
            assert abs(p.ts - float(row["frame.time_epoch"])) < 2e-6, path
        assert src.issues == []


def test_iteration_is_single_pass_and_close_is_idempotent():
    data = to_bytes(write_pcap, _segs())
    src = open_capture(io.BytesIO(data))
    assert len(list(src)) == len(_segs())
    with pytest.raises(RuntimeError):
        iter(src)
    src.close()
    src.close()


def test_frame_type_keeps_fields():
    fr = Frame(1.5, b"ab", 10, 0)
    assert fr.wire_len == 10


@pytest.mark.parametrize("byteorder", ["<", ">"])
def test_modified_pcap_24_byte_records(byteorder):
    """The patched-libpcap ("Kuznetsov") format: magic a1b2cd34, 8 extra bytes per record."""
    import struct

    frames = pcapgen.build_frames(_segs()[:4], pcapgen.LINKTYPE_ETHERNET)
    out = struct.pack(byteorder + "IHHiIII", 0xA1B2CD34, 2, 4, 0, 0, 65535, 1)
    for f in frames:
        sec = int(f.ts)
        out += struct.pack(byteorder + "IIII", sec, round((f.ts - sec) * 1e6), len(f.data),
                           f.wire_len) + b"\0" * 8 + f.data
    pkts, src = _read(out)
    assert [p.data for p in pkts] == [f.data for f in frames] and src.issues == []


_VALID = {}


def _valid(fmt: str) -> bytes:
    if fmt not in _VALID:
        frames = pcapgen.build_frames(_segs()[:6], pcapgen.LINKTYPE_ETHERNET)
        _VALID[fmt] = to_bytes(write_pcap if fmt == "pcap" else write_pcapng, frames)
    return _VALID[fmt]


@settings(max_examples=300, deadline=None)
@given(fmt=st.sampled_from(["pcap", "pcapng"]), flips=st.lists(
    st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=8),
    cut=st.integers(0, 10_000), tail=st.binary(max_size=64))
def test_fuzz_corrupted_files_never_raise_while_reading(fmt, flips, cut, tail):
    data = bytearray(_valid(fmt))
    for pos, val in flips:
        if pos < len(data):
            data[pos] = val
    data = bytes(data[: max(cut, 0)]) + tail if cut < len(data) else bytes(data) + tail
    try:
        src = open_capture(io.BytesIO(data))
    except CaptureFormatError:
        return  # the one exception allowed, and only at open time
    with src:
        pkts = list(src)
    assert src.stats.packets == len(pkts)
    assert all(isinstance(i, model.Issue) for i in src.issues)
    assert [p.index for p in pkts] == list(range(1, len(pkts) + 1))


def test_caller_file_object_is_not_closed(tmp_path):
    p = tmp_path / "x.pcap"
    write_pcap(p, _segs())
    with open(p, "rb") as f:
        with open_capture(f) as src:
            assert len(list(src)) == len(_segs())
        assert not f.closed


@pytest.mark.parametrize("byteorder", ["<", ">"])
def test_pcapng_tsoffset(byteorder):
    frames = pcapgen.build_frames(_segs()[:5], pcapgen.LINKTYPE_ETHERNET)
    data = to_bytes(write_pcapng, frames, [(1, 6, 1_600_000_000)], byteorder=byteorder)
    raw = bytearray(data)
    pkts, _src = _read(bytes(raw))
    assert [p.ts for p in pkts] == pytest.approx([f.ts for f in frames], abs=1e-6)
    # the stored timestamps really are relative to the offset: SHB 28 + IDB 44 bytes
    hi, lo = struct.unpack_from(byteorder + "II", raw, 28 + 44 + 12)
    assert (hi << 32) | lo == round((frames[0].ts - 1_600_000_000) * 1e6)


def test_format_constants_are_dpkts():
    """readers.py spells out dpkt's constants instead of importing dpkt (start-up time)."""
    import subprocess
    import sys

    from kwinspect.capture import readers

    for mod, names in ((dpkt.pcap, ("TCPDUMP_MAGIC", "PMUDPCT_MAGIC", "TCPDUMP_MAGIC_NANO", "PMUDPCT_MAGIC_NANO",
                                     "MODPCAP_MAGIC")),
                       (dpkt.pcapng, ("PCAPNG_BT_IDB", "PCAPNG_BT_PB", "PCAPNG_BT_SPB", "PCAPNG_BT_EPB",
                                      "PCAPNG_BT_SHB", "BYTE_ORDER_MAGIC", "PCAPNG_OPT_ENDOFOPT",
                                      "PCAPNG_OPT_IF_TSRESOL", "PCAPNG_OPT_IF_TSOFFSET"))):
        for name in names:
            assert getattr(readers, name) == getattr(mod, name), name
    code = "import sys, kwinspect.run.files; print('dpkt' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"


def _taking_every_other_chunk(src) -> tuple[list[RawPacket], set[int]]:
    """``records(mapped=True)`` read by a consumer that takes the records of every other
    chunk itself (as the --jobs reader's compiled loop does) and leaves the rest to the
    reader (its Python path, over the map)."""
    out: list[RawPacket] = []
    sizes = set()  # of the chunks' buffers
    for n, item in enumerate(src.records(mapped=True)):
        if isinstance(item, RawPacket):
            out.append(item)
            continue
        view = memoryview(item.buf)
        sizes.add(len(view))
        big, nano, rec_len, linktype = item.layout[1:]
        rec = struct.Struct((">" if big else "<") + "IIII")
        while n % 2 == 0 and len(view) - item.pos >= rec_len:
            sec, frac, caplen, wire = rec.unpack_from(view, item.pos)
            if caplen > len(view) - item.pos - rec_len:
                break
            data = bytes(view[item.pos + rec_len:item.pos + rec_len + caplen])
            item.index += 1
            item.pos += rec_len + caplen
            item.bytes_wire += max(wire, caplen)
            item.truncated += wire > caplen
            out.append(RawPacket(sec + frac / (1e9 if nano else 1e6), linktype, data, max(wire, caplen), item.index))
        view.release()
    return out, sizes


@pytest.mark.parametrize("byteorder", ["<", ">"])
@pytest.mark.parametrize("shape", ["whole", "cut", "corrupt", "snaplen", "modified"])
def test_mapped_records_read_as_the_file_is_read(shape, byteorder, tmp_path):
    """``records(mapped=True)`` (the --jobs reader: the file mapped, not read) gives a regular
    file's packets, counters and issues as iter() does: whole files, a record cut by the end
    of the file, a corrupt length, snaplen-cut packets, 24-byte record headers."""
    segs = _segs()
    if shape == "snaplen":
        segs = [s._replace(payload=s.payload[:10], missing=len(s.payload) - 10) if len(s.payload) > 10 else s
                for s in segs]
    frames = pcapgen.build_frames(segs, pcapgen.LINKTYPE_ETHERNET)
    data = bytearray(to_bytes(write_pcap, frames, byteorder=byteorder))
    if shape == "modified":
        out = bytearray(struct.pack(byteorder + "IHHiIII", 0xA1B2CD34, 2, 4, 0, 0, 65535, 1))
        for f in frames:
            sec = int(f.ts)
            out += struct.pack(byteorder + "IIII", sec, round((f.ts - sec) * 1e6), len(f.data), f.wire_len)
            out += b"\0" * 8 + f.data
        data = out
    elif shape == "cut":
        data = data[:-7]
    elif shape == "corrupt":
        off = 24 + sum(16 + len(f.data) for f in frames[:5])
        data[off + 8:off + 12] = struct.pack(byteorder + "I", 0x7FFFFFFF)
    path = tmp_path / "c.pcap"
    path.write_bytes(bytes(data))
    with open_capture(str(path)) as src:
        want = list(src)
    with open_capture(str(path)) as mapped:
        got, sizes = _taking_every_other_chunk(mapped)
    assert got == want and len(want) >= 5
    assert sizes == {len(data)}  # one buffer: the whole file
    assert mapped.stats == src.stats
    assert mapped.issues == src.issues
    assert bool(src.issues) == (shape in ("cut", "corrupt", "snaplen"))
