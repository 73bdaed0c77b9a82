"""Hostile input, round two (issue 26): sealed-file integrity, the listener, readers that
cannot hang, and the small bounds (sql timeout and result size, atomic --out, temporary
folders, typed manifest values).

Each test drives the real parts (Arrow IPC segments, Parquet files, DuckDB, ZeroMQ sockets,
the CLI door) with one hostile input and checks the contract of docs/guarantees.md: one line
and an exit status, never a traceback, a hang, or a silently different answer.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from kvclaims.cli import main
from kvclaims.reconstruct import core, loader
from kvclaims.recorder.trace_writer import SEALED_NAME, seal_segments

ROOT = Path(__file__).resolve().parents[1]
EVICTED_SQL = "SELECT count(*) FROM events WHERE event = 'block_evicted'"
# KVCLAIMS_HOSTILE_EVERY_BYTE=1: every footer byte through the whole read (minutes); by
# default every byte is checked against the checksum and every 61st byte read end to end.
EVERY_BYTE = os.environ.get("KVCLAIMS_HOSTILE_EVERY_BYTE") == "1"


class Hang(BaseException):
    """A command ran past its bound."""


@contextlib.contextmanager
def bounded(seconds: float) -> Iterator[None]:
    def alarm(_sig: int, _frame: Any) -> None:
        raise Hang(f"ran longer than {seconds} s")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def run_cli(args: list[str], seconds: float = 600.0) -> tuple[int, str, str]:
    """``kvclaims.cli.main`` in-process: (status, stdout, stderr), bounded in time."""
    out, err = io.StringIO(), io.StringIO()
    with bounded(seconds), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(args)
    return rc, out.getvalue(), err.getvalue()


# -- sealed files ---------------------------------------------------------------------------

def sealed_run(dest: Path, *, checksum: bool = True) -> Path:
    """A copy of the shipped multi-tenant run, sealed again by this recorder (with the
    content checksum), or with the checksum removed (a run sealed by an older recorder)."""
    shutil.copytree(ROOT / "traces" / "multi_tenant", dest,
                    ignore=shutil.ignore_patterns("reconstructed"))
    (dest / SEALED_NAME).unlink()
    manifest = json.loads((dest / "manifest.json").read_text())
    entry = seal_segments(dest, [s["file"] for s in manifest["segments"]])
    if not checksum:
        entry.pop("sha256")
    manifest["sealed"] = entry
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return dest


def footer_span(path: Path) -> tuple[int, int]:
    """``(start, end)`` byte offsets of a Parquet file's footer (metadata, length, magic)."""
    data = path.read_bytes()
    n = struct.unpack("<I", data[-8:-4])[0]
    return len(data) - 8 - n, len(data)


def rename_min_statistic(path: Path) -> None:
    """The issue's flip: the ``event`` column's min statistic ``block_allocated`` becomes
    ``dlock_allocated`` in the footer, so a reader pruning by statistics skips row groups."""
    data = bytearray(path.read_bytes())
    start, _end = footer_span(path)
    at = data.index(b"block_allocated", start)
    data[at] = ord("d")
    path.write_bytes(bytes(data))


def sql_count(run: Path, sql: str = EVICTED_SQL) -> tuple[int, str, str]:
    return run_cli(["sql", sql, str(run), "--format", "csv"])


def test_a_sealed_footer_statistic_changed_falls_back_to_the_segments(tmp_path: Path) -> None:
    run = sealed_run(tmp_path / "run")
    rc0, intact, _ = sql_count(run)
    assert rc0 == 0 and int(intact.splitlines()[1]) > 0
    rename_min_statistic(run / SEALED_NAME)
    rc, got, err = sql_count(run)
    assert (rc, got) == (0, intact)
    assert "content checksum differs" in err and "reading the segments instead" in err


def test_an_intact_sealed_file_is_scanned_in_place_without_a_warning(tmp_path: Path) -> None:
    """Negative twin: the checksum does not refuse a file nobody changed."""
    run = sealed_run(tmp_path / "run")
    info = core.StreamedInput({}, {}, [], set())
    files, _n = core.stage_events(loader.open_runs([run]), info, tmp_path / "stage")
    assert list(files.values()) == [run / SEALED_NAME] and info.truncations == []


def test_a_run_sealed_without_a_checksum_is_never_scanned_by_its_statistics(
        tmp_path: Path) -> None:
    """An older recorder's sealed file: its events are read (pyarrow does not consult
    statistics) and copied, so DuckDB never prunes by a footer nobody can vouch for."""
    run = sealed_run(tmp_path / "run", checksum=False)
    rc0, intact, _ = sql_count(run)
    rename_min_statistic(run / SEALED_NAME)
    info = core.StreamedInput({}, {}, [], set())
    files, _n = core.stage_events(loader.open_runs([run]), info, tmp_path / "stage")
    assert list(files.values()) != [run / SEALED_NAME]
    rc, got, _err = sql_count(run)
    assert rc0 == rc == 0 and got == intact


def test_duckdb_prunes_by_a_changed_statistic_when_it_scans_the_file_itself(
        tmp_path: Path) -> None:
    """Why the checksum is needed: the same flip read by DuckDB directly loses rows."""
    import duckdb

    run = sealed_run(tmp_path / "run")
    path = str(run / SEALED_NAME)
    q = f"SELECT count(*) FROM read_parquet('{path}') WHERE event = 'block_allocated'"
    before = duckdb.sql(q).fetchall()[0][0]
    rename_min_statistic(run / SEALED_NAME)
    assert before > 0 and duckdb.sql(q).fetchall()[0][0] != before


def test_every_footer_byte_of_a_sealed_file_is_caught_by_its_checksum(tmp_path: Path) -> None:
    run = sealed_run(tmp_path / "run")
    path = run / SEALED_NAME
    entry = json.loads((run / "manifest.json").read_text())["sealed"]
    original = path.read_bytes()
    start, end = footer_span(path)
    assert end - start > 1000
    fd = os.open(path, os.O_WRONLY)
    try:
        for i in range(start, end):
            os.pwrite(fd, bytes([original[i] ^ 0xFF]), i)
            with pytest.raises(loader.TraceError, match="checksum"):
                loader.verify_sealed(path, entry)
            os.pwrite(fd, original[i:i + 1], i)
    finally:
        os.close(fd)
    assert path.read_bytes() == original
    loader.verify_sealed(path, entry)  # the twin: the intact file passes


def test_no_footer_byte_of_a_sealed_file_changes_the_events_read(tmp_path: Path) -> None:
    """Every footer byte flipped (``KVCLAIMS_HOSTILE_EVERY_BYTE=1``; by default every 61st):
    the events staged for DuckDB are the segments' own, never the damaged file."""
    run = sealed_run(tmp_path / "run")
    path = run / SEALED_NAME
    original = path.read_bytes()
    want = loader.load_runs([run], sealed=False).events
    start, end = footer_span(path)
    step = 1 if EVERY_BYTE else 61
    for n, i in enumerate(range(start, end, step)):
        data = bytearray(original)
        data[i] ^= 0xFF
        path.write_bytes(bytes(data))
        info = core.StreamedInput({}, {}, [], set())
        stage = tmp_path / f"stage-{n}"
        files, total = core.stage_events(loader.open_runs([run]), info, stage)
        (staged,) = files.values()
        assert staged != path, f"footer byte {i}: the damaged file would be scanned"
        assert pq.read_table(staged).equals(want), f"footer byte {i}: events changed"
        assert any("sealed copy unusable" in t for t in info.truncations)
        assert not info.truncated_runs
        shutil.rmtree(stage)
