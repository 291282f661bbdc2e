"""Filter/sort/render cost of the TUI's store at N rows, without waiting for dissection.

The store is filled with the compact rows of a real capture, repeated with
shifted connections, timestamps and exchange numbers (what bench/make_big_capture.py
does at the packet level), so the numbers isolate the TUI from the dissector.

    .venv/bin/python bench/tui_view_bench.py captures/confluent-mock-produce-consume.pcap --rows 1000000
"""

from __future__ import annotations

import argparse
import resource
import time

FILTERS = (
    'api == "Produce"',
    "latency_ms > 1",
    "error",
    'topic ~ "orders.*" and api_version >= 10',
    'client_id == "demo-producer"',
)


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("capture")
    ap.add_argument("--rows", type=int, default=1_000_000)
    args = ap.parse_args()

    from kwinspect.analyze.filter import compile_filter
    from kwinspect.model import EXCHANGE_COLUMNS, Exchange
    from kwinspect.run.files import dissect_file
    from kwinspect.tui.exporting import write_view
    from kwinspect.tui.store import ExchangeStore, compact
    from kwinspect.tui.view import ViewSpec, compute_view
    from kwinspect.tui.widgets.exchange_list import row_cells

    base = [compact(e) for e in dissect_file(args.capture) if isinstance(e, Exchange)]
    span = max(t[3] for t in base if t[3]) - min(t[3] for t in base if t[3]) + 0.001
    rss0 = rss_mb()
    store = ExchangeStore(spill=False)
    t0 = time.perf_counter()
    k = 0
    while len(store) < args.rows:
        batch = []
        for t in base:
            lst = list(t)
            lst[0] = f"10.{k >> 16 & 255}.{k >> 8 & 255}.{k & 255}:{t[1].rsplit(':', 1)[1]}->{t[2]}"
            lst[1] = lst[0].split("->")[0]
            for i in (3, 4):
                lst[i] = None if lst[i] is None else lst[i] + k * span
            lst[18] = len(store) + len(batch) + 1
            batch.append(tuple(lst))
        with store.lock:
            for t in batch[: args.rows - len(store)]:
                store.add_compact(t)
        k += 1
    fill = time.perf_counter() - t0
    n = len(store)
    cols = sum(a.itemsize * len(a) for a in store.cols.values())
    print(f"{n:,} rows appended in {fill:.1f} s ({n / fill:,.0f} rows/s on the app side); "
          f"columns {cols / 1e6:.0f} MB ({cols / n:.0f} B/row), RSS +{rss_mb() - rss0:.0f} MB, "
          f"{len(store.strings):,} interned strings")
    for expr in FILTERS:
        flt = compile_filter(expr, EXCHANGE_COLUMNS)
        c0 = time.perf_counter()
        res = compute_view(store, ViewSpec(expr=expr), flt)
        print(f"filter {expr!r}: {len(res.rows):,} rows in {time.perf_counter() - c0:.2f} s")
    for name, spec in (("errors only", ViewSpec(errors_only=True)), ("one api", ViewSpec(api_key=0)),
                       ("one connection", ViewSpec(stream=store.strings.get(store.stream(n // 2)))),
                       ("sort by latency", ViewSpec(sort="latency")),
                       ("errors only + filter", ViewSpec(errors_only=True, expr="latency_ms > 1"))):
        flt = compile_filter(spec.expr, EXCHANGE_COLUMNS) if spec.expr else None
        c0 = time.perf_counter()
        res = compute_view(store, spec, flt)
        print(f"toggle {name}: {len(res.rows):,} rows in {(time.perf_counter() - c0) * 1000:.0f} ms")
    c0 = time.perf_counter()
    for r in range(n // 2, n // 2 + 50):
        row_cells(store, r)
    print(f"rendering a 50-row screen: {(time.perf_counter() - c0) * 1000:.1f} ms")
    c0 = time.perf_counter()
    rows = compute_view(store, ViewSpec(errors_only=True), None).rows
    count = write_view(store, (int(r) for r in rows), "/tmp/kw-view-bench.jsonl")
    print(f"export {count:,} rows to jsonl: {time.perf_counter() - c0:.1f} s")
    print(f"max RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
