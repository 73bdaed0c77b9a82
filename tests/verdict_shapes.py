"""Trace shapes for the verdict tests (docs/conformance.md): each shows one rule, and most
take a flag that builds its negative twin.

Built with ``kvclaims.sources.shapes.TraceBuilder`` (dense seqs, schema-checked events), in our
JSON Lines vocabulary; ``reconstruct_events`` turns them into reconstructed tables the way
``kvclaims reconstruct`` would, optionally with a manifest (``evidence``, ``lowering``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from kvclaims.reconstruct import core, loader
from kvclaims.sources import shapes
from kvclaims.sources.jsonl import events_to_table
from kvclaims.sources.shapes import TraceBuilder, block_hash
from kvclaims.sources.shapes import _cache  # a request caching n fresh blocks: one helper for both

Events = list[dict[str, Any]]
CLAIM = "claim:doc"


@dataclass
class FixtureTrace:
    """What ``core.reconstruct`` reads from a loaded trace: events plus per-run manifests."""

    events: pa.Table
    manifests: dict[str, dict[str, Any]] = field(default_factory=dict)
    truncated_runs: set[str] = field(default_factory=set)


def reconstruct_events(events: Events, manifest: dict[str, Any] | None = None) -> core.Tables:
    """Reconstruct JSON-Lines-shaped events (renumbered densely), with an optional manifest."""
    events = [{**e, "seq": i} for i, e in enumerate(events)]
    batches = [loader.decode_batch(b) for b in events_to_table(events).to_batches()]
    table = pa.Table.from_batches(batches, schema=loader.EVENTS_SCHEMA)
    if manifest is None:
        return core.reconstruct(table)
    run_ids = {e["run_id"] for e in events}
    return core.reconstruct(FixtureTrace(table, {rid: manifest for rid in run_ids}))


def verdicts(t: core.Tables) -> dict[str, tuple[str, str]]:
    """check -> (verdict, detail) of a one-run reconstruction."""
    rows = t.con.sql('SELECT "check", verdict, detail FROM conformance').fetchall()
    return {c: (v, d) for c, v, d in rows}


def _claim(b: TraceBuilder, hashes: list[int], *, claim: str = CLAIM, tenant: str = "tenant-a",
           mode: str = "hard_protected", request: str = "r", ttl_s: float | None = None) -> int:
    """Submit, accept and bind a claim over hashes; return its submit seq (its claim_seq)."""
    seq = b.emit("claim_submitted", claim_id=claim, tenant=tenant, request_id=request,
                 protection_mode=mode, threshold_blocks=len(hashes), value=1.0, ttl_s=ttl_s)
    b.emit("claim_accepted", claim_id=claim)
    for i, h in enumerate(hashes):
        b.emit("claim_bound", claim_id=claim, block_hash=h, position=i)
    return seq


def _demote_for(b: TraceBuilder, claim: str, need: int, request: str = "x") -> None:
    """``claim`` is demoted to admit ``request`` of ``need`` blocks (8 usable): a justified
    demotion when the claim's freed blocks + the rest protected + need exceed the pool."""
    b.emit("request_arrived", request_id=request, tenant="tenant-b", num_prompt_tokens=need * 16)
    b.emit("claim_demoted", claim_id=claim, reason="conflict", by_request_id=request)
    b.emit("request_admitted", request_id=request, blocks_required=need, free_blocks=8 - need,
           protected_blocks=0, usable_blocks=8)


# -- claim instances and ownership -------------------------------------------------------------

def reused_after_release(*, second_submit: bool = True, end: str = "claim_released") -> Events:
    """A claim ended by ``end`` (released, expired, demoted or rejected), then declared again
    with the same id and harmed.

    Twin (``second_submit=False``): no second declaration, so the loss belongs to the first
    instance (a relaxation after a release).
    """
    b = TraceBuilder("reuse-after-release", usable=8)
    hashes = _cache(b, "r", 2)
    if end == "claim_rejected":
        b.emit("claim_submitted", claim_id=CLAIM, tenant="tenant-a", request_id="r",
               protection_mode="expiring", threshold_blocks=2, value=1.0)
        b.emit("claim_rejected", claim_id=CLAIM, reason="expiring needs ttl_s", request_id="r")
    else:
        # the mode the end needs to be legitimate (docs/design.md §5)
        _claim(b, hashes, mode={"claim_demoted": "demotable", "claim_expired": "expiring"}.get(
            end, "best_effort"), ttl_s=1.0 if end == "claim_expired" else None)
    if end == "claim_released":
        b.emit("claim_released", claim_id=CLAIM, reason="client released", released_by="tenant",
               request_id="r", tenant="tenant-a")
    elif end == "claim_expired":
        b.advance(1_000_000_000)
        b.emit("claim_expired", claim_id=CLAIM, reason="ttl_s elapsed")
    elif end == "claim_demoted":
        _demote_for(b, CLAIM, 7)
    if second_submit:
        _claim(b, hashes, mode="demotable")
    b.emit("block_evicted", block_id=2, block_hash=hashes[1], cause="allocation",
           by_request_id="x")
    return b.finish()


def released_by(who: str | None) -> Events:
    """A claim ended by ``claim_released`` (released_by=who) or, for None, by a demotion."""
    b = TraceBuilder("released-by", policy="demote_on_conflict", usable=8)
    hashes = _cache(b, "r", 2)
    _claim(b, hashes, mode="demotable")
    if who is None:
        _demote_for(b, CLAIM, 7)
    else:
        b.emit("claim_released", claim_id=CLAIM, reason="released", released_by=who,
               request_id="r" if who == "tenant" else None,
               tenant="tenant-a" if who == "tenant" else None)
    return b.finish()


def release_refused(*, refused: bool = True) -> Events:
    """Another tenant asks to release tenant-a's claim and is refused (twin: nobody asks)."""
    b = TraceBuilder("release-refused", policy="hard_protected", usable=8)
    hashes = _cache(b, "r", 2)
    _claim(b, hashes)
    if refused:
        b.emit("claim_release_refused", claim_id=CLAIM, reason="not the claim's tenant",
               request_id="intruder", tenant="tenant-b")
    return b.finish()


# -- preemption attribution --------------------------------------------------------------------

def preempted_by_pinned(*, attributed: bool = True) -> Events:
    """A request preempted while a hard claim pinned 6 blocks (twin: a v1 event, no fields)."""
    b = TraceBuilder("preempted", policy="hard_protected", usable=8)
    hashes = _cache(b, "r", 6)
    _claim(b, hashes)
    b.emit("request_arrived", request_id="grow", tenant="tenant-b", num_prompt_tokens=16)
    b.emit("request_admitted", request_id="grow", blocks_required=1, free_blocks=2,
           protected_blocks=6, usable_blocks=8)
    fields: dict[str, Any] = {}
    if attributed:
        fields = dict(free_blocks=0, protected_blocks=6, usable_blocks=8,
                      blocking_claim_ids=[CLAIM])
    b.emit("request_preempted", request_id="grow", **fields)
    b.emit("request_finished", request_id="grow", finish_reason="length", num_cached_tokens=0,
           num_output_tokens=40)
    return b.finish()


# -- fail-open marks ---------------------------------------------------------------------------

def hard_with_hook_failure(where: str | None) -> Events:
    """The hard 60/70/80 probe with a ``hook_failed`` event.

    ``where``: "start" (before any enforcement evidence), "end" (after all of it), None (no
    failure).
    """
    events = shapes.capacity_probe("hook-failed", policy="hard_protected",
                                   claim_mode="hard_protected")
    mark = {"run_id": "hook-failed", "seq": 0, "ts_ns": 0, "event": "hook_failed",
            "hook": "scheduler.schedule", "error_type": "RuntimeError"}
    if where == "start":
        i = next(i for i, e in enumerate(events) if e["event"] == "request_arrived")
        events.insert(i, {**mark, "ts_ns": events[i]["ts_ns"]})
    elif where == "end":
        events.insert(len(events) - 1, {**mark, "ts_ns": events[-1]["ts_ns"]})
    return events


def refusal_around_hook(*, hook_first: bool) -> Events:
    """A refusal that names no blocking claim (a violation whatever the labels); a
    ``hook_failed`` comes before it (``hook_first``) or after it."""
    b = TraceBuilder("refusal-hook", policy="hard_protected", usable=8)
    b.emit("request_arrived", request_id="big", tenant="tenant-b", num_prompt_tokens=160)
    if hook_first:
        b.emit("hook_failed", hook="arbiter.admit", error_type="ValueError")
    b.emit("request_refused", request_id="big", blocks_required=10, free_blocks=8,
           protected_blocks=0, usable_blocks=8, blocking_claim_ids=[], shortfall_blocks=2,
           reason="protected_resident_capacity")
    if not hook_first:
        b.emit("hook_failed", hook="arbiter.admit", error_type="ValueError")
    return b.finish()


def protected_loss_around_hook(*, hook_first: bool) -> Events:
    """A hard claim in force loses a block under an enforcing policy (a violation); a
    ``hook_failed`` comes before it (``hook_first``) or after it."""
    b = TraceBuilder("protected-loss", policy="hard_protected", usable=8)
    hashes = _cache(b, "r", 2)
    _claim(b, hashes)
    b.emit("claim_materialized", claim_id=CLAIM)
    if hook_first:
        b.emit("hook_failed", hook="block_pool.touch", error_type="KeyError")
    b.emit("block_evicted", block_id=2, block_hash=hashes[1], cause="allocation",
           by_request_id="x")
    b.emit("claim_harmed", claim_id=CLAIM, block_hash=hashes[1])
    if not hook_first:
        b.emit("hook_failed", hook="block_pool.touch", error_type="KeyError")
    return b.finish()


# -- L4: only the demoted instance's losses count ----------------------------------------------

def demoted_beside_released() -> Events:
    """A demoted claim loses 2 blocks; another claim, released, loses 3 (not L4's business)."""
    b = TraceBuilder("demoted-beside-released", policy="demote_on_conflict", usable=8)
    dem = _cache(b, "d", 2)
    rel = _cache(b, "u", 3, first_block=3)
    _claim(b, dem, claim="claim:demoted", mode="demotable", request="d")
    _claim(b, rel, claim="claim:released", mode="demotable", request="u")
    _demote_for(b, "claim:demoted", 4)   # 3 still protected + 2 freed + 4 > 8
    b.emit("claim_released", claim_id="claim:released", reason="done", released_by="operator")
    for bid, h in [(1, dem[0]), (2, dem[1]), (3, rel[0]), (4, rel[1]), (5, rel[2])]:
        b.emit("block_evicted", block_id=bid, block_hash=h, cause="allocation",
               by_request_id="x")
    return b.finish()


def demoted_without_loss() -> Events:
    """A claim demoted whose content is never lost: L4 has nothing to judge."""
    b = TraceBuilder("demoted-no-loss", policy="demote_on_conflict", usable=8)
    hashes = _cache(b, "d", 2)
    _claim(b, hashes, mode="demotable", request="d")
    _demote_for(b, CLAIM, 7)
    return b.finish()


# -- L7: what vLLM told the client -------------------------------------------------------------

def full_prompt_hit(*, reported_blocks: int, blocks: int = 4, recorded_hits: int = 4) -> Events:
    """A prompt of ``blocks`` full blocks cached, then sent again: the trace records
    ``recorded_hits`` block_hit events, vLLM reports ``reported_blocks`` blocks cached.

    vLLM recomputes the last token of a fully cached prompt, so the right report for a full
    hit is ``blocks - 1`` blocks.
    """
    b = TraceBuilder("cached-tokens", usable=8, block_size=16)
    hashes = _cache(b, "first", blocks)
    b.emit("request_arrived", request_id="again", tenant="tenant-a",
           num_prompt_tokens=blocks * 16)
    b.emit("request_admitted", request_id="again", blocks_required=1, free_blocks=8 - blocks,
           protected_blocks=0, usable_blocks=8)
    for i in range(recorded_hits):
        b.emit("block_hit", block_id=i + 1, block_hash=hashes[i], request_id="again")
    b.emit("request_finished", request_id="again", finish_reason="stop",
           num_cached_tokens=reported_blocks * 16, num_output_tokens=1)
    return b.finish()


# -- lowering ----------------------------------------------------------------------------------

def offloadable_claim(*, rejected: bool) -> Events:
    """An offloadable claim, rejected at submission (schema 2) or accepted (an older runtime)."""
    b = TraceBuilder("offloadable", policy="hard_protected", usable=8)
    hashes = _cache(b, "r", 2)
    b.emit("claim_submitted", claim_id=CLAIM, tenant="tenant-a", request_id="r",
           protection_mode="offloadable", threshold_blocks=2, value=1.0)
    if rejected:
        b.emit("claim_rejected", claim_id=CLAIM, request_id="r",
               reason="protection_mode 'offloadable' needs an offload tier, which this runtime "
                      "does not have")
    else:
        b.emit("claim_accepted", claim_id=CLAIM)
        for i, h in enumerate(hashes):
            b.emit("claim_bound", claim_id=CLAIM, block_hash=h, position=i)
    return b.finish()


def denied_while_others_evict(*, other_in_window: bool) -> Events:
    """A reuse-denied request evicts a resident block before its denial and one after; another
    request evicts one resident block after the denied request ends and (``other_in_window``)
    one while it runs. L2 counts each resident loss once: the request's own, and those while
    it ran."""
    b = TraceBuilder("denied-window", policy="write_no_admit", usable=8)
    hashes = _cache(b, "a", 6)
    for i in range(6):
        b.emit("block_freed", block_id=i + 1, request_id="a")

    def evict(block: int, by: str) -> None:
        b.emit("block_evicted", block_id=block, block_hash=hashes[block - 1], cause="allocation",
               by_request_id=by)
        b.emit("block_allocated", block_id=block, request_id=by)

    b.emit("request_arrived", request_id="d", tenant="tenant-b", num_prompt_tokens=32)
    b.emit("request_admitted", request_id="d", blocks_required=2, free_blocks=2,
           protected_blocks=0, usable_blocks=8)
    evict(6, "d")
    b.emit("reuse_denied", request_id="d")
    evict(5, "d")
    b.emit("request_arrived", request_id="o", tenant="tenant-b", num_prompt_tokens=32)
    b.emit("request_admitted", request_id="o", blocks_required=2, free_blocks=0,
           protected_blocks=0, usable_blocks=8)
    if other_in_window:
        evict(4, "o")
    b.emit("request_finished", request_id="d", finish_reason="length", num_cached_tokens=0,
           num_output_tokens=1)
    evict(3, "o")
    b.emit("request_finished", request_id="o", finish_reason="length", num_cached_tokens=0,
           num_output_tokens=1)
    return b.finish()


def unclaimed_losses(*, by_reset: bool) -> Events:
    """Three unclaimed cached blocks lost at once by a cache_reset (one seq), or (twin) each
    evicted by an event of its own (three seqs)."""
    b = TraceBuilder("unclaimed-losses", usable=8)
    hashes = _cache(b, "a", 3)
    if by_reset:
        b.emit("cache_reset", reason="reset_prefix_cache")
    else:
        for i, h in enumerate(hashes):
            b.emit("block_evicted", block_id=i + 1, block_hash=h, cause="allocation",
                   by_request_id="x")
    return b.finish()
