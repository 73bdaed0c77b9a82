"""Golden tests of the reconstructor over the hand-made fixtures (tests/fixtures/*.jsonl)."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kvclaims.cli import main
from kvclaims.reconstruct import core, loader
from kvclaims.sources import shapes

FIX = Path(__file__).parent / "fixtures"


def recon(*names: str, truncated: tuple[str, ...] = (), threads: int | None = None
          ) -> core.Tables:
    """Reconstruct fixtures by name (as a Trace, so truncation can be declared)."""
    events = core.load_jsonl([FIX / f"{n}.jsonl" for n in names])
    trace = loader.Trace(events=events, manifests={}, truncated_runs=set(truncated))
    return core.reconstruct(trace, threads=threads)


def rows(tables: core.Tables, sql: str) -> list[tuple]:
    return tables.con.sql(sql).fetchall()


def labels(tables: core.Tables) -> dict[str, int]:
    return dict(rows(tables, "SELECT label, count(*) FROM losses GROUP BY label"))


def test_fixtures_are_up_to_date_with_shapes(tmp_path: Path) -> None:
    for path in shapes.write_all(tmp_path):
        assert path.read_text() == (FIX / path.name).read_text(), path.name


# -- the paper's 60/70/80 shapes ---------------------------------------------------------------

def test_native_loses_50_blocks_all_eviction() -> None:
    t = recon("native_60_70_80")
    assert labels(t) == {"eviction": 50}


def test_native_evicts_tail_first_positions_10_to_59() -> None:
    t = recon("native_60_70_80")
    lost = {r[0] for r in rows(t, "SELECT block_id FROM losses")}
    assert lost == set(range(11, 61))  # block id = position + 1


def test_unenforced_claim_loses_50_blocks_all_harm_first_at_first_loss() -> None:
    t = recon("unenforced_60_70_80")
    assert labels(t) == {"harm": 50}
    (first_loss,), = rows(t, "SELECT min(seq) FROM losses")
    (outcome, first_harm, value_lost), = rows(
        t, "SELECT outcome, first_harm_seq, value_lost FROM claims")
    assert (outcome, first_harm, value_lost) == ("harmed", first_loss, 1.0)


def test_hard_claim_refuses_active_naming_claim_with_shortfall_50() -> None:
    t = recon("hard_60_70_80")
    assert labels(t) == {}
    (outcome, blocking, shortfall), = rows(
        t, "SELECT outcome, blocking_claim_ids, shortfall_blocks FROM requests "
           "WHERE request_id = 'active'")
    assert (outcome, blocking, shortfall) == ("refused", ["claim:resident"], 50)


def test_hard_claim_with_room_is_preserved() -> None:
    t = recon("hard_60_70_130")
    assert rows(t, "SELECT outcome FROM claims") == [("preserved",)]
    assert rows(t, "SELECT outcome FROM requests WHERE request_id='active'") == [("served",)]


def test_demote_precedes_first_loss_and_losses_are_relaxation() -> None:
    t = recon("demote_60_70_80")
    assert labels(t) == {"relaxation": 50}
    (demoted, first), = rows(t, "SELECT release_seq, (SELECT min(seq) FROM losses) FROM claims")
    assert demoted < first
    assert rows(t, "SELECT DISTINCT decided_by_seq FROM losses") == [(demoted,)]


def test_ttl_expiry_precedes_first_loss_and_losses_are_expiry() -> None:
    t = recon("ttl_60_70_80")
    assert labels(t) == {"expiry": 50}
    (expired, event, first), = rows(
        t, "SELECT release_seq, release_event, (SELECT min(seq) FROM losses) FROM claims")
    assert event == "claim_expired" and expired < first


def test_write_no_admit_serves_active_and_still_evicts_residents() -> None:
    t = recon("write_no_admit_60_70_80")
    assert labels(t) == {"eviction": 50}
    assert rows(t, "SELECT outcome, reuse_denied FROM requests WHERE request_id='active'") == [
        ("served", True)]


def test_position_zero_lost_means_never_materialized_even_with_59_of_60() -> None:
    t = recon("l6_position_zero")
    assert rows(t, "SELECT outcome, materialized_seq FROM claims") == [
        ("never_materialized", None)]
    assert labels(t) == {"eviction": 2}


# -- one behaviour per shape -------------------------------------------------------------------

def test_block_under_two_claims_gets_most_severe_label() -> None:
    t = recon("multi_claim")
    assert rows(t, "SELECT label, claim_ids FROM losses") == [("harm", ["claim:a", "claim:b"])]
    assert rows(t, "SELECT claim_id, label FROM loss_claims ORDER BY claim_id") == [
        ("claim:a", "harm"), ("claim:b", "relaxation")]


def test_loss_claims_carry_claim_facts_and_predicate() -> None:
    t = recon("multi_claim")
    r = rows(t, "SELECT tenant, protection_mode, predicate_before, predicate_after, "
                "breaks_predicate FROM loss_claims WHERE claim_id='claim:a'")
    assert r == [("tenant-a", "hard_protected", True, False, True)]


def test_evicted_hash_is_resolved_from_last_block_cached() -> None:
    t = recon("rematerialize")
    (h,), = rows(t, "SELECT block_hash FROM losses ORDER BY seq LIMIT 1")
    assert h == shapes.block_hash("r", 0)


def test_recached_block_rematerializes_and_second_copy_keeps_predicate() -> None:
    t = recon("rematerialize")
    assert [r[0] for r in rows(t, "SELECT label FROM losses ORDER BY seq")] == [
        "harm", "eviction", "harm"]


def test_cache_reset_loses_every_resident_block_with_reset_seq() -> None:
    t = recon("reset")
    (reset_seq,), = rows(t, "SELECT seq FROM events WHERE event='cache_reset'")
    r = rows(t, "SELECT block_id, cause, label FROM losses WHERE seq = $s ORDER BY block_id"
             .replace("$s", str(reset_seq)))
    assert r == [(1, "reset", "harm"), (2, "reset", "harm")]


def test_losses_after_first_gap_are_unknown() -> None:
    t = recon("gap")
    assert [r[0] for r in rows(t, "SELECT label FROM losses ORDER BY seq")] == ["harm", "unknown"]


def test_truncated_run_turns_preserved_into_unknown() -> None:
    assert rows(recon("truncated"), "SELECT outcome FROM claims") == [("preserved",)]
    assert rows(recon("truncated", truncated=("truncated",)),
                "SELECT outcome FROM claims") == [("unknown",)]


def test_rejected_claim_content_loss_is_eviction() -> None:
    t = recon("rejected")
    assert labels(t) == {"eviction": 1}
    assert rows(t, "SELECT outcome, value_lost FROM claims") == [("rejected", 0.0)]


def test_never_materialized_claim_loss_is_eviction() -> None:
    t = recon("never_materialized")
    assert labels(t) == {"eviction": 1}
    assert rows(t, "SELECT outcome FROM claims") == [("never_materialized",)]


def test_never_submitted_claim_makes_loss_unknown() -> None:
    t = recon("never_submitted")
    assert labels(t) == {"unknown": 1}
    assert rows(t, "SELECT outcome FROM claims") == [("unknown",)]
    assert rows(t, "SELECT kind FROM findings") == [("claim_never_submitted",)]


def test_loss_beyond_threshold_is_eviction_loss_of_position_zero_is_harm() -> None:
    t = recon("threshold")
    assert [r[0] for r in rows(t, "SELECT label FROM losses ORDER BY seq")] == [
        "eviction", "harm"]


def test_release_then_loss_is_relaxation() -> None:
    t = recon("released")
    assert labels(t) == {"relaxation": 1}
    assert rows(t, "SELECT outcome FROM claims") == [("released",)]


def test_request_outcomes_preempted_aborted_deferred_then_served() -> None:
    t = recon("requests")
    assert dict(rows(t, "SELECT request_id, outcome FROM requests")) == {
        "p": "preempted", "a": "aborted", "d": "deferred_then_served"}


def test_feasibility_row_for_every_admission_decision() -> None:
    t = recon("hard_60_70_80")
    r = rows(t, "SELECT decision, protected_blocks, blocks_required, usable_blocks, feasible, "
                "shortfall_blocks FROM feasibility WHERE request_id='active'")
    assert r == [("deferred", 60, 70, 80, False, 50), ("refused", 60, 70, 80, False, 50)]


def test_runs_never_mix_even_with_same_blocks_and_hashes() -> None:
    # unenforced and native share block ids and block hashes; native has no claim
    t = recon("native_60_70_80", "unenforced_60_70_80")
    assert dict(rows(t, "SELECT run_id, list(DISTINCT label) FROM losses GROUP BY run_id")) == {
        "native-60-70-80": ["eviction"], "unenforced-60-70-80": ["harm"]}


def test_every_label_carries_its_evidence() -> None:
    t = recon("unenforced_60_70_80", "demote_60_70_80", "ttl_60_70_80")
    missing = rows(t, "SELECT count(*) FROM losses WHERE decided_by_seq IS NULL "
                      "OR by_request_id IS NULL OR seq IS NULL")
    assert missing == [(0,)]


def test_missing_harm_report_is_a_finding() -> None:
    events = [e for e in shapes.SHAPES["unenforced_60_70_80"]() if e["event"] != "claim_harmed"]
    t = core.reconstruct(_table(events))
    assert ("harm_not_reported",) in rows(t, "SELECT kind FROM findings")


def test_reported_harm_is_no_finding_of_a_missing_report() -> None:
    t = core.reconstruct(_table(shapes.SHAPES["unenforced_60_70_80"]()))
    assert ("harm_not_reported",) not in rows(t, "SELECT kind FROM findings")


def test_removed_event_without_gap_is_a_seq_hole_and_unknown() -> None:
    events = shapes.SHAPES["unenforced_60_70_80"]()
    first_loss = next(i for i, e in enumerate(events) if e["event"] == "block_evicted")
    del events[first_loss - 1]
    t = core.reconstruct(_table(events, renumber=False))
    assert labels(t) == {"unknown": 50}
    assert ("seq_hole",) in rows(t, "SELECT kind FROM findings")


def _table(events: list[dict], renumber: bool = True) -> pa.Table:
    from kvclaims.sources.jsonl import events_to_table
    if renumber:  # a mutated trace as a runtime would have written it: dense seqs
        events = [{**e, "seq": i} for i, e in enumerate(events)]
    batches = [loader.decode_batch(b) for b in events_to_table(events).to_batches()]
    return pa.Table.from_batches(batches, schema=loader.EVENTS_SCHEMA)


# -- CLI ---------------------------------------------------------------------------------------

def test_cli_reconstruct_writes_every_table_as_parquet(tmp_path: Path, capsys) -> None:
    assert main(["reconstruct", str(FIX / "native_60_70_80.jsonl"), "--out",
                 str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        f"{n}.parquet" for n in set(core.TABLE_NAMES) | set(core.VERDICT_TABLES))
    assert pq.read_table(tmp_path / "losses.parquet").num_rows == 50


def test_cli_reconstruct_json_summary(tmp_path: Path, capsys) -> None:
    assert main(["reconstruct", str(FIX / "unenforced_60_70_80.jsonl"), "--out",
                 str(tmp_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["runs"][0]["labels"] == {"harm": 50}


def test_cli_reconstruct_run_dir_writes_next_to_run(tmp_path: Path, capsys) -> None:
    from kvclaims.sources.jsonl import import_jsonl
    run = tmp_path / "run"
    import_jsonl(FIX / "ttl_60_70_80.jsonl", run)
    assert main(["reconstruct", str(run)]) == 0
    assert pq.read_table(run / "reconstructed" / "losses.parquet").num_rows == 50


def test_cli_reconstruct_missing_path_is_a_clean_error(tmp_path: Path, capsys) -> None:
    assert main(["reconstruct", str(tmp_path / "nope")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_a_run_without_its_head_labels_every_loss_unknown() -> None:
    events = shapes.SHAPES["unenforced_60_70_80"]()[300:]  # the first 300 events are gone
    t = core.reconstruct(_table(events, renumber=False))
    assert set(labels(t)) == {"unknown"}
    assert ("missing_head",) in rows(t, "SELECT kind FROM findings")


def test_a_run_with_its_head_has_no_missing_head_finding() -> None:
    t = core.reconstruct(_table(shapes.SHAPES["unenforced_60_70_80"]()))
    assert ("missing_head",) not in rows(t, "SELECT kind FROM findings")
    assert "unknown" not in labels(t)


def test_a_stage_statement_that_fails_is_named_in_the_error_s_first_line() -> None:
    con = duckdb.connect()
    con.execute("CREATE VIEW events AS SELECT 1 AS seq")  # no run_id: stage 01 cannot bind
    with pytest.raises(duckdb.BinderException) as err:
        core.run_stages(con)
    first = str(err.value).splitlines()[0]
    assert first.startswith("Binder Error: ")
    assert first.endswith("[in 01_runs.sql, statement 1 of 4 (kv_ev_runs)]")


@pytest.mark.parametrize("threads", [1, 2])
def test_the_configured_thread_count_holds_after_the_stages(threads: int) -> None:
    # 08_conformance runs one statement on one thread and restores the count it found
    t = recon("native_60_70_80", threads=threads)
    assert t.con.execute("SELECT current_setting('threads')").fetchone()[0] == threads
