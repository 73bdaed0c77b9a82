"""Synthetic trace generators for benchmarks and scale tests (vectorised, any size).

Requests of ``n`` blocks each arrive one after another into a pool of ``pool`` blocks, one
scheduler step per request; each request allocates and caches its blocks (round robin over
the pool: a block reused later is evicted first, so most cached blocks are eventually lost),
finishes and frees them. Optionally a ``cache_reset`` follows every ``reset_every``-th request.

Two shapes (``SHAPES``):

- ``sparse``: 1 request in 10 declares a ``hard_protected`` claim over its prefix (native
  policy: recorded, not enforced); half of those are released after the request finishes
  (their losses are relaxation), the others are harmed when their blocks are reused.
- ``dense``: every other request claims its whole prompt; the first half of each prompt is a
  chain shared by the requests of a family (``families`` families; a chain lives for
  ``generation`` rounds, so about that many claims bind each shared hash, and a hash has several
  copies); lifecycle ends cycle through released, demoted, expired and none (in force: harm);
  modes cycle through best_effort, soft_priority, hard_protected, demotable, expiring, except
  that a demoted claim is demotable and an expired one expiring (ttl 1 us), so every end is
  legitimate (docs/design.md §5); releases are the operator's; claim ids are reused (a new
  instance each time); a 2000-block pool and resets.
- ``mixed`` (a shape the pass was not designed around; benchmarks write it as many short runs,
  ``MIXED_POLICIES`` in turn): the dense shape's modes and ends, but a claim's lifecycle end
  comes ``hold`` requests after its request finished (long-lived claims: their blocks are
  evicted, reused and re-cached while they are in force), one request in three claims, no
  resets.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
from tqdm import tqdm

from kvclaims.contract.schema import ARROW_SCHEMA, SCHEMA_VERSION
from kvclaims.contract.trace_writer import RunWriter
from kvclaims.sources.jsonl import events_to_table

EVENT_NAMES = ["request_arrived", "claim_submitted", "claim_accepted", "claim_bound",
               "request_admitted", "block_evicted", "block_allocated", "block_cached",
               "claim_materialized", "request_finished", "claim_released", "block_freed",
               "cache_reset", "claim_demoted", "claim_expired"]
E = {name: i for i, name in enumerate(EVENT_NAMES)}
MODES = ["best_effort", "soft_priority", "hard_protected", "demotable", "expiring"]
# lifecycle end of a claim (event code; -1 = none: the claim stays in force)
ENDS = [E["claim_released"], E["claim_demoted"], E["claim_expired"], -1]


@dataclass(frozen=True)
class Shape:
    """How a synthetic trace looks (see the module docstring)."""

    n: int = 8                 # blocks per request
    pool: int = 4096           # usable blocks
    claim_every: int = 10      # 1 request in claim_every declares a claim
    shared: int = 0            # leading blocks of a prompt shared by its family
    families: int = 1
    generation: int = 1        # rounds a shared chain lives
    dense: bool = False        # modes and ends cycle, ids reused
    reset_every: int = 0
    hold: int = 0              # a claim's end comes this many requests after its own slot


SHAPES: dict[str, Shape] = {
    "sparse": Shape(),
    "dense": Shape(n=16, pool=2000, claim_every=2, shared=8, families=64, generation=8,
                   dense=True, reset_every=5003),
    "mixed": Shape(n=16, pool=1024, claim_every=3, shared=8, families=64, generation=8,
                   dense=True, hold=160),
}
# Run policies the ``mixed`` shape's runs take in turn (labels do not depend on them).
MIXED_POLICIES: list[str] = ["native", "hard_protected", "demote_on_conflict", "ttl_expiry",
                             "write_no_admit"]


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


def content_hash(shape: Shape, r: np.ndarray, p: np.ndarray) -> np.ndarray:
    """The content hash of request r's block p (a family's shared chain, else unique)."""
    r = r.astype(np.uint64)
    p = p.astype(np.uint64)
    k1, k2, k3 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xC2B2AE3D27D4EB4F), np.uint64(
        0x165667B19E3779F9)
    fam = r % np.uint64(shape.families)
    gen = r // np.uint64(shape.families * shape.generation)
    shared = (fam * k1 ^ (p + np.uint64(1)) * k2 ^ (gen + np.uint64(7)) * k3) | np.uint64(3)
    unique = ((r * np.uint64(1 << 12) + p) * k1) | np.uint64(1)
    unique &= ~np.uint64(2)   # NOTE: unique hashes have bit 1 clear, shared ones set
    return np.where(p < np.uint64(shape.shared), shared, unique)


def chunk_batch(r0: int, r1: int, n: int, pool: int, seq0: int, run_id: str,
                reset_every: int = 0, shape: Shape | None = None) -> pa.RecordBatch:
    """The events of requests r0..r1-1 as one ARROW_SCHEMA batch."""
    shape = shape or Shape(n=n, pool=pool, reset_every=reset_every)
    n, pool, reset_every = shape.n, shape.pool, shape.reset_every
    slots = template(n)
    ev_code = np.array([E[s[0]] for s in slots], dtype=np.int32)
    pos = np.array([s[1] for s in slots], dtype=np.int32)
    reqs = np.arange(r0, r1, dtype=np.int64)
    R, T = len(reqs), len(slots)
    ev = np.array(np.broadcast_to(ev_code, (R, T)))
    ps = np.broadcast_to(pos, (R, T))
    rq = np.broadcast_to(reqs[:, None], (R, T))
    is_end_slot = ev == E["claim_released"]
    # NOTE: an end slot ends the claim of the request ``hold`` requests before (``src``)
    src = rq - shape.hold * is_end_slot if shape.hold else rq
    claim = ((src % shape.claim_every) == 0) & (src >= 0)
    ci = src // shape.claim_every                      # claim ordinal
    if shape.dense:
        end = np.asarray(ENDS)[ci % len(ENDS)]
        # NOTE: a demotion or an expiry ends force only for the mode that allows it
        # (docs/design.md §5 "Lifecycle legitimacy"): those claims take that mode
        mode = np.where(end == E["claim_demoted"], MODES.index("demotable"),
                        np.where(end == E["claim_expired"], MODES.index("expiring"),
                                 ci % len(MODES)))
    else:
        end = np.where(ci % 2 == 0, E["claim_released"], -1)
        mode = np.full((R, T), MODES.index("hard_protected"))
    ev = np.where(is_end_slot & (end >= 0), end, ev)
    g = rq * n + ps                                    # global block index
    block_id = (g % pool) + 1
    keep = np.ones((R, T), dtype=bool)
    claim_slot = np.isin(ev, [E["claim_submitted"], E["claim_accepted"], E["claim_bound"],
                              E["claim_materialized"]])
    keep &= ~claim_slot | claim
    keep &= ~is_end_slot | (claim & (end >= 0))
    old_r = (g - pool) // n                            # the request whose block is evicted
    after_reset = (old_r >= (rq // reset_every) * reset_every) if reset_every else True
    keep &= (ev != E["block_evicted"]) | ((g >= pool) & after_reset)
    keep &= (ev != E["cache_reset"]) | (
        (reset_every > 0) & ((rq + 1) % max(reset_every, 1) == 0))
    ev, ps, rq, g, block_id, claim, mode, ci = (
        a[keep] for a in (ev, ps, rq, g, block_id, claim, mode, ci))
    m = len(ev)
    is_ev = ev == E["block_evicted"]
    old_g = g - pool
    block_hash = np.where(is_ev, content_hash(shape, old_g // n, old_g % n),
                          content_hash(shape, rq, np.maximum(ps, 0)))
    has_hash = np.isin(ev, [E["claim_bound"], E["block_evicted"], E["block_cached"]])
    has_block = np.isin(ev, [E["block_evicted"], E["block_allocated"], E["block_cached"],
                             E["block_freed"]])
    has_pos = np.isin(ev, [E["claim_bound"], E["block_cached"]])
    claim_events = [E["claim_submitted"], E["claim_accepted"], E["claim_bound"],
                    E["claim_materialized"], E["claim_released"], E["claim_demoted"],
                    E["claim_expired"]]
    has_req = ~np.isin(ev, claim_events[1:] + [E["block_evicted"], E["cache_reset"]])
    has_claim = np.isin(ev, claim_events) | ((ev == E["request_arrived"]) & claim)
    is_adm = ev == E["request_admitted"]
    is_fin = ev == E["request_finished"]
    is_sub = ev == E["claim_submitted"]
    req_names = [f"r{r}" for r in range(r0, r1)]
    local = (rq - r0).astype(np.int64)
    if shape.dense:   # NOTE: ids are reused: every claim_submitted starts a new instance
        claim_codes, claim_names = ci % 4096, [f"claim:{i}" for i in range(4096)]
    else:
        claim_codes, claim_names = local, [f"claim:{x}" for x in req_names]
    cols: dict[str, pa.Array] = {
        "run_id": _dict(np.zeros(m), [run_id]),
        "seq": pa.array(np.arange(seq0, seq0 + m, dtype=np.int64)),
        "ts_ns": pa.array(np.arange(seq0, seq0 + m, dtype=np.int64) * 1000),
        "event": _dict(ev, EVENT_NAMES),
        "step": pa.array(rq.astype(np.int64)),
        "request_id": _dict(local, req_names, mask=~has_req),
        "by_request_id": _dict(local, req_names, mask=~is_ev),
        "tenant": _dict(rq % 7, [f"tenant-{i}" for i in range(7)],
                        mask=~(is_sub | (ev == E["request_arrived"]))),
        "claim_id": _dict(claim_codes, claim_names, mask=~has_claim),
        "protection_mode": _dict(mode, MODES, mask=~is_sub),
        "threshold_blocks": pa.array(np.full(m, n, np.int32), mask=~is_sub),
        # NOTE: 1 us: the expiry slot comes 3n+ events (1 us each) after the acceptance
        "ttl_s": pa.array(np.full(m, 1e-6), mask=~(is_sub & (mode == MODES.index("expiring")))),
        # a release is the operator's (docs/design.md §2 "Ownership")
        "released_by": _dict(np.zeros(m), ["operator"], mask=~(ev == E["claim_released"])),
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


def events_per_request(shape: Shape) -> float:
    """About how many events one request writes (for sizing a trace)."""
    n = shape.n
    per = 3 * n + n + 3 + (3 + n + 2) / shape.claim_every
    return per


def write_trace(out: Path, events: int, n: int = 8, pool: int = 4096, *, reset_every: int = 0,
                run_id: str = "bench", progress: bool = True,
                shape: Shape | None = None, policy: str = "native") -> int:
    """Write a synthetic run directory of about ``events`` events; return the exact count."""
    shape = shape or Shape(n=n, pool=pool, reset_every=reset_every)
    requests = max(1, int(events / events_per_request(shape)))
    step = 20_000
    with RunWriter(out, {"run_id": run_id, "policy": policy, "usable_blocks": shape.pool,
                         "runtime": "synthetic"}, rotate_bytes=256 << 20) as w:
        # NOTE: every run starts with run_started at seq 0 (a run without its head is unknown)
        w.write_batch(events_to_table([{
            "run_id": run_id, "seq": 0, "ts_ns": 0, "event": "run_started",
            "runtime": "synthetic", "policy": policy, "usable_blocks": shape.pool,
            "num_blocks": shape.pool + 1, "schema_version": SCHEMA_VERSION}]).to_batches()[0])
        seq = 1
        for r0 in tqdm(range(0, requests, step), desc="generate", unit="chunk",
                       disable=not progress):
            batch = chunk_batch(r0, min(requests, r0 + step), shape.n, shape.pool, seq, run_id,
                                shape=shape)
            seq += batch.num_rows
            w.write_batch(batch)
    return seq


def write_mixed(out: Path, events: int, runs: int = 64, *, progress: bool = False) -> int:
    """Write the ``mixed`` shape: ``runs`` short run directories ``OUT/run000..`` of about
    ``events`` events together, their policies ``MIXED_POLICIES`` in turn (run ids
    ``mixed-000``..); return the exact count."""
    total = 0
    for i in tqdm(range(runs), desc="generate", unit="run", disable=not progress):
        total += write_trace(out / f"run{i:03d}", max(1, events // runs), run_id=f"mixed-{i:03d}",
                             progress=False, shape=SHAPES["mixed"],
                             policy=MIXED_POLICIES[i % len(MIXED_POLICIES)])
    return total
