"""Lowering verdicts (docs/conformance.md "Lowering"; issue 8 item 3): what the runtime does
with each protection mode, from the manifest when it says, else derived with evidence."""

from __future__ import annotations

from kvclaims.sources import shapes
from kvclaims.contract.vocabulary import PROTECTION_MODES
from tests import verdict_shapes as vs


def lowering(events: vs.Events, manifest: dict | None = None) -> dict[str, tuple[str, str, str]]:
    t = vs.reconstruct_events(events, manifest)
    rows = t.con.sql("SELECT mode, verdict, evidence, source FROM lowering").fetchall()
    return {m: (v, e, s) for m, v, e, s in rows}


def test_every_mode_gets_a_lowering_verdict_with_evidence() -> None:
    low = lowering(shapes.capacity_probe("hard", policy="hard_protected",
                                         claim_mode="hard_protected"))
    assert set(low) == set(PROTECTION_MODES)
    assert all(v in ("enforced", "approximated", "rejected", "recorded only") and e
               for v, e, _ in low.values())


def test_an_enforcing_policy_enforces_pinning_modes_and_records_best_effort() -> None:
    low = lowering(shapes.capacity_probe("hard", policy="hard_protected",
                                         claim_mode="hard_protected"))
    assert low["hard_protected"][:1] == ("enforced",) and low["hard_protected"][2] == "policy"
    assert low["best_effort"][0] == "recorded only"


def test_a_policy_that_enforces_nothing_records_every_mode_only() -> None:
    low = lowering(shapes.capacity_probe("native", claim_mode="hard_protected"))
    assert low["hard_protected"][0] == "recorded only"
    assert "enforces no claim" in low["hard_protected"][1]


def test_offloadable_rejected_at_submission_is_rejected_with_the_rejection_as_evidence() -> None:
    verdict, evidence, _ = lowering(vs.offloadable_claim(rejected=True))["offloadable"]
    assert verdict == "rejected" and "offload tier" in evidence


def test_offloadable_accepted_is_recorded_only_a_promise_nothing_keeps() -> None:
    verdict, evidence, _ = lowering(vs.offloadable_claim(rejected=False))["offloadable"]
    assert verdict == "recorded only" and "not implemented" in evidence


def test_the_manifests_lowering_section_wins_and_says_so() -> None:
    manifest = {"lowering": {"soft_priority": {"verdict": "approximated",
                                               "evidence": "LRU order among claims only"}}}
    low = lowering(shapes.capacity_probe("hard", policy="hard_protected",
                                         claim_mode="hard_protected"), manifest)
    assert low["soft_priority"] == ("approximated", "LRU order among claims only", "manifest")
    assert low["hard_protected"][2] == "policy"


def test_a_malformed_lowering_section_falls_back_to_the_policy() -> None:
    low = lowering(shapes.capacity_probe("hard", policy="hard_protected",
                                         claim_mode="hard_protected"),
                   {"lowering": {"soft_priority": "approximated"}})
    assert low["soft_priority"][2] == "policy"
