"""An allocation's evictions are recorded key by key: one ``block_evicted`` row per content lost.

vLLM removes a cached block's content through its prefix-cache index (``pop``, once per key), and
a block that also holds a partial prefix-cache entry loses several keys at once. Driven here on
vLLM's real ``BlockPool`` inside the recorder's scheduler, built by vLLM's own test helper
(``create_scheduler``, fetched by ``tests/upstream/vllm_upstream.py``), with no engine.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "upstream"))

import vllm_upstream  # noqa: E402

BLOCK = 16
NUM_BLOCKS = 9  # 8 usable: vLLM's block 0 is the null block


@pytest.fixture(scope="module")
def vllm_helpers() -> Any:
    """vLLM's ``tests.v1.core.utils`` from its source distribution (skip: registry offline)."""
    return vllm_upstream.test_utils_or_skip()


def _request(name: str, n_blocks: int) -> Any:
    """A vLLM ``Request`` of ``n_blocks`` full blocks with its prefix-cache block hashes."""
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    init_none_hash(sha256)
    params = SamplingParams(max_tokens=1, ignore_eos=True)
    params.update_from_generation_config({}, 50256)
    prompt = [1 + (i * 31 + (i * i) % 97) % 4000 for i in range(n_blocks * BLOCK)]
    return Request(request_id=name, prompt_token_ids=prompt, sampling_params=params,
                   pooling_params=None, block_hasher=get_request_block_hasher(BLOCK, sha256))


def evictions(helpers: Any, tmp: Path, monkeypatch: pytest.MonkeyPatch, *, cache: bool,
              partial: bool) -> list[tuple[int, int]]:
    """(block id, block hash) of every ``block_evicted`` row after the pool hands out every
    free block; before that two blocks were allocated and freed, cached first if ``cache``,
    the second one also holding a partial entry (the first block's prefix) if ``partial``."""
    from kvclaims.recorder.scheduler import KVClaimsScheduler
    from kvclaims.reconstruct.loader import load_runs

    out = tmp / f"run-{cache}-{partial}"
    monkeypatch.setenv("KVCLAIMS_OUT", str(out))
    monkeypatch.setenv("KVCLAIMS_POLICY", "native")
    monkeypatch.setenv("KVCLAIMS_RUN_ID", "pool-losses")
    scheduler = helpers.create_scheduler(
        model=helpers.MODEL_DIR, enable_prefix_caching=True, num_blocks=NUM_BLOCKS,
        block_size=BLOCK, max_num_batched_tokens=256, max_model_len=256,
        scheduler_cls=KVClaimsScheduler)
    try:
        pool = scheduler.kv_cache_manager.block_pool
        request = _request("doc", 2)
        blocks = pool.get_new_blocks(2)
        if cache:
            pool.cache_full_blocks(request, blocks, 0, 2, BLOCK, 0)
        if partial:
            pool.cache_partial_block(request, blocks[1], BLOCK, 0, BLOCK)
        pool.free_blocks(blocks)
        pool.get_new_blocks(pool.get_num_free_blocks())
    finally:
        scheduler.shutdown()
    rows = load_runs([out]).events.to_pylist()
    return [(r["block_id"], r["block_hash"]) for r in rows if r["event"] == "block_evicted"]


def test_allocation_records_each_cached_block_it_takes_as_one_loss(
        vllm_helpers: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lost = evictions(vllm_helpers, tmp_path, monkeypatch, cache=True, partial=False)
    assert len(lost) == 2
    assert len({block for block, _ in lost}) == 2
    assert len({key for _, key in lost}) == 2


def test_twin_allocation_of_never_cached_blocks_records_no_loss(
        vllm_helpers: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert evictions(vllm_helpers, tmp_path, monkeypatch, cache=False, partial=False) == []


def test_block_with_a_partial_entry_loses_every_key_it_held(
        vllm_helpers: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lost = evictions(vllm_helpers, tmp_path, monkeypatch, cache=True, partial=True)
    per_block = Counter(block for block, _ in lost)
    assert sorted(per_block.values()) == [1, 2]
    # the extra key is the first block's content: two rows name it, one per block
    assert sorted(Counter(key for _, key in lost).values()) == [1, 2]
