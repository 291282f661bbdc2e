"""Keyed hashes and stable pseudonyms: same input, same output, for one secret.

Every replacement is derived from the run's secret (``--secret``,
``--secret-file``, KWINSPECT_SANITIZE_SECRET, else random per run) with
SHAKE-256 over ``secret || kind || input``: without the secret a pseudonym
cannot be turned back into the name by hashing guesses.  With the same secret,
two captures sanitized separately use the same pseudonyms.

Addresses (``addresses``): "map" numbers them into documentation ranges in order
of appearance; "prefix" maps them Crypto-PAn style (keyed, prefix-preserving:
two addresses sharing exactly k leading bits map to two sharing exactly k);
"keep" keeps them.  Ports: a keyed permutation of 1024-32767 and of 32768-65535
(ports below 1024 are kept), so two ports never map onto one.
"""

from __future__ import annotations

import hashlib
import ipaddress
import secrets as _secrets
from collections import Counter

# Addresses originals are mapped into: the ranges set aside for benchmarking
# (RFC 2544) and documentation (RFC 3849), which real traffic does not use.
# IPv6 ones are numbered from 2001:db8::5a17:0 on, so their text never holds "::1".
IPV4_POOL = ipaddress.IPv4Network("198.18.0.0/15")
IPV6_POOL = ipaddress.IPv6Network("2001:db8::5a17:0/112")
PORT_LOW = 1024  # ports below are services' own: kept


def prefix_preserving(address: ipaddress.IPv4Address | ipaddress.IPv6Address, secret: bytes):
    """Crypto-PAn style: bit i of the result is bit i of the address XOR a keyed
    pseudorandom bit of the address's first i bits.  So two addresses whose first k
    bits agree (and bit k differs) map to two whose first k bits agree and bit k
    differs: exactly the shared prefix length is kept, and it is a bijection."""
    width = address.max_prefixlen
    n = int(address)
    out = 0
    tag = b"prefix4" if width == 32 else b"prefix6"
    for i in range(width):
        prefix = (n >> (width - i)) if i else 0
        digest = hashlib.shake_256(secret + tag + bytes((i,)) + prefix.to_bytes(16, "big")).digest(1)
        bit = (n >> (width - 1 - i)) & 1
        out = (out << 1) | (bit ^ (digest[0] & 1))
    return type(address)(out)


def new_secret() -> bytes:
    return _secrets.token_bytes(32)


class Pseudonyms:
    """The run's replacements, what was replaced (counts) and the mapping (for --mapping)."""

    def __init__(self, secret: bytes, *, values: str = "hash", keep_topics: bool = False,
                 addresses: str = "map") -> None:
        self.secret = secret
        self.addresses = addresses  # "map" | "prefix" | "keep"
        self.body_ports = False  # ports in Kafka bodies (broker ports) mapped too
        self._ports: dict[tuple[int, frozenset[int]], int] = {}
        self.values = values  # "hash" | "keep" | "truncate:N"
        self.truncate = int(values.split(":", 1)[1]) if values.startswith("truncate:") else None
        self.keep_topics = keep_topics
        self.counts: Counter[str] = Counter()
        self.mapping: dict[str, dict[str, str]] = {}
        self._ips: dict[str, str] = {}
        self._next_ip = {4: 1, 6: 1}
        self.counting = True

    def count(self, kind: str, n: int = 1) -> None:
        if self.counting:
            self.counts[kind] += n

    def _digest(self, kind: str, data: bytes, n: int) -> bytes:
        return hashlib.shake_256(self.secret + kind.encode() + b"\0" + data).digest(n)

    # ------------------------------------------------------------------ record data

    def value(self, kind: str, data: bytes | None) -> bytes | None:
        """A record key, value or header value: keyed hash of the same length (hex
        digits), its first N bytes, or itself.  Null stays null, empty stays empty."""
        if data is None or not data:
            return data
        self.count(f"record_{kind}")
        if self.values == "keep":
            return data
        if self.truncate is not None:
            return data[:self.truncate]
        # one hash for keys, values and header values alike: a key that reappears as
        # a value (or in another topic) still matches
        return self._digest("value", data, (len(data) + 1) // 2).hex()[:len(data)].encode()

    # ------------------------------------------------------------------ names

    def name(self, kind: str, original: str | None) -> str | None:
        """A stable pseudonym such as ``topic-3fa2b1c0`` for a name of one kind."""
        if original is None or original in ("", "*"):
            return original  # nothing, or an ACL's wildcard
        if kind == "topic" and (self.keep_topics or original.startswith("__")):
            return original  # internal topics (__consumer_offsets) name no one
        if kind == "host":
            return self.host(original)
        self.count(kind)
        pseudonym = f"{kind}-{self._digest(kind, original.encode(), 4).hex()}"
        self.mapping.setdefault(kind, {})[original] = pseudonym
        return pseudonym

    def host(self, original: str) -> str:
        """A host name; an address literal becomes the address the packets get."""
        self.count("host")
        literal = original.lstrip("/")  # DescribeGroups' client_host is "/10.0.0.1"
        try:
            ipaddress.ip_address(literal.strip("[]"))
        except ValueError:
            pseudonym = f"host-{self._digest('host', original.encode(), 4).hex()}.invalid"
        else:
            pseudonym = original[:len(original) - len(literal)] + self.ip(literal.strip("[]"))
        self.mapping.setdefault("host", {})[original] = pseudonym
        return pseudonym

    def ip(self, original: str) -> str:
        """An IP address, mapped consistently: into IPV4_POOL / IPV6_POOL (first seen, first
        numbered), prefix-preserving, or kept (``addresses``)."""
        mapped = self._ips.get(original)
        if mapped is None:
            address = ipaddress.ip_address(original)
            if self.addresses == "keep":
                mapped = original
            elif self.addresses == "prefix":
                mapped = str(prefix_preserving(address, self.secret))
            else:
                pool = IPV4_POOL if address.version == 4 else IPV6_POOL
                mapped = str(pool.network_address + self._next_ip[address.version])
                self._next_ip[address.version] += 1
            self._ips[original] = mapped
            if self.addresses != "keep":
                self.mapping.setdefault("ip", {})[original] = mapped
        return mapped

    def port(self, original: int, avoid: frozenset[int] = frozenset()) -> int:
        """A TCP port through the keyed permutation (see _permute_port); ``avoid`` (the broker
        ports kept) is walked past, which keeps it a bijection of the ports not in
        ``avoid`` (cycle walking), so a client port never lands on a broker's."""
        if original < PORT_LOW or original in avoid:
            return original
        key = (original, avoid)
        mapped = self._ports.get(key)
        if mapped is None:
            mapped = self._permute_port(original)
            while mapped in avoid:
                mapped = self._permute_port(mapped)
            self._ports[key] = mapped
            if mapped != original:
                self.mapping.setdefault("port", {})[str(original)] = str(mapped)
        return mapped

    def body_port(self, original: int) -> int:
        """A port in a Kafka body (a broker's): mapped as the TCP ports are when
        broker ports are mapped, else kept."""
        if not self.body_ports or not 0 < original <= 0xFFFF:
            return original
        mapped = self.port(original)
        if mapped != original:
            self.count("port")
        return mapped

    def _permute_port(self, port: int) -> int:
        """A 4-round Feistel network over 16 bits, walked until it lands back in the
        port's own half: 1024-32767 or 32768-65535 (where systems take ephemeral ports).
        An ephemeral port stays ephemeral-looking: it does not land on the low ports
        where services (and Wireshark's port-based dissectors) mostly live."""
        low, high = (PORT_LOW, 0x7FFF) if port < 0x8000 else (0x8000, 0xFFFF)
        x = port
        while True:
            left, right = x >> 8, x & 0xFF
            for r in range(4):
                f = self._digest("port", bytes((r, right)), 1)[0]
                left, right = right, left ^ f
            x = (left << 8) | right
            if low <= x <= high:
                return x

    def removed(self, kind: str) -> bytes:
        self.count(kind)
        return b""

    def scrub(self, text: str | None) -> str | None:
        """Free text (error messages, config values): every name already replaced is replaced in it too."""
        if not text:
            return text
        out = text
        for kind in ("host", "ip", "topic", "client_id", "group", "member", "transactional_id", "principal"):
            for original, pseudonym in self.mapping.get(kind, {}).items():
                if len(original) >= 3 and original in out:
                    out = out.replace(original, pseudonym)
        if out != text:
            self.count("free_text")
        return out
