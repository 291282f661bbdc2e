"""Every extra installs what its feature needs: each one alone, in a fresh venv, runs its feature.

The dev extra brings everything, so the rest of the suite cannot notice an extra that
forgot a package (kwinspect[spark] once installed pyspark without the pandas PySpark
requires).  Here the wheel is installed with one extra into a fresh `python3 -m venv`
and that extra's feature runs on the demo capture with the venv's own `kwinspect`:
the pipeline (local mode) for spark, a latency plot for plot, the live-capture layer
(scapy and its filter compiler, prometheus_client for --metrics; no root needed) for
live, the TUI headless for tui, Avro/Protobuf/JSON Schema values decoded for schemas.

Select with `-m extras`; needs the package index (skipped when it cannot be reached).
"""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.helpers.wheel import ROOT, clean_env
from tests.spark.compare import compare

# one worker builds the wheel and the venvs (the Spark cluster test reuses the spark one)
pytestmark = [pytest.mark.extras, pytest.mark.xdist_group("extra-venvs")]

DEMO = str(ROOT / "captures" / "confluent-mock-produce-consume.pcap")


def run(bin_dir: Path, *args: str, timeout: float = 1800, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout,
                          env=clean_env(bin_dir, **env), cwd=bin_dir.parent)


def exchange_count(bin_dir: Path) -> int:
    res = run(bin_dir, bin_dir / "kwinspect", "exchanges", DEMO, "-F", "jsonl")
    assert res.returncode == 0, res.stderr
    rows = [json.loads(line) for line in res.stdout.splitlines() if line.strip()]
    assert len(rows) > 10
    return len(rows)


def test_spark_extra_runs_the_pipeline(extra_venv, tmp_path):
    bin_dir = extra_venv("spark")
    out = tmp_path / "out"
    res = run(bin_dir, bin_dir / "kwinspect", "pipeline", DEMO, "-o", out, "--records", "--master", "local[2]",
              "-q", "--conf", "spark.ui.enabled=false")
    assert res.returncode == 0, res.stderr[-4000:]
    for table in ("exchanges", "records", "errors"):
        expected = tmp_path / f"{table}.parquet"
        res = run(bin_dir, bin_dir / "kwinspect", table, DEMO, "-F", "parquet", "-o", expected)
        assert res.returncode == 0, res.stderr
        ok, message = compare(str(expected), str(out), table)
        assert ok, message


def test_plot_extra_draws_the_latency_plot(extra_venv, tmp_path):
    bin_dir = extra_venv("plot")
    png = tmp_path / "latency.png"
    res = run(bin_dir, bin_dir / "kwinspect", "latency", DEMO, "--plot", png)
    assert res.returncode == 0, res.stderr
    assert "plot written to" in res.stderr
    data = png.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 10_000


def test_live_extra_has_the_capture_layer(extra_venv):
    bin_dir = extra_venv("live")
    res = run(bin_dir, bin_dir / "kwinspect", "live", "--help")
    assert res.returncode == 0 and "-i" in res.stdout, res.stderr
    # what a capture needs before it opens the socket (which needs root): scapy's Linux
    # layer and its BPF compiler (libpcap), for the filter live puts on the socket
    script = textwrap.dedent("""
        from kwinspect.capture.live import _compile, _scapy, capture_filter
        _scapy()
        prog = _compile(capture_filter(None), 1, 262144, loopback=True)
        print(len(prog))
    """)
    res = run(bin_dir, bin_dir / "python", "-c", script)
    assert res.returncode == 0, res.stderr
    assert int(res.stdout.strip()) > 5 * 8  # raw sock_filter instructions, 8 bytes each
    # --metrics: the endpoint's library, and the page it serves
    script = "from kwinspect.export import metrics; import prometheus_client; print('ok')"
    res = run(bin_dir, bin_dir / "python", "-c", script)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr


def test_schemas_extra_decodes_avro_protobuf_and_json_schema(extra_venv):
    bin_dir = extra_venv("schemas")
    capture = ROOT / "captures" / "confluent-mock-schemas.pcap"
    res = run(bin_dir, bin_dir / "kwinspect", "records", capture, "--schemas",
              ROOT / "captures" / "confluent-mock-schemas.schemas", "-F", "jsonl", "-q")
    assert res.returncode == 0, res.stderr[-4000:]
    rows = [json.loads(line) for line in res.stdout.splitlines() if line.strip()]
    # every format the producers serialized is decoded (the values themselves are checked
    # against the producers' own record in tests/analyze/test_schema_values.py)
    assert {r["value_encoding"] for r in rows} >= {"avro", "protobuf", "json_schema"}


def test_tui_extra_shows_the_capture(extra_venv):
    bin_dir = extra_venv("tui")
    script = textwrap.dedent(f"""
        import asyncio
        from kwinspect.tui.app import KwinspectApp

        async def main():
            app = KwinspectApp([{DEMO!r}])
            async with app.run_test(size=(160, 40)) as pilot:
                for _ in range(1000):
                    if app.indexer.done.is_set():
                        break
                    await pilot.pause(0.02)
                await pilot.pause()
                app.screen.poll()
                await pilot.pause()
                print(app.screen.query_one("#status").render())

        asyncio.run(main())
    """)
    res = run(bin_dir, bin_dir / "python", "-c", script)
    assert res.returncode == 0, res.stderr[-4000:]
    assert f"{exchange_count(bin_dir)} exchanges" in res.stdout, res.stdout
