"""load_runs / iter_batches: decoding, ordering, sweeps, truncation, every refusal."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from kvclaims.contract.batches import build_batch
from kvclaims.recorder.buffer import EventBuffer
from kvclaims.contract.schema import ARROW_SCHEMA, COLUMNS, SCHEMA_VERSION
from kvclaims.contract.trace_writer import RunWriter, segment_name
from kvclaims.reconstruct.loader import (EVENTS_SCHEMA, TraceError, batch_reader, iter_batches,
                                         load_runs, parquet_file, scan_stream)


def _record(run_dir: Path, run_id: str = "r1", n: int = 30, *, batch_events: int = 10,
            rotate_bytes: int | None = None) -> Path:
    """A real run: n block_cached events, flushed (one record batch) every batch_events."""
    kwargs = {} if rotate_bytes is None else {"rotate_bytes": rotate_bytes}
    writer = RunWriter(run_dir, {"run_id": run_id, "model": "tiny", "block_size": 32},
                       hash_scheme="vllm-raw", seal=False, **kwargs)
    buf = EventBuffer(writer, run_id, flush_interval_s=3600)
    for i in range(n):
        buf.emit("block_cached", block_id=i, block_hash=2**64 - 1 - i, position=i,
                 request_id=f"req-{i % 3}")
        if (i + 1) % batch_events == 0:
            buf.flush()  # one record batch per flush: many batches to cut through
    buf.close()
    return run_dir


def _manifest(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "manifest.json").read_text())


def _write_manifest(run_dir: Path, manifest: dict[str, Any]) -> None:
    (run_dir / "manifest.json").write_text(json.dumps(manifest))


def _batch_ends(path: Path) -> list[int]:
    """Byte offsets where the schema message and then each complete record batch end."""
    data = path.read_bytes()
    ends: list[int] = []
    for cut in range(8, len(data) + 1, 8):
        end = scan_stream(data[:cut], str(path)).complete_end
        if end and (not ends or end > ends[-1]):
            ends.append(end)
    return ends


def test_events_have_plain_string_columns(tmp_path: Path) -> None:
    trace = load_runs([_record(tmp_path / "run")])
    assert trace.events.schema.field("request_id").type == pa.string()
    assert trace.events.schema.field("event").type == pa.string()
    assert trace.events.schema.equals(EVENTS_SCHEMA)
    assert trace.events.num_rows == 32


def test_uint64_hashes_above_2_63_survive(tmp_path: Path) -> None:
    trace = load_runs([_record(tmp_path / "run")])
    hashes = trace.events.column("block_hash").drop_null().to_pylist()
    assert max(hashes) == 2**64 - 1


def test_events_are_ordered_by_run_id_then_seq(tmp_path: Path) -> None:
    _record(tmp_path / "b", "run-b", n=5)
    _record(tmp_path / "a", "run-a", n=5)
    trace = load_runs([tmp_path / "b", tmp_path / "a"])
    keys = list(zip(trace.events.column("run_id").to_pylist(),
                    trace.events.column("seq").to_pylist()))
    assert keys == sorted(keys)
    assert set(trace.manifests) == {"run-a", "run-b"}


def test_a_sweep_directory_loads_every_run_below_it(tmp_path: Path) -> None:
    _record(tmp_path / "sweep" / "cap-60" / "native", "r60", n=3)
    _record(tmp_path / "sweep" / "cap-80" / "native", "r80", n=3)
    trace = load_runs([tmp_path / "sweep"])
    assert set(trace.manifests) == {"r60", "r80"}
    assert trace.run_dirs["r80"] == tmp_path / "sweep" / "cap-80" / "native"


def test_the_same_run_named_twice_loads_once(tmp_path: Path) -> None:
    run = _record(tmp_path / "run", n=3)
    assert load_runs([run, run]).events.num_rows == 5


def test_two_runs_with_one_run_id_are_both_loaded_told_apart_by_path(tmp_path: Path) -> None:
    _record(tmp_path / "x", "same", n=1)
    _record(tmp_path / "y", "same", n=1)
    trace = load_runs([tmp_path / "x", tmp_path / "y"])
    ids = sorted(trace.manifests)
    assert ids == [f"same@{tmp_path / 'x'}", f"same@{tmp_path / 'y'}"]
    assert sorted(set(trace.events.column("run_id").to_pylist())) == ids
    assert len(trace.truncations) == 2 and not trace.truncated_runs  # warnings, no hole


def test_rotated_segments_load_in_order(tmp_path: Path) -> None:
    run = _record(tmp_path / "run", n=50, rotate_bytes=1)
    assert len(_manifest(run)["segments"]) > 3
    trace = load_runs([run])
    assert trace.events.column("seq").to_pylist() == list(range(52))
    assert trace.truncations == []


def test_truncated_last_segment_keeps_every_complete_batch(tmp_path: Path) -> None:
    run = _record(tmp_path / "run", n=30, batch_events=10)
    seg = run / segment_name(0)
    with pa.OSFile(str(seg)) as fh:
        sizes = [b.num_rows for b in pa.ipc.open_stream(fh)]
    ends = _batch_ends(seg)
    data = seg.read_bytes()
    # ends: schema, then batches; cut in the middle of the 3rd record batch (or its dictionaries)
    cut = (ends[2] + ends[3]) // 2
    seg.write_bytes(data[:cut])
    trace = load_runs([run])
    kept = sizes[0] + sizes[1]
    assert trace.events.num_rows == kept
    assert trace.events.column("seq").to_pylist() == list(range(kept))
    msg = trace.truncations[0]
    assert str(seg) in msg and "kept 2 complete batches" in msg
    assert trace.truncated_runs == {"r1"}
    (hole,) = trace.holes  # a complete run: the manifest says how far the segment went
    assert (hole.reason, hole.first_seq, hole.last_seq) == ("truncated", kept, 31)


def test_every_cut_point_of_a_last_segment_is_recovered_or_reported(tmp_path: Path) -> None:
    run = _record(tmp_path / "run", n=20, batch_events=5)
    seg = run / segment_name(0)
    data = seg.read_bytes()
    ends = _batch_ends(seg)
    for cut in range(0, len(data), 97):
        seg.write_bytes(data[:cut])
        trace = load_runs([run])
        kept_batches = sum(1 for e in ends[1:] if e <= cut)
        assert f"kept {kept_batches} complete batches" in trace.truncations[0]
        assert trace.holes, "a cut segment is always a hole"


def test_an_intact_run_reports_no_truncation(tmp_path: Path) -> None:
    trace = load_runs([_record(tmp_path / "run")])
    assert trace.truncations == [] and trace.truncated_runs == set()
    assert trace.incomplete_runs == set()


def test_segment_without_end_marker_is_reported_as_truncated(tmp_path: Path) -> None:
    run = _record(tmp_path / "run", n=5)
    seg = run / segment_name(0)
    seg.write_bytes(seg.read_bytes()[:-8])  # drop only the end-of-stream marker
    trace = load_runs([run])
    assert trace.events.num_rows == 7
    assert "no end-of-stream marker" in trace.truncations[0]


def test_truncated_segment_that_is_not_the_last_is_a_hole_with_its_manifest_span(
        tmp_path: Path) -> None:
    run = _record(tmp_path / "run", n=50, rotate_bytes=1)
    seg = run / segment_name(0)
    entry = _manifest(run)["segments"][0]
    seg.write_bytes(seg.read_bytes()[:-20])
    trace = load_runs([run])
    (hole,) = trace.holes
    assert hole.reason == "truncated" and hole.last_seq == entry["last_seq"]
    assert segment_name(0) in trace.truncations[0] and trace.truncated_runs == {"r1"}


def test_an_intact_rotated_run_has_no_hole(tmp_path: Path) -> None:
    trace = load_runs([_record(tmp_path / "run", n=50, rotate_bytes=1)])
    assert trace.holes == [] and trace.truncations == []


def test_garbage_segment_is_an_error_naming_the_file(tmp_path: Path) -> None:
    run = _record(tmp_path / "run")
    (run / segment_name(0)).write_bytes(b"this is not arrow at all" * 50)
    with pytest.raises(TraceError, match=segment_name(0)):
        load_runs([run])


def test_garbage_after_a_valid_prefix_keeps_the_prefix_and_is_a_hole(tmp_path: Path) -> None:
    run = _record(tmp_path / "run")
    seg = run / segment_name(0)
    data = seg.read_bytes()
    ends = _batch_ends(seg)
    seg.write_bytes(data[:ends[1]] + b"\x00\x01garbage!" * 40)
    trace = load_runs([run])
    assert trace.events.num_rows > 0 and trace.holes
    assert any("corrupt IPC framing" in t for t in trace.truncations)


def test_bytes_after_the_end_marker_are_a_hole(tmp_path: Path) -> None:
    run = _record(tmp_path / "run")
    seg = run / segment_name(0)
    seg.write_bytes(seg.read_bytes() + b"trailing")
    trace = load_runs([run])
    assert trace.events.num_rows == load_runs([_record(tmp_path / "twin")]).events.num_rows
    assert any("after end of stream" in t for t in trace.truncations)


def test_missing_manifest_is_an_error(tmp_path: Path) -> None:
    run = _record(tmp_path / "run")
    (run / "manifest.json").unlink()
    with pytest.raises(TraceError, match="manifest.json: missing manifest"):
        load_runs([run])


def test_unreadable_manifest_is_an_error(tmp_path: Path) -> None:
    run = _record(tmp_path / "run")
    (run / "manifest.json").write_text("{not json")
    with pytest.raises(TraceError, match="manifest.json: unreadable manifest"):
        load_runs([run])


def test_manifest_from_a_future_schema_version_is_refused(tmp_path: Path) -> None:
    run = _record(tmp_path / "run")
    m = _manifest(run)
    m["schema_version"] = SCHEMA_VERSION + 1
    _write_manifest(run, m)
    with pytest.raises(TraceError, match="manifest.json: schema_version .* newer"):
        load_runs([run])


def test_current_schema_version_is_accepted(tmp_path: Path) -> None:
    run = _record(tmp_path / "run")
    assert _manifest(run)["schema_version"] == SCHEMA_VERSION
    load_runs([run])


def test_segment_from_a_future_schema_version_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "run"
    w = RunWriter(run, {"run_id": "r1"}, seal=False)
    w.close()
    future = ARROW_SCHEMA.with_metadata({"kvclaims.schema_version": str(SCHEMA_VERSION + 1)})
    with pa.OSFile(str(run / segment_name(0)), "wb") as fh, pa.ipc.new_stream(fh, future):
        pass
    m = _manifest(run)
    m["complete"] = False
    _write_manifest(run, m)
    with pytest.raises(TraceError, match=f"{segment_name(0)}: schema_version"):
        load_runs([run])


def _older_run(run: Path, version: int, drop: tuple[str, ...]) -> Path:
    """A run whose one segment (no checksums, as before them) lacks the columns ``drop``."""
    RunWriter(run, {"run_id": "r1"}, seal=False).close()
    older = pa.schema([f for f in ARROW_SCHEMA if f.name not in drop],
                      metadata={"kvclaims.schema_version": str(version)})
    values = {"run_id": "r1", "seq": 0, "ts_ns": 5, "event": "run_started"}
    batch = pa.record_batch([pa.array([values.get(f.name)], f.type) for f in older],
                            schema=older)
    with pa.OSFile(str(run / segment_name(0)), "wb") as fh, pa.ipc.new_stream(fh, older) as w:
        w.write_batch(batch)
    m = _manifest(run)
    m.update(complete=False, schema_version=version)
    del m["batch_checksum"]
    _write_manifest(run, m)
    return run


def test_older_segment_lacking_columns_reads_them_as_null(tmp_path: Path) -> None:
    trace = load_runs([_older_run(tmp_path / "run", 1, ("step", "hook", "error_type",
                                                         "released_by"))])
    row = trace.events.to_pylist()[0]
    assert row["event"] == "run_started" and row["step"] is None
    assert trace.events.schema.equals(EVENTS_SCHEMA) and trace.holes == []


def test_segment_lacking_a_required_column_is_a_hole_not_nulls(tmp_path: Path) -> None:
    trace = load_runs([_older_run(tmp_path / "run", 2, ("claim_id",))])
    assert trace.events.num_rows == 0
    assert any(h.reason == "missing_columns" for h in trace.holes)
    assert any("claim_id" in t for t in trace.truncations)


def test_a_path_that_is_not_a_run_dir_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(TraceError, match="empty: not a run directory"):
        load_runs([tmp_path / "empty"])


def test_a_missing_path_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no such file or directory"):
        load_runs([tmp_path / "nowhere"])


def test_a_jsonl_file_path_gets_an_import_hint(tmp_path: Path) -> None:
    (tmp_path / "t.jsonl").write_text("{}\n")
    with pytest.raises(TraceError, match="kvclaims import"):
        load_runs([tmp_path / "t.jsonl"])


def test_segment_listed_in_the_manifest_but_missing_is_an_error(tmp_path: Path) -> None:
    run = _record(tmp_path / "run", n=50, rotate_bytes=1)
    last = _manifest(run)["segments"][-1]["file"]
    (run / last).unlink()
    with pytest.raises(TraceError, match=f"{last}: listed in the manifest but missing"):
        load_runs([run])


def test_a_hole_in_segment_numbers_is_an_error(tmp_path: Path) -> None:
    run = _record(tmp_path / "run", n=50, rotate_bytes=1)
    (run / segment_name(1)).unlink()
    with pytest.raises(TraceError, match=segment_name(1)):
        load_runs([run])


def test_segment_event_count_must_match_the_manifest(tmp_path: Path) -> None:
    run = _record(tmp_path / "run")
    m = _manifest(run)
    m["segments"][0]["events"] += 1
    _write_manifest(run, m)
    with pytest.raises(TraceError, match="the manifest says"):
        load_runs([run])


def test_events_of_another_run_id_are_an_error(tmp_path: Path) -> None:
    run = _record(tmp_path / "run")
    m = _manifest(run)
    m["run_id"] = "someone-else"
    _write_manifest(run, m)
    with pytest.raises(TraceError, match="run_id other than"):
        load_runs([run])


def test_seq_going_backwards_is_an_error(tmp_path: Path) -> None:
    run = tmp_path / "run"
    w = RunWriter(run, {"run_id": "r1"}, seal=False)
    for seqs in ([0, 1], [1, 2]):
        w.write_batch(build_batch(seqs, seqs, ["block_freed"] * 2, "r1", {}))
    w.close()
    with pytest.raises(TraceError, match="seq 1 does not follow 1"):
        load_runs([run])


def test_unfinished_run_is_listed_as_incomplete(tmp_path: Path) -> None:
    run = tmp_path / "run"
    w = RunWriter(run, {"run_id": "r1"}, seal=False)
    w.write_batch(build_batch([0], [0], ["block_freed"], "r1", {}))
    # never closed: as after a crash
    trace = load_runs([run])
    assert trace.incomplete_runs == {"r1"}
    assert trace.events.num_rows == 1


def test_duckdb_group_by_event_over_a_run_dir(tmp_path: Path) -> None:
    con = load_runs([_record(tmp_path / "run", n=6)]).connect()
    rows = con.sql("SELECT event, count(*) FROM events GROUP BY event ORDER BY event").fetchall()
    assert rows == [("block_cached", 6), ("run_finished", 1), ("run_started", 1)]


def test_duckdb_sees_the_manifests(tmp_path: Path) -> None:
    con = load_runs([_record(tmp_path / "run", n=6)]).connect()
    assert con.sql("SELECT run_id, complete, events_written, block_size FROM manifests"
                   ).fetchall() == [("r1", True, 8, 32)]


def test_duckdb_joins_on_string_columns_without_casts(tmp_path: Path) -> None:
    con = load_runs([_record(tmp_path / "run", n=6)]).connect()
    n = con.sql("SELECT count(*) FROM events e JOIN manifests m USING (run_id) "
                "WHERE e.request_id = 'req-1'").fetchall()[0][0]
    assert n == 2


def test_to_polars_keeps_rows_and_uint64(tmp_path: Path) -> None:
    df = load_runs([_record(tmp_path / "run", n=6)]).to_polars()
    assert df.height == 8
    assert df["block_hash"].max() == 2**64 - 1


def test_iter_batches_streams_the_same_rows_as_load_runs(tmp_path: Path) -> None:
    run = _record(tmp_path / "run", n=50, rotate_bytes=1)
    streamed = pa.Table.from_batches(list(iter_batches([run])), schema=EVENTS_SCHEMA)
    assert streamed.equals(load_runs([run]).events)


def test_batch_reader_feeds_duckdb_streaming(tmp_path: Path) -> None:
    import duckdb

    run = _record(tmp_path / "run", n=20)
    reader = batch_reader([run])
    assert duckdb.sql("SELECT count(*) FROM reader").fetchall()[0][0] == 22


def test_iter_batches_reports_truncations(tmp_path: Path) -> None:
    run = _record(tmp_path / "run", n=5)
    seg = run / segment_name(0)
    seg.write_bytes(seg.read_bytes()[:-8])
    notes: list[str] = []
    list(iter_batches([run], truncations=notes))
    assert len(notes) == 1 and str(seg) in notes[0]


# -- integrity: checksums, head, tail, manifest values -------------------------------------------

def test_a_damaged_middle_batch_is_a_hole_and_later_batches_still_load(tmp_path: Path) -> None:
    run = _record(tmp_path / "run", n=30, batch_events=10)
    seg = run / segment_name(0)
    data = bytearray(seg.read_bytes())
    g = scan_stream(bytes(data), str(seg)).groups[1]  # seqs 10..19 (run_started is 0)
    data[(g.meta_end + g.end) // 2] ^= 0xFF
    seg.write_bytes(bytes(data))
    trace = load_runs([run])
    seqs = trace.events.column("seq").to_pylist()
    (hole,) = trace.holes
    assert (hole.reason, hole.first_seq, hole.last_seq) == ("corrupt_batch", 11, 20)
    assert 11 not in seqs and 21 in seqs and seqs[-1] == 31
    assert trace.truncated_runs == {"r1"}


def test_an_intact_batch_is_not_a_hole(tmp_path: Path) -> None:
    run = _record(tmp_path / "run", n=30, batch_events=10)
    assert load_runs([run]).holes == []


def test_a_removed_head_is_a_hole(tmp_path: Path) -> None:
    run = tmp_path / "run"
    w = RunWriter(run, {"run_id": "r1"}, seal=False)
    w.write_batch(build_batch([300, 301], [1, 2], ["block_freed"] * 2, "r1",
                              {"block_id": [1, 2]}))
    w.close()
    (hole,) = load_runs([run]).holes
    assert (hole.reason, hole.first_seq, hole.last_seq) == ("missing_head", 0, 299)


def test_an_emptied_last_segment_of_a_complete_run_is_a_hole(tmp_path: Path) -> None:
    run = _record(tmp_path / "run", n=50, rotate_bytes=1)
    last = sorted(run.glob("events-*.arrows"))[-1]
    last.write_bytes(b"")
    trace = load_runs([run])
    assert any(h.reason in ("truncated", "missing_tail") for h in trace.holes)
    assert trace.truncated_runs == {"r1"}


@pytest.mark.parametrize("key,raw", [
    ("usable_blocks", str(2**40)), ("usable_blocks", "9" * 5000), ("schema_version", "[]"),
    ("block_size", "1e999"), ("events_written", "-1"), ("model", "5"),
    ("segments", "[" * 100000 + "]" * 100000), ("clock", "3")])
def test_hostile_manifest_values_are_one_clear_error(tmp_path: Path, key: str, raw: str) -> None:
    run = _record(tmp_path / "run")
    text = json.dumps({**_manifest(run), key: "__X__"}).replace('"__X__"', raw)
    (run / "manifest.json").write_text(text)
    with pytest.raises(TraceError, match="manifest"):
        load_runs([run])


def test_out_of_range_values_in_a_segment_are_refused(tmp_path: Path) -> None:
    run = tmp_path / "run"
    w = RunWriter(run, {"run_id": "r1"}, seal=False)
    w.write_batch(build_batch([0], [1], ["block_cached"], "r1",
                              {"block_id": [1], "position": [2**31 - 1]}))
    w.close()
    with pytest.raises(TraceError, match="seq 0: field 'position' is 2147483647"):
        load_runs([run])


def test_a_sealed_file_failing_midway_resumes_from_the_segments_without_duplicates(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pyarrow.parquet as pq

    from kvclaims.contract import trace_writer

    monkeypatch.setattr(trace_writer, "SEAL_ROW_GROUP", 8)
    run = tmp_path / "run"
    w = RunWriter(run, {"run_id": "r1"}, rotate_bytes=1)
    for i in range(6):
        names = (["run_started"] if i == 0 else ["block_freed"]) + ["block_freed"] * 4
        w.write_batch(build_batch(list(range(i * 5, i * 5 + 5)), [0] * 5, names, "r1",
                                  {"block_id": [None if i == 0 else 1] + [1] * 4}))
    w.close()
    sealed = run / "events.parquet"
    meta = pq.ParquetFile(str(sealed)).metadata
    assert meta.num_row_groups >= 3
    col = meta.row_group(2).column(1)  # "seq" of the third row group
    data = bytearray(sealed.read_bytes())
    data[col.data_page_offset + 20] ^= 0xFF
    sealed.write_bytes(bytes(data))
    trace = load_runs([run])
    assert trace.events.column("seq").to_pylist() == list(range(30))
    assert any("sealed copy unusable" in t for t in trace.truncations) and trace.holes == []


def _incompressible_parquet(path: Path, row_groups: int = 24, rows: int = 50_000) -> int:
    """A Parquet file of random int64s in ``row_groups`` groups; returns one group's bytes."""
    import numpy as np
    import pyarrow.parquet as pq

    rng = np.random.default_rng(7)
    with pq.ParquetWriter(str(path), pa.schema([("v", pa.int64())])) as writer:
        for _ in range(row_groups):
            writer.write_table(pa.table({"v": rng.integers(0, 2**62, rows)}))
    return rows * 8


def _peak_allocated_while_streaming(pf: Any) -> int:
    base, peak = pa.total_allocated_bytes(), 0
    for _batch in pf.iter_batches(batch_size=10_000):
        peak = max(peak, pa.total_allocated_bytes() - base)
    return peak


def test_streaming_a_parquet_file_holds_a_few_row_groups_not_the_file(tmp_path: Path) -> None:
    group = _incompressible_parquet(tmp_path / "e.parquet")   # 24 row groups
    assert _peak_allocated_while_streaming(parquet_file(tmp_path / "e.parquet")) < 6 * group


def test_pyarrow_default_reader_holds_what_it_has_read_until_the_end(tmp_path: Path) -> None:
    # the twin: why parquet_file turns pre-buffering off (memory grew with the file)
    import pyarrow.parquet as pq

    group = _incompressible_parquet(tmp_path / "e.parquet")
    assert _peak_allocated_while_streaming(pq.ParquetFile(str(tmp_path / "e.parquet"))) > 12 * group
