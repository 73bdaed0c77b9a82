"""``kvclaims listen``: record a stock vLLM from its own KV events, beside the engine.

    kvclaims listen --endpoint tcp://HOST:5557 [--replay tcp://HOST:5558] [--topic T]
                    [--claims FILE] --out RUN_DIR

One listener per engine (or per data-parallel rank: vLLM offsets the ports by the rank). It
stops cleanly on SIGINT/SIGTERM (or after ``--duration``) and closes the run. See
docs/stock-vllm.md for what an observed run can and cannot tell.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from kvclaims.contract.schema import InputError
from kvclaims.sources.declared_claims import DEFAULT_NONE_HASH_SEED, HashScheme
from kvclaims.sources.declared_claims import load_claims, tokenize
from kvclaims.sources import kv_events as kv


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``listen``."""
    p = sub.add_parser(
        "listen", help="record a stock vLLM from its KV events (--kv-events-config)",
        description="Subscribe to vLLM's ZMQ KV events and record them as an observed run "
                    "(evidence: observed): block_cached / block_evicted (cause unknown) / "
                    "cache_reset, gaps from the batch seq (filled from --replay when given), "
                    "and the claims of --claims written at their 'from'/'until' times.")
    p.add_argument("--endpoint", required=True,
                   help="vLLM's PUB endpoint, e.g. tcp://127.0.0.1:5557")
    p.add_argument("--bind", action="store_true",
                   help="bind --endpoint instead of connecting (when vLLM's endpoint names a "
                        "host, e.g. tcp://127.0.0.1:5557, vLLM connects to it)")
    p.add_argument("--allow-remote", action="store_true",
                   help="with --bind: allow an address beyond loopback (every interface, an "
                        "interface name, a non-loopback address). Anyone who can reach it can "
                        "publish forged events; see docs/stock-vllm.md")
    p.add_argument("--max-frame-bytes", type=int, default=None, metavar="BYTES",
                   help="drop (and count, as a gap) a payload larger than this "
                        "(default 1 MiB; vLLM's largest batches are ~100 KB)")
    p.add_argument("--replay", default=None,
                   help="vLLM's replay (ROUTER) endpoint, e.g. tcp://127.0.0.1:5558")
    p.add_argument("--topic", default="", help="topic prefix to subscribe to (default: all)")
    p.add_argument("--data-parallel-rank", type=int, default=0, metavar="RANK",
                   help="listen to this DP rank: vLLM adds the rank to both ports (default 0)")
    p.add_argument("--claims", type=Path, default=None,
                   help="claims file (JSON Lines, or YAML); see docs/stock-vllm.md")
    p.add_argument("--out", required=True, type=Path, help="run directory to create")
    p.add_argument("--run-id", default=None, help="run id (default: the --out folder name)")
    p.add_argument("--model", default=None, help="model name, for the manifest")
    p.add_argument("--block-size", type=int, default=None,
                   help="vLLM's block size (default: learned from the first BlockStored)")
    p.add_argument("--num-blocks", type=int, default=None,
                   help="vLLM's num_gpu_blocks, for the manifest (usable = N - 1)")
    p.add_argument("--hash-algo", default="sha256",
                   choices=("sha256", "sha256_cbor", "xxhash", "xxhash_cbor"),
                   help="vLLM's --prefix-caching-hash-algo (to bind claims given by tokens)")
    p.add_argument("--hash-seed", default=None,
                   help="the engine's PYTHONHASHSEED if it sets one (vLLM then seeds NONE_HASH "
                        "with it; required for xxhash)")
    p.add_argument("--tokenizer", default=None,
                   help="local tokenizer folder for claims given as text")
    p.add_argument("--capture", type=Path, default=None,
                   help="also save the raw frames to this file "
                        "(kvclaims import --from vllm-kv-events FILE)")
    p.add_argument("--duration", type=float, default=None,
                   help="stop after this many seconds (default: until SIGINT/SIGTERM)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.set_defaults(func=cmd_listen)


def hash_scheme(algo: str, seed: str | None) -> Any:
    """The engine's hash scheme (vLLM's rules for the NONE_HASH seed)."""

    if seed is None and algo.startswith("xxhash"):
        raise InputError(f"--hash-algo {algo}: vLLM seeds it randomly per process unless the "
                         "engine sets PYTHONHASHSEED; pass that value as --hash-seed")
    return HashScheme(algo, seed if seed is not None else DEFAULT_NONE_HASH_SEED)


def load_declared(path: Path | None, scheme: Any, block_size: int | None,
                  tokenizer: str | None) -> list[Any]:
    """Load the claims file and check, before listening, everything that can be checked."""
    if path is None:
        return []

    claims = load_claims(path)
    for c in claims:
        if c.text is not None:  # NOTE: tokenize now: a tokenizer fault is a startup error
            c.token_ids = tokenize(c.text, c.tokenizer or tokenizer, c.add_special_tokens,
                                   c.where)
        if block_size is not None or c.block_hashes is not None:
            c.hashes(scheme, block_size)
    return claims


def cmd_listen(args: argparse.Namespace) -> int:
    """``kvclaims listen``: run until SIGINT/SIGTERM or ``--duration``, then close the run."""

    if args.data_parallel_rank < 0:
        raise InputError("--data-parallel-rank must be >= 0")
    rank = args.data_parallel_rank
    endpoint = kv.check_endpoint(args.endpoint, bind=args.bind, rank=rank,
                                 allow_remote=args.allow_remote)
    if args.allow_remote and args.bind and endpoint.startswith("tcp://"):
        problem = kv.loopback_problem(endpoint[len("tcp://"):].rpartition(":")[0])
        if problem is not None:
            print(f"kvclaims listen: warning: --allow-remote: {problem}; anyone who can reach "
                  "it can publish forged events (docs/stock-vllm.md)", file=sys.stderr)
    max_frame = kv.MAX_FRAME_BYTES if args.max_frame_bytes is None else args.max_frame_bytes
    if max_frame < 1024:
        raise InputError("--max-frame-bytes must be >= 1024")
    replay_ep = (None if args.replay is None
                 else kv.check_endpoint(args.replay, "--replay", rank=rank))
    for name in ("block_size", "num_blocks"):
        val = getattr(args, name)
        if val is not None and val < 1:
            raise InputError(f"--{name.replace('_', '-')} must be >= 1")
    if args.duration is not None and args.duration <= 0:
        raise InputError("--duration must be > 0")
    scheme = hash_scheme(args.hash_algo, args.hash_seed)
    claims = load_declared(args.claims, scheme, args.block_size, args.tokenizer)
    topic = args.topic.encode()
    source = kv.ZmqSource(endpoint, topic, bind=args.bind, max_frame_bytes=max_frame,
                          allow_remote=args.allow_remote)
    replay = kv.ReplayClient(replay_ep) if replay_ep else None
    capture = None
    previous: dict[int, Any] = {}
    try:
        capture = kv.open_capture(args.capture) if args.capture else None
        info = kv.run_info(args.run_id or args.out.name, model=args.model,
                           block_size=args.block_size, num_blocks=args.num_blocks,
                           source={"endpoint": endpoint, "bind": args.bind,
                                   "replay": replay_ep, "topic": args.topic,
                                   "data_parallel_rank": rank},
                           scheme=scheme)
        run = kv.ObservedRun(args.out, info)
        listener = kv.Listener(run, kv.Translator(scheme), claims=claims, replay=replay,
                               topic=topic, capture=capture, default_tokenizer=args.tokenizer)
        listener.max_frame_bytes = max_frame
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, lambda *_: stop.set())
        _say(args, f"listening on {endpoint}"
                   f"{' (bound)' if args.bind else ''} -> {args.out} (evidence: observed)")
        leftover = _loop(listener, source, stop, args)
        _say(args, f"stopping: {'signal' if stop.is_set() else '--duration'}; closing the run")
        # NOTE: frames already received are applied before closing, for at most
        # STOP_DRAIN_S (a stop is honoured within a second); what is left is counted
        source.close()
        left = _drain(listener, source, leftover, time.monotonic() + STOP_DRAIN_S)
        summary = listener.close(time.time_ns(), {"listener_overflow": source.overflow,
                                                  "listener_unapplied_at_stop": left})
    finally:
        for sig, handler in previous.items():   # NOTE: an in-process caller keeps its own
            signal.signal(sig, handler)
        if capture is not None:
            capture.close()
        if replay is not None:
            replay.close()
        if not source._stop.is_set():
            source.close()
    _say(args, f"closed {args.out}: {summary['batches']} batches, {summary['events']} KV "
               f"events, {summary['batches_lost']} batches lost, {summary['replayed']} "
               f"replayed, hash check {summary['hash_check']}, "
               f"{summary['claims_started']} claims in force")
    return 0


# How long a stop waits for frames already received to be applied.
STOP_DRAIN_S = 0.5


def _drain(listener: Any, source: Any, items: list[Any], until: float) -> int:
    """Apply ``items``, then the queued frames, until the monotonic time ``until``; return
    how many were left unapplied."""
    left = 0
    while True:
        items = items or source.get(0.0)
        if not items:
            return left
        for frames, wall in items:
            if time.monotonic() >= until:
                left += 1
                continue
            listener.on_frames(frames, wall)
        items = []


def _loop(listener: Any, source: Any, stop: threading.Event,
          args: argparse.Namespace) -> list[Any]:
    """Apply frames until ``stop`` or ``--duration``; return the frames taken from the queue
    but not yet applied."""
    deadline = None if args.duration is None else time.monotonic() + args.duration
    next_report = time.monotonic() + 10.0
    reported = None
    while not stop.is_set():
        if deadline is not None and time.monotonic() >= deadline:
            return []
        items = source.get(0.1)
        for i, (frames, wall) in enumerate(items):
            if stop.is_set():   # NOTE: checked per frame: SIGINT is honoured within one
                return items[i:]  # frame's work (bounded by --max-frame-bytes)
            listener.on_frames(frames, wall)
        listener.tick(time.time_ns())
        if time.monotonic() >= next_report:
            next_report += 10.0
            c = listener.counts
            if reported == (c["batches"], c["batches_lost"]):
                continue  # NOTE: progress only when something moved
            reported = (c["batches"], c["batches_lost"])
            _say(args, f"listening: {c['batches']} batches, {c['events']} KV events, "
                       f"{c['batches_lost']} lost, {c['replayed']} replayed")
    return []


def _say(args: argparse.Namespace, msg: str) -> None:
    if not args.quiet:
        print(msg, file=sys.stderr, flush=True)
