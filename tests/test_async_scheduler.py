"""The recorder over vLLM's ``AsyncScheduler`` records and enforces as over ``Scheduler``.

vLLM's CPU build never chooses ``AsyncScheduler`` (it resolves ``async_scheduling`` to off), so
the composition is tested directly: both recorder classes are built with vLLM's own test helper
(``create_scheduler`` from ``tests/v1/core/utils.py`` of vLLM's source distribution, fetched by
``tests/upstream/vllm_upstream.py``) and driven with hand-made model-runner outputs. The
synchronous order is schedule -> output -> schedule; the asynchronous one is vLLM's engine order
with async scheduling: step N+1 is scheduled before step N's output arrives (output
placeholders), as in vLLM's ``tests/v1/core/test_async_scheduler.py``. Only the GPU is missing:
the model-runner output is made by hand, as vLLM's own scheduler tests do.
"""

from __future__ import annotations

import sys
from collections import Counter, deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "upstream"))

import vllm_upstream  # noqa: E402

BLOCK = 16
NUM_BLOCKS = 41  # 40 usable: vLLM's block 0 is the null block
EOS = 50256
IGNORED = ("run_id", "seq", "ts_ns", "step")


@pytest.fixture(scope="module")
def vllm_helpers() -> Any:
    """vLLM's ``tests.v1.core.utils`` from its source distribution (skip: registry offline)."""
    return vllm_upstream.test_utils_or_skip()


def _classes() -> dict[str, type]:
    from kvclaims.recorder.scheduler import KVClaimsAsyncScheduler, KVClaimsScheduler

    return {"sync": KVClaimsScheduler, "async": KVClaimsAsyncScheduler}


def tokens(seed: int, n_blocks: int) -> list[int]:
    """A prompt of whole blocks; different seeds share no block."""
    return [1 + (seed * 7919 + i * 31 + (i * i) % 97) % 4000 for i in range(n_blocks * BLOCK)]


def make_request(name: str, prompt: list[int], max_tokens: int,
                 extra: dict[str, Any] | None = None) -> Any:
    """A vLLM ``Request`` with prefix-cache block hashes, as vLLM's helper builds them."""
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    init_none_hash(sha256)
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, extra_args=extra)
    params.update_from_generation_config({}, EOS)
    return Request(request_id=name, prompt_token_ids=prompt, sampling_params=params,
                   pooling_params=None, block_hasher=get_request_block_hasher(BLOCK, sha256))


def runner_output(scheduler_output: Any) -> Any:
    """One sampled token per scheduled request (vLLM's test helper does the same)."""
    from vllm.v1.outputs import ModelRunnerOutput

    ids = list(scheduler_output.num_scheduled_tokens)
    return ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                             sampled_token_ids=[[7] for _ in ids], logprobs=None,
                             prompt_logprobs_dict={}, pooler_output=[])


def run_sync(scheduler: Any, max_steps: int = 500) -> None:
    """Scheduler order: each step's output is applied before the next step is scheduled."""
    for _ in range(max_steps):
        if not scheduler.has_requests():
            return
        out = scheduler.schedule()
        scheduler.update_from_output(out, runner_output(out))
    raise AssertionError("requests did not finish")


def run_async(scheduler: Any, max_steps: int = 500) -> None:
    """AsyncScheduler order (vLLM's engine with a batch queue of 2): step N+1 is scheduled
    before step N's output arrives, so running requests carry output placeholders."""
    in_flight: deque[Any] = deque()
    for _ in range(max_steps):
        if scheduler.has_requests():
            in_flight.append(scheduler.schedule())
        if not in_flight:
            return
        if len(in_flight) == 2 or not scheduler.has_requests():
            out = in_flight.popleft()
            scheduler.update_from_output(out, runner_output(out))
    raise AssertionError("requests did not finish")


def workload(scheduler: Any, run: Callable[[Any], None]) -> None:
    """A claimed resident prompt, three requests sharing a prefix, an infeasible big request
    (under an enforcing policy), then the resident prompt again."""
    scheduler.add_request(make_request("resident", tokens(1, 10), 2, {"kv_claim": {
        "claim_id": "c:resident", "tenant": "t1", "protection_mode": "hard_protected"}}))
    run(scheduler)
    shared = tokens(2, 4)
    for i in range(3):
        scheduler.add_request(make_request(f"shared-{i}", shared + tokens(10 + i, 2), 3))
    run(scheduler)
    scheduler.add_request(make_request("big", tokens(3, 34), 2))
    run(scheduler)
    scheduler.add_request(make_request("probe", tokens(1, 10), 1))
    run(scheduler)


def record(helpers: Any, kind: str, policy: str, tmp: Path,
           monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Run the workload on the recorder over ``kind`` ("sync" / "async"); its events."""
    from kvclaims.reconstruct.loader import load_runs

    out = tmp / f"{kind}-{policy}"
    monkeypatch.setenv("KVCLAIMS_OUT", str(out))
    monkeypatch.setenv("KVCLAIMS_POLICY", policy)
    monkeypatch.setenv("KVCLAIMS_RUN_ID", "async-check")
    # one deployment key for every run, so their keyed block hashes compare equal
    key = tmp / "hash.key"
    key.write_text("kvclaims-async-test-key-0123456789")
    monkeypatch.setenv("KVCLAIMS_HASH_KEY_FILE", str(key))
    scheduler = helpers.create_scheduler(
        model=helpers.MODEL_DIR, enable_prefix_caching=True, num_blocks=NUM_BLOCKS,
        block_size=BLOCK, max_num_batched_tokens=1024, max_model_len=1024,
        async_scheduling=kind == "async", scheduler_cls=_classes()[kind])
    try:
        workload(scheduler, run_async if kind == "async" else run_sync)
    finally:
        scheduler.shutdown()
    rows = load_runs([out]).events.to_pylist()
    return [{k: v for k, v in r.items() if k not in IGNORED and v is not None} for r in rows
            if r["event"] not in ("run_started", "run_finished")]


def _key(row: dict[str, Any]) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in row.items()))


def per_request(rows: list[dict[str, Any]]) -> dict[str, list[tuple]]:
    """Each request's own events, in order."""
    out: dict[str, list[tuple]] = {}
    for row in rows:
        if row.get("request_id") is not None:
            out.setdefault(row["request_id"], []).append(_key(row))
    return out


@pytest.fixture(scope="module")
def recordings(vllm_helpers: Any, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """(kind, policy) -> events, each recorded once."""
    mp = pytest.MonkeyPatch()
    tmp = tmp_path_factory.mktemp("async")
    try:
        return {(k, p): record(vllm_helpers, k, p, tmp, mp)
                for k in ("sync", "async") for p in ("native", "hard_protected")}
    finally:
        mp.undo()


def test_recorder_over_async_scheduler_is_an_async_scheduler() -> None:
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    classes = _classes()
    assert issubclass(classes["async"], AsyncScheduler)
    assert issubclass(classes["async"], classes["sync"]) or \
        not issubclass(classes["sync"], AsyncScheduler)


def test_recorder_over_scheduler_is_not_an_async_scheduler() -> None:
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    assert not issubclass(_classes()["sync"], AsyncScheduler)


@pytest.mark.parametrize("policy", ["native", "hard_protected"])
def test_async_order_records_the_same_events_as_sync_order(recordings: dict,
                                                           policy: str) -> None:
    sync, async_ = recordings[("sync", policy)], recordings[("async", policy)]
    assert len(sync) > 100
    assert Counter(map(_key, async_)) == Counter(map(_key, sync))
    assert per_request(async_) == per_request(sync)


def test_different_workloads_record_different_events(recordings: dict) -> None:
    """Negative twin: the comparison above tells two different runs apart."""
    native, enforced = recordings[("sync", "native")], recordings[("sync", "hard_protected")]
    assert Counter(map(_key, native)) != Counter(map(_key, enforced))


def _events_of(rows: list[dict[str, Any]], event: str, request_id: str) -> list[dict]:
    return [r for r in rows if r["event"] == event and r.get("request_id") == request_id]


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_hard_protected_claim_holds_against_the_big_request(recordings: dict,
                                                            kind: str) -> None:
    rows = recordings[(kind, "hard_protected")]
    assert _events_of(rows, "request_refused", "big")
    assert not [r for r in rows if r["event"] == "block_evicted"
                and r.get("by_request_id") == "big"]
    # NOTE: vLLM computes at least the last token, so a fully cached prompt hits all but its
    # last block.
    assert len(_events_of(rows, "block_hit", "probe")) == 10 - 1


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_native_lets_the_big_request_evict_the_claimed_prompt(recordings: dict,
                                                              kind: str) -> None:
    """Negative twin: without enforcement the same workload loses the resident blocks."""
    rows = recordings[(kind, "native")]
    assert not _events_of(rows, "request_refused", "big")
    assert [r for r in rows if r["event"] == "block_evicted" and r.get("by_request_id") == "big"]
    assert len(_events_of(rows, "block_hit", "probe")) < 10 - 1
