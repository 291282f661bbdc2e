"""The long fuzz run (`make fuzz`): mutated real input through every parser, end to end.

    python bench/fuzz.py                       # 1,200,000 inputs over all targets, 2 workers
    python bench/fuzz.py --inputs 50000 --targets decode,records --workers 1 --seed 7

Targets, seeds, mutators and invariants live in tests/fuzz/harness.py (the
bounded tests use the same code): decode (decode_request/decode_response for
every api/version, and the compiled labels of each body against the Python walks), records (parse_record_set + full record decoding, codecs),
framing (FrameSplitter with gaps and any chunking), tcp (TcpReassembler on
mangled real segments), pcap (open_capture + PacketParser on mutated files),
dissect (the whole Dissector and every output row on mutated captures), core
(the compiled readers, parser and Dissector against the pure-Python ones on the
same mutated captures: they must agree exactly).

`make fuzz-asan` builds the C extension with AddressSanitizer and runs this with
it preloaded, over the targets that reach the C code (pcap, dissect, core, decode).

A failure is any exception escaping the code under test, the decoder's
``internal_error`` issue, a broken accounting identity, an input running longer
than --timeout seconds (a hang), or a tracemalloc peak above --mem-limit-mb on
the inputs sampled for memory (every --mem-every-th).  Each failure is saved as
a reproducer under tests/fuzz_regressions/ (replayed by the test suite) and
printed; the exit status is 1 when anything failed.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import signal
import sys
import time
import tracemalloc

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# this file is itself named fuzz.py: its own folder must not shadow tests/fuzz
sys.path[:] = [ROOT, os.path.join(ROOT, "tests")] + [p for p in sys.path if os.path.abspath(p or ".") != HERE]
sys.modules.pop("fuzz", None)

from fuzz import harness  # noqa: E402

# Share of the inputs per target (the cheap decoder gets the most; every target gets many).
WEIGHTS = {"decode": 0.50, "records": 0.17, "pcap": 0.12, "framing": 0.08, "tcp": 0.08, "dissect": 0.05,
           "core": 0.05}
CHUNK = 2000


class Hang(BaseException):
    """Raised by the per-input alarm (a BaseException, so no `except Exception` swallows it)."""


def _alarm(_signum, _frame):
    raise Hang()


def _signature(message: str) -> str:
    return message.split(":", 1)[0][:80] + "|" + message[:60]


def work(task: tuple[str, int, int, float, int, int, str]) -> dict:
    """Run `count` inputs of one target; returns counts, failures (saved) and peaks."""
    target, count, seed, timeout, mem_every, mem_limit, outdir = task
    corpus = harness.load_corpus()
    gen = harness.GENERATORS[target]
    rng = random.Random(seed)
    signal.signal(signal.SIGALRM, _alarm)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    failures: list[tuple[str, str]] = []
    seen: set[str] = set()
    peak = 0
    slowest = 0.0
    t0 = time.perf_counter()
    for i in range(count):
        case = gen(rng, corpus)
        traced = mem_every and i % mem_every == 0
        message = None
        if traced:
            tracemalloc.start()
        t = time.perf_counter()
        signal.setitimer(signal.ITIMER_REAL, timeout)
        try:
            harness.check(case)
        except harness.FuzzFailure as exc:
            message = str(exc)
        except Hang:
            message = f"hang: more than {timeout} s on one input"
        finally:
            try:
                signal.setitimer(signal.ITIMER_REAL, 0)
            except Hang:  # the alarm fired as it was being cleared: it would kill the worker
                message = message or f"hang: more than {timeout} s on one input"
        slowest = max(slowest, time.perf_counter() - t)
        if traced:
            _cur, p = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            peak = max(peak, p)
            if message is None and p > mem_limit:
                message = f"memory: tracemalloc peak {p >> 20} MiB > {mem_limit >> 20} MiB"
        if message is not None:
            sig = _signature(message)
            if sig not in seen and len(failures) < 5:
                seen.add(sig)
                path = harness.save_regression(case, message, outdir)
                failures.append((message, path))
            else:
                failures.append((message, ""))
    return {"target": target, "count": count, "failures": failures, "peak": peak,
            "slowest": slowest, "seconds": time.perf_counter() - t0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inputs", type=int, default=1_200_000, help="total inputs over all targets")
    ap.add_argument("--targets", default=",".join(harness.TARGETS), help="comma-separated targets")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=None, help="base seed (default: from the clock)")
    ap.add_argument("--timeout", type=float, default=20.0, help="seconds per input before it is a hang")
    ap.add_argument("--mem-every", type=int, default=50, help="trace memory on every Nth input (0: never)")
    ap.add_argument("--mem-limit-mb", type=int, default=300, help="tracemalloc peak that counts as a spike")
    ap.add_argument("--out", default=harness.REGRESSIONS, help="where reproducers are saved")
    ap.add_argument("--max-seconds", type=float, default=None,
                    help="stop after this long and report what ran (also on SIGTERM / Ctrl-C)")
    args = ap.parse_args(argv)

    targets = [t for t in args.targets.split(",") if t]
    unknown = set(targets) - set(harness.TARGETS)
    if unknown:
        ap.error(f"unknown targets: {', '.join(sorted(unknown))}")
    seed = args.seed if args.seed is not None else int(time.time())
    total_w = sum(WEIGHTS[t] for t in targets)
    plan = {t: int(args.inputs * WEIGHTS[t] / total_w) for t in targets}
    tasks = []
    for t in targets:
        left, k = plan[t], 0
        while left > 0:
            n = min(CHUNK, left)
            tasks.append((t, n, seed * 1_000_003 + hash(t) % 10_007 * 7919 + k, args.timeout,
                          args.mem_every, args.mem_limit_mb << 20, args.out))
            left -= n
            k += 1
    random.Random(seed).shuffle(tasks)  # mix targets across workers and time
    harness.load_corpus()  # once, before forking
    print(f"fuzz: seed {seed}, {sum(plan.values()):,} inputs over {', '.join(targets)}, "
          f"{args.workers} workers, {len(tasks)} chunks", flush=True)
    done = {t: 0 for t in targets}
    fails = {t: 0 for t in targets}
    peaks = {t: 0 for t in targets}
    slowest = {t: 0.0 for t in targets}
    cpu = {t: 0.0 for t in targets}
    messages: list[tuple[str, str, str]] = []
    t0 = time.time()
    ctx = mp.get_context("fork")
    stopped = None

    def _term(_signum, _frame):
        raise KeyboardInterrupt

    pool = ctx.Pool(args.workers, maxtasksperchild=50)
    signal.signal(signal.SIGTERM, _term)
    try:
        for i, res in enumerate(pool.imap_unordered(work, tasks), 1):
            t = res["target"]
            done[t] += res["count"]
            fails[t] += len(res["failures"])
            peaks[t] = max(peaks[t], res["peak"])
            slowest[t] = max(slowest[t], res["slowest"])
            cpu[t] += res["seconds"]
            for msg, path in res["failures"]:
                if path:
                    messages.append((t, msg, path))
                    print(f"FAIL {t}: {msg[:300]}\n  reproducer: {os.path.relpath(path, ROOT)}", flush=True)
            if i % 25 == 0 or i == len(tasks):
                el = time.time() - t0
                print(f"[{el:7.0f}s] {sum(done.values()):,} inputs, {sum(fails.values())} failures", flush=True)
            if args.max_seconds is not None and time.time() - t0 > args.max_seconds:
                stopped = f"--max-seconds {args.max_seconds:g} reached"
                break
        pool.close()
    except KeyboardInterrupt:
        stopped = "interrupted"
    finally:
        if stopped:
            pool.terminate()
        pool.join()
    el = time.time() - t0
    print(f"\nfuzz: {sum(done.values()):,} inputs in {el:.0f} s (seed {seed})"
          + (f" - stopped early: {stopped}; counts are the completed chunks" if stopped else ""))
    print(f"{'target':<9} {'inputs':>10} {'failures':>9} {'inputs/s':>9} {'slowest':>8} {'peak MiB':>9}")
    for t in targets:
        rate = done[t] / cpu[t] if cpu[t] else 0
        print(f"{t:<9} {done[t]:>10,} {fails[t]:>9} {rate:>9.0f} {slowest[t]:>7.2f}s "
              f"{peaks[t] / (1 << 20):>9.1f}")
    try:
        import resource
        rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        print(f"largest worker RSS: {rss:.0f} MiB")
    except (ImportError, OSError):
        pass
    return 1 if any(fails.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
