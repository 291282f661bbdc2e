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


TSHARK_FIELDS = ("frame.time_epoch", "frame.len", "frame.cap_len", "tcp.srcport", "tcp.dstport",
                 "tcp.seq_raw", "tcp.ack_raw", "tcp.flags", "tcp.len")


@pytest.fixture(scope="session")
def tshark_frames(public_captures, tshark) -> dict[Path, list[dict[str, str]]]:
    """Per public capture, tshark's view of every frame (one tshark run per file)."""
    import subprocess

    procs = {}
    for path in public_captures:  # all at once: tshark's start-up dominates
        cmd = [tshark, "-r", str(path), "-T", "fields"]
        for f in TSHARK_FIELDS:
            cmd += ["-e", f]
        procs[path] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                       text=True)
    out: dict[Path, list[dict[str, str]]] = {}
    for path, proc in procs.items():
        text, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, f"tshark failed on {path}"
        out[path] = [dict(zip(TSHARK_FIELDS, line.split("\t"), strict=True))
                     for line in text.split("\n") if line.strip()]
    return out
