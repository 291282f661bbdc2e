"""Checksums used by Kafka record formats.

- ``crc32``: CRC-32 (IEEE), used by legacy message sets (magic 0 and 1), over
  the bytes from the magic byte to the end of the message.
- ``crc32c``: CRC-32C (Castagnoli), used by record batch v2, over the bytes
  from the attributes field to the end of the batch.

This is the only module of the sans-IO core that may import the ``crc32c``
package (import-linter contract in pyproject.toml).  When the package is
missing, a table-driven pure-Python implementation is used instead: slow but
correct, so decoding never depends on an optional wheel.
"""

from __future__ import annotations

import zlib

__all__ = ["crc32", "crc32c", "CRC32C_NATIVE"]


def crc32(data: bytes | bytearray | memoryview) -> int:
    """CRC-32 (IEEE 802.3) as an unsigned 32-bit int."""
    return zlib.crc32(data) & 0xFFFFFFFF


def _make_table(poly: int) -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ poly if c & 1 else c >> 1
        table.append(c)
    return table


_CRC32C_TABLE: list[int] | None = None


def _crc32c_py(data: bytes | bytearray | memoryview) -> int:
    global _CRC32C_TABLE
    if _CRC32C_TABLE is None:
        _CRC32C_TABLE = _make_table(0x82F63B78)
    table = _CRC32C_TABLE
    crc = 0xFFFFFFFF
    for b in bytes(data):
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


try:  # the fast path: the crc32c wheel (hardware accelerated where possible)
    import crc32c as _crc32c_mod

    def crc32c(data: bytes | bytearray | memoryview) -> int:
        """CRC-32C (Castagnoli) as an unsigned 32-bit int."""
        return _crc32c_mod.crc32c(data) & 0xFFFFFFFF

    if _crc32c_mod.crc32c(b"\xff" * 4) == 0xFFFFFFFF:  # unsigned already: no wrapper call per batch
        crc32c = _crc32c_mod.crc32c  # noqa: F811

    CRC32C_NATIVE = True
except ImportError:  # pragma: no cover - exercised only without the wheel
    crc32c = _crc32c_py
    CRC32C_NATIVE = False
