"""The Confluent wire format against confluent-kafka's own serializers (in-process
mock:// registry), and hostile payloads: cut, flipped and random bytes with real schema
ids give an issue, never an exception."""

from __future__ import annotations

import base64
import json
import random
import shutil
import tempfile

import pytest

from kwinspect.analyze.schema_source import ExportSchemas
from kwinspect.analyze.schema_values import SchemaValues, read_message_indexes, split_wire_format
from kwinspect.model import RecordRow

pytest.importorskip("fastavro")
pytest.importorskip("confluent_kafka.schema_registry")


def _row(value: bytes) -> RecordRow:
    text, enc = (value.decode(), "utf8") if _utf8(value) else (
        base64.b64encode(value).decode(), "base64")
    return RecordRow("produce", "t", 0, 5, None, None, None, None, text, enc, [], "none", 2,
                     True, None, None, None, False, False, None, 1, "s")


def _utf8(b: bytes) -> bool:
    try:
        b.decode()
        return True
    except UnicodeDecodeError:
        return False


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    """Values serialized by confluent-kafka, and the registry as an export file."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.schema_registry.json_schema import JSONSerializer
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from rig.schema_scenarios import CUSTOMER_AVSC, ORDER_JSON_SCHEMA, _proto_classes

    sr = SchemaRegistryClient.new_client({"url": "mock://wire-format-test"})
    tmp = tempfile.mkdtemp()
    try:
        order_pb2, _customer_pb2 = _proto_classes(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    ctx = SerializationContext("t", MessageField.VALUE)
    line = order_pb2.Order.Line(sku="x-1", qty=3)  # a nested message: index list [0, 0]
    values = {
        "avro": (AvroSerializer(sr, json.dumps(CUSTOMER_AVSC))({"name": "n", "tier": "GOLD"},
                                                              SerializationContext("a", MessageField.VALUE)),
                 {"name": "n", "tier": "GOLD"}),
        "proto-nested": (ProtobufSerializer(order_pb2.Order.Line, sr,
                                            {"use.deprecated.format": False})(line, ctx),
                         {"sku": "x-1", "qty": 3}),
        "json": (JSONSerializer(json.dumps(ORDER_JSON_SCHEMA), sr)(
            {"order_id": 1, "amount": 2.5}, SerializationContext("j", MessageField.VALUE)),
            {"order_id": 1, "amount": 2.5}),
    }
    export = []
    for subject in sr.get_subjects():
        for version in sr.get_versions(subject):
            reg = sr.get_version(subject, version)
            export.append({"subject": subject, "version": version, "id": reg.schema_id,
                           "schemaType": reg.schema.schema_type or "AVRO",
                           "schema": reg.schema.schema_str,
                           "references": [{"name": r.name, "subject": r.subject,
                                           "version": r.version}
                                          for r in reg.schema.references or ()]})
    path = tmp_path_factory.mktemp("registry") / "export.json"
    path.write_text(json.dumps(export))
    return values, str(path)


def test_nested_protobuf_message_index_from_the_serializer(registry):
    values, export = registry
    framed, _oracle = values["proto-nested"]
    schema_id, payload = split_wire_format(framed)
    assert read_message_indexes(payload)[0] == [0, 0]  # Order.Line: first message, first nested


@pytest.mark.parametrize("name", ["avro", "proto-nested", "json"])
def test_serializer_bytes_decode_to_what_they_were_given(registry, name):
    values, export = registry
    framed, oracle = values[name]
    row = _row(framed)
    issues: list = []
    [out] = SchemaValues(ExportSchemas(export)).apply([row], issues)
    assert issues == []
    assert json.loads(out.value) == oracle
    assert out.value_schema_id == int.from_bytes(framed[1:5], "big")


def test_hostile_payloads_give_issues_never_exceptions(registry):
    values, export = registry
    sv = SchemaValues(ExportSchemas(export))
    rnd = random.Random(2611)
    seen_kinds = set()
    for framed, _oracle in values.values():
        variants = [framed[:n] for n in range(len(framed))]
        for _ in range(300):
            b = bytearray(framed)
            for _k in range(rnd.randint(1, 4)):
                b[rnd.randrange(5, len(b))] = rnd.randrange(256)
            variants.append(bytes(b))
            variants.append(framed[:5] + rnd.randbytes(rnd.randint(0, 40)))
        variants.append(framed[:5] + b"\xff" * 20)  # message index count far too large
        for v in variants:
            issues: list = []
            [row] = sv.apply([_row(v)], issues)
            if row.value_encoding in ("avro", "protobuf", "json_schema"):
                json.loads(row.value)  # whatever decoded is valid JSON text
            else:
                assert row.value in (_row(v).value,)  # the raw value, untouched
            seen_kinds.update(i.kind for i in issues)
            assert all(i.kind.startswith("schema_") for i in issues)
    assert "schema_mismatch" in seen_kinds


def test_bytes_that_merely_start_with_zero_are_not_taken_for_the_format(registry):
    _values, export = registry
    issues: list = []
    [row] = SchemaValues(ExportSchemas(export)).apply([_row(b"\x00\x7f\x00\x00\x01hello")], issues)
    assert row.value_schema_id is None and row.value_format is None
    assert [i.kind for i in issues] == ["schema_unknown"]
    assert [i.severity for i in issues] == ["warning"]


def test_protobuf_payload_of_another_message_is_a_mismatch(registry):
    values, export = registry
    framed, _oracle = values["proto-nested"]
    header = framed[:5] + b"\x04\x00\x00"  # schema id, message indexes [0, 0]
    assert read_message_indexes(framed[5:])[0] == [0, 0]
    issues: list = []
    [row] = SchemaValues(ExportSchemas(export)).apply([_row(header + b"\x38\x01")], issues)
    assert row.value_schema_id == int.from_bytes(framed[1:5], "big")
    assert row.value_encoding == "utf8"  # raw (these bytes are valid UTF-8), with the id shown
    assert [i.kind for i in issues] == ["schema_mismatch"]
    assert "field number(s) 7 are not in shop.Order.Line" in issues[0].message


def test_json_schema_references_resolve_for_validation(tmp_path):
    """A JSON Schema whose $ref names another subject's schema (the registry's
    reference name): valid payloads decode, one the referenced schema rejects does not."""
    customer = {"type": "object", "properties": {"name": {"type": "string"}},
                "required": ["name"]}
    order = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
             "properties": {"order_id": {"type": "integer"},
                            "customer": {"$ref": "customer.json"}}}
    export = [
        {"subject": "customer", "version": 1, "id": 1, "schemaType": "JSON",
         "schema": json.dumps(customer), "references": []},
        {"subject": "orders-value", "version": 1, "id": 2, "schemaType": "JSON",
         "schema": json.dumps(order),
         "references": [{"name": "customer.json", "subject": "customer", "version": 1}]},
    ]
    path = tmp_path / "export.json"
    path.write_text(json.dumps(export))
    sv = SchemaValues(ExportSchemas(str(path)))
    good = b"\x00\x00\x00\x00\x02" + b'{"order_id": 7, "customer": {"name": "x"}}'
    bad = b"\x00\x00\x00\x00\x02" + b'{"order_id": 7, "customer": {"name": 5}}'
    issues: list = []
    ok, rejected = sv.apply([_row(good), _row(bad)], issues)
    assert json.loads(ok.value) == {"order_id": 7, "customer": {"name": "x"}}
    assert ok.value_encoding == "json_schema" and rejected.value_encoding == "utf8"
    assert [i.kind for i in issues] == ["schema_mismatch"]
    assert "customer/name" in issues[0].message


def test_json_schema_refs_in_a_folder_and_refs_that_do_not_resolve(tmp_path):
    from kwinspect.analyze.schema_source import FolderSchemas

    (tmp_path / "customer.json").write_text(json.dumps(
        {"type": "object", "properties": {"name": {"type": "string"}}}))
    (tmp_path / "2.json").write_text(json.dumps(
        {"type": "object", "properties": {"customer": {"$ref": "customer.json"}}}))
    (tmp_path / "3.json").write_text(json.dumps(
        {"type": "object", "properties": {"customer": {"$ref": "missing.json"}}}))
    sv = SchemaValues(FolderSchemas(str(tmp_path)))
    issues: list = []
    ok, bad, unchecked = sv.apply([
        _row(b"\x00\x00\x00\x00\x02" + b'{"customer": {"name": "x"}}'),
        _row(b"\x00\x00\x00\x00\x02" + b'{"customer": {"name": 5}}'),
        _row(b"\x00\x00\x00\x00\x03" + b'{"customer": {"name": 5}}')], issues)
    assert ok.value_encoding == "json_schema" and bad.value_encoding == "utf8"
    # a $ref nothing defines: shown as the JSON it is, not called a mismatch
    assert json.loads(unchecked.value) == {"customer": {"name": 5}}
    assert [i.kind for i in issues] == ["schema_mismatch"]
