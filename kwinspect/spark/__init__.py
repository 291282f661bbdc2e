"""The Spark pipeline (``kwinspect pipeline``): the same sans-IO core over many capture files.

``fragments`` (stage 1: files -> TCP segments) and ``connection`` (stage 2: one
Dissector per 4-tuple) are Spark-free and run inside executors; ``pipeline``
wires them with PySpark.  pyspark is imported only in ``pipeline``, lazily.
See docs/pipeline.md.
"""
