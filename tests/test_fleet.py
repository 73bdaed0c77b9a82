"""The fleet audit on Spark (local mode) gives the same tables, views and explanations as one
machine.

Spark starts once per module (a JVM); the fleet is a handful of shipped runs, a generated run,
a run split into many segments and a run with a hole. Tasks run the labelling core; the later
stages run as Spark SQL transpiled from the same stage files (kvclaims/fleet.py).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

pytest.importorskip("pyspark")

from kvclaims.contract.trace_writer import RunWriter  # noqa: E402
from kvclaims import fleet  # noqa: E402
from kvclaims.audit import open_audit  # noqa: E402
from kvclaims.sources.jsonl import import_jsonl  # noqa: E402
from kvclaims.reconstruct.core import STAGES  # noqa: E402
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
        code = main(["reconstruct", "--engine", "spark", *map(str, fleet_dirs),
                     "--out", str(out), "--json"])
    assert code == 0
    return json.loads(printed.getvalue())


@pytest.fixture(scope="module")
def dataset(dataset_result: dict[str, Any]) -> Path:
    return Path(dataset_result["dataset"])


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


def test_every_run_has_one_partition_in_every_table(dataset: Path,
                                                   fleet_dirs: list[Path]) -> None:
    for table in fleet.dataset_tables(dataset):
        run_dirs = list((dataset / table).glob("date=*/run_id=*"))
        assert len(run_dirs) == len(fleet_dirs), table


def test_tasks_run_only_the_core_and_spark_sql_the_rest() -> None:
    shipped, outputs, statements = fleet.plan_tables()
    assert {"losses", "loss_claims", "events", "kv_runs", "kv_claim_facts"} <= set(shipped)
    # what the SQL stages create is computed by Spark, never shipped from a task
    assert not {s.table for s in statements} & set(shipped)
    assert {"claims", "requests", "feasibility", "findings", "conformance"} <= {
        s.table for s in statements}
    assert set(fleet.core_stages()) | set(fleet.sql_stages()) == set(STAGES)


def test_dataset_holds_every_table_of_the_audit(dataset: Path, single: Any) -> None:
    assert set(fleet.TABLES_OUT) <= set(fleet.dataset_tables(dataset)) == set(single.tables)


# NOTE: list columns whose order the stage SQL leaves undefined (a list() without ORDER BY,
# concatenated): compared as sorted lists. Everything else is compared as it is.
UNORDERED_LISTS: dict[str, tuple[str, ...]] = {"conformance": ("evidence_seqs",)}


def _table(con: Any, table: str) -> Any:
    cols = ", ".join(f'list_sort("{c}") AS "{c}"' for c in UNORDERED_LISTS.get(table, ()))
    return con.sql(f"SELECT * REPLACE ({cols}) FROM {table}" if cols else f"SELECT * FROM {table}")


@pytest.mark.parametrize("table", fleet.TABLES_OUT + ("lowering",))
def test_spark_tables_equal_single_machine_tables(dataset: Path, single: Any,
                                                  table: str) -> None:
    con = fleet.open_dataset_duckdb(dataset)
    assert _rows(_table(con, table)) == _rows(_table(single.con, table))


def test_table_comparison_sees_one_changed_label(dataset: Path) -> None:
    con = fleet.open_dataset_duckdb(dataset)
    changed = con.sql("SELECT * REPLACE (CASE WHEN seq = (SELECT min(seq) FROM losses) "
                      "THEN label || '-changed' ELSE label END AS label) FROM losses")
    assert _rows(changed) != _rows(con.sql("SELECT * FROM losses"))


def test_spark_sql_runs_the_stages_it_can(dataset_result: dict[str, Any]) -> None:
    # NOTE: a statement Spark SQL cannot analyse runs per run in DuckDB (listed with the
    # reason); every table of 05_feasibility and 06_outcomes runs on Spark SQL
    fallen = {line.split(":")[1].strip() for line in dataset_result["duckdb_fallbacks"]}
    assert not fallen & {"feasibility", "claims", "requests", "kv_claim_refs"}


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
    from kvclaims.contract.schema import InputError

    (tmp_path / "keep.txt").write_text("x")
    with pytest.raises(InputError, match="not empty"):
        fleet.reconstruct_spark([str(fleet_dirs[0])], tmp_path, spark=object())


def test_fleet_refuses_a_pattern_matching_nothing(tmp_path: Path) -> None:
    from kvclaims.contract.schema import InputError

    with pytest.raises(InputError):
        fleet.find_fleet_runs([str(tmp_path / "nothing-*")])


def test_cli_engine_spark_reports_every_run_without_error(dataset_result: dict[str, Any],
                                                           fleet_dirs: list[Path]) -> None:
    assert len(dataset_result["runs"]) == len(fleet_dirs)
    assert all(r["error"] is None and r["events"] > 0 for r in dataset_result["runs"])


def test_cli_engine_spark_needs_an_output_dataset(fleet_dirs: list[Path], capsys: Any) -> None:
    from kvclaims.cli import main

    assert main(["reconstruct", "--engine", "spark", str(fleet_dirs[1])]) == 2
    assert "needs --out" in capsys.readouterr().err


# -- explanations read from the dataset -----------------------------------------------------------

def _tenants(single: Any) -> list[str]:
    from kvclaims.explaining import tenants_by_harm

    return tenants_by_harm(single)


def test_explanation_from_the_dataset_equals_the_run_directories(dataset: Path,
                                                                  single: Any) -> None:
    from kvclaims.explaining import explain

    tenant = _tenants(single)[0]
    with fleet.open_dataset_audit(dataset) as audit:
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
    with fleet.open_dataset_audit(dataset) as audit:
        text = explain(audit, tenant).render("json")
        assert _foreign_ids_shown(audit, tenant, text) == set()
    assert others and all(o not in text for o in others)


def test_another_tenants_explanation_shows_ids_foreign_to_the_first(dataset: Path,
                                                                     single: Any) -> None:
    from kvclaims.explaining import explain

    tenant, other, *_ = _tenants(single)
    with fleet.open_dataset_audit(dataset) as audit:
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
