"""The event vocabulary: the one place where event names and fields are defined.

Everything else (the recorder's column buffers, the Arrow segments, the JSON Lines codec, the
reconstructor's SQL) derives from the tables below. ``docs/design.md`` ("Event vocabulary") is
the contract; this module is its executable form.

NOTE: the schema is append-only within a major version. Adding an event or a nullable column
bumps ``SCHEMA_VERSION``; readers refuse versions from the future instead of guessing.
"""

from __future__ import annotations

import math

from typing import Any, Final

import pyarrow as pa

from kvclaims.contract.vocabulary import EVENT_NAMES


SCHEMA_VERSION: Final[int] = 3
# Versions this kvclaims reads. Version 2 added the ``step`` column, ``hook_failed``,
# ``claim_release_refused``, ``released_by``, preemption attribution and the ``unknown`` cause.
# Version 3 added the scheduler settings a replay needs on ``run_started``
# (``max_num_batched_tokens``, ``max_num_seqs``, ``max_defer_steps``, ``max_defer_s``).
READABLE_SCHEMA_VERSIONS: Final[frozenset[int]] = frozenset({1, 2, 3})
RECORDER_VERSION: Final[str] = "0.1.0"

# Envelope columns every event carries (never null).
ENVELOPE: Final[tuple[str, ...]] = ("run_id", "seq", "ts_ns", "event")

_DICT_STR = pa.dictionary(pa.int32(), pa.string())

# Column name -> Arrow type. Strings that repeat (ids, names, reasons) are dictionary-encoded.
COLUMNS: Final[dict[str, pa.DataType]] = {
    "run_id": _DICT_STR,
    "seq": pa.int64(),
    "ts_ns": pa.int64(),
    "event": _DICT_STR,
    # The engine's scheduler step (0, 1, ...) in which an in-engine event happened; null for
    # events outside a step (imports, JSON Lines fixtures, the listener). Claim predicates are
    # judged at the end of each step where the trace has steps (docs/design.md).
    "step": pa.int64(),
    # run
    "runtime": _DICT_STR,
    "runtime_version": _DICT_STR,
    "model": _DICT_STR,
    "block_size": pa.int32(),
    "num_blocks": pa.int32(),
    "usable_blocks": pa.int32(),
    "policy": _DICT_STR,
    "schema_version": pa.int32(),
    "recorder_version": _DICT_STR,
    "events_written": pa.int64(),
    "events_dropped": pa.int64(),
    "first_seq": pa.int64(),
    "last_seq": pa.int64(),
    # the engine's scheduler settings (run_started, schema 3): how many tokens one step may
    # schedule (chunked prefill) and how many requests may run at once, and the arbiter's
    # deferral limits; what a replay (kvclaims whatif) needs to schedule as the engine did
    "max_num_batched_tokens": pa.int32(),
    "max_num_seqs": pa.int32(),
    "max_defer_steps": pa.int32(),
    "max_defer_s": pa.float64(),
    # requests
    "request_id": _DICT_STR,
    "tenant": _DICT_STR,
    "num_prompt_tokens": pa.int32(),
    "blocks_required": pa.int32(),
    "free_blocks": pa.int32(),
    "protected_blocks": pa.int32(),
    "blocking_claim_ids": pa.list_(pa.string()),
    "shortfall_blocks": pa.int32(),
    "reason": _DICT_STR,
    "finish_reason": _DICT_STR,
    "num_cached_tokens": pa.int32(),
    "num_output_tokens": pa.int32(),
    # blocks
    "block_id": pa.int32(),
    "block_hash": pa.uint64(),
    "parent_hash": pa.uint64(),
    "position": pa.int32(),
    "cause": _DICT_STR,
    "by_request_id": _DICT_STR,
    # claims
    "claim_id": _DICT_STR,
    "protection_mode": _DICT_STR,
    "threshold_blocks": pa.int32(),
    "ttl_s": pa.float64(),
    "value": pa.float64(),
    # who ended a claim's force: "tenant" (a request of the claim's own tenant), "operator"
    # (the in-process API), "arbiter" (demotion, expiry, the runtime itself)
    "released_by": _DICT_STR,
    # fail-open marks: which hook failed inside vLLM and the exception type (never its message,
    # which may quote tenant data)
    "hook": _DICT_STR,
    "error_type": _DICT_STR,
}

_ADMISSION = ("request_id", "blocks_required", "free_blocks", "protected_blocks", "usable_blocks")

# Event name -> the fields it may carry beyond the envelope.
EVENTS: Final[dict[str, tuple[str, ...]]] = {
    "run_started": ("runtime", "runtime_version", "model", "block_size", "num_blocks",
                    "usable_blocks", "policy", "schema_version", "recorder_version",
                    "max_num_batched_tokens", "max_num_seqs", "max_defer_steps", "max_defer_s"),
    "run_finished": ("events_written", "events_dropped"),
    "recorder_gap": ("first_seq", "last_seq", "events_dropped", "reason"),
    "request_arrived": ("request_id", "tenant", "num_prompt_tokens", "claim_id"),
    "request_admitted": _ADMISSION,
    "request_deferred": _ADMISSION + ("blocking_claim_ids", "shortfall_blocks", "reason"),
    "request_refused": _ADMISSION + ("blocking_claim_ids", "shortfall_blocks", "reason"),
    # protected_blocks / blocking_claim_ids: the pinned blocks and the claims holding them at
    # the moment vLLM preempted the request (decode growth met pinned blocks)
    "request_preempted": ("request_id", "free_blocks", "protected_blocks", "usable_blocks",
                          "blocking_claim_ids"),
    "request_finished": ("request_id", "finish_reason", "num_cached_tokens",
                         "num_output_tokens", "reason"),
    "block_allocated": ("block_id", "request_id"),
    "block_cached": ("block_id", "block_hash", "parent_hash", "position", "request_id"),
    "block_hit": ("block_id", "block_hash", "position", "request_id"),
    "block_freed": ("block_id", "request_id"),
    "block_evicted": ("block_id", "block_hash", "cause", "by_request_id"),
    "cache_reset": ("reason",),
    "reuse_denied": ("request_id",),
    "claim_submitted": ("claim_id", "tenant", "request_id", "protection_mode",
                        "threshold_blocks", "ttl_s", "value"),
    "claim_accepted": ("claim_id",),
    "claim_rejected": ("claim_id", "reason", "request_id", "shortfall_blocks"),
    "claim_bound": ("claim_id", "block_hash", "position"),
    "claim_materialized": ("claim_id",),
    "claim_demoted": ("claim_id", "reason", "by_request_id"),
    "claim_expired": ("claim_id", "reason"),
    "claim_released": ("claim_id", "reason", "released_by", "request_id", "tenant"),
    # a release asked for by someone who does not own the claim (another or no tenant)
    "claim_release_refused": ("claim_id", "reason", "request_id", "tenant"),
    "claim_harmed": ("claim_id", "block_hash"),
    # a recorder hook or the arbiter raised inside vLLM; the engine kept serving (fail-open),
    # so enforcement from this seq on cannot be trusted and is judged unknown
    "hook_failed": ("hook", "error_type"),
}
assert tuple(EVENTS) == EVENT_NAMES  # NOTE: the vocabulary names every event, in this order

# Columns an in-engine event may carry whatever its event (beyond ENVELOPE).
COMMON: Final[tuple[str, ...]] = ("step",)


ARROW_SCHEMA: Final[pa.Schema] = pa.schema(
    [pa.field(name, typ, nullable=name not in ENVELOPE) for name, typ in COLUMNS.items()],
    metadata={"kvclaims.schema_version": str(SCHEMA_VERSION)},
)

# Python types a JSON value may have for each Arrow type (bool is not an int here).
_INT_TYPES = {pa.int32(), pa.int64(), pa.uint64()}


# Columns a schema version added: a segment of an older version may lack them (read as null);
# every other column is required (a segment without its claim_id column is not our trace).
COLUMN_SINCE: Final[dict[str, int]] = {"step": 2, "released_by": 2, "hook": 2, "error_type": 2,
                                       "max_num_batched_tokens": 3, "max_num_seqs": 3,
                                       "max_defer_steps": 3, "max_defer_s": 3}

# Value ranges every reader relies on (inclusive). NOTE: block counts and positions stay below
# 2**30 so that sums of two (e.g. protected + required) cannot overflow int32 in SQL; ttl_s is
# at most ~31 years so that it converts to an interval.
BLOCK_RANGE: Final[tuple[int, int]] = (0, 2**30 - 1)
VALUE_RANGES: Final[dict[str, tuple[float, float]]] = {
    "seq": (0, 2**62), "ts_ns": (0, 2**63 - 1), "step": (0, 2**62),
    "block_size": (1, 2**30 - 1), "num_blocks": BLOCK_RANGE, "usable_blocks": BLOCK_RANGE,
    "schema_version": (1, 2**31 - 1), "events_written": (0, 2**62), "events_dropped": (0, 2**62),
    "first_seq": (0, 2**62), "last_seq": (0, 2**62), "num_prompt_tokens": (0, 2**31 - 1),
    "blocks_required": BLOCK_RANGE, "free_blocks": BLOCK_RANGE, "protected_blocks": BLOCK_RANGE,
    "shortfall_blocks": (-(2**30), 2**30 - 1), "num_cached_tokens": (0, 2**31 - 1),
    "num_output_tokens": (0, 2**31 - 1), "block_id": BLOCK_RANGE, "position": BLOCK_RANGE,
    "threshold_blocks": BLOCK_RANGE, "ttl_s": (0.0, 1e9), "value": (-1e15, 1e15),
    "max_num_batched_tokens": (1, 2**31 - 1), "max_num_seqs": (1, 2**31 - 1),
    "max_defer_steps": (0, 2**31 - 1), "max_defer_s": (0.0, 1e9),
}


def range_problem(column: str, value: Any) -> str | None:
    """Why one value of ``column`` is out of range (or not finite), or None."""
    bounds = VALUE_RANGES.get(column)
    if bounds is None or value is None or isinstance(value, bool):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return f"field '{column}' is {value}, not a finite number"
    lo, hi = bounds
    if not lo <= value <= hi:
        return f"field '{column}' is {value}, outside {lo:g}..{hi:g}"
    return None


class InputError(ValueError):
    """Bad input (trace, fixture, claim, command option): shown to the user as one clear line."""


class SchemaError(InputError):
    """An event that does not fit the vocabulary; the message names the field."""


def check_event(event: dict[str, Any]) -> None:
    """Validate one event given as a plain dict (the JSON Lines form).

    Raises ``SchemaError`` naming the first offending field.
    """
    for name in ENVELOPE:
        if event.get(name) is None:
            raise SchemaError(f"missing required field '{name}'")
    name = event["event"]
    if not isinstance(name, str) or name not in EVENTS:
        raise SchemaError(f"unknown event {name!r}")
    allowed = EVENTS[name]
    for key, val in event.items():
        if key in ENVELOPE:
            _check_type(key, val)
            continue
        if key not in COLUMNS:
            raise SchemaError(f"unknown field '{key}' on event '{name}'")
        if val is None:
            continue
        if key not in allowed and key not in COMMON:
            raise SchemaError(f"field '{key}' does not belong to event '{name}'")
        _check_type(key, val)


def _check_type(key: str, val: Any) -> None:
    typ = COLUMNS[key]
    ok: bool
    if typ in _INT_TYPES or typ == pa.int32():
        ok = isinstance(val, int) and not isinstance(val, bool)
        if ok and typ == pa.uint64():
            ok = 0 <= val < 2**64
        elif ok and typ == pa.int32():
            ok = -(2**31) <= val < 2**31
        elif ok:
            ok = -(2**63) <= val < 2**63
    elif typ == pa.float64():
        ok = isinstance(val, (int, float)) and not isinstance(val, bool)
    elif pa.types.is_list(typ):
        ok = isinstance(val, list) and all(isinstance(v, str) for v in val)
    else:
        ok = isinstance(val, str)
    if not ok:
        raise SchemaError(f"field '{key}' has wrong type: {type(val).__name__} {val!r}, "
                          f"expected {typ}")


def hash64(block_hash: Any) -> int:
    """Map a runtime block hash (bytes, int, or vLLM's BlockHash) to 64 bits.

    NOTE: like vLLM's own KV events, the integer form is the low 64 bits of the digest.
    """
    if isinstance(block_hash, int):
        return block_hash & 0xFFFF_FFFF_FFFF_FFFF
    raw = bytes(block_hash)
    return int.from_bytes(raw[-8:], "big", signed=False)
