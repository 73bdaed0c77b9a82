"""The fleet audit on Spark (local mode) gives the same tables and views as one machine.

Spark starts once per module (a JVM); the fleet is a handful of shipped runs, a run split into
many segments and a run with a hole.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

pytest.importorskip("pyspark")

from kvclaims.recorder.trace_writer import RunWriter  # noqa: E402
from kvclaims.reconstruct import fleet  # noqa: E402
from kvclaims.audit import open_audit  # noqa: E402
from kvclaims.importers.jsonl import import_jsonl  # noqa: E402
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
    from kvclaims.recorder.schema import ARROW_SCHEMA

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
    return runs


@pytest.fixture(scope="module")
def spark() -> Any:
    session = fleet.spark_session("local[2]")
    yield session
    session.stop()


@pytest.fixture(scope="module")
def dataset(spark: Any, fleet_dirs: list[Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dataset") / "fleet"
    result = fleet.reconstruct_spark([str(p) for p in fleet_dirs], out, spark=spark)
    assert result.errors == []
    return out


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


def test_every_run_is_one_task_and_one_partition(dataset: Path, fleet_dirs: list[Path]) -> None:
    run_dirs = [p for p in (dataset / "losses").glob("date=*/run_id=*")]
    assert len(run_dirs) == len(fleet_dirs)


def test_dataset_holds_every_table_of_the_audit(dataset: Path, single: Any) -> None:
    assert set(fleet.TABLES_OUT) <= set(fleet.dataset_tables(dataset)) == set(single.tables)


@pytest.mark.parametrize("table", fleet.TABLES_OUT)
def test_spark_tables_equal_single_machine_tables(dataset: Path, single: Any,
                                                  table: str) -> None:
    con = fleet.open_dataset_duckdb(dataset)
    assert _rows(con.sql(f"SELECT * FROM {table}")) == _rows(
        single.con.sql(f"SELECT * FROM {table}"))


def test_split_run_labels_equal_its_unsplit_twin(dataset: Path) -> None:
    con = fleet.open_dataset_duckdb(dataset)
    whole, split = (con.sql(f"""
        SELECT seq, block_id, label FROM losses WHERE run_id = '{rid}' ORDER BY seq, block_id
        """).fetchall() for rid in ("multi_tenant-hard_protected-80",
                                    "multi_tenant-hard_protected-80-split"))
    assert whole and whole == split


def test_run_with_a_gap_keeps_its_unknown_labels(dataset: Path) -> None:
    con = fleet.open_dataset_duckdb(dataset)
    labels = {r[0] for r in con.sql(
        "SELECT label FROM losses WHERE run_id = 'gap'").fetchall()}
    assert "unknown" in labels


def test_dataset_reads_the_same_in_polars(dataset: Path) -> None:
    import polars as pl

    frame = pl.scan_parquet(str(dataset / "losses" / "**" / "*.parquet"),
                            hive_partitioning=True).collect()
    con = fleet.open_dataset_duckdb(dataset)
    assert frame.height == con.sql("SELECT count(*) FROM losses").fetchall()[0][0] > 0
    assert set(frame["run_id"].unique()) == {r[0] for r in con.sql(
        "SELECT DISTINCT run_id FROM losses").fetchall()}


def test_every_documented_view_runs_on_spark_and_duckdb_alike(spark: Any,
                                                             dataset: Path) -> None:
    import duckdb

    views = fleet.open_dataset_spark(spark, dataset)
    con = fleet.open_dataset_duckdb(dataset)
    for view in views:
        from_spark = spark.sql(f"SELECT * FROM {view}").toArrow()
        tmp = duckdb.connect()
        tmp.register("spark_rows", from_spark)
        assert _rows(tmp.sql("SELECT * FROM spark_rows")) == _rows(
            con.sql(f"SELECT * FROM {view}")), view


def test_view_transpiles_duckdb_only_constructs() -> None:
    sql = fleet.spark_view_sql("tenant_explanations")
    assert " FOR " not in sql and "{}" not in sql


def test_fleet_refuses_a_non_empty_output(tmp_path: Path, fleet_dirs: list[Path]) -> None:
    from kvclaims.recorder.schema import InputError

    (tmp_path / "keep.txt").write_text("x")
    with pytest.raises(InputError, match="not empty"):
        fleet.reconstruct_spark([str(fleet_dirs[0])], tmp_path, spark=object())


def test_fleet_refuses_a_pattern_matching_nothing(tmp_path: Path) -> None:
    from kvclaims.recorder.schema import InputError

    with pytest.raises(InputError):
        fleet.find_fleet_runs([str(tmp_path / "nothing-*")])


def test_cli_engine_spark_writes_the_dataset(spark: Any, fleet_dirs: list[Path],
                                             tmp_path: Path, capsys: Any) -> None:
    from kvclaims.cli import main

    assert main(["reconstruct", "--engine", "spark", str(fleet_dirs[1]),
                 "--out", str(tmp_path / "ds")]) == 0
    assert "reconstructed 1 run(s) on Spark" in capsys.readouterr().out
    assert "losses" in fleet.dataset_tables(tmp_path / "ds")


def test_cli_engine_spark_needs_an_output_dataset(fleet_dirs: list[Path], capsys: Any) -> None:
    from kvclaims.cli import main

    assert main(["reconstruct", "--engine", "spark", str(fleet_dirs[1])]) == 2
    assert "needs --out" in capsys.readouterr().err
