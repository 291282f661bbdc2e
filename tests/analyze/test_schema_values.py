"""Schema Registry keys and values, decoded: `records --schemas DIR|FILE` and
`--schema-registry URL` on the shipped capture of confluent-kafka's own serializers
(captures/confluent-mock-schemas.*), whose manifest holds the values the serializers
were given: the oracle.  Run as a user runs it (a subprocess)."""

from __future__ import annotations

import base64
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from rig.manifest import Manifest
from tests.helpers.schema_oracle import schema_problems

pytest.importorskip("fastavro")
pytest.importorskip("google.protobuf")

ROOT = Path(__file__).resolve().parents[2]
CAPTURES = ROOT / "captures"
NAME = "confluent-mock-schemas"
PCAP = str(CAPTURES / f"{NAME}.pcap")
FOLDER = str(CAPTURES / f"{NAME}.schemas")
EXPORT = str(CAPTURES / f"{NAME}.registry.json")
MANIFEST = Manifest.read(CAPTURES / f"{NAME}.manifest.json")
GOOD = [t for t in MANIFEST.schema_values if "problem" not in t]
BAD = [t for t in MANIFEST.schema_values if "problem" in t]


def kwinspect(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    return subprocess.run([sys.executable, "-m", "kwinspect.cli", *args], capture_output=True,
                          env=full_env, timeout=300)


def records(*args: str, env: dict | None = None) -> list[dict]:
    proc = kwinspect("records", "-q", PCAP, "-F", "jsonl", *args, env=env)
    assert proc.returncode == 0, proc.stderr.decode()
    assert b"Traceback" not in proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


def check_against_oracle(rows: list[dict], raw: str = "auto") -> None:
    assert len(GOOD) == 27 and len(BAD) == 4
    problems = schema_problems(rows, MANIFEST.schema_values, raw)
    assert not problems, "\n".join(problems[:10])


@pytest.mark.parametrize("source", [FOLDER, EXPORT], ids=["folder", "export"])
def test_records_show_what_the_serializers_were_given(source):
    check_against_oracle(records("--schemas", source))


@pytest.mark.parametrize("mode", ["hex", "base64", "utf8"])
def test_every_values_mode_decodes_the_same(mode):
    """Decoding starts from the rendered key/value: each --values rendering gives the
    same decoded rows (utf8 escapes undecodable bytes as \\xNN)."""
    check_against_oracle(records("--schemas", FOLDER, "--values", mode), raw=mode)


def test_without_schemas_the_new_columns_are_null_and_values_raw():
    for r in records():
        assert r["key_schema_id"] is None and r["value_schema_id"] is None
        assert r["value_format"] is None
        assert r["value_encoding"] in (None, "utf8", "base64")


@pytest.mark.parametrize("expr, want", [
    ("value.order_id == 7", lambda t: t["value"]["order_id"] == 7),
    ("value.order_id >= 200", lambda t: t["value"]["order_id"] >= 200),
    ('key.customer == "bob"', lambda t: t["key_format"] == "avro" and t["key"]["customer"] == "bob"),
    ('value.customer.name == "carol" and value.amount > 4',
     lambda t: t["value"]["customer"]["name"] == "carol" and t["value"]["amount"] > 4),
    ("value.paid", lambda t: bool(t["value"].get("paid"))),
    ("value.note == null", lambda t: t["value"].get("note") is None),
])
def test_filter_on_decoded_fields_selects_exactly_the_matching_records(expr, want):
    rows = records("--schemas", FOLDER, "-f", expr)
    expected = {(t["topic"], t["offset"]) for t in GOOD if want(t)}
    if expr == "value.note == null":  # records that are not decoded have no note either
        expected |= {(t["topic"], t["offset"]) for t in BAD}
    assert expected
    assert {(r["topic"], r["offset"]) for r in rows} == expected
    assert len(rows) == 2 * len(expected)  # produced and fetched


@pytest.mark.parametrize("args, words", [
    (["--schemas", FOLDER, "-f", "value.order_idd == 7"],
     ["unknown column 'value.order_idd'", "did you mean value.order_id?"]),
    (["--schemas", FOLDER, "-f", 'value.order_id == "7"'],
     ["column 'value.order_id' holds numbers"]),
    (["-f", "value.order_id == 7"], ["unknown column 'value.order_id'", "--schemas"]),
    (["--schemas", "/nonexistent/schemas"], ["no such folder or file"]),
    (["--schemas", FOLDER, "--schema-registry", "http://127.0.0.1:9"], ["not both"]),
    (["--schema-registry", "ftp://x"], ["http://"]),
])
def test_filter_and_source_usage_errors(args, words):
    proc = kwinspect("records", "-q", PCAP, "-F", "jsonl", *args)
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert "Traceback" not in err
    for w in words:
        assert w in err, err


def test_problems_are_error_rows_never_a_crash():
    proc = kwinspect("errors", "-q", "--records", PCAP, "--schemas", EXPORT, "-F", "jsonl")
    assert proc.returncode == 0, proc.stderr.decode()
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    schema_rows = [r for r in rows if r["kind"].startswith("schema_")]
    found = {(r["path"].split(".", 1)[0], r["kind"], r["path"].split("@")[1]) for r in schema_rows}
    for truth in BAD:
        for direction in ("produce", "fetch"):
            assert (direction, truth["problem"], f"{truth['offset']}.value") in found, found
    assert len(schema_rows) == 2 * len(BAD)
    messages = " ".join(r["message"] for r in schema_rows)
    assert "schema id 999" in messages and "truncated" in messages
    assert "'seven' is not of type 'integer'" in messages
    # the records command says how many were left raw
    proc = kwinspect("records", "-q", PCAP, "--schemas", EXPORT, "-F", "jsonl")
    assert "8 key/values not decoded with a schema" in proc.stderr.decode()


def test_proto_text_schemas_and_imports_from_the_folder(tmp_path):
    """A registry's GET answers Protobuf schemas as .proto text: compiled with protoc,
    the import found by its file name in the folder."""
    from rig.schema_scenarios import CUSTOMER_PROTO, ORDER_PROTO

    proto_ids = {t["value_schema_id"] for t in GOOD if t["value_format"] == "protobuf"}
    for f in os.listdir(FOLDER):
        if not f.endswith(".proto"):
            shutil.copy(os.path.join(FOLDER, f), tmp_path / f)
    for schema_id in proto_ids:
        (tmp_path / f"{schema_id}.proto").write_text(ORDER_PROTO)
    (tmp_path / "customer.proto").write_text(CUSTOMER_PROTO)
    check_against_oracle(records("--schemas", str(tmp_path)))


class Registry(http.server.BaseHTTPRequestHandler):
    """The documented REST paths of a Schema Registry, served from the export."""

    export: list[dict] = []
    auth = "reader:s3cret"
    hits: list[str] = []

    def do_GET(self):  # noqa: N802
        self.hits.append(self.path)
        want = "Basic " + base64.b64encode(self.auth.encode()).decode()
        if self.headers.get("Authorization") != want:
            return self._send(401, {"error_code": 401, "message": "Unauthorized"})
        parts = self.path.strip("/").split("/")
        if parts[:2] == ["schemas", "ids"]:
            for s in self.export:
                if str(s["id"]) == parts[2]:
                    body = {"schema": s["schema"], "references": s["references"]}
                    if s["schemaType"] != "AVRO":
                        body["schemaType"] = s["schemaType"]
                    return self._send(200, body)
            return self._send(404, {"error_code": 40403, "message": "Schema not found"})
        if parts[0] == "subjects" and len(parts) == 4:
            for s in self.export:
                if s["subject"] == parts[1] and str(s["version"]) == parts[3]:
                    return self._send(200, s)
        return self._send(404, {"error_code": 40401, "message": "Subject not found"})

    def _send(self, code, obj):
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_schema_registry_over_rest_with_auth_then_offline_from_the_cache(tmp_path):
    Registry.export = json.loads(Path(EXPORT).read_text())
    Registry.hits = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Registry)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    cache = tmp_path / "cache"
    try:
        # without credentials: every value stays raw, the 401 is the records' problem
        proc = kwinspect("records", "-q", PCAP, "-F", "jsonl", "--schema-registry", url,
                         "--schema-cache", str(tmp_path / "nocache"))
        assert proc.returncode == 0 and b"HTTP 401" not in proc.stdout
        assert all(json.loads(x)["value_format"] is None for x in proc.stdout.splitlines())
        rows = records("--schema-registry", url, "--schema-cache", str(cache),
                       env={"KWINSPECT_SCHEMA_REGISTRY_AUTH": Registry.auth})
        check_against_oracle(rows)
        assert any(h.startswith("/subjects/") for h in Registry.hits)  # references fetched
    finally:
        server.shutdown()
        server.server_close()
    # the server is gone: the second run reads the cache only
    again = records("--schema-registry", url, "--schema-cache", str(cache))
    assert again == rows
    for f in cache.iterdir():
        assert "s3cret" not in f.read_text()


def test_the_oracle_check_catches_a_wrong_decode():
    rows = records("--schemas", EXPORT)
    assert not schema_problems(rows, MANIFEST.schema_values)
    broken = [dict(r) for r in rows]
    target = next(r for r in broken if r["value_format"] == "protobuf")
    target["value"] = target["value"].replace('"order_id":1', '"order_id":9', 1)
    assert schema_problems(broken, MANIFEST.schema_values)
    raw = records()  # without schemas nothing is decoded: every framed record differs
    assert len(schema_problems(raw, MANIFEST.schema_values)) >= 2 * len(GOOD)


def test_only_the_records_written_are_decoded():
    """A filter on columns decoding does not change runs first: the problems line
    counts only the records written (offset 9: the unknown id and the JSON its schema
    rejects, produced and fetched), and those written are decoded as always."""
    for jobs in ("1", "2"):
        proc = kwinspect("records", "-q", PCAP, "-F", "jsonl", "-j", jobs, "--schemas", FOLDER,
                         "-f", "offset >= 8 and offset <= 9")
        assert proc.returncode == 0, proc.stderr.decode()
        rows = [json.loads(line) for line in proc.stdout.splitlines()]
        assert {r["offset"] for r in rows} == {8, 9}
        subset = [t for t in MANIFEST.schema_values if t["offset"] in (8, 9)]
        assert not schema_problems(rows, subset)
        assert "4 key/values not decoded with a schema (2 schema_unknown, 2 schema_mismatch)" \
            in proc.stderr.decode()
