from __future__ import annotations

import io

from kwinspect.export.progress import Progress, interrupted_message


class FakeTty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_silent_when_stderr_is_not_a_terminal():
    buf = io.StringIO()
    with Progress(total=100, description="reading x.pcap", stream=buf) as p:
        assert not p.enabled
        for i in range(10):
            p.update(i * 10, rows=i)
    assert buf.getvalue() == ""
    assert p.completed == 90 and p.rows == 9


def test_progress_draws_on_a_terminal():
    buf = FakeTty()
    with Progress(total=1000, description="reading x.pcap", stream=buf) as p:
        assert p.enabled
        p.update(500, rows=3)
        p.advance(250)
    assert p.completed == 750
    assert "reading x.pcap" in buf.getvalue()


def test_interrupted_message_says_how_far_it_got():
    p = Progress(total=200, stream=io.StringIO())
    p.update(50)
    msg = interrupted_message(p, {"exchanges": 1234})
    assert msg == "interrupted after 25% of the input: wrote 1,234 exchanges (output is complete up to there)"
    assert "\n" not in msg
    assert interrupted_message(None, {}) == "interrupted: wrote nothing (output is complete up to there)"
