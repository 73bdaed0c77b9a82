"""Lowering verdicts (docs/conformance.md "Lowering verdicts"; seed 004): the class each
protection mode's evidence in the run supports, fail-closed, with what the manifest declares
beside it (the runtime's claim, never the verdict). Each rule with its negative twin."""

from __future__ import annotations

from kvclaims.sources import shapes
from kvclaims.reconstruct.checks import LOWERING_CLASSES
from kvclaims.contract.vocabulary import PROTECTION_MODES
from tests import feasibility_shapes as fs
from tests import verdict_shapes as vs

CLASSES = {c.name for c in LOWERING_CLASSES}


def lowering(events: vs.Events, manifest: dict | None = None) -> dict[str, tuple]:
    t = vs.reconstruct_events(events, manifest)
    rows = t.con.sql("SELECT mode, verdict, evidence, source, declared, declared_in_vocabulary "
                     "FROM lowering").fetchall()
    return {m: tuple(r) for m, *r in rows}


def findings(events: vs.Events, manifest: dict | None, kind: str) -> list[tuple]:
    t = vs.reconstruct_events(events, manifest)
    return t.con.sql("SELECT severity, detail FROM findings WHERE kind = $k",
                     params={"k": kind}).fetchall()


def test_every_mode_gets_a_class_of_seed_004_with_evidence() -> None:
    low = lowering(shapes.capacity_probe("hard", policy="hard_protected",
                                         claim_mode="hard_protected"))
    assert set(low) == set(PROTECTION_MODES)
    assert all(v in CLASSES and e and s == "evidence" for v, e, s, *_ in low.values())


def test_a_hard_claim_that_met_pressure_and_kept_its_blocks_is_adapter_policy_evidence() -> None:
    low = lowering(shapes.capacity_probe("hard", policy="hard_protected",
                                         claim_mode="hard_protected"))
    assert low["hard_protected"][0] == "adapter-policy evidence"
    assert low["best_effort"][0] == "adapter-observational evidence"


def test_an_enforced_mode_no_claim_pressed_is_unknown_evidence_not_kept() -> None:
    low = lowering(shapes.capacity_probe("hard-130", policy="hard_protected", usable=130,
                                         claim_mode="hard_protected"))
    assert low["hard_protected"][0] == "unknown evidence"
    assert "no claim of the mode met pressure" in low["hard_protected"][1]


def test_a_policy_that_enforces_nothing_is_observational_evidence() -> None:
    low = lowering(shapes.capacity_probe("native", claim_mode="hard_protected"))
    assert low["hard_protected"][0] == "adapter-observational evidence"
    assert "enforces no claim" in low["hard_protected"][1]


def test_offloadable_rejected_at_submission_is_a_rejected_mapping_with_its_reason() -> None:
    verdict, evidence, *_ = lowering(vs.offloadable_claim(rejected=True))["offloadable"]
    assert verdict == "rejected mapping" and "offload tier" in evidence


def test_offloadable_accepted_is_observational_a_promise_nothing_keeps() -> None:
    verdict, evidence, *_ = lowering(vs.offloadable_claim(rejected=False))["offloadable"]
    assert verdict == "adapter-observational evidence" and "not implemented" in evidence


def test_a_declared_enforced_mode_whose_promise_was_broken_is_a_rejected_mapping() -> None:
    low = lowering(fs.hard_loss(claims_block=True), fs.manifest_lowering("enforced"))
    verdict, evidence, _s, declared, valid = low["hard_protected"]
    assert (verdict, declared, valid) == ("rejected mapping", "adapter-policy evidence", True)
    assert "promise was broken" in evidence


def test_a_declared_enforced_mode_whose_promise_held_is_not_a_rejected_mapping() -> None:
    low = lowering(fs.hard_loss(claims_block=False), fs.manifest_lowering("enforced"))
    assert low["hard_protected"][0] != "rejected mapping"


def test_a_broken_promise_declared_enforced_is_a_disagreement_failing_l_lowering() -> None:
    events, manifest = fs.hard_loss(claims_block=True), fs.manifest_lowering("enforced")
    assert [s for s, _ in findings(events, manifest, "lowering_claim_unsupported")] == [
        "disagreement"]
    assert vs.verdicts(vs.reconstruct_events(events, manifest))["L_lowering"][0] == "fail"


def test_a_declaration_the_evidence_supports_passes_l_lowering() -> None:
    events = shapes.capacity_probe("hard", policy="hard_protected", claim_mode="hard_protected")
    manifest = fs.manifest_lowering("enforced")
    assert findings(events, manifest, "lowering_claim_unsupported") == []
    assert vs.verdicts(vs.reconstruct_events(events, manifest))["L_lowering"][0] == "pass"


def test_a_value_outside_the_vocabulary_is_a_finding_never_a_verdict() -> None:
    events = fs.hard_loss(claims_block=False)
    low = lowering(events, fs.manifest_lowering("totally enforced!!"))
    verdict, _e, _s, declared, valid = low["hard_protected"]
    assert verdict in CLASSES and declared is None and valid is False
    rows = findings(events, fs.manifest_lowering("totally enforced!!"), "lowering_value_unknown")
    assert len(rows) == 1 and "totally" not in rows[0][1]


def test_a_value_in_the_vocabulary_is_no_finding() -> None:
    assert findings(fs.hard_loss(claims_block=False), fs.manifest_lowering("enforced"),
                    "lowering_value_unknown") == []


def test_without_a_lowering_section_l_lowering_is_not_exercised() -> None:
    t = vs.reconstruct_events(fs.hard_loss(claims_block=True))
    assert vs.verdicts(t)["L_lowering"][0] == "not_exercised"
