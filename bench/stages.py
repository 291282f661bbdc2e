"""Where the CPU goes: each stage of the pipeline timed by running the stages before it too.

    .venv/bin/python bench/stages.py b               # input (b) of bench/make_inputs.py
    .venv/bin/python bench/stages.py a --stages read,parse,tcp
    .venv/bin/python bench/stages.py PATH.pcap --ports 9092
    KWINSPECT_PURE=1 .venv/bin/python bench/stages.py b   # the pure-Python core
    .venv/bin/python bench/stages.py b --cores compiled,python --runs 3   # both, interleaved

A profiler multiplies the cost of small Python functions (cProfile ~5x here,
pyinstrument ~3x of wall), so the split between stages it reports is skewed.
Here every stage runs in a fresh process over the whole capture, doing the work
of all the stages before it and stopping there; the CPU time (process_time,
imports excluded) of stage N minus that of stage N-1 is what stage N costs:

  read       open_capture, iterate the RawPackets
  parse      + PacketParser.parse (link, IP, TCP headers)
  tcp        + TcpReassembler (in-order data to a sink that drops it)
  frames     + the Dissector: detection, framing; a conversation that drops frames
  decode     + decode_request / decode_response of every frame (no pairing, labels, rows)
  dissect    + pairing, labels, Exchange/ErrorRow values (PacketLoop, rows in order)
  exchanges  + the rows rendered to jsonl (`kwinspect exchanges -F jsonl -o /dev/null`)
  records    `kwinspect records -F jsonl -o /dev/null` (decodes and renders every record)
  summary    `kwinspect summary -F json` (stdout to /dev/null)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, ROOT)

STAGES = ("read", "parse", "tcp", "frames", "decode", "dissect", "exchanges", "records", "summary")
CUMULATIVE = STAGES[:7]  # each of these does the work of the ones before it


def _stage(name: str, path: str, ports: list[int]) -> float:
    """Run one stage in this process; its CPU seconds."""
    from kwinspect.capture.packets import PacketParser
    from kwinspect.capture.readers import open_capture
    from kwinspect.capture.tcp import TcpReassembler
    from kwinspect.dissect import DissectConfig, Dissector
    from kwinspect.protocol import decode_request, decode_response
    from kwinspect.run.loop import PacketLoop
    from kwinspect.stream.conversation import Conversation

    config = DissectConfig(kafka_ports=frozenset(ports))

    class DropFrames(Conversation):
        def on_request(self, frame, ts_first, ts_last):
            pass

        def on_response(self, frame, ts_first, ts_last):
            pass

    class DecodeOnly(Conversation):
        versions: dict

        def on_request(self, frame, ts_first, ts_last):
            msg = decode_request(frame)
            if msg.api_key is not None:
                self.__dict__.setdefault("versions", {})[msg.header.get("correlation_id")] = (
                    msg.api_key, msg.api_version)

        def on_response(self, frame, ts_first, ts_last):
            cid = int.from_bytes(frame[:4], "big", signed=True) if len(frame) >= 4 else None
            kv = self.__dict__.get("versions", {}).pop(cid, None)
            if kv is not None:
                decode_response(frame, *kv)

    t0 = time.process_time()
    if name in ("read", "parse", "tcp"):
        parser = PacketParser()
        tcp = TcpReassembler()
        tcp.data_sink = lambda *a: None
        with open_capture(path) as src:
            for raw in src:
                if name == "read":
                    continue
                seg = parser.parse(raw)
                if name == "tcp" and seg is not None:
                    tcp.feed(seg)
        if name == "tcp":
            tcp.finish()
    elif name in ("frames", "decode", "dissect"):
        conv = {"frames": DropFrames, "decode": DecodeOnly, "dissect": Conversation}[name]
        d = Dissector(config, conversation_class=conv)
        with open_capture(path) as src:
            for _row in PacketLoop(d).run(src):
                pass
    else:
        from kwinspect import cli

        p = ",".join(map(str, ports))
        argv = {"exchanges": ["exchanges", "-F", "jsonl", "-o", os.devnull],
                "records": ["records", "-F", "jsonl", "-o", os.devnull],
                "summary": ["summary", "-F", "json"]}[name]
        saved = sys.stdout
        with open(os.devnull, "w") as sink:
            sys.stdout = sink
            try:
                cli.main([*argv, "-q", "--kafka-ports", p, path])
            finally:
                sys.stdout = saved
    return time.process_time() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("input", help="a, b or c (bench/make_inputs.py), or a capture file")
    ap.add_argument("--ports", default="", help="Kafka ports (default: from the input's .json)")
    ap.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated, of {', '.join(STAGES)}")
    ap.add_argument("--runs", type=int, default=1, help="runs per stage, the median is kept (default 1)")
    ap.add_argument("--cores", default="",
                    help="compiled,python: both cores, alternating run by run (default: the one installed)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.input in ("a", "b", "c"):
        import make_inputs

        path = make_inputs.path_of(args.input)
        ports = make_inputs.meta_of(args.input)["kafka_ports"]
    else:
        path, ports = args.input, []
    if args.ports:
        ports = [int(x) for x in args.ports.split(",")]
    if args.child:
        print(json.dumps(_stage(args.child, path, ports or [9092])))
        return 0
    from kwinspect.core import PURE_ENV, core_name

    stages = [s for s in args.stages.split(",") if s]
    cores = [c for c in args.cores.split(",") if c] or [core_name()]
    print(f"{path} ({os.path.getsize(path) / 1e6:.0f} MB), cores: {', '.join(cores)}, "
          f"load {os.getloadavg()[0]:.1f}, median of {args.runs}")
    prev: dict[str, float] = {}
    for name in stages:
        samples: dict[str, list[float]] = {c: [] for c in cores}
        for _ in range(args.runs):
            for c in cores:  # interleaved: the cores see the same load
                env = dict(os.environ)
                env.pop(PURE_ENV, None)
                if c == "python":
                    env[PURE_ENV] = "1"
                out = subprocess.run([sys.executable, os.path.abspath(__file__), args.input, "--child", name,
                                      "--ports", ",".join(map(str, ports))],
                                     capture_output=True, text=True, cwd=ROOT, check=True, env=env)
                samples[c].append(json.loads(out.stdout.strip().splitlines()[-1]))
        cells = []
        for c in cores:
            cpu = sorted(samples[c])[len(samples[c]) // 2]
            step = ""
            if name in CUMULATIVE and c in prev:
                step = f" (+{cpu - prev[c]:6.2f})"
            cells.append(f"{c} {cpu:7.2f} s{step}")
            if name in CUMULATIVE:
                prev[c] = cpu
        print(f"  {name:10s} " + "   ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
