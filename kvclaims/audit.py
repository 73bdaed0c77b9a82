"""The one audit facade: paths in, a locked-down DuckDB audit out.

    import kvclaims
    audit = kvclaims.open(["traces/multi_tenant"])           # run dirs, sweeps, globs, .jsonl
    fleet = kvclaims.open("fleet/")                          # or a fleet dataset (docs/fleet.md)
    audit.sql("SELECT label, count(*) FROM losses GROUP BY label").pl()
    audit.table("claims").df()
    audit.view("claim_outcomes").pl()

Every consumer (the CLI, ``record``/``sweep`` rows, the dashboard, the Python API) goes through
``open``: the events are streamed batch by batch into a temporary on-disk DuckDB database
(bounded memory: DuckDB spills beyond ``memory_limit``), reconstructed (or the up-to-date
``RUN_DIR/reconstructed/*.parquet`` are reused), every reconstructed table that has ``ts_ns``
gains ``ts`` (UTC, from the manifest's wall-clock anchor; NULL when the run has no clock), the
documented views (``queries/*.sql``) are created, and then the connection is locked down:
external access disabled, configuration locked. User SQL is one read-only SELECT
(``check_read_only``). The reference is docs/sql.md.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Final

import duckdb
import pyarrow as pa

from kvclaims import queries
from kvclaims.contract.clock import Clock, clock_anchor, clock_table
from kvclaims.contract.schema import InputError
from kvclaims.contract.vocabulary import TABLE_NAMES, sql_string
from kvclaims.contract.trace_writer import MANIFEST_NAME, file_sha256
from kvclaims.reconstruct import core, loader
from kvclaims.reconstruct.core import Tables, write_tables
from kvclaims.reconstruct.loader import Trace, open_run, read_small_file

#: Where ``kvclaims reconstruct`` writes a run's tables, and the stamp that says what from.
RECONSTRUCTED_DIR: Final[str] = "reconstructed"
STAMP_NAME: Final[str] = "_kvclaims_stamp.json"
_RAW: Final[str] = "kv_raw_"   # a table's own name once its ts-bearing view takes its name


class SQLRefused(InputError):
    """User SQL that the read-only audit refuses (one clear line)."""


# -- read-only SQL ------------------------------------------------------------------------------

def check_read_only(sql: str) -> str:
    """Return ``sql`` if it is exactly one SELECT statement; else raise ``SQLRefused``.

    NOTE: this is the first of two locks: the connection itself has external access disabled
    and its configuration locked, so even a SELECT cannot read or write files.
    """
    if not isinstance(sql, str) or not sql.strip():
        raise SQLRefused("refused: no SQL statement given")
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise InputError(f"SQL error: {_first_line(exc)}") from None
    if len(statements) != 1:
        raise SQLRefused(f"refused: {len(statements)} statements; give exactly one read-only "
                         "SELECT")
    kind = statements[0].type
    if kind != duckdb.StatementType.SELECT:
        name = getattr(kind, "name", str(kind))
        raise SQLRefused(f"refused: {name} statements are not allowed; the audit is read-only "
                         "(one SELECT over its tables and views)")
    return sql


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _sql_error(exc: BaseException) -> InputError:
    """A DuckDB error as one line; file access is a refusal, not a bug."""
    if isinstance(exc, duckdb.PermissionException):
        return SQLRefused("refused: the audit cannot read or write files, attach databases or "
                          "load extensions; query its tables and views")
    return InputError(f"SQL error: {_first_line(exc)}")


def lock_down(con: Any, allowed_paths: Sequence[str] = (),
              allowed_directories: Sequence[str] = ()) -> None:
    """No file access, no extensions, no replacement scans of Python variables, and no later
    change to any of that (``lock_configuration``).

    ``allowed_paths``: files DuckDB may still read (the Parquet files under the ``events``
    view, which it scans for each query); ``allowed_directories``: folders it may read
    (a fleet dataset, whose views scan its tables' folders); everything else is refused.
    """
    if allowed_paths:
        con.execute("SET allowed_paths = ?", [list(allowed_paths)])
    if allowed_directories:
        con.execute("SET allowed_directories = ?", [list(allowed_directories)])
    for setting in ("python_enable_replacements", "autoinstall_known_extensions",
                    "autoload_known_extensions", "enable_external_access"):
        con.execute(f"SET {setting} = false")
    con.execute("SET lock_configuration = true")


# -- inputs -------------------------------------------------------------------------------------

def expand_paths(paths: Sequence[str | Path] | str | Path) -> list[Path]:
    """Paths as given, globs expanded (sorted); a glob that matches nothing is an error."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    out: list[Path] = []
    for p in paths:
        text = str(p)
        if not Path(text).exists() and glob.has_magic(text):
            hits = sorted(glob.glob(text))
            if not hits:
                raise InputError(f"{text}: no file or directory matches")
            out += [Path(h) for h in hits]
        else:
            if not Path(text).exists():
                raise InputError(f"{text}: no such file or directory")
            out.append(Path(text))
    if not out:
        raise InputError("no run directories given")
    return out


def _code_version() -> str:
    """A hash of everything that decides the reconstructed tables (stage SQL, the Python
    that drives it, the vocabulary): a stamp written by other code is never trusted."""
    h = hashlib.sha256()
    for package, pattern in (("kvclaims.reconstruct", "*.py"),
                             ("kvclaims.reconstruct", "sql/*.sql"),
                             ("kvclaims.contract", "*.py")):
        root = Path(str(resources.files(package)))
        for f in sorted(root.glob(pattern)):
            h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def _fingerprint(run: Any) -> dict[str, Any]:
    """What a run directory holds now (manifest bytes, each segment's size and mtime)."""

    manifest = read_small_file(run.path / MANIFEST_NAME, 64 * 1024 * 1024, "manifest")
    return {"manifest_sha256": hashlib.sha256(manifest).hexdigest(),
            "segments": [[s.name, s.stat().st_size, s.stat().st_mtime_ns]
                         for s in run.segments]}


def _fresh_tables(runs: Sequence[Any], code: str) -> list[str] | None:
    """The table names every run's ``reconstructed/`` holds for exactly its current inputs and
    this code, or None when any run must be reconstructed."""
    names: list[str] | None = None
    for run in runs:
        stamp_path = run.path / RECONSTRUCTED_DIR / STAMP_NAME
        try:
            stamp = json.loads(read_small_file(stamp_path, 1024 * 1024, "stamp"))
        except (OSError, ValueError, InputError):   # NOTE: a FIFO too: rebuild, never wait
            return None
        if (not isinstance(stamp, dict) or stamp.get("code") != code
                or stamp.get("inputs") != _fingerprint(run) or stamp.get("run_id") != run.run_id):
            return None
        tables = stamp.get("tables")
        if not isinstance(tables, list) or (names is not None and tables != names):
            return None
        if not all(isinstance(t, str) and t.isidentifier() for t in tables):
            return None
        if stamp.get("sha256") != _table_digests(run.path / RECONSTRUCTED_DIR, tables):
            return None   # NOTE: a changed byte anywhere (a footer statistic too): rebuild
        names = tables
    return names


def _table_digests(folder: Path, tables: Sequence[str]) -> dict[str, str] | None:
    """SHA-256 of each ``<table>.parquet`` in ``folder`` (None if any is missing, not a
    regular file or unreadable): the stamp records them, reuse verifies them."""
    out = {}
    for t in tables:
        try:
            out[t] = file_sha256(folder / f"{t}.parquet")[0]
        except OSError:
            return None
    return out


# -- fleet datasets -----------------------------------------------------------------------------

#: The tables every fleet dataset holds (``kvclaims.fleet`` writes them; ``open`` knows a
#: dataset by them).
DATASET_REQUIRED: Final[tuple[str, ...]] = ("events", "manifests")


def is_dataset(path: str | Path) -> bool:
    """Whether ``path`` is a fleet dataset (``kvclaims reconstruct --engine spark --out``):
    a folder per table, ``events/`` and ``manifests/`` among them, and no run directory."""
    p = Path(path)
    return (p.is_dir() and all((p / t).is_dir() for t in DATASET_REQUIRED)
            and not loader.is_run_dir(p))


def dataset_tables(out: str | Path) -> list[str]:
    """The tables a fleet dataset holds (one folder each)."""
    return sorted(p.name for p in Path(out).iterdir()
                  if p.is_dir() and not p.name.startswith(("_", ".")))


def dataset_glob(out: str | Path, table: str) -> str:
    """The Parquet files of one table of a dataset."""
    return str(Path(out) / table / "*" / "*" / "*.parquet")


def _dataset_source(out: Path, table: str) -> str:
    """DuckDB's scan of one table of a dataset: every partition's files by column name (a run
    sealed by an older schema lacks newer columns), ``run_id`` from the path (it wins over a
    copy inside the file: the sealed events hold one)."""
    path = dataset_glob(out, table).replace("'", "''")
    return (f"(SELECT * EXCLUDE (date) FROM read_parquet('{path}', hive_partitioning = true, "
            "union_by_name = true, hive_types = {'date': VARCHAR, 'run_id': VARCHAR}))")


# -- the audit ----------------------------------------------------------------------------------

@dataclass
class Audit:
    """An opened audit: the events, the reconstructed tables and the documented views in one
    read-only DuckDB connection. Close it (or use ``with``) to remove its temporary database
    now; otherwise it goes when the connection and every relation from it are gone.
    """

    con: Any
    runs: list[str]
    manifests: dict[str, dict[str, Any]]
    run_dirs: dict[str, Path] = field(default_factory=dict)
    truncations: list[str] = field(default_factory=list)
    truncated_runs: set[str] = field(default_factory=set)
    tables: list[str] = field(default_factory=list)
    views: list[str] = field(default_factory=list)
    reused: bool = False
    locked: bool = False
    #: the fleet dataset the audit reads (None: run directories or traces)
    dataset: Path | None = None
    #: each run's events as one Parquet file in seq order (what ``events`` scans: the sealed
    #: ``events.parquet``, or the copy made during the read); none for a dataset
    event_files: dict[str, Path] = field(default_factory=dict)
    # NOTE: removes the temporary database once the connection is gone: relations keep the
    # connection alive, so kvclaims.open(p).sql(...).pl() works on a dropped Audit
    _cleanup: Any = field(default=None, repr=False)

    # -- relations ---------------------------------------------------------------------------

    def sql(self, text: str) -> Any:
        """One read-only SELECT over the audit, as a DuckDB relation (``.pl()``, ``.df()``,
        ``.fetchall()``). Anything else raises ``SQLRefused``; a bad query ``InputError``."""
        check_read_only(text)
        try:
            return self.con.sql(text)
        except duckdb.Error as exc:
            raise _sql_error(exc) from None

    def table(self, name: str) -> Any:
        """A table (``events``, ``manifests``, a reconstructed table) as a DuckDB relation."""
        if name not in self.tables:
            raise InputError(f"unknown table {name!r}; tables: {', '.join(self.tables)}")
        return self.con.table(name)

    def view(self, name: str) -> Any:
        """A documented view (``queries/*.sql``) as a DuckDB relation."""
        if name not in self.views:
            raise InputError(f"unknown view {name!r}; views: {', '.join(self.views)}")
        return self.con.view(name) if hasattr(self.con, "view") else self.con.table(name)

    def relation(self, name: str) -> Any:
        """A table or a view by name."""
        if name in self.views:
            return self.view(name)
        if name in self.tables:
            return self.table(name)
        raise InputError(f"unknown table or view {name!r}; see 'kvclaims query --list'")

    def has_column(self, name: str, column: str) -> bool:
        """Whether table or view ``name`` has ``column`` (the schema is being extended)."""
        return column in self.relation(name).columns

    @property
    def clocks(self) -> dict[str, Clock | None]:
        """Each run's wall-clock anchor (None: the run has no clock, ``ts`` is NULL)."""
        return {rid: clock_anchor(self.manifests.get(rid, {})) for rid in self.runs}

    # -- output ------------------------------------------------------------------------------

    def write(self, out_dir: str | Path, run_id: str | None = None) -> list[Path]:
        """Write the reconstructed tables as ``OUT_DIR/<table>.parquet`` (``run_id``'s rows
        only if given), without the derived ``ts`` column."""

        self._refuse_on_dataset("write")
        names = self._reconstructed()
        raw = write_tables(self.con, [_RAW + n if self._wrapped(n) else n for n in names],
                           out_dir, run_id=run_id)
        out = []
        for name, path in zip(names, raw):
            final = path.with_name(f"{name}.parquet")
            if final != path:
                path.replace(final)
            out.append(final)
        return out

    def write_reconstructed(self) -> dict[str, Path]:
        """Write each run's tables to ``RUN_DIR/reconstructed/`` with the stamp that lets a
        later ``open`` reuse them; returns where each run went."""

        self._refuse_on_dataset("write_reconstructed")
        code = _code_version()
        written = {}
        for rid in self.runs:
            run_dir = self.run_dirs.get(rid)
            if run_dir is None:
                continue
            out = run_dir / RECONSTRUCTED_DIR
            self.write(out, run_id=rid)
            tables = self._reconstructed()
            stamp = {"run_id": rid, "code": code, "inputs": _fingerprint(open_run(run_dir)),
                     "tables": tables, "sha256": _table_digests(out, tables)}
            (out / STAMP_NAME).write_text(json.dumps(stamp, indent=1) + "\n", encoding="utf-8")
            written[rid] = out
        return written

    def summary(self) -> list[dict[str, Any]]:
        """Per run: events, loss counts by label, claim, request outcomes, findings (needs
        the reconstruction's run facts: an audit opened with ``reuse=False``)."""

        self._refuse_on_dataset("summary")
        return Tables(self.con, self.runs).summary()

    # -- lifetime ----------------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection and remove the temporary database (relations from this audit
        stop working)."""
        try:
            self.con.close()
        except duckdb.Error:
            pass   # NOTE: interrupted mid-query ("busy"): the folder goes all the same
        finally:
            if self._cleanup is not None:
                self._cleanup()

    def __enter__(self) -> Audit:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- internals ---------------------------------------------------------------------------

    def _refuse_on_dataset(self, what: str) -> None:
        # NOTE: a dataset holds the tables, not the reconstruction's run facts or run dirs
        if self.dataset is not None:
            raise InputError(f"{what}: not for a fleet dataset ({self.dataset}): its tables "
                             "are written already; open the run directories for this")

    def _wrapped(self, name: str) -> bool:
        return _RAW + name in _relations(self.con)

    def _reconstructed(self) -> list[str]:
        return [t for t in self.tables if t not in ("events", "manifests")]


def open_audit(paths: Sequence[str | Path] | str | Path, *, memory_limit: str | None = None,
               progress: Callable[[str], None] | None = None,
               temp_directory: str | Path | None = None, threads: int | None = None,
               reuse: bool = True, lock: bool = True, views: bool = True,
               utc: bool | None = None, runs: Sequence[str] | None = None) -> Audit:
    """Open run directories, sweep directories, globs or JSON Lines traces, or one fleet
    dataset (``kvclaims.fleet``; ``runs``: only these run ids of it), as one ``Audit``.

    Reads every run once, checked (``events`` is then a view over the runs' Parquet files: a
    sealed ``events.parquet`` where it was read whole, else a copy made during the read),
    reconstructs them in a temporary on-disk DuckDB database (memory bounded by
    ``memory_limit``, e.g. ``"2GB"``; DuckDB spills to ``temp_directory`` beyond it; from
    ``reconstruct.core.COMPACT_EVENTS`` events on, its tables are compressed in the database
    file) (or reuses every run's up-to-date ``reconstructed/*.parquet`` when ``reuse``), adds
    ``ts`` (UTC) to every table with ``ts_ns``, creates the documented views and locks the
    connection down (``lock``). ``views=False`` leaves the bare reconstruction (no ``ts``, no
    views: benchmarks and table-for-table comparisons). ``progress`` is told ``read``, each
    stage's name, and ``views``. ``utc`` adds the ``ts`` columns without the views (default: with
    them). Bad input raises ``InputError`` (one line, naming the file).

    A fleet dataset's tables are views over its Parquet files (nothing is reconstructed);
    ``events`` gains ``ts`` there (its files are the runs' sealed events), the other tables
    hold it already; the views are the documented ones and the fleet views
    (``queries/fleet/*.sql``). ``write``, ``write_reconstructed`` and ``summary`` need run
    directories and say so.
    """
    given = expand_paths(paths)
    datasets = [p for p in given if is_dataset(p)]
    if datasets:
        if len(given) > 1:
            raise InputError(f"{datasets[0]}: a fleet dataset is opened alone, not with other "
                             "paths")
        return _open_dataset(datasets[0], runs=runs, memory_limit=memory_limit,
                             temp_directory=temp_directory, threads=threads, lock=lock,
                             views=views, progress=progress)
    if runs is not None:
        raise InputError("runs= picks runs of a fleet dataset; for run directories name "
                         "the directories")
    jsonl = [p for p in given if p.is_file() and p.suffix == ".jsonl"]
    dirs = [p for p in given if p not in jsonl]
    opened = loader.open_runs(dirs) if dirs else []
    info = core.StreamedInput({}, {}, [], set())
    con, tmp = core.open_database(memory_limit=memory_limit, temp_directory=temp_directory,
                                  threads=threads)
    audit: Audit | None = None
    try:
        events = core.load_jsonl(jsonl) if jsonl else None
        if events is not None:
            _check_unique_runs(events, opened)
        folder = os.path.join(tmp, "events")
        files, n = core.stage_events(opened, info, folder, extra=events)
        if events is not None:
            for rid in events.column("run_id").unique().to_pylist():
                info.manifests.setdefault(rid, {"run_id": rid, "source": "jsonl"})
        allowed = core.expose_events(con, files, folder)
        if progress is not None:
            progress("read")
        if n == 0 and not info.manifests:
            raise InputError("no events to reconstruct")
        fresh = _fresh_tables(opened, _code_version()) if reuse and opened and not jsonl else None
        if fresh is not None:
            for name in fresh:
                stored = [str(r.path / RECONSTRUCTED_DIR / f"{name}.parquet") for r in opened]
                con.execute(f"CREATE TEMP TABLE {name} AS SELECT * FROM read_parquet(?, "
                            "union_by_name = true)", [stored])
            if progress is not None:
                progress("reused reconstructed/")
        else:
            # NOTE: a large input keeps its tables compressed in the database file
            # (core.COMPACT_EVENTS): as TEMP tables they would spill uncompressed
            core.run_stages(con, manifests=info.manifests, truncated_runs=info.truncated_runs,
                            progress=progress, persist=n >= core.COMPACT_EVENTS,
                            sources=files, folder=os.path.join(tmp, "tables"))
        _register_manifests(con, info)
        tables = _add_utc(con) if (views if utc is None else utc) else _shown(con)

        view_names = queries.apply(con) if views else []
        if progress is not None:
            progress("views")
        audit = Audit(con=con, runs=sorted(info.manifests), manifests=dict(info.manifests),
                      run_dirs=dict(info.run_dirs), truncations=list(info.truncations),
                      truncated_runs=set(info.truncated_runs), tables=tables, views=view_names,
                      reused=fresh is not None, event_files=dict(files),
                      _cleanup=weakref.finalize(con, shutil.rmtree, tmp, True))
        if lock:
            # NOTE: the streamed passes' tables are views over files of the audit's folder
            lock_down(con, allowed_paths=allowed,
                      allowed_directories=[os.path.join(tmp, "tables") + os.sep])
            audit.locked = True
        return audit
    except duckdb.Error as exc:
        if audit is None:
            core.drop_database(con, tmp)
        raise InputError(f"cannot reconstruct: {_first_line(exc)}") from None
    except BaseException:
        if audit is None:
            core.drop_database(con, tmp)
        raise


def _open_dataset(root: Path, *, runs: Sequence[str] | None, memory_limit: str | None,
                  temp_directory: str | Path | None, threads: int | None, lock: bool,
                  views: bool, progress: Callable[[str], None] | None) -> Audit:
    """A fleet dataset as an ``Audit`` (``open_audit``): each table a view over its Parquet
    files (only ``runs``' partitions if given), ``ts`` added where a table lacks it, the
    documented and fleet views, locked down to reading the dataset."""
    # NOTE: the views scan by absolute path (a later chdir changes nothing); a folder name
    # DuckDB would read as a glob pattern is refused rather than misread
    base = root.resolve()
    if any(c in core.GLOB_CHARS for c in str(base)):
        raise InputError(f"{root}: a fleet dataset's path cannot hold any of "
                         f"{''.join(sorted(core.GLOB_CHARS))}")
    con, tmp = core.open_database(memory_limit=memory_limit, temp_directory=temp_directory,
                                  threads=threads)
    try:
        present = dataset_tables(base)
        for table in present:
            if not table.isidentifier():
                raise InputError(f"{root / table}: not a table name")
            where = f" WHERE run_id IN ({', '.join(map(sql_string, runs))})" if runs else ""
            con.execute(f"CREATE TEMP VIEW {table} AS SELECT * FROM "
                        f"{_dataset_source(base, table)}{where}")
        manifests = {rid: json.loads(text) for rid, text in con.execute(
            "SELECT run_id, manifest_json FROM manifests").fetchall()}
        missing = sorted(set(runs or ()) - set(manifests))
        if missing:
            raise InputError(f"{root}: no run {missing[0]!r} in the dataset")
        truncated = {r[0] for r in con.execute(
            "SELECT run_id FROM manifests WHERE truncated").fetchall()}
        _register_clock(con, manifests)
        if progress is not None:
            progress("read")
        tables = _add_utc(con, _order_shown(present)) if views else _order_shown(present)
        view_names = (queries.apply(con) + queries.apply_fleet(con)) if views else []
        if progress is not None:
            progress("views")
    except duckdb.Error as exc:
        core.drop_database(con, tmp)
        raise InputError(f"{root}: cannot read the fleet dataset: {_first_line(exc)}") from None
    except BaseException:
        core.drop_database(con, tmp)
        raise
    audit = Audit(con=con, runs=sorted(manifests), manifests=manifests,
                  truncated_runs=truncated, tables=tables, views=view_names,
                  dataset=root, _cleanup=weakref.finalize(con, shutil.rmtree, tmp, True))
    if lock:
        lock_down(con, allowed_directories=[str(base) + os.sep])
        audit.locked = True
    return audit


def _check_unique_runs(events: Any, runs: Sequence[Any]) -> None:
    dirs = {run.run_id: run.path for run in runs}
    for rid in events.column("run_id").unique().to_pylist():
        if rid in dirs:
            raise InputError(f"run_id {rid!r} is both in a .jsonl trace and in {dirs[rid]}")


def _register_manifests(con: Any, info: Any) -> None:
    trace = Trace(events=pa.table({}), manifests=info.manifests, run_dirs=info.run_dirs,
                  truncations=info.truncations, truncated_runs=info.truncated_runs)
    con.register("kv_manifests_in", trace.manifests_table())
    con.execute("CREATE OR REPLACE TEMP TABLE manifests AS SELECT * FROM kv_manifests_in")
    con.unregister("kv_manifests_in")
    _register_clock(con, info.manifests)


def _register_clock(con: Any, manifests: dict[str, dict[str, Any]]) -> None:
    """``kv_clock``: each run's wall-clock anchor, what ``ts`` is computed from."""
    con.register("kv_clock_in", clock_table(manifests))
    con.execute("CREATE OR REPLACE TEMP TABLE kv_clock AS SELECT * FROM kv_clock_in")
    con.unregister("kv_clock_in")


def _shown(con: Any) -> list[str]:
    """The tables an audit shows: events, manifests, the reconstructed tables, then any other
    non-internal table a stage made (``kv_*`` are the stages' own). A reconstructed table a
    streamed pass wrote (``loss_claims``) is a view over its file."""
    # NOTE: events (a view over the runs' files) and manifests are always shown
    return _order_shown(["events", "manifests", *_relations(con)])


def _relations(con: Any) -> set[str]:
    """The names of the connection's own tables and views (not DuckDB's internal ones)."""
    return {r[0] for r in con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE NOT internal UNION ALL "
        "SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()}


def _order_shown(names: Any) -> list[str]:
    """Tables in the order an audit shows them: events, manifests, the reconstructed tables,
    then any other (``kv_*`` are the stages' own, never shown)."""
    present = set(names)
    # NOTE: any other non-internal table a stage adds (e.g. ``lowering``) is shown too
    shown = [t for t in ("events", "manifests", *TABLE_NAMES) if t in present]
    return shown + sorted(t for t in present if t not in shown and not t.startswith("kv_"))


def _add_utc(con: Any, shown: list[str] | None = None) -> list[str]:
    """Give every shown table with ``ts_ns`` a ``ts`` column (UTC ``TIMESTAMP``; likewise
    ``X_ts_ns`` -> ``X_ts``): the table becomes ``kv_raw_<name>`` and a view ``<name>`` adds
    the columns. Returns the shown tables.

    NOTE: ts = anchor utc + (ts_ns - anchor ts_ns); NULL when the run has no clock. A table
    that has ``ts`` already (a fleet dataset's, written with it) is left as it is.
    """
    shown = _shown(con) if shown is None else shown
    for name in shown:
        cols = [r[0] for r in con.execute(
            "SELECT column_name FROM duckdb_columns() WHERE table_name = ?", [name]).fetchall()]
        # ts_ns -> ts, first_harm_ts_ns -> first_harm_ts, ...
        pairs = [(c, c[: -len("_ns")]) for c in cols
                 if (c == "ts_ns" or c.endswith("_ts_ns")) and c[: -len("_ns")] not in cols]
        if not pairs or "run_id" not in cols:
            continue
        added = ",\n".join(
            f"CAST(c.utc + to_microseconds((t.{src} - c.ts_ns) // 1000) AS TIMESTAMP) AS {dst}"
            for src, dst in pairs)
        kind = "VIEW" if con.execute("SELECT count(*) FROM duckdb_views() WHERE view_name = ?",
                                     [name]).fetchall()[0][0] else "TABLE"
        con.execute(f"ALTER {kind} {name} RENAME TO {_RAW}{name}")
        con.execute(f"""
            CREATE TEMP VIEW {name} AS
            SELECT t.*, {added}
            FROM {_RAW}{name} t LEFT JOIN kv_clock c ON c.run_id = t.run_id""")
    return shown


__all__ = ["Audit", "Clock", "SQLRefused", "check_read_only", "clock_anchor", "expand_paths",
           "lock_down", "open_audit"]

