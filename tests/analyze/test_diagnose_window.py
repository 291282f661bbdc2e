"""The storm window keeps one timestamp, then a list, then a deque: it counts as the plain
deque it replaced did (the reference below), for any order of timestamps."""

from __future__ import annotations

from collections import deque

from hypothesis import given, settings
from hypothesis import strategies as st

from kwinspect.analyze.diagnose import core
from kwinspect.analyze.diagnose.core import Window


class _DequeWindow:
    """The window as it was written before (a deque from the first event)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.times: deque[float] = deque()
        self.best = 0
        self.best_span = None

    def add(self, ts):
        if ts is None:
            return len(self.times)
        self.times.append(ts)
        while self.times and (self.times[0] < ts - self.seconds or len(self.times) > core.MAX_WINDOW_EVENTS):
            self.times.popleft()
        if len(self.times) > self.best:
            self.best = len(self.times)
            self.best_span = (self.times[0], ts)
        return len(self.times)


@settings(max_examples=300, deadline=None)
@given(seconds=st.sampled_from([0.0, 1.0, 60.0]),
       times=st.lists(st.one_of(st.none(), st.floats(0, 200, allow_nan=False)), max_size=120),
       cap=st.sampled_from([3, 40, 10_000]))
def test_window_counts_as_the_deque_did(seconds, times, cap):
    saved = core.MAX_WINDOW_EVENTS
    core.MAX_WINDOW_EVENTS = cap
    try:
        new, ref = Window(seconds), _DequeWindow(seconds)
        for ts in sorted(t for t in times if t is not None) if len(times) % 2 else times:
            assert new.add(ts) == ref.add(ts)
            assert new.best == ref.best
    finally:
        core.MAX_WINDOW_EVENTS = saved


def test_a_window_of_one_or_two_events_is_small():
    """A window per client host (connection churn) costs no deque until it holds many."""
    import tracemalloc

    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        windows = [Window(60.0) for _ in range(2_000)]
        for i, w in enumerate(windows):
            w.add(float(i))
            w.add(float(i) + 1.0)
        per = (tracemalloc.get_traced_memory()[0] - base) / len(windows)
    finally:
        tracemalloc.stop()
    assert per < 300, f"{per:.0f} bytes a window"  # ~850 with a deque each
