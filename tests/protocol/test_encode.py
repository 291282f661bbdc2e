"""The encoder is the decoder's inverse: decode -> encode gives the original bytes.

Oracles: frames kio (an independent implementation, see test_decode_kio.py)
encodes, at every (api, version, direction) it knows, with edge and random
values; and every frame of the shipped and public captures that decodes
cleanly.  A changed value is encoded as kio encodes the changed entity.
"""

from __future__ import annotations

import collections
import dataclasses
import struct
from pathlib import Path

import pytest
from hypothesis import given

from kwinspect.capture.readers import open_capture
from kwinspect.dissect import DissectConfig, Dissector
from kwinspect.model import Message
from kwinspect.protocol import decode_request, decode_response
from kwinspect.protocol.encode import EncodeError, encode_request, encode_response, encode_struct
from kwinspect.protocol.records import RecordSet
from kwinspect.run.loop import PacketLoop
from tests.protocol.test_decode_kio import (
    KNOWN_CASES,
    SETTINGS,
    _entity_class,
    edge_instance,
    entity_strategy,
)
from tests.protocol.test_decode_kio import encode_request as kio_request
from tests.protocol.test_decode_kio import encode_response as kio_response

ROOT = Path(__file__).resolve().parents[2]
CAPTURES = sorted((ROOT / "captures").glob("*.pcap")) + sorted(
    (ROOT.parent / "shared" / "captures-public").glob("*.pcap*"))


def _kio_frame(entity, direction: str) -> bytes:
    return kio_request(entity) if direction == "request" else kio_response(entity)


def _reencode(frame: bytes, key: int, version: int, direction: str, like: bool) -> bytes:
    if direction == "request":
        return encode_request(decode_request(frame), like=frame if like else None)
    return encode_response(decode_response(frame, key, version), like=frame if like else None)


@pytest.mark.parametrize(("api_key", "name", "version", "direction"), KNOWN_CASES)
def test_kio_frames_encode_back_to_their_bytes(api_key, name, version, direction):
    cls = _entity_class(name, version, direction)
    for mode in ("low", "high"):
        frame = _kio_frame(edge_instance(cls, mode), direction)
        # kio, like Kafka, leaves tagged fields at their defaults off the wire:
        # the encoder's own rule gives its bytes without being shown the frame
        assert _reencode(frame, api_key, version, direction, like=False) == frame
        assert _reencode(frame, api_key, version, direction, like=True) == frame

    @SETTINGS
    @given(entity_strategy(cls))
    def random_values(entity):
        frame = _kio_frame(entity, direction)
        assert _reencode(frame, api_key, version, direction, like=True) == frame

    random_values()


def _string_fields(entity):
    return [f.name for f in dataclasses.fields(entity) if isinstance(getattr(entity, f.name), str)]


@pytest.mark.parametrize(("name", "version"), [("find_coordinator", 2), ("join_group", 9), ("join_group", 5),
                                               ("sync_group", 5), ("sasl_handshake", 1),
                                               ("init_producer_id", 5)])
def test_a_changed_string_is_encoded_as_kio_encodes_it(name, version):
    """Sanitizing changes strings (lengths move, compact and classic): kio says what the bytes must be."""
    cls = _entity_class(name, version, "request")
    entity = edge_instance(cls, "high")
    frame = kio_request(entity)
    msg = decode_request(frame)
    changed_entity, body = entity, dict(msg.body)
    for field in _string_fields(entity):
        new = "pseudonym-" + field
        changed_entity = dataclasses.replace(changed_entity, **{field: new})
        body[field] = new
    assert body != msg.body, "the case changes nothing: pick an entity with top-level strings"
    changed = Message(True, msg.api_key, msg.api_version, msg.header, body)
    assert encode_request(changed, like=frame) == kio_request(changed_entity)


def test_values_that_do_not_fit_are_refused_with_their_path():
    frame = kio_request(edge_instance(_entity_class("metadata", 12, "request"), "high"))
    msg = decode_request(frame)
    msg.body["topics"][0]["name"] = 5
    with pytest.raises(EncodeError, match=r"topics.\[0\].name: int where a string belongs"):
        encode_request(msg)
    del msg.body["topics"]
    with pytest.raises(EncodeError, match="topics: missing"):
        encode_request(msg)
    with pytest.raises(EncodeError, match="no schema named Nope"):
        encode_struct("Nope", 0, {})


def comparable(x):
    """Bodies compare by value: record sets by their bytes, dicts whatever their key order."""
    if isinstance(x, dict):
        return sorted((k, comparable(v)) for k, v in x.items())
    if isinstance(x, list):
        return [comparable(v) for v in x]
    if isinstance(x, RecordSet):
        return ("records", x.raw)
    return (type(x).__name__, x)


def _capture_frames(path: Path):
    frames = []
    d = Dissector(DissectConfig(), on_frame=lambda stream, direction, frame: frames.append(
        (stream, direction, bytes(frame))))
    with open_capture(path) as source:
        for _ in PacketLoop(d).run(source):
            pass
    return frames


def test_every_clean_capture_frame_encodes_back_to_its_bytes():
    counts = collections.Counter()
    wrong = []
    for path in CAPTURES:
        pending = {}
        for stream, direction, frame in _capture_frames(path):
            if direction == "request":
                msg = decode_request(frame)
                pending[(stream, msg.correlation_id)] = (msg.api_key, msg.api_version)
                encode = encode_request
            else:
                if len(frame) < 4 or (kv := pending.pop((stream, struct.unpack_from(">i", frame)[0]), None)) is None:
                    continue
                msg = decode_response(frame, *kv)
                encode = encode_response
            if msg.issues or msg.body is None:
                counts["not clean"] += 1
                continue
            counts[direction] += 1
            if encode(msg, like=frame) != frame:
                wrong.append((path.name, direction, msg.api_key, msg.api_version, msg.correlation_id))
            plain = encode(msg)  # without the frame: Kafka's rule, tagged fields at defaults left out
            if plain != frame:
                counts["tagged defaults on the wire"] += 1
                again = decode_request(plain) if direction == "request" else decode_response(plain, *kv)
                assert (again.issues, comparable(again.body)) == ([], comparable(msg.body))
    assert wrong == []
    # the shipped captures alone hold over a thousand clean frames, some hundreds each way
    assert counts["request"] > 400 and counts["response"] > 400, counts
    # tansu writes every tagged field of its ApiVersions and Fetch responses
    assert counts["tagged defaults on the wire"] > 0, counts
