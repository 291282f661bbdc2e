"""Benchmark the TUI on a big capture, headless: time to first rows, indexing, filters, memory.

    .venv/bin/python bench/make_big_capture.py captures/confluent-mock-produce-consume.pcap \\
        --exchanges 1000000 -o /tmp/kw-1m.pcap
    .venv/bin/python bench/tui_bench.py /tmp/kw-1m.pcap

Drives the real app (App.run_test) the way tests do; numbers go to docs/tui.md.
"""

from __future__ import annotations

import asyncio
import os
import resource
import sys
import time

FILTERS = (
    'api == "Produce"',
    "latency_ms > 1",
    "error",
    'topic ~ "demo.*" and api_version >= 10',
    'client_id == "demo-producer"',
)


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


async def run(path: str) -> None:
    from kwinspect.analyze.filter import compile_filter
    from kwinspect.model import EXCHANGE_COLUMNS
    from kwinspect.tui.app import KwinspectApp

    print(f"RSS before the app: {rss_mb():.0f} MB")
    t0 = time.perf_counter()
    c0 = time.process_time()
    app = KwinspectApp([path])
    async with app.run_test(size=(200, 50)) as pilot:
        main = app.screen
        while main.list.count == 0:
            await pilot.pause(0.01)
        t_first = time.perf_counter() - t0
        print(f"time to first rows: {t_first:.2f} s ({main.list.count} rows shown)")
        # responsiveness while indexing: how long do key presses take?
        lags = []
        for key in ("up", "pageup", "home", "down", "end"):
            k0 = time.perf_counter()
            await pilot.press(key)
            lags.append(time.perf_counter() - k0)
        print(f"key press round trip while indexing: max {max(lags) * 1000:.0f} ms")
        last = 0
        while not app.indexer.done.is_set():
            await pilot.pause(0.5)
            n = len(app.store)
            if n // 200_000 != last // 200_000:
                print(f"  {n:,} rows after {time.perf_counter() - t0:.1f} s, RSS {rss_mb():.0f} MB")
            last = n
        t_index = time.perf_counter() - t0
        app_cpu = time.process_time() - c0
        main.poll()
        await pilot.pause()
        n = len(app.store)
        spill = os.fstat(app.store.spill._r.fileno()).st_size if app.store.spill else 0
        print(f"indexed {n:,} exchanges, {app.store.error_count:,} errors in {t_index:.1f} s "
              f"({n / t_index:,.0f}/s); RSS {rss_mb():.0f} MB; frame spill {spill / 1e6:.0f} MB on disk")
        # the indexing process has ended and been waited for: its CPU is the children's
        child = resource.getrusage(resource.RUSAGE_CHILDREN)
        print(f"CPU while indexing: indexing process {child.ru_utime + child.ru_stime:.1f} s "
              f"(user {child.ru_utime:.1f}), app process {app_cpu:.1f} s; load average "
              f"{' / '.join(f'{x:.1f}' for x in os.getloadavg())}")
        cols = sum(a.itemsize * len(a) for a in app.store.cols.values())
        print(f"store columns: {cols / 1e6:.0f} MB ({cols / max(n, 1):.0f} bytes/exchange)")
        for expr in FILTERS:
            f0 = time.perf_counter()
            main.apply_spec(main.spec.with_(expr=expr), compile_filter(expr, EXCHANGE_COLUMNS))
            while main.computing is not None:
                await pilot.pause(0.01)
            print(f"filter {expr!r}: {main.list.count:,} rows in {time.perf_counter() - f0:.2f} s")
        main.apply_spec(main.spec.with_(expr=""), None)
        await pilot.pause()
        for name, spec in (("errors only", main.spec.with_(errors_only=True)),
                           ("one api (Fetch)", main.spec.with_(api_key=1, api_label="Fetch")),
                           ("sort by latency", main.spec.with_(sort="latency"))):
            f0 = time.perf_counter()
            main.apply_spec(spec, None)
            while main.computing is not None:
                await pilot.pause(0.01)
            print(f"toggle {name}: {main.list.count:,} rows in {time.perf_counter() - f0:.2f} s")
            main.apply_spec(main.spec.__class__(), None)
        main.list.move_to(n // 2)
        d0 = time.perf_counter()
        row = main.list.current_row
        main.detail.show(row)
        while main.detail.row != row:
            await pilot.pause(0.005)
        print(f"detail pane filled (re-decode from the spill, in a worker) for a row in the middle: "
              f"{(time.perf_counter() - d0) * 1000:.1f} ms")
        print(f"RSS at the end: {rss_mb():.0f} MB")


if __name__ == "__main__":
    asyncio.run(run(sys.argv[1]))
