"""Real TLS sessions from OpenSSL (Python's ssl over memory BIOs) with their key logs:
the oracle for the record layer and key schedules (tests only)."""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass, field

from rig.tlsproxy import make_self_signed

SSL_OP_NO_ENCRYPT_THEN_MAC = 0x00080000


@dataclass
class Session:
    wire: list[tuple[bool, bytes]] = field(default_factory=list)  # (from client?, bytes) as sent
    client_sent: bytes = b""
    server_sent: bytes = b""
    keylog: str = ""
    cipher: str = ""
    version: str = ""
    session: object = None
    contexts: tuple = ()


def certs(directory: str) -> tuple[str, str]:
    cert, key = os.path.join(directory, "proxy-cert.pem"), os.path.join(directory, "proxy-key.pem")
    if not os.path.exists(cert):
        make_self_signed(directory)
    return cert, key


def run_session(directory: str, *, version: ssl.TLSVersion, ciphers: str | None = None, etm: bool = True,
                messages: int = 3, size: int = 3000, mtls: bool = False, session: object = None,
                contexts: tuple = (), exchanges: list[tuple[bytes, bytes]] | None = None) -> Session:
    cert, key = certs(directory)
    keylog = os.path.join(directory, f"keys-{os.getpid()}-{id(object())}.log")
    if contexts:  # resumption: the same contexts (OpenSSL's session cache lives in them)
        sctx, cctx = contexts
        return _talk(sctx, cctx, keylog, session, messages, size, exchanges)
    sctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    sctx.load_cert_chain(cert, key)
    sctx.minimum_version = sctx.maximum_version = version
    cctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    cctx.check_hostname = False
    cctx.verify_mode = ssl.CERT_NONE
    cctx.minimum_version = cctx.maximum_version = version
    cctx.keylog_filename = keylog
    if ciphers:
        sctx.set_ciphers(ciphers)
        cctx.set_ciphers(ciphers)
    if not etm:
        sctx.options |= SSL_OP_NO_ENCRYPT_THEN_MAC
        cctx.options |= SSL_OP_NO_ENCRYPT_THEN_MAC
    if mtls:
        sctx.verify_mode = ssl.CERT_REQUIRED
        sctx.load_verify_locations(cert)
        cctx.load_cert_chain(cert, key)
    return _talk(sctx, cctx, keylog, session, messages, size, exchanges)


def _talk(sctx, cctx, keylog: str, session: object, messages: int, size: int,
          exchanges: list[tuple[bytes, bytes]] | None) -> Session:
    open(keylog, "w").close()
    cctx.keylog_filename = keylog
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    client = cctx.wrap_bio(c_in, c_out, server_hostname="localhost", session=session)
    server = sctx.wrap_bio(s_in, s_out, server_side=True)
    out = Session()

    def pump() -> None:
        moved = True
        while moved:
            moved = False
            d = c_out.read()
            if d:
                out.wire.append((True, d))
                s_in.write(d)
                moved = True
            d = s_out.read()
            if d:
                out.wire.append((False, d))
                c_in.write(d)
                moved = True

    def step(fn) -> object:
        for _ in range(50):
            try:
                return fn()
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                pump()
        raise AssertionError("TLS did not progress")

    done = [False, False]
    for _ in range(50):
        for i, obj in enumerate((client, server)):
            if not done[i]:
                try:
                    obj.do_handshake()
                    done[i] = True
                except ssl.SSLWantReadError:
                    pass
        pump()
        if all(done):
            break
    if exchanges is None:
        exchanges = [(msg, msg[::-1] + b"!") for msg in
                     (bytes((i + j) % 251 for j in range(size)) for i in range(messages))]
    for msg, reply in exchanges:
        client.write(msg)
        out.client_sent += msg
        pump()
        got = b""
        while len(got) < len(msg):
            got += step(lambda: server.read(65536))
        server.write(reply)
        out.server_sent += reply
        pump()
        got = b""
        while len(got) < len(reply):
            got += step(lambda: client.read(65536))
    pump()
    out.cipher = client.cipher()[0]
    out.version = client.version()
    out.session = client.session
    out.contexts = (sctx, cctx)
    with open(keylog) as f:
        out.keylog = f.read()
    os.unlink(keylog)
    return out
