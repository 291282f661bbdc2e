"""Keys and values in the Confluent wire format, decoded with their schemas.

The format: magic byte 0, a 4-byte big-endian schema id, for Protobuf the
message-index list (zigzag varints: a count, then that many indexes; a single 0
means the first message), then the Avro, Protobuf or JSON payload.  Bytes that
merely start with 0 are not taken for it: a key or value counts as framed only
when its schema id resolves in the schema source (analyze/schema_source.py).

``SchemaValues(source)`` decodes (and caches a decoder per schema id):

- Avro with fastavro (the writer's schema; named types from references),
- Protobuf with descriptors built from the schema: a base64 ``FileDescriptorProto``
  (what confluent-kafka's serializer registers) or ``.proto`` text, compiled with
  protoc from grpcio-tools; imports resolve through the references, the folder's
  other files and the protobuf runtime's well-known types,
- JSON Schema payloads as JSON (checked against the schema when ``jsonschema`` is
  installed).

``apply(rows, issues)`` fills ``key_schema_id``/``value_schema_id``/``value_format``
of records-table rows as they stream past and, where the payload decodes, puts the
decoded key/value in as compact JSON text with encoding ``avro``/``protobuf``/
``json_schema``.  Where it does not (schema missing, payload not matching, cut
short) the raw value stays as it was, the schema id is still shown when it
resolved, and an ``Issue`` (kinds ``schema_unknown``, ``schema_mismatch``,
``schema_error``) names the record; nothing raises.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as _dt
import decimal
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from kwinspect.analyze.schema_source import (
    RawSchema,
    Reference,
    RegistrySchemas,
    SchemaUnavailable,
)
from kwinspect.model import Issue, RecordRow

__all__ = ["DECODED_ENCODINGS", "FORMATS", "Decoded", "SchemaValues", "split_wire_format"]

FORMATS = {"AVRO": "avro", "PROTOBUF": "protobuf", "JSON": "json"}
ENCODINGS = {"avro": "avro", "protobuf": "protobuf", "json": "json_schema"}
DECODED_ENCODINGS = frozenset(ENCODINGS.values())
MAX_DECODED_CHARS = 64 << 20  # decoded JSON text past this is not shown (raw value kept)
MAX_REFERENCE_DEPTH = 32
MAX_MESSAGE_INDEXES = 64


@dataclass(slots=True)
class Decoded:
    schema_id: int
    format: str | None  # "avro" | "protobuf" | "json" once the id resolved
    text: str | None = None  # compact JSON of the decoded value
    problem: tuple[str, str] | None = None  # (issue kind, message)


def split_wire_format(data: bytes) -> tuple[int, bytes] | None:
    """(schema id, rest) of bytes in the Confluent wire format, else None."""
    if len(data) < 5 or data[0] != 0:
        return None
    return int.from_bytes(data[1:5], "big"), data[5:]


def _read_zigzag(buf: bytes, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        if pos >= len(buf):
            raise ValueError("message index list cut short")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            break
        shift += 7
        if shift > 63:
            raise ValueError("message index varint too long")
    return (result >> 1) ^ -(result & 1), pos


def read_message_indexes(payload: bytes) -> tuple[list[int], bytes]:
    count, pos = _read_zigzag(payload, 0)
    if count == 0:
        return [0], payload[pos:]
    if count < 0 or count > MAX_MESSAGE_INDEXES:
        raise ValueError(f"message index count {count} is not plausible")
    out = []
    for _ in range(count):
        i, pos = _read_zigzag(payload, pos)
        if i < 0:
            raise ValueError(f"negative message index {i}")
        out.append(i)
    return out, payload[pos:]


# --------------------------------------------------------------------------- JSON text


def _json_default(v: Any) -> Any:
    if isinstance(v, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(v)).decode("ascii")
    if isinstance(v, _dt.datetime | _dt.date | _dt.time):
        return v.isoformat()
    if isinstance(v, decimal.Decimal | uuid.UUID):
        return str(v)
    return str(v)


def to_json_text(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), default=_json_default)


# --------------------------------------------------------------------------- decoders


class _Avro:
    format = "avro"

    def __init__(self, schema: Any, named: dict[str, Any]) -> None:
        self.schema = schema
        self.named = named

    def fields(self) -> Iterator[tuple[str, str]]:
        yield from _avro_fields(self.schema, self.named, "", 0)

    def decode(self, payload: bytes) -> Any:
        from fastavro import schemaless_reader

        buf = io.BytesIO(payload)
        value = schemaless_reader(buf, self.schema, None)
        left = len(payload) - buf.tell()
        if left:
            raise ValueError(f"{left} bytes left over after the Avro value")
        return value


class _Protobuf:
    format = "protobuf"

    def __init__(self, file_desc: Any, order: list[str]) -> None:
        self.file = file_desc
        self.order = order  # top-level messages in file order (the indexes count in it)
        self.classes: dict[tuple[int, ...], Any] = {}

    def fields(self) -> Iterator[tuple[str, str]]:
        for name in self.order:  # any top-level message may be the one a record names
            yield from _pb_fields(self.file.message_types_by_name[name], "", 0)

    def decode(self, payload: bytes) -> Any:
        from google.protobuf import message_factory

        indexes, body = read_message_indexes(payload)
        key = tuple(indexes)
        cls = self.classes.get(key)
        if cls is None:
            desc = None
            seq = [self.file.message_types_by_name[n] for n in self.order]
            for i in indexes:
                if i >= len(seq):
                    raise ValueError(f"message index {indexes} names no message in "
                                     f"{self.file.name}")
                desc = seq[i]
                seq = list(desc.nested_types)
            cls = self.classes[key] = message_factory.GetMessageClass(desc)
        msg = cls()
        msg.ParseFromString(body)
        _no_unknown_fields(msg)
        return _pb_value(msg)


def _no_unknown_fields(msg: Any) -> None:
    """The writer's schema knows every field it wrote: unknown ones mean the payload is
    not of this message type."""
    from google.protobuf.unknown_fields import UnknownFieldSet

    unknown = sorted({f.field_number for f in UnknownFieldSet(msg)})
    if unknown:
        raise ValueError(f"field number(s) {', '.join(map(str, unknown[:8]))} are not in "
                         f"{msg.DESCRIPTOR.full_name}")


def _pb_value(msg: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for fd in msg.DESCRIPTOR.fields:
        if fd.is_repeated:
            val = getattr(msg, fd.name)
            mt = fd.message_type
            if mt is not None and mt.GetOptions().map_entry:
                vfd = mt.fields_by_name["value"]
                out[fd.name] = {str(k): _pb_scalar(vfd, v) for k, v in val.items()}
            else:
                out[fd.name] = [_pb_scalar(fd, v) for v in val]
        elif fd.has_presence and not msg.HasField(fd.name):
            continue  # unset message / optional / oneof member
        else:
            out[fd.name] = _pb_scalar(fd, getattr(msg, fd.name))
    return out


def _pb_scalar(fd: Any, v: Any) -> Any:
    if fd.message_type is not None:
        return _pb_value(v)
    if fd.enum_type is not None:
        ev = fd.enum_type.values_by_number.get(v)
        return ev.name if ev is not None else v
    if isinstance(v, bytes):
        return base64.b64encode(v).decode("ascii")
    return v


class _Json:
    format = "json"

    def __init__(self, schema: Any, validate: Callable[[Any], None] | None) -> None:
        self.schema = schema
        self.validate = validate

    def fields(self) -> Iterator[tuple[str, str]]:
        yield from _json_fields(self.schema, "", 0)

    def decode(self, payload: bytes) -> Any:
        value = json.loads(payload.decode("utf-8"))
        if self.validate is not None:
            self.validate(value)
        return value


# --------------------------------------------------------------------------- building


class SchemaValues:
    """Decode Confluent-framed keys and values with the schemas of ``source``."""

    def __init__(self, source: Any) -> None:
        self.source = source
        self._decoders: dict[int, Any] = {}
        self._failed: dict[int, tuple[str, str]] = {}

    # -- per value ----------------------------------------------------------
    def decode(self, data: bytes) -> Decoded | None:
        """The decoded key/value, or None when the bytes are not in the wire format
        or their schema id does not resolve (then ``unknown_id`` tells which)."""
        framed = split_wire_format(data)
        if framed is None:
            return None
        schema_id, payload = framed
        dec = self.decoder(schema_id)
        if dec is None:
            return None
        if isinstance(dec, tuple):  # the schema resolved but could not be built
            return Decoded(schema_id, dec[0], problem=dec[1])
        try:
            value = dec.decode(payload)
            text = to_json_text(value)
        except RecursionError:
            return Decoded(schema_id, dec.format, problem=(
                "schema_mismatch", "value nested too deeply to decode"))
        except Exception as exc:  # noqa: BLE001 (any decoding failure is the record's problem)
            return Decoded(schema_id, dec.format, problem=("schema_mismatch", _why(exc, payload)))
        if len(text) > MAX_DECODED_CHARS:
            return Decoded(schema_id, dec.format, problem=(
                "limit_exceeded", f"decoded value over {MAX_DECODED_CHARS} characters; raw kept"))
        return Decoded(schema_id, dec.format, text)

    def unknown_reason(self, data: bytes) -> str | None:
        framed = split_wire_format(data)
        if framed is None:
            return None
        failed = self._failed.get(framed[0])
        return failed[1] if failed else None

    def decoder(self, schema_id: int) -> Any:
        """The decoder of a schema id, ``(format, problem)`` when its schema cannot be
        built, None when the id does not resolve."""
        dec = self._decoders.get(schema_id)
        if dec is not None or schema_id in self._decoders:
            return dec
        if schema_id in self._failed:
            return None
        try:
            raw = self.source.schema(schema_id)
        except SchemaUnavailable as exc:
            self._failed[schema_id] = ("schema_unknown", str(exc))
            return None
        except Exception as exc:  # noqa: BLE001 (a broken source is reported, never raised)
            self._failed[schema_id] = ("schema_unknown", f"schema id {schema_id}: {exc}")
            return None
        fmt = FORMATS.get(raw.schema_type)
        try:
            if fmt is None:
                raise ValueError(f"unknown schema type {raw.schema_type!r}")
            dec = self._build(raw)
        except Exception as exc:  # noqa: BLE001
            dec = (fmt, ("schema_error", f"schema id {schema_id} ({raw.name}): {_one_line(exc)}"))
        self._decoders[schema_id] = dec
        return dec

    def _build(self, raw: RawSchema) -> Any:
        if raw.schema_type == "AVRO":
            return _Avro(*self._avro_schema(raw))
        if raw.schema_type == "PROTOBUF":
            return _Protobuf(*self._proto_file(raw))
        return _Json(json.loads(raw.text), self._json_validator(raw))

    def _refs(self, raw: RawSchema, depth: int = 0) -> Iterator[tuple[Reference, RawSchema]]:
        """The references of ``raw``, depth first (a reference's own references before it)."""
        if depth > MAX_REFERENCE_DEPTH:
            raise ValueError("schema references nested deeper than 32")
        for ref in raw.references:
            sub = self.source.reference(ref)
            yield from self._refs(sub, depth + 1)
            yield ref, sub

    # -- Avro ---------------------------------------------------------------
    def _avro_schema(self, raw: RawSchema) -> Any:
        from fastavro import parse_schema

        named: dict[str, Any] = {}
        for _ref, sub in self._refs(raw):
            parse_schema(json.loads(sub.text), named_schemas=named)
        try:
            return parse_schema(json.loads(raw.text), named_schemas=named), named
        except Exception as exc:  # noqa: BLE001
            if not self._avro_folder_types(named, exc):
                raise
            return parse_schema(json.loads(raw.text), named_schemas=named), named

    def _avro_folder_types(self, named: dict[str, Any], exc: Exception) -> bool:
        """A folder's other .avsc files as named types, for a schema that uses one
        without a registry reference list.  True when any was added."""
        from fastavro import parse_schema

        avsc_paths = getattr(self.source, "avsc_paths", None)
        if avsc_paths is None or type(exc).__name__ != "UnknownType":
            return False
        pending = avsc_paths()
        added = False
        for _ in range(len(pending)):  # a type may need another: repeat until none is added
            left = []
            for path in pending:
                try:
                    with open(path, encoding="utf-8") as fh:
                        parse_schema(json.load(fh), named_schemas=named)
                    added = True
                except Exception:  # noqa: BLE001
                    left.append(path)
            if len(left) == len(pending):
                break
            pending = left
        return added

    # -- Protobuf -------------------------------------------------------------
    def _proto_file(self, raw: RawSchema) -> Any:
        from google.protobuf import descriptor_pool

        pool = descriptor_pool.DescriptorPool()
        protos: dict[str, Any] = {}
        texts: dict[str, str] = {}
        for ref, sub in self._refs(raw):
            fdp = _as_file_descriptor(sub.text)
            if fdp is None:
                texts[ref.name] = sub.text
            else:
                protos[fdp.name or ref.name] = fdp
        main = _as_file_descriptor(raw.text)
        if main is None:  # .proto text: protoc, with the references and the folder's files
            folder = getattr(self.source, "references_for_import", None)
            extra = folder() if folder is not None else {}
            fds = _compile_proto(raw.text, texts, extra)
            files = list(fds.file)
            main = files[-1]
            for f in files[:-1]:
                protos.setdefault(f.name, f)
        elif texts:
            for name, text in texts.items():
                fds = _compile_proto(text, {}, {}, name)
                for f in fds.file:
                    protos.setdefault(f.name, f)
        main_name = main.name or "schema.proto"
        main.name = main_name
        protos.pop(main_name, None)

        added: set[str] = set()

        def add(fdp: Any, depth: int = 0) -> None:
            if fdp.name in added or depth > MAX_REFERENCE_DEPTH:
                return
            for dep in fdp.dependency:
                if dep in added:
                    continue
                if dep in protos:
                    add(protos[dep], depth + 1)
                else:
                    found = _well_known(dep) or self._folder_import(dep)
                    if found is None:
                        raise ValueError(f"import {dep!r} is neither a reference nor a "
                                         "well-known type")
                    add(found, depth + 1)
            pool.Add(fdp)
            added.add(fdp.name)

        add(main)
        return pool.FindFileByName(main_name), [m.name for m in main.message_type]

    def _folder_import(self, name: str) -> Any:
        """A folder file a base64 descriptor imports: by file name, or an id-named file
        whose descriptor has that name (a registry's references exported by id)."""
        find = getattr(self.source, "find_import", None)
        if find is None:
            return None
        for text in find(name):
            fdp = _as_file_descriptor(text)
            if fdp is not None and (fdp.name == name or not fdp.name):
                fdp.name = name
                return fdp
            if fdp is None:  # .proto text named like the import
                fds = _compile_proto(text, {}, {}, name)
                return fds.file[-1]
        return None

    # -- JSON Schema ---------------------------------------------------------
    def _json_validator(self, raw: RawSchema) -> Callable[[Any], None] | None:
        schema = json.loads(raw.text)
        try:
            import jsonschema
        except ImportError:  # validation is a bonus; the payload is JSON either way
            return None
        resources = [(ref.name, sub.text) for ref, sub in self._refs(raw)]
        folder = getattr(self.source, "references_for_import", None)
        if folder is not None:  # a folder: its other .json files are what $ref may name
            for name, path in folder().items():
                if name.endswith(".json"):
                    with contextlib.suppress(OSError, UnicodeDecodeError):
                        with open(path, encoding="utf-8") as fh:
                            resources.append((name, fh.read()))
        if resources:
            try:
                from referencing import Registry, Resource
            except ImportError:
                return None
            loaded = []
            for name, text in resources:
                with contextlib.suppress(ValueError):
                    loaded.append((name, Resource.from_contents(
                        json.loads(text), default_specification=_draft(schema))))
            validator = jsonschema.validators.validator_for(schema)(
                schema, registry=Registry().with_resources(loaded))
        else:
            validator = jsonschema.validators.validator_for(schema)(schema)

        def validate(value: Any) -> None:
            try:
                err = jsonschema.exceptions.best_match(validator.iter_errors(value))
            except Exception:  # noqa: BLE001 (a $ref we cannot resolve: the payload is JSON, shown unchecked)
                return
            if err is not None:
                where = "/".join(str(p) for p in err.absolute_path) or "(root)"
                raise ValueError(f"does not match its JSON Schema at {where}: {err.message[:200]}")

        return validate

    # -- the fields a filter may name -----------------------------------------
    def field_kinds(self) -> dict[str, str]:
        """``{"value.order_id": "integer", "key.customer": "text", ...}`` over every schema
        the source can list (which are keys and which values is not known up front, so
        each field is offered under both); a field whose type differs between schemas
        is "any".  A registry adds ``ANY_PATH``: its schemas are known only as they are
        met."""
        out: dict[str, str] = {}
        for schema_id in self.source.ids():
            dec = self.decoder(schema_id)
            if dec is None or isinstance(dec, tuple):
                continue
            try:
                for path, kind in dec.fields():
                    for root in ("key", "value"):
                        full = f"{root}.{path}"
                        out[full] = kind if out.get(full, kind) == kind else ANY
            except Exception:  # noqa: BLE001, S112 (a schema we cannot walk names no fields)
                continue
        if isinstance(self.source, RegistrySchemas):
            out[ANY_PATH] = ANY
        return out

    # -- rows -----------------------------------------------------------------
    def apply(self, rows: Iterable[RecordRow], issues: list[Issue] | None = None,
              ) -> Iterator[RecordRow]:
        """Rows with their framed keys and values decoded (see the module doc)."""
        for row in rows:
            if row.key is not None:
                self._apply_one(row, "key", issues)
            if row.value is not None:
                self._apply_one(row, "value", issues)
            yield row

    def _apply_one(self, row: RecordRow, which: str, issues: list[Issue] | None) -> None:
        text = getattr(row, which)
        encoding = getattr(row, f"{which}_encoding")
        data = _raw_bytes(text, encoding)
        if data is None:
            return
        dec = self.decode(data)
        if dec is None:
            reason = self.unknown_reason(data)
            if reason is not None and issues is not None:
                issues.append(Issue("schema_unknown", f"{which}: {reason}", None,
                                    _path(row, which), "warning"))
            return
        setattr(row, f"{which}_schema_id", dec.schema_id)
        if which == "value":
            row.value_format = dec.format
        if dec.text is not None:
            setattr(row, which, dec.text)
            setattr(row, f"{which}_encoding", ENCODINGS[dec.format])
        elif dec.problem is not None and issues is not None:
            kind, message = dec.problem
            issues.append(Issue(kind, f"{which} (schema id {dec.schema_id}): {message}", None,
                                _path(row, which), "error"))


# --------------------------------------------------------------------------- field kinds
# (the kinds of analyze/filter.py's columns, spelled as it does)
ANY_PATH = "*"
INT, FLOAT, STR, BOOL, ANY = "integer", "number", "text", "boolean", "any"
MAX_FIELD_DEPTH = 8
_AVRO_KINDS = {"int": INT, "long": INT, "float": FLOAT, "double": FLOAT, "string": STR,
               "bytes": STR, "boolean": BOOL, "enum": STR, "fixed": STR}


def _avro_fields(schema: Any, named: dict[str, Any], prefix: str,
                 depth: int) -> Iterator[tuple[str, str]]:
    if isinstance(schema, str):
        schema = named.get(schema, schema)
    if not isinstance(schema, dict) or schema.get("type") != "record" or depth > MAX_FIELD_DEPTH:
        return
    for f in schema.get("fields", ()):
        path = prefix + f["name"]
        ftype = f["type"]
        if isinstance(ftype, list):  # ["null", X] is X; other unions are any
            rest = [t for t in ftype if t != "null"]
            ftype = rest[0] if len(rest) == 1 else None
        if isinstance(ftype, str) and ftype in named:
            ftype = named[ftype]
        if isinstance(ftype, dict):
            if ftype.get("logicalType"):
                yield path, ANY
                continue
            if ftype.get("type") == "record":
                yield path, ANY
                yield from _avro_fields(ftype, named, path + ".", depth + 1)
                continue
            ftype = ftype.get("type") if ftype.get("type") in ("enum", "fixed") else None
        yield path, _AVRO_KINDS.get(ftype, ANY) if isinstance(ftype, str) else ANY


def _pb_fields(desc: Any, prefix: str, depth: int) -> Iterator[tuple[str, str]]:
    from google.protobuf.descriptor import FieldDescriptor as F

    if depth > MAX_FIELD_DEPTH:
        return
    ints = {F.TYPE_INT32, F.TYPE_INT64, F.TYPE_UINT32, F.TYPE_UINT64, F.TYPE_SINT32,
            F.TYPE_SINT64, F.TYPE_FIXED32, F.TYPE_FIXED64, F.TYPE_SFIXED32, F.TYPE_SFIXED64}
    for fd in desc.fields:
        path = prefix + fd.name
        if fd.is_repeated:
            yield path, ANY
        elif fd.message_type is not None:
            yield path, ANY
            yield from _pb_fields(fd.message_type, path + ".", depth + 1)
        elif fd.type in ints:
            yield path, INT
        elif fd.type in (F.TYPE_DOUBLE, F.TYPE_FLOAT):
            yield path, FLOAT
        elif fd.type == F.TYPE_BOOL:
            yield path, BOOL
        else:  # string, bytes (base64), enum (its name)
            yield path, STR


_JSON_KINDS = {"integer": INT, "number": FLOAT, "string": STR, "boolean": BOOL}


def _json_fields(schema: Any, prefix: str, depth: int) -> Iterator[tuple[str, str]]:
    if not isinstance(schema, dict) or depth > MAX_FIELD_DEPTH:
        return
    props = schema.get("properties")
    if not isinstance(props, dict):
        return
    for name, sub in props.items():
        path = prefix + str(name)
        if not isinstance(sub, dict):
            yield path, ANY
            continue
        jtype = sub.get("type")
        if isinstance(jtype, list):
            rest = [t for t in jtype if t != "null"]
            jtype = rest[0] if len(rest) == 1 else None
        if jtype == "object":
            yield path, ANY
            yield from _json_fields(sub, path + ".", depth + 1)
        else:
            yield path, _JSON_KINDS.get(jtype, ANY) if isinstance(jtype, str) else ANY


_ESCAPED_BYTE = re.compile(r"\\x([0-9a-f]{2})")


def _raw_bytes(text: Any, encoding: Any) -> bytes | None:
    """The bytes a rendered key/value was made of: base64 and hex are exact, and so is
    ``auto``'s utf8 (strict UTF-8); ``--values utf8`` escapes undecodable bytes as
    ``\\xNN``, undone here (a payload holding those four characters literally then
    reads differently and is reported as not matching its schema)."""
    if not isinstance(text, str) or not text:
        return None
    try:
        if encoding == "base64":
            if text[0] != "A":  # a first byte of 0 encodes to "A...": nothing else can match
                return None
            return base64.b64decode(text)
        if encoding == "hex":
            return bytes.fromhex(text) if text.startswith("00") else None
        if encoding == "utf8":
            if text[0] != "\0":
                return None
            if "\\x" not in text:
                return text.encode("utf-8")
            parts = _ESCAPED_BYTE.split(text)  # text, hex digits, text, ...
            return b"".join(bytes.fromhex(p) if i % 2 else p.encode("utf-8")
                            for i, p in enumerate(parts))
    except ValueError:
        return None
    return None


def _path(row: RecordRow, which: str) -> str:
    offset = "?" if row.offset is None else row.offset
    return f"{row.direction}.{row.topic}[{row.partition}]@{offset}.{which}"


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    if type(exc).__name__ == "UnknownType":  # fastavro says only the name
        text = f"unknown Avro type {text} (not in the schema nor its references)"
    return text[:300]


def _why(exc: BaseException, payload: bytes) -> str:
    if isinstance(exc, EOFError | IndexError) or "cut short" in str(exc) or "Truncated" in str(exc):
        return f"payload of {len(payload)} bytes ends before the value does (truncated?)"
    return _one_line(exc)


def _draft(schema: Any) -> Any:
    from referencing.jsonschema import DRAFT7, specification_with

    uri = schema.get("$schema") if isinstance(schema, dict) else None
    return specification_with(uri, default=DRAFT7) if uri else DRAFT7


def _as_file_descriptor(text: str) -> Any:
    """A base64 serialized FileDescriptorProto (what confluent-kafka registers), else None."""
    from google.protobuf import descriptor_pb2

    stripped = text.strip()
    if not stripped or "{" in stripped or ";" in stripped:
        return None
    try:
        data = base64.b64decode(stripped, validate=True)
        fdp = descriptor_pb2.FileDescriptorProto()
        fdp.ParseFromString(data)
    except Exception:  # noqa: BLE001
        return None
    return fdp if fdp.name or fdp.message_type else None


def _well_known(name: str) -> Any:
    """The FileDescriptorProto of a well-known type the protobuf runtime ships."""
    import importlib

    from google.protobuf import descriptor_pb2

    if not name.startswith("google/protobuf/") or not name.endswith(".proto"):
        return None
    module = "google.protobuf." + name[len("google/protobuf/"):-len(".proto")] + "_pb2"
    try:
        mod = importlib.import_module(module)
    except ImportError:
        return None
    fdp = descriptor_pb2.FileDescriptorProto()
    mod.DESCRIPTOR.CopyToProto(fdp)
    return fdp


def _compile_proto(text: str, refs: dict[str, str], folder: dict[str, str],
                   name: str = "schema.proto") -> Any:
    """Compile .proto text with protoc (grpcio-tools) into a FileDescriptorSet, the
    main file last.  Imports come from ``refs`` (name -> text), the folder's files
    and the well-known types protoc ships."""
    from google.protobuf import descriptor_pb2

    try:
        import grpc_tools
    except ImportError:
        raise ValueError("a .proto text schema needs grpcio-tools (pip install "
                         "'kwinspect[schemas]')") from None
    include = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    with tempfile.TemporaryDirectory(prefix="kwinspect-proto-") as tmp:
        src = os.path.join(tmp, "src")
        os.makedirs(src)
        for ref_name, ref_text in {**folder, **refs}.items():
            if ".." in ref_name.split("/") or ref_name.startswith("/"):
                continue
            dest = os.path.join(src, ref_name)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            if ref_name in refs:
                with open(dest, "w", encoding="utf-8") as fh:
                    fh.write(ref_text)
            else:
                with open(ref_text, "rb") as fin, open(dest, "wb") as fout:
                    fout.write(fin.read())
        main_name = name if name not in refs else f"_main_{name}"
        with open(os.path.join(src, main_name), "w", encoding="utf-8") as fh:
            fh.write(text)
        out = os.path.join(tmp, "set.pb")
        proc = subprocess.run(
            [sys.executable, "-m", "grpc_tools.protoc", f"-I{src}", f"-I{include}",
             f"--descriptor_set_out={out}", "--include_imports", main_name],
            cwd=src, capture_output=True, text=True, timeout=60, check=False)
        if proc.returncode != 0:
            msg = " ".join(proc.stderr.replace(src + os.sep, "").split())[:300]
            raise ValueError(f"protoc: {msg or 'failed'}")
        fds = descriptor_pb2.FileDescriptorSet()
        with open(out, "rb") as fh:
            fds.ParseFromString(fh.read())
    return fds
