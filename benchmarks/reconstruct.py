"""Reconstruction benchmark: a synthetic trace of N events (default 10 M), reconstructed in
bounded memory, against a plain-Python replay of the same labels.

    python benchmarks/reconstruct.py [--events N] [--memory-limit 4GB] [--python-events N]

Prints, side by side: import events/s (run directory -> DuckDB, streamed), reconstruct
events/s (all stages), peak RSS, and the plain-Python replay's events/s with the ratio.

The trace: requests of ``--blocks`` blocks each arrive one after another into a pool of
``--pool`` blocks; each request allocates and caches its blocks, finishes and frees them; a
block reused later is evicted first (so most cached blocks are eventually lost). Every 10th
request declares a claim over its prefix (submitted, accepted, bound, materialized); half of
those are released after the request finishes (their losses are relaxation), the others are
harmed when their blocks are reused (native policy: claims are recorded, not enforced).
"""

from __future__ import annotations

import argparse
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from recorder.schema import ARROW_SCHEMA  # noqa: E402
from recorder.trace_writer import RunWriter  # noqa: E402
from reconstruct import core, loader  # noqa: E402

EVENT_NAMES = ["request_arrived", "claim_submitted", "claim_accepted", "claim_bound",
               "request_admitted", "block_evicted", "block_allocated", "block_cached",
               "claim_materialized", "request_finished", "claim_released", "block_freed"]
E = {name: i for i, name in enumerate(EVENT_NAMES)}


def template(n: int) -> list[tuple[str, int]]:
    """Per-request slots: (event, position); -1 = not a block slot."""
    slots = [("request_arrived", -1), ("claim_submitted", -1), ("claim_accepted", -1)]
    slots += [("claim_bound", p) for p in range(n)]
    slots += [("request_admitted", -1)]
    for p in range(n):
        slots += [("block_evicted", p), ("block_allocated", p), ("block_cached", p)]
    slots += [("claim_materialized", -1), ("request_finished", -1), ("claim_released", -1)]
    slots += [("block_freed", p) for p in range(n - 1, -1, -1)]
    return slots


def _dict(indices: np.ndarray, values: list[str], mask: np.ndarray | None = None) -> pa.Array:
    idx = pa.array(indices.astype(np.int32), mask=mask)
    return pa.DictionaryArray.from_arrays(idx, pa.array(values, pa.string()))


def chunk_batch(r0: int, r1: int, n: int, pool: int, seq0: int, run_id: str) -> pa.RecordBatch:
    """The events of requests r0..r1-1 as one ARROW_SCHEMA batch."""
    slots = template(n)
    ev_code = np.array([E[s[0]] for s in slots], dtype=np.int32)
    pos = np.array([s[1] for s in slots], dtype=np.int32)
    reqs = np.arange(r0, r1, dtype=np.int64)
    R, T = len(reqs), len(slots)
    ev = np.broadcast_to(ev_code, (R, T))
    ps = np.broadcast_to(pos, (R, T))
    rq = np.broadcast_to(reqs[:, None], (R, T))
    claim = (rq % 10) == 0
    release = claim & ((rq // 10) % 2 == 0)
    g = rq * n + ps                           # global block index
    block_id = (g % pool) + 1
    keep = np.ones((R, T), dtype=bool)
    claim_slot = np.isin(ev, [E["claim_submitted"], E["claim_accepted"], E["claim_bound"],
                              E["claim_materialized"]])
    keep &= ~claim_slot | claim
    keep &= (ev != E["claim_released"]) | release
    keep &= (ev != E["block_evicted"]) | (g >= pool)
    ev, ps, rq, g, block_id, claim = (a[keep] for a in (ev, ps, rq, g, block_id, claim))
    m = len(ev)
    # content hash of global block g; an eviction loses the content of block index g - pool
    h_of = lambda gi: (gi.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)) | np.uint64(1)  # noqa: E731
    is_ev = ev == E["block_evicted"]
    block_hash = np.where(is_ev, h_of(g - pool), h_of(g))
    has_hash = np.isin(ev, [E["claim_bound"], E["block_evicted"], E["block_cached"]])
    has_block = np.isin(ev, [E["block_evicted"], E["block_allocated"], E["block_cached"],
                             E["block_freed"]])
    has_pos = np.isin(ev, [E["claim_bound"], E["block_cached"]])
    has_req = ~np.isin(ev, [E["claim_bound"], E["claim_accepted"], E["claim_materialized"],
                            E["claim_released"], E["block_evicted"]])
    has_claim = np.isin(ev, [E["claim_submitted"], E["claim_accepted"], E["claim_bound"],
                             E["claim_materialized"], E["claim_released"]]) | (
        (ev == E["request_arrived"]) & claim)
    is_adm = ev == E["request_admitted"]
    is_fin = ev == E["request_finished"]
    is_sub = ev == E["claim_submitted"]
    req_names = [f"r{r}" for r in range(r0, r1)]
    local = (rq - r0).astype(np.int64)
    # the request that evicts block index g - pool is the one allocating index g
    cols: dict[str, pa.Array] = {
        "run_id": _dict(np.zeros(m), [run_id]),
        "seq": pa.array(np.arange(seq0, seq0 + m, dtype=np.int64)),
        "ts_ns": pa.array(np.arange(seq0, seq0 + m, dtype=np.int64) * 1000),
        "event": _dict(ev, EVENT_NAMES),
        "request_id": _dict(local, req_names, mask=~has_req),
        "by_request_id": _dict(local, req_names, mask=~is_ev),
        "tenant": _dict(rq % 7, [f"tenant-{i}" for i in range(7)],
                        mask=~(is_sub | (ev == E["request_arrived"]))),
        "claim_id": _dict(local, [f"claim:{x}" for x in req_names], mask=~has_claim),
        "protection_mode": _dict(np.zeros(m), ["best_effort"], mask=~is_sub),
        "threshold_blocks": pa.array(np.full(m, n, np.int32), mask=~is_sub),
        "value": pa.array(np.ones(m), mask=~is_sub),
        "block_id": pa.array(block_id.astype(np.int32), mask=~has_block),
        "block_hash": pa.array(block_hash, mask=~has_hash),
        "position": pa.array(ps.astype(np.int32), mask=~has_pos),
        "cause": _dict(np.zeros(m), ["allocation"], mask=~is_ev),
        "blocks_required": pa.array(np.full(m, n, np.int32), mask=~is_adm),
        "free_blocks": pa.array(np.full(m, pool, np.int32), mask=~is_adm),
        "protected_blocks": pa.array(np.zeros(m, np.int32), mask=~is_adm),
        "usable_blocks": pa.array(np.full(m, pool, np.int32), mask=~is_adm),
        "finish_reason": _dict(np.zeros(m), ["stop"], mask=~is_fin),
        "num_cached_tokens": pa.array(np.zeros(m, np.int32), mask=~is_fin),
        "num_output_tokens": pa.array(np.ones(m, np.int32), mask=~is_fin),
    }
    arrays = [cols[f.name] if f.name in cols else pa.nulls(m, f.type) for f in ARROW_SCHEMA]
    return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)


def write_trace(out: Path, events: int, n: int, pool: int) -> int:
    """Write a synthetic run directory of about ``events`` events; return the exact count."""
    per_req = len(template(n)) - 0.9 * (3 + n) - 0.95   # average after masking
    requests = max(1, int(events / per_req))
    step = 20_000
    seq = 0
    with RunWriter(out, {"run_id": "bench", "policy": "native", "usable_blocks": pool,
                         "runtime": "synthetic"}, rotate_bytes=256 << 20) as w:
        for r0 in tqdm(range(0, requests, step), desc="generate", unit="chunk"):
            batch = chunk_batch(r0, min(requests, r0 + step), n, pool, seq, "bench")
            seq += batch.num_rows
            w.write_batch(batch)
    return seq


def python_replay(run_dir: Path, limit: int) -> tuple[int, float, dict[str, int]]:
    """Plain-Python replay of the loss labels over the first ``limit`` events."""
    content: dict[int, int] = {}
    copies: dict[int, int] = {}
    bound: dict[int, list[str]] = {}
    claims: dict[str, dict[str, Any]] = {}
    counts: dict[str, int] = {}
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
                    if (label, lab) and ["eviction", "relaxation", "harm"].index(lab) > \
                            ["eviction", "relaxation", "harm"].index(label):
                        label = lab
                counts[label] = counts.get(label, 0) + 1
            elif ev == "claim_submitted":
                claims[cid] = {"k": k, "missing": k, "mat": None, "released": None}
            elif ev == "claim_bound":
                bound.setdefault(h, []).append(cid)
            elif ev == "claim_released":
                claims[cid]["released"] = seq
            done += 1
            if done >= limit:
                return done, time.perf_counter() - t0, counts
    return done, time.perf_counter() - t0, counts


def peak_rss_mib() -> float:
    """Peak resident set size of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=10_000_000)
    ap.add_argument("--blocks", type=int, default=8, help="blocks per request")
    ap.add_argument("--pool", type=int, default=4096, help="usable blocks")
    ap.add_argument("--memory-limit", default="4GB")
    ap.add_argument("--python-events", type=int, default=1_000_000,
                    help="events the plain-Python replay runs on (its rate is per event)")
    ap.add_argument("--keep", metavar="DIR", help="write the trace here and keep it")
    args = ap.parse_args(argv)

    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="kvclaims-bench-"))
    run_dir = work / "run"
    try:
        t0 = time.perf_counter()
        n_events = write_trace(run_dir, args.events, args.blocks, args.pool)
        t_gen = time.perf_counter() - t0
        marks: dict[str, float] = {}
        bar = tqdm(total=len(core.STAGES) + 1, desc="reconstruct", unit="stage")

        def progress(stage: str) -> None:
            marks[stage] = time.perf_counter()
            bar.update(1)
            bar.set_postfix_str(stage)

        t0 = time.perf_counter()
        tables, _info = core.reconstruct_paths(
            [run_dir], database=work / "bench.duckdb", memory_limit=args.memory_limit,
            temp_directory=work / "spill", progress=progress)
        t_end = time.perf_counter()
        bar.close()
        t_import = marks["import"] - t0
        t_recon = t_end - marks["import"]
        sql_counts = dict(tables.con.sql(
            "SELECT label, count(*) FROM losses GROUP BY label").fetchall())
        rss_sql = peak_rss_mib()
        py_n, py_t, py_counts = python_replay(run_dir, args.python_events)
        py_rate = py_n / py_t
        rec_rate = n_events / t_recon
        print()
        print(f"events                 {n_events:>14,}   (generated in {t_gen:.1f} s)")
        print(f"import (stream->DuckDB){n_events / t_import:>14,.0f} events/s  ({t_import:.2f} s)")
        print(f"reconstruct (DuckDB)   {rec_rate:>14,.0f} events/s  ({t_recon:.2f} s)")
        print(f"plain-Python replay    {py_rate:>14,.0f} events/s  (on {py_n:,} events, "
              f"{py_t:.2f} s)")
        print(f"ratio reconstruct/py   {rec_rate / py_rate:>14.1f} x")
        print(f"peak RSS               {rss_sql:>14,.0f} MiB (memory_limit {args.memory_limit})")
        print(f"loss labels (SQL)      {sql_counts}")
        print(f"loss labels (py, partial) {py_counts}")
        tables.con.close()
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
