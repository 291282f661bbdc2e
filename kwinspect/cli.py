"""The kwinspect command line: one program, subcommands in the style of tshark and kcat.

Exit status: 0 when the input was read (malformed Kafka data inside it is
reported, not fatal), 1 when an input cannot be read, 2 for usage errors
(bad flags, bad --filter expressions), 130 after Ctrl-C (what was processed
so far is printed first).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

from kwinspect import core
from kwinspect.capture.keylog import KeyLog
from kwinspect.capture.readers import CaptureFormatError
from kwinspect.dissect import DEFAULT_KAFKA_PORTS, DissectConfig
from kwinspect.model import (
    EXCHANGE_COLUMNS,
    ErrorRow,
    Exchange,
    plural,
)
from kwinspect.protocol.schema.api_keys import ApiKey
from kwinspect.run.files import FileRun, dissect_file_batches

PRODUCE = int(ApiKey.PRODUCE)
FETCH = int(ApiKey.FETCH)

PROG = "kwinspect"
VALUE_MODES = ("auto", "utf8", "hex", "base64")
TABLE_FORMATS = ("table", "jsonl", "csv", "parquet")

EXAMPLES = """\
examples:
  kwinspect summary capture.pcap
  kwinspect exchanges capture.pcap --filter 'api == "Produce" and latency_ms > 50'
  kwinspect records capture.pcap --format parquet -o records.parquet
  kwinspect errors capture.pcap --format csv
  kwinspect latency capture.pcap --by broker --plot latency.html
  kwinspect stats capture.pcap --interval 10s --by api,topic -o stats.parquet
  kwinspect deliveries capture.pcap --problems
  kwinspect decode capture.pcap | jq 'select(.api_name == "Metadata")'
  kwinspect exchanges rotated-*.pcap --kafka-ports 9092,19092-19094

Kafka is found on port 9092 and, by detection, on any other port; --kafka-ports
names broker ports up front (needed for connections whose start was not captured
on unusual ports). Output columns of every table: docs/columns.md; the filter
language: docs/filter.md; formats and examples: docs/cli.md.
"""


class UsageError(Exception):
    """Bad input from the user: one line on stderr, exit status 2."""


# ---------------------------------------------------------------------------
# Argument parsing
# ---------------------------------------------------------------------------




def parse_ports(text: str) -> frozenset[int]:
    """'9092,19092-19094' -> {9092, 19092, 19093, 19094}."""
    ports: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            a, b = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a port or port range: {part!r}") from None
        if sep and a > b:
            raise argparse.ArgumentTypeError(f"port range {part!r} is reversed: write {b}-{a}")
        if not (0 < a <= b <= 65535):
            raise argparse.ArgumentTypeError(f"port range out of bounds (1-65535): {part!r}")
        ports.update(range(a, b + 1))
    if not ports:
        raise argparse.ArgumentTypeError("no ports given")
    return frozenset(ports)


def _input_options(p: argparse.ArgumentParser, nargs: str = "+", jobs: bool = True) -> None:
    p.add_argument("pcap", nargs=nargs, metavar="PCAP",
                   help="pcap or pcapng file(s), optionally .gz; several are read as one capture in time order")
    g = p.add_argument_group("reading")
    g.add_argument("--kafka-ports", type=parse_ports, metavar="PORTS",
                   help="broker ports, e.g. 9092,19092-19094 (default: 9092, plus detection on any port)")
    g.add_argument("--no-detect", action="store_true",
                   help="only treat --kafka-ports as Kafka; do not look for Kafka on other ports")
    g.add_argument("--values", choices=VALUE_MODES, default="auto",
                   help="how to show keys, values and bytes: auto = UTF-8 text when it decodes, else base64")
    g.add_argument("--no-redact", action="store_true",
                   help="show SASL passwords, SCRAM proofs, OAuth tokens and token HMACs (redacted by default)")
    g.add_argument("--max-frame-size", type=_frame_size, default=None, metavar="BYTES",
                   help="largest Kafka frame accepted (default 100 MiB, as brokers use)")
    g.add_argument("--tls-keylog", action="append", default=[], metavar="FILE",
                   help="NSS key log (SSLKEYLOGFILE format) to decrypt TLS connections with; repeatable. "
                        "SSLKEYLOGFILE, when set, is read too, and secrets in pcapng Decryption Secrets "
                        "Blocks are used")
    g.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    if jobs:  # not for the tui, which decodes in one process as it browses
        g.add_argument("-j", "--jobs", type=_jobs, default=1, metavar="N",
                       help="decode with N worker processes, TCP connections shared out among them "
                            "by one process that reads the capture; same output as one process "
                            "(default 1; 0 = one per CPU)")


def _schema_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("schema registry (keys and values in the Confluent wire format)")
    g.add_argument("--schemas", metavar="DIR|FILE",
                   help="decode Avro, Protobuf and JSON Schema keys/values with these schemas: a "
                        "folder of files named by schema id (42.avsc, 43.proto, 44.json, plus the "
                        "files they reference) or a registry export (the JSON of GET /schemas)")
    g.add_argument("--schema-registry", metavar="URL",
                   help="fetch the schemas from this Schema Registry (GET /schemas/ids/{id}); "
                        "basic auth from $KWINSPECT_SCHEMA_REGISTRY_AUTH (user:password); "
                        "answers are cached, so a second run is offline")
    g.add_argument("--schema-cache", metavar="DIR",
                   help="where --schema-registry keeps its answers (default "
                        "~/.cache/kwinspect/schema-registry/HOST)")


def _schema_values(args) -> Any:
    """The SchemaValues of --schemas / --schema-registry (None without them), made once."""
    cached = getattr(args, "schema_values_made", None)
    if cached is not None:
        return cached or None
    from kwinspect.analyze.schema_source import SchemaSourceError, open_schema_source
    from kwinspect.analyze.schema_values import SchemaValues

    try:
        source = open_schema_source(getattr(args, "schemas", None),
                                    getattr(args, "schema_registry", None),
                                    getattr(args, "schema_cache", None))
    except SchemaSourceError as exc:
        raise UsageError(str(exc)) from None
    args.schema_values_made = SchemaValues(source) if source is not None else False
    return args.schema_values_made or None


def _frame_size(text: str) -> int:
    from kwinspect.protocol.peek import MIN_REQUEST_HEADER

    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of bytes: {text!r}") from None
    if n < MIN_REQUEST_HEADER:  # api key, version, correlation id, client id length
        raise argparse.ArgumentTypeError(
            f"{n} is below the smallest valid Kafka frame ({MIN_REQUEST_HEADER} bytes: a request header)")
    return n


def _jobs(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of processes: {text!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError("--jobs must be 0 (one per CPU) or more")
    return n or (os.cpu_count() or 1)


def _max_records(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of records: {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError("--max-records must be at least 1")
    return n


def _output_options(p: argparse.ArgumentParser, formats=TABLE_FORMATS, filterable=True) -> None:
    g = p.add_argument_group("output")
    g.add_argument("-F", "--format", choices=formats, default=None,
                   help="output format (default: table on a terminal, else jsonl; or from -o's extension)")
    g.add_argument("-o", "--output", metavar="OUT", help="write to OUT instead of stdout")
    if "csv" in formats:
        g.add_argument("--csv-exact", action="store_true",
                       help="CSV: write text exactly as captured; by default a cell starting with "
                            "= + - @ tab or CR gets a leading ' so spreadsheets do not run it as a formula")
    if filterable:
        g.add_argument("-f", "--filter", metavar="EXPR",
                       help='keep rows matching EXPR, e.g. \'api == "Produce" and latency_ms > 50\', '
                            "'topic ~ \"orders.*\"', 'error' (see docs/filter.md)")


class _Version(argparse.Action):
    """--version: the version, and which core runs (asked only when --version is given)."""

    def __init__(self, option_strings, version: str, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                 help: str | None = None) -> None:
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)
        self.version = version

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        from kwinspect.core import describe

        print(f"{self.version}, {describe()}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    from kwinspect import __version__

    parser = argparse.ArgumentParser(
        prog=PROG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Kafka wire-protocol analyzer: decode Kafka traffic in pcap/pcapng captures.",
        epilog=EXAMPLES)
    parser.add_argument("--version", action=_Version, version=f"{PROG} {__version__}",
                        help="show the version and which core runs (compiled or python), then exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def add(name: str, help_text: str, description: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help_text, description=description,
                              formatter_class=argparse.RawDescriptionHelpFormatter)

    p = add("summary", "one-screen overview of a capture",
            "Capture span, connections, brokers, clients (with library guess), API mix and versions,\n"
            "error counts, latency percentiles per API, top topics, and anomalies.\n"
            "The -F json fields are defined in docs/columns.md.")
    _input_options(p)
    p.add_argument("-F", "--format", choices=("table", "json"), default="table",
                   help="table (default) or json")

    for name, what in (("exchanges", "one row per request/response pair"),
                       ("records", "one row per Kafka record produced or fetched"),
                       ("errors", "Kafka error codes and anomalies (gaps, missing requests, bad CRCs, ...)")):
        p = add(name, what, f"{what[0].upper()}{what[1:]}; every column is defined in docs/columns.md.")
        _input_options(p)
        if name != "exchanges":
            _schema_options(p)
        _output_options(p)
        if name == "errors":
            p.add_argument("--records", action="store_true",
                           help="also decode every record batch (decompressing it) and list the problems found "
                                "there: limits hit (compression bombs), bad records; slower")

    p = add("latency", "latency percentiles by api, broker, client or topic",
            "Latency = request's last byte to response's first byte, from capture timestamps.\n"
            "Percentiles are nearest-rank (p50/p95/p99/max) over paired exchanges.\n"
            "Columns: docs/columns.md.")
    _input_options(p)
    p.add_argument("--by", choices=("api", "broker", "client", "topic"), default="api", help="grouping (default api)")
    p.add_argument("--plot", metavar="FILE", help="also write a histogram and time series: .png, .svg or .html")
    _output_options(p)

    p = add("stats", "traffic as time series: requests, errors, latency, bytes per interval",
            "Per interval (--interval, default 1s): requests, errors and unanswered requests per\n"
            "api, version, broker and client_id; latency histogram and p50/p95/p99 per api and\n"
            "broker (Fetch long polls counted apart); produced and fetched records and bytes per\n"
            "topic and partition; throttling; connections opened, closed and refused per broker;\n"
            "consumer lag per group, topic and partition where the capture shows it.\n"
            "One row per interval, series and dimension values (long format, for pandas/Spark).\n"
            "Series and columns: docs/columns.md; examples: docs/cli.md.")
    p.epilog = STATS_EXAMPLES
    _input_options(p, jobs=False)
    g = p.add_argument_group("series")
    g.add_argument("-i", "--interval", default="1s", metavar="DURATION",
                   help="length of an interval: 100ms, 1s, 10s, 1m, 1h (default 1s); intervals start "
                        "on multiples of it since the epoch")
    g.add_argument("--by", default=None, metavar="DIMS",
                   help="dimensions to keep, comma-separated: api, version, broker, client, topic, "
                        "partition, group (default all; 'none' for totals); the others are summed over")
    g.add_argument("--series", default=None, metavar="FAMILIES",
                   help="series to count, comma-separated: requests, latency, volume, throttle, "
                        "connections, lag (default all)")
    g.add_argument("--max-labels", type=int, default=None, metavar="N",
                   help="distinct values kept per api, version, broker, client_id, topic and group "
                        "(default 1000); later new values are counted as (other)")
    g.add_argument("--plot", metavar="FILE",
                   help="also draw requests/s, p99 latency and bytes/s over time: .png, .svg or .html")
    g.add_argument("--plot-by", choices=("api", "topic"), default="api",
                   help="one line per api (default) or per topic in the --plot")
    _output_options(p, filterable=False)
    g.add_argument("-f", "--filter", metavar="EXPR",
                   help="count only exchanges matching EXPR (exchange columns, see docs/filter.md); "
                        "connections are not exchanges and are always counted")
    p = add("deliveries", "follow every acknowledged record: produce, ack, fetches, commit",
            "One row per produced record the broker acknowledged (its offset from the\n"
            "ProduceResponse), joined with every Fetch response that returned that offset\n"
            "and the first OffsetCommit covering it, with the delays between them.\n"
            "--problems lists what the join finds instead: records never fetched (a gap\n"
            "when a consumer read past them), records written twice by a retry, records\n"
            "fetched twice by one group, failed attempts that were retried, offsets a\n"
            "consumer skipped. Columns: docs/columns.md; findings: docs/diagnose.md.")
    p.epilog = ("examples:\n"
                "  kwinspect deliveries capture.pcap\n"
                "  kwinspect deliveries capture.pcap -f 'times_fetched == 0' -F csv -o unread.csv\n"
                "  kwinspect deliveries capture.pcap -f 'end_to_end_ms > 500'\n"
                "  kwinspect deliveries capture.pcap --problems\n")
    _input_options(p)
    _output_options(p)
    p.add_argument("--problems", action="store_true",
                   help="list the findings of the join (as `diagnose` does) instead of the rows: text on a "
                        "terminal or with -F table, else -F jsonl")
    p.add_argument("--max-records", type=_max_records, default=None, metavar="N",
                   help="track at most N records (default 200,000, about 550 bytes each); past it the "
                        "output says where it was truncated")

    p = add("decode", "every message fully decoded, as JSON lines (for jq)",
            "One JSON object per exchange: its columns plus request and response with header, body, issues.\n"
            "Fields: docs/columns.md.")
    _input_options(p)
    g = p.add_argument_group("output")
    g.add_argument("-o", "--output", metavar="OUT", help="write to OUT instead of stdout")
    g.add_argument("-f", "--filter", metavar="EXPR", help="keep exchanges matching EXPR (exchange columns)")

    p = add("tui", "interactive browser of a capture (Textual)",
            "Browse exchanges like a protocol analyst: filter, decoded trees, records, hex,\n"
            "connections, errors and latency views. Press ? inside for the keys.\n"
            "--live -i IFACE captures on an interface (as `kwinspect live`; root or CAP_NET_RAW);\n"
            "--live PCAP replays a capture as a live feed.")
    _input_options(p, nargs="*", jobs=False)
    _schema_options(p)
    p.add_argument("--live", action="store_true", help="live mode: rows stream in and the view follows the tail")
    p.add_argument("-i", "--interface", metavar="IFACE", help="capture on IFACE (with --live)")
    p.add_argument("--rate", type=float, default=None, metavar="N",
                   help="with --live PCAP: replay N exchanges per second (default: the capture's own pace)")
    p.add_argument("-f", "--filter", metavar="EXPR", help="start with this filter (the --filter language)")

    p = add("pipeline", "Spark pipeline over many (rotated, large) captures, Parquet out",
            "Runs the same decoder on Spark (embedded local[*] by default, or --master URL):\n"
            "files are read in parallel, each TCP connection is dissected in capture order,\n"
            "and exchanges, errors (and --records) are written to DIR as Parquet with the\n"
            "exporters' schemas; stats (per minute, as `kwinspect stats -i 1m`; --no-stats\n"
            "leaves it out) and --deliveries (as `kwinspect deliveries`) are joined across\n"
            "connections in Spark; plus per-minute latency, error and topic-volume tables.\n"
            "  kwinspect pipeline 'rotated/*.pcap' -o tables/ --records --deliveries\n"
            "See docs/pipeline.md.")
    p.add_argument("pcap", nargs="+", metavar="INPUT",
                   help="pcap/pcapng(.gz) files, directories or globs; local paths or URIs (hdfs://, s3a://, ...)")
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="output directory (Parquet tables)")
    p.add_argument("--master", metavar="URL", help="Spark master (default local[*]; spark://, yarn, k8s://...)")
    p.add_argument("--partitions", type=int, metavar="N", help="shuffle partitions for the per-connection stage")
    p.add_argument("--records", action="store_true", help="also write the records table (one row per record)")
    p.add_argument("--no-stats", dest="stats", action="store_false",
                   help="leave out the stats table (per minute, the rows of `kwinspect stats -i 1m`)")
    p.add_argument("--deliveries", action="store_true",
                   help="also write the deliveries table (every acknowledged record joined with its fetches "
                        "and commit, as `kwinspect deliveries`; a join across connections)")
    p.add_argument("--overwrite", action="store_true", help="replace DIR if it exists")
    p.add_argument("--split-mb", type=int, default=128, metavar="MB",
                   help="read uncompressed pcap and pcapng files in byte ranges of this size (default 128)")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="extra Spark setting (repeatable)")
    p.add_argument("--ship-env", action="store_true",
                   help="on a cluster, pack this virtualenv (venv-pack, cached) and run the executors' "
                        "Python from it, so workers need no kwinspect or pyarrow of their own")
    g = p.add_argument_group("reading")
    g.add_argument("--kafka-ports", type=parse_ports, metavar="PORTS",
                   help="broker ports, e.g. 9092,19092-19094 (default: 9092, plus detection on any port)")
    g.add_argument("--no-detect", action="store_true", help="only treat --kafka-ports as Kafka")
    g.add_argument("--values", choices=VALUE_MODES, default="auto", help="how to show keys and values (records)")
    g.add_argument("--no-redact", action="store_true", help="show SASL secrets (redacted by default)")
    g.add_argument("--max-frame-size", type=_frame_size, default=None, metavar="BYTES",
                   help="largest Kafka frame accepted (default 100 MiB)")
    g.add_argument("--tls-keylog", action="append", default=[], metavar="FILE",
                   help="NSS key log (SSLKEYLOGFILE format) to decrypt TLS connections with; repeatable. "
                        "A local file, read by the driver and broadcast to the executors; SSLKEYLOGFILE "
                        "is read too, and secrets in pcapng Decryption Secrets Blocks are used")
    g.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")

    p = add("diagnose", "findings about interop problems, with the exchanges as evidence",
            "Version negotiation, producer sequences/retries/transactions, consumer-group rebalances,\n"
            "fetch sessions, metadata storms, leader changes, throttling, connection churn, lost requests\n"
            "and latency outliers, and what following every record finds (records never fetched,\n"
            "written twice, fetched twice by a group, retried, skipped); each finding has a severity\n"
            "and the exchanges (stream + correlation id) that show it. Rules and thresholds:\n"
            "docs/diagnose.md; fields: docs/columns.md.")
    _input_options(p)
    g = p.add_argument_group("output")
    g.add_argument("-F", "--format", choices=("text", "jsonl"), default=None,
                   help="text (default on a terminal) or jsonl (one finding per line; default otherwise)")
    g.add_argument("-o", "--output", metavar="OUT", help="write to OUT instead of stdout")
    g.add_argument("--min-severity", choices=("info", "warning", "error"), default="info",
                   help="leave out findings below this severity (default info: everything)")
    _add_live_parser(add)

    p = add("sanitize", "a copy of a capture safe to share: values hashed, names replaced",
            "Write OUT (.pcap or .pcapng) with record keys, values and header values\n"
            "replaced by keyed hashes of the same length; client ids, topics, groups,\n"
            "members, transactional ids, principals and hosts by stable pseudonyms; SASL\n"
            "tokens and token HMACs removed; IP and MAC addresses and client ports\n"
            "mapped. Every length, CRC, checksum and TCP sequence number is recomputed,\n"
            "so kwinspect and Wireshark decode it as the original. TLS connections,\n"
            "non-Kafka packets and frames that cannot be decoded are left out. Prints\n"
            "what was replaced, per kind. Memory stays small whatever the capture's size\n"
            "(the bytes go through temporary files in $TMPDIR). See docs/sanitize.md.\n\n"
            "  kwinspect sanitize prod.pcap -o shareable.pcapng --report report.json\n"
            "  kwinspect sanitize a.pcap b.pcap -o out.pcap --keep-topics --mapping map.json\n"
            "  tcpdump -i any -w - port 9092 | kwinspect sanitize - -o shareable.pcapng\n"
            "  kwinspect sanitize a.pcap -o a.pcapng --secret-file key --addresses prefix")
    p.add_argument("pcap", nargs="+", metavar="PCAP",
                   help="pcap or pcapng file(s), optionally .gz; - reads standard input")
    p.add_argument("-o", "--output", required=True, metavar="OUT",
                   help="the sanitized capture: .pcapng, else pcap")
    g = p.add_argument_group("what is replaced")
    g.add_argument("--values", default="hash", metavar="hash|truncate:N|keep",
                   help="record keys, values and header values: a keyed hash of the same length "
                        "(default), their first N bytes, or kept")
    g.add_argument("--secret", metavar="TEXT",
                   help="key of the hashes and pseudonyms: the same secret gives the same pseudonyms "
                        "across captures (default: random for this run). Visible in `ps`: prefer "
                        "--secret-file or $KWINSPECT_SANITIZE_SECRET")
    g.add_argument("--secret-file", metavar="FILE",
                   help="read the secret from the first line of FILE (else $KWINSPECT_SANITIZE_SECRET "
                        "is used when set)")
    g.add_argument("--addresses", choices=("map", "prefix", "keep"), default="map",
                   help="IP addresses: numbered into documentation ranges in order of appearance "
                        "(map, default), mapped keeping shared prefixes (prefix: keyed, subnets stay "
                        "subnets), or kept")
    g.add_argument("--ports", choices=("clients", "all", "keep"), default="clients",
                   help="TCP ports: clients' (ephemeral) ports mapped, broker ports kept so Wireshark "
                        "knows Kafka (clients, default); broker ports too, in packets and in Kafka "
                        "bodies (all: decode with -d tcp.port==PORT,kafka); or kept")
    g.add_argument("--keep-ports", action="store_true", help="keep every port (the same as --ports keep)")
    g.add_argument("--keep-topics", action="store_true", help="keep topic names")
    g.add_argument("--keep-other", action="store_true",
                   help="also copy packets that are not Kafka over TCP (as they are: not sanitized)")
    g.add_argument("--undecodable", choices=("drop", "zero"), default="drop",
                   help="a Kafka frame that cannot be decoded: left out (default) or kept as zeros")
    g = p.add_argument_group("output")
    g.add_argument("--report", metavar="FILE.json", help="write the report as JSON to FILE (- for stdout)")
    g.add_argument("--mapping", metavar="FILE",
                   help="write original -> pseudonym per kind as JSON (it holds the originals: keep it)")
    g = p.add_argument_group("reading")
    g.add_argument("--kafka-ports", type=parse_ports, metavar="PORTS",
                   help="broker ports, e.g. 9092,19092-19094 (default: 9092, plus detection on any port)")
    g.add_argument("--no-detect", action="store_true",
                   help="only treat --kafka-ports as Kafka; do not look for Kafka on other ports")
    g.add_argument("--max-frame-size", type=_frame_size, default=None, metavar="BYTES",
                   help="largest Kafka frame accepted (default 100 MiB, as brokers use)")
    return parser


# ---------------------------------------------------------------------------
# Running the pipeline
# ---------------------------------------------------------------------------


def _config(args, watch_keys: bool = False) -> DissectConfig:
    kw: dict[str, Any] = {"redact": not args.no_redact, "detect": not args.no_detect}
    if args.kafka_ports:
        kw["kafka_ports"] = args.kafka_ports if args.no_detect else args.kafka_ports | DEFAULT_KAFKA_PORTS
    if args.max_frame_size is not None:
        kw["max_frame_size"] = args.max_frame_size
    keys = _tls_keys(args, watch_keys)
    if keys is not None:
        kw["tls_keys"] = keys
    return DissectConfig(**kw)


def _tls_keys(args, watch: bool = False) -> KeyLog | None:
    """The key logs of --tls-keylog and SSLKEYLOGFILE, read once per command; with
    ``watch`` (live capture) read again as they grow, and a file that does not exist
    yet is read once a client creates it.  An error names the file, never its content."""
    cached = getattr(args, "tls_keys_read", None)
    if cached is not None:
        return cached or None
    paths = list(getattr(args, "tls_keylog", None) or [])
    env = os.environ.get("SSLKEYLOGFILE")
    if env and (watch or os.path.isfile(env)) and env not in paths:
        paths.append(env)
    keys = KeyLog()
    for path in paths:
        if watch and os.path.isdir(path):
            raise UsageError(f"--tls-keylog {path}: is a directory")
        try:
            if watch:
                keys.watch(path)
            else:
                keys.add_file(path)
        except OSError as exc:
            raise UsageError(f"--tls-keylog {path}: {exc.strerror or 'cannot be read'}") from None
    args.tls_keys_read = keys if paths else False
    return keys if paths else None


def _check_inputs(paths: list[str]) -> None:
    if paths.count("-") > 1:
        raise UsageError("standard input (-) can be read only once")
    for path in paths:
        if path == "-":  # standard input (kwinspect.run.files.STDIN)
            continue
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path}: no such file")
        if os.path.isdir(path):
            raise IsADirectoryError(f"{path}: is a directory")
        if not os.access(path, os.R_OK):
            raise PermissionError(f"{path}: permission denied")


def _events(args, run: FileRun, render: Callable[[Any], Any] | None = None, fold: Any = None) -> Iterator[Any]:
    """The events of the inputs; with --jobs and ``render`` (see dissect_files_parallel)
    also rows the workers rendered to their final text (str); with ``fold``, the workers'
    partial results are in ``run.dissector.partials`` at the end."""
    for batch in _event_batches(args, run, render, fold):
        yield from batch


EVENT_BATCH = 256  # --jobs rows handed on together (one process: the packet loop's lists)
ROW_BATCH = 256  # table rows made from events handed to the writer together, at most


def _in_lists(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    """items, a list of at most ``size`` at a time."""
    out: list[Any] = []
    for item in items:
        out.append(item)
        if len(out) >= size:
            yield out
            out = []
    if out:
        yield out


def _event_batches(args, run: FileRun, render: Callable[[Any], Any] | None = None,
                   fold: Any = None) -> Iterator[list[Any]]:
    """_events a list at a time."""
    from kwinspect.export.progress import Progress

    _check_inputs(args.pcap)
    total = sum(os.path.getsize(p) for p in args.pcap if p != "-")
    # the commands that read no Produce bodies have them decoded only if asked
    config = _config(args)
    if args.command in ("exchanges", "summary"):
        config = dataclasses.replace(config, defer_bodies=True)
    with Progress(total, "reading", enabled=False if args.quiet else None) as progress:
        if getattr(args, "jobs", 1) > 1 and "-" not in args.pcap:  # a pipe cannot be split
            from kwinspect.run.parallel import dissect_files_parallel

            # exchanges/errors rows and latency stats need no decoded bodies, summary only record
            # counts and sizes: do not ship the rest between processes
            bodies = {"exchanges": False, "errors": getattr(args, "records", False), "latency": False,
                      "summary": "summary"}.get(args.command, True)
            yield from _in_lists(dissect_files_parallel(args.pcap, config, run=run,
                                                        progress=lambda done, _total: progress.update(done),
                                                        jobs=args.jobs, bodies=bodies, render=render, fold=fold),
                                 EVENT_BATCH)
            return
        yield from dissect_file_batches(args.pcap, config, run=run,
                                        progress=lambda done, _total: progress.update(done))


def _consume(args, run: FileRun, handle: Callable[[Any], Any], fold: Any = None,
             handle_batch: Callable[[list], Any] | None = None) -> bool:
    """Feed every event of the inputs to handle() (or each batch of them to
    handle_batch()); True when Ctrl-C cut the input short."""
    try:
        for batch in _event_batches(args, run, fold=fold):
            if handle_batch is not None:
                handle_batch(batch)
                continue
            for ev in batch:
                handle(ev)
    except KeyboardInterrupt:
        return True
    return False


class RecordProblems(NamedTuple):
    """The kinds of the record-batch problems of one exchange, beside its rendered records
    (--jobs workers); the main process counts them for the line at the end of `records`."""

    kinds: tuple[str, ...]


def _compile_filter(expr: str | None, columns, schemas: Any = None,
                    record_paths: bool = False) -> Callable[[dict], bool] | None:
    if not expr:
        return None
    from kwinspect.analyze.filter import FilterError, compile_filter

    try:
        return compile_filter(expr, columns,
                              fields=schemas.field_kinds() if schemas is not None else None,
                              record_paths=record_paths)
    except FilterError as exc:
        raise UsageError(f"bad --filter expression: {exc}") from None


# the records columns schema decoding fills in or changes
DECODED_COLUMNS = frozenset({"key", "value", "key_encoding", "value_encoding", "key_schema_id",
                             "value_schema_id", "value_format"})


def _schema_passes(args, table: str, keep: Any) -> tuple[Any, Any]:
    """(decode before the filter, decode after it): a filter that reads none of the
    columns decoding changes runs first, so only the records written are decoded."""
    schemas = _schema_values(args) if table in ("records", "errors") else None
    if schemas is None or table != "records" or keep is None:
        return schemas, None
    from kwinspect.analyze.filter import names_read

    if names_read(args.filter) & DECODED_COLUMNS:
        return schemas, None
    return None, schemas


def _worker_renderer(args, table: str, fmt: str, keep: Callable[[dict], bool] | None):
    """With --jobs, rows in jsonl/csv are made (records decoded), filtered and rendered to
    their text in the workers: the main process, on the same cores, only merges and
    writes them (dissect_files_parallel's ``render``)."""
    if getattr(args, "jobs", 1) <= 1 or fmt not in ("jsonl", "csv") or getattr(args, "records", False):
        return None  # (errors --records needs the exchanges in the main process)
    from kwinspect.export.tables import problem_kinds, records_of
    from kwinspect.export.writers import TextRenderer
    from kwinspect.run.parallel import DROP

    text = TextRenderer(fmt, table, csv_exact=getattr(args, "csv_exact", False))
    want = ErrorRow if table == "errors" else Exchange
    values = args.values
    early, late = _schema_passes(args, table, keep)

    def render(ev: Any, topic_names: Any, as_text: bool) -> Any:
        if not isinstance(ev, want):
            return DROP
        if table == "records":
            if not as_text:
                return None
            issues: list = []
            kept = (r for r in records_of(ev, values, topic_names, issues, schemas=early)
                    if keep is None or keep(r.row()))
            rows: list[Any] = [text(r) for r in (late.apply(kept, issues) if late else kept)]
            if (kinds := problem_kinds(issues)):
                rows.append(RecordProblems(kinds))
            return rows if rows else DROP
        if keep is not None and not keep(ev.row()):
            return DROP
        return text(ev) if as_text else None

    return render


def _row_batches(args, table: str, run: FileRun, fmt: str | None = None) -> Iterator[list[Any]]:
    """The rows of ``table`` a list at a time: model rows, or with --jobs rows already
    rendered in ``fmt`` (str)."""
    from kwinspect.analyze.record_rows import records_from_exchange
    from kwinspect.export.tables import TABLES, problem_kinds, rows_of

    schemas = _schema_values(args)
    keep = _compile_filter(getattr(args, "filter", None), TABLES[table],
                           schemas if table == "records" else None)
    record_errors = table == "errors" and getattr(args, "records", False)
    early, late = _schema_passes(args, table, keep)
    plain = table == "exchanges" and keep is None  # an exchange is its own row: rows_of's answer, inlined
    records_plain = table == "records" and early is None

    def rows(events: list[Any]) -> Iterator[Any]:
        for ev in events:
            if type(ev) is str:
                yield ev
                continue
            if plain and type(ev) is Exchange:
                yield ev
                continue
            if type(ev) is RecordProblems:  # a worker's count beside its rendered records
                run.record_problems.update(ev.kinds)
                continue
            issues: list | None = [] if table == "records" else None
            names = run.dissector.shared.topic_names if run.dissector else None
            if records_plain and type(ev) is Exchange:  # rows_of -> records_of's answer, without the calls
                items = records_from_exchange(ev, values=args.values, topic_names=names, issues=issues)
            else:
                items = rows_of(table, ev, values=args.values, topic_names=names, issues=issues,
                                record_errors=record_errors, schemas=early)
            if keep is None:
                yield from items
            else:
                kept = (item for item in items if keep(item.row()))
                yield from (late.apply(kept, issues) if late is not None else kept)
            if issues:
                run.record_problems.update(problem_kinds(issues))

    for batch in _event_batches(args, run, _worker_renderer(args, table, fmt, keep) if fmt else None):
        if plain:  # (most batches: exchanges, and --jobs rows already rendered)
            out = [ev for ev in batch if type(ev) is Exchange or type(ev) is str]
            if len(out) == len(batch):
                yield out
                continue
        # at most ROW_BATCH rows at a time (an exchange may make thousands of records)
        yield from _in_lists(rows(batch), ROW_BATCH)


def _output_format(args, default_table: str = "table") -> str:
    from kwinspect.export.writers import default_format, format_from_path

    if args.format:
        return args.format
    if args.output and args.output != "-":
        fmt = format_from_path(args.output)
        if fmt is None:
            raise UsageError(f"-o {args.output}: unknown extension; use .jsonl, .json, .ndjson, .csv, "
                             ".parquet, .pq or .txt, or name the format with -F")
        return fmt
    fmt = default_format(sys.stdout)
    return fmt if fmt != "table" else default_table


def cmd_table(args, table: str) -> int:
    from kwinspect.export.writers import write_row_batches

    fmt = _output_format(args)
    if fmt == "parquet" and args.output in (None, "-") and sys.stdout.isatty():
        raise UsageError("refusing to write Parquet to a terminal: use -o FILE.parquet or a pipe")
    run = FileRun()
    try:
        write_row_batches(_row_batches(args, table, run, fmt), table, fmt, args.output,
                          **_writer_options(args, fmt))
    finally:
        schema_kinds = {k: n for k, n in run.record_problems.items() if k.startswith("schema_")}
        batch_kinds = {k: n for k, n in run.record_problems.items() if k not in schema_kinds}
        if batch_kinds:  # batches the table could not (fully) expand: say so where the user looks
            kinds = ", ".join(f"{n:,} {k}" for k, n in sorted(batch_kinds.items(), key=lambda kv: -kv[1]))
            print(f"{PROG}: {plural(sum(batch_kinds.values()), 'record batch problem')} ({kinds}): "
                  f"their records are missing or incomplete in this output; `{PROG} errors --records` lists them",
                  file=sys.stderr)
        if schema_kinds:  # framed keys/values left raw
            kinds = ", ".join(f"{n:,} {k}" for k, n in sorted(schema_kinds.items(), key=lambda kv: -kv[1]))
            print(f"{PROG}: {plural(sum(schema_kinds.values()), 'key/value')} not decoded with a schema "
                  f"({kinds}): shown raw; `{PROG} errors --records` with the same schema options lists them",
                  file=sys.stderr)
    return 0


def _writer_options(args, fmt: str) -> dict[str, Any]:
    """What the writer needs from the command line: --csv-exact; for a terminal table, the
    columns a filter names are never among those dropped to fit (``-f error`` keeps error_names)."""
    if fmt == "csv" and getattr(args, "csv_exact", False):
        return {"exact": True}
    expr = getattr(args, "filter", None)
    if fmt == "table" and expr and re.search(r"\berror", expr):
        return {"keep": ("error_names",)}
    return {}


STATS_TABLE_CHUNK = 10_000  # rows the stats table's column widths are taken from


def cmd_summary(args) -> int:
    from kwinspect.analyze.summary import SummaryBuilder, SummaryFold, render_summary

    builder = SummaryBuilder()
    run = FileRun()
    # --jobs: the workers count what does not depend on capture order (SummaryFold) and
    # the partial summaries are merged here, exactly (SummaryBuilder.merge_partial)
    restart = None
    if getattr(args, "jobs", 1) > 1:
        from kwinspect.run.parallel import RESTART as restart

    def add(ev) -> None:
        nonlocal builder
        if restart is not None and ev is restart:  # the run goes on in one process: every event comes again
            builder = SummaryBuilder()
            return
        builder.add_event(ev, run.dissector.shared.topic_names if run.dissector else None)

    def add_batch(batch: list) -> None:
        # the common case per batch, not per event: one process (no restart), and the
        # dissector's topic names (the same dict all along) looked up once
        if restart is not None or run.dissector is None:
            for ev in batch:
                add(ev)
            return
        builder.add_events(batch, run.dissector.shared.topic_names)

    interrupted = _consume(args, run, add, fold=SummaryFold() if restart is not None else None,
                           handle_batch=add_batch)
    for partial, broker_ids in getattr(run.dissector, "partials", ()):
        builder.merge_partial(partial, broker_ids)
    summary = builder.build(sources=args.pcap, interrupted=interrupted,
                            packet_counts=run.dissector.packet_counts() if run.dissector else None,
                            byte_counts=run.dissector.byte_counts() if run.dissector else None)
    if args.format == "json":
        json.dump(summary.as_dict(), sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        render_summary(summary)
    return 130 if interrupted else 0


def cmd_latency(args) -> int:
    from kwinspect.analyze.latency import PLOT_SUFFIXES, LatencyStats, plot_latency, render_latency

    stats = LatencyStats(args.by, keep_series=bool(args.plot))
    keep = _compile_filter(args.filter, EXCHANGE_COLUMNS)
    if args.plot and os.path.splitext(args.plot)[1].lower() not in PLOT_SUFFIXES:
        raise UsageError(f"--plot {args.plot}: unknown extension; use .png, .svg or .html")
    fmt = _output_format(args)  # a bad -o fails before the capture is read
    run = FileRun()
    interrupted = _consume(args, run, lambda ev: (
        stats.add(ev) if isinstance(ev, Exchange) and (keep is None or keep(ev.row())) else None))
    if fmt == "table":
        render_latency(stats)
    else:
        from kwinspect.export.writers import write_rows

        write_rows(stats.rows(), "latency", fmt, args.output, **_writer_options(args, fmt))
    if args.plot:
        try:
            path = plot_latency(stats, args.plot)
        except RuntimeError as exc:  # matplotlib missing
            raise UsageError(str(exc)) from None
        print(f"plot written to {path}", file=sys.stderr)
    return 130 if interrupted else 0


STATS_EXAMPLES = """\
examples:
  kwinspect stats capture.pcap                              # every series, 1 s intervals
  kwinspect stats capture.pcap --interval 100ms --series requests,latency --by api
  kwinspect stats capture.pcap --by topic,partition --series volume -F csv
  kwinspect stats capture.pcap -i 1m -o stats.parquet --plot stats.html

In pandas: df.pivot_table(index="interval_start", columns="series", values="amount",
aggfunc="sum") gives one column per series. See docs/cli.md#stats.
"""


def cmd_stats(args) -> int:
    from kwinspect.analyze.stats import (
        DEFAULT_LABEL_CAP,
        FAMILIES,
        TrafficStats,
        by_dimensions,
        parse_interval,
    )
    from kwinspect.analyze.stats_plot import PLOT_BY, PLOT_FAMILIES

    try:
        interval = parse_interval(args.interval)
        by = by_dimensions(_comma_list(args.by)) if args.by is not None else None
    except ValueError as exc:
        raise UsageError(f"stats: {exc}") from None
    families = _comma_list(args.series) if args.series is not None else list(FAMILIES)
    unknown = [f for f in families if f not in FAMILIES]
    if unknown or not families:
        raise UsageError(f"--series {args.series!r}: expected some of {', '.join(FAMILIES)}")
    if args.max_labels is not None and args.max_labels < 1:
        raise UsageError("--max-labels must be at least 1")
    keep = _compile_filter(args.filter, EXCHANGE_COLUMNS)
    if args.plot:
        from kwinspect.analyze.plotting import PLOT_SUFFIXES

        if os.path.splitext(args.plot)[1].lower() not in PLOT_SUFFIXES:
            raise UsageError(f"--plot {args.plot}: unknown extension; use .png, .svg or .html")
    fmt = _output_format(args)  # a bad -o fails before the capture is read
    if fmt == "parquet" and args.output in (None, "-") and sys.stdout.isatty():
        raise UsageError("refusing to write Parquet to a terminal: use -o FILE.parquet or a pipe")
    config = _config(args)
    stats = TrafficStats(interval, by, families, args.max_labels or DEFAULT_LABEL_CAP,
                         kafka_ports=config.kafka_ports)
    run = FileRun(on_close=stats.add_connection)
    # the plot's own series: by api and topic only (a p99 per api is not made of p99s per broker)
    plotted = TrafficStats(interval, PLOT_BY, PLOT_FAMILIES) if args.plot else None

    def add(ev: Any) -> None:
        if isinstance(ev, Exchange) and (keep is None or keep(ev.row())):
            names = run.dissector.shared.topic_names if run.dissector else None
            stats.add(ev, names)
            if plotted is not None:
                plotted.add(ev, names)

    interrupted = _consume(args, run, add)
    from kwinspect.export.writers import write_rows

    options = _writer_options(args, fmt)
    if fmt == "table":  # on a terminal, only the dimensions the rows have (the files keep every column)
        options["columns"] = stats.used_columns()
        # column widths come from the first chunk: a big one, so that a longer api name or
        # amount in a later interval is not cut (the rows are in memory already; bounded)
        options["chunk_size"] = STATS_TABLE_CHUNK
    write_rows(stats.rows(), "stats", fmt, args.output, **options)
    folded = stats.observer.overflowed()
    if folded:
        what = ", ".join(f"{plural(n, 'observation')} of {dim}" for dim, n in folded.items())
        print(f"{PROG}: more distinct values than --max-labels: {what} counted as (other)", file=sys.stderr)
    if plotted is not None:
        from kwinspect.analyze.stats_plot import plot_stats

        try:
            path = plot_stats(list(plotted.rows()), args.plot, by=args.plot_by, interval=interval)
        except RuntimeError as exc:  # matplotlib missing
            raise UsageError(str(exc)) from None
        print(f"plot written to {path}", file=sys.stderr)
    return 130 if interrupted else 0


def _comma_list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def cmd_deliveries(args) -> int:
    from kwinspect.analyze.deliveries import MAX_TRACKED_RECORDS, DeliveryTracker
    from kwinspect.export.tables import TABLES

    keep = _compile_filter(args.filter, TABLES["deliveries"])
    fmt = _output_format(args)  # a bad -o fails before the capture is read
    if args.problems and fmt not in ("table", "jsonl"):
        raise UsageError("--problems writes findings: text (-F table) or -F jsonl")
    if fmt == "parquet" and args.output in (None, "-") and sys.stdout.isatty():
        raise UsageError("refusing to write Parquet to a terminal: use -o FILE.parquet or a pipe")
    tracker = DeliveryTracker(args.max_records or MAX_TRACKED_RECORDS, values=args.values)
    run = FileRun()
    interrupted = _consume(args, run, lambda ev: tracker.add(
        ev, run.dissector.shared.topic_names if run.dissector else None))
    if args.problems:
        from kwinspect.analyze.diagnose import sort_findings
        from kwinspect.analyze.diagnose.render import render_text, write_jsonl

        findings = sort_findings(tracker.findings())
        out = open(args.output, "w", encoding="utf-8") if args.output and args.output != "-" else sys.stdout  # noqa: SIM115
        try:
            if fmt == "jsonl":
                write_jsonl(findings, out)
            else:
                from rich.console import Console

                render_text(findings, Console(file=out) if out is not sys.stdout else None,
                            pcap=args.pcap[0] if len(args.pcap) == 1 else "PCAP",
                            examined=f"{plural(tracker.tracked, 'acknowledged record')} followed")
        finally:
            if out is not sys.stdout:
                out.close()
    else:
        from kwinspect.export.writers import write_rows

        rows = tracker.rows()
        if keep is not None:
            rows = (r for r in rows if keep(r))
        write_rows(rows, "deliveries", fmt, args.output, **_writer_options(args, fmt))
    note = tracker.truncation_note()
    if note:
        print(f"{PROG} deliveries: {note}", file=sys.stderr)
    return 130 if interrupted else 0


def cmd_decode(args) -> int:
    from kwinspect.analyze.render import exchange_json

    keep = _compile_filter(args.filter, EXCHANGE_COLUMNS)
    out = open(args.output, "w", encoding="utf-8") if args.output and args.output != "-" else sys.stdout  # noqa: SIM115
    from kwinspect.export.writers import iso_utc

    try:
        for ev in _events(args, FileRun()):
            if not isinstance(ev, Exchange) or (keep is not None and not keep(ev.row())):
                continue
            # a Produce/Fetch of many records is written as it is decoded (bounded memory)
            lazy = ev.api_key in (PRODUCE, FETCH) and _record_count(ev) > STREAM_RECORDS_OVER
            obj = exchange_json(ev, args.values, lazy)
            for col in ("request_ts", "response_ts"):
                obj[col] = iso_utc(obj[col])
            if lazy:
                _write_streaming(obj, out)
            else:
                out.write(json.dumps(obj, default=_json_default, ensure_ascii=False) + "\n")
            out.flush()
    finally:
        if out is not sys.stdout:
            out.close()
    return 0


STREAM_RECORDS_OVER = 10_000  # records in an exchange past which decode writes its JSON as it goes


def _record_count(ex: Exchange) -> int:
    from kwinspect.stream.labels import iter_record_sets

    n = 0
    for msg in (ex.request, ex.response):
        if msg is not None:
            for _topic, _partition, rs in iter_record_sets(ex.api_key, msg.body):
                n += sum(max(0, b.record_count or 0) for b in rs.batches)
    return n


def _write_streaming(obj: Any, out: Any) -> None:
    """One JSON line equal to json.dumps(obj), its record arrays (LazyJsonArray) written one
    record at a time: the rest is dumped with placeholders (a random nonce, so no capture
    content can fake one) that are then filled in as the records are decoded."""
    import uuid

    from kwinspect.protocol.records import LazyJsonArray

    nonce = uuid.uuid4().hex
    arrays: list[LazyJsonArray] = []

    def swap(node: Any) -> Any:
        if type(node) is LazyJsonArray:
            arrays.append(node)
            return f"{nonce}:{len(arrays) - 1}"
        if isinstance(node, dict):
            return {k: swap(v) for k, v in node.items()}
        if isinstance(node, list):
            return [swap(v) for v in node]
        return node

    text = json.dumps(swap(obj), default=_json_default, ensure_ascii=False)
    pos = 0
    for m in re.finditer(f'"{nonce}:(\\d+)"', text):
        out.write(text[pos:m.start()])
        out.write("[")
        sep = ""
        for item in arrays[int(m.group(1))]:
            out.write(sep)
            out.write(json.dumps(item, default=_json_default, ensure_ascii=False))
            sep = ", "
        out.write("]")
        pos = m.end()
    out.write(text[pos:] + "\n")


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        return value.hex()
    return str(value)


def cmd_tui(args) -> int:
    if args.interface:
        if args.pcap:
            raise UsageError("tui: give either PCAP files or --live -i IFACE, not both")
        # the TUI's filter: exchange columns, and key./value. fields of their records
        _compile_filter(args.filter, EXCHANGE_COLUMNS, _schema_values(args), record_paths=True)
        from kwinspect.tui.app import run_live  # textual is imported only here

        return run_live(args.interface, _config(args, watch_keys=True), kafka_ports=args.kafka_ports, values=args.values,
                        initial_filter=args.filter, schemas=_schema_values(args))
    if not args.pcap:
        raise UsageError("tui needs a PCAP file (or --live -i IFACE)")
    if "-" in args.pcap:
        raise UsageError("tui needs capture files (it reads them again as you browse); "
                         "write standard input to a file first")
    _check_inputs(args.pcap)
    from kwinspect.capture.readers import open_capture

    for path in args.pcap:  # unreadable input fails here, with exit status 1, not inside the app
        open_capture(path).close()
    _compile_filter(args.filter, EXCHANGE_COLUMNS, _schema_values(args), record_paths=True)
    try:
        from kwinspect.tui.app import run_tui  # textual is imported only here
    except ImportError as exc:
        raise UsageError(f"the TUI needs the textual package ({exc})") from None
    return run_tui(args.pcap, _config(args), values=args.values, initial_filter=args.filter,
                   replay=args.live, rate=args.rate, schemas=_schema_values(args))


def cmd_pipeline(args) -> int:
    """The Spark pipeline; pyspark is imported only inside kwinspect.spark.pipeline."""
    from kwinspect.spark.pipeline import PipelineError, PipelineOptions, run_pipeline

    conf = {}
    for item in args.conf:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--conf wants KEY=VALUE, got {item!r}")
        conf[key.strip()] = value
    if args.partitions is not None and args.partitions < 1:
        raise UsageError("--partitions must be at least 1")
    if args.split_mb < 1:
        raise UsageError("--split-mb must be at least 1")
    opts = PipelineOptions(inputs=args.pcap, output=args.output, master=args.master,
                           partitions=args.partitions, records=args.records, stats=args.stats,
                           deliveries=args.deliveries,
                           overwrite=args.overwrite,
                           config=_config(args), values=args.values, split_bytes=args.split_mb << 20,
                           spark_conf=conf, ship_env=args.ship_env)
    if args.quiet:
        conf.setdefault("spark.ui.showConsoleProgress", "false")
    log = None if args.quiet else (lambda line: print(f"{PROG} pipeline: {line}", file=sys.stderr))
    try:
        result = run_pipeline(opts, log=log)
    except PipelineError as exc:
        print(f"{PROG} pipeline: {exc}", file=sys.stderr)
        return 1
    print("\n".join(result.lines()))
    return 0


LIVE_EXAMPLES = """\
examples:
  kwinspect live -i eth0                                   # exchanges as they complete
  kwinspect live -i lo --kafka-ports 9092 -t records -F jsonl | jq .value
  kwinspect live -i eth0 -w kafka.pcap -C 100 -W 10        # keep the packets: 10 x 100 MB ring
  kwinspect live -i eth0 --duration 60 -t errors -F csv -o errors.csv
  kwinspect live -i eth0 --kafka-ports 9092 --metrics 0.0.0.0:9464 -t none -q
                                                           # a Prometheus exporter
  kwinspect exchanges kafka-*.pcap                         # the same session, offline

Needs root or CAP_NET_RAW (Linux AF_PACKET, via scapy). Stops on Ctrl-C, SIGTERM,
--duration or --count, then finishes every connection (requests still waiting for
a response become response_missing exchanges), closes the files and prints a
summary with the kernel's drop count on stderr. See docs/live.md.
"""


def _add_live_parser(add: Callable[..., argparse.ArgumentParser]) -> None:
    p = add("live", "capture and decode Kafka traffic on an interface as it happens",
            "Capture on IFACE and print exchanges, records or errors as they complete,\n"
            "in the same formats and columns as the offline commands; optionally keep the\n"
            "raw packets in pcap files (-w, with tcpdump-like -C/-G/-W rotation).")
    p.epilog = LIVE_EXAMPLES
    g = p.add_argument_group("capture")
    g.add_argument("-i", "--interface", required=True, metavar="IFACE", help="interface to capture on (e.g. lo, eth0, or any for all of them)")
    g.add_argument("--bpf", metavar="EXPR",
                   help="capture filter in tcpdump syntax (default: 'tcp and (port P or ...)' for --kafka-ports, "
                        "else 'tcp' so that Kafka is detected on any port)")
    g.add_argument("-c", "--count", type=int, metavar="N",
                   help="stop after N packets (captured packets, as tcpdump -c / tshark -c)")
    g.add_argument("--duration", type=float, metavar="S", help="stop after S seconds")
    g.add_argument("-w", "--write", metavar="FILE", help="also write the raw packets to FILE (pcap, microseconds)")
    g.add_argument("-C", "--file-size", type=float, metavar="MB",
                   help="with -w: start a new file before one would exceed MB million bytes "
                        "(files are FILE-00000.pcap, FILE-00001.pcap, ...)")
    g.add_argument("-G", "--rotate-seconds", type=float, metavar="S",
                   help="with -w: start a new file every S seconds (strftime patterns in FILE are expanded)")
    g.add_argument("-W", "--file-count", type=int, metavar="N", help="with -C/-G: keep only the newest N files")
    g.add_argument("-s", "--snaplen", type=int, default=262144, metavar="BYTES",
                   help="bytes kept per packet (default 262144, as tcpdump)")
    g.add_argument("-B", "--buffer-size", type=int, default=65536, metavar="KiB",
                   help="kernel receive buffer in KiB (default 65536 = 64 MiB; bursts beyond it are dropped)")
    g.add_argument("-p", "--no-promiscuous-mode", action="store_true", help="do not put the interface in promiscuous mode")
    g = p.add_argument_group("reading")
    g.add_argument("--kafka-ports", type=parse_ports, metavar="PORTS",
                   help="broker ports, e.g. 9092,19092-19094; only these ports are captured "
                        "(default: all TCP, Kafka found on 9092 and by detection on any port)")
    g.add_argument("--no-detect", action="store_true", help="only treat --kafka-ports as Kafka")
    g.add_argument("--values", choices=VALUE_MODES, default="auto",
                   help="how to show keys, values and bytes: auto = UTF-8 text when it decodes, else base64")
    g.add_argument("--no-redact", action="store_true",
                   help="show SASL passwords, SCRAM proofs, OAuth tokens and token HMACs (redacted by default)")
    g.add_argument("--max-frame-size", type=_frame_size, default=None, metavar="BYTES",
                   help="largest Kafka frame accepted (default 100 MiB, as brokers use)")
    g.add_argument("--tls-keylog", action="append", default=[], metavar="FILE",
                   help="NSS key log (SSLKEYLOGFILE format) to decrypt TLS connections with, read again "
                        "as clients append to it (it need not exist yet); repeatable. SSLKEYLOGFILE, "
                        "when set, is watched too")
    g = p.add_argument_group("output")
    g.add_argument("-t", "--table", choices=("exchanges", "records", "errors", "none"), default="exchanges",
                   help="which rows to print as they complete (default exchanges; none: only -w and the summary)")
    g.add_argument("-F", "--format", choices=("table", "jsonl", "csv"), default=None,
                   help="row format (default: table on a terminal, else jsonl, one line per row, flushed at once)")
    g.add_argument("-o", "--output", metavar="OUT", help="write rows to OUT instead of stdout")
    g.add_argument("-f", "--filter", metavar="EXPR", help="keep rows matching EXPR (see docs/filter.md)")
    g.add_argument("--also", action="append", default=[], metavar="TABLE=FILE",
                   help="also write another table to FILE at the same time, e.g. --also records=rec.jsonl "
                        "(format from the extension: .jsonl, .csv, .txt; unfiltered; repeatable)")
    g.add_argument("--metrics", metavar="[HOST:]PORT",
                   help="serve Prometheus/OpenMetrics metrics at http://HOST:PORT/metrics while capturing "
                        "(host default 127.0.0.1; 0.0.0.0:PORT for every interface); without -F/-o no rows "
                        "are printed. Metric names: docs/live.md")
    g.add_argument("--max-labels", type=int, default=None, metavar="N",
                   help="--metrics: distinct values kept per api, version, broker, client_id, topic and group "
                        "label (default 100); later new values are counted as (other)")
    g.add_argument("-q", "--quiet", action="store_true", help="no status line and no summary on stderr")
    g.add_argument("--status-interval", type=float, default=1.0, metavar="S",
                   help="seconds between status-line updates on a terminal's stderr (default 1)")


def cmd_live(args) -> int:
    from kwinspect.capture.live import LiveCaptureError, LiveFilterError, capture_filter
    from kwinspect.export.tables import CAPTURE_TABLES, TABLES
    from kwinspect.run.live_session import LiveOptions, run_live

    metrics = None
    if args.metrics is not None:
        try:
            from kwinspect.export.metrics import parse_listen
        except ImportError as exc:
            raise UsageError(f"--metrics needs the prometheus_client package: pip install 'kwinspect[live]' "
                             f"({exc})") from None
        try:
            metrics = parse_listen(args.metrics)
        except ValueError as exc:
            raise UsageError(f"--metrics: {exc}") from None
        if args.format is None and args.output is None:
            args.table = "none"  # an exporter next to a broker: no rows on stdout unless asked for
    elif args.max_labels is not None:
        raise UsageError("--max-labels is for --metrics")
    if args.max_labels is not None and args.max_labels < 1:
        raise UsageError("--max-labels must be at least 1")
    keep = _compile_filter(args.filter, TABLES["exchanges" if args.table == "none" else args.table])
    for flag, value in (("--count", args.count), ("--duration", args.duration), ("-C", args.file_size),
                        ("-G", args.rotate_seconds), ("-W", args.file_count), ("--snaplen", args.snaplen),
                        ("--buffer-size", args.buffer_size)):
        if value is not None and value <= 0:
            raise UsageError(f"{flag} must be positive")
    if (args.file_size or args.rotate_seconds or args.file_count) and not args.write:
        raise UsageError("-C, -G and -W need -w FILE")
    if args.file_count and not (args.file_size or args.rotate_seconds):
        raise UsageError("-W needs -C or -G")
    if args.format:
        fmt = args.format
    elif args.output and args.output != "-":
        fmt = _output_format(args)
        if fmt == "parquet":
            raise UsageError("live output is jsonl, csv or table (write -w FILE.pcap and convert it later)")
    else:
        from kwinspect.export.writers import default_format

        fmt = default_format(sys.stdout)
    also: list[tuple[str, str, str]] = []
    for spec in args.also:
        table, sep, path = spec.partition("=")
        if not sep or table not in CAPTURE_TABLES or not path:
            raise UsageError(f"--also {spec!r}: expected exchanges=FILE, records=FILE or errors=FILE")
        from kwinspect.export.writers import format_from_path

        afmt = format_from_path(path)
        if afmt is None:
            raise UsageError(f"--also {spec}: unknown extension; use .jsonl, .csv or .txt")
        if afmt == "parquet":
            raise UsageError("--also: live output is jsonl, csv or table (.txt)")
        also.append((table, afmt, path))
    opts = LiveOptions(
        interface=args.interface, also=also,
        bpf=args.bpf if args.bpf is not None else capture_filter(args.kafka_ports),
        config=_config(args, watch_keys=True), table=args.table, fmt=fmt, output=args.output, keep=keep,
        values=args.values, write=args.write,
        rotate_bytes=int(args.file_size * 1_000_000) if args.file_size else None,
        rotate_seconds=args.rotate_seconds, max_files=args.file_count, duration=args.duration,
        count=args.count, snaplen=args.snaplen, buffer_bytes=args.buffer_size * 1024,
        promisc=not args.no_promiscuous_mode, quiet=args.quiet, status_interval=args.status_interval,
        metrics=metrics, metrics_label_cap=args.max_labels)
    try:
        return run_live(opts)
    except LiveFilterError as exc:
        raise UsageError(str(exc)) from None
    except LiveCaptureError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1


def cmd_diagnose(args) -> int:
    from kwinspect.analyze.diagnose import Diagnoser
    from kwinspect.analyze.diagnose.render import render_text, write_jsonl

    diagnoser = Diagnoser(deliveries=True)
    run = FileRun()
    interrupted = _consume(args, run, diagnoser.add)
    if run.dissector is not None:
        diagnoser.connections_ended(run.dissector.connections.values(), _config(args).kafka_ports)
    findings = diagnoser.findings(args.min_severity)
    fmt = args.format or ("text" if (args.output in (None, "-") and sys.stdout.isatty()) else "jsonl")
    out = open(args.output, "w", encoding="utf-8") if args.output and args.output != "-" else sys.stdout  # noqa: SIM115
    try:
        if fmt == "jsonl":
            write_jsonl(findings, out)
        else:
            from rich.console import Console

            console = Console(file=out) if out is not sys.stdout else None
            render_text(findings, console, exchanges=diagnoser.exchanges,
                        pcap=args.pcap[0] if len(args.pcap) == 1 else "PCAP")
    finally:
        if out is not sys.stdout:
            out.close()
    return 130 if interrupted else 0


def cmd_sanitize(args) -> int:
    from kwinspect.sanitize.command import run_command

    kw: dict[str, Any] = {"detect": not args.no_detect}
    if args.kafka_ports:
        kw["kafka_ports"] = args.kafka_ports if args.no_detect else args.kafka_ports | DEFAULT_KAFKA_PORTS
    if args.max_frame_size is not None:
        kw["max_frame_size"] = args.max_frame_size
    try:
        return run_command(args, DissectConfig(**kw))
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def cmd_planned(args) -> int:
    print(f"{PROG} {args.command}: not available in this version yet", file=sys.stderr)
    return 2


# ---------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    status = _run(argv)
    _forget_caught_interrupt()
    return status


def _forget_caught_interrupt() -> None:
    """CPython remembers a KeyboardInterrupt that escaped code run by exec() or eval() of a
    string (a dataclass or namedtuple made during a lazy import, when Ctrl-C lands there)
    even after we caught it, and under ``python -m kwinspect`` then kills itself with SIGINT
    at exit instead of exiting 130 as docs/cli.md promises. Running a string through exec()
    resets that memory (CPython's run_eval_code_obj clears it on entry)."""
    exec("pass")  # noqa: S102 - a constant string; the call itself is the point


def _run(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    handlers = {
        "summary": cmd_summary, "latency": cmd_latency, "decode": cmd_decode,
        "exchanges": lambda a: cmd_table(a, "exchanges"), "records": lambda a: cmd_table(a, "records"),
        "errors": lambda a: cmd_table(a, "errors"), "deliveries": cmd_deliveries,
        "tui": cmd_tui, "pipeline": cmd_pipeline, "live": cmd_live,
        "diagnose": cmd_diagnose, "stats": cmd_stats, "sanitize": cmd_sanitize,
    }
    handler = handlers.get(args.command, cmd_planned)
    core.tune_collector()
    sys.unraisablehook = _quiet_out_of_memory
    try:
        return handler(args)
    except UsageError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    except CaptureFormatError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        if isinstance(exc, BrokenPipeError):  # `kwinspect decode x | head`
            _silence_stdout()
            return 0
        print(f"{PROG}: {exc.strerror + ': ' + exc.filename if exc.filename and exc.strerror else exc}",
              file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except MemoryError:
        # Decoding is bounded (docs/limits.md), but a memory limit (ulimit -v, a container)
        # can still be below what a capture needs: one line, not a traceback.
        gc.collect()
        print(f"{PROG}: out of memory (exit status {EXIT_OUT_OF_MEMORY}); rows written so far are complete; "
              "see docs/limits.md", file=sys.stderr)
        return EXIT_OUT_OF_MEMORY


EXIT_OUT_OF_MEMORY = 3


def _quiet_out_of_memory(unraisable: Any) -> None:
    """Generators closed while a MemoryError unwinds can fail again; the one line main()
    prints says it all (anything else is shown as Python would)."""
    if isinstance(unraisable.exc_value, MemoryError):
        return
    sys.__unraisablehook__(unraisable)


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except OSError:
        pass


if __name__ == "__main__":
    sys.exit(main())
