"""Property test: one event written by the runtime cannot turn harm into a non-harm without a
finding (docs/design.md §5, issue 24). Hypothesis builds honest traces of a materialized claim
whose block is then lost, and falsifies them at random: a demoted hard claim, an expiry without
or before its TTL, a release by another tenant, a phantom hit repairing the loss, a gap inside
the loss's step. No such loss may be labelled relaxation, expiry or eviction, and every
falsification yields its finding."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvclaims.sources.jsonl import events_to_table
from kvclaims.reconstruct import core, loader

# falsification -> the finding kind it must yield
FALSIFICATIONS: dict[str, str] = {
    "demote_hard": "demoted_not_demotable",
    "expire_without_ttl": "expired_without_ttl",
    "expire_before_ttl": "expired_before_ttl",
    "expire_hard": "expired_not_expiring",
    "release_by_other_tenant": "released_not_by_owner",
    "release_by_nobody": "released_by_unknown",
    "phantom_hit": "hit_not_resident",
    "gap_in_step": "recorder_gap",
}


def falsified_run(run_id: str, kind: str, blocks: int, lost: int, stepped: bool,
                  noise: int) -> list[dict[str, Any]]:
    """A claim over ``blocks`` cached blocks (tenant ta), materialized; ``noise`` unrelated
    blocks; then the falsified transition ``kind`` and the loss of claimed block ``lost``."""
    mode = {"expire_without_ttl": "expiring", "expire_before_ttl": "expiring",
            "expire_on_time": "expiring", "demote_demotable": "demotable"}.get(
        kind, "hard_protected")
    ttl = {"expire_before_ttl": 60.0, "expire_hard": 0.000001,
           "expire_on_time": 0.000001}.get(kind)
    evs: list[dict[str, Any]] = [{"event": "run_started", "policy": "native",
                                  "schema_version": 2}]
    step = [0]

    def emit(ev: dict[str, Any]) -> None:
        if stepped:
            ev["step"] = step[0]
        evs.append(ev)

    sub = {"event": "claim_submitted", "claim_id": "c", "tenant": "ta", "request_id": "r",
           "protection_mode": mode, "threshold_blocks": blocks}
    if ttl is not None:
        sub["ttl_s"] = ttl
    emit(sub)
    emit({"event": "claim_accepted", "claim_id": "c"})
    for p in range(blocks):
        emit({"event": "claim_bound", "claim_id": "c", "block_hash": 100 + p, "position": p})
    for p in range(blocks + noise):
        emit({"event": "block_cached", "block_id": p + 1, "block_hash": 100 + p,
              "position": p, "request_id": "r"})
    step[0] += 1
    if kind.startswith("demote"):
        emit({"event": "claim_demoted", "claim_id": "c", "by_request_id": "x"})
    elif kind.startswith("expire"):
        emit({"event": "claim_expired", "claim_id": "c"})
    elif kind.startswith("release_by_o"):   # the other tenant, or the owner (twin)
        emit({"event": "claim_released", "claim_id": "c", "released_by": "tenant",
              "tenant": "tb" if kind == "release_by_other_tenant" else "ta",
              "request_id": "b1"})
    elif kind == "release_by_nobody":
        emit({"event": "claim_released", "claim_id": "c"})
    emit({"event": "block_evicted", "block_id": lost + 1, "block_hash": 100 + lost,
          "cause": "allocation", "by_request_id": "x"})
    if kind == "phantom_hit":
        emit({"event": "block_hit", "block_id": lost + 1, "block_hash": 100 + lost,
              "position": lost, "request_id": "x"})
    gap_at = None
    if kind == "gap_in_step":
        gap_at = len(evs)
        evs.append({"event": "__dropped__"})
    step[0] += 1
    emit({"event": "request_arrived", "request_id": "z", "tenant": "ta",
          "num_prompt_tokens": 16})
    out = []
    seq = 0
    for ev in evs:
        if ev["event"] == "__dropped__":
            seq += 1           # this seq is dropped; the gap event below covers it
            continue
        out.append({"run_id": run_id, "seq": seq, "ts_ns": 1000 * (seq + 1), **ev})
        seq += 1
    if gap_at is not None:
        out.append({"run_id": run_id, "seq": seq, "ts_ns": 1000 * (seq + 1),
                    "event": "recorder_gap", "first_seq": gap_at, "last_seq": gap_at,
                    "events_dropped": 1})
    return out


case = st.tuples(st.sampled_from(sorted(FALSIFICATIONS)), st.integers(1, 4),
                 st.integers(0, 3), st.booleans(), st.integers(0, 3))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(case, min_size=1, max_size=8))
def test_no_falsified_transition_turns_harm_into_a_non_harm_without_a_finding(
        cases: list[tuple[str, int, int, bool, int]]) -> None:
    events: list[dict[str, Any]] = []
    want: dict[str, str] = {}
    for i, (kind, blocks, lost, stepped, noise) in enumerate(cases):
        rid = f"run-{i:02d}"
        # phantom hits and gaps inside a step need steps to be inside one
        stepped = stepped or kind in ("phantom_hit", "gap_in_step")
        events += falsified_run(rid, kind, blocks, min(lost, blocks - 1), stepped, noise)
        want[rid] = kind
    batches = [loader.decode_batch(b) for b in events_to_table(events).to_batches()]
    t = core.reconstruct(pa.Table.from_batches(batches, schema=loader.EVENTS_SCHEMA))
    labels = dict(t.con.sql("SELECT run_id, label FROM loss_claims").fetchall())
    kinds: dict[str, set[str]] = {}
    for rid, kind in t.con.sql("SELECT run_id, kind FROM findings").fetchall():
        kinds.setdefault(rid, set()).add(kind)
    for rid, kind in want.items():
        assert labels[rid] in ("harm", "unknown"), (rid, kind, labels[rid])
        assert FALSIFICATIONS[kind] in kinds.get(rid, set()), (rid, kind, kinds.get(rid))


@pytest.mark.parametrize("kind, label", [("demote_demotable", "relaxation"),
                                         ("expire_on_time", "expiry"),
                                         ("release_by_owner", "relaxation")])
def test_twin_the_legitimate_transition_ends_force_without_a_finding(kind: str,
                                                                    label: str) -> None:
    events = falsified_run("honest", kind, 2, 1, True, 0)
    batches = [loader.decode_batch(b) for b in events_to_table(events).to_batches()]
    t = core.reconstruct(pa.Table.from_batches(batches, schema=loader.EVENTS_SCHEMA))
    assert t.con.sql("SELECT label FROM loss_claims").fetchall() == [(label,)]
    kinds = {k for (k,) in t.con.sql("SELECT kind FROM findings").fetchall()}
    assert not kinds & set(FALSIFICATIONS.values())
