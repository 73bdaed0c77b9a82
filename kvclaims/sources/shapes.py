"""Canonical trace shapes in our vocabulary, for fixtures, docs and benchmarks.

The paper's capacity probe (docs/design.md, "Conformance"; prior-art §1): a resident prompt of
``resident`` blocks (optionally declaring a claim over all of them), then an active prompt of
``active`` blocks in a pool of ``usable`` blocks. Under pressure vLLM evicts the finished
resident chain tail first, so positions ``resident - lost .. resident - 1`` are lost and the
leading ones survive.

``python -m kvclaims.sources.shapes OUT_DIR`` writes every shape as ``OUT_DIR/<name>.jsonl`` (the
files in ``tests/fixtures/`` are made this way; a test checks they are up to date).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from kvclaims.contract.schema import RECORDER_VERSION, SCHEMA_VERSION, check_event

CLAIM: Final[str] = "claim:resident"


class TraceBuilder:
    """Append events with dense ``seq`` and a steadily advancing ``ts_ns``."""

    def __init__(self, run_id: str, *, policy: str = "native", usable: int = 80,
                 block_size: int = 16, start: bool = True) -> None:
        self.run_id = run_id
        self.events: list[dict[str, Any]] = []
        self.ts = 1_000_000
        # the scheduler step stamped on every event from now on (None: a stepless trace)
        self.step: int | None = None
        if start:
            self.emit("run_started", runtime="vllm", runtime_version="0.32.0",
                      model="tiny-llama", block_size=block_size, num_blocks=usable + 1,
                      usable_blocks=usable, policy=policy, schema_version=SCHEMA_VERSION,
                      recorder_version=RECORDER_VERSION)

    def emit(self, event: str, **fields: Any) -> int:
        """Append one event; return its seq."""
        seq = len(self.events)
        self.ts += 1000
        ev = {"run_id": self.run_id, "seq": seq, "ts_ns": self.ts, "event": event,
              **{k: v for k, v in fields.items() if v is not None}}
        if self.step is not None:
            ev["step"] = self.step
        check_event(ev)
        self.events.append(ev)
        return seq

    def advance(self, ns: int) -> None:
        """Let engine time pass (for TTLs)."""
        self.ts += ns

    def finish(self) -> list[dict[str, Any]]:
        """Close the run with ``run_finished`` and return the events."""
        self.emit("run_finished", events_written=len(self.events) + 1, events_dropped=0)
        return self.events


def block_hash(request: str, position: int) -> int:
    """A stable 64-bit stand-in for vLLM's chained block hash of ``request``'s prefix."""
    h = 1469598103934665603
    for ch in f"{request}/{position}":
        h = ((h ^ ord(ch)) * 1099511628211) & 0xFFFF_FFFF_FFFF_FFFF
    return h


def capacity_probe(run_id: str, *, policy: str = "native", resident: int = 60,
                   active: int = 70, usable: int = 80, claim_mode: str | None = None,
                   ttl_s: float | None = None, report_harm: bool = True,
                   write_no_admit: bool = False, defer_steps: int = 1,
                   finish: bool = True) -> list[dict[str, Any]]:
    """The resident/active capacity probe.

    ``claim_mode`` None: no claim. Under an enforcing policy a ``hard_protected`` claim makes
    the active request deferred then refused; ``demotable`` demotes the claim first,
    ``expiring`` lets it expire first; otherwise (native policy) the claim is recorded but not
    enforced and its lost blocks are harm (reported by the runtime when ``report_harm``).
    """
    b = TraceBuilder(run_id, policy=policy, usable=usable)
    enforcing = policy in ("hard_protected", "demote_on_conflict", "ttl_expiry")
    claim = claim_mode is not None
    res_hashes = [block_hash("resident", i) for i in range(resident)]
    b.emit("request_arrived", request_id="resident", tenant="tenant-a",
           num_prompt_tokens=resident * 16, claim_id=CLAIM if claim else None)
    if claim:
        b.emit("claim_submitted", claim_id=CLAIM, tenant="tenant-a", request_id="resident",
               protection_mode=claim_mode, threshold_blocks=resident, ttl_s=ttl_s, value=1.0)
        b.emit("claim_accepted", claim_id=CLAIM)
        for i, h in enumerate(res_hashes):
            b.emit("claim_bound", claim_id=CLAIM, block_hash=h, position=i)
    b.emit("request_admitted", request_id="resident", blocks_required=resident,
           free_blocks=usable, protected_blocks=0, usable_blocks=usable)
    for i, h in enumerate(res_hashes):
        b.emit("block_allocated", block_id=i + 1, request_id="resident")
        b.emit("block_cached", block_id=i + 1, block_hash=h,
               parent_hash=res_hashes[i - 1] if i else None, position=i, request_id="resident")
    if claim:
        b.emit("claim_materialized", claim_id=CLAIM)
    b.emit("request_finished", request_id="resident", finish_reason="length",
           num_cached_tokens=0, num_output_tokens=1)
    for i in reversed(range(resident)):  # vLLM frees tail first: the tail is evicted first
        b.emit("block_freed", block_id=i + 1, request_id="resident")
    if ttl_s is not None:
        b.advance(int(ttl_s * 1e9))

    protected = resident if (claim and enforcing) else 0
    b.emit("request_arrived", request_id="active", tenant="tenant-b",
           num_prompt_tokens=active * 16)
    if write_no_admit:
        b.emit("reuse_denied", request_id="active")
    shortfall = protected + active - usable
    if claim and enforcing and shortfall > 0:
        if claim_mode == "demotable":
            b.emit("claim_demoted", claim_id=CLAIM, reason="conflict with request active",
                   by_request_id="active")
            protected = 0
        elif claim_mode == "expiring":
            b.emit("claim_expired", claim_id=CLAIM, reason=f"ttl_s={ttl_s} elapsed")
            protected = 0
        else:
            fields = dict(request_id="active", blocks_required=active, free_blocks=usable - resident,
                          protected_blocks=protected, usable_blocks=usable,
                          blocking_claim_ids=[CLAIM], shortfall_blocks=shortfall,
                          reason="protected_resident_capacity")
            for _ in range(defer_steps):
                b.emit("request_deferred", **fields)
            b.emit("request_refused", **fields)
            b.emit("request_finished", request_id="active", finish_reason="error",
                   num_cached_tokens=0, num_output_tokens=0, reason="protected_resident_capacity")
            return b.finish() if finish else b.events
    b.emit("request_admitted", request_id="active", blocks_required=active,
           free_blocks=usable - resident, protected_blocks=protected, usable_blocks=usable)
    free_ids = list(range(resident + 1, usable + 1))
    victims = list(range(resident, 0, -1))  # block ids of positions resident-1 .. 0
    act_hashes = [block_hash("active", i) for i in range(active)]
    harm_reported = False
    for i in range(active):
        if free_ids:
            bid = free_ids.pop(0)
        else:
            bid = victims.pop(0)
            b.emit("block_evicted", block_id=bid, block_hash=res_hashes[bid - 1],
                   cause="allocation", by_request_id="active")
            if claim and not enforcing and report_harm and not harm_reported:
                b.emit("claim_harmed", claim_id=CLAIM, block_hash=res_hashes[bid - 1])
                harm_reported = True
        b.emit("block_allocated", block_id=bid, request_id="active")
        if not write_no_admit:
            b.emit("block_cached", block_id=bid, block_hash=act_hashes[i],
                   parent_hash=act_hashes[i - 1] if i else None, position=i,
                   request_id="active")
    b.emit("request_finished", request_id="active", finish_reason="length",
           num_cached_tokens=0, num_output_tokens=1)
    return b.finish() if finish else b.events


def l6_position_zero(run_id: str = "l6-position-zero", *, blocks: int = 60,
                     report_materialized: bool = False) -> list[dict[str, Any]]:
    """59 of 60 blocks survive but position 0 was lost: the claim is never materialized."""
    b = TraceBuilder(run_id, policy="native", usable=blocks + 20)
    hashes = [block_hash("resident", i) for i in range(blocks)]
    b.emit("request_arrived", request_id="resident", tenant="tenant-a",
           num_prompt_tokens=blocks * 16)
    b.emit("request_admitted", request_id="resident", blocks_required=blocks,
           free_blocks=blocks + 20, protected_blocks=0, usable_blocks=blocks + 20)
    for i, h in enumerate(hashes):
        b.emit("block_allocated", block_id=i + 1, request_id="resident")
        b.emit("block_cached", block_id=i + 1, block_hash=h,
               parent_hash=hashes[i - 1] if i else None, position=i, request_id="resident")
    b.emit("request_finished", request_id="resident", finish_reason="length",
           num_cached_tokens=0, num_output_tokens=1)
    for i in reversed(range(blocks)):
        b.emit("block_freed", block_id=i + 1, request_id="resident")
    b.emit("block_evicted", block_id=1, block_hash=hashes[0], cause="explicit")
    b.emit("request_arrived", request_id="again", tenant="tenant-a",
           num_prompt_tokens=blocks * 16, claim_id=CLAIM)
    b.emit("claim_submitted", claim_id=CLAIM, tenant="tenant-a", request_id="again",
           protection_mode="hard_protected", threshold_blocks=blocks, value=1.0)
    b.emit("claim_accepted", claim_id=CLAIM)
    for i, h in enumerate(hashes):
        b.emit("claim_bound", claim_id=CLAIM, block_hash=h, position=i)
    if report_materialized:  # a runtime that counts surviving blocks (59 >= 59)
        b.emit("claim_materialized", claim_id=CLAIM)
    b.emit("block_evicted", block_id=blocks, block_hash=hashes[-1], cause="explicit")
    return b.finish()


# -- small shapes: one behaviour each ---------------------------------------------------------

def _cache(b: TraceBuilder, request: str, n: int, first_block: int = 1,
           claim: str | None = None, mode: str = "hard_protected",
           threshold: int | None = None) -> list[int]:
    """A request caches n blocks (block ids first_block..); optionally declares a claim."""
    hashes = [block_hash(request, i) for i in range(n)]
    b.emit("request_arrived", request_id=request, tenant="tenant-a", num_prompt_tokens=n * 16,
           claim_id=claim)
    if claim:
        b.emit("claim_submitted", claim_id=claim, tenant="tenant-a", request_id=request,
               protection_mode=mode, threshold_blocks=threshold if threshold else n, value=2.0)
        b.emit("claim_accepted", claim_id=claim)
        for i, h in enumerate(hashes):
            b.emit("claim_bound", claim_id=claim, block_hash=h, position=i)
    b.emit("request_admitted", request_id=request, blocks_required=n, free_blocks=8,
           protected_blocks=0, usable_blocks=8)
    for i, h in enumerate(hashes):
        b.emit("block_allocated", block_id=first_block + i, request_id=request)
        b.emit("block_cached", block_id=first_block + i, block_hash=h, position=i,
               request_id=request)
    b.emit("request_finished", request_id=request, finish_reason="stop", num_cached_tokens=0,
           num_output_tokens=1)
    return hashes


def shape_multi_claim() -> list[dict[str, Any]]:
    """Two claims on the same content: one demoted (relaxation), one in force (harm)."""
    b = TraceBuilder("multi-claim", usable=8)
    hashes = _cache(b, "r", 3, claim="claim:a")
    b.emit("claim_submitted", claim_id="claim:b", tenant="tenant-b", request_id="r2",
           protection_mode="demotable", threshold_blocks=3, value=1.0)
    b.emit("claim_accepted", claim_id="claim:b")
    for i, h in enumerate(hashes):
        b.emit("claim_bound", claim_id="claim:b", block_hash=h, position=i)
    # claim:b is demoted to make room for x (6 blocks): 3 protected + 6 > 8 usable
    b.emit("request_arrived", request_id="x", tenant="tenant-b", num_prompt_tokens=6 * 16)
    b.emit("claim_demoted", claim_id="claim:b", reason="conflict", by_request_id="x")
    b.emit("request_admitted", request_id="x", blocks_required=6, free_blocks=5,
           protected_blocks=3, usable_blocks=8)
    b.emit("block_evicted", block_id=3, block_hash=hashes[2], cause="allocation",
           by_request_id="x")
    b.emit("claim_harmed", claim_id="claim:a", block_hash=hashes[2])
    return b.finish()


def shape_rematerialize() -> list[dict[str, Any]]:
    """Harm, re-cache (re-materialization), a second copy survives a loss, harm again."""
    b = TraceBuilder("rematerialize", usable=8)
    hashes = _cache(b, "r", 2, claim="claim:a")
    b.emit("block_evicted", block_id=1, cause="allocation", by_request_id="x")  # hash omitted
    b.emit("claim_harmed", claim_id="claim:a", block_hash=hashes[0])
    b.emit("block_cached", block_id=5, block_hash=hashes[0], position=0, request_id="r")
    b.emit("block_cached", block_id=6, block_hash=hashes[0], position=0, request_id="r3")
    b.emit("block_evicted", block_id=5, block_hash=hashes[0], cause="allocation",
           by_request_id="y")
    b.emit("block_evicted", block_id=6, block_hash=hashes[0], cause="allocation",
           by_request_id="z")
    b.emit("claim_harmed", claim_id="claim:a", block_hash=hashes[0])
    return b.finish()


def shape_reset() -> list[dict[str, Any]]:
    """A cache_reset loses every resident block: one loss row each, cause 'reset'."""
    b = TraceBuilder("reset", usable=8)
    _cache(b, "r", 2, claim="claim:a")
    _cache(b, "u", 1, first_block=3)
    b.emit("block_evicted", block_id=3, cause="allocation", by_request_id="x")
    b.emit("cache_reset", reason="reset_prefix_cache")
    b.emit("claim_harmed", claim_id="claim:a", block_hash=block_hash("r", 0))
    b.emit("block_cached", block_id=4, block_hash=block_hash("v", 0), position=0,
           request_id="v")
    return b.finish()


def shape_gap() -> list[dict[str, Any]]:
    """A recorder_gap: losses from its first dropped seq on are unknown."""
    b = TraceBuilder("gap", usable=8)
    hashes = _cache(b, "r", 3, claim="claim:a")
    b.emit("block_evicted", block_id=3, block_hash=hashes[2], cause="allocation",
           by_request_id="x")
    b.emit("claim_harmed", claim_id="claim:a", block_hash=hashes[2])
    gap_first = len(b.events)  # seqs gap_first..gap_first+1 were dropped
    b.events.append({"run_id": b.run_id, "seq": gap_first + 2, "ts_ns": b.ts + 5000,
                     "event": "recorder_gap", "first_seq": gap_first,
                     "last_seq": gap_first + 1, "events_dropped": 2, "reason": "buffer_full"})
    b.ts += 5000
    ev = {"run_id": b.run_id, "seq": gap_first + 3, "ts_ns": b.ts + 1000,
          "event": "block_evicted", "block_id": 2, "block_hash": hashes[1],
          "cause": "allocation", "by_request_id": "y"}
    check_event(ev)
    b.events.append(ev)
    b.events.append({"run_id": b.run_id, "seq": gap_first + 4, "ts_ns": b.ts + 2000,
                     "event": "run_finished", "events_written": gap_first + 3,
                     "events_dropped": 2})
    return b.events


def shape_truncated() -> list[dict[str, Any]]:
    """A run cut short (no run_finished): a preserved-looking claim is unknown if truncated."""
    b = TraceBuilder("truncated", usable=8)
    _cache(b, "r", 2, claim="claim:a")
    return b.events


def shape_rejected() -> list[dict[str, Any]]:
    """A rejected claim: its content's losses are plain eviction."""
    b = TraceBuilder("rejected", usable=8)
    hashes = [block_hash("r", i) for i in range(2)]
    b.emit("claim_submitted", claim_id="claim:a", tenant="tenant-a", request_id="r",
           protection_mode="expiring", threshold_blocks=2)
    b.emit("claim_rejected", claim_id="claim:a", reason="protection_mode 'expiring' needs ttl_s",
           request_id="r")
    for i, h in enumerate(hashes):
        b.emit("block_cached", block_id=i + 1, block_hash=h, position=i, request_id="r")
    b.emit("block_evicted", block_id=2, block_hash=hashes[1], cause="allocation")
    return b.finish()


def shape_never_materialized() -> list[dict[str, Any]]:
    """An accepted claim whose position 1 is never cached: never materialized, no harm."""
    b = TraceBuilder("never-materialized", usable=8)
    hashes = [block_hash("r", i) for i in range(2)]
    b.emit("claim_submitted", claim_id="claim:a", tenant="tenant-a", request_id="r",
           protection_mode="hard_protected", threshold_blocks=2)
    b.emit("claim_accepted", claim_id="claim:a")
    for i, h in enumerate(hashes):
        b.emit("claim_bound", claim_id="claim:a", block_hash=h, position=i)
    b.emit("block_cached", block_id=1, block_hash=hashes[0], position=0, request_id="r")
    b.emit("block_evicted", block_id=1, block_hash=hashes[0], cause="allocation")
    return b.finish()


def shape_never_submitted() -> list[dict[str, Any]]:
    """claim_accepted/claim_bound for a claim never submitted: its losses are unknown."""
    b = TraceBuilder("never-submitted", usable=8)
    h = block_hash("r", 0)
    b.emit("claim_accepted", claim_id="claim:ghost")
    b.emit("claim_bound", claim_id="claim:ghost", block_hash=h, position=0)
    b.emit("block_cached", block_id=1, block_hash=h, position=0, request_id="r")
    b.emit("block_evicted", block_id=1, block_hash=h, cause="allocation")
    return b.finish()


def shape_threshold() -> list[dict[str, Any]]:
    """Threshold 2 of 3: losing position 2 keeps the predicate (eviction); position 0 harms."""
    b = TraceBuilder("threshold", usable=8)
    hashes = _cache(b, "r", 3, claim="claim:a", threshold=2)
    b.emit("block_evicted", block_id=3, block_hash=hashes[2], cause="allocation")
    b.emit("block_evicted", block_id=1, block_hash=hashes[0], cause="allocation")
    b.emit("claim_harmed", claim_id="claim:a", block_hash=hashes[0])
    return b.finish()


def shape_released() -> list[dict[str, Any]]:
    """An explicit claim_released, then a loss: relaxation."""
    b = TraceBuilder("released", usable=8)
    hashes = _cache(b, "r", 2, claim="claim:a")
    b.emit("claim_released", claim_id="claim:a", reason="client released",
           released_by="tenant", request_id="r", tenant="tenant-a")
    b.emit("block_evicted", block_id=2, block_hash=hashes[1], cause="allocation")
    return b.finish()


def shape_preempted() -> list[dict[str, Any]]:
    """Request outcomes: preempted (never finished), aborted, deferred then served."""
    b = TraceBuilder("requests", usable=8)
    for rid in ("p", "a", "d"):
        b.emit("request_arrived", request_id=rid, tenant="tenant-a", num_prompt_tokens=32)
    b.emit("request_admitted", request_id="p", blocks_required=2, free_blocks=8,
           protected_blocks=0, usable_blocks=8)
    b.emit("request_preempted", request_id="p")
    b.emit("request_admitted", request_id="a", blocks_required=2, free_blocks=6,
           protected_blocks=0, usable_blocks=8)
    b.emit("request_finished", request_id="a", finish_reason="abort", num_cached_tokens=0,
           num_output_tokens=0)
    b.emit("request_deferred", request_id="d", blocks_required=9, free_blocks=6,
           protected_blocks=0, usable_blocks=8, blocking_claim_ids=[], shortfall_blocks=1)
    b.emit("request_admitted", request_id="d", blocks_required=2, free_blocks=6,
           protected_blocks=0, usable_blocks=8)
    b.emit("request_finished", request_id="d", finish_reason="stop", num_cached_tokens=16,
           num_output_tokens=4)
    return b.finish()


# -- one rule each, with its negative twin (docs/reconstruction.md, "Labels") -----------------

def shape_reuse(end: str, again: bool = True) -> list[dict[str, Any]]:
    """claim:a ends (``end``: released | expired | demoted | rejected), then, with ``again``,
    the same id is declared again over the same content and block 2 is lost: the loss harms
    the second instance (the first one's row is relaxation/expiry). The first instance's mode is
    the one its end needs to be legitimate (docs/design.md §5): demotable, expiring (ttl 1 s)."""
    b = TraceBuilder(f"reuse-{end}" + ("" if again else "-once"), usable=8)
    hashes = [block_hash("r", i) for i in range(2)]
    mode = {"demoted": "demotable", "expired": "expiring"}.get(end, "hard_protected")
    b.emit("request_arrived", request_id="r", tenant="tenant-a", num_prompt_tokens=32,
           claim_id="claim:a")
    b.emit("claim_submitted", claim_id="claim:a", tenant="tenant-a", request_id="r",
           protection_mode=mode, threshold_blocks=2, value=1.0,
           ttl_s=1.0 if end == "expired" else None)
    if end == "rejected":
        b.emit("claim_rejected", claim_id="claim:a", reason="over the tenant's limit",
               request_id="r")
    else:
        b.emit("claim_accepted", claim_id="claim:a")
        for i, h in enumerate(hashes):
            b.emit("claim_bound", claim_id="claim:a", block_hash=h, position=i)
    b.emit("request_admitted", request_id="r", blocks_required=2, free_blocks=8,
           protected_blocks=0, usable_blocks=8)
    for i, h in enumerate(hashes):
        b.emit("block_allocated", block_id=i + 1, request_id="r")
        b.emit("block_cached", block_id=i + 1, block_hash=h, position=i, request_id="r")
    b.emit("request_finished", request_id="r", finish_reason="stop", num_cached_tokens=0,
           num_output_tokens=1)
    for i in (2, 1):
        b.emit("block_freed", block_id=i, request_id="r")
    if end == "released":
        b.emit("claim_released", claim_id="claim:a", reason="client released",
               released_by="tenant", request_id="r", tenant="tenant-a")
    elif end == "expired":
        b.advance(1_000_000_000)
        b.emit("claim_expired", claim_id="claim:a", reason="ttl_s elapsed")
    elif end == "demoted":
        b.emit("claim_demoted", claim_id="claim:a", reason="conflict", by_request_id="x")
    if again:
        b.emit("claim_submitted", claim_id="claim:a", tenant="tenant-a", request_id="r2",
               protection_mode="hard_protected", threshold_blocks=2, value=1.0)
        b.emit("claim_accepted", claim_id="claim:a")
        for i, h in enumerate(hashes):
            b.emit("claim_bound", claim_id="claim:a", block_hash=h, position=i)
    b.emit("block_evicted", block_id=2, block_hash=hashes[1], cause="allocation",
           by_request_id="x")
    return b.finish()


def shape_step_repair(repaired: bool, stepped: bool = True) -> list[dict[str, Any]]:
    """A claimed block is evicted in step 2 and its content cached again into another block:
    in the same step (``repaired``: the predicate holds at the step's end: eviction) or in the
    next step (harm). Without steps (``stepped=False``) each event is judged: harm."""
    name = "step-repaired" if repaired else "step-not-repaired"
    b = TraceBuilder(name if stepped else name + "-stepless", usable=8)
    b.step = 1 if stepped else None
    hashes = _cache(b, "r", 3, claim="claim:a")
    for i in (3, 2, 1):
        b.emit("block_freed", block_id=i, request_id="r")
    b.step = 2 if stepped else None
    b.emit("request_arrived", request_id="probe", tenant="tenant-a", num_prompt_tokens=48)
    b.emit("request_admitted", request_id="probe", blocks_required=1, free_blocks=5,
           protected_blocks=0, usable_blocks=8)
    b.emit("block_hit", block_id=1, block_hash=hashes[0], position=0, request_id="probe")
    b.emit("block_hit", block_id=2, block_hash=hashes[1], position=1, request_id="probe")
    b.emit("block_evicted", block_id=3, block_hash=hashes[2], cause="allocation",
           by_request_id="probe")
    b.emit("block_allocated", block_id=3, request_id="probe")
    if not repaired and stepped:
        b.step = 3
    b.emit("block_cached", block_id=3, block_hash=hashes[2], position=2, request_id="probe")
    b.step = (4 if not repaired else 3) if stepped else None
    b.emit("request_finished", request_id="probe", finish_reason="length",
           num_cached_tokens=32, num_output_tokens=1)
    b.step = None
    return b.finish()


def shape_mode_loss(mode: str) -> list[dict[str, Any]]:
    """An accepted, materialized claim in ``mode`` loses position 1 under native."""
    b = TraceBuilder(f"mode-{mode}", usable=8)
    hashes = _cache(b, "r", 2, claim="claim:a", mode=mode)
    for i in (2, 1):
        b.emit("block_freed", block_id=i, request_id="r")
    b.emit("block_evicted", block_id=2, block_hash=hashes[1], cause="allocation",
           by_request_id="x")
    return b.finish()


def shape_soft_loss(lower_evictable: bool, policy: str = "native") -> list[dict[str, Any]]:
    """A soft_priority claim loses a block while an unclaimed block is (``lower_evictable``:
    harm, the eviction order was broken) or is not (still held by its request: eviction)
    evictable."""
    name = "soft-lower-evictable" if lower_evictable else "soft-no-lower"
    b = TraceBuilder(name if policy == "native" else f"{name}-{policy.replace('_', '-')}",
                     policy=policy, usable=8)
    hashes = _cache(b, "r", 2, claim="claim:a", mode="soft_priority")
    for i in (2, 1):
        b.emit("block_freed", block_id=i, request_id="r")
    b.emit("request_arrived", request_id="u", tenant="tenant-b", num_prompt_tokens=16)
    b.emit("request_admitted", request_id="u", blocks_required=1, free_blocks=6,
           protected_blocks=0, usable_blocks=8)
    b.emit("block_allocated", block_id=3, request_id="u")
    b.emit("block_cached", block_id=3, block_hash=block_hash("u", 0), position=0,
           request_id="u")
    if lower_evictable:
        b.emit("request_finished", request_id="u", finish_reason="stop", num_cached_tokens=0,
               num_output_tokens=1)
        b.emit("block_freed", block_id=3, request_id="u")
    b.emit("block_evicted", block_id=2, block_hash=hashes[1], cause="allocation",
           by_request_id="x")
    return b.finish()


def shape_hook_failed(before_loss: bool) -> list[dict[str, Any]]:
    """A hook fails inside the engine before (the loss is unknown: enforcement cannot be
    trusted) or after (the loss stays harm) a loss of an in-force hard claim."""
    b = TraceBuilder("hook-failed-before" if before_loss else "hook-failed-after", usable=8)
    hashes = _cache(b, "r", 2, claim="claim:a")
    if before_loss:
        b.emit("hook_failed", hook="schedule", error_type="RuntimeError")
    b.emit("block_evicted", block_id=2, block_hash=hashes[1], cause="allocation",
           by_request_id="x")
    if not before_loss:
        b.emit("hook_failed", hook="schedule", error_type="RuntimeError")
    return b.finish()


# -- lifecycle legitimacy and timeline evidence (docs/design.md §5), each with its twin --------

# name -> (protection mode, ttl_s, the end event and its fields, seconds before the end)
LIFECYCLE_CASES: Final[dict[str, tuple[str, float | None, str, dict[str, Any], float]]] = {
    "demoted_hard": ("hard_protected", None, "claim_demoted", {"by_request_id": "x"}, 0.0),
    "demoted_demotable": ("demotable", None, "claim_demoted", {"by_request_id": "x"}, 0.0),
    "expired_hard": ("hard_protected", 1.0, "claim_expired", {}, 2.0),
    "expired_no_ttl": ("expiring", None, "claim_expired", {}, 2.0),
    "expired_early": ("expiring", 5.0, "claim_expired", {}, 2.0),
    "expired_on_time": ("expiring", 1.0, "claim_expired", {}, 2.0),
    "released_other_tenant": ("hard_protected", None, "claim_released",
                              {"released_by": "tenant", "tenant": "tenant-b",
                               "request_id": "b1"}, 0.0),
    "released_own_tenant": ("hard_protected", None, "claim_released",
                            {"released_by": "tenant", "tenant": "tenant-a",
                             "request_id": "a2"}, 0.0),
    "released_operator": ("hard_protected", None, "claim_released",
                          {"released_by": "operator"}, 0.0),
    "released_arbiter": ("hard_protected", None, "claim_released",
                         {"released_by": "arbiter"}, 0.0),
}


def _claimed_pair(b: TraceBuilder, mode: str, ttl_s: float | None,
                  tenant: str = "tenant-a", request: str = "r") -> list[int]:
    """``request`` of ``tenant`` caches 2 blocks (ids 1, 2) under claim:a (``mode``), then
    frees them: an accepted, materialized claim whose blocks are evictable."""
    hashes = [block_hash(request, i) for i in range(2)]
    b.emit("request_arrived", request_id=request, tenant=tenant, num_prompt_tokens=32,
           claim_id="claim:a")
    b.emit("claim_submitted", claim_id="claim:a", tenant=tenant, request_id=request,
           protection_mode=mode, threshold_blocks=2, ttl_s=ttl_s, value=1.0)
    b.emit("claim_accepted", claim_id="claim:a")
    for i, h in enumerate(hashes):
        b.emit("claim_bound", claim_id="claim:a", block_hash=h, position=i)
    b.emit("request_admitted", request_id=request, blocks_required=2, free_blocks=8,
           protected_blocks=0, usable_blocks=8)
    for i, h in enumerate(hashes):
        b.emit("block_allocated", block_id=i + 1, request_id=request)
        b.emit("block_cached", block_id=i + 1, block_hash=h, position=i, request_id=request)
    b.emit("claim_materialized", claim_id="claim:a")
    b.emit("request_finished", request_id=request, finish_reason="stop", num_cached_tokens=0,
           num_output_tokens=1)
    for i in (2, 1):
        b.emit("block_freed", block_id=i, request_id=request)
    return hashes


def shape_lifecycle(case: str) -> list[dict[str, Any]]:
    """claim:a (tenant-a, native policy) ends by the event of ``LIFECYCLE_CASES[case]``, then
    block 2 is lost: relaxation/expiry where the contract allows that end, harm otherwise."""
    mode, ttl_s, event, fields, wait_s = LIFECYCLE_CASES[case]
    b = TraceBuilder(f"lifecycle-{case.replace('_', '-')}", usable=8)
    hashes = _claimed_pair(b, mode, ttl_s)
    b.advance(int(wait_s * 1e9))
    b.emit(event, claim_id="claim:a", reason=f"{event} ({case})", **fields)
    b.emit("block_evicted", block_id=2, block_hash=hashes[1], cause="allocation",
           by_request_id="x")
    return b.finish()


def shape_demotion_for(needed: bool) -> list[dict[str, Any]]:
    """Under demote_on_conflict a demotable 2-block claim is demoted for request ``x`` of
    ``7 if needed else 3`` blocks in an 8-block pool: with the claim's 2 protected blocks back,
    7 + 2 > 8 (the demotion made room: justified) or 3 + 2 <= 8 (it did not: unjustified)."""
    b = TraceBuilder("demotion-" + ("needed" if needed else "not-needed"),
                     policy="demote_on_conflict", usable=8)
    hashes = _claimed_pair(b, "demotable", None)
    need = 7 if needed else 3
    b.emit("request_arrived", request_id="x", tenant="tenant-b", num_prompt_tokens=need * 16)
    b.emit("claim_demoted", claim_id="claim:a", reason="conflict with request x",
           by_request_id="x")
    b.emit("request_admitted", request_id="x", blocks_required=need, free_blocks=6,
           protected_blocks=0, usable_blocks=8)
    b.emit("block_evicted", block_id=2, block_hash=hashes[1], cause="allocation",
           by_request_id="x")
    return b.finish()


def shape_phantom_hit(phantom: bool) -> list[dict[str, Any]]:
    """A claimed block is evicted in step 2; in the same step the content comes "back": by a
    block_hit on the evicted, empty block (``phantom``: the timeline contradicts it, the loss
    stays harm) or by a block_cached into another block (a real repair: eviction)."""
    b = TraceBuilder("phantom-hit" if phantom else "real-repair", usable=8)
    b.step = 1
    hashes = _claimed_pair(b, "hard_protected", None)
    b.step = 2
    b.emit("request_arrived", request_id="p", tenant="tenant-a", num_prompt_tokens=32)
    b.emit("request_admitted", request_id="p", blocks_required=0, free_blocks=6,
           protected_blocks=0, usable_blocks=8)
    b.emit("block_evicted", block_id=2, block_hash=hashes[1], cause="allocation",
           by_request_id="p")
    if phantom:
        b.emit("block_hit", block_id=2, block_hash=hashes[1], position=1, request_id="p")
    else:
        b.emit("block_allocated", block_id=3, request_id="p")
        b.emit("block_cached", block_id=3, block_hash=hashes[1], position=1, request_id="p")
    b.step = 3
    b.emit("request_finished", request_id="p", finish_reason="stop", num_cached_tokens=32,
           num_output_tokens=1)
    b.step = None
    return b.finish()


def shape_gap_in_step(same_step: bool) -> list[dict[str, Any]]:
    """A claimed block is lost in step 2, and the recorder drops events (a recorder_gap) in
    that same step (``same_step``: they could hold the repair: unknown) or only in step 3 (the
    loss stays harm)."""
    b = TraceBuilder("gap-in-step" if same_step else "gap-next-step", usable=8)
    b.step = 1
    hashes = _claimed_pair(b, "hard_protected", None)
    b.step = 2
    b.emit("block_evicted", block_id=2, block_hash=hashes[1], cause="allocation",
           by_request_id="p")
    if not same_step:
        b.step = 3
        b.emit("request_arrived", request_id="q", tenant="tenant-a", num_prompt_tokens=16)
    first = len(b.events)  # seqs first, first+1 are dropped
    b.events.append({"run_id": b.run_id, "seq": first + 2, "ts_ns": b.ts + 3000,
                     "event": "recorder_gap", "first_seq": first, "last_seq": first + 1,
                     "events_dropped": 2, "reason": "buffer_full"})
    b.ts += 3000
    b.events.append({"run_id": b.run_id, "seq": first + 3, "ts_ns": b.ts + 1000,
                     "event": "run_finished", "events_written": first + 2,
                     "events_dropped": 2})
    return b.events


def shape_claim_id_reuse(other_tenant: bool) -> list[dict[str, Any]]:
    """tenant-a's claim:a is in force; with ``other_tenant`` tenant-b submits the same id (the
    runtime rejects it), then tenant-a releases its claim and block 2 is lost: the release and
    the loss belong to tenant-a's instance (relaxation), never to tenant-b's rejected one."""
    b = TraceBuilder("claim-id-reuse" if other_tenant else "claim-id-single", usable=8)
    hashes = _claimed_pair(b, "hard_protected", None)
    if other_tenant:
        b.emit("request_arrived", request_id="b1", tenant="tenant-b", num_prompt_tokens=32,
               claim_id="claim:a")
        b.emit("claim_submitted", claim_id="claim:a", tenant="tenant-b", request_id="b1",
               protection_mode="hard_protected", threshold_blocks=2, value=1.0)
        b.emit("claim_rejected", claim_id="claim:a", request_id="b1",
               reason="claim_id must be a non-empty string not in use")
    b.emit("claim_released", claim_id="claim:a", reason="client released",
           released_by="tenant", request_id="a2", tenant="tenant-a")
    b.emit("block_evicted", block_id=2, block_hash=hashes[1], cause="allocation",
           by_request_id="x")
    return b.finish()


SHAPES: Final[dict[str, Callable[[], list[dict[str, Any]]]]] = {
    "native_60_70_80": lambda: capacity_probe("native-60-70-80"),
    "write_no_admit_60_70_80": lambda: capacity_probe(
        "write-no-admit-60-70-80", policy="write_no_admit", write_no_admit=True),
    "unenforced_60_70_80": lambda: capacity_probe(
        "unenforced-60-70-80", claim_mode="hard_protected"),
    "hard_60_70_80": lambda: capacity_probe(
        "hard-60-70-80", policy="hard_protected", claim_mode="hard_protected"),
    "demote_60_70_80": lambda: capacity_probe(
        "demote-60-70-80", policy="demote_on_conflict", claim_mode="demotable"),
    "ttl_60_70_80": lambda: capacity_probe(
        "ttl-60-70-80", policy="ttl_expiry", claim_mode="expiring", ttl_s=1.0),
    "hard_60_70_130": lambda: capacity_probe(
        "hard-60-70-130", policy="hard_protected", claim_mode="hard_protected", usable=130),
    "l6_position_zero": l6_position_zero,
    "multi_claim": shape_multi_claim,
    "rematerialize": shape_rematerialize,
    "reset": shape_reset,
    "gap": shape_gap,
    "truncated": shape_truncated,
    "rejected": shape_rejected,
    "never_materialized": shape_never_materialized,
    "never_submitted": shape_never_submitted,
    "threshold": shape_threshold,
    "released": shape_released,
    "requests": shape_preempted,
    "unenforced_60_70_130": lambda: capacity_probe(
        "unenforced-60-70-130", claim_mode="hard_protected", usable=130),
    **{f"reuse_{end}": (lambda end=end: shape_reuse(end))
       for end in ("released", "expired", "demoted", "rejected")},
    **{f"reuse_{end}_once": (lambda end=end: shape_reuse(end, again=False))
       for end in ("released", "expired", "demoted", "rejected")},
    "step_repaired": lambda: shape_step_repair(True),
    "step_not_repaired": lambda: shape_step_repair(False),
    "step_repaired_stepless": lambda: shape_step_repair(True, stepped=False),
    "mode_best_effort": lambda: shape_mode_loss("best_effort"),
    "mode_hard_protected": lambda: shape_mode_loss("hard_protected"),
    "soft_lower_evictable": lambda: shape_soft_loss(True),
    "soft_no_lower": lambda: shape_soft_loss(False),
    "hook_failed_before": lambda: shape_hook_failed(True),
    "hook_failed_after": lambda: shape_hook_failed(False),
    **{f"lifecycle_{case}": (lambda case=case: shape_lifecycle(case))
       for case in LIFECYCLE_CASES},
    "soft_lower_evictable_enforced": lambda: shape_soft_loss(True, "hard_protected"),
    "soft_no_lower_enforced": lambda: shape_soft_loss(False, "hard_protected"),
    "l6_position_zero_reported": lambda: l6_position_zero("l6-position-zero-reported",
                                                          report_materialized=True),
    "demotion_needed": lambda: shape_demotion_for(True),
    "demotion_not_needed": lambda: shape_demotion_for(False),
    "phantom_hit": lambda: shape_phantom_hit(True),
    "real_repair": lambda: shape_phantom_hit(False),
    "gap_in_step": lambda: shape_gap_in_step(True),
    "gap_next_step": lambda: shape_gap_in_step(False),
    "claim_id_reuse": lambda: shape_claim_id_reuse(True),
    "claim_id_single": lambda: shape_claim_id_reuse(False),
}


def to_jsonl(events: list[dict[str, Any]]) -> str:
    """Events as JSON Lines text (one compact object per line)."""
    return "".join(json.dumps(e, separators=(",", ":")) + "\n" for e in events)


def write_all(out_dir: str | Path) -> list[Path]:
    """Write every shape as ``OUT_DIR/<name>.jsonl``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, make in SHAPES.items():
        path = out / f"{name}.jsonl"
        path.write_text(to_jsonl(make()), encoding="utf-8")
        paths.append(path)
    return paths


if __name__ == "__main__":
    for p in write_all(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures"):
        print(p)
