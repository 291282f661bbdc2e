"""Pin every CLI output on every shipped and public capture, byte for byte.

The restructuring of issue 18 had to leave every output unchanged. This module
runs each (capture, command) in-process and records a SHA-256 of what it wrote;
tests/golden/test_pinned_outputs.py compares against tests/golden/outputs.json.

    python -m tests.golden.pin_outputs --write     # re-pin after an intended change
    python -m tests.golden.pin_outputs --dump DIR  # write the outputs, to diff two commits
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PUBLIC = ROOT.parent / "shared" / "captures-public"
PINS = Path(__file__).with_name("outputs.json")

# (name, argv before the capture path); "{out}" is replaced by a temporary file.
COMMANDS: list[tuple[str, list[str]]] = [
    ("summary", ["summary"]),
    ("summary-json", ["summary", "-F", "json"]),
    ("exchanges-jsonl", ["exchanges", "-F", "jsonl"]),
    ("exchanges-csv", ["exchanges", "-F", "csv"]),
    ("exchanges-table", ["exchanges", "-F", "table"]),
    ("exchanges-parquet", ["exchanges", "-F", "parquet", "-o", "{out}"]),
    ("exchanges-filter", ["exchanges", "-F", "jsonl", "-f", "latency_ms > 5 or api == 'Produce'"]),
    ("exchanges-jobs", ["exchanges", "-F", "jsonl", "-j", "2"]),
    ("records-jobs", ["records", "-F", "jsonl", "-j", "2"]),
    ("records-jsonl", ["records", "-F", "jsonl"]),
    ("records-hex-csv", ["records", "-F", "csv", "--values", "hex"]),
    ("records-parquet", ["records", "-F", "parquet", "-o", "{out}"]),
    ("errors-jsonl", ["errors", "-F", "jsonl"]),
    ("errors-records-table", ["errors", "--records", "-F", "table"]),
    ("latency-table", ["latency", "-F", "table"]),
    ("latency-broker-jsonl", ["latency", "--by", "broker", "-F", "jsonl"]),
    ("latency-topic-csv", ["latency", "--by", "topic", "-F", "csv"]),
    ("decode", ["decode"]),
    ("decode-no-redact", ["decode", "--no-redact", "--values", "base64"]),
    ("diagnose-jsonl", ["diagnose", "-F", "jsonl"]),
    ("diagnose-text", ["diagnose", "-F", "text"]),
    ("deliveries-jsonl", ["deliveries", "-F", "jsonl"]),
    ("deliveries-problems", ["deliveries", "--problems", "-F", "table"]),
]


def captures() -> list[Path]:
    found = sorted((ROOT / "captures").glob("*.pcap"))
    if PUBLIC.is_dir():
        found += sorted(PUBLIC.glob("*.pcap*"))
    return found


def _parquet_text(path: Path) -> bytes:
    """Parquet files carry writer metadata; pin the schema and rows instead."""
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    rows = json.dumps(table.to_pylist(), default=str, sort_keys=True)
    return (str(table.schema) + "\n" + rows).encode()


def run(command: list[str], capture: Path) -> tuple[int, bytes, bytes]:
    """Run one command in-process; return (exit status, stdout, stderr).

    The capture is named relative to the repository (outputs quote the path), so the
    pins hold wherever the repository is checked out."""
    from kwinspect import cli

    with tempfile.TemporaryDirectory() as tmp:
        out_file = Path(tmp) / "out.parquet"
        # a TLS capture shipped with its key log (NAME.keys) is pinned decrypted
        keys = capture.with_suffix(".keys")
        tls = ["--tls-keylog", os.path.relpath(keys, ROOT)] if keys.is_file() else []
        argv = [a.replace("{out}", str(out_file)) for a in command] + tls + [os.path.relpath(capture, ROOT)]
        stdout, stderr = io.StringIO(), io.StringIO()
        with contextlib.chdir(ROOT), contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            status = cli.main(argv)
        written = stdout.getvalue().encode()
        if out_file.exists():
            written += _parquet_text(out_file)
    return status, written, stderr.getvalue().encode()


def key(capture: Path, name: str) -> str:
    return f"{capture.name} {name}"


def digest(status: int, out: bytes, err: bytes) -> str:
    h = hashlib.sha256(out).hexdigest()[:24]
    e = hashlib.sha256(err).hexdigest()[:12]
    return f"{status} {h} {e}"


def pin_all(dump: Path | None = None) -> dict[str, str]:
    os.environ["COLUMNS"] = "120"
    os.environ.pop("SSLKEYLOGFILE", None)  # a developer's key log must not change the outputs
    os.environ["NO_COLOR"] = "1"
    pins = {}
    for capture in captures():
        for name, command in COMMANDS:
            status, out, err = run(command, capture)
            pins[key(capture, name)] = digest(status, out, err)
            if dump is not None:
                (dump / f"{capture.name}.{name}.out").write_bytes(out)
                (dump / f"{capture.name}.{name}.err").write_bytes(err)
    return pins


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help=f"re-pin into {PINS.name}")
    parser.add_argument("--dump", type=Path, help="also write every output into this folder")
    args = parser.parse_args()
    if args.dump:
        args.dump.mkdir(parents=True, exist_ok=True)
    pins = pin_all(args.dump)
    if args.write:
        PINS.write_text(json.dumps(pins, indent=1, sort_keys=True) + "\n")
    old = json.loads(PINS.read_text()) if PINS.exists() else {}
    changed = sorted(k for k in pins if old.get(k) != pins[k])
    for k in changed:
        print(f"changed: {k}", file=sys.stderr)
    print(f"{len(pins)} outputs, {len(changed)} differ from {PINS.name}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
