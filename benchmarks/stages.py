"""Per-statement cost of the reconstruction's SQL stages (reconstruct/sql/*.sql).

    python benchmarks/stages.py [--events N] [--shapes sparse,dense,sweep] [--work DIR]
                                [--save DIR | --compare DIR] [--stages 05,06,07]
                                [--memory-limit 1GB]

For each shape (the traces of benchmarks/reconstruct.py, written once under ``--work`` and
reused: the same cache as its ``--traces``, so one folder serves both), the events are read into a fresh DuckDB database as ``kvclaims.open`` does (a table,
or a view over the runs' Parquet files where the core exposes them so), every stage runs once
through ``core.run_stages``, and each statement's wall and CPU time is printed with the stage it
belongs to and the table it makes, slowest first within a stage, under the stage's whole time
(its streamed pass included: "outside statements").

``--save DIR`` writes every reconstructed table (sorted) to ``DIR/<shape>/<table>.parquet``;
``--compare DIR`` checks the tables of this run against such a saved set, row for row (the
way to show that a rewrite of a stage changes cost, not content).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import _report  # noqa: E402
from benchmarks.reconstruct import kept_traces  # noqa: E402
from kvclaims.reconstruct import core, loader  # noqa: E402

COMPARED = core.TABLE_NAMES + ("lowering",)


class TimedConnection:
    """A DuckDB connection whose ``execute`` records (stage, statement target, wall seconds,
    CPU seconds). NOTE: CPU is the process's (every DuckDB thread): on a shared machine the
    wall time of a statement says more about its neighbours than about it."""

    def __init__(self, con: Any) -> None:
        self._con = con
        self.stage = "01_runs.sql"
        self.times: list[tuple[str, str, float, float]] = []
        # per stage, all of it (wall, CPU): the streamed passes also work outside ``execute``
        self.stage_times: dict[str, tuple[float, float]] = {}
        self._mark = (time.perf_counter(), time.process_time())

    def end_stage(self, stage: str) -> None:
        """Record ``stage``'s whole time: from the end of the one before it to now."""
        now = (time.perf_counter(), time.process_time())
        self.stage_times[stage] = (now[0] - self._mark[0], now[1] - self._mark[1])
        self._mark = now

    def execute(self, sql: str, *args: Any) -> Any:
        t0, c0 = time.perf_counter(), time.process_time()
        out = self._con.execute(sql, *args)
        self.times.append((self.stage, core.created_table(sql) or sql.split()[0].lower(),
                           time.perf_counter() - t0, time.process_time() - c0))
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._con, name)


def time_stages(paths: list[Path], work: Path,
                memory_limit: str | None = None) -> tuple[Any, TimedConnection, int, str]:
    """Read ``paths`` as ``kvclaims.open`` does and run every stage with per-statement timing."""
    runs = loader.open_runs(paths)
    info = core.StreamedInput({}, {}, [], set())
    con, tmp = core.open_database(memory_limit=memory_limit, temp_directory=work / "spill")
    t0 = time.perf_counter()
    extra: dict[str, Any] = {}
    if hasattr(core, "expose_events"):
        # NOTE: `events` is a view over the runs' Parquet files (read once, during the read)
        files, n = core.stage_events(runs, info, Path(tmp) / "events")
        core.expose_events(con, files, Path(tmp) / "events")
        extra["sources"] = files
    else:
        n = core.import_events(con, core.stream_runs(runs, info), info)
    print(f"  import: {time.perf_counter() - t0:6.2f} s  ({n:,} events)", flush=True)
    timed = TimedConnection(con)
    stages = list(core.STAGES)

    def progress(stage: str) -> None:
        timed.end_stage(stage)
        i = stages.index(stage)
        if i + 1 < len(stages):
            timed.stage = stages[i + 1]

    core.run_stages(timed, manifests=info.manifests, truncated_runs=info.truncated_runs,
                    progress=progress, persist=False, folder=Path(tmp) / "tables", **extra)
    return con, timed, n, tmp


def report(timed: TimedConnection, only: list[str]) -> dict[str, tuple[float, float]]:
    """Print statement and stage seconds (wall, CPU); return them per stage."""
    in_sql: dict[str, tuple[float, float]] = {}
    for stage, _target, s, c in timed.times:
        w0, c0 = in_sql.get(stage, (0.0, 0.0))
        in_sql[stage] = (w0 + s, c0 + c)
    per_stage = {stage: timed.stage_times.get(stage, t) for stage, t in in_sql.items()}
    for stage in core.STAGES:
        if only and not any(stage.startswith(p) for p in only):
            continue
        # NOTE: a streamed pass runs statements per run or window: summed per target
        targets: dict[str, tuple[float, float]] = {}
        for st, target, s, c in timed.times:
            if st == stage:
                w0, c0 = targets.get(target, (0.0, 0.0))
                targets[target] = (w0 + s, c0 + c)
        w, c = per_stage.get(stage, (0.0, 0.0))
        sw, sc = in_sql.get(stage, (0.0, 0.0))
        targets["(outside statements)"] = (w - sw, c - sc)
        print(f"  {stage:20s} {w:7.3f} s  {c:7.3f} CPU-s", flush=True)
        for target, (s, c) in sorted(targets.items(), key=lambda r: -r[1][1]):
            if s >= 0.005 or c >= 0.005:
                print(f"      {target:28s} {s:7.3f} s  {c:7.3f} CPU-s")
    return per_stage


def ordered(con: Any, name: str) -> Any:
    """A table's rows in a total order (every column), as Arrow."""
    cols = [r[0] for r in con.execute(f"DESCRIBE {name}").fetchall()]
    order = ", ".join(f'"{c}"' for c in cols)
    return con.sql(f"SELECT * FROM {name} ORDER BY {order}").to_arrow_table()


def save_or_compare(con: Any, shape_dir: Path, save: bool) -> bool:
    """Write every compared table to ``shape_dir``, or check them against it."""
    ok = True
    shape_dir.mkdir(parents=True, exist_ok=True)
    for name in COMPARED:
        table = ordered(con, name)
        path = shape_dir / f"{name}.parquet"
        if save:
            pq.write_table(table, path)
            continue
        want = pq.read_table(path)
        same = want.schema == table.schema and want.equals(table)
        print(f"  compare {name:12s} {table.num_rows:9,} rows: "
              f"{'identical' if same else 'DIFFERENT'}", flush=True)
        ok &= same
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--shapes", default="sparse,dense,sweep")
    ap.add_argument("--work", default="/tmp/kvclaims-stages", help="trace cache directory")
    ap.add_argument("--stages", default="", help="comma-separated stage prefixes to print")
    ap.add_argument("--memory-limit", help="DuckDB memory_limit (default: DuckDB's)")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--save", metavar="DIR", help="save every table for a later --compare")
    g.add_argument("--compare", metavar="DIR", help="compare every table with a --save")
    _report.add_doc_option(ap)
    args = ap.parse_args(argv)
    work = Path(args.work)
    only = [p for p in args.stages.split(",") if p]
    ok = True
    seconds: dict[str, dict[str, tuple[float, float]]] = {}
    for shape in args.shapes.split(","):
        print(f"{shape} ({args.events:,} events)", flush=True)
        paths = kept_traces(work, shape, args.events)[0]
        con, timed, _n, tmp = time_stages(paths, work, args.memory_limit)
        try:
            per_stage = report(timed, only)
            seconds[shape] = per_stage
            late = [v for k, v in per_stage.items() if k >= "05"]
            print(f"  total 05-08: {sum(w for w, _ in late):.3f} s "
                  f"{sum(c for _, c in late):.3f} CPU-s; all stages: "
                  f"{sum(w for w, _ in per_stage.values()):.3f} s "
                  f"{sum(c for _, c in per_stage.values()):.3f} CPU-s", flush=True)
            if args.save or args.compare:
                ok &= save_or_compare(con, Path(args.save or args.compare) / shape,
                                      save=bool(args.save))
        finally:
            core.drop_database(con, tmp)
    _report.write_section("stages", stage_table(seconds, args.events), args.doc,
                          script=__file__)
    return 0 if ok else 1


def stage_table(seconds: dict[str, dict[str, tuple[float, float]]], events: int) -> str:
    """Wall and CPU seconds per stage (rows) and shape (columns), with the totals, as Markdown."""
    shapes = list(seconds)

    def cell(pairs: list[tuple[float, float]]) -> str:
        return f"{sum(w for w, _ in pairs):.3f} / {sum(c for _, c in pairs):.3f}"

    rows = [[stage, *(cell([seconds[s].get(stage, (0.0, 0.0))]) for s in shapes)]
            for stage in core.STAGES]
    rows.append(["total 05-08", *(cell([v for k, v in seconds[s].items() if k >= "05"])
                                  for s in shapes)])
    rows.append(["all stages", *(cell(list(seconds[s].values())) for s in shapes)])
    return _report.markdown_table(
        ["stage (wall s / CPU-s)", *(f"{s} ({events:,} events)" for s in shapes)], rows)


if __name__ == "__main__":
    sys.exit(main())
