"""`kwinspect sanitize` on every shipped and public capture, judged as the issue judges it.

Oracles: tshark (the system's and, when its chroot is there, 4.6.9 through
tshark-new.sh, fed on stdin) and `kwinspect exchanges` / `records` of the original file find
the same requests (api key, version, correlation id) in the sanitized file;
records per partition are unchanged (topics translated through the --mapping
file); the report adds up; and nothing the scenario manifests say the clients
sent (record keys, values, header values, client ids, SASL passwords, topic
and group names) nor the original addresses appear in the sanitized file's
bytes or in its records after decompression, and no original client port is a
client port of the sanitized file.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PUBLIC = ROOT.parent / "shared" / "captures-public"
CAPTURES = sorted((ROOT / "captures").glob("*.pcap")) + sorted(PUBLIC.glob("*.pcap*"))
TSHARK = shutil.which("tshark")
TSHARK_NEW = Path("/work/shared/tools/tshark-new.sh")
TSHARK_NEW_READY = Path(os.environ.get("TSHARK_CHROOT", Path.home() / ".cache/tshark-trixie"), "usr/bin/tshark")
SECRET = "test-secret"
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def kwinspect(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kwinspect", *args], capture_output=True, text=True,
                          timeout=600, env=ENV, cwd=ROOT)


_ROWS: dict[tuple, list[dict]] = {}


def rows(table: str, path: Path, *extra: str) -> list[dict]:
    """`kwinspect TABLE -F jsonl` of a file, run once per file and arguments (each test
    of a capture asks for its original's tables again: a process each cost minutes)."""
    key = (table, str(path), extra)
    if key not in _ROWS:
        proc = kwinspect(table, "-F", "jsonl", *extra, str(path))
        assert proc.returncode == 0, proc.stderr
        _ROWS[key] = [json.loads(line) for line in proc.stdout.splitlines()]
    return _ROWS[key]


@pytest.fixture(scope="module")
def sanitized(tmp_path_factory):
    """capture -> (sanitized file, report, mapping), made once per capture."""
    made = {}

    def make(path: Path):
        if path not in made:
            out = tmp_path_factory.mktemp("san") / (path.stem + ".pcapng")
            report, mapping = out.with_suffix(".report.json"), out.with_suffix(".map.json")
            proc = kwinspect("sanitize", str(path), "-o", str(out), "--secret", SECRET,
                             "--report", str(report), "--mapping", str(mapping))
            assert proc.returncode == 0, proc.stderr
            made[path] = (out, json.loads(report.read_text()), json.loads(mapping.read_text()), proc.stdout)
        return made[path]

    return make


def decrypted_streams(path: Path) -> set[str]:
    """Connections kwinspect decrypts with secrets inside the file: sanitize leaves TLS out."""
    return {e["stream"] for e in rows("errors", path) if e["kind"] == "tls_decrypted"}


def requests_of(exchanges: list[dict], leave_out: set[str] = frozenset()) -> Counter:
    # a response whose request is not in the capture: its correlation id is all that is
    # known for sure (kwinspect may guess the api from the body, which sanitize blanks)
    return Counter((None, None, r["correlation_id"], r["status"]) if r["status"] == "request_missing"
                   else (r["api_key"], r["api_version"], r["correlation_id"], r["status"])
                   for r in exchanges if r["stream"] not in leave_out)


def undecodable_sides(path: Path) -> list[tuple[dict, str]]:
    """(exchange, "request"|"response") whose message the decoder could not read: sanitize
    drops such frames (--undecodable drop), so the other side is left unanswered/unasked."""
    proc = kwinspect("decode", str(path))
    assert proc.returncode == 0, proc.stderr
    decoded = [json.loads(line) for line in proc.stdout.splitlines()]
    return [(d, side) for d in decoded for side in ("request", "response")
            if any(i.get("kind") == "decode_error" for i in (d.get(side) or {}).get("issues", []))]


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: p.name)
def test_kwinspect_finds_the_same_requests(path, sanitized):
    out, report, _mapping, _text = sanitized(path)
    leave_out = decrypted_streams(path)
    original = requests_of(rows("exchanges", path), leave_out)
    dropped = [(d, side) for d, side in undecodable_sides(path) if d["stream"] not in leave_out]
    for d, side in dropped:  # what the sanitized file must show instead
        original[(d["api_key"], d["api_version"], d["correlation_id"], d["status"])] -= 1
        original[(d["api_key"], d["api_version"], d["correlation_id"], "response_missing") if side == "response"
                 else (None, None, d["correlation_id"], "request_missing")] += 1
    assert report.get("frames", {}).get("undecodable_dropped", 0) == len(dropped)
    assert requests_of(rows("exchanges", out)) == original  # Counter: a count of 0 equals no entry


def tshark_requests(tshark: list[str], path: Path, ports: set[str]) -> Counter:
    # the capture goes in on stdin: tshark-new.sh bind-mounts the folder of a file argument
    # into its chroot and keeps a mount it finds, so a folder deleted and made again at the
    # same path (a fresh checkout) stays hidden behind the old mount ("file doesn't exist")
    cmd = [*tshark, "-r", "-", "-T", "fields", "-E", "separator=|", "-e", "kafka.request_key",
           "-e", "kafka.api_version", "-e", "kafka.correlation_id"]
    for port in sorted(ports):
        cmd += ["-d", f"tcp.port=={port},kafka"]
    with path.open("rb") as capture:
        proc = subprocess.run(cmd, stdin=capture, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    found = Counter()
    for line in proc.stdout.splitlines():
        keys, versions, cids = line.split("|")
        for key, version, cid in zip(keys.split(","), versions.split(","), cids.split(","), strict=False):
            # raw SASL tokens (after SaslHandshake v0) are no Kafka messages, but tshark reads
            # their first bytes as a header: the password's letters in the original, 0xFF in
            # the sanitized file (the token is blanked); they are not requests to compare
            if key and 0 <= int(key) < 1000:
                found[(int(key), int(version), int(cid))] += 1
    return found


TSHARKS = [pytest.param([TSHARK], id="tshark", marks=pytest.mark.skipif(TSHARK is None, reason="no tshark")),
           pytest.param(["bash", str(TSHARK_NEW)], id="tshark-4.6",
                        marks=pytest.mark.skipif(not TSHARK_NEW_READY.exists(),
                                                 reason="tshark 4.6 chroot not built (tshark-new.sh)"))]


@pytest.mark.parametrize("tshark", TSHARKS)
@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: p.name)
def test_tshark_finds_the_same_requests(path, tshark, sanitized):
    out, _report, _mapping, _text = sanitized(path)
    exchanges = rows("exchanges", path)
    ports = {r["broker"].rsplit(":", 1)[1] for r in exchanges}
    if not ports or decrypted_streams(path):
        pytest.skip("no plaintext Kafka for tshark to find")
    original = tshark_requests(tshark, path, ports)
    assert original, "tshark finds nothing in the original: the comparison would prove nothing"
    assert tshark_requests(tshark, out, ports) == original


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: p.name)
def test_records_per_partition_are_unchanged(path, sanitized):
    out, _report, mapping, _text = sanitized(path)
    topics = mapping.get("topic", {})
    leave_out = decrypted_streams(path)
    want = Counter((topics.get(r["topic"], r["topic"]), r["partition"]) for r in rows("records", path)
                   if r["stream"] not in leave_out)
    assert Counter((r["topic"], r["partition"]) for r in rows("records", out)) == want


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: p.name)
def test_the_report_adds_up(path, sanitized):
    _out, report, _mapping, text = sanitized(path)
    frames, packets = Counter(report["frames"]), Counter(report["packets"])
    assert frames["requests"] + frames["responses"] == (
        frames["sanitized"] + frames["undecodable_dropped"] + frames["undecodable_zeroed"]
        + frames["sasl_tokens_blanked"] + frames["responses_without_request_blanked"])
    assert packets["read"] == (packets["kafka"] + packets["dropped_unsafe_connection"] + packets["dropped_tls"]
                               + packets["dropped_other"] + packets["kept_other"])
    assert packets["written"] >= packets["kafka"] + packets["kept_other"]
    # the text on stdout says the same numbers
    for kind, n in report["replaced"].items():
        assert f"{kind} " in text and f"{n:,}" in text
    # every record value kwinspect reads in the original was replaced (some more were:
    # fetched records below the fetch offset, which `records` leaves out as consumers do)
    leave_out = decrypted_streams(path)
    values = sum(1 for r in rows("records", path)
                 if r.get("value") and r["stream"] not in leave_out and r.get("control_type") is None)
    assert report["replaced"].get("record_value", 0) >= values


# --------------------------------------------------------------------------- what must not be there


def _manifest(path: Path) -> dict | None:
    m = path.with_suffix(".manifest.json")
    return json.loads(m.read_text()) if m.is_file() else None


def _bytes_of(value: str | None, encoding: str | None) -> bytes | None:
    if value is None:
        return None
    return base64.b64decode(value) if encoding == "base64" else value.encode()


def _walk(x, key=""):
    if isinstance(x, dict):
        for k, v in x.items():
            yield from _walk(v, k)
    elif isinstance(x, list):
        for v in x:
            yield from _walk(v, key)
    else:
        yield key, x


def secrets_of(manifest: dict) -> dict[str, set[bytes]]:
    """What the clients say they sent, that must not be in the sanitized file."""
    out: dict[str, set[bytes]] = {"record data": set(), "client id": set(), "password": set(),
                                  "topic": set(), "group": set(), "address": set()}
    for rec in manifest.get("produced", []) + manifest.get("consumed", []):
        for value, enc in ((rec.get("key"), rec.get("key_encoding")), (rec.get("value"), rec.get("value_encoding"))):
            if (data := _bytes_of(value, enc)) and len(data) >= 6:
                out["record data"].add(data)
        for h in rec.get("headers") or []:
            if (data := _bytes_of(h.get("value"), h.get("value_encoding"))) and len(data) >= 6:
                out["record data"].add(data)
    for key, value in _walk(manifest):
        if not isinstance(value, str) or len(value) < 4:
            continue
        if key in ("client_id", "client.id"):
            out["client id"].add(value.encode())
        elif key in ("sasl.password", "password"):
            out["password"].add(value.encode())
    out["topic"] = {t["name"].encode() for t in manifest.get("topics", []) if not t["name"].startswith("__")}
    out["group"] = {g.encode() for g in manifest.get("group_ids", []) if len(g) >= 4}
    return out


def addresses(exchanges: list[dict]) -> set[bytes]:
    found = set()
    for r in exchanges:
        for ep in (r["client"], r["broker"]):
            ip = ep.rsplit(":", 1)[0].strip("[]")
            found.add(ip.encode())  # as text (host fields) ...
            packed = ipaddress.ip_address(ip).packed
            if len(packed) == 4:  # ... and as IPv4 header bytes (16 bytes of ::1 are mostly zeros)
                found.add(packed)
    return found


def decompressed_record_data(path: Path) -> bytes:
    """Every key, value and header value of the sanitized file, after decompression."""
    parts = []
    for r in rows("records", path, "--values", "base64"):
        for v in (r.get("key"), r.get("value")):
            if v:
                parts.append(base64.b64decode(v))
        for h in r.get("headers") or []:
            if h.get("value"):
                parts.append(base64.b64decode(h["value"]))
    return b"\n".join(parts)


WITH_MANIFESTS = [p for p in CAPTURES if p.with_suffix(".manifest.json").is_file()]


@pytest.mark.parametrize("path", WITH_MANIFESTS, ids=lambda p: p.name)
def test_nothing_identifying_is_left(path, sanitized):
    out, _report, _mapping, _text = sanitized(path)
    manifest = _manifest(path)
    forbidden = secrets_of(manifest)
    exchanges = rows("exchanges", path)
    forbidden["address"] = addresses(exchanges)
    raw = out.read_bytes()
    inside = decompressed_record_data(out)
    left = {kind: sorted(s for s in values if s in raw or s in inside) for kind, values in forbidden.items()}
    assert {k: v for k, v in left.items() if v} == {}
    # client (ephemeral) ports: two bytes, which a byte search would find anywhere, so the
    # decoded port fields are compared; broker ports are kept (they tell Wireshark it is Kafka)
    def client_ports(rs: list[dict]) -> set[int]:
        return {int(r["client"].rsplit(":", 1)[1]) for r in rs}

    assert not client_ports(exchanges) & client_ports(rows("exchanges", out))
    # the check can fail: the originals are there to be found
    original = path.read_bytes() + decompressed_record_data(path)
    if exchanges and not decrypted_streams(path):
        assert any(s in original for s in forbidden["client id"] | forbidden["record data"]), \
            "the manifest names nothing the original holds: this capture proves nothing"
