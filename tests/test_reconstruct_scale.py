"""Bounded memory: a trace whose reconstruction needs more memory than DuckDB's memory_limit is
reconstructed out of core (spilling to temp_directory), in many small windows of the labelling
pass (state carried across them), and gives exactly the tables of an unconstrained in-memory
reconstruction. A dense trace is reconstructed under a hard cap in a child process: the
conformance evidence is bounded (docs/conformance.md), so the cap holds where a list of every
evidence seq did not fit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from kvclaims.audit import open_audit
from kvclaims.contract.vocabulary import TABLE_NAMES
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
    assert held > 48 * 2**20, "the trace must not fit in the memory limit tested"

    monkeypatch.setattr(labels, "WINDOW_ROWS", 50_000)   # ~20 windows: carried pass state
    monkeypatch.setattr(labels, "SLOT_FILL_INSTANCES", 7)   # the slot table built in pieces
    # NOTE: below MEMORY_LIMIT: the streamed passes' tables are files, not DuckDB's memory
    small = open_audit([run_dir], memory_limit="48MB", temp_directory=tmp_path / "spill",
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


def _held(audit: core.Tables) -> int:
    """Bytes DuckDB holds in memory or has spilled to temp_directory."""
    return audit.con.sql("SELECT sum(memory_usage_bytes + temporary_storage_bytes) "
                         "FROM duckdb_memory()").fetchall()[0][0]


def _temporary(audit: core.Tables, names: tuple[str, ...]) -> set[bool]:
    return {t for (t,) in audit.con.execute(
        "SELECT temporary FROM duckdb_tables() WHERE table_name IN "
        f"({', '.join('?' * len(names))})", list(names)).fetchall()}


COMPACTED = ("claims", "requests", "feasibility", "findings", "kv_claim_inst",
             "kv_claim_facts")
#: What the streamed passes write (reconstruct/sink.py): files, whatever the input's size
#: (``losses`` and ``loss_claims``: views of ``kv_losses`` and ``kv_loss_claims``).
PASS_FILES = ("losses", "loss_claims", "kv_losses", "kv_loss_claims", "kv_claim_ev",
              "kv_claim_binds", "kv_claim_subs", "kv_stage_events", "kv_admission_state")


def test_large_input_keeps_its_tables_in_the_database_file_not_in_memory_or_spill(
        run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    temp = open_audit([run_dir], memory_limit=MEMORY_LIMIT, temp_directory=tmp_path / "temp",
                      threads=1, reuse=False, lock=False, views=False)
    monkeypatch.setattr(core, "COMPACT_EVENTS", 1)   # this input counts as large
    compact = open_audit([run_dir], memory_limit=MEMORY_LIMIT,
                         temp_directory=tmp_path / "compact", threads=1, reuse=False,
                         lock=False, views=False)
    assert _temporary(compact, COMPACTED) == {False}
    # the point: written to the file, the same tables are neither held nor spilled by DuckDB
    assert _held(compact) < _held(temp) / 2
    for name in (*core.TABLE_NAMES, "conformance"):
        assert _rows(compact, name) == _rows(temp, name), name


def test_small_input_keeps_temp_tables(run_dir: Path, tmp_path: Path) -> None:
    audit = open_audit([run_dir], temp_directory=tmp_path / "spill", reuse=False, lock=False,
                       views=False)
    assert _temporary(audit, COMPACTED) == {True}


def _views(audit: core.Tables) -> dict[str, str]:
    return dict(audit.con.execute("SELECT view_name, sql FROM duckdb_views()").fetchall())


def test_the_streamed_passes_tables_are_parquet_files_of_the_audit_not_duckdb_tables(
        run_dir: Path, tmp_path: Path) -> None:
    audit = open_audit([run_dir], temp_directory=tmp_path / "spill", reuse=False, lock=False,
                       views=False)
    assert _temporary(audit, PASS_FILES) == set()   # no DuckDB table of these names
    views = _views(audit)
    files = sorted((tmp_path / "spill").rglob("*.parquet"))
    for name in PASS_FILES:
        if name not in ("losses", "loss_claims"):
            assert any(f.name == f"{name}.parquet" and str(f) in views[name] for f in files), name
    for name in ("losses", "loss_claims"):
        assert audit.con.execute(f"SELECT count(*) FROM {name}").fetchall()[0][0] > 0
    # (its twin: the SQL stages' tables are DuckDB tables, test_small_input_keeps_temp_tables)



# -- a hard cap, in a child process ---------------------------------------------------------------

#: The child: reconstruct RUN_DIR under MEMORY_LIMIT ("-": DuckDB's default) with one thread,
#: write every table to OUT/<table>.parquet, print its own peak RSS (bytes) as JSON.
#: NOTE: the peak is the child's VmHWM (its own address space's high-water mark): getrusage's
#: ru_maxrss survives fork and exec on Linux, so a child starts at the test process's peak, and
#: RUSAGE_CHILDREN is the largest child ever reaped (a vLLM engine of an earlier test).
CHILD = """
import json, re, sys
from pathlib import Path
from kvclaims.audit import open_audit
from kvclaims.contract.vocabulary import TABLE_NAMES
from kvclaims.reconstruct import labels

labels.WINDOW_ROWS = 50_000
run_dir, out, limit = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
audit = open_audit([run_dir], memory_limit=None if limit == "-" else limit,
                   temp_directory=out / "spill", threads=1, reuse=False, lock=False, views=False)
for name in TABLE_NAMES:
    audit.con.execute(f"COPY {name} TO '{out / name}.parquet' (FORMAT parquet)")
hwm = re.search(r"VmHWM:\\s+(\\d+) kB", Path("/proc/self/status").read_text())
print(json.dumps({"peak_rss": int(hwm.group(1)) * 1024}))
"""


@pytest.fixture(scope="module")
def dense_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """About 1 M dense events (every other request claims its whole prompt, every lifecycle
    end): ~200 k conformance evidence seqs, which as lists did not fit in MEMORY_LIMIT."""
    out = tmp_path_factory.mktemp("dense") / "run"
    synthetic.write_trace(out, 1_000_000, run_id="dense", progress=False,
                          shape=synthetic.SHAPES["dense"])
    return out


def _child(run_dir: Path, out: Path, limit: str) -> subprocess.CompletedProcess[str]:
    out.mkdir()
    return subprocess.run([sys.executable, "-c", CHILD, str(run_dir), str(out), limit],
                          capture_output=True, text=True, timeout=300, check=False)


def _peak_rss(child: subprocess.CompletedProcess[str]) -> int:
    return json.loads(child.stdout.splitlines()[-1])["peak_rss"]


def _table(out: Path, name: str) -> list[tuple]:
    return duckdb.sql(f"SELECT * FROM '{out / name}.parquet' ORDER BY ALL").fetchall()


def test_dense_trace_under_a_hard_cap_gives_the_unconstrained_tables(dense_dir: Path,
                                                                    tmp_path: Path) -> None:
    # NOTE: a child that compiles the passes (numba's cache cold after a change) peaks higher
    # than one that loads them: a first child fills the cache, the two measured load it
    warm = _child(dense_dir, tmp_path / "warm", MEMORY_LIMIT)
    assert warm.returncode == 0, warm.stderr[-3000:]
    small = _child(dense_dir, tmp_path / "small", MEMORY_LIMIT)
    assert small.returncode == 0, small.stderr[-3000:]
    ref = _child(dense_dir, tmp_path / "ref", "-")
    assert ref.returncode == 0, ref.stderr[-3000:]
    # the cap bounds the process: below the peak of the same reconstruction without it
    assert _peak_rss(small) < _peak_rss(ref)
    (largest,), = duckdb.sql("SELECT max(evidence_seq_count) FROM "
                             f"'{tmp_path / 'small'}/conformance.parquet'").fetchall()
    assert largest > 50_000, "the trace must hold a large evidence list"
    for name in TABLE_NAMES:
        assert _table(tmp_path / "small", name) == _table(tmp_path / "ref", name), name


def test_a_cap_too_small_for_the_trace_is_an_error_not_an_overrun(dense_dir: Path,
                                                                   tmp_path: Path) -> None:
    child = _child(dense_dir, tmp_path / "tiny", "16MB")
    assert child.returncode != 0
    assert "cannot reconstruct: Out of Memory Error" in child.stderr
