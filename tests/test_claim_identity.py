"""Claim identity (reconstruct/identity.py, docs/reconstruction.md "Claim instances"): which
instance each claim event joins, one behaviour each with its twin."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from kvclaims.reconstruct import core, loader
from kvclaims.sources.jsonl import events_to_table


def reconstructed(*events: tuple[Any, ...]) -> Any:
    """The reconstruction of one run: (event, claim_id[, other fields]) in seq order."""
    rows: list[dict[str, Any]] = [{"run_id": "r", "seq": 0, "ts_ns": 1, "event": "run_started"}]
    for i, (name, cid, *more) in enumerate(events, 1):
        rows.append({"run_id": "r", "seq": i, "ts_ns": 1000 * i, "event": name,
                     "claim_id": cid, "tenant": "t", **(more[0] if more else {})})
    batches = [loader.decode_batch(b) for b in events_to_table(rows).to_batches()]
    return core.reconstruct(pa.Table.from_batches(batches, schema=loader.EVENTS_SCHEMA))


def identity(*events: tuple[str, str]) -> tuple[dict[int, int], dict[int, tuple]]:
    """(event, claim_id) in seq order -> ({seq: claim_seq}, {sub_seq: (rejected, prev_live)})."""
    t = reconstructed(*events)
    seqs = dict(t.con.sql("SELECT seq, claim_seq FROM kv_claim_ev UNION ALL "
                          "SELECT seq, claim_seq FROM kv_claim_binds").fetchall())
    subs = {s: (r, p) for s, r, p in t.con.sql(
        "SELECT sub_seq, rejected_seq, prev_live_seq FROM kv_claim_subs").fetchall()}
    return seqs, subs


def bound(position: int) -> dict[str, int]:
    return {"position": position, "block_hash": 100 + position}


def test_a_rejected_resubmission_never_captures_the_ids_later_events() -> None:
    seqs, subs = identity(("claim_submitted", "c"), ("claim_accepted", "c"),
                          ("claim_submitted", "c"), ("claim_rejected", "c"),
                          ("claim_released", "c"))
    assert seqs == {1: 1, 2: 1, 3: 3, 4: 3, 5: 1}
    assert subs == {1: (None, None), 3: (4, 1)}


def test_an_accepted_resubmission_takes_the_ids_later_events() -> None:
    seqs, subs = identity(("claim_submitted", "c"), ("claim_accepted", "c"),
                          ("claim_submitted", "c"), ("claim_accepted", "c"),
                          ("claim_released", "c"))
    assert seqs == {1: 1, 2: 1, 3: 3, 4: 3, 5: 3}
    assert subs == {1: (None, None), 3: (None, 1)}


def test_events_of_an_id_before_any_submission_form_an_instance_of_their_own() -> None:
    seqs, subs = identity(("claim_accepted", "c"), ("claim_released", "c"),
                          ("claim_submitted", "c"), ("claim_released", "c"))
    assert seqs == {1: 1, 2: 1, 3: 3, 4: 3}
    assert subs == {3: (None, None)}


def test_ids_do_not_share_instances() -> None:
    seqs, _ = identity(("claim_submitted", "a"), ("claim_submitted", "b"),
                       ("claim_released", "a"), ("claim_released", "b"))
    assert seqs == {1: 1, 2: 2, 3: 1, 4: 2}


def test_bindings_join_their_instance_in_a_table_of_their_own() -> None:
    t = reconstructed(("claim_submitted", "c"), ("claim_bound", "c", bound(0)),
                      ("claim_bound", "c", bound(1)), ("claim_accepted", "c"))
    assert t.con.sql("SELECT seq, claim_seq, position FROM kv_claim_binds ORDER BY seq"
                     ).fetchall() == [(2, 1, 0), (3, 1, 1)]


def test_other_claim_events_stay_out_of_the_bindings_table() -> None:
    t = reconstructed(("claim_submitted", "c"), ("claim_bound", "c", bound(0)),
                      ("claim_accepted", "c"))
    assert t.con.sql("SELECT seq FROM kv_claim_ev ORDER BY seq").fetchall() == [(1,), (3,)]


def test_an_instance_with_only_bindings_keeps_its_positions() -> None:
    t = reconstructed(("claim_bound", "c", bound(0)), ("claim_bound", "c", bound(1)),
                      ("claim_bound", "c", bound(1)))
    assert t.con.sql("SELECT claim_seq, claim_id, positions_bound, max_position, n_slots "
                     "FROM kv_claim_facts").fetchall() == [(1, "c", 2, 1, 2)]


def test_an_instance_without_bindings_has_no_positions() -> None:
    t = reconstructed(("claim_submitted", "c"), ("claim_accepted", "c"))
    assert t.con.sql("SELECT claim_seq, claim_id, positions_bound, max_position, n_slots "
                     "FROM kv_claim_facts").fetchall() == [(1, "c", 0, None, 0)]
