"""Decoding Kafka requests and responses: the public decode API and the reference decoder.

For each (api key, version, direction) the schema tables are compiled once into
a tree of small reader closures (protocol/layout.py) and cached, so the hot path
does no schema lookups.  Clean frames take the generated straight-line decoders
of protocol/fastdecode.py first; anything unusual is decoded by those closures,
the reference.  Decoding never raises on bad bytes: a reader raises
``DecodeStop``; each enclosing struct or array attaches what it had decoded so
far and its own path element while the signal unwinds, and the entry point
turns it into an Issue with the byte offset and field path.
"""

from __future__ import annotations

import struct
import threading
from typing import Any

from kwinspect.model import (
    DECODE_ERROR,
    SEVERITY_ERROR,
    SEVERITY_INFO,
    SEVERITY_WARNING,
    TRAILING_BYTES,
    UNKNOWN_API_KEY,
    UNSUPPORTED_VERSION,
    Issue,
    Message,
    plural,
)
from kwinspect.protocol import compiled, fastdecode
from kwinspect.protocol import primitives as p
from kwinspect.protocol.layout import (
    API_VERSIONS_KEY,
    MAX_ELEMENTS_PER_MESSAGE,
    STRUCTS,
    UNSUPPORTED_VERSION_CODE,
    Reader,
    body_schema,
    compile_struct,
    find_definition,
    in_range,
    is_flexible,
    request_header_version,
    response_header_version,
)
from kwinspect.protocol.layout import thread_state as _local
from kwinspect.protocol.primitives import DecodeStop
from kwinspect.protocol.schema.index import APIS

_MAX_API_KEY = max(APIS)
INTERNAL_ERROR = "internal_error"  # a bug in kwinspect, never bad input

# ---------------------------------------------------------------------------
# Compiled readers, cached per real version
# ---------------------------------------------------------------------------

_compiled: dict[tuple, Any] = {}
_lock = threading.Lock()


def _body_reader(api_key: int, version: int, is_request: bool):
    """(compiled reader, version it decodes) for a body; (None, None) for unknown keys."""
    key = (api_key, version, is_request)
    cached = _compiled.get(key)
    if cached is None:
        definition, use_version = body_schema(api_key, version, is_request)
        if definition is None:
            return None, None
        # Compile once per version actually decoded with, and remember only real
        # versions: garbage input carries arbitrary version numbers, which must
        # neither recompile readers nor grow the cache without bound.
        real = (api_key, use_version, is_request)
        cached = _compiled.get(real)
        if cached is None:
            with _lock:
                reader = compile_struct(definition[3], use_version, in_range(definition[2], use_version))
                cached = _compiled[real] = (reader, use_version)
    return cached


def _struct_reader(name: str, version: int):
    key = ("struct", name, version)
    cached = _compiled.get(key)
    if cached is None:
        defs = STRUCTS.get(name)
        if defs is None:
            return None, None
        definition, use_version = find_definition(defs, version)
        real = ("struct", name, use_version)  # see _body_reader: real versions only
        cached = _compiled.get(real)
        if cached is None:
            reader = compile_struct(definition[3], use_version, in_range(definition[2], use_version))
            cached = _compiled[real] = (reader, use_version)
    return cached


# ---------------------------------------------------------------------------
# Fast path: generated straight-line decoders (fastdecode.py) for clean frames.
# They are cached like the readers, for real versions only; False marks a
# version whose decoder could not be generated (the reference is used).
# ---------------------------------------------------------------------------

_fast_requests: dict[bytes, Any] = {}  # frame[:4] (api key + version bytes) -> decoder
_fast_responses: dict[tuple[int, int], Any] = {}
_fast_structs: dict[tuple[str, int], Any] = {}
_REQUEST_KEY = struct.Struct(">hh")


def _generate(build, *args):
    """The compiled decoder (protocol/compiled.py, when the extension is there), else the
    generated Python one; False where neither can be made (the reference then decides)."""
    compiled_build = compiled.struct_decoder if build is fastdecode.build_struct else compiled.message_decoder
    try:
        fast = compiled_build(*args)
    except Exception:  # noqa: BLE001 - a table the interpreter cannot express: the generated Python
        fast = None
    if fast is not None:
        return fast
    try:
        return build(*args)
    except Exception:  # noqa: BLE001 - a table the generator cannot express: reference only
        return False


def _or_false(make, *args):
    """A generated decoder, or False where none can be made (the reference then decides)."""
    try:
        return make(*args)
    except Exception:  # noqa: BLE001 - e.g. a version that is not an int: the reference reports it
        return False


def _new_fast_request_decoder(frame: bytes):
    if len(frame) < 4:
        return False
    api_key, api_version = _REQUEST_KEY.unpack_from(frame, 0)
    if api_key not in APIS:
        return False
    definition, use_version = body_schema(api_key, api_version, True)
    if definition is None or use_version != api_version:
        return False  # not cached: garbage versions must not grow the cache
    fast = _generate(fastdecode.build, True, api_key, api_version, request_header_version(api_key, api_version),
                     definition)
    _fast_requests[bytes(frame[:4])] = fast
    return fast


def _new_fast_response_decoder(api_key: int, api_version: int):
    if api_key not in APIS:
        return False
    definition, use_version = body_schema(api_key, api_version, False)
    if definition is None or use_version != api_version:
        return False
    fast = _generate(fastdecode.build, False, api_key, api_version, response_header_version(api_key, api_version),
                     definition)
    _fast_responses[(api_key, api_version)] = fast
    return fast


def _new_fast_struct_decoder(name: str, version: int):
    defs = STRUCTS.get(name)
    if defs is None:
        return False
    definition, use_version = find_definition(defs, version)
    if use_version != version:
        return False
    fast = _generate(fastdecode.build_struct, definition[3], version, in_range(definition[2], version))
    _fast_structs[(name, version)] = fast
    return fast


def clear_caches() -> None:
    """Forget every compiled reader, generated decoder and repeated response (benchmarks of
    the first decode)."""
    _compiled.clear()
    _repeated.clear()
    _fast_requests.clear()
    _fast_responses.clear()
    _fast_structs.clear()


# ---------------------------------------------------------------------------
# Entry points
# ---------------------------------------------------------------------------


def _stop_issue(stop: DecodeStop, prefix: str) -> Issue:
    parts = [x for x in reversed(stop.path) if x is not None]
    path = ""
    for part in parts:
        path += part if part.startswith("[") or not path else "." + part
    if prefix and path:
        path = f"{prefix}.{path}"
    elif prefix:
        path = prefix
    return Issue(getattr(stop, "kind", DECODE_ERROR), stop.reason, offset=stop.offset, path=path or None)


def _run(reader: Reader, buf, pos: int, prefix: str, issues: list[Issue]):
    """Run a reader; on DecodeStop return the partial value and record the issue."""
    _local.elements_left = MAX_ELEMENTS_PER_MESSAGE  # every top-level read has its own budget (ElementLimit)
    try:
        return reader(buf, pos)
    except DecodeStop as stop:
        issues.append(_stop_issue(stop, prefix))
        return (stop.partial if stop.has_partial else None), None
    finally:  # readers called outside a _run (the fast decoder's tagged fields) start full too
        _local.elements_left = MAX_ELEMENTS_PER_MESSAGE


def decode_struct(name: str, version: int, data: bytes) -> tuple[dict | None, list[Issue]]:
    """Decode a named non-API structure (ConsumerProtocolSubscription, internal-topic records...)."""
    if type(data) is bytes:
        fast = _fast_structs.get((name, version))
        if fast is None:
            fast = _or_false(_new_fast_struct_decoder, name, version)
        if fast:
            try:
                value = fast(data)
            except Exception:  # noqa: BLE001 - anything unusual: the reference decides
                value = None
            if value is not None:
                return value, []
    return decode_struct_reference(name, version, data)


def decode_struct_reference(name: str, version: int, data: bytes) -> tuple[dict | None, list[Issue]]:
    """decode_struct with the reference (closure) decoder only."""
    issues: list[Issue] = []
    reader, use_version = _struct_reader(name, version)
    if reader is None:
        return None, [Issue(DECODE_ERROR, f"no schema named {name}")]
    _local.notes = issues
    try:
        value, end = _run(reader, data, 0, "", issues)
    except Exception as exc:  # noqa: BLE001 - last line of defence, reported as a bug
        return None, [Issue(INTERNAL_ERROR, f"decoder bug: {exc!r}")]
    finally:
        _local.notes = None
    if use_version != version:
        issues.append(Issue(UNSUPPORTED_VERSION, f"{name} v{version} unknown; decoded as v{use_version}",
                            severity=SEVERITY_WARNING))
    if end is not None and end < len(data):
        issues.append(Issue(TRAILING_BYTES, f"{plural(len(data) - end, 'byte')} after {name}",
                            offset=end, severity=SEVERITY_WARNING))
    return value, issues


class DeferredMessage(Message):
    """A request or response the compiled scan found clean (protocol/_cdecode.c, scan_message):
    its header is decoded, its body is decoded from ``frame`` the first time it is read (then
    kept, so it is one object, changes included, as a decoded Message's), and ``facts`` holds
    what the scan noted of it for the rows and the summary: ``(topics, volumes, throttle_time_ms,
    acks)``, tuples, volumes ``(topic, records, bytes)`` per record set, as ``labels.topics_of`` and
    ``labels.iter_record_sets`` give them. The scan ran decoding's checks, so the decode cannot
    fail or report: the body is the one decode_request / decode_response would have given
    when the frame arrived. Made only by the C (slots set in place); pickled and copied as a
    plain Message with its body."""

    __slots__ = ("frame", "facts", "_body")

    @property  # type: ignore[override]
    def body(self) -> dict[str, Any] | None:
        try:
            return self._body
        except AttributeError:
            pass
        if self.is_request:
            msg = decode_request(self.frame)
        else:
            msg = decode_response(self.frame, self.api_key, self.api_version)  # type: ignore[arg-type]
        self._body = body = msg.body
        return body

    @body.setter
    def body(self, value: dict[str, Any] | None) -> None:
        self._body = value


def decode_request(frame: bytes) -> Message:
    """Decode one request (header + body, without the 4-byte size prefix)."""
    if type(frame) is bytes:
        fast = _fast_requests.get(frame[:4])  # keyed by the raw api key + version
        if fast is None:
            fast = _or_false(_new_fast_request_decoder, frame)
        if fast:
            try:
                msg = fast(frame)
            except Exception:  # noqa: BLE001 - anything unusual: the reference decides
                msg = None
            if msg is not None:
                return msg
    return decode_request_reference(frame)


def decode_request_reference(frame: bytes) -> Message:
    """decode_request with the reference (closure) decoder only; gives the exact issues."""
    issues: list[Issue] = []
    _local.notes = issues
    try:
        return _decode_request(frame, issues)
    except Exception as exc:  # noqa: BLE001 - last line of defence, reported as a bug
        issues.append(Issue(INTERNAL_ERROR, f"decoder bug: {exc!r}"))
        return Message(True, None, None, {}, None, issues, raw_body=bytes(frame), size=len(frame))
    finally:
        _local.notes = None


compiled.configure_deferred(DeferredMessage)


def _decode_request(frame, issues) -> Message:
    size = len(frame)
    if size < 4:
        issues.append(Issue(DECODE_ERROR, f"request of {size} bytes is too short for a header",
                            offset=0, path="header"))
        return Message(True, None, None, {}, None, issues, raw_body=bytes(frame), size=size)
    api_key = p.read_int16(frame, 0)[0]
    api_version = p.read_int16(frame, 2)[0]
    known = api_key in APIS
    if known:
        hv = request_header_version(api_key, api_version)
    else:
        # Every API added since flexible versions exist (KIP-482, Kafka 2.4) is
        # flexible from v0, so a key newer than our tables has header v2.
        hv = 2 if api_key > _MAX_API_KEY else 1
    header_reader, _ = _struct_reader("RequestHeader", hv)
    header, pos = _run(header_reader, frame, 0, "header", issues)
    header = header or {}
    if pos is None:
        return Message(True, api_key, api_version, header, None, issues, size=size)
    if not known:
        issues.append(Issue(UNKNOWN_API_KEY, f"api key {api_key} is not in the schema tables; body kept as bytes",
                            offset=0, path="header.request_api_key", severity=SEVERITY_WARNING))
        return Message(True, api_key, api_version, header, None, issues, raw_body=bytes(frame[pos:]), size=size)
    return _decode_body(frame, pos, api_key, api_version, True, header, issues)


def decode_response(frame: bytes, api_key: int, api_version: int) -> Message:
    """Decode one response, given the api key and version of its request."""
    if type(frame) is bytes:
        fast = _fast_responses.get((api_key, api_version))
        if fast is None:
            fast = _or_false(_new_fast_response_decoder, api_key, api_version)
        if fast:
            try:
                msg = fast(frame, api_key, api_version)
            except Exception:  # noqa: BLE001 - anything unusual: the reference decides
                msg = None
            if msg is not None:
                return msg
        if 4 <= len(frame) <= REPEAT_MAX_FRAME and type(api_key) is int and type(api_version) is int:
            return _decode_response_repeated(frame, api_key, api_version)
    return decode_response_reference(frame, api_key, api_version)


# ---------------------------------------------------------------------------
# Repeated unusual responses
# ---------------------------------------------------------------------------

# A response the fast decoders decline (issues, or a layout they cannot express) is
# decoded by the reference, ~50x slower. Small ones repeat byte for byte on many
# connections (a broker's ApiVersions rejection to every client of a newer version,
# a mock broker's Metadata with a trailing byte), differing only in the correlation
# id: the reference result depends on nothing else (its offsets count from the frame
# start, and the id is a fixed 4 bytes), so it is decoded once and copied.
REPEAT_MAX_FRAME = 1024  # bytes; larger frames rarely repeat and cost more to keep
REPEAT_MAX_ENTRIES = 256  # bounded: the oldest entry goes first
_repeated: dict[tuple, tuple] = {}
_PLAIN = (str, int, float, bool, bytes, type(None))


def _plain_copy(value: Any) -> Any:
    """A copy of a decoded value as fresh dicts and lists; raises TypeError for anything
    else (a value the memo must not share)."""
    t = type(value)
    if t is dict:
        return {k: _plain_copy(v) for k, v in value.items()}
    if t is list:
        return [_plain_copy(v) for v in value]
    if t in _PLAIN:
        return value
    raise TypeError(t)


def _decode_response_repeated(frame: bytes, api_key: int, api_version: int) -> Message:
    """decode_response_reference's result, from the memo when the same bytes after the
    correlation id were decoded before (key and version plain ints: the Message carries
    the caller's objects, which the memo does not keep)."""
    key = (api_key, api_version, frame[4:])
    hit = _repeated.get(key)
    cid = int.from_bytes(frame[:4], "big", signed=True)  # (frames of 4 bytes or more)
    if hit is None:
        msg = decode_response_reference(frame, api_key, api_version)
        header = msg.header
        if (len(header) != 1 or header.get("correlation_id") != cid
                or any(i.kind == INTERNAL_ERROR for i in msg.issues)):
            return msg
        try:
            body = _plain_copy(msg.body)
        except TypeError:
            return msg  # e.g. decoded records: not shared
        issues = tuple((i.kind, i.message, i.offset, i.path, i.severity) for i in msg.issues)
        if len(_repeated) >= REPEAT_MAX_ENTRIES:
            try:
                del _repeated[next(iter(_repeated))]
            except (KeyError, RuntimeError, StopIteration):  # another thread got there first
                pass
        _repeated[key] = (body, issues, msg.raw_body, msg.size, msg.decoded_version)
        return msg
    body, issues, raw_body, size, decoded_version = hit
    return Message(False, api_key, api_version, {"correlation_id": cid}, _plain_copy(body),
                   [Issue(*i) for i in issues], raw_body, size, decoded_version)


def decode_response_reference(frame: bytes, api_key: int, api_version: int) -> Message:
    """decode_response with the reference (closure) decoder only; gives the exact issues."""
    issues: list[Issue] = []
    _local.notes = issues
    try:
        return _decode_response(frame, api_key, api_version, issues)
    except Exception as exc:  # noqa: BLE001 - last line of defence, reported as a bug
        issues.append(Issue(INTERNAL_ERROR, f"decoder bug: {exc!r}"))
        return Message(False, api_key, api_version, {}, None, issues, raw_body=bytes(frame), size=len(frame))
    finally:
        _local.notes = None


def decode_response_header(frame: bytes, flexible: bool = False) -> tuple[dict, int | None, list[Issue]]:
    """Just the response header (v1 when `flexible`), for responses whose request is unknown."""
    issues: list[Issue] = []
    reader, _ = _struct_reader("ResponseHeader", 1 if flexible else 0)
    header, pos = _run(reader, frame, 0, "header", issues)
    return header or {}, pos, issues


def _decode_response(frame, api_key, api_version, issues) -> Message:
    known = api_key in APIS
    # A key newer than our tables is flexible (see _decode_request): header v1.
    hv = response_header_version(api_key, api_version) if known else (1 if api_key > _MAX_API_KEY else 0)
    header_reader, _ = _struct_reader("ResponseHeader", hv)
    header, pos = _run(header_reader, frame, 0, "header", issues)
    header = header or {}
    if pos is None:
        return Message(False, api_key, api_version, header, None, issues, size=len(frame))
    if not known:
        issues.append(Issue(UNKNOWN_API_KEY, f"api key {api_key} is not in the schema tables; body kept as bytes",
                            offset=0, severity=SEVERITY_WARNING))
        return Message(False, api_key, api_version, header, None, issues, raw_body=bytes(frame[pos:]), size=len(frame))
    if (api_key == API_VERSIONS_KEY and api_version > 0 and len(frame) >= pos + 2
            and p.read_int16(frame, pos)[0] == UNSUPPORTED_VERSION_CODE):
        return _decode_api_versions_rejection(frame, pos, api_version, header, issues)
    return _decode_body(frame, pos, api_key, api_version, False, header, issues)


def _decode_api_versions_rejection(frame, pos, api_version, header, issues) -> Message:
    """UNSUPPORTED_VERSION to ApiVersions: brokers answer in the v0 layout so any client can read it.

    Some brokers (librdkafka's mock cluster among them) answer in another layout;
    then the layout of the version asked for is tried, and if neither fits, the
    v0 reading (which always yields the error code) is kept with a warning.
    """
    layouts = (0, api_version)
    attempts = []
    for version in layouts:
        trial_issues: list[Issue] = []
        msg = _decode_body(frame, pos, API_VERSIONS_KEY, version, False, header, trial_issues)
        if not trial_issues:
            issues.append(Issue(UNSUPPORTED_VERSION,
                                f"broker rejected ApiVersions v{api_version} and answered in the v{version} layout",
                                offset=pos, severity=SEVERITY_INFO))
            msg.issues = issues
            msg.api_version, msg.decoded_version = api_version, version
            return msg
        attempts.append((msg, trial_issues))
    msg, trial_issues = attempts[0]
    issues.append(Issue(UNSUPPORTED_VERSION,
                        f"broker rejected ApiVersions v{api_version} (error 35) with a body that fits neither "
                        f"the v0 layout brokers use nor v{api_version}: {trial_issues[0].message}",
                        offset=trial_issues[0].offset, path=trial_issues[0].path, severity=SEVERITY_WARNING))
    msg.issues = issues
    msg.api_version, msg.decoded_version = api_version, 0
    return msg


def _decode_body(frame, pos, api_key, api_version, is_request, header, issues) -> Message:
    reader, use_version = _body_reader(api_key, api_version, is_request)
    if use_version != api_version:
        lo, hi = APIS[api_key][1], APIS[api_key][2]
        issues.append(Issue(UNSUPPORTED_VERSION,
                            f"{APIS[api_key][0]} v{api_version} is outside the known range v{lo}-v{hi}; "
                            f"decoded best-effort as v{use_version}",
                            offset=2 if is_request else None, path="header", severity=SEVERITY_WARNING))
    body, end = _run(reader, frame, pos, "", issues)
    if end is not None and end < len(frame):
        if is_request and api_key == API_VERSIONS_KEY and api_version == 0 and frame[end:] == b"\0\0\0\0":
            issues.append(Issue(TRAILING_BYTES, "4 zero bytes after an ApiVersions v0 request "
                                "(librdkafka pads it so old brokers accept it)", offset=end, severity=SEVERITY_INFO))
        else:
            side = "request" if is_request else "response"
            issues.append(Issue(TRAILING_BYTES, f"{plural(len(frame) - end, 'byte')} after the "
                                f"{APIS[api_key][0]} v{api_version} {side} body",
                                offset=end, severity=SEVERITY_WARNING))
    msg = Message(is_request, api_key, api_version, header, body if body is not None else {}, issues,
                  size=len(frame), decoded_version=use_version)
    return msg


__all__ = [
    "decode_request", "decode_response", "decode_response_header", "decode_struct",
    "request_header_version", "response_header_version", "is_flexible", "body_schema",
    "SEVERITY_ERROR",
]
