"""Read franz-go's protocol definitions (its small DSL) into the schema tables' field tuples.

franz-go (the Go Kafka client) describes the wire protocol in its own DSL, kept in
step with Apache Kafka by hand; its author documents it in UPSTREAM-GENERATE-README.md
beside the definitions.  It is a second, independent description of the protocol:
codegen/schema.py takes from it the (api key, version) pairs Kafka's JSON message
definitions lack, and checks that the two agree wherever both define a version.

The fields come out as the generator's tuples (name, kind, versions, nullable_versions,
tag, tagged_versions, flexible_versions, default, children) with franz-go's CamelCase
names; schema.py renames them to Kafka's names.  Only what decodes the wire is kept:
names, types, versions, nullability, tags and defaults, never the comments.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

OPEN_END = 32767

_PRIMITIVES = {"bool", "int8", "int16", "uint16", "int32", "uint32", "int64", "float64", "uuid",
               "string", "bytes", "varint", "varlong"}
_HEADER = re.compile(r"^(\w+) =>(.*)$")
_ENUM = re.compile(r"^(\w+) (int8|int16|int32|int64|uint8|uint16|uint32)\b")
_ARRAY = re.compile(r"^(nullable(?:-v(\d+)\+)?|varint)?\[(.+)\](\w*)$")
_NULLABLE_FROM = re.compile(r"^nullable-(string|bytes)-v(\d+)\+$")
_SPECIAL = re.compile(r"^(ThrottleMillis|TimeoutMillis)(?:\((\d+)\))?$")
_VERSIONS = re.compile(r"^v(\d+)(\+|-v(\d+))$")


@dataclass
class Message:
    """One top-level request or response of the DSL."""

    name: str
    key: int
    max_version: int
    flexible: tuple[int, int] | None
    fields: tuple = ()
    source: str = "franz-go"


@dataclass
class Definitions:
    requests: dict[int, Message] = field(default_factory=dict)
    responses: dict[int, Message] = field(default_factory=dict)


class DslError(SystemExit):
    pass


def _parse_default(kind: str, raw: str | None):
    if raw is None or raw == "null":
        return None
    if kind == "bool":
        return raw == "true"
    if kind == "float64":
        return float(raw)
    if kind in ("string", "bytes"):
        return raw
    try:
        return int(raw, 0)
    except ValueError:
        return raw


def _intersect(a, b):
    lo, hi = max(a[0], b[0]), min(a[1], b[1])
    return (lo, hi) if lo <= hi else None


class _Reader:
    def __init__(self, folder: Path):
        self.folder = folder
        self.enums = self._read_enums(folder / "enums")
        self.named: dict[str, tuple] = {}  # not-top-level structs: name -> raw field lines

    @staticmethod
    def _read_enums(path: Path) -> dict[str, str]:
        out = {}
        if path.is_file():
            for line in path.read_text(encoding="utf-8").splitlines():
                m = _ENUM.match(line)
                if m:
                    out[m.group(1)] = m.group(2)
        return out

    def blocks(self, path: Path):
        """(header line, [(indent, text, comment, line number)]) per definition of a file."""
        header = None
        body: list = []
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            stripped = line.strip()
            if stripped.startswith("//"):
                continue
            if not stripped:
                if header is not None:
                    yield header, body
                header, body = None, []
                continue
            if not line.startswith(" "):
                if header is not None:
                    yield header, body
                header, body = (line, number), []
                continue
            text, _, comment = line.partition(" //")
            body.append((len(line) - len(line.lstrip(" ")), text.strip(), comment.strip(), number))
        if header is not None:
            yield header, body

    def fields(self, lines: list, where: str, parent: tuple[int, int], flexible) -> tuple:
        """Field tuples of one struct level; `lines` holds this level and everything nested."""
        out = []
        i = 0
        while i < len(lines):
            indent, text, comment, number = lines[i]
            j = i + 1
            while j < len(lines) and lines[j][0] > indent:
                j += 1
            nested = lines[i + 1:j]
            try:
                out.append(self.field(text, comment, nested, parent, flexible))
            except DslError:
                raise
            except Exception as exc:  # noqa: BLE001 - reported with the line that caused it
                raise DslError(f"{where}:{number}: cannot read {text!r}: {exc}") from exc
            i = j
        return tuple(out)

    def field(self, text: str, comment: str, nested: list, parent, flexible) -> tuple:
        versions, tag = (0, OPEN_END), None
        for part in filter(None, (p.strip() for p in comment.split(","))):
            m = _VERSIONS.match(part)
            if m:
                versions = (int(m.group(1)), OPEN_END if m.group(2) == "+" else int(m.group(3)))
            elif part.startswith("tag "):
                tag = int(part[4:])
            else:
                raise ValueError(f"unknown field annotation {part!r}")
        special = _SPECIAL.match(text)
        if special:
            name, type_text = special.group(1), "int32"
        else:
            name, sep, type_text = text.partition(": ")
            if not sep:
                raise ValueError("expected 'Name: type'")
        tagged_versions = None
        if tag is not None:
            if flexible is None:
                raise ValueError("a tagged field in a message that is never flexible")
            versions = _intersect(versions, flexible) or versions
            tagged_versions = versions
        # A nested field's range is its own (a field inside a v3+ array that says
        # nothing holds from v0): the decoder reads it only where its parent is.
        kind, nullable, default, children = self.type_of(type_text, nested, versions, flexible)
        return (name, kind, versions, nullable, tag, tagged_versions, None, default, children)

    def type_of(self, text: str, nested: list, versions, flexible):
        """(kind, nullable_versions, default, children) of a DSL type."""
        default = None
        m = re.match(r"^(.*?)\((.*)\)$", text)
        if m and not text.endswith("=>"):
            text, default = m.group(1), m.group(2)
        everywhere = (0, OPEN_END)
        if text in ("=>", "nullable=>") or re.match(r"^(nullable)?=>\w+$", text):
            children = self.fields(nested, text, versions, flexible)
            return "struct", everywhere if text.startswith("nullable") else None, None, children
        m = _ARRAY.match(text)
        if m:
            prefix, nullable_from, inner, _hint = m.groups()
            if prefix == "varint":
                raise ValueError("varint arrays appear only in records, not in api messages")
            nullable = None
            if prefix and prefix.startswith("nullable"):
                nullable = (int(nullable_from), OPEN_END) if nullable_from else everywhere
            if inner == "=>" or inner.startswith("=>"):
                return "[]struct", nullable, None, self.fields(nested, text, versions, flexible)
            kind, _n, _d, children = self.type_of(inner, [], versions, flexible)
            if children is not None:
                return "[]struct", nullable, None, children
            return "[]" + kind, nullable, _parse_default("array", default), None
        m = _NULLABLE_FROM.match(text)
        if m:
            return m.group(1), (int(m.group(2)), OPEN_END), _parse_default(m.group(1), default), None
        if text in ("nullable-string", "nullable-bytes"):
            kind = text.split("-")[1]
            return kind, everywhere, _parse_default(kind, default), None
        if text.startswith("enum-"):
            backing = self.enums.get(text[5:])
            if backing is None:
                raise ValueError(f"unknown enum {text}")
            return backing, None, _parse_default(backing, default), None
        if text in _PRIMITIVES:
            if text in ("varint", "varlong"):
                raise ValueError("varint fields appear only in records, not in api messages")
            return text, None, _parse_default(text, default), None
        if text in self.named:
            lines, named_flexible = self.named[text]
            return "struct", None, None, self.fields(lines, text, versions, named_flexible or flexible)
        raise ValueError(f"unknown type {text!r}")


def _modifiers(text: str) -> dict:
    out: dict = {}
    for part in (p.strip() for p in text.split(",")):
        if part.startswith("key "):
            out["key"] = int(part[4:])
        elif part.startswith("max version "):
            out["max"] = int(part[12:])
        elif part.startswith("flexible v") and part.endswith("+"):
            out["flexible"] = (int(part[10:-1]), OPEN_END)
        elif part == "not top level":
            out["not_top_level"] = True
    return out


def read_definitions(folder: Path, source: str = "franz-go") -> Definitions:
    """Every request and response of the numbered definition files in `folder`."""
    reader = _Reader(folder)
    out = Definitions()
    files = sorted(p for p in folder.iterdir() if p.is_file() and re.match(r"^\d+_", p.name))
    if not files:
        raise DslError(f"no franz-go definition files (NN_name) in {folder}")
    for path in files:
        request: Message | None = None
        for (header, number), body in reader.blocks(path):
            m = _HEADER.match(header)
            if not m:
                raise DslError(f"{path.name}:{number}: not a definition header: {header!r}")
            name, mods = m.group(1), _modifiers(m.group(2))
            if mods.get("not_top_level"):
                reader.named[name] = (body, mods.get("flexible"))
                continue
            where = f"{path.name}:{name}"
            if name.endswith("Request"):
                if "key" not in mods or "max" not in mods:
                    raise DslError(f"{where}: a request needs 'key N, max version M'")
                request = Message(name[: -len("Request")], mods["key"], mods["max"], mods.get("flexible"),
                                  source=source)
                request.fields = reader.fields(body, where, (0, mods["max"]), request.flexible)
                out.requests[request.key] = request
            elif name.endswith("Response"):
                if request is None or name[: -len("Response")] != request.name:
                    raise DslError(f"{where}: a response must follow its request")
                response = Message(request.name, request.key, request.max_version, request.flexible,
                                   source=source)
                response.fields = reader.fields(body, where, (0, request.max_version), request.flexible)
                out.responses[request.key] = response
                request = None
            else:
                raise DslError(f"{where}: a top-level definition is a request or a response")
    return out
