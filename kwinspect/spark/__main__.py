"""`python -m kwinspect.spark INPUT... -o DIR` = `kwinspect pipeline ...`; also the spark-submit entry.

    spark-submit --master yarn --py-files kwinspect.zip kwinspect/spark/__main__.py hdfs:///caps -o hdfs:///out

Under spark-submit the master and resources come from spark-submit, not --master.
"""

from __future__ import annotations

import sys

from kwinspect.cli import main

if __name__ == "__main__":
    sys.exit(main(["pipeline", *sys.argv[1:]]))
