"""CLI subcommands for moving traces in and out and asking the audit questions.

    kvclaims import FILE.jsonl --out RUN_DIR [--from kvclaims|arbiter-jsonl]
    kvclaims export RUN_DIR... --format jsonl|parquet [--out FILE|-]
    kvclaims sql "SELECT ..." RUN_DIR... [--format table|csv|json|parquet] [--out FILE]
    kvclaims query NAME RUN_DIR... [--format ...] [--out FILE]      (query --list: every name)
    kvclaims explain RUN_DIR... --tenant T [--claim C] [--request R] [--format text|md|html|json]
    kvclaims explain --dataset DIR [--run RUN_ID] --tenant T ...   # a fleet dataset (Spark)

Every RUN_DIR argument may also be one fleet dataset directory (``kvclaims.open``).

``sql``, ``query`` and ``explain`` open the runs through the one audit facade
(``kvclaims.open``): read-only, locked-down SQL (docs/sql.md, docs/explain.md).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import sys
import threading
import time
from collections.abc import Callable, Sequence
from datetime import date, datetime, timezone
from decimal import Decimal
from pathlib import Path
from typing import IO, Any

import duckdb
import pyarrow.parquet as pq

from kvclaims.contract.schema import InputError
from kvclaims.contract.trace_writer import atomic_output
import kvclaims
from kvclaims.sources import jsonl
from kvclaims.reconstruct.loader import EVENTS_SCHEMA, iter_batches
from kvclaims.audit import check_read_only, is_dataset
from kvclaims import queries
from kvclaims.audit import _sql_error
from kvclaims.explaining import explain, run_days, time_window
from kvclaims.replays import gather
from kvclaims.sources.arbiter_traces import convert_file
from kvclaims.sources.kv_events import import_capture

IMPORT_FORMATS = ("kvclaims", "arbiter-jsonl", "vllm-kv-events")
RESULT_FORMATS = ("table", "csv", "json", "parquet")
# Bounds on one query's result (docs/sql.md "Bounds"): wall time, and what is built in Python
# for table, csv and json output (Parquet streams to its file).
DEFAULT_TIMEOUT_S = 300.0
DEFAULT_MAX_ROWS = 1_000_000
DEFAULT_MAX_BYTES = 256 * 1024 * 1024
_FETCH_ROWS = 2048
EXPLAIN_FORMATS = ("text", "md", "html", "json")


def register(subparsers: Any) -> None:
    """Add ``import``, ``export``, ``sql``, ``query`` and ``explain`` to the CLI."""
    p = subparsers.add_parser(
        "import", help="turn a JSON Lines trace into a run directory",
        description="Validate a JSON Lines trace and write it as a run directory (several "
                    "runs: a sweep directory with one sub-directory per run_id).")
    p.add_argument("file", help="the .jsonl trace")
    p.add_argument("--out", required=True, help="run directory to create")
    p.add_argument("--from", dest="source_format", choices=IMPORT_FORMATS, default="kvclaims",
                   help="input format: kvclaims JSON Lines (default) or the arbiter's JSONL")
    p.set_defaults(func=cmd_import)

    p = subparsers.add_parser(
        "export", help="write run directories' events as JSON Lines or Parquet",
        description="Write run(s) as canonical JSON Lines (schema column order, nulls omitted) "
                    "or as one Parquet file of events (--out required).")
    p.add_argument("run_dir", nargs="+", help="run or sweep directories")
    p.add_argument("--format", choices=("jsonl", "parquet"), required=True,
                   help="output encoding")
    p.add_argument("--out", default="-", help="output file, or '-' for stdout (jsonl only)")
    p.set_defaults(func=cmd_export)

    p = subparsers.add_parser(
        "sql", help="one read-only SQL SELECT over the audit (events, tables, views)",
        description="Run one read-only SELECT over the events, the reconstructed tables and "
                    "every documented view of the given runs (reconstructed on demand). "
                    "Names: 'kvclaims query --list'. Reference: docs/sql.md.")
    p.add_argument("sql", metavar="SQL", help='e.g. "SELECT label, count(*) FROM losses '
                                              'GROUP BY label"')
    p.add_argument("paths", nargs="+", metavar="RUN_DIR",
                   help="run directories, sweep directories, globs or .jsonl traces")
    _result_options(p)
    p.set_defaults(func=cmd_sql)

    p = subparsers.add_parser(
        "query", help="show one table or documented view by name (--list: every name)",
        description="Show one reconstructed table or documented view (queries/*.sql) of the "
                    "given runs. 'kvclaims query --list' prints every name with its "
                    "description. '--sql \"SELECT ...\"' runs one SELECT instead (same as "
                    "'kvclaims sql'). Reference: docs/sql.md.")
    p.add_argument("args", nargs="*", metavar="NAME RUN_DIR",
                   help="the table or view name, then run directories (with --sql: only "
                        "run directories)")
    p.add_argument("--list", action="store_true", help="list every table and view")
    p.add_argument("--sql", default=None, help="one SELECT to run instead of a name")
    _result_options(p)
    p.set_defaults(func=cmd_query)

    p = subparsers.add_parser(
        "explain", help="a tenant's post-incident explanation (text, Markdown, HTML, JSON)",
        description="Explain to one tenant what happened to each of its claims and to each of "
                    "its refused, deferred or preempted requests: what was promised, the "
                    "timeline in UTC, why in capacity terms, the value lost and what would "
                    "have prevented it. Other tenants appear only as 'another tenant'. "
                    "Reference: docs/explain.md.")
    p.add_argument("paths", nargs="*", metavar="RUN_DIR",
                   help="run directories, sweep directories, globs or .jsonl traces")
    p.add_argument("--dataset", default=None, metavar="DIR",
                   help="read a fleet dataset (kvclaims reconstruct --engine spark --out DIR) "
                        "instead of run directories")
    p.add_argument("--run", action="append", default=None, metavar="RUN_ID",
                   help="with --dataset: only this run (repeatable; default every run)")
    p.add_argument("--tenant", required=True, help="the tenant to explain to")
    p.add_argument("--claim", default=None, help="only this claim of the tenant")
    p.add_argument("--request", default=None, help="only this request of the tenant")
    p.add_argument("--format", choices=EXPLAIN_FORMATS, default="text",
                   help="text (default), md, html (one self-contained file) or json")
    p.add_argument("--at", default=None, metavar="TIME",
                   help="only claims and requests with something within --window of TIME: an "
                        "ISO 8601 date-time (no zone: UTC) or a UTC time of day such as 14:02 "
                        "(on the runs' first day)")
    p.add_argument("--window", default=None, metavar="DURATION",
                   help="with --at: how far either side of TIME (30s, 500ms, 2m, 1h; "
                        "default 1m)")
    p.add_argument("--since", default=None, metavar="TIME",
                   help="only claims and requests with something at or after TIME")
    p.add_argument("--until", default=None, metavar="TIME",
                   help="only claims and requests with something at or before TIME")
    p.add_argument("--whatif", action="append", default=[], metavar="DIR",
                   help="a computed what-if (kvclaims whatif --out DIR, or one of its run "
                        "directories; repeatable): a harmed or demoted claim cites what the "
                        "replays of its run did. Replays among RUN_DIR are cited too; without "
                        "any, nothing counterfactual is said")
    p.add_argument("--out", default=None, metavar="FILE", help="write here instead of stdout")
    audit_options(p)
    p.set_defaults(func=cmd_explain)


def audit_options(p: argparse.ArgumentParser) -> None:
    """``--memory-limit``, ``--temp-dir``, ``--quiet``: every command that opens an audit."""
    p.add_argument("--memory-limit", default=None, metavar="SIZE",
                   help="DuckDB memory limit, e.g. 2GB (spills to --temp-dir beyond it)")
    p.add_argument("--temp-dir", default=None, metavar="DIR", help="DuckDB spill directory")
    p.add_argument("--quiet", action="store_true",
                   help="no progress on stderr (it is shown only on a terminal anyway)")


def _result_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--format", choices=RESULT_FORMATS, default=None,
                   help="table (default: aligned text), csv, json (an array of row objects) "
                        "or parquet (needs --out)")
    p.add_argument("--json", action="store_true", help="same as --format json")
    p.add_argument("--out", default=None, metavar="FILE", help="write here instead of stdout")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                   help=f"stop the query after this long (default {DEFAULT_TIMEOUT_S:g} s; "
                        "the reconstruction before it is not counted)")
    p.add_argument("--max-rows", type=int, default=DEFAULT_MAX_ROWS, metavar="N",
                   help=f"refuse a result of more rows (default {DEFAULT_MAX_ROWS:,}; "
                        "--format parquet --out FILE streams any size)")
    p.add_argument("--max-bytes", type=int, default=DEFAULT_MAX_BYTES, metavar="N",
                   help=f"refuse a result of more bytes of values (default "
                        f"{DEFAULT_MAX_BYTES // (1024 * 1024)} MiB)")
    audit_options(p)


def check_bounds(args: argparse.Namespace) -> None:
    """``--timeout``, ``--max-rows``, ``--max-bytes`` are positive and finite."""
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        raise InputError(f"--timeout must be a positive number of seconds, not {args.timeout}")
    if args.max_rows < 1 or args.max_bytes < 1:
        raise InputError("--max-rows and --max-bytes must be >= 1")


def _warn(messages: Sequence[str], command: str = "kvclaims") -> None:
    for msg in messages:
        print(f"{command}: warning: {msg}", file=sys.stderr)


# -- progress -------------------------------------------------------------------------------------

# Reconstruction steps as a user sees them: read, label (stages 01-04), tables (05-...),
# then the views.
_PHASES = {"read": "read", "reused reconstructed/": "tables (reused reconstructed/)",
           "views": "views"}


def _phase(step: str) -> str:
    if step in _PHASES:
        return _PHASES[step]
    if step[:2].isdigit():
        return "label" if int(step[:2]) <= 4 else "tables"
    return step


def progress_reporter(command: str, quiet: bool = False,
                      stream: IO[str] | None = None) -> Callable[[str], None] | None:
    """A progress callback for ``kvclaims.open`` that prints each finished phase (read,
    label, tables, views) with the elapsed time on stderr, or None when ``quiet`` or stderr
    is not a terminal (piped output stays clean)."""
    out = sys.stderr if stream is None else stream
    if quiet or not (hasattr(out, "isatty") and out.isatty()):
        return None
    start = time.monotonic()
    done: list[str] = []

    def report(step: str) -> None:
        phase = _phase(step)
        if done and done[-1] == phase:
            return
        if done:
            print(f"{command}: {done[-1]} done ({time.monotonic() - start:.1f} s)", file=out)
        done.append(phase)
        if phase == "views":
            print(f"{command}: ready ({time.monotonic() - start:.1f} s)", file=out)
        out.flush()

    return report


def open_audit(args: argparse.Namespace, paths: Sequence[str], command: str, **kw: Any) -> Any:
    """Open the audit for a command, with its options and progress; warn about truncations."""

    if not paths:
        raise InputError("give at least one RUN_DIR")
    audit = kvclaims.open(list(paths), memory_limit=args.memory_limit,
                          temp_directory=args.temp_dir,
                          progress=progress_reporter(f"kvclaims {command}",
                                                     getattr(args, "quiet", False)), **kw)
    _warn(audit.truncations, f"kvclaims {command}")
    return audit


# -- import / export ------------------------------------------------------------------------------

def cmd_import(args: argparse.Namespace) -> int:
    """``kvclaims import``: validate and write run directories."""

    path = Path(args.file)
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    if args.source_format == "arbiter-jsonl":
        converted = convert_file(path)
        # NOTE: the converter's own summary (unmapped events, notes) travels in the manifest
        summary = getattr(converted, "summary", None)
        extra: dict[str, Any] = {"source_format": "arbiter-jsonl"}
        if summary is not None and hasattr(summary, "to_dict"):
            extra["import_summary"] = summary.to_dict()
            _warn([f"{path}: {note}" for note in getattr(summary, "notes", [])])
        events = jsonl.validate_events(converted, path.name)
        dirs = jsonl.import_events(events, args.out, source=path.name, extra=extra)
    elif args.source_format == "vllm-kv-events":  # a `kvclaims listen --capture` file

        import_capture(path, args.out, warn=lambda m: _warn([f"{path}: {m}"]))
        dirs = [Path(args.out)]
    else:
        dirs = jsonl.import_jsonl(path, args.out)
    for d in dirs:
        print(f"imported {path} -> {d}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """``kvclaims export``: run dirs -> canonical JSON Lines, or one Parquet file of events."""
    truncations: list[str] = []
    if args.format == "parquet":
        if args.out in (None, "-"):
            raise InputError("--format parquet needs --out FILE (Parquet is binary)")
        count = export_parquet(args.run_dir, args.out, truncations=truncations)
    else:
        count = export_jsonl(args.run_dir, args.out, truncations=truncations)
    _warn(truncations, "kvclaims export")
    if args.out != "-":
        print(f"exported {count} events -> {args.out}", file=sys.stderr)
    return 0


def export_jsonl(run_dir: str | Path | Sequence[str | Path], out: str | Path | IO[str], *,
                 truncations: list[str] | None = None) -> int:
    """Write run(s) as canonical JSON Lines to ``out`` (path, '-' or text stream).

    ``run_dir`` may be a run directory, a sweep directory or a list of them; runs are written
    in run_id order. Returns the number of events; truncation messages go to ``truncations``.
    """
    paths = [run_dir] if isinstance(run_dir, (str, Path)) else list(run_dir)
    with jsonl.open_out(out) as fh:
        return jsonl.write_jsonl(iter_batches(paths, truncations=truncations), fh)


def export_parquet(paths: Sequence[str | Path], out: str | Path, *,
                   truncations: list[str] | None = None) -> int:
    """Write every event of the runs (decoded, by run_id then seq) to one Parquet file,
    streaming; returns the number of events."""
    count = 0
    with atomic_output(out) as tmp:
        with pq.ParquetWriter(str(tmp), EVENTS_SCHEMA, compression="zstd") as writer:
            for batch in iter_batches(list(paths), truncations=truncations):
                writer.write_batch(batch)
                count += batch.num_rows
    return count


# -- sql / query ----------------------------------------------------------------------------------

def cmd_sql(args: argparse.Namespace) -> int:
    """``kvclaims sql``: one read-only SELECT over the audit."""

    check_read_only(args.sql)  # NOTE: refuse before the (slow) reconstruction
    check_bounds(args)
    with open_audit(args, args.paths, "sql") as audit:
        emit(audit.sql(args.sql), args, title="result", con=audit.con, text=args.sql)
    return 0


def cmd_query(args: argparse.Namespace) -> int:
    """``kvclaims query``: a table or view by name, ``--list``, or ``--sql``."""
    if args.list:
        return list_names(args)
    if args.sql is not None:

        check_read_only(args.sql)
        check_bounds(args)
        with open_audit(args, args.args, "query") as audit:
            emit(audit.sql(args.sql), args, title="result", con=audit.con, text=args.sql)
        return 0
    if len(args.args) < 2:
        raise InputError("usage: kvclaims query NAME RUN_DIR... (names: kvclaims query --list)")
    name, paths = args.args[0], args.args[1:]

    # NOTE: the fleet views exist over a fleet dataset (the audit says so over run dirs)
    if name not in queries.VIEWS + queries.FLEET_VIEWS and name not in queries.TABLES:
        raise InputError(f"unknown table or view {name!r}; see 'kvclaims query --list'")
    check_bounds(args)
    with open_audit(args, paths, "query") as audit:
        rel = audit.relation(name)
        text = f'SELECT * FROM "{name}"'
        if name in audit.tables:
            rel = rel.order("ALL")  # NOTE: views carry their own ORDER BY
            text += " ORDER BY ALL"
        emit(rel, args, title=name, con=audit.con, text=text)
    return 0


def list_names(args: argparse.Namespace) -> int:
    """``kvclaims query --list``: every view (description from its SQL comment), then every
    table."""

    rows = [("view", v, queries.description(v)) for v in sorted(queries.VIEWS)]
    rows += [("table", t, d) for t, d in sorted(queries.TABLES.items())]
    if _format(args) == "json":
        _write(args.out, json.dumps([{"kind": k, "name": n, "description": d}
                                     for k, n, d in rows], indent=2) + "\n")
        return 0
    width = max(len(n) for _, n, _ in rows)
    lines = [f"{len(queries.VIEWS)} views and {len(queries.TABLES)} tables "
             "(kvclaims query NAME RUN_DIR...)"]
    lines += [f"{k:<5}  {n:<{width}}  {d}" for k, n, d in rows]
    _write(args.out, "\n".join(lines) + "\n")
    return 0


def _format(args: argparse.Namespace) -> str:
    if getattr(args, "json", False):
        if args.format not in (None, "json"):
            raise InputError("--json and --format disagree; give one")
        return "json"
    return args.format or "table"


def emit(rel: Any, args: argparse.Namespace, *, title: str, con: Any = None,
         text: str | None = None) -> None:
    """Print or write a relation in the chosen format.

    With ``con`` and ``text`` (the relation's SQL) the query runs under ``--timeout`` and
    its result under ``--max-rows`` / ``--max-bytes`` (one line when exceeded).
    """

    fmt = _format(args)
    timeout = getattr(args, "timeout", None)
    if fmt == "parquet" and not args.out:
        raise InputError("--format parquet needs --out FILE (Parquet is binary)")
    try:
        if fmt == "parquet":
            n = run_bounded(con, timeout, lambda: write_parquet(rel, args.out))
            print(f"wrote {n} rows -> {args.out}", file=sys.stderr)
            return
        if con is not None and text is not None:
            names, rows = run_bounded(con, timeout, lambda: fetch_bounded(
                con, text, getattr(args, "max_rows", None), getattr(args, "max_bytes", None)))
        else:
            names = list(rel.columns)
            rows = rel.fetchall()
    except QueryTimeout:
        raise InputError(f"the query ran longer than --timeout {timeout:g} s and was stopped; "
                         "narrow it or give a larger --timeout") from None
    except duckdb.Error as exc:
        raise _sql_error(exc) from None
    if fmt == "json":
        text = format_json(names, rows)
    elif fmt == "csv":
        text = format_csv(names, rows)
    else:
        text = format_table(names, rows, title=title, drop_null_columns=True)
    _write(args.out, text)


class QueryTimeout(Exception):
    """The query passed its ``--timeout`` and was interrupted."""


def run_bounded(con: Any, seconds: float | None, work: Callable[[], Any]) -> Any:
    """Run ``work`` (DuckDB calls on ``con``) on a worker thread; return its result or raise
    its exception. After ``seconds`` the query is interrupted (DuckDB raises
    ``InterruptException``).

    NOTE: the main thread waits in short slices, so Python runs the SIGINT/SIGTERM handlers
    while DuckDB computes (it would defer them until the query ends); a signal interrupts
    the query and unwinds normally, so temporary folders and half-written files go.
    """
    if con is None:
        return work()
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = work()
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread
            box["error"] = exc

    worker = threading.Thread(target=target, name="kvclaims-query", daemon=True)
    deadline = None if seconds is None else time.monotonic() + seconds
    worker.start()
    try:
        while worker.is_alive():
            worker.join(0.05)
            if deadline is not None and time.monotonic() >= deadline:
                con.interrupt()   # NOTE: again each slice: a fetch between queries misses one
    except BaseException:
        # NOTE: again and again until the worker ends: one interrupt sent before DuckDB has
        # registered the query is lost, and a worker left running at exit aborts the process
        until = time.monotonic() + 10.0
        while worker.is_alive() and time.monotonic() < until:
            con.interrupt()
            worker.join(0.05)
        raise
    if "error" in box:
        if isinstance(box["error"], duckdb.InterruptException):
            # NOTE: past the deadline it is the timeout; before it, a Ctrl-C reached DuckDB
            if deadline is None or time.monotonic() < deadline:
                raise KeyboardInterrupt
            raise QueryTimeout() from None
        raise box["error"]
    return box["result"]


def fetch_bounded(con: Any, text: str, max_rows: int | None,
                  max_bytes: int | None) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Run one SELECT and fetch its rows in chunks, refusing (one line) a result of more than
    ``max_rows`` rows or ``max_bytes`` bytes of values before it is all built in Python.

    NOTE: one value is fetched whole before it is measured: its size is bounded by DuckDB's
    ``--memory-limit``, the result's by these bounds.
    """
    cur = con.execute(text)
    names = [d[0] for d in cur.description or []]
    rows: list[tuple[Any, ...]] = []
    size = 0
    while True:
        chunk = cur.fetchmany(_FETCH_ROWS)
        if not chunk:
            return names, rows
        rows.extend(chunk)
        size += sum(_value_bytes(v) for row in chunk for v in row)
        if max_rows is not None and len(rows) > max_rows:
            raise InputError(f"the result has more than {max_rows:,} rows (--max-rows); add "
                             "a LIMIT or WHERE, or write it with --format parquet --out FILE")
        if max_bytes is not None and size > max_bytes:
            raise InputError(f"the result holds more than {max_bytes:,} bytes of values "
                             "(--max-bytes); select fewer or shorter columns, or write it "
                             "with --format parquet --out FILE")


def _value_bytes(value: Any) -> int:
    """About how many bytes a fetched value holds (strings and blobs by length)."""
    if isinstance(value, (str, bytes, bytearray)):
        return len(value) + 8
    if isinstance(value, (list, tuple)):
        return 8 + sum(_value_bytes(v) for v in value)
    if isinstance(value, dict):
        return 8 + sum(_value_bytes(k) + _value_bytes(v) for k, v in value.items())
    return 8


def _write(out: str | None, text: str) -> None:
    if out in (None, "-"):
        sys.stdout.write(text)
        return
    with atomic_output(out) as tmp:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
    print(f"wrote {out}", file=sys.stderr)


def write_parquet(rel: Any, out: str | Path) -> int:
    """Stream a relation into one Parquet file (written atomically); returns the row count."""
    n = 0
    with atomic_output(out) as tmp:
        reader = rel.to_arrow_reader(batch_size=1 << 16)
        with pq.ParquetWriter(str(tmp), reader.schema, compression="zstd") as writer:
            for batch in reader:
                writer.write_batch(batch)
                n += batch.num_rows
    return n


# -- explain --------------------------------------------------------------------------------------

#: Any day: a time of day is checked for syntax before the runs (and their days) are read.
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def cmd_explain(args: argparse.Namespace) -> int:
    """``kvclaims explain``: one tenant's post-incident explanation."""

    # NOTE: the window's syntax is checked before any trace is read (bad input: one line)
    time_window(args.at, args.window, args.since, args.until, days=[_EPOCH])
    if args.dataset is not None:
        if args.paths:
            raise InputError("give either RUN_DIR... or --dataset DIR, not both")
        if not is_dataset(args.dataset):
            raise InputError(f"{args.dataset}: not a fleet dataset (no events/ and manifests/ "
                             "tables)")
        source = open_audit(args, [args.dataset], "explain", runs=args.run)
    elif args.run:
        raise InputError("--run needs --dataset DIR")
    else:
        source = open_audit(args, args.paths, "explain")
    with source as audit:
        window = time_window(args.at, args.window, args.since, args.until,
                             days=run_days(audit))
        text = explain(audit, args.tenant, claim=args.claim, request=args.request,
                       window=window, whatifs=gather(audit, args.whatif)).render(args.format)
    _write(args.out, text)
    return 0


# -- formatting -----------------------------------------------------------------------------------

def _cell(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, list):
        return "[" + ", ".join(_cell(v) for v in value) + "]"
    return str(value)


def format_table(names: Sequence[str], rows: Sequence[Sequence[Any]], *, title: str = "result",
                 drop_null_columns: bool = False) -> str:
    """Aligned text: a one-line summary, header, rule, every row (nothing elided).

    With ``drop_null_columns`` a column that is NULL in every row is left out (the summary
    names them): a raw ``SELECT *`` over events is mostly nulls.
    """
    if not names:
        return f"{title}: no result\n"
    keep = list(range(len(names)))
    dropped: list[str] = []
    if drop_null_columns and rows:
        keep = [i for i in keep if any(r[i] is not None for r in rows)]
        dropped = [names[i] for i in range(len(names)) if i not in keep]
    shown = [names[i] for i in keep]
    cells = [[_cell(r[i]) for i in keep] for r in rows]
    numeric = [bool(rows) and all(isinstance(r[i], (int, float, Decimal)) and
                                  not isinstance(r[i], bool) for r in rows if r[i] is not None)
               and any(r[i] is not None for r in rows) for i in keep]
    widths = [max([len(n)] + [len(r[j]) for r in cells]) for j, n in enumerate(shown)]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.rjust(w) if num else v.ljust(w)
                         for v, w, num in zip(values, widths, numeric)).rstrip()

    summary = f"{title}: {len(rows)} row{'s' if len(rows) != 1 else ''}, {len(names)} columns"
    if dropped:
        summary += f" ({len(dropped)} all-NULL hidden: {', '.join(dropped)})"
    lines = [summary, line(shown), "  ".join("-" * w for w in widths)]
    lines += [line(r) for r in cells]
    return "\n".join(lines) + "\n"


def _jsonable(value: Any) -> Any:
    """JSON has no NaN/Infinity, dates or decimals: such values become strings ("nan", ISO
    8601 time); lists and structs recurse."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return value


def format_json(names: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A JSON array of row objects, one row per line (exact integers, uint64 included); ``[]``
    when there are no rows."""
    body = ",\n".join(json.dumps({n: _jsonable(v) for n, v in zip(names, row)},
                                 ensure_ascii=False, default=str, allow_nan=False)
                      for row in rows)
    return f"[\n{body}\n]\n" if rows else "[]\n"


def format_csv(names: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """RFC 4180 CSV with a header; NULL is an empty field, booleans true/false, lists JSON."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(names)
    for r in rows:
        w.writerow(["" if v is None else json.dumps(_jsonable(v)) if isinstance(v, (list, dict))
                    else ("true" if v else "false") if isinstance(v, bool)
                    else _jsonable(v) for v in r])
    return buf.getvalue()
