"""TLS key material: NSS key log files (what SSLKEYLOGFILE / Python's
``SSLContext.keylog_filename`` / ``editcap --inject-secrets`` write).

One line per secret: ``LABEL <client random, hex> <secret, hex>``.  The labels
read are ``CLIENT_RANDOM`` (the TLS 1.2 master secret) and the TLS 1.3 traffic
secrets (``CLIENT_HANDSHAKE_TRAFFIC_SECRET``, ``SERVER_HANDSHAKE_TRAFFIC_SECRET``,
``CLIENT_TRAFFIC_SECRET_0``, ``SERVER_TRAFFIC_SECRET_0``, ``EARLY_TRAFFIC_SECRET``
/ ``CLIENT_EARLY_TRAFFIC_SECRET``, ``EXPORTER_SECRET``); other lines (comments,
``RSA`` pre-master lines, garbage) are counted and ignored.

A key log can also be *watched* (``watch(path)``, for live capture): clients
append lines as they connect, so ``refresh()`` reads what was appended since
(complete lines only; a file replaced or truncated is read again from the start),
at most every ``REFRESH_INTERVAL`` seconds.  A watched key log is ``growing``:
a TLS session that finds no key in it waits for the key instead of giving up.

Secrets never leave this object in any printable form: its repr says only how
many it holds, and nothing here logs or raises with a secret in the message.
"""

from __future__ import annotations

import os
import re
import time

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
# a watched key log is looked at (one stat per file) at most this often
REFRESH_INTERVAL = 0.25


class KeyLog:
    """Secrets by (label, client random).  Several sources may be added (files,
    pcapng Decryption Secrets Blocks, text); a later line for the same label and
    client random replaces the earlier one."""

    __slots__ = ("_checked", "_secrets", "_watch", "ignored_lines", "refreshes", "sources")

    def __init__(self) -> None:
        self._secrets: dict[tuple[str, bytes], bytes] = {}
        self.ignored_lines = 0
        self.sources = 0
        # watched files: path -> (bytes read, inode); see watch() and refresh()
        self._watch: dict[str, tuple[int, int]] = {}
        self._checked = float("-inf")  # time.monotonic() of the last refresh
        self.refreshes = 0  # refreshes that found new lines

    def __repr__(self) -> str:  # never the secrets
        return f"KeyLog({len(self._secrets)} secrets)"

    __str__ = __repr__

    def __len__(self) -> int:
        return len(self._secrets)

    def __bool__(self) -> bool:
        """Secrets in it, or files watched that may bring some."""
        return bool(self._secrets) or bool(self._watch)

    @property
    def growing(self) -> bool:
        """Watched files may add secrets later (live capture)."""
        return bool(self._watch)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, KeyLog) and other._secrets == self._secrets

    __hash__ = None  # type: ignore[assignment]

    def __getstate__(self) -> dict:
        return {"secrets": self._secrets, "ignored": self.ignored_lines, "sources": self.sources,
                "watch": self._watch}

    def __setstate__(self, state: dict) -> None:
        self._secrets = state["secrets"]
        self.ignored_lines = state["ignored"]
        self.sources = state["sources"]
        self._watch = dict(state.get("watch") or {})
        self._checked = float("-inf")
        self.refreshes = 0

    def copy(self) -> KeyLog:
        """The same secrets and watched files (each copy reads the files on its own)."""
        keys = KeyLog()
        keys.__setstate__(self.__getstate__())
        keys._secrets = dict(self._secrets)  # noqa: SLF001 - the same class
        return keys

    def add_text(self, text: str | bytes) -> int:
        """Read key log lines; returns how many secrets were added."""
        self.sources += 1
        return self._add_lines(text)

    def _add_lines(self, text: str | bytes) -> int:
        if isinstance(text, bytes | bytearray | memoryview):
            text = bytes(text).decode("ascii", "replace")
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

    def watch(self, path: str | os.PathLike[str]) -> int:
        """Read a key log file now (if it exists yet) and again, from where this left
        off, whenever ``refresh()`` finds it grew.  OSError if it exists but cannot be
        read; a file that does not exist yet is read once it appears."""
        path = os.fspath(path)
        self.sources += 1
        self._watch[path] = (0, -1)
        if os.path.exists(path):
            with open(path, "rb"):  # readable now, or OSError with the file's name only
                pass
        return self._read_new(path)

    def refresh(self, force: bool = False) -> int:
        """Read the lines appended to the watched files since the last look; returns how
        many secrets were added.  Does nothing more often than every REFRESH_INTERVAL
        seconds unless ``force``; never raises (a file that vanished is skipped)."""
        if not self._watch:
            return 0
        now = time.monotonic()
        if not force and now - self._checked < REFRESH_INTERVAL:
            return 0
        self._checked = now
        added = sum(self._read_new(path) for path in self._watch)
        if added:
            self.refreshes += 1
        return added

    def _read_new(self, path: str) -> int:
        try:
            st = os.stat(path)
        except OSError:
            return 0
        offset, inode = self._watch[path]
        if st.st_ino != inode or st.st_size < offset:  # a new file, replaced or truncated
            offset = 0
        if st.st_size == offset:
            self._watch[path] = (offset, st.st_ino)
            return 0
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read(st.st_size - offset)
        except OSError:
            return 0
        end = data.rfind(b"\n") + 1  # complete lines only: a client may be writing the next one
        self._watch[path] = (offset + end, st.st_ino)
        return self._add_lines(data[:end]) if end else 0

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
