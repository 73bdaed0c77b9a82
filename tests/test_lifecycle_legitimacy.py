"""Lifecycle legitimacy decides labels; evidence comes from the block timeline; claim identity
across tenants (docs/design.md §2, §5). One behaviour per rule, each with its negative twin.
Fixtures: kvclaims/sources/shapes.py -> tests/fixtures/*.jsonl."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pytest

import kvclaims
from kvclaims.explaining import explain
from kvclaims.sources.arbiter_traces import convert_file
from kvclaims.sources.jsonl import events_to_table
from kvclaims.reconstruct import core, labels, loader
from kvclaims.recorder.arbiter import ClaimArbiter
from kvclaims.recorder.claims import UNUSABLE_CLAIM_ID
from kvclaims.contract.policies import POLICIES

from tests.test_labels_rules import loss_labels, recon, rows

FIX = Path(__file__).parent / "fixtures"
DESIGN = Path(__file__).resolve().parent.parent / "docs" / "design.md"


def finding_kinds(t: core.Tables) -> set[str]:
    return {r[0] for r in rows(t, "SELECT kind FROM findings")}


def verdict(t: core.Tables, check: str) -> str:
    (v,), = rows(t, f"SELECT verdict FROM conformance WHERE \"check\" = '{check}'")
    return v


def outcome(t: core.Tables) -> str:
    (o,), = rows(t, "SELECT outcome FROM claims WHERE tenant = 'tenant-a'")
    return o


# -- 1. claim_demoted ends force only for a demotable instance ---------------------------------

def test_demoting_a_hard_claim_leaves_it_in_force_its_loss_is_harm() -> None:
    t = recon("lifecycle_demoted_hard")
    assert loss_labels(t) == ["harm"]
    assert outcome(t) == "harmed"
    assert rows(t, "SELECT severity FROM findings WHERE kind = 'demoted_not_demotable'") == [
        ("violation",)]
    assert verdict(t, "L4") == "fail"


def test_twin_demoting_a_demotable_claim_is_relaxation() -> None:
    t = recon("lifecycle_demoted_demotable")
    assert loss_labels(t) == ["relaxation"]
    assert outcome(t) == "demoted"
    assert "demoted_not_demotable" not in finding_kinds(t)


# -- 2. claim_expired ends force only for an expiring instance, once its ttl_s elapsed ---------

@pytest.mark.parametrize("case, rule", [("expired_hard", "expired_not_expiring"),
                                        ("expired_no_ttl", "expired_without_ttl"),
                                        ("expired_early", "expired_before_ttl")])
def test_illegitimate_expiry_leaves_the_claim_in_force_its_loss_is_harm(case: str,
                                                                        rule: str) -> None:
    t = recon(f"lifecycle_{case}")
    assert loss_labels(t) == ["harm"]
    assert rows(t, f"SELECT severity FROM findings WHERE kind = '{rule}'") == [("violation",)]
    assert verdict(t, "L5") == "fail"


def test_twin_expiry_after_ttl_of_an_expiring_claim_is_expiry() -> None:
    t = recon("lifecycle_expired_on_time")
    assert loss_labels(t) == ["expiry"]
    assert outcome(t) == "expired"
    assert verdict(t, "L5") == "pass"


# -- 3. claim_released ends force only when the operator or the claim's own tenant asked ------

@pytest.mark.parametrize("case, rule", [("released_other_tenant", "released_not_by_owner"),
                                        ("released_arbiter", "released_by_arbiter")])
def test_release_not_by_owner_leaves_the_claim_in_force_its_loss_is_harm(case: str,
                                                                         rule: str) -> None:
    t = recon(f"lifecycle_{case}")
    assert loss_labels(t) == ["harm"]
    assert rows(t, f"SELECT severity FROM findings WHERE kind = '{rule}'") == [("violation",)]
    assert verdict(t, "INV_release_by_owner") == "fail"


@pytest.mark.parametrize("case", ["released_own_tenant", "released_operator"])
def test_twin_release_by_owner_or_operator_is_relaxation(case: str) -> None:
    t = recon(f"lifecycle_{case}")
    assert loss_labels(t) == ["relaxation"]
    assert outcome(t) == "released"
    assert verdict(t, "INV_release_by_owner") == "pass"


def test_release_by_owner_check_is_not_exercised_without_a_release() -> None:
    assert verdict(recon("lifecycle_demoted_demotable"), "INV_release_by_owner") == \
        "not_exercised"


# -- 4. a demotion must make room for the request it names -------------------------------------

def test_demotion_for_a_request_that_fit_anyway_is_unjustified_and_fails_l4() -> None:
    t = recon("demotion_not_needed")
    assert rows(t, "SELECT severity FROM findings WHERE kind = 'demotion_unjustified'") == [
        ("violation",)]
    assert verdict(t, "L4") == "fail"
    assert loss_labels(t) == ["relaxation"]     # legitimate for labels: the mode allows it


def test_twin_demotion_for_a_request_that_needed_the_blocks_is_justified() -> None:
    t = recon("demotion_needed")
    assert "demotion_unjustified" not in finding_kinds(t)
    assert verdict(t, "L4") == "pass"


def test_demotion_naming_no_admitted_request_is_unjustified() -> None:
    # by_request_id "x" is never decided in this trace
    assert "demotion_unjustified" in finding_kinds(recon("lifecycle_demoted_demotable"))


# -- 5. evidence comes from the block timeline -------------------------------------------------

def test_hit_on_an_evicted_block_repairs_nothing_the_loss_is_harm() -> None:
    t = recon("phantom_hit")
    assert loss_labels(t) == ["harm"]
    assert rows(t, "SELECT repaired_in_step FROM losses") == [(False,)]
    assert rows(t, "SELECT severity FROM findings WHERE kind = 'hit_not_resident'") == [
        ("disagreement",)]
    assert verdict(t, "L7") == "fail"


def test_twin_content_cached_again_within_the_step_is_a_repair() -> None:
    t = recon("real_repair")
    assert loss_labels(t) == ["eviction"]
    assert rows(t, "SELECT repaired_in_step FROM losses") == [(True,)]
    assert "hit_not_resident" not in finding_kinds(t)


def test_loss_in_a_step_the_recorder_gap_falls_in_is_unknown() -> None:
    t = recon("gap_in_step")
    assert loss_labels(t) == ["unknown"]


def test_twin_gap_in_a_later_step_leaves_the_loss_harm() -> None:
    assert loss_labels(recon("gap_next_step")) == ["harm"]


# -- 6. claim identity across tenants (issue 26) -----------------------------------------------

def test_rejected_reuse_of_an_id_by_another_tenant_never_captures_the_owners_events() -> None:
    t = recon("claim_id_reuse")
    by_tenant = dict(rows(t, "SELECT tenant, outcome FROM claims"))
    assert by_tenant == {"tenant-a": "released", "tenant-b": "rejected"}
    assert rows(t, "SELECT l.label, c.tenant FROM loss_claims l JOIN claims c "
                   "USING (run_id, claim_seq)") == [("relaxation", "tenant-a")]
    (rel_tenant,), = rows(t, "SELECT c.tenant FROM kv_claim_ev e JOIN claims c "
                             "USING (run_id, claim_seq) WHERE e.event = 'claim_released'")
    assert rel_tenant == "tenant-a"
    assert not finding_kinds(t) & {"released_not_by_owner", "protected_block_lost"}


def test_twin_without_the_other_tenants_submission_the_owner_outcome_is_the_same() -> None:
    t = recon("claim_id_single")
    assert dict(rows(t, "SELECT tenant, outcome FROM claims")) == {"tenant-a": "released"}
    assert loss_labels(t) == ["relaxation"]


def _timeline_seqs(fixture: str, tenant: str) -> list[int]:
    """The seqs on ``tenant``'s claim timelines in the explanation of ``fixture``."""
    with kvclaims.open([FIX / f"{fixture}.jsonl"]) as audit:
        sections = explain(audit, tenant).sections
    return [m.seq for s in sections if s.kind == "claim" for m in s.timeline]


def test_the_other_tenants_explanation_shows_only_its_own_rejected_submission() -> None:
    t = recon("claim_id_reuse")
    (release,), = rows(t, "SELECT seq FROM events WHERE event = 'claim_released'")
    subs = [s for (s,) in rows(t, "SELECT seq FROM events WHERE event IN "
                                  "('claim_submitted', 'claim_rejected') AND tenant IS "
                                  "DISTINCT FROM 'tenant-a' ORDER BY seq")]
    assert _timeline_seqs("claim_id_reuse", "tenant-b") == subs[-2:]
    assert release not in _timeline_seqs("claim_id_reuse", "tenant-b")


def test_twin_the_owner_explanation_keeps_its_release() -> None:
    t = recon("claim_id_reuse")
    (release,), = rows(t, "SELECT seq FROM events WHERE event = 'claim_released'")
    assert release in _timeline_seqs("claim_id_reuse", "tenant-a")


def _rejections(second: dict) -> list[str]:
    """The rejection reasons when tenant-a declares claim "c", then tenant-b ``second``."""
    events: list[tuple[str, dict]] = []
    arb = ClaimArbiter(POLICIES["native"], 10, lambda e, **f: events.append((e, f)),
                       pin=lambda bs: None, unpin=lambda bs: None)
    arb.on_request("a1", {"claim_id": "c", "tenant": "tenant-a"}, [], [b"a"])
    arb.on_request("b1", {"tenant": "tenant-b", **second}, [], [b"a"])
    return [f["reason"] for e, f in events if e == "claim_rejected"]


def test_rejection_of_an_id_in_force_reads_like_any_unusable_id() -> None:
    assert _rejections({"claim_id": "c"}) == [UNUSABLE_CLAIM_ID]


def test_twin_a_malformed_id_gets_the_very_same_reason() -> None:
    assert _rejections({"claim_id": ""}) == [UNUSABLE_CLAIM_ID]


# -- 7. a format that records no TTL keeps the runtime's reading, marked unverified ------------

def _prototype(kind: str) -> core.Tables:
    events = list(convert_file(Path(__file__).resolve().parent.parent / "traces"
                               / "arbiter-prototype" / f"{kind}.jsonl"))
    batches = [loader.decode_batch(b) for b in events_to_table(events).to_batches()]
    return core.reconstruct(pa.Table.from_batches(batches, schema=loader.EVENTS_SCHEMA))


def test_prototype_expiry_without_ttl_keeps_its_labels_marked_unverified() -> None:
    t = _prototype("expire")
    assert "harm" not in loss_labels(t) and "expiry" in loss_labels(t)
    assert rows(t, "SELECT severity FROM findings WHERE kind = 'lifecycle_unverified'") == [
        ("anomaly",)]


def test_twin_our_own_format_expiry_without_ttl_is_illegitimate() -> None:
    t = recon("lifecycle_expired_no_ttl")
    assert "lifecycle_unverified" not in finding_kinds(t)
    assert "expired_without_ttl" in finding_kinds(t)


# -- 8. one rule table: docs/design.md §5 states the code's rules ------------------------------

def _design_table(heading: str) -> list[tuple[str, ...]]:
    """The rows of the first Markdown table after ``heading`` in docs/design.md."""
    text = DESIGN.read_text(encoding="utf-8")
    start = text.index(heading)
    out = []
    for line in text[start:].splitlines()[1:]:
        if line.startswith("|"):
            cells = tuple(c.strip() for c in line.strip().strip("|").split("|"))
            if not set(cells[0]) <= set("-: "):
                out.append(cells)
        elif out:
            break
    return out[1:]   # without the header row


def test_design_label_rule_table_is_the_codes_rule_table() -> None:
    assert _design_table("**Label rules**") == [
        (str(n), cond, lab) for n, cond, lab in labels.LABEL_RULES]


def test_design_lifecycle_table_is_the_codes_lifecycle_rules() -> None:
    assert _design_table("**Lifecycle legitimacy**") == [
        (ev, allowed, finding) for ev, allowed, finding in labels.LIFECYCLE_RULES]


def test_lifecycle_rule_kinds_are_the_findings_the_sql_names() -> None:
    sql = (Path(core.__file__).parent / "sql" / "02_claims.sql").read_text()
    named = set(re.findall(r"\{finding\.((?:demoted|expired|released)_[a-z_]+)\}", sql))
    in_table = {k for _, _, kinds in labels.LIFECYCLE_RULES for k in kinds.split(", ")}
    assert named == in_table


# -- 9. label-side litmus: soft order, thresholded value, materialization failure -------------

def test_soft_claim_lost_while_lower_priority_content_was_evictable_fails_soft_order() -> None:
    t = recon("soft_lower_evictable_enforced")
    assert loss_labels(t) == ["harm"]
    assert verdict(t, "LIT_soft_order") == "fail"


def test_twin_soft_claim_lost_with_nothing_lower_to_evict_passes_soft_order() -> None:
    t = recon("soft_no_lower_enforced")
    assert loss_labels(t) == ["eviction"]
    assert verdict(t, "LIT_soft_order") == "pass"


def test_soft_order_is_not_exercised_where_no_policy_enforces_it() -> None:
    assert verdict(recon("soft_lower_evictable"), "LIT_soft_order") == "not_exercised"


def test_value_follows_the_leading_prefix_not_the_block_count() -> None:
    # threshold 2 of 3: losing position 2 keeps the value; losing position 0 loses all of it
    t = recon("threshold")
    assert verdict(t, "LIT_thresholded_value") == "pass"
    assert rows(t, "SELECT outcome, value_lost = value FROM claims") == [("harmed", True)]


def test_twin_a_reconstruction_that_counted_surviving_blocks_fails_thresholded_value() -> None:
    t = recon("threshold")
    t.con.execute("UPDATE claims SET value_lost = value / 3")   # 2 of 3 blocks survive
    for stmt in core.split_statements(core.stage_sql("08_conformance.sql")):
        t.con.execute(stmt)
    assert verdict(t, "LIT_thresholded_value") == "fail"


def test_claim_never_materialized_and_reported_so_passes_materialization_failure() -> None:
    t = recon("never_materialized")
    assert verdict(t, "LIT_materialization_failure") == "pass"


def test_twin_runtime_reporting_materialization_by_block_count_fails_it() -> None:
    t = recon("l6_position_zero_reported")
    assert verdict(t, "LIT_materialization_failure") == "fail"


# -- 10. a release in a format without released_by ---------------------------------------------

def _release_without_releaser(schema_version: int) -> core.Tables:
    """lifecycle_released_operator with released_by removed, in a run of ``schema_version``."""
    events = [json.loads(line) for line in
              (FIX / "lifecycle_released_operator.jsonl").read_text().splitlines()]
    for e in events:
        e.pop("released_by", None)
        if e["event"] == "run_started":
            e["schema_version"] = schema_version
    batches = [loader.decode_batch(b) for b in events_to_table(events).to_batches()]
    return core.reconstruct(pa.Table.from_batches(batches, schema=loader.EVENTS_SCHEMA))


def test_schema_one_release_without_releaser_is_kept_unverified() -> None:
    t = _release_without_releaser(1)
    assert loss_labels(t) == ["relaxation"]
    assert "lifecycle_unverified" in finding_kinds(t)
    assert verdict(t, "INV_release_by_owner") == "not_exercised"   # nothing it can verify


def test_twin_schema_two_release_without_releaser_is_illegitimate() -> None:
    t = _release_without_releaser(2)
    assert loss_labels(t) == ["harm"]
    assert "released_by_unknown" in finding_kinds(t)
    assert verdict(t, "INV_release_by_owner") == "fail"
