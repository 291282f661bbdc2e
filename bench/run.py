"""Offline-command benchmark: kwinspect vs tshark on the reference captures (`make bench`).

    .venv/bin/python bench/run.py                  # (a), (b) and the memory run on (c), 3 runs each
    .venv/bin/python bench/run.py --inputs a --runs 5
    .venv/bin/python bench/run.py --update-docs    # also rewrite the two sections of docs/benchmarks.md

Inputs are made by bench/make_inputs.py with the real-traffic rig and cached in
bench/data/ (missing ones are made first; that needs root, tcpdump and, for (a),
network namespaces).

Every command runs in a fresh process; per command we report the median over
``--runs`` of wall time and CPU time (user + sys of the child, from wait4), MB/s,
packets/s, exchanges/s and records/s (from wall time), and the largest peak RSS
(ru_maxrss). tshark does the equivalent work when it is installed:

- exchanges / summary: ``tshark -r F -d tcp.port==P,kafka ... -Y kafka -T fields
  -e frame.number -e kafka.request_key -e kafka.correlation_id`` (every Kafka PDU
  dissected, one line each; tshark pairs responses with requests too);
- records: the same plus ``-e kafka.topic_name -e kafka.partition_id
  -e kafka.message_key -e kafka.message_value -e kafka.message_timestamp``
  (tshark decompresses and dissects every record to print them).

Ratio = kwinspect wall / tshark wall (<= 1.0: kwinspect is as fast or faster).
Numbers on a shared machine are noisy: the load average before and after each
input is recorded, and CPU time is shown next to wall time.

Which tshark: ``KWINSPECT_BENCH_TSHARK`` names the program to run (a path or a
command on PATH, e.g. a wrapper that runs a newer tshark in a chroot), else
``tshark`` on PATH; its version is printed and stored with the results, and
every ratio is against it. Which kwinspect core: ``--cores compiled,python``
(default: both when the compiled core is built) times each kwinspect command
once per core; the rows of the pure-Python core are labelled ``[python core]``
(run with KWINSPECT_PURE=1). Runs are interleaved: run 1 of every command of an
input, then run 2 of every command, and so on, so both cores and tshark see the same
load and the ratios hold on a shared machine; every run's CPU time is kept
(``cpus`` in the results) besides the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import struct
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, ROOT)

import make_inputs  # noqa: E402

OUT = os.path.join(HERE, "out")
DOCS = os.path.join(ROOT, "docs", "benchmarks.md")
KWINSPECT = [sys.executable, "-m", "kwinspect.cli"]
TSHARK_BASE_FIELDS = ["frame.number", "kafka.request_key", "kafka.correlation_id"]
TSHARK_RECORD_FIELDS = ["kafka.topic_name", "kafka.partition_id", "kafka.message_key", "kafka.message_value",
                        "kafka.message_timestamp"]


# ---------------------------------------------------------------------------
# Measuring one process
# ---------------------------------------------------------------------------


# Commands run as an installed package runs: with its bytecode cached. A shell that sets
# PYTHONDONTWRITEBYTECODE (ours do) would otherwise make every run compile kwinspect
# from source, ~0.08 s that no user pays; compile_bytecode() fills the cache first.
CHILD_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


TSHARK_ENV = "KWINSPECT_BENCH_TSHARK"
PYTHON_CORE = " [python core]"  # label suffix of the rows timed with KWINSPECT_PURE=1


def tshark_program() -> str | None:
    """The tshark to compare with: $KWINSPECT_BENCH_TSHARK, else tshark on PATH."""
    named = os.environ.get(TSHARK_ENV)
    if named:
        found = shutil.which(named)
        if found is None:
            raise SystemExit(f"{TSHARK_ENV}={named}: no such program")
        return found
    return shutil.which("tshark")


def tshark_version(program: str | None) -> str:
    """'TShark (Wireshark) 4.6.9' (the first line of `tshark -v`), or '-'."""
    if not program:
        return "-"
    res = subprocess.run([program, "-v"], capture_output=True, text=True, timeout=600)
    lines = res.stdout.splitlines()
    return lines[0].rstrip(".") if lines else "-"


def compile_bytecode() -> None:
    subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.join(ROOT, "kwinspect")],
                   check=True, env=CHILD_ENV)


def measure(cmd: list[str], stdout_path: str | None = None, env: dict | None = None) -> dict:
    """Run `cmd`; wall time, CPU time (user+sys) and peak RSS of that child alone."""
    out = open(stdout_path, "wb") if stdout_path else subprocess.DEVNULL  # noqa: SIM115
    try:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.PIPE, cwd=ROOT, env=env or CHILD_ENV)
        stderr = proc.stderr.read() if proc.stderr else b""
        _pid, status, ru = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
    finally:
        if stdout_path:
            out.close()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {stderr.decode(errors='replace')[-800:]}")
    return {"wall": wall, "cpu": ru.ru_utime + ru.ru_stime, "rss_mb": ru.ru_maxrss / 1024}


def count_lines(path: str) -> int:
    n = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            n += chunk.count(b"\n")
    return n


def count_packets(path: str) -> int:
    """Records of a classic pcap (what make_inputs writes), by walking the record headers."""
    n = 0
    with open(path, "rb") as f:
        head = f.read(24)
        endian = "<" if head[:4] in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1") else ">"
        hdr = struct.Struct(endian + "IIII")
        while True:
            rec = f.read(16)
            if len(rec) < 16:
                return n
            incl = hdr.unpack(rec)[2]
            f.seek(incl, 1)
            n += 1


def loadavg() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


# ---------------------------------------------------------------------------
# Commands
# ---------------------------------------------------------------------------


def kw_supports_jobs() -> bool:
    res = subprocess.run([*KWINSPECT, "exchanges", "--help"], capture_output=True, text=True, cwd=ROOT)
    return "--jobs" in res.stdout


def commands(path: str, ports: list[int], jobs: list[int], cores: tuple[str, ...] = ("compiled",)
             ) -> list[tuple[str, list[str], str | None, str]]:
    """(label, argv, what its stdout/output counts, kind) for one input; kind "kw" (the
    compiled core, or whatever is built), "kw-python" (KWINSPECT_PURE=1) or "tshark"."""
    p = ",".join(map(str, ports))
    common = ["-q", "--kafka-ports", p, path]
    cmds = [
        ("exchanges", [*KWINSPECT, "exchanges", "-F", "jsonl", "-o", "{out}", *common], "exchanges", "kw"),
        ("summary", [*KWINSPECT, "summary", "-F", "json", *common], None, "kw"),
        ("records", [*KWINSPECT, "records", "-F", "jsonl", "-o", "{out}", *common], "records", "kw"),
    ]
    for j in jobs:
        cmds.append((f"exchanges -j {j}", [*KWINSPECT, "exchanges", "-j", str(j), "-F", "jsonl", "-o", "{out}",
                                           *common], "exchanges", "kw"))
        cmds.append((f"summary -j {j}", [*KWINSPECT, "summary", "-j", str(j), "-F", "json", *common], None, "kw"))
        cmds.append((f"records -j {j}", [*KWINSPECT, "records", "-j", str(j), "-F", "jsonl", "-o", "{out}",
                                         *common], "records", "kw"))
    if "python" in cores:
        own = [(label + PYTHON_CORE, argv, counted, "kw-python") for label, argv, counted, _kind in cmds]
        cmds = (cmds if "compiled" in cores else []) + own
    tshark = tshark_program()
    if tshark:
        decode_as = [x for port in ports for x in ("-d", f"tcp.port=={port},kafka")]
        base = [tshark, "-r", path, *decode_as, "-Y", "kafka", "-T", "fields"]
        cmds.append(("tshark (exchanges/summary)", [*base, *[x for f in TSHARK_BASE_FIELDS for x in ("-e", f)]],
                     None, "tshark"))
        cmds.append(("tshark (records)", [*base, *[x for f in TSHARK_BASE_FIELDS + TSHARK_RECORD_FIELDS
                                                   for x in ("-e", f)]], None, "tshark"))
    return cmds


PURE_ENV = {**CHILD_ENV, "KWINSPECT_PURE": "1"}
COMPILED_ENV = {k: v for k, v in CHILD_ENV.items() if k != "KWINSPECT_PURE"}


def run_input(key: str, runs: int, jobs: list[int], log=print, with_tshark: bool = True,
              only: set[str] | None = None, cores: tuple[str, ...] = ("compiled",)) -> dict:
    path = make_inputs.path_of(key)
    meta = make_inputs.meta_of(key)
    size = os.path.getsize(path)
    counts = meta.setdefault("counts", {})
    if "packets" not in counts:
        counts["packets"] = count_packets(path)
    os.makedirs(OUT, exist_ok=True)
    result = {"input": key, "file": os.path.basename(path), "bytes": size, "meta": meta,
              "load_before": loadavg(), "rows": []}
    selected = []
    for label, argv, counted, kind in commands(path, meta["kafka_ports"], jobs, cores):
        if kind == "tshark" and not with_tshark:
            continue
        base = label.removesuffix(PYTHON_CORE)
        if only and base.split(" (")[0] not in only and base not in only:
            continue
        selected.append((label, argv, counted, kind))
    samples: dict[str, list[dict]] = {label: [] for label, *_ in selected}
    loads: dict[str, list[float]] = {label: [] for label, *_ in selected}
    # run i of every command, then run i + 1 of every command: the commands (and the cores,
    # and tshark) see the same load, so the ratios of one run hold even on a busy machine
    for i in range(runs):
        for label, argv, counted, kind in selected:
            env = PURE_ENV if kind == "kw-python" else COMPILED_ENV
            out = os.path.join(OUT, f"{key}-{re.sub(r'[^A-Za-z0-9.-]+', '_', label)}.out")
            cmd = [a.replace("{out}", out) for a in argv]
            stdout_path = out if "{out}" not in " ".join(argv) else None
            m = measure(cmd, stdout_path, env)
            if i == 0 and kind == "tshark":
                counts.setdefault("tshark_lines_" + label.split("(")[1].rstrip(")"), count_lines(out))
            if i == 0 and counted:
                n = count_lines(out)
                prev = counts.get(counted)
                if prev is not None and prev != n:
                    log(f"  warning: {label} gave {n} {counted}, an earlier command {prev}")
                counts[counted] = n
            os.unlink(out)
            samples[label].append(m)
            loads[label].append(os.getloadavg()[0])
            log(f"  ({key}) {label:28s} run {i + 1}: {m['wall']:7.2f} s wall {m['cpu']:7.2f} s cpu "
                f"{m['rss_mb']:7.0f} MB  load {loadavg()}")
    for label, _argv, _counted, kind in selected:
        runs_of = samples[label]
        result["rows"].append({"command": label, "kind": kind,
                               "wall": statistics.median(s["wall"] for s in runs_of),
                               "cpu": statistics.median(s["cpu"] for s in runs_of),
                               "rss_mb": max(s["rss_mb"] for s in runs_of),
                               "walls": [round(s["wall"], 2) for s in runs_of],
                               "cpus": [round(s["cpu"], 2) for s in runs_of],
                               "at": time.strftime("%H:%M", time.gmtime()), "runs": runs,
                               "load": round(statistics.median(loads[label]), 1)})
    result["counts"] = counts
    result["load_after"] = loadavg()
    with open(make_inputs.path_of(key)[:-5] + ".json", "w") as f:
        json.dump(meta, f, indent=2)
    return result


# ---------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------


def machine() -> str:
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (f"{os.cpu_count()} cores ({cpu}), {mem:.0f} GiB RAM, {platform.platform()}, "
            f"Python {platform.python_version()}")


def table(results: list[dict]) -> str:
    lines = ["| input | command | wall s (median) | cpu s | MB/s | packets/s | exchanges/s | records/s | "
             "peak RSS MB | vs tshark (wall) | vs tshark (cpu) | measured (UTC, runs, load) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for res in results:
        c = res["counts"]
        tsh = {r["command"]: r for r in res["rows"] if r["kind"] == "tshark"}
        for r in res["rows"]:
            wall = r["wall"]
            ref = None
            if r["kind"] in ("kw", "kw-python"):
                ref = tsh.get("tshark (records)" if r["command"].startswith("records")
                              else "tshark (exchanges/summary)")
            ratio_w = f"{wall / ref['wall']:.2f}" if ref else ""
            ratio_c = f"{r['cpu'] / ref['cpu']:.2f}" if ref else ""
            ex = c.get("exchanges")
            rec = c.get("records")
            lines.append(
                f"| ({res['input']}) {res['bytes'] / 1e6:.0f} MB | {r['command']} | {wall:.2f} | {r['cpu']:.2f} | "
                f"{res['bytes'] / 1e6 / wall:.1f} | {c['packets'] / wall:,.0f} | "
                f"{(ex or 0) / wall:,.0f} | {(rec or 0) / wall if r['command'].startswith(('records', 'tshark (rec')) else 0:,.0f} | "
                f"{r['rss_mb']:.0f} | {ratio_w} | {ratio_c} | "
                f"{r.get('at', '?')}, {r.get('runs', '?')}x, {r.get('load', '?')} |")
    return "\n".join(lines)


def inputs_table(results: list[dict]) -> str:
    lines = ["| input | file | size | packets | exchanges | records | how it was made |", "|---|---|---:|---:|---:|---:|---|"]
    for res in results:
        c, m = res["counts"], res["meta"]
        lines.append(f"| ({res['input']}) | {res['file']} | {res['bytes'] / 1e6:.0f} MB | {c['packets']:,} | "
                     f"{c.get('exchanges', 0):,} | {c.get('records', 0):,} | {m.get('what', '')} |")
    return "\n".join(lines)


BEGIN = "<!-- bench/run.py --update-docs: generated from here -->"
END_MARK = "<!-- bench/run.py: to here -->"


def update_docs(section: str, body: str) -> None:
    """Replace the generated part of one `## ` section of docs/benchmarks.md (between the
    markers; prose after them is kept), or append the section; other sections are left alone."""
    text = open(DOCS).read() if os.path.exists(DOCS) else "# Benchmarks\n"
    head = f"## {section}\n"
    generated = f"{BEGIN}\n\n{body.strip()}\n\n{END_MARK}\n"
    start = text.find(head)
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + head + "\n" + generated
    else:
        end = text.find("\n## ", start + len(head))
        end = len(text) if end < 0 else end + 1
        sec = text[start:end]
        b, e = sec.find(BEGIN), sec.find(END_MARK)
        if b >= 0 and e > b:
            sec = sec[:b] + generated + sec[e + len(END_MARK) + 1:]
        else:
            sec = head + "\n" + generated + "\n" + sec[len(head):].lstrip("\n")
        text = text[:start] + sec + text[end:]
    with open(DOCS, "w") as f:
        f.write(text.rstrip("\n") + "\n")


STORE = os.path.join(OUT, "results.json")
ORDER = ["exchanges", "summary", "records", "exchanges -j 2", "summary -j 2", "records -j 2"]
ORDER += [label + PYTHON_CORE for label in ORDER] + ["tshark (exchanges/summary)", "tshark (records)"]


def merge_store(results: list[dict], started: str, desc: str) -> dict:
    """bench/out/results.json keeps the latest row per (input, command): a later run of
    some commands (--inputs, --only) updates those rows and keeps the others."""
    store = {"machine": desc, "inputs": {}}
    if os.path.exists(STORE):
        with open(STORE) as f:
            old = json.load(f)
        desc = (desc or old.get("machine") or "").rstrip(".")
        if "inputs" in old:
            store["inputs"] = old["inputs"]
        else:  # the first format: one run's results
            for res in (old.get("results") or []) + ([old["memory"]] if old.get("memory") else []):
                for row in res["rows"]:
                    row.setdefault("at", old["started"][11:16])
                    row.setdefault("day", old["started"])
                    row.setdefault("runs", len(row.get("walls", [])))
                    row.setdefault("load", float(res["load_before"].split()[0]))
                store["inputs"][res["input"]] = {**res, "rows": {r["command"]: r for r in res["rows"]}}
    for res in results:
        entry = store["inputs"].setdefault(res["input"], {"rows": {}})
        for k in ("input", "file", "bytes", "meta", "counts", "load_before", "load_after"):
            entry[k] = res[k]
        for row in res["rows"]:
            row.setdefault("day", started)
            entry["rows"][row["command"]] = row
    store["machine"] = desc
    os.makedirs(OUT, exist_ok=True)
    with open(STORE, "w") as f:
        json.dump(store, f, indent=2)
    return store


def _as_result(entry: dict) -> dict:
    rows = sorted(entry["rows"].values(), key=lambda r: (ORDER.index(r["command"]) if r["command"] in ORDER
                                                          else len(ORDER), r["command"]))
    return {**entry, "rows": rows}


def docs_from_store(store: dict) -> None:
    inputs = store["inputs"]
    timed = [_as_result(inputs[k]) for k in sorted(inputs) if k != "c"]
    mem = _as_result(inputs["c"]) if "c" in inputs else None
    days = sorted({r.get("day", "?")[:10] for res in timed + ([mem] if mem else []) for r in res["rows"]})
    update_docs("Offline commands vs tshark", (
        f"`make bench` (bench/run.py; inputs from bench/make_inputs.py) on {store['machine']}, "
        f"{', '.join(days)}. Each command is a fresh process writing jsonl (summary: json) to a file; "
        "tshark prints fields for every Kafka PDU (see bench/run.py). Wall and CPU (user+sys) are "
        "medians of the runs; the last column says when a row was measured, how many runs and the "
        "1-minute load average (this 2-core box is shared; wall time follows the load, CPU time much less).\n\n"
        + inputs_table(timed + ([mem] if mem else [])) + "\n\n" + table(timed)))
    if mem:
        update_docs("Memory", (
            f"Peak RSS (ru_maxrss of the command's process; with -j 2 the largest of the main process "
            f"and its workers) on ({mem['input']}), {mem['bytes'] / 1e9:.1f} GB ({mem['meta'].get('what', '')}):"
            "\n\n" + table([mem])))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inputs", default="a,b", help="comma-separated inputs to time (default a,b)")
    ap.add_argument("--runs", type=int, default=3, help="runs per command, median reported (default 3)")
    ap.add_argument("--jobs", default="2", help="--jobs values to time besides 1 (default 2; '' for none)")
    ap.add_argument("--no-memory", action="store_true", help="skip the memory run on (c)")
    ap.add_argument("--memory-runs", type=int, default=1, help="runs per command on (c) (default 1)")
    ap.add_argument("--only", default="", help="only these commands (e.g. exchanges,tshark)")
    ap.add_argument("--cores", default=None,
                    help="kwinspect cores to time: compiled,python (default: both when the compiled one is built)")
    ap.add_argument("--update-docs", action="store_true",
                    help="rewrite the generated part of two sections of docs/benchmarks.md from bench/out/results.json")
    ap.add_argument("--docs-only", action="store_true", help="only --update-docs from the stored results")
    args = ap.parse_args(argv)
    if args.docs_only:
        docs_from_store(merge_store([], "", None))
        return 0
    keys = [k for k in args.inputs.split(",") if k]
    need = keys + ([] if args.no_memory else ["c"])
    make_inputs.ensure(need)
    compile_bytecode()
    jobs = [int(j) for j in args.jobs.split(",") if j] if kw_supports_jobs() else []
    only = set(args.only.split(",")) - {""} or None
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    from kwinspect.core import core_name

    built = core_name() == "compiled"
    cores = tuple(c for c in (args.cores or ("compiled,python" if built else "python")).split(",") if c)
    if "compiled" in cores and not built:
        raise SystemExit("--cores compiled: the compiled core is not built (pip install -e . or "
                         "python setup.py build_ext --inplace)")
    tshark = tshark_program()
    tver = tshark_version(tshark)
    desc = f"{machine()}, {tver}"
    print(f"machine: {desc}\nload average: {loadavg()}\nkwinspect cores: {', '.join(cores)}")
    print(f"every ratio is against {tver} ({tshark or 'no tshark'})")
    results = [run_input(k, args.runs, jobs, only=only, cores=cores) for k in keys]
    mem = None
    if not args.no_memory:
        mem = run_input("c", args.memory_runs, jobs, with_tshark=False,
                        only=only or {"exchanges", "summary", f"exchanges -j {jobs[0]}" if jobs else "exchanges"})
    print()
    print(inputs_table(results + ([mem] if mem else [])))
    print()
    print(table(results))
    if mem:
        print()
        print(table([mem]))
    store = merge_store(results + ([mem] if mem else []), started, desc)
    if args.update_docs:
        docs_from_store(store)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
