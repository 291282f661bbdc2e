"""Entry point of the record-matching process: ``python -m kwinspect.tui.match_proc``.

The TUI starts it for filters on decoded record keys and values
(``tui.record_match``), so that decoding records never holds the app's GIL.
It reads pickles on stdin: first ``(spill_fd, schema_source, values)``, then
requests ``(expr, topic_names, items)``, each answered on stdout with the
list of the items' row ids that match (or an error string).  It ends at the
end of its input.  The app started this process itself and trusts it;
nothing here reads untrusted pickles.  Stray prints go to stderr.
"""

from __future__ import annotations

import os
import pickle
import sys


def main() -> int:
    inp = sys.stdin.buffer
    spill_fd, source, values = pickle.load(inp)  # noqa: S301 - from the app that started us
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # keep the answer channel clean
    from kwinspect.tui.record_match import FrameMatcher

    schemas = None
    if source is not None:
        from kwinspect.analyze.schema_values import SchemaValues

        schemas = SchemaValues(source)
    matcher = FrameMatcher(spill_fd, schemas, values)
    while True:
        try:
            expr, topic_names, items = pickle.load(inp)  # noqa: S301
        except EOFError:
            return 0
        try:
            answer: object = matcher.match(expr, topic_names, items)
        except Exception as exc:  # noqa: BLE001 - the app falls back to matching itself
            answer = f"{type(exc).__name__}: {exc}"
        try:
            pickle.dump(answer, out, protocol=pickle.HIGHEST_PROTOCOL)
            out.flush()
        except BrokenPipeError:
            return 0


if __name__ == "__main__":
    sys.exit(main())
