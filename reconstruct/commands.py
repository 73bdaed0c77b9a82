"""``kvclaims reconstruct`` and ``kvclaims conformance``: the CLI over ``reconstruct.core``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from recorder.schema import InputError
from reconstruct.core import TABLE_NAMES, Tables, load_jsonl, reconstruct, reconstruct_paths


def register(subparsers: Any) -> None:
    """Add the ``reconstruct`` and ``conformance`` subcommands."""
    p = subparsers.add_parser(
        "reconstruct", help="label every block loss and rebuild claim/request outcomes",
        description="Build losses, loss_claims, claims, requests, feasibility and findings "
                    "as Parquet next to each run (RUN_DIR/reconstructed/) or in --out.")
    _inputs(p)
    p.add_argument("--out", metavar="DIR", help="write every run's tables here instead")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=cmd_reconstruct)

    c = subparsers.add_parser(
        "conformance", help="litmus L1-L7 and invariants, computed from the trace",
        description="Each check is pass | fail | not_applicable | unknown with the seq numbers "
                    "that prove it. Exit status 1 when any check fails.")
    _inputs(c)
    c.add_argument("--json", action="store_true", help="print the verdicts as JSON")
    c.set_defaults(func=cmd_conformance)


def _inputs(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="+", metavar="RUN_DIR",
                   help="run directories, sweep directories, or JSON Lines traces (.jsonl)")
    p.add_argument("--memory-limit", default=None, metavar="SIZE",
                   help="DuckDB memory limit, e.g. 2GB (spills to --temp-dir beyond it)")
    p.add_argument("--temp-dir", default=None, metavar="DIR", help="DuckDB spill directory")


def _load(args: argparse.Namespace) -> tuple[Tables, dict[str, Path], list[str]]:
    """Reconstruct the inputs; return tables, where each run came from, truncation notes."""
    paths = [Path(p) for p in args.paths]
    for p in paths:
        if not p.exists():
            raise InputError(f"{p}: no such file or directory")
    jsonl = [p for p in paths if p.is_file() and p.suffix == ".jsonl"]
    if jsonl and len(jsonl) != len(paths):
        raise InputError("give either run directories or .jsonl traces, not both")
    if jsonl:
        events = load_jsonl(jsonl)
        if events.num_rows == 0:
            raise InputError("no events to reconstruct")
        tables = reconstruct(events, memory_limit=args.memory_limit,
                             temp_directory=args.temp_dir)
        origin = {}
        for p in jsonl:
            for rid in load_jsonl(p).column("run_id").unique().to_pylist():
                origin[rid] = p.with_name(p.stem + ".reconstructed")
        return tables, origin, []
    tables, info = reconstruct_paths(paths, memory_limit=args.memory_limit,
                                     temp_directory=args.temp_dir)
    origin = {rid: d / "reconstructed" for rid, d in info.run_dirs.items()}
    return tables, origin, info.truncations


def cmd_reconstruct(args: argparse.Namespace) -> int:
    """Reconstruct, write Parquet, print a summary."""
    tables, origin, notes = _load(args)
    for msg in notes:
        print(f"kvclaims reconstruct: warning: {msg}", file=sys.stderr)
    written: dict[str, str] = {}
    if args.out:
        tables.write(args.out)
        written = {rid: str(Path(args.out)) for rid in tables.run_ids}
    else:
        for rid in tables.run_ids:
            tables.write(origin[rid], run_id=rid)
            written[rid] = str(origin[rid])
    summary = tables.summary()
    for row in summary:
        row["out"] = written.get(row["run_id"])
    if args.json:
        print(json.dumps({"tables": list(TABLE_NAMES), "runs": summary}, indent=2,
                         default=str))
        return 0
    for row in summary:
        print(f"{row['run_id']}: {row['losses']} losses {_counts(row['labels'])}; "
              f"claims {_counts(row['claim_outcomes'])}; "
              f"requests {_counts(row['request_outcomes'])}; "
              f"findings {_counts(row['findings'])}"
              + (f"; unknown from seq {row['unknown_from_seq']}"
                 if row["unknown_from_seq"] is not None else "")
              + (" (truncated)" if row["truncated"] else ""))
        print(f"  -> {row['out']}/{{{','.join(TABLE_NAMES)}}}.parquet")
    return 0


def _counts(d: dict[str, int] | None) -> str:
    if not d:
        return "(none)"
    return "(" + ", ".join(f"{k} {v}" for k, v in sorted(d.items())) + ")"


def cmd_conformance(args: argparse.Namespace) -> int:
    """Print every check's verdict; exit 1 when any fails."""
    tables, _origin, notes = _load(args)
    for msg in notes:
        print(f"kvclaims conformance: warning: {msg}", file=sys.stderr)
    rows = tables.con.sql(
        'SELECT run_id, "check", verdict, evidence_seqs, detail FROM conformance').fetchall()
    failed = any(r[2] == "fail" for r in rows)
    if args.json:
        print(json.dumps([{"run_id": r[0], "check": r[1], "verdict": r[2],
                           "evidence_seqs": r[3], "detail": r[4]} for r in rows], indent=2))
    else:
        run = None
        for rid, check, verdict, seqs, detail in rows:
            if rid != run:
                print(rid)
                run = rid
            ev = "" if not seqs else " seq " + ",".join(str(s) for s in seqs[:12]) + (
                ",..." if len(seqs) > 12 else "")
            print(f"  {check:<36} {verdict:<14}{ev}  {detail}")
    return 1 if failed else 0
