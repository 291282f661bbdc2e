"""End-to-end: a real, successful SASL/PLAIN session (tansu behind rig.saslproxy).

Runs rig.sasl_scenarios live (skipped without tansu/tcpdump/root) and
checks the committed captures/tansu-sasl-plain-proxy.pcap: every request paired
(SaslHandshake v1 + SaslAuthenticate from librdkafka, SaslHandshake v0 + raw
SaslToken from kafka-python, then the real traffic), records equal to the
manifest, the wrong password refused with SASL_AUTHENTICATION_FAILED, and the
passwords absent from `kwinspect exchanges|errors|decode` unless --no-redact.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict

import pytest

from kwinspect import cli
from rig import verify
from rig.manifest import Manifest
from rig.sasl_scenarios import (
    NAME,
    PASSWORD,
    WRONG_PASSWORD,
    tansu_sasl_plain_proxy,
    unavailable_reason,
)

pytestmark = [pytest.mark.e2e]

CAPTURES = os.path.join(os.path.dirname(__file__), "..", "..", "captures")
COMMITTED = os.path.join(CAPTURES, f"{NAME}.manifest.json")


def _cli(tmp_path, *args: str) -> str:
    out = tmp_path / f"out-{len(list(tmp_path.iterdir()))}.jsonl"
    rc = cli.main([*args, "-o", str(out), "-q"])
    assert rc == 0, f"kwinspect {' '.join(args)} exited {rc}"
    return out.read_text(encoding="utf-8")


def _problems(m: Manifest, pcap: str, tmp_path, *, strict_pairing: bool) -> list[str]:
    d = verify.decode(pcap, m.kafka_ports)
    problems = [f"[{name}] {p}" for name, fn in verify.CHECKS.items() for p in fn(m, d)]

    # every request paired: verify.check_pairing (above) excuses only requests a client
    # left in flight when it closed its connection (a consumer's last Fetch/Metadata);
    # the SASL exchanges themselves must all be paired
    if strict_pairing:
        problems += [f"[sasl] {ex.api_name} corr={ex.correlation_id} on {ex.stream}: {ex.status}"
                     for ex in d.exchanges if ex.status != "paired"
                     and ex.api_name in ("SaslHandshake", "SaslAuthenticate", "SaslToken")]
        if "SaslToken" not in {ex.api_name for ex in d.exchanges}:
            problems.append("no SaslToken exchange decoded")

    # per connection: ApiVersions, SaslHandshake, then SaslAuthenticate (v1) or SaslToken (v0)
    by_stream: dict[str, list] = defaultdict(list)
    for ex in d.exchanges:
        by_stream[ex.stream].append(ex)
    handshakes: set[int] = set()
    for stream, exs in by_stream.items():
        names = [ex.api_name for ex in exs]
        if names[:2] != ["ApiVersions", "SaslHandshake"]:
            problems.append(f"{stream} does not start ApiVersions, SaslHandshake: {names[:4]}")
            continue
        hv = exs[1].api_version
        handshakes.add(hv)
        want = "SaslToken" if hv == 0 else "SaslAuthenticate"
        if len(names) < 3 or names[2] != want:
            problems.append(f"{stream}: SaslHandshake v{hv} not followed by {want}: {names[:4]}")
        elif want == "SaslToken":
            body = exs[2].request.body or {}
            if body.get("username") != "alice" or exs[2].response is None \
                    or exs[2].response.size != 0:
                problems.append(f"{stream}: raw PLAIN token not decoded as such: {body}")
        if "SASL_AUTHENTICATION_FAILED" in (exs[2].error_names if len(exs) > 2 else []):
            if len(exs) != 3 or exs[2].client_id != "sasl-wrong-password":
                problems.append(f"{stream}: failed login by {exs[2].client_id} went on: {names}")
    if handshakes != {0, 1}:
        problems.append(f"SaslHandshake versions seen: {sorted(handshakes)}, want v0 and v1")
    failed = [ex for ex in d.exchanges if ex.api_name == "SaslAuthenticate"
              and ex.error_names == ["SASL_AUTHENTICATION_FAILED"]]
    if not failed or any(ex.client_id != "sasl-wrong-password" for ex in failed):
        problems.append(f"SASL_AUTHENTICATION_FAILED: {[(ex.client_id, ex.stream) for ex in failed]}")
    good = [ex for ex in d.exchanges if ex.api_name == "SaslAuthenticate" and not ex.error_names]
    if not good:
        problems.append("no successful SaslAuthenticate")

    # the records kwinspect shows (CLI) are the ones the clients produced and consumed
    ports = ",".join(map(str, m.kafka_ports))
    rows = [json.loads(line) for line in
            _cli(tmp_path, "records", pcap, "--kafka-ports", ports, "--format", "jsonl").splitlines()]
    seen = {(r["direction"], r["topic"], r["partition"], r["offset"], r["key"], r["value"])
            for r in rows}
    for direction, truths in (("produce", m.produced), ("fetch", m.consumed)):
        for t in truths:
            k = (direction, t.topic, t.partition, t.offset, t.key, t.value)
            if k not in seen:
                problems.append(f"`kwinspect records` lacks {k}")
    if not m.produced or len(m.consumed) < len(m.produced):
        problems.append(f"manifest: {len(m.produced)} produced, {len(m.consumed)} consumed")

    # passwords: redacted by default in every output, shown with --no-redact
    errors_out = _cli(tmp_path, "errors", pcap, "--kafka-ports", ports, "--format", "jsonl")
    if '"SASL_AUTHENTICATION_FAILED"' not in errors_out:
        problems.append("`kwinspect errors` does not show SASL_AUTHENTICATION_FAILED")
    for cmd in ("exchanges", "errors", "decode"):
        fmt = [] if cmd == "decode" else ["--format", "jsonl"]
        text = _cli(tmp_path, cmd, pcap, "--kafka-ports", ports, *fmt)
        for secret in (PASSWORD, WRONG_PASSWORD):
            if secret in text:
                problems.append(f"`kwinspect {cmd}` shows the password {secret!r} by default")
        if cmd == "decode":
            if '"password": "<redacted>"' not in text:
                problems.append("decode shows no redacted PLAIN password")
            clear = _cli(tmp_path, cmd, pcap, "--kafka-ports", ports, "--no-redact")
            for secret in (PASSWORD, WRONG_PASSWORD):
                if secret not in clear:
                    problems.append(f"`kwinspect decode --no-redact` hides {secret!r}")
            raw_tokens = [json.loads(line) for line in clear.splitlines()
                          if '"api_name": "SaslToken"' in line]
            if not any((r["request"]["body"] or {}).get("password") == PASSWORD for r in raw_tokens):
                problems.append("--no-redact: the raw SaslToken does not show the password")
    return problems


def _assert_clean(problems: list[str]) -> None:
    assert not problems, "\n".join(problems[:20])


def test_committed_sasl_capture(tmp_path):
    m = Manifest.read(COMMITTED)
    _assert_clean(_problems(m, m.pcap_path(COMMITTED), tmp_path, strict_pairing=True))


def test_sasl_plain_live(tmp_path):
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    from rig.rig import Rig

    workdir = tmp_path / "cap"
    with Rig(log_dir=str(tmp_path)) as rig:
        m = tansu_sasl_plain_proxy(rig, str(workdir))
    sessions = m.broker.get("sasl_sessions") or []
    outcomes = {s["outcome"] for s in sessions}
    assert {"authenticated", "authenticated (raw token)",
            "rejected: SASL_AUTHENTICATION_FAILED"} <= outcomes, sessions
    assert m.capture["stats"].get("dropped_by_kernel") == 0
    out = tmp_path / "cli"
    out.mkdir()
    pcap = str(workdir / m.pcap)
    _assert_clean(_problems(m, pcap, out, strict_pairing=True))
