"""Recording subclasses of vLLM's block pool and KV-cache manager.

They are installed on the live objects by swapping ``__class__`` for a subclass of whatever class
the engine built (``install``), so vLLM's source is never patched and every internal caller
(coordinator, single-type managers) sees the hooks.

NOTE: every hook calls vLLM first or last exactly as the base class would, and records around it;
recording errors are swallowed by the event buffer, never raised into the engine. The hot path
does one ``emit`` per block event and no other work.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from recorder.schema import hash64

if TYPE_CHECKING:  # pragma: no cover
    from recorder.scheduler import KVClaimsScheduler


def content_hash(key: Any) -> bytes:
    """vLLM's ``BlockHashWithGroupId`` is the block hash followed by a 4-byte group id."""
    return bytes(key[:-4])


class RecordingBlockPool:
    """Mixin over ``vllm.v1.core.block_pool.BlockPool``."""

    _kvc: KVClaimsScheduler
    _kvc_cause: str = "explicit"

    def get_new_blocks(self, num_blocks: int) -> list:
        kvc = self._kvc
        if kvc.arbiter.has_soft_claims:
            kvc.safely(_defer_soft_claimed, self.free_block_queue, num_blocks,
                       kvc.arbiter.is_soft_claimed)
        self._kvc_cause = "allocation"
        try:
            blocks = super().get_new_blocks(num_blocks)  # type: ignore[misc]
        finally:
            self._kvc_cause = "explicit"
        emit, request_id = kvc.emit, kvc.current_request_id
        for block in blocks:
            emit("block_allocated", block_id=block.block_id, request_id=request_id)
        return blocks

    def _maybe_evict_cached_block(self, block: Any) -> bool:
        keys = []
        if block.block_hash is not None:
            keys.append(block.block_hash)
        keys.extend(self.cached_block_hashes_by_block.get(block.block_id, ()))  # type: ignore
        evicted = super()._maybe_evict_cached_block(block)  # type: ignore[misc]
        if evicted:
            kvc = self._kvc
            for key in keys:
                content = content_hash(key)
                kvc.emit("block_evicted", block_id=block.block_id, block_hash=hash64(content),
                         cause=self._kvc_cause, by_request_id=kvc.current_request_id)
                kvc.safely(kvc.arbiter.on_lost, block.block_id, content)
        return evicted

    def cache_full_blocks(self, request: Any, blocks: list, num_cached_blocks: int,
                          num_full_blocks: int, block_size: int, kv_cache_group_id: int,
                          block_mask: list[bool] | None = None) -> None:
        kvc = self._kvc
        if request.request_id in kvc.reuse_denied:
            return  # write no-admit: this request's blocks never become reusable
        before = [b.block_hash for b in blocks[num_cached_blocks:num_full_blocks]]
        super().cache_full_blocks(request, blocks, num_cached_blocks,  # type: ignore[misc]
                                  num_full_blocks, block_size, kv_cache_group_id, block_mask)
        hashes = request.block_hashes
        for i, block in enumerate(blocks[num_cached_blocks:num_full_blocks]):
            if block.block_hash is None or block.block_hash == before[i] or block.is_null:
                continue
            position = num_cached_blocks + i
            content = content_hash(block.block_hash)
            parent = hash64(hashes[position - 1]) if 0 < position <= len(hashes) else None
            kvc.emit("block_cached", block_id=block.block_id, block_hash=hash64(content),
                     parent_hash=parent, position=position, request_id=request.request_id)
            kvc.safely(kvc.arbiter.on_resident, block, content)

    def free_blocks(self, ordered_blocks: Any) -> None:
        blocks = list(ordered_blocks)
        super().free_blocks(blocks)  # type: ignore[misc]
        kvc = self._kvc
        request_id = kvc.current_request_id
        for block in blocks:
            if not block.is_null:
                kvc.emit("block_freed", block_id=block.block_id, request_id=request_id)

    def reset_prefix_cache(self) -> bool:
        done = super().reset_prefix_cache()  # type: ignore[misc]
        if done:
            self._kvc.emit("cache_reset", reason="reset_prefix_cache")
            self._kvc.safely(self._kvc.arbiter.on_reset)
        return done

    # The arbiter's extra reference: vLLM's own touch / free, without block events.
    def kvc_pin(self, blocks: list) -> None:
        super().touch(blocks)  # type: ignore[misc]

    def kvc_unpin(self, blocks: list) -> None:
        super().free_blocks(blocks)  # type: ignore[misc]


class RecordingKVCacheManager:
    """Mixin over ``vllm.v1.core.kv_cache_manager.KVCacheManager``: request context + hits."""

    _kvc: KVClaimsScheduler

    def allocate_slots(self, request: Any, num_new_tokens: int, *args: Any,
                       **kwargs: Any) -> Any:
        kvc = self._kvc
        admitting = kvc.is_admission(request)
        if admitting and not kvc.safely(kvc.admit, request, *args, fallback=True, **kwargs):
            return None
        previous, kvc.current_request_id = kvc.current_request_id, request.request_id
        try:
            result = super().allocate_slots(request, num_new_tokens,  # type: ignore[misc]
                                            *args, **kwargs)
        finally:
            kvc.current_request_id = previous
        if admitting and result is not None:
            kvc.safely(kvc.admitted, request, *args, **kwargs)
        return result

    def free(self, request: Any) -> None:
        kvc = self._kvc
        previous, kvc.current_request_id = kvc.current_request_id, request.request_id
        try:
            super().free(request)  # type: ignore[misc]
        finally:
            kvc.current_request_id = previous


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
        if node.block_hash is not None and soft(content_hash(node.block_hash)):
            moved.append(node)
        else:
            unclaimed += 1
        node = nxt
        seen += 1
    for block in moved:
        queue.remove(block)
    if moved:
        queue.append_n(moved)


def install(scheduler: KVClaimsScheduler) -> None:
    """Swap the engine's pool and manager classes for their recording subclasses."""
    manager = scheduler.kv_cache_manager
    pool = manager.block_pool
    for obj, mixin in ((pool, RecordingBlockPool), (manager, RecordingKVCacheManager)):
        base = type(obj)
        obj.__class__ = type(f"Recording{base.__name__}", (mixin, base), {})
        obj._kvc = scheduler
