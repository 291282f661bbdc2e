"""The shipped TLS captures (rig/tls_scenarios.py) through the CLI: with the key log
every connection decodes; with part of it, the rest says why; without it, every
connection is "TLS, not decoded" and the command still succeeds; and no secret of the
key log, nor a key derived from it, appears in any output."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kwinspect.capture import tls
from kwinspect.capture.keylog import KeyLog

ROOT = Path(__file__).resolve().parents[2]
CAPTURES = ROOT / "captures"
KEYED = sorted(p for p in CAPTURES.glob("*-keylog.pcap") if p.with_suffix(".keys").is_file())


def cli(*argv: str) -> tuple[int, str, str]:
    from kwinspect import cli as kw

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = kw.main(list(argv))
    return status, out.getvalue(), err.getvalue()


def jsonl(*argv: str) -> list[dict]:

    status, out, _err = cli(*argv, "-F", "jsonl", "-q")
    assert status == 0
    return [json.loads(line) for line in out.splitlines()]


def test_tls_captures_are_shipped() -> None:
    assert [p.name for p in KEYED] == ["tansu-kafkajs-tls13-keylog.pcap", "tansu-tls12-keylog.pcap",
                                       "tansu-tls13-keylog.pcap"]
    assert (CAPTURES / "tansu-tls13-dsb.pcap").is_file()


@pytest.mark.parametrize("pcap", KEYED, ids=lambda p: p.name)
def test_without_the_key_log(pcap: Path) -> None:
    rows = jsonl("errors", str(pcap))
    assert rows and all(r["kind"] == "tls_stream" for r in rows)
    assert all(r["message"] == "TLS handshake: the stream is encrypted and cannot be decoded (no key log given: --tls-keylog FILE decrypts it)" for r in rows)
    assert len({r["stream"] for r in rows}) == len(rows)  # one per connection
    assert jsonl("exchanges", str(pcap)) == []


@pytest.mark.parametrize("pcap", KEYED, ids=lambda p: p.name)
def test_with_part_of_the_key_log(pcap: Path) -> None:
    some = str(pcap.with_suffix("")) + ".some.keys"
    rows = jsonl("errors", "--tls-keylog", some, str(pcap))
    decrypted = {r["stream"] for r in rows if r["kind"] == "tls_decrypted"}
    refused = [r for r in rows if r["kind"] == "tls_stream"]
    assert decrypted and refused
    assert all(r["message"].endswith(": no key for this client random in the key log)") for r in refused)
    exchanges = jsonl("exchanges", "--tls-keylog", some, str(pcap))
    assert {e["stream"] for e in exchanges} == decrypted
    manifest = json.loads(pcap.with_suffix(".manifest.json").read_text())
    producers = {c["client_id"] for c in manifest["clients"] if c["role"] == "producer"}
    assert {e["client_id"] for e in exchanges} == producers


@pytest.mark.parametrize("pcap", KEYED, ids=lambda p: p.name)
def test_several_key_logs_and_sslkeylogfile(pcap: Path, monkeypatch) -> None:
    keys = str(pcap.with_suffix(".keys"))
    some = str(pcap.with_suffix("")) + ".some.keys"
    full = jsonl("exchanges", "--tls-keylog", keys, str(pcap))
    assert jsonl("exchanges", "--tls-keylog", some, "--tls-keylog", keys, str(pcap)) == full
    monkeypatch.setenv("SSLKEYLOGFILE", keys)
    assert jsonl("exchanges", str(pcap)) == full
    assert jsonl("exchanges", "-j", "2", str(pcap)) == full


def test_dsb_capture_needs_no_key_log() -> None:
    dsb = jsonl("exchanges", str(CAPTURES / "tansu-tls13-dsb.pcap"))
    keyed = jsonl("exchanges", "--tls-keylog", str(CAPTURES / "tansu-tls13-keylog.keys"),
                  str(CAPTURES / "tansu-tls13-keylog.pcap"))
    assert dsb and [(e["api_key"], e["api_version"], e["correlation_id"], e["frame"]) for e in dsb] == [
        (e["api_key"], e["api_version"], e["correlation_id"], e["frame"]) for e in keyed]


def test_unreadable_key_log_is_a_usage_error(tmp_path) -> None:
    status, out, err = cli("summary", "--tls-keylog", str(tmp_path / "nope.keys"), str(KEYED[0]))
    assert status != 0 and "nope.keys" in err


def _secrets(keys_path: Path) -> list[str]:
    """Every secret of the key log and every key/iv derived from it, as hex (both cases)
    and as the raw bytes' base64."""
    import base64

    k = KeyLog()
    k.add_file(keys_path)
    out: set[bytes] = set()
    for line in keys_path.read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        secret = bytes.fromhex(line.split()[2])
        out.add(secret)
        for suite in (tls.SUITES[0x1301], tls.SUITES[0x1302]):
            if len(secret) == {"sha256": 32, "sha384": 48}[suite.hash]:
                out.update(tls.tls13_traffic_keys(secret, suite))
    texts = []
    for b in out:
        texts += [b.hex(), b.hex().upper(), base64.b64encode(b).decode()]
    return texts


SUBCOMMANDS = [
    ["summary"], ["summary", "-F", "json"], ["exchanges", "-F", "jsonl"], ["exchanges", "-F", "csv"],
    ["exchanges", "-F", "table"], ["records", "-F", "jsonl"], ["records", "-F", "csv"], ["errors", "-F", "jsonl"],
    ["errors", "--records", "-F", "table"], ["latency", "-F", "jsonl"], ["decode"], ["decode", "--no-redact"],
    ["diagnose", "-F", "jsonl"], ["diagnose", "-F", "text"],
]


@pytest.mark.parametrize("pcap", KEYED, ids=lambda p: p.name)
def test_no_secret_in_any_output(pcap: Path, tmp_path) -> None:
    keys = pcap.with_suffix(".keys")
    secrets = _secrets(keys)
    assert len(secrets) > 20
    for keyfile in (keys, Path(str(pcap.with_suffix("")) + ".some.keys")):
        for argv in SUBCOMMANDS:
            status, out, err = cli(*argv, "-q", "--tls-keylog", str(keyfile), str(pcap))
            assert status == 0, (argv, err)
            text = out + err
            assert not [s for s in secrets if s in text], argv
        # parquet too
        out_file = tmp_path / "r.parquet"
        status, _o, _e = cli("records", "-q", "-F", "parquet", "-o", str(out_file), "--tls-keylog", str(keyfile),
                             str(pcap))
        assert status == 0
        raw = out_file.read_bytes()
        assert not [s for s in secrets if s.encode() in raw]


def test_console_script_exit_status() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("SSLKEYLOGFILE", None)
    proc = subprocess.run([sys.executable, "-m", "kwinspect", "summary", "-q", str(KEYED[-1])],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0 and "TLS, not decoded" in proc.stdout


def test_key_updates_from_a_real_tls_stack(tmp_path) -> None:
    """openssl s_client sent ApiVersions with correlation ids 1, 2, 3, the second after a
    KeyUpdate both sides answered, the third after one from the client alone
    (rig/tls_scenarios.py, the manifest's client config says what went on stdin)."""
    pcap = CAPTURES / "tansu-openssl-keyupdate.pcap"
    keys = pcap.with_suffix(".keys")
    manifest = json.loads(pcap.with_suffix(".manifest.json").read_text())
    assert "'K'" in manifest["clients"][0]["config"]["stdin"]
    want = [(18, 0, 1, "paired"), (18, 0, 2, "paired"), (18, 0, 3, "paired")]
    got = [(e["api_key"], e["api_version"], e["correlation_id"], e["status"])
           for e in jsonl("exchanges", "--tls-keylog", str(keys), str(pcap))]
    assert got == want
    # OpenSSL also logs each updated secret (…_TRAFFIC_SECRET_N); the keys after an update
    # are derived from the *_TRAFFIC_SECRET_0 lines alone, as RFC 8446 7.2 says.
    only_first = tmp_path / "first.keys"
    only_first.write_text("".join(line for line in keys.read_text().splitlines(keepends=True)
                                  if "_TRAFFIC_SECRET_N " not in line))
    assert "_N " not in only_first.read_text() and "SECRET_0 " in only_first.read_text()
    got = [(e["api_key"], e["api_version"], e["correlation_id"], e["status"])
           for e in jsonl("exchanges", "--tls-keylog", str(only_first), str(pcap))]
    assert got == want
    assert jsonl("exchanges", str(pcap)) == []
