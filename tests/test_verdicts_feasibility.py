"""Feasibility as seed 000 states it, rebuilt from the block timeline (docs/conformance.md,
docs/reconstruction.md "Feasibility"), the checks that need their situation, and the one
check table. Each rule with its negative twin."""

from __future__ import annotations

import json
from pathlib import Path

import kvclaims

from kvclaims.explaining import explain
from kvclaims.sources import shapes
from kvclaims.reconstruct.checks import CHECKS, checks_markdown, lowering_markdown
from tests import feasibility_shapes as fs
from tests import verdict_shapes as vs

DOCS = Path(__file__).resolve().parents[1] / "docs"


def judge(events: vs.Events) -> dict[str, str]:
    return {c: v for c, (v, _d) in vs.verdicts(vs.reconstruct_events(events)).items()}


def kinds(events: vs.Events) -> dict[str, str]:
    t = vs.reconstruct_events(events)
    return dict(t.con.sql("SELECT kind, max(severity) FROM findings GROUP BY kind").fetchall())


def feas(events: vs.Events, request: str) -> tuple:
    t = vs.reconstruct_events(events)
    return t.con.sql("SELECT protected_blocks, live_blocks, required_blocks, feasible, "
                     "runtime_feasible FROM feasibility WHERE request_id = $q "
                     "ORDER BY seq DESC LIMIT 1", params={"q": request}).fetchall()[0]


# -- the inequality: protected + active live <= usable -------------------------------------------

def test_a_running_requests_live_blocks_count_4_plus_3_plus_3_exceeds_8() -> None:
    assert feas(fs.live_pressure(running=True), "new") == (4, 3, 3, False, True)


def test_without_a_running_request_4_plus_3_fits_8() -> None:
    assert feas(fs.live_pressure(running=False), "new") == (4, 0, 3, True, True)


def test_an_admission_infeasible_with_live_kv_fails_inv_feasible_admission() -> None:
    v = judge(fs.live_pressure(running=True))
    assert v["INV_feasible_admission"] == "fail" and v["L_feasibility"] == "fail"


def test_an_admission_feasible_with_live_kv_counted_passes() -> None:
    assert judge(fs.live_pressure(running=False))["INV_feasible_admission"] == "pass"


def test_a_running_requests_hit_on_a_claims_block_is_protected_not_also_live() -> None:
    assert feas(fs.hit_while_running(on_claim=True), "new")[:3] == (2, 1, 1)


def test_a_running_requests_hit_on_unclaimed_blocks_is_live() -> None:
    assert feas(fs.hit_while_running(on_claim=False), "new")[:3] == (2, 3, 1)


# -- a refusal is justified only if rebuilt infeasible -----------------------------------------

def test_a_refusal_of_a_request_that_fit_fails_l3_and_the_refusal_invariant() -> None:
    v = judge(fs.refusal_of(2))
    assert v["L3"] == "fail" and v["INV_refusal_names_protected_claim"] == "fail"
    assert kinds(fs.refusal_of(2))["unjustified_refused"] == "violation"


def test_a_refusal_of_a_request_that_did_not_fit_passes() -> None:
    v = judge(fs.refusal_of(7))
    assert v["L3"] == "pass" and v["INV_refusal_names_protected_claim"] == "pass"
    assert "unjustified_refused" not in kinds(fs.refusal_of(7))


def test_a_refusal_naming_a_claim_that_protected_nothing_is_a_violation() -> None:
    events = fs.refusal_naming_idle(name_idle=True)
    assert kinds(events)["refusal_names_claim_holding_no_blocks"] == "violation"
    assert judge(events)["INV_refusal_names_protected_claim"] == "fail"


def test_a_refusal_naming_only_the_claims_whose_blocks_were_needed_is_no_violation() -> None:
    events = fs.refusal_naming_idle(name_idle=False)
    assert "refusal_names_claim_holding_no_blocks" not in kinds(events)
    assert judge(events)["INV_refusal_names_protected_claim"] == "pass"


def test_the_refusals_figures_are_rebuilt_every_one_compared() -> None:
    t = vs.reconstruct_events(fs.refusal_of(2))
    rows = t.con.sql("SELECT detail FROM findings WHERE kind = 'feasibility_figure_mismatch'"
                     ).fetchall()
    assert any("shortfall rebuilt from the trace 0, the runtime reported 1" in d
               for (d,) in rows)
    (short, runtime), = t.con.sql("SELECT shortfall_blocks, runtime_shortfall_blocks "
                                  "FROM requests WHERE request_id = 'x'").fetchall()
    assert (short, runtime) == (0, 1)


# -- non-enforcing policies: expected differences are info ---------------------------------------

def test_a_disagreement_under_a_policy_that_enforces_nothing_is_info() -> None:
    events = shapes.capacity_probe("native-claim", claim_mode="hard_protected")
    assert kinds(events)["feasibility_disagreement"] == "info"
    assert judge(events)["L7"] != "fail"


def test_a_disagreement_under_an_enforcing_policy_is_a_disagreement() -> None:
    assert kinds(fs.live_pressure(running=True))["feasibility_disagreement"] == "disagreement"


# -- chunking does not bound live KV -------------------------------------------------------------

def test_a_chunked_request_judged_on_one_chunk_fails_l_chunking() -> None:
    events = fs.chunked_prefill(counted_blocks=2)
    assert judge(events)["L_chunking"] == "fail"
    assert "chunk_counted_as_need" in kinds(events)


def test_a_chunked_request_judged_on_its_full_prompt_passes_l_chunking() -> None:
    events = fs.chunked_prefill(counted_blocks=6)
    assert feas(events, "c")[2] == 6
    assert judge(events)["L_chunking"] == "pass"


def test_l_chunking_is_not_exercised_without_chunked_prefill() -> None:
    assert judge(fs.live_pressure(running=False))["L_chunking"] == "not_exercised"


# -- no vacuous pass -----------------------------------------------------------------------------

def test_inv_no_protected_loss_is_not_exercised_in_a_run_with_no_loss() -> None:
    assert judge(shapes.capacity_probe("hard", policy="hard_protected",
                                       claim_mode="hard_protected"))[
        "INV_no_protected_loss"] == "not_exercised"


def test_inv_no_protected_loss_passes_on_a_loss_beside_a_kept_hard_claim() -> None:
    assert judge(fs.hard_loss(claims_block=False))["INV_no_protected_loss"] == "pass"


def test_inv_release_precedes_loss_is_not_exercised_when_the_released_claim_lost_nothing() -> None:
    assert judge(vs.demoted_without_loss())["INV_release_precedes_loss"] == "not_exercised"


def test_inv_release_precedes_loss_passes_when_the_released_claim_lost_content() -> None:
    assert judge(vs.demoted_beside_released())["INV_release_precedes_loss"] == "pass"


def test_inv_feasible_admission_is_not_exercised_with_nothing_protected() -> None:
    assert judge(fs.no_claim_admissions())["INV_feasible_admission"] == "not_exercised"


def test_l7_is_not_exercised_by_finished_requests_with_nothing_cached() -> None:
    assert judge(fs.no_claim_admissions())["L7"] == "not_exercised"


def test_l7_is_exercised_by_a_finished_request_with_cached_tokens() -> None:
    assert judge(vs.full_prompt_hit(reported_blocks=3))["L7"] == "pass"


def test_a_materialized_report_of_an_unaccepted_claim_fails_l6() -> None:
    events = fs.hard_loss(claims_block=False)
    i = next(i for i, e in enumerate(events) if e["event"] == "request_finished")
    events.insert(i, {**events[i], "event": "claim_materialized", "claim_id": "claim:ghost"})
    for k in ("request_id", "finish_reason", "num_cached_tokens", "num_output_tokens"):
        events[i].pop(k, None)
    assert judge(events)["L6"] == "fail"


def test_a_materialized_report_of_an_accepted_resident_claim_passes_l6() -> None:
    events = fs.hard_loss(claims_block=False)
    i = next(i for i, e in enumerate(events) if e["event"] == "request_finished")
    events.insert(i, {**events[i], "event": "claim_materialized", "claim_id": fs.CLAIM})
    for k in ("request_id", "finish_reason", "num_cached_tokens", "num_output_tokens"):
        events[i].pop(k, None)
    assert judge(events)["L6"] == "pass"


# -- one check table -----------------------------------------------------------------------------

def test_the_docs_check_table_is_the_generated_one() -> None:
    assert checks_markdown() in (DOCS / "conformance.md").read_text(encoding="utf-8")


def test_the_docs_lowering_table_is_the_generated_one() -> None:
    assert lowering_markdown() in (DOCS / "conformance.md").read_text(encoding="utf-8")


def test_the_conformance_table_has_one_row_per_check_of_the_python_table() -> None:
    t = vs.reconstruct_events(vs.demoted_without_loss())
    rows = t.con.sql('SELECT "check", title, needs FROM conformance').fetchall()
    assert rows == [(c.name, c.title, c.needs) for c in sorted(CHECKS, key=lambda c: c.ord)]


def test_no_doc_mentions_the_retired_not_applicable_verdict() -> None:
    for name in ("conformance.md", "reconstruction.md", "design.md"):
        assert "not_applicable" not in (DOCS / name).read_text(encoding="utf-8"), name


# -- preemption figures are rebuilt, not copied ------------------------------------------------

def _preempted_reporting(protected: int) -> vs.Events:
    events = vs.preempted_by_pinned()
    for e in events:
        if e["event"] == "request_preempted":
            e["protected_blocks"] = protected
    return events


def test_a_preemptions_protected_figure_that_disagrees_is_a_finding_and_rebuilt() -> None:
    events = _preempted_reporting(0)
    t = vs.reconstruct_events(events)
    rows = t.con.sql("SELECT detail FROM findings WHERE kind = 'feasibility_figure_mismatch' "
                     "AND detail LIKE 'request_preempted%'").fetchall()
    assert len(rows) == 1 and "protected blocks rebuilt from the trace 6" in rows[0][0]
    assert t.con.sql("SELECT preempted_protected_blocks, runtime_preempted_protected_blocks "
                     "FROM requests WHERE request_id = 'grow'").fetchall() == [(6, 0)]


def test_a_preemptions_protected_figure_that_agrees_is_no_finding() -> None:
    t = vs.reconstruct_events(_preempted_reporting(6))
    assert t.con.sql("SELECT count(*) FROM findings WHERE kind = 'feasibility_figure_mismatch' "
                     "AND detail LIKE 'request_preempted%'").fetchall() == [(0,)]


# -- explain shows the rebuilt figures ---------------------------------------------------------

def _explain_refusal(tmp_path: Path, need: int) -> str:
    trace = tmp_path / "refusal.jsonl"
    trace.write_text("".join(json.dumps(e) + "\n" for e in fs.refusal_of(need)),
                     encoding="utf-8")
    with kvclaims.open([trace]) as audit:
        return explain(audit, "tenant-b", request="x").to_text()


def test_explain_tells_a_refusal_with_the_rebuilt_shortfall_not_the_runtimes(
        tmp_path: Path) -> None:
    # the runtime reported shortfall 1; the trace shows 2 protected + 2 needed <= 8: 0
    text = _explain_refusal(tmp_path, 2)
    assert "you needed 2" in text and "shortfall 0" in text and "shortfall 1" not in text


def test_explain_tells_a_justified_refusal_with_its_shortfall(tmp_path: Path) -> None:
    text = _explain_refusal(tmp_path, 7)
    assert "you needed 7" in text and "shortfall 1" in text


# -- the report shows the rebuilt figures and the derived lowering ---------------------------------

def _report(tmp_path: Path, events: vs.Events) -> str:
    from kvclaims.dashboard import data
    from kvclaims.dashboard.report import build_report

    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(e) + "\n" for e in events), encoding="utf-8")
    return build_report(data.load_audit([trace]))


def test_the_report_lists_a_refusal_with_rebuilt_and_runtime_figures(tmp_path: Path) -> None:
    page = _report(tmp_path, fs.refusal_of(2))
    section = page.split("<h2>Capacity decisions</h2>")[1].split("<h2>")[0]
    assert "live_blocks" in section and "runtime_shortfall_blocks" in section
    assert "refused" in section


def test_the_report_has_no_capacity_rows_without_a_notable_decision(tmp_path: Path) -> None:
    page = _report(tmp_path, fs.live_pressure(running=False))
    section = page.split("<h2>Capacity decisions</h2>")[1].split("<h2>")[0]
    assert "No deferral, refusal, preemption or infeasible admission" in section


def test_the_listeners_not_exercised_list_is_the_checks_needing_the_engine() -> None:
    from kvclaims.sources.kv_events import NOT_EXERCISED

    assert set(NOT_EXERCISED) == {c.name for c in CHECKS if c.needs_engine}
