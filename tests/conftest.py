"""Rig fixtures for the end-to-end tests (tests/e2e): brokers start once per session.

The brokers (librdkafka mock cluster, tansu) live as long as the session; each
scenario runs once, into a session temp dir, and its capture is decoded once.
Everything started here is stopped in the fixture's finally, also on failure.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest


def pytest_configure(config: pytest.Config) -> None:
    # kafka-python (used by the e2e scenarios) loads its schemas with deprecated calls.
    config.addinivalue_line("filterwarnings", "ignore:read_text is deprecated:DeprecationWarning")
    config.addinivalue_line("filterwarnings", "ignore:open_text is deprecated:DeprecationWarning")


@pytest.fixture(autouse=True)
def _no_inherited_terminal_width(monkeypatch: pytest.MonkeyPatch) -> None:
    """Table output honours COLUMNS; pytest-xdist workers inherit one from the controller,
    so every test starts without it (tests of narrow output set it themselves)."""
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("LINES", raising=False)
    # kwinspect reads SSLKEYLOGFILE as a TLS key log: a developer's must not change outputs
    monkeypatch.delenv("SSLKEYLOGFILE", raising=False)


def rig_unavailable_reason() -> str | None:
    from rig.tcpdump import tcpdump_path

    if os.name != "posix" or os.geteuid() != 0:
        return "needs root: tcpdump captures on lo (CI runs as root)"
    if tcpdump_path() is None:
        return "tcpdump is not installed (`make sysdeps` installs it)"
    return None


@pytest.fixture(scope="session")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    reason = rig_unavailable_reason()
    if reason:
        pytest.skip(reason)
    from rig.rig import Rig

    r = Rig(log_dir=str(tmp_path_factory.mktemp("rig-logs")))
    try:
        yield r
    finally:
        r.close()


@pytest.fixture(scope="session")
def scenario_run(rig: Any, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Any]:
    """`scenario_run(name)` -> (Manifest, pcap path, Decoded); each scenario runs once."""
    from rig import verify
    from rig.scenarios import run_scenario, unavailable_reason

    workdir = str(tmp_path_factory.mktemp("scenarios"))
    cache: dict[str, Any] = {}

    def get(name: str) -> Any:
        why = unavailable_reason(name)
        if why:
            pytest.skip(f"{name}: {why}")
        if name not in cache:
            try:
                m = run_scenario(name, rig, workdir)
                cache[name] = (m, os.path.join(workdir, m.pcap))
            except Exception as exc:  # remembered, so the other checks fail fast
                cache[name] = exc
        got = cache[name]
        if isinstance(got, Exception):
            pytest.fail(f"scenario {name} could not run: {type(got).__name__}: {got}")
        m, pcap = got
        key = ("decoded", name)
        if key not in cache:
            try:
                cache[key] = verify.decode(pcap, m.kafka_ports)
            except Exception as exc:
                cache[key] = exc
        decoded = cache[key]
        if isinstance(decoded, Exception):
            pytest.fail(f"kwinspect could not decode {pcap}: {type(decoded).__name__}: {decoded}")
        return m, pcap, decoded

    return get


@pytest.fixture(scope="session")
def kwinspect_wheel(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """kwinspect's wheel, built once per session (tests/helpers/wheel.py)."""
    from tests.helpers.wheel import build_wheel

    return build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="session")
def extra_venv(kwinspect_wheel: Any, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Any]:
    """`extra_venv("spark")` -> bin/ of a fresh `python3 -m venv` holding kwinspect[spark] and
    nothing else; one venv per extra per session (pip's cache makes the installs quick)."""
    from tests.helpers.wheel import venv_with

    made: dict[str, Any] = {}

    def get(extra: str) -> Any:
        if extra not in made:
            made[extra] = venv_with(kwinspect_wheel, extra, tmp_path_factory.mktemp(f"venv-{extra}"))
        return made[extra]

    return get
