"""Per-connection facts of the ``summary`` report, in a few bytes a connection.

The summary counts connections in total, per broker and per client, and names each
client's software from its connections' ApiVersions requests. It used to keep, for every
connection, its name in several sets and dicts (~1 KB a connection: 447 MB on a capture of
176k short connections). Here a connection is a slot: its ``tcp_stream`` number (Wireshark's
``tcp.stream``; a reused address pair is a new connection, as in ``connections.total``'s
definition), or, for events that carry none, a slot found by the connection's name. A slot
holds small ints (its broker, its client, its client software: indexes into tables of the
distinct values) and flag bits: 13 bytes. The counts are made from the slots at the end,
and two tables merge exactly (``--jobs``: a connection is seen by the worker that owns it
and by the main process for the exchanges it adds itself).
"""

from __future__ import annotations

from array import array
from collections import Counter
from typing import Any

# flag bits of a slot
SEEN = 1  # counted in connections.total (it has a name)
TLS = 2
TLS_DECRYPTED = 4
NOT_KAFKA = 8
_FLAGS = (SEEN, TLS, TLS_DECRYPTED, NOT_KAFKA)
# bytes.translate tables: a flag byte -> 1 when the bit is set, else 0
_HAS = {bit: bytes(1 if b & bit else 0 for b in range(256)) for bit in _FLAGS}


def host_of(addr: str | None) -> str:
    """'10.0.0.1:5000' -> '10.0.0.1'; '[::1]:5000' -> '::1'."""
    if not addr:
        return "(unknown)"
    if addr.startswith("["):
        end = addr.find("]")
        return addr[1:end] if end > 0 else addr
    return addr.rsplit(":", 1)[0] if addr.count(":") == 1 else addr


class _Slots:
    """Parallel arrays indexed by slot; 0 in an index array means "none yet"."""

    __slots__ = ("broker", "client", "software", "flags", "more")

    def __init__(self) -> None:
        self.broker = array("I")
        self.client = array("I")
        self.software = array("I")
        self.flags = bytearray()
        # slot -> further (broker index, client index) pairs: a client id that changed
        # within one connection (rare; exact like the rest)
        self.more: dict[int, set[tuple[int, int]]] = {}

    def reach(self, slot: int) -> None:
        """Make ``slot`` addressable (grow by half again, so appends stay amortized)."""
        n = len(self.flags)
        if slot < n:
            return
        grow = max(slot + 1 - n, n >> 1, 1024)
        zeros = bytes(4 * grow)
        self.broker.frombytes(zeros)
        self.client.frombytes(zeros)
        self.software.frombytes(zeros)
        self.flags.extend(bytes(grow))

    def state(self) -> tuple:
        return (self.broker, self.client, self.software, self.flags, self.more)


class ConnectionCounts:
    """Which broker, clients and client software each connection had (see the module doc)."""

    def __init__(self) -> None:
        self._brokers: dict[str, int] = {}  # broker address -> index (from 1), first seen first
        self._broker_names: list[str | None] = [None]
        self._clients: dict[tuple[str | None, str], int] = {}  # (client id, host) -> index
        self._client_keys: list[Any] = [None]
        self._softwares: dict[tuple[str | None, str | None], int] = {}
        self._software_keys: list[Any] = [None]
        self._numbered = _Slots()  # by tcp_stream
        self._named = _Slots()  # by connection name, for events without a tcp_stream
        self._names: dict[str, int] = {}

    # -- feeding --------------------------------------------------------------------
    def _slot(self, tcp_stream: int | None, stream: str | None) -> tuple[_Slots, int]:
        if tcp_stream is not None and tcp_stream >= 0:
            slots, slot = self._numbered, tcp_stream
        else:
            slots, name = self._named, stream or ""
            slot = self._names.get(name)
            if slot is None:
                slot = self._names[name] = len(self._names)
        slots.reach(slot)
        return slots, slot

    def _index(self, table: dict, keys: list, key: Any) -> int:
        i = table.get(key)
        if i is None:
            i = table[key] = len(keys)
            keys.append(key)
        return i

    def exchange(self, tcp_stream: int | None, stream: str | None, broker: str, client_id: str | None,
                 client: str | None) -> tuple[str | None, str]:
        """Note an exchange's connection; returns its client key (client id, client host)."""
        if tcp_stream is not None and tcp_stream >= 0:
            slots = self._numbered
            if tcp_stream < len(slots.flags):
                # the common case: this connection's client already noted with this client id
                # (broker and client host are the connection's own)
                c = slots.client[tcp_stream]
                if c:
                    ckey = self._client_keys[c]
                    if ckey[0] == client_id and self._broker_names[slots.broker[tcp_stream]] == broker:
                        return ckey
        slots, slot = self._slot(tcp_stream, stream)
        ckey = (client_id, host_of(client))
        b = self._index(self._brokers, self._broker_names, broker)
        c = self._index(self._clients, self._client_keys, ckey)
        self._note(slots, slot, b, c)
        if stream:
            slots.flags[slot] |= SEEN
        return ckey

    @staticmethod
    def _note(slots: _Slots, slot: int, b: int, c: int) -> None:
        if not slots.client[slot]:
            slots.broker[slot] = b
            slots.client[slot] = c
        elif (slots.broker[slot], slots.client[slot]) != (b, c):
            slots.more.setdefault(slot, set()).add((b, c))

    def software(self, tcp_stream: int | None, stream: str | None, name: str, version: str | None) -> None:
        """The client software a connection's ApiVersions request named (the last one wins)."""
        slots, slot = self._slot(tcp_stream, stream)
        slots.software[slot] = self._index(self._softwares, self._software_keys, (name, version))

    def flag(self, tcp_stream: int | None, stream: str | None, bits: int) -> None:
        """Mark a named connection (an error row's): seen, and TLS / not Kafka when so."""
        slots, slot = self._slot(tcp_stream, stream)
        slots.flags[slot] |= bits

    # -- merging (--jobs) -------------------------------------------------------------
    def part(self) -> tuple:
        """Everything, to :meth:`merge` into another table (picklable; arrays stay compact)."""
        return (self._broker_names, self._client_keys, self._software_keys,
                self._numbered.state(), self._named.state(), list(self._names))

    def merge(self, part: tuple) -> None:
        """Add another table's :meth:`part`; a connection both saw is counted once. New
        brokers and clients take their place after this table's, in the other's order."""
        broker_names, client_keys, software_keys, numbered, named, names = part
        bmap = [0] + [self._index(self._brokers, self._broker_names, k) for k in broker_names[1:]]
        cmap = [0] + [self._index(self._clients, self._client_keys, k) for k in client_keys[1:]]
        smap = [0] + [self._index(self._softwares, self._software_keys, k) for k in software_keys[1:]]
        slot_of_name = [self._slot(None, name)[1] for name in names]
        for mine, theirs, where in ((self._numbered, numbered, None), (self._named, named, slot_of_name)):
            broker, client, software, flags, more = theirs
            for i, f in enumerate(flags):
                c = client[i]
                if not (f or c or software[i]):
                    continue
                j = i if where is None else where[i]
                mine.reach(j)
                mine.flags[j] |= f
                if c:
                    self._note(mine, j, bmap[broker[i]], cmap[c])
                if software[i]:
                    mine.software[j] = smap[software[i]]
            for i, pairs in more.items():
                j = i if where is None else where[i]
                for b, c in pairs:
                    self._note(mine, j, bmap[b], cmap[c])

    # -- results --------------------------------------------------------------------
    def count(self, bit: int) -> int:
        """Connections with a flag bit (SEEN: connections.total)."""
        table = _HAS[bit]
        return sum(bytes(s.flags).translate(table).count(1) for s in (self._numbered, self._named))

    def per_broker_and_client(self) -> tuple[dict[str, int], dict[tuple, int], dict[tuple, set]]:
        """(connections per broker, connections per client key, client software per client
        key), brokers and clients in the order first seen."""
        brokers: Counter = Counter()
        clients: Counter = Counter()
        software: set[tuple[int, int]] = set()  # (client, software)
        for s in (self._numbered, self._named):
            brokers.update(s.broker)
            clients.update(s.client)
            software.update(zip(s.client, s.software, strict=True))
            for slot, pairs in s.more.items():  # a connection counts once per broker, per client
                brokers.update({b for b, _c in pairs} - {s.broker[slot]})
                clients.update({c for _b, c in pairs} - {s.client[slot]})
                software.update((c, s.software[slot]) for _b, c in pairs)
        by_client: dict[tuple, set] = {}
        for c, sw in software:
            if c and sw:
                by_client.setdefault(self._client_keys[c], set()).add(self._software_keys[sw])
        return ({self._broker_names[b]: brokers[b] for b in range(1, len(self._broker_names)) if brokers[b]},
                {self._client_keys[c]: clients[c] for c in range(1, len(self._client_keys)) if clients[c]},
                by_client)
