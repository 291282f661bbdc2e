"""`kwinspect sanitize` flags, as the user sees them: files written, report, exit status."""

from __future__ import annotations

import base64
import json
import struct
import subprocess
import sys
from collections import Counter
from pathlib import Path

from helpers.pcapgen import conversation, write_pcap

from tests.sanitize.test_sanitize_captures import ENV, rows

ROOT = Path(__file__).resolve().parents[2]
CAPTURE = ROOT / "captures" / "tansu-produce-consume.pcap"


def sanitize(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kwinspect", "sanitize", *args], capture_output=True,
                          text=True, env=ENV, timeout=300)


def test_the_secret_decides_the_pseudonyms(tmp_path):
    outs = {}
    for name, extra in (("a1", ["--secret", "a"]), ("a2", ["--secret", "a"]), ("b", ["--secret", "b"]),
                        ("r1", []), ("r2", [])):
        out = tmp_path / f"{name}.pcap"
        assert sanitize(str(CAPTURE), "-o", str(out), *extra).returncode == 0
        outs[name] = out.read_bytes()
    assert outs["a1"] == outs["a2"]
    assert outs["a1"] != outs["b"]
    assert outs["r1"] != outs["r2"]  # no secret: a random one per run


def _values(path: Path) -> list[tuple]:
    return [(r["topic"], r["partition"], r["offset"], r["key"], r["value"])
            for r in rows("records", path, "--values", "base64")]


def test_keep_topics_and_values(tmp_path):
    out = tmp_path / "kept.pcap"
    assert sanitize(str(CAPTURE), "-o", str(out), "--keep-topics", "--values", "keep").returncode == 0
    assert _values(out) == _values(CAPTURE)


def test_values_truncated_keep_their_first_bytes(tmp_path):
    out = tmp_path / "cut.pcap"
    assert sanitize(str(CAPTURE), "-o", str(out), "--keep-topics", "--values", "truncate:3").returncode == 0
    got, want = _values(out), _values(CAPTURE)
    assert len(got) == len(want) > 0

    def cut(b64):
        return None if b64 is None else base64.b64encode(base64.b64decode(b64)[:3]).decode()

    assert got == [(t, p, o, cut(k), cut(v)) for t, p, o, k, v in want]


def test_hashed_values_keep_their_length_and_equality(tmp_path):
    out = tmp_path / "hashed.pcap"
    assert sanitize(str(CAPTURE), "-o", str(out), "--keep-topics").returncode == 0
    got, want = _values(out), _values(CAPTURE)
    assert [(t, p, o) for t, p, o, _k, _v in got] == [(t, p, o) for t, p, o, _k, _v in want]
    pairs = {}
    for (_t, _p, _o, _k, v_new), (_t2, _p2, _o2, _k2, v_old) in zip(got, want, strict=True):
        if v_old is None:
            assert v_new is None
            continue
        old, new = base64.b64decode(v_old), base64.b64decode(v_new)
        assert len(new) == len(old) and (new != old or not old)  # empty stays empty
        assert pairs.setdefault(old, new) == new  # same input, same output (fetched = produced)
    assert len(pairs) > 10


def test_other_packets_are_dropped_unless_asked(tmp_path):
    capture = ROOT / "captures" / "confluent-mock-broker-down.pcap"
    for extra, kept in (([], False), (["--keep-other"], True)):
        out, report = tmp_path / "o.pcap", tmp_path / "r.json"
        assert sanitize(str(capture), "-o", str(out), "--report", str(report), *extra).returncode == 0
        packets = json.loads(report.read_text())["packets"]
        if kept:
            assert packets["kept_other"] > 0 and packets["written"] == packets["read"]
        else:
            assert packets["dropped_other"] > 0 and packets["written"] == packets["read"] - packets["dropped_other"]


# --------------------------------------------------------------------------- undecodable frames


def _str16(s: bytes) -> bytes:
    return struct.pack(">h", len(s)) + s


def _frame(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


def _api_versions_v3_request(cid: int, software: bytes) -> bytes:
    # header v2: key, version, correlation id, client id (int16 string), no tags; body: two
    # compact strings and no tags
    return (struct.pack(">hhi", 18, 3, cid) + _str16(b"secret-client") + b"\0"
            + bytes([len(software) + 1]) + software + b"\x021\0")


def _api_versions_v3_response(cid: int) -> bytes:
    # header v0; error 0, one api (18, v0-v3), throttle 0, no tags
    return struct.pack(">ih", cid, 0) + b"\x02" + struct.pack(">hhh", 18, 0, 3) + b"\0" + struct.pack(">i", 0) + b"\0"


def test_undecodable_frames_are_dropped_or_zeroed_never_copied(tmp_path):
    good = _api_versions_v3_request(1, b"kwinspect-test")
    # a compact string that claims more bytes than there are: the body does not decode
    bad = _api_versions_v3_request(2, b"SECRET-GARBAGE")[:-16] + b"\x7fSECRET-GARBAGE"
    messages = [("c", _frame(good)), ("s", _frame(_api_versions_v3_response(1))),
                ("c", _frame(bad)), ("s", _frame(_api_versions_v3_response(2)))]
    capture = tmp_path / "in.pcap"
    write_pcap(capture, conversation(("10.1.2.3", 40000), ("10.1.2.4", 9092), messages))
    assert b"SECRET-GARBAGE" in capture.read_bytes()
    for mode in ("drop", "zero"):
        out, report = tmp_path / f"{mode}.pcap", tmp_path / f"{mode}.json"
        proc = sanitize(str(capture), "-o", str(out), "--report", str(report), "--undecodable", mode)
        assert proc.returncode == 0, proc.stderr
        frames = json.loads(report.read_text())["frames"]
        assert frames[f"undecodable_{'dropped' if mode == 'drop' else 'zeroed'}"] == 1
        assert frames["sanitized"] == 3
        data = out.read_bytes()
        assert b"SECRET-GARBAGE" not in data and b"secret-client" not in data and b"10.1.2.3" not in data
        statuses = sorted((r["correlation_id"], r["status"]) for r in rows("exchanges", out))
        if mode == "drop":  # the request is gone: its answer is one without a request
            assert statuses == [(1, "paired"), (2, "request_missing")]


def test_usage_errors_are_one_line_and_status_2(tmp_path):
    for args, message in (([str(CAPTURE), "-o", str(tmp_path / "x.pcap"), "--values", "nope"], "--values"),
                          ([str(CAPTURE), "-o", str(CAPTURE)], "one of the inputs")):
        proc = sanitize(*args)
        assert proc.returncode == 2 and message in proc.stderr and len(proc.stderr.splitlines()) == 1, proc.stderr
    proc = sanitize(str(tmp_path / "missing.pcap"), "-o", str(tmp_path / "x.pcap"))
    assert proc.returncode == 1 and len(proc.stderr.splitlines()) == 1, proc.stderr


def _summary(path: Path) -> dict:
    proc = subprocess.run([sys.executable, "-m", "kwinspect", "summary", "-F", "json", str(path)],
                          capture_output=True, text=True, env=ENV, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_summary_tells_the_same_story(tmp_path):
    """`summary` of the original is the oracle: the same api mix, versions, errors, statuses,
    record counts and client libraries (library names are not pseudonymized)."""
    for name in ("tansu-produce-consume.pcap", "confluent-mock-transactions.pcap", "kafka-python-mock-group.pcap"):
        capture = ROOT / "captures" / name
        out = tmp_path / name
        assert sanitize(str(capture), "-o", str(out)).returncode == 0
        before, after = _summary(capture), _summary(out)
        for section in ("apis", "kafka_errors", "statuses", "exchanges"):
            assert after[section] == before[section], (name, section)
        assert Counter(c["library"] for c in after["clients"]) == Counter(c["library"] for c in before["clients"])
        assert not {c["client_id"] for c in after["clients"]} & {c["client_id"] for c in before["clients"]}


def test_tls_connections_are_left_out_even_with_keep_other(tmp_path):
    capture = ROOT / "captures" / "tansu-tls-proxy.pcap"  # TLS to a proxy, plaintext Kafka behind it
    out, report = tmp_path / "o.pcap", tmp_path / "r.json"
    assert sanitize(str(capture), "-o", str(out), "--report", str(report), "--keep-other").returncode == 0
    packets = json.loads(report.read_text())["packets"]
    assert packets["dropped_tls"] > 0 and packets["kafka"] > 0
    assert packets["written"] == packets["read"] - packets["dropped_tls"]


def test_the_secret_from_a_file_or_the_environment_never_in_any_output(tmp_path):
    secret = "Kw1nspect-s3cret-value"
    secret_file = tmp_path / "secret"
    secret_file.write_text(secret + "\n")
    outputs = {}
    for name, extra, env in (("flag", ["--secret", secret], ENV), ("file", ["--secret-file", str(secret_file)], ENV),
                             ("env", [], {**ENV, "KWINSPECT_SANITIZE_SECRET": secret}),
                             ("other", ["--secret", "another"], ENV)):
        out, report, mapping = tmp_path / f"{name}.pcapng", tmp_path / f"{name}.json", tmp_path / f"{name}.map"
        proc = subprocess.run([sys.executable, "-m", "kwinspect", "sanitize", str(CAPTURE), "-o", str(out),
                               "--report", str(report), "--mapping", str(mapping), *extra],
                              capture_output=True, env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr
        outputs[name] = out.read_bytes()
        for data in (outputs[name], report.read_bytes(), mapping.read_bytes(), proc.stdout, proc.stderr):
            assert secret.encode() not in data
    # the same secret, however given, gives the same file; another gives another
    assert outputs["flag"] == outputs["file"] == outputs["env"] != outputs["other"]


def test_secret_usage_errors_name_the_file_not_its_content(tmp_path):
    secret_file = tmp_path / "secret"
    secret_file.write_text("Kw1nspect-s3cret-value\n")
    out = str(tmp_path / "x.pcap")
    proc = sanitize(str(CAPTURE), "-o", out, "--secret", "a", "--secret-file", str(secret_file))
    assert proc.returncode == 2 and "--secret-file" in proc.stderr and len(proc.stderr.splitlines()) == 1
    secret_file.write_bytes(b"\xff\xfeKw1nspect-s3cret-value\n")  # not text
    for path in (secret_file, tmp_path / "missing"):
        proc = sanitize(str(CAPTURE), "-o", out, "--secret-file", str(path))
        assert proc.returncode == 2 and str(path) in proc.stderr and "s3cret" not in proc.stderr, proc.stderr
    (tmp_path / "empty").write_text("\n")
    proc = sanitize(str(CAPTURE), "-o", out, "--secret-file", str(tmp_path / "empty"))
    assert proc.returncode == 2 and "empty" in proc.stderr
