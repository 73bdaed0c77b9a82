"""The compiled hook bodies (recorder/_hooks.c) record exactly what their Python twins record.

The C bodies exist for speed only (docs/transparency.md): a trace must not tell which ran,
except the manifest's ``hooks``. Each behaviour is checked on the real engine, once with the
compiled hooks and once with ``KVCLAIMS_HOOKS=python``.
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import query

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import recorder_overhead as bench  # noqa: E402

from kvclaims.recorder import hooks  # noqa: E402

compiled = pytest.mark.skipif(hooks.compiled_hooks() is None,
                              reason="the compiled hooks are not built here")


def _canonical(run: Path) -> tuple[int, dict[str, list]]:
    """Every event but its timestamp, with block hashes numbered by first appearance (vLLM
    seeds its hashes per process) and request ids without their per-engine suffix."""
    from kvclaims.reconstruct.loader import load_runs

    table = load_runs([run]).connect().sql(
        "SELECT * EXCLUDE (ts_ns) FROM events ORDER BY seq").to_arrow_table()
    cols = {c: table.column(c).to_pylist() for c in table.column_names}
    numbers: dict[Any, int] = {}
    for c in ("block_hash", "parent_hash"):
        cols[c] = [None if v is None else numbers.setdefault(v, len(numbers)) for v in cols[c]]
    for c in ("request_id", "by_request_id"):
        cols[c] = [None if v is None else re.sub(r"-[0-9a-f]{8}$", "", v) for v in cols[c]]
    return table.num_rows, cols


def _hooks_of(run: Path) -> str:
    from kvclaims.reconstruct.loader import read_manifest

    return read_manifest(run)["hooks"]


def _choose_hooks(env: pytest.MonkeyPatch, python: bool) -> None:
    """The Python twins (``KVCLAIMS_HOOKS=python``) or, where built, the compiled hooks."""
    if python:
        env.setenv("KVCLAIMS_HOOKS", "python")
    else:
        env.delenv("KVCLAIMS_HOOKS", raising=False)


def _run(config: str, out: Path, python: bool) -> dict:
    """The small prefix-sharing workload (eviction, hits, frees) on one fresh engine."""
    phases, usable = bench.prefix_shape(n=80)
    return bench.run_engine(config, phases, usable - 64, out, python_hooks=python)


def test_the_compiled_hooks_are_built_where_a_c_compiler_is() -> None:
    """``make install`` compiles them; a silently failed build would lose the speed."""
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler on this machine")
    assert hooks.compiled_hooks() is not None


def test_kvclaims_hooks_python_keeps_the_python_twins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVCLAIMS_HOOKS", "python")
    assert hooks.compiled_hooks() is None


@compiled
@pytest.mark.vllm
@pytest.mark.parametrize("config", ["native", "hard"])
def test_compiled_and_python_hooks_record_identical_events(
        config: str, tmp_path: Path) -> None:
    fast = _run(config, tmp_path / "compiled", python=False)
    slow = _run(config, tmp_path / "python", python=True)
    assert _hooks_of(tmp_path / "compiled") == "compiled"  # the manifest says which ran
    assert _hooks_of(tmp_path / "python") == "python"
    assert query(tmp_path / "compiled", "SELECT count(*) FROM events "
                                        "WHERE event = 'block_evicted'")[0][0] > 0
    assert _canonical(tmp_path / "compiled") == _canonical(tmp_path / "python")
    assert fast["cached"] == slow["cached"]


FAILING = ("block_allocated", "block_evicted", "block_freed", "block_cached", "block_hit",
           "request_admitted", "request_arrived", "request_finished")


class FailingBlockStageScheduler:
    """Fault injection: a KVClaimsScheduler that cannot stage its block or request events (the
    recording part of every compiled hook fails; vLLM's own work must not notice)."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        from kvclaims.recorder.scheduler import KVClaimsScheduler

        sched = KVClaimsScheduler(*args, **kwargs)
        stage = sched.kvc_stage

        def failing(entry: tuple) -> None:
            if entry[0] in FAILING:
                raise RuntimeError("injected staging failure")
            stage(entry)

        sched.kvc_stage = sched.kv_cache_manager.block_pool.kvc_stage = failing
        return sched


def _failing_run(out: Path, monkeypatch: pytest.MonkeyPatch, python: bool) -> tuple[dict, set]:
    from vllm import EngineArgs, LLMEngine

    from kvclaims.recorder.scenarios import Driver, engine_args, tokens
    from kvclaims.recorder.tiny_model import ensure_tiny_model

    with monkeypatch.context() as env:
        _choose_hooks(env, python)
        args = engine_args(ensure_tiny_model(), 16, {"out": str(out), "run_id": "failing"})
        args["scheduler_cls"] = FailingBlockStageScheduler
        engine = LLMEngine.from_engine_args(EngineArgs(**args))
    driver = Driver(engine)
    try:
        driver.submit("a", tokens(1, 10))
        driver.run()
        driver.submit("a2", tokens(1, 10))  # hits a's cached blocks
        driver.run()
        driver.submit("b", tokens(2, 14))  # evicts them
        driver.run()
    finally:
        engine.engine_core.shutdown()
    assert _hooks_of(out) == ("python" if python else "compiled")
    failed = {(h, e) for h, e in query(out, "SELECT DISTINCT hook, error_type FROM events "
                                            "WHERE event = 'hook_failed'")}
    return {n: o.finish_reason for n, o in driver.outcomes.items()}, failed


@compiled
@pytest.mark.vllm
def test_a_failing_compiled_hook_is_reported_like_its_python_twin(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    served, failed = _failing_run(tmp_path / "compiled", monkeypatch, python=False)
    served_py, failed_py = _failing_run(tmp_path / "python", monkeypatch, python=True)
    assert served == served_py == {"a": "length", "a2": "length", "b": "length"}
    assert failed == failed_py == {(hook, "RuntimeError") for hook in (
        "get_new_blocks", "free_blocks", "cache_full_blocks", "kvc_admitted", "kvc_on_arrival",
        "kvc_on_finish")}
