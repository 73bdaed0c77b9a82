"""The labelling pass holds the content and the claim instances that are live, not every hash
and instance of the run (docs/reconstruction.md, "Scale"): a bound hash that no later event
names is forgotten, with its bindings, once it has no copy, and an instance is let go once no
later event of its own follows and no hash held binds it; a hash that a later event names is
kept, with the instances bound to it, so its loss is judged against them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvclaims.reconstruct import core, labels, loader

REQUESTS = 2400
BLOCKS = 2        # per request, each a content hash of its own
POOL = 16         # blocks, reused round robin: every cached block is evicted later


RUN_STARTED = {"event": "run_started", "runtime": "vllm", "runtime_version": "0.32.0",
               "model": "tiny-llama", "block_size": 16, "num_blocks": POOL + 1,
               "usable_blocks": POOL, "policy": "native", "schema_version": 3,
               "recorder_version": "0.1.0"}


def _write(path: Path, run: str, rows: list[dict]) -> None:
    """``rows`` as one run's JSON Lines trace, numbered from seq 0."""
    with path.open("w") as f:
        for seq, row in enumerate(rows):
            f.write(json.dumps({"run_id": run, "seq": seq, "ts_ns": 1_000_000 + 1000 * seq,
                                **row}) + "\n")


def _hash(r: int, p: int) -> int:
    return 1_000_003 * (r + 1) + p


def _trace(path: Path, *, named_again: bool) -> None:
    """A run of ``REQUESTS`` requests, each claiming its own ``BLOCKS`` hashes (claim released
    after the request); with ``named_again`` every hash is cached once more at the end."""
    run = "held-state"
    rows: list[dict] = [dict(RUN_STARTED)]
    held: dict[int, int] = {}   # block -> hash it holds

    def cache(b: int, h: int, req: str) -> None:
        if b in held:
            rows.append({"event": "block_evicted", "block_id": b, "block_hash": held[b],
                         "cause": "allocation", "by_request_id": req})
        rows.append({"event": "block_allocated", "block_id": b, "request_id": req})
        rows.append({"event": "block_cached", "block_id": b, "block_hash": h, "position": 0,
                     "request_id": req})
        rows.append({"event": "block_freed", "block_id": b, "request_id": req})
        held[b] = h

    for r in range(REQUESTS):
        req, claim = f"r{r}", f"claim:{r}"
        rows += [{"event": "request_arrived", "request_id": req, "tenant": "tenant-a",
                  "num_prompt_tokens": 16 * BLOCKS, "claim_id": claim},
                 {"event": "claim_submitted", "claim_id": claim, "tenant": "tenant-a",
                  "request_id": req, "protection_mode": "hard_protected",
                  "threshold_blocks": BLOCKS, "value": 1.0},
                 {"event": "claim_accepted", "claim_id": claim}]
        rows += [{"event": "claim_bound", "claim_id": claim, "block_hash": _hash(r, p),
                  "position": p} for p in range(BLOCKS)]
        for p in range(BLOCKS):
            cache((r * BLOCKS + p) % POOL, _hash(r, p), req)
        rows.append({"event": "claim_released", "claim_id": claim, "reason": "done",
                     "released_by": "operator", "request_id": req, "tenant": "tenant-a"})
    if named_again:
        for i in range(REQUESTS * BLOCKS):
            cache(i % POOL, _hash(i // BLOCKS, i % BLOCKS), "again")
    rows.append({"event": "run_finished", "events_written": len(rows) + 1,
                 "events_dropped": 0})
    _write(path, run, rows)


def _reconstruct(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *,
                 named_again: bool) -> core.Tables:
    path = tmp_path / "trace.jsonl"
    _trace(path, named_again=named_again)
    monkeypatch.setattr(labels, "WINDOW_ROWS", 2_000)   # many windows: dead hashes collected
    events = core.load_jsonl([path])
    return core.reconstruct(loader.Trace(events=events, manifests={}, truncated_runs=set()))


def test_hashes_and_instances_no_later_event_reaches_are_not_held(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    t = _reconstruct(tmp_path, monkeypatch, named_again=False)
    bound = REQUESTS * BLOCKS
    assert t.con.sql("SELECT count(DISTINCT block_hash) FROM loss_claims").fetchall() == [
        (bound - POOL,)]                       # every evicted hash was bound by a claim
    assert labels.HELD["hashes"] <= bound // 4
    # one claim in force at a time; the others wait at most for a rebuild of the hash table
    assert labels.HELD["instances"] <= REQUESTS // 4


def test_twin_hashes_named_again_later_are_held_with_their_instances_and_judged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    t = _reconstruct(tmp_path, monkeypatch, named_again=True)
    bound = REQUESTS * BLOCKS
    assert labels.HELD["hashes"] >= bound
    assert labels.HELD["instances"] == REQUESTS
    # each hash's second loss is still judged against the (released) claim bound to it
    assert t.con.sql("SELECT label, count(*) FROM loss_claims WHERE by_request_id = 'again' "
                     "GROUP BY label").fetchall() == [("relaxation", bound)]


def _late_binding_trace(path: Path) -> None:
    """One claim accepted, then more events than a window holds, then bound (its last event)
    to content that is cached and lost."""
    rows: list[dict] = [dict(RUN_STARTED),
                        {"event": "claim_submitted", "claim_id": "c", "tenant": "tenant-a",
                         "request_id": "r", "protection_mode": "hard_protected",
                         "threshold_blocks": 1, "value": 1.0},
                        {"event": "claim_accepted", "claim_id": "c"}]
    for i in range(3000):
        rows += [{"event": "block_allocated", "block_id": 1, "request_id": f"f{i}"},
                 {"event": "block_freed", "block_id": 1, "request_id": f"f{i}"}]
    rows += [{"event": "claim_bound", "claim_id": "c", "block_hash": 8, "position": 0},
             {"event": "block_allocated", "block_id": 0, "request_id": "r"},
             {"event": "block_cached", "block_id": 0, "block_hash": 8, "position": 0,
              "request_id": "r"},
             {"event": "block_freed", "block_id": 0, "request_id": "r"},
             {"event": "block_evicted", "block_id": 0, "block_hash": 8, "cause": "allocation",
              "by_request_id": "x"}]
    _write(path, "late", rows)


def test_an_instance_whose_last_event_is_a_binding_is_held_until_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "trace.jsonl"
    _late_binding_trace(path)
    monkeypatch.setattr(labels, "WINDOW_ROWS", 2_000)   # the late binding is windows later
    t = core.reconstruct(loader.Trace(events=core.load_jsonl([path]), manifests={},
                                      truncated_runs=set()))
    assert t.con.sql("SELECT claim_id, position FROM loss_claims").fetchall() == [("c", 0)]


def _late_materialization_trace(path: Path, *, cached_again: bool) -> None:
    """A claim on two hashes loses the first before the second is ever cached; more events
    than a window holds follow; with ``cached_again`` both are then cached (the instance
    materializes, windows after its loss was written)."""
    rows: list[dict] = [dict(RUN_STARTED),
                        {"event": "claim_submitted", "claim_id": "c", "tenant": "tenant-a",
                         "request_id": "r", "protection_mode": "hard_protected",
                         "threshold_blocks": 2, "value": 1.0},
                        {"event": "claim_accepted", "claim_id": "c"},
                        {"event": "claim_bound", "claim_id": "c", "block_hash": 8, "position": 0},
                        {"event": "claim_bound", "claim_id": "c", "block_hash": 9, "position": 1},
                        {"event": "block_allocated", "block_id": 0, "request_id": "r"},
                        {"event": "block_cached", "block_id": 0, "block_hash": 8, "position": 0,
                         "request_id": "r"},
                        {"event": "block_freed", "block_id": 0, "request_id": "r"},
                        {"event": "block_evicted", "block_id": 0, "block_hash": 8,
                         "cause": "allocation", "by_request_id": "x"}]
    for i in range(3000):
        rows += [{"event": "block_allocated", "block_id": 3, "request_id": f"f{i}"},
                 {"event": "block_freed", "block_id": 3, "request_id": f"f{i}"}]
    if cached_again:
        for b, h in ((1, 8), (2, 9)):
            rows += [{"event": "block_allocated", "block_id": b, "request_id": "r2"},
                     {"event": "block_cached", "block_id": b, "block_hash": h, "position": h - 8,
                      "request_id": "r2"}]
    _write(path, "mat", rows)


def _materialized(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *,
                  cached_again: bool) -> tuple[list[tuple], list[tuple]]:
    path = tmp_path / "trace.jsonl"
    _late_materialization_trace(path, cached_again=cached_again)
    monkeypatch.setattr(labels, "WINDOW_ROWS", 2_000)   # the loss is written windows earlier
    t = core.reconstruct(loader.Trace(events=core.load_jsonl([path]), manifests={},
                                      truncated_runs=set()))
    return (t.con.sql("SELECT seq, materialized_seq FROM loss_claims").fetchall(),
            t.con.sql("SELECT materialized_seq FROM kv_materialized").fetchall())


def test_a_loss_before_its_instance_materialized_carries_the_later_materialization(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pairs, materialized = _materialized(tmp_path, monkeypatch, cached_again=True)
    (mat,), = materialized
    assert pairs == [(8, mat)] and mat > 6000


def test_twin_an_instance_that_never_materializes_leaves_its_losses_without_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pairs, materialized = _materialized(tmp_path, monkeypatch, cached_again=False)
    assert pairs == [(8, None)] and materialized == []
