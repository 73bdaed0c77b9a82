"""What the recorder costs: emit() per event, background conversion+write throughput, bytes/event.

Run: ``.venv/bin/python benchmarks/recorder_cost.py [--events N]`` (default 1,000,000; well
under a minute). The event mix imitates a prefix-caching workload: each request allocates its
blocks, caches them (hash, parent hash, position), later ones hit a shared prefix, blocks are
freed, and some are evicted; a second figure emits the same mix as one ``emit_many`` entry
per hook call; a third stages it as the engine's hooks do (``EventBuffer.stage``: one flat
tuple per hook call, no lock, one ``advance_step`` per scheduler step of 32 hook calls), with the
writer thread's rate for those staged entries.

The cost where it matters — the scheduler's own CPU time inside the real vLLM engine, plain vs
with the recorder — is ``benchmarks/recorder_overhead.py``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import _report  # noqa: E402
from kvclaims.recorder.buffer import EventBuffer, layout  # noqa: E402
from kvclaims.contract.trace_writer import RunWriter  # noqa: E402
from kvclaims.reconstruct.loader import load_runs  # noqa: E402


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


def _timed_flush(buf: EventBuffer) -> float:
    """Seconds one ``flush`` takes (the writer's conversion of what is buffered)."""
    t0 = time.perf_counter()
    buf.flush()
    return time.perf_counter() - t0


def _close_clean(buf: EventBuffer) -> None:
    """Close ``buf``; a run that dropped events or hit recorder errors measured nothing."""
    buf.close()
    assert buf.events_dropped == 0 and buf.recorder_errors == 0


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
        flush_s += _timed_flush(buf)
    _close_clean(buf)
    return statistics.median(per_event) * 1e9, len(events) / flush_s


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
    _close_clean(buf)
    return statistics.median(per_event) * 1e9


_SCALARS = ("request_id", "by_request_id", "cause")


def as_staged(calls: list[tuple[str, int, dict]]) -> list[tuple[str, int, tuple, tuple]]:
    """The ``emit_many`` entries as the hooks stage them: (event, n, layout, flat values)."""
    out = []
    for name, count, cols in calls:
        scalars = tuple(k for k in cols if k in _SCALARS)
        columns = tuple(k for k in cols if k not in _SCALARS)
        values = tuple(cols[k] for k in scalars) + tuple(v for k in columns for v in cols[k])
        out.append((name, count, layout(scalars, columns), values))
    return out


def hot_path_staged(events: list[tuple[str, dict]], run: Path, chunk: int = 50_000,
                    step_every: int = 32) -> tuple[float, float]:
    """Median ``stage`` cost per recorded event (the hook's flat tuple built from prepared
    columns, plus one ``advance_step`` per ``step_every`` hook calls), and the writer's
    convert + write rate for the staged entries (events/s of ``flush()``)."""
    staged = as_staged(as_hook_calls(events))
    buf = EventBuffer(RunWriter(run, {"run_id": "bench-staged"}), "bench-staged",
                      capacity=4 * chunk, flush_interval_s=3600, step=0)
    stage, step, clock = buf.stage, buf.advance_step, time.monotonic_ns
    per_event = []
    flush_s = 0.0
    for start in range(0, len(staged), chunk // 8):
        part = staged[start:start + chunk // 8]
        n = sum(c[1] for c in part)
        t0 = time.perf_counter()
        for i, (name, count, lay, values) in enumerate(part):
            stage((name, count, clock(), lay, *values))
            if i % step_every == step_every - 1:
                step()
        step()
        per_event.append((time.perf_counter() - t0) / n)
        flush_s += _timed_flush(buf)
    _close_clean(buf)
    return statistics.median(per_event) * 1e9, len(events) / flush_s


def main(argv: list[str] | None = None) -> int:
    """Print the figures."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--compression", default="zstd", help="zstd, lz4 or none")
    _report.add_doc_option(ap)
    args = ap.parse_args(argv)
    compression = None if args.compression == "none" else args.compression
    events = workload(args.events)
    n = len(events)
    floor = _call_floor(events[:200_000]) / min(n, 200_000) * 1e9
    with tempfile.TemporaryDirectory() as tmp:
        emit_ns, convert_rate = hot_path(events, Path(tmp) / "hot")
        many_ns = hot_path_many(events, Path(tmp) / "many")
        staged_ns, staged_rate = hot_path_staged(events, Path(tmp) / "staged")

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

    figures = [
        ("events", f"{n:,} (compression: {args.compression})"),
        ("python call floor (same kwargs)", f"{floor:.0f} ns/event"),
        ("emit() hot path, median", f"{emit_ns:.0f} ns/event"),
        ("emit_many() per hook call, median", f"{many_ns:.0f} ns/event"),
        ("stage() per hook call, median", f"{staged_ns:.0f} ns/event"),
        ("convert + write (writer thread)", f"{convert_rate:,.0f} events/s"),
        ("the same, staged hook calls", f"{staged_rate:,.0f} events/s"),
        ("end to end (emit+convert+write)", f"{live / n * 1e9:.0f} ns/event"),
        ("on disk", f"{seg_bytes / n:.1f} bytes/event ({seg_bytes / 1e6:.1f} MB)"),
        ("load (decode + checks)", f"{n / load:,.0f} events/s"),
    ]
    for name, value in figures:
        print(f"{name:<37}{value}")
    _report.write_section("recorder_cost", _report.markdown_table(["figure", "value"], figures),
                          args.doc, script=__file__)
    return 0


if __name__ == "__main__":
    sys.exit(main())
