"""Findings added by issue 8 (docs/conformance.md "Findings"): rebuilt vs runtime
feasibility, fail-open hook failures, refused releases. Each with its negative twin."""

from __future__ import annotations

from kvclaims.sources import shapes
from tests import verdict_shapes as vs


def findings(events: vs.Events, kind: str) -> list[tuple]:
    t = vs.reconstruct_events(events)
    return t.con.sql("SELECT severity, seq, claim_id, claim_seq, request_id, detail "
                     "FROM findings WHERE kind = $k ORDER BY seq", params={"k": kind}).fetchall()


def test_runtime_feasibility_that_disagrees_with_the_trace_is_a_finding_with_both_figures() -> None:
    # native: the runtime protects nothing and reports protected 0; the trace shows the
    # in-force claim's 60 resident blocks at the active request's admission
    rows = findings(shapes.capacity_probe("native-claim", claim_mode="hard_protected"),
                    "feasibility_disagreement")
    # NOTE: info, not disagreement: native enforces no claim, so the difference is expected
    assert [(r[0], r[4]) for r in rows] == [("info", "active")]
    assert "protected 60 + live 0 + required 70 (feasible: false)" in rows[0][5]
    assert "reported protected 0 + required 70 (feasible: true)" in rows[0][5]


def test_runtime_feasibility_that_agrees_with_the_trace_is_no_finding() -> None:
    assert findings(shapes.capacity_probe("hard-130", policy="hard_protected", usable=130,
                                          claim_mode="hard_protected"),
                    "feasibility_disagreement") == []


def test_a_hook_failure_is_a_finding_naming_the_hook_and_unknown_enforcement() -> None:
    rows = findings(vs.hard_with_hook_failure("start"), "hook_failed")
    assert len(rows) == 1
    severity, _seq, _c, _cs, _r, detail = rows[0]
    assert severity == "hole"
    assert "scheduler.schedule" in detail and "RuntimeError" in detail
    assert "unknown" in detail


def test_no_hook_failure_no_finding() -> None:
    assert findings(vs.hard_with_hook_failure(None), "hook_failed") == []


def test_a_refused_release_is_a_security_finding_naming_the_instance() -> None:
    t = vs.reconstruct_events(vs.release_refused())
    (claim_seq,), = t.con.sql("SELECT claim_seq FROM claims").fetchall()
    rows = t.con.sql("SELECT severity, claim_id, claim_seq, detail FROM findings "
                     "WHERE kind = 'claim_release_refused'").fetchall()
    assert [r[:3] for r in rows] == [("security", vs.CLAIM, claim_seq)]
    assert "tenant tenant-b" in rows[0][3]


def test_no_refused_release_no_security_finding() -> None:
    assert findings(vs.release_refused(refused=False), "claim_release_refused") == []


def test_a_violation_after_a_hook_failure_names_the_hook() -> None:
    [(_sev, _seq, _c, _cs, _r, detail)] = findings(
        vs.refusal_around_hook(hook_first=True), "refusal_without_blocking_claim")
    assert "after hook arbiter.admit failed" in detail


def test_a_violation_before_a_hook_failure_does_not_name_it() -> None:
    [(_sev, _seq, _c, _cs, _r, detail)] = findings(
        vs.refusal_around_hook(hook_first=False), "refusal_without_blocking_claim")
    assert "hook" not in detail
