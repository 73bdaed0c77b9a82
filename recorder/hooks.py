"""Recording subclasses of vLLM's block pool and KV-cache manager.

They are installed on the live objects by swapping ``__class__`` for a subclass of whatever class
the engine built (``install``), so vLLM's source is never patched and every internal caller
(coordinator, single-type managers) sees the hooks.

NOTE: invariants
- every hook calls vLLM first or last exactly as the base class would, and records around it;
  a recording failure becomes a ``hook_failed`` event (``KVClaimsMixin.kvc_failed``), never an
  exception in the engine;
- one hook call stages one entry per event kind (``EventBuffer.stage``: the whole allocation,
  free list, cache step or hit list as columns), never one entry per block, and takes no lock
  (the staged entries take their seqs in a later locked move, off the step path); block hashes
  travel as vLLM's raw ``BlockHashWithGroupId`` bytes and become 64-bit integers on the writer
  thread;
- per-block work in a hook is C-level passes (``map`` with ``attrgetter``, slices,
  ``list.count`` / ``in``), never a Python loop or a Python call per block, in the usual case;
- the arbiter is called only for content bound to a claim in force (``arbiter.watched``): a
  hook's list of keys is passed only when one of them is watched (a C-level ``any`` that stops
  at the first; it ignores every unwatched key anyway);
- every attribute added to vLLM's objects is named ``kvc_*``; the hottest hooks
  (``get_new_blocks``, ``cache_full_blocks``, ``free_blocks``, ``allocate_slots``, ``free``, the
  index's ``pop``) call vLLM's own method through a ``kvc_base_*`` class attribute (the base class's
  function, set by ``install`` / ``kvc_watch_index``) rather than ``super()``, which builds a
  proxy object on every call.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from operator import attrgetter
from time import monotonic_ns as _now
from typing import TYPE_CHECKING, Any

from kvclaims.recorder.buffer import layout

if TYPE_CHECKING:  # pragma: no cover
    from kvclaims.recorder.scheduler import KVClaimsMixin

_BLOCK_ID = attrgetter("block_id")
# the staged layouts of the pool's events (``EventBuffer.stage``): scalars, then columns
_ALLOCATED = layout(("request_id",), ("block_id",))
_FREED = layout(("request_id",), ("block_id",))
_EVICTED = layout(("cause", "by_request_id"), ("block_id", "block_hash"))
_CACHED = layout(("request_id",), ("block_id", "block_hash", "parent_hash", "position"))
HIT = layout(("request_id",), ("block_id", "block_hash", "position"))  # the scheduler's


def mix_in(obj: Any, mixin: type, names: Sequence[str]) -> None:
    """Make ``obj`` (a live vLLM object) an instance of ``recording_class(type(obj), ...)``.

    NOTE: CPython 3.11 keeps an object's attributes inline, laid out by its class, and
    specialises attribute reads on that layout; after a ``__class__`` swap they no longer match
    and every read of the object's attributes (vLLM's own code included: ``self.blocks``,
    ``self._cache``, ...) takes the generic path, about 3x slower per read. Re-homing them in
    a new plain dict makes the reads specialise again (as a dict lookup with a hint); the
    attributes and their values are unchanged (on 3.10, whose objects always have a plain
    dict, it is only a copy).
    """
    obj.__class__ = recording_class(type(obj), mixin, names)
    obj.__dict__ = dict(obj.__dict__)


def recording_class(base: type, mixin: type, names: Sequence[str]) -> type:
    """``mixin`` over ``base`` (vLLM's class), vLLM's methods ``names`` kept as ``kvc_base_*``
    class attributes."""
    ns: dict[str, Any] = {f"kvc_base_{n}": getattr(base, n) for n in names}
    return type(f"Recording{base.__name__}", (mixin, base), ns)


def _hash_getter(block_cls: type) -> Any:
    """A C-level getter of a block's ``block_hash``.

    NOTE: vLLM's ``KVCacheBlock.block_hash`` is a Python property over the ``_block_hash`` slot;
    reading the slot directly skips a Python call per block. Used only when the property
    really is that slot's plain getter (any other layout: the public property).
    """
    prop = getattr(block_cls, "block_hash", None)
    slot = getattr(block_cls, "_block_hash", None)
    fget = getattr(prop, "fget", None)
    code = getattr(fget, "__code__", None)
    if slot is not None and type(slot).__name__ == "member_descriptor" and code is not None \
            and code.co_names == ("_block_hash",):
        return attrgetter("_block_hash")
    return attrgetter("block_hash")


def group_keys(block_hashes: Sequence[bytes], group_id: int = 0) -> list[bytes]:
    """vLLM ``BlockHash``es as the ``BlockHashWithGroupId`` keys the block pool uses.

    NOTE: claims watch KV-cache group 0 (the full-attention group of an ordinary model); the
    key is the digest followed by the 4-byte big-endian group id, as
    ``vllm.v1.core.kv_cache_utils.make_block_hash_with_group_id`` builds it.
    """
    suffix = group_id.to_bytes(4, "big", signed=False)
    return [bytes(h) + suffix for h in block_hashes]


def cached_blocks(pool: Any, key: bytes) -> Iterable[Any]:
    """Every block of ``pool`` that holds content ``key`` now (vLLM keeps duplicates)."""
    index = pool.cached_block_hash_to_block
    cache = getattr(index, "_cache", None)
    if cache is None:  # NOTE: another vLLM layout: one copy is enough to start watching
        block = index.get_one_block(key)
        return () if block is None else (block,)
    found = cache.get(key)
    if found is None:
        return ()
    return list(found.values()) if isinstance(found, dict) else (found,)


def hits_mirrored(manager: Any) -> bool:
    """Whether every block a request's prefix-cache hit returns is already known to the arbiter
    as a copy of its content (so a hit can change nothing unless a claim pins).

    NOTE: the arbiter's copies of a watched key are learned from the index itself at watch
    start (``cached_blocks``) and then from every insert the hooks see (``cache_full_blocks``,
    ``move_block_hashes``) and every removal (the index's ``pop``; a reset loses them all), so
    short of a recorded ``hook_failed`` they include every block the index holds for the key.
    That covers a hit only where vLLM inserts group-0 keys through those methods alone and
    touches every hit block before allocating: group 0 managed by plain
    ``FullAttentionManager`` (not a manager that keeps a longer hit than it touches, and no
    partial-block entries, which ``cache_partial_block`` inserts past the hooks and which
    need hash blocks finer than the cache block), and the index layout ``cached_blocks``
    reads exactly (another one yields a single copy). Anything else: False.
    """
    try:
        from vllm.v1.core.single_type_kv_cache_manager import FullAttentionManager
    except ImportError:  # pragma: no cover - another vLLM layout
        return False
    pool = manager.block_pool
    managers = getattr(getattr(manager, "coordinator", None), "single_type_managers", ())
    if not managers or type(managers[0]) is not FullAttentionManager:
        return False
    first = managers[0]
    return (not getattr(first, "retains_longer_hit", True)
            and getattr(pool, "hash_block_size", None) == getattr(first, "block_size", 0)
            and isinstance(getattr(pool.cached_block_hash_to_block, "_cache", None), dict))


class RecordingHashIndex:
    """Mixin over vLLM's ``BlockHashToBlockMap`` (the pool's prefix-cache index).

    NOTE: vLLM removes a cached block's content only through ``pop``, so every loss passes
    here once per evicted key, and blocks without content cost nothing (hooking
    ``_maybe_evict_cached_block`` instead would add a Python frame to every allocated block).
    ``kvc_sink`` says what a successful pop means: None, a loss to report now (an explicit
    eviction, e.g. a Mamba checkpoint slot); a ``(block ids, keys)`` pair of lists, a loss to
    collect (the pool's hook stages the whole list as one entry); False, not a loss (vLLM moving
    or promoting a hash inside ``cache_full_blocks`` / ``move_block_hashes``).
    ``kvc_base_pop`` is the base class's ``pop`` (set on the class by ``kvc_watch_index``):
    calling it directly costs less than ``super()`` on a path taken once per evicted block.
    """

    kvc_pool: RecordingBlockPool
    kvc_sink: Any = None
    kvc_base_pop: Any

    def pop(self, key: Any, block_id: int) -> Any:
        block = self.kvc_base_pop(key, block_id)
        if block is not None:
            sink = self.kvc_sink
            if sink is None:
                self.kvc_pool.kvc_lost_now(block_id, key)
            elif sink is not False:
                sink[0].append(block_id)
                sink[1].append(key)
        return block


class RecordingBlockPool:
    """Mixin over ``vllm.v1.core.block_pool.BlockPool``.

    ``install`` sets the ``kvc_*`` references the hooks read (the scheduler, its arbiter, the
    buffer's ``stage``, the reuse-denied set, the null block's id, the hash getter), so a hook
    reaches them in one attribute lookup; ``kvc_request_id`` is the request the KV-cache manager is
    allocating or freeing for (None outside those calls).
    """

    kvc_sched: KVClaimsMixin
    kvc_arbiter: Any
    kvc_stage: Any  # the buffer's ``stage`` (or a discard when no run directory opened)
    kvc_reuse_denied: set[str]
    kvc_null_id: int
    kvc_hash: Any
    kvc_request_id: str | None = None
    # vLLM's methods, class attributes set by ``install`` (called bound, without super())
    kvc_base_get_new_blocks: Any
    kvc_base_cache_full_blocks: Any
    kvc_base_free_blocks: Any
    cached_block_hash_to_block: Any  # vLLM's; its class is swapped by kvc_watch_index

    def get_new_blocks(self, num_blocks: int) -> list:
        arbiter = self.kvc_arbiter
        if arbiter.has_soft_claims:
            self.kvc_sched.kvc_safely(_defer_soft_claimed,
                                      self.free_block_queue,  # type: ignore[attr-defined]
                                      num_blocks, arbiter.is_soft_claimed)
        index = self.cached_block_hash_to_block
        lost_ids: list[int] = []
        lost_keys: list[bytes] = []
        index.kvc_sink = (lost_ids, lost_keys)
        try:
            blocks = self.kvc_base_get_new_blocks(num_blocks)
        finally:
            index.kvc_sink = None
        try:
            request_id = self.kvc_request_id
            if lost_ids:
                # NOTE: ``kvc_report_lost`` inlined (one frame less per evicting allocation);
                # the same entry and arbiter call
                self.kvc_stage(("block_evicted", len(lost_ids), _now(), _EVICTED, "allocation",
                                request_id, *lost_ids, *lost_keys))
                watched = arbiter.watched
                if watched and any(map(watched.__contains__, lost_keys)):
                    try:
                        arbiter.on_lost_many(lost_ids, lost_keys)
                    except Exception as exc:  # noqa: BLE001
                        self.kvc_sched.kvc_failed("on_lost_many", exc)
            if blocks:
                self.kvc_stage(("block_allocated", len(blocks), _now(), _ALLOCATED,
                                request_id, *map(_BLOCK_ID, blocks)))
        except Exception as exc:  # noqa: BLE001
            self.kvc_sched.kvc_failed("get_new_blocks", exc)
        return blocks

    def evict_blocks(self, block_ids: set[int]) -> None:
        index = self.cached_block_hash_to_block
        lost_ids: list[int] = []
        lost_keys: list[bytes] = []
        index.kvc_sink = (lost_ids, lost_keys)
        try:
            super().evict_blocks(block_ids)  # type: ignore[misc]
        finally:
            index.kvc_sink = None
        if lost_ids:
            try:
                self.kvc_report_lost(lost_ids, lost_keys, "explicit", self.kvc_request_id)
            except Exception as exc:  # noqa: BLE001
                self.kvc_sched.kvc_failed("evict_blocks", exc)

    def move_block_hashes(self, src_block: Any, dst_block: Any) -> None:
        # NOTE: vLLM's copy-on-write path for Mamba-style state (single_type_kv_cache_manager):
        # the cached content moves to a private copy; no content is lost, so no event. The
        # arbiter learns the new holder of claimed content.
        index = self.cached_block_hash_to_block
        index.kvc_sink = False
        try:
            super().move_block_hashes(src_block, dst_block)  # type: ignore[misc]
        finally:
            index.kvc_sink = None
        key = dst_block.block_hash
        if key is not None and key in self.kvc_arbiter.watched:
            self.kvc_sched.kvc_safely(self.kvc_arbiter.on_resident, dst_block, key)

    def kvc_report_lost(self, ids: list[int], keys: list[bytes], cause: str,
                        request_id: str | None) -> None:
        """One ``block_evicted`` entry for collected losses; tell the arbiter of claimed ones."""
        self.kvc_stage(("block_evicted", len(ids), _now(), _EVICTED, cause, request_id,
                        *ids, *keys))
        watched = self.kvc_arbiter.watched
        if watched and any(map(watched.__contains__, keys)):
            # NOTE: kvc_safely inlined (one frame less per loss list); the same failure report
            try:
                self.kvc_arbiter.on_lost_many(ids, keys)
            except Exception as exc:  # noqa: BLE001
                self.kvc_sched.kvc_failed("on_lost_many", exc)

    def kvc_lost_now(self, block_id: int, key: bytes) -> None:
        """A loss outside an allocation or ``evict_blocks`` call (vLLM evicting one block)."""
        try:
            self.kvc_report_lost([block_id], [key], "explicit", self.kvc_request_id)
        except Exception as exc:  # noqa: BLE001
            self.kvc_sched.kvc_failed("_maybe_evict_cached_block", exc)

    def kvc_watch_index(self) -> None:
        """Mix ``RecordingHashIndex`` into the pool's current prefix-cache index."""
        index = self.cached_block_hash_to_block
        if not isinstance(index, RecordingHashIndex):
            mix_in(index, RecordingHashIndex, ("pop",))
        index.kvc_pool = self

    def cache_full_blocks(self, request: Any, blocks: list, num_cached_blocks: int,
                          num_full_blocks: int, block_size: int, kv_cache_group_id: int,
                          block_mask: list[bool] | None = None) -> None:
        if num_cached_blocks >= num_full_blocks:
            return
        if self.kvc_reuse_denied and request.request_id in self.kvc_reuse_denied:
            return  # write no-admit: this request's blocks never become reusable
        new = blocks[num_cached_blocks:num_full_blocks]
        before = list(map(self.kvc_hash, new))
        index = self.cached_block_hash_to_block
        index.kvc_sink = False  # a partial block's hash promoted to a full one: not a loss
        try:
            self.kvc_base_cache_full_blocks(request, blocks, num_cached_blocks, num_full_blocks,
                                            block_size, kv_cache_group_id, block_mask)
        finally:
            index.kvc_sink = None
        # NOTE: the recording is inline (one frame less per cache step): one ``block_cached``
        # entry for the blocks of ``new`` that gained a hash
        try:
            hashes = request.block_hashes
            n = len(new)
            first = num_cached_blocks
            last = first + n
            keys = list(map(self.kvc_hash, new))
            ids = tuple(map(_BLOCK_ID, new))
            if before.count(None) == n and all(keys) and self.kvc_null_id not in ids \
                    and len(hashes) >= last:
                # NOTE: the usual case (every new full block cached): whole-list slices, no
                # per-block Python. ``all(keys)``: no key is None (a hash is never empty bytes;
                # an empty one takes the exact path below), a truth test per key instead of an
                # equality test against None
                kept = new
                positions: Sequence[int] = range(first, last)
                parents = ((hashes[first - 1] if first > 0 else None), *hashes[first:last - 1])
            else:
                null = self.kvc_null_id
                idx = [i for i in range(n) if keys[i] is not None and keys[i] != before[i]
                       and ids[i] != null]
                if not idx:
                    return
                kept = [new[i] for i in idx]
                keys = [keys[i] for i in idx]
                ids = tuple([ids[i] for i in idx])
                positions = tuple([first + i for i in idx])
                parents = tuple([hashes[p - 1] if 0 < p <= len(hashes) else None
                                 for p in positions])
            self.kvc_stage(("block_cached", len(ids), _now(), _CACHED, request.request_id,
                            *ids, *keys, *parents, *positions))
            watched = self.kvc_arbiter.watched
            if watched and any(map(watched.__contains__, keys)):
                try:
                    self.kvc_arbiter.on_resident_many(kept, keys)
                except Exception as exc:  # noqa: BLE001
                    self.kvc_sched.kvc_failed("on_resident_many", exc)
        except Exception as exc:  # noqa: BLE001
            self.kvc_sched.kvc_failed("cache_full_blocks", exc)

    def free_blocks(self, ordered_blocks: Any) -> None:
        blocks = ordered_blocks if ordered_blocks.__class__ is list else list(ordered_blocks)
        self.kvc_base_free_blocks(blocks)
        try:
            ids = tuple(map(_BLOCK_ID, blocks))
            null = self.kvc_null_id
            if null in ids:
                ids = tuple([i for i in ids if i != null])
            if ids:
                self.kvc_stage(("block_freed", len(ids), _now(), _FREED,
                                self.kvc_request_id, *ids))
        except Exception as exc:  # noqa: BLE001
            self.kvc_sched.kvc_failed("free_blocks", exc)

    def reset_prefix_cache(self) -> bool:
        done = super().reset_prefix_cache()  # type: ignore[misc]
        if done:
            kvc = self.kvc_sched
            kvc.kvc_safely(self.kvc_watch_index)  # vLLM replaced the index with a new one
            kvc.kvc_emit("cache_reset", reason="reset_prefix_cache")
            kvc.kvc_safely(self.kvc_arbiter.on_reset)
        return done

    # The arbiter's extra reference: vLLM's own touch / free, without block events.
    def kvc_pin(self, blocks: list) -> None:
        super().touch(blocks)  # type: ignore[misc]

    def kvc_unpin(self, blocks: list) -> None:
        super().free_blocks(blocks)  # type: ignore[misc]


class RecordingKVCacheManager:
    """Mixin over ``vllm.v1.core.kv_cache_manager.KVCacheManager``: request context + hits.

    NOTE: the fast path (a running request growing) only names the request on the pool for the
    duration of vLLM's call; admission (a waiting or preempted request's first blocks) goes
    through the arbiter in ``kvc_allocate_admitting``.
    """

    kvc_sched: KVClaimsMixin
    kvc_pool: RecordingBlockPool
    kvc_admission_states: frozenset
    kvc_base_allocate_slots: Any  # vLLM's method (a class attribute set by ``install``)
    kvc_base_free: Any

    def allocate_slots(self, request: Any, num_new_tokens: int, *args: Any,
                       **kwargs: Any) -> Any:
        if request.status in self.kvc_admission_states:
            return self.kvc_allocate_admitting(request, num_new_tokens, args, kwargs)
        # NOTE: a running request: vLLM's scheduler never nests allocate_slots in another
        # request's context, so the context is simply cleared afterwards
        pool = self.kvc_pool
        pool.kvc_request_id = request.request_id
        try:
            return self.kvc_base_allocate_slots(request, num_new_tokens, *args, **kwargs)
        finally:
            pool.kvc_request_id = None

    def kvc_allocate_admitting(self, request: Any, num_new_tokens: int, args: tuple,
                               kwargs: dict[str, Any]) -> Any:
        """``allocate_slots`` for a request asking for its first blocks: the arbiter first."""
        kvc = self.kvc_sched
        admitting = request.request_id not in kvc.kvc_to_refuse
        if admitting:
            try:
                arbiter = kvc.kvc_arbiter
                if not arbiter.pins and not arbiter.deferrals:
                    # NOTE: nothing pinned, nobody deferred: the arbiter can only admit, with
                    # exactly ``ClaimArbiter.admitted_fields`` (no decision object to build, no
                    # frame of ``kvc_admit``'s)
                    kvc.kvc_pending_admission = arbiter.admitted_fields(
                        request.request_id, -(-request.num_tokens // kvc.block_size),
                        self.kvc_pool.get_num_free_blocks())
                    admit = True
                else:
                    admit = kvc.kvc_admit(request, args, kwargs)
            except Exception as exc:  # noqa: BLE001 - fail open: vLLM decides alone
                kvc.kvc_failed("kvc_admit", exc)
                # NOTE: never another request's decision: what the arbiter did not say is null
                kvc.kvc_pending_admission = {"request_id": request.request_id}
                admit = True
            if not admit:
                return None
        pool = self.kvc_pool
        previous = pool.kvc_request_id
        pool.kvc_request_id = request.request_id
        try:
            result = self.kvc_base_allocate_slots(request, num_new_tokens, *args, **kwargs)
        finally:
            pool.kvc_request_id = previous
        if admitting and result is not None:
            try:
                kvc.kvc_admitted(request, args, kwargs)
            except Exception as exc:  # noqa: BLE001
                kvc.kvc_failed("kvc_admitted", exc)
        return result

    def free(self, request: Any) -> None:
        pool = self.kvc_pool
        previous = pool.kvc_request_id
        pool.kvc_request_id = request.request_id
        try:
            self.kvc_base_free(request)
        finally:
            pool.kvc_request_id = previous


def _defer_soft_claimed(queue: Any, num_blocks: int, soft: Any) -> None:
    """Move soft-claimed cached blocks behind the unclaimed ones at the head of the free queue.

    NOTE: only the blocks that would otherwise be handed out now are looked at, so the cost is
    O(num_blocks + soft-claimed blocks met), and the relative order of each kind is kept.
    """
    moved = []
    unclaimed = 0
    node = queue.fake_free_list_head.next_free_block
    tail = queue.fake_free_list_tail
    seen = 0
    while node is not tail and unclaimed < num_blocks and seen < queue.num_free_blocks:
        nxt = node.next_free_block
        if node.block_hash is not None and soft(node.block_hash):
            moved.append(node)
        else:
            unclaimed += 1
        node = nxt
        seen += 1
    for block in moved:
        queue.remove(block)
    if moved:
        queue.append_n(moved)


def install(scheduler: KVClaimsMixin) -> None:
    """Swap the engine's pool and manager classes for their recording subclasses."""
    from vllm.v1.request import RequestStatus

    manager = scheduler.kv_cache_manager
    pool = manager.block_pool
    for obj, mixin, names in ((pool, RecordingBlockPool,
                               ("get_new_blocks", "cache_full_blocks", "free_blocks")),
                              (manager, RecordingKVCacheManager, ("allocate_slots", "free"))):
        mix_in(obj, mixin, names)
        obj.kvc_sched = scheduler
    # NOTE: the references every hook reads, set once here (none of them is ever rebound)
    pool.kvc_arbiter = scheduler.kvc_arbiter
    pool.kvc_stage = scheduler.kvc_stage
    pool.kvc_reuse_denied = scheduler.kvc_reuse_denied
    null = getattr(pool, "null_block", None)
    pool.kvc_null_id = null.block_id if null is not None else -1
    pool.kvc_hash = _hash_getter(type(null) if null is not None else object)
    manager.kvc_pool = pool
    scheduler.kvc_hits_mirrored = hits_mirrored(manager)
    manager.kvc_admission_states = frozenset((RequestStatus.WAITING, RequestStatus.PREEMPTED))
    pool.kvc_watch_index()
