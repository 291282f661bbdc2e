"""SharedState.broker_id_for keeps its answers while `brokers` is unchanged: they must be the
uncached answers however `brokers` is mutated or replaced in between."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kwinspect.model import Endpoint
from kwinspect.stream.conversation import SharedState

HOSTS = st.sampled_from(["10.0.0.1", "10.0.0.2", "::1"])
PORTS = st.sampled_from([9092, 9093])
OPS = st.lists(st.one_of(
    st.tuples(st.just("ask"), HOSTS, PORTS),
    st.tuples(st.just("set"), st.integers(0, 3), st.tuples(HOSTS, PORTS)),
    st.tuples(st.just("del"), st.integers(0, 3)),
    st.tuples(st.just("replace"), st.dictionaries(st.integers(0, 3), st.tuples(HOSTS, PORTS), max_size=4)),
    st.tuples(st.just("learn"), st.integers(-1, 3), HOSTS, PORTS),
), max_size=40)


@settings(max_examples=300, deadline=None)
@given(ops=OPS)
def test_cached_broker_ids_are_the_uncached_ones(ops):
    shared = SharedState()
    for op in ops:
        if op[0] == "ask":
            ep = Endpoint(op[1], op[2])
            assert shared.broker_id_for(ep) == shared._broker_id_for(ep)
        elif op[0] == "set":
            shared.brokers[op[1]] = op[2]
        elif op[0] == "del":
            shared.brokers.pop(op[1], None)
        elif op[0] == "replace":
            shared.brokers = op[1]
        else:
            shared.learn(3, {"brokers": [{"node_id": op[1], "host": op[2], "port": op[3]}]})


def test_cache_does_not_change_equality_or_repr():
    a, b = SharedState(), SharedState()
    a.broker_id_for(Endpoint("10.0.0.1", 9092))
    assert a == b and repr(a) == repr(b)
