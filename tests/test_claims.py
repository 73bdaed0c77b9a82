"""Claim declarations (recorder/claims.py) and the arbiter's pure decisions, without vLLM."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from kvclaims.recorder.arbiter import ClaimArbiter
from kvclaims.recorder.claims import ClaimDeclaration, Rejection, parse_claim, raw_claim, release_ids
from kvclaims.contract.policies import POLICIES


def test_nested_claim_is_read_from_extra_args():
    assert raw_claim({"kv_claim": {"claim_id": "c"}}) == {"claim_id": "c"}


def test_json_string_claim_is_read_from_extra_args():
    assert raw_claim({"kv_claim": json.dumps({"claim_id": "c", "tenant": "t"})}) == \
        {"claim_id": "c", "tenant": "t"}


def test_flat_http_keys_are_read_from_extra_args():
    assert raw_claim({"kv_claim_id": "c", "kv_claim_mode": "demotable",
                      "kv_claim_threshold_blocks": 3}) == \
        {"claim_id": "c", "protection_mode": "demotable", "threshold_blocks": 3}


def test_request_without_claim_declares_nothing():
    assert raw_claim({"other": 1}) is None and raw_claim(None) is None


def test_malformed_json_claim_is_rejected_not_raised():
    parsed = parse_claim(raw_claim({"kv_claim": "{not json"}), "r1", 4)
    assert isinstance(parsed, Rejection) and "not valid JSON" in parsed.reason


def test_valid_claim_parses_with_defaults():
    parsed = parse_claim({"claim_id": "c"}, "r1", 4)
    assert parsed == ClaimDeclaration("c", None, None, None, None, 1.0)


@pytest.mark.parametrize("raw, reason", [
    ({"claim_id": "c", "protection_mode": "forever"}, "unknown protection_mode"),
    ({"claim_id": "c", "threshold_blocks": 5}, "larger than the prefix"),
    ({"claim_id": "c", "threshold_blocks": "3"}, "must be an integer"),
    ({"claim_id": "c", "threshold_blocks": True}, "must be an integer"),
    ({"claim_id": "c", "ttl_s": -1}, "ttl_s must be a positive number"),
    ({"claim_id": "c", "protection_mode": "expiring"}, "needs ttl_s"),
    ({"claim_id": "c", "value": "high"}, "value must be"),
    ({"claim_id": "c", "colour": "red"}, "unknown claim field"),
    ({"claim_id": ""}, "claim_id must be a non-empty string"),
    ({"tenant": 3, "claim_id": "c"}, "tenant must be a string"),
])
def test_invalid_declaration_is_rejected_with_reason(raw, reason):
    parsed = parse_claim(raw, "r1", 4)
    assert isinstance(parsed, Rejection) and reason in parsed.reason


def test_rejection_without_claim_id_gets_a_synthesised_id():
    assert parse_claim({"tenant": "t"}, "r9", 4).claim_id == "claim:r9"


def test_release_accepts_one_id_or_a_list():
    assert release_ids({"kv_claim_release": "a"}) == ["a"]
    assert release_ids({"kv_claim_release": ["a", "b"]}) == ["a", "b"]
    assert release_ids({}) == []


# --- the arbiter's decisions, on plain blocks -------------------------------------------------

@dataclass(frozen=True)
class Block:
    block_id: int


class Recorded:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict]] = []
        self.pinned: list[int] = []
        self.unpinned: list[int] = []

    def emit(self, event: str, **fields) -> None:
        self.events.append((event, fields))

    def names(self) -> list[str]:
        return [e for e, _ in self.events if e != "claim_bound"]


def arbiter(policy: str, usable: int = 10) -> tuple[ClaimArbiter, Recorded]:
    rec = Recorded()
    arb = ClaimArbiter(POLICIES[policy], usable, rec.emit,
                       pin=lambda bs: rec.pinned.extend(b.block_id for b in bs),
                       unpin=lambda bs: rec.unpinned.extend(b.block_id for b in bs))
    return arb, rec


def cache(arb: ClaimArbiter, hashes: list[bytes], first_block: int) -> None:
    for i, h in enumerate(hashes):
        arb.on_resident(Block(first_block + i), h)


def test_enforcing_policy_pins_a_hard_claims_blocks():
    arb, rec = arbiter("hard_protected")
    arb.on_request("r", {"claim_id": "c"}, [], [b"a", b"b"])
    cache(arb, [b"a", b"b"], 1)
    assert rec.pinned == [1, 2] and arb.protected_blocks == 2


def test_native_policy_pins_nothing():
    arb, rec = arbiter("native")
    arb.on_request("r", {"claim_id": "c"}, [], [b"a", b"b"])
    cache(arb, [b"a", b"b"], 1)
    assert rec.pinned == [] and arb.protected_blocks == 0


def test_claim_materializes_when_its_leading_prefix_is_resident():
    arb, rec = arbiter("native")
    arb.on_request("r", {"claim_id": "c", "threshold_blocks": 1}, [], [b"a", b"b"])
    cache(arb, [b"a"], 1)
    assert "claim_materialized" in rec.names()


def test_claim_does_not_materialize_without_position_zero():
    arb, rec = arbiter("native")
    arb.on_request("r", {"claim_id": "c"}, [], [b"a", b"b"])
    cache(arb, [b"b"], 2)
    assert "claim_materialized" not in rec.names()


def test_infeasible_request_is_deferred_then_refused():
    arb, rec = arbiter("hard_protected", usable=10)
    arb.on_request("r", {"claim_id": "c"}, [], [b"a", b"b", b"c", b"d"])
    cache(arb, [b"a", b"b", b"c", b"d"], 1)
    first, second = arb.admit("big", 7, 6), arb.admit("big", 7, 6)
    assert (first.action, second.action) == ("defer", "refuse")
    assert second.fields["shortfall_blocks"] == 1 and second.fields["blocking_claim_ids"] == ["c"]


def test_feasible_request_is_admitted():
    arb, _ = arbiter("hard_protected", usable=10)
    arb.on_request("r", {"claim_id": "c"}, [], [b"a", b"b", b"c", b"d"])
    cache(arb, [b"a", b"b", b"c", b"d"], 1)
    assert arb.admit("fits", 6, 6).action == "admit"


def test_demotion_releases_the_lowest_value_claim_that_suffices():
    arb, rec = arbiter("demote_on_conflict", usable=10)
    arb.on_request("r1", {"claim_id": "hi", "value": 2.0}, [], [b"a", b"b", b"c"])
    arb.on_request("r2", {"claim_id": "lo", "value": 0.5}, [], [b"x", b"y", b"z"])
    cache(arb, [b"a", b"b", b"c"], 1)
    cache(arb, [b"x", b"y", b"z"], 4)
    assert arb.admit("big", 6, 4).action == "admit"
    assert [f["claim_id"] for e, f in rec.events if e == "claim_demoted"] == ["lo"]
    assert rec.unpinned == [6, 5, 4]  # tail first


def test_demotion_is_skipped_when_it_cannot_make_room():
    arb, rec = arbiter("demote_on_conflict", usable=10)
    arb.on_request("r1", {"claim_id": "lo", "value": 0.5}, [], [b"a", b"b"])
    arb.on_request("r2", {"claim_id": "hard", "protection_mode": "hard_protected"}, [],
                   [b"x", b"y", b"z", b"w"])
    cache(arb, [b"a", b"b"], 1)
    cache(arb, [b"x", b"y", b"z", b"w"], 3)
    assert arb.admit("big", 9, 4).action == "defer"
    assert "claim_demoted" not in rec.names()


def test_expiry_releases_the_claim_on_the_engine_clock():
    now = [0.0]
    rec = Recorded()
    arb = ClaimArbiter(POLICIES["ttl_expiry"], 10, rec.emit, pin=lambda b: None,
                       unpin=lambda b: None, clock=lambda: now[0])
    arb.on_request("r", {"claim_id": "c", "ttl_s": 2.0}, [], [b"a"])
    arb.tick()
    before = "claim_expired" in rec.names()
    now[0] = 2.5
    arb.tick()
    assert not before and "claim_expired" in rec.names()


def test_loss_breaking_a_materialized_claim_is_reported_once():
    arb, rec = arbiter("native")
    arb.on_request("r", {"claim_id": "c"}, [], [b"a", b"b"])
    cache(arb, [b"a", b"b"], 1)
    arb.on_lost(2, b"b")
    arb.on_lost(1, b"a")
    arb.end_of_step()
    assert rec.names().count("claim_harmed") == 1


def test_harm_is_reported_when_the_step_ends_not_at_the_loss():
    arb, rec = arbiter("native")
    arb.on_request("r", {"claim_id": "c"}, [], [b"a", b"b"])
    cache(arb, [b"a", b"b"], 1)
    arb.on_lost(2, b"b")
    assert "claim_harmed" not in rec.names()
    arb.end_of_step()
    assert rec.names().count("claim_harmed") == 1


def test_a_loss_repaired_within_the_step_is_not_reported():
    arb, rec = arbiter("native")
    arb.on_request("r", {"claim_id": "c"}, [], [b"a", b"b"])
    cache(arb, [b"a", b"b"], 1)
    arb.on_lost(2, b"b")
    arb.on_resident(Block(7), b"b")  # identical content cached again in the same step
    arb.end_of_step()
    assert "claim_harmed" not in rec.names()


def test_loss_of_one_copy_keeps_the_content_resident():
    arb, rec = arbiter("native")
    arb.on_request("r", {"claim_id": "c"}, [], [b"a"])
    arb.on_resident(Block(1), b"a")
    arb.on_resident(Block(2), b"a")
    arb.on_lost(1, b"a")
    assert "claim_harmed" not in rec.names()


def test_a_hit_by_the_blocks_already_holding_claimed_content_changes_nothing():
    arb, rec = arbiter("native")
    arb.on_request("r", {"claim_id": "c"}, [], [b"a", b"b"])
    blocks = [Block(1), Block(2)]
    arb.on_resident_many(blocks, [b"a", b"b"])
    before = list(rec.events)
    arb.on_resident_many(blocks, [b"a", b"b"])  # a request hitting both, as vLLM reports it
    watches = [arb.watched[b"a"], arb.watched[b"b"]]
    assert rec.events == before
    assert [(w.block_id, w.block, w.more) for w in watches] == [(1, blocks[0], None),
                                                                (2, blocks[1], None)]


def test_a_hit_by_another_block_holding_claimed_content_is_kept_as_a_further_copy():
    arb, rec = arbiter("native")
    arb.on_request("r", {"claim_id": "c"}, [], [b"a", b"b"])
    arb.on_resident_many([Block(1), Block(2)], [b"a", b"b"])
    arb.on_resident_many([Block(1), Block(7)], [b"a", b"b"])
    arb.on_lost(2, b"b")
    arb.end_of_step()
    assert arb.watched[b"b"].block_id == 7 and "claim_harmed" not in rec.names()


def test_duplicate_claim_id_in_force_is_rejected():
    arb, rec = arbiter("native")
    arb.on_request("r1", {"claim_id": "c"}, [], [b"a"])
    arb.on_request("r2", {"claim_id": "c"}, [], [b"a"])
    assert rec.names().count("claim_rejected") == 1


# --- what the runtime cannot keep is rejected (issue 8) ---------------------------------------

def test_offloadable_claim_is_rejected_naming_the_missing_lower_tier():
    arb, rec = arbiter("hard_protected")
    arb.on_request("r", {"claim_id": "c", "protection_mode": "offloadable"}, [], [b"a"])
    reasons = [f["reason"] for e, f in rec.events if e == "claim_rejected"]
    assert len(reasons) == 1 and "lower KV tier" in reasons[0] and "c" not in arb.claims


def test_hard_protected_claim_is_accepted_where_offloadable_is_not():
    arb, rec = arbiter("hard_protected")
    arb.on_request("r", {"claim_id": "c", "protection_mode": "hard_protected"}, [], [b"a"])
    assert "claim_accepted" in rec.names() and "claim_rejected" not in rec.names()


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_lowering_rejects_offloadable_under_every_policy(policy):
    from kvclaims.contract.policies import lowering

    verdicts = {m: v["verdict"] for m, v in lowering(POLICIES[policy]).items()}
    assert verdicts["offloadable"] == "rejected"
    others = {v for m, v in verdicts.items() if m != "offloadable"}
    if POLICIES[policy].enforce:
        assert verdicts["soft_priority"] == "approximated" and \
            verdicts["hard_protected"] == "enforced"
    else:
        assert others == {"recorded only"}


# --- claim ownership (issue 8) -----------------------------------------------------------------

def _owned(policy: str = "hard_protected") -> tuple[ClaimArbiter, Recorded]:
    arb, rec = arbiter(policy)
    arb.on_request("r", {"claim_id": "c", "tenant": "acme"}, [], [b"a", b"b"])
    cache(arb, [b"a", b"b"], 1)
    return arb, rec


def test_release_by_the_claims_own_tenant_is_honoured():
    arb, rec = _owned()
    arb.on_request("rel", None, ["c"], [], tenant="acme")
    released = [f for e, f in rec.events if e == "claim_released"]
    assert released == [{"claim_id": "c", "reason": "released by request rel",
                         "released_by": "tenant", "request_id": "rel", "tenant": "acme"}]
    assert rec.unpinned == [2, 1] and "c" not in arb.claims


def test_release_by_another_tenant_is_refused_and_the_claim_stays():
    arb, rec = _owned()
    arb.on_request("rel", None, ["c"], [], tenant="mallory")
    refused = [f for e, f in rec.events if e == "claim_release_refused"]
    assert [(f["claim_id"], f["request_id"], f["tenant"]) for f in refused] == \
        [("c", "rel", "mallory")]
    assert "claim_released" not in rec.names() and rec.unpinned == [] and "c" in arb.claims


def test_release_without_a_tenant_is_refused():
    arb, rec = _owned()
    arb.on_request("rel", None, ["c"], [])
    assert "claim_release_refused" in rec.names() and "c" in arb.claims


def test_operator_release_is_recorded_as_the_operators():
    arb, rec = _owned()
    assert arb.release("c")
    assert [f["released_by"] for e, f in rec.events if e == "claim_released"] == ["operator"]


def test_a_released_claim_id_can_be_declared_again():
    arb, rec = _owned()
    arb.release("c")
    arb.on_request("r2", {"claim_id": "c", "tenant": "acme"}, [], [b"a"])
    assert rec.names().count("claim_accepted") == 2


# --- per-tenant limit on protected blocks (issue 8) ---------------------------------------------

def _limited(limit: int) -> tuple[ClaimArbiter, Recorded]:
    rec = Recorded()
    arb = ClaimArbiter(POLICIES["hard_protected"], 100, rec.emit, pin=lambda b: None,
                       unpin=lambda b: None, max_protected_blocks_per_tenant=limit)
    arb.on_request("r1", {"claim_id": "c1", "tenant": "acme"}, [], [b"a", b"b", b"c"])
    return arb, rec


def test_claim_over_its_tenants_limit_is_rejected_with_the_shortfall():
    arb, rec = _limited(4)
    arb.on_request("r2", {"claim_id": "c2", "tenant": "acme"}, [], [b"x", b"y"])
    rejected = [f for e, f in rec.events if e == "claim_rejected"]
    assert [(f["claim_id"], f["shortfall_blocks"]) for f in rejected] == [("c2", 1)]
    assert "max_protected_blocks_per_tenant=4" in rejected[0]["reason"]


def test_claim_within_its_tenants_limit_is_accepted():
    arb, rec = _limited(4)
    arb.on_request("r2", {"claim_id": "c2", "tenant": "acme"}, [], [b"x"])
    arb.on_request("r3", {"claim_id": "c3", "tenant": "other"}, [], [b"x", b"y", b"z"])
    assert rec.names().count("claim_accepted") == 3 and "claim_rejected" not in rec.names()


def test_a_released_claim_frees_its_tenants_quota():
    arb, rec = _limited(4)
    arb.release("c1")
    arb.on_request("r2", {"claim_id": "c2", "tenant": "acme"}, [], [b"x", b"y", b"z", b"w"])
    assert "claim_rejected" not in rec.names()


# --- no claims, no enforcement (issue 9) ---------------------------------------------------------

def test_without_claims_an_enforcing_policy_admits_a_request_larger_than_the_pool():
    arb, rec = arbiter("hard_protected", usable=10)
    assert [arb.admit("huge", 12, 10).action for _ in range(3)] == ["admit"] * 3


def test_with_a_protecting_claim_a_request_that_needs_its_blocks_is_refused():
    arb, rec = arbiter("hard_protected", usable=10)
    arb.on_request("r", {"claim_id": "c"}, [], [b"a", b"b"])
    cache(arb, [b"a", b"b"], 1)
    assert [arb.admit("big", 9, 8).action for _ in range(2)] == ["defer", "refuse"]


# --- per-step work is proportional to claims in force (issue 8) ----------------------------------

def test_ended_claims_leave_nothing_behind_for_the_hot_path():
    arb, rec = arbiter("ttl_expiry")
    now = [0.0]
    arb._clock = lambda: now[0]
    for i in range(50):
        arb.on_request(f"r{i}", {"claim_id": f"c{i}", "ttl_s": 1.0}, [], [bytes([i])])
    now[0] = 2.0
    arb.tick()
    assert arb.claims == {} and arb.watched == {} and not arb.has_deadlines
    assert rec.names().count("claim_expired") == 50


def test_claims_in_force_stay_watched():
    arb, _ = arbiter("ttl_expiry")
    arb.on_request("r", {"claim_id": "c", "ttl_s": 100.0}, [], [b"a"])
    arb.tick()
    assert list(arb.claims) == ["c"] and b"a" in arb.watched and arb.has_deadlines


def _sharing(policy: str, release_first: bool) -> tuple[ClaimArbiter, Recorded]:
    """Two claims on the same content, resident in block 1; the first released or not."""
    arb, rec = arbiter(policy)
    for n in (1, 2):
        arb.on_request(f"r{n}", {"claim_id": f"c{n}", "tenant": "t"}, [], [b"a"], "t")
    cache(arb, [b"a"], 1)
    if release_first:
        arb.release("c1")
    return arb, rec


def _harmed(rec: Recorded) -> list[str]:
    return [f["claim_id"] for e, f in rec.events if e == "claim_harmed"]


def test_a_released_claim_is_not_judged_on_content_it_shared():
    arb, rec = _sharing("native", release_first=True)
    arb.on_lost(1, b"a")
    arb.end_of_step()
    assert _harmed(rec) == ["c2"]


def test_claims_sharing_lost_content_are_each_judged():
    arb, rec = _sharing("native", release_first=False)
    arb.on_lost(1, b"a")
    arb.end_of_step()
    assert _harmed(rec) == ["c1", "c2"]


def test_a_released_claim_pins_no_new_copy_of_content_it_shared():
    arb, rec = _sharing("hard_protected", release_first=True)
    arb.on_resident(Block(2), b"a")
    arb.release("c2")
    assert arb.protected_blocks == 0 and sorted(rec.unpinned) == [1, 2]


def test_a_claim_in_force_keeps_every_copy_of_its_content_pinned():
    arb, rec = _sharing("hard_protected", release_first=False)
    arb.on_resident(Block(2), b"a")
    arb.release("c2")
    assert arb.protected_blocks == 2 and rec.unpinned == []


def test_protected_split_counts_other_tenants_blocks_without_naming_them():
    arb, _ = _owned()
    assert arb.protected_split("acme") == (0, 2)
    assert arb.protected_split("other") == (2, 0)
    assert arb.protected_split(None) == (2, 0)


# --- shared content: claims counting the same blocks (the arbiter's segments) -----------------

def _nested(rec_first: bool = False) -> tuple[ClaimArbiter, Recorded]:
    """Claim ``doc`` on [a, b] and claim ``long`` on [a, b, c], all three resident."""
    arb, rec = arbiter("native")
    arb.on_request("r1", {"claim_id": "doc"}, [], [b"a", b"b"])
    arb.on_request("r2", {"claim_id": "long"}, [], [b"a", b"b", b"c"])
    cache(arb, [b"a", b"b", b"c"], 1)
    return arb, rec


def test_a_loss_of_shared_content_harms_every_claim_counting_it():
    arb, rec = _nested()
    arb.on_lost(2, b"b")
    arb.end_of_step()
    assert _harmed(rec) == ["doc", "long"]


def test_a_loss_of_content_one_claim_counts_harms_only_that_claim():
    arb, rec = _nested()
    arb.on_lost(3, b"c")
    arb.end_of_step()
    assert _harmed(rec) == ["long"]


def test_claims_sharing_a_prefix_materialize_when_their_own_blocks_are_resident():
    arb, rec = arbiter("native")
    arb.on_request("r1", {"claim_id": "doc"}, [], [b"a", b"b"])
    arb.on_request("r2", {"claim_id": "long"}, [], [b"a", b"b", b"c"])
    cache(arb, [b"a", b"b"], 1)
    assert [f["claim_id"] for e, f in rec.events if e == "claim_materialized"] == ["doc"]


def test_a_claim_whose_sharer_ended_is_still_judged_on_its_own_content():
    arb, rec = _nested()
    arb.release("long")
    arb.on_lost(1, b"a")
    arb.end_of_step()
    assert _harmed(rec) == ["doc"]


def test_content_only_an_ended_claim_counted_harms_nobody():
    arb, rec = _nested()
    arb.release("long")
    arb.on_lost(3, b"c")
    arb.end_of_step()
    assert _harmed(rec) == []


def test_a_claim_ended_after_a_loss_broke_it_is_still_reported_at_the_step_end():
    arb, rec = _nested()
    arb.on_lost(3, b"c")
    arb.release("long")
    arb.end_of_step()
    assert _harmed(rec) == ["long"]


def test_a_claim_repaired_before_it_ended_is_not_reported():
    arb, rec = _nested()
    arb.on_lost(3, b"c")
    arb.on_resident(Block(9), b"c")
    arb.release("long")
    arb.end_of_step()
    assert _harmed(rec) == []


def test_a_reset_reports_the_first_resident_content_a_claim_lost():
    arb, rec = arbiter("native")
    arb.on_request("r", {"claim_id": "c"}, [], [b"a", b"b"])
    cache(arb, [b"b", b"a"], 1)  # b's first copy arrived first
    arb.on_reset()
    arb.end_of_step()
    assert [f["block_hash"] for e, f in rec.events if e == "claim_harmed"] == [b"b"]


def test_a_reset_after_content_returned_reports_the_earlier_copy():
    arb, rec = arbiter("native")
    arb.on_request("r", {"claim_id": "c"}, [], [b"a", b"b"])
    cache(arb, [b"b", b"a"], 1)
    arb.on_lost(1, b"b")
    arb.on_resident(Block(3), b"b")  # b's first copy is now younger than a's
    arb.end_of_step()
    arb.on_reset()
    arb.end_of_step()
    assert [f["block_hash"] for e, f in rec.events if e == "claim_harmed"] == [b"a"]
