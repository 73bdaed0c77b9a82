"""The fleet audit on Spark (local mode) gives the same tables, views and explanations as one
machine.

Spark starts once per module (a JVM); the fleet is a handful of shipped runs, a generated run,
a run split into many segments and a run with a hole. Each task runs the single-machine audit
over its run(s) and writes every table; Spark SQL runs only the fleet views
(kvclaims/fleet.py, queries/fleet/). The dataset is read back through ``kvclaims.open``, the
same Audit as run directories give.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

pytest.importorskip("pyspark")

import kvclaims  # noqa: E402
from kvclaims.contract.schema import InputError  # noqa: E402
from kvclaims.contract.trace_writer import RunWriter  # noqa: E402
from kvclaims import fleet  # noqa: E402
from kvclaims.audit import open_audit  # noqa: E402
from kvclaims import queries  # noqa: E402
from kvclaims.sources.jsonl import import_jsonl  # noqa: E402
from kvclaims.reconstruct.loader import load_runs  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures"
SHIPPED = [ROOT / "traces" / "multi_tenant", ROOT / "traces" / "lifecycle_expire",
           ROOT / "traces" / "sweep-resident60_active70" / "resident60_active70-native-80",
           ROOT / "traces" / "sweep-resident60_active70" / "resident60_active70-hard_protected-80"]


def _split_into_segments(src: Path, dst: Path, rows_per_segment: int = 40) -> Path:
    """Re-write a run directory so that its events span many small segments."""
    trace = load_runs([src])
    info = dict(trace.manifests[next(iter(trace.manifests))])
    info["run_id"] = info["run_id"] + "-split"
    events = trace.events.set_column(
        trace.events.schema.get_field_index("run_id"), "run_id",
        pa.array([info["run_id"]] * trace.events.num_rows))
    with RunWriter(dst, {k: v for k, v in info.items()
                         if k in ("run_id", "runtime", "runtime_version", "model", "block_size",
                                  "num_blocks", "usable_blocks", "policy")},
                   rotate_bytes=1) as writer:
        for batch in events.to_batches(max_chunksize=rows_per_segment):
            writer.write_batch(_to_writer_schema(batch))
    return dst


def _to_writer_schema(batch: pa.RecordBatch) -> pa.RecordBatch:
    from kvclaims.contract.schema import ARROW_SCHEMA

    cols = []
    for field in ARROW_SCHEMA:
        i = batch.schema.get_field_index(field.name)
        col = batch.column(i) if i >= 0 else pa.nulls(batch.num_rows, field.type)
        cols.append(col.cast(field.type) if col.type != field.type else col)
    return pa.RecordBatch.from_arrays(cols, schema=ARROW_SCHEMA)


@pytest.fixture(scope="module")
def fleet_dirs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """The fleet: shipped runs, one of them split into many segments, and a run with a gap."""
    base = tmp_path_factory.mktemp("fleet")
    runs = []
    for src in SHIPPED:
        dst = base / src.name
        shutil.copytree(src, dst, ignore=shutil.ignore_patterns("reconstructed"))
        runs.append(dst)
    runs.append(_split_into_segments(SHIPPED[0], base / "split"))
    runs += import_jsonl(FIX / "gap.jsonl", base / "gap")
    from kvclaims.sources.synthetic import write_trace

    # a generated, claim-dense run with pool pressure (the fleet benchmark's generator)
    write_trace(base / "generated", 3000, n=4, pool=256, reset_every=50, run_id="generated",
                progress=False)
    runs.append(base / "generated")
    return runs


@pytest.fixture(scope="module")
def spark() -> Any:
    session = fleet.spark_session("local[2]")
    yield session
    session.stop()


@pytest.fixture(scope="module")
def dataset_result(spark: Any, fleet_dirs: list[Path],
                   tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The fleet reconstructed once, through the CLI (``--json``), on the module's session.

    NOTE: once per module: each reconstruction costs tens of seconds of Spark jobs, whatever
    the fleet's size; the CLI finds the session the ``spark`` fixture started.
    """
    import contextlib
    import io
    import json

    from kvclaims.cli import main

    out = tmp_path_factory.mktemp("dataset") / "fleet"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        # NOTE: --pack-events 2000: the generated run (3000 events) is a task of its own,
        # the small runs share tasks
        code = main(["reconstruct", "--engine", "spark", *map(str, fleet_dirs),
                     "--out", str(out), "--json", "--pack-events", "2000"])
    assert code == 0
    return json.loads(printed.getvalue())


@pytest.fixture(scope="module")
def dataset(dataset_result: dict[str, Any]) -> Path:
    return Path(dataset_result["dataset"])


@pytest.fixture(scope="module")
def single_views(fleet_dirs: list[Path]) -> Any:
    """The same runs through ``kvclaims.open`` as a user opens them (locked, the views)."""
    with kvclaims.open(fleet_dirs, reuse=False) as audit:
        yield audit


@pytest.fixture(scope="module")
def single(fleet_dirs: list[Path]) -> Any:
    """The same runs through the single-machine audit facade, all at once."""
    audit = open_audit(fleet_dirs, reuse=False, lock=False)
    yield audit
    audit.close()


def _rows(relation: Any) -> list[tuple]:
    """A relation's rows with columns in name order, sorted (NULLs first), for comparison."""
    names = sorted(relation.columns)
    cols = ", ".join(f'"{n}"' for n in names)
    return relation.query("r", f"SELECT {cols} FROM r ORDER BY ALL NULLS FIRST").fetchall()


@pytest.fixture(scope="module")
def opened(dataset: Path) -> Any:
    """The dataset through the one facade, ``kvclaims.open``, as a user opens it."""
    with kvclaims.open(dataset) as audit:
        yield audit


def _partitions(dataset: Path, table: str) -> set[str]:
    return {p.name.removeprefix("run_id=") for p in (dataset / table).glob("date=*/run_id=*")}


def test_a_run_with_rows_of_a_table_has_its_partition(dataset: Path, single: Any) -> None:
    for table in fleet.TABLES_OUT:
        with_rows = {r[0] for r in single.con.execute(
            f"SELECT DISTINCT run_id FROM {table}").fetchall()}
        assert with_rows and with_rows <= _partitions(dataset, table), table


def test_a_run_without_rows_of_a_table_has_no_file_there(fleet_dirs: list[Path],
                                                         tmp_path: Path) -> None:
    # multi_tenant has no findings, lifecycle_expire has: one task over both
    runs = fleet.find_fleet_runs(fleet_dirs[:2])
    written = fleet.audit_runs(runs, tmp_path / "out")
    without = [r.run_id for r in runs if not written[r.run_id]["findings"]]
    assert without == ["multi_tenant-hard_protected-80"]
    assert _partitions(tmp_path / "out", "findings") == {
        r.run_id for r in runs if r.run_id not in without}
    assert _partitions(tmp_path / "out", "losses") == {r.run_id for r in runs}


def test_a_table_without_rows_keeps_its_schema_in_one_empty_file(fleet_dirs: list[Path],
                                                                 tmp_path: Path) -> None:
    run = fleet.find_fleet_runs([fleet_dirs[0]])[0]   # multi_tenant: no findings
    fleet.audit_runs([run], tmp_path / "out")
    (file,) = (tmp_path / "out" / "findings").glob("date=*/run_id=*/*.parquet")
    with kvclaims.open(tmp_path / "out") as audit:
        assert audit.sql("SELECT count(*) FROM findings").fetchall() == [(0,)]
        assert {"run_id", "kind", "severity"} <= set(audit.table("findings").columns)


def test_dataset_holds_every_table_of_the_audit(dataset: Path, single: Any) -> None:
    assert set(fleet.TABLES_OUT) <= set(fleet.dataset_tables(dataset)) == set(single.tables)


# NOTE: list columns whose order the stage SQL leaves undefined (a list() without ORDER BY,
# concatenated): compared as sorted lists. Everything else is compared as it is.
UNORDERED_LISTS: dict[str, tuple[str, ...]] = {"conformance": ("evidence_seqs",)}


def _table(con: Any, table: str) -> Any:
    cols = ", ".join(f'list_sort("{c}") AS "{c}"' for c in UNORDERED_LISTS.get(table, ()))
    return con.sql(f"SELECT * REPLACE ({cols}) FROM {table}" if cols else f"SELECT * FROM {table}")


@pytest.mark.parametrize("table", fleet.TABLES_OUT + ("lowering",))
def test_spark_tables_equal_single_machine_tables(opened: Any, single: Any,
                                                  table: str) -> None:
    assert _rows(_table(opened.con, table)) == _rows(_table(single.con, table))


@pytest.mark.parametrize("view", queries.VIEWS)
def test_documented_view_over_the_dataset_equals_the_run_directories(opened: Any,
                                                                     single_views: Any,
                                                                     view: str) -> None:
    assert _rows(opened.view(view)) == _rows(single_views.view(view))


def test_view_comparison_sees_one_run_left_out(dataset: Path, single_views: Any) -> None:
    with kvclaims.open(dataset, runs=["gap"]) as audit:
        assert _rows(audit.view("claim_outcomes")) != _rows(single_views.view("claim_outcomes"))


def test_dataset_opens_as_the_same_audit_type(opened: Any, single: Any) -> None:
    assert type(opened) is type(single) and opened.dataset is not None
    assert opened.tables == single.tables and opened.runs == single.runs


def test_dataset_audit_says_in_one_line_what_needs_run_directories(opened: Any) -> None:
    for call in (opened.summary, opened.write_reconstructed):
        with pytest.raises(InputError, match="not for a fleet dataset") as err:
            call()
        assert "\n" not in str(err.value)


def test_dataset_audit_is_locked_down_like_any_audit(opened: Any) -> None:
    with pytest.raises(kvclaims.SQLRefused):
        opened.sql("SELECT * FROM read_csv('/etc/passwd')").fetchall()


def test_a_folder_neither_run_nor_dataset_is_a_one_line_error(tmp_path: Path,
                                                             capsys: Any) -> None:
    from kvclaims.cli import main

    (tmp_path / "events").mkdir()           # half a dataset: no manifests/ table
    with pytest.raises(InputError, match="not a run directory") as err:
        kvclaims.open(tmp_path)
    assert "\n" not in str(err.value)
    assert main(["query", "losses", str(tmp_path)]) == 2
    err_text = capsys.readouterr().err
    assert err_text.count("\n") == 1 and "Traceback" not in err_text


def test_a_dataset_opened_by_a_relative_path_reads_after_a_chdir(dataset: Path, tmp_path: Path,
                                                                 monkeypatch: Any) -> None:
    monkeypatch.chdir(dataset.parent)
    with kvclaims.open(dataset.name) as audit:
        monkeypatch.chdir(tmp_path)
        assert audit.sql("SELECT count(*) FROM events").fetchall()[0][0] > 0


def test_a_dataset_path_with_glob_characters_is_a_one_line_error(dataset: Path,
                                                                  tmp_path: Path) -> None:
    odd = shutil.copytree(dataset, tmp_path / "fleet[1]")
    with pytest.raises(InputError, match="cannot hold any of") as err:
        kvclaims.open(odd)
    assert "\n" not in str(err.value)


def test_a_dataset_is_not_opened_together_with_run_directories(dataset: Path,
                                                               fleet_dirs: list[Path]) -> None:
    with pytest.raises(InputError, match="opened alone"):
        kvclaims.open([dataset, fleet_dirs[0]])


def test_cli_query_reads_a_dataset_like_run_directories(dataset: Path, fleet_dirs: list[Path],
                                                        capsys: Any) -> None:
    from kvclaims.cli import main

    assert main(["query", "claim_outcomes", *map(str, fleet_dirs), "--format", "csv"]) == 0
    from_dirs = capsys.readouterr().out
    assert main(["query", "claim_outcomes", str(dataset), "--format", "csv"]) == 0
    assert sorted(capsys.readouterr().out.splitlines()) == sorted(from_dirs.splitlines())


def test_table_comparison_sees_one_changed_label(opened: Any) -> None:
    con = opened.con
    changed = con.sql("SELECT * REPLACE (CASE WHEN seq = (SELECT min(seq) FROM losses) "
                      "THEN label || '-changed' ELSE label END AS label) FROM losses")
    assert _rows(changed) != _rows(con.sql("SELECT * FROM losses"))


def test_split_run_labels_equal_its_unsplit_twin(opened: Any) -> None:
    con = opened.con
    whole, split = (con.sql(f"""
        SELECT seq, block_id, label FROM losses WHERE run_id = '{rid}' ORDER BY seq, block_id
        """).fetchall() for rid in ("multi_tenant-hard_protected-80",
                                    "multi_tenant-hard_protected-80-split"))
    assert whole and whole == split


def test_run_with_a_gap_keeps_its_unknown_labels(opened: Any) -> None:
    con = opened.con
    labels = {r[0] for r in con.sql(
        "SELECT label FROM losses WHERE run_id = 'gap'").fetchall()}
    assert "unknown" in labels


def test_dataset_reads_the_same_in_polars(dataset: Path, opened: Any) -> None:
    import polars as pl

    frame = pl.scan_parquet(str(dataset / "losses" / "**" / "*.parquet"),
                            hive_partitioning=True).collect()
    con = opened.con
    assert frame.height == con.sql("SELECT count(*) FROM losses").fetchall()[0][0] > 0
    assert set(frame["run_id"].unique()) == {r[0] for r in con.sql(
        "SELECT DISTINCT run_id FROM losses").fetchall()}


def _spark_view(spark: Any, view: str) -> list[tuple]:
    import duckdb

    tmp = duckdb.connect()
    tmp.register("spark_rows", spark.sql(f"SELECT * FROM {view}").toArrow())
    return _rows(tmp.sql("SELECT * FROM spark_rows"))


@pytest.fixture(scope="module")
def spark_views(spark: Any, dataset: Path) -> list[str]:
    return fleet.open_dataset_spark(spark, dataset)


@pytest.mark.parametrize("view", queries.FLEET_VIEWS)
def test_fleet_view_is_equal_on_spark_and_duckdb(spark: Any, spark_views: list[str],
                                                  opened: Any, view: str) -> None:
    from_duckdb = _rows(opened.view(view))
    assert from_duckdb and _spark_view(spark, view) == from_duckdb


def test_fleet_view_comparison_sees_one_changed_count(spark: Any, spark_views: list[str],
                                                      opened: Any) -> None:
    changed = _rows(opened.sql("SELECT * REPLACE (findings + 1 AS findings) "
                            "FROM fleet_findings_by_kind"))
    assert _spark_view(spark, "fleet_findings_by_kind") != changed


def test_fleet_views_are_one_sql_text_for_both_engines(spark: Any, spark_views: list[str]
                                                      ) -> None:
    # NOTE: the text Spark ran is the file itself: no dialect translation in between
    assert spark_views == list(queries.FLEET_VIEWS)
    for view in queries.FLEET_VIEWS:
        text = queries.fleet_sql_text(view)
        assert text.lstrip("- ").startswith(view) and f"VIEW {view} AS" in text


def test_spark_reads_each_runs_events_from_the_partition_path(spark: Any,
                                                             spark_views: list[str],
                                                             opened: Any) -> None:
    # NOTE: the events' files are the runs' own (with a run_id inside); the path's wins
    counts = "SELECT run_id, count(*) AS n FROM events GROUP BY run_id"
    assert _spark_view(spark, f"({counts}) AS c") == _rows(opened.sql(counts))


def test_fleet_view_harmed_claims_follow_the_claims_table(opened: Any) -> None:
    con = opened.con
    ((harmed,),) = con.sql("SELECT count(*) FROM claims WHERE outcome = 'harmed'").fetchall()
    ((viewed,),) = con.sql("SELECT sum(claims_harmed) FROM fleet_claims_harmed").fetchall()
    assert harmed > 0 and viewed == harmed


def test_the_audit_job_has_no_shuffle(spark: Any, dataset: Path) -> None:
    # a job without a shuffle is one stage; one with a shuffle has a stage per side of it
    tracker = spark.sparkContext.statusTracker()
    jobs = tracker.getJobIdsForGroup(fleet.AUDIT_JOB_GROUP)
    assert jobs and all(len(tracker.getJobInfo(j).stageIds) == 1 for j in jobs)


def test_a_job_with_a_shuffle_shows_more_than_one_stage(spark: Any) -> None:
    sc = spark.sparkContext
    sc.setJobGroup("kvclaims-test-shuffle", "a shuffle, for the negative twin")
    try:
        sc.parallelize(range(10), 2).map(lambda x: (x % 3, x)).reduceByKey(
            lambda a, b: a + b).collect()
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    tracker = sc.statusTracker()
    (job,) = tracker.getJobIdsForGroup("kvclaims-test-shuffle")
    assert len(tracker.getJobInfo(job).stageIds) == 2


def test_fleet_refuses_a_non_empty_output(tmp_path: Path, fleet_dirs: list[Path]) -> None:
    (tmp_path / "keep.txt").write_text("x")
    with pytest.raises(InputError, match="not empty"):
        fleet.reconstruct_spark([str(fleet_dirs[0])], tmp_path, spark=object())


def test_fleet_refuses_a_pattern_matching_nothing(tmp_path: Path) -> None:
    with pytest.raises(InputError):
        fleet.find_fleet_runs([str(tmp_path / "nothing-*")])


def test_cli_engine_spark_reports_every_run_without_error(dataset_result: dict[str, Any],
                                                           fleet_dirs: list[Path]) -> None:
    assert len(dataset_result["runs"]) == len(fleet_dirs)
    assert all(r["error"] is None and r["events"] > 0 for r in dataset_result["runs"])


def test_cli_engine_spark_runs_the_largest_run_alone_and_first(
        dataset_result: dict[str, Any]) -> None:
    first, *rest = dataset_result["tasks"]
    assert first["run_ids"] == ["generated"] and rest
    assert any(t["runs"] > 1 for t in rest)
    assert all(first["events"] >= t["events"] for t in rest)


def test_cli_engine_spark_refuses_a_pack_size_below_one(fleet_dirs: list[Path], tmp_path: Path,
                                                         capsys: Any) -> None:
    from kvclaims.cli import main

    assert main(["reconstruct", "--engine", "spark", str(fleet_dirs[1]), "--out",
                 str(tmp_path / "out"), "--pack-events", "0"]) == 2
    assert "--pack-events must be at least 1" in capsys.readouterr().err


def test_cli_engine_spark_needs_an_output_dataset(fleet_dirs: list[Path], capsys: Any) -> None:
    from kvclaims.cli import main

    assert main(["reconstruct", "--engine", "spark", str(fleet_dirs[1])]) == 2
    assert "needs --out" in capsys.readouterr().err


# -- scheduling and failures, without Spark ------------------------------------------------------

def _run(rid: str, events: int) -> fleet.FleetRun:
    return fleet.FleetRun(rid, f"/runs/{rid}", "2026-12-01", events * 10, events)


def test_plan_puts_a_giant_run_alone_in_the_first_task() -> None:
    runs = [_run(f"r{i}", 100) for i in range(20)] + [_run("giant", 10_000)]
    tasks = fleet.plan_tasks(runs, slots=2, pack_events=1000)
    assert [r.run_id for r in tasks[0]] == ["giant"]
    assert sorted(r.run_id for t in tasks for r in t) == sorted(r.run_id for r in runs)


def test_default_packs_stay_below_the_largest_run() -> None:
    runs = [_run(f"r{i}", 100_000) for i in range(40)] + [_run("giant", 2_000_000)]
    first, *packs = fleet.plan_tasks(runs, slots=2)
    assert [r.run_id for r in first] == ["giant"]
    assert packs and all(sum(r.events for r in t) <= 1_000_000 for t in packs)


def test_plan_packs_small_runs_up_to_the_pack_size() -> None:
    tasks = fleet.plan_tasks([_run(f"r{i}", 100) for i in range(20)], slots=2,
                             pack_events=1000)
    assert [len(t) for t in tasks] == [10, 10]


def test_plan_gives_each_run_its_task_when_every_run_fills_one() -> None:
    tasks = fleet.plan_tasks([_run(f"r{i}", 100 * (i + 1)) for i in range(5)], slots=2,
                             pack_events=100)
    assert [[r.run_id for r in t] for t in tasks] == [["r4"], ["r3"], ["r2"], ["r1"], ["r0"]]


def test_fleet_runs_are_found_largest_first(fleet_dirs: list[Path]) -> None:
    runs = fleet.find_fleet_runs(fleet_dirs)
    assert runs[0].run_id == "generated"
    assert [r.events for r in runs] == sorted((r.events for r in runs), reverse=True)


def _damage_a_middle_segment(run_dir: Path) -> None:
    """Overwrite a segment that is not the last with bytes that are no Arrow IPC stream (and
    drop the sealed copy, so the segments are what is read): the loader refuses the run."""
    (run_dir / "events.parquet").unlink(missing_ok=True)
    segments = sorted(run_dir.glob("events-*.arrows"))
    assert len(segments) > 2
    segments[1].write_bytes(b"this is not an Arrow IPC stream\n" * 50)


def test_a_bad_run_in_a_pack_fails_alone(fleet_dirs: list[Path], tmp_path: Path) -> None:
    good = fleet.find_fleet_runs([fleet_dirs[1]])[0]
    bad_dir = shutil.copytree(fleet_dirs[4], tmp_path / "bad")   # the split run
    _damage_a_middle_segment(bad_dir)
    bad = fleet.find_fleet_runs([bad_dir])[0]
    statuses = fleet.run_task((0, [asdict(good), asdict(bad)]), str(tmp_path / "out"))
    by_run = {s["run_id"]: s for s in statuses if s["kind"] == "run"}
    assert by_run[good.run_id]["error"] is None and by_run[good.run_id]["events"] > 0
    assert by_run[bad.run_id]["error"] and "\n" not in by_run[bad.run_id]["error"]
    assert (tmp_path / "out" / "losses").is_dir()


def test_a_pack_of_good_runs_reports_no_error(fleet_dirs: list[Path], tmp_path: Path) -> None:
    runs = fleet.find_fleet_runs(fleet_dirs[1:3])
    statuses = fleet.run_task((0, [asdict(r) for r in runs]), str(tmp_path / "out"))
    assert [s["error"] for s in statuses if s["kind"] == "run"] == [None, None]


# -- explanations read from the dataset -----------------------------------------------------------

def _tenants(single: Any) -> list[str]:
    from kvclaims.explaining import tenants_by_harm

    return tenants_by_harm(single)


def test_explanation_from_the_dataset_equals_the_run_directories(dataset: Path,
                                                                  single: Any) -> None:
    from kvclaims.explaining import explain

    tenant = _tenants(single)[0]
    with kvclaims.open(dataset) as audit:
        from_dataset = explain(audit, tenant).render("text")
    assert from_dataset == explain(single, tenant).render("text")
    assert tenant in from_dataset


def _foreign_ids_shown(audit: Any, tenant: str, text: str) -> set[str]:
    """The claim and request ids of other tenants that ``text`` shows (whole ids: a request id
    "r" is inside every word); an id the tenant also uses (in another run) is its own."""
    ids = "SELECT claim_id FROM claims WHERE {0} UNION SELECT request_id FROM requests WHERE {0}"
    own, foreign = ({r[0] for r in audit.con.execute(ids.format(cond), [tenant, tenant])
                     .fetchall() if r[0]} for cond in ("tenant = ?", "tenant <> ?"))
    assert foreign - own, "the fleet must hold other tenants' ids for the check to mean much"
    return (foreign - own) & set(re.findall(r"[\w:.\-]+", text))


def test_explanation_from_the_dataset_never_names_another_tenant(dataset: Path,
                                                                  single: Any) -> None:
    from kvclaims.explaining import explain

    tenant, *others = _tenants(single)
    with kvclaims.open(dataset) as audit:
        text = explain(audit, tenant).render("json")
        assert _foreign_ids_shown(audit, tenant, text) == set()
    assert others and all(o not in text for o in others)


def test_another_tenants_explanation_shows_ids_foreign_to_the_first(dataset: Path,
                                                                     single: Any) -> None:
    from kvclaims.explaining import explain

    tenant, other, *_ = _tenants(single)
    with kvclaims.open(dataset) as audit:
        text = explain(audit, other).render("json")
        assert _foreign_ids_shown(audit, tenant, text) != set()


def test_cli_explain_reads_one_run_of_the_dataset(dataset: Path, fleet_dirs: list[Path],
                                                  single: Any, capsys: Any) -> None:
    from kvclaims.cli import main

    run_dir = fleet_dirs[0]
    run_id = fleet.find_fleet_runs([str(run_dir)])[0].run_id
    tenant = single.con.execute("SELECT min(tenant) FROM claims WHERE run_id = ?",
                                [run_id]).fetchall()[0][0]
    assert main(["explain", str(run_dir), "--tenant", tenant]) == 0
    from_dirs = capsys.readouterr().out
    assert main(["explain", "--dataset", str(dataset), "--run", run_id,
                 "--tenant", tenant]) == 0
    assert capsys.readouterr().out == from_dirs != ""


def test_cli_explain_refuses_a_run_the_dataset_does_not_hold(dataset: Path, single: Any,
                                                             capsys: Any) -> None:
    from kvclaims.cli import main

    assert main(["explain", "--dataset", str(dataset), "--run", "no-such-run",
                 "--tenant", _tenants(single)[0]]) == 2
    assert "no run 'no-such-run'" in capsys.readouterr().err


def test_cli_explain_refuses_a_directory_that_is_not_a_dataset(tmp_path: Path,
                                                               capsys: Any) -> None:
    from kvclaims.cli import main

    assert main(["explain", "--dataset", str(tmp_path), "--tenant", "t"]) == 2
    assert "not a fleet dataset" in capsys.readouterr().err
