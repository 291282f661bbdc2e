"""The Spark pipeline: the single-process decoder over many (rotated, large) capture files.

Shape (details and the reasons in docs/pipeline.md):

1. stage 1 (one task per file, or per byte range of a big classic pcap):
   read packets, parse them to TCP segments, emit them as Arrow batches keyed by
   the connection's 4-tuple, with their capture position.  Written to a staging
   Parquet directory.
2. driver: fold each file's earlier ranges into the merge timestamps, collect
   reader issues, compute the capture-wide idle-check schedule.
3. stage 2, pass 1: shuffle by 4-tuple, sort by capture position within each
   task, run one unchanged ``Dissector`` per connection (mapInArrow).
4. driver: the topic-id -> name and broker-endpoint facts each connection
   learned, and where; pass 2 re-runs only the connections whose lookups those
   facts could have changed, with the facts broadcast.
5. outputs: exchanges, errors, optionally records, plus per-minute aggregates,
   written to a temporary directory next to DIR and renamed into place at the end.

pyspark is imported only in this package; kwinspect.spark.fragments and
kwinspect.spark.connection hold the Spark-free parts that run on executors.
"""

from __future__ import annotations

import glob
import math
import os
import re
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kwinspect.dissect import DissectConfig
from kwinspect.export.tables import CAPTURE_TABLES, TABLES, TIMESTAMP_COLUMNS
from kwinspect.model import (
    Endpoint,
    ErrorRow,
    plural,
)
from kwinspect.spark.connection import (
    EVENT_SCHEMA,
    EventBuffer,
    GlobalBrokers,
    GlobalNames,
    Pos,
    compact_brokers,
    compact_names,
    dissect_partition,
    idle_checks,
    pos_of,
)
from kwinspect.spark.fragments import (
    SEGMENT_SCHEMA,
    SNAPLEN_TRUNCATED_SUFFIX,
    pcapng_spans,
    read_range,
    scan_pcapng_range,
)
from kwinspect.spark.joins import deliveries_table, stats_table

DEFAULT_SPLIT_BYTES = 128 << 20
DEFAULT_EXACT_IDLE_LIMIT = 20_000_000  # segments; above it idle checks are per connection
DATA_TABLES = {t: TABLES[t] for t in CAPTURE_TABLES}
AGGREGATE_TABLES = ("latency_by_minute", "error_counts", "topic_volume")
# The row tables written to DIR/<table>: hive partition columns (SQL over the table's
# columns; records also see `cap_ts`, the capture time of their exchange). A table whose
# rows stage 2 emits (export.tables.CAPTURE_TABLES) is written by adding its line here.
OUTPUT_TABLES: dict[str, dict[str, str]] = {
    "exchanges": {"date": "to_date(coalesce(request_ts, response_ts))", "api": "coalesce(api_name, 'unknown')"},
    "errors": {"date": "to_date(ts)"},
    "records": {"date": "to_date(timestamp_micros(cap_ts))"},  # with --records
}
MARKER = "_KWINSPECT_PIPELINE"


class PipelineError(Exception):
    """A problem the user can fix (missing Java, unreadable input, DIR exists): one line."""


@dataclass
class PipelineOptions:
    inputs: Sequence[str]
    output: str
    master: str | None = None
    partitions: int | None = None
    records: bool = False
    stats: bool = True  # the per-minute stats table (`--no-stats` leaves it out)
    deliveries: bool = False  # the deliveries table (`--deliveries`)
    overwrite: bool = False
    config: DissectConfig = field(default_factory=DissectConfig)
    values: str = "auto"
    split_bytes: int = DEFAULT_SPLIT_BYTES
    exact_idle_limit: int = DEFAULT_EXACT_IDLE_LIMIT
    spark_conf: dict[str, str] = field(default_factory=dict)
    ship_env: bool = False


@dataclass
class PipelineResult:
    output: str
    files: int = 0
    input_bytes: int = 0
    tasks: int = 0
    segments: int = 0
    connections: int = 0
    kafka_connections: int = 0
    rerun_connections: int = 0
    exact_idle: bool = True
    counts: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    startup_seconds: float = 0.0  # of `seconds`: starting Spark (JVM, context), before any work
    top_apis: list[tuple[str, int]] = field(default_factory=list)

    def lines(self) -> list[str]:
        rate = self.counts.get("exchanges", 0) / self.seconds if self.seconds else 0.0
        out = [
            f"kwinspect pipeline: {plural(self.files, 'file')}, {self.input_bytes / 1e6:.1f} MB in "
            f"{plural(self.tasks, 'read task')}, {plural(self.segments, 'TCP segment')}, "
            f"{plural(self.connections, 'connection')} "
            f"({self.kafka_connections} Kafka)",
            "tables: " + ", ".join(f"{t} {n}" for t, n in self.counts.items()),
            f"time: {self.seconds:.1f} s (Spark start-up {self.startup_seconds:.1f} s, work "
            f"{self.seconds - self.startup_seconds:.1f} s), {rate:,.0f} exchanges/s",
            f"{plural(self.rerun_connections, 'connection')} re-run for cross-connection names"
            + ("" if self.exact_idle else "; idle checks per connection (above the exact limit)"),
        ]
        if self.top_apis:
            out.append("top APIs: " + ", ".join(f"{a} {n}" for a, n in self.top_apis))
        out.append(f"written to {self.output}")
        return out


# ---------------------------------------------------------------------------
# Session
# ---------------------------------------------------------------------------


def java_available() -> bool:
    home = os.environ.get("JAVA_HOME")
    if home and os.access(os.path.join(home, "bin", "java"), os.X_OK):
        return True
    return shutil.which("java") is not None


def get_session(master: str | None = None, partitions: int | None = None,
                conf: dict[str, str] | None = None, app_name: str = "kwinspect pipeline",
                ship_env: bool = False, log: Callable[[str], None] | None = None):
    """A SparkSession (local[*] by default) configured for the pipeline.

    ``ship_env``: on a cluster, the executors run this virtualenv, packed and sent with
    the job (kwinspect.spark.shipenv); local mode shares the driver's Python anyway.
    """
    if not java_available():
        raise PipelineError("Java not found: the Spark pipeline needs a JDK 17+ (install one or set JAVA_HOME)")
    submitted = "PYSPARK_GATEWAY_PORT" in os.environ  # under spark-submit: it chose the master
    if not submitted:
        master = master or os.environ.get("KWINSPECT_SPARK_MASTER") or "local[*]"
    conf = dict(conf or {})
    if master and master.startswith("local"):
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    elif ship_env:
        if submitted:  # the context exists already: archives are spark-submit's to give
            raise PipelineError("--ship-env does not work under spark-submit: give it the packed "
                                "environment with --archives (docs/pipeline.md)")
        _ship_env(conf, log)
    import warnings

    from pyspark.sql import SparkSession

    # pyspark warns about pandas 3 on every Arrow job; the pipeline does not use pandas
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas")
    b = SparkSession.builder.appName(app_name)
    if master:
        b = b.master(master)
    settings = {
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        "spark.sql.parquet.compression.codec": "zstd",
        "spark.sql.execution.arrow.maxRecordsPerBatch": "1024",  # segments can be 64 KiB each
    }
    if partitions:
        settings["spark.sql.shuffle.partitions"] = str(partitions)
    settings.update(conf)
    for k, v in settings.items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("KWINSPECT_SPARK_LOG_LEVEL", "ERROR"))
    if not spark.sparkContext.master.startswith("local") and os.environ.get("KWINSPECT_SHIP", "1") != "0":
        spark.sparkContext.addPyFile(_package_zip())  # executors get this kwinspect (not its dependencies)
    for k, v in settings.items():  # an existing session (tests, notebooks) gets the SQL settings too
        if k.startswith("spark.sql."):
            spark.conf.set(k, v)
    return spark


def _ship_env(conf: dict[str, str], log: Callable[[str], None] | None) -> None:
    """spark.archives gets the packed virtualenv; executors run its Python (PySpark's venv-pack way)."""
    from kwinspect.spark.shipenv import ALIAS, EXECUTOR_PYTHON, ShipEnvError, packed_env

    try:
        path = packed_env(log)
    except ShipEnvError as exc:
        raise PipelineError(str(exc)) from None
    archives = [a for a in conf.get("spark.archives", "").split(",") if a.strip()]
    conf["spark.archives"] = ",".join([*archives, f"{path}#{ALIAS}"])
    # read by SparkContext when it starts: the executors' Python, relative to their working
    # directory, where spark.archives are unpacked
    os.environ["PYSPARK_PYTHON"] = EXECUTOR_PYTHON


def _package_zip() -> str:
    """kwinspect's own sources as a zip for SparkContext.addPyFile."""
    import tempfile
    import zipfile

    import kwinspect

    pkg = os.path.dirname(os.path.abspath(kwinspect.__file__))
    path = os.path.join(tempfile.mkdtemp(prefix="kwinspect-ship-"), "kwinspect.zip")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for root, dirs, names in os.walk(pkg):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for name in names:
                if name.endswith(".py"):
                    full = os.path.join(root, name)
                    z.write(full, os.path.relpath(full, os.path.dirname(pkg)))
    return path


# ---------------------------------------------------------------------------
# Files: local paths through the os module, URIs through Hadoop's FileSystem
# ---------------------------------------------------------------------------


def _is_uri(path: str) -> bool:
    return "://" in path or path.startswith("file:")


class _HadoopFS:
    def __init__(self, spark, path: str) -> None:
        # PySpark has no public handle on the JVM or its Hadoop configuration; this is
        # how PySpark programs reach the Hadoop FileSystem API
        jvm = spark.sparkContext._jvm  # noqa: SLF001
        self.jvm = jvm
        self.conf = spark.sparkContext._jsc.hadoopConfiguration()  # noqa: SLF001
        self.path = jvm.org.apache.hadoop.fs.Path(path)
        self.fs = self.path.getFileSystem(self.conf)

    def P(self, p: str):  # noqa: N802
        return self.jvm.org.apache.hadoop.fs.Path(p)


def expand_inputs(spark, inputs: Sequence[str]) -> list[tuple[str, int]]:
    """Files, directories (all non-hidden files below) and globs -> sorted [(path, size)]."""
    found: dict[str, int] = {}
    for item in inputs:
        if not _is_uri(item):
            matches = sorted(glob.glob(item)) if glob.has_magic(item) else [item]
            if not matches:
                raise PipelineError(f"{item}: no such file")
            for m in matches:
                if os.path.isdir(m):
                    for root, dirs, files in os.walk(m):
                        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "_")))
                        for name in files:
                            if not name.startswith((".", "_")):
                                p = os.path.join(root, name)
                                found[p] = os.path.getsize(p)
                elif os.path.isfile(m):
                    if not os.access(m, os.R_OK):
                        raise PipelineError(f"{m}: permission denied")
                    found[m] = os.path.getsize(m)
                else:
                    raise PipelineError(f"{m}: no such file")
            continue
        h = _HadoopFS(spark, item)
        statuses = h.fs.globStatus(h.path)
        if statuses is None or len(statuses) == 0:
            raise PipelineError(f"{item}: no such file")
        for st in statuses:
            if st.isDirectory():
                it = h.fs.listFiles(st.getPath(), True)
                while it.hasNext():
                    f = it.next()
                    name = f.getPath().getName()
                    if not name.startswith((".", "_")):
                        found[f.getPath().toString()] = int(f.getLen())
            else:
                found[st.getPath().toString()] = int(st.getLen())
    if not found:
        raise PipelineError("no input files")
    return sorted(found.items())


class _Output:
    """DIR, its temporary sibling, and the final rename; local or any Hadoop file system."""

    def __init__(self, spark, out: str) -> None:
        self.out = out.rstrip("/") or out
        self.run_id = uuid.uuid4().hex[:12]
        self.tmp = f"{self.out}.kwinspect-tmp-{self.run_id}"
        self.h = _HadoopFS(spark, self.out)

    def exists(self, p: str | None = None) -> bool:
        return bool(self.h.fs.exists(self.h.P(p or self.out)))

    def delete(self, p: str) -> None:
        if self.exists(p):
            self.h.fs.delete(self.h.P(p), True)

    def check(self, overwrite: bool) -> None:
        if self.exists() and not overwrite:
            raise PipelineError(f"{self.out} exists; pass --overwrite to replace it")

    def commit(self) -> None:
        fs, P = self.h.fs, self.h.P
        for stage in ("stage-segments", "stage-events1", "stage-events2"):
            self.delete(f"{self.tmp}/{stage}")
        out = fs.create(P(f"{self.tmp}/{MARKER}"), True)
        out.close()
        old = f"{self.out}.kwinspect-old-{self.run_id}"
        if self.exists():
            if not fs.rename(P(self.out), P(old)):
                raise PipelineError(f"could not move the old {self.out} aside")
        if not fs.rename(P(self.tmp), P(self.out)):
            if self.exists(old):
                fs.rename(P(old), P(self.out))
            raise PipelineError(f"could not move the finished tables into {self.out}")
        self.delete(old)

    def abort(self) -> None:
        try:
            self.delete(self.tmp)
        except Exception:  # noqa: BLE001 - best effort; the temporary name never looks complete
            pass


# ---------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------


def _spark_schema(arrow_schema):
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(arrow_schema)


def _user_error(exc: BaseException) -> str | None:
    text = str(exc)
    for marker in ("CaptureFormatError: ", "PipelineError: "):
        i = text.rfind(marker)
        if i >= 0:
            return text[i + len(marker):].splitlines()[0].strip()
    return None


def run_pipeline(opts: PipelineOptions, spark=None, log: Callable[[str], None] | None = None) -> PipelineResult:
    """Run the whole pipeline; raises PipelineError for problems the user can fix."""
    t0 = time.monotonic()
    startup = 0.0
    if spark is None:
        spark = get_session(opts.master, opts.partitions, opts.spark_conf, ship_env=opts.ship_env, log=log)
        startup = time.monotonic() - t0
    else:
        spark.conf.set("spark.sql.session.timeZone", "UTC")
        spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
    out = _Output(spark, opts.output)
    out.check(opts.overwrite)
    files = expand_inputs(spark, opts.inputs)
    try:
        result = _run(spark, opts, files, out, log or (lambda s: None))
    except PipelineError:
        out.abort()
        raise
    except Exception as exc:
        out.abort()
        msg = _user_error(exc)
        if msg:
            raise PipelineError(msg) from None
        raise
    out.commit()
    result.seconds = time.monotonic() - t0
    result.startup_seconds = startup
    return result


def _run(spark, opts: PipelineOptions, files: list[tuple[str, int]], out: _Output,
         log: Callable[[str], None]) -> PipelineResult:
    from pyspark.sql import functions as F

    res = PipelineResult(output=out.out, files=len(files), input_bytes=sum(s for _p, s in files))
    split = max(4096, int(opts.split_bytes))
    partitions = opts.partitions or max(2, spark.sparkContext.defaultParallelism * 2)
    spark.conf.set("spark.sql.shuffle.partitions", str(partitions))

    # -- stage 1: read files / ranges -------------------------------------------------
    ranges = []
    for rank, (path, size) in enumerate(files):
        lower = path.lower()
        n = 1 if lower.endswith((".gz", ".gzip")) else max(1, math.ceil(size / split))
        ranges.append((path, rank, n))
    spans = _pcapng_spans(spark, [r for r in ranges if r[2] > 1], split)
    tasks = []
    for path, rank, n in ranges:
        if rank in spans:
            tasks.extend((path, rank, r, n, *span) for r, span in enumerate(spans[rank]))
        else:
            tasks.extend((path, rank, r, n, None, None, None) for r in range(n))
    res.tasks = len(tasks)
    log(f"stage 1: {plural(len(files), 'file')} in {plural(len(tasks), 'task')}")
    seg_schema = _spark_schema(SEGMENT_SCHEMA)

    def read_tasks(batches):
        for b in batches:
            for path, rank, rng, n, start, end, prefix in zip(*(b.column(i).to_pylist() for i in range(7)),
                                                               strict=True):
                span = None if start is None else (start, end, prefix)
                yield from read_range(path, rank, rng, n, split, span=span)

    task_df = spark.createDataFrame(spark.sparkContext.parallelize(tasks, len(tasks)),
                                    "path string, file int, rng int, n int, start long, end long, "
                                    "prefix binary")
    seg_dir = f"{out.tmp}/stage-segments"
    task_df.mapInArrow(read_tasks, seg_schema).write.parquet(seg_dir)
    raw = spark.read.parquet(seg_dir)

    # -- driver: merge positions, reader issues, idle schedule --------------------------
    side = raw.filter(F.col("kind") != "seg").select(
        "kind", "conn", "file", "rng", "lpm", "ts", "seq", "ikind", "imsg", "npackets",
        F.col("idx").alias("npackets_tcp")).collect()
    range_max: dict[int, dict[int, float]] = {}
    for r in side:
        if r.kind == "range" and r.lpm is not None:
            range_max.setdefault(r.file, {})[r.rng] = r.lpm
    carry_rows = []
    for f, ranges in range_max.items():
        running = -math.inf
        for rng in sorted(ranges):
            if running > -math.inf:
                carry_rows.append((f, rng, running))
            running = max(running, ranges[rng])
    packets_before: dict[tuple[int, int], int] = {}
    for f in {r.file for r in side if r.kind == "range"}:
        total = 0
        for r in sorted((r for r in side if r.kind == "range" and r.file == f), key=lambda r: r.rng):
            packets_before[(f, r.rng)] = total
            total += int(r.npackets or 0)

    segs = raw.filter(F.col("kind") == "seg").drop("kind", "ikind", "imsg", "npackets")
    if carry_rows:
        carry = spark.createDataFrame(carry_rows, "file int, rng int, carry double")
        segs = (segs.join(F.broadcast(carry), ["file", "rng"], "left")
                .withColumn("kts", F.when(F.col("carry").isNull(), F.col("lpm"))
                            .otherwise(F.greatest("lpm", "carry"))).drop("carry"))
    else:
        segs = segs.withColumn("kts", F.col("lpm"))
    segs = segs.drop("lpm")
    res.segments = sum(int(r.npackets_tcp or 0) for r in side if r.kind == "range")
    checks = None
    last_ts = None
    if res.segments <= opts.exact_idle_limit:
        checks, last_ts = _idle_schedule(raw, carry_rows)
    else:
        last_ts = max((r.lpm for r in side if r.kind == "range" and r.lpm is not None), default=None)
    res.exact_idle = checks is not None
    reader_errors = _issue_rows(side, files, packets_before, last_ts)

    # -- stage 2 ----------------------------------------------------------------------
    # TLS key material: --tls-keylog's key log plus the capture's Decryption Secrets Blocks,
    # broadcast to the executors inside the config (never logged: KeyLog's repr is a count)
    config = _with_capture_secrets(opts.config, raw.filter(F.col("kind") == "secrets")
                                   .select("file", "rng", "npackets", "payload").collect())
    config_bc = spark.sparkContext.broadcast(config)
    ev_schema = _spark_schema(EVENT_SCHEMA)
    seg_cols = ["conn", "kts", "file", "rng", "idx", "ts", "src_ip", "src_port", "dst_ip", "dst_port",
                "seq", "ack", "flags", "payload", "missing"]

    def stage2(df, names: GlobalNames, brokers: GlobalBrokers, dest: str) -> None:
        values, want, stats, deliveries = opts.values, opts.records, opts.stats, opts.deliveries

        def run(batches):
            yield from dissect_partition(batches, config=config_bc.value, values=values, want_records=want,
                                         checks=checks, names=names, brokers=brokers, meta=True, stats=stats,
                                         deliveries=deliveries)

        (df.select(*seg_cols).repartition(partitions, "conn")
         .sortWithinPartitions("conn", "kts", "file", "rng", "idx")
         .mapInArrow(run, ev_schema).write.parquet(dest))

    log("stage 2: dissecting connections")
    ev1_dir = f"{out.tmp}/stage-events1"
    stage2(segs, {}, {}, ev1_dir)
    ev1 = spark.read.parquet(ev1_dir)
    names, brokers, rerun = _cross_connection(ev1)
    res.rerun_connections = len(rerun)
    events = ev1
    if rerun:
        log(f"stage 2, pass 2: {plural(len(rerun), 'connection')} with names learned elsewhere")
        rerun_df = F.broadcast(spark.createDataFrame([(c,) for c in sorted(rerun)], "conn string"))
        ev2_dir = f"{out.tmp}/stage-events2"
        stage2(segs.join(rerun_df, "conn", "left_semi"), names, brokers, ev2_dir)
        ev2 = spark.read.parquet(ev2_dir)
        events = ev1.join(rerun_df, "conn", "left_anti").unionByName(ev2)
    if reader_errors:
        buf = EventBuffer()
        for e in reader_errors:
            buf.add("errors", "", e.row())
        import pyarrow as pa

        extra = spark.createDataFrame(pa.Table.from_batches([buf.batch()]))
        events = events.unionByName(extra.select(*events.columns))

    written = [t for t in OUTPUT_TABLES if t != "records" or opts.records]
    counts = events.filter(F.col("table").isin(*written, "conn_counts")).groupBy(
        "table", "api_name").agg(F.count("*").alias("n"), F.sum("m_records").alias("c"),
                                 F.sum("m_port").alias("k")).collect()
    for r in counts:
        if r.table == "conn_counts":
            res.connections += int(r.c or 0)
            res.kafka_connections += int(r.k or 0)
        else:
            res.counts[r.table] = res.counts.get(r.table, 0) + int(r.n)
    res.top_apis = sorted(((r.api_name or "unknown", int(r.n)) for r in counts if r.table == "exchanges"),
                          key=lambda x: (-x[1], x[0]))[:5]
    for t in written:
        res.counts.setdefault(t, 0)

    # -- tables -------------------------------------------------------------------------
    for t in written:
        parts = OUTPUT_TABLES[t]
        df = _table(events, t)
        for name, sql in parts.items():
            df = df.withColumn(name, F.expr(sql))
        log(f"writing {t}")
        df.drop("cap_ts").repartition(*parts).write.partitionBy(*parts).parquet(f"{out.tmp}/{t}")
    ex = spark.read.parquet(f"{out.tmp}/exchanges")
    er = spark.read.parquet(f"{out.tmp}/errors")
    vol = events.filter(F.col("table") == "volume")
    for name, df in _aggregates(ex, er, vol).items():
        df.coalesce(1).write.parquet(f"{out.tmp}/{name}")
    if opts.stats:
        log("writing stats (per minute)")
        (stats_table(events).withColumn("date", F.to_date("interval_start")).repartition("date")
         .write.partitionBy("date").parquet(f"{out.tmp}/stats"))
        res.counts["stats"] = spark.read.parquet(f"{out.tmp}/stats").count()
    if opts.deliveries:
        log("writing deliveries (acknowledged records joined with their fetches and commits)")
        (deliveries_table(events).withColumn("date", F.to_date(F.coalesce("ack_ts", "produce_ts")))
         .repartition("date").write.partitionBy("date").parquet(f"{out.tmp}/deliveries"))
        res.counts["deliveries"] = spark.read.parquet(f"{out.tmp}/deliveries").count()
    return res


def _pcapng_spans(spark, big: list[tuple[str, int, int]], split: int) -> dict[int, list]:
    """For each big pcapng file (rank -> per range: start, end, the blocks to read first).

    A light first pass: one task per range walks its block headers (scan_pcapng_range).
    A file whose walks do not join up exactly (corrupt lengths, an unknown byte order)
    is left out, so it is read whole, as the single-process reader reads it.
    """
    if not big:
        return {}
    jobs = [(path, rank, r, n) for path, rank, n in big for r in range(n)]

    def scan(job):
        path, rank, rng, n = job
        got = scan_pcapng_range(path, rng, n, split)
        return [] if got is None else [(rank, rng, got)]

    found: dict[int, list] = {}
    for rank, _rng, got in sorted(spark.sparkContext.parallelize(jobs, len(jobs)).flatMap(scan).collect(),
                                 key=lambda x: (x[0], x[1])):
        found.setdefault(rank, []).append(got)
    spans = {}
    for _path, rank, n in big:
        scans = found.get(rank)
        if scans and len(scans) == n:
            planned = pcapng_spans(scans)
            if planned is not None:
                spans[rank] = planned
    return spans


def _with_capture_secrets(config: DissectConfig, secrets: list) -> DissectConfig:
    """The config with the secrets of the capture's Decryption Secrets Blocks added to its
    key log (in file order), as Dissector.add_tls_secrets adds them in a single process."""
    if not secrets:
        return config
    import dataclasses

    from kwinspect.capture.keylog import KeyLog

    keys = config.tls_keys.copy() if config.tls_keys is not None else KeyLog()
    for r in sorted(secrets, key=lambda r: (r.file, r.rng)):
        keys.add_dsb(int(r.npackets), bytes(r.payload))
    return dataclasses.replace(config, tls_keys=keys)


def _idle_schedule(raw, carry_rows) -> list:
    """The capture-wide idle checks, from every segment's position (sorted here, not by Spark)."""
    import numpy as np
    from pyspark.sql import functions as F

    tbl = raw.filter(F.col("kind") == "seg").select("lpm", "file", "rng", "idx", "ts").toArrow()
    if tbl.num_rows == 0:
        return [], None
    lpm, fl, rg, ix, ts = (tbl.column(c).to_numpy() for c in ("lpm", "file", "rng", "idx", "ts"))
    kts = lpm.astype(np.float64).copy()
    for f, r, carry in carry_rows:
        sel = (fl == f) & (rg == r)
        kts[sel] = np.maximum(kts[sel], carry)
    order = np.lexsort((ix, rg, fl, kts))
    kts, fl, rg, ix, ts = kts[order], fl[order], rg[order], ix[order], ts[order]
    checks = idle_checks(ts, lambda i: pos_of(float(kts[i]), int(fl[i]), int(rg[i]), int(ix[i])))
    return checks, float(ts[-1])  # Dissector._last_ts at the end: the last segment's ts


def _table(events, table: str):
    from pyspark.sql import functions as F

    cols = []
    for c in DATA_TABLES[table]:
        cols.append(F.expr(f"timestamp_micros(`{c}`)").alias(c) if c in TIMESTAMP_COLUMNS else F.col(c))
    if table == "records":
        cols.append(F.col("cap_ts"))
    return events.filter(F.col("table") == table).select(*cols)


def _aggregates(ex, er, vol) -> dict[str, Any]:
    """Per-minute views: latency percentiles (nearest rank), error counts, topic volume."""
    from pyspark.sql import functions as F

    minute = F.date_trunc("minute", F.coalesce("request_ts", "response_ts")).alias("minute")
    paired = ex.filter((F.col("status") == "paired") & F.col("latency_ms").isNotNull())
    # Long polls (a Fetch the broker held waiting for data) are counted apart and left
    # out of the figures, as `kwinspect latency` does; aggregates skip the nulls.
    long_poll = F.coalesce(F.col("long_poll"), F.lit(False))
    paired = paired.withColumn("fig_ms", F.when(~long_poll, F.col("latency_ms")))
    pct = {f"p{int(q * 100)}_ms": F.expr(f"percentile_disc({q}) WITHIN GROUP (ORDER BY fig_ms)")
           for q in (0.5, 0.95, 0.99)}
    latency = (paired.groupBy(minute, "api_name", "broker", "client_id")
               .agg(F.count("fig_ms").alias("count"), F.round(F.avg("fig_ms"), 3).alias("mean_ms"),
                    *[v.alias(k) for k, v in pct.items()], F.max("fig_ms").alias("max_ms"),
                    F.count(F.when(long_poll, 1)).alias("long_polls"))
               .orderBy("minute", "api_name", "broker", "client_id"))
    errors = (er.groupBy(F.date_trunc("minute", "ts").alias("minute"), "kind", "code", "name", "api_name")
              .agg(F.count("*").alias("count")).orderBy("minute", "kind", "name", "api_name"))
    volume = (vol.withColumn("minute", F.date_trunc("minute", F.expr("timestamp_micros(ts)")))
              .groupBy("minute", "topic", "direction")
              .agg(F.sum("m_records").alias("records"), F.sum("m_bytes").alias("bytes"),
                   F.count("*").alias("record_sets"))
              .orderBy("minute", "topic", "direction"))
    return {"latency_by_minute": latency, "error_counts": errors, "topic_volume": volume}


_NUMBERED = re.compile(r"\b(frame|packet|record) (\d+)")
_OFFSET = re.compile(r"\b(offset )(\d+)")


def _issue_rows(side, files: list[tuple[str, int]], packets_before: dict[tuple[int, int], int],
                last_ts: float | None) -> list[ErrorRow]:
    """The error rows single-process dissection makes for reader and packet-parser issues.

    Reader issues: ``path: message`` rows at the end, snaplen counts summed per
    file; parser issues: the message with the packet's ts (or the capture's last
    segment ts for what the parser settles at the end).  Frame/record numbers and
    file offsets found by a byte range are made file-absolute again.
    """
    rows: list[ErrorRow] = []
    snap: dict[int, tuple[str, int]] = {}
    for r in sorted((r for r in side if r.kind == "issue"), key=lambda r: (r.file, r.rng)):
        msg = r.imsg
        if r.rng:
            before = packets_before.get((r.file, r.rng), 0)
            msg = _NUMBERED.sub(lambda m, b=before: f"{m[1]} {int(m[2]) + b}", msg)
            msg = _OFFSET.sub(lambda m, d=r.seq or 0: f"{m[1]}{int(m[2]) + d}", msg)
        if r.conn == "parser":
            rows.append(ErrorRow(kind=r.ikind, message=msg, ts=r.ts))
        elif r.conn == "parser_end":
            rows.append(ErrorRow(kind=r.ikind, message=msg, ts=last_ts))
        elif r.npackets is not None and msg.endswith(SNAPLEN_TRUNCATED_SUFFIX):
            kind, n = snap.get(r.file, (r.ikind, 0))
            snap[r.file] = (kind, n + r.npackets)
        else:
            rows.append(ErrorRow(kind=r.ikind, message=f"{files[r.file][0]}: {msg}", path=None))
    for f, (kind, n) in sorted(snap.items()):
        rows.append(ErrorRow(kind=kind, message=f"{files[f][0]}: {n}{SNAPLEN_TRUNCATED_SUFFIX}", path=None))
    return rows


def _cross_connection(ev1) -> tuple[GlobalNames, GlobalBrokers, set[str]]:
    """Pass-1 bookkeeping -> the broadcast tables and the connections to run again.

    A connection is run again only when some answer it got could differ with
    what other connections learned earlier in the capture:
    * a topic-id lookup answered X (or nothing) while another connection had
      learned a different name for that id by then;
    * "is this endpoint a broker proven elsewhere?" answered no while another
      connection had proven it, unless the connection was found to be Kafka at
      that very segment with that endpoint as the broker anyway (the outcome the
      shortcut would have given).
    """
    from pyspark.sql import functions as F

    meta = ev1.filter(F.col("table").isin("learn", "lookup", "known", "known_lookup", "decision")).select(
        "table", "conn", "p_kts", "p_file", "p_rng", "p_idx", "m_key", "m_value", "m_port").collect()
    names: GlobalNames = {}
    brokers: GlobalBrokers = {}
    lookups: list[tuple[str, str, str | None, Pos]] = []
    known_lookups: list[tuple[str, tuple[str, int], Pos]] = []
    decisions: dict[tuple[str, Pos], list[tuple[tuple[str, int], str]]] = {}
    for r in meta:
        pos = pos_of(r.p_kts, r.p_file, r.p_rng, r.p_idx)
        if r.table == "learn":
            names.setdefault(r.m_key, []).append((pos, r.m_value, r.conn))
        elif r.table == "lookup":
            lookups.append((r.conn, r.m_key, r.m_value, pos))
        elif r.table == "known":
            brokers.setdefault((r.m_key, r.m_port), []).append((pos, r.conn))
        elif r.table == "decision":
            decisions.setdefault((r.conn, pos), []).append(((r.m_key, r.m_port), r.m_value))
        else:
            known_lookups.append((r.conn, (r.m_key, r.m_port), pos))
    names = {tid: compact_names(sorted(v)) for tid, v in names.items()}
    brokers = {ep: compact_brokers(sorted(v)) for ep, v in brokers.items()}

    def known_elsewhere(ep: tuple[str, int], pos: Pos, conn: str) -> bool:
        return any(c != conn and p <= pos for p, c in brokers.get(ep, ()))

    rerun: set[str] = set()
    for conn, tid, answer, pos in lookups:
        if any(c != conn and p <= pos and n != answer for p, n, c in names.get(tid, ())):
            rerun.add(conn)
    for conn, ep, pos in known_lookups:
        if conn in rerun or not known_elsewhere(ep, pos, conn):
            continue
        same = any(broker == str(Endpoint(*ep)) and not known_elsewhere(client, pos, conn)
                   for client, broker in decisions.get((conn, pos), ()))
        if not same:
            rerun.add(conn)
    return names, brokers, rerun
