"""JSON Lines: validation with FILE:LINE errors, import to run dirs, lossless export."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from kvclaims.contract.schema import ARROW_SCHEMA, COLUMNS, InputError, SchemaError
from kvclaims.cli.io import export_jsonl
from kvclaims.sources.jsonl import (event_to_json, import_jsonl, read_jsonl,
                               validate_events)
from kvclaims.reconstruct.loader import load_runs

# Canonical form: keys in schema column order, nulls omitted, json.dumps default separators.
CANONICAL = [
    {"run_id": "r1", "seq": 0, "ts_ns": 1000, "event": "run_started", "runtime": "vllm",
     "runtime_version": "0.32.0", "model": "tiny-llama", "block_size": 32, "num_blocks": 81,
     "usable_blocks": 80, "policy": "hard", "schema_version": 1, "recorder_version": "0.1.0"},
    {"run_id": "r1", "seq": 1, "ts_ns": 1500, "event": "request_arrived", "request_id": "req-A",
     "tenant": "tenant-é", "num_prompt_tokens": 1920, "claim_id": "c1"},
    {"run_id": "r1", "seq": 2, "ts_ns": 1600, "event": "claim_submitted", "request_id": "req-A",
     "tenant": "tenant-é", "claim_id": "c1", "protection_mode": "expiring",
     "threshold_blocks": 60, "ttl_s": 2.5, "value": 1.0},
    {"run_id": "r1", "seq": 3, "ts_ns": 1700, "event": "block_cached", "request_id": "req-A",
     "block_id": 7, "block_hash": 18446744073709551615, "parent_hash": 9223372036854775808,
     "position": 0},
    {"run_id": "r1", "seq": 5, "ts_ns": 1800, "event": "recorder_gap", "events_dropped": 1,
     "first_seq": 4, "last_seq": 4, "reason": "buffer_full"},
    {"run_id": "r1", "seq": 6, "ts_ns": 1900, "event": "request_refused", "usable_blocks": 80,
     "request_id": "req-B", "blocks_required": 70, "free_blocks": 20, "protected_blocks": 60,
     "blocking_claim_ids": ["c1", "c2"], "shortfall_blocks": 50, "reason": "hard_claims"},
    {"run_id": "r1", "seq": 7, "ts_ns": 2000, "event": "request_deferred", "usable_blocks": 80,
     "request_id": "req-C", "blocks_required": 1, "free_blocks": 0, "protected_blocks": 80,
     "blocking_claim_ids": []},
    {"run_id": "r1", "seq": 8, "ts_ns": 2100, "event": "block_evicted", "block_id": 7,
     "block_hash": 18446744073709551615, "cause": "allocation", "by_request_id": "req-B"},
    {"run_id": "r1", "seq": 9, "ts_ns": 2200, "event": "run_finished", "events_written": 9,
     "events_dropped": 1},
]


def _write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def _canonical_file(path: Path, events: list[dict[str, Any]] = CANONICAL) -> Path:
    return _write_lines(path, [json.dumps(e, ensure_ascii=False) for e in events])


def test_fixture_is_in_canonical_key_order() -> None:
    order = list(COLUMNS)
    for event in CANONICAL:
        keys = list(event)
        assert keys == sorted(keys, key=order.index)


def test_round_trip_is_byte_identical(tmp_path: Path) -> None:
    src = _canonical_file(tmp_path / "in.jsonl")
    import_jsonl(src, tmp_path / "run")
    export_jsonl(tmp_path / "run", tmp_path / "out.jsonl")
    assert (tmp_path / "out.jsonl").read_bytes() == src.read_bytes()


def test_round_trip_keeps_uint64_above_2_63(tmp_path: Path) -> None:
    import_jsonl(_canonical_file(tmp_path / "in.jsonl"), tmp_path / "run")
    hashes = load_runs([tmp_path / "run"]).events.column("block_hash").drop_null().to_pylist()
    assert 2**64 - 1 in hashes


def test_round_trip_of_several_runs_makes_a_sweep_dir(tmp_path: Path) -> None:
    other = [dict(e, run_id="r2") for e in CANONICAL[:3]]
    src = _canonical_file(tmp_path / "in.jsonl", CANONICAL + other)
    dirs = import_jsonl(src, tmp_path / "sweep")
    assert [d.name for d in dirs] == ["r1", "r2"]
    export_jsonl(tmp_path / "sweep", tmp_path / "out.jsonl")
    assert (tmp_path / "out.jsonl").read_bytes() == src.read_bytes()


def test_non_canonical_input_is_exported_canonically(tmp_path: Path) -> None:
    src = _write_lines(tmp_path / "in.jsonl", [
        '{"event":"block_freed","seq":0,"ts_ns":5,"run_id":"r","request_id":"q",'
        '"block_id":2,"claim_id":null}'])
    import_jsonl(src, tmp_path / "run")
    buf = io.StringIO()
    export_jsonl(tmp_path / "run", buf)
    assert buf.getvalue() == ('{"run_id": "r", "seq": 0, "ts_ns": 5, "event": "block_freed", '
                              '"request_id": "q", "block_id": 2}\n')


def test_export_omits_nulls_and_orders_keys() -> None:
    row = {name: None for name in COLUMNS}
    row.update(run_id="r", seq=1, ts_ns=2, event="block_freed", block_id=3, request_id="q")
    assert event_to_json(row) == ('{"run_id": "r", "seq": 1, "ts_ns": 2, "event": "block_freed",'
                                  ' "request_id": "q", "block_id": 3}')


def test_read_jsonl_returns_a_table_in_the_arrow_schema(tmp_path: Path) -> None:
    table = read_jsonl(_canonical_file(tmp_path / "in.jsonl"))
    assert table.schema.equals(ARROW_SCHEMA)
    assert table.num_rows == len(CANONICAL)
    assert table.column("blocking_claim_ids").to_pylist()[5] == ["c1", "c2"]


def test_blank_lines_are_skipped(tmp_path: Path) -> None:
    lines = [json.dumps(e) for e in CANONICAL[:2]]
    src = _write_lines(tmp_path / "in.jsonl", [lines[0], "", "   ", lines[1]])
    assert read_jsonl(src).num_rows == 2


def _error(tmp_path: Path, bad_line: str, exc: type[Exception] = InputError) -> str:
    """Put bad_line on line 2 of a file and return the error message."""
    src = _write_lines(tmp_path / "bad.jsonl", [json.dumps(CANONICAL[0]), bad_line])
    with pytest.raises(exc) as info:
        read_jsonl(src)
    return str(info.value)


def test_bad_json_names_the_line(tmp_path: Path) -> None:
    msg = _error(tmp_path, '{"run_id": "r1", "seq": 1,')
    assert msg.startswith(f"{tmp_path / 'bad.jsonl'}:2: invalid JSON")


def test_unknown_event_names_the_line_and_field(tmp_path: Path) -> None:
    msg = _error(tmp_path, '{"run_id": "r1", "seq": 1, "ts_ns": 1, "event": "block_moved"}',
                 SchemaError)
    assert msg.startswith(f"{tmp_path / 'bad.jsonl'}:2: field 'event'")
    assert "block_moved" in msg


def test_missing_seq_names_the_line_and_field(tmp_path: Path) -> None:
    msg = _error(tmp_path, '{"run_id": "r1", "ts_ns": 1, "event": "block_freed"}', SchemaError)
    assert msg.startswith(f"{tmp_path / 'bad.jsonl'}:2: ")
    assert "field 'seq'" in msg


def test_wrong_type_names_the_line_and_field(tmp_path: Path) -> None:
    msg = _error(tmp_path, '{"run_id": "r1", "seq": 1, "ts_ns": 1, "event": "block_freed", '
                           '"block_id": "seven"}', SchemaError)
    assert msg.startswith(f"{tmp_path / 'bad.jsonl'}:2: field 'block_id' has wrong type")


def test_float_where_an_integer_belongs_is_refused(tmp_path: Path) -> None:
    msg = _error(tmp_path, '{"run_id": "r1", "seq": 1, "ts_ns": 1, "event": "block_freed", '
                           '"block_id": 7.0}', SchemaError)
    assert "field 'block_id'" in msg


def test_hash_beyond_64_bits_is_refused(tmp_path: Path) -> None:
    msg = _error(tmp_path, '{"run_id": "r1", "seq": 1, "ts_ns": 1, "event": "block_evicted", '
                           f'"block_hash": {2**64}}}', SchemaError)
    assert "field 'block_hash'" in msg


def test_non_object_line_names_the_line(tmp_path: Path) -> None:
    msg = _error(tmp_path, '[1, 2, 3]', SchemaError)
    assert msg == f"{tmp_path / 'bad.jsonl'}:2: expected a JSON object, got list"


def test_field_of_another_event_names_the_line_and_field(tmp_path: Path) -> None:
    msg = _error(tmp_path, '{"run_id": "r1", "seq": 1, "ts_ns": 1, "event": "block_freed", '
                           '"claim_id": "c1"}', SchemaError)
    assert msg.startswith(f"{tmp_path / 'bad.jsonl'}:2: field 'claim_id'")


def test_duplicate_key_names_the_line_and_field(tmp_path: Path) -> None:
    msg = _error(tmp_path, '{"run_id": "r1", "seq": 1, "seq": 2, "ts_ns": 1, '
                           '"event": "block_freed"}')
    assert msg.startswith(f"{tmp_path / 'bad.jsonl'}:2: invalid JSON: duplicate field 'seq'")


def test_nan_is_refused(tmp_path: Path) -> None:
    msg = _error(tmp_path, '{"run_id": "r1", "seq": 1, "ts_ns": 1, "event": "claim_submitted", '
                           '"claim_id": "c", "ttl_s": NaN}')
    assert ":2: invalid JSON" in msg


def test_future_schema_version_in_run_started_is_refused(tmp_path: Path) -> None:
    src = _canonical_file(tmp_path / "in.jsonl", [dict(CANONICAL[0], schema_version=99)])
    with pytest.raises(SchemaError, match=r":1: field 'schema_version' is 99"):
        read_jsonl(src)


def test_seq_must_increase_within_a_run(tmp_path: Path) -> None:
    events = [CANONICAL[0], dict(CANONICAL[1], seq=0)]
    src = _canonical_file(tmp_path / "in.jsonl", events)
    with pytest.raises(SchemaError, match=r"in.jsonl:2: field 'seq' is 0, not greater than 0"):
        read_jsonl(src)


def test_seq_is_per_run_so_interleaved_runs_are_fine(tmp_path: Path) -> None:
    events = [CANONICAL[0], dict(CANONICAL[0], run_id="r2"), dict(CANONICAL[1]),
              dict(CANONICAL[1], run_id="r2")]
    assert read_jsonl(_canonical_file(tmp_path / "in.jsonl", events)).num_rows == 4


def test_missing_file_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot open"):
        read_jsonl(tmp_path / "nope.jsonl")


def test_non_utf8_file_names_the_line(tmp_path: Path) -> None:
    src = tmp_path / "bad.jsonl"
    src.write_bytes(json.dumps(CANONICAL[0]).encode() + b"\n\xff\xfe\n")
    with pytest.raises(InputError, match="not UTF-8"):
        read_jsonl(src)


def test_manifest_run_facts_come_from_run_started(tmp_path: Path) -> None:
    import_jsonl(_canonical_file(tmp_path / "in.jsonl"), tmp_path / "run")
    m = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert (m["run_id"], m["runtime"], m["model"], m["block_size"], m["usable_blocks"],
            m["policy"]) == ("r1", "vllm", "tiny-llama", 32, 80, "hard")
    assert m["complete"] is True and m["events_written"] == len(CANONICAL)
    assert m["events_dropped"] == 1
    assert m["imported_from"] == "in.jsonl"


def test_without_run_started_the_manifest_facts_are_null(tmp_path: Path) -> None:
    import_jsonl(_canonical_file(tmp_path / "in.jsonl", CANONICAL[1:3]), tmp_path / "run")
    m = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert m["run_id"] == "r1" and m["model"] is None and m["block_size"] is None


def test_import_refuses_an_existing_run_dir(tmp_path: Path) -> None:
    src = _canonical_file(tmp_path / "in.jsonl")
    import_jsonl(src, tmp_path / "run")
    with pytest.raises(InputError, match="already holds a run"):
        import_jsonl(src, tmp_path / "run")


def test_import_of_an_empty_file_is_refused(tmp_path: Path) -> None:
    src = _write_lines(tmp_path / "in.jsonl", [])
    with pytest.raises(InputError, match="no events"):
        import_jsonl(src, tmp_path / "run")


def test_validate_events_names_the_event_number() -> None:
    with pytest.raises(SchemaError, match=r"conv: event #2: missing required field 'seq'"):
        validate_events([CANONICAL[0], {"run_id": "r1", "ts_ns": 1, "event": "block_freed"}],
                        "conv")


# -- hostile values: one clear error naming the line --------------------------------------------

@pytest.mark.parametrize("line,expect", [
    ('{"run_id": "r1", "seq": 1, "ts_ns": 2, "event": "block_cached", "position": 2147483647}',
     "field 'position' is 2147483647"),
    ('{"run_id": "r1", "seq": 1, "ts_ns": 2, "event": "claim_submitted", "claim_id": "c", '
     '"ttl_s": 1e999}', "field 'ttl_s' is inf"),
    ('{"run_id": "r1", "seq": 1, "ts_ns": 2, "event": "block_freed", "block_id": '
     + "9" * 5000 + "}", "invalid JSON"),
    ("[" * 100000 + "]" * 100000, "invalid JSON"),
    ('{"run_id": "r1", "seq": 1, "ts_ns": 2, "event": "block_freed", "block_id": -3}',
     "field 'block_id' is -3"),
])
def test_hostile_values_name_the_line(tmp_path: Path, line: str, expect: str) -> None:
    msg = _error(tmp_path, line)
    assert msg.startswith(f"{tmp_path / 'bad.jsonl'}:2: ") and expect in msg


def test_in_range_values_are_accepted(tmp_path: Path) -> None:
    ok = ('{"run_id": "r1", "seq": 1, "ts_ns": 2, "event": "block_cached", "position": 1000, '
          '"block_id": 0}')
    src = _write_lines(tmp_path / "ok.jsonl", [json.dumps(CANONICAL[0]), ok])
    assert read_jsonl(src).num_rows == 2


def test_an_import_keeps_hashes_and_has_no_clock(tmp_path: Path) -> None:
    out = import_jsonl(_canonical_file(tmp_path / "in.jsonl"), tmp_path / "run")[0]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["clock"] is None and manifest["hash_scheme"] == "imported"
