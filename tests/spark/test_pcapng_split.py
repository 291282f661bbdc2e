"""A big pcapng is read in byte ranges too, with the same tables as reading it whole.

The test file has three sections (little-endian, big-endian, little-endian), the first
two with two interfaces each of different link types, timestamp resolutions and
offsets, built from real shipped captures.  Ranges of 4 KiB cut it in the middle of
blocks; each range is read with the section header and interface blocks in effect
where it starts.  Spark-free checks look at the ranges themselves (starts on block
boundaries found by an independent walk; the packets of all ranges are the packets of
the file); the Spark check compares the pipeline's tables with the single-process
exporters', also for a pcapng with a corrupt block length in the middle (the reader
stops there, so that file must be read whole).
"""

from __future__ import annotations

import struct
from collections import Counter
from pathlib import Path

import dpkt
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kwinspect.capture.readers import open_capture
from kwinspect.spark.fragments import pcapng_spans, read_range, scan_pcapng_range
from kwinspect.spark.pipeline import PipelineOptions, _pcapng_spans, run_pipeline
from tests.helpers.pcapgen import LINKTYPE_ETHERNET, LINKTYPE_RAW, Frame, to_bytes, write_pcapng
from tests.spark.compare import compare, single_process_tables

# with the other modules that use the local Spark session (one session start, one worker)
pytestmark = pytest.mark.xdist_group("spark-session")

CAPTURES = Path(__file__).resolve().parents[2] / "captures"
SPLIT = 4096
SPARK_SPLIT = 32 << 10  # fewer, bigger ranges for the Spark run: a task costs Spark time


def _frames(name: str) -> list[tuple[float, bytes]]:
    with open(CAPTURES / name, "rb") as f:
        r = dpkt.pcap.Reader(f)
        assert r.datalink() == LINKTYPE_ETHERNET
        return [(ts, bytes(buf)) for ts, buf in r]


def _two_interfaces(packets, eth_iface: int) -> list[Frame]:
    """Every other packet on a raw-IP interface (Ethernet header stripped)."""
    out = []
    for i, (ts, buf) in enumerate(packets):
        if i % 2:
            out.append(Frame(ts, buf[14:], len(buf) - 14, 1 - eth_iface))
        else:
            out.append(Frame(ts, buf, len(buf), eth_iface))
    return out


@pytest.fixture(scope="module")
def multi_section(tmp_path_factory) -> Path:
    big = _frames("netns-mtu1500-produce-consume.pcap")
    half = len(big) // 2
    a = to_bytes(write_pcapng, _two_interfaces(big[:half], 0),
                 interfaces=[(LINKTYPE_ETHERNET, 6), (LINKTYPE_RAW, 9, 0)], byteorder="<")
    b = to_bytes(write_pcapng, _two_interfaces(big[half:], 1),
                 interfaces=[(LINKTYPE_RAW, 9), (LINKTYPE_ETHERNET, 0x80 | 20, 100)], byteorder=">")
    c = to_bytes(write_pcapng, [Frame(ts, buf, len(buf)) for ts, buf in _frames(
        "confluent-mock-produce-consume.pcap")], byteorder="<")
    path = tmp_path_factory.mktemp("pcapng") / "multi-section.pcapng"
    path.write_bytes(a + b + c)
    return path


def _boundaries(data: bytes) -> list[int]:
    """Block starts, walked from the file start (independent of the code under test)."""
    off, order, out = 0, "<", []
    while off + 12 <= len(data):
        out.append(off)
        if data[off:off + 4] == b"\x0a\x0d\x0d\x0a":
            order = "<" if data[off + 8:off + 12] == b"\x4d\x3c\x2b\x1a" else ">"
        off += struct.unpack_from(order + "I", data, off + 4)[0]
    assert off == len(data)
    return out


def _spans(path: Path):
    n = -(-path.stat().st_size // SPLIT)
    scans = [scan_pcapng_range(str(path), r, n, SPLIT) for r in range(n)]
    return n, pcapng_spans(scans)


def _segments(path: Path, spans) -> Counter:
    rows = []
    for r, span in enumerate(spans):
        for batch in read_range(str(path), 0, r, len(spans), SPLIT, span=span):
            t = pa.Table.from_batches([batch])
            rows += [(x["ts"], x["src_ip"], x["src_port"], x["seq"], x["payload"])
                     for x in t.to_pylist() if x["kind"] == "seg"]
    return Counter(rows)


def test_the_file_has_sections_interfaces_and_cuts_inside_blocks(multi_section):
    data = multi_section.read_bytes()
    starts = _boundaries(data)
    assert sum(data[o:o + 4] == b"\x0a\x0d\x0d\x0a" for o in starts) == 3
    assert sum(struct.unpack_from("<I", data, o)[0] in (1, 0x01000000) for o in starts) == 5
    cuts = range(SPLIT, len(data), SPLIT)
    assert sum(c not in starts for c in cuts) > 20  # the cut points fall inside blocks


def test_ranges_start_on_block_boundaries(multi_section):
    starts = set(_boundaries(multi_section.read_bytes()))
    n, spans = _spans(multi_section)
    assert spans is not None and len(spans) == n > 50
    assert all(s in starts for s, _e, _p in spans)
    assert [e for _s, e, _p in spans[:-1]] == [s for s, _e, _p in spans[1:]]


def test_ranges_hold_every_packet_once(multi_section):
    _n, spans = _spans(multi_section)
    whole = _segments(multi_section, [(0, multi_section.stat().st_size, b"")])
    parser_count = sum(1 for _ in open_capture(str(multi_section)))
    assert sum(whole.values()) > parser_count // 2  # most packets are TCP segments
    assert _segments(multi_section, spans) == whole


def test_a_corrupt_pcapng_is_not_split(multi_section, tmp_path):
    data = bytearray(multi_section.read_bytes())
    starts = _boundaries(bytes(data))
    middle = starts[len(starts) // 2]
    struct.pack_into("<I", data, middle + 4, 7)  # an invalid block length: the reader stops
    bad = tmp_path / "corrupt.pcapng"
    bad.write_bytes(bytes(data))
    _n, spans = _spans(bad)
    assert spans is None


@pytest.mark.spark
def test_split_pcapng_tables_equal_single_process(spark, multi_section, tmp_path):
    data = bytearray(multi_section.read_bytes())
    starts = _boundaries(bytes(data))
    struct.pack_into("<I", data, starts[len(starts) // 2] + 4, 7)
    corrupt = tmp_path / "corrupt.pcapng"
    corrupt.write_bytes(bytes(data))
    # a packet block naming an interface that does not exist, in a later range: the reader
    # skips it with an error row naming its file offset, which a range must report as such
    data = bytearray(multi_section.read_bytes())
    bad_iface = next(o for o in starts[len(starts) // 3:] if struct.unpack_from("<I", data, o)[0] == 6)
    struct.pack_into("<I", data, bad_iface + 8, 7)
    split = tmp_path / "split.pcapng"
    split.write_bytes(bytes(data))
    inputs = [str(corrupt), str(split)]  # sorted by name, as the pipeline orders them

    n = -(-split.stat().st_size // SPARK_SPLIT)
    planned = _pcapng_spans(spark, [(str(corrupt), 0, n), (str(split), 1, n)], SPARK_SPLIT)
    assert set(planned) == {1} and len(planned[1]) == n > 8  # the good file is split, the corrupt one not

    expected = single_process_tables(inputs, str(tmp_path / "single"))
    out = str(tmp_path / "out")
    run_pipeline(PipelineOptions(inputs=inputs, output=out, records=True, stats=False, split_bytes=SPARK_SPLIT,
                                 partitions=2),
                 spark=spark)
    for table in ("exchanges", "records", "errors"):
        ok, message = compare(expected[table], out, table)
        assert ok, message
    errors = pq.read_table(expected["errors"]).column("message").to_pylist()
    assert any(f"packet block at offset {bad_iface} refers to interface 7" in (m or "") for m in errors)
