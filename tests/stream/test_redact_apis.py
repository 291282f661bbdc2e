"""redact_body acts only on REDACTED_APIS: for every other api it changes nothing."""

from __future__ import annotations

import copy

from hypothesis import given, settings
from hypothesis import strategies as st

from kwinspect.stream.redact import REDACTED_APIS, redact_body

VALUES = st.one_of(st.none(), st.binary(max_size=8), st.text(max_size=5), st.integers(-2, 2))
BODIES = st.dictionaries(st.sampled_from(["auth_bytes", "hmac", "tokens", "mechanism", "x"]),
                         st.one_of(VALUES, st.lists(st.dictionaries(st.sampled_from(["hmac", "y"]), VALUES),
                                                    max_size=3)), max_size=5)


@settings(max_examples=300, deadline=None)
@given(api=st.integers(-1, 80), is_request=st.booleans(), body=BODIES,
       mechanism=st.sampled_from([None, "PLAIN", "SCRAM-SHA-256", "OAUTHBEARER", "GSSAPI"]))
def test_other_apis_are_left_alone(api, is_request, body, mechanism):
    before = copy.deepcopy(body)
    redact_body(api, is_request, body, mechanism)
    if api not in REDACTED_APIS:
        assert body == before


def test_the_listed_apis_do_redact():
    for api, is_request, body in ((36, True, {"auth_bytes": b"\x00u\x00secret"}), (38, False, {"hmac": b"k"}),
                                  (39, True, {"hmac": b"k"}), (40, True, {"hmac": b"k"}),
                                  (41, False, {"tokens": [{"hmac": b"k"}]})):
        before = copy.deepcopy(body)
        redact_body(api, is_request, body, "PLAIN")
        assert body != before and api in REDACTED_APIS


@settings(max_examples=300, deadline=None)
@given(api=st.sampled_from(sorted(REDACTED_APIS)), is_request=st.booleans(), body=BODIES,
       mechanism=st.sampled_from([None, "PLAIN", "SCRAM-SHA-256", "OAUTHBEARER", "GSSAPI"]))
def test_the_listed_apis_never_raise_on_odd_bodies(api, is_request, body, mechanism):
    # found by the test above: DescribeDelegationToken with {"tokens": 1} raised TypeError
    redact_body(api, is_request, body, mechanism)
