"""PacketLoop over a reader's buffers (the compiled packet loop, Dissector.feed_chunk) gives
exactly what the loop one RawPacket at a time gives.

Both run the compiled core in one process; the per-packet loop is what a Dissector made
with ``dissect.chunk_fastpath`` set to None runs. Compared, in order: every row the loop
yields, every row filed in its RowOrder with its key (the compiled loop files a batch of
packets' rows at once, the per-packet one each packet's), every ``mark(ts)`` it makes,
every tick with its packet
count, the reader's ``position()`` and the counters at that moment, and at the end the
dissector's books (``packet_counts``, DissectStats, the parser's stats), the connections,
the reader's CaptureStats and issues. On shipped captures (IPv6, TLS, SASL, several
connections) and on generated files made of what the C declines: VLAN tags, IP fragments,
BSD loopback, non-Kafka connections, records cut by the end of the file, snaplen cuts,
gzip, pcapng with two interfaces and other blocks, a reader fed a few hundred bytes per
read, ticks that cancel the run and the long run of unparseable records that stops it.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import random
from pathlib import Path

import pytest
from helpers.cores import require_compiled
from helpers.pcapgen import (
    LINKTYPE_ETHERNET,
    LINKTYPE_LINUX_SLL2,
    LINKTYPE_LOOP,
    Frame,
    build_frames,
    conversation,
    mangle,
    write_pcap,
    write_pcapng,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kwinspect import dissect
from kwinspect.capture.readers import CaptureFormatError, open_capture
from kwinspect.dissect import DissectConfig, Dissector
from kwinspect.model import Endpoint
from kwinspect.run.loop import PacketLoop
from kwinspect.stream.row_order import RowOrder
from tests.test_core import _mutate, capture_files

ROOT = Path(__file__).resolve().parents[1]
S = Endpoint("10.0.0.2", 9092)


@pytest.fixture(autouse=True)
def _compiled():
    require_compiled()


class _RecordingRows(RowOrder):
    """A RowOrder that writes down every row filed and its key (the packet it is ordered by)."""

    def __init__(self, log: list) -> None:
        super().__init__()
        self.log = log

    def push(self, key, row) -> None:
        self.log.append(("push", key, repr(row)))
        super().push(key, row)

    def push_keyed(self, keyed) -> None:
        self.log.extend(("push", key, repr(row)) for key, row in keyed)
        super().push_keyed(keyed)


class _Recording(PacketLoop):
    """A PacketLoop that writes down where it acts (its feed and collect stay PacketLoop's:
    the compiled loop still runs, with rows per batch where it takes them so)."""

    def __init__(self, d: Dissector, src, log: list, cancel_at: int | None, **kw) -> None:
        super().__init__(d, **kw)
        self.src, self.log, self.cancel_at = src, log, cancel_at
        self.rows = _RecordingRows(log)

    def mark(self, ts: float) -> None:
        self.log.append(("mark", ts))
        super().mark(ts)

    def tick(self, count: int) -> bool:
        d = self.dissector
        self.log.append(("tick", count, self.src.position(), d.stats.packets,
                         dataclasses.astuple(d.parser.stats), d.packet_counts()))
        return self.cancel_at is not None and count >= self.cancel_at


def _run(make_input, *, chunked: bool, cancel_at: int | None = None, eager: bool = False,
         config: DissectConfig | None = None) -> dict:
    saved = dissect.chunk_fastpath
    if not chunked:
        dissect.chunk_fastpath = None
    try:
        src = open_capture(make_input())
        d = Dissector(config or DissectConfig(kafka_ports=frozenset({9092})))
    finally:
        dissect.chunk_fastpath = saved
    assert d.takes_chunks == chunked
    src.on_secrets = d.add_tls_secrets
    log: list = []
    taken = [0, 0]
    if chunked:  # how many records the compiled loop took (it must have taken some), and
        feed_chunk = d.feed_chunk  # how often it went on past a packet that left rows

        def counting(chunk, limit, marks=None):
            n = feed_chunk(chunk, limit, marks)
            taken[0] += n
            taken[1] += bool(marks) and marks[-1] < n
            return n
        d.feed_chunk = counting
    loop = _Recording(d, src, log, cancel_at, eager=eager)
    with src:
        for row in loop.run(src):
            log.append(("row", repr(row)))
        position = src.position()
    return {
        "log": log,
        "count": loop.count,
        "position": position,
        "packet_counts": d.packet_counts(),
        "stats": dataclasses.astuple(d.stats),
        "parser": dataclasses.astuple(d.parser.stats),
        "parser_issues": [repr(i) for i in d.parser.issues],
        "connections": [repr(dataclasses.replace(c, conversation=None)) for c in d.connections.values()],
        "reader": dataclasses.astuple(src.stats),
        "reader_issues": [repr(i) for i in src.issues],
        "_taken": taken[0],
        "_past_rows": taken[1],
    }


def _same(make_input, **kw) -> dict:
    chunked = _run(make_input, chunked=True, **kw)
    per_packet = _run(make_input, chunked=False, **kw)
    taken = chunked.pop("_taken")
    per_packet.pop("_taken")
    past_rows = chunked.pop("_past_rows")
    assert per_packet.pop("_past_rows") == 0
    assert chunked == per_packet
    assert taken > 0
    chunked["taken"] = taken
    chunked["past_rows"] = past_rows
    return chunked


class _Trickle(io.RawIOBase):
    """A file that gives at most a few hundred bytes per read (a pipe): the reader's buffer
    ends inside records all the time."""

    def __init__(self, data: bytes, seed: int) -> None:
        self._data, self._pos, self._rng = data, 0, random.Random(seed)

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        n = min(len(b), self._rng.randrange(1, 700), len(self._data) - self._pos)
        b[:n] = self._data[self._pos:self._pos + n]
        self._pos += n
        return n

    def tell(self) -> int:
        return self._pos


def _kafka(n: int, pad: int) -> list[tuple[str, bytes]]:
    out = []
    for cid in range(n):
        req = (18).to_bytes(2, "big") + (0).to_bytes(2, "big") + cid.to_bytes(4, "big") + b"\x00\x01c" + b"x" * pad
        resp = cid.to_bytes(4, "big") + bytes(12)
        out += [("c", len(req).to_bytes(4, "big") + req), ("s", len(resp).to_bytes(4, "big") + resp)]
    return out


def _mixed_frames(seed: int, n: int = 900) -> list[Frame]:
    """Kafka connections made of what the compiled loop takes and what it declines."""
    rng = random.Random(seed)
    frames: list[Frame] = []
    for k, (kw, extra) in enumerate([
        ({}, {}),                                   # plain Ethernet IPv4: the C takes it
        ({"vlan": (100,)}, {}),                     # a VLAN tag: the Python parser's
        ({"fragment_size": 512}, {"pad": 1500}),    # IP fragments
        ({}, {"v6": True}),                         # IPv6 (the C takes it too)
        ({}, {"mangle": True}),                     # lost, duplicated, reordered segments
        ({}, {"other_port": True}),                 # not Kafka
    ]):
        client = Endpoint(f"fd00::{k + 1}" if extra.get("v6") else f"10.0.{k}.1", 40000 + k)
        server = Endpoint("fd00::99", 9092) if extra.get("v6") else S
        if extra.get("other_port"):
            server = Endpoint("10.0.0.3", 8080)
            msgs = [("c", b"GET / HTTP/1.1\r\n\r\n" * 3), ("s", b"HTTP/1.1 200 OK\r\n\r\n" * 40)] * (n // 20)
        else:
            msgs = _kafka(n // 6, extra.get("pad", rng.choice((0, 40, 3000))))
        segs = conversation(client, server, msgs, mss=rng.choice((536, 1460)), ts0=1_700_000_000.0 + k / 7,
                            close=rng.choice(("fin", "rst", None)))
        if extra.get("mangle"):
            segs = mangle(segs, drop=0.05, duplicate=0.1, reorder=0.1, truncate=0.05, seed=seed)
        frames += build_frames(segs, LINKTYPE_ETHERNET, **kw)
    frames.sort(key=lambda f: f.ts)
    return frames


def _pcap(frames: list[Frame], **kw) -> bytes:
    buf = io.BytesIO()
    buf.close = lambda: None  # type: ignore[method-assign]
    write_pcap(buf, frames, **kw)
    return buf.getvalue()


# -- shipped captures -------------------------------------------------------------------------


SHIPPED = sorted((ROOT / "captures").glob("*.pcap"))


@pytest.mark.parametrize("capture", SHIPPED, ids=lambda p: p.name)
def test_same_rows_counters_and_ticks_on_every_shipped_capture(capture):
    _same(lambda: str(capture))


def test_same_with_tls_keys_and_a_pipe_read_as_it_arrives():
    from kwinspect.capture.keylog import KeyLog

    cap = ROOT / "captures" / "tansu-tls13-keylog.pcap"
    keys = KeyLog()
    keys.add_file(cap.with_suffix(".keys"))
    out = _same(lambda: _Trickle(cap.read_bytes(), 1), eager=True,
                config=DissectConfig(kafka_ports=frozenset({9092}), tls_keys=keys))
    assert out["past_rows"] == 0  # eager: back at every packet that leaves rows, to release them


# -- generated captures of what the C declines ----------------------------------------------


@pytest.mark.parametrize("seed", range(3))
def test_same_on_declined_packets(seed):
    data = _pcap(_mixed_frames(seed))
    out = _same(lambda: io.BytesIO(data))
    assert out["count"] > 2 * 1024  # several ticks
    assert out["past_rows"] > 0  # rows filed per batch, not at every packet that left some
    counts = out["packet_counts"]
    assert counts["kafka"] and counts["non_kafka"]


@pytest.mark.parametrize("seed", range(3))
def test_same_when_every_read_gives_a_few_hundred_bytes(seed):
    data = _pcap(_mixed_frames(seed, n=120))
    _same(lambda: _Trickle(data, seed), eager=seed == 1)


def test_same_on_a_cut_file():
    frames = _mixed_frames(4, n=120)
    data = _pcap(frames)
    for cut in (len(data) - 7, len(data) // 2 + 3):
        out = _same(lambda cut=cut: io.BytesIO(data[:cut]))
        assert out["reader_issues"]  # the cut is reported


def test_same_on_gzip_and_big_endian_nanosecond_files():
    frames = _mixed_frames(5, n=120)
    data = gzip.compress(_pcap(frames, byteorder=">", nano=True))
    out = _same(lambda: io.BytesIO(data))
    assert out["reader"][1] is True  # compressed
    _same(lambda: io.BytesIO(data[: len(data) * 2 // 3]))  # a cut gzip stream


def test_same_on_pcapng_with_two_interfaces_and_other_blocks():
    frames = _mixed_frames(6, n=120)
    # every third packet on a second interface (SLL2, nanoseconds, an offset), big-endian
    ng_frames = []
    for i, f in enumerate(frames):
        if i % 3 == 0:  # (a VLAN-tagged frame's tag becomes junk at the IP header: unparseable)
            ng_frames.append(Frame(f.ts, _sll2(f.data[14:]), f.wire_len + 6, 1))
        else:
            ng_frames.append(f)
    for order in ("<", ">"):
        buf = io.BytesIO()
        buf.close = lambda: None  # type: ignore[method-assign]
        write_pcapng(buf, ng_frames, interfaces=((LINKTYPE_ETHERNET, 6), (LINKTYPE_LINUX_SLL2, 9, 17)),
                     byteorder=order, secrets=[(0x544C534B, b"# no keys\n")])
        data = buf.getvalue()
        out = _same(lambda data=data: io.BytesIO(data))
        assert out["taken"] > out["count"] // 2  # both interfaces' blocks go through C
        _same(lambda data=data: _Trickle(data, 7))


def _sll2(ip: bytes) -> bytes:
    import struct

    etype = 0x0800 if ip[0] >> 4 == 4 else 0x86DD
    return struct.pack("!HHIHBB8s", etype, 0, 1, 772, 0, 6, b"\0" * 8) + ip


def test_same_on_bsd_loopback():
    segs = conversation(Endpoint("10.0.0.1", 40000), S, _kafka(400, 100))
    data = _pcap(build_frames(segs, LINKTYPE_LOOP), linktype=LINKTYPE_LOOP)
    _same(lambda: io.BytesIO(data))


# -- ticks that stop the run ------------------------------------------------------------------


@pytest.mark.parametrize("cancel_at", [1024, 2048])
def test_same_when_a_tick_cancels(cancel_at):
    data = _pcap(_mixed_frames(7))
    out = _same(lambda: io.BytesIO(data), cancel_at=cancel_at)
    assert out["count"] == cancel_at  # nothing read past the tick that cancelled
    assert out["reader"][2] == cancel_at  # the reader counted exactly what was handed out


def test_same_when_a_long_run_of_unparseable_records_stops_reading():
    segs = conversation(Endpoint("10.0.0.1", 40000), S, _kafka(30, 10))
    good = build_frames(segs, LINKTYPE_ETHERNET)
    junk = [Frame(good[-1].ts + i * 1e-6, b"\x00" * 10, 10, 0) for i in range(64 * 1024 + 2048)]
    data = _pcap(good + junk)
    out = _same(lambda: io.BytesIO(data))
    assert any(e[0] == "row" and "records in a row are not packets" in e[1] for e in out["log"])


def test_same_when_idle_connections_are_flushed():
    """Connections left open, then traffic minutes later: the idle checks close them at the
    same packets (config.idle_timeout, a check a minute)."""
    frames: list[Frame] = []
    for k in range(4):
        segs = conversation(Endpoint(f"10.0.1.{k}", 41000 + k), S, _kafka(150, 30), close=None,
                            ts0=1_700_000_000.0 + k * 400.0, dt=0.05)
        frames += build_frames(segs, LINKTYPE_ETHERNET)
    frames.sort(key=lambda f: f.ts)
    data = _pcap(frames)
    out = _same(lambda: io.BytesIO(data), config=DissectConfig(kafka_ports=frozenset({9092}), idle_timeout=120.0))
    assert sum("'idle'" in c for c in out["connections"]) >= 2


# -- generated and mutated files (hypothesis) -------------------------------------------------


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=capture_files, mseed=st.integers(0, 2**32), flips=st.integers(0, 12), cut=st.booleans(),
       trickle=st.booleans())
def test_same_on_mutated_files(data, mseed, flips, cut, trickle):
    """pcap and pcapng of every link type, both byte orders and resolutions, snaplen cuts,
    bytes flipped and files cut: whatever the reader makes of them, both loops agree."""
    data = _mutate(data, random.Random(mseed), flips, cut)
    try:
        open_capture(io.BytesIO(data)).close()
    except CaptureFormatError:
        return
    make = (lambda: _Trickle(data, mseed)) if trickle else (lambda: io.BytesIO(data))
    chunked = _run(make, chunked=True)
    per_packet = _run(make, chunked=False)
    for out in (chunked, per_packet):
        out.pop("_taken")
        out.pop("_past_rows")
    assert chunked == per_packet
