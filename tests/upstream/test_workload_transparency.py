"""Workload-level transparency: under ``native`` every request is served from the prefix cache
exactly as by vLLM's plain scheduler (``num_cached_tokens`` as vLLM reports it to the client)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import recorder_overhead as bench  # noqa: E402

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """The multi-turn workload (prefix hits, eviction, preemption) on three fresh engines."""
    phases, usable = bench.multiturn_shape(conversations=8, turns=4)
    tmp = tmp_path_factory.mktemp("workload")
    return {config: bench.run_engine(config, phases, usable, tmp / config)
            for config in ("plain", "native", "write_no_admit")}


def test_native_serves_every_request_with_the_cache_hits_of_plain_vllm(served: dict) -> None:
    plain, native = served["plain"]["cached"], served["native"]["cached"]
    assert len(plain) == 32 and sum(plain.values()) > 0
    assert native == plain
    assert served["native"]["events"] > 0


def test_a_policy_that_changes_reuse_changes_the_cache_hits(served: dict) -> None:
    """Negative twin: ``write_no_admit`` (claim-less blocks never reusable) is told apart."""
    assert served["write_no_admit"]["cached"] != served["plain"]["cached"]
