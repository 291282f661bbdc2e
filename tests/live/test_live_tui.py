"""The TUI's live mode fed by LiveEventSource (how `kwinspect tui --live -i IFACE` is wired).

The app is driven headless; a real broker (librdkafka's mock cluster) and a
real producer make the traffic.  Oracle: the exchanges the app lists are the
ones `kwinspect exchanges` decodes from the source's own -w file.
"""

from __future__ import annotations

import asyncio
import os
import sys

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("live")]


def _skip_reason() -> str | None:
    if sys.platform != "linux" or os.geteuid() != 0:
        return "needs root on Linux (AF_PACKET capture on lo)"
    for mod in ("scapy", "textual"):
        try:
            __import__(mod)
        except ImportError:
            return f"{mod} is not installed"
    return None


@pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or "")
def test_tui_live_mode_lists_what_was_captured(tmp_path):
    from kwinspect.capture.live import capture_filter
    from kwinspect.dissect import DissectConfig
    from kwinspect.model import Exchange
    from kwinspect.run.files import dissect_file
    from kwinspect.run.live import LiveEventSource
    from kwinspect.tui.app import KwinspectApp
    from kwinspect.tui.indexer import END
    from rig.manifest import Manifest
    from rig.mock_cluster import MockCluster
    from rig.scenarios import ck_produce, standard_items

    pcap = str(tmp_path / "tui.pcap")

    async def run(mc, src) -> int:
        q = src.start(end=END)
        app = KwinspectApp(live=q, live_dissector=src.dissector, label="live on lo")
        async with app.run_test(size=(200, 30)) as pilot:
            m = Manifest(scenario="tui-live", description="")
            await asyncio.to_thread(ck_produce, m, mc.bootstrap_servers, "tui-producer",
                                    standard_items("tui-live", 10), acks="all")
            await asyncio.sleep(0.5)
            await asyncio.to_thread(src.stop)
            for _ in range(500):
                if app.indexer.done.is_set():
                    break
                await pilot.pause(0.02)
            assert app.indexer.done.is_set() and app.indexer.error is None, app.indexer.error
            await pilot.pause()
            app.screen.poll()
            await pilot.pause()
            return app.screen.list.count

    with MockCluster(1) as mc:
        mc.create_topic("tui-live", 1, 1)
        ports = frozenset(mc.ports)
        src = LiveEventSource("lo", DissectConfig(kafka_ports=ports | {9092}), bpf=capture_filter(ports),
                              write=pcap)
        try:
            count = asyncio.run(run(mc, src))
        finally:
            src.stop()
    assert src.error is None
    offline = [e for e in dissect_file(pcap, DissectConfig(kafka_ports=ports | {9092})) if isinstance(e, Exchange)]
    assert any(e.api_name == "Produce" for e in offline)
    assert count == len(offline)
