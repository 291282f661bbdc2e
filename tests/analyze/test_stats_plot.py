"""`kwinspect stats --plot`: the files written are real PNG/SVG/HTML with the series in them.

What must be drawn comes from `kwinspect summary -F json` of the same capture (the apis
and topics it saw), not from the plotting code."""

from __future__ import annotations

import base64
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from kwinspect.cli import main

CAPTURES = Path(__file__).resolve().parents[2] / "captures"
PCAP = CAPTURES / "confluent-mock-produce-consume.pcap"


def _summary(pcap: Path, capsys) -> dict:
    capsys.readouterr()
    assert main(["summary", "-q", "-F", "json", str(pcap)]) == 0
    return json.loads(capsys.readouterr().out)


def _plot(tmp_path: Path, name: str, *args: str, pcap: Path = PCAP) -> Path:
    out = tmp_path / name
    assert main(["stats", "-q", str(pcap), "-i", "100ms", "-o", str(tmp_path / "rows.jsonl"),
                 "--plot", str(out), *args]) == 0
    return out


def test_png_is_a_png_with_coloured_lines(tmp_path):
    import matplotlib.image as mpimg

    path = _plot(tmp_path, "s.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    img = mpimg.imread(path)
    assert img.ndim == 3 and img.shape[0] > 800 and img.shape[1] > 800
    rgb = (img[..., :3] * 255).round().astype(int)
    # matplotlib's first two line colours (C0 #1f77b4, C1 #ff7f0e): the busiest lines were drawn
    for colour in ((0x1F, 0x77, 0xB4), (0xFF, 0x7F, 0x0E)):
        assert int((np.abs(rgb - np.array(colour)).sum(axis=-1) < 30).sum()) > 200, colour


def test_html_page_names_every_api_and_inlines_the_figure(tmp_path, capsys):
    apis = [a["api"] for a in _summary(PCAP, capsys)["apis"]]
    text = _plot(tmp_path, "s.html").read_text(encoding="utf-8")
    assert "<script" not in text and not re.search(r"(src|href)=\"https?:", text)
    table = text.split("<tbody>")[1].split("</tbody>")[0]
    assert sorted(re.findall(r"<tr><td>([^<]+)</td>", table)) == sorted(apis)
    m = re.search(r'src="data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)"', text)
    assert m, "figure not inlined"
    svg = base64.b64decode(m.group(1)).decode("utf-8")
    assert ET.fromstring(svg).tag.endswith("svg")
    for title in ("requests/s per api", "p99 latency per api", "bytes/s produced and fetched"):
        assert title in svg
    # the busiest apis have their own line, named in the legend
    busiest = sorted(_summary(PCAP, capsys)["apis"], key=lambda a: (-a["count"], a["api"]))[:8]
    legend = set(re.findall(r"<text[^>]*>([^<]+)</text>", svg))
    assert {a["api"] for a in busiest} <= legend


def test_plot_by_topic_draws_the_topics(tmp_path, capsys):
    pcap = CAPTURES / "tansu-consumer-group.pcap"
    topics = [t["topic"] for t in _summary(pcap, capsys)["topics"] if t["records"]]
    assert topics
    text = _plot(tmp_path, "t.html", "--plot-by", "topic", pcap=pcap).read_text(encoding="utf-8")
    table = text.split("<tbody>")[1].split("</tbody>")[0]
    assert sorted(re.findall(r"<tr><td>([^<]+)</td>", table)) == sorted(topics)
    svg = base64.b64decode(re.search(r"base64,([A-Za-z0-9+/=]+)", text).group(1)).decode("utf-8")
    assert "records/s per topic" in svg and all(t in svg for t in topics)


def test_svg_is_valid_xml(tmp_path):
    root = ET.parse(_plot(tmp_path, "s.svg")).getroot()
    assert root.tag.endswith("svg")


def test_capture_without_exchanges_still_gets_a_plot(tmp_path):
    path = _plot(tmp_path, "e.png", pcap=CAPTURES / "tansu-tls-proxy.pcap")  # TLS, no key log
    assert path.read_bytes()[:4] == b"\x89PNG" and path.stat().st_size > 1000


def test_unknown_plot_extension_is_a_usage_error(tmp_path, capsys):
    assert main(["stats", "-q", str(PCAP), "--plot", str(tmp_path / "s.jpg")]) == 2
    assert ".png, .svg or .html" in capsys.readouterr().err
    assert not (tmp_path / "s.jpg").exists()


@pytest.mark.parametrize("args", [["--by", "broker"], ["--series", "connections"]])
def test_the_plot_does_not_depend_on_by_or_series(tmp_path, args, capsys):
    """The table's --by/--series choose its rows; the plot keeps its own series per api."""
    apis = sorted(a["api"] for a in _summary(PCAP, capsys)["apis"])
    text = _plot(tmp_path, "s.html", *args).read_text(encoding="utf-8")
    table = text.split("<tbody>")[1].split("</tbody>")[0]
    assert sorted(re.findall(r"<tr><td>([^<]+)</td>", table)) == apis
