"""Closed connections are dropped from memory without changing any output or count."""

from pathlib import Path

import pytest

from kwinspect.dissect import DissectConfig
from kwinspect.run.files import FileRun, dissect_files

CAPTURES = sorted((Path(__file__).resolve().parents[1] / "captures").glob("*.pcap"))


@pytest.mark.parametrize("capture", CAPTURES[:6], ids=lambda p: p.name)
def test_keeping_one_closed_connection_changes_nothing_but_memory(capture):
    results = []
    for keep in (1_000_000, 1):
        run = FileRun()
        rows = [e.row() for e in dissect_files([capture], DissectConfig(keep_closed_connections=keep), run=run)]
        results.append((rows, run.dissector.packet_counts(), len(run.dissector.connections)))
    (rows_all, counts_all, conns_all), (rows_one, counts_one, conns_one) = results
    assert rows_one == rows_all
    assert counts_one == counts_all and run.dissector.packet_accounting_error() is None
    assert conns_one <= 1 < conns_all


def test_closed_connections_share_their_brokers_advertised_versions(tmp_path):
    """Every connection to a broker gets the same ApiVersions answer (kio-encoded here, 60
    ranges): the closed connections kept for the TUI and diagnose hold one copy of it, not
    one each (it was 8.4 KB a closed connection here, 2.8 KB with the map shared)."""
    import datetime as dt
    import sys
    import tracemalloc

    sys.path.insert(0, str(Path(__file__).parent))
    from helpers.pcapgen import conversation, write_pcap
    from kio.schema.api_versions.v3 import request as av_req
    from kio.schema.api_versions.v3 import response as av_resp
    from kio.schema.errors import ErrorCode
    from kio.static.primitive import i16, i32Timedelta
    from stream.kio_frames import request_frame, response_frame

    req = av_req.ApiVersionsRequest(client_software_name="lib", client_software_version="1")
    resp = av_resp.ApiVersionsResponse(
        error_code=ErrorCode(0), throttle_time=i32Timedelta.parse(dt.timedelta(0)),
        api_keys=tuple(av_resp.ApiVersion(api_key=i16(k), min_version=i16(0), max_version=i16(k % 13))
                       for k in range(60)))
    frames = [("c", request_frame(req, 1)), ("s", response_frame(resp, 1))]
    messages = [(who, len(f).to_bytes(4, "big") + f) for who, f in frames]
    n = 2_000
    segs = []
    for i in range(n):
        segs += conversation((f"10.0.{i >> 8}.{i & 255}", 40000), ("10.9.0.1", 9092), messages,
                             ts0=1_700_000_000.0 + i)
    path = tmp_path / "many.pcap"
    write_pcap(path, segs)

    def retained(per: int) -> int:
        tracemalloc.start()
        try:
            run = FileRun()
            rows = list(dissect_files([path], DissectConfig(keep_closed_connections=per), run=run))
            held = tracemalloc.get_traced_memory()[0]
            assert len(rows) == n and len(run.dissector.connections) == min(per, n)
            del rows, run
            return held
        finally:
            tracemalloc.stop()

    per_connection = (retained(n) - retained(1)) / n
    assert per_connection < 4_000, f"{per_connection:.0f} bytes a closed connection"
