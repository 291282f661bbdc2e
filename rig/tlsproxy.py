"""A TLS-terminating TCP proxy on loopback, for a real TLS Kafka connection.

Neither the librdkafka mock nor tansu 0.6 (its --cert/--key options exclude
each other) serves TLS, so a scenario puts this proxy in front of tansu: the
client speaks real TLS (librdkafka's OpenSSL handshake) to the proxy, which
forwards the plaintext to the broker.  A capture of both ports holds a TLS
stream and the same Kafka traffic in clear.

The certificate is a throw-away self-signed one made with the `openssl` CLI.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import ssl
import subprocess
import threading

from rig.proxy import LoopbackProxy, close_sockets


def openssl_path() -> str | None:
    return shutil.which("openssl")


def make_self_signed(directory: str, cn: str = "localhost") -> tuple[str, str]:
    """(cert.pem, key.pem) for 127.0.0.1/localhost, valid two days."""
    exe = openssl_path()
    if exe is None:
        raise FileNotFoundError("openssl")
    cert = os.path.join(directory, "proxy-cert.pem")
    key = os.path.join(directory, "proxy-key.pem")
    subprocess.run(
        [exe, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
         "-days", "2", "-subj", f"/CN={cn}",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        check=True, capture_output=True, timeout=60,
    )
    return cert, key


class TlsProxy(LoopbackProxy):
    """Listens with TLS on 127.0.0.1:port and forwards each connection to upstream."""

    def __init__(self, upstream: tuple[str, int], cert: str, key: str) -> None:
        super().__init__(backlog=16)
        self.upstream = upstream
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.load_cert_chain(cert, key)

    def _serve(self, raw: socket.socket) -> None:
        try:
            raw.settimeout(10)
            tls = self.ctx.wrap_socket(raw, server_side=True)
            tls.settimeout(None)
            up = socket.create_connection(self.upstream, timeout=10)
            up.settimeout(None)
        except (OSError, ssl.SSLError):
            with contextlib.suppress(OSError):
                raw.close()
            return
        self._track(tls, up)
        t = threading.Thread(target=self._pump, args=(up, tls), daemon=True)
        t.start()
        self._pump(tls, up)
        t.join(timeout=5)

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except (OSError, ssl.SSLError):
            pass
        close_sockets(dst, src)
