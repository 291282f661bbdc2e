"""Straight-line decoders generated from the schema tables: the fast path of decode.py.

For one (api key, version, direction) this writes the Python source of a single
function that reads the header and the body of a well-formed frame and returns
the ``Message``: precompiled ``Struct`` objects read runs of fixed-size fields
in one call, compact lengths take a one-byte-varint shortcut, array counts are
checked against the bytes left before looping, and nested structs are inlined,
so no per-field function call, tuple or closure is involved.

The generated code handles only the common, clean case.  Anything unusual -- a
short buffer, a bad length, invalid UTF-8, a tagged field the reference would
report on (wrong size, undecodable), trailing bytes, an ApiVersions rejection --
makes it raise or return None, and the caller
throws that attempt away and runs the reference closure decoder in decode.py,
which produces the exact issues, paths and partial values.  So this module never
has to reproduce an error, only the values of a frame that decodes cleanly, and
it builds them from the same tables with the same rules (field selection,
nullability, compact encodings, tagged-field defaults, element limit) as the
reference: those rules live in layout.py, which both decoders import; this
module imports nothing from decode.py.
"""

from __future__ import annotations

import struct
from typing import Any

from kwinspect.model import Message
from kwinspect.protocol.layout import (
    API_VERSIONS_KEY,
    FIXED_ARRAY_CODES,
    MAX_ELEMENTS_PER_MESSAGE,
    STRUCTS,
    UNSUPPORTED_VERSION_CODE,
    copy_default,
    default_value,
    field_reader,
    find_definition,
    in_range,
    min_size,
    records_parser,
    thread_state,
)
from kwinspect.protocol.primitives import FIXED_SIZES, read_uvarint, uuid_to_str


class Bail(Exception):  # noqa: N818 - a control-flow signal: "let the reference decoder do it"
    """The frame is not the clean case the generated code handles."""


# One-field struct codes of the fixed-size types; uuid is read as 16 raw bytes.
_CODES = {"bool": "?", "int8": "b", "int16": "h", "uint16": "H", "int32": "i", "uint32": "I",
          "int64": "q", "float64": "d", "uuid": "16s"}
_SMALL = 17  # arrays of fixed-size numbers shorter than this use a precompiled Struct
_I16 = struct.Struct(">h").unpack_from
_I32 = struct.Struct(">i").unpack_from


class _Gen:
    """Source lines plus the constants (Struct readers, defaults) they refer to."""

    def __init__(self):
        self.lines: list[str] = []
        self.consts: dict[str, Any] = {}
        self._structs: dict[str, str] = {}
        self.n = 0

    def tmp(self, prefix: str = "v") -> str:
        self.n += 1
        return f"{prefix}{self.n}"

    def const(self, obj) -> str:
        name = f"K{len(self.consts)}"
        self.consts[name] = obj
        return name

    def unpacker(self, fmt: str) -> str:
        name = self._structs.get(fmt)
        if name is None:
            name = self._structs[fmt] = self.const(struct.Struct(">" + fmt).unpack_from)
        return name

    def fresh_copy(self, value) -> str:
        """An expression building what layout.copy_default(value) returns."""
        if isinstance(value, dict):
            return "{" + ", ".join(f"{k!r}: {self.fresh_copy(v)}" for k, v in value.items()) + "}"
        if isinstance(value, list):
            return "[]"
        return self.const(value)

    def emit(self, ind: int, line: str) -> None:
        self.lines.append("    " * ind + line)

    # -- lengths ------------------------------------------------------------------

    def uvarint(self, ind: int, var: str) -> None:
        """`var` = the unsigned varint at pos; one-byte values without a call."""
        self.emit(ind, f"{var} = buf[pos]")
        self.emit(ind, f"if {var} < 128:")
        self.emit(ind + 1, "pos += 1")
        self.emit(ind, "elif buf[pos + 1] < 128:")  # two bytes: lengths up to 16383
        self.emit(ind + 1, f"{var} = ({var} & 127) | (buf[pos + 1] << 7)")
        self.emit(ind + 1, "pos += 2")
        self.emit(ind, "else:")
        self.emit(ind + 1, f"{var}, pos = read_uvarint(buf, pos)")

    def sized(self, ind: int, ftype: str, nullable: bool, compact: bool, target: str, convert: str) -> None:
        """A string / bytes / records value: length prefix, then `convert` of the bytes."""
        n = self.tmp("n")
        if compact:  # uvarint length + 1, 0 = null
            self.uvarint(ind, n)
            self.emit(ind, f"if {n}:")
            self.emit(ind + 1, f"e = pos + {n} - 1")
        else:  # int16 (string) / int32 (bytes) length, -1 = null
            self.emit(ind, f"{n}, = {'I16' if ftype == 'string' else 'I32'}(buf, pos)")
            self.emit(ind, f"pos += {2 if ftype == 'string' else 4}")
            self.emit(ind, f"if {n} >= 0:")
            self.emit(ind + 1, f"e = pos + {n}")
        self.emit(ind + 1, "if e > L:")
        self.emit(ind + 2, "raise Bail")
        self.emit(ind + 1, f"{target} = {convert.format('buf[pos:e]')}")
        self.emit(ind + 1, "pos = e")
        if not compact and nullable:
            self.emit(ind, f"elif {n} == -1:")
            self.emit(ind + 1, f"{target} = None")
        self.emit(ind, "else:")
        self.emit(ind + 1, f"{target} = None" if compact and nullable else "raise Bail")

    # -- values -------------------------------------------------------------------

    def value(self, ind, ftype, nullable, compact, children, version, flexible, target) -> None:
        if ftype in _CODES:
            size = FIXED_SIZES[ftype]
            self.emit(ind, f"{target}, = {self.unpacker(_CODES[ftype])}(buf, pos)")
            self.emit(ind, f"pos += {size}")
            if ftype == "uuid":
                self.emit(ind, f"{target} = uuid_to_str({target})")
        elif ftype == "string":
            self.sized(ind, ftype, nullable, compact, target, "{}.decode()")
        elif ftype == "bytes":
            self.sized(ind, ftype, nullable, compact, target, "{}")
        elif ftype == "records":
            self.sized(ind, "bytes", nullable, compact, target, "parse({})")
        elif ftype == "struct":
            self.struct(ind, children, version, flexible, nullable, target)
        elif ftype.startswith("[]"):
            self.array(ind, ftype[2:], nullable, compact, children, version, flexible, target)
        else:
            raise ValueError(f"unknown field type {ftype!r} in the schema tables")

    def array(self, ind, inner, nullable, compact, children, version, flexible, target) -> None:
        n = self.tmp("n")
        if compact:
            self.uvarint(ind, n)
            self.emit(ind, f"if not {n}:")
            self.emit(ind + 1, f"{target} = None" if nullable else "raise Bail")
            self.emit(ind, "else:")
            ind += 1
            self.emit(ind, f"{n} -= 1")
        else:
            self.emit(ind, f"{n}, = I32(buf, pos)")
            self.emit(ind, "pos += 4")
            if nullable:
                self.emit(ind, f"if {n} == -1:")
                self.emit(ind + 1, f"{target} = None")
                self.emit(ind, "else:")
                ind += 1
            self.emit(ind, f"if {n} < 0:")
            self.emit(ind + 1, "raise Bail")
        if inner == "struct":
            least = min_size(children, version, flexible)
        else:
            least = FIXED_SIZES.get(inner, 1 if compact else 2)
        self.emit(ind, f"if {n} * {max(least, 1)} > L - pos:")
        self.emit(ind + 1, "raise Bail")
        self.emit(ind, f"E -= {n}")  # the reference's element budget (layout.ElementLimit)
        self.emit(ind, "if E < 0:")
        self.emit(ind + 1, "raise Bail")
        if inner in FIXED_ARRAY_CODES:
            code, size = FIXED_ARRAY_CODES[inner], FIXED_SIZES[inner]
            small = self.const(tuple(struct.Struct(f">{i}{code}").unpack_from for i in range(_SMALL)))
            self.emit(ind, f"if {n} < {_SMALL}:")  # short arrays: a precompiled Struct per length
            self.emit(ind + 1, f"{target} = list({small}[{n}](buf, pos))")
            self.emit(ind, "else:")
            self.emit(ind + 1, f"{target} = list(unpack_from('>%d{code}' % {n}, buf, pos))")
            self.emit(ind, f"pos += {n} * {size}")
            return
        items, elem = self.tmp("a"), self.tmp("v")
        self.emit(ind, f"{items} = []")
        self.emit(ind, f"for _ in range({n}):")
        if inner == "struct":
            self.struct(ind + 1, children, version, flexible, False, elem)
        else:
            self.value(ind + 1, inner, False, compact, None, version, flexible, elem)
        self.emit(ind + 1, f"{items}.append({elem})")
        self.emit(ind, f"{target} = {items}")

    def struct(self, ind, fields, version, flexible, nullable, target) -> None:
        """Inline code reading one struct into `target` (same field rules as compile_struct)."""
        regular, tagged = struct_layout(fields, version, flexible)
        if nullable:  # int8 presence marker, negative = null
            self.emit(ind, "if buf[pos] > 127:")
            self.emit(ind + 1, "pos += 1")
            self.emit(ind + 1, f"{target} = None")
            self.emit(ind, "else:")
            ind += 1
            self.emit(ind, "pos += 1")
        items: list[tuple[str, str]] = []
        i = 0
        while i < len(regular):
            if regular[i][1] in _CODES:  # a run of fixed-size fields: one unpack
                j, fmt, size, names = i, "", 0, []
                while j < len(regular) and regular[j][1] in _CODES:
                    ftype = regular[j][1]
                    fmt += _CODES[ftype]
                    size += FIXED_SIZES[ftype]
                    var = self.tmp()
                    names.append(var)
                    items.append((regular[j][0], f"uuid_to_str({var})" if ftype == "uuid" else var))
                    j += 1
                self.emit(ind, f"{', '.join(names)}, = {self.unpacker(fmt)}(buf, pos)")
                self.emit(ind, f"pos += {size}")
                i = j
                continue
            name, ftype, fnull, compact, children = regular[i]
            var = self.tmp()
            self.value(ind, ftype, fnull, compact, children, version, flexible, var)
            items.append((name, var))
            i += 1
        if not flexible:
            self.emit(ind, f"{target} = {{{', '.join(f'{name!r}: {expr}' for name, expr in items)}}}")
            return
        # "No tagged fields" (a single zero byte) is inline; otherwise a helper
        # reads them with the reference readers, in the order they come.
        present = {name for name, _ in items}
        regular_names = frozenset(present)
        defaults = []
        for name, default in tagged:
            if name in present:
                continue  # compile_struct keeps the regular field's value
            present.add(name)
            defaults.append((name, self.fresh_copy(default)))
        fixed = ", ".join(f"{name!r}: {expr}" for name, expr in items)
        table = self.const(tag_table(fields, version, flexible, tagged, regular_names))
        self.emit(ind, "if buf[pos]:")
        self.emit(ind + 1, f"t, pos = read_tagged(buf, pos, L, {table})")
        self.emit(ind + 1, f"{target} = {{{fixed}{', ' if fixed else ''}**t}}")
        self.emit(ind, "else:")
        self.emit(ind + 1, "pos += 1")
        tail = ", ".join(f"{name!r}: {expr}" for name, expr in items + defaults)
        self.emit(ind + 1, f"{target} = {{{tail}}}")


def struct_layout(fields, version: int, flexible: bool) -> tuple[list, list]:
    """The fields of one struct at one version, as compile_struct selects them: the regular
    ones (name, type, nullable, compact, children) in wire order, and the tagged ones
    (name, default when absent)."""
    regular, tagged = [], []
    for name, ftype, versions, nullable_v, tag, tagged_v, flex_override, default, children in fields:
        if not in_range(versions or (0, 32767), version):
            continue
        compact = flexible and (flex_override is None or in_range(flex_override, version))
        fnull = in_range(nullable_v, version)
        if flexible and tag is not None and in_range(tagged_v, version):
            tagged.append((name, default_value(ftype, default, children, version, flexible, fnull)))
        else:
            regular.append((name, ftype, fnull, compact, children))
    return regular, tagged


def tag_table(fields, version: int, flexible: bool, tagged, regular_names: frozenset) -> tuple:
    """What read_tagged needs for one struct: tag -> (name, reference reader), exactly as
    compile_struct builds them; the tagged fields' defaults; the regular fields' names."""
    readers = {}
    for name, ftype, versions, nullable_v, tag, tagged_v, flex_override, _d, children in fields:
        if not in_range(versions or (0, 32767), version):
            continue
        if tag is not None and in_range(tagged_v, version):
            compact = flexible and (flex_override is None or in_range(flex_override, version))
            readers[tag] = (name, field_reader(ftype, in_range(nullable_v, version), compact, children,
                                               version, flexible))
    return readers, tuple(tagged), regular_names


def read_tagged(buf, pos: int, end_of_data: int, table) -> tuple[dict, int]:
    """The tagged fields of one struct, as layout._read_tagged_fields reads them.

    Returns the entries to append to the struct (known tags in the order they
    come, ``_unknown_tags``, then the defaults of absent tags) and the new
    position.  Anything the reference would report (a size mismatch, a value
    that does not decode, a note from a nested tagged field) raises Bail.
    """
    readers, defaults, regular_names = table
    count, pos = read_uvarint(buf, pos)
    if count > end_of_data - pos:
        raise Bail
    out: dict = {}
    view = None
    for _ in range(count):
        tag, pos = read_uvarint(buf, pos)
        size, pos = read_uvarint(buf, pos)
        end = pos + size
        if end > end_of_data:
            raise Bail
        entry = readers.get(tag)
        if entry is not None:
            if view is None:
                view = memoryview(buf)
            notes: list = []
            saved = getattr(thread_state, "notes", None)
            thread_state.notes = notes
            try:
                value, used = entry[1](view[:end], pos)
            finally:
                thread_state.notes = saved
            if used != end or notes:
                raise Bail
            out[entry[0]] = value
        else:
            out.setdefault("_unknown_tags", {})[tag] = buf[pos:end]
        pos = end
    for name, default in defaults:
        if name not in out and name not in regular_names:
            out[name] = copy_default(default)
    return out, pos


def _definition(defs, version):
    definition, use_version = find_definition(defs, version)
    return definition[3], use_version, in_range(definition[2], use_version)


def build(is_request: bool, api_key: int, api_version: int, header_version: int,
          body_definition) -> Any:
    """The generated decoder of one (api key, version, direction), or raises on a bad table.

    `body_definition` is the definition that supplies `api_version`.  The function takes the frame (bytes)
    (and for a response the caller's api key and version) and returns the Message
    of a clean decode, or None / raises for anything else.
    """
    g = _Gen()
    header_name = "RequestHeader" if is_request else "ResponseHeader"
    h_fields, h_version, h_flexible = _definition(STRUCTS[header_name], header_version)
    g.emit(1, "L = len(buf)")
    g.emit(1, "pos = 0")
    g.emit(1, f"E = {MAX_ELEMENTS_PER_MESSAGE}")
    g.struct(1, h_fields, h_version, h_flexible, False, "h")
    if not is_request and api_key == API_VERSIONS_KEY and api_version > 0:
        # An UNSUPPORTED_VERSION rejection has its own layout rules (see decode.py).
        g.emit(1, f"if buf[pos:pos + 2] == {struct.pack('>h', UNSUPPORTED_VERSION_CODE)!r}:")
        g.emit(2, "return None")
    g.struct(1, body_definition[3], api_version, in_range(body_definition[2], api_version), False, "b")
    g.emit(1, "if pos != L:")
    g.emit(2, "return None")
    if is_request:
        g.emit(1, f"return Message(True, {api_key}, {api_version}, h, b, [], None, L, {api_version})")
        return _compile(g, f"<kwinspect fast decoder Request {api_key} v{api_version}>")
    # The caller's own key and version objects go into the Message, as in the reference.
    g.emit(1, "return Message(False, api_key, api_version, h, b, [], None, L, api_version)")
    return _compile(g, f"<kwinspect fast decoder Response {api_key} v{api_version}>", "buf, api_key, api_version")


def build_struct(fields, version: int, flexible: bool) -> Any:
    """The generated decoder of a named struct: data -> value of a clean, complete decode, else None."""
    g = _Gen()
    g.emit(1, "L = len(buf)")
    g.emit(1, "pos = 0")
    g.emit(1, f"E = {MAX_ELEMENTS_PER_MESSAGE}")
    g.struct(1, fields, version, flexible, False, "d")
    g.emit(1, "if pos != L:")
    g.emit(2, "return None")
    g.emit(1, "return d")
    return _compile(g, "<kwinspect fast struct decoder>")


def _compile(g: _Gen, filename: str, args: str = "buf") -> Any:
    source = f"def decode({args}):\n" + "\n".join(g.lines) + "\n"
    namespace: dict[str, Any] = {
        "Bail": Bail, "Message": Message, "read_uvarint": read_uvarint, "read_tagged": read_tagged,
        "uuid_to_str": uuid_to_str, "unpack_from": struct.unpack_from, "I16": _I16, "I32": _I32,
        "parse": records_parser(), **g.consts,
    }
    exec(compile(source, filename, "exec"), namespace)  # noqa: S102 - source generated from our own tables
    fn = namespace["decode"]
    fn.source = source  # for debugging and tests
    return fn
