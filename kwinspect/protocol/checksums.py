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
from collections.abc import Callable

__all__ = ["crc32", "crc32c"]


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


def _fastest_crc32c() -> Callable[[bytes | bytearray | memoryview], int]:
    """The crc32c wheel's function (hardware accelerated where possible), else the table."""
    try:
        import crc32c as crc32c_wheel
    except ImportError:  # pragma: no cover - exercised only without the wheel
        return _crc32c_py
    if crc32c_wheel.crc32c(b"\xff" * 4) == 0xFFFFFFFF:  # unsigned already: no wrapper
        return crc32c_wheel.crc32c
    return lambda data: crc32c_wheel.crc32c(data) & 0xFFFFFFFF  # pragma: no cover


_crc32c_impl: Callable[[bytes | bytearray | memoryview], int] | None = None


def crc32c(data: bytes | bytearray | memoryview) -> int:
    """CRC-32C (Castagnoli) as an unsigned 32-bit int.

    The wheel is imported at the first call, not with this module: its import (which
    reads package metadata) cost every start ~17 ms, and the compiled decoder computes
    batch CRCs in C where the CPU allows, so most runs never call this."""
    global _crc32c_impl
    if _crc32c_impl is None:
        _crc32c_impl = _fastest_crc32c()
    return _crc32c_impl(data)
