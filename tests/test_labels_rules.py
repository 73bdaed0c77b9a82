"""One behaviour per labelling rule, each with its negative twin (docs/reconstruction.md,
"Labels"): claim instances, step-level predicates, mode promises, hook failures and the
rebuilt feasibility. Fixtures: kvclaims/sources/shapes.py -> tests/fixtures/*.jsonl."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from kvclaims.reconstruct import core, labels, loader

FIX = Path(__file__).parent / "fixtures"


def recon(name: str) -> core.Tables:
    events = core.load_jsonl([FIX / f"{name}.jsonl"])
    return core.reconstruct(loader.Trace(events=events, manifests={}, truncated_runs=set()))


def rows(t: core.Tables, sql: str) -> list[tuple]:
    return t.con.sql(sql).fetchall()


def loss_labels(t: core.Tables) -> list[str]:
    return [r[0] for r in rows(t, "SELECT label FROM losses ORDER BY seq, block_id")]


def pair_labels(t: core.Tables) -> list[tuple[int, str]]:
    """(claim_seq, label) of each loss_claims row, in claim_seq order."""
    return rows(t, "SELECT claim_seq, label FROM loss_claims ORDER BY seq, claim_seq")


# -- 1. claim instances ------------------------------------------------------------------------

FIRST_LABEL = {"released": "relaxation", "expired": "expiry", "demoted": "relaxation"}


@pytest.mark.parametrize("end", ["released", "expired", "demoted"])
def test_loss_of_a_reused_claim_id_harms_its_second_instance(end: str) -> None:
    t = recon(f"reuse_{end}")
    (first, second), = rows(t, "SELECT min(seq), max(seq) FROM events "
                               "WHERE event = 'claim_submitted'")
    assert pair_labels(t) == [(first, FIRST_LABEL[end]), (second, "harm")]
    assert loss_labels(t) == ["harm"]
    assert rows(t, "SELECT claim_seq, decided_by_claim_id FROM losses") == [
        (second, "claim:a")]


@pytest.mark.parametrize("end", ["released", "expired", "demoted"])
def test_twin_without_a_second_declaration_is_the_first_instances_label(end: str) -> None:
    t = recon(f"reuse_{end}_once")
    assert [lab for _, lab in pair_labels(t)] == [FIRST_LABEL[end]]
    assert loss_labels(t) == [FIRST_LABEL[end]]


def test_claim_id_declared_again_after_rejection_is_harmed() -> None:
    t = recon("reuse_rejected")
    (second,), = rows(t, "SELECT max(seq) FROM events WHERE event = 'claim_submitted'")
    assert pair_labels(t) == [(second, "harm")]


def test_twin_rejected_claim_alone_loses_nothing_it_was_promised() -> None:
    t = recon("reuse_rejected_once")
    assert pair_labels(t) == []
    assert loss_labels(t) == ["eviction"]


def test_every_claim_event_carries_its_instance() -> None:
    t = recon("reuse_released")
    seqs = rows(t, "SELECT DISTINCT claim_seq FROM kv_claim_ev ORDER BY 1")
    subs = rows(t, "SELECT seq FROM events WHERE event = 'claim_submitted' ORDER BY 1")
    assert seqs == subs
    assert rows(t, "SELECT count(*) FROM kv_claim_facts") == [(2,)]


# -- 2. step-level predicates ------------------------------------------------------------------

def test_loss_repaired_within_its_step_is_eviction_flagged_repaired() -> None:
    t = recon("step_repaired")
    assert loss_labels(t) == ["eviction"]
    assert rows(t, "SELECT label, repaired_in_step, predicate_after FROM loss_claims") == [
        ("eviction", True, False)]
    assert rows(t, "SELECT repaired_in_step FROM losses") == [(True,)]


def test_twin_content_back_only_in_the_next_step_is_harm() -> None:
    t = recon("step_not_repaired")
    assert loss_labels(t) == ["harm"]
    assert rows(t, "SELECT repaired_in_step FROM loss_claims") == [(False,)]


def test_twin_without_steps_each_event_is_judged_harm() -> None:
    t = recon("step_repaired_stepless")
    assert loss_labels(t) == ["harm"]
    assert rows(t, "SELECT step, repaired_in_step FROM loss_claims") == [(None, False)]


def test_materialization_is_judged_at_the_end_of_a_step() -> None:
    t = recon("step_repaired")
    (mat,), = rows(t, "SELECT materialized_seq FROM kv_materialized")
    (last_of_step1,), = rows(t, "SELECT max(seq) FROM events WHERE step = 1")
    assert mat == last_of_step1


# -- 3. what the mode promised -----------------------------------------------------------------

def test_best_effort_loss_is_eviction() -> None:
    assert loss_labels(recon("mode_best_effort")) == ["eviction"]


def test_twin_hard_protected_loss_under_native_is_harm() -> None:
    assert loss_labels(recon("mode_hard_protected")) == ["harm"]


def test_soft_loss_with_a_lower_priority_evictable_block_is_harm() -> None:
    assert loss_labels(recon("soft_lower_evictable")) == ["harm"]


def test_twin_soft_loss_without_a_lower_priority_evictable_block_is_eviction() -> None:
    assert loss_labels(recon("soft_no_lower")) == ["eviction"]


# -- 4. hook failures --------------------------------------------------------------------------

def test_loss_after_a_hook_failure_is_unknown() -> None:
    assert loss_labels(recon("hook_failed_before")) == ["unknown"]


def test_twin_loss_before_the_hook_failure_stays_harm() -> None:
    assert loss_labels(recon("hook_failed_after")) == ["harm"]


# -- 5. feasibility, rebuilt -------------------------------------------------------------------

def _active_admission(t: core.Tables) -> tuple:
    (row,) = rows(t, "SELECT protected_blocks, required_blocks, usable_blocks, feasible, "
                     "runtime_protected_blocks, runtime_feasible, agrees FROM feasibility "
                     "WHERE request_id = 'active' AND event = 'request_admitted'")
    return row


def test_native_admission_over_a_resident_claim_is_infeasible_60_plus_70_over_80() -> None:
    assert _active_admission(recon("unenforced_60_70_80")) == (60, 70, 80, False, 0, True,
                                                               False)


def test_twin_same_admission_with_130_usable_is_feasible() -> None:
    assert _active_admission(recon("unenforced_60_70_130")) == (60, 70, 130, True, 0, True,
                                                                True)


def test_twin_no_claim_protects_nothing() -> None:
    assert _active_admission(recon("native_60_70_80")) == (0, 70, 80, True, 0, True, True)


def test_admission_state_names_the_protecting_claim_instance() -> None:
    t = recon("unenforced_60_70_80")
    (sub,), = rows(t, "SELECT seq FROM events WHERE event = 'claim_submitted'")
    assert rows(t, "SELECT protected_claim_seqs FROM feasibility "
                   "WHERE request_id = 'active'") == [([sub],)]


def _dense_feasibility(tmp_path: Path) -> core.Tables:
    import kvclaims
    from kvclaims.sources import synthetic
    synthetic.write_trace(tmp_path / "dense", 40_000, run_id="dense", progress=False,
                          shape=synthetic.SHAPES["dense"])
    return kvclaims.open([tmp_path / "dense"], reuse=False)


def test_admission_state_lists_protecting_instances_in_claim_seq_order(tmp_path: Path) -> None:
    lists = [r[0] for r in rows(_dense_feasibility(tmp_path),
                                "SELECT protected_claim_seqs FROM kv_admission_state")]
    assert any(len(x) >= 2 for x in lists)
    assert all(x == sorted(set(x)) for x in lists)


def test_twin_an_instance_released_before_the_decision_is_never_listed(tmp_path: Path) -> None:
    t = _dense_feasibility(tmp_path)
    released = rows(t, "SELECT count(*) FROM claims WHERE release_seq IS NOT NULL")[0][0]
    listed_after_release = rows(t, """
        SELECT count(*) FROM kv_admission_state a, unnest(a.protected_claim_seqs) AS u(cs)
        JOIN claims c ON c.run_id = a.run_id AND c.claim_seq = u.cs
        WHERE c.release_seq IS NOT NULL AND c.release_seq < a.seq""")[0][0]
    assert released > 0 and listed_after_release == 0


# -- 6. per-loss and per-decision facts the pass hands to the SQL stages ------------------------

def test_pinning_acceptance_at_the_losss_own_seq_is_in_force() -> None:
    # accepted at 5, released at 9: in force at 5..8 (an acceptance at the loss's seq counts)
    got = labels.pinned_in_force(np.array([5]), np.array([9]), np.array([4, 5, 8]))
    assert got.tolist() == [False, True, True]


def test_twin_release_at_the_losss_own_seq_ends_the_force() -> None:
    got = labels.pinned_in_force(np.array([5]), np.array([9]), np.array([9, 10]))
    assert got.tolist() == [False, False]


def test_protected_claim_ids_list_each_claim_once_in_order() -> None:
    vals, off = labels.distinct_sorted(np.array([3, 1, 3, 2, 7, 7]), np.array([0, 4, 6]))
    assert vals.tolist() == [1, 2, 3, 7] and off.tolist() == [0, 3, 4]


def test_twin_a_decision_without_protecting_instances_lists_none() -> None:
    vals, off = labels.distinct_sorted(np.array([4, 4]), np.array([0, 0, 2, 2]))
    assert vals.tolist() == [4] and off.tolist() == [0, 0, 1, 1]


def test_a_take_of_the_runs_ids_is_encoded_over_the_ids_taken_only() -> None:
    ids = pc.dictionary_encode(pa.array(["a", "b", "c", "d"]))
    got = labels.take_compact(ids, np.array([3, 1, 3]))
    assert got.to_pylist() == ["d", "b", "d"] and got.dictionary.to_pylist() == ["b", "d"]


def test_twin_a_take_where_not_valid_is_null_and_encodes_no_id_for_it() -> None:
    ids = pc.dictionary_encode(pa.array(["a", "b", "c", "d"]))
    got = labels.take_compact(ids, np.array([-1, 2]), np.array([False, True]))
    assert got.to_pylist() == [None, "c"] and got.dictionary.to_pylist() == ["c"]
