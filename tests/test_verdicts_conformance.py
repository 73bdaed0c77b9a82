"""Conformance verdicts you can trust (docs/conformance.md; issue 8 items 6, 7 and the L7
comparison with vLLM's own report): a check passes only where its situation occurred,
observed runs and hook failures are said, never guessed. Each rule with its negative twin."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from kvclaims.audit import open_audit
from kvclaims.reconstruct import core
from kvclaims.sources import shapes
from kvclaims.reconstruct.checks import CHECKS, EVIDENCE_MAX
from tests import verdict_shapes as vs

DOC = Path(__file__).resolve().parent.parent / "docs" / "conformance.md"


def judge(events: vs.Events, manifest: dict | None = None) -> dict[str, tuple[str, str]]:
    return vs.verdicts(vs.reconstruct_events(events, manifest))


def probe(name: str, **kw) -> vs.Events:
    return shapes.capacity_probe(name, **kw)


# -- L1 ----------------------------------------------------------------------------------------

def l1_evidence(events: vs.Events) -> tuple[list[int], int]:
    t = vs.reconstruct_events(events)
    return t.con.sql("SELECT evidence_seqs, evidence_seq_count FROM conformance "
                     "WHERE \"check\" = 'L1'").fetchall()[0]


def test_l1_shows_a_reset_that_lost_several_blocks_as_one_seq() -> None:
    seqs, n = l1_evidence(vs.unclaimed_losses(by_reset=True))
    assert len(seqs) == 1 and n == 1


def test_twin_l1_shows_each_eviction_as_a_seq_of_its_own() -> None:
    seqs, n = l1_evidence(vs.unclaimed_losses(by_reset=False))
    assert len(seqs) == 3 and n == 3


# -- L2 ----------------------------------------------------------------------------------------

def test_l2_passes_where_the_served_request_evicted_residents() -> None:
    verdict, detail = judge(probe("wna-80", policy="write_no_admit", write_no_admit=True))["L2"]
    assert verdict == "pass" and "50 resident block(s)" in detail


def test_l2_is_not_exercised_where_no_resident_was_under_pressure() -> None:
    verdict, detail = judge(probe("wna-150", policy="write_no_admit", write_no_admit=True,
                                  usable=150))["L2"]
    assert verdict == "not_exercised"
    assert "resident block was lost to pressure" in detail


def test_l2_counts_the_requests_own_evictions_and_every_resident_loss_while_it_ran() -> None:
    verdict, detail = judge(vs.denied_while_others_evict(other_in_window=True))["L2"]
    assert verdict == "pass" and "while 3 resident block(s) were evicted" in detail


def test_twin_l2_leaves_out_other_requests_evictions_after_it_ended() -> None:
    verdict, detail = judge(vs.denied_while_others_evict(other_in_window=False))["L2"]
    assert verdict == "pass" and "while 2 resident block(s) were evicted" in detail


# -- L3 ----------------------------------------------------------------------------------------

def test_l3_passes_where_a_hard_claim_faced_an_infeasible_request() -> None:
    assert judge(probe("hard-80", policy="hard_protected",
                       claim_mode="hard_protected"))["L3"][0] == "pass"


def test_l3_is_not_exercised_where_no_conflict_happened() -> None:
    verdict, detail = judge(probe("hard-130", policy="hard_protected", usable=130,
                                  claim_mode="hard_protected"))["L3"]
    assert verdict == "not_exercised" and "infeasible request" in detail


# -- L4 / L5 -----------------------------------------------------------------------------------

def test_l4_detail_counts_only_the_demoted_instances_losses() -> None:
    verdict, detail = judge(vs.demoted_beside_released())["L4"]
    assert verdict == "pass"
    assert "later lost 2 block(s): 2 labelled relaxation" in detail


def test_l4_is_not_exercised_when_the_demoted_claim_lost_nothing() -> None:
    assert judge(vs.demoted_without_loss())["L4"][0] == "not_exercised"


def test_l5_passes_on_an_expired_claim_that_later_lost_content() -> None:
    verdict, detail = judge(probe("ttl", policy="ttl_expiry", claim_mode="expiring",
                                  ttl_s=1.0))["L5"]
    assert verdict == "pass" and "50 labelled expiry" in detail


def test_l5_is_not_exercised_without_an_expiry() -> None:
    assert judge(probe("demote", policy="demote_on_conflict",
                       claim_mode="demotable"))["L5"][0] == "not_exercised"


# -- not_exercised is not a pass ---------------------------------------------------------------

def test_a_run_that_exercises_nothing_has_no_pass() -> None:
    v = judge(vs.demoted_without_loss()[:2] + vs.demoted_without_loss()[-1:])
    assert "pass" not in {verdict for verdict, _ in v.values()}
    assert {verdict for verdict, _ in v.values()} == {"not_exercised"}


def test_every_not_exercised_verdict_names_the_situation_it_needs() -> None:
    for verdict, detail in judge(vs.demoted_without_loss()).values():
        if verdict == "not_exercised":
            assert detail.startswith("not exercised: needs ")


# -- L7 against vLLM's num_cached_tokens -------------------------------------------------------

def test_l7_accepts_vllms_full_prompt_rule_one_block_recomputed() -> None:
    assert judge(vs.full_prompt_hit(reported_blocks=3))["L7"][0] == "pass"


def test_l7_fails_when_vllm_reports_more_cached_tokens_than_the_trace_shows() -> None:
    t = vs.reconstruct_events(vs.full_prompt_hit(reported_blocks=4))
    verdict, seqs, detail = t.con.sql('SELECT verdict, evidence_seqs, detail FROM conformance '
                                      "WHERE \"check\" = 'L7'").fetchall()[0]
    (finished,), = t.con.sql("SELECT finished_seq FROM requests "
                             "WHERE request_id = 'again'").fetchall()
    assert verdict == "fail" and seqs == [finished] and "cached_tokens_mismatch" in detail


def test_l7_fails_when_the_trace_shows_fewer_hits_than_vllm_reports() -> None:
    assert judge(vs.full_prompt_hit(reported_blocks=3, recorded_hits=2))["L7"][0] == "fail"


# -- observed runs (stock-vLLM listener) -------------------------------------------------------

def test_observed_runs_report_in_engine_checks_as_not_exercised_with_the_reason() -> None:
    v = judge(probe("obs", policy="hard_protected", claim_mode="hard_protected"),
              {"evidence": "observed"})
    verdict, detail = v["L3"]
    assert verdict == "not_exercised" and "observed run" in detail
    assert v["INV_feasible_admission"][0] == "not_exercised"


def test_in_engine_runs_judge_the_same_trace() -> None:
    v = judge(probe("obs", policy="hard_protected", claim_mode="hard_protected"),
              {"evidence": "in_engine"})
    assert v["L3"][0] == "pass" and v["INV_refusal_names_protected_claim"][0] == "pass"


# -- hook failures (fail-open) -----------------------------------------------------------------

def test_checks_whose_evidence_follows_a_hook_failure_are_unknown_naming_it() -> None:
    verdict, detail = judge(vs.hard_with_hook_failure("start"))["L3"]
    assert verdict == "unknown"
    assert "hook scheduler.schedule failed" in detail and "RuntimeError" in detail


def test_checks_whose_evidence_precedes_the_hook_failure_keep_their_verdict() -> None:
    verdict, detail = judge(vs.hard_with_hook_failure("end"))["L3"]
    assert verdict == "pass" and "all evidence precedes it" in detail


def test_a_violation_after_a_hook_failure_is_unknown_not_blamed_on_the_policy() -> None:
    verdict, detail = judge(vs.refusal_around_hook(hook_first=True))[
        "INV_refusal_names_protected_claim"]
    assert verdict == "unknown" and "hook arbiter.admit failed" in detail


def test_a_violation_before_a_hook_failure_fails() -> None:
    assert judge(vs.refusal_around_hook(hook_first=False))[
        "INV_refusal_names_protected_claim"][0] == "fail"


def test_a_protected_claim_losing_content_after_a_hook_failure_is_unknown() -> None:
    # whatever the loss is labelled, enforcement after the failed hook is not known
    verdict, detail = judge(vs.protected_loss_around_hook(hook_first=True))[
        "INV_no_protected_loss"]
    assert verdict == "unknown" and "hook block_pool.touch failed" in detail


def test_a_protected_claim_losing_content_before_a_hook_failure_fails() -> None:
    assert judge(vs.protected_loss_around_hook(hook_first=False))[
        "INV_no_protected_loss"][0] == "fail"


# -- bounded evidence: the smallest EVIDENCE_MAX seqs and how many there are ------------------

def lost_under_enforcement() -> core.Tables:
    """The native probe's trace judged under an enforcing policy: each of its 50 harm losses of
    a hard claim is a protected_block_lost finding (INV_no_protected_loss fails on 50 seqs),
    and its one infeasible admission fails INV_feasible_admission on one seq."""
    events = probe("lost", claim_mode="hard_protected")
    return vs.reconstruct_events([{**e, "policy": "hard_protected"} if "policy" in e else e
                                  for e in events])


def evidence(t: core.Tables, check: str) -> tuple[str, list[int], int]:
    return t.con.sql('SELECT verdict, evidence_seqs, evidence_seq_count FROM conformance '
                     'WHERE "check" = $c', params={"c": check}).fetchall()[0]


def finding_seqs(t: core.Tables, kind: str) -> list[int]:
    return [s for s, in t.con.sql("SELECT DISTINCT seq FROM findings WHERE kind = $k "
                                  "ORDER BY seq", params={"k": kind}).fetchall()]


def test_evidence_beyond_the_bound_keeps_the_smallest_seqs_and_the_true_count() -> None:
    t = lost_under_enforcement()
    verdict, seqs, n = evidence(t, "INV_no_protected_loss")
    lost = finding_seqs(t, "protected_block_lost")
    assert len(lost) > EVIDENCE_MAX
    assert verdict == "fail" and seqs == lost[:EVIDENCE_MAX] and n == len(lost)


def test_evidence_within_the_bound_is_kept_whole_its_length_the_count() -> None:
    t = lost_under_enforcement()
    verdict, seqs, n = evidence(t, "INV_feasible_admission")
    assert verdict == "fail" and seqs == finding_seqs(t, "infeasible_admission")
    assert n == len(seqs) <= EVIDENCE_MAX


# -- titles and the documentation --------------------------------------------------------------

def test_every_check_has_a_title_and_the_situation_it_needs() -> None:
    t = vs.reconstruct_events(vs.demoted_without_loss())
    rows = t.con.sql('SELECT "check", title, needs FROM conformance').fetchall()
    assert len(rows) == len(CHECKS)
    assert all(title and needs and title != check for check, title, needs in rows)


def test_docs_list_every_check_with_its_title() -> None:
    t = vs.reconstruct_events(vs.demoted_without_loss())
    doc = DOC.read_text(encoding="utf-8")
    for check, title in t.con.sql('SELECT "check", title FROM kv_checks').fetchall():
        assert re.search(rf"\|\s*`{check}`\s*\|\s*{re.escape(title)}\s*\|", doc), check


# -- claim instances in the evidence -----------------------------------------------------------

def claims_of(t: core.Tables, check: str) -> list[tuple[str, int]]:
    (ev,), = t.con.sql('SELECT evidence_claims FROM conformance WHERE "check" = $c',
                       params={"c": check}).fetchall()
    return [(e["claim_id"], e["claim_seq"]) for e in ev]


def test_a_passing_check_names_the_claim_instances_it_judged() -> None:
    t = vs.reconstruct_events(vs.demoted_beside_released())
    (seq,), = t.con.sql("SELECT claim_seq FROM claims "
                        "WHERE claim_id = 'claim:demoted'").fetchall()
    assert claims_of(t, "L4") == [("claim:demoted", seq)]


def test_a_failing_check_names_only_the_failing_instance_of_a_reused_id() -> None:
    t = vs.reconstruct_events(vs.reused_after_release())
    first, second = [s for (s,) in t.con.sql("SELECT claim_seq FROM claims "
                                             "ORDER BY claim_seq").fetchall()]
    assert claims_of(t, "L7") == [(vs.CLAIM, second)]
    assert (vs.CLAIM, first) not in claims_of(t, "L7")


def _copy_run(src: Path, dst: Path, **manifest: object) -> Path:
    shutil.copytree(src, dst)
    m = json.loads((dst / "manifest.json").read_text())
    (dst / "manifest.json").write_text(json.dumps({**m, **manifest}))
    return dst


SHIPPED = Path(__file__).resolve().parent.parent / "traces" / "live_pressure"


def test_an_observed_run_directory_is_judged_from_its_manifest(tmp_path: Path) -> None:
    run = _copy_run(SHIPPED, tmp_path / "observed", evidence="observed")
    t = open_audit([run], reuse=False, lock=False, views=False)
    v = dict(t.con.sql('SELECT "check", verdict FROM conformance').fetchall())
    assert v["L3"] == "not_exercised" and v["INV_refusal_names_protected_claim"] == "not_exercised"


def test_the_same_run_directory_recorded_in_engine_is_judged(tmp_path: Path) -> None:
    run = _copy_run(SHIPPED, tmp_path / "in-engine")
    t = open_audit([run], reuse=False, lock=False, views=False)
    v = dict(t.con.sql('SELECT "check", verdict FROM conformance').fetchall())
    assert v["L3"] == "pass" and v["INV_refusal_names_protected_claim"] == "pass"


def test_an_observed_run_still_judges_expiry_declared_beside_the_engine() -> None:
    v = judge(probe("obs-ttl", policy="ttl_expiry", claim_mode="expiring", ttl_s=1.0),
              {"evidence": "observed"})
    assert v["L5"][0] == "pass" and v["L6"][0] == "not_exercised"
