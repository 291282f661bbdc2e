"""One local SparkSession for every Spark test (start-up is the slow part)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from kwinspect.spark.pipeline import get_session, java_available

    if not java_available():
        # Fail, not skip: CI has Java, and a silently skipped pipeline suite proves nothing.
        pytest.fail("the Spark tests need Java (a JDK 17+ on PATH or JAVA_HOME); none was found")
    session = get_session("local[2]", 2, {
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        "spark.sql.adaptive.enabled": "false",
        "spark.driver.memory": "1g",
    })
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()
