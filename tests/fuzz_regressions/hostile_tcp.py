"""Generators of the small hostile captures of "Hostile captures, round two" (TCP side).

Run as a script to write them next to this file for a look in Wireshark:
    python tests/fuzz_regressions/hostile_tcp.py /tmp/out
The tests build them in a temporary directory instead of committing binaries.
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path

_TESTS = Path(__file__).resolve().parents[1]
if str(_TESTS) not in sys.path:
    sys.path.insert(0, str(_TESTS))

from helpers.pcapgen import conversation, write_pcap  # noqa: E402

from kwinspect.capture.packets import ACK, FIN, RST, TcpSegment  # noqa: E402

CLIENT = ("10.0.0.1", 40000)
SERVER = ("10.0.0.2", 9092)
EXCHANGES = 11


def api_versions_exchange(cid: int) -> list[tuple[str, bytes]]:
    """ApiVersions v0: request with client id "c", response with no error and no api keys."""
    req = struct.pack(">hhih", 18, 0, cid, 1) + b"c"
    resp = struct.pack(">ihi", cid, 0, 0)
    return [("c", struct.pack(">i", len(req)) + req), ("s", struct.pack(">i", len(resp)) + resp)]


def _base() -> list[TcpSegment]:
    msgs = [m for cid in range(1, EXCHANGES + 1) for m in api_versions_exchange(cid)]
    return conversation(CLIENT, SERVER, msgs, close="fin")


def _after_first_exchange(segs: list[TcpSegment]) -> int:
    """Index just after the first server data segment (the first response)."""
    return next(i for i, s in enumerate(segs) if s.src.port == 9092 and s.payload) + 1


def forged_rst() -> list[TcpSegment]:
    """A server->client RST 2**30 bytes beyond the server's sequence space, after exchange 1."""
    segs = _base()
    k = _after_first_exchange(segs)
    ref = segs[k - 1]
    rst = ref._replace(seq=(ref.seq + (1 << 30)) & 0xFFFFFFFF, flags=RST | ACK, payload=b"",
                       ts=ref.ts + 0.0001)
    return segs[:k] + [rst] + segs[k:]


def forged_fins() -> list[TcpSegment]:
    """FINs in both directions at sequence numbers the receivers already have (old),
    after exchange 1: the rest of the conversation must go on."""
    segs = _base()
    k = _after_first_exchange(segs)
    first_c = next(s for s in segs if s.src.port != 9092 and s.payload)
    first_s = segs[k - 1]
    t = first_s.ts + 0.0001
    fins = [first_c._replace(flags=FIN | ACK, payload=b"", ts=t),
            first_s._replace(flags=FIN | ACK, payload=b"", ts=t)]
    return segs[:k] + fins + segs[k:]


def data_after_close() -> tuple[list[TcpSegment], int]:
    """A clean conversation closed by FINs, then a retransmitted copy of its last response:
    (segments, bytes that arrive after the close)."""
    segs = _base()
    last = max((s for s in segs if s.src.port == 9092 and s.payload), key=lambda s: s.ts)
    late = last._replace(ts=segs[-1].ts + 1.0)
    return segs + [late], len(late.payload)


def zero_length_frames(n: int = 2000) -> list[TcpSegment]:
    """One good exchange, then `n` zero-length Kafka frames from the client (each a
    4-byte size of 0): each is an undecodable request."""
    msgs = api_versions_exchange(1) + [("c", b"\0\0\0\0" * n)] + api_versions_exchange(2)
    return conversation(CLIENT, SERVER, msgs, close="fin")


def write_all(out: Path) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    files = {"forged-rst": forged_rst(), "forged-fins": forged_fins(),
             "data-after-close": data_after_close()[0], "zero-length-frames": zero_length_frames()}
    paths = {}
    for name, segs in files.items():
        paths[name] = out / f"{name}.pcap"
        write_pcap(paths[name], segs)
    return paths


if __name__ == "__main__":
    for p in write_all(Path(sys.argv[1] if len(sys.argv) > 1 else ".")).values():
        print(p)
