"""Text (rich) and JSON-lines output for `kwinspect diagnose`."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import IO, Any

from kwinspect.analyze.diagnose.core import ERROR, INFO, WARNING, Finding
from kwinspect.model import plural

STYLE = {ERROR: "bold red", WARNING: "yellow", INFO: "cyan"}
HEADING = {ERROR: "Errors", WARNING: "Warnings", INFO: "Info"}
EVIDENCE_SHOWN = 5


def _iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _clock(ts: float | None) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%H:%M:%S.%f")[:-3] if ts is not None else "-"


def finding_json(f: Finding) -> dict[str, Any]:
    d = f.as_dict()
    d["first_ts"], d["last_ts"] = _iso(f.first_ts), _iso(f.last_ts)
    for e in d["evidence"]:
        e["ts"] = _iso(e["ts"])
    return d


def write_jsonl(findings: Iterable[Finding], out: IO[str]) -> None:
    for f in findings:
        out.write(json.dumps(finding_json(f), ensure_ascii=False, default=str) + "\n")


def render_text(findings: list[Finding], console: Any = None, *, exchanges: int = 0, pcap: str = "PCAP",
                examined: str | None = None) -> None:
    """``examined``: what was looked at, for the first line (default: the number of exchanges)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.text import Text

    from kwinspect.analyze.termsafe import term_safe as clean

    console = console or Console()
    examined = examined or f"{plural(exchanges, 'exchange')} examined"
    if not findings:
        console.print(f"No findings ({examined}).")
        return
    counts = {s: sum(1 for f in findings if f.severity == s) for s in (ERROR, WARNING, INFO)}
    console.print(Text.assemble(("Diagnosis: ", "bold"),
                                (plural(counts[ERROR], "error"), STYLE[ERROR]), ", ",
                                (plural(counts[WARNING], "warning"), STYLE[WARNING]), ", ",
                                (f"{counts[INFO]} info", STYLE[INFO]),
                                f"  ({examined})"))
    for sev in (ERROR, WARNING, INFO):
        group = [f for f in findings if f.severity == sev]
        if not group:
            continue
        console.print()
        console.rule(Text(HEADING[sev], style=STYLE[sev]), align="left")
        for f in group:
            head = Text.assemble((f"[{f.kind}] ", STYLE[sev]), (clean(f.title), "bold"))
            if f.count > 1:
                head.append(f"  x{f.count}", style="dim")
            console.print(head)
            if f.detail:
                console.print(Text("    " + clean(f.detail), style="dim"), overflow="fold")
            when = _iso(f.first_ts)
            if when:
                last = _iso(f.last_ts)
                console.print(Text(f"    when: {when}" + (f" .. {last}" if last and last != when else ""),
                                   style="dim"))
            for e in f.evidence[:EVIDENCE_SHOWN]:
                what = (f"correlation_id={e.correlation_id} " if e.correlation_id is not None else "") + \
                    clean(str(e.api_name))
                console.print(f"    - {escape(what)} {_clock(e.ts)} {escape(clean(str(e.stream)))}",
                              overflow="fold")
            if len(f.evidence) > EVIDENCE_SHOWN or f.count > len(f.evidence):
                more = max(len(f.evidence), f.count) - EVIDENCE_SHOWN
                if more > 0:
                    console.print(Text(f"    ... {more} more (-F jsonl lists up to 20)", style="dim"))
    console.print()
    # correlation ids repeat across connections: the stream names the connection
    example = next((e for f in findings for e in f.evidence if e.correlation_id is not None and e.stream), None)
    stream = clean(example.stream) if example else "CLIENT->BROKER"
    cid = example.correlation_id if example else "N"
    console.print(Text("Find an exchange (stream and correlation_id of the evidence):\n"
                       f"  kwinspect exchanges {clean(pcap)} -f 'stream == \"{stream}\" and "
                       f"correlation_id == {cid}'", style="dim"), overflow="fold")
