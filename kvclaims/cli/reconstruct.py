"""``kvclaims reconstruct`` and ``kvclaims conformance``: the CLI over ``kvclaims.open``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Final

from kvclaims import fleet
from kvclaims.cli.io import audit_options, open_audit
from kvclaims.contract.schema import InputError
from kvclaims.contract.vocabulary import VERDICT
from kvclaims.progress import Progress
from kvclaims.reconstruct.checks import CHECKS, checks_help

#: ``kvclaims conformance`` shows at most this many evidence seqs on a check's line, then how
#: many more there are.
EVIDENCE_SHOWN: Final[int] = 12


def register(subparsers: Any) -> None:
    """Add the ``reconstruct`` and ``conformance`` subcommands."""
    p = subparsers.add_parser(
        "reconstruct", help="label every block loss and rebuild claim/request outcomes",
        description="Build losses, loss_claims, claims, requests, feasibility, findings and "
                    "conformance as Parquet next to each run (RUN_DIR/reconstructed/, reused "
                    "by later commands while the run is unchanged) or in --out. Progress "
                    "(read, label, tables) goes to stderr on a terminal.")
    _inputs(p)
    p.add_argument("--out", metavar="DIR", help="write every run's tables here instead "
                   "(with --engine spark: the dataset, one Parquet dataset per table)")
    p.add_argument("--engine", choices=("duckdb", "spark"), default="duckdb",
                   help="duckdb: this process (default); spark: the same audit, one Spark task "
                        "per run (small runs packed), every table written as a Parquet "
                        "dataset partitioned by day and run (docs/fleet.md)")
    p.add_argument("--master", metavar="URL",
                   help="with --engine spark: Spark's master (default local[*] or "
                        "$KVCLAIMS_SPARK_MASTER)")
    p.add_argument("--pack-events", metavar="N", type=int,
                   help="with --engine spark: runs of fewer events share a task, up to N "
                        "events per task (default: the fleet over 4 tasks per slot, at least "
                        "half the largest run)")
    p.add_argument("--json", action="store_true",
                   help='print {"tables": [...], "runs": [...]} as JSON')
    p.set_defaults(func=cmd_reconstruct)

    c = subparsers.add_parser(
        "conformance", help="litmus checks and invariants, computed from the trace",
        description="Each check's verdict (pass | fail | not_exercised | unknown) with its "
                    "title and the seq numbers that prove it; not_exercised (the situation "
                    "the check needs did not occur) is never a pass. Exit status 1 when any "
                    "check fails. Rules: docs/conformance.md.",
        epilog=checks_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    _inputs(c)
    c.add_argument("--json", action="store_true", help="print the verdicts as a JSON array")
    c.set_defaults(func=cmd_conformance)


def _inputs(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="+", metavar="RUN_DIR",
                   help="run directories, sweep directories, globs, or JSON Lines traces "
                        "(.jsonl)")
    audit_options(p)


def cmd_reconstruct(args: argparse.Namespace) -> int:
    """Reconstruct, write Parquet, print a summary."""
    if args.engine == "spark":
        return _reconstruct_spark(args)
    with open_audit(args, args.paths, "reconstruct", reuse=False) as audit:
        written: dict[str, str] = {}
        if args.out:
            audit.write(args.out)
            written = {rid: str(Path(args.out)) for rid in audit.runs}
        else:
            written = {rid: str(p) for rid, p in audit.write_reconstructed().items()}
            for p in args.paths:
                path = Path(p)
                if path.is_file() and path.suffix == ".jsonl":
                    # NOTE: a JSON Lines trace has no run directory: its tables go beside it
                    out = path.with_name(path.stem + ".reconstructed")
                    rids = [r[0] for r in audit.con.execute(
                        "SELECT DISTINCT run_id FROM events ORDER BY 1").fetchall()
                        if r[0] not in audit.run_dirs]
                    for rid in rids:
                        audit.write(out if len(rids) == 1 else out / rid, run_id=rid)
                        written[rid] = str(out if len(rids) == 1 else out / rid)
        summary = audit.summary()
        tables = [t for t in audit.tables if t not in ("events", "manifests")]
    for row in summary:
        row["out"] = written.get(row["run_id"])
    if args.json:
        print(json.dumps({"tables": tables, "runs": summary}, indent=2, default=str))
        return 0
    print(f"reconstructed {len(summary)} run(s): {sum(r['losses'] for r in summary)} block "
          f"losses, {sum(r['events'] for r in summary)} events")
    for row in summary:
        print(f"{row['run_id']}: {row['losses']} losses {_counts(row['labels'])}; "
              f"claims {_counts(row['claim_outcomes'])}; "
              f"requests {_counts(row['request_outcomes'])}; "
              f"findings {_counts(row['findings'])}"
              + (f"; unknown from seq {row['unknown_from_seq']}"
                 if row["unknown_from_seq"] is not None else "")
              + (" (truncated)" if row["truncated"] else ""))
        print(f"  -> {row['out']}/{{{','.join(tables)}}}.parquet")
    return 0


def _reconstruct_spark(args: argparse.Namespace) -> int:
    """``--engine spark``: the fleet path (``kvclaims.fleet``), one task per run."""

    if not args.out:
        raise InputError("--engine spark needs --out DATASET (the fleet's Parquet datasets)")
    if args.pack_events is not None and args.pack_events < 1:
        raise InputError(f"--pack-events must be at least 1, not {args.pack_events}")
    try:
        import pyspark  # noqa: F401
    except ImportError:
        raise InputError("--engine spark needs pyspark: pip install 'kvclaims[spark]'") from None

    # NOTE: the key counts runs, so the "time left" estimate compares like with like
    with Progress("reconstruct --engine spark", quiet=bool(args.json),
                  key=f"reconstruct spark x{len(args.paths)}") as progress:
        result = fleet.reconstruct_spark(args.paths, args.out, master=args.master,
                                         memory_limit=args.memory_limit or "1GB",
                                         progress=progress.stage,
                                         pack_events=args.pack_events)
    if args.json:
        print(json.dumps({"dataset": str(result.out), "runs": result.runs,
                          "tasks": result.tasks, "seconds": result.seconds},
                         indent=2, default=str))
    else:
        print(f"reconstructed {len(result.runs)} run(s) on Spark in {len(result.tasks)} "
              f"task(s): {result.events} events in {result.seconds:.1f} s -> "
              f"{result.out}/<table>/date=*/run_id=*/")
        for row in result.errors:
            print(f"  {row['run_id']}: error: {row['error']}", file=sys.stderr)
    return 3 if result.errors else 0


def _counts(d: dict[str, int] | None) -> str:
    if not d:
        return "(none)"
    return "(" + ", ".join(f"{k} {v}" for k, v in sorted(d.items())) + ")"


def cmd_conformance(args: argparse.Namespace) -> int:
    """Print every check's verdict, aligned and with its title; exit 1 when any fails."""
    with open_audit(args, args.paths, "conformance") as audit:
        cols = audit.table("conformance").columns
        title = next((c for c in ("title", "check_title") if c in cols), None)
        # NOTE: evidence_seqs holds the smallest seqs only; a dataset written before the count
        # existed holds every seq, so its length is the count
        count = ("evidence_seq_count" if "evidence_seq_count" in cols
                 else "len(coalesce(evidence_seqs, []))")
        rows = audit.con.sql(
            'SELECT run_id, "check", ' + (f'"{title}"' if title else '"check"')
            + ", verdict, list_sort(coalesce(evidence_seqs, [])), detail, " + count
            + ' FROM conformance ORDER BY run_id, "check"').fetchall()
        # NOTE: the order of the one check table (reconstruct/checks.py); unknown ids last
        order = {c.name: c.ord for c in CHECKS}
        rows.sort(key=lambda r: (r[0], order.get(r[1], len(order) + 1000), r[1]))
        lowering: dict[str, list[tuple[str, str]]] = {}
        if "lowering" in audit.tables:
            for rid, mode, verdict in audit.con.sql(
                    "SELECT run_id, mode, verdict FROM lowering ORDER BY run_id, mode").fetchall():
                lowering.setdefault(rid, []).append((mode, verdict))
    failed = any(r[3] == VERDICT.fail for r in rows)
    if args.json:
        print(json.dumps([{"run_id": r[0], "check": r[1], "title": r[2], "verdict": r[3],
                           "evidence_seqs": r[4], "evidence_seq_count": r[6], "detail": r[5]}
                          for r in rows], indent=2))
        return 1 if failed else 0
    counts: dict[str, int] = {}
    for r in rows:
        counts[r[3]] = counts.get(r[3], 0) + 1
    runs = sorted({r[0] for r in rows})
    print(f"conformance: {len(runs)} run(s), {len(rows)} checks: "
          + (", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"))
    check_w = max([len(r[1]) for r in rows] + [5])
    title_w = max([len(r[2] or "") for r in rows] + [5])
    verdict_w = max([len(r[3]) for r in rows] + [7])
    run = None
    for rid, check, ttl, verdict, seqs, detail, n_seqs in rows:
        if rid != run:
            print(rid)
            if lowering.get(rid):  # what the runtime does with each mode (docs/design.md §3)
                print("  modes: " + ", ".join(f"{m} {v}" for m, v in lowering[rid]))
            run = rid
        ev = ("seq " + ",".join(str(s) for s in seqs[:EVIDENCE_SHOWN])
              + (f" ... and {n_seqs - EVIDENCE_SHOWN:,} more" if n_seqs > EVIDENCE_SHOWN
                 else "")) if seqs else "-"
        shown_title = ttl if title else ""
        print(f"  {check:<{check_w}}  " + (f"{shown_title:<{title_w}}  " if title else "")
              + f"{verdict:<{verdict_w}}  {ev}  {detail or ''}".rstrip())
    sys.stdout.flush()
    return 1 if failed else 0
