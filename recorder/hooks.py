"""Recording subclasses of vLLM's block pool and KV-cache manager.

They are installed on the live objects by swapping ``__class__`` for a subclass of whatever class
the engine built (``install``), so vLLM's source is never patched and every internal caller
(coordinator, single-type managers) sees the hooks.

NOTE: invariants
- every hook calls vLLM first or last exactly as the base class would, and records around it;
  a recording failure becomes a ``hook_failed`` event (``KVClaimsMixin.kvc_failed``), never an
  exception in the engine;
- one hook call emits one entry per event kind (``emit_many``: the whole allocation, free list,
  cache step or hit list as columns), never one ``emit`` per block; block hashes travel as
  vLLM's raw ``BlockHashWithGroupId`` bytes and become 64-bit integers on the writer thread;
- the arbiter is called only for content bound to a claim in force (``arbiter.watched``);
- every attribute added to vLLM's objects is named ``kvc_*``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from recorder.scheduler import KVClaimsMixin


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


class RecordingHashIndex:
    """Mixin over vLLM's ``BlockHashToBlockMap`` (the pool's prefix-cache index).

    NOTE: vLLM removes a cached block's content only through ``pop``, so every loss passes
    here once per evicted key, and blocks without content cost nothing (hooking
    ``_maybe_evict_cached_block`` instead would add a Python frame to every allocated block).
    ``kvc_sink`` says what a successful pop means: None, a loss to report now (an explicit
    eviction, e.g. a Mamba checkpoint slot); a ``(block ids, keys)`` pair, a loss to collect
    (the pool's hook emits the whole list as one entry); False, not a loss (vLLM moving or
    promoting a hash inside ``cache_full_blocks`` / ``move_block_hashes``).
    """

    kvc_pool: RecordingBlockPool
    kvc_sink: Any = None

    def pop(self, key: Any, block_id: int) -> Any:
        block = super().pop(key, block_id)  # type: ignore[misc]
        if block is not None:
            sink = self.kvc_sink
            if sink is None:
                self.kvc_pool.kvc_lost_now(block_id, key)
            elif sink is not False:
                sink[0].append(block_id)
                sink[1].append(key)
        return block


class RecordingBlockPool:
    """Mixin over ``vllm.v1.core.block_pool.BlockPool``."""

    kvc_sched: KVClaimsMixin
    cached_block_hash_to_block: Any  # vLLM's; its class is swapped by kvc_watch_index

    def get_new_blocks(self, num_blocks: int) -> list:
        kvc = self.kvc_sched
        arbiter = kvc.kvc_arbiter
        if arbiter.has_soft_claims:
            kvc.kvc_safely(_defer_soft_claimed, self.free_block_queue,  # type: ignore[attr-defined]
                           num_blocks, arbiter.is_soft_claimed)
        index = self.cached_block_hash_to_block
        lost: tuple[list[int], list[bytes]] = ([], [])
        index.kvc_sink = lost
        try:
            blocks = super().get_new_blocks(num_blocks)  # type: ignore[misc]
        finally:
            index.kvc_sink = None
        try:
            request_id = kvc.kvc_current_request_id
            if lost[0]:
                self.kvc_report_lost(lost, "allocation", request_id)
            kvc.kvc_emit_many("block_allocated", len(blocks), {
                "block_id": tuple([b.block_id for b in blocks]), "request_id": request_id})
        except Exception as exc:  # noqa: BLE001
            kvc.kvc_failed("get_new_blocks", exc)
        return blocks

    def evict_blocks(self, block_ids: set[int]) -> None:
        index = self.cached_block_hash_to_block
        lost: tuple[list[int], list[bytes]] = ([], [])
        index.kvc_sink = lost
        try:
            super().evict_blocks(block_ids)  # type: ignore[misc]
        finally:
            index.kvc_sink = None
        if lost[0]:
            try:
                self.kvc_report_lost(lost, "explicit", self.kvc_sched.kvc_current_request_id)
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
        kvc = self.kvc_sched
        key = dst_block.block_hash
        if key is not None and key in kvc.kvc_arbiter.watched:
            kvc.kvc_safely(kvc.kvc_arbiter.on_resident, dst_block, key)

    def kvc_report_lost(self, lost: tuple[list[int], list[bytes]], cause: str,
                        request_id: str | None) -> None:
        """One ``block_evicted`` entry for collected losses; tell the arbiter of claimed ones."""
        kvc = self.kvc_sched
        ids, keys = lost
        kvc.kvc_emit_many("block_evicted", len(ids), {
            "block_id": tuple(ids), "block_hash": tuple(keys), "cause": cause,
            "by_request_id": request_id})
        if kvc.kvc_arbiter.watched:
            kvc.kvc_safely(kvc.kvc_arbiter.on_lost_many, ids, keys)

    def kvc_lost_now(self, block_id: int, key: bytes) -> None:
        """A loss outside an allocation or ``evict_blocks`` call (vLLM evicting one block)."""
        try:
            self.kvc_report_lost(([block_id], [key]), "explicit",
                                 self.kvc_sched.kvc_current_request_id)
        except Exception as exc:  # noqa: BLE001
            self.kvc_sched.kvc_failed("_maybe_evict_cached_block", exc)

    def kvc_watch_index(self) -> None:
        """Mix ``RecordingHashIndex`` into the pool's current prefix-cache index."""
        index = self.cached_block_hash_to_block
        if not isinstance(index, RecordingHashIndex):
            base = type(index)
            index.__class__ = type(f"Recording{base.__name__}", (RecordingHashIndex, base), {})
        index.kvc_pool = self

    def cache_full_blocks(self, request: Any, blocks: list, num_cached_blocks: int,
                          num_full_blocks: int, block_size: int, kv_cache_group_id: int,
                          block_mask: list[bool] | None = None) -> None:
        kvc = self.kvc_sched
        if request.request_id in kvc.kvc_reuse_denied:
            return  # write no-admit: this request's blocks never become reusable
        if num_cached_blocks >= num_full_blocks:
            return
        new = blocks[num_cached_blocks:num_full_blocks]
        before = [b.block_hash for b in new]
        index = self.cached_block_hash_to_block
        index.kvc_sink = False  # a partial block's hash promoted to a full one: not a loss
        try:
            super().cache_full_blocks(request, blocks, num_cached_blocks,  # type: ignore[misc]
                                      num_full_blocks, block_size, kv_cache_group_id,
                                      block_mask)
        finally:
            index.kvc_sink = None
        try:
            _record_cached(kvc, request, new, before, num_cached_blocks)
        except Exception as exc:  # noqa: BLE001
            kvc.kvc_failed("cache_full_blocks", exc)

    def free_blocks(self, ordered_blocks: Any) -> None:
        blocks = ordered_blocks if isinstance(ordered_blocks, list) else list(ordered_blocks)
        super().free_blocks(blocks)  # type: ignore[misc]
        try:
            ids = tuple([b.block_id for b in blocks if not b.is_null])
            if ids:
                kvc = self.kvc_sched
                kvc.kvc_emit_many("block_freed", len(ids), {
                    "block_id": ids, "request_id": kvc.kvc_current_request_id})
        except Exception as exc:  # noqa: BLE001
            self.kvc_sched.kvc_failed("free_blocks", exc)

    def reset_prefix_cache(self) -> bool:
        done = super().reset_prefix_cache()  # type: ignore[misc]
        if done:
            kvc = self.kvc_sched
            kvc.kvc_safely(self.kvc_watch_index)  # vLLM replaced the index with a new one
            kvc.kvc_emit("cache_reset", reason="reset_prefix_cache")
            kvc.kvc_safely(kvc.kvc_arbiter.on_reset)
        return done

    # The arbiter's extra reference: vLLM's own touch / free, without block events.
    def kvc_pin(self, blocks: list) -> None:
        super().touch(blocks)  # type: ignore[misc]

    def kvc_unpin(self, blocks: list) -> None:
        super().free_blocks(blocks)  # type: ignore[misc]


def _record_cached(kvc: KVClaimsMixin, request: Any, new: list, before: list,
                   first_position: int) -> None:
    """One ``block_cached`` entry for the blocks of ``new`` that gained a hash."""
    hashes = request.block_hashes
    last = first_position + len(new)
    if all(h is None for h in before) and all(b.block_hash is not None and not b.is_null
                                              for b in new) and len(hashes) >= last:
        # NOTE: the usual case (every new full block cached): whole-list slices, no branches
        kept = new
        positions = list(range(first_position, last))
        parents = ([hashes[first_position - 1]] if first_position > 0 else [None]) + \
            list(hashes[first_position:last - 1])
    else:
        idx = [i for i, b in enumerate(new) if b.block_hash is not None
               and b.block_hash != before[i] and not b.is_null]
        if not idx:
            return
        kept = [new[i] for i in idx]
        positions = [first_position + i for i in idx]
        parents = [hashes[p - 1] if 0 < p <= len(hashes) else None for p in positions]
    keys = [b.block_hash for b in kept]
    kvc.kvc_emit_many("block_cached", len(kept), {
        "block_id": tuple([b.block_id for b in kept]), "block_hash": tuple(keys),
        "parent_hash": tuple(parents), "position": tuple(positions),
        "request_id": request.request_id})
    if kvc.kvc_arbiter.watched:
        kvc.kvc_safely(kvc.kvc_arbiter.on_resident_many, kept, keys)


class RecordingKVCacheManager:
    """Mixin over ``vllm.v1.core.kv_cache_manager.KVCacheManager``: request context + hits."""

    kvc_sched: KVClaimsMixin

    def allocate_slots(self, request: Any, num_new_tokens: int, *args: Any,
                       **kwargs: Any) -> Any:
        kvc = self.kvc_sched
        admitting = kvc.kvc_is_admission(request)
        if admitting:
            try:
                admit = kvc.kvc_admit(request, *args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - fail open: vLLM decides alone
                kvc.kvc_failed("kvc_admit", exc)
                admit = True
            if not admit:
                return None
        previous, kvc.kvc_current_request_id = kvc.kvc_current_request_id, request.request_id
        try:
            result = super().allocate_slots(request, num_new_tokens,  # type: ignore[misc]
                                            *args, **kwargs)
        finally:
            kvc.kvc_current_request_id = previous
        if admitting and result is not None:
            try:
                kvc.kvc_admitted(request, *args, **kwargs)
            except Exception as exc:  # noqa: BLE001
                kvc.kvc_failed("kvc_admitted", exc)
        return result

    def free(self, request: Any) -> None:
        kvc = self.kvc_sched
        previous, kvc.kvc_current_request_id = kvc.kvc_current_request_id, request.request_id
        try:
            super().free(request)  # type: ignore[misc]
        finally:
            kvc.kvc_current_request_id = previous


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
    manager = scheduler.kv_cache_manager
    pool = manager.block_pool
    for obj, mixin in ((pool, RecordingBlockPool), (manager, RecordingKVCacheManager)):
        base = type(obj)
        obj.__class__ = type(f"Recording{base.__name__}", (mixin, base), {})
        obj.kvc_sched = scheduler
    pool.kvc_watch_index()
