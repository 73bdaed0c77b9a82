"""The recorder inside the real vLLM CPU engine: what the trace says happened (issue 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import client, query, request_id, scalar

pytestmark = pytest.mark.vllm

LOST_RESIDENT_POSITIONS = """
    SELECT DISTINCT b.position FROM events b JOIN events e ON e.block_hash = b.block_hash
    WHERE b.event = 'claim_bound' AND b.claim_id = 'claim:resident'
      AND e.event = 'block_evicted' AND e.seq < (SELECT min(seq) FROM events
          WHERE event = 'request_arrived' AND request_id = '{probe}')
    ORDER BY 1"""


def _lost_positions(run: Path, view: dict) -> list[int]:
    return [r[0] for r in query(run, LOST_RESIDENT_POSITIONS.format(
        probe=request_id(view, "probe")))]


def test_resident_request_caches_sixty_blocks(record_run):
    run, view = record_run("resident60_active70", "native")
    rid = request_id(view, "resident")
    assert scalar(run, f"SELECT count(DISTINCT position) FROM events WHERE event = "
                       f"'block_cached' AND request_id = '{rid}'") == 60


def test_active_request_evicts_residents_by_allocation(record_run):
    run, view = record_run("resident60_active70", "native")
    rows = query(run, f"""SELECT DISTINCT e.cause, e.by_request_id FROM events e
        JOIN events c ON c.event = 'block_cached' AND c.block_hash = e.block_hash
        WHERE e.event = 'block_evicted' AND c.request_id = '{request_id(view, "resident")}'""")
    assert rows == [("allocation", request_id(view, "active"))]


def test_native_loses_fifty_resident_blocks_tail_first(record_run):
    run, view = record_run("resident60_active70", "native")
    assert _lost_positions(run, view) == list(range(10, 60))


def test_probe_hit_equals_what_the_trace_says_survived(record_run):
    run, view = record_run("resident60_active70", "native")
    lost = set(_lost_positions(run, view))
    surviving_prefix = next(p for p in range(61) if p == 60 or p in lost)
    # NOTE: vLLM recomputes the last block of a full-prompt hit.
    expected = min(surviving_prefix, 59) * 32
    assert client(view, "probe")["num_cached_tokens"] == expected
    assert scalar(run, f"SELECT num_cached_tokens FROM events WHERE event = "
                       f"'request_finished' AND request_id = '{request_id(view, 'probe')}'") \
        == expected


def test_seq_is_strictly_increasing_and_ts_monotonic(record_run):
    run, _ = record_run("resident60_active70", "native")
    rows = query(run, "SELECT seq, ts_ns FROM events ORDER BY seq")
    seqs = [r[0] for r in rows]
    assert seqs == list(range(len(seqs)))
    assert all(a[1] <= b[1] for a, b in zip(rows, rows[1:]))


def test_manifest_counts_the_null_block_out(record_run):
    from kvclaims.reconstruct.loader import read_manifest

    run, _ = record_run("resident60_active70", "native")
    manifest = read_manifest(run)
    assert (manifest["num_blocks"], manifest["usable_blocks"]) == (81, 80)
    assert manifest["complete"] is True and manifest["events_dropped"] == 0


def test_group_by_event_works_in_duckdb(record_run):
    run, _ = record_run("resident60_active70", "native")
    counts = dict(query(run, "SELECT event, count(*) FROM events GROUP BY event"))
    assert counts["run_started"] == counts["run_finished"] == 1
    assert counts["request_arrived"] == counts["request_finished"] == 3


def test_claim_lifecycle_is_recorded_in_order(record_run):
    run, _ = record_run("resident60_active70", "native")
    order = [r[0] for r in query(run, "SELECT event FROM events WHERE claim_id = "
                                      "'claim:resident' AND event != 'claim_bound' ORDER BY seq")]
    assert order[:4] == ["request_arrived", "claim_submitted", "claim_accepted",
                         "claim_materialized"]


def test_unenforced_claim_is_reported_harmed_at_the_end_of_the_breaking_step(record_run):
    # predicates are judged at step ends (docs/design.md §5): the runtime's report closes the
    # step whose losses broke the claim, before any event of the next step
    run, _ = record_run("resident60_active70", "native")
    harmed = scalar(run, "SELECT min(seq) FROM events WHERE event = 'claim_harmed'")
    first_loss = scalar(run, "SELECT min(seq) FROM events WHERE event = 'block_evicted'")
    assert harmed > first_loss
    assert scalar(run, f"SELECT count(DISTINCT step) FROM events WHERE seq BETWEEN "
                       f"{first_loss} AND {harmed}") == 1
    assert scalar(run, f"SELECT min(step) FROM events WHERE seq > {harmed}") == scalar(
        run, f"SELECT step FROM events WHERE seq = {harmed}") + 1


def test_every_engine_event_carries_its_scheduler_step_in_order(record_run):
    run, _ = record_run("resident60_active70", "native")
    assert scalar(run, "SELECT count(*) FROM events WHERE step IS NULL") == 0
    steps = [r[0] for r in query(run, "SELECT step FROM events ORDER BY seq")]
    assert steps == sorted(steps) and steps[0] == 0


def test_later_requests_are_admitted_in_later_steps(record_run):
    run, view = record_run("resident60_active70", "native")
    admitted = [scalar(run, f"SELECT step FROM events WHERE event = 'request_admitted' "
                            f"AND request_id = '{request_id(view, n)}'")
                for n in ("resident", "active", "probe")]
    assert admitted[0] < admitted[1] < admitted[2]


def test_claim_bound_hashes_are_the_cached_blocks_hashes(record_run):
    run, view = record_run("resident60_active70", "native")
    rid = request_id(view, "resident")
    assert scalar(run, f"""SELECT count(*) FROM events b JOIN events c
        ON c.event = 'block_cached' AND c.request_id = '{rid}'
        AND c.block_hash = b.block_hash AND c.position = b.position
        WHERE b.event = 'claim_bound'""") == 60
    assert scalar(run, f"""SELECT count(*) FROM events c JOIN events p
        ON p.event = 'block_cached' AND p.request_id = '{rid}'
        AND p.position = c.position - 1 AND p.block_hash = c.parent_hash
        WHERE c.event = 'block_cached' AND c.request_id = '{rid}'""") == 59


def test_hard_protected_claim_gets_no_runtime_harm_report(record_run):
    run, _ = record_run("resident60_active70", "hard_protected")
    assert scalar(run, "SELECT count(*) FROM events WHERE event = 'claim_harmed'") == 0


def test_unwritable_run_directory_does_not_stop_serving(tmp_path: Path):
    from vllm import EngineArgs, LLMEngine

    from kvclaims.sources.scenarios import Driver, engine_args
    from kvclaims.sources.tiny_model import ensure_tiny_model

    blocker = tmp_path / "file"
    blocker.write_text("a run directory cannot be created below a regular file")
    cfg = {"out": str(blocker / "run"), "policy": "native", "run_id": "unwritable"}
    engine = LLMEngine.from_engine_args(EngineArgs(**engine_args(ensure_tiny_model(), 16, cfg)))
    driver = Driver(engine)
    try:
        driver.submit("r", [1, 2, 3] * 20)
        driver.run()
    finally:
        engine.engine_core.shutdown()
    assert driver.outcomes["r"].finish_reason == "length"
    assert not (blocker / "run").exists()


def _cli(*args: str) -> "subprocess.CompletedProcess[str]":
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "kvclaims.cli", *args], capture_output=True,
                          text=True, timeout=600)


def test_record_command_prints_the_reconstructed_audit_as_json(tmp_path: Path):
    import json

    done = _cli("record", "--scenario", "live_pressure", "--out", str(tmp_path / "run"),
                "--json")
    result = json.loads(done.stdout)
    assert done.returncode == 0 and result["usable_blocks"] == 67
    assert [(c["claim_id"], c["outcome"]) for c in result["claims"]] == \
        [("claim:live-resident", "preserved")]


def test_record_command_refuses_a_non_empty_run_directory(tmp_path: Path):
    (tmp_path / "keep.txt").write_text("data that must not be lost")
    done = _cli("record", "--scenario", "live_pressure", "--out", str(tmp_path))
    assert done.returncode == 2 and "already exists and is not empty" in done.stderr
    assert (tmp_path / "keep.txt").read_text() == "data that must not be lost"


def test_sweep_command_rejects_bad_capacities(tmp_path: Path):
    done = _cli("sweep", "--capacities", "80,lots", "--out", str(tmp_path))
    assert done.returncode == 2 and "--capacities must be comma-separated integers" in done.stderr


class ExplodingArbiterScheduler:
    """Fault injection for the next test: a KVClaimsScheduler whose arbiter fails on every
    block-content and admission call (built lazily so importing this module needs no vLLM)."""

    def __new__(cls, *args, **kwargs):  # type: ignore[no-untyped-def]
        from kvclaims.recorder.scheduler import KVClaimsScheduler

        def boom(*_a, **_k):
            raise RuntimeError("injected arbiter failure")

        sched = KVClaimsScheduler(*args, **kwargs)
        for name in ("on_resident_many", "on_lost_many", "admit", "admitted_fields"):
            setattr(sched.kvc_arbiter, name, boom)
        return sched


def _faulty_run(out: Path, scheduler_cls: str) -> tuple[dict, int]:
    from vllm import EngineArgs, LLMEngine

    from kvclaims.sources.scenarios import Driver, engine_args, tokens
    from kvclaims.sources.tiny_model import ensure_tiny_model

    cfg = {"out": str(out), "policy": "hard_protected", "run_id": "faulty"}
    args = engine_args(ensure_tiny_model(), 16, cfg)
    args["scheduler_cls"] = scheduler_cls
    engine = LLMEngine.from_engine_args(EngineArgs(**args))
    driver = Driver(engine)
    try:
        driver.submit("a", tokens(1, 4), claim={"claim_id": "c"})
        driver.submit("b", tokens(2, 14))  # needs eviction beside a: the pool has 16 blocks
        driver.run()
        failures = engine.engine_core.engine_core.scheduler.kvc_hook_failures
    finally:
        engine.engine_core.shutdown()
    return driver.outcomes, failures


def test_arbiter_failures_never_reach_the_engine_and_leave_hook_failed(tmp_path: Path):
    from kvclaims.reconstruct.loader import read_manifest

    outcomes, failures = _faulty_run(tmp_path / "run",
                                     "tests.test_recorder_vllm.ExplodingArbiterScheduler")
    assert outcomes["a"].finish_reason == outcomes["b"].finish_reason == "length"
    rows = query(tmp_path / "run", "SELECT hook, error_type, count(*) FROM events "
                                   "WHERE event = 'hook_failed' GROUP BY ALL ORDER BY 1")
    assert {(h, e) for h, e, _ in rows} >= {("kvc_admit", "RuntimeError")}
    assert all(e == "RuntimeError" for _, e, _ in rows)
    assert sum(n for *_, n in rows) == failures == read_manifest(tmp_path / "run")[
        "hook_failures"] > 0


def test_a_healthy_run_records_no_hook_failure(tmp_path: Path):
    from kvclaims.reconstruct.loader import read_manifest

    outcomes, failures = _faulty_run(tmp_path / "run", "kvclaims.recorder.scheduler.KVClaimsScheduler")
    # b is refused (4 protected + 14 > 16): the arbiter worked, and nothing failed
    assert (outcomes["a"].finish_reason, outcomes["b"].finish_reason) == ("length", "error")
    assert failures == 0
    assert scalar(tmp_path / "run", "SELECT count(*) FROM events "
                                    "WHERE event = 'hook_failed'") == 0
    assert read_manifest(tmp_path / "run")["hook_failures"] == 0
