"""Every shell example in README.md and docs/*.md runs, verbatim, on the shipped captures.

The fenced ``sh``/``console`` blocks are extracted (``console``: the ``$`` lines; ``sh``:
every command line) and run with bash (``pipefail``) in a scratch directory holding
``captures/`` and ``README.md``, with ``kwinspect`` and ``python`` on PATH meaning this
checkout. Placeholder file names are replaced by shipped captures (PLACEHOLDERS, the
only rewriting done). A command passes when it exits with the status its output shows
(``# exit N``, else 0), prints no traceback, and produces output: text on stdout or
stderr, or the non-empty files it names with ``-o``/``--plot``. ``kwinspect:`` lines
shown as output in a ``console`` block must be what the command prints.

SKIPPED lists, by command prefix, the only examples not run and why: they need root
and a live interface, Spark/a cluster, or build a virtualenv.
"""

from __future__ import annotations

import os
import re
import select
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]

# Placeholder names in the examples -> shipped captures (whole-word replacement).
PLACEHOLDERS = {
    "capture.pcap": "captures/confluent-mock-errors.pcap",  # slow Produce, Metadata, errors, findings
    "x.pcap": "captures/confluent-mock-errors.pcap",
    "rotated-*.pcap": "captures/tansu-*.pcap",
    "kafka-*.pcap": "captures/confluent-mock-*.pcap",
}

# Commands not run, by prefix (after placeholder replacement), with the reason.
SKIPPED = {
    "sudo ": "needs root and a live network interface",
    "kwinspect live ": "captures on a live interface (root or CAP_NET_RAW)",
    "kwinspect pipeline ": "needs Spark and a JDK (tests/spark covers the pipeline)",
    "spark-submit ": "needs a Spark cluster",
    "pip install ": "installs kwinspect and its extras from the package index",
    "python3 -m venv ": "builds a virtualenv for a Spark cluster",
    "kw/bin/kwinspect pipeline ": "needs a Spark cluster",
    "pyspark_venv/bin/venv-pack ": "packs a virtualenv for a Spark cluster",
    "PYSPARK_DRIVER_PYTHON=": "needs a Spark cluster (spark-submit)",
    "make demo": "builds a virtualenv (.venv)",
    "make test": "builds a virtualenv and runs the whole suite",
}
# Interactive: run on a terminal and quit with `q`.
INTERACTIVE = ("kwinspect tui ",)
NEEDS_JQ = "| jq"


@dataclass
class Example:
    doc: str
    line: int
    command: str
    expected: list[str] = field(default_factory=list)

    @property
    def status(self) -> int:
        for text in self.expected:
            m = re.search(r"#\s*exit (\d+)\s*$", text)
            if m:
                return int(m.group(1))
        return 0


def _replace_placeholders(command: str) -> str:
    for name, real in PLACEHOLDERS.items():
        command = re.sub(rf"(?<![\w./-]){re.escape(name)}(?![\w.-])", real, command)
    return command


def examples() -> list[Example]:
    out: list[Example] = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for m in re.finditer(r"^```(sh|console)\n(.*?)^```", text, re.S | re.M):
            first = text[: m.start(2)].count("\n") + 1
            lines = m.group(2).splitlines()
            joined: list[tuple[int, str]] = []
            for i, line in enumerate(lines):  # backslash continuations
                if joined and joined[-1][1].endswith("\\"):
                    joined[-1] = (joined[-1][0], joined[-1][1][:-1] + " " + line.strip())
                else:
                    joined.append((first + i, line))
            for lineno, line in joined:
                if m.group(1) == "console":
                    if line.startswith("$ "):
                        out.append(Example(doc.name, lineno, _replace_placeholders(line[2:])))
                    elif out and out[-1].doc == doc.name and line.strip():
                        out[-1].expected.append(line)
                elif line.strip() and not line.lstrip().startswith("#"):
                    out.append(Example(doc.name, lineno, _replace_placeholders(line.strip())))
    return out


EXAMPLES = examples()


def _skip_reason(ex: Example) -> str | None:
    for prefix, why in SKIPPED.items():
        if ex.command.startswith(prefix):
            return why
    return None


def _blocks() -> list[list[Example]]:
    """Examples grouped by document, in order: a later example may read an earlier one's file."""
    by_doc: dict[str, list[Example]] = {}
    for ex in EXAMPLES:
        by_doc.setdefault(ex.doc, []).append(ex)
    return list(by_doc.values())


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("docs-examples")
    (work / "captures").symlink_to(ROOT / "captures")
    (work / "README.md").symlink_to(ROOT / "README.md")
    bin_dir = work / ".bin"
    bin_dir.mkdir()
    for name, target in (("kwinspect", f'"{sys.executable}" -m kwinspect.cli "$@"'),
                         ("python", f'"{sys.executable}" "$@"')):
        shim = bin_dir / name
        shim.write_text(f"#!/bin/sh\nexec {target}\n")
        shim.chmod(0o755)
    return work


def _env(work: Path) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), PATH=f"{work / '.bin'}{os.pathsep}{os.environ['PATH']}",
               COLUMNS="100", TERM="xterm")
    env.pop("PYTHONSTARTUP", None)
    return env


def _run_interactive(command: str, work: Path) -> tuple[int, str]:
    pty = pytest.importorskip("pty")
    leader, follower = pty.openpty()
    proc = subprocess.Popen(["bash", "-c", command], stdin=follower, stdout=follower, stderr=follower,
                            cwd=work, env=dict(_env(work), LINES="30"), start_new_session=True)
    os.close(follower)
    out, sent, start = b"", False, time.monotonic()
    try:
        while proc.poll() is None and time.monotonic() - start < 60:
            ready, _, _ = select.select([leader], [], [], 0.5)
            if ready:
                try:
                    out += os.read(leader, 65536)
                except OSError:
                    break
            if not sent and len(out) > 2000:  # the app has drawn its screen
                time.sleep(1.0)
                os.write(leader, b"q")
                sent = True
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        os.close(leader)
    return proc.returncode, out.decode("utf-8", "replace")


def _files_named(command: str) -> list[str]:
    words = shlex.split(command.split("|")[0], comments=True)
    return [words[i + 1] for i, w in enumerate(words[:-1]) if w in ("-o", "--output", "--plot")]


def _check(ex: Example, work: Path) -> str | None:
    """None when the example works, else what is wrong."""
    where = f"{ex.doc}:{ex.line}: {ex.command}"
    if NEEDS_JQ in ex.command and not shutil.which("jq"):
        return f"{where}\n  jq is not installed (`make sysdeps` installs it)"
    if ex.command.startswith(INTERACTIVE):
        status, text = _run_interactive(ex.command, work)
        if status != 0 or "Traceback" in text or not text.strip():
            return f"{where}\n  exit {status}\n{text[-2000:]}"
        return None
    files = _files_named(ex.command)
    for f in files:
        (work / f).unlink(missing_ok=True)
    proc = subprocess.run(["bash", "-o", "pipefail", "-c", ex.command], cwd=work, env=_env(work),
                          capture_output=True, text=True, timeout=300)
    text = proc.stdout + proc.stderr
    problems = []
    if proc.returncode != ex.status:
        problems.append(f"exit {proc.returncode}, the docs say {ex.status}")
    if "Traceback" in text:
        problems.append("traceback")
    if files:
        problems += [f"{f} not written" for f in files if not (work / f).is_file() or not (work / f).stat().st_size]
    elif not proc.stdout.strip() and not proc.stderr.strip():
        problems.append("no output")
    for shown in ex.expected:
        if shown.startswith("kwinspect: "):
            message = re.sub(r"\s*#\s*exit \d+\s*$", "", shown)
            if message not in proc.stderr:
                problems.append(f"the docs show {message!r}")
    if problems:
        return f"{where}\n  " + "; ".join(problems) + f"\n  stdout: {proc.stdout[-800:]}\n  stderr: {proc.stderr[-800:]}"
    return None


def test_examples_were_found():
    docs = {ex.doc for ex in EXAMPLES}
    assert {"README.md", "cli.md", "live.md", "pipeline.md"} <= docs
    assert len(EXAMPLES) > 30


def test_docs_stand_alone():
    """docs/ and the README never point outside the repository."""
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for bad in ("DESIGN.md", "../shared", "shared/"):
            assert bad not in text, f"{doc.name} refers to {bad}"
        for target in re.findall(r"\]\(([^)#]+)", text):
            if "://" not in target:
                assert (doc.parent / target).resolve().is_relative_to(ROOT), f"{doc.name} links {target}"
                assert (doc.parent / target).exists(), f"{doc.name}: broken link {target}"


@pytest.mark.parametrize("block", _blocks(), ids=lambda b: b[0].doc)
def test_shell_examples_run(block, workdir):
    failures = [msg for ex in block if _skip_reason(ex) is None for msg in [_check(ex, workdir)] if msg]
    assert not failures, "\n\n".join(failures)


def test_skips_are_only_the_listed_kinds():
    """Every skipped example matches SKIPPED, and every SKIPPED entry is still used."""
    used = {prefix for ex in EXAMPLES for prefix in SKIPPED if ex.command.startswith(prefix)}
    assert used == set(SKIPPED), f"unused SKIPPED entries: {set(SKIPPED) - used}"
