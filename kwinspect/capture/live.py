"""Live capture on a network interface: packets in as ``RawPacket``, events out.

    cap = LiveCapture("lo", capture_filter(frozenset({9092}))).open()
    for raw in cap.read(timeout=0.2):      # RawPacket(ts, linktype, data, wire_len, index)
        dissector.feed_packet(raw)
    cap.kernel_stats()                     # (received by the filter, dropped by the kernel)

Linux only (AF_PACKET).  scapy is imported here and only here, lazily: its
``L2ListenSocket`` opens the socket (interface lookup, promiscuous mode,
timestamps, auxiliary data) and its libpcap binding compiles the BPF filter.
Packets are then read as raw bytes with ``recvmsg_into`` on that socket rather
than through scapy's packet objects, which cost ~50 us each (we parse with our
own fast parser, capture/packets.py).

Details that matter for correctness:

* The compiled filter is re-attached with two changes: its accept instructions
  keep ``snaplen`` bytes (scapy compiles with a 65535-byte snap length, which
  would cut the 65550-byte frames of the 64 KiB loopback MTU), and on a
  loopback interface a prefix drops the ``PACKET_OUTGOING`` copy of every
  packet in the kernel (AF_PACKET sees each loopback packet twice; libpcap
  drops the outgoing copy too).
* Timestamps come from the kernel (``SO_TIMESTAMPNS``) and are kept to the
  microsecond: ``ts = sec + usec / 1e6``, exactly what the pcap reader computes
  for the microsecond pcap files ``PcapRotator`` writes, so a session decoded
  live and the same session decoded from its ``-w`` file see identical floats.
* VLAN tags the kernel stripped are put back from ``PACKET_AUXDATA``, and the
  wire length comes from it too (``tp_len``).
* Kernel drop counts: ``PACKET_STATISTICS`` (read-and-reset, accumulated here).

Driving the Dissector from a live capture (``live_events``, ``LiveEventSource``)
is kwinspect.run.live's job: this module only captures.
"""

from __future__ import annotations

import ctypes
import datetime as _dt
import logging
import os
import select
import socket
import struct
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import IO, Any

from kwinspect.capture.readers import RawPacket

__all__ = [
    "LiveCaptureError",
    "LiveFilterError",
    "LiveCapture",
    "PcapRotator",
    "capture_filter",
]

DEFAULT_SNAPLEN = 262_144  # as tcpdump
DEFAULT_BUFFER = 64 << 20  # kernel receive buffer (SO_RCVBUFFORCE as root)

# Linux constants (not all exposed by the socket module)
SOL_PACKET = 263
PACKET_AUXDATA = 8
PACKET_STATISTICS = 6
PACKET_OUTGOING = 4
SO_TIMESTAMPNS = 35
SO_ATTACH_FILTER = 26
SO_RCVBUFFORCE = 33
TP_STATUS_VLAN_VALID = 0x10
TP_STATUS_VLAN_TPID_VALID = 0x40
ARPHRD_LOOPBACK = 772

# ARPHRD_* of the interface -> LINKTYPE_* of the frames AF_PACKET/SOCK_RAW hands us.
ARPHRD_TO_LINKTYPE = {
    1: 1,  # Ethernet
    ARPHRD_LOOPBACK: 1,  # Linux loopback carries a zeroed Ethernet header
    65534: 101,  # ARPHRD_NONE (tun): raw IP
    768: 101,  # IPIP tunnel
    776: 101,  # SIT (IPv6 in IPv4)
}

_TIMESPEC = struct.Struct("qq")
_SLL = struct.Struct(">HHH8sH")  # Linux cooked header: packet type, ARPHRD, addr len, addr, protocol
_AUXDATA = struct.Struct("IIIHHHH")
_ANC_SIZE = socket.CMSG_SPACE(_TIMESPEC.size) + socket.CMSG_SPACE(_AUXDATA.size) + 64


class LiveCaptureError(Exception):
    """Capture cannot start (no such interface, not permitted, no scapy): one line, exit 1."""


class LiveFilterError(LiveCaptureError):
    """The capture filter (BPF) does not compile: a usage error."""


def capture_filter(kafka_ports: Iterable[int] | None) -> str:
    """The BPF filter for the broker ports, or all TCP when Kafka is to be detected anywhere."""
    ports = sorted(set(kafka_ports or ()))
    if not ports:
        return "tcp"
    parts: list[str] = []
    i = 0
    while i < len(ports):
        j = i
        while j + 1 < len(ports) and ports[j + 1] == ports[j] + 1:
            j += 1
        if j - i >= 2:
            parts.append(f"portrange {ports[i]}-{ports[j]}")
            i = j + 1
        else:
            parts.append(f"port {ports[i]}")
            i += 1
    return "tcp and (" + " or ".join(parts) + ")"


def interface_names() -> list[str]:
    try:
        return [name for _i, name in socket.if_nameindex()]
    except OSError:
        return []


def _hatype(name: str) -> int | None:
    """The interface's ARPHRD type from sysfs (no privileges needed), None if unknown."""
    try:
        with open(f"/sys/class/net/{name}/type", encoding="ascii") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def _scapy():
    """Import scapy's Linux layer quietly (it logs warnings about routes at import)."""
    logging.getLogger("scapy.runtime").setLevel(logging.ERROR)
    logging.getLogger("scapy.loading").setLevel(logging.ERROR)
    try:
        from scapy.arch.common import compile_filter
        from scapy.arch.linux import L2ListenSocket
        from scapy.error import Scapy_Exception
    except ImportError as exc:
        raise LiveCaptureError(f"live capture needs scapy (pip install 'kwinspect[live]'): {exc}") from None
    return L2ListenSocket, compile_filter, Scapy_Exception


def _compile(expr: str, linktype: int, snaplen: int, loopback: bool, loopback_ifindex: int | None = None) -> bytes:
    """The filter as raw sock_filter instructions, patched for snaplen and loopback.

    ``loopback``: the socket is on a loopback interface, drop every outgoing copy.
    ``loopback_ifindex`` (for -i any): drop the outgoing copies on that interface only.
    """
    insns: list[tuple[int, int, int, int]] = []
    if expr.strip():
        _L2, compile_filter, scapy_exc = _scapy()
        try:
            bp = compile_filter(expr, linktype=linktype)
        except ImportError as exc:
            raise LiveCaptureError(f"compiling the capture filter needs libpcap (Debian: apt install "
                                   f"libpcap0.8): {exc}") from None
        except (scapy_exc, OSError) as exc:
            raise LiveFilterError(f"bad capture filter {expr!r}: {str(exc).strip() or type(exc).__name__}") \
                from None
        for i in range(bp.bf_len):
            ins = bp.bf_insns[i]
            insns.append((ins.code, ins.jt, ins.jf, ins.k & 0xFFFFFFFF))
    else:
        insns.append((0x06, 0, 0, snaplen))  # ret #snaplen: accept everything
    # BPF_RET|BPF_K with a non-zero k accepts k bytes: make that our snaplen.
    insns = [(c, jt, jf, snaplen if c == 0x06 and k else k) for c, jt, jf, k in insns]
    if loopback:
        # ldb [SKF_AD_OFF + SKF_AD_PKTTYPE]; jeq #PACKET_OUTGOING, drop, keep; drop: ret #0
        insns = [(0x30, 0, 0, (-0x1000 + 4) & 0xFFFFFFFF), (0x15, 0, 1, PACKET_OUTGOING),
                 (0x06, 0, 0, 0)] + insns
    elif loopback_ifindex is not None:
        # ... and only when ld [SKF_AD_OFF + SKF_AD_IFINDEX] is the loopback interface
        insns = [(0x30, 0, 0, (-0x1000 + 4) & 0xFFFFFFFF), (0x15, 0, 3, PACKET_OUTGOING),
                 (0x20, 0, 0, (-0x1000 + 8) & 0xFFFFFFFF), (0x15, 0, 1, loopback_ifindex),
                 (0x06, 0, 0, 0)] + insns
    return b"".join(struct.pack("HBBI", *ins) for ins in insns)


def _attach(sock: socket.socket, program: bytes) -> None:
    buf = ctypes.create_string_buffer(program, len(program))
    fprog = struct.pack("HL", len(program) // 8, ctypes.addressof(buf))
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)


@dataclass
class LiveCounters:
    packets: int = 0  # delivered to the caller
    bytes: int = 0  # captured bytes delivered
    wire_bytes: int = 0
    truncated: int = 0  # cut by the snap length
    kernel_received: int = 0  # PACKET_STATISTICS tp_packets (accepted by the filter)
    kernel_dropped: int = 0  # PACKET_STATISTICS tp_drops (receive buffer full)


class LiveCapture:
    """One AF_PACKET socket on one interface, read in batches of RawPacket."""

    def __init__(self, interface: str, bpf: str = "tcp", *, snaplen: int = DEFAULT_SNAPLEN,
                 buffer_bytes: int = DEFAULT_BUFFER, promisc: bool = True) -> None:
        self.interface = interface
        self.bpf = bpf
        self.snaplen = snaplen
        self.buffer_bytes = buffer_bytes
        self.promisc = promisc
        self.linktype = 1
        self.loopback = False
        self.cooked = False  # -i any: SOCK_DGRAM, cooked (SLL) headers built here
        self._loopback_names: set[str] = set()
        self.counters = LiveCounters()
        self._ssock: Any = None
        self._sock: socket.socket | None = None
        self._buf = bytearray(snaplen)
        self._view = memoryview(self._buf)
        self._poll: select.poll | None = None

    # -- lifetime -------------------------------------------------------------------

    def open(self) -> LiveCapture:
        name = self.interface
        if name == "any":
            return self._open_any()
        try:
            socket.if_nametoindex(name)
        except OSError:
            known = ", ".join(interface_names()) or "none found"
            raise LiveCaptureError(f"{name}: no such interface (interfaces: {known})") from None
        hatype = _hatype(name)
        if hatype is not None and hatype not in ARPHRD_TO_LINKTYPE:
            raise LiveCaptureError(f"{name}: link type ARPHRD {hatype} is not supported for live capture "
                                   "(capture it with tcpdump -w and read the file)")
        linktype = ARPHRD_TO_LINKTYPE.get(hatype, 1)
        # Compiled first: a bad filter is a usage error, whoever runs it.
        program = _compile(self.bpf, linktype, self.snaplen, hatype == ARPHRD_LOOPBACK)
        l2listen, _compile_filter, scapy_exc = _scapy()
        try:
            # The filter is attached by us below, patched (scapy would compile it with a
            # 64 KiB snap length); what queues before that is drained.
            self._ssock = l2listen(iface=name, promisc=self.promisc, filter=None)
        except PermissionError:
            raise LiveCaptureError(
                f"{name}: capture not permitted: needs root or CAP_NET_RAW "
                "(run with sudo, or setcap cap_net_raw,cap_net_admin=eip on the Python binary)") from None
        except OSError as exc:
            raise LiveCaptureError(f"{name}: cannot capture: {exc.strerror or exc}") from None
        except scapy_exc as exc:
            raise LiveCaptureError(f"{name}: cannot capture: {exc}") from None
        sock = self._ssock.ins
        self._sock = sock
        try:
            hatype = sock.getsockname()[3]
            if hatype not in ARPHRD_TO_LINKTYPE:
                raise LiveCaptureError(f"{name}: link type ARPHRD {hatype} is not supported for live capture "
                                       "(capture it with tcpdump -w and read the file)")
            self.linktype = ARPHRD_TO_LINKTYPE[hatype]
            self.loopback = hatype == ARPHRD_LOOPBACK
            if self.linktype != linktype or self.loopback != (_hatype(name) == ARPHRD_LOOPBACK):
                program = _compile(self.bpf, self.linktype, self.snaplen, self.loopback)
            _attach(sock, program)
            self._drain_queued()  # packets queued before our filter was attached
            self._setup(sock)
        except BaseException:
            self.close()
            raise
        return self

    def _open_any(self) -> LiveCapture:
        """-i any: one SOCK_DGRAM socket on every interface, cooked (SLL) headers, as libpcap does.

        The kernel hands us the network-layer packet; the 16-byte Linux cooked
        header is rebuilt from the socket address (packet type, ARPHRD type,
        link address, protocol), so the frames and the -w file are LINKTYPE_LINUX_SLL.
        The filter is compiled for raw IP (it sees the network header), and the
        outgoing copies on the loopback interface are dropped.  No promiscuous mode.
        """
        lo = [n for n in interface_names() if _hatype(n) == ARPHRD_LOOPBACK]
        lo_index = socket.if_nametoindex(lo[0]) if lo else None
        program = _compile(self.bpf, 101, self.snaplen, False, lo_index)
        try:
            sock = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(0x0003))
        except PermissionError:
            raise LiveCaptureError(
                "any: capture not permitted: needs root or CAP_NET_RAW "
                "(run with sudo, or setcap cap_net_raw,cap_net_admin=eip on the Python binary)") from None
        except OSError as exc:
            raise LiveCaptureError(f"any: cannot capture: {exc.strerror or exc}") from None
        self._sock = sock
        self._loopback_names = set(lo)
        self.cooked = True
        self.linktype = 113
        try:
            _attach(sock, program)
            self._drain_queued()
            self._setup(sock)
        except BaseException:
            self.close()
            raise
        return self

    def _setup(self, sock: socket.socket) -> None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, self.buffer_bytes)
        except OSError:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.buffer_bytes)
        sock.setsockopt(SOL_PACKET, PACKET_AUXDATA, 1)
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        sock.setblocking(False)
        self.kernel_stats()  # reset the kernel counters
        self.counters.kernel_received = self.counters.kernel_dropped = 0
        self._poll = select.poll()
        self._poll.register(sock.fileno(), select.POLLIN)

    def _drain_queued(self) -> None:
        sock = self._sock
        sock.setblocking(False)
        while True:
            try:
                sock.recv(1)
            except (BlockingIOError, InterruptedError):
                return

    def close(self) -> None:
        if self._ssock is None and self._sock is not None:  # -i any: our own socket
            try:
                self.kernel_stats()
            except OSError:
                pass
            self._sock.close()
            self._sock = None
        if self._ssock is not None:
            try:
                self.kernel_stats()
            except OSError:
                pass
            try:
                self._ssock.close()
            except Exception:  # noqa: BLE001 - closing; nothing to do about it
                pass
            self._ssock = None
            self._sock = None

    def __enter__(self) -> LiveCapture:
        return self.open() if self._sock is None else self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def fileno(self) -> int:
        assert self._sock is not None
        return self._sock.fileno()

    # -- reading ----------------------------------------------------------------------

    def read(self, timeout: float = 0.2, max_packets: int = 4096) -> list[RawPacket]:
        """Up to ``max_packets`` packets; waits up to ``timeout`` s for the first one."""
        sock = self._sock
        if sock is None:
            return []
        if timeout > 0:
            try:
                if not self._poll.poll(int(timeout * 1000)):
                    return []
            except InterruptedError:
                return []
        out: list[RawPacket] = []
        recv = sock.recvmsg_into
        view = self._view
        buf = self._buf
        linktype = self.linktype
        c = self.counters
        index = c.packets
        cooked = self.cooked
        tsunpack = _TIMESPEC.unpack_from
        auxunpack = _AUXDATA.unpack_from
        while len(out) < max_packets:
            try:
                n, anc, flags, addr = recv([view], _ANC_SIZE)
            except (BlockingIOError, InterruptedError):
                break
            if addr[2] == PACKET_OUTGOING and (self.loopback or addr[0] in self._loopback_names):
                continue  # in case the kernel prefix did not apply
            if cooked:
                hw = addr[4][:8]
                data = _SLL.pack(addr[2], addr[3], len(hw), hw, addr[1]) + buf[:n]
            else:
                data = bytes(buf[:n])
            sec = usec = None
            wire_len = len(data)
            for lvl, typ, cdata in anc:
                if lvl == socket.SOL_SOCKET and typ == SO_TIMESTAMPNS:
                    sec, nsec = tsunpack(cdata)
                    usec = nsec // 1000
                elif lvl == SOL_PACKET and typ == PACKET_AUXDATA and len(cdata) >= _AUXDATA.size:
                    status, tp_len, _snap, _mac, _net, tci, tpid = auxunpack(cdata)
                    wire_len = tp_len + 16 if cooked else tp_len
                    if linktype == 1 and (tci or status & TP_STATUS_VLAN_VALID) and n >= 12:
                        if not status & TP_STATUS_VLAN_TPID_VALID:
                            tpid = 0x8100
                        data = data[:12] + struct.pack(">HH", tpid, tci) + data[12:]
                        wire_len += 4
            if sec is None:
                now = time.time_ns()
                sec, usec = divmod(now // 1000, 1_000_000)
            index += 1
            if wire_len > len(data):
                c.truncated += 1
            c.bytes += len(data)
            c.wire_bytes += wire_len
            out.append(RawPacket(sec + usec / 1_000_000, linktype, data, wire_len, index))
        c.packets = index
        return out

    def kernel_stats(self) -> tuple[int, int]:
        """(packets accepted by the filter, packets dropped by the kernel) since open()."""
        if self._sock is not None:
            raw = self._sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8)
            received, dropped = struct.unpack("II", raw)
            self.counters.kernel_received += received
            self.counters.kernel_dropped += dropped
        return self.counters.kernel_received, self.counters.kernel_dropped


# ---------------------------------------------------------------------------
# Writing what was captured: pcap files with tcpdump-like rotation
# ---------------------------------------------------------------------------

_PCAP_HEADER = struct.Struct("<IHHiIII")
_PCAP_RECORD = struct.Struct("<IIII")


class PcapRotator:
    """Classic microsecond pcap (tcpdump's default format), rotated by size and/or time.

    Without rotation the packets go to ``path``.  With ``max_bytes`` (-C) or
    ``every`` (-G), files are ``STEM-00000.EXT``, ``STEM-00001.EXT``, ... so
    that ``kwinspect exchanges 'STEM-*.EXT'`` reads a session back in order;
    when ``path`` holds strftime patterns (``%H%M%S``) and ``every`` is set,
    the name is formatted with the start time of each file (as tcpdump -G
    does) and a counter is added only when -C splits one period.  ``max_files``
    (-W) keeps only the newest files.  A new file starts *before* a packet
    that would take the current one past ``max_bytes`` (tcpdump checks after),
    so no file exceeds the limit unless a single packet does.
    """

    def __init__(self, path: str, linktype: int, snaplen: int = DEFAULT_SNAPLEN, *,
                 max_bytes: int | None = None, every: float | None = None,
                 max_files: int | None = None, flush_interval: float = 1.0) -> None:
        self.path = path
        self.linktype = linktype
        self.snaplen = snaplen
        self.max_bytes = max_bytes
        self.every = every
        self.max_files = max_files
        self.flush_interval = flush_interval
        self.rotating = bool(max_bytes or every)
        self.files: list[str] = []  # every file opened, in order (also those -W removed)
        self.removed: list[str] = []
        self.packets = 0
        self._fh: IO[bytes] | None = None
        self._size = 0
        self._seq = 0
        self._period_start: float | None = None
        self._period_seq = 0
        self._last_flush = time.monotonic()

    def _name(self, ts: float) -> str:
        if not self.rotating:
            return self.path
        if self.every and "%" in self.path:
            name = _dt.datetime.fromtimestamp(ts).strftime(self.path)
            if self._period_seq:
                stem, ext = os.path.splitext(name)
                name = f"{stem}-{self._period_seq:05d}{ext}"
            return name
        stem, ext = os.path.splitext(self.path)
        return f"{stem}-{self._seq:05d}{ext or '.pcap'}"

    def _open(self, ts: float) -> None:
        self._close_file()
        name = self._name(ts)
        fh = open(name, "wb")  # noqa: SIM115 - closed in _close_file
        fh.write(_PCAP_HEADER.pack(0xA1B2C3D4, 2, 4, 0, 0, self.snaplen, self.linktype))
        self._fh = fh
        self._size = _PCAP_HEADER.size
        self.files.append(name)
        self._seq += 1
        if self.max_files and len(self.files) - len(self.removed) > self.max_files:
            old = self.files[len(self.removed)]
            try:
                os.unlink(old)
            except OSError:
                pass
            self.removed.append(old)

    def write(self, raw: RawPacket) -> None:
        ts = raw.ts
        data = raw.data
        size = _PCAP_RECORD.size + len(data)
        if self._fh is None:
            self._period_start = ts
            self._open(ts)
        elif self.every and ts - self._period_start >= self.every:
            self._period_start += self.every * ((ts - self._period_start) // self.every)
            self._period_seq = 0
            self._open(ts)
        elif self.max_bytes and self._size + size > self.max_bytes and self._size > _PCAP_HEADER.size:
            self._period_seq += 1
            self._open(ts)
        sec = int(ts)
        usec = round((ts - sec) * 1_000_000)  # exact: see the module docstring
        if usec >= 1_000_000:
            sec, usec = sec + 1, usec - 1_000_000
        self._fh.write(_PCAP_RECORD.pack(sec, usec, len(data), raw.wire_len))
        self._fh.write(data)
        self._size += size
        self.packets += 1

    def tick(self) -> None:
        """Flush now and then, so the current file can be read while capturing."""
        now = time.monotonic()
        if self._fh is not None and now - self._last_flush >= self.flush_interval:
            self._fh.flush()
            self._last_flush = now

    def _close_file(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def close(self) -> None:
        if self._fh is None and not self.files:
            # No packet at all: still leave a valid, empty capture behind.
            self._period_start = time.time()
            self._open(self._period_start)
        self._close_file()

    @property
    def kept(self) -> list[str]:
        return self.files[len(self.removed):]
