"""The compiled decoder of clean frames (``_cdecode.c``), or None: the facade decode.py asks.

``_cdecode`` is a small interpreter in C; what it interprets is built here, once per
(api key, version, direction) or named struct, from the schema tables with the layout
rules fastdecode.py generates its Python from (``fastdecode.struct_layout``,
``tag_table``, ``layout.min_size``): one source of truth, two back ends. It builds the
same objects the generated Python builds and gives up (None) where that code gives
up, so decode.py uses it in place of the generated function and the reference
decoder still makes every issue. RECORDS fields of whole v2 batches with right
CRCs become the same RecordSet/RecordBatch objects records.parse_record_set makes
(anything else: that parser reads the field). Where the extension is not built, or
``KWINSPECT_PURE=1``, ``available()`` is False and the generated Python runs.

A program is nested tuples of ints, strs and the Python objects the C hands back
(tagged-field tables, defaults): ``struct = (flexible, names, fields, tag_table,
defaults)``, ``field = (op, compact, nullable, inner op, least element size, child
struct)``.
"""

from __future__ import annotations

import sys
from functools import partial
from typing import Any

from kwinspect.core import load
from kwinspect.model import Message
from kwinspect.protocol import checksums, records
from kwinspect.protocol.codecs import DEFAULT_LIMITS, codec_name
from kwinspect.protocol.fastdecode import read_tagged, struct_layout, tag_table
from kwinspect.protocol.layout import (
    API_VERSIONS_KEY,
    MAX_ELEMENTS_PER_MESSAGE,
    STRUCTS,
    body_schema,
    find_definition,
    in_range,
    min_size,
    records_parser,
    request_header_version,
    response_header_version,
)
from kwinspect.protocol.primitives import FIXED_SIZES
from kwinspect.protocol.schema.index import APIS

_c = load("kwinspect.protocol._cdecode")

# The C functions (None without the extension; tests set them to None for the Python core).
compile_program = _c.compile if _c is not None else None
decode_request = _c.decode_request if _c is not None else None
decode_response = _c.decode_response if _c is not None else None
decode_struct = _c.decode_struct if _c is not None else None
scan_request = _c.scan_request if _c is not None else None
scan_response = _c.scan_response if _c is not None else None

# _cdecode.c's op numbers
OPS = {"bool": 0, "int8": 1, "int16": 2, "uint16": 3, "int32": 4, "uint32": 5, "int64": 6, "float64": 7,
       "uuid": 8, "string": 9, "bytes": 10, "records": 11, "struct": 12}
ARRAY = 13
_KIND_STRUCT, _KIND_REQUEST, _KIND_RESPONSE = 0, 1, 2

_configured = False


def available() -> bool:
    return compile_program is not None


def _configure() -> None:
    global _configured
    if not _configured and _c is not None:
        _c.configure(Message, read_tagged, records_parser())
        # whole, clean v2 batches are read in C too (records.parse_record_set is the reference)
        _c.configure_records(records.RecordSet, records.RecordBatch, checksums.crc32c,
                             tuple(codec_name(i) for i in range(8)), records.TIMESTAMP_CREATE,
                             records.TIMESTAMP_LOG_APPEND, DEFAULT_LIMITS)
        _configured = True


def _struct(fields, version: int, flexible: bool) -> tuple:
    regular, tagged = struct_layout(fields, version, flexible)
    names = tuple(sys.intern(name) for name, *_ in regular)
    ops = tuple(_field(ftype, fnull, compact, children, version, flexible)
                for _name, ftype, fnull, compact, children in regular)
    if not flexible:
        return (0, names, ops, None, ())
    # an absent tagged field gets its default unless a regular field has its name
    present, defaults = set(names), []
    for name, default in tagged:
        if name not in present:
            present.add(name)
            defaults.append((sys.intern(name), default))
    return (1, names, ops, tag_table(fields, version, flexible, tagged, frozenset(names)), tuple(defaults))


def _field(ftype: str, nullable: bool, compact: bool, children, version: int, flexible: bool) -> tuple:
    if ftype in OPS and ftype != "struct":
        return (OPS[ftype], int(compact), int(nullable), 0, 0, None)
    if ftype == "struct":
        return (OPS["struct"], int(compact), int(nullable), 0, 0, _struct(children, version, flexible))
    inner = ftype[2:] if ftype.startswith("[]") else None
    if inner == "struct":
        least = min_size(children, version, flexible)
        return (ARRAY, int(compact), int(nullable), OPS["struct"], max(least, 1), _struct(children, version, flexible))
    if inner in OPS:
        least = FIXED_SIZES.get(inner, 1 if compact else 2)
        return (ARRAY, int(compact), int(nullable), OPS[inner], max(least, 1), None)
    raise ValueError(f"field type {ftype!r} has no compiled reader")


def _definition(defs, version: int):
    definition, use_version = find_definition(defs, version)
    return definition[3], use_version, in_range(definition[2], use_version)


def message_decoder(is_request: bool, api_key: int, api_version: int, header_version: int,
                    body_definition) -> Any:
    """The compiled decoder of one (api key, version, direction) with fastdecode.build's
    signature ((frame) or (frame, api_key, api_version) -> Message | None), or None
    without the extension. Raises on a table it cannot express (the caller then uses
    the generated Python)."""
    if compile_program is None:
        return None
    _configure()
    h_fields, h_version, h_flexible = _definition(STRUCTS["RequestHeader" if is_request else "ResponseHeader"],
                                                  header_version)
    program = compile_program((
        _KIND_REQUEST if is_request else _KIND_RESPONSE,
        _struct(h_fields, h_version, h_flexible),
        _struct(body_definition[3], api_version, in_range(body_definition[2], api_version)),
        # an UNSUPPORTED_VERSION ApiVersions response is left to the reference (see decode.py)
        int(not is_request and api_key == API_VERSIONS_KEY and api_version > 0), api_key, api_version, MAX_ELEMENTS_PER_MESSAGE))
    return partial(decode_request if is_request else decode_response, program)


def exchange_decoder(is_request: bool, api_key: int, api_version: int) -> Any:
    """The compiled decoder decode.py's decode_request / decode_response would use for this
    direction, api key and version (made under the same conditions: a known key, a version
    the tables have), or None where decode.py would use something else (no extension, a
    version decoded as another, a table the interpreter cannot express). For the compiled
    conversation (stream/_cconv.c), which caches it: what it returns is exactly what
    decode.py returns for a frame it decodes (None: decode.py decides)."""
    if compile_program is None or api_key not in APIS:
        return None
    definition, use_version = body_schema(api_key, api_version, is_request)
    if definition is None or use_version != api_version:
        return None
    header_version = (request_header_version if is_request else response_header_version)(api_key, api_version)
    try:
        return message_decoder(is_request, api_key, api_version, header_version, definition)
    except Exception:  # noqa: BLE001 - a table the interpreter cannot express (decode.py: the generated Python)
        return None


def exchange_scanner(is_request: bool, api_key: int, api_version: int) -> Any:
    """The scan twin of exchange_decoder's decoder (frame -> DeferredMessage | None, with the
    same arguments), or None where there is no such decoder: the same checks as decoding, the
    header built, the body noted (its topics, record-set volumes, throttle and acks) and decoded
    only when read (see _cdecode.c's scan_message). For the compiled conversation's commands
    that read no bodies (stream/_cconv.c, which caches it)."""
    scan = scan_request if is_request else scan_response
    decoder = exchange_decoder(is_request, api_key, api_version) if scan is not None else None
    if decoder is None:
        return None
    return partial(scan, decoder.args[0])


def configure_deferred(cls: type) -> None:
    """Name the Message subclass the scanners make (protocol/decode.py's DeferredMessage)."""
    if _c is not None:
        _configure()
        _c.configure_deferred(cls)


def struct_decoder(fields, version: int, flexible: bool) -> Any:
    """The compiled decoder of a named struct (data -> dict | None), or None without the extension."""
    if compile_program is None:
        return None
    _configure()
    program = compile_program((_KIND_STRUCT, None, _struct(fields, version, flexible), 0, 0, 0,
                               MAX_ELEMENTS_PER_MESSAGE))
    return partial(decode_struct, program)
