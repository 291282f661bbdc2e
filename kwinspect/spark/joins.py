"""The cross-connection tables in Spark: `stats` and `deliveries`, from stage 2's facts.

Stage 2 (kwinspect.spark.connection) emits, besides the rows of the per-connection
tables, the facts of kwinspect.spark.facts, each with its capture-order position.
Here Spark shuffles them so that what belongs together meets in one task, sorted
in capture order, and the reducers of kwinspect.spark.facts run the single-process
code over each group:

* lag: offset facts by (topic, partition) -> consumer and fetch lag observations;
* refusals: a connection attempt counts as refused when its broker was seen (an
  exchange or a Kafka connection) earlier in the capture, or its port is a Kafka port;
* stats: every observation by (minute, series, dimension values) -> the rows of
  `kwinspect stats -i 1m`;
* deliveries: acknowledged records joined with failed attempts, fetches and
  commits (deliveries_table).

Nothing is collected to the driver.
"""

from __future__ import annotations

from typing import Any

from kwinspect.analyze.deliveries import MIRROR_WINDOW_S
from kwinspect.analyze.delivery_columns import DELIVERY_TIMESTAMP_COLUMNS
from kwinspect.spark.facts import (
    COMMIT_SCHEMA,
    DELIVERIES_STAGE_SCHEMA,
    DIM_COLUMNS,
    OBS_COLUMNS,
    OBS_SCHEMA,
    ORDER_COLUMNS,
    STATS_STAGE_SCHEMA,
    commit_sweep,
    delivery_rows,
    lag_replay,
    stats_reduce,
)


def _spark_schema(arrow_schema):
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(arrow_schema)


def stats_table(events) -> Any:
    """The stats rows (STATS_COLUMNS, interval_start a timestamp) from stage 2's events."""
    from pyspark.sql import functions as F

    obs_cols = [*OBS_COLUMNS, *ORDER_COLUMNS]
    local = events.filter(F.col("table") == "obs").select(*obs_cols)

    facts = events.filter(F.col("table") == "lagfact").select(*OBS_COLUMNS, "o_offset", *ORDER_COLUMNS)
    lag = (facts.repartition("o_topic", "o_partition")
           .sortWithinPartitions("o_topic", "o_partition", *ORDER_COLUMNS)
           .mapInArrow(lag_replay, _spark_schema(OBS_SCHEMA)).select(*obs_cols))

    # a refusal counts when its broker was seen at an earlier position (or on a Kafka port)
    pos = F.struct("p_kts", "p_file", "p_rng", "p_idx", "o_seq")
    seen = (events.filter(F.col("table") == "bseen").groupBy("o_broker")
            .agg(F.min(pos).alias("seen_at")))
    refusals = events.filter(F.col("table") == "refusal").withColumn("at", pos)
    refused = (refusals.join(seen, "o_broker", "left")
               .filter((F.col("o_offset") == 1) | (F.col("seen_at").isNotNull() & (F.col("seen_at") < F.col("at"))))
               .select(*obs_cols))

    observations = local.unionByName(lag).unionByName(refused)
    key = ["o_interval", "o_series", *DIM_COLUMNS]
    rows = (observations.repartition(*key).sortWithinPartitions(*key, *ORDER_COLUMNS)
            .mapInArrow(stats_reduce, _spark_schema(STATS_STAGE_SCHEMA)))
    return rows.withColumn("interval_start", F.expr("timestamp_micros(interval_start)"))


def deliveries_table(events) -> Any:
    """The deliveries rows (DELIVERY_COLUMNS, timestamps as timestamps) from stage 2's facts.

    Joins, all in Spark (docs/pipeline.md, "deliveries"):
    * a record is tracked at its first acknowledgment (capture order); later ones at
      the same offset count as attempts unless they are the same request on a proxy's
      other leg;
    * failed attempts join the record acknowledged next with the same link key (a
      failure of a request whose other leg was acknowledged is not one);
    * fetched offsets join on (topic, partition, offset) when fetched after the
      acknowledgment; the fetch's group is the one its client named last before it;
    * commits cover records per (topic, partition) in capture order (commit_sweep).
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    order = [F.col(c) for c in ORDER_COLUMNS]
    x = F.struct(*ORDER_COLUMNS)
    tp_off = ["o_topic", "o_partition", "o_offset"]
    d = events.filter(F.col("table").startswith("d_"))

    acks = d.filter(F.col("table") == "d_ack").withColumn(
        "rn", F.row_number().over(Window.partitionBy(*tp_off).orderBy(*order)))
    tracked = acks.filter(F.col("rn") == 1).drop("rn")
    first = tracked.select(*tp_off, F.col("o_client_id").alias("f_client"), F.col("m_port").alias("f_corr"),
                           F.col("o_ts").alias("f_ts"))
    again = (acks.filter(F.col("rn") > 1).join(first, tp_off)
             .filter(~(F.col("m_port").eqNullSafe(F.col("f_corr")) & F.col("o_client_id").eqNullSafe(F.col("f_client"))
                       & F.coalesce(F.abs(F.col("f_ts") - F.col("o_ts")) <= MIRROR_WINDOW_S, F.lit(False))))
             .groupBy(*tp_off).agg(F.count("*").alias("extra_attempts")))

    # a failed attempt is not one when the same request's other leg was acknowledged
    ex_key = ["conn", "p_kts", "p_file", "p_rng", "p_idx", "o_seq"]
    reqs = d.filter(F.col("table") == "d_req")
    w_req = Window.partitionBy("o_client_id", "m_port").orderBy(*order)
    prev = (reqs.withColumn("prev_stream", F.lag("m_value").over(w_req))
            .withColumn("prev_ts", F.lag("o_ts").over(w_req))
            .withColumn("prev_acked", F.lag("o_offset").over(w_req))
            .withColumn("mirror_acked", (F.col("prev_stream") != F.col("m_value"))
                        & (F.abs(F.col("prev_ts") - F.col("o_ts")) <= MIRROR_WINDOW_S)
                        & (F.col("prev_acked") == 1))
            .select(*ex_key, "mirror_acked"))
    fails = (d.filter(F.col("table") == "d_fail").join(prev, ex_key, "left")
             .filter(~F.coalesce(F.col("mirror_acked"), F.lit(False))))
    # each failure goes to the next record acknowledged with its link key
    linked = (tracked.select("m_key", *ORDER_COLUMNS, F.lit(1).alias("is_ack"), *tp_off)
              .unionByName(fails.select("m_key", *ORDER_COLUMNS, F.lit(0).alias("is_ack"),
                                        *[F.lit(None).cast(t).alias(c) for c, t in
                                          (("o_topic", "string"), ("o_partition", "int"), ("o_offset", "bigint"))],
                                        "o_series", "o_client_id", "m_port", "m_value", "o_ts"),
                        allowMissingColumns=True)
              .withColumn("acks_before", F.coalesce(F.sum("is_ack").over(
                  Window.partitionBy("m_key").orderBy(*order).rowsBetween(Window.unboundedPreceding, -1)),
                  F.lit(0))))
    fail_groups = (linked.filter(F.col("is_ack") == 0).groupBy("m_key", "acks_before").agg(
        F.count("*").alias("fail_n"),
        F.array_join(F.array_distinct(F.transform(F.array_sort(F.collect_list(F.struct(x.alias("x"), "o_series"))),
                                                  lambda e: e["o_series"])), ", ").alias("fail_errors"),
        F.max_by(F.struct(F.col("o_client_id").alias("fail_client_id"), F.col("m_port").alias("fail_correlation_id"),
                          F.col("o_ts").alias("fail_ts"), F.col("m_value").alias("fail_stream")), x).alias("last")))
    ack_fails = (linked.filter(F.col("is_ack") == 1).select(*tp_off, "m_key", "acks_before")
                 .join(fail_groups, ["m_key", "acks_before"])
                 .select(*tp_off, "fail_n", "fail_errors", "last.*"))

    # fetches: the group the client named last before each, and the one it named last of all
    groups = d.filter(F.col("table") == "d_group")
    fetch_rows = d.filter(F.col("table") == "d_fetch")
    w_client = Window.partitionBy("o_client_id").orderBy(*order).rowsBetween(Window.unboundedPreceding, 0)
    with_group = (fetch_rows.unionByName(groups)
                  .withColumn("group_then", F.last("o_group_id", ignorenulls=True).over(w_client))
                  .filter(F.col("table") == "d_fetch"))
    last_group = groups.groupBy("o_client_id").agg(F.max_by("o_group_id", x).alias("group_last"))
    ack_at = tracked.select(*tp_off, x.alias("ack_x"))
    fetches = (with_group.join(ack_at, tp_off).filter(x > F.col("ack_x"))
               .join(last_group, "o_client_id", "left")
               .groupBy(*tp_off).agg(F.array_sort(F.collect_list(F.struct(
                   x.alias("x"), F.col("o_client_id").alias("client_id"), F.col("m_port").alias("correlation_id"),
                   F.col("m_value").alias("stream"), F.col("o_ts").alias("ts"), "group_then", "group_last")))
                   .alias("fetches")))

    commits = (tracked.select("table", *tp_off, *ORDER_COLUMNS, "o_group_id", "o_ts")
               .unionByName(d.filter(F.col("table") == "d_commit")
                            .select("table", *tp_off, *ORDER_COLUMNS, "o_group_id", "o_ts"))
               .repartition("o_topic", "o_partition").sortWithinPartitions("o_topic", "o_partition", *ORDER_COLUMNS)
               .mapInArrow(commit_sweep, _spark_schema(COMMIT_SCHEMA)))

    joined = (tracked.select(*tp_off, "o_blob")
              .join(again, tp_off, "left").join(ack_fails, tp_off, "left")
              .join(fetches, tp_off, "left").join(commits, tp_off, "left"))
    rows = joined.mapInArrow(delivery_rows, _spark_schema(DELIVERIES_STAGE_SCHEMA))
    for c in DELIVERY_TIMESTAMP_COLUMNS:
        rows = rows.withColumn(c, F.expr(f"timestamp_micros(`{c}`)"))
    return rows
