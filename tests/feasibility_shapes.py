"""Trace shapes for rebuilt feasibility, lowering from evidence and non-vacuous checks
(docs/conformance.md): each shows one rule, and its flag builds the negative twin.

Built with ``kvclaims.sources.shapes.TraceBuilder`` (dense seqs, schema-checked events).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from kvclaims.sources.shapes import TraceBuilder, _cache, block_hash

Events = list[dict[str, Any]]
CLAIM: Final[str] = "claim:doc"


def _resident_claim(b: TraceBuilder, n: int) -> list[int]:
    """Request ``r`` caches n blocks (ids 1..n) under a hard claim, finishes and frees them."""
    hashes = _cache(b, "r", n, claim=CLAIM, mode="hard_protected")
    for i in reversed(range(n)):
        b.emit("block_freed", block_id=i + 1, request_id="r")
    return hashes


def refusal_of(need: int) -> Events:
    """Under hard_protected at 8 usable blocks, a 2-block claim is resident and a request of
    ``need`` blocks is refused naming it. ``need=2``: it fit (2 + 2 <= 8), an unjustified
    refusal; ``need=7``: 2 + 7 > 8, a justified one (the twin)."""
    b = TraceBuilder("refusal", policy="hard_protected", usable=8)
    _resident_claim(b, 2)
    b.emit("request_arrived", request_id="x", tenant="tenant-b", num_prompt_tokens=need * 16)
    b.emit("request_refused", request_id="x", blocks_required=need, free_blocks=6,
           protected_blocks=2, usable_blocks=8, blocking_claim_ids=[CLAIM],
           shortfall_blocks=max(1, 2 + need - 8), reason="protected_resident_capacity")
    b.emit("request_finished", request_id="x", finish_reason="error", num_cached_tokens=0,
           num_output_tokens=0)
    return b.finish()


def refusal_naming_idle(*, name_idle: bool) -> Events:
    """Under hard_protected at 8 usable blocks, a 2-block claim is resident and a second hard
    claim (``claim:idle``, materialized) lost both its blocks; a 7-block request is refused
    (2 + 7 > 8). ``name_idle``: the refusal also names ``claim:idle``, in force but holding no
    block there; the twin names only the claim whose blocks were needed."""
    b = TraceBuilder("refusal-idle", policy="hard_protected", usable=8)
    _resident_claim(b, 2)
    idle = _cache(b, "q", 2, first_block=3, claim="claim:idle", mode="hard_protected")
    for i in reversed(range(2)):
        b.emit("block_freed", block_id=3 + i, request_id="q")
    for i in range(2):
        b.emit("block_evicted", block_id=3 + i, block_hash=idle[i], cause="allocation",
               by_request_id="t")
    b.emit("request_arrived", request_id="x", tenant="tenant-b", num_prompt_tokens=7 * 16)
    b.emit("request_refused", request_id="x", blocks_required=7, free_blocks=6,
           protected_blocks=2, usable_blocks=8,
           blocking_claim_ids=[CLAIM, "claim:idle"] if name_idle else [CLAIM],
           shortfall_blocks=1, reason="protected_resident_capacity")
    b.emit("request_finished", request_id="x", finish_reason="error", num_cached_tokens=0,
           num_output_tokens=0)
    return b.finish()


def live_pressure(*, running: bool) -> Events:
    """Under hard_protected at 8 usable blocks: a 4-block claim is resident, request ``run``
    holds 3 blocks, and request ``new`` (3 blocks) is admitted: the runtime counts 4 + 3 <= 8,
    the trace 4 protected + 3 live + 3 needed = 10 > 8. Twin (``running=False``): ``run`` has
    finished and freed its blocks: 4 + 0 + 3 <= 8."""
    b = TraceBuilder("live-pressure", policy="hard_protected", usable=8)
    _resident_claim(b, 4)
    b.emit("request_arrived", request_id="run", tenant="tenant-a", num_prompt_tokens=3 * 16)
    b.emit("request_admitted", request_id="run", blocks_required=3, free_blocks=4,
           protected_blocks=4, usable_blocks=8)
    for i in range(3):
        b.emit("block_allocated", block_id=5 + i, request_id="run")
    if not running:
        b.emit("request_finished", request_id="run", finish_reason="stop", num_cached_tokens=0,
               num_output_tokens=1)
        for i in reversed(range(3)):
            b.emit("block_freed", block_id=5 + i, request_id="run")
    b.emit("request_arrived", request_id="new", tenant="tenant-b", num_prompt_tokens=3 * 16)
    b.emit("request_admitted", request_id="new", blocks_required=3,
           free_blocks=1 if running else 4, protected_blocks=4, usable_blocks=8)
    for i in range(1 if running else 3):
        b.emit("block_allocated", block_id=8 - i, request_id="new")
    return b.finish()


def hit_while_running(*, on_claim: bool) -> Events:
    """Under hard_protected at 8 usable blocks: a 2-block claim (blocks 1-2) and two unclaimed
    cached blocks (3-4); request ``h`` hits two of them and allocates block 5, still running
    when request ``new`` is admitted. ``on_claim``: it hits the claim's blocks, which count as
    protected, not again as live (live 1); the twin hits the unclaimed ones (live 3)."""
    b = TraceBuilder("hit-running", policy="hard_protected", usable=8)
    claimed = _resident_claim(b, 2)
    other = _cache(b, "s", 2, first_block=3)
    for i in reversed(range(2)):
        b.emit("block_freed", block_id=3 + i, request_id="s")
    b.emit("request_arrived", request_id="h", tenant="tenant-a", num_prompt_tokens=3 * 16)
    b.emit("request_admitted", request_id="h", blocks_required=1, free_blocks=4,
           protected_blocks=2, usable_blocks=8)
    hit_block, hashes = (1, claimed) if on_claim else (3, other)
    for i in range(2):
        b.emit("block_hit", block_id=hit_block + i, block_hash=hashes[i], request_id="h")
    b.emit("block_allocated", block_id=5, request_id="h")
    b.emit("request_arrived", request_id="new", tenant="tenant-b", num_prompt_tokens=16)
    b.emit("request_admitted", request_id="new", blocks_required=1, free_blocks=3,
           protected_blocks=2, usable_blocks=8)
    b.emit("block_allocated", block_id=6, request_id="new")
    return b.finish()


def chunked_prefill(*, counted_blocks: int) -> Events:
    """A 6-block prompt admitted once and allocated 2 blocks per scheduler step over 3 steps
    (chunked prefill). The runtime counts ``counted_blocks`` at the admission: 6 is the full
    need; 2 (one chunk) is the twin that treats chunking as bounding live KV."""
    b = TraceBuilder("chunked", policy="hard_protected", usable=8)
    b.step = 1
    b.emit("request_arrived", request_id="c", tenant="tenant-a", num_prompt_tokens=6 * 16)
    for i in range(2):
        b.emit("block_allocated", block_id=1 + i, request_id="c")
    b.emit("request_admitted", request_id="c", blocks_required=counted_blocks, free_blocks=8,
           protected_blocks=0, usable_blocks=8)
    for step in (2, 3):
        b.step = step
        for i in range(2):
            b.emit("block_allocated", block_id=1 + 2 * (step - 1) + i, request_id="c")
    b.step = 4
    b.emit("request_finished", request_id="c", finish_reason="stop", num_cached_tokens=0,
           num_output_tokens=1)
    b.step = None
    return b.finish()


def hard_loss(*, claims_block: bool) -> Events:
    """Under hard_protected at 8 usable blocks, a 2-block hard claim is resident and request
    ``s`` caches 2 more; then a block is evicted. ``claims_block=False``: the evicted block is
    ``s``'s (pressure, and the claim kept its blocks); ``True``: it is the claim's (harm)."""
    b = TraceBuilder("hard-loss", policy="hard_protected", usable=8)
    hashes = _resident_claim(b, 2)
    other = _cache(b, "s", 2, first_block=3)
    for i in reversed(range(2)):
        b.emit("block_freed", block_id=3 + i, request_id="s")
    block, h = (1, hashes[0]) if claims_block else (3, other[0])
    b.emit("block_evicted", block_id=block, block_hash=h, cause="allocation", by_request_id="t")
    return b.finish()


def no_claim_admissions() -> Events:
    """Under hard_protected, requests admitted while no claim protects anything."""
    b = TraceBuilder("no-claim", policy="hard_protected", usable=8)
    _cache(b, "r", 2)
    _cache(b, "s", 2, first_block=3)
    return b.finish()


def manifest_lowering(verdict: Any) -> dict[str, Any]:
    """A manifest whose lowering section declares ``verdict`` for hard_protected."""
    return {"lowering": {"hard_protected": {"verdict": verdict, "evidence": "hand-added"}}}


SHAPES: Final[dict[str, Callable[[], Events]]] = {
    "hard_unrelated_loss": lambda: hard_loss(claims_block=False),
    "hard_claim_loss": lambda: hard_loss(claims_block=True),
}

__all__ = ["block_hash", "CLAIM", "SHAPES"]
