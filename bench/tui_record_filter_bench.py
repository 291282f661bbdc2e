"""Benchmark the TUI's filters on decoded record fields (`value.order_id == 7`), headless.

    .venv/bin/python bench/make_big_capture.py captures/confluent-mock-schemas.pcap \\
        --exchanges 26000 -o /tmp/kw-schemas-26k.pcap
    .venv/bin/python bench/tui_record_filter_bench.py /tmp/kw-schemas-26k.pcap \\
        captures/confluent-mock-schemas.schemas [--in-thread]

Indexes the capture, then applies record-field filters through the screen (as the
filter bar does) and reports: the time to the filtered view (first run: frames read
back and decoded; second run: the decoded keys/values come from the cache), the
progress values the status line showed meanwhile, the round trip of key presses
made while the filter runs (and with none running), and the app's RSS.
``--in-thread`` matches in the app's worker thread (the live-feed fallback)
instead of the helper process, for comparison.  Numbers go to docs/tui.md.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time

FILTERS = (
    "value.order_id == 7",
    "value.order_id == 8",  # same fields, other value: served by the cache
    'key.customer == "bob" and value.amount > 50',
    'api == "Produce" and value.customer.name == "carol"',
)


def rss_mb(pid: str = "self") -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def helper_rss(app) -> str:
    proc = app.record_filtering.process()
    return f", helper RSS {rss_mb(str(proc.proc.pid)):.0f} MB" if proc is not None else ""


async def key_presses(pilot, n: int) -> list[float]:
    lags = []
    for key in ("down", "up") * (n // 2):
        k0 = time.perf_counter()
        await pilot.press(key)
        lags.append(time.perf_counter() - k0)
    return lags


def ms(lags: list[float]) -> str:
    return f"median {statistics.median(lags) * 1000:.0f} ms, max {max(lags) * 1000:.0f} ms over {len(lags)}"


async def run(path: str, schemas_dir: str, in_thread: bool) -> None:
    from kwinspect.analyze.schema_source import open_schema_source
    from kwinspect.analyze.schema_values import SchemaValues
    from kwinspect.tui.app import KwinspectApp

    app = KwinspectApp([path], schemas=SchemaValues(open_schema_source(schemas_dir)))
    async with app.run_test(size=(200, 50)) as pilot:
        main = app.screen
        t0 = time.perf_counter()
        while not app.indexer.done.is_set():
            await pilot.pause(0.2)
        main.poll()
        await pilot.pause()
        print(f"indexed {len(app.store):,} exchanges in {time.perf_counter() - t0:.1f} s; RSS {rss_mb():.0f} MB")
        print(f"key press round trip, no filter running: {ms(await key_presses(pilot, 20))}")
        if in_thread:  # the fallback (live feeds): records matched in the view's thread worker
            app.record_filtering.process = lambda: None
        for expr in FILTERS:
            predicate = app.record_filtering.compile(expr)
            f0 = time.perf_counter()
            main.apply_spec(main.spec.with_(expr=expr), predicate)
            progress: list[float] = []
            lags: list[float] = []
            keys = iter(("down", "up") * 1000)
            while main.computing is not None:
                k0 = time.perf_counter()
                await pilot.press(next(keys))  # the list stays usable while the worker decodes
                lags.append(time.perf_counter() - k0)
                if main.filter_progress is not None and (not progress or progress[-1] != main.filter_progress):
                    progress.append(main.filter_progress)
                await pilot.pause(0.05)
            took = time.perf_counter() - f0
            lag = f"key press round trip {ms(lags)}" if lags else "no key press"
            where = "app thread" if in_thread else "helper process"
            print(f"filter {expr!r} ({where}): {main.list.count:,} rows in {took:.2f} s; {len(progress)} progress "
                  f"updates shown; {lag}; app RSS {rss_mb():.0f} MB{helper_rss(app)}")


if __name__ == "__main__":
    asyncio.run(run(sys.argv[1], sys.argv[2], "--in-thread" in sys.argv[3:]))
