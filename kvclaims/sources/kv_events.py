"""Record a stock vLLM from its own KV events: subscribe beside the engine, never inside it.

vLLM started with ``--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq",
...}'`` publishes, per scheduler step that changed its prefix cache, one ZMQ message of three
frames ``(topic, seq, payload)``: ``seq`` an 8-byte big-endian counter per *batch*, ``payload``
``msgspec.msgpack`` of ``EventBatch`` ``[ts, [events...], data_parallel_rank]`` with
``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared`` as tagged maps (``"type"``, newer
vLLM) or positional arrays (tag first, older vLLM). An optional ROUTER replay endpoint resends
the batches from a given seq. This module turns that stream into an ordinary kvclaims run
directory (``kvclaims.contract.trace_writer.RunWriter``), so the reconstructor, SQL and dashboard read
it like any other run; the manifest says ``"evidence": "observed"``.

What the evidence is, and is not (docs/design.md "Evidence: recorded or observed";
docs/stock-vllm.md):

- ``BlockStored`` -> one ``block_cached`` per hash: ``parent_hash`` from the chain, ``position``
  from the parent's position (0 when the parent is None; NULL when the parent was never seen);
  ``request_id`` NULL (the events name no request).
- ``BlockRemoved`` -> ``block_evicted`` with ``cause`` ``unknown`` and ``by_request_id`` NULL.
- ``AllBlocksCleared`` -> ``cache_reset`` (the reconstructor loses every resident block at it,
  exactly as for the in-engine recorder's ``cache_reset``).
- Block ids: the events carry none. A block is identified by its content hash; each
  ``BlockStored`` of a hash is one more *copy* of it (vLLM may hold one content in several
  physical blocks), given a synthetic ``block_id`` from a free list (smallest free id first,
  from 1), and a ``BlockRemoved`` of the hash ends one of its copies. The ids are stable within
  a run and never shared by two live copies, but they are not vLLM's physical block ids.
- A missing batch (the publisher's seq jumps, a payload that does not decode) is fetched from
  the replay endpoint when one is configured, else (or if the replay no longer has it) it
  becomes a ``recorder_gap``: one of the run's seqs per lost batch, reason
  ``publisher_batches_lost`` or ``undecodable_batch``; every loss after it is ``unknown``.
  A seq that goes *back* means the publisher restarted (a new engine, an empty cache): a
  ``cache_reset`` with reason ``publisher_restarted``.

NOTE: invariants
- seqs are dense from 0 (``run_started``) to ``run_finished``; every seq is a row or inside a
  later ``recorder_gap``'s span;
- batches are applied in the publisher's seq order, each exactly once;
- the receive loop only moves frames from ZMQ into a bounded queue: decoding, translation and
  writing happen on the processing thread, so a slow disk shows up as a gap (dropped frames,
  then replay), never as back-pressure on the engine (vLLM's PUB socket drops, it never blocks).
"""

from __future__ import annotations

import heapq
import ipaddress
import math
import os
import queue
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any, Final

from kvclaims.recorder.buffer import event_problem, pending_to_batch
from kvclaims.contract.schema import InputError, hash64
from kvclaims.contract.trace_writer import RunWriter, open_regular
from kvclaims.sources.declared_claims import HashScheme
from kvclaims.contract.schema import RECORDER_VERSION, SCHEMA_VERSION
from kvclaims.sources.declared_claims import schedule
from kvclaims.sources.declared_claims import START, action_events

RUNTIME: Final[str] = "vllm-kv-events"
END_SEQ: Final[bytes] = (-1).to_bytes(8, "big", signed=True)
CAPTURE_MAGIC: Final[bytes] = b"KVCLAIMS-VLLM-KV-EVENTS 1\n"
_RECORD = struct.Struct(">qIII")  # wall ns at receipt, len(topic), len(seq), len(payload)
_GPU_MEDIA: Final[frozenset[Any]] = frozenset({None, "GPU", "gpu"})
_MAX_POSITIONS: Final[int] = 4_000_000  # content hashes whose chain position is remembered
_MAX_GAP_NOTES: Final[int] = 100
_MASK: Final[int] = 0xFFFF_FFFF_FFFF_FFFF
CLOCK_GRACE_NS: Final[int] = 2_000_000_000

# Bounds on what one frame may make the listener do (docs/stock-vllm.md "Hostile publishers").
# NOTE: vLLM's largest real batch is one step's new blocks (a step of 128k prefill tokens is
# 8k hashes, ~80 KB of msgpack): 1 MiB (~116k hashes) leaves an order of magnitude of room
# and bounds one frame's work (and so how long a stop waits for it).
MAX_FRAME_BYTES: Final[int] = 1024 * 1024           # a payload larger is dropped and counted
MAX_BATCH_HASHES: Final[int] = 1 << 20              # block hashes in one batch, all events
MAX_LIVE_COPIES: Final[int] = 1 << 24               # cached copies tracked (block ids < 2^30)
MAX_SEQ: Final[int] = 1 << 62                       # a publisher seq at or above is malformed
MAX_SEQ_JUMP: Final[int] = 1 << 32                  # a forward jump larger is malformed
MAX_TS_S: Final[float] = 9.2e9                      # EventBatch.ts: seconds since the epoch
MAX_BLOCK_SIZE: Final[int] = 2**30 - 1

# Conformance checks an observed run cannot exercise, and why (also in the manifest).
NOT_EXERCISED: Final[dict[str, str]] = {
    "L2": "write no-admit needs reuse_denied, which only the in-engine recorder writes",
    "L3": "nothing enforced the claims: no admission decisions, refusals or pins observed",
    "L6": "the runtime reports no claim materialization",
    "L7": "the runtime reports nothing about claims to compare with",
    "INV_refusal_names_protected_claim": "no admission decisions observed",
    "INV_no_protected_loss": "nothing protected the claimed blocks",
    "INV_feasible_admission": "no admission decisions observed",
    "L4": "nothing demotes an observed claim: no arbiter runs beside a stock engine",
    "L_feasibility": "no admission decisions observed",
    "L_chunking": "no scheduler steps or allocations observed",
    "LIT_soft_order": "nothing orders evictions by claim priority beside a stock engine",
}
# What the evidence cannot tell; the columns stay NULL (or 'unknown'), never guessed.
OBSERVED_LIMITS: Final[tuple[str, ...]] = (
    "block_evicted.cause is 'unknown' and by_request_id NULL: KV events name no evicting request",
    "no request_* events: admission, deferral, refusal and preemption are not observed",
    "block_cached.request_id NULL; block_allocated/block_hit/block_freed absent",
    "step NULL: the events carry no scheduler step; claim predicates are judged per event",
    "block_id is synthetic: one id per cached copy of a content hash, not vLLM's block id",
)

STORED, REMOVED, CLEARED = 0, 1, 2
_KINDS: Final[dict[str, int]] = {"BlockStored": STORED, "BlockRemoved": REMOVED,
                                 "AllBlocksCleared": CLEARED}
# Older vLLM (array_like tagged structs): the tag, then the fields in declaration order.
_POSITIONAL: Final[dict[int, tuple[str, ...]]] = {
    STORED: ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
             "medium"),
    REMOVED: ("block_hashes", "medium"),
    CLEARED: (),
}

# One decoded event: (kind, hashes, parent, token_ids, block_size, medium, group_idx)
KVEvent = tuple[int, list[int], "int | None", "list[int] | None", "int | None", Any, Any]


class KVEventsError(InputError):
    """A frame or capture that is not vLLM KV events (one clear line)."""


# -- decoding ---------------------------------------------------------------------------------

_decoder: Any = None


def _msgpack_decoder() -> Any:
    global _decoder
    if _decoder is None:
        try:
            import msgspec
        except ImportError:
            raise InputError("vLLM KV events need the Python package 'msgspec' "
                             "(pip install msgspec)") from None
        _decoder = msgspec.msgpack.Decoder()
    return _decoder


def _hash(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value & 0xFFFF_FFFF_FFFF_FFFF
    if isinstance(value, (bytes, bytearray, memoryview)) and len(value) <= 1024:
        return hash64(bytes(value))
    raise KVEventsError(f"block hash is {type(value).__name__}, expected int or bytes")


def _opt_int(value: Any, name: str, lo: int, hi: int) -> int | None:
    """An optional integer field in ``lo..hi``; anything else is a malformed batch."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise KVEventsError(f"field '{name}' is {_brief(value)}, expected an integer in "
                            f"{lo}..{hi}")
    return value


def _brief(value: Any) -> str:
    text = repr(value) if not isinstance(value, (list, dict, bytes)) else type(value).__name__
    return text if len(text) <= 40 else text[:37] + "..."


def _event(raw: Any) -> KVEvent:
    if isinstance(raw, dict):
        tag = raw.get("type")
        kind = _KINDS.get(tag) if isinstance(tag, str) else None
        if kind is None:
            raise KVEventsError(f"unknown KV event type {_brief(tag)}")
        get = raw.get
    elif isinstance(raw, list) and raw and isinstance(raw[0], str):
        kind = _KINDS.get(raw[0])
        if kind is None:
            raise KVEventsError(f"unknown KV event type {_brief(raw[0])}")
        fields = dict(zip(_POSITIONAL[kind], raw[1:]))
        get = fields.get
    else:
        raise KVEventsError(f"KV event is {type(raw).__name__}, expected a map or an array")
    if kind == CLEARED:
        return (CLEARED, [], None, None, None, None, None)
    hashes = get("block_hashes")
    if not isinstance(hashes, list):
        raise KVEventsError("KV event without a block_hashes list")
    if len(hashes) > MAX_BATCH_HASHES:
        raise KVEventsError(f"{len(hashes)} block hashes in one event (at most "
                            f"{MAX_BATCH_HASHES})")
    hs = [h & _MASK if type(h) is int else _hash(h) for h in hashes]
    medium = get("medium")
    if medium is not None and not isinstance(medium, str):
        raise KVEventsError(f"field 'medium' is {_brief(medium)}, expected a string")
    group = _opt_int(get("group_idx"), "group_idx", 0, 2**31 - 1)
    if kind == REMOVED:
        return (REMOVED, hs, None, None, None, medium, group)
    parent = get("parent_block_hash")
    tokens = get("token_ids")
    if tokens is not None and not (isinstance(tokens, list) and all(
            type(t) is int for t in tokens)):
        tokens = None   # NOTE: only hash verification reads them; ill-typed: not verified
    size = _opt_int(get("block_size"), "block_size", 1, MAX_BLOCK_SIZE)
    return (STORED, hs, None if parent is None else _hash(parent), tokens, size,
            medium, group)


def decode_batch(payload: bytes) -> tuple[float, list[KVEvent], int | None]:
    """Decode one payload: ``(ts, events, data_parallel_rank)``. Raises ``KVEventsError``."""
    try:
        raw = _msgpack_decoder().decode(payload)
    except KVEventsError:
        raise
    except Exception as exc:  # noqa: BLE001 - msgspec.DecodeError and friends
        raise KVEventsError(f"payload is not msgpack: {exc}") from None
    if isinstance(raw, dict):
        ts, events, rank = raw.get("ts"), raw.get("events"), raw.get("data_parallel_rank")
    elif isinstance(raw, list) and len(raw) in (2, 3):
        ts, events = raw[0], raw[1]
        rank = raw[2] if len(raw) == 3 else None
    else:
        raise KVEventsError("payload is not an EventBatch [ts, events, rank]")
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not isinstance(events, list):
        raise KVEventsError("payload is not an EventBatch [ts, events, rank]")
    if not math.isfinite(ts) or not 0 <= ts <= MAX_TS_S:
        raise KVEventsError(f"field 'ts' is {_brief(ts)}, expected seconds since the epoch "
                            f"in 0..{MAX_TS_S:g}")
    rank = _opt_int(rank if not isinstance(rank, bool) else -1, "data_parallel_rank", 0,
                    2**31 - 1)
    try:
        decoded = [_event(e) for e in events]
    except (TypeError, ValueError, OverflowError, KeyError) as exc:
        # NOTE: the checks above name each field; this is the net under them: a shape
        # nobody foresaw is a malformed batch (a gap), never an exception in the listener
        raise KVEventsError(f"malformed KV event: {type(exc).__name__}: {exc}"[:200]) from None
    if sum(len(e[1]) for e in decoded) > MAX_BATCH_HASHES:
        raise KVEventsError(f"more than {MAX_BATCH_HASHES} block hashes in one batch")
    return float(ts), decoded, rank


# -- translation into kvclaims events ---------------------------------------------------------

Emitted = list[tuple[str, dict[str, Any]]]


class Translator:
    """vLLM KV events -> kvclaims block events, keeping the copies of each content hash.

    ``scheme`` (a ``kvclaims.sources.declared_claims.HashScheme``), when given, is checked against
    the hashes vLLM publishes for the first ``verify_limit`` blocks whose chain is known: the
    manifest then says whether claims declared by token ids can bind.
    """

    def __init__(self, scheme: Any = None, verify_limit: int = 1000) -> None:
        self.copies: dict[int, list[int]] = {}   # content hash -> synthetic ids holding it
        self._free: list[int] = []               # heap of released ids
        self._next_id = 1
        self.position: dict[int, int] = {}      # content hash -> chain position
        self.block_size: int | None = None
        self.scheme = scheme
        self.verify_limit = verify_limit
        self._full: dict[int, bytes] = {}        # 64-bit hash -> full digest (verification)
        self.counts = {"blocks_stored": 0, "blocks_removed": 0, "resets": 0,
                       "removed_unseen": 0, "position_unknown": 0, "other_medium": 0,
                       "other_group": 0, "hash_verified": 0, "hash_mismatched": 0}

    # NOTE: smallest free id first keeps ids within the number of live copies (like a pool)
    def ids_left(self) -> int:
        """How many more copies can be tracked (``MAX_LIVE_COPIES`` bounds memory)."""
        return len(self._free) + max(0, MAX_LIVE_COPIES - self._next_id)

    def _take_id(self) -> int:
        if self._free:
            return heapq.heappop(self._free)
        self._next_id += 1
        return self._next_id - 1

    def reset(self) -> None:
        """Every copy is gone (AllBlocksCleared, publisher restart)."""
        self.copies.clear()
        self._free.clear()
        self._next_id = 1

    def apply(self, ev: KVEvent, out: Emitted) -> None:
        """Append the kvclaims events for one KV event to ``out``."""
        kind, hashes, parent, tokens, size, medium, group = ev
        if kind == CLEARED:
            self.reset()
            self.counts["resets"] += 1
            out.append(("cache_reset", {"reason": "all_blocks_cleared"}))
            return
        # NOTE: only the GPU pool's first KV cache group is the pool the claims live in; an
        # offload tier or a second group (hybrid models) would double-count the same content.
        if medium not in _GPU_MEDIA:
            self.counts["other_medium"] += len(hashes)
            return
        if group not in (None, 0):
            self.counts["other_group"] += len(hashes)
            return
        if kind == REMOVED:
            for h in hashes:
                held = self.copies.get(h)
                if held:
                    block_id = held.pop()
                    if not held:
                        del self.copies[h]
                else:  # cached before we saw it (or after a gap): a loss of unseen content
                    self.counts["removed_unseen"] += 1
                    block_id = self._take_id()
                heapq.heappush(self._free, block_id)
                out.append(("block_evicted", {"block_id": block_id, "block_hash": h,
                                              "cause": "unknown"}))
            self.counts["blocks_removed"] += len(hashes)
            return
        if size is not None and self.block_size is None:
            self.block_size = size
        pos: int | None = 0
        if parent is not None:
            ppos = self.position.get(parent)
            pos = None if ppos is None else ppos + 1
        c = self.counts
        if self.scheme is not None and c["hash_verified"] + c["hash_mismatched"] < \
                self.verify_limit:
            self._verify(hashes, parent, tokens, size)
        prev = parent
        for h in hashes:
            block_id = self._take_id()
            self.copies.setdefault(h, []).append(block_id)
            if pos is None:
                self.counts["position_unknown"] += 1
            elif h not in self.position and len(self.position) < _MAX_POSITIONS:
                self.position[h] = pos
            fields = {"block_id": block_id, "block_hash": h}
            if prev is not None:  # NOTE: None fields are omitted (emit_many takes them as is)
                fields["parent_hash"] = prev
            if pos is not None:
                fields["position"] = pos
            out.append(("block_cached", fields))
            prev = h
            pos = None if pos is None else pos + 1
        self.counts["blocks_stored"] += len(hashes)

    def _verify(self, hashes: list[int], parent: int | None, tokens: list[int] | None,
                size: int | None) -> None:
        """Recompute the chain from the event's own token ids where the parent digest is
        known; count matches and mismatches with the published hashes."""
        if tokens is None or not size or len(tokens) != size * len(hashes):
            return
        digest: bytes | None = None
        if parent is not None:
            digest = self._full.get(parent)
            if digest is None:
                return
        for i, h in enumerate(hashes):
            digest = self.scheme.block(digest, tokens[i * size:(i + 1) * size])
            if hash64(digest) == h:
                self.counts["hash_verified"] += 1
                if len(self._full) < 4 * self.verify_limit:
                    self._full[h] = digest
            else:
                self.counts["hash_mismatched"] += 1
                return


# -- the observed run (seqs, batches, manifest) -----------------------------------------------

class ObservedRun:
    """Owns the run's seqs and writes events through ``RunWriter`` in batches.

    Single-threaded: the processing thread is the only caller.
    """

    def __init__(self, run_dir: str | Path, run_info: dict[str, Any], *,
                 batch_events: int = 65536,
                 clock: Callable[[], int] = time.monotonic_ns) -> None:
        self.writer = RunWriter(run_dir, run_info)
        self.clock = clock  # ts_ns of events that carry no engine time
        self.run_id = self.writer.run_id
        self.batch_events = batch_events
        self.next_seq = 0
        self.rows = 0
        self.dropped = 0
        self.errors: list[str] = []
        self.last_ts = 0
        self._p: tuple[list[int], list[int], list[str], list[dict[str, Any]]] = ([], [], [], [])
        info = self.writer.run_info

        self.emit(None, "run_started", {
            **{k: info.get(k) for k in ("runtime", "runtime_version", "model", "block_size",
                                        "num_blocks", "usable_blocks", "policy")},
            "schema_version": SCHEMA_VERSION, "recorder_version": RECORDER_VERSION})

    def _ts(self, ts_ns: int | None) -> int:
        # NOTE: ts_ns never goes back (a replayed batch carries an older engine time)
        ts = self.clock() if ts_ns is None else ts_ns
        if ts < self.last_ts:
            ts = self.last_ts
        self.last_ts = ts
        return ts

    def emit(self, ts_ns: int | None, event: str, fields: dict[str, Any]) -> int:
        """Queue one event at the next seq; return the seq."""
        seq = self.next_seq
        self.next_seq += 1
        p = self._p
        p[0].append(seq)
        p[1].append(self._ts(ts_ns))
        p[2].append(event)
        p[3].append({k: v for k, v in fields.items() if v is not None})
        if len(p[0]) >= self.batch_events:
            self.flush()
        return seq

    def emit_many(self, ts_ns: int, events: Emitted) -> None:
        """Queue translated events (fields without None values) at one engine time."""
        ts = self._ts(ts_ns)
        seq = self.next_seq
        n = len(events)
        p = self._p
        p[0].extend(range(seq, seq + n))
        p[1].extend([ts] * n)
        p[2].extend([e for e, _ in events])
        p[3].extend([f for _, f in events])
        self.next_seq = seq + n
        if len(p[0]) >= self.batch_events:
            self.flush()

    def gap(self, ts_ns: int | None, lost: int, reason: str) -> tuple[int, int]:
        """Leave ``lost`` seqs as a hole and write the ``recorder_gap`` covering it."""
        first = self.next_seq
        self.next_seq += lost
        self.dropped += lost
        self.emit(ts_ns, "recorder_gap", {"first_seq": first, "last_seq": first + lost - 1,
                                          "events_dropped": lost, "reason": reason})
        return first, first + lost - 1

    def flush(self) -> None:
        """Write everything queued (an event that does not fit the schema becomes a gap)."""
        p = self._p
        if not p[0]:
            return
        chunk = (p[0][:], p[1][:], p[2][:], p[3][:])
        for lst in p:
            lst.clear()
        try:
            batch = pending_to_batch(chunk, self.run_id)
        except Exception:  # noqa: BLE001 - a translator bug must not lose the whole chunk
            batch = self._without_invalid(chunk)
        if batch is None:
            return
        try:
            self.writer.write_batch(batch)
            self.rows += batch.num_rows
            self.writer.maybe_rotate()
        except Exception as exc:  # noqa: BLE001 - disk full, directory removed: keep going
            # NOTE: the events are lost, not the listener: their seqs become a gap
            self.errors.append(f"write: {exc!r}"[:300])
            self.dropped += batch.num_rows
            self.emit(None, "recorder_gap", {"first_seq": chunk[0][0], "last_seq": chunk[0][-1],
                                             "events_dropped": batch.num_rows,
                                             "reason": "write_failed"})

    def _without_invalid(self, chunk: Any) -> Any:
        keep = [i for i, (e, f) in enumerate(zip(chunk[2], chunk[3]))
                if event_problem(e, f) is None]
        bad = len(chunk[0]) - len(keep)
        if bad:
            self.errors.append(f"{bad} invalid events dropped")
            self.dropped += bad
        kept = tuple([col[i] for i in keep] for col in chunk)
        good = set(keep)
        for i, seq in enumerate(chunk[0]):
            if i not in good:
                self.emit(None, "recorder_gap", {"first_seq": seq, "last_seq": seq,
                                                 "events_dropped": 1,
                                                 "reason": "invalid_event"})
        return pending_to_batch(kept, self.run_id) if kept[0] else None

    def close(self, extra: dict[str, Any] | None = None) -> None:
        """Write ``run_finished`` and the final manifest (``complete: true``)."""
        self.flush()
        self.emit(None, "run_finished", {"events_written": self.rows + 1 + len(self._p[0]),
                                         "events_dropped": self.dropped})
        self.flush()
        self.writer.set_counters(events_dropped=self.dropped, recorder_errors=len(self.errors))
        if self.errors:
            self.writer.set_extra("recorder_error_samples", self.errors[:10])
        for key, value in (extra or {}).items():
            self.writer.set_extra(key, value)
        try:
            self.writer.close()
        except OSError as exc:
            raise InputError(f"{self.writer.run_dir}: cannot close the run: "
                             f"{exc.strerror or exc}") from None


# -- the listener (frames -> events, gaps, replay, claims) ------------------------------------

class Listener:
    """Applies ``(topic, seq, payload)`` frames in publisher order to an ``ObservedRun``.

    ``replay``: a callable ``start_seq -> [(topic, seq, payload), ...]`` (``ReplayClient``) or
    None. ``claims``: ``kvclaims.sources.declared_claims.DeclaredClaim``s; they take force at their
    ``from`` on the engine's clock (the batch ``ts``). ``wall0``/``mono0`` pair the engine's
    wall clock with the run's ``ts_ns`` clock.
    """

    def __init__(self, run: ObservedRun, translator: Translator, *, claims: Sequence[Any] = (),
                 replay: Callable[[int], list[tuple[bytes, int, bytes]]] | None = None,
                 topic: bytes = b"", capture: IO[bytes] | None = None,
                 wall0: int | None = None, mono0: int | None = None,
                 default_tokenizer: str | None = None,
                 warn: Callable[[str], None] | None = None) -> None:

        self.run = run
        self.tr = translator
        self.replay = replay
        self.topic = topic
        self.capture = capture
        self.wall0 = time.time_ns() if wall0 is None else wall0
        self.mono0 = time.monotonic_ns() if mono0 is None else mono0
        self.default_tokenizer = default_tokenizer
        self.warn = warn or (lambda msg: print(f"kvclaims listen: warning: {msg}",
                                               file=sys.stderr))
        self.expected: int | None = None
        self.last_batch_wall: int | None = None
        self._actions = schedule(list(claims), self.wall0)
        self._claims_started = 0
        self._claims_rejected: list[str] = []
        self.counts = {"batches": 0, "events": 0, "replayed": 0, "batches_lost": 0,
                       "undecodable": 0, "restarts": 0, "malformed_frames": 0,
                       "foreign_topic": 0, "oversized_frames": 0}
        self.max_frame_bytes = MAX_FRAME_BYTES
        self.dp_ranks: set[int] = set()
        self.gap_notes: list[dict[str, Any]] = []
        self._out: Emitted = []
        self.due(self.wall0 if wall0 is not None else None)

    def ts_of(self, wall_ns: int) -> int:
        """The run's ``ts_ns`` for an engine wall time (clamped to the int64 range: a batch
        time decades away from the listener's start cannot overflow a column)."""
        return min(max(self.mono0 + (wall_ns - self.wall0), 0), 2**63 - 1)

    # -- claims --------------------------------------------------------------------------------
    def due(self, wall_ns: int | None) -> None:
        """Write the claim actions due at or before ``wall_ns`` (None: only ``"from": "start"``
        claims). A claim given by token ids waits until the block size is known."""

        while self._actions:
            act = self._actions[0]
            if act.wall_ns != START and (wall_ns is None or act.wall_ns > wall_ns):
                return
            hashes = None
            if act.kind == "start":
                try:
                    hashes = act.claim.hashes(self.tr.scheme, self.tr.block_size,
                                              self.default_tokenizer)
                except InputError as exc:
                    if self.tr.block_size is None and act.claim.block_hashes is None:
                        return  # NOTE: no block stored yet, so binding later loses nothing
                    self._reject(act, str(exc))
                    heapq.heappop(self._actions)
                    continue
                self._claims_started += 1
            elif act.claim.claim_id in self._claims_rejected:
                heapq.heappop(self._actions)
                continue
            heapq.heappop(self._actions)
            ts = None if act.wall_ns == START else self.ts_of(max(act.wall_ns, self.wall0))
            for name, fields in action_events(act, hashes):
                self.run.emit(ts, name, fields)

    def _reject(self, act: Any, reason: str) -> None:
        c = act.claim
        self._claims_rejected.append(c.claim_id)
        self.warn(f"claim {c.claim_id!r} rejected: {reason}")
        self.run.emit(None, "claim_submitted", {"claim_id": c.claim_id, "tenant": c.tenant,
                                                "protection_mode": c.mode,
                                                "threshold_blocks": c.threshold_blocks})
        self.run.emit(None, "claim_rejected", {"claim_id": c.claim_id,
                                               "reason": reason[:300]})

    # -- frames --------------------------------------------------------------------------------
    def on_frames(self, frames: Sequence[Any], recv_wall_ns: int) -> None:
        """One message from the SUB socket (its payload may be ``Oversized``: the receive
        loop dropped the bytes and kept the size).

        NOTE: never raises for what the frame holds: a malformed frame is counted
        (``malformed_frames``), a batch that does not decode or validate is a gap.
        """
        if len(frames) != 3 or not isinstance(frames[1], (bytes, bytearray, memoryview)) \
                or len(frames[1]) != 8 or len(frames[0]) > 1024:
            self._malformed("not a (topic, 8-byte seq, payload) message")
            return
        topic, seq_bytes, payload = frames
        if not bytes(topic).startswith(self.topic):
            self.counts["foreign_topic"] += 1
            return
        seq = int.from_bytes(seq_bytes, "big")
        expected = 0 if self.expected is None else self.expected
        if seq >= MAX_SEQ or seq - expected > MAX_SEQ_JUMP:
            self._malformed(f"batch seq {seq} is out of range (expected about {expected})")
            return
        if isinstance(payload, Oversized) or len(payload) > self.max_frame_bytes:
            self.counts["oversized_frames"] += 1
            if self.counts["oversized_frames"] <= 3:
                self.warn(f"batch {seq}: payload of {len(payload)} bytes exceeds "
                          f"{self.max_frame_bytes}; dropped (a gap)")
            payload = OVERSIZED
        self.on_batch(seq, payload if payload is OVERSIZED else bytes(payload),
                      recv_wall_ns, topic)

    def _malformed(self, why: str) -> None:
        self.counts["malformed_frames"] += 1
        if self.counts["malformed_frames"] <= 3:
            self.warn(f"malformed frame dropped: {why}")

    def on_batch(self, seq: int, payload: bytes, recv_wall_ns: int, topic: bytes = b"") -> None:
        """One batch in arrival order: detect restarts and holes, then apply it."""
        expected = 0 if self.expected is None else self.expected
        if seq < expected:
            # NOTE: a PUB socket never resends: a seq going back is a new publisher, i.e. a
            # restarted engine whose cache started empty.
            self.counts["restarts"] += 1
            self.run.emit(self.ts_of(recv_wall_ns), "cache_reset",
                          {"reason": "publisher_restarted"})
            self.tr.reset()
            expected = 0
        if seq > expected:
            self._fill(expected, seq, recv_wall_ns)
        self._apply(seq, payload, recv_wall_ns, topic)

    def _fill(self, first: int, stop: int, wall_ns: int) -> None:
        """Batches ``first..stop-1`` never arrived: replay them, or write a gap."""
        got: list[tuple[bytes, int, bytes]] = []
        if self.replay is not None:
            try:
                got = sorted((r for r in self.replay(first)
                              if first <= r[1] < stop and r[0].startswith(self.topic)),
                             key=lambda r: r[1])
            except Exception as exc:  # noqa: BLE001 - a failed replay is a gap, not a crash
                self.warn(f"replay from seq {first} failed: {exc}")
        cur = first
        for topic, seq, payload in got:
            if seq < cur:
                continue
            if len(payload) > self.max_frame_bytes:
                self.counts["oversized_frames"] += 1
                payload = OVERSIZED
            if seq > cur:
                self._lost(cur, seq - 1, wall_ns, "publisher_batches_lost")
            self.counts["replayed"] += 1
            self._apply(seq, payload, wall_ns, topic)
            cur = seq + 1
        if cur < stop:
            self._lost(cur, stop - 1, wall_ns, "publisher_batches_lost")

    def _lost(self, first: int, last: int, wall_ns: int, reason: str) -> None:
        n = last - first + 1
        self.counts["batches_lost"] += n
        span = self.run.gap(self.ts_of(wall_ns), n, reason)
        if len(self.gap_notes) < _MAX_GAP_NOTES:
            self.gap_notes.append({"first_seq": span[0], "last_seq": span[1],
                                   "publisher_first_seq": first, "publisher_last_seq": last,
                                   "reason": reason})
        self.expected = last + 1

    def _apply(self, seq: int, payload: bytes, wall_ns: int, topic: bytes) -> None:
        if payload is OVERSIZED:
            self.expected = seq + 1
            self._lost(seq, seq, wall_ns, "oversized_batch")
            return
        if self.capture is not None:
            write_capture_record(self.capture, wall_ns, topic, seq.to_bytes(8, "big"), payload)
        self.expected = seq + 1
        try:
            ts, events, rank = decode_batch(payload)
            if sum(len(e[1]) for e in events) > self.tr.ids_left():
                raise KVEventsError(f"more cached copies than the {MAX_LIVE_COPIES} tracked")
        except KVEventsError as exc:
            self.counts["undecodable"] += 1
            if self.counts["undecodable"] <= 3:
                self.warn(f"batch {seq}: {exc}")
            self._lost(seq, seq, wall_ns, "undecodable_batch")
            return
        if rank is not None:
            self.dp_ranks.add(rank)
        batch_wall = int(ts * 1e9)
        self.last_batch_wall = batch_wall
        self.counts["batches"] += 1
        self.counts["events"] += len(events)
        if self.tr.block_size is None:
            for ev in events:  # learn the block size before binding claims by token ids
                if ev[0] == STORED and ev[4]:
                    self.tr.block_size = ev[4]
                    break
        self.due(batch_wall)
        out = self._out
        out.clear()
        apply = self.tr.apply
        for ev in events:
            apply(ev, out)
        if out:
            self.run.emit_many(self.ts_of(batch_wall), out)

    def tick(self, now_wall_ns: int) -> None:
        """Idle tick: claims whose time has come on the wall clock; periodic flush.

        NOTE: a batch stamped before a claim's time may still be on its way (vLLM's publisher
        queue, the network), so on the wall clock a claim is placed only ``CLOCK_GRACE_NS``
        after its time; while batches flow, their own stamps place it exactly.
        """
        self.due(now_wall_ns - CLOCK_GRACE_NS)
        self.run.flush()

    def summary(self) -> dict[str, Any]:
        """The ``kv_events`` manifest section: counters, gaps, hash check, claims."""
        tr = self.tr.counts
        status = ("not_checked" if self.tr.scheme is None
                  else "mismatch" if tr["hash_mismatched"]
                  else "verified" if tr["hash_verified"] else "not_seen")
        return {**self.counts, **tr, "block_size_seen": self.tr.block_size,
                # the pair that maps ts_ns to UTC: ts_ns = mono + (utc_ns - wall)
                "clock": {"utc_ns": self.wall0, "ts_ns": self.mono0},
                "data_parallel_ranks": sorted(self.dp_ranks), "gaps": self.gap_notes,
                "hash_check": status, "claims_started": self._claims_started,
                "claims_rejected": list(self._claims_rejected),
                "claims_not_started": [a.claim.claim_id for a in sorted(self._actions)
                                       if a.kind == "start"]}

    def close(self, wall_ns: int | None = None, extra: dict[str, Any] | None = None) -> dict:
        """Apply claim actions due by ``wall_ns`` and close the run; return the summary."""
        if wall_ns is not None:
            self.due(wall_ns)
        summary = self.summary()
        if summary["hash_check"] == "mismatch":
            self.warn("vLLM's published block hashes do not match the configured hash scheme; "
                      "claims given by token ids or text cannot bind (set --hash-algo and "
                      "--hash-seed as the engine runs)")
        self.run.close({"kv_events": summary, **(extra or {})})
        if self.capture is not None:
            self.capture.flush()
        return summary


class Oversized:
    """A payload the receive loop dropped for its size (only the size is kept)."""

    __slots__ = ("size",)

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size


OVERSIZED: Final[Any] = Oversized(0)   # the marker ``on_batch`` passes on


# -- capture files (raw frames, for `kvclaims import --from vllm-kv-events`) -------------------

def write_capture_record(fh: IO[bytes], wall_ns: int, topic: bytes, seq: bytes,
                         payload: bytes) -> None:
    """Append one frame triple to a capture file (the header is written by ``open_capture``)."""
    fh.write(_RECORD.pack(wall_ns, len(topic), len(seq), len(payload)))
    fh.write(topic)
    fh.write(seq)
    fh.write(payload)


def open_capture(path: str | Path) -> IO[bytes]:
    """Create a capture file (refuses to overwrite one)."""
    p = Path(path)
    try:
        fh = open(p, "xb")
    except FileExistsError:
        raise InputError(f"{p}: already exists; choose a new capture file") from None
    except OSError as exc:
        raise InputError(f"{p}: cannot create: {exc.strerror or exc}") from None
    fh.write(CAPTURE_MAGIC)
    return fh


def read_capture(path: str | Path,
                 truncated: list[str] | None = None) -> Iterator[tuple[int, list[bytes]]]:
    """Yield ``(wall_ns, [topic, seq, payload])`` from a capture file; a cut-off last record
    is reported in ``truncated`` (not an error: a killed listener leaves one)."""
    p = Path(path)
    try:
        fh = os.fdopen(open_regular(p), "rb")   # NOTE: a FIFO is refused, never waited on
    except OSError as exc:
        raise InputError(f"{p}: cannot open: {exc.strerror or exc}") from None
    with fh:
        if fh.read(len(CAPTURE_MAGIC)) != CAPTURE_MAGIC:
            raise KVEventsError(f"{p}: not a kvclaims capture of vLLM KV events "
                                "(written by kvclaims listen --capture)")
        n = 0
        while True:
            head = fh.read(_RECORD.size)
            if not head:
                return
            if len(head) < _RECORD.size:
                break
            wall, lt, ls, lp = _RECORD.unpack(head)
            if lt > 1024 or ls > 1024:
                raise KVEventsError(f"{p}: record {n + 1}: topic or seq longer than 1 KiB "
                                    "(not a capture, or damaged)")
            oversized = lp > MAX_FRAME_BYTES
            body = fh.read(lt + ls + (0 if oversized else lp))
            if len(body) < lt + ls + (0 if oversized else lp):
                break
            if oversized:  # NOTE: skipped, not read: memory stays bounded (a gap on import)
                here = fh.tell()
                if fh.seek(lp, os.SEEK_CUR) > os.fstat(fh.fileno()).st_size:
                    fh.seek(here)
                    break
            n += 1
            payload: Any = Oversized(lp) if oversized else body[lt + ls:]
            yield wall, [body[:lt], body[lt:lt + ls], payload]
    if truncated is not None:
        truncated.append(f"{p}: last record cut off after {n} complete records")


# -- sockets ----------------------------------------------------------------------------------

def _zmq() -> Any:
    try:
        import zmq
    except ImportError:
        raise InputError("kvclaims listen needs the Python package 'pyzmq' "
                         "(pip install pyzmq)") from None
    return zmq


def check_endpoint(endpoint: str, name: str = "--endpoint", *, bind: bool = False,
                   rank: int = 0, allow_remote: bool = False) -> str:
    """``tcp://HOST:PORT`` (or ipc://...), with vLLM's data-parallel offset applied (port +
    rank; ipc: ``_dp<rank>`` suffix); one clear line otherwise. Binding anything but a
    loopback address is refused unless ``allow_remote`` (``loopback_problem``)."""
    if endpoint.startswith("ipc://") and len(endpoint) > 6:
        return endpoint if rank == 0 else f"{endpoint}_dp{rank}"
    if endpoint.startswith("tcp://"):
        host, _, port = endpoint[6:].rpartition(":")
        if host and port.isdigit() and 0 < int(port) < 65536:
            if bind and not allow_remote:
                problem = loopback_problem(host)
                if problem is not None:
                    raise InputError(f"{name} {endpoint}: {problem}; anyone who can reach it "
                                     "could publish forged events. Bind a loopback address "
                                     "(tcp://127.0.0.1:PORT) or an ipc:// socket, or pass "
                                     "--allow-remote")
            if int(port) + rank >= 65536:
                raise InputError(f"{name} {endpoint}: port + rank {rank} exceeds 65535")
            return f"tcp://{host}:{int(port) + rank}"
    raise InputError(f"{name} {endpoint!r} is not tcp://HOST:PORT or ipc://PATH")


def loopback_problem(host: str) -> str | None:
    """Why binding ``host`` could listen beyond this machine, or None (loopback only).

    NOTE: decided on what the name resolves to, never on its spelling: ``*``, an interface
    name (ZeroMQ binds its address), and any name or literal whose addresses are not all
    loopback (``0``, ``0.0.0.00``, ``[::ffff:0.0.0.0]``, ``::``) are refused; a name that
    does not resolve is refused too.
    """
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if bare in ("*", ""):
        return "binds every interface"
    try:
        interfaces = {name for _i, name in socket.if_nameindex()}
    except OSError:
        interfaces = set()
    if bare in interfaces:
        return f"'{bare}' names a network interface (it binds that interface's address)"
    try:
        infos = socket.getaddrinfo(bare, None, proto=socket.IPPROTO_TCP,
                                   flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError) as exc:
        return f"'{bare}' does not resolve ({exc})"
    for info in infos:
        addr = ipaddress.ip_address(info[4][0].split("%", 1)[0])
        mapped = getattr(addr, "ipv4_mapped", None)
        if not (mapped or addr).is_loopback:
            what = "every interface" if (mapped or addr).is_unspecified else "a non-loopback"
            return f"'{bare}' resolves to {addr} ({what} address)"
    return None


class ZmqSource:
    """The receive loop: a SUB socket drained on its own thread into a bounded queue.

    ``bind``: vLLM *connects* its PUB socket when its endpoint names a host (not ``*``), so the
    listener then binds that address (e.g. ``tcp://127.0.0.1:5557``); with vLLM's default
    ``tcp://*:5557`` vLLM binds and the listener connects.
    """

    def __init__(self, endpoint: str, topic: bytes = b"", *, bind: bool = False,
                 max_pending: int = 1_000_000, max_pending_bytes: int = 256 * 1024 * 1024,
                 max_frame_bytes: int = MAX_FRAME_BYTES, allow_remote: bool = False) -> None:
        zmq = _zmq()
        self._zmq = zmq
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.SUB)
        # NOTE: memory is bounded three ways: ZeroMQ's own queue (RCVHWM messages, each at
        # most MAXMSGSIZE: a larger frame disconnects its sender), the frames waiting here
        # (max_pending messages, max_pending_bytes), and a payload above max_frame_bytes is
        # dropped on receipt (only its size is kept: a counted gap)
        self.sock.setsockopt(zmq.RCVHWM, 1_000)
        self.sock.setsockopt(zmq.MAXMSGSIZE, max(128 * 1024 * 1024, 8 * max_frame_bytes))
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SUBSCRIBE, topic)
        try:
            if bind and endpoint.startswith("ipc://"):
                _bind_private_ipc(self.sock, endpoint)
            else:
                (self.sock.bind if bind else self.sock.connect)(endpoint)
            if bind and not allow_remote:
                _check_bound(self.sock.getsockopt(zmq.LAST_ENDPOINT).decode(), endpoint)
        except (zmq.ZMQError, InputError) as exc:
            self.sock.close()
            self.ctx.term()
            if isinstance(exc, InputError):
                raise
            raise InputError(f"cannot {'bind' if bind else 'connect'} {endpoint}: {exc}") \
                from None
        self.queue: queue.SimpleQueue[tuple[list[Any], int]] = queue.SimpleQueue()
        self.max_pending = max_pending
        self.max_pending_bytes = max_pending_bytes
        self.max_frame_bytes = max_frame_bytes
        self.pending_bytes = 0
        self._bytes_lock = threading.Lock()
        self.overflow = 0
        self.oversized = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvclaims-listen-recv",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        zmq, sock, put, q = self._zmq, self.sock, self.queue.put, self.queue
        clock = time.time_ns
        while not self._stop.is_set():
            try:
                if not sock.poll(100):
                    continue
                for _ in range(10_000):  # drain what is there without a poll per message
                    parts = sock.recv_multipart(zmq.NOBLOCK, copy=False)
                    frames: list[Any] = []
                    size = 0
                    for i, part in enumerate(parts):
                        n = len(part.buffer)
                        if i == 2 and n > self.max_frame_bytes:
                            self.oversized += 1
                            frames.append(Oversized(n))   # NOTE: never copied into Python
                            continue
                        frames.append(part.bytes)
                        size += n
                    if q.qsize() >= self.max_pending or \
                            self.pending_bytes + size > self.max_pending_bytes:
                        self.overflow += 1  # NOTE: a dropped frame is a seq hole: replayed
                        continue
                    with self._bytes_lock:
                        self.pending_bytes += size
                    put((frames, clock()))
            except zmq.Again:
                continue
            except zmq.ZMQError:
                if self._stop.is_set():
                    return
                time.sleep(0.01)

    def get(self, timeout: float) -> list[tuple[list[bytes], int]]:
        """Everything queued, waiting up to ``timeout`` s for the first item."""
        try:
            items = [self.queue.get(timeout=timeout)]
        except queue.Empty:
            return []
        get = self.queue.get_nowait
        try:
            while len(items) < 1_000:
                items.append(get())
        except queue.Empty:
            pass
        done = sum(len(f) for frames, _w in items for f in frames
                   if not isinstance(f, Oversized))
        with self._bytes_lock:
            self.pending_bytes -= done
        return items

    def close(self) -> None:
        """Stop the receive thread and close the socket."""
        self._stop.set()
        self._thread.join(timeout=2.0)
        self.sock.close(linger=0)
        self.ctx.term()


def _bind_private_ipc(sock: Any, endpoint: str) -> None:
    """Bind an ipc:// socket that only this user can connect to (mode 0600).

    NOTE: the umask is set around the bind, so the socket file never exists with wider
    permissions; connecting needs write permission on it (docs/stock-vllm.md).
    """
    old = os.umask(0o077)
    try:
        sock.bind(endpoint)
    finally:
        os.umask(old)
    path = endpoint[len("ipc://"):]
    if path and not path.startswith("@"):   # "@name": Linux abstract socket, no file
        os.chmod(path, 0o600)


def _check_bound(bound: str, endpoint: str) -> None:
    """After binding: the address ZeroMQ actually bound is loopback (tcp) or a file."""
    if not bound.startswith("tcp://"):
        return
    host = bound[len("tcp://"):].rpartition(":")[0]
    problem = loopback_problem(host)
    if problem is not None:
        raise InputError(f"--endpoint {endpoint}: bound {bound}, {problem}; pass "
                         "--allow-remote to listen beyond this machine")


class ReplayClient:
    """Asks vLLM's ROUTER replay endpoint for the batches from a seq (a DEALER per request,
    so a late reply to an abandoned request can never be mistaken for a new one)."""

    def __init__(self, endpoint: str, timeout_s: float = 2.0) -> None:
        self.zmq = _zmq()
        self.endpoint = endpoint
        self.timeout_ms = int(timeout_s * 1000)
        self.ctx = self.zmq.Context()

    def __call__(self, start_seq: int) -> list[tuple[bytes, int, bytes]]:
        zmq = self.zmq
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, 8 * MAX_FRAME_BYTES)
        out: list[tuple[bytes, int, bytes]] = []
        try:
            sock.connect(self.endpoint)
            sock.send_multipart([b"", start_seq.to_bytes(8, "big")])
            while sock.poll(self.timeout_ms):
                frames = sock.recv_multipart()
                if len(frames) != 4:
                    continue
                _, topic, seq, payload = frames
                if seq == END_SEQ:
                    return out
                out.append((topic, int.from_bytes(seq, "big"), payload))
            raise TimeoutError(f"no end-of-replay marker from {self.endpoint} within "
                               f"{self.timeout_ms} ms ({len(out)} batches received)")
        finally:
            sock.close(linger=0)

    def close(self) -> None:
        """Close the context."""
        self.ctx.term()


# -- entry points -----------------------------------------------------------------------------

def run_info(run_id: str, *, model: str | None = None, block_size: int | None = None,
             num_blocks: int | None = None, runtime_version: str | None = None,
             source: dict[str, Any] | None = None, scheme: Any = None) -> dict[str, Any]:
    """The manifest of an observed run: ``evidence: observed`` and what that leaves out."""
    return {
        "run_id": run_id, "runtime": RUNTIME, "runtime_version": runtime_version,
        "model": model, "block_size": block_size, "num_blocks": num_blocks,
        "usable_blocks": None if num_blocks is None else num_blocks - 1,
        # NOTE: nothing enforced the claims: vLLM as shipped, i.e. the native policy
        "policy": "native",
        "evidence": "observed",
        "observed": {"source": source or {}, "limits": list(OBSERVED_LIMITS),
                     "block_ids": "synthetic: one id per cached copy of a content hash",
                     "hash_scheme": None if scheme is None else scheme.describe()},
        "checks_not_exercised": dict(NOT_EXERCISED),
    }


def import_capture(path: str | Path, out_dir: str | Path, *, claims: Sequence[Any] = (),
                   run_id: str | None = None, scheme: Any = None,
                   block_size: int | None = None, num_blocks: int | None = None,
                   model: str | None = None,
                   warn: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Turn a capture file (``kvclaims listen --capture``) into an observed run directory.

    Replayed batches were captured in the order they were applied, so the result equals the
    live run's events (timestamps aside: ``ts_ns`` counts from the capture's first frame).
    """
    p = Path(path)
    truncated: list[str] = []
    frames = read_capture(p, truncated)
    first = next(frames, None)
    if first is None:
        raise KVEventsError(f"{p}: capture holds no frames")

    scheme = scheme or HashScheme()
    info = run_info(run_id or p.stem, model=model, block_size=block_size,
                    num_blocks=num_blocks, source={"capture": p.name}, scheme=scheme)
    run = ObservedRun(out_dir, info, clock=lambda: 0)  # NOTE: clamped to the last batch time
    listener = Listener(run, Translator(scheme), claims=claims, wall0=first[0], mono0=0,
                        warn=warn)
    listener.on_frames(first[1], first[0])
    last_wall = first[0]
    for wall, fr in frames:
        listener.on_frames(fr, wall)
        last_wall = wall
    end = max(last_wall, listener.last_batch_wall or last_wall)
    return listener.close(end, {"imported_from": p.name, **(
        {"capture_truncated": truncated[0]} if truncated else {})})
