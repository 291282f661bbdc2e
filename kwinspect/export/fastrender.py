"""The compiled row renderer of export/, or None: writers.py renders JSON lines with it
when it is there and with its own generated Python functions otherwise (which stay
the reference: the C hands them every row it does not render itself). The C source is
``_crender.c`` beside this file.
"""

from __future__ import annotations

from kwinspect.core import load

_c = load("kwinspect.export._crender")

# JsonlRow(kinds: bytes, prefixes: tuple[str], suffix: str, fallback) -> callable(values) -> line
#   kinds per column: 0 scalar, 1 timestamp, 2 list (writers.py: _jsonl_renderer)
JsonlRow = _c.JsonlRow if _c is not None else None
