"""kvclaims.open: the one audit facade (streamed, bounded memory, reused tables, UTC, globs)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import polars as pl
import pytest

import kvclaims
from kvclaims.contract.schema import InputError

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO / "traces"
CHILD = textwrap.dedent("""
    import json, resource, sys
    limit = int(sys.argv[2]) * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    import kvclaims
    with kvclaims.open([sys.argv[1]], memory_limit="128MB", threads=1) as audit:
        rows = audit.sql("SELECT label, count(*) FROM losses GROUP BY label ORDER BY label")
        print("COUNTS", json.dumps(dict(rows.fetchall())))
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024, "MiB")
""")


@pytest.fixture(scope="module")
def big_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """About 400 k synthetic events: claims harmed and released, resets."""
    from kvclaims.sources import synthetic

    out = tmp_path_factory.mktemp("facade") / "run"
    synthetic.write_trace(out, 400_000, 8, 2048, reset_every=997, run_id="facade-scale",
                          progress=False)
    return out


def _child(run: Path, limit_mib: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", CHILD, str(run), str(limit_mib)],
                          capture_output=True, text=True, cwd=REPO, timeout=600)


def test_facade_reconstructs_within_an_address_space_limit(big_run: Path) -> None:
    # NOTE: RLIMIT_AS bounds virtual address space, not RSS: numba's LLVM JIT (the labelling
    # pass) reserves about a GiB of it on top of Python + DuckDB; peak RSS stays far lower
    proc = _child(big_run, 3072)
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("COUNTS "))
    counts = json.loads(line[len("COUNTS "):])
    assert counts.keys() >= {"harm", "relaxation", "eviction"}


def test_the_address_space_limit_is_real(big_run: Path) -> None:
    # negative twin: far below what Python + DuckDB need, the same child cannot finish
    proc = _child(big_run, 600)
    assert proc.returncode != 0


def test_open_returns_polars_frames_for_tables_and_views() -> None:
    with kvclaims.open([TRACES / "multi_tenant"]) as audit:
        losses = audit.table("losses").pl()
        outcomes = audit.view("claim_outcomes").pl()
        assert isinstance(losses, pl.DataFrame) and losses.height > 0
        assert set(outcomes["tenant"]) >= {"tenant-a", "tenant-d"}
        assert audit.runs == ["multi_tenant-hard_protected-80"]
        assert audit.manifests[audit.runs[0]]["policy"] == "hard_protected"


def test_open_unknown_table_is_a_clear_error() -> None:
    with kvclaims.open([TRACES / "multi_tenant"]) as audit, pytest.raises(InputError):
        audit.table("nope")


def test_open_expands_globs(tmp_path: Path) -> None:
    with kvclaims.open([str(TRACES / "lifecycle_*")]) as audit:
        assert len(audit.runs) == 2


def test_a_glob_matching_nothing_is_an_error() -> None:
    with pytest.raises(InputError, match="no file or directory matches"):
        kvclaims.open([str(TRACES / "nothing_*")])


def test_open_reads_jsonl_fixtures() -> None:
    with kvclaims.open([REPO / "tests" / "fixtures" / "released.jsonl"]) as audit:
        assert audit.sql("SELECT count(*) FROM claims").fetchall()[0][0] >= 1


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_up_to_date_reconstructed_tables_are_reused(tmp_path: Path) -> None:
    run = _copy(TRACES / "lifecycle_demote", tmp_path / "run")
    with kvclaims.open([run], reuse=False) as first:
        first.write_reconstructed()
        want = first.sql("SELECT * FROM losses ORDER BY ALL").fetchall()
    with kvclaims.open([run]) as again:
        assert again.reused
        assert again.sql("SELECT * FROM losses ORDER BY ALL").fetchall() == want


def test_a_changed_run_is_reconstructed_again(tmp_path: Path) -> None:
    run = _copy(TRACES / "lifecycle_demote", tmp_path / "run")
    with kvclaims.open([run], reuse=False) as first:
        first.write_reconstructed()
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["note"] = "edited"
    (run / "manifest.json").write_text(json.dumps(manifest))
    with kvclaims.open([run]) as again:
        assert not again.reused


def _with_clock(src: Path, dst: Path) -> Path:
    run = _copy(src, dst)
    manifest = json.loads((run / "manifest.json").read_text())
    import pyarrow as pa

    from kvclaims.reconstruct.loader import load_runs

    first_ts = pa.compute.min(load_runs([run]).events.column("ts_ns")).as_py()
    # the recorder's anchor (docs/trace-format.md): utc and utc_ns read with monotonic_ns
    manifest["clock"] = {"utc": "2026-11-30T10:42:07.123000000Z",
                         "utc_ns": 1_796_035_327_123_000_000, "monotonic_ns": first_ts,
                         "host": "gpu-node-7"}
    (run / "manifest.json").write_text(json.dumps(manifest))
    return run


def test_ts_is_utc_from_the_manifest_anchor(tmp_path: Path) -> None:
    run = _with_clock(TRACES / "lifecycle_demote", tmp_path / "run")
    with kvclaims.open([run]) as audit:
        first = audit.sql("SELECT ts FROM events ORDER BY seq LIMIT 1").fetchall()[0][0]
        assert first.isoformat() == "2026-11-30T10:42:07.123000"
        assert audit.sql("SELECT count(*) FROM losses WHERE ts IS NULL").fetchall()[0][0] == 0


def test_clock_anchor_reads_the_iso_time_when_utc_ns_is_absent() -> None:
    from kvclaims.contract.clock import clock_anchor

    got = clock_anchor({"clock": {"utc": "2026-11-30T10:42:07.123456789Z", "monotonic_ns": 5}})
    assert got is not None and got.ts_ns == 5 and got.utc.microsecond == 123456


def test_a_manifest_without_clock_has_no_anchor() -> None:
    from kvclaims.contract.clock import clock_anchor

    assert clock_anchor({"run_id": "r"}) is None
    assert clock_anchor({"clock": None}) is None     # importers write null


def test_ts_is_null_without_a_clock(tmp_path: Path) -> None:
    run = _copy(TRACES / "lifecycle_demote", tmp_path / "run")
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["clock"] = None  # as an import without a clock writes it
    (run / "manifest.json").write_text(json.dumps(manifest))
    with kvclaims.open([run]) as audit:
        assert audit.sql("SELECT count(ts) FROM events").fetchall()[0][0] == 0
        assert audit.clocks == {audit.runs[0]: None}
