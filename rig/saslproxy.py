"""A SASL/PLAIN-terminating Kafka proxy on loopback, for real successful SASL sessions.

Neither the librdkafka mock cluster nor tansu 0.6 completes SASL/PLAIN, so a
scenario puts this proxy in front of tansu (started with its advertised
listener set to the proxy's port, so every connection a client opens after
Metadata goes through the proxy too).  Per client connection the proxy opens
one connection to the broker and:

- until authentication completes, reads client frames one at a time and either
  answers them itself (SaslHandshake v0/v1, SaslAuthenticate v0-v2, and the raw
  PLAIN token that follows a SaslHandshake v0) or forwards them and relays the
  single response (ApiVersions), so responses stay in request order;
- after that, forwards size-delimited frames both ways unchanged.

A wrong username or password gets SASL_AUTHENTICATION_FAILED (58) in the
SaslAuthenticate response, then the connection is closed, as Kafka does; after
a SaslHandshake v0 there is no error field, so the proxy just closes.

`legacy_handshake` lists client software names / client ids for which the
proxy lowers SaslHandshake's max_version to 0 in the relayed ApiVersions
response, so such clients (kafka-python negotiates the version) take the raw
token path of SaslHandshake v0.

Responses are encoded with struct following the upstream message definitions
(SaslHandshake v0-v1 never flexible; SaslAuthenticate v2 flexible, so its
response uses response header v1).
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Iterable

from rig.proxy import LoopbackProxy, close_sockets

SASL_HANDSHAKE = 17
SASL_AUTHENTICATE = 36
API_VERSIONS = 18
UNSUPPORTED_SASL_MECHANISM = 33
ILLEGAL_SASL_STATE = 34
SASL_AUTHENTICATION_FAILED = 58
MAX_FRAME = 64 * 1024 * 1024


class _Closed(Exception):
    pass


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise _Closed
        buf += chunk
    return bytes(buf)


def read_frame(sock: socket.socket) -> bytes:
    (size,) = struct.unpack(">i", _recv_exact(sock, 4))
    if size < 0 or size > MAX_FRAME:
        raise _Closed
    return _recv_exact(sock, size)


def _frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def _uvarint(data: bytes, pos: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7


def _put_uvarint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _skip_tags(data: bytes, pos: int) -> int:
    count, pos = _uvarint(data, pos)
    for _ in range(count):
        _tag, pos = _uvarint(data, pos)
        size, pos = _uvarint(data, pos)
        pos += size
    return pos


def parse_request_header(frame: bytes) -> tuple[int, int, int, str | None, int]:
    """(api_key, api_version, correlation_id, client_id, body offset) for the APIs the proxy reads."""
    api_key, version, cid, clen = struct.unpack_from(">hhih", frame, 0)
    pos = 10
    client_id = None
    if clen >= 0:
        client_id = frame[pos:pos + clen].decode("utf-8", "replace")
        pos += clen
    flexible = (api_key == SASL_AUTHENTICATE and version >= 2) or (api_key == API_VERSIONS and version >= 3)
    if flexible:
        pos = _skip_tags(frame, pos)
    return api_key, version, cid, client_id, pos


def check_plain(token: bytes, username: str, password: str) -> bool:
    parts = token.split(b"\x00")
    return (len(parts) == 3 and parts[1] == username.encode("utf-8")
            and parts[2] == password.encode("utf-8"))


def handshake_response(cid: int, error: int, mechanisms: Iterable[str]) -> bytes:
    """SaslHandshake response v0/v1 (never flexible): header v0."""
    mechs = list(mechanisms)
    body = struct.pack(">ihi", cid, error, len(mechs))
    for m in mechs:
        raw = m.encode()
        body += struct.pack(">h", len(raw)) + raw
    return _frame(body)


def authenticate_response(cid: int, version: int, error: int, message: str | None,
                          auth_bytes: bytes = b"", session_lifetime_ms: int = 0) -> bytes:
    """SaslAuthenticate response v0-v2 (v2 flexible: response header v1, compact fields)."""
    msg = message.encode() if message is not None else None
    if version >= 2:
        out = struct.pack(">i", cid) + b"\x00"  # response header v1: empty tagged fields
        out += struct.pack(">h", error)
        out += _put_uvarint(0) if msg is None else _put_uvarint(len(msg) + 1) + msg
        out += _put_uvarint(len(auth_bytes) + 1) + auth_bytes
        out += struct.pack(">q", session_lifetime_ms) + b"\x00"
        return _frame(out)
    out = struct.pack(">ih", cid, error)
    out += struct.pack(">h", -1) if msg is None else struct.pack(">h", len(msg)) + msg
    out += struct.pack(">i", len(auth_bytes)) + auth_bytes
    if version >= 1:
        out += struct.pack(">q", session_lifetime_ms)
    return _frame(out)


def lower_handshake_version(frame: bytes, version: int) -> bytes:
    """An ApiVersions response (header v0) with SaslHandshake's max_version set to 0."""
    data = bytearray(frame)
    pos = 4  # correlation id
    (error,) = struct.unpack_from(">h", data, pos)
    pos += 2
    if error != 0:
        return frame
    if version >= 3:
        n, pos = _uvarint(data, pos)
        n -= 1
    else:
        (n,) = struct.unpack_from(">i", data, pos)
        pos += 4
    for _ in range(max(n, 0)):
        key, _lo, _hi = struct.unpack_from(">hhh", data, pos)
        if key == SASL_HANDSHAKE:
            struct.pack_into(">h", data, pos + 4, 0)
        pos += 6
        if version >= 3:
            pos = _skip_tags(data, pos)
    return bytes(data)


class SaslPlainProxy(LoopbackProxy):
    """Listens on 127.0.0.1:port, terminates SASL/PLAIN and forwards the rest to upstream."""

    def __init__(self, upstream: tuple[str, int] | None, username: str, password: str, *,
                 legacy_handshake: Iterable[str] = ()) -> None:
        super().__init__(backlog=32)
        self.upstream = upstream  # may be set after construction (the broker needs our port)
        self.username = username
        self.password = password
        self.legacy_handshake = set(legacy_handshake)
        # what happened, for the manifest: [{client_id, mechanism, handshake_version, outcome}]
        self.log: list[dict] = []

    def _serve(self, client: socket.socket) -> None:
        try:
            assert self.upstream is not None
            up = socket.create_connection(self.upstream, timeout=10)
            up.settimeout(None)
        except OSError:
            with contextlib.suppress(OSError):
                client.close()
            return
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        up.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._track(client, up)
        try:
            ok = self._authenticate(client, up)
        except (_Closed, OSError, struct.error, IndexError):
            ok = False
        if not ok:
            close_sockets(client, up)
            return
        t = threading.Thread(target=self._pump, args=(up, client), daemon=True)
        t.start()
        self._pump(client, up)
        t.join(timeout=5)
        close_sockets(client, up)

    def _authenticate(self, client: socket.socket, up: socket.socket) -> bool:
        """The pre-authentication state machine; True once the client is authenticated."""
        mechanism: str | None = None
        legacy = False
        entry: dict = {"client_id": None, "mechanism": None, "handshake_version": None,
                       "outcome": "closed before authenticating"}
        with self._lock:
            self.log.append(entry)
        while True:
            frame = read_frame(client)
            api_key, version, cid, client_id, pos = parse_request_header(frame)
            entry["client_id"] = client_id
            if api_key == API_VERSIONS:
                if client_id in self.legacy_handshake:
                    legacy = True
                elif version >= 3:
                    with contextlib.suppress(struct.error, IndexError, UnicodeDecodeError):
                        n, p = _uvarint(frame, pos)
                        if frame[p:p + n - 1].decode() in self.legacy_handshake:
                            legacy = True
                up.sendall(_frame(frame))
                resp = read_frame(up)
                if legacy:
                    resp = lower_handshake_version(resp, version)
                client.sendall(_frame(resp))
            elif api_key == SASL_HANDSHAKE:
                (mlen,) = struct.unpack_from(">h", frame, pos)
                mechanism = frame[pos + 2:pos + 2 + mlen].decode("utf-8", "replace")
                entry["mechanism"], entry["handshake_version"] = mechanism, version
                if mechanism != "PLAIN":
                    client.sendall(handshake_response(cid, UNSUPPORTED_SASL_MECHANISM, ["PLAIN"]))
                    entry["outcome"] = "unsupported mechanism"
                    continue
                client.sendall(handshake_response(cid, 0, ["PLAIN"]))
                if version == 0:
                    # raw PLAIN token, no Kafka header; success = an empty size-prefixed reply
                    token = read_frame(client)
                    if not check_plain(token, self.username, self.password):
                        entry["outcome"] = "raw token rejected (connection closed)"
                        return False
                    client.sendall(_frame(b""))
                    entry["outcome"] = "authenticated (raw token)"
                    return True
            elif api_key == SASL_AUTHENTICATE:
                if version >= 2:
                    n, p = _uvarint(frame, pos)
                    token = frame[p:p + n - 1]
                else:
                    (n,) = struct.unpack_from(">i", frame, pos)
                    token = frame[pos + 4:pos + 4 + n]
                entry["authenticate_version"] = version
                if mechanism != "PLAIN":
                    client.sendall(authenticate_response(cid, version, ILLEGAL_SASL_STATE,
                                                         "SaslAuthenticate before SaslHandshake"))
                    entry["outcome"] = "illegal state"
                    return False
                if not check_plain(token, self.username, self.password):
                    client.sendall(authenticate_response(
                        cid, version, SASL_AUTHENTICATION_FAILED,
                        "Authentication failed: Invalid username or password"))
                    entry["outcome"] = "rejected: SASL_AUTHENTICATION_FAILED"
                    # let the client read the error before the FIN, as Kafka does
                    with contextlib.suppress(OSError):
                        client.shutdown(socket.SHUT_WR)
                        client.settimeout(2)
                        while client.recv(65536):
                            pass
                    return False
                client.sendall(authenticate_response(cid, version, 0, None))
                entry["outcome"] = "authenticated"
                return True
            else:
                # anything else before authentication: forward and relay the one response
                up.sendall(_frame(frame))
                client.sendall(_frame(read_frame(up)))

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        """Copy src to dst; on src's FIN pass a half-close on, so responses in flight still arrive."""
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            close_sockets(src, dst)
            return
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)
