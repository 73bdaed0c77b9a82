"""Shared fixtures: recordings on the real vLLM CPU engine, made once per test session."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

Recorder = Callable[..., tuple[Path, dict[str, Any]]]


@pytest.fixture(scope="session")
def record_run(tmp_path_factory: pytest.TempPathFactory) -> Recorder:
    """``record_run(scenario, policy=None, usable=None)`` -> (run_dir, client view).

    Each (scenario, policy, usable) is recorded once per session on a fresh vLLM engine;
    ``scenario`` is a built-in name or a ``kvclaims.sources.scenarios.Scenario``.
    """
    cache: dict[tuple[str, str | None, int | None], tuple[Path, dict[str, Any]]] = {}

    def record_once(scenario: Any, policy: str | None = None,
                    usable: int | None = None) -> tuple[Path, dict[str, Any]]:
        from kvclaims.sources.scenarios import record

        name = scenario if isinstance(scenario, str) else scenario.name
        key = (name, policy, usable)
        if key not in cache:
            out = tmp_path_factory.mktemp("runs") / f"{name}-{policy}-{usable}"
            cache[key] = (out, record(scenario, usable, policy, out))
        return cache[key]

    return record_once


def query(run_dir: Path, sql: str) -> list[tuple]:
    """Run SQL over one run directory's ``events`` view."""
    from kvclaims.reconstruct.loader import load_runs

    return load_runs([run_dir]).connect().sql(sql).fetchall()


def scalar(run_dir: Path, sql: str) -> Any:
    """The single value a SQL query over ``events`` returns."""
    rows = query(run_dir, sql)
    assert len(rows) == 1 and len(rows[0]) == 1, rows
    return rows[0][0]


def request_id(view: dict[str, Any], name: str) -> str:
    """The engine's request id of the scenario request called ``name``."""
    return next(r["request_id"] for r in view["requests"] if r["name"] == name)


def client(view: dict[str, Any], name: str) -> dict[str, Any]:
    """What vLLM reported to the client for the scenario request called ``name``."""
    return next(r for r in view["requests"] if r["name"] == name)
