"""Claim declarations (recorder/claims.py) and the arbiter's pure decisions, without vLLM."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from recorder.arbiter import ClaimArbiter
from recorder.claims import ClaimDeclaration, Rejection, parse_claim, raw_claim, release_ids
from recorder.policies import POLICIES


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
    assert rec.names().count("claim_harmed") == 1


def test_loss_of_one_copy_keeps_the_content_resident():
    arb, rec = arbiter("native")
    arb.on_request("r", {"claim_id": "c"}, [], [b"a"])
    arb.on_resident(Block(1), b"a")
    arb.on_resident(Block(2), b"a")
    arb.on_lost(1, b"a")
    assert "claim_harmed" not in rec.names()


def test_duplicate_claim_id_in_force_is_rejected():
    arb, rec = arbiter("native")
    arb.on_request("r1", {"claim_id": "c"}, [], [b"a"])
    arb.on_request("r2", {"claim_id": "c"}, [], [b"a"])
    assert rec.names().count("claim_rejected") == 1
