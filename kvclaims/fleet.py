"""A fleet's runs on Apache Spark: the single-machine audit, one task per run.

Every table of the audit is keyed by run: labels depend on the order of one run's events and
never on another run, and no later table mixes runs either. So each Spark task opens its
run(s) through the **same** facade as ``kvclaims.open`` (``kvclaims.audit.open_audit``: the
loader's checked read, every reconstruction stage, the ``ts`` columns) and writes every table
the audit shows (``events``, ``manifests``, ``losses``, ``loss_claims``, ``claims``,
``requests``, ``feasibility``, ``findings``, ``conformance``, ``lowering``, and any table a
stage adds) as Parquet partitions (``write_dataset``). No per-run stage runs as Spark SQL;
nothing is shuffled.

Spark SQL runs only where runs meet: the fleet views (``queries/fleet/*.sql``: claims harmed
per tenant per day, capacity by policy, findings by kind), one SQL text each, read over the
dataset by Spark (``open_dataset_spark``) and by DuckDB (``kvclaims.open(OUT)``) alike.

Output layout (one Parquet dataset per table, Hive-partitioned, read alike by DuckDB, Polars
and Spark)::

    OUT/<table>/date=YYYY-MM-DD/run_id=<run>/part-0.parquet

``date`` is the UTC day the run started (from the manifest's wall-clock anchor), or
``unknown`` for runs without a clock. ``run_id`` lives in the path (the reconstructed
tables' files have none; the events' files are the runs' own, which hold one). A run without
rows of a table has no file there.

NOTE: a run is never split: its labels need its events in order. Runs are scheduled largest
first (by events, then bytes on disk), so a giant run starts at once and overlaps with all the
small ones instead of running alone at the end; it is one task and bounds the job's critical
path. Small runs are packed into one task (one audit over several runs: exact, since no stage
mixes runs) so that the audit's fixed cost per opening is paid per task, not per run.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote

import pyarrow as pa
import pyarrow.parquet as pq

from kvclaims import queries
from kvclaims.audit import dataset_tables, open_audit
from kvclaims.contract.clock import clock_anchor
from kvclaims.contract.schema import InputError
from kvclaims.contract.vocabulary import TABLE_NAMES, sql_string
from kvclaims.reconstruct import loader
from kvclaims.reconstruct.core import validate_memory_limit

# The tables every fleet dataset holds (a stage may add more, e.g. ``lowering``: those are
# written too): the events themselves (sealed), the manifests, every reconstructed table.
TABLES_OUT: Final[tuple[str, ...]] = ("events", "manifests", *TABLE_NAMES)

#: The one file each run has in each table (a rerun of a task rewrites the same name).
PART_NAME: Final[str] = "part-0.parquet"

#: Packs of small runs hold about this many events at least and at most (``plan_tasks``).
PACK_MIN_EVENTS: Final[int] = 50_000
PACK_MAX_EVENTS: Final[int] = 2_000_000
#: Tasks per slot the packing aims for (more, smaller tasks even out the slots' loads).
TASKS_PER_SLOT: Final[int] = 4

_DATE_RE: Final = re.compile(r"^\d{4}-\d{2}-\d{2}")


@dataclass(frozen=True)
class FleetRun:
    """One run of the fleet: where it is, its id, its day, its size (events, bytes on disk)."""

    run_id: str
    run_dir: str
    date: str
    bytes_in: int
    events: int = 0


def run_date(manifest: dict[str, Any]) -> str:
    """The UTC day a run started, from its manifest's wall-clock anchor; ``unknown`` without."""

    for key in ("started_utc", "start_utc", "started_at_utc"):
        value = manifest.get(key)
        if isinstance(value, str) and _DATE_RE.match(value):
            return value[:10]
    clock = clock_anchor(manifest)
    return "unknown" if clock is None else clock.utc.strftime("%Y-%m-%d")


def manifest_events(manifest: dict[str, Any]) -> int:
    """Events a run's manifest says its segments hold (0 when it does not say)."""
    segments = manifest.get("segments")
    if isinstance(segments, list):
        counts = [s.get("events") for s in segments if isinstance(s, dict)]
        if counts and all(isinstance(c, int) and not isinstance(c, bool) for c in counts):
            return sum(counts)
    written = manifest.get("events_written")
    return written if isinstance(written, int) and not isinstance(written, bool) else 0


def find_fleet_runs(patterns: Sequence[str | Path]) -> list[FleetRun]:
    """Every run directory the patterns name (run dirs, sweep dirs, shell globs), largest first
    (by events, then bytes on disk).

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
                runs[rid] = FleetRun(rid, str(run_dir), run_date(manifest), size,
                                     manifest_events(manifest))
    if not runs:
        raise InputError("no run directories found")
    return sorted(runs.values(), key=_largest_first)


def _largest_first(run: FleetRun) -> tuple[int, int, str]:
    return (-run.events, -run.bytes_in, run.run_id)


# -- scheduling -----------------------------------------------------------------------------------

def pack_target(runs: Sequence[FleetRun], slots: int) -> int:
    """How many events a pack of small runs holds: the fleet over ``TASKS_PER_SLOT`` tasks per
    slot, but at least half the largest run's events, within
    ``PACK_MIN_EVENTS``..``PACK_MAX_EVENTS``.

    NOTE: each task pays the audit's fixed cost (its SQL statements, its views, its writes)
    once: fewer, larger packs cost less CPU, more of them balance the slots better. A pack
    also pays per-run costs a single run does not (a pack of the largest run's size outlasted
    it), so packs stay at half the largest run.
    """
    total = sum(r.events for r in runs)
    largest = max((r.events for r in runs), default=0)
    share = total // max(1, slots * TASKS_PER_SLOT)
    return max(PACK_MIN_EVENTS, min(PACK_MAX_EVENTS, max(share, largest // 2)))


def plan_tasks(runs: Sequence[FleetRun], slots: int, pack_events: int | None = None
               ) -> list[list[FleetRun]]:
    """The fleet's tasks, largest first: a run of at least ``pack_events`` events (default
    ``pack_target``) is a task of its own; smaller runs are packed, largest first, into tasks
    of up to that many events (first fit).

    NOTE: a run is never split (its labels need its events in order), so the largest run's
    task bounds the job whatever the cluster; it comes first so everything else overlaps it.
    """
    target = pack_events if pack_events is not None else pack_target(runs, slots)
    if target < 1:
        raise InputError(f"pack_events must be at least 1, not {target}")
    tasks: list[list[FleetRun]] = []
    loads: list[int] = []
    for run in sorted(runs, key=_largest_first):
        if run.events >= target:
            tasks.append([run])
            loads.append(target)      # NOTE: full: nothing is packed beside a large run
            continue
        for i, load in enumerate(loads):
            if load + max(run.events, 1) <= target:
                tasks[i].append(run)
                loads[i] += max(run.events, 1)
                break
        else:
            tasks.append([run])
            loads.append(max(run.events, 1))
    return sorted(tasks, key=lambda t: (-sum(r.events for r in t),
                                        -sum(r.bytes_in for r in t), t[0].run_id))


# -- the per-run audit, inside a task -------------------------------------------------------------

def partition_dir(table_dir: Path, date: str, run_id: str) -> Path:
    """Where one run's rows of a table lie: Hive partitions, each value percent-encoded as
    DuckDB's ``COPY ... PARTITION_BY`` writes it (every byte but ``A-Za-z0-9-._~``); DuckDB
    and Spark read the value back."""
    return table_dir / f"date={quote(date, safe='')}" / f"run_id={quote(run_id, safe='')}"


def write_table_partitions(con: Any, table: str, runs: Sequence[FleetRun],
                           table_dir: Path) -> dict[str, int]:
    """Write one table of an audit's connection as ``table_dir/date=…/run_id=…/part-0.parquet``
    (zstd; ``date`` and ``run_id`` in the path, not in the files), one partition per run that
    has rows; returns the rows per run.

    A run without rows has no file (readers see no rows for it either way); only when none of
    ``runs`` has a row is one empty file written (the first run's), so the table's folder
    always holds its schema.

    NOTE: one DuckDB ``COPY ... PARTITION_BY`` per table, streamed, not one query per run and
    table (a query's fixed cost times runs x tables was most of a task's time); a task that
    runs again rewrites the same names (``OVERWRITE_OR_IGNORE``). Each file costs a few ms of
    CPU (Parquet metadata, column writers), hence none for an empty partition. Needs
    ``kv_fleet_dates``.
    """
    rows = dict(con.execute(f"SELECT run_id, count(*) FROM {table} GROUP BY run_id").fetchall())
    table_dir.mkdir(parents=True, exist_ok=True)
    with_rows = [r for r in runs if rows.get(r.run_id, 0)]
    if len(with_rows) <= 1:
        # NOTE: one run (or none: the empty file that holds the schema): a plain COPY into its
        # partition (a partitioned write costs twice as much CPU)
        run = with_rows[0] if with_rows else runs[0]
        target = partition_dir(table_dir, run.date, run.run_id)
        target.mkdir(parents=True, exist_ok=True)
        con.execute(f"COPY (SELECT * EXCLUDE (run_id) FROM {table} WHERE run_id = "
                    f"{sql_string(run.run_id)}) TO {sql_string(str(target / PART_NAME))} "
                    "(FORMAT parquet, COMPRESSION zstd)")
    else:
        con.execute(f"""
            COPY (SELECT t.*, d.date FROM {table} t JOIN kv_fleet_dates d ON d.run_id = t.run_id)
            TO {sql_string(str(table_dir))}
            (FORMAT parquet, COMPRESSION zstd, PARTITION_BY (date, run_id), OVERWRITE_OR_IGNORE,
             FILENAME_PATTERN 'part-{{i}}')""")
    return {run.run_id: rows.get(run.run_id, 0) for run in runs}


def copy_event_partitions(audit: Any, runs: Sequence[FleetRun], table_dir: Path
                          ) -> dict[str, int]:
    """Write the ``events`` table: each run's events file as the audit read it (its sealed
    ``events.parquet``, or the copy the read made) copied byte for byte into its partition;
    returns the rows per run.

    NOTE: a copy, not a re-encoding: writing the events again was a third of a task's CPU.
    The file keeps its own ``run_id`` column (the path's value is the one readers give) and
    has no ``ts``: ``kvclaims.open`` over the dataset adds it, as it does over run
    directories. A run without events has no file; a task with none writes one empty file.
    """
    rows = dict(audit.con.execute(
        "SELECT run_id, count(*) FROM events GROUP BY run_id").fetchall())
    written = 0
    for run in runs:
        source = audit.event_files.get(run.run_id)
        if source is None or not rows.get(run.run_id, 0):
            continue
        target = partition_dir(table_dir, run.date, run.run_id)
        target.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target / PART_NAME)
        written += 1
    if not written:
        target = partition_dir(table_dir, runs[0].date, runs[0].run_id)
        target.mkdir(parents=True, exist_ok=True)
        pq.write_table(loader.EVENTS_SCHEMA.empty_table(), target / PART_NAME,
                       compression="zstd")
    return {run.run_id: rows.get(run.run_id, 0) for run in runs}


def write_dataset(audit: Any, runs: Sequence[FleetRun], out: Path) -> dict[str, dict[str, int]]:
    """Write every table ``audit`` shows into the dataset ``out``, one partition per run
    (``copy_event_partitions`` for ``events``, ``write_table_partitions`` for the others);
    returns the rows written per run and table."""
    rows: dict[str, dict[str, int]] = {r.run_id: {} for r in runs}
    dates = pa.table({"run_id": [r.run_id for r in runs], "date": [r.date for r in runs]})
    audit.con.register("kv_fleet_dates_in", dates)
    audit.con.execute("CREATE OR REPLACE TEMP TABLE kv_fleet_dates AS "
                      "SELECT * FROM kv_fleet_dates_in")
    audit.con.unregister("kv_fleet_dates_in")
    for table in audit.tables:
        if "run_id" not in audit.con.table(table).columns:
            raise InputError(f"{table}: the audit's table has no run_id column")
        if table == "events":
            written = copy_event_partitions(audit, runs, out / table)
        else:
            written = write_table_partitions(audit.con, table, runs, out / table)
        for rid, n in written.items():
            rows[rid][table] = n
    return rows


def audit_runs(runs: Sequence[FleetRun], out: str | Path, *, memory_limit: str = "1GB",
               threads: int | None = 1, cpu: dict[str, float] | None = None
               ) -> dict[str, dict[str, int]]:
    """Audit ``runs`` exactly as ``kvclaims.open`` does (one audit over them: no stage mixes
    runs; the ``ts`` columns, not the views: nothing here reads them) and write every table
    it shows (``write_dataset``); returns the rows written per run and table. ``cpu``, if
    given, gets this process's CPU seconds in the audit (``audit``) and the writes
    (``write``).

    Raises ``InputError`` (one line) when a run cannot be read.
    """

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    c0 = time.process_time()
    with open_audit([r.run_dir for r in runs], memory_limit=memory_limit, threads=threads,
                    reuse=False, lock=False, views=False, utc=True) as audit:
        missing = sorted({r.run_id for r in runs} - set(audit.runs))
        if missing:
            raise InputError(f"run {missing[0]!r} is not in the audit of its directory")
        c1 = time.process_time()
        rows = write_dataset(audit, runs, out)
    if cpu is not None:
        cpu["audit"] = cpu.get("audit", 0.0) + c1 - c0
        cpu["write"] = cpu.get("write", 0.0) + time.process_time() - c1
    return rows


def run_task(task: tuple[int, list[dict[str, Any]]], out: str, memory_limit: str = "1GB",
             threads: int | None = 1) -> list[dict[str, Any]]:
    """What each Spark task runs: audit its runs (``audit_runs``) and return one status row
    per run (``kind`` ``run``: events, losses, error) and one for the task (``kind``
    ``task``: its runs, events, when it started (epoch seconds), wall and CPU seconds of this
    worker, the CPU seconds in the audit and in the writes).

    A pack that fails on a bad run is audited again one run at a time, so only that run is
    reported as failed (its one-line error); the fleet goes on.
    """
    index, items = task
    runs = [FleetRun(**item) for item in items]
    started = time.time()
    t0, c0 = time.perf_counter(), time.process_time()
    split: dict[str, float] = {}
    statuses = _audit_or_split(runs, out, memory_limit, threads, split)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    for s in statuses:
        s["task"] = index
    statuses.append({"kind": "task", "task": index, "runs": len(runs),
                     "run_ids": [r.run_id for r in runs],
                     "events": sum(s["events"] for s in statuses),
                     "started": started, "seconds": wall, "cpu_seconds": cpu,
                     "audit_cpu_seconds": split.get("audit", 0.0),
                     "write_cpu_seconds": split.get("write", 0.0), "pid": os.getpid()})
    return statuses


def _audit_or_split(runs: list[FleetRun], out: str, memory_limit: str,
                    threads: int | None, cpu: dict[str, float]) -> list[dict[str, Any]]:
    def status(run: FleetRun, error: str | None = None,
               rows: dict[str, int] | None = None) -> dict[str, Any]:
        rows = rows or {}
        return {"kind": "run", "run_id": run.run_id, "date": run.date,
                "bytes_in": run.bytes_in, "events": rows.get("events", 0),
                "losses": rows.get("losses", 0), "tables": len(rows), "error": error}

    try:
        written = audit_runs(runs, out, memory_limit=memory_limit, threads=threads, cpu=cpu)
    except InputError as exc:
        if len(runs) == 1:
            return [status(runs[0], error=str(exc))]
        return [s for run in runs
                for s in _audit_or_split([run], out, memory_limit, threads, cpu)]
    return [status(run, rows=written[run.run_id]) for run in runs]


# -- the driver -----------------------------------------------------------------------------------

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
               # the fleet views' aggregations are small: few shuffle partitions (a cluster
               # sets its own: KVCLAIMS_SPARK_SHUFFLE_PARTITIONS)
               .config("spark.sql.shuffle.partitions",
                       os.environ.get("KVCLAIMS_SPARK_SHUFFLE_PARTITIONS", "4"))
               .config("spark.sql.adaptive.enabled", "true"))
    if (master or "local").startswith("local"):
        # NOTE: in local mode the driver's JVM is the executor too; no table passes through
        # it (tasks write their Parquet themselves), so it stays small
        builder = (builder.config("spark.driver.memory",
                                  os.environ.get("KVCLAIMS_SPARK_DRIVER_MEMORY", "1g"))
                   .config("spark.driver.bindAddress", "127.0.0.1")
                   .config("spark.driver.host", "127.0.0.1")
                   .config("spark.ui.host", "127.0.0.1"))
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


@dataclass
class FleetResult:
    """What a fleet reconstruction did: the dataset, one status row per run and per task (in
    the order they were scheduled), the wall time."""

    out: Path
    runs: list[dict[str, Any]]
    seconds: float
    tasks: list[dict[str, Any]] = field(default_factory=list)

    @property
    def events(self) -> int:
        """Events reconstructed over every run."""
        return sum(r["events"] for r in self.runs)

    @property
    def errors(self) -> list[dict[str, Any]]:
        """Runs that could not be reconstructed (each with its one-line reason)."""
        return [r for r in self.runs if r["error"]]

    @property
    def critical_task(self) -> dict[str, Any] | None:
        """The longest task: no cluster finishes the job sooner (a giant run's, or a pack of
        runs that cost more per event)."""
        return max(self.tasks, key=lambda t: t["seconds"], default=None)


#: The job group of the per-run audit (Spark's status API tells its stages from the views').
AUDIT_JOB_GROUP: Final[str] = "kvclaims-fleet-audit"


def reconstruct_spark(patterns: Sequence[str | Path], out: str | Path, *, spark: Any = None,
                      master: str | None = None, memory_limit: str = "1GB",
                      progress: Callable[[str], None] | None = None,
                      pack_events: int | None = None) -> FleetResult:
    """Audit every run the patterns name on Spark into the dataset ``out``.

    One Spark task per run (small runs packed, ``plan_tasks``), largest first; each runs
    ``audit_runs`` (the single-machine audit) and writes its runs' partitions of every table.
    ``progress`` is told the plan and the end.
    """

    memory_limit = validate_memory_limit(memory_limit)  # in the driver, before any task
    runs = find_fleet_runs(patterns)
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise InputError(f"{out}: output dataset directory is not empty")
    out.mkdir(parents=True, exist_ok=True)
    spark = spark or spark_session(master)
    say = progress or (lambda _msg: None)
    sc = spark.sparkContext
    tasks = plan_tasks(runs, sc.defaultParallelism, pack_events)
    say(f"audit: {len(runs)} run(s) in {len(tasks)} task(s), largest first")
    t0 = time.perf_counter()
    items = [(i, [asdict(r) for r in task]) for i, task in enumerate(tasks)]
    # NOTE: one partition per task, in the planned order: Spark hands a stage's tasks out in
    # partition order, so the largest starts first
    sc.setJobGroup(AUDIT_JOB_GROUP, "kvclaims: the per-run audit, one task per run")
    try:
        target = str(out.resolve())
        statuses = [s for part in sc.parallelize(items, numSlices=len(items)).map(
            lambda task: run_task(task, target, memory_limit)).collect() for s in part]
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    seconds = time.perf_counter() - t0
    say("audit: done")
    runs_out = sorted((s for s in statuses if s["kind"] == "run"), key=lambda s: s["run_id"])
    tasks_out = sorted((s for s in statuses if s["kind"] == "task"), key=lambda s: s["task"])
    return FleetResult(out, runs_out, seconds, tasks_out)


# -- reading a fleet dataset back -----------------------------------------------------------------

def open_dataset_spark(spark: Any, out: str | Path) -> list[str]:
    """Register each table of a fleet dataset and every fleet view on a Spark session; return
    the fleet views' names.

    NOTE: only the fleet views run on Spark: the per-run views are DuckDB SQL over one audit
    (``kvclaims.open`` serves them over the dataset). ``events`` has no ``ts`` here (the
    runs' sealed files); every other table has it.
    """

    for table in dataset_tables(out):
        # NOTE: Spark unescapes the run ids in the partition paths; a run's events are its
        # sealed file, maybe of an older schema: merged by name (the other tables are all
        # written by one code)
        reader = spark.read.option("mergeSchema", "true") if table == "events" else spark.read
        reader.parquet(str(Path(out) / table)).drop("date").createOrReplaceTempView(table)
    for view in queries.FLEET_VIEWS:
        spark.sql(queries.fleet_sql_text(view))
    return list(queries.FLEET_VIEWS)
