"""RunWriter: segments, rotation, manifest (real files, read back with pyarrow)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from recorder.buffer import build_batch
from recorder.schema import ARROW_SCHEMA, SCHEMA_VERSION, InputError, SchemaError
from recorder.trace_writer import RunWriter, segment_name


def _batch(first_seq: int, n: int, request_id: str = "req-0") -> pa.RecordBatch:
    """n block_allocated events, seqs first_seq.. (request_id drives the dictionary)."""
    seqs = list(range(first_seq, first_seq + n))
    return build_batch(seqs, [s * 10 for s in seqs], ["block_allocated"] * n, "r1",
                       {"block_id": seqs, "request_id": [request_id] * n})


def _manifest(run_dir: Path) -> dict:
    return json.loads((run_dir / "manifest.json").read_text())


def _read_segment(path: Path) -> pa.Table:
    with pa.OSFile(str(path)) as fh:
        return pa.ipc.open_stream(fh).read_all()


def test_manifest_exists_at_open_and_is_not_complete(tmp_path: Path) -> None:
    RunWriter(tmp_path / "run", {"run_id": "r1"})
    m = _manifest(tmp_path / "run")
    assert m["complete"] is False
    assert m["schema_version"] == SCHEMA_VERSION and m["segments"] == []


def test_close_marks_manifest_complete_with_segment_stats(tmp_path: Path) -> None:
    w = RunWriter(tmp_path / "run", {"run_id": "r1"})
    w.write_batch(_batch(0, 5))
    w.write_batch(_batch(5, 3))
    w.close()
    m = _manifest(tmp_path / "run")
    assert m["complete"] is True
    assert m["events_written"] == 8
    (seg,) = m["segments"]
    assert seg["file"] == "events-000000.arrows"
    assert (seg["events"], seg["first_seq"], seg["last_seq"]) == (8, 0, 7)
    assert seg["bytes"] == (tmp_path / "run" / seg["file"]).stat().st_size


def test_manifest_has_every_run_fact_and_extra_keys(tmp_path: Path) -> None:
    info = {"run_id": "r1", "runtime": "vllm", "runtime_version": "0.32.0", "model": "tiny",
            "block_size": 32, "num_blocks": 81, "usable_blocks": 80, "policy": "native",
            "enforcement": {"hard_protected": "enforced"}, "scenario": "pressure"}
    RunWriter(tmp_path / "run", info).close()
    m = _manifest(tmp_path / "run")
    for key, val in info.items():
        assert m[key] == val
    for key in ("schema_version", "recorder_version", "segments", "events_written",
                "events_dropped", "recorder_errors", "complete"):
        assert key in m


def test_missing_run_facts_are_null_not_absent(tmp_path: Path) -> None:
    RunWriter(tmp_path / "run", {"run_id": "r1"}).close()
    m = _manifest(tmp_path / "run")
    assert m["model"] is None and m["block_size"] is None


def test_run_info_without_run_id_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="run_id"):
        RunWriter(tmp_path / "run", {"model": "tiny"})


def test_run_info_cannot_set_writer_owned_keys(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="complete"):
        RunWriter(tmp_path / "run", {"run_id": "r1", "complete": True})


def test_run_info_must_be_json_serialisable(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="JSON"):
        RunWriter(tmp_path / "run", {"run_id": "r1", "hardware": object()})


def test_existing_run_dir_is_not_overwritten(tmp_path: Path) -> None:
    RunWriter(tmp_path / "run", {"run_id": "r1"}).close()
    with pytest.raises(InputError, match="already holds a run"):
        RunWriter(tmp_path / "run", {"run_id": "r2"})


def test_empty_existing_dir_is_accepted(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    RunWriter(tmp_path / "run", {"run_id": "r1"}).close()
    assert _manifest(tmp_path / "run")["complete"] is True


def test_size_rotation_numbers_segments_densely(tmp_path: Path) -> None:
    w = RunWriter(tmp_path / "run", {"run_id": "r1"}, rotate_bytes=1)
    for i in range(3):
        w.write_batch(_batch(i * 10, 10))
    w.close()
    m = _manifest(tmp_path / "run")
    assert [s["file"] for s in m["segments"]] == [segment_name(i) for i in range(3)]
    assert [(s["first_seq"], s["last_seq"]) for s in m["segments"]] == [(0, 9), (10, 19), (20, 29)]


def test_no_rotation_below_the_limits(tmp_path: Path) -> None:
    w = RunWriter(tmp_path / "run", {"run_id": "r1"})
    for i in range(3):
        w.write_batch(_batch(i * 10, 10))
    w.close()
    assert len(_manifest(tmp_path / "run")["segments"]) == 1


def test_time_rotation_closes_a_segment_once_due(tmp_path: Path) -> None:
    w = RunWriter(tmp_path / "run", {"run_id": "r1"}, rotate_seconds=0)
    w.write_batch(_batch(0, 2))
    w.write_batch(_batch(2, 2))
    w.close()
    assert len(_manifest(tmp_path / "run")["segments"]) == 2


def test_maybe_rotate_closes_an_idle_due_segment(tmp_path: Path) -> None:
    w = RunWriter(tmp_path / "run", {"run_id": "r1"}, rotate_seconds=3600)
    w.write_batch(_batch(0, 2))
    w.rotate_seconds = 0  # now due, with no new batch arriving
    w.maybe_rotate()
    assert [s["file"] for s in _manifest(tmp_path / "run")["segments"]] == [segment_name(0)]
    w.close()


def test_manifest_is_rewritten_at_rotation_before_close(tmp_path: Path) -> None:
    w = RunWriter(tmp_path / "run", {"run_id": "r1"}, rotate_bytes=1)
    w.write_batch(_batch(0, 4))
    m = _manifest(tmp_path / "run")
    assert m["complete"] is False and m["events_written"] == 4
    assert m["segments"][0]["events"] == 4
    w.close()


def test_manifest_write_leaves_no_tmp_file(tmp_path: Path) -> None:
    w = RunWriter(tmp_path / "run", {"run_id": "r1"}, rotate_bytes=1)
    w.write_batch(_batch(0, 4))
    w.close()
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [
        "events-000000.arrows", "manifest.json"]


def test_segment_is_an_ipc_stream_with_the_schema(tmp_path: Path) -> None:
    w = RunWriter(tmp_path / "run", {"run_id": "r1"})
    w.write_batch(_batch(0, 3))
    w.close()
    table = _read_segment(tmp_path / "run" / segment_name(0))
    assert table.schema.equals(ARROW_SCHEMA, check_metadata=True)
    assert table.column("seq").to_pylist() == [0, 1, 2]


def test_each_batch_may_carry_its_own_dictionary(tmp_path: Path) -> None:
    w = RunWriter(tmp_path / "run", {"run_id": "r1"})
    w.write_batch(_batch(0, 2, request_id="alpha"))
    w.write_batch(_batch(2, 2, request_id="beta"))
    w.close()
    with pa.OSFile(str(tmp_path / "run" / segment_name(0))) as fh:
        batches = list(pa.ipc.open_stream(fh))
    assert [b.column("request_id").dictionary.to_pylist() for b in batches] == [
        ["alpha"], ["beta"]]
    assert [b.column("request_id").to_pylist() for b in batches] == [
        ["alpha", "alpha"], ["beta", "beta"]]


def test_batch_with_another_schema_is_refused(tmp_path: Path) -> None:
    w = RunWriter(tmp_path / "run", {"run_id": "r1"})
    other = pa.record_batch([pa.array([1])], names=["seq"])
    with pytest.raises(SchemaError):
        w.write_batch(other)


def test_empty_batch_opens_no_segment(tmp_path: Path) -> None:
    w = RunWriter(tmp_path / "run", {"run_id": "r1"})
    w.write_batch(_batch(0, 0))
    w.close()
    assert _manifest(tmp_path / "run")["segments"] == []
    assert not list((tmp_path / "run").glob("events-*"))


def test_close_is_idempotent(tmp_path: Path) -> None:
    w = RunWriter(tmp_path / "run", {"run_id": "r1"})
    w.write_batch(_batch(0, 1))
    w.close()
    before = (tmp_path / "run" / "manifest.json").read_text()
    w.close()
    assert (tmp_path / "run" / "manifest.json").read_text() == before


def test_write_after_close_is_refused(tmp_path: Path) -> None:
    w = RunWriter(tmp_path / "run", {"run_id": "r1"})
    w.close()
    with pytest.raises(InputError, match="closed"):
        w.write_batch(_batch(0, 1))


def test_counters_reach_the_manifest_at_close(tmp_path: Path) -> None:
    w = RunWriter(tmp_path / "run", {"run_id": "r1"})
    w.set_counters(events_dropped=7, recorder_errors=2)
    w.close()
    m = _manifest(tmp_path / "run")
    assert (m["events_dropped"], m["recorder_errors"]) == (7, 2)


def test_uncompressed_segments_are_also_readable(tmp_path: Path) -> None:
    w = RunWriter(tmp_path / "run", {"run_id": "r1"}, compression=None)
    w.write_batch(_batch(0, 3))
    w.close()
    assert _read_segment(tmp_path / "run" / segment_name(0)).num_rows == 3
