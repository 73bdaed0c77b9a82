"""RunWriter: segments, rotation, manifest (real files, read back with pyarrow)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from kvclaims.contract.batches import build_batch
from kvclaims.contract.schema import ARROW_SCHEMA, SCHEMA_VERSION, InputError, SchemaError
from kvclaims.contract.trace_writer import RunWriter, segment_name


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
        "events-000000.arrows", "events.parquet", "manifest.json"]


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


# -- batch checksums ----------------------------------------------------------------------------

def test_every_record_batch_carries_a_checksum_of_its_group(tmp_path: Path) -> None:
    from kvclaims.reconstruct.loader import group_checksum, scan_stream

    w = RunWriter(tmp_path / "run", {"run_id": "r1"})
    for i in range(3):
        w.write_batch(_batch(i * 4, 4, request_id=f"q{i}"))
    w.close()
    data = (tmp_path / "run" / segment_name(0)).read_bytes()
    sums = [group_checksum(data, g) for g in scan_stream(data, "seg").groups]
    assert len(sums) == 3 and all(s is not None and s == c for s, c in sums)
    assert _manifest(tmp_path / "run")["batch_checksum"] == "crc32-group"


def test_a_changed_byte_changes_the_group_checksum(tmp_path: Path) -> None:
    from kvclaims.reconstruct.loader import group_checksum, scan_stream

    w = RunWriter(tmp_path / "run", {"run_id": "r1"})
    w.write_batch(_batch(0, 4))
    w.close()
    data = bytearray((tmp_path / "run" / segment_name(0)).read_bytes())
    (g,) = scan_stream(bytes(data), "seg").groups
    data[g.end - 3] ^= 1  # inside the record batch body
    stored, computed = group_checksum(bytes(data), g)
    assert stored != computed


def test_each_group_decodes_on_its_own(tmp_path: Path) -> None:
    """Every batch re-sends its dictionaries: a reader can skip a damaged one."""
    from kvclaims.reconstruct.loader import scan_stream

    w = RunWriter(tmp_path / "run", {"run_id": "r1"})
    w.write_batch(_batch(0, 2, request_id="alpha"))
    w.write_batch(_batch(2, 2, request_id="alpha"))  # equal dictionary: still re-sent
    w.close()
    data = (tmp_path / "run" / segment_name(0)).read_bytes()
    scan = scan_stream(data, "seg")
    second = scan.groups[1]
    alone = data[:scan.schema_end] + data[second.start:second.end]
    (batch,) = list(pa.ipc.open_stream(alone))
    assert batch.column("request_id").to_pylist() == ["alpha", "alpha"]


# -- keyed content hashes -----------------------------------------------------------------------

def _hashes(run_dir: Path) -> list[int | None]:
    return _read_segment(run_dir / segment_name(0)).column("block_hash").to_pylist()


def _hash_batch(values: list[int | None]) -> pa.RecordBatch:
    n = len(values)
    return build_batch(list(range(n)), list(range(n)), ["block_hit"] * n, "r1",
                       {"block_id": list(range(n)), "block_hash": values,
                        "position": [0] * n, "request_id": ["q"] * n})


def test_siphash_matches_the_reference_test_vector() -> None:
    import numpy as np

    from kvclaims.contract.trace_writer import siphash64

    # SipHash-2-4 reference vectors: key 00..0f, message 00..07 -> 62 24 93 9a 79 f5 f5 93
    msg = int.from_bytes(bytes(range(8)), "little")
    out = siphash64(bytes(range(16)), np.array([msg], dtype=np.uint64))
    assert int(out[0]) == 0x93F5F5799A932462
    assert int(siphash64(bytes(16), np.array([msg], dtype=np.uint64))[0]) != 0x93F5F5799A932462


def test_hashes_are_keyed_by_default_and_equality_is_kept(tmp_path: Path) -> None:
    raw = [2**64 - 1, 5, 2**64 - 1, None, 5]
    w = RunWriter(tmp_path / "run", {"run_id": "r1"})
    w.write_batch(_hash_batch(raw))
    w.close()
    got = _hashes(tmp_path / "run")
    assert got[3] is None and got[0] == got[2] and got[1] == got[4] and got[0] != got[1]
    assert {got[0], got[1]}.isdisjoint({2**64 - 1, 5})
    m = _manifest(tmp_path / "run")
    assert m["hash_scheme"] == "keyed-siphash24-64" and len(m["hash_key_id"]) == 16


def test_vllm_raw_keeps_the_runtime_hashes(tmp_path: Path) -> None:
    w = RunWriter(tmp_path / "run", {"run_id": "r1"}, hash_scheme="vllm-raw")
    w.write_batch(_hash_batch([2**64 - 1, 5]))
    w.close()
    assert _hashes(tmp_path / "run") == [2**64 - 1, 5]
    m = _manifest(tmp_path / "run")
    assert (m["hash_scheme"], m["hash_key_id"]) == ("vllm-raw", None)


def test_random_per_run_keys_differ_and_are_never_written(tmp_path: Path) -> None:
    outs = []
    for name in ("a", "b"):
        w = RunWriter(tmp_path / name, {"run_id": name})
        w.write_batch(_hash_batch([7]))
        key = w._hash_key
        w.close()
        outs.append(_hashes(tmp_path / name)[0])
        assert key is not None
        for f in (tmp_path / name).iterdir():
            assert key not in f.read_bytes() and key.hex().encode() not in f.read_bytes()
    assert outs[0] != outs[1]


def test_a_deployment_key_file_gives_stable_hashes_across_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    keyfile = tmp_path / "key"
    keyfile.write_bytes(b"operator-controlled secret material 0123456789")
    monkeypatch.setenv("KVCLAIMS_HASH_KEY_FILE", str(keyfile))
    outs, ids = [], []
    for name in ("a", "b"):
        w = RunWriter(tmp_path / name, {"run_id": name})
        w.write_batch(_hash_batch([7]))
        w.close()
        outs.append(_hashes(tmp_path / name)[0])
        ids.append(_manifest(tmp_path / name)["hash_key_id"])
    assert outs[0] == outs[1] != 7 and ids[0] == ids[1]


def test_an_unreadable_key_file_is_a_clear_error(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVCLAIMS_HASH_KEY_FILE", str(tmp_path / "missing"))
    with pytest.raises(InputError, match="hash key file"):
        RunWriter(tmp_path / "run", {"run_id": "r1"})


def test_an_unknown_hash_scheme_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="hash scheme"):
        RunWriter(tmp_path / "run", {"run_id": "r1"}, hash_scheme="md5")


# -- wall-clock anchor --------------------------------------------------------------------------

def test_manifest_anchors_the_monotonic_clock_to_utc(tmp_path: Path) -> None:
    import socket
    import time
    from datetime import datetime

    before_utc, before_mono = time.time_ns(), time.monotonic_ns()
    RunWriter(tmp_path / "run", {"run_id": "r1"}).close()
    clock = _manifest(tmp_path / "run")["clock"]
    assert before_utc <= clock["utc_ns"] <= time.time_ns()
    assert before_mono <= clock["monotonic_ns"] <= time.monotonic_ns()
    assert clock["host"] == socket.gethostname()
    parsed = datetime.fromisoformat(clock["utc"].replace("Z", "+00:00")[:26] + "+00:00")
    assert abs(parsed.timestamp() * 1e9 - clock["utc_ns"]) < 1e6


def test_a_run_without_a_clock_says_so(tmp_path: Path) -> None:
    RunWriter(tmp_path / "run", {"run_id": "r1"}, clock=False).close()
    assert _manifest(tmp_path / "run")["clock"] is None


# -- token ids are never recorded ---------------------------------------------------------------

TRACES = Path(__file__).resolve().parents[1] / "traces"


class _PromptLog:
    """Collects the prompts a scenario script submits (the engine is not needed for that)."""

    def __init__(self) -> None:
        self.prompts: list[list[int]] = []

    def submit(self, name: str, prompt: list[int], **_kw: object) -> None:
        self.prompts.append(list(prompt))

    def run(self, *a: object, **k: object) -> None: ...
    def step(self, *a: object, **k: object) -> None: ...
    def sleep(self, *a: object, **k: object) -> None: ...
    def abort(self, *a: object, **k: object) -> None: ...


def _token_windows_found(run_dir: Path, prompts: list[list[int]], width: int = 8) -> list[str]:
    """Where any ``width`` consecutive prompt token ids appear in a trace: as consecutive values
    of an integer column, or as int32/int64 bytes anywhere in its uncompressed buffers."""
    from kvclaims.reconstruct.loader import load_runs

    events = load_runs([run_dir]).events
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, events.schema) as w:
        w.write_table(events)
    raw = sink.getvalue().to_pybytes()
    found = []
    windows = {tuple(p[i:i + width]) for p in prompts for i in range(0, len(p) - width, width)}
    for name in events.column_names:
        col = events.column(name)
        if not pa.types.is_integer(col.type):
            continue
        values = col.to_pylist()
        seen = {tuple(values[i:i + width]) for i in range(len(values) - width + 1)}
        found += [f"column {name}" for _ in windows & seen][:1]
    for win in list(windows)[:200]:
        for fmt in ("<i", "<q"):
            import struct
            if struct.pack(f"{fmt[0]}{width}{fmt[1]}", *win) in raw:
                found.append(f"bytes {fmt}")
    return found


def test_a_recorded_trace_holds_none_of_its_prompts_token_ids() -> None:
    from kvclaims.sources.scenarios import multi_tenant

    log = _PromptLog()
    multi_tenant(log, "hard_protected")  # type: ignore[arg-type]
    assert sum(map(len, log.prompts)) > 1000
    assert _token_windows_found(TRACES / "multi_tenant", log.prompts) == []


def test_the_token_scan_finds_token_ids_that_were_written(tmp_path: Path) -> None:
    prompt = [17, 230, 41, 99, 5, 311, 72, 8, 123, 64, 201, 3, 77, 18, 250, 9]
    n = len(prompt)
    w = RunWriter(tmp_path / "run", {"run_id": "r1"}, hash_scheme="vllm-raw")
    w.write_batch(build_batch(list(range(n)), list(range(n)), ["block_allocated"] * n, "r1",
                              {"block_id": prompt, "request_id": ["q"] * n}))
    w.close()
    assert _token_windows_found(tmp_path / "run", [prompt])


# -- sealing --------------------------------------------------------------------------------------

def test_a_clean_close_seals_the_run_into_parquet(tmp_path: Path) -> None:
    from kvclaims.reconstruct.loader import load_runs

    w = RunWriter(tmp_path / "run", {"run_id": "r1"}, rotate_bytes=1)
    for i in range(3):
        w.write_batch(_batch(i * 4, 4, request_id=f"q{i}"))
    w.close()
    sealed = _manifest(tmp_path / "run")["sealed"]
    assert (sealed["file"], sealed["format"], sealed["events"]) == ("events.parquet",
                                                                    "parquet", 12)
    via_parquet = load_runs([tmp_path / "run"]).events
    via_ipc = load_runs([tmp_path / "run"], sealed=False).events
    assert via_parquet.equals(via_ipc) and via_parquet.num_rows == 12


def test_a_run_that_did_not_close_is_not_sealed(tmp_path: Path) -> None:
    w = RunWriter(tmp_path / "run", {"run_id": "r1"})
    w.write_batch(_batch(0, 4))
    w.rotate()
    assert "sealed" not in _manifest(tmp_path / "run")
    assert not (tmp_path / "run" / "events.parquet").exists()


def test_a_damaged_sealed_file_falls_back_to_the_segments(tmp_path: Path) -> None:
    from kvclaims.reconstruct.loader import load_runs

    w = RunWriter(tmp_path / "run", {"run_id": "r1"}, rotate_bytes=1)
    for i in range(3):
        w.write_batch(_batch(i * 4, 4))
    w.close()
    sealed = tmp_path / "run" / "events.parquet"
    data = bytearray(sealed.read_bytes())
    data[len(data) // 3] ^= 0xFF
    sealed.write_bytes(bytes(data))
    trace = load_runs([tmp_path / "run"])
    assert trace.events.column("seq").to_pylist() == list(range(12))
    assert any("sealed copy unusable" in t for t in trace.truncations)


def test_key_hashes_maps_values_as_the_trace_holds_them(tmp_path: Path) -> None:
    w = RunWriter(tmp_path / "run", {"run_id": "r1"})
    w.write_batch(_hash_batch([11, 12]))
    mapped = [int(v) for v in w.key_hashes([11, 12])]
    w.close()
    assert _hashes(tmp_path / "run") == mapped and mapped != [11, 12]
    raw = RunWriter(tmp_path / "raw", {"run_id": "r2"}, hash_scheme="vllm-raw")
    assert [int(v) for v in raw.key_hashes([11, 12])] == [11, 12]
