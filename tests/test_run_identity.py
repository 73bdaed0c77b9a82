"""Run identity: ``kvclaims record --run-id`` and a default no other recording shares; readers
given two runs with one id keep going, each told apart by its path, with a warning."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

import kvclaims
from kvclaims.reconstruct.loader import open_runs
from kvclaims.contract.schema import InputError
from kvclaims.sources.scenarios import check_run_id, default_run_id

REPO = Path(__file__).resolve().parents[1]
MULTI = REPO / "traces" / "multi_tenant"
RID = "multi_tenant-hard_protected-80"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvclaims.cli", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture()
def twins(tmp_path: Path) -> Path:
    """A folder holding two copies of one run (one run id, two paths)."""
    for name in ("first", "second"):
        shutil.copytree(MULTI, tmp_path / "runs" / name)
    return tmp_path / "runs"


def test_the_default_run_id_names_the_configuration_and_the_utc_time() -> None:
    t = datetime(2026, 12, 1, 16, 2, 3, 456789, tzinfo=timezone.utc)
    assert default_run_id("demo", "native", 80, t) == "demo-native-80-20261201T160203.456789Z"


def test_two_default_run_ids_differ() -> None:
    assert default_run_id("demo", "native", 80) != default_run_id("demo", "native", 80)


@pytest.mark.parametrize("bad", ["", "a/b", "a@b", " a", "a\nb", "x" * 201])
def test_a_bad_run_id_is_refused(bad: str) -> None:
    with pytest.raises(InputError, match="bad run id"):
        check_run_id(bad)


def test_a_plain_run_id_is_kept() -> None:
    assert check_run_id("demo-2026-12-01") == "demo-2026-12-01"


def test_record_refuses_a_bad_run_id_in_one_line_before_the_engine(tmp_path: Path) -> None:
    r = _cli("record", "--scenario", "multi_tenant", "--out", str(tmp_path / "x"),
             "--run-id", "a/b")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "bad run id" in r.stderr
    assert not (tmp_path / "x").exists()


def test_two_runs_with_one_id_are_both_opened_and_told_apart_by_path(twins: Path) -> None:
    runs = open_runs([twins])
    assert [r.run_id for r in runs] == [f"{RID}@{twins / 'first'}", f"{RID}@{twins / 'second'}"]
    assert all(r.recorded_run_id == RID and len(r.notes) == 1 for r in runs)
    assert "also the id of" in runs[0].notes[0] and str(twins / "second") in runs[0].notes[0]


def test_a_single_run_keeps_its_id_without_warning(tmp_path: Path) -> None:
    # negative twin
    shutil.copytree(MULTI, tmp_path / "only")
    [run] = open_runs([tmp_path])
    assert run.run_id == RID and run.recorded_run_id is None and not run.notes


def test_the_audit_of_twins_has_both_runs_and_every_event_of_each(twins: Path) -> None:
    with kvclaims.open([MULTI]) as one:
        n = one.sql("SELECT count(*) FROM events").fetchall()[0][0]
        claims = one.sql("SELECT count(*) FROM claims").fetchall()[0][0]
    with kvclaims.open([twins]) as a:
        counts = dict(a.sql("SELECT run_id, count(*) FROM events GROUP BY 1").fetchall())
        per_run = dict(a.sql("SELECT run_id, count(*) FROM claims GROUP BY 1").fetchall())
        assert len(a.truncations) == 2
    assert sorted(counts.values()) == [n, n] and sorted(per_run.values()) == [claims, claims]


def test_conformance_over_a_parent_folder_of_twins_keeps_going(twins: Path) -> None:
    r = _cli("conformance", str(twins), "--quiet", "--json")
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("warning:") == 2 and "also the id of" in r.stderr
    doc = json.loads(r.stdout)
    text = json.dumps(doc)
    assert f"{RID}@{twins / 'first'}" in text and f"{RID}@{twins / 'second'}" in text


def test_the_dashboard_data_of_twins_has_both_runs(twins: Path) -> None:
    from kvclaims.dashboard import data

    audit = data.load_audit([str(twins)])
    assert len(audit.run_ids) == 2 and len(audit.truncations) == 2
    assert set(audit.runs["run_dir"]) == {str(twins / "first"), str(twins / "second")}


# -- on the real engine -------------------------------------------------------------------------

@pytest.mark.vllm
def test_record_names_the_run_by_run_id(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    r = _cli("record", "--scenario", "resident60_active70", "--usable-blocks", "80",
             "--out", str(out), "--run-id", "ticket-4711", "--json", "--quiet")
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((out / "manifest.json").read_text())["run_id"] == "ticket-4711"
    assert json.loads(r.stdout)["run_id"] == "ticket-4711"


@pytest.mark.vllm
def test_a_default_run_id_does_not_collide_with_the_shipped_sweep_point(record_run) -> None:
    run, view = record_run("resident60_active70", "native", 80)
    rid = json.loads((run / "manifest.json").read_text())["run_id"]
    assert rid.startswith("resident60_active70-native-80-") and rid.endswith("Z")
    shipped = REPO / "traces" / "sweep-resident60_active70" / "resident60_active70-native-80"
    with kvclaims.open([run, shipped]) as a:   # two runs, told apart by their ids
        assert sorted(a.runs) == sorted([rid, "resident60_active70-native-80"])
        assert not a.truncations
