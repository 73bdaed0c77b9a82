"""A synthetic trace generator for benchmarks and scale tests (vectorised, any size).

The trace: requests of ``n`` blocks each arrive one after another into a pool of ``pool``
blocks; each request allocates and caches its blocks, finishes and frees them; a block reused
later is evicted first (so most cached blocks are eventually lost). Every 10th request declares
a claim over its prefix (submitted, accepted, bound, materialized); half of those are released
after the request finishes (their losses are relaxation), the others are harmed when their
blocks are reused (native policy: claims are recorded, not enforced). Optionally a
``cache_reset`` follows every ``reset_every``-th request.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
from tqdm import tqdm

from recorder.schema import ARROW_SCHEMA
from recorder.trace_writer import RunWriter

EVENT_NAMES = ["request_arrived", "claim_submitted", "claim_accepted", "claim_bound",
               "request_admitted", "block_evicted", "block_allocated", "block_cached",
               "claim_materialized", "request_finished", "claim_released", "block_freed",
               "cache_reset"]
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
    slots += [("cache_reset", -1)]
    return slots


def _dict(indices: np.ndarray, values: list[str], mask: np.ndarray | None = None) -> pa.Array:
    idx = pa.array(indices.astype(np.int32), mask=mask)
    return pa.DictionaryArray.from_arrays(idx, pa.array(values, pa.string()))


def chunk_batch(r0: int, r1: int, n: int, pool: int, seq0: int, run_id: str,
                reset_every: int = 0) -> pa.RecordBatch:
    """The events of requests r0..r1-1 as one ARROW_SCHEMA batch (a cache_reset after every
    ``reset_every``-th request; none if 0)."""
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
    keep &= (ev != E["cache_reset"]) | (
        (reset_every > 0) & ((rq + 1) % max(reset_every, 1) == 0))
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
                            E["claim_released"], E["block_evicted"], E["cache_reset"]])
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


def write_trace(out: Path, events: int, n: int = 8, pool: int = 4096, *, reset_every: int = 0,
                run_id: str = "bench", progress: bool = True) -> int:
    """Write a synthetic run directory of about ``events`` events; return the exact count."""
    per_req = len(template(n)) - 0.9 * (3 + n) - 0.95 - 1   # average after masking
    requests = max(1, int(events / per_req))
    step = 20_000
    seq = 0
    with RunWriter(out, {"run_id": run_id, "policy": "native", "usable_blocks": pool,
                         "runtime": "synthetic"}, rotate_bytes=256 << 20) as w:
        for r0 in tqdm(range(0, requests, step), desc="generate", unit="chunk",
                       disable=not progress):
            batch = chunk_batch(r0, min(requests, r0 + step), n, pool, seq, run_id,
                                reset_every)
            seq += batch.num_rows
            w.write_batch(batch)
    return seq
