"""`kwinspect sanitize IN... -o OUT`: three passes over the input files.

1. The dissector (through PacketLoop, with an ``on_frame`` tap) finds the Kafka
   connections, which side is the client, and every complete frame of each
   direction in order.  Each frame is decoded, checked to encode back to its
   own bytes (what does not is "undecodable": dropped or zeroed), its fields
   replaced (fields.py) and encoded again.  The frames are walked twice: the
   first walk only learns the names, so free text met early (an error message
   naming a topic seen later) is cleaned too.
2. The packets are read again to rebuild each Kafka direction's byte stream
   by sequence number; the dissector's frames are found in it in order, and
   the bytes between them (resynchronised garbage, a cut-off last frame) are
   known to be zeroed.  That gives, per direction, a map from original stream
   offsets to new ones.
3. The packets are read a third time and written: each Kafka packet carries
   the new bytes of the range its original carried (cut at the same frame
   offsets, so the packet boundaries stay where sizes allow), with sequence
   and acknowledgement numbers (and SACK edges) moved through the maps, so
   retransmissions, gaps, FINs and RSTs stay as they were; addresses are
   mapped, checksums computed anew.

Memory: the Kafka bytes of the input, about three times (original frames, new
frames, rebuilt streams); see docs/limits.md.
"""

from __future__ import annotations

import heapq
import ipaddress
import struct
from bisect import bisect_right
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from kwinspect.capture.readers import open_capture
from kwinspect.dissect import ConnectionInfo, DissectConfig, Dissector
from kwinspect.model import Endpoint
from kwinspect.protocol import decode_request, decode_response
from kwinspect.protocol.encode import EncodeError, encode_request, encode_response
from kwinspect.protocol.peek import peek_request_header, plausible_header
from kwinspect.protocol.schema.api_keys import ApiKey
from kwinspect.run.loop import PacketLoop
from kwinspect.sanitize import packets as pk
from kwinspect.sanitize.fields import Unsanitizable, sanitize_message
from kwinspect.sanitize.pcapout import open_writer
from kwinspect.sanitize.pseudonyms import Pseudonyms, new_secret

SYN, FIN, ACK = 0x02, 0x01, 0x10
MAX_PAYLOAD = 65000
SASL_HANDSHAKE, API_VERSIONS = int(ApiKey.SASL_HANDSHAKE), int(ApiKey.API_VERSIONS)  # an IP packet holds at most 65535 bytes: larger new payloads are split


@dataclass
class SanitizeOptions:
    values: str = "hash"  # hash | keep | truncate:N
    secret: bytes | None = None  # None: random for this run
    keep_topics: bool = False
    keep_other: bool = False
    undecodable: str = "drop"  # drop | zero


@dataclass
class Report:
    inputs: list[str]
    output: str
    packets: Counter[str] = field(default_factory=Counter)
    frames: Counter[str] = field(default_factory=Counter)
    connections: Counter[str] = field(default_factory=Counter)
    bytes: Counter[str] = field(default_factory=Counter)
    replaced: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        return {"inputs": self.inputs, "output": self.output, "packets": dict(self.packets),
                "frames": dict(self.frames), "connections": dict(self.connections),
                "bytes": dict(self.bytes), "replaced": dict(sorted(self.replaced.items()))}


def _signed(n: int) -> int:
    n &= 0xFFFFFFFF
    return n - (1 << 32) if n >= 1 << 31 else n


def _merged(paths: list[str]):
    sources = [open_capture(p) for p in paths]
    try:
        yield from (iter(sources[0]) if len(sources) == 1 else heapq.merge(*sources, key=lambda r: r.ts))
    finally:
        for s in sources:
            s.close()


# --------------------------------------------------------------------------- pass 1: frames


class _Direction:
    """One direction of a Kafka connection: its frames, its stream, its offset map."""

    def __init__(self) -> None:
        self.frames: list[bytes] = []  # original frames (no size prefix), in order
        self.new: list[bytes] = []  # what each becomes, with its size prefix (b"" when dropped)
        self.syn: int | None = None
        self.segments: dict[int, bytes] = {}  # seq -> payload (pass 2)
        self.base = 0
        # tiles: (orig_start, orig_len, new_start, new bytes or None for zeros of orig_len)
        self.starts: list[int] = []
        self.new_starts: list[int] = []
        self.tiles: list[tuple[int, int, int, bytes | None]] = []
        self.orig_end = 0
        self.new_end = 0

    def offset(self, seq: int) -> int:
        return _signed(seq - self.base)

    def map(self, x: int) -> int:
        """New stream offset of original offset x (sequence space; FIN and SYN included)."""
        if x <= 0 or not self.tiles:
            return x
        if x >= self.orig_end:
            return self.new_end + (x - self.orig_end)
        i = bisect_right(self.starts, x) - 1
        o_start, o_len, n_start, blob = self.tiles[i]
        n_len = o_len if blob is None else len(blob)
        return n_start + min(x - o_start, n_len)

    def new_bytes(self, a: int, b: int) -> bytes:
        """The new stream's bytes [a, b); past the tiles (never captured) there is nothing to give."""
        out = bytearray()
        i = max(bisect_right(self.new_starts, a) - 1, 0)
        while i < len(self.tiles) and a < b:
            o_start, o_len, n_start, blob = self.tiles[i]
            n_len = o_len if blob is None else len(blob)
            lo, hi = max(a, n_start), min(b, n_start + n_len)
            if lo < hi:
                out += bytes(hi - lo) if blob is None else blob[lo - n_start:hi - n_start]
            i += 1
        return bytes(out)


class _Connection:
    def __init__(self, info: ConnectionInfo) -> None:
        self.client, self.broker = info.client, info.broker
        self.to_broker, self.to_client = _Direction(), _Direction()
        self.unsafe: str | None = None

    def direction(self, src: Endpoint) -> tuple[_Direction, _Direction]:
        if src == self.client:
            return self.to_broker, self.to_client
        return self.to_client, self.to_broker


class Sanitizer:
    def __init__(self, paths: list[str], output: str, options: SanitizeOptions,
                 config: DissectConfig | None = None) -> None:
        self.paths, self.output, self.options = paths, output, options
        self.config = config or DissectConfig()
        self.ps = Pseudonyms(options.secret or new_secret(), values=options.values,
                             keep_topics=options.keep_topics)
        self.report = Report(inputs=list(paths), output=output)
        self.streams: dict[str, dict[str, list[bytes]]] = defaultdict(lambda: {"request": [], "response": []})
        self.connections: dict[tuple[Endpoint, Endpoint], _Connection] = {}
        self.macs: dict[bytes, bytes] = {}
        self.original_v4: set[bytes] = set()
        self.tls: set[tuple[Endpoint, Endpoint]] = set()  # TLS connections: never written

    # ------------------------------------------------------------------ pass 1

    def read_frames(self) -> None:
        infos: dict[str, ConnectionInfo] = {}

        def on_frame(stream: str, direction: str, frame: bytes) -> None:
            self.streams[stream][direction].append(bytes(frame))

        def on_close(info: ConnectionInfo) -> None:
            infos[info.stream] = info

        d = Dissector(self.config, on_frame=on_frame, on_close=on_close, keep_conversations=False)
        for _ in PacketLoop(d).run(_merged(self.paths)):
            pass
        for info in d.connections.values():
            infos.setdefault(info.stream, info)
        for info in infos.values():
            if info.kind != "kafka" or info.client is None or info.broker is None:
                self.report.connections["not_kafka" if info.kind != "tls" else "tls"] += 1
                if info.kind == "tls":
                    self.tls.update({(info.a, info.b), (info.b, info.a)})
                continue
            if info.tls is not None:
                self.report.connections["tls"] += 1
                self.tls.update({(info.client, info.broker), (info.broker, info.client)})
                continue
            conn = _Connection(info)
            frames = self.streams.pop(info.stream, {"request": [], "response": []})
            conn.to_broker.frames, conn.to_client.frames = frames["request"], frames["response"]
            self.connections[(info.client, info.broker)] = conn
            self.connections[(info.broker, info.client)] = conn

    def _kafka_connections(self) -> list[_Connection]:
        seen, out = set(), []
        for conn in self.connections.values():
            if id(conn) not in seen:
                seen.add(id(conn))
                out.append(conn)
        return out

    def sanitize_frames(self) -> None:
        conns = self._kafka_connections()
        for conn in conns:  # addresses first, so host fields holding them get the same ones
            self.ps.ip(conn.client.ip)
            self.ps.ip(conn.broker.ip)
        self.ps.counting = False
        for conn in conns:  # learn the names
            self._sanitize_connection(conn, keep=False)
        self.ps.counting = True
        for conn in conns:
            self._sanitize_connection(conn, keep=True)
        self.report.replaced.update(self.ps.counts)

    def _sanitize_connection(self, conn: _Connection, keep: bool) -> None:
        pending: dict[int, tuple[int, int]] = {}
        # SaslHandshake v0: the SASL exchange follows as raw size-prefixed tokens, not
        # Kafka messages; what does not decode on such a connection is a token
        raw_sasl = any(kv == (SASL_HANDSHAKE, 0) for kv in self._handshakes(conn))
        # responses need their requests' api key and version: all requests first (a
        # response never comes before its request)
        news_req = [self._frame(f, True, pending, keep, raw_sasl) for f in conn.to_broker.frames]
        news_resp = [self._frame(f, False, pending, keep, raw_sasl) for f in conn.to_client.frames]
        if keep:
            conn.to_broker.new, conn.to_client.new = news_req, news_resp

    @staticmethod
    def _handshakes(conn: _Connection):
        for frame in conn.to_broker.frames:
            if len(frame) >= 4:
                yield struct.unpack_from(">hh", frame)

    @staticmethod
    def _plausible_request(frame: bytes) -> bool:
        peek = peek_request_header(frame)
        return peek is not None and plausible_header(peek)

    def _undecodable(self, frame: bytes) -> bytes:
        if self.options.undecodable == "drop":
            return b""
        return struct.pack(">i", len(frame)) + bytes(len(frame))

    def _frame(self, frame: bytes, is_request: bool, pending: dict, keep: bool, raw_sasl: bool) -> bytes:
        if keep:
            self.report.frames["requests" if is_request else "responses"] += 1
        if raw_sasl and (not is_request or not self._plausible_request(frame)) and (
                is_request or len(frame) < 4 or struct.unpack_from(">i", frame)[0] not in pending):
            if keep:
                self.report.frames["sasl_tokens_blanked"] += 1
            # 0xFF, not zeros: a blank token must not read as a Produce v0 request
            return struct.pack(">i", len(frame)) + b"\xff" * len(frame)
        if not is_request and len(frame) >= 4 and struct.unpack_from(">i", frame)[0] not in pending:
            # its request is not in the capture (it started mid-connection): the body cannot be
            # read, the correlation id can; kept, so the response is still seen unanswered
            if keep:
                self.report.frames["responses_without_request_blanked"] += 1
            return struct.pack(">i", len(frame)) + frame[:4] + bytes(len(frame) - 4)
        new = self._sanitize_frame(frame, is_request, pending)
        if new is None:
            if keep:
                self.report.frames[f"undecodable_{'dropped' if self.options.undecodable == 'drop' else 'zeroed'}"] += 1
            return self._undecodable(frame)
        if keep:
            self.report.frames["sanitized"] += 1
        return struct.pack(">i", len(new)) + new

    def _sanitize_frame(self, frame: bytes, is_request: bool, pending: dict) -> bytes | None:
        if is_request:
            msg = decode_request(frame)
            if msg.api_key is not None and msg.correlation_id is not None:
                pending[msg.correlation_id] = (msg.api_key, msg.api_version)
            encode = encode_request
        else:
            if len(frame) < 4:
                return None
            kv = pending.pop(struct.unpack_from(">i", frame)[0], None)
            if kv is None:
                return None
            msg = decode_response(frame, *kv)
            encode = encode_response
        if msg.body is None:
            return None
        try:
            again = encode(msg, like=frame)
        except EncodeError:
            again = None
        if again is None or not frame.startswith(again):
            if not is_request and msg.api_key == API_VERSIONS:
                # a rejection in a layout of the broker's own (librdkafka's mock): numbers
                # and feature names only, nothing that names anyone: kept as it came
                self.report.frames["api_versions_kept_as_sent"] += 1 if self.ps.counting else 0
                return frame
            return None
        padding = frame[len(again):]
        # understood in full, or up to zero padding (librdkafka pads ApiVersions v0 requests)
        if padding.strip(b"\0"):
            return None
        try:
            sanitize_message(msg, self.ps)
            return encode(msg, like=frame) + padding
        except (Unsanitizable, EncodeError):
            return None

    # ------------------------------------------------------------------ pass 2

    def rebuild_streams(self) -> set[int]:
        linktypes: set[int] = set()
        for raw in _merged(self.paths):
            p = pk.parse(raw.linktype, raw.data)
            if p is None:
                if self.options.keep_other:
                    linktypes.add(raw.linktype)
                continue
            src, dst = Endpoint(p.src, p.sport), Endpoint(p.dst, p.dport)
            conn = self.connections.get((src, dst))
            if conn is None:
                if self.options.keep_other:
                    linktypes.add(raw.linktype)
                continue
            linktypes.add(raw.linktype)
            d, _ = conn.direction(src)
            if p.flags & SYN:
                if d.syn is not None and d.syn != p.seq:
                    conn.unsafe = "port_reused"  # two connections on one 4-tuple
                d.syn = p.seq
            payload = p.payload
            if payload:
                old = d.segments.get(p.seq)
                if old is None or len(payload) > len(old):
                    d.segments[p.seq] = payload
        for conn in self._kafka_connections():
            for d in (conn.to_broker, conn.to_client):
                if conn.unsafe is None:
                    conn.unsafe = self._tile(d)
                d.segments = {}
            if conn.unsafe is not None:
                self.report.connections[f"dropped_{conn.unsafe}"] += 1
            else:
                self.report.connections["kafka"] += 1
        return linktypes

    def _tile(self, d: _Direction) -> str | None:
        if d.syn is not None:
            d.base = (d.syn + 1) & 0xFFFFFFFF
        elif d.segments:
            first = next(iter(d.segments))
            d.base = (first + min(_signed(s - first) for s in d.segments)) & 0xFFFFFFFF
        # a retransmission that differs from what the dissector framed makes its frames
        # unfindable below: the connection is then dropped, never guessed at
        stream = bytearray()
        covered: list[list[int]] = []  # [start, end) ranges the capture holds, merged
        for seq, payload in sorted(d.segments.items(), key=lambda kv: d.offset(kv[0])):
            x = d.offset(seq)
            if x < 0:
                return "data_before_syn"
            if x + len(payload) > len(stream):
                stream.extend(bytes(x + len(payload) - len(stream)))
            stream[x:x + len(payload)] = payload
            if covered and x <= covered[-1][1]:
                covered[-1][1] = max(covered[-1][1], x + len(payload))
            else:
                covered.append([x, x + len(payload)])
        pos = new_pos = 0
        data = bytes(stream)
        for frame, new in zip(d.frames, d.new, strict=True):
            blob = struct.pack(">i", len(frame)) + frame
            at = data.find(blob, pos)
            if at < 0:
                return "frames_not_found"
            if at > pos:  # bytes no frame holds: blanked
                d.tiles.append((pos, at - pos, new_pos, self._blank(data, pos, at, covered, pos > 0 or d.syn is not None)))
                self.report.bytes["zeroed_outside_frames"] += at - pos
                new_pos += at - pos
            d.tiles.append((at, len(blob), new_pos, new))
            new_pos += len(new)
            pos = at + len(blob)
        if pos < len(data):
            d.tiles.append((pos, len(data) - pos, new_pos, self._blank(data, pos, len(data), covered,
                                                                  pos > 0 or d.syn is not None)))
            self.report.bytes["zeroed_outside_frames"] += len(data) - pos
            new_pos += len(data) - pos
        d.starts = [t[0] for t in d.tiles]
        d.new_starts = [t[2] for t in d.tiles]
        d.orig_end, d.new_end = len(data), new_pos
        self.report.bytes["kafka_in"] += len(data)
        self.report.bytes["kafka_out"] += new_pos
        return None

    def _blank(self, data: bytes, start: int, end: int, covered: list[list[int]], at_boundary: bool) -> bytes:
        """Bytes no frame holds (a frame a gap cut, a cut-off last frame), blanked: when the
        region starts where a frame starts (after a frame, or at a SYN), the size prefixes
        that chain from there are kept (the dissector skips a cut frame by its size, and
        must land where it did); everything else is zeroed."""
        out = bytearray(end - start)
        pos = start
        while at_boundary and pos + 4 <= end and any(a <= pos and pos + 4 <= b for a, b in covered):
            size = struct.unpack_from(">i", data, pos)[0]
            if size < 0 or size > self.config.max_frame_size:
                break
            out[pos - start:pos - start + 4] = data[pos:pos + 4]
            pos += 4 + size
        return bytes(out)

    # ------------------------------------------------------------------ pass 3

    def _mac(self, mac: bytes) -> bytes:
        if not mac.strip(b"\0"):
            return mac  # loopback's zero addresses say nothing
        mapped = self.macs.get(mac)
        if mapped is None:
            n = len(self.macs) + 1
            mapped = self.macs[mac] = (b"\x02" + n.to_bytes(len(mac) - 1, "big"))[:len(mac)]
        return mapped

    def write(self, linktypes: set[int]) -> None:
        # an original IPv4 address must not appear even by chance: a TCP checksum ending in
        # 0x7f, then urgent pointer 0 and a NOP, reads 7f 00 00 01 (see move_leading_nops)
        self.original_v4 = {ipaddress.ip_address(ep.ip).packed for conn in self._kafka_connections()
                            for ep in (conn.client, conn.broker) if ":" not in ep.ip}
        with open(self.output, "wb") as f:
            writer = open_writer(f, self.output, linktypes)
            count = self.report.packets
            for raw in _merged(self.paths):
                count["read"] += 1
                p = pk.parse(raw.linktype, raw.data)
                key = None if p is None else (Endpoint(p.src, p.sport), Endpoint(p.dst, p.dport))
                conn = None if key is None else self.connections.get(key)
                if key in self.tls:
                    count["dropped_tls"] += 1
                    continue
                if conn is None or conn.unsafe is not None:
                    if conn is not None:
                        count["dropped_unsafe_connection"] += 1
                    elif self.options.keep_other:
                        count["kept_other"] += 1
                        writer.write(raw.ts, raw.linktype, raw.data)
                    else:
                        count["dropped_other"] += 1
                    continue
                count["kafka"] += 1
                for data in self._rewrite(p, raw.linktype, conn):
                    count["written"] += 1
                    writer.write(raw.ts, raw.linktype, data)
            count["written"] += count["kept_other"]

    def _rewrite(self, p: pk.Packet, linktype: int, conn: _Connection) -> list[bytes]:
        d, r = conn.direction(Endpoint(p.src, p.sport))
        x = d.offset(p.seq)
        n = len(p.payload)
        start = d.map(x)
        payload = d.new_bytes(start, d.map(x + n)) if n else b""
        ack = (r.base + r.map(r.offset(p.ack))) if p.flags & ACK else p.ack
        src, dst = self.ps.ip(p.src), self.ps.ip(p.dst)

        def sack(edge: int) -> int:
            return r.base + r.map(r.offset(edge))

        out = []
        chunks = [payload[i:i + MAX_PAYLOAD] for i in range(0, len(payload), MAX_PAYLOAD)] or [b""]
        for i, chunk in enumerate(chunks):
            data = pk.build(p, linktype, src=src, dst=dst, seq=d.base + start + i * MAX_PAYLOAD, ack=ack,
                            payload=chunk, map_sack=sack, map_link=self._mac, clear_fin=i < len(chunks) - 1)
            if any(a in data for a in self.original_v4):
                data = pk.move_leading_nops(data, p)
                self.report.packets["address_look_alike_moved"] += 1
            out.append(data)
        return out

    def run(self) -> Report:
        self.read_frames()
        self.sanitize_frames()
        linktypes = self.rebuild_streams()
        self.write(linktypes)
        return self.report

    def mapping(self) -> dict[str, dict[str, str]]:
        return {kind: dict(m) for kind, m in self.ps.mapping.items()}


# --------------------------------------------------------------------------- the command


def parse_values(text: str) -> str:
    """--values: hash, keep or truncate:N (N >= 0)."""
    if text in ("hash", "keep"):
        return text
    if text.startswith("truncate:") and text[9:].isdigit():
        return f"truncate:{int(text[9:])}"
    raise ValueError(f"--values {text!r}: hash, keep or truncate:N (N a number of bytes)")


def render_report(report: Report) -> str:
    """The report as text, one count a line, grouped; readable at 80 columns."""
    lines = [f"sanitized {', '.join(report.inputs)} -> {report.output}"]
    for title, counts in (("packets", report.packets), ("connections", report.connections),
                          ("frames", report.frames), ("bytes", report.bytes),
                          ("replaced (values and names)", report.replaced)):
        lines.append(f"{title}:")
        if not counts:
            lines.append("  (none)")
        for kind, n in sorted(counts.items()):
            lines.append(f"  {kind:<40} {n:>12,}")
    return "\n".join(lines) + "\n"


def run_command(args, config: DissectConfig) -> int:
    """`kwinspect sanitize`: write the sanitized capture, the report, and the mapping if asked."""
    import json
    import os
    import sys

    out = args.output
    if any(os.path.abspath(p) == os.path.abspath(out) for p in args.pcap):
        raise ValueError(f"-o {out}: that is one of the inputs")
    options = SanitizeOptions(values=parse_values(args.values),
                              secret=args.secret.encode() if args.secret else None,
                              keep_topics=args.keep_topics, keep_other=args.keep_other,
                              undecodable=args.undecodable)
    sanitizer = Sanitizer(list(args.pcap), out, options, config)
    report = sanitizer.run()
    if args.report and args.report != "-":
        with open(args.report, "w", encoding="utf-8") as f:
            json.dump(report.as_dict(), f, indent=2)
            f.write("\n")
    elif args.report == "-":
        json.dump(report.as_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    if not args.report or args.report != "-":
        sys.stdout.write(render_report(report))
    if args.mapping:
        with open(args.mapping, "w", encoding="utf-8") as f:
            json.dump(sanitizer.mapping(), f, indent=2, ensure_ascii=False)
            f.write("\n")
    return 0
