"""A loopback TCP proxy skeleton: listen, accept, one thread per connection, clean close.

The rig's TLS- and SASL-terminating proxies differ only in what they do with
each accepted connection (``_serve``); this holds the rest.
"""

from __future__ import annotations

import contextlib
import socket
import threading


def close_sockets(*socks: socket.socket) -> None:
    for s in socks:
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            s.close()


class LoopbackProxy:
    """Listens on 127.0.0.1 (a free port, in ``self.port``) and serves each connection on a thread."""

    def __init__(self, backlog: int = 16) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(backlog)
        self.port = self.sock.getsockname()[1]
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()

    def _serve(self, client: socket.socket) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def _track(self, *socks: socket.socket) -> None:
        """Sockets to close when the proxy closes."""
        with self._lock:
            self._conns += socks

    def start(self):
        t = threading.Thread(target=self._accept_loop, daemon=True)
        t.start()
        with self._lock:
            self._threads.append(t)
        return self

    def _accept_loop(self) -> None:
        self.sock.settimeout(0.1)
        while not self._stop.is_set():
            try:
                client, _addr = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            t = threading.Thread(target=self._serve, args=(client,), daemon=True)
            t.start()
            with self._lock:
                self._threads.append(t)

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self.sock.close()
        with self._lock:
            conns = list(self._conns)
            threads = list(self._threads)
        close_sockets(*conns)
        for t in threads:
            t.join(timeout=2)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
