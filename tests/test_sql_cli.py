"""`kvclaims sql` and `kvclaims query`: SQL over the whole audit, read-only and locked down."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import kvclaims
from kvclaims.audit import SQLRefused, check_read_only
from kvclaims.cli import main

REPO = Path(__file__).resolve().parents[1]
DEMOTE = str(REPO / "traces" / "lifecycle_demote")
SWEEP = str(REPO / "traces" / "sweep-resident60_active70")


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


# -- lock-down ----------------------------------------------------------------------------------

REFUSED = {
    "copy_to": "COPY (SELECT 1) TO '{tmp}/out.csv'",
    "read_csv": "SELECT * FROM read_csv('/etc/passwd')",
    "attach": "ATTACH '{tmp}/other.duckdb'",
    "install": "INSTALL httpfs",
    "load": "LOAD httpfs",
    "set": "SET memory_limit = '100GB'",
    "pragma": "PRAGMA enable_profiling",
    "two_statements": "SELECT 1; SELECT 2",
    "create": "CREATE TABLE t AS SELECT 1",
    "read_parquet_in_select": "SELECT * FROM read_parquet('{tmp}/*.parquet')",
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_sql_refuses_with_one_line(name: str, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    sql = REFUSED[name].format(tmp=tmp_path)
    rc, out, err = _run(capsys, "sql", sql, DEMOTE, "--quiet")
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and "refused:" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []   # nothing written


def test_the_same_select_without_file_access_runs(capsys: pytest.CaptureFixture[str]) -> None:
    # negative twin of the refusals: a plain SELECT over the audit's own tables answers
    rc, out, _ = _run(capsys, "sql", "SELECT count(*) AS n FROM losses", DEMOTE, "--json")
    assert rc == 0 and json.loads(out)[0]["n"] > 0


def test_a_select_that_reads_files_is_refused_by_duckdb_itself() -> None:
    # check_read_only lets a SELECT through: the locked connection is the second lock
    check_read_only("SELECT * FROM read_csv('/etc/passwd')")
    with kvclaims.open([DEMOTE]) as audit, pytest.raises(SQLRefused):
        audit.sql("SELECT * FROM read_csv('/etc/passwd')").fetchall()


def test_settings_cannot_be_changed_after_open() -> None:
    with kvclaims.open([DEMOTE]) as audit:
        assert audit.locked
        with pytest.raises(Exception, match="locked"):
            audit.con.execute("SET enable_external_access = true")


def test_memory_limit_injection_is_refused_and_writes_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "pwned.csv"
    rc, _, err = _run(capsys, "query", "losses", DEMOTE, "--memory-limit",
                      f"1GB'; COPY (SELECT 1) TO '{target}'; --")
    assert rc == 2 and "--memory-limit" in err and "Traceback" not in err
    assert not target.exists()


def test_a_valid_memory_limit_is_applied(capsys: pytest.CaptureFixture[str]) -> None:
    with kvclaims.open([DEMOTE], memory_limit="300MB") as audit:
        got = audit.sql("SELECT current_setting('memory_limit')").fetchall()[0][0]
    assert got.startswith("286")   # 300 MB in MiB, as DuckDB prints it


# -- query / sql --------------------------------------------------------------------------------

def test_query_list_prints_every_view_with_its_description(
        capsys: pytest.CaptureFixture[str]) -> None:
    from kvclaims import queries

    rc, out, _ = _run(capsys, "query", "--list")
    assert rc == 0
    lines = out.splitlines()
    assert lines[0].startswith(f"{len(queries.VIEWS)} views")
    for view in queries.VIEWS:
        assert any(line.split()[:2] == ["view", view] and queries.description(view) in line
                   for line in lines), view


REQUIRED = ("losses", "loss_claims", "loss_labels_by_tenant", "claim_timeline",
            "claim_outcomes", "request_outcomes", "refusals_with_blockers", "feasibility",
            "feasibility_violations", "pool_occupancy", "capacity_sweep", "conformance",
            "tenant_explanations")


@pytest.mark.parametrize("name", REQUIRED)
def test_query_reaches_every_documented_name(name: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(capsys, "query", name, DEMOTE, "--json")
    assert rc == 0 and isinstance(json.loads(out), list)


def test_query_of_an_unknown_name_is_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = _run(capsys, "query", "no_such_view", DEMOTE)
    assert rc == 2 and "query --list" in err


def test_query_over_a_sweep_directory_sees_every_run(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(capsys, "query", "capacity_sweep", SWEEP, "--json")
    rows = json.loads(out)
    assert rc == 0 and len(rows) == 21
    refused = {(r["policy"], r["usable_blocks"]) for r in rows if r["active_outcome"] == "refused"}
    assert ("hard_protected", 80) in refused and ("native", 80) not in refused


def test_query_text_is_a_summary_then_aligned_rows(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(capsys, "query", "capacity_sweep", SWEEP)
    lines = out.splitlines()
    assert rc == 0 and lines[0].startswith("capacity_sweep: 21 rows")
    assert lines[2].startswith("---") and len({len(line) for line in lines[2:3]}) == 1
    usable = [int(line.split()[2]) for line in lines[3:] if line.split()[1] == "native"]
    assert usable == sorted(usable)      # numbers sort as numbers: 80 before 100


def test_text_output_hides_all_null_columns(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(capsys, "sql", "SELECT * FROM events WHERE event = 'run_started'", DEMOTE)
    assert rc == 0 and "all-NULL hidden" in out.splitlines()[0]
    assert "hook" not in out.splitlines()[1].split()


def test_json_output_keeps_all_null_columns(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(capsys, "sql", "SELECT * FROM events WHERE event = 'run_started'",
                      DEMOTE, "--json")
    assert rc == 0 and "hook" in json.loads(out)[0]


def test_json_of_no_rows_is_an_empty_array(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(capsys, "sql", "SELECT * FROM losses WHERE false", DEMOTE, "--json")
    assert rc == 0 and json.loads(out) == []


def test_csv_output_has_a_header(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(capsys, "query", "loss_labels", DEMOTE, "--format", "csv")
    assert rc == 0 and out.splitlines()[0] == "run_id,label,blocks_lost,first_seq,last_seq," \
                                              "from_reset"


def test_parquet_output_to_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "losses.parquet"
    rc, _, _ = _run(capsys, "query", "losses", DEMOTE, "--format", "parquet", "--out", str(out))
    assert rc == 0 and pq.read_table(out).num_rows > 0 and "ts" in pq.read_table(out).schema.names


def test_parquet_output_needs_a_file(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = _run(capsys, "query", "losses", DEMOTE, "--format", "parquet")
    assert rc == 2 and "--out" in err


def test_query_sql_still_works(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(capsys, "query", DEMOTE, "--json", "--sql",
                      "SELECT count(*) AS n FROM tenant_explanations")
    assert rc == 0 and json.loads(out) == [{"n": 1}]


def test_python_api_returns_polars_frames() -> None:
    import polars as pl

    with kvclaims.open([SWEEP]) as audit:
        frame = audit.sql("SELECT policy, count(*) AS runs FROM capacity_sweep "
                          "GROUP BY policy ORDER BY policy").pl()
    assert isinstance(frame, pl.DataFrame)
    assert frame.to_dicts() == [{"policy": "hard_protected", "runs": 7},
                                {"policy": "native", "runs": 7},
                                {"policy": "write_no_admit", "runs": 7}]


# -- export / progress --------------------------------------------------------------------------

def test_export_parquet_writes_every_event(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "events.parquet"
    rc, _, _ = _run(capsys, "export", DEMOTE, "--format", "parquet", "--out", str(out))
    with kvclaims.open([DEMOTE]) as audit:
        n = audit.sql("SELECT count(*) FROM events").fetchall()[0][0]
    assert rc == 0 and pq.read_table(out).num_rows == n


def test_export_parquet_to_stdout_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = _run(capsys, "export", DEMOTE, "--format", "parquet")
    assert rc == 2 and "--out" in err


def _cli(*argv: str, tty: bool) -> str:
    """Run the CLI in a child; return its stderr (through a pty when ``tty``)."""
    cmd = [sys.executable, "-m", "kvclaims.cli", *argv]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if not tty:
        return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env,
                              timeout=300).stderr
    leader, follower = pty.openpty()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=follower, cwd=REPO, env=env)
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 4096)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=300)
    os.close(leader)
    return b"".join(chunks).decode(errors="replace")


def test_reconstruct_progress_shows_on_a_terminal(tmp_path: Path) -> None:
    err = _cli("reconstruct", DEMOTE, "--out", str(tmp_path / "t"), tty=True)
    assert "read done" in err and "label done" in err and "tables done" in err


def test_reconstruct_progress_is_hidden_when_piped(tmp_path: Path) -> None:
    assert "done" not in _cli("reconstruct", DEMOTE, "--out", str(tmp_path / "t"), tty=False)


def test_quiet_hides_progress_on_a_terminal(tmp_path: Path) -> None:
    err = _cli("reconstruct", DEMOTE, "--out", str(tmp_path / "t"), "--quiet", tty=True)
    assert "done" not in err
