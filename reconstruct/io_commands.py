"""CLI subcommands for moving traces in and out: ``import``, ``export`` and ``query``.

    kvclaims import FILE.jsonl --out RUN_DIR [--from kvclaims|arbiter-jsonl]
    kvclaims export RUN_DIR --format jsonl [--out FILE|-]
    kvclaims query RUN_DIR... --sql "SELECT ..." [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from recorder.schema import InputError

IMPORT_FORMATS = ("kvclaims", "arbiter-jsonl", "vllm-kv-events")


def register(subparsers: Any) -> None:
    """Add the ``import``, ``export`` and ``query`` subcommands to the CLI."""
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
        "export", help="write run directories as JSON Lines",
        description="Write run(s) as canonical JSON Lines (schema column order, nulls omitted).")
    p.add_argument("run_dir", nargs="+", help="run or sweep directories")
    p.add_argument("--format", choices=("jsonl",), required=True, help="output encoding")
    p.add_argument("--out", default="-", help="output file, or '-' for stdout (default)")
    p.set_defaults(func=cmd_export)

    p = subparsers.add_parser(
        "query", help="run SQL over run directories (DuckDB; the view is 'events')",
        description="Run one SQL statement over the events of the given runs. Views: events "
                    "(one row per event, strings decoded), manifests (one row per run).")
    p.add_argument("run_dir", nargs="+", help="run or sweep directories")
    p.add_argument("--sql", required=True, help='e.g. "SELECT event, count(*) FROM events '
                                                'GROUP BY event"')
    p.add_argument("--json", action="store_true", help="print rows as a JSON array of objects")
    p.set_defaults(func=cmd_query)


def _warn(messages: Sequence[str]) -> None:
    for msg in messages:
        print(f"warning: {msg}", file=sys.stderr)


def cmd_import(args: argparse.Namespace) -> int:
    """``kvclaims import``: validate and write run directories."""
    from reconstruct import jsonl

    path = Path(args.file)
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    if args.source_format == "arbiter-jsonl":
        # NOTE: imported lazily: the converter is a separate part and optional here
        try:
            from reconstruct.arbiter_import import convert_file
        except ImportError as exc:
            raise InputError(f"--from arbiter-jsonl is not available: {exc}") from None
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
        from recorder.kv_events import import_capture

        import_capture(path, args.out, warn=lambda m: _warn([f"{path}: {m}"]))
        dirs = [Path(args.out)]
    else:
        dirs = jsonl.import_jsonl(path, args.out)
    for d in dirs:
        print(f"imported {path} -> {d}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """``kvclaims export``: run dirs -> canonical JSON Lines."""
    from reconstruct import jsonl

    truncations: list[str] = []
    count = jsonl.export_jsonl(args.run_dir, args.out, truncations=truncations)
    _warn(truncations)
    if args.out != "-":
        print(f"exported {count} events -> {args.out}", file=sys.stderr)
    return 0


def cmd_query(args: argparse.Namespace) -> int:
    """``kvclaims query``: one SQL statement over the loaded runs."""
    import duckdb

    from reconstruct.loader import load_runs

    trace = load_runs(args.run_dir)
    _warn(trace.truncations)
    con = trace.connect()
    try:
        cur = con.execute(args.sql)
        names = [d[0] for d in cur.description] if cur.description else []
        rows = cur.fetchall() if names else []
    except duckdb.Error as exc:
        raise InputError(f"SQL error: {exc}") from None
    out = sys.stdout
    if args.json:
        out.write(format_json(names, rows))
    else:
        out.write(format_table(names, rows))
    return 0


def _cell(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def format_table(names: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Aligned text table: header, rule, every row (nothing elided), then a row count."""
    if not names:
        return "(no result)\n"
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(n)] + [len(r[i]) for r in cells]) for i, n in enumerate(names)]
    lines = ["  ".join(n.ljust(w) for n, w in zip(names, widths)).rstrip(),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.append(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
    return "\n".join(lines) + "\n"


def _jsonable(value: Any) -> Any:
    """JSON has no NaN/Infinity: such floats become their string form ("nan", "inf")."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value


def format_json(names: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A JSON array of row objects, one row per line (exact integers, uint64 included)."""
    body = ",\n".join(json.dumps({n: _jsonable(v) for n, v in zip(names, row)},
                                 ensure_ascii=False, default=str, allow_nan=False)
                      for row in rows)
    return f"[\n{body}\n]\n" if rows else "[]\n"
