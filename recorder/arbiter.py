"""The claim arbiter: tracks every claim's lifecycle and enforces the protection modes.

It knows nothing of vLLM's classes: the block-pool hooks tell it what happens to block content
(``on_resident`` / ``on_lost``), and it acts on the pool only through two callbacks, ``pin`` and
``unpin`` (an extra reference through vLLM's own ``BlockPool.touch`` / ``free_blocks``).

NOTE: invariants
- a block is pinned at most once, however many claims protect it (``_pins[block_id]`` holds
  the set of claims); it is unpinned when that set becomes empty;
- only claims in force under an enforcing policy, in a pinning mode, pin blocks;
- ``claim_demoted`` / ``claim_expired`` / ``claim_released`` are emitted before the unpin that
  can make their blocks victims, so a relaxation loss always follows its release in the trace.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from recorder.claims import ClaimDeclaration, Rejection, parse_claim
from recorder.policies import PINNING_MODES, Policy
from recorder.schema import hash64

Emit = Callable[..., None]
Block = Any  # vLLM's KVCacheBlock (has .block_id); opaque here


@dataclass
class Claim:
    """One accepted claim and its live state."""

    decl: ClaimDeclaration
    request_id: str
    mode: str
    threshold: int
    hashes: list[Hashable]  # bound content, by logical position
    deadline: float | None  # engine monotonic clock
    status: str = "in_force"  # in_force | demoted | expired | released
    missing: int = 0  # positions < threshold not resident
    materialized: bool = False
    broken: bool = False  # predicate held once and is now false

    @property
    def in_force(self) -> bool:
        return self.status == "in_force"


@dataclass(frozen=True)
class Admission:
    """The arbiter's answer for a request asking for blocks."""

    action: str  # admit | defer | refuse
    fields: dict[str, Any] = field(default_factory=dict)


class ClaimArbiter:
    """Claims of one engine: lifecycle, materialization, protection and admission."""

    def __init__(self, policy: Policy, usable_blocks: int, emit: Emit,
                 pin: Callable[[list[Block]], None], unpin: Callable[[list[Block]], None],
                 *, max_defer_steps: int = 1, max_defer_s: float = 0.0,
                 clock: Callable[[], float] = time.monotonic):
        self.policy = policy
        self.usable_blocks = usable_blocks
        self.max_defer_steps = max_defer_steps
        self.max_defer_s = max_defer_s
        self._emit = emit
        self._pin_cb = pin
        self._unpin_cb = unpin
        self._clock = clock
        self.claims: dict[str, Claim] = {}
        self._by_hash: dict[Hashable, list[tuple[Claim, int]]] = {}
        self._resident: dict[Hashable, dict[int, Block]] = {}  # hash -> block_id -> block
        self._pins: dict[int, set[str]] = {}
        self._pinned: dict[int, tuple[Block, int]] = {}  # block_id -> (block, position)
        self._deferrals: dict[str, tuple[int, float]] = {}  # request -> (steps, since)
        self._soft_in_force: set[str] = set()

    # ----------------------------------------------------------------- declarations
    def on_request(self, request_id: str, raw: dict[str, Any] | None,
                   releases: Sequence[str], block_hashes: Sequence[Hashable]) -> None:
        """Handle the releases and the claim (``raw_claim`` form) a new request declares."""
        for claim_id in releases:
            self.release(claim_id, reason=f"released by request {request_id}")
        if raw is None:
            return
        parsed = parse_claim(raw, request_id, len(block_hashes))
        claim_id = parsed.claim_id
        self._emit("claim_submitted", claim_id=claim_id, request_id=request_id,
                   tenant=_str_or_none(raw.get("tenant")),
                   protection_mode=_str_or_none(raw.get("protection_mode")),
                   threshold_blocks=_int_or_none(raw.get("threshold_blocks")),
                   ttl_s=_float_or_none(raw.get("ttl_s")), value=_float_or_none(raw.get("value")))
        if isinstance(parsed, ClaimDeclaration):
            parsed = self._check_in_context(parsed)
        if isinstance(parsed, Rejection):
            self._emit("claim_rejected", claim_id=claim_id, reason=parsed.reason,
                       request_id=request_id)
            return
        self._accept(parsed, request_id, list(block_hashes))

    def _check_in_context(self, decl: ClaimDeclaration) -> ClaimDeclaration | Rejection:
        mode = decl.protection_mode or self.policy.default_mode
        existing = self.claims.get(decl.claim_id)
        if existing is not None and existing.in_force:
            return Rejection(decl.claim_id, "a claim with this claim_id is already in force", {})
        if mode == "expiring" and decl.ttl_s is None:
            return Rejection(decl.claim_id, "protection_mode 'expiring' needs ttl_s", {})
        return decl

    def _accept(self, decl: ClaimDeclaration, request_id: str, hashes: list[Hashable]) -> None:
        mode = decl.protection_mode or self.policy.default_mode
        threshold = decl.threshold_blocks or len(hashes)
        deadline = None if decl.ttl_s is None else self._clock() + decl.ttl_s
        claim = Claim(decl, request_id, mode, threshold, hashes, deadline)
        self.claims[decl.claim_id] = claim
        if mode == "soft_priority":
            self._soft_in_force.add(decl.claim_id)
        self._emit("claim_accepted", claim_id=decl.claim_id)
        for position, block_hash in enumerate(hashes):
            self._emit("claim_bound", claim_id=decl.claim_id, block_hash=hash64(block_hash),
                       position=position)
            self._by_hash.setdefault(block_hash, []).append((claim, position))
            copies = self._resident.get(block_hash)
            if position < threshold and not copies:
                claim.missing += 1
            if copies and self._protects(claim):
                for block in copies.values():
                    self._pin(claim, block, position)
        self._check_materialized(claim)

    # ----------------------------------------------------------------- block content
    def on_resident(self, block: Block, block_hash: Hashable) -> None:
        """A block now holds reusable content (cached, or hit by a request)."""
        copies = self._resident.setdefault(block_hash, {})
        first_copy = not copies
        copies[block.block_id] = block
        for claim, position in self._by_hash.get(block_hash, ()):
            if first_copy and position < claim.threshold:
                claim.missing -= 1
                self._check_materialized(claim)
            if self._protects(claim):
                self._pin(claim, block, position)

    def on_lost(self, block_id: int, block_hash: Hashable) -> None:
        """A block's content was evicted; report harm where a predicate breaks."""
        copies = self._resident.get(block_hash)
        if not copies or copies.pop(block_id, None) is None or copies:
            return
        del self._resident[block_hash]
        for claim, position in self._by_hash.get(block_hash, ()):
            if position >= claim.threshold:
                continue
            claim.missing += 1
            if claim.missing == 1 and claim.materialized and claim.in_force:
                claim.broken = True
                self._emit("claim_harmed", claim_id=claim.decl.claim_id,
                           block_hash=hash64(block_hash))

    def on_reset(self) -> None:
        """vLLM dropped every cached hash (``reset_prefix_cache``)."""
        for block_hash, copies in list(self._resident.items()):
            for block_id in list(copies):
                self.on_lost(block_id, block_hash)

    @property
    def has_soft_claims(self) -> bool:
        """Whether allocation must look for soft-claimed blocks at all (cheap, hot path)."""
        return self.policy.enforce and bool(self._soft_in_force)

    def is_protected(self, block_id: int) -> bool:
        """Whether a claim holds an extra reference on this block."""
        return block_id in self._pins

    def is_soft_claimed(self, block_hash: Hashable) -> bool:
        """Whether evicting this content should wait for every unclaimed candidate."""
        if not self.policy.enforce:
            return False
        return any(c.in_force and c.mode == "soft_priority"
                   for c, _ in self._by_hash.get(block_hash, ()))

    # ----------------------------------------------------------------- lifecycle
    def tick(self) -> None:
        """Expire claims whose ttl has passed (called at every scheduler step)."""
        now = self._clock()
        for claim in list(self.claims.values()):
            if claim.in_force and claim.deadline is not None and now >= claim.deadline:
                self._end(claim, "expired", "claim_expired", f"ttl_s={claim.decl.ttl_s} elapsed")

    def release(self, claim_id: str, reason: str = "released") -> bool:
        """Release an in-force claim explicitly; False if there is none by that id."""
        claim = self.claims.get(claim_id)
        if claim is None or not claim.in_force:
            return False
        self._end(claim, "released", "claim_released", reason)
        return True

    def _end(self, claim: Claim, status: str, event: str, reason: str, **extra: Any) -> None:
        claim.status = status
        self._soft_in_force.discard(claim.decl.claim_id)
        self._emit(event, claim_id=claim.decl.claim_id, reason=reason, **extra)
        self._unpin_claim(claim)

    # ----------------------------------------------------------------- admission
    @property
    def protected_blocks(self) -> int:
        return len(self._pins)

    def admit(self, request_id: str, blocks_required: int, free_blocks: int) -> Admission:
        """Decide whether a waiting request may allocate ``blocks_required`` new blocks.

        NOTE: feasibility is ``protected + required <= usable``; only an enforcing policy can
        defer or refuse, and only because of protected blocks.
        """
        fields = {"request_id": request_id, "blocks_required": blocks_required,
                  "free_blocks": free_blocks, "usable_blocks": self.usable_blocks}
        if not self.policy.enforce:
            return Admission("admit", {**fields, "protected_blocks": self.protected_blocks})
        shortfall = self.protected_blocks + blocks_required - self.usable_blocks
        if shortfall > 0:
            for claim in self._demotion_plan(shortfall):
                self._end(claim, "demoted", "claim_demoted",
                          f"conflict with request {request_id}", by_request_id=request_id)
            shortfall = self.protected_blocks + blocks_required - self.usable_blocks
        fields["protected_blocks"] = self.protected_blocks
        if shortfall <= 0:
            self._deferrals.pop(request_id, None)
            return Admission("admit", fields)
        blocking = sorted({cid for cids in self._pins.values() for cid in cids})
        fields.update(blocking_claim_ids=blocking, shortfall_blocks=shortfall)
        fields["reason"] = "protected_resident_capacity"
        steps, since = self._deferrals.get(request_id, (0, self._clock()))
        if steps >= self.max_defer_steps and self._clock() - since >= self.max_defer_s:
            self._deferrals.pop(request_id, None)
            return Admission("refuse", fields)
        self._deferrals[request_id] = (steps + 1, since)
        # NOTE: only the first deferral is news; later steps of the same wait are not events.
        return Admission("defer" if steps == 0 else "wait", fields)

    def _demotion_plan(self, shortfall: int) -> list[Claim]:
        """The fewest demotable claims (lowest value first) whose blocks cover the shortfall."""
        candidates = [c for c in self.claims.values() if c.in_force and c.mode == "demotable"]
        gains = {c.decl.claim_id: self._sole_pins(c) for c in candidates}
        candidates.sort(key=lambda c: (c.decl.value, -gains[c.decl.claim_id]))
        plan: list[Claim] = []
        freed = 0
        for claim in candidates:
            if freed >= shortfall:
                break
            if gains[claim.decl.claim_id] == 0:
                continue
            plan.append(claim)
            freed += gains[claim.decl.claim_id]
        # A partial plan helps nobody: demote only when it makes the request fit.
        return plan if freed >= shortfall else []

    def _sole_pins(self, claim: Claim) -> int:
        cid = claim.decl.claim_id
        return sum(1 for cids in self._pins.values() if cids == {cid})

    # ----------------------------------------------------------------- pins
    def _protects(self, claim: Claim) -> bool:
        return self.policy.enforce and claim.in_force and claim.mode in PINNING_MODES

    def _pin(self, claim: Claim, block: Block, position: int) -> None:
        owners = self._pins.get(block.block_id)
        if owners is None:
            self._pins[block.block_id] = {claim.decl.claim_id}
            self._pinned[block.block_id] = (block, position)
            self._pin_cb([block])
        else:
            owners.add(claim.decl.claim_id)

    def _unpin_claim(self, claim: Claim) -> None:
        cid = claim.decl.claim_id
        released: list[tuple[Block, int]] = []
        for block_id, owners in list(self._pins.items()):
            if cid in owners:
                owners.discard(cid)
                if not owners:
                    del self._pins[block_id]
                    released.append(self._pinned.pop(block_id))
        if released:
            # Tail first, like vLLM frees a finished request: the leading blocks survive longest.
            released.sort(key=lambda bp: -bp[1])
            self._unpin_cb([block for block, _ in released])

    def _check_materialized(self, claim: Claim) -> None:
        if claim.missing == 0 and claim.in_force and not claim.materialized:
            claim.materialized = True
            self._emit("claim_materialized", claim_id=claim.decl.claim_id)


def _str_or_none(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def _int_or_none(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and -2**31 <= v < 2**31 else None


def _float_or_none(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)
