"""Claims and the arbiter on the real vLLM CPU engine (issue 3); facts come from the trace."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kvclaims.sources.scenarios import Driver, Scenario, engine_args, tokens
from kvclaims.sources.tiny_model import ensure_tiny_model
from tests.conftest import client, query, request_id, scalar

pytestmark = pytest.mark.vllm


def resident_losses(run: Path, claim_id: str = "claim:resident") -> list[tuple[int, int]]:
    """(seq, position) of every loss of content bound to ``claim_id``."""
    return query(run, f"""SELECT e.seq, b.position FROM events e JOIN events b
        ON b.event = 'claim_bound' AND b.claim_id = '{claim_id}' AND b.block_hash = e.block_hash
        WHERE e.event = 'block_evicted' ORDER BY e.seq""")


def first_seq(run: Path, event: str, claim_id: str | None = None) -> int | None:
    where = f" AND claim_id = '{claim_id}'" if claim_id else ""
    return scalar(run, f"SELECT min(seq) FROM events WHERE event = '{event}'{where}")


# --- the paper's 60 + 70 > 80 case under each policy -------------------------------------------

def test_native_serves_active_and_loses_fifty_tail_first(record_run):
    run, view = record_run("resident60_active70", "native")
    assert client(view, "active")["finish_reason"] == "length"
    assert [p for _, p in resident_losses(run)][:50] == list(range(59, 9, -1))


def test_write_no_admit_never_caches_the_active_request(record_run):
    run, view = record_run("resident60_active70", "write_no_admit")
    active = request_id(view, "active")
    assert scalar(run, f"SELECT count(*) FROM events WHERE event = 'reuse_denied' "
                       f"AND request_id = '{active}'") == 1
    assert scalar(run, f"SELECT count(*) FROM events WHERE event = 'block_cached' "
                       f"AND request_id = '{active}'") == 0


def test_write_no_admit_still_loses_residents(record_run):
    run, view = record_run("resident60_active70", "write_no_admit")
    probe_arrival = scalar(run, f"SELECT seq FROM events WHERE event = 'request_arrived' "
                                f"AND request_id = '{request_id(view, 'probe')}'")
    lost = sorted(p for s, p in resident_losses(run) if s < probe_arrival)
    assert client(view, "active")["finish_reason"] == "length"
    assert lost == list(range(10, 60))


def test_hard_protected_refuses_active_naming_the_claim(record_run):
    run, view = record_run("resident60_active70", "hard_protected")
    active = request_id(view, "active")
    row = query(run, f"""SELECT blocking_claim_ids, shortfall_blocks, protected_blocks,
        blocks_required, usable_blocks FROM events
        WHERE event = 'request_refused' AND request_id = '{active}'""")
    assert row == [(["claim:resident"], 50, 60, 70, 80)]
    assert client(view, "active")["finish_reason"] == "error"
    assert "kv_claim_refused" in client(view, "active")["stop_reason"]


def test_refused_client_is_told_counts_never_another_tenants_claim_ids(record_run):
    _, view = record_run("resident60_active70", "hard_protected")
    stop = client(view, "active")["stop_reason"]
    assert "claim:resident" not in stop
    assert stop == ("kv_claim_refused: 60 blocks protected by claims of other tenants; "
                    "shortfall_blocks=50")


def test_hard_protected_defers_before_refusing(record_run):
    run, view = record_run("resident60_active70", "hard_protected")
    active = request_id(view, "active")
    order = [r[0] for r in query(run, f"SELECT event FROM events WHERE request_id = '{active}' "
                                      f"AND event LIKE 'request_%' ORDER BY seq")]
    assert order == ["request_arrived", "request_deferred", "request_refused",
                     "request_finished"]


def test_hard_protected_loses_no_resident_block(record_run):
    run, view = record_run("resident60_active70", "hard_protected")
    assert resident_losses(run) == []
    assert client(view, "probe")["num_cached_tokens"] == 59 * 32


def test_demote_on_conflict_demotes_strictly_before_first_loss(record_run):
    run, view = record_run("resident60_active70", "demote_on_conflict")
    demoted = first_seq(run, "claim_demoted", "claim:resident")
    losses = resident_losses(run)
    assert demoted is not None and losses and demoted < losses[0][0]
    assert client(view, "active")["finish_reason"] == "length"


def test_ttl_expiry_expires_strictly_before_first_loss(record_run):
    run, view = record_run("resident60_active70", "ttl_expiry")
    expired = first_seq(run, "claim_expired", "claim:resident")
    losses = resident_losses(run)
    assert expired is not None and losses and expired < losses[0][0]
    assert first_seq(run, "claim_harmed") is None


def test_every_feasibility_field_uses_usable_blocks_without_the_null_block(record_run):
    run, _ = record_run("resident60_active70", "hard_protected")
    assert query(run, "SELECT DISTINCT usable_blocks FROM events WHERE usable_blocks IS NOT NULL"
                 ) == [(80,)]


# --- soft priority: a case built to show it ---------------------------------------------------

def _soft_case(d: Driver, policy: str) -> None:
    d.submit("soft-doc", tokens(40, 10), claim={"claim_id": "soft", "tenant": "t-soft",
                                               "protection_mode": "soft_priority"})
    d.run()
    d.submit("plain", tokens(41, 10))  # cached later: LRU would evict soft-doc first
    d.run()
    d.submit("pressure", tokens(42, 30))
    d.run()


SOFT = Scenario("soft_case", _soft_case, "soft priority vs LRU", "hard_protected", 40)


def test_soft_priority_evicts_unclaimed_blocks_first(record_run):
    run, view = record_run(SOFT, "hard_protected")
    assert resident_losses(run, "soft") == []
    plain = request_id(view, "plain")
    assert scalar(run, f"""SELECT count(*) FROM events e JOIN events c ON c.event =
        'block_cached' AND c.request_id = '{plain}' AND c.block_hash = e.block_hash
        WHERE e.event = 'block_evicted'""") == 10


def test_soft_priority_unenforced_loses_the_older_claimed_blocks(record_run):
    run, _ = record_run(SOFT, "native")
    assert len(resident_losses(run, "soft")) == 10


# --- demotion picks the fewest, lowest-value claims -------------------------------------------

def _two_tenants(d: Driver, policy: str) -> None:
    d.submit("t1-doc", tokens(50, 30), claim={"claim_id": "t1", "tenant": "tenant-1",
                                             "protection_mode": "demotable", "value": 2.0})
    d.submit("t2-doc", tokens(51, 30), claim={"claim_id": "t2", "tenant": "tenant-2",
                                             "protection_mode": "demotable", "value": 0.5})
    d.run()
    d.submit("active", tokens(52, 40))  # 60 protected + 40 > 80: shortfall 20
    d.run()


TWO_TENANTS = Scenario("two_tenants", _two_tenants, "two demotable claims", "demote_on_conflict",
                       80)


def test_only_the_needed_lowest_value_claim_is_demoted(record_run):
    run, view = record_run(TWO_TENANTS)
    assert query(run, "SELECT claim_id FROM events WHERE event = 'claim_demoted'") == [("t2",)]
    assert client(view, "active")["finish_reason"] == "length"


def test_the_higher_value_claim_keeps_every_block(record_run):
    run, _ = record_run(TWO_TENANTS)
    assert resident_losses(run, "t1") == []


# --- declarations ------------------------------------------------------------------------------

def test_invalid_claim_is_rejected_with_reason_and_request_served(record_run):
    run, view = record_run("multi_tenant")
    assert query(run, "SELECT reason FROM events WHERE event = 'claim_rejected' "
                      "AND claim_id = 'e:bad'") == [("unknown protection_mode 'pinned-forever'",)]
    assert client(view, "e-bad")["finish_reason"] == "length"


def test_valid_claims_of_every_mode_this_runtime_can_keep_are_accepted(record_run):
    run, _ = record_run("multi_tenant")
    modes = {r[0] for r in query(run, """SELECT s.protection_mode FROM events s JOIN events a
        ON a.event = 'claim_accepted' AND a.claim_id = s.claim_id
        WHERE s.event = 'claim_submitted'""")}
    assert modes == {"hard_protected", "demotable", "expiring", "best_effort", "soft_priority"}


def test_offloadable_claim_is_rejected_naming_the_missing_tier_and_still_served(record_run):
    run, view = record_run("multi_tenant")
    reasons = query(run, "SELECT reason FROM events WHERE event = 'claim_rejected' "
                         "AND claim_id = 'e:off'")
    assert len(reasons) == 1 and "lower KV tier" in reasons[0][0]
    assert client(view, "e-off")["finish_reason"] == "length"


def test_manifest_carries_a_lowering_verdict_per_mode(record_run):
    from kvclaims.reconstruct.loader import read_manifest

    run, _ = record_run("multi_tenant")
    lowering = read_manifest(run)["lowering"]
    assert {m: v["verdict"] for m, v in lowering.items()} == {
        "best_effort": "recorded only", "soft_priority": "approximated",
        "hard_protected": "enforced", "demotable": "enforced", "expiring": "enforced",
        "offloadable": "rejected"}
    assert all(v["evidence"] for v in lowering.values())


def test_native_manifest_records_every_mode_only_and_rejects_offloadable(record_run):
    from kvclaims.reconstruct.loader import read_manifest

    run, _ = record_run("resident60_active70", "native")
    verdicts = {m: v["verdict"] for m, v in read_manifest(run)["lowering"].items()}
    assert verdicts.pop("offloadable") == "rejected"
    assert set(verdicts.values()) == {"recorded only"}


def test_preemption_records_the_protected_blocks_and_their_claims(record_run):
    run, _ = record_run("multi_tenant")
    rows = query(run, """SELECT protected_blocks, usable_blocks, free_blocks,
        blocking_claim_ids FROM events WHERE event = 'request_preempted'""")
    assert rows and all(p is not None and u == 80 and f is not None for p, u, f, _ in rows)
    assert all(b == ["a:doc"] and p == 20 for p, _, _, b in rows)


def test_claim_released_by_a_later_request_is_released_before_its_losses(record_run):
    run, _ = record_run("multi_tenant")
    released = first_seq(run, "claim_released", "a:doc")
    losses = resident_losses(run, "a:doc")
    assert released is not None and losses and released < losses[0][0]


def test_deferred_request_is_served_once_a_release_makes_room(record_run):
    run, view = record_run("multi_tenant")
    wait = request_id(view, "h-wait")
    order = [r[0] for r in query(run, f"SELECT event FROM events WHERE request_id = '{wait}' "
                                      f"AND event LIKE 'request_%' ORDER BY seq")]
    assert order == ["request_arrived", "request_deferred", "request_admitted",
                     "request_finished"]
    assert client(view, "h-wait")["finish_reason"] == "length"


def _tenant_release(d: Driver, policy: str) -> None:
    d.submit("resident", tokens(1, 60), claim={"claim_id": "claim:resident",
                                               "tenant": "owner"})
    d.run()
    d.submit("steal", [1], extra={"kv_claim_release": "claim:resident", "kv_tenant": "mallory"})
    d.run()
    d.submit("blocked", tokens(3, 70))  # the claim is still in force: refused
    d.run()
    d.submit("release", [1], extra={"kv_claim_release": "claim:resident", "kv_tenant": "owner"})
    d.run()
    d.submit("active", tokens(2, 70))
    d.run()


RELEASE = Scenario("release", _tenant_release, "release by another tenant, then by the owner",
                   "hard_protected", 80)


def test_release_by_another_tenant_is_refused_and_the_claim_holds(record_run):
    run, view = record_run(RELEASE)
    steal = request_id(view, "steal")
    assert query(run, f"""SELECT claim_id, tenant FROM events WHERE event =
        'claim_release_refused' AND request_id = '{steal}'""") == [("claim:resident", "mallory")]
    assert client(view, "blocked")["finish_reason"] == "error"


def test_release_by_the_owner_lets_the_active_request_in(record_run):
    run, view = record_run(RELEASE)
    assert query(run, """SELECT released_by, tenant FROM events
        WHERE event = 'claim_released'""") == [("tenant", "owner")]
    assert first_seq(run, "claim_released", "claim:resident") < resident_losses(run)[0][0]
    assert client(view, "active")["finish_reason"] == "length"


def test_release_claim_helper_works_through_llm(tmp_path: Path):
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from kvclaims.recorder.api import claim_args, release_claim
    from kvclaims.sources.scenarios import engine_args
    from kvclaims.sources.tiny_model import ensure_tiny_model
    from kvclaims.reconstruct.loader import load_runs

    cfg = {"out": str(tmp_path / "run"), "policy": "hard_protected", "run_id": "api"}
    llm = LLM(**engine_args(ensure_tiny_model(), 16, cfg))
    llm.generate([TokensPrompt(prompt_token_ids=tokens(3, 4))],
                 SamplingParams(max_tokens=1, extra_args=claim_args("c", tenant="t")),
                 use_tqdm=False)
    release_claim(llm, "c")
    llm.llm_engine.engine_core.shutdown()
    events = load_runs([tmp_path / "run"]).connect().sql(
        "SELECT event, released_by FROM events WHERE claim_id = 'c' AND event LIKE 'claim_%' "
        "AND event != 'claim_bound' ORDER BY seq").fetchall()
    assert events == [("claim_submitted", None), ("claim_accepted", None),
                      ("claim_materialized", None), ("claim_released", "operator")]


# --- live pressure -----------------------------------------------------------------------------

def test_live_pressure_defers_then_refuses_with_shortfall_19(record_run):
    run, view = record_run("live_pressure")
    active = request_id(view, "active")
    rows = query(run, f"""SELECT event, protected_blocks, blocks_required, usable_blocks,
        shortfall_blocks, blocking_claim_ids FROM events WHERE request_id = '{active}'
        AND event IN ('request_deferred', 'request_refused') ORDER BY seq""")
    assert rows == [("request_deferred", 40, 46, 67, 19, ["claim:live-resident"]),
                    ("request_refused", 40, 46, 67, 19, ["claim:live-resident"])]


def test_live_pressure_serves_the_small_requests_and_loses_nothing(record_run):
    run, view = record_run("live_pressure")
    assert all(client(view, f"small-{i}")["finish_reason"] == "length" for i in range(3))
    assert resident_losses(run, "claim:live-resident") == []


def _pressure_without_claims(d: Driver, policy: str) -> None:
    d.submit("resident", tokens(1, 40))
    d.run()
    d.submit("active", tokens(2, 46))
    for i in range(3):
        d.submit(f"small-{i}", tokens(10 + i, 4), max_tokens=4)
    d.run()


def test_without_claims_an_enforcing_policy_behaves_like_vllm(record_run):
    run, view = record_run(Scenario("no_claims", _pressure_without_claims, "live_pressure "
                                    "without its claim", "hard_protected", 67))
    assert scalar(run, "SELECT count(*) FROM events WHERE event IN "
                       "('request_deferred', 'request_refused')") == 0
    assert all(r["finish_reason"] == "length" for r in view["requests"])


# --- hits on content the arbiter already mirrors ----------------------------------------------

def _hits_run(out: Path, *, mirrored: bool, stale: bool = False) -> tuple[list[tuple], dict]:
    """A ``native`` run whose requests hit claimed content, before and after it is evicted and
    cached again: its events (block hashes numbered by first appearance, no timestamps or
    request ids) and the arbiter's state at the end (per claim: gaps, materialized, and the
    blocks it knows hold each bound position).

    ``mirrored``: the scheduler's ``kvc_hits_mirrored`` (False: every hit list on watched
    content reaches the arbiter). ``stale``: the arbiter is not told of the claimed content's
    first caching, so it does not know the copies the reader then hits.
    """
    from vllm import EngineArgs, LLMEngine

    args = engine_args(ensure_tiny_model(), 16, {"out": str(out), "policy": "native",
                                                 "run_id": "hits"})
    engine = LLMEngine.from_engine_args(EngineArgs(**args))
    sched = engine.engine_core.engine_core.scheduler
    assert sched.kvc_hits_mirrored  # the tiny model's group 0: plain full attention
    sched.kvc_hits_mirrored = mirrored
    arbiter = sched.kvc_arbiter
    if stale:
        told = arbiter.on_resident_many
        dropped: list[object] = []

        def forgetful(blocks, keys):  # type: ignore[no-untyped-def]
            if not dropped and sys._getframe(1).f_code.co_name == "cache_full_blocks":
                dropped.append(keys)
                return
            told(blocks, keys)

        arbiter.on_resident_many = forgetful
    driver = Driver(engine)
    try:
        driver.submit("doc", tokens(60, 6), claim={"claim_id": "doc", "tenant": "t"})
        driver.run()
        driver.submit("reader", tokens(60, 6) + tokens(61, 2))
        driver.run()
        driver.submit("pressure", tokens(62, 14))  # evicts the claimed content
        driver.run()
        driver.submit("again", tokens(60, 6) + tokens(63, 1))  # caches it again
        driver.run()
        driver.submit("reader2", tokens(60, 6) + tokens(64, 1))
        driver.run()
        state = {cid: (c.gaps, c.materialized,
                       [(w.block_id, tuple(w.more or ())) for w in map(arbiter.watched.get,
                                                                        c.hashes)])
                 for cid, c in arbiter.claims.items()}
    finally:
        engine.engine_core.shutdown()
    numbers: dict[int, int] = {}
    rows = [tuple(numbers.setdefault(v, len(numbers)) if i == 3 and v is not None else v
                  for i, v in enumerate(row))
            for row in query(out, "SELECT seq, event, claim_id, block_hash, block_id, position "
                                  "FROM events ORDER BY seq")]
    return rows, state


def test_hits_skipped_while_nothing_pins_leave_the_same_trace_and_arbiter(tmp_path: Path):
    skipped = _hits_run(tmp_path / "skipped", mirrored=True)
    called = _hits_run(tmp_path / "called", mirrored=False)
    assert skipped == called
    events = [r[1] for r in called[0]]
    bound = {r[3] for r in called[0] if r[1] == "claim_bound"}
    # the run exercised the skip: hits on claimed content, then its loss and return
    assert any(r[1] == "block_hit" and r[3] in bound for r in called[0])
    assert "claim_harmed" in events and events.count("claim_materialized") == 1
    assert called[1]["doc"][:2] == (0, True)


def test_hits_skipped_over_a_copy_the_arbiter_never_learned_would_differ(tmp_path: Path):
    # the negative twin: the comparison above sees a hit that would teach the arbiter something
    skipped = _hits_run(tmp_path / "skipped", mirrored=True, stale=True)
    called = _hits_run(tmp_path / "called", mirrored=False, stale=True)
    assert skipped != called
    materialized = [[r[0] for r in run[0] if r[1] == "claim_materialized"]
                    for run in (skipped, called)]
    # the reader's hits teach only the arbiter that is called the copies it missed
    assert materialized[1] and materialized[0] != materialized[1]
