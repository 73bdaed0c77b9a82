"""Reconstruction benchmark: a synthetic trace of N events (default 10 M), reconstructed in
bounded memory, against a plain-Python replay of the same labels.

    python benchmarks/reconstruct.py [--events N] [--memory-limit 4GB] [--python-events N]

Prints, side by side: import events/s (run directory -> DuckDB, streamed), reconstruct
events/s for the labelling core (stages 01-04) and for all tables (01-07, incl. findings and
conformance), end to end, peak RSS, the plain-Python replay's events/s on the same labels and
the ratios, and checks that the reconstructor's labels equal the replay's on the replayed part
(wall and CPU seconds: the machine may be shared; CPU counts every DuckDB thread).

The trace: requests of ``--blocks`` blocks each arrive one after another into a pool of
``--pool`` blocks; each request allocates and caches its blocks, finishes and frees them; a
block reused later is evicted first (so most cached blocks are eventually lost). Every 10th
request declares a claim over its prefix (submitted, accepted, bound, materialized); half of
those are released after the request finishes (their losses are relaxation), the others are
harmed when their blocks are reused (native policy: claims are recorded, not enforced).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reconstruct import core, loader, synthetic  # noqa: E402

EVENT_NAMES, template, chunk_batch = synthetic.EVENT_NAMES, synthetic.template, synthetic.chunk_batch


def write_trace(out: Path, events: int, n: int, pool: int) -> int:
    """Write a synthetic run directory of about ``events`` events; return the exact count."""
    return synthetic.write_trace(out, events, n, pool)


def python_replay(run_dir: Path, limit: int) -> tuple[int, float, dict[tuple[int, int], str]]:
    """Plain-Python replay of the loss labels over the first ``limit`` events.

    Returns (events replayed, seconds, {(seq, block_id): label}). It reads the same run
    directory batch by batch (reading is part of its time) and keeps per-block content,
    per-hash copies and per-claim state in dicts, for this trace's shapes: one copy per
    hash, claims with a declared threshold, submitted and accepted before their blocks.
    """
    content: dict[int, int] = {}
    copies: dict[int, int] = {}
    bound: dict[int, list[str]] = {}
    claims: dict[str, dict[str, Any]] = {}
    labels: dict[tuple[int, int], str] = {}
    rank = {"eviction": 0, "relaxation": 1, "harm": 2}
    done = 0
    t0 = time.perf_counter()
    for batch in loader.iter_batches([run_dir]):
        cols = batch.select(["seq", "event", "block_id", "block_hash", "claim_id",
                             "position", "threshold_blocks"]).to_pydict()
        for seq, ev, b, h, cid, p, k in zip(*cols.values()):
            if ev == "block_cached":
                old = content.get(b)
                if old is not None:
                    copies[old] -= 1
                content[b] = h
                copies[h] = copies.get(h, 0) + 1
                for c in bound.get(h, ()):
                    st = claims[c]
                    st["missing"] -= 1
                    if st["missing"] == 0 and st["mat"] is None:
                        st["mat"] = seq
            elif ev == "block_evicted":
                if h is None:
                    h = content.get(b)
                if content.pop(b, None) is not None:
                    copies[h] -= 1
                label = "eviction"
                for c in bound.get(h, ()):
                    st = claims[c]
                    if copies.get(h, 0) == 0:
                        st["missing"] += 1
                    if st["released"] is not None:
                        lab = "relaxation"
                    elif st["mat"] is not None and st["missing"] > 0:
                        lab = "harm"
                    else:
                        lab = "eviction"
                    if rank[lab] > rank[label]:
                        label = lab
                labels[(seq, b)] = label
            elif ev == "claim_submitted":
                claims[cid] = {"k": k, "missing": k, "mat": None, "released": None}
            elif ev == "claim_bound":
                bound.setdefault(h, []).append(cid)
            elif ev == "claim_released":
                claims[cid]["released"] = seq
            done += 1
            if done >= limit:
                return done, time.perf_counter() - t0, labels
    return done, time.perf_counter() - t0, labels


def peak_rss_mib() -> float:
    """Peak resident set size of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cpu_s() -> float:
    """CPU seconds (user + system) of this process so far, all threads."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


# What each reported figure covers (also printed with --explain).
SCOPES = """\
import       run directory segments -> loader (decode, checks) -> DuckDB table `events` (streamed)
labelling    stages 01-04 on `events`: runs, block timeline (kv_losses), claims + predicate,
             loss_claims and losses (every loss labelled)
all tables   stages 01-07: the above + claims, requests, feasibility, findings, conformance
end to end   import + all tables
python       plain-Python replay of the losses' labels only (reads the same run directory);
             the ratios divide the reconstructor's rate by this one"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=10_000_000)
    ap.add_argument("--blocks", type=int, default=8, help="blocks per request")
    ap.add_argument("--pool", type=int, default=4096, help="usable blocks")
    ap.add_argument("--memory-limit", default="4GB")
    ap.add_argument("--threads", type=int, default=None, help="DuckDB threads (default: all)")
    ap.add_argument("--python-events", type=int, default=1_000_000,
                    help="events the plain-Python replay runs on (its rate is per event)")
    ap.add_argument("--keep", metavar="DIR", help="write the trace here and keep it")
    args = ap.parse_args(argv)

    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="kvclaims-bench-"))
    run_dir = work / "run"
    try:
        t0 = time.perf_counter()
        if (run_dir / "manifest.json").exists():
            n_events = sum(b.num_rows for b in loader.iter_batches([run_dir]))
        else:
            n_events = write_trace(run_dir, args.events, args.blocks, args.pool)
        t_gen = time.perf_counter() - t0
        rss_gen = peak_rss_mib()
        marks: dict[str, tuple[float, float]] = {}
        bar = tqdm(total=len(core.STAGES) + 1, desc="reconstruct", unit="stage")

        def progress(stage: str) -> None:
            marks[stage] = (time.perf_counter(), cpu_s())
            bar.update(1)
            bar.set_postfix_str(stage)

        # NOTE: what `kvclaims reconstruct RUN_DIR` does: a temporary database (here inside
        # the work directory, so it is removed with it), reconstructed tables not persisted.
        start = (time.perf_counter(), cpu_s())
        tables, _info = core.reconstruct_paths(
            [run_dir], memory_limit=args.memory_limit, temp_directory=work / "spill",
            threads=args.threads, progress=progress)
        end = (time.perf_counter(), cpu_s())
        bar.close()
        rss_rec = peak_rss_mib()

        def span(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
            return b[0] - a[0], b[1] - a[1]

        imp = span(start, marks["import"])
        label = span(marks["import"], marks["04_labels.sql"])
        every = span(marks["import"], end)
        e2e = span(start, end)
        steps, prev = [], marks["import"]
        for stage in core.STAGES:
            steps.append((stage, *span(prev, marks[stage])))
            prev = marks[stage]

        py_n, py_t, py_labels = python_replay(run_dir, args.python_events)
        py_rate = py_n / py_t
        last = max(s for s, _b in py_labels) if py_labels else -1
        sql_labels = {(s, b): lab for s, b, lab in tables.con.execute(
            "SELECT seq, block_id, label FROM losses WHERE run_id = 'bench' AND seq <= $last",
            {"last": last}).fetchall()}
        same = sql_labels == py_labels
        counts: dict[str, int] = dict(tables.con.sql(
            "SELECT label, count(*) FROM losses GROUP BY label ORDER BY label").fetchall())
        tables.con.close()

        def rate(t: tuple[float, float]) -> str:
            return (f"{n_events / t[0]:>12,.0f} events/s  {t[0]:7.2f} s wall "
                    f"{t[1]:7.2f} s CPU  {n_events / t[0] / py_rate:6.1f}x python")

        print()
        print(f"events                 {n_events:>12,}   (generated in {t_gen:.1f} s; "
              f"DuckDB memory_limit {args.memory_limit}, threads "
              f"{args.threads or 'all'}, {os.cpu_count()} CPUs)")
        print(f"import                 {n_events / imp[0]:>12,.0f} events/s  {imp[0]:7.2f} s wall "
              f"{imp[1]:7.2f} s CPU")
        print(f"reconstruct: labelling {rate(label)}")
        print(f"reconstruct: all tables{rate(every)}")
        print(f"end to end (import+all){rate(e2e)}")
        print(f"plain-Python replay    {py_rate:>12,.0f} events/s  {py_t:7.2f} s wall "
              f"(labels only, first {py_n:,} events)")
        print(f"peak RSS               {rss_rec:>12,.0f} MiB   (after generating: "
              f"{rss_gen:,.0f} MiB)")
        print(f"labels check           {'OK' if same else 'MISMATCH'}: "
              f"{len(py_labels):,} losses in the replayed part, reconstructor "
              f"{'==' if same else '!='} Python replay")
        print(f"loss labels (all)      {counts}")
        print("per stage (wall s / CPU s): " + ", ".join(
            f"{name.split('_')[0]} {w:.2f}/{c:.2f}" for name, w, c in steps))
        print()
        print(SCOPES)
        if not same:
            diff = {k: (sql_labels.get(k), py_labels.get(k))
                    for k in set(sql_labels) | set(py_labels)
                    if sql_labels.get(k) != py_labels.get(k)}
            print(f"label mismatches: {len(diff)}, e.g. {sorted(diff.items())[:5]}")
            return 1
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
