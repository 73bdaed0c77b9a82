"""Crash safety: a kill at any byte, a disk that fills and frees, a flipped byte.

Real files, the real writer and loader; a real SIGKILL of a recording process; a real full
filesystem (a small tmpfs) where this machine lets us mount one, otherwise an injected ENOSPC
in the writer's one write call (the test says which ran).
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from benchmarks.recorder_cost import workload
from kvclaims.contract import trace_writer
from kvclaims.contract.batches import build_batch
from kvclaims.recorder.buffer import EventBuffer
from kvclaims.contract.trace_writer import RunWriter, WriteError, segment_name
from kvclaims.reconstruct.loader import group_checksum, load_runs, scan_stream

ROOT = Path(__file__).resolve().parents[1]


def _record(run_dir: Path, batches: int = 3, per_batch: int = 60) -> Path:
    """A real recording (realistic block-event mix), one record batch per flush, then killed
    in spirit: the manifest is the one a crash leaves (complete false, open segment unlisted)."""
    writer = RunWriter(run_dir, {"run_id": "r1", "block_size": 32})
    buf = EventBuffer(writer, "r1", flush_interval_s=3600)
    for i, (name, fields) in enumerate(workload(batches * per_batch)):
        buf.emit(name, **fields)
        if i % per_batch == per_batch - 1:
            buf.flush()
    buf.close()
    manifest = json.loads((run_dir / "manifest.json").read_text())
    manifest.update(complete=False, segments=[])
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    return run_dir


def _group_rows(run_dir: Path) -> list[int]:
    """Rows of each record batch of the intact segment, in order."""
    import pyarrow as pa

    with pa.OSFile(str(run_dir / segment_name(0))) as fh:
        return [b.num_rows for b in pa.ipc.open_stream(fh)]


def _full_every_byte() -> bool:
    return os.environ.get("KVCLAIMS_EVERY_BYTE_FULL") == "1"


def test_a_cut_at_every_byte_of_the_last_two_batches_keeps_every_complete_batch(
        tmp_path: Path) -> None:
    """Every byte offset: the framing and checksums select exactly the complete batches before
    the cut; the full loader (decompression included) runs at every offset within 4 bytes
    of a message boundary and every 101st byte elsewhere (``KVCLAIMS_EVERY_BYTE_FULL=1``: at every byte)."""
    run = _record(tmp_path / "run", batches=2)
    seg = run / segment_name(0)
    data = seg.read_bytes()
    rows = _group_rows(run)
    groups = scan_stream(data, str(seg)).groups
    assert len(groups) == len(rows) == 3  # two batches of events, then run_finished
    boundaries = {g.start for g in groups} | {g.meta_start for g in groups} | {
        g.meta_end for g in groups} | {g.end for g in groups}
    full_loads = 0
    for cut in range(groups[-2].start, len(data) + 1):
        prefix = data[:cut]
        scan = scan_stream(prefix, str(seg))
        complete = [g for g in groups if g.end <= cut]
        assert list(scan.groups) == complete
        assert all(s == c for s, c in (group_checksum(prefix, g) for g in scan.groups))
        near = any(abs(cut - b) <= 4 for b in boundaries)
        if _full_every_byte() or near or cut % 101 == 0:
            seg.write_bytes(prefix)
            trace = load_runs([run])
            kept = sum(rows[:len(complete)])
            assert trace.events.column("seq").to_pylist() == list(range(kept)), cut
            if cut < len(data):
                assert trace.truncated_runs == {"r1"} and trace.holes
            full_loads += 1
    assert full_loads > 100


def test_an_intact_recording_loads_without_a_hole(tmp_path: Path) -> None:
    run = _record(tmp_path / "run")
    trace = load_runs([run])
    assert trace.events.num_rows == sum(_group_rows(run)) and trace.holes == []


def test_a_flipped_byte_in_any_batch_is_a_hole_never_a_different_event(tmp_path: Path) -> None:
    run = _record(tmp_path / "run")
    seg = run / segment_name(0)
    data = seg.read_bytes()
    intact = load_runs([run]).events.to_pylist()
    groups = scan_stream(data, str(seg)).groups
    for g in groups[1:]:
        for offset in range(g.start, g.end, max(1, (g.end - g.start) // 12)):
            mutated = bytearray(data)
            mutated[offset] ^= 0x10
            seg.write_bytes(bytes(mutated))
            trace = load_runs([run])
            got = trace.events.to_pylist()
            assert trace.holes, f"flip at byte {offset} went unreported"
            # every event we still deliver is exactly the recorded one
            by_seq = {e["seq"]: e for e in intact}
            assert all(by_seq[e["seq"]] == e for e in got)
    seg.write_bytes(data)
    assert load_runs([run]).holes == []


def test_a_sigkill_while_recording_leaves_a_loadable_prefix(tmp_path: Path) -> None:
    run = tmp_path / "run"
    script = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {str(ROOT)!r})
        from benchmarks.recorder_cost import workload
        from kvclaims.recorder.buffer import EventBuffer
        from kvclaims.contract.trace_writer import RunWriter
        buf = EventBuffer(RunWriter({str(run)!r}, {{"run_id": "k"}}), "k",
                          flush_interval_s=0.01, batch_events=500)
        events = workload(20000)
        print("ready", flush=True)
        while True:
            for name, fields in events:
                buf.emit(name, **fields)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            seg = run / segment_name(0)
            if seg.exists() and seg.stat().st_size > 200_000:
                break
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    trace = load_runs([run])
    seqs = trace.events.column("seq").to_pylist()
    assert len(seqs) > 1000 and seqs == list(range(len(seqs)))  # a dense prefix from seq 0
    assert trace.incomplete_runs == {"k"}


# -- a disk that fills and then frees ----------------------------------------------------------

def _batch(first: int, n: int) -> object:
    seqs = list(range(first, first + n))
    return build_batch(seqs, seqs, ["block_allocated"] * n, "d",
                       {"block_id": [s % 1000 for s in seqs],
                        "request_id": [f"req-{s}" for s in seqs]})


class _Full:
    """Injected ENOSPC in the writer's one write call while ``full`` is set."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.full = False
        real = trace_writer._write_all

        def write_all(fd: int, data: bytes | bytearray) -> None:
            if self.full:
                os.write(fd, bytes(data[:len(data) // 2]))  # half a batch reaches the disk
                raise OSError(errno.ENOSPC, "No space left on device")
            real(fd, data)

        monkeypatch.setattr(trace_writer, "_write_all", write_all)


def _mount_tmpfs(where: Path, size: str) -> bool:
    where.mkdir()
    if os.geteuid() != 0:
        return False
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                         capture_output=True)
    return res.returncode == 0


def _fill_and_free_through_the_buffer(run: Path, fill: object, free: object) -> None:
    """Record through EventBuffer while the disk fills, then frees; close the run."""
    writer = RunWriter(run, {"run_id": "d"}, hash_scheme="vllm-raw")
    writer.BACKOFF_FIRST_S = 0.0  # type: ignore[misc]  # retry at once: the test has no time
    buf = EventBuffer(writer, "d", flush_interval_s=3600, batch_events=200)
    events = workload(6000)
    for i, (name, fields) in enumerate(events):
        buf.emit(name, **fields)
        if i % 200 == 199:
            buf.flush()
        if i == 1500:
            fill()  # type: ignore[operator]
        if i == 4000:
            free()  # type: ignore[operator]
    buf.close()
    assert buf.events_dropped > 0 and buf.recorder_errors > 0


def _assert_truthful_run(run: Path) -> None:
    trace = load_runs([run])
    manifest = trace.manifests["d"]
    assert manifest["complete"] is True and manifest["write_failures"] > 0
    assert manifest["recorder_errors"] > 0 and manifest["events_dropped"] > 0
    assert trace.holes == []  # nothing half-written stayed in the file
    ev = trace.events.to_pylist()
    gaps = [e for e in ev if e["event"] == "recorder_gap"]
    assert gaps and all(g["reason"] == "write_failed" for g in gaps)
    # every seq is accounted for: a row, or inside a recorder_gap's span
    covered = {e["seq"] for e in ev}
    for g in gaps:
        covered |= set(range(g["first_seq"], g["last_seq"] + 1))
    assert covered == set(range(ev[-1]["seq"] + 1))
    assert ev[-1]["event"] == "run_finished"
    assert ev[-1]["events_dropped"] == sum(g["events_dropped"] for g in gaps) \
        == manifest["events_dropped"]


def test_disk_full_then_freed_on_a_real_tmpfs(tmp_path: Path) -> None:
    mnt = tmp_path / "mnt"
    if not _mount_tmpfs(mnt, "640k"):
        pytest.skip("cannot mount a tmpfs here; the injected-ENOSPC twin covers this")
    try:
        filler = mnt / "filler"

        def fill() -> None:
            with open(filler, "wb") as fh:  # take every free byte
                try:
                    while True:
                        fh.write(b"\0" * 65536)
                        fh.flush()
                except OSError:
                    pass

        _fill_and_free_through_the_buffer(mnt / "run", fill, filler.unlink)
        _assert_truthful_run(mnt / "run")
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_disk_full_then_freed_with_injected_enospc(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    disk = _Full(monkeypatch)
    _fill_and_free_through_the_buffer(tmp_path / "run", lambda: setattr(disk, "full", True),
                                      lambda: setattr(disk, "full", False))
    _assert_truthful_run(tmp_path / "run")


def test_a_failed_write_rolls_back_and_is_raised(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    disk = _Full(monkeypatch)
    w = RunWriter(tmp_path / "run", {"run_id": "d"})
    w.write_batch(_batch(0, 10))  # type: ignore[arg-type]
    size = (tmp_path / "run" / segment_name(0)).stat().st_size
    disk.full = True
    with pytest.raises(WriteError):
        w.write_batch(_batch(10, 10))  # type: ignore[arg-type]
    assert (tmp_path / "run" / segment_name(0)).stat().st_size == size  # rolled back
    with pytest.raises(WriteError, match="backing off"):
        w.write_batch(_batch(10, 10))  # type: ignore[arg-type]  # no disk touched


def test_writes_resume_after_the_back_off(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    disk = _Full(monkeypatch)
    w = RunWriter(tmp_path / "run", {"run_id": "d"})
    w.write_batch(_batch(0, 10))  # type: ignore[arg-type]
    disk.full = True
    with pytest.raises(WriteError):
        w.write_batch(_batch(10, 10))  # type: ignore[arg-type]
    disk.full = False
    time.sleep(w.BACKOFF_FIRST_S + 0.01)
    w.write_batch(_batch(20, 10))  # type: ignore[arg-type]
    w.close()
    trace = load_runs([tmp_path / "run"])
    assert trace.events.column("seq").to_pylist() == list(range(10)) + list(range(20, 30))
    assert trace.manifests["d"]["write_failures"] == 1


def _summary(run: Path, out: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    from kvclaims.cli import main

    code = main(["reconstruct", str(run), "--out", str(out)])
    captured = capsys.readouterr()
    return code, captured.out.splitlines()[1], captured.err


def test_a_damaged_sealed_copy_is_reported_and_the_segments_give_the_same_audit(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import shutil

    run = tmp_path / "run"
    shutil.copytree(ROOT / "traces" / "multi_tenant", run,
                    ignore=shutil.ignore_patterns("reconstructed"))
    intact = _summary(run, tmp_path / "a", capsys)
    sealed = run / "events.parquet"
    data = bytearray(sealed.read_bytes())
    data[len(data) // 2: len(data) // 2 + 64] = b"\xff" * 64  # inside the column pages
    sealed.write_bytes(bytes(data))
    code, line, err = _summary(run, tmp_path / "b", capsys)
    assert "sealed copy unusable" in err and "reading the segments instead" in err
    assert (code, line) == intact[:2] and "truncated" not in line


def test_an_intact_sealed_copy_reads_without_a_warning(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import shutil

    run = tmp_path / "run"
    shutil.copytree(ROOT / "traces" / "multi_tenant", run,
                    ignore=shutil.ignore_patterns("reconstructed"))
    code, _line, err = _summary(run, tmp_path / "a", capsys)
    assert code == 0 and "sealed copy" not in err
