"""Shared fixtures for the capture-layer tests."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

# tests/helpers/pcapgen.py is imported as `helpers.pcapgen`
_TESTS = Path(__file__).resolve().parents[1]
if str(_TESTS) not in sys.path:
    sys.path.insert(0, str(_TESTS))

PUBLIC = Path(__file__).resolve().parents[3] / "shared" / "captures-public"


@pytest.fixture(scope="session")
def public_captures() -> list[Path]:
    files = sorted(PUBLIC.glob("*.pcap")) + sorted(PUBLIC.glob("*.pcapng"))
    if not files:
        pytest.skip(f"public captures folder {PUBLIC} is absent")
    return files


@pytest.fixture(scope="session")
def tshark() -> str:
    exe = shutil.which("tshark")
    if exe is None:
        pytest.skip("tshark is not installed (it is the independent oracle for these tests)")
    return exe
