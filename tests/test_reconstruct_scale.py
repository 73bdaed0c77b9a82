"""Bounded memory: a trace whose reconstruction needs more memory than DuckDB's memory_limit is
reconstructed out of core (spilling to temp_directory), in many small windows of the labelling
pass (state carried across them), and gives exactly the tables of an unconstrained in-memory
reconstruction."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvclaims.audit import open_audit
from kvclaims.reconstruct import core, labels, loader
from kvclaims.sources import synthetic

MEMORY_LIMIT = "64MB"


def _rows(tables: core.Tables, name: str) -> list[tuple]:
    # NOTE: compare contents; the row order of large tables read back is DuckDB's scan order
    return tables.con.sql(f"SELECT * FROM {name} ORDER BY ALL").fetchall()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """About 1 M events: claims harmed and released, and a cache_reset every 997 requests."""
    out = tmp_path_factory.mktemp("scale") / "run"
    synthetic.write_trace(out, 1_000_000, 8, 2048, reset_every=997, run_id="scale",
                          progress=False)
    return out


def test_small_memory_limit_and_windows_equal_in_memory(run_dir: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    ref = core.reconstruct(loader.load_runs([run_dir]))
    held = ref.con.sql("SELECT sum(memory_usage_bytes) FROM duckdb_memory()").fetchall()[0][0]
    assert held > 64 * 2**20, "the trace must not fit in the memory limit tested"

    monkeypatch.setattr(labels, "WINDOW_ROWS", 50_000)   # ~20 windows: carried pass state
    monkeypatch.setattr(labels, "SLOT_FILL_INSTANCES", 7)   # the slot table built in pieces
    small = open_audit([run_dir], memory_limit=MEMORY_LIMIT, temp_directory=tmp_path / "spill",
                       threads=1, reuse=False, lock=False, views=False)
    spilled = small.con.sql(
        "SELECT sum(temporary_storage_bytes) FROM duckdb_memory()").fetchall()[0][0]
    assert spilled > 0, "DuckDB should have spilled to temp_directory"
    assert small.run_dirs == {"scale": run_dir}

    counts = dict(small.con.sql("SELECT label, count(*) FROM losses GROUP BY label").fetchall())
    assert counts.keys() >= {"harm", "relaxation", "eviction"}
    assert small.con.sql("SELECT count(*) FROM losses WHERE synthetic").fetchall()[0][0] > 0
    for name in (*core.TABLE_NAMES, "conformance"):
        assert _rows(small, name) == _rows(ref, name), name
