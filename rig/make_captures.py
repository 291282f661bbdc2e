"""Regenerate the captures/ corpus: `python -m rig.make_captures`.

    python -m rig.make_captures [--out captures/] [--only NAME ...] [--list]

Each scenario writes NAME.pcap and NAME.manifest.json into --out.  Needs root
(tcpdump on lo; the namespace variant also needs `ip` and `ethtool`).  The
README in captures/ describes every file; regenerate it after changing a
scenario and review the diff (ports, timestamps and offsets change per run).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import traceback

from rig.captures_readme import write_readme
from rig.deliveries_scenarios import SCENARIOS as DELIVERIES_SCENARIOS
from rig.deliveries_scenarios import unavailable_reason as deliveries_unavailable
from rig.rig import Rig
from rig.sasl_scenarios import SCENARIOS as SASL_SCENARIOS
from rig.scenarios import NEEDS_NETNS, unavailable_reason
from rig.scenarios import SCENARIOS as RIG_SCENARIOS
from rig.schema_scenarios import SCENARIOS as SCHEMA_SCENARIOS
from rig.tls_scenarios import SCENARIOS as TLS_SCENARIOS

# Every capture in captures/, so `make captures` regenerates the whole corpus.
SCENARIOS = {**RIG_SCENARIOS, **SASL_SCENARIOS, **TLS_SCENARIOS, **DELIVERIES_SCENARIOS,
             **SCHEMA_SCENARIOS}

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rig.make_captures",
                                 description="Regenerate the captures/ corpus from the scenarios.")
    ap.add_argument("--out", default="captures", help="output directory (default: captures)")
    ap.add_argument("--only", action="append", default=[], metavar="NAME",
                    help="run only this scenario (repeatable)")
    ap.add_argument("--list", action="store_true", help="list scenario names and exit")
    ap.add_argument("--skip-netns", action="store_true",
                    help="skip the network-namespace (1500 MTU) variant")
    args = ap.parse_args(argv)

    if args.list:
        for name, fn in SCENARIOS.items():
            doc = (fn.__doc__ or "").strip().splitlines()
            print(f"{name:34s} {doc[0] if doc else ''}")
        return 0
    unknown = [n for n in args.only if n not in SCENARIOS]
    if unknown:
        print(f"unknown scenario(s): {', '.join(unknown)}; see --list", file=sys.stderr)
        return 2
    names = args.only or list(SCENARIOS)
    if args.skip_netns:
        names = [n for n in names if n not in NEEDS_NETNS]
    if os.geteuid() != 0:
        print("warning: not root; tcpdump on lo will probably fail", file=sys.stderr)

    os.makedirs(args.out, exist_ok=True)
    failed: list[str] = []
    with Rig(log_dir=tempfile.mkdtemp(prefix="kwinspect-captures-")) as rig:
        for name in names:
            why = deliveries_unavailable(name) if name in DELIVERIES_SCENARIOS else unavailable_reason(name)
            if why:
                print(f"skipped {name}: {why}", file=sys.stderr)
                continue
            t0 = time.monotonic()
            try:
                m = SCENARIOS[name](rig, args.out)
            except Exception:  # report and go on with the others
                traceback.print_exc()
                failed.append(name)
                print(f"FAILED {name}", file=sys.stderr)
                continue
            size = os.path.getsize(os.path.join(args.out, m.pcap))
            drops = m.capture.get("stats", {}).get("dropped_by_kernel", 0)
            if drops:
                print(f"warning: {name}: tcpdump reports {drops} packets dropped by the kernel",
                      file=sys.stderr)
            print(f"{name:34s} {time.monotonic() - t0:6.1f}s {size / 1024:8.1f} KiB  "
                  f"produced={len(m.produced)} consumed={len(m.consumed)} "
                  f"ports={','.join(map(str, m.kafka_ports))}")
    write_readme(args.out)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
