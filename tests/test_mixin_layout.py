"""The recorder's hooks mix into vLLM's objects without changing their attributes.

``hooks.install`` mixes the recording classes into vLLM's live block pool, KV-cache manager and
prefix-cache index by swapping ``__class__``, then re-homes each object's attributes in a plain
dict (``hooks.mix_in``: on CPython 3.11 a bare swap leaves them laid out for the old class and
every read of them slower; what that costs is measured by ``benchmarks/recorder_overhead.py``,
not here). Driven on vLLM's real classes inside the recorder's scheduler, built by vLLM's own
test helper (``create_scheduler``, fetched by ``tests/upstream/vllm_upstream.py``), with no
engine.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "upstream"))

import vllm_upstream  # noqa: E402


@pytest.fixture(scope="module")
def vllm_helpers() -> Any:
    """vLLM's ``tests.v1.core.utils`` from its source distribution (skip: registry offline)."""
    return vllm_upstream.test_utils_or_skip()


@pytest.fixture(scope="module")
def schedulers(vllm_helpers: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """(vLLM's plain scheduler, the recorder's), on the same small pool."""
    from vllm.v1.core.sched.scheduler import Scheduler

    from kvclaims.recorder.scheduler import KVClaimsScheduler

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KVCLAIMS_OUT", str(tmp_path_factory.mktemp("run") / "r"))
        mp.setenv("KVCLAIMS_POLICY", "native")
        mp.setenv("KVCLAIMS_RUN_ID", "mixin-layout")
        built = [_scheduler(vllm_helpers, cls) for cls in (Scheduler, KVClaimsScheduler)]
    yield built
    built[1].shutdown()


def _scheduler(vllm_helpers: Any, cls: type) -> Any:
    """A scheduler of class ``cls`` on a small pool, built by vLLM's own test helper."""
    return vllm_helpers.create_scheduler(
        model=vllm_helpers.MODEL_DIR, enable_prefix_caching=True, num_blocks=9, block_size=16,
        max_num_batched_tokens=256, max_model_len=256, scheduler_cls=cls)


def _objects(scheduler: Any) -> dict[str, Any]:
    manager = scheduler.kv_cache_manager
    pool = manager.block_pool
    return {"pool": pool, "manager": manager, "index": pool.cached_block_hash_to_block}


def test_recording_objects_keep_vllms_attributes_and_add_only_kvc_ones(schedulers):
    plain, recording = (_objects(s) for s in schedulers)
    for kind in ("pool", "manager", "index"):
        theirs, ours = vars(plain[kind]), vars(recording[kind])
        assert type(ours) is dict
        assert set(theirs) <= set(ours)
        assert {n for n in set(ours) - set(theirs) if not n.startswith("kvc_")} == set()
    # the re-homed attributes are vLLM's own objects: the manager still reaches the pool
    assert recording["manager"].block_pool is recording["pool"]
    assert recording["pool"].cached_block_hash_to_block is recording["index"]
