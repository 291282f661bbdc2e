"""`-` reads a capture from standard input, streaming, so a pipe works like a file.

The oracle for what the rows must be is the same command on the file itself; the
streaming test feeds a pipe half a capture, reads a row before sending the rest.
"""

from __future__ import annotations

import gzip
import json
import select
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

CAPTURES = Path(__file__).resolve().parents[2] / "captures"
PUBLIC = Path(__file__).resolve().parents[3] / "shared" / "captures-public"
KW = [sys.executable, "-m", "kwinspect.cli"]


def run(argv: list[str], stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*KW, *argv], input=stdin, capture_output=True, check=False)


@pytest.mark.parametrize("path", [CAPTURES / "confluent-mock-produce-consume.pcap",
                                  CAPTURES / "netns-mtu1500-produce-consume.pcap",
                                  PUBLIC / "ntop_nDPI__kafka.pcapng"], ids=lambda p: p.name)
@pytest.mark.parametrize("table", ["exchanges", "records", "errors"])
@pytest.mark.parametrize("compress", [False, True], ids=["plain", "gzip"])
def test_stdin_gives_what_the_file_gives(path, table, compress):
    if not path.exists():
        pytest.skip(f"{path} not here")
    data = path.read_bytes()
    want = run([table, str(path), "-F", "jsonl"])
    got = run([table, "-", "-F", "jsonl"], gzip.compress(data) if compress else data)
    assert got.returncode == 0, got.stderr
    assert got.stdout == want.stdout and want.stdout


def test_rows_come_out_while_the_pipe_is_still_open():
    data = (CAPTURES / "confluent-mock-produce-consume.pcap").read_bytes()
    first = json.loads(run(["exchanges", str(CAPTURES / "confluent-mock-produce-consume.pcap"),
                            "-F", "jsonl"]).stdout.splitlines()[0])
    for compress in (False, True):
        proc = subprocess.Popen([*KW, "exchanges", "-", "-F", "jsonl"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            half = data[: len(data) // 2]
            if compress:  # a sync flush, as `gzip` over a live capture would emit blocks
                z = zlib.compressobj(wbits=31)
                proc.stdin.write(z.compress(half) + z.flush(zlib.Z_SYNC_FLUSH))
            else:
                proc.stdin.write(half)
            proc.stdin.flush()
            ready, _, _ = select.select([proc.stdout], [], [], 60)
            assert ready, "no row before the end of the input: stdin is not streamed"
            line = proc.stdout.readline()
            assert json.loads(line)["correlation_id"] == first["correlation_id"]
            proc.stdin.write(z.compress(data[len(half):]) + z.flush() if compress else data[len(half):])
            proc.stdin.close()
            assert proc.wait(60) == 0
        finally:
            proc.kill()
            proc.wait()


def test_usage_errors_for_stdin():
    path = str(CAPTURES / "confluent-mock-produce-consume.pcap")
    data = Path(path).read_bytes()
    # -j falls back to one process for a pipe (every worker would read the input)
    jobs = run(["exchanges", "-", "-j", "2", "-F", "jsonl"], data)
    assert jobs.returncode == 0 and jobs.stdout == run(["exchanges", path, "-F", "jsonl"]).stdout
    assert run(["exchanges", "-", "-"], data).returncode == 2
    bad = run(["exchanges", "-"], b"not a capture at all")
    assert bad.returncode == 1 and b"Traceback" not in bad.stderr
