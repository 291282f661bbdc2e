"""Make untrusted strings safe to print on a terminal.

Everything kwinspect shows comes off the wire: client ids, topic names, record
keys and values, header keys.  A value holding ``ESC [ 2 J`` would clear the
user's screen, ``ESC ] 52`` can write the clipboard, a carriage return can
overwrite what was printed before, and bidi overrides (U+202E) can make text
read backwards.  Every human-facing renderer (tables, the summary report, the
TUI) passes cells through :func:`term_safe` first.

Escaping rule: C0 and C1 control characters, DEL, and Unicode format
characters that change how text is laid out (bidi embeddings/overrides/
isolates, zero-width characters, BOM) are written as Python-style escapes:
``\\x1b``, ``\\x7f``, ``\\u202e``.  Newlines and tabs are escaped too (``\\n``,
``\\t``), so one value is always one line.  Printable text, including
non-ASCII letters, passes through unchanged; backslashes are not doubled.
"""

from __future__ import annotations

import re
from typing import Any

# C0 controls, DEL, C1 controls, layout-changing format characters, and lone
# surrogates (from surrogateescape decoding; they cannot be encoded for output).
_UNSAFE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u2028\u2029"
    "\u202a-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\ud800-\udfff]"
)
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_char(m: re.Match[str]) -> str:
    ch = m.group(0)
    named = _NAMED.get(ch)
    if named is not None:
        return named
    cp = ord(ch)
    return f"\\x{cp:02x}" if cp <= 0xFF else f"\\u{cp:04x}"


def term_safe(value: Any, max_len: int | None = None) -> str:
    """``str(value)`` with control/ANSI/bidi characters escaped, optionally cut.

    ``max_len`` truncates the *escaped* text to that many characters, ending
    with an ellipsis, so a multi-megabyte record value stays cheap to render.
    """
    if value is None:
        return ""
    text = value if isinstance(value, str) else str(value)
    if max_len is not None and len(text) > 4 * max_len:
        # Cut before escaping (an escape is at most 6 chars) to bound the work.
        text = text[: 4 * max_len]
        cut = True
    else:
        cut = False
    text = _UNSAFE.sub(_escape_char, text)
    if max_len is not None and (cut or len(text) > max_len):
        text = text[: max(0, max_len - 1)] + "…"
    return text
