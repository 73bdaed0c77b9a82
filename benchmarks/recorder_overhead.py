"""The recorder's cost inside the real vLLM engine, and whether its writer keeps up.

Run: ``.venv/bin/python benchmarks/recorder_overhead.py [--rounds 4]
[--shapes prefix,multiturn,short,claims] [--configs plain,native,hard]
[--writer-only | --engine-only] [--lockstep [--cold-mib 0,64]] [--claim-path]
[--write docs/benchmarks.md]``
(in-process engines; 3-5 min per shape on 2 shared cores). ``--write``: the tables also replace
this script's section of that file (between ``<!-- recorder_overhead:begin -->`` and
``<!-- recorder_overhead:end -->``), with the command, the UTC date and the machine.

Engine part. Real in-process vLLM CPU engines (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): vLLM's
plain ``Scheduler`` (``plain``), the recorder under ``native`` (claims recorded, never
enforced; on every shape but ``claims`` its requests declare none: the pool hooks alone) and
the recorder under ``hard_protected`` with claims (``hard``), always with the recorder's Python
hooks. Timed: CPU time of the engine thread (``time.thread_time_ns``) inside ``schedule()``
and ``update_from_output()``: the scheduler's own work with every recorder hook in it, not the
model, not the writer thread; the wall time of the same calls beside it.

Paired rounds. Each round builds two engines in one process, vanilla vLLM and one
configuration, and steps them in turn on the same workload (the order reversed at each turn), so
the machine's drift hits both alike: on this shared VM the same plain run's scheduler time moved
2.5x between whole runs minutes apart, far more than the recorder's cost. Whichever engine steps
first in a round measures a few percent slower, so the first position alternates between rounds
and rounds are averaged in pairs (one each way). ``plain`` against ``plain`` is the null
control: its added time is the table's resolution. ``--rounds`` rounds per configuration (made
even), after one discarded warm-up round. Four shapes:

- ``prefix``: 400 requests over 24 shared documents (4-24 blocks) plus 1-3 unique blocks, 160
  usable blocks: heavy eviction (the shape of issue 9);
- ``multiturn``: a shape the recorder was not tuned on: 24 conversations of 6 turns, each turn
  the whole history plus a new message, 24-token answers, 8 conversations at once over 120
  usable blocks (decode growth, preemption, prefix hits on the history);
- ``short``: added after the hot path was tuned on the other two, and not tuned on: 600 short
  requests (1-4 unique blocks, one in five behind a shared one-block system prompt, 2-16 output
  tokens), 48 at a time over 200 usable blocks: many arrivals and finishes, few hits, little
  eviction (the recorder's fixed per-request cost);
- ``claims``: the claim path under ``native``: ``prefix``'s documents and pool, and one request
  in five declares a claim (every recorder configuration declares them), so the claims in force
  watch content that is evicted and cached again on every step.

Per-event cost = median over balanced pairs of (configuration's scheduler CPU - plain's) /
events recorded; ratio = median over balanced pairs of configuration / plain.

``--claim-path``: the ``claims`` shape's added time split in two, each measured as paired rounds:
``unclaimed`` (``native`` with the shape's claims not declared: the pool hooks alone) against
vanilla vLLM, and ``unclaimed:native`` (``native`` with the claims against ``native`` without:
the claim path alone), beside ``native`` against vanilla vLLM (both).

``--lockstep``: the same shapes without engines: vLLM's ``Scheduler`` and the recorder's, built
by vLLM's own test helper (``create_scheduler`` from its source distribution, fetched as
``tests/upstream/vllm_upstream.py`` does) and driven with hand-made model outputs (one token
per request), all three stepped side by side so that load on a shared machine hits them alike.
Seconds per round instead of minutes, and a few-ms resolution. ``--cold-mib 0,64``: also with
64 MiB of memory read (untimed) before every timed call, as a CPU engine's model forward does
between scheduler calls: the caches start cold, as in the real engine on this machine.

Writer part (issue 9 item 4). The writer thread's sustained rate: a producer thread emits the
realistic event mix of ``recorder_cost.py`` as it can; events written / wall seconds, and
/ the writer thread's own CPU seconds. Then offered rates are paced for ``--window-s`` seconds
against a buffer of ``--capacity`` pending events: the lowest offered rate at which the buffer
drops events, and the ``recorder_gap`` rows that cover them in the written trace.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from benchmarks import _report  # noqa: E402

_clock = time.thread_time_ns
SPENT: dict[str, int] = {}  # scheduler CPU ns per timed engine
WALL: dict[str, int] = {}  # wall ns of the same calls
STEPS: dict[str, int] = {}
_wall = time.perf_counter_ns
# the section of a docs file this script's tables replace (``--write``)
CONFIGS = ("plain", "native", "hard")
POLICY = {"plain": None, "native": "native", "hard": "hard_protected",
          "unclaimed": "native",  # ``native`` whose requests declare no claim on any shape
          "write_no_admit": "write_no_admit"}  # the last: the tests' negative control
# Engine table rows: a configuration against vanilla vLLM, or ``base:config`` (two
# configurations paired directly)
ENGINE_ROWS = ("plain", "native", "hard")
# ``--claim-path``: the claims shape's pool hooks alone, its claim path alone, and both
CLAIM_PATH_ROWS = ("unclaimed", "unclaimed:native", "native")


# -- workloads --------------------------------------------------------------------------------

Request = tuple[str, list[int], dict[str, Any] | None, int]  # name, prompt, claim, max_tokens
Phase = list[Request]  # submitted together, run to idle


def prefix_shape(n: int = 400, seed: int = 0) -> tuple[list[Phase], int]:
    """``n`` requests over 24 shared documents, 16 at a time; every fourth document's first
    request declares a hard claim on it. 160 usable blocks."""
    from kvclaims.sources.scenarios import tokens

    rng = random.Random(seed)
    docs = [tokens(1000 + d, rng.randint(4, 24)) for d in range(24)]
    claimed: set[int] = set()
    reqs: list[Request] = []
    for i in range(n):
        d = rng.randrange(len(docs))
        claim = None
        if d % 4 == 0 and d not in claimed:
            claimed.add(d)
            claim = {"claim_id": f"doc-{d}", "tenant": f"t{d % 3}",
                     "protection_mode": "hard_protected"}
        reqs.append((f"p{i}", docs[d] + tokens(5000 + i, rng.randint(1, 3)), claim, 4))
    return [reqs[i:i + 16] for i in range(0, n, 16)], 160


def multiturn_shape(conversations: int = 24, turns: int = 6, seed: int = 1) -> \
        tuple[list[Phase], int]:
    """Multi-turn chats: each turn resends the history plus a new message (1-3 blocks); 8
    conversations run at once; the first turn of every third conversation claims its opening
    message. 120 usable blocks."""
    from kvclaims.sources.scenarios import tokens

    rng = random.Random(seed)
    phases: list[Phase] = []
    for group in range(0, conversations, 8):
        history = {c: tokens(7000 + c, rng.randint(2, 4)) for c in range(group, group + 8)}
        for t in range(turns):
            phase: Phase = []
            for c in range(group, group + 8):
                history[c] = history[c] + tokens(9000 + c * 100 + t, rng.randint(1, 3))
                claim = ({"claim_id": f"chat-{c}", "tenant": f"t{c % 3}",
                          "protection_mode": "hard_protected", "threshold_blocks": 2}
                         if t == 0 and c % 3 == 0 else None)
                phase.append((f"c{c}-t{t}", list(history[c]), claim, 24))
            phases.append(phase)
    return phases, 120


def short_shape(n: int = 600, seed: int = 2) -> tuple[list[Phase], int]:
    """Many short requests with little sharing (a shape nobody tuned the recorder on): ``n``
    prompts of 1-4 unique blocks, one in five behind a one-block system prompt shared by all,
    2-16 output tokens, 48 at a time over 200 usable blocks; every tenth claims its prompt
    (``best_effort``: recorded, never enforced)."""
    from kvclaims.sources.scenarios import tokens

    rng = random.Random(seed)
    system = tokens(3000, 1)
    reqs: list[Request] = []
    for i in range(n):
        prompt = tokens(20000 + i, rng.randint(1, 4))
        if rng.random() < 0.2:
            prompt = system + prompt
        claim = ({"claim_id": f"s-{i}", "tenant": f"t{i % 4}", "protection_mode": "best_effort"}
                 if i % 10 == 0 else None)
        reqs.append((f"s{i}", prompt, claim, rng.randint(2, 16)))
    return [reqs[i:i + 48] for i in range(0, n, 48)], 200


def claims_shape(n: int = 400, seed: int = 3) -> tuple[list[Phase], int]:
    """The claim path under ``native``: ``n`` requests over 24 shared documents (4-24 blocks)
    plus 1-3 unique blocks, 16 at a time over 160 usable blocks, as ``prefix``; one request in
    five declares its own claim (no mode: the policy's default, recorded and judged, never
    enforced under ``native``), every other one on the document only (``threshold_blocks``).
    Claims are never released, so the claims in force grow to ``n / 5`` and watch every
    document: bound content evicted and cached again on every step."""
    from kvclaims.sources.scenarios import BLOCK_SIZE, tokens

    rng = random.Random(seed)
    docs = [tokens(1000 + d, rng.randint(4, 24)) for d in range(24)]
    reqs: list[Request] = []
    for i in range(n):
        d = rng.randrange(len(docs))
        claim = None
        if i % 5 == 0:
            claim = {"claim_id": f"k-{i}", "tenant": f"t{i % 4}"}
            if i % 10 == 0:
                claim["threshold_blocks"] = len(docs[d]) // BLOCK_SIZE
        reqs.append((f"k{i}", docs[d] + tokens(5000 + i, rng.randint(1, 3)), claim, 4))
    return [reqs[i:i + 16] for i in range(0, n, 16)], 160


SHAPES = {"prefix": prefix_shape, "multiturn": multiturn_shape, "short": short_shape,
          "claims": claims_shape}
# NOTE: shapes whose claims every recorder configuration declares (the others declare theirs
# under ``hard`` only: the rows without claims measure the pool hooks alone)
CLAIMS_UNDER_EVERY_POLICY = frozenset({"claims"})


# -- real engines ----------------------------------------------------------------------------

def timed(base: type, key: str = "run") -> type:
    """``base`` with the engine thread's CPU time in schedule()/update_from_output() counted
    under ``key`` (in ``SPENT``; their wall time in ``WALL``; scheduler steps in ``STEPS``)."""

    class Timed(base):  # type: ignore[misc, valid-type]
        def schedule(self, *a: Any, **k: Any) -> Any:
            STEPS[key] += 1
            w0, t0 = _wall(), _clock()
            try:
                return super().schedule(*a, **k)
            finally:
                SPENT[key] += _clock() - t0
                WALL[key] += _wall() - w0

        def update_from_output(self, *a: Any, **k: Any) -> Any:
            w0, t0 = _wall(), _clock()
            try:
                return super().update_from_output(*a, **k)
            finally:
                SPENT[key] += _clock() - t0
                WALL[key] += _wall() - w0

    Timed.__name__ = f"Timed{base.__name__}"
    return Timed


def build_engine(config: str, usable: int, out: Path, key: str, *,
                 async_scheduling: bool = False) -> Any:
    """A fresh in-process engine for ``config`` whose scheduler time counts under ``key``; its
    ``Driver``.

    ``async_scheduling``: vLLM's ``AsyncScheduler`` and the recorder over it (a GPU engine;
    the CPU build resolves async scheduling to off).
    """
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from vllm import EngineArgs, LLMEngine
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    import kvclaims.recorder.scheduler as rs
    from kvclaims.sources.scenarios import Driver, engine_args
    from kvclaims.sources.tiny_model import ensure_tiny_model

    # NOTE: the class vLLM itself would build for this config, timed; the recorder's async
    # variant by name, as a timed subclass is not upgraded by KVClaimsScheduler.__new__.
    base = ((AsyncScheduler if async_scheduling else Scheduler) if POLICY[config] is None
            else rs.KVClaimsAsyncScheduler if async_scheduling else rs.KVClaimsScheduler)
    policy = POLICY[config]
    args = engine_args(ensure_tiny_model(), usable,
                       {"out": str(out), "policy": policy or "native",
                        "run_id": f"bench-{config}", "max_defer_steps": 2})
    args["scheduler_cls"] = timed(base, key)
    if async_scheduling:
        args["async_scheduling"] = True
    if policy is None:
        args.pop("additional_config")
    SPENT[key] = WALL[key] = STEPS[key] = 0
    return Driver(LLMEngine.from_engine_args(EngineArgs(**args)))


def _declares(config: str, shape: str) -> bool:
    """Whether ``config``'s requests declare the shape's claims (``hard`` always; every
    recorder configuration but ``unclaimed`` on a shape of ``CLAIMS_UNDER_EVERY_POLICY``)."""
    return config == "hard" or (POLICY[config] is not None and config != "unclaimed"
                                and shape in CLAIMS_UNDER_EVERY_POLICY)


def _drive(drivers: dict[str, Any], configs: dict[str, str], phases: list[Phase],
           shape: str = "") -> None:
    """Run every phase on every engine, stepping the engines in turn (the order reversed at
    each turn, so each engine follows the other as itself). On failure every engine
    is shut down before the error propagates."""
    order = list(drivers)
    try:
        for phase in phases:
            for key, driver in drivers.items():
                for name, prompt, claim, max_tokens in phase:
                    driver.submit(name, prompt,
                                  claim=claim if _declares(configs[key], shape) else None,
                                  max_tokens=max_tokens)
            while any(d.engine.has_unfinished_requests() for d in drivers.values()):
                order.reverse()
                for key in order:
                    if drivers[key].engine.has_unfinished_requests():
                        drivers[key].step()
    except BaseException:
        for d in drivers.values():
            d.engine.engine_core.shutdown()
        raise


def _result(key: str, config: str, driver: Any, out: Path) -> dict[str, Any]:
    """Shut the engine down; its scheduler CPU seconds, events, steps and client view."""
    driver.engine.engine_core.shutdown()
    events = 0
    if POLICY[config] is not None:
        events = int(json.loads((out / "manifest.json").read_text())["events_written"])
    return {"cpu_s": SPENT[key] / 1e9, "wall_s": WALL[key] / 1e9, "events": events,
            "steps": STEPS[key],
            "cached": {o.name: o.num_cached_tokens for o in driver.outcomes.values()},
            "finish": {o.name: (o.finish_reason, o.num_output_tokens)
                       for o in driver.outcomes.values()}}


def run_engine(config: str, phases: list[Phase], usable: int, out: Path, *,
               async_scheduling: bool = False,
               shape: str = "") -> dict[str, Any]:
    """One fresh in-process engine run alone; the scheduler's CPU seconds, events, steps, and
    each request's ``num_cached_tokens`` and output tokens as vLLM reported them to the client."""
    driver = build_engine(config, usable, out, "run", async_scheduling=async_scheduling)
    _drive({"run": driver}, {"run": config}, phases, shape)
    return _result("run", config, driver, out)


def paired_round(config: str, phases: list[Phase], usable: int, out: Path,
                 base_first: bool, base: str = "plain",
                 shape: str = "") -> tuple[dict[str, Any], dict[str, Any]]:
    """``base`` (vanilla vLLM unless told) and ``config`` in one process, stepped in turn on the
    same workload; (base's result, config's result).

    NOTE: whichever engine steps first in a round is measured a few percent slower (measured
    with plain against plain), so ``base_first`` alternates between rounds and the table
    averages rounds in position-balanced pairs.
    """
    keys = ("base", "other") if base_first else ("other", "base")
    configs = {"base": base, "other": config}
    drivers = {k: build_engine(configs[k], usable, out / k, k) for k in keys}
    _drive(drivers, configs, phases, shape)
    return (_result("base", base, drivers["base"], out / "base"),
            _result("other", config, drivers["other"], out / "other"))


def _balanced(xs: list[float]) -> list[float]:
    """Means of consecutive rounds (plain first, then second): the position bias cancels."""
    return [(xs[i] + xs[i + 1]) / 2 for i in range(0, len(xs) - 1, 2)]


def engine_table(shape: str, rounds: int, tmp: Path, configs: tuple[str, ...] = ENGINE_ROWS
                 ) -> tuple[list[str], list[dict[str, Any]]]:
    """Paired rounds of plain vLLM against itself (the null control), ``native`` and ``hard``
    on one shape; the printed rows, and one record per row for the docs table."""
    phases, usable = SHAPES[shape]()
    n = sum(len(p) for p in phases)
    rounds += rounds % 2  # NOTE: an even count: every pair of rounds balances the positions
    # NOTE: the first engines built in a process run slower (imports, first compilation):
    # one discarded round
    paired_round("plain", phases, usable, tmp / f"{shape}-warmup", base_first=True)
    rows = [f"shape {shape}: {n} requests, {usable} usable blocks; per configuration {rounds} "
            f"rounds, each vanilla vLLM and the configuration stepped in turn in one process",
            f"  {'config':<16}{'base CPU s':>12}{'config CPU s':>13}{'added ms':>10}"
            f"{'(min..max)':>16}{'events':>9}{'steps':>11}{'µs/event':>10}{'ratio':>7}"
            f"{'same hits':>11}"]
    table: list[dict[str, Any]] = []
    for row in configs:
        base, _, config = row.rpartition(":")
        base = base or "plain"
        pairs = []
        for r in range(rounds):
            plain, other = paired_round(config, phases, usable, tmp / f"{shape}-{row}-{r}",
                                        base_first=r % 2 == 0, base=base, shape=shape)
            pairs.append((plain, other))
            print(f"  {shape} {row} round {r + 1}/{rounds}: {base} {plain['cpu_s']:.3f} s, "
                  f"{config} {other['cpu_s']:.3f} s, {other['events']:,} events",
                  file=sys.stderr, flush=True)
        added = _balanced([o["cpu_s"] - p["cpu_s"] for p, o in pairs])
        ratio = _balanced([o["cpu_s"] / p["cpu_s"] for p, o in pairs])
        wall_ratio = _balanced([o["wall_s"] / p["wall_s"] for p, o in pairs])
        events = int(statistics.median(o["events"] for _, o in pairs))
        # NOTE: plain's steps / the configuration's: enforcement (hard) changes the schedule
        # itself, so its added time includes vLLM's own work for the extra steps
        steps = [int(statistics.median(x[i]["steps"] for x in pairs)) for i in (0, 1)]
        med = statistics.median(added)
        same = all(o["cached"] == p["cached"] for p, o in pairs) if config != "hard" else None
        per_event = f"{med / events * 1e6:10.2f}" if events else f"{'-':>10}"
        rows.append(
            f"  {row if row != 'plain' else 'plain (null)':<16}"
            f"{statistics.median(p['cpu_s'] for p, _ in pairs):12.3f}"
            f"{statistics.median(o['cpu_s'] for _, o in pairs):13.3f}{med * 1e3:10.1f}"
            f"{f'({min(added) * 1e3:.1f}..{max(added) * 1e3:.1f})':>16}{events:>9,}"
            f"{f'{steps[0]}/{steps[1]}':>11}{per_event}"
            f"{statistics.median(ratio):7.2f}{'-' if same is None else str(same):>11}")
        print(rows[-1], file=sys.stderr, flush=True)
        table.append({
            "shape": shape, "row": row, "rounds": rounds, "events": events,
            "base_cpu_s": statistics.median(p["cpu_s"] for p, _ in pairs),
            "cpu_s": statistics.median(o["cpu_s"] for _, o in pairs),
            "base_wall_s": statistics.median(p["wall_s"] for p, _ in pairs),
            "wall_s": statistics.median(o["wall_s"] for _, o in pairs),
            "added_ms": med * 1e3, "us_per_event": med / events * 1e6 if events else None,
            "ratio": statistics.median(ratio), "wall_ratio": statistics.median(wall_ratio),
            "same_hits": same})
    return rows, table


# -- lockstep: the schedulers alone, driven side by side -------------------------------------

def _vllm_test_utils() -> Any:
    """vLLM's ``tests.v1.core.utils`` from its source distribution (as the upstream harness and
    ``tests/test_async_scheduler.py`` fetch it)."""
    sys.path.insert(0, str(ROOT / "tests" / "upstream"))
    import vllm_upstream

    return vllm_upstream.vllm_test_utils()


def lockstep_run(shape: str, tmp: Path, utils: Any, cold_mib: int = 0
                 ) -> tuple[dict[str, float], dict[str, int], dict[str, float]]:
    """One pass of ``shape`` through plain, native and hard schedulers built by vLLM's own test
    helper, stepped side by side (each step: every scheduler's schedule() and
    update_from_output() in turn, the order alternating), with hand-made model outputs of one
    token per request (no model, as vLLM's scheduler tests do). Returns each configuration's
    scheduler CPU seconds, events written and the wall seconds of the same calls.

    ``cold_mib``: before each timed call, untimed, read that many MiB of memory, as a CPU
    engine's model forward does between scheduler calls, so the call starts with cold caches.

    NOTE: interleaving step by step exposes the configurations to the same load at the same
    moments, which a shared machine's drift between whole runs does not.
    """
    import numpy as np

    sweep = np.ones(cold_mib * 2**20 // 8) if cold_mib > 0 else None
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request as VRequest

    import kvclaims.recorder.scheduler as rs
    from kvclaims.sources.scenarios import BLOCK_SIZE

    phases, usable = SHAPES[shape]()
    init_none_hash(sha256)
    scheds = {}
    for config in CONFIGS:
        os.environ.update(KVCLAIMS_OUT=str(tmp / config), KVCLAIMS_RUN_ID=f"lock-{config}",
                          KVCLAIMS_POLICY=POLICY[config] or "native")
        scheds[config] = utils.create_scheduler(
            model=utils.MODEL_DIR, enable_prefix_caching=True, num_blocks=usable + 1,
            block_size=BLOCK_SIZE, max_model_len=usable * BLOCK_SIZE,
            max_num_batched_tokens=8192, max_num_seqs=256,
            scheduler_cls=Scheduler if POLICY[config] is None else rs.KVClaimsScheduler)
    spent = dict.fromkeys(CONFIGS, 0)
    wall = dict.fromkeys(CONFIGS, 0)
    order = list(CONFIGS)
    for phase in phases:
        for config, sched in scheds.items():
            for name, prompt, claim, max_tokens in phase:
                params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, extra_args=(
                    {"kv_claim": claim} if claim and _declares(config, shape) else None))
                params.update_from_generation_config({}, 2)
                sched.add_request(VRequest(
                    request_id=name, prompt_token_ids=prompt, sampling_params=params,
                    pooling_params=None, block_hasher=get_request_block_hasher(BLOCK_SIZE, sha256)))
        while any(s.has_requests() for s in scheds.values()):
            order.reverse()
            for config in order:
                sched = scheds[config]
                if not sched.has_requests():
                    continue
                if sweep is not None:
                    sweep.sum()
                w0, t0 = _wall(), _clock()
                out = sched.schedule()
                spent[config] += _clock() - t0
                wall[config] += _wall() - w0
                ids = list(out.num_scheduled_tokens)
                result = ModelRunnerOutput(
                    req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                    sampled_token_ids=[[7] for _ in ids], logprobs=None,
                    prompt_logprobs_dict={}, pooler_output=[])
                if sweep is not None:
                    sweep.sum()
                w0, t0 = _wall(), _clock()
                sched.update_from_output(out, result)
                spent[config] += _clock() - t0
                wall[config] += _wall() - w0
    events = {}
    for config, sched in scheds.items():
        events[config] = 0
        if POLICY[config] is not None:
            sched.shutdown()
            events[config] = int(json.loads(
                (tmp / config / "manifest.json").read_text())["events_written"])
    return ({c: v / 1e9 for c, v in spent.items()}, events,
            {c: v / 1e9 for c, v in wall.items()})


def lockstep_table(shape: str, rounds: int, tmp: Path, utils: Any, cold_mib: int = 0
                   ) -> tuple[list[str], list[dict[str, Any]]]:
    """``rounds`` lockstep passes of one shape; the printed rows (medians over rounds), and one
    record per configuration for the docs table."""
    runs = [lockstep_run(shape, tmp / f"lock-{shape}-{cold_mib}-{r}", utils, cold_mib)
            for r in range(rounds)]
    plain = statistics.median(r[0]["plain"] for r in runs)
    caches = f"caches swept ({cold_mib} MiB read) before each call" if cold_mib else "warm"
    rows = [f"lockstep {shape}: schedulers alone (vLLM's create_scheduler, hand-made outputs), "
            f"{caches}, {rounds} rounds",
            f"  {'config':<8}{'sched CPU s':>12}{'added ms':>10}{'events':>10}{'µs/event':>10}"
            f"{'ratio':>8}"]
    table: list[dict[str, Any]] = []
    plain_wall = statistics.median(r[2]["plain"] for r in runs)
    for config in CONFIGS:
        med = statistics.median(r[0][config] for r in runs)
        added = statistics.median(r[0][config] - r[0]["plain"] for r in runs)
        events = runs[0][1][config]
        per_event = f"{added / events * 1e6:10.2f}" if events else f"{'-':>10}"
        rows.append(f"  {config:<8}{med:12.3f}{added * 1e3:10.1f}{events:>10,}{per_event}"
                    f"{med / plain:8.2f}")
        wall = statistics.median(r[2][config] for r in runs)
        table.append({"shape": shape, "row": config, "rounds": rounds, "events": events,
                      "base_cpu_s": plain, "cpu_s": med, "base_wall_s": plain_wall,
                      "wall_s": wall, "added_ms": added * 1e3,
                      "us_per_event": added / events * 1e6 if events else None,
                      "ratio": med / plain, "wall_ratio": wall / plain_wall,
                      "same_hits": None, "cold_mib": cold_mib})
    return rows, table


# -- the writer thread ------------------------------------------------------------------------

def _thread_cpu_s(thread: threading.Thread) -> float:
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))  # type: ignore[arg-type]


def writer_sustained(events: list[tuple[str, dict]], tmp: Path) -> tuple[float, float, int]:
    """Emit everything as possible from a producer thread; (events/s wall through
    close, events per writer-thread CPU second, events dropped)."""
    from kvclaims.recorder.buffer import EventBuffer
    from kvclaims.contract.trace_writer import RunWriter

    buf = EventBuffer(RunWriter(tmp / "sustained", {"run_id": "w"}), "w",
                      capacity=len(events) + 16)
    writer = buf._thread  # NOTE: private, read only to clock its CPU time
    cpu0 = _thread_cpu_s(writer)

    def produce() -> None:
        emit = buf.emit
        for name, fields in events:
            emit(name, **fields)

    t0 = time.perf_counter()
    producer = threading.Thread(target=produce)
    producer.start()
    producer.join()
    buf.flush()
    writer_cpu = _thread_cpu_s(writer) - cpu0
    wall = time.perf_counter() - t0
    buf.close()
    return len(events) / wall, len(events) / max(writer_cpu, 1e-9), buf.events_dropped


def writer_offered(events: list[tuple[str, dict]], rate: int, window_s: float, capacity: int,
                   out: Path) -> tuple[int, int, int]:
    """Offer ``rate`` events/s for ``window_s`` s; (emitted, dropped, recorder_gap rows)."""
    from kvclaims.reconstruct.loader import load_runs
    from kvclaims.recorder.buffer import EventBuffer
    from kvclaims.contract.trace_writer import RunWriter

    buf = EventBuffer(RunWriter(out, {"run_id": "o"}), "o", capacity=capacity)
    emit = buf.emit
    tick = 0.005
    per_tick = max(1, int(rate * tick))
    start = time.perf_counter()
    sent = 0
    while (now := time.perf_counter() - start) < window_s:
        due = int(now * rate)
        while sent < due:
            for _ in range(min(per_tick, due - sent)):
                name, fields = events[sent % len(events)]
                emit(name, **fields)
                sent += 1
        time.sleep(tick)
    buf.close()
    gaps = load_runs([out]).connect().sql(
        "select count(*) from events where event = 'recorder_gap'").fetchall()[0][0]
    return sent, buf.events_dropped, int(gaps)


def writer_rows(args: argparse.Namespace, tmp: Path) -> list[str]:
    """The writer figures, as printed rows."""
    from recorder_cost import workload

    events = workload(args.writer_events)
    wall_rate, cpu_rate, dropped = writer_sustained(events, tmp)
    rows = [f"writer: {len(events):,} events of the recorder_cost.py mix",
            f"  sustained, producer flat out: {wall_rate:12,.0f} events/s wall "
            f"(emit + convert + write, one process), {cpu_rate:12,.0f} events per writer-thread "
            f"CPU second; dropped {dropped}",
            f"  offered rate for {args.window_s:g} s into {args.capacity:,} pending events:",
            f"  {'offered/s':>12}{'emitted':>12}{'dropped':>10}{'recorder_gap':>14}"]
    first_drop = None
    for rate in args.rates:
        sent, dropped, gaps = writer_offered(events, rate, args.window_s, args.capacity,
                                             tmp / f"offered-{rate}")
        rows.append(f"  {rate:>12,}{sent:>12,}{dropped:>10,}{gaps:>14}")
        print(rows[-1], file=sys.stderr, flush=True)
        if dropped and first_drop is None:
            first_drop = rate
    rows.append(f"  first offered rate with drops: "
                f"{f'{first_drop:,}/s' if first_drop else 'none up to the highest offered'}")
    return rows


# -- the docs section ---------------------------------------------------------------------------

def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def engine_markdown(mode: str, table: list[dict[str, Any]]) -> str:
    """The engine (or lockstep) rows as the docs show them: what was measured, then one table
    row per configuration and shape."""
    rows = []
    for r in table:
        name = "plain (null)" if r["row"] == "plain" else r["row"]
        if r.get("cold_mib"):
            name += f", {r['cold_mib']} MiB swept"
        rows.append([r["shape"], name, r["rounds"], f"{r['base_cpu_s']:.3f}",
                     f"{r['cpu_s']:.3f}", f"{r['base_wall_s']:.3f}", f"{r['wall_s']:.3f}",
                     f"{r['added_ms']:.1f}", f"{r['events']:,}", _fmt(r["us_per_event"], ".2f"),
                     f"{r['ratio']:.2f}", f"{r['wall_ratio']:.2f}"])
    header = ["shape", "config", "rounds", "plain CPU s", "config CPU s", "plain wall s",
              "config wall s", "added CPU ms", "events", "µs/event", "CPU ratio", "wall ratio"]
    return mode + "\n\n" + _report.markdown_table(header, rows)


def main(argv: list[str] | None = None) -> int:
    """Print the engine table per shape and the writer figures."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--configs", default=",".join(ENGINE_ROWS),
                    help="engine rows, from: " + ", ".join(ENGINE_ROWS))
    ap.add_argument("--engine-only", action="store_true")
    ap.add_argument("--lockstep", action="store_true",
                    help="instead of engines: the schedulers alone, stepped side by side")
    ap.add_argument("--cold-mib", type=lambda s: [int(x) for x in s.split(",")], default=[0],
                    help="with --lockstep: MiB read before each timed call (0: warm caches); "
                    "a list runs each")
    ap.add_argument("--claim-path", action="store_true",
                    help="instead of --shapes/--configs: the claims shape's pool hooks and claim "
                    "path measured apart (" + ", ".join(CLAIM_PATH_ROWS) + ")")
    ap.add_argument("--writer-only", action="store_true")
    ap.add_argument("--writer-events", type=int, default=1_000_000)
    ap.add_argument("--capacity", type=int, default=1_000_000,
                    help="pending events the buffer holds (the recorder's default: 1,000,000)")
    ap.add_argument("--window-s", type=float, default=4.0)
    ap.add_argument("--rates", type=lambda s: [int(x) for x in s.split(",")],
                    default=[100_000, 200_000, 400_000, 800_000])
    _report.add_doc_option(ap)
    args = ap.parse_args(argv)
    shapes = [s for s in args.shapes.split(",") if s]
    configs = tuple(c for c in args.configs.split(",") if c)
    if args.claim_path:
        shapes, configs = ["claims"], CLAIM_PATH_ROWS
    unknown = [s for s in shapes if s not in SHAPES]
    odd = [c for c in configs if c not in ENGINE_ROWS + CLAIM_PATH_ROWS]
    if unknown or odd or args.rounds < 1 or min(args.cold_mib) < 0:
        print(f"error: unknown shape(s) {unknown} or config(s) {odd}; shapes: {sorted(SHAPES)}, "
              f"configs: {list(ENGINE_ROWS)}; rounds >= 1, cold-mib >= 0", file=sys.stderr)
        return 2
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    rows: list[str] = []
    table: list[dict[str, Any]] = []
    writer: list[str] = []
    mode = ""
    with tempfile.TemporaryDirectory() as tmp:
        if args.lockstep:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            os.environ.setdefault("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")  # OPT's 2,048 < 6,400
            utils = _vllm_test_utils()
            mode = ("Lockstep: the schedulers alone (vLLM's `create_scheduler`, hand-made model "
                    "outputs), plain, native and hard stepped side by side; medians over "
                    "rounds; CPU and wall seconds of `schedule()` + `update_from_output()`.")
            for shape in shapes:
                for cold in args.cold_mib:
                    printed, records = lockstep_table(shape, args.rounds, Path(tmp), utils, cold)
                    rows += printed
                    table += records
                    print("\n".join(printed), file=sys.stderr, flush=True)
        elif not args.writer_only:
            mode = ("Engines: real in-process vLLM CPU engines, vanilla vLLM and one "
                    "configuration stepped in turn in one process per round (position-balanced "
                    "pairs of rounds); CPU seconds of the engine thread and wall seconds in "
                    "`schedule()` + `update_from_output()`, medians; added ms, µs per event and "
                    "ratios are medians over balanced pairs; `plain (null)` is vanilla vLLM "
                    "against itself (the resolution).")
            if args.claim_path:
                mode += (" `unclaimed`: `native` with the shape's claims not declared (the pool "
                         "hooks alone), against vanilla vLLM; `unclaimed:native`: `native` with "
                         "the claims against `native` without (the claim path alone; its "
                         "\"plain\" columns are `unclaimed`'s); `native`: both, against vanilla "
                         "vLLM.")
            for shape in shapes:
                printed, records = engine_table(shape, args.rounds, Path(tmp), configs)
                rows += printed
                table += records
        if not args.engine_only:
            writer = writer_rows(args, Path(tmp))
            rows += writer
    print("\n".join(rows))
    # NOTE: one section per part, so that --writer-only or --lockstep replaces only its own
    engine = ("recorder_overhead.lockstep" if args.lockstep else
              "recorder_overhead.claim_path" if args.claim_path else "recorder_overhead.engine")
    if table:
        _report.write_section(engine, engine_markdown(mode, table), args.doc, script=__file__)
    if writer:
        _report.write_section("recorder_overhead.writer", _report.preformatted(writer),
                              args.doc, script=__file__)
    return 0


if __name__ == "__main__":
    sys.exit(main())
