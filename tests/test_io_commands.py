"""The import / export / query subcommands, through the real CLI entry point."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvclaims.cli import main

REPO = Path(__file__).resolve().parents[1]

EVENTS = [
    {"run_id": "r1", "seq": 0, "ts_ns": 10, "event": "run_started", "model": "tiny",
     "block_size": 32, "usable_blocks": 80},
    {"run_id": "r1", "seq": 1, "ts_ns": 20, "event": "block_cached", "request_id": "a",
     "block_id": 1, "block_hash": 18446744073709551615, "position": 0},
    {"run_id": "r1", "seq": 2, "ts_ns": 30, "event": "block_cached", "request_id": "a",
     "block_id": 2, "block_hash": 5, "parent_hash": 18446744073709551615, "position": 1},
    {"run_id": "r1", "seq": 3, "ts_ns": 40, "event": "block_evicted", "block_id": 1,
     "block_hash": 18446744073709551615, "cause": "allocation", "by_request_id": "b"},
]


@pytest.fixture()
def jsonl(tmp_path: Path) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in EVENTS), encoding="utf-8")
    return path


@pytest.fixture()
def run_dir(tmp_path: Path, jsonl: Path) -> Path:
    assert main(["import", str(jsonl), "--out", str(tmp_path / "run")]) == 0
    return tmp_path / "run"


def test_import_writes_a_run_dir(run_dir: Path) -> None:
    assert (run_dir / "manifest.json").is_file()
    assert list(run_dir.glob("events-*.arrows"))


def test_export_to_a_file_round_trips(tmp_path: Path, jsonl: Path, run_dir: Path) -> None:
    out = tmp_path / "out.jsonl"
    assert main(["export", str(run_dir), "--format", "jsonl", "--out", str(out)]) == 0
    assert out.read_bytes() == jsonl.read_bytes()


def test_export_to_stdout(jsonl: Path, run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["export", str(run_dir), "--format", "jsonl"]) == 0
    assert capsys.readouterr().out == jsonl.read_text()


def test_export_requires_a_format(run_dir: Path) -> None:
    with pytest.raises(SystemExit):
        main(["export", str(run_dir)])


def test_query_group_by_event(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["query", str(run_dir), "--sql",
                 "SELECT event, count(*) AS n FROM events GROUP BY event ORDER BY event"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "result: 3 rows, 2 columns"   # the one-line summary comes first
    assert out[1].split() == ["event", "n"]
    assert [line.split() for line in out[3:6]] == [
        ["block_cached", "2"], ["block_evicted", "1"], ["run_started", "1"]]


def test_query_json_keeps_uint64(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["query", str(run_dir), "--json", "--sql",
                 "SELECT seq, block_hash FROM events WHERE event = 'block_evicted'"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"seq": 3, "block_hash": 2**64 - 1}]


def test_query_json_of_no_rows_is_an_empty_array(run_dir: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["query", str(run_dir), "--json", "--sql",
                 "SELECT * FROM events WHERE false"]) == 0
    assert json.loads(capsys.readouterr().out) == []


def test_query_over_several_runs(tmp_path: Path, jsonl: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    other = tmp_path / "other.jsonl"
    other.write_text(jsonl.read_text().replace('"r1"', '"r2"'))
    main(["import", str(jsonl), "--out", str(tmp_path / "sweep" / "a")])
    main(["import", str(other), "--out", str(tmp_path / "sweep" / "b")])
    capsys.readouterr()
    assert main(["query", str(tmp_path / "sweep"), "--json", "--sql",
                 "SELECT run_id, count(*) AS n FROM events GROUP BY run_id ORDER BY run_id"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"run_id": "r1", "n": 4},
                                                   {"run_id": "r2", "n": 4}]


def test_query_sees_manifests(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["query", str(run_dir), "--json", "--sql",
                 "SELECT run_id, complete, model FROM manifests"]) == 0
    assert json.loads(capsys.readouterr().out) == [
        {"run_id": "r1", "complete": True, "model": "tiny"}]


def test_sql_error_is_one_line_and_exit_2(run_dir: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["query", str(run_dir), "--sql", "SELECT nope FROM events"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvclaims query: error: SQL error:")
    assert "Traceback" not in err


def test_query_of_a_dir_without_manifest_names_the_file(tmp_path: Path, run_dir: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    (run_dir / "manifest.json").unlink()
    assert main(["query", str(run_dir), "--sql", "SELECT 1"]) == 2
    assert "manifest.json: missing manifest" in capsys.readouterr().err


def test_query_warns_about_a_truncated_segment(run_dir: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    seg = next(run_dir.glob("events-*.arrows"))
    seg.write_bytes(seg.read_bytes()[:-8])
    (run_dir / "events.parquet").unlink()  # the sealed copy would be read instead
    capsys.readouterr()
    # exit 3: a partial result (docs/guarantees.md)
    assert main(["query", str(run_dir), "--sql", "SELECT count(*) FROM events"]) == 3
    assert "warning:" in capsys.readouterr().err


def test_import_of_malformed_jsonl_names_line_and_field(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(EVENTS[0]) + "\n"
                   + '{"run_id": "r1", "seq": 1, "ts_ns": 2, "event": "block_freed", '
                     '"block_id": "x"}\n')
    assert main(["import", str(bad), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:2: field 'block_id'" in err
    assert not (tmp_path / "run").exists()


def test_import_of_a_missing_file_is_exit_2(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["import", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "run")]) == 2
    assert "no such file" in capsys.readouterr().err


@pytest.mark.skipif(importlib.util.find_spec("kvclaims.sources.arbiter_traces") is None,
                    reason="the arbiter importer is not part of this tree")
def test_import_from_arbiter_jsonl_refuses_our_own_format(
        jsonl: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # our vocabulary is not the prototype's: the converter must refuse it with a clean error
    assert main(["import", str(jsonl), "--out", str(tmp_path / "run"),
                 "--from", "arbiter-jsonl"]) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_console_script_runs_a_query(run_dir: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "kvclaims.cli", "query", str(run_dir), "--json", "--sql",
         "SELECT event, count(*) AS n FROM events GROUP BY event ORDER BY event"],
        capture_output=True, text=True, cwd=REPO, timeout=120, check=True)
    assert json.loads(proc.stdout)[0] == {"event": "block_cached", "n": 2}


ARBITER_FIXTURE = REPO / "tests" / "fixtures" / "arbiter" / "hard_6_7_8.jsonl"


@pytest.mark.skipif(importlib.util.find_spec("kvclaims.sources.arbiter_traces") is None
                    or not ARBITER_FIXTURE.is_file(),
                    reason="the arbiter importer or its fixture is not part of this tree")
def test_import_from_arbiter_jsonl_writes_a_queryable_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    assert main(["import", str(ARBITER_FIXTURE), "--out", str(out),
                 "--from", "arbiter-jsonl"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["source_format"] == "arbiter-jsonl"
    assert "import_summary" in manifest
    capsys.readouterr()
    assert main(["query", str(out), "--json", "--sql",
                 "SELECT event FROM events ORDER BY seq LIMIT 1"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"event": "run_started"}]
