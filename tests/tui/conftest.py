"""Helpers for driving the real app headless with Pilot."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run ``async def`` tests in a fresh event loop (no async plugin needed)."""
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    kwargs = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
    asyncio.run(pyfuncitem.obj(**kwargs))
    return True


CAPTURES = Path(__file__).resolve().parents[2] / "captures"


async def wait_for(pilot, cond: Callable[[], bool], what: str = "condition", steps: int = 500) -> None:
    """Let the app run until ``cond()`` holds (bounded by steps, not by a clock assertion)."""
    for _ in range(steps):
        if cond():
            return
        await pilot.pause(0.02)
    raise AssertionError(f"timed out waiting for {what}")


async def indexed(pilot) -> None:
    app = pilot.app
    await wait_for(pilot, app.indexer.done.is_set, "indexing")
    await pilot.pause()
    main = app.screen
    main.poll()
    await pilot.pause()


@pytest.fixture
def produce_consume() -> Path:
    return CAPTURES / "confluent-mock-produce-consume.pcap"


@pytest.fixture
def errors_capture() -> Path:
    return CAPTURES / "confluent-mock-errors.pcap"
