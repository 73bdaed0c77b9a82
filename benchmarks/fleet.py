"""Fleet benchmark: the same fleet of runs audited by one DuckDB process and by Spark.

    python benchmarks/fleet.py [--runs 120] [--giant-events 1000000] [--master local[2]]

A fleet of synthetic run directories of varied shapes (sizes spread over two orders of
magnitude, pools of 256-4096 blocks, claim-sparse and claim-dense, some with resets, and one
giant run) is written once under --dir, then:

- **duckdb**: one process audits every run (``kvclaims.open``, streamed, bounded: the same
  tables, the ``ts`` columns and the views);
- **spark**: ``reconstruct_spark`` on ``--master`` (local mode here): one task per run runs the
  labelling core (stages 01-04) and returns its tables as Arrow; stages 05-07 run as Spark SQL
  (transpiled from the same files) over them; Spark writes the dataset.

It prints events/s for both side by side (per wall second and per CPU second of the whole
process tree: on a shared machine the wall time is inflated by others), then how the Spark job
would spread over a cluster: tasks, shuffle bytes (from Spark's own stage metrics, REST API
on 127.0.0.1), the core-task skew the giant run causes, the critical path it sets, and any
statement that fell back to per-run DuckDB.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvclaims import fleet  # noqa: E402
import kvclaims  # noqa: E402
from kvclaims.sources.synthetic import write_trace  # noqa: E402


def make_fleet(out: Path, runs: int, giant_events: int, seed: int = 7) -> list[Path]:
    """Write ``runs`` run directories of varied shapes plus one giant run; reuse if present."""
    import random

    marker = out / "fleet.json"
    spec = {"runs": runs, "giant_events": giant_events, "seed": seed}
    if marker.exists() and json.loads(marker.read_text()) == spec:
        return sorted(p for p in out.iterdir() if p.is_dir())
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    rng = random.Random(seed)
    dirs = []
    for i in range(runs):
        events = int(10 ** rng.uniform(3.7, 5.0))          # 5 k .. 100 k events
        n = rng.choice([2, 4, 8, 16])                       # blocks per request
        pool = rng.choice([256, 1024, 4096])
        reset = rng.choice([0, 0, 0, 50])
        d = out / f"run-{i:04d}"
        write_trace(d, events, n=n, pool=pool, reset_every=reset, run_id=f"run-{i:04d}",
                    progress=False)
        dirs.append(d)
    giant = out / "run-giant"
    write_trace(giant, giant_events, n=8, pool=2048, run_id="run-giant", progress=False)
    dirs.append(giant)
    marker.write_text(json.dumps(spec))
    return dirs


def events_in(dirs: list[Path]) -> int:
    """Events in the fleet, from the manifests (what the writers recorded)."""
    total = 0
    for d in dirs:
        manifest = json.loads((d / "manifest.json").read_text())
        total += sum(s.get("events", 0) for s in manifest["segments"])
    return total


def stage_metrics(spark: Any) -> dict[str, int]:
    """Shuffle and input bytes over every stage of this application (Spark's REST API)."""
    url = spark.sparkContext.uiWebUrl
    if not url:
        return {}
    app = spark.sparkContext.applicationId
    try:
        with urllib.request.urlopen(f"{url}/api/v1/applications/{app}/stages",
                                    timeout=120) as r:
            stages = json.load(r)
    except OSError as exc:  # the UI is best effort; the benchmark's figures do not need it
        print(f"  (Spark's stage metrics unavailable: {exc})")
        return {}
    keys = ("shuffleReadBytes", "shuffleWriteBytes", "inputBytes", "outputBytes", "numTasks")
    return {k: sum(int(s.get(k, 0)) for s in stages) for k in keys}


def tree_cpu_seconds(pid: int | None = None) -> float:
    """CPU seconds (user + system, with reaped children) of a process and every live
    descendant: this Python, DuckDB's threads, Spark's JVM and its Python workers. Linux
    /proc; NOTE: on a shared machine wall time is inflated by others, CPU time is not."""
    import os

    tick = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    times: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # a process that ended while we looked
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
        times[int(entry)] = sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    total, todo = 0, [pid or os.getpid()]
    while todo:
        p = todo.pop()
        total += times.get(p, 0)
        todo += children.get(p, [])
    return total / tick


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=120)
    ap.add_argument("--giant-events", type=int, default=1_000_000)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--dir", type=Path, default=Path("/tmp/kvclaims-fleet"))
    args = ap.parse_args()

    t0 = time.perf_counter()
    dirs = make_fleet(args.dir / "runs", args.runs, args.giant_events)
    n_events = events_in(dirs)
    print(f"fleet: {len(dirs)} runs, {n_events:,} events "
          f"(written in {time.perf_counter() - t0:.1f} s, {args.dir / 'runs'})")

    t0, c0 = time.perf_counter(), tree_cpu_seconds()
    with kvclaims.open(dirs, memory_limit="2GB", reuse=False, lock=False) as audit:
        audit.con.sql("SELECT count(*) FROM losses").fetchall()
    duck_s, duck_cpu = time.perf_counter() - t0, tree_cpu_seconds() - c0
    print(f"duckdb, one process: {duck_s:.1f} s wall, {duck_cpu:.1f} CPU s", flush=True)

    spark = fleet.spark_session(args.master, ui=True)
    spark.sparkContext.parallelize([0], 1).count()  # start the executors before timing
    out = args.dir / "dataset"
    shutil.rmtree(out, ignore_errors=True)
    t0, c0 = time.perf_counter(), tree_cpu_seconds()
    result = fleet.reconstruct_spark(
        dirs, out, spark=spark,
        progress=lambda msg: print(f"  {time.perf_counter() - t0:7.1f} s  {msg}", flush=True))
    spark_s, spark_cpu = time.perf_counter() - t0, tree_cpu_seconds() - c0
    metrics = stage_metrics(spark)
    spark.stop()

    task_s = sorted((r["seconds"] for r in result.runs), reverse=True)
    giant = next(r for r in result.runs if r["run_id"] == "run-giant")
    median = task_s[len(task_s) // 2]
    print()
    print(f"{'engine':<22}{'wall s':>8}{'events/s':>12}{'vs duckdb':>11}"
          f"{'CPU s':>8}{'events/CPU s':>14}{'vs duckdb':>11}")
    for name, wall, cpu in (("duckdb, one process", duck_s, duck_cpu),
                            (f"spark {args.master}", spark_s, spark_cpu)):
        print(f"{name:<22}{wall:>8.1f}{n_events / wall:>12,.0f}{duck_s / wall:>11.2f}"
              f"{cpu:>8.1f}{n_events / cpu:>14,.0f}{duck_cpu / cpu:>11.2f}")
    print()
    print("how the Spark job spreads (from its own metrics):")
    print(f"  tasks: {metrics.get('numTasks', '?')} in all; the core stage has one task per "
          f"run ({len(dirs)}), the SQL stages' tasks follow spark.sql.shuffle.partitions")
    print(f"  shuffle: read {metrics.get('shuffleReadBytes', 0):,} B, "
          f"write {metrics.get('shuffleWriteBytes', 0):,} B (the SQL stages' joins and "
          f"aggregations by run; events reach them once, from the core tasks' Parquet)")
    print(f"  core task time: median {median:.2f} s, max {task_s[0]:.2f} s (the giant run, "
          f"{giant['events']:,} events: {giant['seconds']:.2f} s); sum {sum(task_s):.1f} s")
    ideal = sum(task_s) / 2
    print(f"  critical path: the giant core task bounds that stage at {giant['seconds']:.1f} s "
          f"on any cluster; on 2 cores its ideal is max(giant, sum/2) = "
          f"{max(giant['seconds'], ideal):.1f} s; the SQL stages and the write took "
          f"{spark_s - max(giant['seconds'], ideal):.1f} s more here")
    for line in result.fallbacks:
        print(f"  per-run DuckDB fallback: {line[:160]}")
    if result.errors:
        print(f"  errors: {len(result.errors)} runs could not be reconstructed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
