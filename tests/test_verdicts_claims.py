"""Claim instances, who released a claim, refused releases, preemption attribution
(docs/conformance.md; issue 8 items 1, 5, 8). Each rule with its negative twin."""

from __future__ import annotations

import pytest

from tests import verdict_shapes as vs


def claim_rows(events: vs.Events, cols: str) -> list[tuple]:
    t = vs.reconstruct_events(events)
    return t.con.sql(f"SELECT {cols} FROM claims ORDER BY claim_seq").fetchall()


@pytest.mark.parametrize("end,first_outcome", [
    ("claim_released", "released"), ("claim_expired", "expired"),
    ("claim_demoted", "demoted"), ("claim_rejected", "rejected")])
def test_a_claim_declared_again_is_a_second_instance_and_its_harm_is_harm(
        end: str, first_outcome: str) -> None:
    rows = claim_rows(vs.reused_after_release(end=end), "claim_id, claim_seq, outcome")
    assert [r[0] for r in rows] == [vs.CLAIM, vs.CLAIM]
    assert rows[0][1] < rows[1][1]
    assert [r[2] for r in rows] == [first_outcome, "harmed"]


def test_without_a_second_declaration_the_loss_after_release_is_relaxation() -> None:
    rows = claim_rows(vs.reused_after_release(second_submit=False),
                      "outcome, blocks_lost_relaxation")
    assert rows == [("released", 1)]


def test_findings_name_the_harmed_instance() -> None:
    events = vs.reused_after_release()
    t = vs.reconstruct_events(events)
    (second,), = t.con.sql("SELECT max(claim_seq) FROM claims").fetchall()
    named = t.con.sql("SELECT claim_id, claim_seq FROM findings "
                      "WHERE kind = 'harm_not_reported'").fetchall()
    assert named == [(vs.CLAIM, second)]


def test_released_by_names_who_ended_the_claim() -> None:
    assert claim_rows(vs.released_by("tenant"), "released_by") == [("tenant",)]
    assert claim_rows(vs.released_by("operator"), "released_by") == [("operator",)]


def test_a_demotion_is_the_arbiters_release() -> None:
    assert claim_rows(vs.released_by(None), "release_event, released_by") == [
        ("claim_demoted", "arbiter")]


def test_refused_release_attempts_are_counted_on_the_claim() -> None:
    rows = claim_rows(vs.release_refused(), "release_refusals, len(release_refused_seqs), outcome")
    # the refused release leaves the claim in force: still preserved at the end of the run
    assert rows == [(1, 1, "preserved")]


def test_no_refused_release_counts_zero() -> None:
    assert claim_rows(vs.release_refused(refused=False), "release_refusals") == [(0,)]


def test_preemption_carries_the_pinned_blocks_and_the_claims_holding_them() -> None:
    t = vs.reconstruct_events(vs.preempted_by_pinned())
    (claim_seq,), = t.con.sql("SELECT claim_seq FROM claims").fetchall()
    row = t.con.sql("SELECT outcome, preempted_protected_blocks, preempted_free_blocks, "
                    "preempted_blocking_claim_ids, preempted_blocking_claim_seqs "
                    "FROM requests WHERE request_id = 'grow'").fetchall()
    assert row == [("preempted", 6, 0, [vs.CLAIM], [claim_seq])]


def test_preemption_without_attribution_leaves_the_runtimes_figures_unknown() -> None:
    # the protected blocks are rebuilt from the timeline (6), whatever the runtime reported
    # (here nothing): its own figure and its blocking claims stay unknown
    t = vs.reconstruct_events(vs.preempted_by_pinned(attributed=False))
    row = t.con.sql("SELECT outcome, preempted_protected_blocks, "
                    "runtime_preempted_protected_blocks, preempted_blocking_claim_seqs "
                    "FROM requests WHERE request_id = 'grow'").fetchall()
    assert row == [("preempted", 6, None, None)]
