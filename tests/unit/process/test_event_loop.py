"""run_event_loop: uvloop when it is installed (it is a dependency here), asyncio's own loop when it is not."""

from __future__ import annotations

import asyncio
import sys

import pytest

from detok_worker.process.runtime import run_event_loop


async def loop_module_and(value: int) -> tuple[str, int]:
    await asyncio.sleep(0)
    return type(asyncio.get_running_loop()).__module__, value


def test_runs_on_uvloop_when_installed() -> None:
    module, value = run_event_loop(loop_module_and(7))
    assert module.startswith("uvloop") and value == 7


def test_falls_back_to_asyncio_without_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop now raises ImportError
    module, value = run_event_loop(loop_module_and(3))
    assert module.startswith("asyncio") and value == 3
