"""A fleet's runs on Apache Spark: the same audit, one task per run.

A run is the unit of parallelism. Labels depend on the order of one run's events and never on
another run, so each run is reconstructed by one Spark task that runs the **same** single-run
reconstruction as ``kvclaims reconstruct`` (the labelling pass and the DuckDB stages, bounded by
``memory_limit``, spilling beyond it) and writes its tables straight into the output dataset.
No shuffle moves events between machines; what crosses the network is one small status row per
run. The driver then reads the datasets back with Spark SQL for the documented views
(``queries/``, written once in DuckDB's dialect and transpiled with sqlglot).

Output layout (one Parquet dataset per table, Hive-partitioned, read alike by DuckDB, Polars
and Spark)::

    OUT/<table>/date=YYYY-MM-DD/run_id=<run>/part-0.parquet     # table in TABLES_OUT

``date`` is the UTC day the run started (from the manifest's wall-clock anchor), or
``unknown`` for runs without a clock. ``run_id`` lives in the path, not in the files.

NOTE: a giant run is one task, never split: its labels need its events in order. Runs are
scheduled largest first (by bytes on disk), so one giant run starts at once and overlaps with
all the small ones instead of running alone at the end; inside its task it streams in bounded
memory like any single-machine reconstruction.
"""

from __future__ import annotations

import glob
import os
import re
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote

import pyarrow as pa
import pyarrow.parquet as pq

from kvclaims.recorder.schema import InputError

# The tables every fleet dataset holds (a stage may add more, e.g. ``lowering``: those are
# written too): the events themselves (sealed), the manifests, every reconstructed table.
TABLES_OUT: Final[tuple[str, ...]] = (
    "events", "manifests", "losses", "loss_claims", "claims", "requests", "feasibility",
    "findings", "conformance")

# What each Spark task reports back to the driver: one row per run.
STATUS_SCHEMA: Final[pa.Schema] = pa.schema([
    ("run_id", pa.string()), ("date", pa.string()), ("events", pa.int64()),
    ("losses", pa.int64()), ("bytes_in", pa.int64()), ("bytes_out", pa.int64()),
    ("seconds", pa.float64()), ("error", pa.string())])

# The same, as Spark's DDL string (mapInArrow takes a Spark schema).
STATUS_DDL: Final[str] = ", ".join(
    f"{f.name} {'string' if f.type == pa.string() else 'long' if f.type == pa.int64() else 'double'}"
    for f in STATUS_SCHEMA)

_DATE_RE: Final = re.compile(r"^\d{4}-\d{2}-\d{2}")


@dataclass(frozen=True)
class FleetRun:
    """One run of the fleet: where it is, its id, its day, its size on disk."""

    run_id: str
    run_dir: str
    date: str
    bytes_in: int


def run_date(manifest: dict[str, Any]) -> str:
    """The UTC day a run started, from its manifest's wall-clock anchor; ``unknown`` without."""
    for key in ("started_utc", "start_utc", "started_at_utc"):
        value = manifest.get(key)
        if isinstance(value, str) and _DATE_RE.match(value):
            return value[:10]
    clock = manifest.get("clock")
    if isinstance(clock, dict):
        return run_date(clock)
    return "unknown"


def find_fleet_runs(patterns: Sequence[str | Path]) -> list[FleetRun]:
    """Every run directory the patterns name (run dirs, sweep dirs, shell globs), largest first.

    Raises ``InputError`` for a pattern that matches nothing and for a run id seen twice.
    """
    from kvclaims.reconstruct import loader

    runs: dict[str, FleetRun] = {}
    for pattern in patterns:
        matches = sorted(glob.glob(str(pattern))) or [str(pattern)]
        for match in matches:
            for run_dir in loader.find_run_dirs(match):
                manifest = loader.read_manifest(run_dir)
                rid = manifest["run_id"]
                if rid in runs and runs[rid].run_dir != str(run_dir):
                    raise InputError(f"{run_dir}: run id {rid!r} also in {runs[rid].run_dir}")
                size = sum(p.stat().st_size for p in Path(run_dir).iterdir() if p.is_file())
                runs[rid] = FleetRun(rid, str(run_dir), run_date(manifest), size)
    if not runs:
        raise InputError("no run directories found")
    return sorted(runs.values(), key=lambda r: (-r.bytes_in, r.run_id))


def partition_dir(out: str | Path, table: str, date: str, run_id: str) -> Path:
    """Where one run's rows of one table go (Hive layout; the run id is percent-encoded)."""
    return Path(out) / table / f"date={date}" / f"run_id={quote(run_id, safe='')}"


def audit_run(run: FleetRun, out: str | Path, *, memory_limit: str = "1GB") -> dict[str, Any]:
    """Reconstruct one run through the audit facade and write its partitions of the dataset.

    Returns the status row (see ``STATUS_SCHEMA``). This is the whole body of a Spark task.
    """
    from kvclaims.audit import open_audit

    t0 = time.perf_counter()
    counts: dict[str, int] = {}
    bytes_out = 0
    # NOTE: the same path as `kvclaims reconstruct` (streamed, bounded); the tables keep their
    # UTC `ts` columns so the documented views read the dataset as they read an audit
    with open_audit([run.run_dir], memory_limit=memory_limit, reuse=False, lock=False) as audit:
        for table in audit.tables:
            data = audit.con.sql(
                f"SELECT * EXCLUDE (run_id) FROM {table} ORDER BY ALL").to_arrow_table()
            counts[table] = data.num_rows
            target = partition_dir(out, table, run.date, run.run_id)
            target.mkdir(parents=True, exist_ok=True)
            path = target / "part-0.parquet"
            pq.write_table(data, path, compression="zstd")
            bytes_out += path.stat().st_size
    return {"run_id": run.run_id, "date": run.date, "events": counts.get("events", 0),
            "losses": counts.get("losses", 0), "bytes_in": run.bytes_in,
            "bytes_out": bytes_out, "seconds": time.perf_counter() - t0, "error": None}


def _task(out: str, memory_limit: str):
    """The function each Spark task runs over its partition (one run per partition)."""

    def run_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for row in batch.to_pylist():
                run = FleetRun(row["run_id"], row["run_dir"], row["date"], row["bytes_in"])
                try:
                    status = audit_run(run, out, memory_limit=memory_limit)
                except InputError as exc:  # a bad run is reported, the fleet goes on
                    status = {"run_id": run.run_id, "date": run.date, "events": 0,
                              "losses": 0, "bytes_in": run.bytes_in, "bytes_out": 0,
                              "seconds": 0.0, "error": str(exc)}
                yield pa.RecordBatch.from_pylist([status], schema=STATUS_SCHEMA)

    return run_partition


def spark_session(master: str | None = None, *, app_name: str = "kvclaims-fleet",
                  ui: bool = False) -> Any:
    """A Spark session for the fleet audit (``local[*]`` unless a master is given).

    Executors run this Python (``PYSPARK_PYTHON``) so they import the same kvclaims; the local
    driver binds to 127.0.0.1; partition values are read as strings (run ids like ``80``).
    """
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = (SparkSession.builder.appName(app_name)
               .master(master or os.environ.get("KVCLAIMS_SPARK_MASTER", "local[*]"))
               .config("spark.ui.enabled", "true" if ui else "false")
               .config("spark.sql.sources.partitionColumnTypeInference.enabled", "false")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.python.worker.reuse", "true")
               .config("spark.ui.showConsoleProgress", "false"))
    if (master or "local").startswith("local"):
        builder = (builder.config("spark.driver.bindAddress", "127.0.0.1")
                   .config("spark.driver.host", "127.0.0.1")
                   .config("spark.ui.host", "127.0.0.1"))
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


@dataclass
class FleetResult:
    """What a fleet reconstruction did: the dataset, one status row per run, the wall time."""

    out: Path
    runs: list[dict[str, Any]]
    seconds: float

    @property
    def events(self) -> int:
        """Events reconstructed over every run."""
        return sum(r["events"] for r in self.runs)

    @property
    def errors(self) -> list[dict[str, Any]]:
        """Runs that could not be reconstructed (each with its one-line reason)."""
        return [r for r in self.runs if r["error"]]


def reconstruct_spark(patterns: Sequence[str | Path], out: str | Path, *, spark: Any = None,
                      master: str | None = None, memory_limit: str = "1GB") -> FleetResult:
    """Reconstruct every run the patterns name on Spark, one task per run, into ``out``."""
    from kvclaims.reconstruct.core import validate_memory_limit

    memory_limit = validate_memory_limit(memory_limit)  # in the driver, before any task
    runs = find_fleet_runs(patterns)
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise InputError(f"{out}: output dataset directory is not empty")
    out.mkdir(parents=True, exist_ok=True)
    spark = spark or spark_session(master)
    t0 = time.perf_counter()
    rows = [{"run_id": r.run_id, "run_dir": r.run_dir, "date": r.date, "bytes_in": r.bytes_in}
            for r in runs]
    # NOTE: one slice per run, largest first: Spark hands out tasks in partition order.
    rdd = spark.sparkContext.parallelize(rows, numSlices=len(rows))
    df = spark.createDataFrame(rdd, "run_id string, run_dir string, date string, bytes_in long")
    status = df.mapInArrow(_task(str(out.resolve()), memory_limit), STATUS_DDL).collect()
    return FleetResult(out, sorted((r.asDict() for r in status), key=lambda r: r["run_id"]),
                       time.perf_counter() - t0)


# -- reading a fleet dataset back ---------------------------------------------------------------

def dataset_tables(out: str | Path) -> list[str]:
    """The tables a fleet dataset holds (one folder each)."""
    return sorted(p.name for p in Path(out).iterdir() if p.is_dir())


def dataset_glob(out: str | Path, table: str) -> str:
    """The Parquet files of one table of a dataset."""
    return str(Path(out) / table / "*" / "*" / "*.parquet")


def open_dataset_duckdb(out: str | Path, con: Any = None) -> Any:
    """A DuckDB connection with each table of a fleet dataset as a view, and the query views."""
    import duckdb

    from kvclaims import queries

    con = con or duckdb.connect()
    for table in dataset_tables(out):
        path = dataset_glob(out, table).replace("'", "''")
        con.execute(
            f"CREATE OR REPLACE VIEW {table} AS SELECT * EXCLUDE (date) FROM read_parquet("
            f"'{path}', hive_partitioning = true, union_by_name = true, "
            "hive_types = {'date': VARCHAR, 'run_id': VARCHAR})")
    queries.apply(con)
    return con


def _to_spark(node: Any) -> Any:
    """Rewrite the DuckDB-only constructs sqlglot leaves as they are into Spark SQL."""
    from sqlglot import exp

    if isinstance(node, exp.Array) and len(node.expressions) == 1 and isinstance(
            node.expressions[0], exp.Comprehension):
        # [x FOR v IN list IF cond]  ->  transform(filter(list, v -> cond), v -> x)
        comp = node.expressions[0]
        var = comp.args["expression"]
        listed = comp.args["iterator"]
        if comp.args.get("condition") is not None:
            listed = exp.Anonymous(this="filter", expressions=[
                listed, exp.Lambda(this=comp.args["condition"], expressions=[var.copy()])])
        body = comp.this
        if isinstance(body, exp.Column) and body.name == var.name:
            return listed
        return exp.Anonymous(this="transform", expressions=[
            listed, exp.Lambda(this=body, expressions=[var.copy()])])
    if isinstance(node, exp.Format):
        # DuckDB's format('{}') is fmt-style; Spark's format_string is printf-style
        for lit in node.this.find_all(exp.Literal):
            if lit.is_string:
                lit.set("this", lit.this.replace("%", "%%").replace("{}", "%s"))
    return node


def spark_view_sql(view: str) -> str:
    """A documented view's SQL, transpiled from DuckDB's dialect to Spark SQL (a temp view).

    The views are written once, in DuckDB's dialect; sqlglot translates them, and
    ``_to_spark`` rewrites the few constructs it leaves alone (list comprehensions, fmt-style
    format strings). ``tests/test_fleet.py`` runs every view on both engines and compares.
    """
    import sqlglot
    from sqlglot import exp

    from kvclaims import queries

    tree = sqlglot.parse_one(queries.sql_text(view), read="duckdb")
    if isinstance(tree, exp.Create):
        tree.set("replace", True)
        props = tree.args.get("properties") or exp.Properties(expressions=[])
        props.append("expressions", exp.TemporaryProperty())
        tree.set("properties", props)
    return tree.transform(_to_spark).sql(dialect="spark")


def open_dataset_spark(spark: Any, out: str | Path) -> list[str]:
    """Register each table of a fleet dataset and every documented view on a Spark session."""
    from urllib.parse import unquote

    from kvclaims import queries
    from pyspark.sql import functions as F

    for table in dataset_tables(out):
        df = spark.read.parquet(str(Path(out) / table))
        # NOTE: the path keeps run ids percent-encoded; the column gives them back as written
        decode = F.udf(unquote, "string")
        df = df.withColumn("run_id", decode(F.col("run_id"))).drop("date")
        df.createOrReplaceTempView(table)
    for view in queries.VIEWS:
        spark.sql(spark_view_sql(view))
    return list(queries.VIEWS)
