"""Messages that are small on the wire but huge decoded: many tiny array elements.

- ``offset_fetch_flood``: one OffsetFetch v1 request of N topics, each an empty name and
  no partitions (6 bytes each: 8M of them are 48 MB, 2.2 GB decoded without a limit),
  answered by an empty response.
- ``unanswered_floods``: K OffsetFetch requests of N such topics each, never answered
  (their decoded bodies used to be kept until the end).
- ``many_records``: one unanswered Produce v3 of B batches of N minimal records (7 bytes
  each: `decode` of 4M of them took 3.1 GB in json.dumps).

    python tests/fuzz_regressions/element_floods.py OUT.pcap [N] [K]
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path

_TESTS = Path(__file__).resolve().parents[1]
if str(_TESTS) not in sys.path:
    sys.path.insert(0, str(_TESTS))

from helpers.pcapgen import conversation, write_pcap  # noqa: E402


def offset_fetch_request(cid: int, topics: int) -> bytes:
    """OffsetFetch v1 (api 9): header v1, group_id, topics[name int16 string, partitions int32 array]."""
    header = struct.pack(">hhih", 9, 1, cid, 7) + b"crafted"
    body = struct.pack(">h", 1) + b"g" + struct.pack(">i", topics) + b"\x00\x00\x00\x00\x00\x00" * topics
    frame = header + body
    return struct.pack(">i", len(frame)) + frame


def offset_fetch_response(cid: int) -> bytes:
    """OffsetFetch v1 response: no topics."""
    frame = struct.pack(">ii", cid, 0)
    return struct.pack(">i", len(frame)) + frame


def offset_fetch_flood(out: Path, topics: int) -> Path:
    msgs = [("c", offset_fetch_request(1, topics)), ("s", offset_fetch_response(1))]
    write_pcap(out, conversation(("10.0.0.1", 40000), ("10.0.0.2", 9092), msgs, mss=65000, acks=False))
    return out


def unanswered_floods(out: Path, topics: int, requests: int) -> Path:
    msgs = [("c", offset_fetch_request(cid, topics)) for cid in range(1, requests + 1)]
    write_pcap(out, conversation(("10.0.0.1", 40000), ("10.0.0.2", 9092), msgs, mss=65000, acks=False,
                                 close=None))
    return out


def _zigzag(n: int) -> bytes:
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | 0x80 if n else b)
        if not n:
            return bytes(out)


def _minimal_batch(count: int, base: int) -> bytes:
    """A v2 batch of `count` records without key, value or headers (CRC left 0: not checked here)."""
    recs = bytearray()
    for i in range(count):
        body = b"\x00" + _zigzag(0) + _zigzag(i) + _zigzag(-1) + _zigzag(-1) + _zigzag(0)
        recs += _zigzag(len(body)) + body
    after_crc = struct.pack(">hiqqqhii", 0, count - 1, 0, 0, -1, -1, -1, count) + bytes(recs)
    return struct.pack(">qiibI", base, 4 + 1 + 4 + len(after_crc), 0, 2, 0) + after_crc


def many_records(out: Path, batches: int, per_batch: int) -> Path:
    records = b"".join(_minimal_batch(per_batch, i * per_batch) for i in range(batches))
    header = struct.pack(">hhih", 0, 3, 1, 7) + b"crafted"
    body = (struct.pack(">hhii", -1, 1, 1000, 1) + struct.pack(">h", 1) + b"t"
            + struct.pack(">iii", 1, 0, len(records)) + records)
    frame = header + body
    msgs = [("c", struct.pack(">i", len(frame)) + frame)]
    write_pcap(out, conversation(("10.0.0.1", 40000), ("10.0.0.2", 9092), msgs, mss=65000, acks=False))
    return out


if __name__ == "__main__":
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 8_000_000
    k = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    if k:
        unanswered_floods(Path(sys.argv[1]), n, k)
    else:
        offset_fetch_flood(Path(sys.argv[1]), n)
