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


class TlsProxy:
    """Listens with TLS on 127.0.0.1:port and forwards each connection to upstream."""

    def __init__(self, upstream: tuple[str, int], cert: str, key: str) -> None:
        self.upstream = upstream
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.load_cert_chain(cert, key)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()

    def start(self) -> TlsProxy:
        t = threading.Thread(target=self._accept_loop, daemon=True)
        t.start()
        self._threads.append(t)
        return self

    def _accept_loop(self) -> None:
        self.sock.settimeout(0.1)
        while not self._stop.is_set():
            try:
                raw, _addr = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            t = threading.Thread(target=self._serve, args=(raw,), daemon=True)
            t.start()
            self._threads.append(t)

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
        with self._lock:
            self._conns += [tls, up]
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
        for s in (dst, src):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self.sock.close()
        with self._lock:
            for s in self._conns:
                with contextlib.suppress(OSError):
                    s.close()
        for t in self._threads:
            t.join(timeout=2)

    def __enter__(self) -> TlsProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
