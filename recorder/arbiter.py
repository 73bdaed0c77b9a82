"""The claim arbiter: tracks every claim's lifecycle and enforces the protection modes.

It knows nothing of vLLM's classes: the block-pool hooks tell it what happens to block content
(``on_resident`` / ``on_lost``), and it acts on the pool only through callbacks: ``pin`` and
``unpin`` (an extra reference through vLLM's own ``BlockPool.touch`` / ``free_blocks``) and
``lookup`` (the blocks that hold some content now, asked once per claim at acceptance).
Block contents are opaque hashable keys (on vLLM, ``BlockHashWithGroupId`` of group 0).

NOTE: invariants
- ``claims`` holds only claims in force; a claim that ends (released, demoted, expired) is
  dropped with everything that indexes it, so per-step and per-block work is proportional to
  the claims in force, never to every claim ever made;
- only content bound to a claim in force is watched (``watched``): the hooks skip every other
  block without calling in here;
- a claim's counted content (positions below its threshold) is grouped into segments: the
  keys counted by exactly the same claims share one ``_Segment``, which counts its keys not
  resident; a claim counts its segments with a key not resident (``Claim.gaps``), so
  ``gaps == 0`` exactly when every counted position is resident (the one thing
  materialization and harm are judged on). A block loss or residency updates one segment,
  and touches the segment's claims only when the segment goes from complete to incomplete or
  back, never once per claim per block;
- a block is pinned at most once, however many claims protect it (``_pins[block_id]`` holds
  the set of claims); it is unpinned when that set becomes empty;
- only claims in force under an enforcing policy, in a pinning mode, pin blocks;
- ``claim_demoted`` / ``claim_expired`` / ``claim_released`` are emitted before the unpin that
  can make their blocks victims, so a relaxation loss always follows its release in the trace;
- only protected blocks make the arbiter defer or refuse: with no pinned block, or for a
  request that would not fit even an empty pool, vLLM's own behaviour applies.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from operator import attrgetter, is_
from typing import Any, NamedTuple

from kvclaims.recorder.claims import UNUSABLE_CLAIM_ID, ClaimDeclaration, Rejection, parse_claim
from kvclaims.contract.policies import OFFLOAD_REJECTION, Policy
from kvclaims.contract.vocabulary import PINNING_MODES, RESIDENCY_MODES

Emit = Callable[..., None]
Block = Any  # vLLM's KVCacheBlock (has .block_id); opaque here
_WATCH_BLOCK = attrgetter("block")
_WATCH_PINNERS = attrgetter("pinners")


@dataclass(eq=False, slots=True)
class Claim:
    """One accepted claim in force and its live state.

    NOTE: slotted: the block hooks read and write ``gaps`` of every claim of a segment that
    became complete or incomplete, the hottest attribute access of the claim path.
    """

    decl: ClaimDeclaration
    request_id: str
    mode: str
    threshold: int
    hashes: list[Hashable]  # bound content, by logical position
    deadline: float | None  # engine monotonic clock
    # segments of its counted positions (< threshold) with a key not resident; 0: every
    # counted position is resident. NOTE: frozen when the claim ends (``_unwatch``)
    gaps: int = 0
    materialized: bool = False
    pinned: set[int] = field(default_factory=set)  # block ids this claim holds a pin on
    # NOTE: fixed at acceptance (the mode and the run policy never change), read per block
    protects: bool = False  # pins its resident blocks (enforcing policy, pinning mode)
    residency: bool = False  # a loss of a counted position breaks its promise


class _Segment:
    """Counted content shared by exactly the same claims in force.

    NOTE: ``claims`` is the signature (the claims counting each member key, in acceptance
    order, each once) and the key of ``ClaimArbiter._segments``, so keys with the same claims
    always share one segment; ``missing`` counts the member keys not resident.
    """

    __slots__ = ("claims", "missing", "size")

    def __init__(self, claims: tuple[Claim, ...]) -> None:
        self.claims = claims
        self.missing = 0  # member keys not resident
        self.size = 0  # member keys


class _Watch:
    """What the arbiter knows of one watched key (content bound to a claim in force).

    NOTE: one object per key, so a block hook finds everything in one dict lookup. The blocks
    holding the content now are ``block_id`` / ``block`` (the oldest copy) and ``more`` (any
    further copies, block_id -> block, oldest first; None until there is one): together, in
    that order, a dict of copies by insertion order, kept without a dict for the usual single
    copy. ``block_id is None`` exactly when no block holds the content (``more`` then empty).
    ``since`` orders the resident keys by when their first copy arrived (``on_reset`` loses
    them in that order).
    """

    __slots__ = ("block_id", "block", "more", "since", "seg", "entries", "pinners")

    def __init__(self) -> None:
        self.block_id: int | None = None
        self.since = 0
        self.block: Block = None
        self.more: dict[int, Block] | None = None
        self.seg: _Segment | None = None  # the claims counting it (below their threshold)
        self.entries: list[tuple[Claim, int]] = []  # every binding (claim, position)
        # bindings of protecting claims (empty under a policy that does not enforce)
        self.pinners: list[tuple[Claim, int]] = []

    def copies(self) -> list[Block]:
        """The blocks holding the content, oldest copy first."""
        if self.block_id is None:
            return []
        return [self.block, *self.more.values()] if self.more else [self.block]

    def add_copy(self, block: Block) -> bool:
        """A block holds the content now; whether it is the first copy. (The block hooks'
        loops inline this.)"""
        block_id = block.block_id
        if self.block_id is None:
            self.block_id = block_id
            self.block = block
            return True
        if self.block_id == block_id:
            self.block = block
        elif self.more is None:
            self.more = {block_id: block}
        else:
            self.more[block_id] = block
        return False

    def drop_copy(self, block_id: int) -> bool:
        """A block lost the content; whether that was the last copy (False also for a block
        not known to hold it). (The block hooks' loops inline this.)"""
        if self.block_id != block_id:
            if self.more:
                self.more.pop(block_id, None)
            return False
        more = self.more
        if more:
            self.block_id = next(iter(more))
            self.block = more.pop(self.block_id)
            return False
        self.block_id = None
        self.block = None
        return True


class Admission(NamedTuple):
    """The arbiter's answer for a request asking for blocks.

    NOTE: a NamedTuple (immutable, like the frozen dataclass it replaced) because one is built
    for every admission in the engine's hot path, and a frozen dataclass's ``__init__`` costs
    several Python-level ``object.__setattr__`` calls.
    """

    action: str  # admit | defer | wait | refuse
    fields: dict[str, Any]


class ClaimArbiter:
    """Claims of one engine: lifecycle, materialization, protection and admission."""

    def __init__(self, policy: Policy, usable_blocks: int, emit: Emit,
                 pin: Callable[[list[Block]], None], unpin: Callable[[list[Block]], None],
                 *, max_defer_steps: int = 1, max_defer_s: float = 0.0,
                 clock: Callable[[], float] = time.monotonic,
                 lookup: Callable[[Hashable], Iterable[Block]] | None = None,
                 max_protected_blocks_per_tenant: int | None = None,
                 emit_many: Callable[[str, int, dict[str, Any]], None] | None = None):
        self.policy = policy
        self.usable_blocks = usable_blocks
        self.max_defer_steps = max_defer_steps
        self.max_defer_s = max_defer_s
        self.max_protected_blocks_per_tenant = max_protected_blocks_per_tenant
        self._emit = emit
        self._emit_many = emit_many
        self._pin_cb = pin
        self._unpin_cb = unpin
        self._lookup = lookup
        self._clock = clock
        self.claims: dict[str, Claim] = {}  # in force only
        self._expiring: dict[str, Claim] = {}  # in force with a deadline
        # every watched key; NOTE: a key is watched exactly while a claim in force binds it
        self._watched: dict[Hashable, _Watch] = {}
        self._segments: dict[tuple[Claim, ...], _Segment] = {}  # by signature
        self._tick = itertools.count().__next__  # ``_Watch.since`` stamps
        self._pins: dict[int, set[str]] = {}
        self._pinned: dict[int, tuple[Block, int]] = {}  # block_id -> (block, position)
        self._deferrals: dict[str, tuple[int, float]] = {}  # request -> (steps, since)
        self._soft_in_force: set[str] = set()
        self._protecting: set[str] = set()  # in force, pinning their resident blocks
        # broken in this step, reported at its end (``end_of_step``; the dict is never rebound)
        self.broken: dict[Claim, Hashable] = {}
        # NOTE: plain attributes, not properties: the engine's hooks read them on every
        # allocation, cache step and scheduler step (a property is a Python call each time).
        # ``watched`` and ``pins`` are the live dicts themselves (never rebound); the flags are
        # kept current by ``_update_flags`` whenever a claim starts or ends.
        self.watched: dict[Hashable, _Watch] = self._watched
        self.pins: dict[int, set[str]] = self._pins
        self.deferrals: dict[str, tuple[int, float]] = self._deferrals
        self.has_soft_claims = False
        self.has_deadlines = False
        # NOTE: False exactly while no watch has ``pinners`` (always under a policy that does
        # not enforce): a block becoming a further copy of watched content is then pinned for
        # nobody
        self.has_protecting = False
        self._tenant_blocks: dict[str | None, int] = {}  # blocks claimed by protecting claims

    # ----------------------------------------------------------------- declarations
    def on_request(self, request_id: str, raw: dict[str, Any] | None,
                   releases: Sequence[str], block_hashes: Sequence[Hashable],
                   tenant: str | None = None) -> None:
        """Handle the releases and the claim (``raw_claim`` form) a new request declares.

        ``tenant`` is the requester's tenant, as set by the gateway in front of the server:
        a release is honoured only for a claim of that same tenant.
        """
        for claim_id in releases:
            self._release_by_request(claim_id, request_id, tenant)
        if raw is None:
            return
        parsed = parse_claim(raw, request_id, len(block_hashes))
        claim_id = parsed.claim_id
        self._emit("claim_submitted", claim_id=claim_id, request_id=request_id,
                   tenant=_str_or_none(raw.get("tenant")),
                   protection_mode=_str_or_none(raw.get("protection_mode")),
                   threshold_blocks=_int_or_none(raw.get("threshold_blocks")),
                   ttl_s=_float_or_none(raw.get("ttl_s")), value=_float_or_none(raw.get("value")))
        shortfall = None
        if isinstance(parsed, ClaimDeclaration):
            parsed, shortfall = self._check_in_context(parsed, len(block_hashes))
        if isinstance(parsed, Rejection):
            self._emit("claim_rejected", claim_id=claim_id, reason=parsed.reason,
                       request_id=request_id, shortfall_blocks=shortfall)
            return
        self._accept(parsed, request_id, list(block_hashes))

    def _check_in_context(self, decl: ClaimDeclaration, full_blocks: int
                          ) -> tuple[ClaimDeclaration | Rejection, int | None]:
        mode = decl.protection_mode or self.policy.default_mode
        if decl.claim_id in self.claims:
            # NOTE: the same text as any unusable id: the reason reaches the submitting tenant
            # and must not reveal that another tenant holds this id (docs/claims.md)
            return Rejection(decl.claim_id, UNUSABLE_CLAIM_ID, {}), None
        if mode == "offloadable":
            # NOTE: fail-closed: accepting a promise this runtime cannot keep would hide harm.
            return Rejection(decl.claim_id, OFFLOAD_REJECTION, {}), None
        if mode == "expiring" and decl.ttl_s is None:
            return Rejection(decl.claim_id, "protection_mode 'expiring' needs ttl_s", {}), None
        limit = self.max_protected_blocks_per_tenant
        if limit is not None and self._would_protect(mode):
            used = self._tenant_blocks.get(decl.tenant, 0)
            shortfall = used + full_blocks - limit
            if shortfall > 0:
                return Rejection(decl.claim_id, f"tenant's protected blocks would exceed "
                                 f"max_protected_blocks_per_tenant={limit}", {}), shortfall
        return decl, None

    def _would_protect(self, mode: str) -> bool:
        return self.policy.enforce and mode in PINNING_MODES

    def _accept(self, decl: ClaimDeclaration, request_id: str, hashes: list[Hashable]) -> None:
        mode = decl.protection_mode or self.policy.default_mode
        threshold = decl.threshold_blocks or len(hashes)
        deadline = None if decl.ttl_s is None else self._clock() + decl.ttl_s
        claim = Claim(decl, request_id, mode, threshold, hashes, deadline,
                      protects=self._would_protect(mode), residency=mode in RESIDENCY_MODES)
        cid = decl.claim_id
        self.claims[cid] = claim
        if deadline is not None:
            self._expiring[cid] = claim
        if mode == "soft_priority":
            self._soft_in_force.add(cid)
        if claim.protects:
            self._protecting.add(cid)
        self._update_flags()
        if self._would_protect(mode):
            self._tenant_blocks[decl.tenant] = self._tenant_blocks.get(decl.tenant, 0) + \
                len(hashes)
        self._emit("claim_accepted", claim_id=cid)
        n = len(hashes)
        if n:
            self._bound(cid, hashes)
        protects = claim.protects
        watched = self._watched
        for position, key in enumerate(hashes):
            watch = watched.get(key)
            if watch is None:
                watch = watched[key] = self._watch(key)
            watch.entries.append((claim, position))
            if protects:
                watch.pinners.append((claim, position))
                for block in watch.copies():
                    self._pin(claim, block, position)
        # the counted keys join the segments of their claims plus this one
        moved: dict[_Segment | None, _Segment] = {}
        for key in dict.fromkeys(hashes[:threshold]):
            watch = watched[key]
            old = watch.seg
            new = moved.get(old)
            if new is None:
                new = moved[old] = self._segment((old.claims if old else ()) + (claim,))
            self._move(watch, old, new)
        self._check_materialized(claim)

    def _bound(self, claim_id: str, hashes: list[Hashable]) -> None:
        if self._emit_many is not None:
            self._emit_many("claim_bound", len(hashes), {"claim_id": claim_id,
                                                  "block_hash": tuple(hashes),
                                                  "position": tuple(range(len(hashes)))})
            return
        for position, key in enumerate(hashes):
            self._emit("claim_bound", claim_id=claim_id, block_hash=key, position=position)

    def _watch(self, key: Hashable) -> _Watch:
        """Start watching content: learn which blocks hold it now."""
        watch = _Watch()
        if self._lookup is not None:
            for block in self._lookup(key):
                if watch.add_copy(block):
                    watch.since = self._tick()
        return watch

    # ----------------------------------------------------------------- segments
    def _segment(self, claims: tuple[Claim, ...]) -> _Segment:
        """The segment of keys counted by exactly ``claims`` (made when there is none)."""
        seg = self._segments.get(claims)
        if seg is None:
            seg = self._segments[claims] = _Segment(claims)
        return seg

    def _move(self, watch: _Watch, old: _Segment | None, new: _Segment | None) -> None:
        """Move a counted key from segment ``old`` to ``new`` (None: counted by no claim).

        NOTE: no event: the claims of both segments keep whether their counted positions are
        all resident (a key's residency does not change here), only their gap counts move.
        """
        absent = watch.block_id is None
        if new is not None:
            new.size += 1
            if absent:
                new.missing += 1
                if new.missing == 1:
                    for claim in new.claims:
                        claim.gaps += 1
        if old is not None:
            old.size -= 1
            if absent:
                old.missing -= 1
                if not old.missing:
                    for claim in old.claims:
                        claim.gaps -= 1
            if not old.size:
                del self._segments[old.claims]
        watch.seg = new

    # ----------------------------------------------------------------- block content
    def _update_flags(self) -> None:
        """Recompute the hot-path flags after a claim started or ended."""
        self.has_soft_claims = self.policy.enforce and bool(self._soft_in_force)
        self.has_deadlines = bool(self._expiring)
        self.has_protecting = bool(self._protecting)

    def on_resident(self, block: Block, key: Hashable) -> None:
        """A block now holds reusable content (cached, or hit by a request)."""
        self.on_resident_many((block,), (key,))

    def on_resident_many(self, blocks: Sequence[Block], keys: Sequence[Hashable]) -> None:
        """A block of ``blocks`` now holds the reusable content of its key in ``keys`` (cached,
        or hit by a request); only watched content is looked at.

        NOTE: the first copy of content counts for its segment (the claims binding it below
        their threshold), and for the segment's claims only when that completes it; any copy
        is pinned for the protecting ones. A further copy under a policy that does not enforce
        (a hit on resident content, the usual case) is one dict store.

        NOTE: when every key is watched, held by exactly its block already (the same object as
        its oldest copy) and pinned for no claim, nothing changes: a request's hits on claimed
        content it found in the cache, the usual call from an admission. That case is found
        by C-level passes and returns before the per-block loop.
        """
        watches = list(map(self._watched.get, keys))
        # NOTE: ``all(watches)``: no key unwatched (a ``_Watch`` is always true), a truth test
        # per watch rather than an equality test against None; the pinners are read only
        # while a claim protects (none has any otherwise)
        protecting = self.has_protecting
        if all(watches) and len(watches) == len(blocks) \
                and all(map(is_, map(_WATCH_BLOCK, watches), blocks)) \
                and not (protecting and any(map(_WATCH_PINNERS, watches))):
            return
        tick = self._tick
        for block, watch in zip(blocks, watches):
            if watch is None:
                continue
            held = watch.block_id
            if held is not None:  # a further copy: ``_Watch.add_copy`` inlined
                block_id = block.block_id
                if held == block_id:
                    watch.block = block
                elif watch.more is None:
                    watch.more = {block_id: block}
                else:
                    watch.more[block_id] = block
            else:
                watch.block_id = block.block_id
                watch.block = block
                watch.since = tick()
                seg = watch.seg
                if seg is not None:
                    missing = seg.missing - 1
                    seg.missing = missing
                    if not missing:
                        for claim in seg.claims:
                            gaps = claim.gaps - 1
                            claim.gaps = gaps
                            if not gaps and not claim.materialized:
                                self._check_materialized(claim)
            if protecting and watch.pinners:
                for claim, position in watch.pinners:
                    self._pin(claim, block, position)

    def on_lost(self, block_id: int, key: Hashable) -> None:
        """A block's content was evicted; report harm where a predicate breaks."""
        self.on_lost_many((block_id,), (key,))

    def end_of_step(self) -> None:
        """Report the harm of every claim still broken when the scheduler step ends.

        NOTE: predicates are judged at step ends (docs/design.md §5): within one step vLLM may
        evict a claimed block and cache identical content again (a request hitting the
        prefix), which breaks nothing.
        """
        if not self.broken:
            return
        broken = list(self.broken.items())
        self.broken.clear()
        for claim, key in broken:
            if claim.gaps > 0:
                self._emit("claim_harmed", claim_id=claim.decl.claim_id, block_hash=key)

    def on_lost_many(self, block_ids: Sequence[int], keys: Sequence[Hashable]) -> None:
        """The block of ``block_ids`` lost the content of its key in ``keys`` (evicted); only
        watched content is looked at. Losing the last copy counts against the claims binding
        it below their threshold (through its segment, and the segment's claims only when the
        segment was complete), and breaks the residency promise of a materialized one
        (reported at the step's end, ``end_of_step``)."""
        broken = self.broken
        for block_id, watch, key in zip(block_ids, map(self._watched.get, keys), keys):
            if watch is None:
                continue
            if watch.block_id != block_id or watch.more:  # not the only copy
                watch.drop_copy(block_id)
                continue
            watch.block_id = None
            watch.block = None
            seg = watch.seg
            if seg is None:
                continue
            missing = seg.missing
            seg.missing = missing + 1
            if missing:
                continue
            for claim in seg.claims:
                gaps = claim.gaps
                claim.gaps = gaps + 1
                # NOTE: only a residency promise is broken by the loss itself (docs/design.md
                # §3): best_effort promised nothing, and whether a soft_priority loss broke its
                # order depends on the other evictable blocks, which only the offline timeline
                # sees
                if not gaps and claim.materialized and claim.residency:
                    broken.setdefault(claim, key)

    def on_reset(self) -> None:
        """vLLM dropped every cached hash (``reset_prefix_cache``)."""
        # NOTE: the resident keys in the order their first copy arrived: the first loss that
        # breaks a claim names the key its claim_harmed reports
        resident = sorted((w.since, key, w.copies()) for key, w in self._watched.items()
                          if w.block_id is not None)
        for _, key, blocks in resident:
            for block in blocks:
                self.on_lost(block.block_id, key)

    def is_protected(self, block_id: int) -> bool:
        """Whether a claim holds an extra reference on this block."""
        return block_id in self._pins

    def is_soft_claimed(self, key: Hashable) -> bool:
        """Whether evicting this content should wait for every unclaimed candidate."""
        if not self.policy.enforce:
            return False
        watch = self._watched.get(key)
        return watch is not None and any(c.mode == "soft_priority" for c, _ in watch.entries)

    # ----------------------------------------------------------------- lifecycle
    def tick(self) -> None:
        """Expire claims whose ttl has passed (called at every scheduler step).

        NOTE: walks only the claims in force that have a deadline.
        """
        if not self._expiring:
            return
        now = self._clock()
        for claim in [c for c in self._expiring.values() if now >= c.deadline]:  # type: ignore
            self._end(claim, "claim_expired", f"ttl_s={claim.decl.ttl_s} elapsed")

    def release(self, claim_id: str, reason: str = "released by the operator") -> bool:
        """The operator's release (in-process API); False if no claim by that id is in force."""
        claim = self.claims.get(claim_id)
        if claim is None:
            return False
        self._end(claim, "claim_released", reason, released_by="operator")
        return True

    def _release_by_request(self, claim_id: str, request_id: str, tenant: str | None) -> None:
        """A request asks to release a claim: honoured only for the claim's own tenant."""
        claim = self.claims.get(claim_id)
        if claim is None:
            return
        if tenant is None or claim.decl.tenant != tenant:
            reason = ("the releasing request names no tenant" if tenant is None else
                      "the releasing request's tenant does not own the claim")
            self._emit("claim_release_refused", claim_id=claim_id, reason=reason,
                       request_id=request_id, tenant=tenant)
            return
        self._end(claim, "claim_released", f"released by request {request_id}",
                  released_by="tenant", request_id=request_id, tenant=tenant)

    def _end(self, claim: Claim, event: str, reason: str, **extra: Any) -> None:
        cid = claim.decl.claim_id
        del self.claims[cid]
        self._expiring.pop(cid, None)
        self._soft_in_force.discard(cid)
        self._protecting.discard(cid)
        self._update_flags()
        if self._would_protect(claim.mode):
            left = self._tenant_blocks.get(claim.decl.tenant, 0) - len(claim.hashes)
            if left > 0:
                self._tenant_blocks[claim.decl.tenant] = left
            else:
                self._tenant_blocks.pop(claim.decl.tenant, None)
        self._emit(event, claim_id=cid, reason=reason, **extra)
        self._unpin_claim(claim)
        self._unwatch(claim)

    def _unwatch(self, claim: Claim) -> None:
        """Drop an ended claim from every key it binds and from their segments.

        NOTE: the claim's ``gaps`` is kept as it was when it ended: ``end_of_step`` may still
        judge it (broken earlier in the step), on its counted positions at its end.
        """
        gaps = claim.gaps
        watched = self._watched
        moved: dict[_Segment, _Segment | None] = {}
        for key in dict.fromkeys(claim.hashes):
            watch = watched.get(key)
            if watch is None:
                continue
            watch.entries = [e for e in watch.entries if e[0] is not claim]
            if watch.pinners:
                watch.pinners = [e for e in watch.pinners if e[0] is not claim]
            old = watch.seg
            if old is not None and claim in old.claims:
                if old not in moved:
                    rest = tuple(c for c in old.claims if c is not claim)
                    moved[old] = self._segment(rest) if rest else None
                self._move(watch, old, moved[old])
            if not watch.entries:
                del watched[key]
        claim.gaps = gaps

    def forget(self, request_id: str) -> None:
        """A request finished: drop its deferral bookkeeping."""
        self._deferrals.pop(request_id, None)

    # ----------------------------------------------------------------- admission
    @property
    def protected_blocks(self) -> int:
        return len(self._pins)

    def blocking_claim_ids(self) -> list[str]:
        """Claims in force that hold at least one pinned block."""
        return sorted(cid for cid, c in self.claims.items() if c.pinned)

    def protected_split(self, tenant: str | None) -> tuple[int, int]:
        """(blocks protected only by other tenants' claims, blocks protected by ``tenant``'s).

        For a refused request's client-visible message: it may count other tenants' blocks,
        never name their claims.
        """
        own = 0
        for owners in self._pins.values():
            if tenant is not None and any(self.claims[c].decl.tenant == tenant for c in owners
                                          if c in self.claims):
                own += 1
        return len(self._pins) - own, own

    def admit(self, request_id: str, blocks_required: int, free_blocks: int) -> Admission:
        """Decide whether a waiting request may allocate ``blocks_required`` new blocks.

        NOTE: feasibility is ``protected + required <= usable``; only an enforcing policy can
        defer or refuse, and only because of protected blocks: with none, or for a request
        that would not fit even an empty pool, vLLM's own behaviour applies.
        """
        if not self.policy.enforce or not self._pins or blocks_required > self.usable_blocks:
            if self._deferrals:
                self._deferrals.pop(request_id, None)
            return Admission("admit", self.admitted_fields(request_id, blocks_required,
                                                           free_blocks))
        fields = {"request_id": request_id, "blocks_required": blocks_required,
                  "free_blocks": free_blocks, "usable_blocks": self.usable_blocks}
        shortfall = len(self._pins) + blocks_required - self.usable_blocks
        if shortfall > 0:
            for claim in self._demotion_plan(shortfall):
                self._end(claim, "claim_demoted", f"conflict with request {request_id}",
                          by_request_id=request_id)
            shortfall = len(self._pins) + blocks_required - self.usable_blocks
        fields["protected_blocks"] = len(self._pins)
        if shortfall <= 0:
            self._deferrals.pop(request_id, None)
            return Admission("admit", fields)
        fields.update(blocking_claim_ids=self.blocking_claim_ids(), shortfall_blocks=shortfall)
        fields["reason"] = "protected_resident_capacity"
        steps, since = self._deferrals.get(request_id, (0, self._clock()))
        if steps >= self.max_defer_steps and self._clock() - since >= self.max_defer_s:
            self._deferrals.pop(request_id, None)
            return Admission("refuse", fields)
        self._deferrals[request_id] = (steps + 1, since)
        # NOTE: only the first deferral is news; later steps of the same wait are not events.
        return Admission("defer" if steps == 0 else "wait", fields)

    def admitted_fields(self, request_id: str, blocks_required: int,
                        free_blocks: int) -> dict[str, Any]:
        """``request_admitted``'s fields for a request admitted with nothing to decide.

        NOTE: with no block pinned and no request deferred (``pins`` and ``deferrals``
        empty) ``admit`` always answers "admit" with exactly these fields, so the engine's
        admission calls this alone then (``KVClaimsMixin.kvc_admit``); a new dict each call
        (the buffer stages it as is).
        """
        return {"request_id": request_id, "blocks_required": blocks_required,
                "free_blocks": free_blocks, "usable_blocks": self.usable_blocks,
                "protected_blocks": len(self._pins)}

    def _demotion_plan(self, shortfall: int) -> list[Claim]:
        """The fewest demotable claims (lowest value first) whose blocks cover the shortfall."""
        candidates = [c for c in self.claims.values() if c.mode == "demotable"]
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
        return sum(1 for b in claim.pinned if self._pins.get(b) == {cid})

    # ----------------------------------------------------------------- pins
    def _pin(self, claim: Claim, block: Block, position: int) -> None:
        cid = claim.decl.claim_id
        owners = self._pins.get(block.block_id)
        if owners is None:
            self._pins[block.block_id] = {cid}
            self._pinned[block.block_id] = (block, position)
            self._pin_cb([block])
        else:
            owners.add(cid)
        claim.pinned.add(block.block_id)

    def _unpin_claim(self, claim: Claim) -> None:
        cid = claim.decl.claim_id
        released: list[tuple[Block, int]] = []
        for block_id in claim.pinned:
            owners = self._pins.get(block_id)
            if owners is None:
                continue
            owners.discard(cid)
            if not owners:
                del self._pins[block_id]
                released.append(self._pinned.pop(block_id))
        claim.pinned.clear()
        if released:
            # Tail first, like vLLM frees a finished request: the leading blocks survive longest.
            released.sort(key=lambda bp: -bp[1])
            self._unpin_cb([block for block, _ in released])

    def _check_materialized(self, claim: Claim) -> None:
        if claim.gaps == 0 and not claim.materialized:
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
