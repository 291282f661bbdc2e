"""A key log that grows while packets come in (live capture: clients append lines as they
connect): a TLS connection whose keys are not there yet waits for them (its records
queued), and is decrypted once they appear, with the same rows as when the key log was
complete from the start.  The shipped TLS captures are fed packet by packet while their
key log is written a few lines at a time, behind the packets."""

from __future__ import annotations

from pathlib import Path

import pytest

from kwinspect.capture import keylog as keylog_mod
from kwinspect.capture import tls
from kwinspect.capture.keylog import KeyLog
from kwinspect.capture.readers import open_capture
from kwinspect.dissect import DissectConfig, Dissector
from kwinspect.export.writers import columns_of, normalize_row
from kwinspect.model import ErrorRow, Exchange
from kwinspect.run.loop import PacketLoop

CAPTURES = Path(__file__).resolve().parents[1] / "captures"
KEYED = ["tansu-tls12-keylog", "tansu-tls13-keylog"]


def exchange_rows(events: list) -> list[dict]:
    """Exchanges rows, in packet order (live rows come in completion order: a connection
    that waited for its keys completes later than in the file run)."""
    cols = columns_of("exchanges")
    rows = [normalize_row(ev, cols) for ev in events if isinstance(ev, Exchange)]
    return sorted(rows, key=lambda r: (r["frame"] or r["response_frame"], r["response_frame"] or 0))


def static_run(name: str, keys_file: str) -> list:
    keys = KeyLog()
    keys.add_file(CAPTURES / keys_file)
    src = open_capture(str(CAPTURES / f"{name}.pcap"))
    try:
        return list(PacketLoop(Dissector(DissectConfig(tls_keys=keys)), ordered=False).run(src))
    finally:
        src.close()


def growing_run(name: str, keys_file: str, tmp_path: Path, *, lag: int, lines_per_step: int = 2,
                split_lines: bool = False) -> tuple[list, Dissector]:
    """Packets in capture order with an idle tick after each; every ``lag`` packets the
    next ``lines_per_step`` lines of the key log are appended (half a line at a time with
    ``split_lines``)."""
    lines = (CAPTURES / keys_file).read_text().splitlines(keepends=True)
    log = tmp_path / "sslkeys.log"  # does not exist yet when the capture starts
    keys = KeyLog()
    keys.watch(log)
    assert keys.growing and keys and len(keys) == 0
    d = Dissector(DissectConfig(tls_keys=keys))
    src = open_capture(str(CAPTURES / f"{name}.pcap"))

    def packets():
        n = 0
        for raw in src:
            yield raw
            n += 1
            yield None  # an idle tick
            if n % lag == 0 and lines:
                chunk = "".join(lines[:lines_per_step])
                del lines[:lines_per_step]
                with open(log, "a") as f:
                    if split_lines:
                        f.write(chunk[: len(chunk) // 2])
                        f.flush()
                        keys.refresh(force=True)  # reads the complete lines only
                        f.write(chunk[len(chunk) // 2:])
                    else:
                        f.write(chunk)
        if lines:
            with open(log, "a") as f:
                f.write("".join(lines))

    try:
        events = [ev for ev in PacketLoop(d, ordered=False).run(packets()) if ev is not None]
    finally:
        src.close()
    return events, d


@pytest.fixture(autouse=True)
def _no_rate_limit(monkeypatch) -> None:
    monkeypatch.setattr(keylog_mod, "REFRESH_INTERVAL", 0.0)


@pytest.mark.parametrize("name", KEYED)
@pytest.mark.parametrize("lag", [1, 2, 3])
def test_keys_arriving_late_decrypt_the_same(name: str, lag: int, tmp_path: Path, monkeypatch) -> None:
    """(Keys arriving after their connection closed are too late: see the test below.)"""
    want = static_run(name, f"{name}.keys")
    resumed = []
    real = tls.TlsSession.resume

    def resume(self):
        out = real(self)
        resumed.append(len(out))
        return out

    monkeypatch.setattr(tls.TlsSession, "resume", resume)
    got, d = growing_run(name, f"{name}.keys", tmp_path, lag=lag)
    assert exchange_rows(got) == exchange_rows(want) and exchange_rows(want)
    assert resumed  # connections did wait for their keys, and were resumed
    assert all(info.tls_decrypted for info in d.connections.values() if info.tls)
    # no connection was given up: only tls_decrypted rows, one per TLS connection
    assert sorted(e.kind for e in got if isinstance(e, ErrorRow)) == sorted(
        e.kind for e in want if isinstance(e, ErrorRow))
    assert d.packet_accounting_error() is None
    for info in d.connections.values():
        for acc in info.tls_bytes.values():
            assert acc["undecryptable"] == 0 and acc["buffered"] == 0


@pytest.mark.parametrize("name", KEYED)
def test_half_written_lines_wait_for_their_end(name: str, tmp_path: Path) -> None:
    want = static_run(name, f"{name}.keys")
    got, _d = growing_run(name, f"{name}.keys", tmp_path, lag=3, lines_per_step=1, split_lines=True)
    assert exchange_rows(got) == exchange_rows(want)


@pytest.mark.parametrize("name", KEYED)
def test_keys_that_never_come_are_reported_at_the_end(name: str, tmp_path: Path) -> None:
    """Only part of the key log is ever written: the connections without keys are given
    up when they close, with the reason a complete-from-the-start key log gives."""
    want = static_run(name, f"{name}.some.keys")
    got, d = growing_run(name, f"{name}.some.keys", tmp_path, lag=1)
    assert exchange_rows(got) == exchange_rows(want)

    def reasons(events):
        return sorted((e.kind, e.stream, e.message) for e in events if isinstance(e, ErrorRow))

    assert reasons(got) == reasons(want)
    assert d.packet_accounting_error() is None


def test_refresh_reads_only_what_was_appended(tmp_path: Path, monkeypatch) -> None:
    lines = (CAPTURES / "tansu-tls13-keylog.keys").read_text().splitlines(keepends=True)
    secrets = [ln for ln in lines if not ln.startswith("#")]
    log = tmp_path / "k.log"
    log.write_text("".join(secrets[:3]))
    keys = KeyLog()
    assert keys.watch(log) == 3
    assert keys.refresh() == 0
    with open(log, "a") as f:
        f.write("".join(secrets[3:5]))
    assert keys.refresh() == 2 and len(keys) == 5
    log.write_text("".join(secrets[:1]))  # truncated and rewritten: read from the start again
    assert keys.refresh() == 1 and len(keys) == 5
    # rate limited: at most one look per REFRESH_INTERVAL
    monkeypatch.setattr(keylog_mod, "REFRESH_INTERVAL", 3600.0)
    with open(log, "a") as f:
        f.write("".join(secrets[5:7]))
    assert keys.refresh(force=True) == 2
    with open(log, "a") as f:
        f.write("".join(secrets[7:8]))
    assert keys.refresh() == 0 and keys.refresh(force=True) == 1
    assert "secret" in repr(keys) and secrets[0].split()[2] not in repr(keys)
    # a watched key log survives pickling (the TUI's indexer process) with its files
    import pickle

    again = pickle.loads(pickle.dumps(keys))
    assert again == keys and again.growing


def test_live_cli_watches_keylog_files_that_do_not_exist_yet(tmp_path: Path, monkeypatch) -> None:
    """`kwinspect live --tls-keylog FILE` and SSLKEYLOGFILE: watched, and a file a client has
    not created yet is fine (offline commands still want a readable file)."""
    from kwinspect import cli

    flag, env = tmp_path / "flag.keys", tmp_path / "env.keys"
    monkeypatch.setenv("SSLKEYLOGFILE", str(env))
    args = cli.build_parser().parse_args(["live", "-i", "lo", "--tls-keylog", str(flag)])
    keys = cli._config(args, watch_keys=True).tls_keys  # noqa: SLF001 - the CLI's own wiring
    assert keys is not None and keys.growing and len(keys) == 0
    lines = (CAPTURES / "tansu-tls13-keylog.keys").read_text()
    env.write_text(lines)
    assert keys.refresh(force=True) > 0
    with pytest.raises(cli.UsageError):
        cli._config(cli.build_parser().parse_args(  # noqa: SLF001
            ["live", "-i", "lo", "--tls-keylog", str(tmp_path)]), watch_keys=True)
    with pytest.raises(cli.UsageError):  # offline: the file must be there
        cli._config(cli.build_parser().parse_args(  # noqa: SLF001
            ["exchanges", "x.pcap", "--tls-keylog", str(tmp_path / "missing.keys")]))
