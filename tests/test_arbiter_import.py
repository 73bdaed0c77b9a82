"""Importer of the paper prototype's JSON Lines telemetry (kvclaims/sources/arbiter_traces.py).

Real inputs only: the eight shipped reference traces (traces/arbiter-prototype/) and small
hand-written fixtures in the prototype's vocabulary (tests/fixtures/arbiter/: a 6-block
resident prefix, a 7-block active request, 8 usable blocks -- the 60/70/80 shapes scaled down,
so 5 resident blocks are lost, positions 1..5, and position 0 survives).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvclaims.sources.arbiter_traces import (
    REPEAT_ADMISSION,
    RUNTIME,
    RUNTIME_VERSION,
    convert_file,
    convert_lines,
    parse_block_hash,
)
from kvclaims.contract.schema import InputError, check_event, hash64

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT / "traces" / "arbiter-prototype"
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "arbiter"

TRACE_NAMES = ["native_80", "write_no_admit_80", "hard_resident_exclude_80", "native_130",
               "demote", "expire", "claim_metadata_60_70_80", "live_scheduler_pressure"]
FIXTURE_NAMES = ["native_6_7_8", "hard_6_7_8", "demote_6_7_8", "expire_6_7_8",
                 "claim_metadata_6_7_8"]
ALL_FILES = [TRACES / f"{n}.jsonl" for n in TRACE_NAMES] + \
            [FIXTURES / f"{n}.jsonl" for n in FIXTURE_NAMES]

_CACHE: dict[Path, list[dict[str, Any]]] = {}


def convert(path: Path) -> list[dict[str, Any]]:
    """Convert once per test session (the traces are read-only inputs)."""
    if path not in _CACHE:
        _CACHE[path] = convert_file(path)
    return _CACHE[path]


def trace(name: str) -> list[dict[str, Any]]:
    return convert(TRACES / f"{name}.jsonl")


def fixture(name: str) -> list[dict[str, Any]]:
    return convert(FIXTURES / f"{name}.jsonl")


def of(events: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [e for e in events if e["event"] == name]


def lost_positions(events: list[dict[str, Any]]) -> list[int]:
    """Logical positions of cached content that a block_evicted destroyed, in loss order."""
    position = {e["block_hash"]: e["position"] for e in of(events, "block_cached")}
    return [position[e["block_hash"]] for e in of(events, "block_evicted")]


def first_seq(events: list[dict[str, Any]], name: str) -> int:
    return of(events, name)[0]["seq"]


def lines_of(*records: dict[str, Any]) -> list[str]:
    return [json.dumps(r) for r in records]


def proto(event: str, **fields: Any) -> dict[str, Any]:
    """A prototype record with its envelope."""
    rec = {"schema_version": 1, "timestamp_ns": 10, "run_id": "r", "event": event,
           "request_id": "active", "claim_id": None, "prefix_id": None, "policy": "native",
           "usable_blocks": 8}
    rec.update(fields)
    return rec


# --- shipped traces and fixtures: well-formed output ---------------------------------------


def test_eight_reference_traces_are_shipped() -> None:
    assert sorted(p.stem for p in TRACES.glob("*.jsonl")) == sorted(TRACE_NAMES)
    assert (TRACES / "README.md").is_file()


@pytest.mark.parametrize("path", ALL_FILES, ids=lambda p: p.stem)
def test_every_converted_event_passes_check_event(path: Path) -> None:
    for event in convert(path):
        check_event(event)


@pytest.mark.parametrize("path", ALL_FILES, ids=lambda p: p.stem)
def test_seq_is_strictly_increasing_in_file_order(path: Path) -> None:
    seqs = [e["seq"] for e in convert(path)]
    assert seqs == list(range(len(seqs)))


@pytest.mark.parametrize("path", ALL_FILES, ids=lambda p: p.stem)
def test_run_is_framed_by_synthetic_start_and_finish(path: Path) -> None:
    events = convert(path)
    assert events[0]["event"] == "run_started" and events[-1]["event"] == "run_finished"
    assert len(of(events, "run_started")) == 1 and len(of(events, "run_finished")) == 1
    assert events[-1]["events_written"] == len(events) - 1
    assert events[-1]["events_dropped"] == 0


@pytest.mark.parametrize("path", ALL_FILES, ids=lambda p: p.stem)
def test_ts_ns_comes_from_the_prototype_timestamps(path: Path) -> None:
    stamps = [json.loads(line)["timestamp_ns"] for line in path.read_text().splitlines()]
    events = convert(path)
    assert events[0]["ts_ns"] == stamps[0] and events[-1]["ts_ns"] == stamps[-1]
    assert {e["ts_ns"] for e in events} <= set(stamps)


def test_run_started_records_runtime_and_the_traces_labels() -> None:
    start = trace("native_80")[0]
    assert start["runtime"] == RUNTIME == "vllm-arbiter-prototype"
    assert start["runtime_version"] == RUNTIME_VERSION == "0.19.1-patched"
    assert start["policy"] == "native" and start["usable_blocks"] == 80
    assert start["run_id"] == "capacity-sweep-native-80"


def test_live_trace_keeps_its_68_usable_label_and_notes_the_null_block() -> None:
    events = trace("live_scheduler_pressure")
    assert events[0]["usable_blocks"] == 68
    notes = " ".join(events.summary.notes)  # type: ignore[attr-defined]
    assert "68 usable" in notes and "67" in notes and "null block" in notes


def test_capacity_sweep_trace_has_no_null_block_note() -> None:
    assert not any("null block" in n for n in trace("native_80").summary.notes)  # type: ignore[attr-defined]


# --- losses ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["native_80", "write_no_admit_80"])
def test_native_pressure_loses_the_tail_positions_10_to_59(name: str) -> None:
    events = trace(name)
    lost = lost_positions(events)
    assert len(lost) == 50
    assert sorted(lost) == list(range(10, 60))
    assert lost[0] == 59  # vLLM frees the finished chain tail-first
    assert set(range(10)).isdisjoint(lost)


def test_losses_are_allocation_evictions_by_the_allocating_request() -> None:
    for e in of(trace("native_80"), "block_evicted"):
        assert e["cause"] == "allocation" and e["by_request_id"] == "active"


def test_free_uncached_victims_are_allocations_not_losses() -> None:
    events = trace("native_130")
    assert of(events, "block_evicted") == []
    assert len(of(events, "block_allocated")) == 130


def test_every_victim_selection_is_an_allocation() -> None:
    events = trace("native_80")
    assert len(of(events, "block_allocated")) == 130
    evicted = of(events, "block_evicted")
    allocated_after = {events[e["seq"] + 1]["block_id"] for e in evicted}
    assert allocated_after == {e["block_id"] for e in evicted}


def test_loss_is_announced_before_the_allocation_of_its_block() -> None:
    events = trace("native_80")
    for e in of(events, "block_evicted"):
        nxt = events[e["seq"] + 1]
        assert nxt["event"] == "block_allocated" and nxt["block_id"] == e["block_id"]


def test_block_cached_carries_parent_hash_of_the_previous_position() -> None:
    cached = of(trace("native_80"), "block_cached")
    assert "parent_hash" not in cached[0]
    for prev, cur in zip(cached, cached[1:]):
        assert cur["parent_hash"] == prev["block_hash"]


def test_write_no_admit_records_reuse_denied_for_the_active_request() -> None:
    denied = of(trace("write_no_admit_80"), "reuse_denied")
    assert [e["request_id"] for e in denied] == ["active"]


def test_native_records_no_reuse_denied() -> None:
    assert of(trace("native_80"), "reuse_denied") == []


def test_native_130_loses_nothing() -> None:
    assert lost_positions(trace("native_130")) == []


# --- claims --------------------------------------------------------------------------------


def test_claim_is_submitted_as_hard_protected_with_its_threshold() -> None:
    events = trace("hard_resident_exclude_80")
    [sub] = of(events, "claim_submitted")
    assert sub["claim_id"] == "claim:resident" and sub["request_id"] == "resident"
    assert sub["protection_mode"] == "hard_protected" and sub["threshold_blocks"] == 60
    assert sub["value"] == 1.0 and "ttl_s" not in sub
    assert first_seq(events, "claim_submitted") < first_seq(events, "claim_accepted")


def test_claim_is_bound_to_each_materialized_position() -> None:
    events = trace("hard_resident_exclude_80")
    bound = of(events, "claim_bound")
    assert [e["position"] for e in bound] == list(range(60))
    cached = {e["block_hash"]: e["position"] for e in of(events, "block_cached")}
    assert all(cached[e["block_hash"]] == e["position"] for e in bound)


@pytest.mark.parametrize("name", ["native_80", "write_no_admit_80", "native_130"])
def test_native_traces_declare_no_claim(name: str) -> None:
    events = trace(name)
    assert not [e for e in events if e["event"].startswith("claim_")]


def test_hard_claim_refuses_the_active_request_naming_the_claim() -> None:
    events = trace("hard_resident_exclude_80")
    [ref] = of(events, "request_refused")
    assert ref["request_id"] == "active" and ref["blocking_claim_ids"] == ["claim:resident"]
    assert ref["shortfall_blocks"] == 50 and ref["protected_blocks"] == 60
    assert ref["blocks_required"] == 70 and ref["free_blocks"] == 20
    assert ref["usable_blocks"] == 80


def test_hard_claim_loses_nothing() -> None:
    assert lost_positions(trace("hard_resident_exclude_80")) == []


@pytest.mark.parametrize("name,release", [("demote", "claim_demoted"),
                                          ("expire", "claim_expired")])
def test_release_strictly_precedes_the_first_of_50_losses(name: str, release: str) -> None:
    events = trace(name)
    assert len(of(events, "block_evicted")) == 50
    assert first_seq(events, release) < first_seq(events, "block_evicted")
    assert of(events, "claim_harmed") == []


def test_demotion_keeps_the_prototypes_arbiter_action_as_reason() -> None:
    [dem] = of(trace("demote"), "claim_demoted")
    assert dem["claim_id"] == "claim:resident" and dem["reason"] == "demote_on_conflict"


def test_unenforced_claim_records_no_release() -> None:
    events = trace("claim_metadata_60_70_80")
    assert of(events, "claim_demoted") == [] and of(events, "claim_expired") == []


def test_claim_metadata_accepts_then_loses_50_after_materialization() -> None:
    events = trace("claim_metadata_60_70_80")
    assert [e["claim_id"] for e in of(events, "claim_accepted")] == ["claim:resident"]
    materialized = first_seq(events, "claim_materialized")
    last_cached = of(events, "block_cached")[-1]["seq"]
    losses = of(events, "block_evicted")
    assert len(losses) == 50
    assert all(e["seq"] > max(materialized, last_cached) for e in losses)


def test_prototype_harm_report_is_kept_with_the_lost_blocks_hash() -> None:
    events = trace("claim_metadata_60_70_80")
    [harm] = of(events, "claim_harmed")
    position = {e["block_hash"]: e["position"] for e in of(events, "block_cached")}
    assert harm["claim_id"] == "claim:resident" and position[harm["block_hash"]] == 59
    assert harm["block_hash"] == of(events, "block_evicted")[0]["block_hash"]


def test_harm_report_order_quirk_is_noted_not_reordered() -> None:
    events = trace("claim_metadata_60_70_80")
    assert first_seq(events, "claim_harmed") < first_seq(events, "block_evicted")
    assert any("precedes the loss" in n for n in events.summary.notes)  # type: ignore[attr-defined]


def test_lost_after_release_lines_are_counted_not_emitted() -> None:
    summary = trace("demote").summary  # type: ignore[attr-defined]
    assert summary.unmapped == {"resident_claim_block_lost_after_release": 50}
    assert summary.input_counts["resident_claim_block_lost_after_release"] == 50


def test_trace_without_unmapped_events_reports_none() -> None:
    assert trace("hard_resident_exclude_80").summary.unmapped == {}  # type: ignore[attr-defined]


# --- live scheduler pressure -----------------------------------------------------------------


def test_live_trace_defers_then_refuses_with_shortfall_19() -> None:
    events = trace("live_scheduler_pressure")
    [deferred] = of(events, "request_deferred")
    [refused] = of(events, "request_refused")
    assert deferred["seq"] < refused["seq"]
    assert deferred["request_id"] == refused["request_id"] == "1-98f251b5"
    assert refused["shortfall_blocks"] == 19 and refused["blocks_required"] == 46
    assert refused["protected_blocks"] == 40
    assert refused["blocking_claim_ids"] == ["claim:live-resident"]
    assert refused["reason"] == "protected_resident_capacity_refused"


def test_live_trace_loses_nothing() -> None:
    assert of(trace("live_scheduler_pressure"), "block_evicted") == []


def test_live_trace_admits_each_request_once_and_counts_repeats() -> None:
    events = trace("live_scheduler_pressure")
    assert [e["request_id"] for e in of(events, "request_admitted")] == ["0-8c32530b"]
    summary = events.summary  # type: ignore[attr-defined]
    assert summary.unmapped[REPEAT_ADMISSION] == 15
    assert summary.unmapped["future_reuse_admitted"] == 16


def test_live_shortfall_inconsistency_with_the_label_is_noted() -> None:
    notes = trace("live_scheduler_pressure").summary.notes  # type: ignore[attr-defined]
    assert any("shortfall 19" in n and "67 allocatable" in n for n in notes)


def test_summary_accounts_for_every_input_line() -> None:
    for name in TRACE_NAMES:
        path = TRACES / f"{name}.jsonl"
        summary = convert(path).summary  # type: ignore[attr-defined]
        assert summary.input_events == len(path.read_text().splitlines())
        assert sum(summary.input_counts.values()) == summary.input_events
        assert summary.output_events == len(convert(path))


# --- the scaled-down fixtures ------------------------------------------------------------------


def test_fixture_native_loses_positions_1_to_5_and_keeps_0() -> None:
    assert lost_positions(fixture("native_6_7_8")) == [5, 4, 3, 2, 1]


def test_fixture_hard_refuses_with_shortfall_5_and_loses_nothing() -> None:
    events = fixture("hard_6_7_8")
    [ref] = of(events, "request_refused")
    assert ref["shortfall_blocks"] == 5 and ref["blocking_claim_ids"] == ["claim:resident"]
    assert of(events, "block_evicted") == []


@pytest.mark.parametrize("name,release", [("demote_6_7_8", "claim_demoted"),
                                          ("expire_6_7_8", "claim_expired")])
def test_fixture_release_precedes_its_5_losses(name: str, release: str) -> None:
    events = fixture(name)
    assert lost_positions(events) == [5, 4, 3, 2, 1]
    assert first_seq(events, release) < first_seq(events, "block_evicted")


def test_fixture_unenforced_claim_keeps_harm_report() -> None:
    events = fixture("claim_metadata_6_7_8")
    [harm] = of(events, "claim_harmed")
    assert harm["block_hash"] == of(events, "block_evicted")[0]["block_hash"]
    assert events.summary.unmapped == {"resident_claim_block_lost_after_release": 4}  # type: ignore[attr-defined]


def test_fixture_integer_hashes_bind_claims() -> None:
    events = fixture("hard_6_7_8")
    assert [e["block_hash"] for e in of(events, "claim_bound")] == [1001 + i for i in range(6)]


# --- block hashes ------------------------------------------------------------------------------


def test_repr_hash_strips_the_group_id_and_keeps_64_bits_of_digest() -> None:
    digest = bytes(range(32))
    raw = repr(digest + (0).to_bytes(4, "big"))
    assert parse_block_hash(raw, "x:1") == hash64(digest) == int.from_bytes(digest[-8:], "big")


def test_repr_hash_in_double_quotes_maps_like_single_quotes() -> None:
    digest = b"\x01" * 8
    single = repr(digest + b"\0\0\0\0")
    double = 'b"' + single[2:-1] + '"'
    assert parse_block_hash(single, "x:1") == parse_block_hash(double, "x:1")


def test_integer_hash_maps_to_its_low_64_bits() -> None:
    assert parse_block_hash(2**64 + 7, "x:1") == 7


def test_other_string_hash_maps_stably() -> None:
    first = parse_block_hash("not-a-bytes-repr", "x:1")
    assert first == parse_block_hash("not-a-bytes-repr", "y:2")
    assert first != parse_block_hash("another", "x:1") and 0 <= first < 2**64


def test_hash_mapping_is_deterministic_across_conversions() -> None:
    path = TRACES / "live_scheduler_pressure.jsonl"
    again = convert_lines(path.read_text().splitlines(), "again")
    assert list(again) == list(convert(path))


def test_two_hashes_colliding_in_64_bits_are_refused() -> None:
    a = repr(b"\xaa" * 8 + b"\0\0\0\0")
    b = repr(b"\xbb" * 24 + b"\xaa" * 8 + b"\0\0\0\0")  # same low 64 bits of digest
    lines = lines_of(
        proto("resident_block_materialized", request_id="resident", block_hash=a,
              logical_block_position=0, physical_block_id=1),
        proto("resident_block_materialized", request_id="resident", block_hash=b,
              logical_block_position=1, physical_block_id=2))
    with pytest.raises(InputError, match=r"t\.jsonl:2: .*same 64-bit hash.*t\.jsonl:1"):
        convert_lines(lines, "t.jsonl")


def test_the_same_hash_seen_twice_is_not_a_collision() -> None:
    h = repr(b"\xaa" * 8 + b"\0\0\0\0")
    lines = lines_of(
        proto("resident_block_materialized", request_id="resident", block_hash=h,
              logical_block_position=0, physical_block_id=1),
        proto("allocation_victim_selected", block_hash=h, physical_block_id=1,
              victim_reason="cached_prefix_reuse"))
    assert len(of(convert_lines(lines, "t.jsonl"), "block_evicted")) == 1


# --- errors --------------------------------------------------------------------------------------


def test_unknown_event_name_is_an_error_naming_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines_of(proto("allocation_victim_selected",
                                             physical_block_id=1, victim_reason="free_uncached"),
                                       proto("resident_claim_teleported"))) + "\n")
    with pytest.raises(InputError, match=r"bad\.jsonl:2: unknown prototype event "
                                         r"'resident_claim_teleported'"):
        convert_file(path)


def test_known_event_without_counterpart_is_counted_not_an_error() -> None:
    events = convert_lines(lines_of(proto("resident_claim_preserved")), "t.jsonl")
    assert events.summary.unmapped == {"resident_claim_preserved": 1}  # type: ignore[attr-defined]


def test_bad_json_is_an_error_naming_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.jsonl"
    path.write_text(json.dumps(proto("future_reuse_denied")) + "\n{\"event\": \n")
    with pytest.raises(InputError, match=r"broken\.jsonl:2: bad JSON"):
        convert_file(path)


def test_non_object_line_is_an_error() -> None:
    with pytest.raises(InputError, match=r"t\.jsonl:1: expected a JSON object"):
        convert_lines(["[1, 2]"], "t.jsonl")


def test_blank_lines_are_skipped_but_line_numbers_stay_true() -> None:
    lines = ["", json.dumps(proto("future_reuse_denied")), "  ", "{oops"]
    with pytest.raises(InputError, match=r"t\.jsonl:4: bad JSON"):
        convert_lines(lines, "t.jsonl")


def test_invalid_utf8_is_an_error_naming_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bytes.jsonl"
    path.write_bytes(json.dumps(proto("future_reuse_denied")).encode() + b"\n\xff\xfe\n")
    with pytest.raises(InputError, match=r"bytes\.jsonl:2: not UTF-8"):
        convert_file(path)


def test_missing_file_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        convert_file(tmp_path / "absent.jsonl")


def test_empty_file_is_an_error() -> None:
    with pytest.raises(InputError, match=r"empty\.jsonl: no events"):
        convert_lines(["", "\n"], "empty.jsonl")


def test_two_runs_in_one_file_are_refused() -> None:
    lines = lines_of(proto("future_reuse_denied"), proto("future_reuse_denied", run_id="other"))
    with pytest.raises(InputError, match=r"t\.jsonl:2: run_id 'other' differs"):
        convert_lines(lines, "t.jsonl")


def test_future_prototype_schema_version_is_refused() -> None:
    with pytest.raises(InputError, match=r"t\.jsonl:1: unsupported prototype schema_version 2"):
        convert_lines(lines_of(proto("future_reuse_denied", schema_version=2)), "t.jsonl")


def test_missing_timestamp_is_refused() -> None:
    rec = proto("future_reuse_denied")
    del rec["timestamp_ns"]
    with pytest.raises(InputError, match=r"t\.jsonl:1: timestamp_ns"):
        convert_lines(lines_of(rec), "t.jsonl")


def test_cached_victim_without_hash_is_refused() -> None:
    lines = lines_of(proto("allocation_victim_selected", physical_block_id=3,
                           victim_reason="cached_prefix_reuse", block_hash=None))
    with pytest.raises(InputError, match=r"t\.jsonl:1: cached_prefix_reuse victim without"):
        convert_lines(lines, "t.jsonl")


def test_unknown_victim_reason_is_refused() -> None:
    lines = lines_of(proto("allocation_victim_selected", physical_block_id=3,
                           victim_reason="lottery"))
    with pytest.raises(InputError, match=r"t\.jsonl:1: unknown victim_reason 'lottery'"):
        convert_lines(lines, "t.jsonl")


def test_unknown_protection_mode_is_refused() -> None:
    lines = lines_of(proto("resident_claim_accepted", claim_id="c", protection_mode="pinky_swear"))
    with pytest.raises(InputError, match=r"t\.jsonl:1: unknown protection_mode 'pinky_swear'"):
        convert_lines(lines, "t.jsonl")


def test_our_own_protection_mode_names_pass_through() -> None:
    lines = lines_of(proto("resident_claim_accepted", claim_id="c", protection_mode="demotable",
                           useful_threshold_blocks=3))
    [sub] = of(convert_lines(lines, "t.jsonl"), "claim_submitted")
    assert sub["protection_mode"] == "demotable"


def test_timestamps_going_backwards_are_kept_and_noted() -> None:
    lines = lines_of(proto("future_reuse_denied", timestamp_ns=20),
                     proto("future_reuse_denied", timestamp_ns=10))
    events = convert_lines(lines, "t.jsonl")
    assert [e["ts_ns"] for e in of(events, "reuse_denied")] == [20, 10]
    assert any("backwards" in n for n in events.summary.notes)  # type: ignore[attr-defined]


def test_relaxed_claim_becomes_a_demotion() -> None:
    lines = lines_of(proto("resident_claim_relaxed", claim_id="c"))
    [dem] = of(convert_lines(lines, "t.jsonl"), "claim_demoted")
    assert dem["claim_id"] == "c" and dem["reason"] == "resident_claim_relaxed"


def test_refused_claim_is_submitted_then_rejected() -> None:
    lines = lines_of(proto("resident_claim_refused", claim_id="c", request_id="resident",
                           arbiter_action="capacity", protection_mode="hard_exclude"))
    events = convert_lines(lines, "t.jsonl")
    assert [e["event"] for e in events][1:3] == ["claim_submitted", "claim_rejected"]
    assert of(events, "claim_rejected")[0]["reason"] == "capacity"


def test_value_outside_our_column_type_is_an_error_naming_the_line() -> None:
    lines = lines_of(proto("resident_block_materialized", request_id="resident", block_hash=5,
                           logical_block_position=2**40, physical_block_id=1))
    with pytest.raises(InputError, match=r"t\.jsonl:1: cannot import as 'block_cached'.*position"):
        convert_lines(lines, "t.jsonl")


def test_wrongly_typed_prototype_field_is_an_error_naming_the_line() -> None:
    lines = lines_of(proto("allocation_victim_selected", physical_block_id="seven",
                           victim_reason="free_uncached"))
    with pytest.raises(InputError, match=r"t\.jsonl:1: field 'physical_block_id' must be an"):
        convert_lines(lines, "t.jsonl")


# --- hostile values -------------------------------------------------------------------------


def test_an_absurd_threshold_is_refused_quickly_not_built_as_a_set() -> None:
    import time

    lines = lines_of(proto("resident_claim_created", claim_id="c",
                           useful_threshold_blocks=2147483647, protection_mode="hard_exclude"),
                     proto("resident_claim_materialized", claim_id="c"))
    start = time.monotonic()
    with pytest.raises(InputError, match="threshold_blocks' is 2147483647"):
        convert_lines(lines, "p.jsonl")
    assert time.monotonic() - start < 5


def test_a_large_but_sane_threshold_is_imported() -> None:
    lines = lines_of(proto("resident_claim_created", claim_id="c",
                           useful_threshold_blocks=100000, protection_mode="hard_exclude"),
                     proto("resident_claim_materialized", claim_id="c"))
    out = convert_lines(lines, "p.jsonl")
    assert any(e.get("threshold_blocks") == 100000 for e in out)


@pytest.mark.parametrize("text", ['{"event": ' + "9" * 5000 + "}", "[" * 100000 + "]" * 100000])
def test_hostile_json_is_one_clear_error(text: str) -> None:
    with pytest.raises(InputError, match="p.jsonl:1: bad JSON"):
        convert_lines([text], "p.jsonl")
