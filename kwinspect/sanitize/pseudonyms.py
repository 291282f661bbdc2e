"""Keyed hashes and stable pseudonyms: same input, same output, for one secret.

Every replacement is derived from the run's secret (``--secret``, else random
per run) with SHAKE-256 over ``secret || kind || input``: without the secret a
pseudonym cannot be turned back into the name by hashing guesses.  With the
same secret, two captures sanitized separately use the same pseudonyms.
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


def new_secret() -> bytes:
    return _secrets.token_bytes(32)


class Pseudonyms:
    """The run's replacements, what was replaced (counts) and the mapping (for --mapping)."""

    def __init__(self, secret: bytes, *, values: str = "hash", keep_topics: bool = False) -> None:
        self.secret = secret
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
        """An IP address, mapped consistently (first seen, first numbered) into IPV4_POOL / IPV6_POOL."""
        mapped = self._ips.get(original)
        if mapped is None:
            version = ipaddress.ip_address(original).version
            pool = IPV4_POOL if version == 4 else IPV6_POOL
            mapped = str(pool.network_address + self._next_ip[version])
            self._next_ip[version] += 1
            self._ips[original] = mapped
            self.mapping.setdefault("ip", {})[original] = mapped
        return mapped

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
