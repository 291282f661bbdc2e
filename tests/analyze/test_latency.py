"""Latency percentiles against numpy (method="inverted_cdf" = nearest rank), plots open."""

from __future__ import annotations

import base64
import math
import re
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kwinspect.analyze.latency import (
    LATENCY_COLUMNS,
    TOTAL_GROUP,
    LatencyStats,
    nearest_rank,
    plot_latency,
    render_latency,
)
from kwinspect.model import Exchange


def ex(lat, api="Produce", *, broker="10.0.0.2:9092", client_id="app", topics=("t",),
       status="paired", ts=1_700_000_000.0, broker_id=None, client="10.0.0.1:5000"):
    return Exchange(
        stream=f"{client}->{broker}", client=client, broker=broker, api_key=0, api_name=api,
        api_version=9, correlation_id=1, client_id=client_id, request_ts=ts, response_ts=None,
        latency_ms=lat, request_size=1, response_size=1, status=status, topics=list(topics),
        broker_id=broker_id,
    )


def np_stats(values):
    a = np.asarray(values, dtype=float)
    return {
        # rows round the mean to microseconds, like every other latency
        "count": len(a), "mean_ms": pytest.approx(round(float(a.mean()), 3), abs=1.01e-3),
        "p50_ms": float(np.percentile(a, 50, method="inverted_cdf")),
        "p95_ms": float(np.percentile(a, 95, method="inverted_cdf")),
        "p99_ms": float(np.percentile(a, 99, method="inverted_cdf")),
        "max_ms": float(a.max()),
    }


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=300),
       st.sampled_from([1, 5, 25, 50, 90, 95, 99, 99.9, 100]))
def test_nearest_rank_equals_numpy_inverted_cdf(values, p):
    assert nearest_rank(sorted(values), p) == np.percentile(values, p, method="inverted_cdf")


def test_nearest_rank_small_cases_by_hand():
    assert nearest_rank([7.0], 99) == 7.0
    assert nearest_rank([1, 2, 3, 4], 50) == 2  # ceil(0.5*4)=2nd
    assert nearest_rank(list(range(1, 101)), 95) == 95
    assert nearest_rank(list(range(1, 21)), 95) == 19  # exact boundary: 0.95*20 = 19
    with pytest.raises(ValueError):
        nearest_rank([], 50)


def test_group_by_api_matches_numpy_and_skips_unpaired():
    rng = np.random.default_rng(7)
    produce = list(rng.lognormal(1, 1, 997))
    fetch = list(rng.lognormal(3, 0.5, 203))
    exs = [ex(v, "Produce") for v in produce] + [ex(v, "Fetch") for v in fetch]
    exs += [ex(None, "Produce", status="response_missing"), ex(5.0, "Fetch", status="request_missing"),
            ex(None, "Produce", status="no_response_expected"), ex(float("nan"), "Fetch")]
    s = LatencyStats("api").add_all(exs)
    assert s.skipped == 4
    rows = s.rows()
    assert all(list(r) == list(LATENCY_COLUMNS) for r in rows)
    by = {r["group"]: r for r in rows}
    assert [r["group"] for r in rows] == ["Produce", "Fetch", TOTAL_GROUP]
    for name, vals in (("Produce", produce), ("Fetch", fetch), (TOTAL_GROUP, produce + fetch)):
        got = {k: by[name][k] for k in ("count", "mean_ms", "p50_ms", "p95_ms", "p99_ms", "max_ms")}
        assert got == np_stats(vals), name
        assert by[name]["by"] == "api"


def test_group_by_broker_client_topic():
    exs = [
        ex(1.0, broker="b1:9092", broker_id=1, client_id="a", topics=["x", "y"]),
        ex(2.0, broker="b1:9092", client_id=None, client="10.9.9.9:1", topics=["x"]),
        ex(3.0, broker="b2:9092", client_id="a", topics=[]),
        ex(4.0, broker="b2:9092", client_id="", topics=["y", "y"]),
    ]
    assert LatencyStats("broker").add_all(exs).groups() == {"b1:9092 (id 1)": [1.0, 2.0],
                                                             "b2:9092": [3.0, 4.0]}
    assert LatencyStats("client").add_all(exs).groups() == {"a": [1.0, 3.0], "10.9.9.9:1": [2.0],
                                                             "": [4.0]}
    topic = LatencyStats("topic").add_all(exs)
    assert topic.groups() == {"x": [1.0, 2.0], "y": [1.0, 4.0]}
    assert [r["count"] for r in topic.rows() if r["group"] == TOTAL_GROUP] == [4]
    with pytest.raises(ValueError, match="cannot group"):
        LatencyStats("partition")


def test_render_escapes_group_names():
    import io

    from rich.console import Console

    buf = io.StringIO()
    s = LatencyStats("client").add_all([ex(1.0, client_id="evil\x1b[2J")])
    render_latency(s, Console(file=buf, width=120, force_terminal=True))
    out = re.sub(r"\x1b\[[0-9;]*m", "", buf.getvalue())
    assert "\x1b" not in out and "evil\\x1b[2J" in out


def _series():
    rng = np.random.default_rng(3)
    exs = []
    for i in range(3000):
        api = ["Produce", "Fetch", "Metadata", "<script>alert(1)</script>"][i % 4]
        exs.append(ex(float(rng.lognormal(1, 1)), api, ts=1_700_000_000 + i * 0.05))
    return LatencyStats("api", keep_series=True).add_all(exs)


def test_png_plot_opens(tmp_path):
    import matplotlib.image as mpimg

    path = plot_latency(_series(), tmp_path / "lat.png")
    img = mpimg.imread(path)
    assert img.ndim == 3 and img.shape[0] > 400 and img.shape[1] > 600
    assert float(img[..., :3].std()) > 0.01  # not a blank canvas


def test_svg_plot_is_valid_xml(tmp_path):
    path = plot_latency(_series(), tmp_path / "lat.svg")
    root = ET.parse(path).getroot()
    assert root.tag.endswith("svg")


def test_html_report_is_self_contained_and_escaped(tmp_path):
    path = plot_latency(_series(), tmp_path / "lat.HTML")
    text = path.read_text(encoding="utf-8")
    assert "<script" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert not re.search(r"(src|href)=\"https?:", text)
    m = re.search(r'src="data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)"', text)
    assert m, "figure not inlined"
    svg = base64.b64decode(m.group(1))
    assert ET.fromstring(svg).tag.endswith("svg")
    assert "nearest-rank" in text and "p99" in text


def test_plot_of_nothing_still_writes_a_file(tmp_path):
    s = LatencyStats("api", keep_series=True).add_all([ex(None, status="response_missing")])
    path = plot_latency(s, tmp_path / "empty.png")
    assert path.stat().st_size > 1000


def test_plot_rejects_unknown_extension_and_missing_series(tmp_path):
    with pytest.raises(ValueError, match=r"\.png, \.svg or \.html"):
        plot_latency(_series(), tmp_path / "lat.jpg")
    with pytest.raises(ValueError, match="keep_series"):
        plot_latency(LatencyStats("api"), tmp_path / "lat.png")


def test_means_in_the_cli_output_are_rounded_to_microseconds(tmp_path):
    import json
    import subprocess
    import sys
    from pathlib import Path

    capture = Path(__file__).resolve().parents[2] / "captures" / "confluent-mock-produce-consume.pcap"
    out = subprocess.run([sys.executable, "-m", "kwinspect.cli", "latency", str(capture), "-F", "jsonl"],
                         check=True, capture_output=True, text=True).stdout
    rows = [json.loads(line) for line in out.splitlines()]
    assert rows
    for r in rows:
        for k in ("mean_ms", "p50_ms", "p95_ms", "p99_ms", "max_ms"):
            assert round(r[k], 3) == r[k], (k, r[k])


@pytest.mark.parametrize("by", ["api", "topic"])
def test_long_groups_become_counts_with_the_same_figures(monkeypatch, by):
    """Past COMPACT_AT values, a group of microsecond latencies is kept as a count per
    distinct value: its rows still equal numpy's over every value, and --jobs' merge of a
    compacted part with an array part gives them too."""
    from kwinspect.analyze import latency

    monkeypatch.setattr(latency, "COMPACT_AT", 2_000)
    monkeypatch.setattr(latency, "CHECK_EVERY", 500)
    rng = np.random.default_rng(11)
    produce = [round(float(v), 2) for v in rng.lognormal(0, 0.3, 9_000)]  # ~200 distinct
    fetch = [round(float(v)) + 0.001 for v in rng.lognormal(4, 0.2, 3_000)]
    exs = [ex(v, "Produce", topics=("p",)) for v in produce] + [ex(v, "Fetch", topics=("f",)) for v in fetch]
    rng.shuffle(exs)
    whole = LatencyStats(by).add_all(exs)
    assert any(isinstance(v, latency.LatencyCounts) for v in whole._groups.values())  # noqa: SLF001
    first, second = LatencyStats(by).add_all(exs[:8_000]), LatencyStats(by).add_all(exs[8_000:])
    first.merge_parts(second.parts())
    truth = {"Produce": produce, "Fetch": fetch, "p": produce, "f": fetch,
             TOTAL_GROUP: [e.latency_ms for e in exs]}
    for s in (whole, first):
        rows = {r["group"]: r for r in s.rows()}
        assert set(rows) == ({"Produce", "Fetch"} if by == "api" else {"p", "f"}) | {TOTAL_GROUP}
        for group, r in rows.items():
            want = np_stats(truth[group])
            want["mean_ms"] = round(math.fsum(truth[group]) / len(truth[group]), 3)  # exact, any order
            assert {k: r[k] for k in want} == want, group


def test_counts_keep_memory_by_distinct_values(monkeypatch):
    import tracemalloc

    from kwinspect.analyze import latency

    monkeypatch.setattr(latency, "COMPACT_AT", 4_096)
    monkeypatch.setattr(latency, "CHECK_EVERY", 1_024)
    e = [ex(float(i % 50), "Produce") for i in range(1_000)]
    s = LatencyStats("api", keep_total=False)
    s.add_all(e * 10)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for _ in range(200):  # 200,000 more values, 50 distinct
            s.add_all(e)
        grown = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert grown < 100_000, grown  # an array would have grown by 1.6 MB
    (row,) = s.rows(include_total=False)
    assert (row["count"], row["p50_ms"], row["max_ms"]) == (210_000, 24.0, 49.0)
