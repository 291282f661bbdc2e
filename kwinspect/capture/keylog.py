"""TLS key material: NSS key log files (what SSLKEYLOGFILE / Python's
``SSLContext.keylog_filename`` / ``editcap --inject-secrets`` write).

One line per secret: ``LABEL <client random, hex> <secret, hex>``.  The labels
read are ``CLIENT_RANDOM`` (the TLS 1.2 master secret) and the TLS 1.3 traffic
secrets (``CLIENT_HANDSHAKE_TRAFFIC_SECRET``, ``SERVER_HANDSHAKE_TRAFFIC_SECRET``,
``CLIENT_TRAFFIC_SECRET_0``, ``SERVER_TRAFFIC_SECRET_0``, ``EARLY_TRAFFIC_SECRET``
/ ``CLIENT_EARLY_TRAFFIC_SECRET``, ``EXPORTER_SECRET``); other lines (comments,
``RSA`` pre-master lines, garbage) are counted and ignored.

Secrets never leave this object in any printable form: its repr says only how
many it holds, and nothing here logs or raises with a secret in the message.
"""

from __future__ import annotations

import os
import re

LABELS = frozenset({
    "CLIENT_RANDOM",
    "CLIENT_HANDSHAKE_TRAFFIC_SECRET",
    "SERVER_HANDSHAKE_TRAFFIC_SECRET",
    "CLIENT_TRAFFIC_SECRET_0",
    "SERVER_TRAFFIC_SECRET_0",
    "CLIENT_EARLY_TRAFFIC_SECRET",
    "EARLY_TRAFFIC_SECRET",
    "EXPORTER_SECRET",
})
_HEX = re.compile(r"[0-9a-fA-F]+\Z")
# the Decryption Secrets Block's secrets type for an NSS key log
DSB_TLS_KEY_LOG = 0x544C534B


class KeyLog:
    """Secrets by (label, client random).  Several sources may be added (files,
    pcapng Decryption Secrets Blocks, text); a later line for the same label and
    client random replaces the earlier one."""

    __slots__ = ("_secrets", "ignored_lines", "sources")

    def __init__(self) -> None:
        self._secrets: dict[tuple[str, bytes], bytes] = {}
        self.ignored_lines = 0
        self.sources = 0

    def __repr__(self) -> str:  # never the secrets
        return f"KeyLog({len(self._secrets)} secrets)"

    __str__ = __repr__

    def __len__(self) -> int:
        return len(self._secrets)

    def __bool__(self) -> bool:
        return bool(self._secrets)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, KeyLog) and other._secrets == self._secrets

    __hash__ = None  # type: ignore[assignment]

    def __getstate__(self) -> dict:
        return {"secrets": self._secrets, "ignored": self.ignored_lines, "sources": self.sources}

    def __setstate__(self, state: dict) -> None:
        self._secrets = state["secrets"]
        self.ignored_lines = state["ignored"]
        self.sources = state["sources"]

    def add_text(self, text: str | bytes) -> int:
        """Read key log lines; returns how many secrets were added."""
        if isinstance(text, bytes | bytearray | memoryview):
            text = bytes(text).decode("ascii", "replace")
        self.sources += 1
        added = 0
        for line in text.splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split()
            if (len(parts) != 3 or parts[0] not in LABELS or len(parts[1]) != 64
                    or not _HEX.match(parts[1]) or not _HEX.match(parts[2]) or len(parts[2]) % 2):
                self.ignored_lines += 1
                continue
            self._secrets[(parts[0], bytes.fromhex(parts[1]))] = bytes.fromhex(parts[2])
            added += 1
        return added

    def add_file(self, path: str | os.PathLike[str]) -> int:
        """Read an NSS key log file (OSError if it cannot be read)."""
        with open(path, "rb") as f:
            return self.add_text(f.read())

    def add_dsb(self, secrets_type: int, data: bytes) -> int:
        """A pcapng Decryption Secrets Block's payload; only TLS key logs are read."""
        if secrets_type != DSB_TLS_KEY_LOG:
            return 0
        return self.add_text(data)

    def merge(self, other: KeyLog) -> None:
        """Add every secret of another key log."""
        self._secrets.update(other._secrets)  # noqa: SLF001 - the same class

    def get(self, label: str, client_random: bytes) -> bytes | None:
        return self._secrets.get((label, client_random))

    def has_client_random(self, client_random: bytes) -> bool:
        return any(cr == client_random for _label, cr in self._secrets)
