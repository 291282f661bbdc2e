"""The conversation's C rounds latency_ms as Python's round(x, 3) does (stream/_cconv.c
round3): Python's own round() is the oracle, on latencies as captures give them
(differences of microsecond timestamps, times 1000), halves, negatives, zeros and
arbitrary floats; where the C is unsure it must say so (None) rather than differ."""

from __future__ import annotations

import math
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kwinspect import core

_c = core.load("kwinspect.stream._cconv")
pytestmark = pytest.mark.skipif(_c is None, reason="the compiled core is not built")


def _same(x: float) -> None:
    got = _c.round3(x)
    if got is None:
        return  # left to round() itself
    want = round(x, 3)
    assert struct.pack(">d", got) == struct.pack(">d", want), (x, got, want)  # bit for bit, sign of zero too


@settings(max_examples=3000, deadline=None)
@given(t0=st.integers(1_600_000_000_000_000, 1_900_000_000_000_000), dt=st.integers(-10_000, 10**9))
def test_latencies_of_microsecond_timestamps(t0, dt):
    req, resp = t0 / 1e6, (t0 + dt) / 1e6
    _same((resp - req) * 1000.0)


@settings(max_examples=3000, deadline=None)
@given(x=st.floats(allow_nan=False, allow_infinity=False))
def test_any_float(x):
    _same(x)


@settings(max_examples=1000, deadline=None)
@given(n=st.integers(-10**12, 10**12))
def test_halves_and_near_halves(n):
    for x in (n / 2000, (n + 0.5) / 1000, math.nextafter(n / 2000, math.inf), math.nextafter(n / 2000, -math.inf)):
        _same(x)


def test_edges():
    for x in (0.0, -0.0, -0.0001, 0.0004, 0.0005, 0.0015, 2.675, -2.675, 1e9, 1e6, 999999.9995, math.inf,
              -math.inf, math.nan, 5e-324):
        got = _c.round3(x)
        if got is not None:
            _same(x)
    assert _c.round3(0.496000000001) == 0.496  # the common case is taken by the C
