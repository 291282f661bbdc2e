"""A loopback Kafka proxy that loses one ProduceResponse, so a producer retries.

The proxy forwards whole Kafka frames both ways. It reads the request header of
every frame a client sends (api key, correlation id) and, for the first Produce
request after `arm()`, swallows the broker's response instead of forwarding it:
the broker has written the records, the producer never hears so, times out and
sends the batch again. Without idempotence the broker writes it twice. The
proxy records what it dropped (`dropped`: the correlation id and the client's
address), which the scenario puts in its manifest.
"""

from __future__ import annotations

import socket
import struct
import threading

from rig.proxy import LoopbackProxy, close_sockets

PRODUCE = 0


def _read_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _read_frame(sock: socket.socket) -> bytes | None:
    head = _read_exact(sock, 4)
    if head is None:
        return None
    (size,) = struct.unpack(">i", head)
    if size < 0 or size > 100 << 20:
        return None
    body = _read_exact(sock, size)
    return None if body is None else head + body


class ProduceResponseDropper(LoopbackProxy):
    """Forwards to ``upstream``; after `arm()`, drops the response to the next Produce request."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        super().__init__(backlog=16)
        self.upstream = upstream
        self._armed = False
        self._lock2 = threading.Lock()
        self.dropped: list[dict] = []  # {correlation_id, client} of each lost response

    def arm(self) -> None:
        with self._lock2:
            self._armed = True

    def _serve(self, client: socket.socket) -> None:
        try:
            up = socket.create_connection(self.upstream, timeout=10)
            up.settimeout(None)
        except OSError:
            close_sockets(client)
            return
        self._track(client, up)
        to_drop: set[int] = set()  # correlation ids whose responses are lost (this connection)
        host, port = client.getpeername()[:2]
        peer = f"{host}:{port}"
        t = threading.Thread(target=self._responses, args=(up, client, to_drop), daemon=True)
        t.start()
        try:
            while (frame := _read_frame(client)) is not None:
                if len(frame) >= 12:
                    api_key, _version, cid = struct.unpack(">hhi", frame[4:12])
                    if api_key == PRODUCE:
                        with self._lock2:
                            if self._armed:
                                self._armed = False
                                to_drop.add(cid)
                                self.dropped.append({"correlation_id": cid, "client": peer})
                up.sendall(frame)
        except OSError:
            pass
        close_sockets(up, client)
        t.join(timeout=5)

    @staticmethod
    def _responses(up: socket.socket, client: socket.socket, to_drop: set[int]) -> None:
        try:
            while (frame := _read_frame(up)) is not None:
                (cid,) = struct.unpack(">i", frame[4:8])
                if cid in to_drop:
                    to_drop.discard(cid)
                    continue  # lost on the way back
                client.sendall(frame)
        except OSError:
            pass
        close_sockets(client, up)
