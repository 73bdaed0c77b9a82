"""What the recorder costs: emit() per event, background conversion+write throughput, bytes/event.

Run: ``.venv/bin/python benchmarks/recorder_cost.py [--events N]`` (default 1,000,000; well
under a minute). The event mix imitates a prefix-caching workload: each request allocates its
blocks, caches them (hash, parent hash, position), later ones hit a shared prefix, blocks are
freed, and some are evicted; a second figure emits the same mix as one ``emit_many`` entry
per hook call, as the engine's hooks do.

``--engine`` measures the cost where it matters: the scheduler's own CPU time inside the real
vLLM engine, plain vs with the recorder (see ``engine_main``); a few minutes on 2 cores:
``.venv/bin/python benchmarks/recorder_cost.py --engine [--requests 400] [--rounds 2]``.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from recorder.buffer import EventBuffer  # noqa: E402
from recorder.trace_writer import RunWriter  # noqa: E402
from reconstruct.loader import load_runs  # noqa: E402


def workload(n: int, seed: int = 0) -> list[tuple[str, dict]]:
    """A realistic mix of block events, precomputed so the timing measures emit() only."""
    rng = random.Random(seed)
    out: list[tuple[str, dict]] = []
    req = 0
    while len(out) < n:
        rid = f"req-{req}"
        req += 1
        nblocks = rng.randint(4, 64)
        shared = rng.randint(0, nblocks // 2)
        parent = 0
        for pos in range(nblocks):
            block = rng.randrange(1, 8192)
            h = rng.getrandbits(64)
            if pos < shared:
                out.append(("block_hit", dict(block_id=block, block_hash=h, position=pos,
                                              request_id=rid)))
            else:
                out.append(("block_allocated", dict(block_id=block, request_id=rid)))
                out.append(("block_cached", dict(block_id=block, block_hash=h, parent_hash=parent,
                                                 position=pos, request_id=rid)))
            parent = h
        for _ in range(nblocks):
            out.append(("block_freed", dict(block_id=rng.randrange(1, 8192), request_id=rid)))
        for _ in range(rng.randint(0, nblocks // 4)):
            out.append(("block_evicted", dict(block_id=rng.randrange(1, 8192),
                                              block_hash=rng.getrandbits(64), cause="allocation",
                                              by_request_id=rid)))
    return out[:n]


def _emit_all(buf: EventBuffer, events: list[tuple[str, dict]]) -> float:
    emit: Callable[..., None] = buf.emit
    t0 = time.perf_counter()
    for name, fields in events:
        emit(name, **fields)
    return time.perf_counter() - t0


def _empty(event: str, **fields: object) -> None:
    """The floor: a Python call with the same keyword arguments and no work."""


def _call_floor(events: list[tuple[str, dict]]) -> float:
    t0 = time.perf_counter()
    for name, fields in events:
        _empty(name, **fields)
    return time.perf_counter() - t0


def hot_path(events: list[tuple[str, dict]], run: Path, chunk: int = 50_000) -> tuple[float, float]:
    """Median emit() cost per event over chunks, flushing (untimed) between chunks.

    NOTE: flushing between chunks keeps the pending list at steady-state size, as the writer
    thread does in a live engine; timing one huge un-drained burst would measure the
    allocator and the cyclic GC walking a million pending dicts instead.
    Returns (median ns/event, conversion+write events/s over the flushes).
    """
    buf = EventBuffer(RunWriter(run, {"run_id": "bench-hot"}), "bench-hot",
                      capacity=4 * chunk, flush_interval_s=3600)
    per_event = []
    flush_s = 0.0
    for start in range(0, len(events), chunk):
        part = events[start:start + chunk]
        per_event.append(_emit_all(buf, part) / len(part))
        t0 = time.perf_counter()
        buf.flush()
        flush_s += time.perf_counter() - t0
    buf.close()
    assert buf.events_dropped == 0 and buf.recorder_errors == 0
    return statistics.median(per_event) * 1e9, len(events) / flush_s


# -- in-engine cost (--engine) ----------------------------------------------------------------

_clock = time.thread_time_ns
SPENT = [0]
STEPS = [0]


def _timed(base: type) -> type:
    """``base`` with its schedule() and update_from_output() CPU time added to SPENT."""

    class Timed(base):  # type: ignore[misc, valid-type]
        def schedule(self, *a: Any, **k: Any) -> Any:
            STEPS[0] += 1
            t0 = _clock()
            try:
                return super().schedule(*a, **k)
            finally:
                SPENT[0] += _clock() - t0

        def update_from_output(self, *a: Any, **k: Any) -> Any:
            t0 = _clock()
            try:
                return super().update_from_output(*a, **k)
            finally:
                SPENT[0] += _clock() - t0

    Timed.__name__ = f"Timed{base.__name__}"
    return Timed


def engine_workload(n: int, seed: int = 0) -> list[tuple[str, list[int], dict | None]]:
    """``n`` requests over 24 shared documents (4-24 blocks) plus 1-3 unique blocks each; the
    first request of every fourth document declares a hard claim on it."""
    rng = random.Random(seed)
    from recorder.scenarios import tokens

    docs = [tokens(1000 + d, rng.randint(4, 24)) for d in range(24)]
    claimed: set[int] = set()
    out = []
    for i in range(n):
        d = rng.randrange(len(docs))
        claim = None
        if d % 4 == 0 and d not in claimed:
            claimed.add(d)
            claim = {"claim_id": f"doc-{d}", "tenant": f"t{d % 3}",
                     "protection_mode": "hard_protected"}
        out.append((f"r{i}", docs[d] + tokens(5000 + i, rng.randint(1, 3)), claim))
    return out


def run_once(config: str, reqs: list, usable: int, out: Path) -> tuple[float, int, int]:
    """One engine, one configuration; returns (scheduler CPU s, events recorded, steps)."""
    from vllm import EngineArgs, LLMEngine
    from vllm.v1.core.sched.scheduler import Scheduler

    from recorder.scenarios import Driver, engine_args
    from recorder.scheduler import KVClaimsScheduler

    from recorder.tiny_model import ensure_tiny_model

    policy = {"plain": None, "native": "native", "hard": "hard_protected"}[config]
    cfg = {"out": str(out), "policy": policy or "native", "run_id": f"bench-{config}",
           "max_defer_steps": 2}
    args = engine_args(ensure_tiny_model(), usable, cfg)
    args["scheduler_cls"] = _timed(Scheduler if policy is None else KVClaimsScheduler)
    if policy is None:
        args.pop("additional_config")
    engine = LLMEngine.from_engine_args(EngineArgs(**args))
    driver = Driver(engine)
    SPENT[0] = STEPS[0] = 0
    try:
        for i in range(0, len(reqs), 16):
            for name, prompt, claim in reqs[i:i + 16]:
                driver.submit(name, prompt, claim=claim if config == "hard" else None,
                              max_tokens=4)
            driver.run()
        spent = SPENT[0] / 1e9
    finally:
        engine.engine_core.shutdown()
    events = 0
    if policy is not None:
        import json

        events = json.loads((out / "manifest.json").read_text())["events_written"]
    return spent, events, STEPS[0]


def engine_main(args: argparse.Namespace) -> int:
    """``--engine``: the scheduler's CPU time inside the real engine, plain vs recorded.

    One in-process vLLM CPU engine per configuration, alternated ``--rounds`` times: vLLM's
    plain ``Scheduler``, the recorder under ``native`` (no claims), and the recorder under
    ``hard_protected`` with claims, on a prefix-heavy workload (24 shared documents, a pool
    far smaller than the working set: heavy eviction). Timed: the engine thread's CPU time
    (``time.thread_time_ns``) inside ``schedule()`` and ``update_from_output()``, i.e. the
    scheduler's own work with every recorder hook, not the model and not the writer thread.
    """
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    reqs = engine_workload(args.requests)
    configs = [c for c in ("plain", "native", "hard") if c in args.configs.split(",")]
    if "plain" not in configs:
        print("--configs must include plain (the baseline)", file=sys.stderr)
        return 2
    results: dict[str, list[tuple[float, int, int]]] = {c: [] for c in configs}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for config in results:
                res = run_once(config, reqs, args.usable_blocks, Path(tmp) / f"{config}-{r}")
                results[config].append(res)
                print(f"round {r + 1}/{args.rounds} {config:6s} scheduler CPU {res[0]:.3f} s, "
                      f"{res[1]:,} events, {res[2]:,} steps", file=sys.stderr, flush=True)
    plain = statistics.median(r[0] for r in results["plain"])
    plain_steps = int(statistics.median(r[2] for r in results["plain"]))
    print(f"workload: {args.requests} requests, {args.usable_blocks} usable blocks, "
          f"{args.rounds} alternating rounds (medians); scheduler = schedule() + "
          f"update_from_output() CPU time of the engine thread")
    print(f"{'configuration':28s} {'sched CPU s':>11s} {'ratio':>6s} {'steps':>7s} "
          f"{'events':>8s} {'added ns/event':>15s}")
    print(f"{'vLLM Scheduler (plain)':28s} {plain:11.3f} {1.0:6.2f} {plain_steps:7,d} "
          f"{'-':>8s} {'-':>15s}")
    for config, label in (("native", "recorder, native"), ("hard", "recorder, hard + claims")):
        if config not in results:
            continue
        spent = statistics.median(r[0] for r in results[config])
        events = int(statistics.median(r[1] for r in results[config]))
        steps = int(statistics.median(r[2] for r in results[config]))
        added = (spent - plain) / events * 1e9 if events else float("nan")
        print(f"{label:28s} {spent:11.3f} {spent / plain:6.2f} {steps:7,d} {events:8,d} "
              f"{added:15.0f}")
    print("NOTE: under hard_protected the claims defer and refuse requests, so the engine runs "
          "a different schedule (see steps); its ratio is not the recorder's cost alone.")
    return 0


def as_hook_calls(events: list[tuple[str, dict]]) -> list[tuple[str, int, dict]]:
    """Group each request's events by kind into ``emit_many`` entries (what one hook call
    emits: a whole allocation, cache step, hit list, free list or eviction list)."""
    calls: list[tuple[str, int, dict]] = []
    current: dict[str, list[dict]] = {}
    current_rid = None

    def flush() -> None:
        for name, group in current.items():
            cols = {k: tuple(f[k] for f in group) for k in group[0]}
            for k in ("request_id", "by_request_id", "cause"):
                if k in cols:
                    cols[k] = group[0][k]
            calls.append((name, len(group), cols))
        current.clear()

    for name, fields in events:
        rid = fields.get("request_id", fields.get("by_request_id"))
        if rid != current_rid:
            flush()
            current_rid = rid
        current.setdefault(name, []).append(fields)
    flush()
    return calls


def hot_path_many(events: list[tuple[str, dict]], run: Path, chunk: int = 50_000) -> float:
    """Median ``emit_many`` cost per recorded event (entries built beforehand, as a hook
    builds its lists from vLLM's block lists)."""
    calls = as_hook_calls(events)
    buf = EventBuffer(RunWriter(run, {"run_id": "bench-many"}), "bench-many",
                      capacity=4 * chunk, flush_interval_s=3600)
    emit_many = buf.emit_many
    per_event = []
    for start in range(0, len(calls), chunk // 8):
        part = calls[start:start + chunk // 8]
        n = sum(c[1] for c in part)
        t0 = time.perf_counter()
        for name, count, cols in part:
            emit_many(name, count, cols)
        per_event.append((time.perf_counter() - t0) / n)
        buf.flush()
    buf.close()
    assert buf.events_dropped == 0 and buf.recorder_errors == 0
    return statistics.median(per_event) * 1e9


def main(argv: list[str] | None = None) -> int:
    """Print the figures."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--compression", default="zstd", help="zstd, lz4 or none")
    ap.add_argument("--engine", action="store_true",
                    help="measure the scheduler's CPU time in the real engine instead")
    ap.add_argument("--requests", type=int, default=400, help="--engine: requests")
    ap.add_argument("--usable-blocks", type=int, default=160, help="--engine: pool size")
    ap.add_argument("--rounds", type=int, default=2, help="--engine: alternating rounds")
    ap.add_argument("--configs", default="plain,native,hard",
                    help="--engine: which of plain,native,hard to run (plain is required)")
    args = ap.parse_args(argv)
    if args.engine:
        return engine_main(args)
    compression = None if args.compression == "none" else args.compression
    events = workload(args.events)
    n = len(events)
    floor = _call_floor(events[:200_000]) / min(n, 200_000) * 1e9
    with tempfile.TemporaryDirectory() as tmp:
        emit_ns, convert_rate = hot_path(events, Path(tmp) / "hot")
        many_ns = hot_path_many(events, Path(tmp) / "many")

        # end to end: a tight loop with the writer thread at its default cadence, so the
        # wall time includes the conversion's share of the GIL
        run = Path(tmp) / "live"
        buf = EventBuffer(RunWriter(run, {"run_id": "bench-live"}, compression=compression),
                          "bench-live", capacity=4 * n)
        t0 = time.perf_counter()
        _emit_all(buf, events)
        buf.close()
        live = time.perf_counter() - t0
        assert buf.events_dropped == 0 and buf.recorder_errors == 0

        seg_bytes = sum(p.stat().st_size for p in run.glob("events-*.arrows"))
        t0 = time.perf_counter()
        trace = load_runs([run])
        load = time.perf_counter() - t0
        assert trace.events.num_rows == n + 2

    print(f"events                               {n:,} (compression: {args.compression})")
    print(f"python call floor (same kwargs)      {floor:8.0f} ns/event")
    print(f"emit() hot path, median              {emit_ns:8.0f} ns/event")
    print(f"emit_many() per hook call, median    {many_ns:8.0f} ns/event")
    print(f"convert + write (writer thread)      {convert_rate:12,.0f} events/s")
    print(f"end to end (emit+convert+write)      {live / n * 1e9:8.0f} ns/event")
    print(f"on disk                              {seg_bytes / n:8.1f} bytes/event "
          f"({seg_bytes / 1e6:.1f} MB)")
    print(f"load (decode + checks)               {n / load:12,.0f} events/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
