"""What decoding builds is bounded, not only what length fields claim.

Captures from element_floods.py: an OffsetFetch request of 1.5M empty topics (9 MB on
the wire; ~400 MB decoded without the element limit) and 10 unanswered requests of
300k topics each (their decoded bodies used to be held until the end: ~800 MB).
Memory is the command's own peak RSS (helpers/peak.py); every command also runs under a
2 GiB address-space limit (RLIMIT_AS) and must finish without a traceback.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from fuzz_regressions import element_floods
from helpers.peak import run_with_peak

ROOT = Path(__file__).resolve().parents[2]
AS_LIMIT = 2 << 30


def _run(*args: str, limit: bool = True) -> subprocess.CompletedProcess:
    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))

    return subprocess.run([sys.executable, "-m", "kwinspect", *args, "-q"], capture_output=True, text=True,
                          cwd=ROOT, preexec_fn=cap if limit else None, timeout=600)


@pytest.fixture(scope="module")
def floods(tmp_path_factory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("floods")
    return {"one": str(element_floods.offset_fetch_flood(d / "one.pcap", 1_500_000)),
            "unanswered": str(element_floods.unanswered_floods(d / "unanswered.pcap", 300_000, 10))}


def test_a_message_past_the_element_limit_is_cut_with_a_limit_row(floods):
    proc = _run("errors", "-F", "jsonl", floods["one"])
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    (limit,) = [r for r in rows if r["kind"] == "limit_exceeded"]
    assert limit["api_name"] == "OffsetFetch" and "1,000,000 array elements" in limit["message"]
    ex = json.loads(_run("exchanges", "-F", "jsonl", floods["one"]).stdout)
    assert ex["status"] == "paired" and ex["request_size"] > 9_000_000


@pytest.mark.parametrize("command", ["exchanges", "summary", "decode"])
def test_unanswered_huge_requests_are_not_held_decoded(floods, command):
    proc, peak_mib = run_with_peak([sys.executable, "-m", "kwinspect", command, "-q", floods["unanswered"]],
                                   cwd=ROOT, timeout=600)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    # decode also renders each message's JSON (its body is not a record set: not streamed)
    bound = 560 if command == "decode" else 500  # exchanges: 810 MiB before
    assert peak_mib < bound, f"{command}: peak {peak_mib} MiB"
    capped = _run(command, floods["unanswered"])
    assert capped.returncode == 0 and "Traceback" not in capped.stderr, capped.stderr


def test_the_exchanges_still_carry_their_decoded_requests(floods):
    """A request kept as bytes while it waited is decoded again when it is read."""
    proc = _run("decode", floods["unanswered"], limit=False)
    first = json.loads(proc.stdout.splitlines()[0])
    assert first["status"] == "response_missing"
    assert len(first["request"]["body"]["topics"]) == 300_000


def test_out_of_memory_is_one_line_with_exit_status_3(floods):
    def tiny() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (250 << 20, 250 << 20))

    proc = subprocess.run([sys.executable, "-m", "kwinspect", "decode", "-q", floods["unanswered"]],
                          capture_output=True, text=True, cwd=ROOT, preexec_fn=tiny, timeout=600)
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [
        "kwinspect: out of memory (exit status 3); rows written so far are complete; see docs/limits.md"]
