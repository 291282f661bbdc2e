"""Replay every input the fuzzers ever broke kwinspect with (tests/fuzz_regressions/*.json).

Each file is ``{"message": why it failed, "case": {...}}`` written by
``tests/fuzz/harness.save_regression`` (bench/fuzz.py writes them on a crash);
the case runs through the same target and invariants again and must now pass.
"""

from __future__ import annotations

import pytest
from fuzz.harness import FuzzFailure, check, load_regressions

from kwinspect.model import Endpoint
from kwinspect.protocol import decode_response
from kwinspect.stream.conversation import Conversation
from kwinspect.stream.labels import iter_errors

CASES = load_regressions()


def test_there_are_regressions_to_replay():
    assert CASES, "tests/fuzz_regressions holds no reproducers"


@pytest.mark.parametrize("name,case", CASES, ids=[n for n, _ in CASES])
def test_replay(name, case):
    try:
        check(case)
    except FuzzFailure as exc:
        pytest.fail(f"{name}: {exc}")


def test_error_walk_skips_unknown_tag_keys():
    # found by the dissect fuzzer: `_unknown_tags` maps int tags to bytes, and the error
    # walk called str methods on every key
    body = {"error_code": 0, "_unknown_tags": {7: b"\x01"},
            "topics": [{"name": "t", "error_code": 3, "_unknown_tags": {0: b""}}]}
    errors = list(iter_errors(body))
    assert [(e["code"], e["topic"]) for e in errors] == [(3, "t")]


def test_partial_api_versions_body_does_not_crash_pairing():
    # found by the dissect fuzzer: an ApiVersions v0 response cut inside its api_keys
    # array left partial entries, and the advertised-range table indexed them blindly
    conv = Conversation(Endpoint("10.0.0.1", 40000), Endpoint("10.0.0.2", 9092))
    request = b"\x00\x12\x00\x03\x00\x00\x00\x01\x00\x01c\x00" + b"\x02a\x02b\x00"  # ApiVersions v3, cid 1
    # error 0, 2 api keys: one complete (0, 0..9) with an unknown tag, the second cut before max_version
    response = (b"\x00\x00\x00\x01" + b"\x00\x00" + b"\x03" + b"\x00\x00\x00\x00\x00\x09"
                + b"\x01\x00\x05abcde" + b"\x00\x03\x00\x00")
    partial = decode_response(response, 18, 3)
    assert partial.body["api_keys"][1] == {"api_key": 3, "min_version": 0}  # the input we mean
    conv.on_request(request, 1.0, 1.0)
    conv.on_response(response, 1.1, 1.1)
    assert conv.advertised == {0: (0, 9)}
    events = conv.pop_events()
    assert any(getattr(ev, "api_key", None) == 18 for ev in events)
