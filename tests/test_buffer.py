"""EventBuffer: seq/ts stamping, overflow gaps, never raising, close (real run dirs)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from kvclaims.recorder.buffer import EventBuffer, event_problem
from kvclaims.contract.schema import SCHEMA_VERSION, InputError
from kvclaims.contract.trace_writer import RunWriter
from kvclaims.reconstruct.loader import load_runs

REPO = Path(__file__).resolve().parents[1]


def _buffer(run_dir: Path, **kwargs: Any) -> EventBuffer:
    kwargs.setdefault("flush_interval_s", 3600)  # tests flush explicitly
    info = {"run_id": "r1", "model": "tiny", "block_size": 32, "num_blocks": 81,
            "usable_blocks": 80, "runtime": "vllm", "policy": "native"}
    # NOTE: vllm-raw: these tests check values round-trip; keyed hashing has its own tests
    return EventBuffer(RunWriter(run_dir, info, hash_scheme="vllm-raw"), "r1", **kwargs)


def _events(run_dir: Path) -> list[dict[str, Any]]:
    rows = load_runs([run_dir]).events.to_pylist()
    return [{k: v for k, v in r.items() if v is not None} for r in rows]


def _manifest(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "manifest.json").read_text())


def test_run_started_is_seq_zero_with_the_run_facts(tmp_path: Path) -> None:
    buf = _buffer(tmp_path / "run")
    buf.close()
    first = _events(tmp_path / "run")[0]
    assert (first["seq"], first["event"]) == (0, "run_started")
    assert first["model"] == "tiny" and first["usable_blocks"] == 80
    assert first["schema_version"] == SCHEMA_VERSION


def test_without_run_started_the_callers_first_event_is_seq_zero(tmp_path: Path) -> None:
    buf = _buffer(tmp_path / "run", emit_run_started=False)
    buf.emit("block_allocated", block_id=1, request_id="a")
    buf.close()
    first = _events(tmp_path / "run")[0]
    assert (first["seq"], first["event"]) == (0, "block_allocated")


def test_seq_strictly_increases_and_ts_is_monotonic(tmp_path: Path) -> None:
    buf = _buffer(tmp_path / "run")
    for i in range(100):
        buf.emit("block_allocated", block_id=i, request_id="a")
    buf.close()
    events = _events(tmp_path / "run")
    assert [e["seq"] for e in events] == list(range(102))
    ts = [e["ts_ns"] for e in events]
    assert ts == sorted(ts)


def test_emitted_fields_are_written(tmp_path: Path) -> None:
    buf = _buffer(tmp_path / "run")
    buf.emit("block_cached", block_id=3, block_hash=2**64 - 1, parent_hash=2**63,
             position=0, request_id="a")
    buf.emit("request_refused", request_id="b", blocks_required=9, free_blocks=1,
             protected_blocks=60, usable_blocks=80, blocking_claim_ids=["c1", "c2"],
             shortfall_blocks=8, reason="hard_claims")
    buf.close()
    cached, refused = _events(tmp_path / "run")[1:3]
    assert cached["block_hash"] == 2**64 - 1 and cached["parent_hash"] == 2**63
    assert refused["blocking_claim_ids"] == ["c1", "c2"]


def test_close_appends_run_finished_last_with_counts(tmp_path: Path) -> None:
    buf = _buffer(tmp_path / "run")
    buf.emit("block_allocated", block_id=1, request_id="a")
    buf.close()
    events = _events(tmp_path / "run")
    last = events[-1]
    assert last["event"] == "run_finished"
    assert last["events_written"] == len(events) == 3
    assert last["events_dropped"] == 0
    m = _manifest(tmp_path / "run")
    assert m["complete"] is True and m["events_written"] == 3


def test_close_is_idempotent_and_later_emits_are_ignored(tmp_path: Path) -> None:
    buf = _buffer(tmp_path / "run")
    buf.close()
    buf.close()
    buf.emit("block_allocated", block_id=1, request_id="a")
    assert buf.events_after_close == 1
    assert [e["event"] for e in _events(tmp_path / "run")] == ["run_started", "run_finished"]


def test_overflow_drops_and_writes_a_gap_with_the_exact_span(tmp_path: Path) -> None:
    buf = _buffer(tmp_path / "run", capacity=10)
    for i in range(25):  # seq 1..25; run_started + seq 1..9 fill the buffer
        buf.emit("block_allocated", block_id=i, request_id="a")
    buf.flush()
    buf.emit("block_freed", block_id=0, request_id="a")  # accepted: preceded by the gap
    buf.close()
    events = _events(tmp_path / "run")
    gap = next(e for e in events if e["event"] == "recorder_gap")
    assert (gap["first_seq"], gap["last_seq"], gap["events_dropped"]) == (10, 25, 16)
    assert gap["reason"] == "buffer_full"
    after = events[events.index(gap) + 1]
    assert (after["event"], after["seq"]) == ("block_freed", gap["seq"] + 1)
    assert gap["seq"] == 26
    assert events[-1]["events_dropped"] == 16
    assert _manifest(tmp_path / "run")["events_dropped"] == 16


def test_no_gap_without_overflow(tmp_path: Path) -> None:
    buf = _buffer(tmp_path / "run", capacity=1000)
    for i in range(25):
        buf.emit("block_allocated", block_id=i, request_id="a")
    buf.close()
    events = _events(tmp_path / "run")
    assert not [e for e in events if e["event"] == "recorder_gap"]
    assert buf.events_dropped == 0


def test_every_seq_is_written_or_covered_by_a_gap(tmp_path: Path) -> None:
    buf = _buffer(tmp_path / "run", capacity=7)
    for round_ in range(5):
        for i in range(11):
            buf.emit("block_allocated", block_id=i, request_id=f"r{round_}")
        buf.flush()
    buf.close()
    events = _events(tmp_path / "run")
    covered = {e["seq"] for e in events}
    for gap in (e for e in events if e["event"] == "recorder_gap"):
        covered |= set(range(gap["first_seq"], gap["last_seq"] + 1))
    assert covered == set(range(events[-1]["seq"] + 1))


def test_drops_at_the_end_are_reported_before_run_finished(tmp_path: Path) -> None:
    buf = _buffer(tmp_path / "run", capacity=3)
    for i in range(6):
        buf.emit("block_allocated", block_id=i, request_id="a")
    buf.close()
    events = _events(tmp_path / "run")
    assert [e["event"] for e in events[-2:]] == ["recorder_gap", "run_finished"]
    assert events[-1]["events_written"] == len(events)
    assert events[-1]["events_dropped"] == events[-2]["events_dropped"] == 4


def test_bad_field_value_is_dropped_counted_and_gapped(tmp_path: Path) -> None:
    buf = _buffer(tmp_path / "run")
    buf.emit("block_allocated", block_id=1, request_id="a")
    buf.emit("block_allocated", block_id=1.5, request_id="a")  # seq 2: float block id
    buf.emit("block_allocated", block_id=3, request_id="a")
    buf.close()
    events = _events(tmp_path / "run")
    assert [e["seq"] for e in events if e["event"] == "block_allocated"] == [1, 3]
    gap = next(e for e in events if e["event"] == "recorder_gap")
    assert (gap["first_seq"], gap["last_seq"], gap["reason"]) == (2, 2, "invalid_event")
    m = _manifest(tmp_path / "run")
    assert m["recorder_errors"] == 1 and m["events_dropped"] == 1
    assert "block_id" in m["recorder_error_samples"][0]


def test_unknown_event_is_dropped_and_the_rest_written(tmp_path: Path) -> None:
    buf = _buffer(tmp_path / "run")
    buf.emit("no_such_event", block_id=1)
    buf.emit("block_freed", block_id=1, request_id="a")
    buf.close()
    names = [e["event"] for e in _events(tmp_path / "run")]
    assert "no_such_event" not in names and "block_freed" in names
    assert buf.recorder_errors == 1


def test_field_that_does_not_belong_to_the_event_is_dropped(tmp_path: Path) -> None:
    buf = _buffer(tmp_path / "run")
    buf.emit("block_freed", block_id=1, request_id="a", claim_id="c1")
    buf.close()
    assert "block_freed" not in [e["event"] for e in _events(tmp_path / "run")]
    assert buf.events_dropped == 1


def test_valid_events_pass_the_event_check() -> None:
    assert event_problem("block_freed", {"block_id": 1, "request_id": "a"}) is None
    assert event_problem("block_freed", {"block_id": "1"}) is not None


def test_numpy_integers_are_accepted(tmp_path: Path) -> None:
    np = pytest.importorskip("numpy")
    buf = _buffer(tmp_path / "run")
    buf.emit("block_cached", block_id=np.int64(5), block_hash=np.uint64(2**64 - 1),
             position=np.int32(0), request_id="a")
    buf.close()
    cached = _events(tmp_path / "run")[1]
    assert (cached["block_id"], cached["block_hash"]) == (5, 2**64 - 1)


def test_emit_never_raises_when_the_run_dir_is_removed(tmp_path: Path) -> None:
    buf = _buffer(tmp_path / "run")
    shutil.rmtree(tmp_path / "run")  # before the first segment is opened
    for i in range(10):
        buf.emit("block_allocated", block_id=i, request_id="a")
    buf.flush()
    buf.emit("block_allocated", block_id=11, request_id="a")
    buf.close()  # must not raise either
    assert buf.recorder_errors >= 2
    assert buf.events_dropped >= 11  # run_started + 10, then the gaps themselves


def test_removing_the_run_dir_mid_segment_is_counted_at_close(tmp_path: Path) -> None:
    buf = _buffer(tmp_path / "run")
    buf.emit("block_allocated", block_id=1, request_id="a")
    buf.flush()
    shutil.rmtree(tmp_path / "run")  # the open segment lives on, unlinked
    buf.emit("block_allocated", block_id=2, request_id="a")
    buf.close()
    assert buf.recorder_errors >= 1  # the final manifest could not be written


def test_emit_never_raises_on_unconvertible_values(tmp_path: Path) -> None:
    buf = _buffer(tmp_path / "run")
    buf.emit("block_allocated", block_id=object(), request_id=b"bytes")
    buf.emit("block_cached", block_hash=-1)  # uint64 out of range
    buf.emit("block_cached", block_hash=2**64)
    buf.emit("request_deferred", blocking_claim_ids="c1")  # a str is not a list
    buf.emit("block_allocated", block_id=2**40)  # int32 out of range
    buf.close()
    assert buf.events_dropped == 5 and buf.recorder_errors == 5
    assert _manifest(tmp_path / "run")["complete"] is True


def test_background_thread_writes_without_flush(tmp_path: Path) -> None:
    buf = _buffer(tmp_path / "run", flush_interval_s=0.02)
    buf.emit("block_allocated", block_id=1, request_id="a")
    deadline = time.monotonic() + 5
    seg = tmp_path / "run" / "events-000000.arrows"
    while time.monotonic() < deadline and not (seg.exists() and seg.stat().st_size > 0):
        time.sleep(0.01)
    assert seg.exists() and seg.stat().st_size > 0
    buf.close()


def test_emit_is_thread_safe(tmp_path: Path) -> None:
    buf = _buffer(tmp_path / "run", flush_interval_s=0.01)

    def work(t: int) -> None:
        for i in range(2000):
            buf.emit("block_allocated", block_id=i, request_id=f"t{t}")

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    buf.close()
    events = _events(tmp_path / "run")
    assert [e["seq"] for e in events] == list(range(8002))
    assert sum(e["event"] == "block_allocated" for e in events) == 8000


def test_run_id_must_match_the_writer(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="differs"):
        EventBuffer(RunWriter(tmp_path / "run", {"run_id": "r1"}), "r2")


def test_close_runs_at_interpreter_exit(tmp_path: Path) -> None:
    script = (
        "from kvclaims.contract.trace_writer import RunWriter\n"
        "from kvclaims.recorder.buffer import EventBuffer\n"
        f"buf = EventBuffer(RunWriter({str(tmp_path / 'run')!r}, {{'run_id': 'r1'}}), 'r1')\n"
        "buf.emit('block_allocated', block_id=1, request_id='a')\n"  # no close(): atexit does it
    )
    subprocess.run([sys.executable, "-c", script], check=True, cwd=REPO, timeout=60)
    assert _manifest(tmp_path / "run")["complete"] is True
    assert [e["event"] for e in _events(tmp_path / "run")] == [
        "run_started", "block_allocated", "run_finished"]


def test_killed_process_leaves_a_readable_incomplete_run(tmp_path: Path) -> None:
    script = (
        "import os\n"
        "from kvclaims.contract.trace_writer import RunWriter\n"
        "from kvclaims.recorder.buffer import EventBuffer\n"
        f"buf = EventBuffer(RunWriter({str(tmp_path / 'run')!r}, {{'run_id': 'r1'}}), 'r1')\n"
        "buf.emit('block_allocated', block_id=1, request_id='a')\n"
        "buf.flush()\n"
        "os._exit(1)\n"  # no atexit, no close: like a SIGKILL
    )
    subprocess.run([sys.executable, "-c", script], cwd=REPO, timeout=60)
    trace = load_runs([tmp_path / "run"])
    assert trace.incomplete_runs == {"r1"}
    assert trace.truncated_runs == {"r1"}
    assert trace.events.column("event").to_pylist() == ["run_started", "block_allocated"]


# --- columnar entries, scheduler steps, raw vLLM hashes (issue 9) -----------------------------

def test_emit_many_writes_one_row_per_event_with_consecutive_seqs(tmp_path: Path) -> None:
    buf = _buffer(tmp_path / "run", emit_run_started=False)
    buf.emit("block_freed", block_id=9, request_id="a")
    buf.emit_many("block_allocated", 3, {"block_id": [1, 2, 3], "request_id": "b"})
    buf.emit("block_freed", block_id=8, request_id="a")
    buf.close()
    rows = [(e["seq"], e["event"], e.get("block_id"), e.get("request_id"))
            for e in _events(tmp_path / "run")]
    assert rows[:5] == [(0, "block_freed", 9, "a"), (1, "block_allocated", 1, "b"),
                        (2, "block_allocated", 2, "b"), (3, "block_allocated", 3, "b"),
                        (4, "block_freed", 8, "a")]


def test_emit_many_with_a_short_column_is_dropped_and_gapped(tmp_path: Path) -> None:
    buf = _buffer(tmp_path / "run", emit_run_started=False)
    buf.emit_many("block_allocated", 3, {"block_id": [1, 2], "request_id": "b"})
    buf.emit("block_freed", block_id=8, request_id="a")
    buf.close()
    events = _events(tmp_path / "run")
    gap = next(e for e in events if e["event"] == "recorder_gap")
    assert (gap["first_seq"], gap["last_seq"], gap["events_dropped"]) == (0, 2, 3)
    assert [e["seq"] for e in events if e["event"] == "block_freed"] == [3]


def test_overflowing_emit_many_gaps_every_seq_it_held(tmp_path: Path) -> None:
    buf = _buffer(tmp_path / "run", emit_run_started=False, capacity=1)
    buf.emit("block_freed", block_id=1, request_id="a")
    buf.emit_many("block_allocated", 4, {"block_id": [1, 2, 3, 4], "request_id": "b"})
    buf.flush()
    buf.emit("block_freed", block_id=2, request_id="a")
    buf.close()
    gap = next(e for e in _events(tmp_path / "run") if e["event"] == "recorder_gap")
    assert (gap["first_seq"], gap["last_seq"], gap["events_dropped"]) == (1, 4, 4)


def test_every_event_carries_the_step_it_was_recorded_in(tmp_path: Path) -> None:
    buf = _buffer(tmp_path / "run", step=0)
    buf.emit("block_freed", block_id=1, request_id="a")
    buf.advance_step()
    buf.emit_many("block_allocated", 2, {"block_id": [1, 2], "request_id": "b"})
    buf.flush()
    buf.advance_step()
    buf.advance_step()
    buf.emit("block_freed", block_id=2, request_id="a")
    buf.close()
    steps = [(e["event"], e.get("step")) for e in _events(tmp_path / "run")]
    assert steps == [("run_started", 0), ("block_freed", 0), ("block_allocated", 1),
                     ("block_allocated", 1), ("block_freed", 3), ("run_finished", 3)]


def test_a_buffer_without_steps_writes_null_steps(tmp_path: Path) -> None:
    buf = _buffer(tmp_path / "run")
    buf.emit("block_freed", block_id=1, request_id="a")
    buf.close()
    assert all("step" not in e for e in _events(tmp_path / "run"))


def test_raw_vllm_hashes_become_their_low_64_bits_on_the_writer(tmp_path: Path) -> None:
    digest = bytes(range(32))
    keyed = digest + (0).to_bytes(4, "big")  # vLLM's BlockHashWithGroupId for group 0
    buf = _buffer(tmp_path / "run", emit_run_started=False)
    buf.emit_many("block_cached", 2, {"block_id": [1, 2], "block_hash": [keyed, keyed],
                                      "parent_hash": [None, digest], "position": [0, 1],
                                      "request_id": "a"})
    buf.emit("claim_harmed", claim_id="c", block_hash=keyed)
    buf.close()
    low = int.from_bytes(digest[-8:], "big")
    rows = [(e.get("block_hash"), e.get("parent_hash")) for e in _events(tmp_path / "run")
            if e["event"] in ("block_cached", "claim_harmed")]
    assert rows == [(low, None), (low, low), (low, None)]


def test_integer_hashes_are_written_unchanged(tmp_path: Path) -> None:
    buf = _buffer(tmp_path / "run", emit_run_started=False)
    buf.emit("claim_harmed", claim_id="c", block_hash=2**64 - 1)
    buf.close()
    assert _events(tmp_path / "run")[0]["block_hash"] == 2**64 - 1


# --- the engine's staged entries (issue 9: one locked move per scheduler step) ----------------

def _alloc_layout() -> Any:
    from kvclaims.recorder.buffer import layout

    return layout(("request_id",), ("block_id",))


def test_staged_entries_take_their_seqs_in_staging_order_before_a_later_emit(
        tmp_path: Path) -> None:
    buf = _buffer(tmp_path / "run", emit_run_started=False)
    buf.stage(("block_freed", 1, time.monotonic_ns(), {"block_id": 9, "request_id": "a"}))
    buf.stage(("block_allocated", 2, time.monotonic_ns(), _alloc_layout(), "b", 1, 2))
    buf.emit("block_freed", block_id=8, request_id="a")  # not staged: after the staged ones
    buf.close()
    rows = [(e["seq"], e["event"], e.get("block_id"), e.get("request_id"))
            for e in _events(tmp_path / "run")]
    assert rows[:4] == [(0, "block_freed", 9, "a"), (1, "block_allocated", 1, "b"),
                        (2, "block_allocated", 2, "b"), (3, "block_freed", 8, "a")]


def test_a_staged_entry_whose_values_do_not_fit_its_layout_is_dropped_and_gapped(
        tmp_path: Path) -> None:
    buf = _buffer(tmp_path / "run", emit_run_started=False)
    buf.stage(("block_allocated", 3, time.monotonic_ns(), _alloc_layout(), "b", 1, 2))
    buf.stage(("block_allocated", 2, time.monotonic_ns(), _alloc_layout(), "c", 5, 6))
    buf.close()
    events = _events(tmp_path / "run")
    gap = next(e for e in events if e["event"] == "recorder_gap")
    assert (gap["first_seq"], gap["last_seq"], gap["events_dropped"]) == (0, 2, 3)
    assert [(e["seq"], e["block_id"]) for e in events if e["event"] == "block_allocated"] \
        == [(3, 5), (4, 6)]


def test_staged_entries_carry_the_step_they_were_staged_in(tmp_path: Path) -> None:
    buf = _buffer(tmp_path / "run", step=0)
    buf.stage(("block_freed", 1, time.monotonic_ns(), {"block_id": 1, "request_id": "a"}))
    buf.advance_step()
    buf.stage(("block_allocated", 2, time.monotonic_ns(), _alloc_layout(), "b", 1, 2))
    buf.advance_step()
    buf.close()
    steps = [(e["event"], e.get("step")) for e in _events(tmp_path / "run")]
    assert steps == [("run_started", 0), ("block_freed", 0), ("block_allocated", 1),
                     ("block_allocated", 1), ("run_finished", 2)]


def test_staged_entries_past_capacity_are_dropped_and_gapped_as_one_step(
        tmp_path: Path) -> None:
    buf = _buffer(tmp_path / "run", emit_run_started=False, capacity=1)
    buf.emit("block_freed", block_id=1, request_id="a")
    buf.stage(("block_allocated", 2, time.monotonic_ns(), _alloc_layout(), "b", 1, 2))
    buf.stage(("block_freed", 1, time.monotonic_ns(), {"block_id": 3, "request_id": "a"}))
    buf.advance_step()  # the move finds the buffer full: the whole group is dropped
    buf.flush()
    buf.emit("block_freed", block_id=2, request_id="a")
    buf.close()
    events = _events(tmp_path / "run")
    gap = next(e for e in events if e["event"] == "recorder_gap")
    assert (gap["first_seq"], gap["last_seq"], gap["events_dropped"]) == (1, 3, 3)
    assert buf.events_dropped == 3


def test_staged_entries_within_capacity_are_all_written(tmp_path: Path) -> None:
    buf = _buffer(tmp_path / "run", emit_run_started=False, capacity=2)
    buf.emit("block_freed", block_id=1, request_id="a")
    buf.stage(("block_allocated", 2, time.monotonic_ns(), _alloc_layout(), "b", 1, 2))
    buf.advance_step()
    buf.close()
    assert buf.events_dropped == 0
    assert [e["event"] for e in _events(tmp_path / "run")] == [
        "block_freed", "block_allocated", "block_allocated", "run_finished"]


def test_a_step_moves_the_staged_entries_once_the_bound_is_reached(tmp_path: Path) -> None:
    from kvclaims.recorder.buffer import _MOVE_EVERY

    buf = _buffer(tmp_path / "run", step=0, emit_run_started=False)
    for i in range(_MOVE_EVERY):
        buf.stage(("block_freed", 1, time.monotonic_ns(), {"block_id": i, "request_id": "a"}))
    buf.advance_step()
    assert buf._staged == []   # the staged list is bounded without any other caller moving it
    buf.close()
    events = [e for e in _events(tmp_path / "run") if e["event"] == "block_freed"]
    assert [e["seq"] for e in events] == list(range(_MOVE_EVERY))
    assert {e["step"] for e in events} == {0}


def test_a_step_below_the_bound_leaves_the_staged_entries_for_the_next_move(
        tmp_path: Path) -> None:
    buf = _buffer(tmp_path / "run", step=0, emit_run_started=False)
    buf.stage(("block_freed", 1, time.monotonic_ns(), {"block_id": 1, "request_id": "a"}))
    buf.advance_step()
    assert len(buf._staged) == 2   # the entry and the step mark: no lock taken, nothing moved
    buf.close()
    assert [(e["event"], e["step"]) for e in _events(tmp_path / "run")] == [
        ("block_freed", 0), ("run_finished", 1)]


def test_staged_entries_after_close_are_ignored(tmp_path: Path) -> None:
    buf = _buffer(tmp_path / "run")
    buf.close()
    buf.stage(("block_freed", 1, time.monotonic_ns(), {"block_id": 1, "request_id": "a"}))
    buf.advance_step()
    assert buf.events_after_close == 1
    assert [e["event"] for e in _events(tmp_path / "run")] == ["run_started", "run_finished"]


def test_malformed_staged_entries_are_gapped_and_the_rest_keep_their_seqs(tmp_path: Path) -> None:
    buf = _buffer(tmp_path / "run", emit_run_started=False)
    buf.stage(("block_freed",))  # no count, no fields: one seq
    buf.stage(("block_allocated", 0, time.monotonic_ns(), _alloc_layout(), "b"))  # count < 1
    buf.stage(("block_allocated", 2, time.monotonic_ns(), {"block_id": 1}))  # a dict for 2
    buf.stage(("block_allocated", 2, time.monotonic_ns(), _alloc_layout(), "c", 5, 6))
    buf.close()
    events = _events(tmp_path / "run")
    gaps = [(e["first_seq"], e["last_seq"]) for e in events if e["event"] == "recorder_gap"]
    assert gaps == [(0, 3)]
    assert [(e["seq"], e["block_id"]) for e in events if e["event"] == "block_allocated"] \
        == [(4, 5), (5, 6)]
    assert buf.events_dropped == 4
