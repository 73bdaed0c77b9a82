"""A fleet's runs on Apache Spark: the same audit, partitioned by run.

A run is the unit of parallelism of the labelling core. Labels depend on the order of one
run's events and never on another run, so each run goes to one Spark task that runs the
**same** labelling core as ``kvclaims.open`` (``core.STAGES`` up to ``04_labels.sql``: the
loader's checked read, run facts, claim instances, the compiled labelling pass; DuckDB bounded
by ``memory_limit``) and returns its tables as Arrow. The later stages (``05_feasibility`` ..
``08_conformance``) run as Spark SQL over those tables, transpiled at run time from the same
stage files with sqlglot (a statement Spark cannot analyse runs per run in DuckDB, on Spark,
and is reported). Spark then writes every table the audit shows, with its UTC ``ts`` columns.
The documented views (``queries/``) are transpiled the same way. docs/fleet.md tells what
runs where.

Output layout (one Parquet dataset per table, Hive-partitioned, read alike by DuckDB, Polars
and Spark)::

    OUT/<table>/date=YYYY-MM-DD/run_id=<run>/part-*.parquet

``date`` is the UTC day the run started (from the manifest's wall-clock anchor), or
``unknown`` for runs without a clock. ``run_id`` lives in the path, not in the files.

NOTE: a giant run is one core task, never split: its labels need its events in order. Runs
are scheduled largest first (by bytes on disk), so one giant run starts at once and overlaps
with all the small ones instead of running alone at the end; inside its task it streams in
bounded memory like any single-machine reconstruction.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import pyarrow as pa
import pyarrow.parquet as pq

from kvclaims import queries
from kvclaims.contract.clock import clock_anchor, clock_table
from kvclaims.contract.schema import InputError
from kvclaims.reconstruct import core, loader
from kvclaims.reconstruct.core import (STAGES, run_stages, split_statements, stage_sql,
                                       validate_memory_limit)

# The tables every fleet dataset holds (a stage may add more, e.g. ``lowering``: those are
# written too): the events themselves (sealed), the manifests, every reconstructed table.
TABLES_OUT: Final[tuple[str, ...]] = (
    "events", "manifests", "losses", "loss_claims", "claims", "requests", "feasibility",
    "findings", "conformance")

#: Where the core tasks leave their tables inside the output directory (removed at the end).
STAGING: Final[str] = "_core"

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


# -- the labelling core, one task per run --------------------------------------------------------

#: The stages each task runs (DuckDB + the numba pass, per run): everything up to the labelled
#: losses. NOTE: the split is by name in core.STAGES, so a stage added before 04 runs in the task.
CORE_LAST: Final[str] = "04_labels.sql"


def core_stages() -> tuple[str, ...]:
    """The stages a task runs: ``core.STAGES`` up to and including ``04_labels.sql``."""

    return STAGES[: STAGES.index(CORE_LAST) + 1]


def sql_stages() -> tuple[str, ...]:
    """The stages Spark SQL runs over the tasks' tables: every stage after the core."""

    return STAGES[STAGES.index(CORE_LAST) + 1:]


class _CoreDone(Exception):
    """Raised from ``run_stages``' progress hook once the core stages are done."""


def run_core(con: Any, manifests: dict[str, dict[str, Any]], truncated: set[str],
             sources: dict[str, Path] | None = None) -> None:
    """Run the core stages on ``con`` (which holds ``events``), exactly as ``core.run_stages``.

    NOTE: ``core.run_stages`` has no stop-after argument; its progress hook stops it after the
    last core stage, so the setup (manifest, policy and mode tables) stays the one in core.py.
    """

    last = core_stages()[-1]

    def stop_after_core(stage: str) -> None:
        if stage == last:
            raise _CoreDone

    try:
        run_stages(con, manifests=manifests, truncated_runs=truncated,
                   progress=stop_after_core, persist=False, sources=sources)
    except _CoreDone:
        return
    raise RuntimeError(f"core.run_stages never reached {last}")


# Each task returns its tables through one Arrow stream: one row per record batch, the batch
# as Arrow IPC bytes; ``part`` -1 carries only the schema (so an empty table still has one).
BLOB_DDL: Final[str] = "table string, run_id string, part int, ipc binary"
BLOB_SCHEMA: Final[pa.Schema] = pa.schema([
    ("table", pa.string()), ("run_id", pa.string()), ("part", pa.int32()),
    ("ipc", pa.binary())])
_BATCH_ROWS: Final[int] = 1 << 16


def _ipc(schema: pa.Schema, batches: Sequence[pa.RecordBatch]) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        for b in batches:
            writer.write_batch(b)
    return sink.getvalue().to_pybytes()


def core_tables(run: FleetRun, tables: Sequence[str], *, memory_limit: str = "1GB"
                ) -> Iterator[tuple[str, pa.Schema, pa.RecordBatch | None]]:
    """One run through the core stages: yield ``(table, schema, batch)`` for each of ``tables``
    (``None`` first, for the schema), plus ``manifests`` and ``kv_clock``.

    The events are read and checked by the loader exactly as by ``kvclaims.open``.
    """

    runs = loader.open_runs([run.run_dir])
    info = core.StreamedInput({}, {}, [], set())
    con, tmp = core.open_database(memory_limit=memory_limit)
    try:
        files, _ = core.stage_events(runs, info, tmp)
        core.expose_events(con, files, tmp)
        run_core(con, info.manifests, info.truncated_runs, sources=files)
        trace = loader.Trace(events=pa.table({}), manifests=info.manifests,
                             run_dirs=info.run_dirs, truncations=info.truncations,
                             truncated_runs=info.truncated_runs)
        clock = clock_table(info.manifests)
        # NOTE: the anchor travels as integer microseconds: a naive Arrow timestamp would be
        # read by Spark in the worker's local time zone
        clock = clock.append_column("utc_us", clock.column("utc").cast(pa.int64())).drop(["utc"])
        extra = {"manifests": trace.manifests_table(), "kv_clock": clock}
        # NOTE: ``events`` is a view over the run's Parquet file (core.expose_events)
        present = {r[0] for r in con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE NOT internal UNION ALL "
            "SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()}
        for name in tables:
            if name in extra:
                data = extra[name]
                yield name, data.schema, None
                for batch in data.to_batches(max_chunksize=_BATCH_ROWS):
                    yield name, data.schema, batch
            elif name in present:
                reader = con.table(name).to_arrow_reader(batch_size=_BATCH_ROWS)
                yield name, reader.schema, None
                for batch in reader:
                    yield name, reader.schema, batch
    finally:
        core.drop_database(con, tmp)


def spark_arrow_type(typ: pa.DataType) -> pa.DataType:
    """The Arrow type a column takes on Spark, which has no unsigned integers: ``uint64`` (block
    hashes) becomes ``decimal(20, 0)`` (exact, as Spark itself reads Parquet's UINT64), smaller
    unsigned types the next signed one; nested types alike."""
    if typ == pa.uint64():
        return pa.decimal128(20, 0)
    if pa.types.is_unsigned_integer(typ):
        return {8: pa.int16(), 16: pa.int32(), 32: pa.int64()}[typ.bit_width]
    if pa.types.is_list(typ) or pa.types.is_large_list(typ):
        return pa.list_(pa.field(typ.value_field.name, spark_arrow_type(typ.value_type)))
    if pa.types.is_struct(typ):
        return pa.struct([f.with_type(spark_arrow_type(f.type)) for f in typ])
    if pa.types.is_dictionary(typ):
        return spark_arrow_type(typ.value_type)
    return typ


def spark_arrow_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with every column in the type it takes on Spark (``spark_arrow_type``)."""
    return pa.schema([f.with_type(spark_arrow_type(f.type)) for f in schema])


def spark_session(master: str | None = None, *, app_name: str = "kvclaims-fleet",
                  ui: bool = False) -> Any:
    """A Spark session for the fleet audit (``local[*]`` unless a master is given).

    Executors run this Python (``PYSPARK_PYTHON``) so they import the same kvclaims; the local
    driver binds to 127.0.0.1; partition values are read as strings (run ids like ``80``).
    """
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # NOTE: local Python workers import this very checkout (not another kvclaims on the path)
    root = str(Path(__file__).resolve().parents[1])
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if root not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([root] + [p for p in paths if p])
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = (SparkSession.builder.appName(app_name)
               .master(master or os.environ.get("KVCLAIMS_SPARK_MASTER", "local[*]"))
               .config("spark.ui.enabled", "true" if ui else "false")
               .config("spark.sql.sources.partitionColumnTypeInference.enabled", "false")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.python.worker.reuse", "true")
               .config("spark.ui.showConsoleProgress", "false")
               # NOTE: DuckDB's semantics where Spark's differ: NULL for x/0 and bad casts
               # (not errors), size(NULL) is NULL
               .config("spark.sql.ansi.enabled", "false")
               .config("spark.sql.legacy.sizeOfNull", "false")
               # the SQL stages' shuffles are small (per-run rows): few partitions, and AQE
               # coalesces further; a cluster sets its own (KVCLAIMS_SPARK_SHUFFLE_PARTITIONS)
               .config("spark.sql.shuffle.partitions",
                       os.environ.get("KVCLAIMS_SPARK_SHUFFLE_PARTITIONS", "4"))
               .config("spark.sql.adaptive.enabled", "true")
               # NOTE: an analysis error prints its plan; the SQL stages' plans are huge
               # (minutes to format): keep the message short
               .config("spark.sql.maxPlanStringLength", "8192"))
    if (master or "local").startswith("local"):
        # NOTE: in local mode the driver's JVM is the executor too: the per-run DuckDB
        # fallback carries each run's rows of a table as one Arrow value through it (1 GB, the
        # default, ran out at a 300 k-event run); on a cluster spark-submit sets it
        builder = (builder.config("spark.driver.memory",
                                  os.environ.get("KVCLAIMS_SPARK_DRIVER_MEMORY", "4g"))
                   .config("spark.driver.bindAddress", "127.0.0.1")
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
    #: statements Spark SQL could not analyse, run per run in DuckDB instead (with Spark's reason)
    fallbacks: list[str] = field(default_factory=list)

    @property
    def events(self) -> int:
        """Events reconstructed over every run."""
        return sum(r["events"] for r in self.runs)

    @property
    def errors(self) -> list[dict[str, Any]]:
        """Runs that could not be reconstructed (each with its one-line reason)."""
        return [r for r in self.runs if r["error"]]


# -- the driver ---------------------------------------------------------------------------------

def plan_tables() -> tuple[list[str], list[str], list[SparkStatement]]:
    """What a fleet reconstruction moves: (tables each task returns, tables written out, the
    Spark SQL statements), all read from the stage files (``core.STAGES``).

    A task returns what the SQL stages read and it built, the core's own output tables, the
    events, the manifests and the clocks; the dataset gets every table that is not a stage's
    internal (``kv_*``), as ``kvclaims.open`` shows them.
    """
    core_created, _ = stage_tables(core_stages())
    sql_created, sql_read = stage_tables(sql_stages())
    statements = [s for stage in sql_stages() for s in spark_stage(stage)]
    outputs = ["events", "manifests"] + sorted(
        t for t in core_created | sql_created if not t.startswith("kv_"))
    shipped = sorted((sql_read - sql_created) | {t for t in outputs if t not in sql_created}
                     | {"kv_clock"})
    return shipped, outputs, statements


def _core_task(tables: Sequence[str], memory_limit: str, staging: str):
    """The function each Spark task runs: for each of its runs, the core tables as Parquet
    files ``staging/<table>/<index>.parquet`` (an empty file where the run has no rows), then
    one status row (``part`` -2, JSON); a run that cannot be read writes nothing and gives only
    a status row with its one-line error."""
    import json

    def status(run: FleetRun, **fields: Any) -> pa.RecordBatch:
        body = {"run_id": run.run_id, "date": run.date, "events": 0, "losses": 0,
                "bytes_in": run.bytes_in, "seconds": 0.0, "error": None, **fields}
        return pa.RecordBatch.from_pylist(
            [{"table": "", "run_id": run.run_id, "part": -2,
              "ipc": json.dumps(body).encode()}], schema=BLOB_SCHEMA)

    def run_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for row in batch.to_pylist():
                run = FleetRun(row["run_id"], row["run_dir"], row["date"], row["bytes_in"])
                t0 = time.perf_counter()
                try:
                    rows = write_core_tables(run, tables, Path(staging), row["index"],
                                             memory_limit=memory_limit)
                except InputError as exc:  # a bad run is reported, the fleet goes on
                    yield status(run, error=str(exc))
                    continue
                yield status(run, events=rows.get("events", 0), losses=rows.get("losses", 0),
                             seconds=time.perf_counter() - t0)

    return run_partition


def write_core_tables(run: FleetRun, tables: Sequence[str], staging: Path, index: int, *,
                      memory_limit: str = "1GB") -> dict[str, int]:
    """One run through the core (``core_tables``), each table written to
    ``staging/<table>/<index>.parquet``; returns the rows per table.

    NOTE: a run's files appear only once it is whole (written hidden, renamed at the end, so
    Spark never reads a partial run); a rerun of the task (Spark retries) rewrites the same
    names.
    """
    rows: dict[str, int] = {}
    writers: dict[str, Any] = {}
    hidden: list[tuple[Path, Path]] = []
    try:
        for name, schema, data in core_tables(run, tables, memory_limit=memory_limit):
            if data is None:
                folder = staging / name
                folder.mkdir(parents=True, exist_ok=True)
                final = folder / f"{index:06d}.parquet"
                tmp = folder / f".{index:06d}.parquet"
                writers[name] = pq.ParquetWriter(str(tmp), schema)
                hidden.append((tmp, final))
                rows[name] = 0
            else:
                writers[name].write_batch(data)
                rows[name] += data.num_rows
        for writer in writers.values():
            writer.close()
        for tmp, final in hidden:
            os.replace(tmp, final)
    except BaseException:
        for writer in writers.values():
            writer.close()
        for tmp, _ in hidden:
            tmp.unlink(missing_ok=True)
        raise
    return rows


def _spark_schema(schema: pa.Schema) -> Any:
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(spark_arrow_schema(schema))


def _with_ts(spark: Any, name: str) -> Any:
    """``name`` with ``ts`` (UTC, ``TIMESTAMP_NTZ``) beside ``ts_ns`` and ``X_ts`` beside
    ``X_ts_ns``, from the run's clock, as ``kvclaims.open`` adds them; NULL without a clock."""
    cols = spark.table(name).columns
    pairs = [(c, c[: -len("_ns")]) for c in cols
             if (c == "ts_ns" or c.endswith("_ts_ns")) and c[: -len("_ns")] not in cols]
    if not pairs or "run_id" not in cols:
        return spark.table(name)
    # NOTE: DuckDB's integer // truncates toward zero, as Spark's div does (the offset from the
    # anchor is negative for events before it: flooring would move them by 1 us)
    added = ", ".join(
        f"CAST(timestamp_micros(c.utc_us + (t.{s} - c.ts_ns) div 1000) AS TIMESTAMP_NTZ) "
        f"AS {d}" for s, d in pairs)
    return spark.sql(f"SELECT t.*, {added} FROM {name} t "
                     "LEFT JOIN kv_clock c ON c.run_id = t.run_id")


def reconstruct_spark(patterns: Sequence[str | Path], out: str | Path, *, spark: Any = None,
                      master: str | None = None, memory_limit: str = "1GB",
                      progress: Callable[[str], None] | None = None) -> FleetResult:
    """Reconstruct every run the patterns name on Spark into ``out``.

    One task per run runs the labelling core (``core_stages``) and leaves its tables as
    Parquet in ``out/_core/``; the later stages (``sql_stages``) run as Spark SQL over them,
    transpiled from the same stage files; each output table is written as Parquet partitioned
    by date and run, and ``out/_core/`` is removed. ``progress`` is told each step (the core,
    each statement's table, each table written).
    """

    memory_limit = validate_memory_limit(memory_limit)  # in the driver, before any task
    shipped, outputs, statements = plan_tables()       # a stage Spark cannot run fails here
    runs = find_fleet_runs(patterns)
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise InputError(f"{out}: output dataset directory is not empty")
    out.mkdir(parents=True, exist_ok=True)
    spark = spark or spark_session(master)
    say = progress or (lambda _msg: None)
    t0 = time.perf_counter()
    try:
        return _reconstruct(spark, runs, out, shipped, outputs, statements, memory_limit, say,
                            t0)
    finally:
        # NOTE: the core's files are the job's scratch, never part of the dataset
        shutil.rmtree(out / STAGING, ignore_errors=True)
        spark.catalog.clearCache()


def _reconstruct(spark: Any, runs: list[FleetRun], out: Path, shipped: list[str],
                 outputs: list[str], statements: list[SparkStatement], memory_limit: str,
                 say: Callable[[str], None], t0: float) -> FleetResult:
    """The body of ``reconstruct_spark`` once its inputs are checked."""
    import json

    from pyspark.sql import functions as F

    rows = [{"run_id": r.run_id, "run_dir": r.run_dir, "date": r.date, "bytes_in": r.bytes_in,
             "index": i} for i, r in enumerate(runs)]
    # NOTE: one slice per run, largest first: Spark hands out tasks in partition order.
    rdd = spark.sparkContext.parallelize(rows, numSlices=len(rows))
    df = spark.createDataFrame(
        rdd, "run_id string, run_dir string, date string, bytes_in long, index int")
    # NOTE: the core's tables go through Parquet files beside the dataset (a shared
    # filesystem, as the dataset itself), read back by Spark's own Parquet reader: no event
    # crosses Python twice, and each table is a leaf plan for the SQL stages
    staging = out / STAGING
    say(f"labelling core: {len(runs)} run(s), one task each")
    status = [json.loads(r.ipc) for r in df.mapInArrow(
        _core_task(shipped, memory_limit, str(staging.resolve())), BLOB_DDL).collect()]
    bad = {s["run_id"] for s in status if s["error"]}
    good = [r for r in runs if r.run_id not in bad]
    shipped_tables = 0
    for name in shipped:
        files = sorted((staging / name).glob("*.parquet")) if (staging / name).is_dir() else []
        if not files:
            continue
        if "run_id" not in pq.read_schema(files[0]).names:
            # NOTE: a table without run_id (kv_modes, kv_policies) is the same in every task:
            # one copy, not one per run
            files = files[:1]
        spark.read.parquet(*map(str, files)).createOrReplaceTempView(name)
        shipped_tables += 1
    say(f"shipped: {shipped_tables} table(s)")
    fallbacks: list[str] = []
    for st in statements:
        try:
            with _quiet_analysis_errors():
                frame = spark.sql(st.sql)
        except Exception as exc:  # noqa: BLE001 -- Spark's analysis errors have no common type
            # NOTE: a statement Spark SQL cannot analyse still runs on Spark, per run, in DuckDB
            fallbacks.append(f"{st.stage}: {st.table}: {str(exc).strip().splitlines()[0]}")
            frame = per_run_duckdb(spark, st)
        frame.localCheckpoint(eager=True).createOrReplaceTempView(st.table)
        say(f"{st.stage}: {st.table}")
    dates = spark.createDataFrame([(r.run_id, r.date) for r in good],
                                  "run_id string, date string")
    for name in outputs:
        if not spark.catalog.tableExists(name):
            continue
        frame = _with_ts(spark, name).join(F.broadcast(dates), "run_id")
        (frame.write.partitionBy("date", "run_id").option("compression", "zstd")
         .mode("overwrite").parquet(str(out / name)))
        _fill_empty_partitions(out / name, frame.drop("date", "run_id").schema, good)
        say(f"written: {name}")
    return FleetResult(out, sorted(status, key=lambda r: r["run_id"]),
                       time.perf_counter() - t0, fallbacks)


@contextlib.contextmanager
def _quiet_analysis_errors() -> Iterator[None]:
    """Silence PySpark's logging of an analysis error (its whole plan and stack, megabytes, on
    stderr): the error is still raised, and a fallback reports its first line."""
    from pyspark.logger import PySparkLogger

    logger = PySparkLogger.getLogger("SQLQueryContextLogger")
    level = logger.level
    logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        logger.setLevel(level)


def _fill_empty_partitions(table_dir: Path, schema: Any, runs: Sequence[FleetRun]) -> None:
    """Give every run a (possibly empty) file in every table, as the single-machine audit has
    every table for every run: Spark writes no file for a partition without rows."""
    from pyspark.sql.pandas.types import to_arrow_schema

    empty = None
    for run in runs:
        target = spark_partition_dir(table_dir, run.date, run.run_id)
        if target.is_dir() and any(target.glob("*.parquet")):
            continue
        if empty is None:
            empty = to_arrow_schema(schema).empty_table()
        target.mkdir(parents=True, exist_ok=True)
        pq.write_table(empty, target / "part-empty.zstd.parquet", compression="zstd")


def spark_partition_dir(table_dir: Path, date: str, run_id: str) -> Path:
    """Where Spark's ``partitionBy`` puts one run's rows (Hive path escaping, as Spark's
    ``ExternalCatalogUtils.escapePathName``)."""
    return table_dir / f"date={_escape(date)}" / f"run_id={_escape(run_id)}"


_SPECIAL: Final[frozenset[str]] = frozenset('"#%\'*/:=?\\\x7f{[]^')


def _escape(value: str) -> str:
    return "".join(f"%{ord(c):02X}" if c in _SPECIAL or ord(c) < 0x20 else c for c in value)


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


    con = con or duckdb.connect()
    for table in dataset_tables(out):
        path = dataset_glob(out, table).replace("'", "''")
        source = (f"read_parquet('{path}', hive_partitioning = true, union_by_name = true, "
                  "hive_types = {'date': VARCHAR, 'run_id': VARCHAR})")
        cols = con.execute(f"DESCRIBE SELECT * EXCLUDE (date) FROM {source}").fetchall()
        # NOTE: Spark has no unsigned integers: it wrote UBIGINT hashes as DECIMAL(20,0)
        select = ", ".join(
            f'CAST("{c}" AS {t.replace("DECIMAL(20,0)", "UBIGINT")}) AS "{c}"'
            if t.startswith("DECIMAL(20,0)") else f'"{c}"' for c, t, *_ in cols)
        con.execute(f"CREATE OR REPLACE VIEW {table} AS SELECT {select} FROM {source}")
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


    tree = sqlglot.parse_one(queries.sql_text(view), read="duckdb")
    if isinstance(tree, exp.Create):
        tree.set("replace", True)
        props = tree.args.get("properties") or exp.Properties(expressions=[])
        props.append("expressions", exp.TemporaryProperty())
        tree.set("properties", props)
    return tree.transform(_to_spark).sql(dialect="spark")


def open_dataset_spark(spark: Any, out: str | Path) -> list[str]:
    """Register each table of a fleet dataset and every documented view on a Spark session."""

    for table in dataset_tables(out):
        # NOTE: Spark unescapes the run ids in the partition paths (it escaped them writing)
        spark.read.parquet(str(Path(out) / table)).drop("date").createOrReplaceTempView(table)
    for view in queries.VIEWS:
        spark.sql(spark_view_sql(view))
    return list(queries.VIEWS)


# -- the SQL stages, transpiled to Spark SQL ----------------------------------------------------

def _conjuncts(node: Any) -> list[Any]:
    from sqlglot import exp

    if isinstance(node, exp.And):
        return _conjuncts(node.this) + _conjuncts(node.expression)
    if isinstance(node, exp.Paren):
        return _conjuncts(node.this)
    return [node]


def _ordered_list(agg: Any, where: Any = None) -> Any:
    """DuckDB's ``list(x ORDER BY k) [FILTER (WHERE c)]`` in Spark.

    Spark's ``collect_list`` drops NULLs, ignores ORDER BY and gives ``[]`` for no rows;
    DuckDB keeps NULLs, orders, and gives NULL. So: collect ``struct(k..., x)``, sort, take
    ``x``; NULL when no row is aggregated.
    """
    from sqlglot import exp

    value = agg.this
    order = None
    if isinstance(value, exp.Order):
        order, value = value, value.this
    distinct = isinstance(value, exp.Distinct)
    if distinct:
        value = value.expressions[0]
    keys = [] if order is None else list(order.expressions)
    desc = {bool(k.args.get("desc")) for k in keys}
    if len(desc) > 1:
        raise NotImplementedError("list() with mixed ASC/DESC order on Spark")
    def spark(node: Any) -> Any:  # the parts are rewritten too (transform skips a new node)
        return node.copy().transform(_stage_to_spark)

    fields = [exp.PropertyEQ(this=exp.to_identifier(f"k{i}"), expression=spark(k.this))
              for i, k in enumerate(keys)]
    fields.append(exp.PropertyEQ(this=exp.to_identifier("v"), expression=spark(value)))
    cond = None if where is None else spark(where.this)
    struct = exp.Struct(expressions=fields)
    collected: Any = exp.Anonymous(this="collect_list", expressions=[struct])
    counted: Any = exp.Count(this=exp.Literal.number(1))
    if cond is not None:
        collected = exp.Filter(this=collected, expression=exp.Where(this=cond.copy()))
        counted = exp.Filter(this=counted, expression=exp.Where(this=cond.copy()))
    if keys:
        collected = exp.Anonymous(this="sort_array", expressions=[
            collected, exp.Boolean(this=not desc.pop())])
    var = exp.to_identifier("__s")
    values = exp.Anonymous(this="transform", expressions=[collected, exp.Lambda(
        this=exp.Dot(this=exp.column(var), expression=exp.to_identifier("v")),
        expressions=[var])])
    if distinct:
        values = exp.Anonymous(this="array_distinct", expressions=[values])
    return exp.Case(ifs=[exp.If(this=exp.GT(this=counted, expression=exp.Literal.number(0)),
                                true=values)])


def _outer_refs_to_inner(select: Any) -> Any:
    """In a correlated subquery, an outer column equal (by a WHERE conjunct) to an inner one
    is replaced by the inner one in the select list: Spark refuses outer references inside an
    aggregate (``list(x.a || CASE WHEN t.ev = ...)``), and under the WHERE they are equal."""
    from sqlglot import exp

    where = select.args.get("where")
    source = select.args.get("from_") or select.args.get("from")
    if where is None or source is None:
        return select
    inner = {source.this.alias_or_name} | {j.this.alias_or_name
                                            for j in select.args.get("joins") or []}
    swap: dict[tuple[str, str], Any] = {}
    for cond in _conjuncts(where.this):
        if not isinstance(cond, exp.EQ):
            continue
        a, b = cond.this, cond.expression
        if not (isinstance(a, exp.Column) and isinstance(b, exp.Column) and a.table
                and b.table):
            continue
        if a.table in inner and b.table not in inner:
            swap[(b.table, b.name)] = a
        elif b.table in inner and a.table not in inner:
            swap[(a.table, a.name)] = b
    if not swap:
        return select
    for expr in select.expressions:
        for col in list(expr.find_all(exp.Column)):
            hit = swap.get((col.table, col.name))
            # NOTE: only inside this select's own aggregates (not in a nested subquery)
            if hit is not None and isinstance(
                    col.find_ancestor(exp.AggFunc, exp.Subquery, exp.Select), exp.AggFunc):
                col.replace(hit.copy())
    return select


def _stage_to_spark(node: Any) -> Any:
    """The rewrites the reconstruction's stage SQL needs on Spark (on top of ``_to_spark``)."""
    from sqlglot import exp

    if isinstance(node, exp.DataType) and node.this == exp.DataType.Type.UBIGINT:
        # Spark has no unsigned integers: hashes are DECIMAL(20,0) there (spark_arrow_type)
        return exp.DataType.build("DECIMAL(20,0)")
    if isinstance(node, exp.ArraySort) and node.expression is None:
        # Spark's array_sort is a higher-order function: no subquery may sit inside it;
        # sort_array is not (the stages sort lists of seqs, never NULL)
        asc = node.args.get("asc")
        return exp.Anonymous(this="sort_array", expressions=[
            node.this.copy().transform(_stage_to_spark),
            exp.Boolean(this=asc is None or bool(asc.this))])
    if isinstance(node, exp.Subquery) and isinstance(node.this, exp.Select):
        node.set("this", _outer_refs_to_inner(node.this))
    if isinstance(node, (exp.Min, exp.Max)) and node.args.get("count") is not None:
        # DuckDB's min(x, n) / max(x, n): the n smallest / largest values, as a sorted list
        collected = exp.Anonymous(this="collect_list",
                                  expressions=[node.this.copy().transform(_stage_to_spark)])
        ordered = exp.Anonymous(this="sort_array", expressions=[
            collected, exp.Boolean(this=isinstance(node, exp.Min))])
        return exp.Anonymous(this="slice", expressions=[
            ordered, exp.Literal.number(1), node.args["count"].copy()])
    if isinstance(node, exp.Filter) and isinstance(node.this, exp.ArrayAgg):
        return _ordered_list(node.this, node.expression)
    if isinstance(node, exp.ArrayAgg) and not isinstance(node.parent, exp.Filter):
        return _ordered_list(node)
    return _to_spark(node)


_LEN_RE: Final = re.compile(r"\blen\s*\(", re.IGNORECASE)


@dataclass(frozen=True)
class SparkStatement:
    """One statement of a stage, as Spark SQL: the table it creates and its query."""

    stage: str
    table: str
    sql: str
    #: the statement as written (DuckDB), for the per-run fallback (``per_run_duckdb``)
    duckdb_sql: str = ""
    #: the tables it reads (CTE names left out)
    reads: tuple[str, ...] = ()


def spark_stage(stage: str, text: str | None = None) -> list[SparkStatement]:
    """A stage file's statements as Spark SQL queries, one per created table.

    The stage SQL is written once, in DuckDB's dialect (``reconstruct/sql/``); each
    ``CREATE [OR REPLACE] [TEMP] TABLE name AS query`` becomes ``name`` = ``query`` transpiled
    by sqlglot, with ``_stage_to_spark``'s rewrites (ordered ``list()``, ``len`` of a
    list) and without its outer ORDER BY (a table's order means nothing on Spark: the
    comparisons sort). Any other statement raises ``NotImplementedError`` naming it.
    NOTE: ``len(`` is DuckDB's list length in every stage (strings use ``length``).
    """
    import sqlglot
    from sqlglot import exp


    out = []
    for stmt in split_statements(stage_sql(stage) if text is None else text):
        tree = sqlglot.parse_one(_LEN_RE.sub("array_length(", stmt), read="duckdb")
        if not (isinstance(tree, exp.Create) and str(tree.kind).upper() in ("TABLE", "VIEW")
                and isinstance(tree.expression, exp.Query)):
            raise NotImplementedError(f"{stage}: not a CREATE TABLE ... AS query: "
                                      f"{stmt.splitlines()[0][:80]}")
        name = tree.this.name
        query = tree.expression
        if query.args.get("order") is not None and query.args.get("limit") is None:
            query.set("order", None)
        sql = query.transform(_stage_to_spark).sql(dialect="spark")
        ctes = {c.alias_or_name for c in query.find_all(exp.CTE)}
        reads = tuple(sorted({t.name for t in query.find_all(exp.Table)} - ctes))
        out.append(SparkStatement(stage, name, sql, stmt, reads))
    return out


def stage_tables(stages: Sequence[str]) -> tuple[set[str], set[str]]:
    """(tables the stages create, tables their statements read) from the stage files."""
    import sqlglot
    from sqlglot import exp


    created: set[str] = set()
    read: set[str] = set()
    for stage in stages:
        for stmt in split_statements(stage_sql(stage)):
            tree = sqlglot.parse_one(_LEN_RE.sub("array_length(", stmt), read="duckdb")
            if isinstance(tree, exp.Create):
                created.add(tree.this.name)
                tree = tree.expression
            if tree is not None:
                ctes = {c.alias_or_name for c in tree.find_all(exp.CTE)}
                read |= {t.name for t in tree.find_all(exp.Table)} - ctes
    return created, read


# -- the per-run fallback -----------------------------------------------------------------------

def duckdb_arrow_type(typ: pa.DataType) -> pa.DataType:
    """The inverse of ``spark_arrow_type`` for hashes: ``decimal(20, 0)`` back to ``uint64``."""
    if typ == pa.decimal128(20, 0):
        return pa.uint64()
    if pa.types.is_list(typ) or pa.types.is_large_list(typ):
        return pa.list_(pa.field(typ.value_field.name, duckdb_arrow_type(typ.value_type)))
    if pa.types.is_struct(typ):
        return pa.struct([f.with_type(duckdb_arrow_type(f.type)) for f in typ])
    return typ


def _to_duckdb(table: pa.Table) -> pa.Table:
    return table.cast(pa.schema([f.with_type(duckdb_arrow_type(f.type)) for f in table.schema]))


def run_statement_duckdb(st: SparkStatement, tables: dict[str, pa.Table]) -> pa.Table:
    """One stage statement, as written, in DuckDB over ``tables`` (one run's rows, or empty
    tables for the result's schema); the result in Spark's types."""
    import duckdb

    con = duckdb.connect()
    try:
        for name, data in tables.items():
            con.register(f"{name}__in", _to_duckdb(data))
            con.execute(f"CREATE TEMP TABLE {name} AS SELECT * FROM {name}__in")
        con.execute(st.duckdb_sql)
        result = con.table(st.table).to_arrow_table()
    finally:
        con.close()
    return result.cast(spark_arrow_schema(result.schema))


def _pack_task(name: str):
    def pack(table: pa.Table) -> pa.Table:
        rid = table.column("run_id")[0].as_py() if table.num_rows else None
        return pa.Table.from_pylist([{"table": name, "run_id": rid, "part": 0,
                                      "ipc": _ipc(table.schema, table.combine_chunks()
                                                  .to_batches() or [])}], schema=BLOB_SCHEMA)

    return pack


def _statement_task(st: SparkStatement, schemas: dict[str, pa.Schema],
                    shared: dict[str, pa.Table], out_schema: pa.Schema):
    def run(blobs: pa.Table) -> pa.Table:
        tables = {n: s.empty_table() for n, s in schemas.items()} | dict(shared)
        for name, blob in zip(blobs.column("table").to_pylist(), blobs.column("ipc").to_pylist()):
            tables[name] = pa.ipc.open_stream(blob).read_all()
        return run_statement_duckdb(st, tables).cast(out_schema)

    return run


def per_run_duckdb(spark: Any, st: SparkStatement) -> Any:
    """A statement Spark SQL cannot analyse, run on Spark one run at a time, in DuckDB, as
    written: each input table's rows of a run travel as one Arrow blob, grouped by run_id;
    tables without ``run_id`` (constants such as ``kv_checks``) go to every run.

    NOTE: exact because every stage joins on run_id and never mixes runs (core.py).
    """
    from pyspark.sql.pandas.types import to_arrow_schema

    present = [t for t in st.reads if spark.catalog.tableExists(t)]
    schemas = {t: to_arrow_schema(spark.table(t).schema) for t in present}
    shared = {t: spark.table(t).toArrow() for t in present
              if "run_id" not in spark.table(t).columns}
    out_schema = run_statement_duckdb(
        st, {t: s.empty_table() for t, s in schemas.items()} | shared).schema
    packed = None
    for t in present:
        if t in shared:
            continue
        frame = spark.table(t).groupBy("run_id").applyInArrow(_pack_task(t), BLOB_DDL)
        packed = frame if packed is None else packed.unionByName(frame)
    if packed is None:
        raise InputError(f"{st.stage}: {st.table}: reads no per-run table")
    return packed.groupBy("run_id").applyInArrow(
        _statement_task(st, schemas, shared, out_schema), _spark_schema(out_schema))


# -- an audit read from a dataset (explanations) ------------------------------------------------

@dataclass
class DatasetAudit:
    """A fleet dataset opened like an audit (``kvclaims.open``) for readers such as
    ``kvclaims explain``: ``con`` (DuckDB, every table a view, plus the documented views),
    ``runs``, ``tables``, ``manifests``, ``clocks``; only ``run_ids``' rows if given."""

    con: Any
    runs: list[str]
    tables: list[str]
    manifests: dict[str, dict[str, Any]]
    truncations: list[str] = field(default_factory=list)

    @property
    def clocks(self) -> dict[str, Any]:
        """Each run's wall-clock anchor (``kvclaims.contract.clock.clock_anchor``), None without one."""
        return {rid: clock_anchor(m) for rid, m in self.manifests.items()}

    def close(self) -> None:
        """Close the connection."""
        self.con.close()

    def __enter__(self) -> DatasetAudit:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def open_dataset_audit(out: str | Path, run_ids: Sequence[str] | None = None) -> DatasetAudit:
    """Open a fleet dataset (``reconstruct_spark``'s output) as a read-only audit.

    Raises ``InputError`` when ``out`` is not a dataset or a run id is not in it.
    """
    import json

    import duckdb

    root = Path(out)
    if not (root / "manifests").is_dir() or not (root / "events").is_dir():
        raise InputError(f"{root}: not a fleet dataset (no manifests/ and events/ tables)")
    con = duckdb.connect()
    open_dataset_duckdb(root, con)
    held = [r[0] for r in con.execute("SELECT run_id FROM manifests ORDER BY run_id").fetchall()]
    if run_ids:
        missing = sorted(set(run_ids) - set(held))
        if missing:
            con.close()
            raise InputError(f"{root}: no run {missing[0]!r} in the dataset")
        for table in dataset_tables(root):
            # NOTE: the run filter sits under every view, so every reader sees only those runs
            con.execute(f"ALTER VIEW {table} RENAME TO kv_all_{table}")
            wanted = ", ".join("'" + r.replace("'", "''") + "'" for r in run_ids)
            con.execute(f"CREATE VIEW {table} AS SELECT * FROM kv_all_{table} "
                        f"WHERE run_id IN ({wanted})")
        held = sorted(run_ids)
    manifests = {rid: json.loads(text) for rid, text in con.execute(
        "SELECT run_id, manifest_json FROM manifests").fetchall()}
    return DatasetAudit(con, held, dataset_tables(root), manifests)
