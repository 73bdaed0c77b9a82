"""The labelling core: one ordered, compiled pass per run (docs/reconstruction.md, "Labels").

Events are read in ``seq`` order, window by window, as Arrow batches straight from the run's
Parquet file (``build(sources=...)``; see ``pass_rows``); block ids, content hashes and claim ids are
turned into dense integer indices; per-block, per-hash, per-slot (claim position) and
per-claim-instance state lives in NumPy arrays; one loop (``_pass``, compiled with numba)
applies every event and emits:

- ``kv_losses`` / ``losses``: one row per block loss (every ``block_evicted`` and one synthetic
  row per block holding content at a ``cache_reset``) with its label, and what conformance
  reads of it (``covered``, ``covered_harm``, ``pinned_in_force``);
- ``loss_claims``: one row per (loss, claim instance with a current binding to the lost hash);
- ``kv_materialized``: when each instance's predicate first held while it was in force;
- ``kv_pred``: the intervals ``[from_seq, to_seq)`` where an instance's predicate holds
  (per event, not per step);
- ``kv_copies``: copies of content overwritten without an eviction (finding block_overwritten);
- ``kv_admission_state``: a snapshot of the pool at every admission decision / preemption,
  with the protecting instances and their claim ids;
- ``kv_protected_hits``: every ``block_hit`` on content an in-force residency claim binds.

The rule table is ONE function, :func:`rule`; everything else here only maintains the state it
reads. DuckDB does the scanning before (stages 01-02) and the joining/aggregating after.

NOTE: memory is the run's state (a few int64 per block, hash, slot and instance) plus one window
of events (``WINDOW_ROWS``) plus at most ``sink.FLUSH_ROWS`` output rows: outputs are written as
Parquet (``sink.ParquetSink``) each time that many are held, and at the end. The hashes
held are those resident, or bound and named by a later event of the run (``kv_hash_last``, one
DuckDB aggregate for all runs): a bound hash no later event names is forgotten with its bindings
once it has no copy. The slot and instance tables hold an instance from its claim_seq until no
later event can reach it (``_Run.enter`` / ``_Run.leave``); the instances' facts (a few columns
each) are read once per run and still grow with its length.
NOTE: a window always ends at the end of a scheduler step, so a step's losses are judged in the
window that holds them (predicates are judged at step ends).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Final

import numba
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kvclaims.contract.vocabulary import LABEL_SEVERITY, RESIDENCY_MODES
from kvclaims.reconstruct.sink import ParquetSink, created, ddl_schema


def _shield_llvmlite() -> None:
    """Let a vLLM engine start in a process that has imported numba.

    NOTE: vLLM 0.32's kernel dispatcher scans every module's namespace and calls
    ``vars(obj).get("kernel")`` on each object; llvmlite's ``ffi.lib`` duck-types a ctypes
    CDLL but, unlike CDLL, answers dunder names too (``__dict__`` becomes a C-function
    wrapper), so an engine started after this module was imported (a sweep, the test suite)
    fails with ``'_lib_fn_wrapper' object has no attribute 'get'``. Dunder names raise
    AttributeError, as ctypes.CDLL's own ``__getattr__`` does; llvmlite never looks one up.
    """
    try:
        from llvmlite.binding import ffi
    except ImportError:  # numba without llvmlite's binding: nothing to shield
        return
    cls = type(ffi.lib)
    original = cls.__getattr__
    if getattr(original, "_kvclaims_shield", False):
        return

    def __getattr__(self: Any, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return original(self, name)

    __getattr__._kvclaims_shield = True  # type: ignore[attr-defined]
    cls.__getattr__ = __getattr__


_shield_llvmlite()

# -- vocabulary as integer codes ----------------------------------------------------------------

EV_OTHER, EV_CACHED, EV_HIT, EV_EVICTED, EV_RESET, EV_ALLOC, EV_FREED = 0, 1, 2, 3, 4, 5, 6
EV_SUBMIT, EV_ACCEPT, EV_CLAIM_OTHER, EV_BOUND, EV_RELEASE, EV_HOOK, EV_ADMISSION = (
    7, 8, 9, 10, 11, 12, 13)

EVENT_CODES: Final[dict[str, int]] = {
    "block_cached": EV_CACHED, "block_hit": EV_HIT, "block_evicted": EV_EVICTED,
    "cache_reset": EV_RESET, "block_allocated": EV_ALLOC, "block_freed": EV_FREED,
    "claim_submitted": EV_SUBMIT, "claim_accepted": EV_ACCEPT, "claim_bound": EV_BOUND,
    "claim_demoted": EV_RELEASE, "claim_expired": EV_RELEASE, "claim_released": EV_RELEASE,
    "claim_rejected": EV_CLAIM_OTHER, "claim_materialized": EV_CLAIM_OTHER,
    "claim_harmed": EV_CLAIM_OTHER, "claim_release_refused": EV_CLAIM_OTHER,
    "hook_failed": EV_HOOK, "request_admitted": EV_ADMISSION, "request_deferred": EV_ADMISSION,
    "request_refused": EV_ADMISSION, "request_preempted": EV_ADMISSION,
}

# Labels: their codes ARE their severity (kvclaims.contract.schema.LABEL_SEVERITY, one source).
EVICTION: Final[int] = LABEL_SEVERITY["eviction"]
RELAXATION: Final[int] = LABEL_SEVERITY["relaxation"]
EXPIRY: Final[int] = LABEL_SEVERITY["expiry"]
HARM: Final[int] = LABEL_SEVERITY["harm"]
UNKNOWN: Final[int] = LABEL_SEVERITY["unknown"]
LABEL_NAMES: Final[dict[int, str]] = {v: k for k, v in LABEL_SEVERITY.items()}

# What a protection mode promised (docs/reconstruction.md, "Mode promises").
MODE_BEST_EFFORT, MODE_SOFT, MODE_RESIDENCY = 0, 1, 2
REL_NONE, REL_RELAXATION, REL_EXPIRY = 0, 1, 2

WINDOW_ROWS: Final[int] = 262_144
_NULL: Final[int] = -1


def mode_class(mode: str | None) -> int:
    """best_effort promises nothing, soft_priority an eviction order, the rest residency.

    NOTE: a mode we do not know is judged as a residency promise (its loss can show as harm)."""
    if mode == "best_effort":
        return MODE_BEST_EFFORT
    if mode == "soft_priority":
        return MODE_SOFT
    if mode in RESIDENCY_MODES:
        return MODE_RESIDENCY
    # NOTE: a mode we do not know is judged as a residency promise: never hide harm
    return MODE_RESIDENCY


# -- the rule table ------------------------------------------------------------------------------

#: The label rules of :func:`rule`, in order (the first that matches decides), as docs/design.md
#: §5 states them word for word (tests/test_lifecycle_legitimacy.py compares the two).
LABEL_RULES: Final[tuple[tuple[int, str, str], ...]] = (
    (1, "the evidence has a hole at or before the loss: a `recorder_gap` (from the first seq of "
        "the scheduler step it falls in), a seq hole, a missing head", "unknown"),
    (2, "the instance was bound or accepted but never submitted", "unknown"),
    (3, "the instance was not accepted before the loss (rejected, undecided, accepted later)",
     "eviction"),
    (4, "a legitimate `claim_expired` ended the instance's force before the loss", "expiry"),
    (5, "a legitimate `claim_demoted` or `claim_released` ended its force before the loss",
     "relaxation"),
    (6, "its mode is `best_effort`", "eviction"),
    (7, "a hook failed inside the engine before the loss (fail-open)", "unknown"),
    (8, "its predicate never held while in force yet, or holds when judged: after the loss, or "
        "at the end of its scheduler step where the trace has steps", "eviction"),
    (9, "its mode is `soft_priority` and no lower-priority evictable block existed at the loss",
     "eviction"),
    (10, "otherwise: a residency promise (or a soft order) broken while in force", "harm"),
)

#: When a lifecycle end ends an instance's force (stage 02's ``kv_lifecycle_ends``), and the
#: finding kinds an end that breaks the rule yields; docs/design.md §5 states the same table.
LIFECYCLE_RULES: Final[tuple[tuple[str, str, str], ...]] = (
    ("claim_demoted", "the instance is `demotable`", "demoted_not_demotable"),
    ("claim_expired", "the instance is `expiring`, has a `ttl_s`, and the event's `ts_ns` >= "
                      "its acceptance's `ts_ns` + `ttl_s` x 10^9",
     "expired_not_expiring, expired_without_ttl, expired_before_ttl"),
    ("claim_released", "`released_by` is `operator`, or `released_by` is `tenant` and the "
                       "event's `tenant` is the instance's tenant",
     "released_not_by_owner, released_by_arbiter, released_by_unknown"),
)


@numba.njit(cache=True)
def rule(seq: int, unknown_from: int, submitted: bool, accepted_seq: int, release_seq: int,
         release_kind: int, mode: int, hook_seq: int, materialized_seq: int,
         predicate_at_judgement: bool, lower_priority_evictable: bool) -> int:
    """The label of one (loss at ``seq``, claim instance) pair: the first rule that matches
    (``LABEL_RULES``; ``release_seq`` is the instance's first *legitimate* end, stage 02).

    ``predicate_at_judgement``: the claim's predicate after the loss (traces without steps) or
    at the end of the loss's scheduler step. ``lower_priority_evictable``: at the loss, a block
    that was cached, held by no request, and bound to no in-force claim of soft_priority or a
    stronger mode existed. Seqs are -1 when the event never happened.
    """
    # 1. a hidden event (gap, seq hole) could change anything from here on: never guess
    if unknown_from >= 0 and seq >= unknown_from:
        return UNKNOWN
    # 2. bound/accepted but never submitted: the instance's state cannot be established
    if not submitted:
        return UNKNOWN
    # 3. not accepted before the loss (rejected, undecided, accepted later): no promise yet
    if accepted_seq < 0 or accepted_seq >= seq:
        return EVICTION
    # 4./5. the instance's force ended before the loss
    if release_seq >= 0 and release_seq < seq:
        return EXPIRY if release_kind == REL_EXPIRY else RELAXATION
    # 6. best_effort promises nothing beyond recording
    if mode == MODE_BEST_EFFORT:
        return EVICTION
    # 7. a hook failed inside the engine earlier (fail-open): enforcement cannot be trusted
    if hook_seq >= 0 and hook_seq < seq:
        return UNKNOWN
    # 8. the promise was never kept yet (never materialized), or it still holds (another copy,
    #    or the content came back before the step ended)
    if materialized_seq < 0 or materialized_seq >= seq or predicate_at_judgement:
        return EVICTION
    # 9. soft_priority promised an order only: harm only if a lower-priority victim existed
    if mode == MODE_SOFT and not lower_priority_evictable:
        return EVICTION
    # 10. a residency promise broken while in force
    return HARM


# -- the pass -------------------------------------------------------------------------------------

# block state columns
B_HASH, B_REF, B_LAST_KIND, B_LAST_HASH, B_LAST_HASH_OK, B_LAST_SEQ, B_ID = range(7)
# hash state columns
H_COPIES, H_EVC, H_SOFT, H_RESID, H_HEAD, H_LEN, H_DEAD = range(7)
NH = 7
# NOTE: H_DEAD: no event of the run names the hash after the window the pass has finished
# (``_Run.forget``): once it also has no copy, nothing can read its state or its bindings again
# slot columns
S_HASH, S_NEXT, S_PREV, S_INST, S_POS = range(5)
# instance state columns
I_OK, I_PRED, I_PRED_FROM, I_BREAK, I_MAT, I_INFORCE, I_SEEN, I_DIRTY, I_PROTPOS = range(9)
# counters
(C_CACHED, C_HELD, C_EVICTABLE, C_LOW, C_PROTECTED, C_HOOK, C_LOSSID, C_NPROT, C_NDIRTY,
 C_NSLOTS, C_PROTVER, C_PROTHELD) = range(12)
NC = 12
# NOTE: C_PROTHELD counts the protected copies (C_PROTECTED) that a request also references
# (held); held - protheld is the active live KV outside the protected set, so feasibility's
# protected + live never counts a block twice (a running request hitting a claim's prefix).
# NOTE: ``prot[:C_NPROT]`` lists exactly the instances protecting blocks now: in force, of a
# residency mode, with a resident bound block (I_OK > 0); ``IS[i, I_PROTPOS]`` is i's index in
# it, -1 when absent. It is kept up to date where any of the three changes (``_protecting``), so
# its length is bounded by what protects blocks, never by the claims ever in force (claims that
# are never released made a rescan of every in-force instance O(steps x claims)). C_PROTVER
# changes whenever the list does: a step's snapshot is retaken only then.
# loss output columns
(L_SEQ, L_ROW, L_BID, L_HASH, L_HASH_OK, L_RES, L_REP, L_REP_OK, L_HELD, L_HELD_OK, L_SYN,
 L_STEP, L_STEP_OK, L_LABEL, L_DSEQ, L_DINST, L_P0, L_P1, L_REPAIRED) = range(19)
NL = 19
# pair output columns
(P_LOSS, P_INST, P_POS, P_BEFORE, P_AFTER, P_LOW, P_LABEL, P_DSEQ, P_BROKEN, P_REPAIRED,
 P_SEQ) = range(11)
NP_ = 11
# admission snapshot columns
A_SEQ, A_ROW, A_PROT, A_CACHED, A_EVICTABLE, A_HELD, A_L0, A_L1, A_LIVE = range(9)
NA = 9


@numba.njit(cache=True)
def _grow(buf: np.ndarray, used: int, need: int) -> np.ndarray:
    if buf.shape[0] - used >= need:
        return buf
    cap = max(2 * buf.shape[0], used + need + 16)
    out = np.empty((cap, buf.shape[1]), dtype=buf.dtype)
    out[:used] = buf[:used]
    return out


@numba.njit(cache=True)
def _grow1(buf: np.ndarray, used: int, need: int) -> np.ndarray:
    if buf.shape[0] - used >= need:
        return buf
    cap = max(2 * buf.shape[0], used + need + 16)
    out = np.empty(cap, dtype=buf.dtype)
    out[:used] = buf[:used]
    return out


@numba.njit(cache=True)
def _home(h: np.uint64, mask: int) -> int:
    """Where content hash ``h`` starts probing in a table of ``mask + 1`` entries."""
    return int((h * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(40)) & mask


@numba.njit(cache=True)
def _slot(keys: np.ndarray, vals: np.ndarray, h: np.uint64) -> int:
    """The table entry of content hash ``h``: where it is, or the empty entry (``vals`` < 0)
    where it would go (open addressing, linear probing; the table is never full)."""
    mask = keys.shape[0] - 1
    i = _home(h, mask)
    while vals[i] >= 0 and keys[i] != h:
        i = (i + 1) & mask
    return i


@numba.njit(cache=True)
def hash_index(keys: np.ndarray, vals: np.ndarray, hused: np.ndarray, h: np.uint64) -> int:
    """Dense index of content hash ``h``, added if the table does not hold it yet.

    ``hused``: [indices handed out so far, free indices n_free, the free indices...]; a new
    hash takes a free index first."""
    i = _slot(keys, vals, h)
    v = vals[i]
    if v >= 0:
        return v
    if hused[1] > 0:
        hused[1] -= 1
        v = hused[2 + hused[1]]
    else:
        v = hused[0]
        hused[0] += 1
    keys[i] = h
    vals[i] = v
    return v


@numba.njit(cache=True)
def _find(keys: np.ndarray, vals: np.ndarray, h: np.uint64) -> int:
    """Dense index of content hash ``h``, -1 when the table does not hold it (nothing added)."""
    v = vals[_slot(keys, vals, h)]
    return v if v >= 0 else -1


@numba.njit(cache=True)
def _mark_dead(keys: np.ndarray, vals: np.ndarray, HS: np.ndarray, hashes: np.ndarray) -> None:
    """Mark ``hashes`` (none named by a later event of the run) dead where the table holds them."""
    for j in range(hashes.shape[0]):
        v = _find(keys, vals, hashes[j])
        if v >= 0:
            HS[v, H_DEAD] = 1


@numba.njit(cache=True)
def _room(hkeys: np.ndarray, hused: np.ndarray, HS: np.ndarray, need: int) -> bool:
    """Whether ``need`` new hashes fit in the table (half empty at most) and in ``HS``."""
    return (2 * (hused[0] - hused[1] + need) <= hkeys.shape[0]
            and hused[1] + HS.shape[0] - hused[0] >= need)


@numba.njit(cache=True)
def _rebuild(hkeys: np.ndarray, hvals: np.ndarray, hused: np.ndarray, HS: np.ndarray,
             SL: np.ndarray, BS: np.ndarray):
    """A new hash table for the live hashes only; the indices of the others become free.

    NOTE: a hash with no copy, no binding and no in-force coverage has all-zero state: it can
    be forgotten and re-entered fresh when it shows up again. A *dead* hash (``H_DEAD``: no
    later event of the run names it) with no copy is forgotten with its bindings: its slots
    are unlinked (``S_HASH`` -1, as if never bound), since no loss, copy or binding can reach
    them through it again; a block whose last cached content it is (an eviction without a
    hash reads that) keeps it. This keeps memory proportional to the content resident, bound
    and named again later, not to every hash the run ever saw or bound. A live hash keeps its
    index, so nothing that refers to it (blocks, slots) is rewritten: a rebuild costs
    O(table + indices + blocks), and leaves room for as many new hashes as are live
    (amortized O(1))."""
    n_old = hused[0]
    live = np.zeros(n_old, dtype=np.bool_)
    for i in range(n_old):
        live[i] = (HS[i, H_COPIES] != 0 or HS[i, H_EVC] != 0
                   or (HS[i, H_DEAD] == 0 and (HS[i, H_LEN] != 0 or HS[i, H_SOFT] != 0
                                               or HS[i, H_RESID] != 0)))
    for b in range(BS.shape[0]):
        if BS[b, B_LAST_KIND] == 1 and BS[b, B_LAST_HASH_OK] == 1:
            v = _find(hkeys, hvals, np.uint64(BS[b, B_LAST_HASH]))
            if v >= 0:
                live[v] = True
    for i in range(n_old):
        if not live[i] and HS[i, H_LEN] != 0:
            s = HS[i, H_HEAD]
            while s >= 0:
                nx = SL[s, S_NEXT]
                SL[s, S_HASH] = -1
                SL[s, S_NEXT] = -1
                SL[s, S_PREV] = -1
                s = nx
        if not live[i]:   # a free index starts from the all-zero state
            HS[i, :] = 0
            HS[i, H_HEAD] = -1
    n_live = int(live.sum())
    cap = 1024
    while cap < 4 * (n_live + 16):
        cap *= 2
    keys = np.zeros(cap, dtype=np.uint64)
    vals = np.full(cap, -1, dtype=hvals.dtype)
    for j in range(hkeys.shape[0]):
        v = hvals[j]
        if v >= 0 and live[v]:
            i = _slot(keys, vals, hkeys[j])   # an empty entry: the old table's keys are unique
            keys[i] = hkeys[j]
            vals[i] = v
    rows = max(HS.shape[0], 2 * n_live + 32)
    hs = HS
    if rows > HS.shape[0]:
        hs = np.zeros((rows, NH), dtype=HS.dtype)
        hs[:, H_HEAD] = -1
        hs[:HS.shape[0]] = HS
    used = np.zeros(2 + rows, dtype=hused.dtype)
    used[0] = n_old
    nf = 0
    for i in range(n_old - 1, -1, -1):   # low indices are handed out first
        if not live[i]:
            used[2 + nf] = i
            nf += 1
    used[1] = nf
    return keys, vals, used, hs


@numba.njit(cache=True)
def _set_pred(inst: int, seq: int, IS: np.ndarray, k: np.ndarray, R: np.ndarray,
              nr: np.ndarray, dirty: np.ndarray, C: np.ndarray) -> None:
    """Re-evaluate an instance's predicate after its ok count changed."""
    holds = k[inst] >= 1 and IS[inst, I_OK] == k[inst]
    if holds and IS[inst, I_PRED] == 0:
        IS[inst, I_PRED] = 1
        IS[inst, I_PRED_FROM] = seq
        if IS[inst, I_DIRTY] == 0:
            IS[inst, I_DIRTY] = 1
            dirty[C[C_NDIRTY]] = inst
            C[C_NDIRTY] += 1
    elif not holds and IS[inst, I_PRED] == 1:
        IS[inst, I_PRED] = 0
        IS[inst, I_BREAK] = seq
        j = nr[0]
        R[j, 0] = inst
        R[j, 1] = IS[inst, I_PRED_FROM]
        R[j, 2] = seq
        nr[0] = j + 1


@numba.njit(cache=True)
def _protecting(inst: int, IS: np.ndarray, mode: np.ndarray, prot: np.ndarray,
                C: np.ndarray) -> None:
    """Put ``inst`` in or take it out of ``prot`` after its force or ok count changed."""
    want = IS[inst, I_INFORCE] == 1 and mode[inst] == MODE_RESIDENCY and IS[inst, I_OK] > 0
    j = IS[inst, I_PROTPOS]
    if want and j < 0:
        IS[inst, I_PROTPOS] = C[C_NPROT]
        prot[C[C_NPROT]] = inst
        C[C_NPROT] += 1
        C[C_PROTVER] += 1
    elif not want and j >= 0:
        last = prot[C[C_NPROT] - 1]
        prot[j] = last
        IS[last, I_PROTPOS] = j
        IS[inst, I_PROTPOS] = -1
        C[C_NPROT] -= 1
        C[C_PROTVER] += 1


@numba.njit(cache=True)
def _residency(h: int, delta: int, seq: int, HS: np.ndarray, SL: np.ndarray, IS: np.ndarray,
               k: np.ndarray, mode: np.ndarray, prot: np.ndarray, R: np.ndarray,
               nr: np.ndarray, dirty: np.ndarray, C: np.ndarray) -> None:
    """Hash ``h`` became resident (+1) or not (-1): update the instances bound to it."""
    s = HS[h, H_HEAD]
    while s >= 0:
        inst = SL[s, S_INST]
        if SL[s, S_POS] < k[inst]:
            old = IS[inst, I_OK]
            IS[inst, I_OK] = old + delta
            if (old > 0) != (old + delta > 0):
                _protecting(inst, IS, mode, prot, C)
            _set_pred(inst, seq, IS, k, R, nr, dirty, C)
        s = SL[s, S_NEXT]


@numba.njit(cache=True)
def _copy(b: int, h: int, delta: int, seq: int, BS: np.ndarray, HS: np.ndarray,
          SL: np.ndarray, IS: np.ndarray, k: np.ndarray, mode: np.ndarray, prot: np.ndarray,
          R: np.ndarray, nr: np.ndarray, dirty: np.ndarray, C: np.ndarray) -> None:
    """Block ``b`` starts (+1) or stops (-1) holding a copy of hash ``h``."""
    if delta > 0:
        BS[b, B_HASH] = h
    else:
        BS[b, B_HASH] = -1
    C[C_CACHED] += delta
    if HS[h, H_RESID] > 0:
        C[C_PROTECTED] += delta
        if BS[b, B_REF] > 0:
            C[C_PROTHELD] += delta
    if BS[b, B_REF] == 0:
        C[C_EVICTABLE] += delta
        HS[h, H_EVC] += delta
        if HS[h, H_SOFT] == 0:
            C[C_LOW] += delta
    HS[h, H_COPIES] += delta
    if (delta > 0 and HS[h, H_COPIES] == 1) or (delta < 0 and HS[h, H_COPIES] == 0):
        _residency(h, delta, seq, HS, SL, IS, k, mode, prot, R, nr, dirty, C)


@numba.njit(cache=True)
def _ref(b: int, delta: int, BS: np.ndarray, HS: np.ndarray, C: np.ndarray) -> None:
    """A request takes (+1) or drops (-1) a reference on block ``b``."""
    old = BS[b, B_REF]
    new = max(0, old + delta)
    if old == new:
        return
    BS[b, B_REF] = new
    if old == 0 or new == 0:
        d = 1 if new > 0 else -1           # held: +1; evictable: -1
        C[C_HELD] += d
        h = BS[b, B_HASH]
        if h >= 0:
            C[C_EVICTABLE] -= d
            HS[h, H_EVC] -= d
            if HS[h, H_RESID] > 0:
                C[C_PROTHELD] += d
            if HS[h, H_SOFT] == 0:
                C[C_LOW] -= d


@numba.njit(cache=True)
def _protect(h: int, mode: int, delta: int, HS: np.ndarray, C: np.ndarray) -> None:
    """An in-force binding of a soft (or stronger) claim starts/stops covering hash ``h``."""
    if mode == MODE_BEST_EFFORT or h < 0:
        return
    old = HS[h, H_SOFT]
    HS[h, H_SOFT] = old + delta
    if old == 0 and delta > 0:
        C[C_LOW] -= HS[h, H_EVC]
    elif old + delta == 0 and delta < 0:
        C[C_LOW] += HS[h, H_EVC]
    if mode == MODE_RESIDENCY:
        old = HS[h, H_RESID]
        HS[h, H_RESID] = old + delta
        if old == 0 and delta > 0:
            C[C_PROTECTED] += HS[h, H_COPIES]
            C[C_PROTHELD] += HS[h, H_COPIES] - HS[h, H_EVC]
        elif old + delta == 0 and delta < 0:
            C[C_PROTECTED] -= HS[h, H_COPIES]
            C[C_PROTHELD] -= HS[h, H_COPIES] - HS[h, H_EVC]


@numba.njit(cache=True)
def _force(inst: int, delta: int, off: np.ndarray, nsl: np.ndarray, k: np.ndarray,
           mode: np.ndarray, SL: np.ndarray, HS: np.ndarray, IS: np.ndarray,
           prot: np.ndarray, C: np.ndarray) -> None:
    """An instance comes into force (+1, accepted) or leaves it (-1, released)."""
    IS[inst, I_INFORCE] = 1 if delta > 0 else 0
    for p in range(min(nsl[inst], max(k[inst], 0))):
        _protect(SL[off[inst] + p, S_HASH], mode[inst], delta, HS, C)
    _protecting(inst, IS, mode, prot, C)


@numba.njit(cache=True)
def _add_loss(L: np.ndarray, nl: int, seq: int, row: int, bid: int, h: np.uint64, h_ok: bool,
              res: bool, rep: np.uint64, rep_ok: bool, held: np.uint64, held_ok: bool,
              syn: bool, step: int, step_ok: bool) -> None:
    L[nl, L_SEQ] = seq
    L[nl, L_ROW] = row
    L[nl, L_BID] = bid
    L[nl, L_HASH] = np.int64(h)
    L[nl, L_HASH_OK] = h_ok
    L[nl, L_RES] = res
    L[nl, L_REP] = np.int64(rep)
    L[nl, L_REP_OK] = rep_ok
    L[nl, L_HELD] = np.int64(held)
    L[nl, L_HELD_OK] = held_ok
    L[nl, L_SYN] = syn
    L[nl, L_STEP] = step
    L[nl, L_STEP_OK] = step_ok
    L[nl, L_LABEL] = 0
    L[nl, L_DSEQ] = -1
    L[nl, L_DINST] = -1
    L[nl, L_REPAIRED] = 0


@numba.njit(cache=True)
def _add_pairs(L: np.ndarray, nl: int, h: int, P: np.ndarray, npair: int, seq: int,
               low: bool, HS: np.ndarray, SL: np.ndarray, IS: np.ndarray, rank: np.ndarray,
               C: np.ndarray) -> int:
    """One pair per instance with a current binding to hash ``h``; sorted by claim id, seq."""
    start = npair
    lid = C[C_LOSSID]
    C[C_LOSSID] += 1
    if h >= 0:
        s = HS[h, H_HEAD]
        while s >= 0:
            inst = SL[s, S_INST]
            pos = SL[s, S_POS]
            if IS[inst, I_SEEN] != lid:
                IS[inst, I_SEEN] = lid
                P[npair, P_LOSS] = nl
                P[npair, P_INST] = inst
                P[npair, P_POS] = pos
                P[npair, P_BEFORE] = IS[inst, I_PRED]
                P[npair, P_LOW] = low
                P[npair, P_SEQ] = seq
                npair += 1
            else:
                for j in range(start, npair):
                    if P[j, P_INST] == inst and pos < P[j, P_POS]:
                        P[j, P_POS] = pos
            s = SL[s, S_NEXT]
    # insertion sort by (claim id rank, instance = claim_seq order)
    for i in range(start + 1, npair):
        j = i
        while j > start and (rank[P[j - 1, P_INST]], P[j - 1, P_INST]) > (
                rank[P[j, P_INST]], P[j, P_INST]):
            for c in range(NP_):
                t = P[j - 1, c]
                P[j - 1, c] = P[j, c]
                P[j, c] = t
            j -= 1
    L[nl, L_P0] = start
    L[nl, L_P1] = npair
    return npair


@numba.njit(cache=True)
def _judge(L: np.ndarray, l0: int, l1: int, P: np.ndarray, IS: np.ndarray,
           submitted: np.ndarray, acc: np.ndarray, rel: np.ndarray, relkind: np.ndarray,
           mode: np.ndarray, unknown_from: int, hook_seq: int) -> None:
    """Label losses l0..l1-1 (and their pairs) with the predicates as they are now."""
    for li in range(l0, l1):
        seq = L[li, L_SEQ]
        best = 0
        for j in range(L[li, L_P0], L[li, L_P1]):
            inst = P[j, P_INST]
            pred_now = IS[inst, I_PRED] == 1
            lab = rule(seq, unknown_from, submitted[inst] == 1, acc[inst], rel[inst],
                       relkind[inst], mode[inst], hook_seq, IS[inst, I_MAT], pred_now,
                       P[j, P_LOW] == 1)
            P[j, P_LABEL] = lab
            P[j, P_DSEQ] = acc[inst] if lab == HARM else (
                rel[inst] if lab == EXPIRY or lab == RELAXATION else -1)
            P[j, P_BROKEN] = IS[inst, I_BREAK] if lab == HARM else -1
            # repaired: the loss left the predicate false, the step's end found it true again
            rep = (L[li, L_STEP_OK] == 1 and P[j, P_AFTER] == 0 and pred_now
                   and lab == EVICTION and IS[inst, I_MAT] >= 0 and IS[inst, I_MAT] < seq
                   and acc[inst] >= 0 and acc[inst] < seq
                   and (rel[inst] < 0 or rel[inst] >= seq))
            P[j, P_REPAIRED] = rep
            if rep:
                L[li, L_REPAIRED] = 1
            if lab > best:
                best = lab
                L[li, L_DINST] = inst
                L[li, L_DSEQ] = P[j, P_DSEQ]
        if (unknown_from >= 0 and seq >= unknown_from) or L[li, L_HASH_OK] == 0:
            best = UNKNOWN
            L[li, L_DINST] = -1
            L[li, L_DSEQ] = -1
        elif best == 0:
            best = EVICTION
        if best == UNKNOWN or best == EVICTION:
            L[li, L_DINST] = -1
            L[li, L_DSEQ] = -1
        L[li, L_LABEL] = best


@numba.njit(cache=True)
def _pass(seq: np.ndarray, step: np.ndarray, step_ok: np.ndarray, ev: np.ndarray,
          bidx: np.ndarray, bid: np.ndarray, hbits: np.ndarray, hok: np.ndarray,
          inst_of: np.ndarray, pos: np.ndarray, owner: np.ndarray,
          hkeys: np.ndarray, hvals: np.ndarray, hused: np.ndarray,
          BS: np.ndarray, HS: np.ndarray, SL: np.ndarray, IS: np.ndarray, C: np.ndarray,
          prot: np.ndarray, dirty: np.ndarray,
          k: np.ndarray, off: np.ndarray, nsl: np.ndarray, mode: np.ndarray,
          submitted: np.ndarray, acc: np.ndarray, rel: np.ndarray, relkind: np.ndarray,
          rank: np.ndarray, border: np.ndarray, unknown_from: int):
    """Apply one window of events (seq order, ending at a step end); return its outputs."""
    n = seq.shape[0]
    nb = BS.shape[0]
    L = np.empty((max(16, n // 8), NL), dtype=np.int64)
    P = np.empty((max(16, n // 8), NP_), dtype=np.int64)
    A = np.empty((16, NA), dtype=np.int64)
    AL = np.empty(16, dtype=np.int64)
    R = np.empty((max(16, n // 16), 3), dtype=np.int64)
    W = np.empty((16, 4), dtype=np.int64)      # overwritten copies: block, hash, start, end
    X = np.empty((16, 5), dtype=np.int64)      # hits the timeline contradicts (see EV_HIT)
    Y = np.empty((16, 3), dtype=np.int64)      # ends of force: row, instance, blocks freed
    M = np.empty((16, 2), dtype=np.int64)      # materializations: inst, seq
    PH = np.empty(16, dtype=np.int64)          # rows of block_hit events on protected content
    nph = 0
    nl = 0
    npair = 0
    na = 0
    nal = 0
    nr = np.zeros(1, dtype=np.int64)
    nw = 0
    nhx = 0
    ny = 0
    nm = 0
    l_judged = 0
    zero = np.uint64(0)
    S0 = np.zeros(5, dtype=np.int64)          # the pool before the current request's own events
    SI0 = np.empty(16, dtype=np.int64)        # claim instances protecting blocks then
    ns0 = 0
    si_ver = -1                               # C_PROTVER when SI0 was taken (-1: never)
    run_owner = -1                            # the request whose block events run now (-1: none)
    run_step = -1
    for i in range(n):
        e = ev[i]
        s = seq[i]
        # room for the (at most 3) hashes this event may add
        if not _room(hkeys, hused, HS, 3):
            hkeys, hvals, hused, HS = _rebuild(hkeys, hvals, hused, HS, SL, BS)
        # capacity for the worst case of this event
        if e == EV_RESET:
            need = C[C_NSLOTS] + nb + 1
        elif e == EV_EVICTED or e == EV_CACHED or e == EV_HIT:
            need = 2
            if hok[i]:
                need += HS[hash_index(hkeys, hvals, hused, hbits[i]), H_LEN]
            b = bidx[i]
            if b >= 0 and BS[b, B_HASH] >= 0:
                need += HS[BS[b, B_HASH], H_LEN]
            if b >= 0 and BS[b, B_LAST_HASH_OK] == 1:
                need += HS[hash_index(hkeys, hvals, hused, np.uint64(BS[b, B_LAST_HASH])),
                           H_LEN]
        elif e == EV_BOUND:
            need = 2
        else:
            need = 1
        L = _grow(L, nl, nb + 1 if e == EV_RESET else 1)
        P = _grow(P, npair, need)
        R = _grow(R, nr[0], need + 1)
        W = _grow(W, nw, 1)
        X = _grow(X, nhx, 1)
        Y = _grow(Y, ny, 1)
        M = _grow(M, nm, C[C_NDIRTY] + 1)
        A = _grow(A, na, 1)
        PH = _grow1(PH, nph, 1)
        AL = _grow1(AL, nal, max(C[C_NPROT], ns0) + 1)
        if step_ok[i] and (i == 0 or (not step_ok[i - 1]) or step[i - 1] != step[i]):
            run_owner = -1
        if (step_ok[i] and owner[i] >= 0 and e != EV_RESET and EV_CACHED <= e <= EV_FREED
                and (owner[i] != run_owner or step[i] != run_step)):
            # NOTE: an admission decision is judged against the pool as the request found it:
            # vLLM allocates (and evicts, and hits) for a request right before the decision is
            # recorded, so the state at the decision's own seq already holds its effects; the
            # state before its own run of block events is the one it met (other requests of
            # the same step, scheduled before it, are in)
            run_owner = owner[i]
            run_step = step[i]
            S0[0] = C[C_PROTECTED]
            S0[1] = C[C_CACHED]
            S0[2] = C[C_EVICTABLE]
            S0[3] = C[C_HELD]
            S0[4] = C[C_HELD] - C[C_PROTHELD]
            if C[C_PROTVER] != si_ver:   # NOTE: else SI0[:ns0] is still exact (C_PROTVER)
                si_ver = C[C_PROTVER]
                ns0 = C[C_NPROT]
                SI0 = _grow1(SI0, 0, ns0 + 1)
                SI0[:ns0] = np.sort(prot[:ns0])   # instance order = claim_seq order

        if e == EV_HIT:
            # NOTE: a hit is evidence of presence only where the timeline has that content
            # resident in that block; a hit on a free, evicted or differently filled block
            # contradicts the timeline: it is kept as a finding and changes no residency (it can
            # never repair a loss), the request's reference on the block still counts
            b = bidx[i]
            if b >= 0:
                _ref(b, 1, BS, HS, C)
                cur = BS[b, B_HASH]
                h = hash_index(hkeys, hvals, hused, hbits[i]) if hok[i] else -1
                if cur < 0 or (h >= 0 and cur != h):
                    X[nhx, 0] = i
                    X[nhx, 1] = np.int64(hbits[i])
                    X[nhx, 2] = hok[i]
                    X[nhx, 3] = BS[b, B_LAST_HASH] if cur >= 0 else 0
                    X[nhx, 4] = cur >= 0
                    nhx += 1
                elif h >= 0 and HS[h, H_RESID] > 0:
                    # NOTE: a hit on content an in-force residency claim binds: that block is
                    # counted as protected, so it is not the request's need (05_feasibility)
                    PH[nph] = i
                    nph += 1
        elif e == EV_CACHED:
            b = bidx[i]
            if b >= 0:
                cur = BS[b, B_HASH]
                h = hash_index(hkeys, hvals, hused, hbits[i]) if hok[i] else -1
                if cur >= 0 and cur != h:
                    # overwritten without an eviction: its copy ends, no loss is invented
                    W[nw, 0] = bid[i]
                    W[nw, 1] = BS[b, B_LAST_HASH]
                    W[nw, 2] = BS[b, B_LAST_SEQ]
                    W[nw, 3] = s
                    nw += 1
                    _copy(b, cur, -1, s, BS, HS, SL, IS, k, mode, prot, R, nr, dirty, C)
                if h >= 0 and cur != h:
                    _copy(b, h, 1, s, BS, HS, SL, IS, k, mode, prot, R, nr, dirty, C)
                BS[b, B_LAST_KIND] = 1
                BS[b, B_LAST_HASH] = np.int64(hbits[i])
                BS[b, B_LAST_HASH_OK] = hok[i]
                BS[b, B_LAST_SEQ] = s
        elif e == EV_EVICTED:
            b = bidx[i]
            held_ok = False
            held = zero
            prev_ok = False
            prev = zero
            cur = -1
            if b >= 0:
                cur = BS[b, B_HASH]
                held_ok = cur >= 0
                if BS[b, B_LAST_KIND] == 1 and BS[b, B_LAST_HASH_OK] == 1:
                    prev_ok = True
                    prev = np.uint64(BS[b, B_LAST_HASH])
                if held_ok:
                    held = prev
            h_ok = hok[i] or prev_ok
            hv = hbits[i] if hok[i] else prev
            h = hash_index(hkeys, hvals, hused, hv) if h_ok else -1
            low = C[C_LOW] > 0
            _add_loss(L, nl, s, i, bid[i], hv, h_ok, held_ok, hbits[i], hok[i], held,
                      held_ok, False, step[i], step_ok[i])
            npair = _add_pairs(L, nl, h, P, npair, s, low, HS, SL, IS, rank, C)
            if cur >= 0:
                _copy(b, cur, -1, s, BS, HS, SL, IS, k, mode, prot, R, nr, dirty, C)
            for j in range(L[nl, L_P0], npair):
                P[j, P_AFTER] = IS[P[j, P_INST], I_PRED]
            nl += 1
            if b >= 0:
                BS[b, B_LAST_KIND] = 2
                BS[b, B_LAST_HASH_OK] = 0
                BS[b, B_LAST_SEQ] = s
        elif e == EV_RESET:
            first = nl
            for bo in range(nb):
                b = border[bo]
                cur = BS[b, B_HASH]
                if cur >= 0:
                    hv = np.uint64(BS[b, B_LAST_HASH])
                    _add_loss(L, nl, s, -1, BS[b, B_ID], hv, True, True, zero, False, hv,
                              True, True, step[i], step_ok[i])
                    # NOTE: a reset evicts every block: no eviction order is broken by it
                    npair = _add_pairs(L, nl, cur, P, npair, s, False, HS, SL, IS, rank, C)
                    nl += 1
            for b in range(nb):
                cur = BS[b, B_HASH]
                if cur >= 0:
                    _copy(b, cur, -1, s, BS, HS, SL, IS, k, mode, prot, R, nr, dirty, C)
            for li in range(first, nl):
                for j in range(L[li, L_P0], L[li, L_P1]):
                    P[j, P_AFTER] = IS[P[j, P_INST], I_PRED]
        elif e == EV_ALLOC:
            if bidx[i] >= 0:
                _ref(bidx[i], 1, BS, HS, C)
        elif e == EV_FREED:
            if bidx[i] >= 0:
                _ref(bidx[i], -1, BS, HS, C)
        elif e == EV_ACCEPT or e == EV_RELEASE:
            inst = inst_of[i]
            if inst >= 0:
                if e == EV_ACCEPT and s == acc[inst] and not (rel[inst] >= 0 and rel[inst] < s):
                    _force(inst, 1, off, nsl, k, mode, SL, HS, IS, prot, C)
                    if IS[inst, I_DIRTY] == 0:
                        IS[inst, I_DIRTY] = 1
                        dirty[C[C_NDIRTY]] = inst
                        C[C_NDIRTY] += 1
                elif e == EV_RELEASE and s == rel[inst] and IS[inst, I_INFORCE] == 1:
                    before = C[C_PROTECTED]
                    held_before = C[C_PROTHELD]
                    _force(inst, -1, off, nsl, k, mode, SL, HS, IS, prot, C)
                    # the protected blocks this end of force gave back to the pool (a
                    # demotion is justified only if the request it made room for needed them)
                    Y[ny, 0] = i
                    Y[ny, 1] = inst
                    Y[ny, 2] = before - C[C_PROTECTED]
                    ny += 1
                    if step_ok[i] and run_owner >= 0:
                        # NOTE: a demotion, expiry or release inside the step comes before the
                        # decisions that follow it (the arbiter demotes to admit): the step's
                        # starting pool no longer protects that claim's blocks
                        S0[0] = max(0, S0[0] - (before - C[C_PROTECTED]))
                        S0[4] += held_before - C[C_PROTHELD]  # held and no longer protected
                        w = 0
                        for j in range(ns0):   # keeps claim_seq order
                            if SI0[j] != inst:
                                SI0[w] = SI0[j]
                                w += 1
                        ns0 = w
        elif e == EV_BOUND:
            inst = inst_of[i]
            p = pos[i]
            if inst >= 0 and hok[i] and 0 <= p < nsl[inst]:
                sl = off[inst] + p
                h = hash_index(hkeys, hvals, hused, hbits[i])
                old = SL[sl, S_HASH]
                counted = p < k[inst]
                if old >= 0:
                    # unlink from the old hash's list
                    pv, nx = SL[sl, S_PREV], SL[sl, S_NEXT]
                    if pv >= 0:
                        SL[pv, S_NEXT] = nx
                    else:
                        HS[old, H_HEAD] = nx
                    if nx >= 0:
                        SL[nx, S_PREV] = pv
                    HS[old, H_LEN] -= 1
                    if IS[inst, I_INFORCE] == 1 and counted:
                        _protect(old, mode[inst], -1, HS, C)
                    if counted and HS[old, H_COPIES] > 0:
                        IS[inst, I_OK] -= 1
                        if IS[inst, I_OK] == 0:
                            _protecting(inst, IS, mode, prot, C)
                SL[sl, S_HASH] = h
                SL[sl, S_PREV] = -1
                SL[sl, S_NEXT] = HS[h, H_HEAD]
                if HS[h, H_HEAD] >= 0:
                    SL[HS[h, H_HEAD], S_PREV] = sl
                HS[h, H_HEAD] = sl
                HS[h, H_LEN] += 1
                if IS[inst, I_INFORCE] == 1 and counted:
                    _protect(h, mode[inst], 1, HS, C)
                if counted and HS[h, H_COPIES] > 0:
                    IS[inst, I_OK] += 1
                    if IS[inst, I_OK] == 1:
                        _protecting(inst, IS, mode, prot, C)
                _set_pred(inst, s, IS, k, R, nr, dirty, C)
        elif e == EV_HOOK:
            if C[C_HOOK] < 0:
                C[C_HOOK] = s
        elif e == EV_ADMISSION:
            A[na, A_SEQ] = s
            A[na, A_ROW] = i
            A[na, A_L0] = nal
            if step_ok[i] and owner[i] >= 0 and owner[i] == run_owner and step[i] == run_step:
                # the pool before the request's own block events (see above)
                A[na, A_PROT] = S0[0]
                A[na, A_CACHED] = S0[1]
                A[na, A_EVICTABLE] = S0[2]
                A[na, A_HELD] = S0[3]
                A[na, A_LIVE] = S0[4]
                for j in range(ns0):
                    AL[nal] = SI0[j]
                    nal += 1
            else:  # no own block events before it (or stepless): the pool at its seq
                A[na, A_PROT] = C[C_PROTECTED]
                A[na, A_CACHED] = C[C_CACHED]
                A[na, A_EVICTABLE] = C[C_EVICTABLE]
                A[na, A_HELD] = C[C_HELD]
                A[na, A_LIVE] = C[C_HELD] - C[C_PROTHELD]
                m = C[C_NPROT]
                AL[nal:nal + m] = np.sort(prot[:m])
                nal += m
            A[na, A_L1] = nal
            na += 1

        # judgement point: after a stepless event, or at the end of a scheduler step
        if (not step_ok[i]) or i == n - 1 or (not step_ok[i + 1]) or step[i + 1] != step[i]:
            M = _grow(M, nm, C[C_NDIRTY])
            if nl > l_judged:
                _judge(L, l_judged, nl, P, IS, submitted, acc, rel, relkind, mode,
                       unknown_from, C[C_HOOK])
                l_judged = nl
            for j in range(C[C_NDIRTY]):
                inst = dirty[j]
                IS[inst, I_DIRTY] = 0
                if (IS[inst, I_MAT] < 0 and IS[inst, I_PRED] == 1 and acc[inst] >= 0
                        and acc[inst] <= s and (rel[inst] < 0 or rel[inst] > s)):
                    IS[inst, I_MAT] = s
                    M[nm, 0] = inst
                    M[nm, 1] = s
                    nm += 1
            C[C_NDIRTY] = 0
    return (L[:nl], P[:npair], A[:na], AL[:nal], R[:nr[0]], W[:nw], M[:nm], PH[:nph], X[:nhx],
            Y[:ny], hkeys, hvals, hused, HS)


@numba.njit(cache=True)
def _instances(seq: np.ndarray, ev: np.ndarray, code: np.ndarray, cur: np.ndarray,
               fseq: np.ndarray, rej: np.ndarray, prev_live: np.ndarray) -> np.ndarray:
    """The claim instance (row of the run's facts, in claim_seq order) of each claim event.

    NOTE: the same rule as stage 02's claim_seq: a submit starts a new instance and its
    acceptance belongs to it; any other claim event joins the latest instance of its id not
    rejected before it (``rej``: the instance's rejection seq, -1 if none; ``prev_live``: the
    latest earlier instance of the id never rejected, -1 if none), or starts one if the id has
    none yet. A rejected submission never captures the events of the instance in force."""
    out = np.full(seq.shape[0], -1, dtype=np.int64)
    for i in range(seq.shape[0]):
        e = ev[i]
        c = code[i]
        if c < 0 or e < EV_SUBMIT or e > EV_RELEASE:
            continue
        if e == EV_SUBMIT or cur[c] < 0:
            j = np.searchsorted(fseq, seq[i])
            cur[c] = j if j < fseq.shape[0] and fseq[j] == seq[i] else -1
        j = cur[c]
        if (e != EV_SUBMIT and e != EV_ACCEPT and j >= 0 and rej[j] >= 0 and rej[j] < seq[i]
                and prev_live[j] >= 0):
            j = prev_live[j]
        out[i] = j
    return out


# -- driver: Arrow batches in (each run in seq order), DuckDB out ---------------------------------

@numba.njit(cache=True)
def distinct_sorted(vals: np.ndarray, off: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per segment ``vals[off[j]:off[j + 1]]``: its distinct values, ascending; returns the
    concatenated values and their segment offsets (``len(off)`` of them)."""
    out = np.empty(vals.shape[0], dtype=vals.dtype)
    oo = np.zeros(off.shape[0], dtype=np.int32)
    n = 0
    for j in range(off.shape[0] - 1):
        seg = np.sort(vals[off[j]:off[j + 1]])
        for x in range(seg.shape[0]):
            if x == 0 or seg[x] != seg[x - 1]:
                out[n] = seg[x]
                n += 1
        oo[j + 1] = n
    return out[:n], oo


def pinned_in_force(pin_from: np.ndarray, pin_to: np.ndarray, seqs: np.ndarray) -> np.ndarray:
    """Whether a pinning claim instance is in force at each of ``seqs``: more acceptances than
    releases at or before it (``pin_from`` / ``pin_to``, sorted). An acceptance or release at
    a loss's own seq counts before the loss (INV_no_protected_loss, 08_conformance.sql)."""
    return (np.searchsorted(pin_from, seqs, side="right")
            - np.searchsorted(pin_to, seqs, side="right")) > 0


#: Seconds spent so far in this process by the driver's parts, disjoint (benchmarks print
#: them): reading and coding the input (``input``), the compiled loop (``loop``), the rest of
#: each window: its state kept and its outputs made as Arrow (``outputs``), writing outputs as
#: Parquet (``write``, also when a window's outputs fill the sink).
TIMINGS: dict[str, float] = {"input": 0.0, "loop": 0.0, "outputs": 0.0, "write": 0.0}


def _timed(items: Iterable[Any], key: str) -> Iterator[Any]:
    it = iter(items)
    while True:
        t0 = time.perf_counter()
        try:
            item = next(it)
        except StopIteration:
            TIMINGS[key] += time.perf_counter() - t0
            return
        TIMINGS[key] += time.perf_counter() - t0
        yield item

# The columns of an event the pass reads (loader schema), and the events whose column it keeps.
PASS_COLUMNS: Final[tuple[str, ...]] = (
    "seq", "step", "event", "block_id", "block_hash", "claim_id", "position", "ts_ns", "cause",
    "by_request_id", "request_id")
_MASKED: Final[dict[str, Callable[[str], bool]]] = {
    "claim_id": lambda e: e.startswith("claim_"),
    "cause": lambda e: e == "block_evicted",
    "by_request_id": lambda e: e == "block_evicted",
    # NOTE: kept on block events too: the admission snapshot is taken before a request's own
    # run of block events (``owner`` in the pass), and kv_protected_hits names the hitter
    "request_id": lambda e: e in ("block_allocated", "block_cached", "block_hit",
                                  "block_freed", "request_admitted", "request_deferred",
                                  "request_refused",
                                  "request_preempted"),
}
# Claim instances whose slots are filled at once when they enter the slot table.
SLOT_FILL_INSTANCES: Final[int] = 1 << 20

# NOTE: only for a connection whose events are not in files (core.reconstruct on a table,
# which holds them in memory already)
_RUN_SQL: Final[str] = (f"SELECT {', '.join(PASS_COLUMNS)} FROM events WHERE run_id = $rid "
                        "ORDER BY seq")

DDL: Final[tuple[str, ...]] = (
    """CREATE OR REPLACE TEMP TABLE kv_losses (
        run_id VARCHAR, seq BIGINT, ts_ns BIGINT, block_id INTEGER, block_hash UBIGINT,
        cause VARCHAR, by_request_id VARCHAR, label VARCHAR, claim_ids VARCHAR[],
        decided_by_seq BIGINT, decided_by_claim_id VARCHAR, claim_seq BIGINT,
        was_resident BOOLEAN, synthetic BOOLEAN, step BIGINT, repaired_in_step BOOLEAN,
        reported_hash UBIGINT, held_hash UBIGINT, pinned_in_force BOOLEAN,
        covered BOOLEAN, covered_harm BOOLEAN)""",
    """CREATE OR REPLACE TEMP TABLE kv_pred (
        run_id VARCHAR, claim_id VARCHAR, claim_seq BIGINT, from_seq BIGINT, to_seq BIGINT)""",
    """CREATE OR REPLACE TEMP TABLE kv_materialized (
        run_id VARCHAR, claim_id VARCHAR, claim_seq BIGINT, materialized_seq BIGINT)""",
    """CREATE OR REPLACE TEMP TABLE kv_copies (
        run_id VARCHAR, block_id INTEGER, block_hash UBIGINT, start_seq BIGINT,
        end_seq BIGINT, end_kind VARCHAR)""",
    """CREATE OR REPLACE TEMP TABLE kv_hit_contradictions (
        run_id VARCHAR, seq BIGINT, block_id INTEGER, block_hash UBIGINT, held_hash UBIGINT,
        request_id VARCHAR, step BIGINT)""",
    """CREATE OR REPLACE TEMP TABLE kv_release_freed (
        run_id VARCHAR, seq BIGINT, claim_seq BIGINT, freed_blocks BIGINT)""",
    """CREATE OR REPLACE TEMP TABLE kv_admission_state (
        run_id VARCHAR, seq BIGINT, request_id VARCHAR, protected_blocks BIGINT,
        protected_claim_seqs BIGINT[], protected_claim_ids VARCHAR[], cached_blocks BIGINT,
        evictable_blocks BIGINT, held_blocks BIGINT, live_blocks BIGINT)""",
    """CREATE OR REPLACE TEMP TABLE kv_protected_hits (
        run_id VARCHAR, seq BIGINT, request_id VARCHAR)""",
)

# ``loss_claims`` in its final shape (docs/design.md, "Labels"): the pass writes it directly
# (as ``kv_loss_claims``; the view ``loss_claims`` adds late materializations), its claim facts
# taken from stage 02's per-instance table.
LOSS_CLAIMS_DDL: Final[str] = """CREATE OR REPLACE TABLE loss_claims (
    run_id VARCHAR, seq BIGINT, ts_ns BIGINT, block_id INTEGER, block_hash UBIGINT,
    claim_id VARCHAR, claim_seq BIGINT, position INTEGER, label VARCHAR, decided_by_seq BIGINT,
    tenant VARCHAR, protection_mode VARCHAR, threshold_blocks INTEGER, accepted_seq BIGINT,
    materialized_seq BIGINT, release_seq BIGINT, release_event VARCHAR,
    predicate_before BOOLEAN, predicate_after BOOLEAN, breaks_predicate BOOLEAN,
    broken_seq BIGINT, by_request_id VARCHAR, step BIGINT, repaired_in_step BOOLEAN)"""

# The instance facts a ``loss_claims`` row repeats (``_FACTS_SQL``'s columns, as stage 02 has
# them: NULL where it has none), by the name ``loss_claims`` gives them.
PAIR_FACTS: Final[dict[str, str]] = {
    "tenant": "tenant", "protection_mode": "protection_mode", "threshold_blocks": "k_declared",
    "accepted_seq": "accepted_seq", "release_seq": "release_seq",
    "release_event": "release_event"}

# NOTE: the pass's per-run inputs are made for every run at once, each run's rows together
# (``r``: the run's place in run_id order, what a zonemap prunes on): one query per run over
# ``events`` (a view over every run's Parquet file) or over stage 02's tables read them all
# again for each run (at 2 M mixed events, 64 runs: 6.4 of the pass's 10.3 CPU-s).
_RUN_NUMBERS: Final[str] = (
    "(SELECT run_id, (row_number() OVER (ORDER BY run_id) - 1)::INTEGER AS r FROM kv_runs)")

_FACTS_SQL: Final[str] = f"""
CREATE OR REPLACE TEMP TABLE kv_pass_facts AS
SELECT n.r, f.claim_seq, f.claim_id, coalesce(f.k, 0) AS k, f.n_slots, f.protection_mode,
       f.submitted_seq IS NOT NULL AS submitted, coalesce(f.accepted_seq, -1) AS acc,
       coalesce(f.release_seq, -1) AS rel, f.release_event,
       coalesce(s.rejected_seq, -1) AS rej, coalesce(s.prev_live_seq, -1) AS prev_live_seq,
       coalesce(f.pinned_mode, false) AS pinned,
       f.tenant, f.k AS k_declared, f.accepted_seq, f.release_seq,
       coalesce(l.last_ev, f.claim_seq) AS last_ev
FROM kv_claim_facts f
JOIN {_RUN_NUMBERS} n ON n.run_id = f.run_id
LEFT JOIN kv_claim_subs s ON s.run_id = f.run_id AND s.sub_seq = f.claim_seq
LEFT JOIN (SELECT run_id, claim_seq, max(seq) AS last_ev
           FROM (SELECT run_id, claim_seq, seq FROM kv_claim_ev
                 UNION ALL SELECT run_id, claim_seq, seq FROM kv_claim_binds)
           GROUP BY run_id, claim_seq) l ON l.run_id = f.run_id AND l.claim_seq = f.claim_seq
ORDER BY n.r, f.claim_seq
"""
_RUN_FACTS_SQL: Final[str] = ("SELECT * EXCLUDE (r) FROM kv_pass_facts WHERE r = $r "
                               "ORDER BY claim_seq")

# Each content hash of each run with the seq of the last event that names it, in that order:
# the pass marks a hash dead once its windows are past that seq (``_Run.forget``).
_HASH_LAST_SQL: Final[str] = f"""
CREATE OR REPLACE TEMP TABLE kv_hash_last AS
SELECT n.r, e.h, e.last_seq
FROM (SELECT run_id, block_hash AS h, max(seq) AS last_seq FROM events
      WHERE block_hash IS NOT NULL GROUP BY run_id, block_hash) e
JOIN {_RUN_NUMBERS} n ON n.run_id = e.run_id
ORDER BY n.r, e.last_seq
"""
_HASH_DEAD_SQL: Final[str] = ("SELECT h FROM kv_hash_last "
                              "WHERE r = $r AND last_seq > $lo AND last_seq <= $hi")

#: The most a run's pass held at once in the last ``build``: content-hash entries (live hashes
#: and those not yet collected), what the hash table's size follows; claim instances (those a
#: later event can reach and the younger ones an older reachable one keeps), what the slot and
#: instance tables' sizes follow.
HELD: dict[str, int] = {"hashes": 0, "instances": 0}

_LABEL_DICT = pa.array(["", *(LABEL_NAMES[i] for i in range(1, 6))], pa.string())


def _labels(codes: np.ndarray) -> pa.Array:
    """Label codes (severities) as a dictionary-encoded string column."""
    return pa.DictionaryArray.from_arrays(pa.array(codes.astype(np.int32)), _LABEL_DICT)


def _const(value: str, n: int) -> pa.Array:
    """``value`` repeated ``n`` times, dictionary-encoded (no Python list of n strings)."""
    return pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, dtype=np.int32)),
                                          pa.array([value], pa.string()))


def _np(col: Any, dtype: Any, fill: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(values, valid) of an Arrow column; NULLs become ``fill``."""
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    valid = (np.ones(len(col), dtype=bool) if col.null_count == 0
             else np.asarray(col.is_valid().to_numpy(zero_copy_only=False)))
    if col.null_count:
        col = col.fill_null(fill)
    return col.to_numpy(zero_copy_only=False).astype(dtype, copy=False), valid


def _opt(values: np.ndarray, valid: np.ndarray, typ: pa.DataType) -> pa.Array:
    return pa.array(values, type=typ, mask=None if valid.all() else ~valid)


def take_compact(col: pa.Array, idx: np.ndarray, valid: np.ndarray | None = None) -> pa.Array:
    """``col``'s values at ``idx`` (NULL where ``valid`` is False); a dictionary column comes
    back encoded over the values taken only.

    NOTE: a dictionary goes whole wherever its column goes (a Parquet dictionary page per row
    group; DuckDB read it whole for every chunk of an INSERT): a take of a run-wide dictionary
    (the run's claim ids: one per instance on traces with distinct ids) made each write cost
    the run's ids, the pass's writes the square of the run's length."""
    valid = np.ones(len(idx), dtype=bool) if valid is None else valid
    if not pa.types.is_dictionary(col.type):
        return col.take(pa.array(idx, mask=None if valid.all() else ~valid))
    pos = np.where(valid, idx, 0)
    ind = col.indices
    if ind.null_count:
        valid = valid & ind.is_valid().to_numpy(zero_copy_only=False)[pos]
        ind = ind.fill_null(0)
    local = np.zeros(len(idx), dtype=np.int32)
    used = np.zeros(0, dtype=np.int64)
    if valid.any():
        used, local[valid] = np.unique(ind.to_numpy()[pos[valid]], return_inverse=True)
    return pa.DictionaryArray.from_arrays(pa.array(local, mask=None if valid.all() else ~valid),
                                          col.dictionary.take(pa.array(used)))


def persistence(stmt: str, persist: bool) -> str:
    """``stmt`` creating its table as a table of the database file (``persist``: compressed as
    DuckDB writes it) or as a TEMP table (spilled uncompressed beyond ``memory_limit``)."""
    if persist:
        return stmt.replace("CREATE OR REPLACE TEMP TABLE ", "CREATE OR REPLACE TABLE ", 1)
    return stmt.replace("CREATE OR REPLACE TABLE ", "CREATE OR REPLACE TEMP TABLE ", 1)


class _Run:
    """One run's state between windows."""

    def __init__(self, con: Any, rid: str, r: int, unknown_from: int | None) -> None:
        self.rid = rid
        self.r = r   # the run's place in run_id order (``kv_hash_last``, ``kv_pass_facts``)
        self.con = con
        self.named_to = -(1 << 62)   # hashes last named at or before this seq are marked dead
        self.unknown_from = -1 if unknown_from is None else int(unknown_from)
        facts = con.sql(_RUN_FACTS_SQL, params={"r": r}).to_arrow_table()
        self.fseq = facts.column("claim_seq").to_numpy().astype(np.int64)
        # claim ids of the instances, dictionary-encoded: takes by instance are int takes
        self.fclaim = pc.dictionary_encode(facts.column("claim_id").combine_chunks())
        # what a loss_claims row repeats of its instance, strings dictionary-encoded: a column
        # is then an integer take by instance
        self.pair_facts = {
            name: (pc.dictionary_encode(col) if pa.types.is_string(col.type) else col)
            for name, col in ((name, facts.column(src).combine_chunks())
                              for name, src in PAIR_FACTS.items())}
        ni = len(self.fseq)
        # the run's claim ids, each once, sorted as DuckDB orders VARCHAR (UTF-8's byte order,
        # which is Arrow's); an id's code is its place here, found by Arrow (no Python object
        # per instance: this map lives as long as the run's pass)
        # NOTE: a claim instance always has an id (stage 02)
        distinct = pc.unique(facts.column("claim_id").combine_chunks())
        self.ids = distinct.take(pc.sort_indices(distinct)).cast(pa.string())
        self.rank = self.codes(facts.column("claim_id"))
        self.cur = np.full(max(1, len(self.ids)), -1, dtype=np.int64)
        self.k = facts.column("k").to_numpy().astype(np.int64)
        self.nsl = facts.column("n_slots").to_numpy().astype(np.int64)
        self.off = np.zeros(ni, dtype=np.int64)
        if ni:
            self.off[1:] = np.cumsum(self.nsl)[:-1]
        self.mode = np.array([mode_class(m) for m in facts.column("protection_mode").to_pylist()],
                             dtype=np.int64)
        self.submitted = facts.column("submitted").to_numpy(zero_copy_only=False).astype(np.int64)
        self.acc = facts.column("acc").to_numpy().astype(np.int64)
        self.rel = facts.column("rel").to_numpy().astype(np.int64)
        # claim identity (stage 02): rejection seqs, and the instance an id's events go back to
        self.rej = facts.column("rej").to_numpy().astype(np.int64)
        pl = facts.column("prev_live_seq").to_numpy().astype(np.int64)
        pj = np.searchsorted(self.fseq, pl)
        self.prev_live = np.where((pl >= 0) & (pj < ni)
                                  & (self.fseq[np.minimum(pj, max(ni - 1, 0))] == pl)
                                  if ni else np.zeros(0, bool), pj, -1).astype(np.int64)
        # the pinning instances' acceptances and releases (a release only after its
        # acceptance), sorted: how many pin at seq s is (#acceptances <= s) - (#releases <= s)
        pinned = (facts.column("pinned").to_numpy(zero_copy_only=False).astype(bool)
                  & (self.acc >= 0))
        self.pin_from = np.sort(self.acc[pinned])
        self.pin_to = np.sort(self.rel[pinned & (self.rel > self.acc)])
        self.relkind = np.array(
            [REL_EXPIRY if r == "claim_expired" else (REL_RELAXATION if r else REL_NONE)
             for r in facts.column("release_event").to_pylist()], dtype=np.int64)
        self.last_ev = facts.column("last_ev").to_numpy().astype(np.int64)
        # NOTE: the slot and instance tables hold the instances [ib, ihi) only, under local
        # indices (instance i is row i - ib, its slots start at off[i] - sb): an instance
        # enters when the pass reaches its claim_seq (``enter``) and leaves once no later
        # event can reach it (``leave``), so they follow the instances live, not the run's
        # length. int32 (a run's slots and instances stay below 2**31).
        self.ib = self.ihi = self.sb = 0
        self.SL = np.full((16, 5), -1, dtype=np.int32)
        self.IS = self._new_instances(16)
        self.C = np.zeros(NC, dtype=np.int64)
        self.C[C_HOOK] = -1
        self.prot = np.zeros(16, dtype=np.int64)
        self.dirty = np.zeros(16, dtype=np.int64)
        self.BS = np.zeros((0, 7), dtype=np.int64)
        self.block_map: dict[int, int] | None = None
        self.hkeys = np.zeros(1024, dtype=np.uint64)
        # NOTE: int32 (a run's live hashes stay below 2**31): the hash table and the per-hash
        # state follow the content resident, or bound and named again later (``forget``)
        self.hvals = np.full(1024, -1, dtype=np.int32)
        self.hused = np.zeros(2, dtype=np.int32)   # no free index before a rebuild
        self.HS = self._new_hashes(512)

    @staticmethod
    def _new_instances(n: int) -> np.ndarray:
        table = np.zeros((n, 9), dtype=np.int64)
        for col in (I_PRED_FROM, I_BREAK, I_MAT, I_SEEN, I_PROTPOS):
            table[:, col] = -1
        return table

    def _slot_end(self, i: int) -> int:
        """The global slot index after instance ``i - 1``'s slots (0 for ``i`` = 0)."""
        return int(self.off[i - 1] + self.nsl[i - 1]) if i > 0 else 0

    def enter(self, seq: int) -> None:
        """Take in the instances whose claim_seq is at or before ``seq`` (no event before an
        instance's claim_seq belongs to it)."""
        ihi = int(np.searchsorted(self.fseq, seq, side="right"))
        if ihi <= self.ihi:
            return
        n_inst, s_used = ihi - self.ib, self._slot_end(self.ihi) - self.sb
        s_need = self._slot_end(ihi) - self.sb
        if s_need > self.SL.shape[0]:
            sl = np.full((max(s_need, 2 * self.SL.shape[0]), 5), -1, dtype=np.int32)
            sl[:s_used] = self.SL[:s_used]
            self.SL = sl
        if n_inst <= self.IS.shape[0]:   # rows left behind by ``leave`` start afresh
            self.IS[self.ihi - self.ib:n_inst] = self._new_instances(1)
        else:
            cap = max(n_inst, 2 * self.IS.shape[0])
            table = self._new_instances(cap)
            table[:self.ihi - self.ib] = self.IS[:self.ihi - self.ib]
            self.IS = table
            for name in ("prot", "dirty"):
                arr = np.zeros(cap, dtype=np.int64)
                arr[:self.ihi - self.ib] = getattr(self, name)[:self.ihi - self.ib]
                setattr(self, name, arr)
        # NOTE: filled a chunk of instances at a time: int64 temporaries of many instances
        # would briefly take four times the rows themselves
        for i0 in range(self.ihi, ihi, SLOT_FILL_INSTANCES):
            i1 = min(ihi, i0 + SLOT_FILL_INSTANCES)
            s0, s1 = self._slot_end(i0) - self.sb, self._slot_end(i1) - self.sb
            inst = np.repeat(np.arange(i0, i1, dtype=np.int64), self.nsl[i0:i1])
            self.SL[s0:s1] = -1
            self.SL[s0:s1, S_INST] = inst - self.ib
            self.SL[s0:s1, S_POS] = np.arange(s0, s1, dtype=np.int64) + self.sb - self.off[inst]
        self.ihi = ihi
        self.C[C_NSLOTS] = s_need
        HELD["instances"] = max(HELD["instances"], n_inst)

    def leave(self, seq: int, sink: _Sink) -> None:
        """Let go of the oldest instances no event after ``seq`` can reach: none of their own
        claim events is later, no slot of theirs is bound to a hash held, and their predicate
        does not hold (so it cannot hold again, nor materialize)."""
        n = self.ihi - self.ib
        if n == 0:
            return
        linked = np.zeros(self._slot_end(self.ihi) - self.sb + 1, dtype=np.int64)
        np.cumsum(self.SL[:linked.size - 1, S_HASH] >= 0, out=linked[1:])
        first = self.off[self.ib:self.ihi] - self.sb
        counts = linked[first + self.nsl[self.ib:self.ihi]] - linked[first]
        # NOTE: strictly before ``seq``: the next window may repeat the seq it ended at
        gone = ((self.last_ev[self.ib:self.ihi] < seq) & (counts == 0)
                & (self.IS[:n, I_PRED] == 0))
        di = n if gone.all() else int(np.argmin(gone))
        if di == 0:
            return
        sink.late_of(self, self.ib, self.ib + di)
        ds = self._slot_end(self.ib + di) - self.sb
        s_used = self._slot_end(self.ihi) - self.sb
        self.SL[:s_used - ds] = self.SL[ds:s_used]
        self.SL[:s_used - ds, S_INST] -= di
        for col in (S_NEXT, S_PREV):
            links = self.SL[:s_used - ds, col]
            links[links >= 0] -= ds
        heads = self.HS[:self.hused[0], H_HEAD]
        heads[heads >= 0] -= ds
        self.IS[:n - di] = self.IS[di:n]
        self.prot[:self.C[C_NPROT]] -= di
        self.ib += di
        self.sb += ds
        self.C[C_NSLOTS] = s_used - ds

    def forget(self, seq: int) -> None:
        """Mark dead the hashes no event after ``seq`` names (the pass is past ``seq``); the
        next rebuild of the hash table forgets those without a copy, with their bindings."""
        dead = self.con.sql(_HASH_DEAD_SQL,
                            params={"r": self.r, "lo": self.named_to, "hi": seq}) \
            .to_arrow_table().column("h").to_numpy().astype(np.uint64)
        self.named_to = seq
        if dead.size:
            _mark_dead(self.hkeys, self.hvals, self.HS, dead)
        HELD["hashes"] = max(HELD["hashes"], int(self.hused[0] - self.hused[1]))

    def codes(self, claim_ids: pa.Array | pa.ChunkedArray) -> np.ndarray:
        """The codes of ``claim_ids`` (their places in ``ids``); -1 for an id not in the run's
        facts, or a null."""
        return pc.fill_null(pc.index_in(claim_ids, value_set=self.ids), -1) \
            .to_numpy().astype(np.int64)

    @staticmethod
    def _new_hashes(n: int) -> np.ndarray:
        hs = np.zeros((n, NH), dtype=np.int32)
        hs[:, H_HEAD] = -1
        return hs

    def blocks(self, bid: np.ndarray, ok: np.ndarray) -> np.ndarray:
        """Dense block indices (-1: no block): the id itself when ids are small, else a map."""
        if self.block_map is None and ok.any():
            lo, hi = int(bid[ok].min()), int(bid[ok].max())
            if lo < 0 or hi >= 1 << 26:
                self.block_map = {int(b): i for i, b in enumerate(self.BS[:, B_ID])} \
                    if self.BS.shape[0] else {}
        if self.block_map is None:
            idx = np.where(ok, bid, -1).astype(np.int64)
            top = int(idx.max()) + 1 if idx.size else 0
            if top > self.BS.shape[0]:
                old = self.BS.shape[0]
                bs = np.zeros((max(top, 2 * old), 7), dtype=np.int64)
                bs[:old] = self.BS
                bs[old:, B_HASH] = -1
                bs[old:, B_ID] = np.arange(old, bs.shape[0])
                self.BS = bs
            return idx
        idx = np.full(bid.shape[0], -1, dtype=np.int64)
        for j in np.flatnonzero(ok):
            b = int(bid[j])
            if b not in self.block_map:
                self.block_map[b] = len(self.block_map)
            idx[j] = self.block_map[b]
        if len(self.block_map) > self.BS.shape[0]:
            old = self.BS.shape[0]
            bs = np.zeros((len(self.block_map), 7), dtype=np.int64)
            bs[:old] = self.BS
            bs[old:, B_HASH] = -1
            self.BS = bs
            for b, i in self.block_map.items():
                self.BS[i, B_ID] = b
        return idx

    def border(self) -> np.ndarray:
        if self.block_map is None:
            return np.arange(self.BS.shape[0], dtype=np.int64)
        return np.argsort(self.BS[:, B_ID], kind="stable").astype(np.int64)


def _step_cut(step: np.ndarray, step_ok: np.ndarray) -> int:
    """Rows [0, cut) end at a step end (a stepless event or a change of step); 0 if none."""
    n = step.shape[0]
    if n == 0:
        return 0
    ends = ~step_ok[:-1] | ~step_ok[1:] | (step[:-1] != step[1:])
    idx = np.flatnonzero(ends)
    return int(idx[-1]) + 1 if idx.size else 0


class _Sink:
    """The pass's outputs, written as Parquet (``sink.ParquetSink``: one file per table, a view
    over it for the SQL stages) every ``sink.FLUSH_ROWS`` rows held, and at the end.

    It also holds the instances of the current run that materialized only after a
    ``loss_claims`` row of theirs was written: ``close`` gives ``loss_claims`` their
    ``materialized_seq`` (one row per instance, never the rows themselves: ``kv_late``).
    """

    def __init__(self, out: ParquetSink) -> None:
        self.out = out
        # instances of the current run with a loss_claims row written before they materialized
        self.pending = np.zeros(0, dtype=bool)
        self.late: list[pa.Table] = []

    def start_run(self, run: _Run) -> None:
        """Start holding the run's pending instances (none yet)."""
        self.pending = np.zeros(len(run.fseq), dtype=bool)

    def end_run(self, run: _Run) -> None:
        """Note the pending instances of the run that materialized later in it."""
        self.late_of(run, run.ib, run.ihi)

    def late_of(self, run: _Run, i0: int, i1: int) -> None:
        """Note the pending instances among ``[i0, i1)`` (held by ``run``: their state is final
        or the run ends) that materialized after their first loss_claims row was written."""
        late = i0 + np.flatnonzero(self.pending[i0:i1]
                                   & (run.IS[i0 - run.ib:i1 - run.ib, I_MAT] >= 0))
        if late.size:
            self.late.append(pa.table({
                "run_id": pa.array([run.rid] * late.size, pa.string()),
                "claim_seq": pa.array(run.fseq[late]),
                "materialized_seq": pa.array(run.IS[late - run.ib, I_MAT])}))

    def add(self, table: str, data: pa.Table) -> None:
        t0 = time.perf_counter()
        self.out.add(table, data)
        TIMINGS["write"] += time.perf_counter() - t0

    def close(self, con: Any) -> list[Path]:
        """Write what is held, make the views, and ``loss_claims``: the pass's rows with the
        late materializations; return the files written."""
        t0 = time.perf_counter()
        paths = self.out.close(con)
        TIMINGS["write"] += time.perf_counter() - t0
        if not self.late:
            con.execute("CREATE OR REPLACE TEMP VIEW loss_claims AS SELECT * FROM kv_loss_claims")
            return paths
        con.register("kv_late_in", pa.concat_tables(self.late))
        try:
            con.execute("CREATE OR REPLACE TEMP TABLE kv_late AS SELECT * FROM kv_late_in")
        finally:
            con.unregister("kv_late_in")
        self.late.clear()
        # NOTE: a join with one row per late instance (a few), not an UPDATE of the file's rows
        con.execute("""
            CREATE OR REPLACE TEMP VIEW loss_claims AS
            SELECT l.* REPLACE (coalesce(u.materialized_seq, l.materialized_seq)
                                AS materialized_seq)
            FROM kv_loss_claims l
            LEFT JOIN kv_late u ON u.run_id = l.run_id AND u.claim_seq = l.claim_seq""")
        return paths


def pass_rows(batch: pa.RecordBatch | pa.Table) -> pa.Table:
    """The rows of one batch of events (loader schema, ``PASS_COLUMNS`` at least) that the pass
    reads, as its input: ``event`` coded as ``ev`` (``EVENT_CODES``), and ``claim_id``,
    ``cause``, ``by_request_id``, ``request_id`` kept only on the events they belong to.

    NOTE: the event names are dictionary-encoded once per batch; every mask is a lookup of
    that small dictionary, not a string comparison per row.
    """
    enc = pc.dictionary_encode(batch.column("event"))
    if isinstance(enc, pa.ChunkedArray):
        enc = enc.combine_chunks()
    names = enc.dictionary.to_pylist()
    idx = enc.indices.to_numpy(zero_copy_only=False)
    code = np.array([EVENT_CODES.get(n, 0) for n in names] or [0], dtype=np.int8)[idx]
    keep = np.flatnonzero(code != 0)
    rows = pa.array(keep)
    cols: dict[str, Any] = {"seq": batch.column("seq").take(rows),
                            "step": batch.column("step").take(rows),
                            "ev": pa.array(code[keep])}
    for name in ("block_id", "block_hash", "claim_id", "position", "ts_ns", "cause",
                 "by_request_id", "request_id"):
        col = batch.column(name).take(rows)
        rule_ = _MASKED.get(name)
        if rule_ is not None and col.null_count < len(col):
            lut = np.array([rule_(n) for n in names] or [False], dtype=bool)
            mask = lut[idx[keep]]
            if not mask.all():
                col = pc.if_else(pa.array(mask), col, pa.scalar(None, col.type))
        cols[name] = col
    return pa.table(cols)


def _windows(batches: Iterable[pa.RecordBatch | pa.Table], window: int) -> Iterator[pa.Table]:
    """The pass's input in windows of about ``window`` rows, each ending at a step end (the
    last one at the end of the run); ``batches`` are a run's events in seq order."""
    held: list[pa.Table] = []
    n = 0
    for batch in batches:
        t = pass_rows(batch)
        if t.num_rows == 0:
            continue
        held.append(t)
        n += t.num_rows
        if n < window:
            continue
        w = pa.concat_tables(held).combine_chunks()
        step, ok = _np(w.column("step"), np.int64)
        cut = _step_cut(step, ok)
        if cut == 0:              # one step longer than the window: read on
            held = [w]
            continue
        yield w.slice(0, cut)
        rest = w.slice(cut)
        held, n = ([rest], rest.num_rows) if rest.num_rows else ([], 0)
    if n:
        yield pa.concat_tables(held).combine_chunks()


def _owners(t: pa.Table) -> np.ndarray:
    """Each row's request as a window-local code (-1: none): ``request_id``, else
    ``by_request_id`` (an eviction's). Only equality within a window is used."""
    col = pc.coalesce(t.column("request_id"), t.column("by_request_id"))
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    enc = pc.dictionary_encode(col)
    codes, ok = _np(enc.indices, np.int64, -1)
    return np.where(ok, codes, -1)


def _window(run: _Run, sink: _Sink, t: pa.Table) -> None:
    """Run the pass over one window (seq order, ending at a step end) and store its outputs."""
    n = t.num_rows
    seq = t.column("seq").to_numpy().astype(np.int64)
    step, step_ok = _np(t.column("step"), np.int64)
    ev = t.column("ev").to_numpy().astype(np.int64)
    bid, bok = _np(t.column("block_id"), np.int64)
    hbits, hok = _np(t.column("block_hash"), np.uint64)
    pos, pok = _np(t.column("position"), np.int64, -1)
    claim = t.column("claim_id").combine_chunks()
    code = np.full(n, -1, dtype=np.int64)
    if claim.null_count < n:
        enc = pc.dictionary_encode(claim).combine_chunks() if isinstance(
            claim, pa.ChunkedArray) else pc.dictionary_encode(claim)
        lut = run.codes(enc.dictionary) if len(enc.dictionary) else np.full(1, -1, np.int64)
        ind, iok = _np(enc.indices, np.int64)
        code = np.where(iok, lut[ind], -1)
    inst_of = _instances(seq, ev, code, run.cur, run.fseq, run.rej, run.prev_live)
    run.enter(int(seq[-1]))
    ib, ihi = run.ib, run.ihi
    if bool(((inst_of >= 0) & (inst_of < ib)).any()):   # ``leave`` let go of it: a bug
        raise RuntimeError(f"run {run.rid}: an event belongs to an instance already let go")
    inst_of = np.where(inst_of >= 0, inst_of - ib, -1)
    bidx = run.blocks(bid, bok)
    owner = _owners(t)
    t0 = time.perf_counter()
    L, P, A, AL, R, W, M, PH, X, Y, run.hkeys, run.hvals, run.hused, run.HS = _pass(
        seq, step, step_ok, ev, bidx, bid, hbits, hok, inst_of, pos, owner,
        run.hkeys, run.hvals, run.hused, run.BS, run.HS, run.SL, run.IS, run.C, run.prot,
        run.dirty, run.k[ib:ihi], run.off[ib:ihi] - run.sb, run.nsl[ib:ihi],
        run.mode[ib:ihi], run.submitted[ib:ihi], run.acc[ib:ihi], run.rel[ib:ihi],
        run.relkind[ib:ihi], run.rank[ib:ihi], run.border(), run.unknown_from)
    TIMINGS["loop"] += time.perf_counter() - t0
    # the pass's instance indices are local (row - ib); from here on they are the run's
    P[:, P_INST] += ib
    R[:, 0] += ib
    M[:, 0] += ib
    Y[:, 1] += ib
    AL += ib
    L[:, L_DINST] = np.where(L[:, L_DINST] >= 0, L[:, L_DINST] + ib, -1)
    rid = run.rid
    nl, npair = L.shape[0], P.shape[0]
    ts = t.column("ts_ns").combine_chunks()
    rows = L[:, L_ROW]
    real = rows >= 0
    take = pa.array(np.where(real, rows, 0))
    # a reset's synthetic losses take the reset's own ts_ns
    ts_rows = rows.copy()
    if nl and not real.all():
        # NOTE: a synthetic loss's seq is its reset's: the last reset row with that seq
        reset_rows = np.flatnonzero(ev == EV_RESET)
        at = np.searchsorted(seq[reset_rows], L[~real, L_SEQ], side="right") - 1
        ts_rows[~real] = reset_rows[at]
    loss_ts = ts.take(pa.array(ts_rows))
    cause = t.column("cause").combine_chunks().take(take)
    by_req = t.column("by_request_id").combine_chunks().take(take)
    if not real.all():   # a reset's synthetic losses (else no second copy of the strings)
        cause = pc.if_else(pa.array(real), cause, pa.scalar("reset"))
        by_req = pc.if_else(pa.array(real), by_req, pa.scalar(None, pa.string()))
    hash_ok = L[:, L_HASH_OK] == 1
    block_hash = _opt(L[:, L_HASH].view(np.uint64), hash_ok, pa.uint64())
    pair_inst = P[:, P_INST]
    # NOTE: the ids stay dictionary-encoded inside the list: DuckDB decodes them on insert
    claim_str = take_compact(run.fclaim, pair_inst) if npair else pa.array([], pa.string())
    offsets = np.append(L[:, L_P0], L[-1, L_P1] if nl else 0).astype(np.int32)
    if nl:
        offsets -= offsets[0]
    dinst = L[:, L_DINST]
    has_d = dinst >= 0
    step_arr = _opt(L[:, L_STEP], L[:, L_STEP_OK] == 1, pa.int64())
    # L1 (08_conformance.sql): a loss is covered when a bound instance was accepted before it;
    # covered_harm when one of those labels it harm. NOTE: conformance matched losses and
    # their pairs on (seq, block_id): a loss without a block id is never covered.
    loss_bid_ok = bok[rows] | ~real if nl else np.zeros(0, bool)
    pacc = run.acc[P[:, P_INST]]
    pcov = (pacc >= 0) & (pacc < P[:, P_SEQ])
    covered = np.zeros(nl, dtype=bool)
    covered[P[pcov, P_LOSS]] = True
    covered_harm = np.zeros(nl, dtype=bool)
    covered_harm[P[pcov & (P[:, P_LABEL] == HARM), P_LOSS]] = True
    losses = pa.table({
        "run_id": _const(rid, nl),
        "seq": pa.array(L[:, L_SEQ]),
        "ts_ns": loss_ts,
        "block_id": _opt(L[:, L_BID], loss_bid_ok, pa.int32()),
        "block_hash": block_hash,
        "cause": cause,
        "by_request_id": by_req,
        "label": _labels(L[:, L_LABEL]),
        "claim_ids": pa.ListArray.from_arrays(pa.array(offsets), claim_str),
        "decided_by_seq": _opt(L[:, L_DSEQ], L[:, L_DSEQ] >= 0, pa.int64()),
        "decided_by_claim_id": take_compact(run.fclaim, dinst, has_d)
        if len(run.fclaim) else pa.nulls(nl, pa.string()),
        "claim_seq": _opt(run.fseq[np.where(has_d, dinst, 0)] if len(run.fseq)
                          else np.zeros(nl, np.int64), has_d, pa.int64()),
        "was_resident": pa.array(L[:, L_RES] == 1),
        "synthetic": pa.array(L[:, L_SYN] == 1),
        "step": step_arr,
        "repaired_in_step": pa.array(L[:, L_REPAIRED] == 1),
        "reported_hash": _opt(L[:, L_REP].view(np.uint64), L[:, L_REP_OK] == 1, pa.uint64()),
        "held_hash": _opt(L[:, L_HELD].view(np.uint64), L[:, L_HELD_OK] == 1, pa.uint64()),
        "pinned_in_force": pa.array(pinned_in_force(run.pin_from, run.pin_to, L[:, L_SEQ])),
        "covered": pa.array(covered & loss_bid_ok),
        "covered_harm": pa.array(covered_harm & loss_bid_ok),
    })
    sink.add("kv_losses", losses)
    if npair:
        li = pa.array(P[:, P_LOSS])
        facts = run.pair_facts
        # NOTE: an instance materializes once (I_MAT never changes after): one not yet
        # materialized at the end of this window gets its seq when the run ends (_Sink.close)
        mat = run.IS[pair_inst - ib, I_MAT]
        known = mat >= 0
        sink.pending[pair_inst[~known]] = True
        before, after = P[:, P_BEFORE] == 1, P[:, P_AFTER] == 1
        sink.add("kv_loss_claims", pa.table({
            "run_id": _const(rid, npair),
            "seq": pa.array(P[:, P_SEQ]),
            "ts_ns": losses.column("ts_ns").take(li),
            "block_id": losses.column("block_id").take(li),
            "block_hash": losses.column("block_hash").take(li),
            "claim_id": claim_str,
            "claim_seq": pa.array(run.fseq[pair_inst]),
            "position": pa.array(P[:, P_POS].astype(np.int32)),
            "label": _labels(P[:, P_LABEL]),
            "decided_by_seq": _opt(P[:, P_DSEQ], P[:, P_DSEQ] >= 0, pa.int64()),
            "tenant": take_compact(facts["tenant"], pair_inst),
            "protection_mode": take_compact(facts["protection_mode"], pair_inst),
            "threshold_blocks": take_compact(facts["threshold_blocks"], pair_inst),
            "accepted_seq": take_compact(facts["accepted_seq"], pair_inst),
            "materialized_seq": _opt(mat, known, pa.int64()),
            "release_seq": take_compact(facts["release_seq"], pair_inst),
            "release_event": take_compact(facts["release_event"], pair_inst),
            "predicate_before": pa.array(before),
            "predicate_after": pa.array(after),
            "breaks_predicate": pa.array(before & ~after),
            "broken_seq": _opt(P[:, P_BROKEN], P[:, P_BROKEN] >= 0, pa.int64()),
            "by_request_id": losses.column("by_request_id").take(li),
            "step": losses.column("step").take(li),
            "repaired_in_step": pa.array(P[:, P_REPAIRED] == 1),
        }))
    if R.shape[0]:
        sink.add("kv_pred", pa.table({
            "run_id": _const(rid, R.shape[0]),
            "claim_id": take_compact(run.fclaim, R[:, 0]),
            "claim_seq": pa.array(run.fseq[R[:, 0]]),
            "from_seq": pa.array(R[:, 1]), "to_seq": pa.array(R[:, 2])}))
    if M.shape[0]:
        sink.add("kv_materialized", pa.table({
            "run_id": _const(rid, M.shape[0]),
            "claim_id": take_compact(run.fclaim, M[:, 0]),
            "claim_seq": pa.array(run.fseq[M[:, 0]]),
            "materialized_seq": pa.array(M[:, 1])}))
    if W.shape[0]:
        sink.add("kv_copies", pa.table({
            "run_id": _const(rid, W.shape[0]),
            "block_id": pa.array(W[:, 0].astype(np.int32)),
            "block_hash": pa.array(W[:, 1].view(np.uint64)),
            "start_seq": pa.array(W[:, 2]), "end_seq": pa.array(W[:, 3]),
            "end_kind": pa.array(["overwritten"] * W.shape[0], pa.string())}))
    request_id = t.column("request_id").combine_chunks()   # once, for the three tables below
    if PH.shape[0]:
        sink.add("kv_protected_hits", pa.table({
            "run_id": _const(rid, PH.shape[0]),
            "seq": pa.array(seq[PH]),
            "request_id": request_id.take(pa.array(PH))}))
    if X.shape[0]:
        xrows = pa.array(X[:, 0])
        sink.add("kv_hit_contradictions", pa.table({
            "run_id": _const(rid, X.shape[0]),
            "seq": pa.array(seq[X[:, 0]]),
            "block_id": pa.array(bid[X[:, 0]].astype(np.int32)),
            "block_hash": _opt(X[:, 1].view(np.uint64), X[:, 2] == 1, pa.uint64()),
            "held_hash": _opt(X[:, 3].view(np.uint64), X[:, 4] == 1, pa.uint64()),
            "request_id": request_id.take(xrows),
            "step": _opt(step[X[:, 0]], step_ok[X[:, 0]], pa.int64())}))
    if Y.shape[0]:
        sink.add("kv_release_freed", pa.table({
            "run_id": _const(rid, Y.shape[0]),
            "seq": pa.array(seq[Y[:, 0]]),
            "claim_seq": pa.array(run.fseq[Y[:, 1]]),
            "freed_blocks": pa.array(Y[:, 2])}))
    if A.shape[0]:
        loff = np.append(A[:, A_L0], A[-1, A_L1]).astype(np.int32)
        loff -= loff[0]
        # the claim ids of those instances, distinct and in order (sorted ids: rank order)
        id_codes, id_off = distinct_sorted(run.rank[AL] if AL.size else np.zeros(0, np.int64),
                                           loff)
        ids_used, id_local = np.unique(id_codes, return_inverse=True)   # see ``take_compact``
        sink.add("kv_admission_state", pa.table({
            "run_id": _const(rid, A.shape[0]),
            "seq": pa.array(A[:, A_SEQ]),
            "request_id": request_id.take(pa.array(A[:, A_ROW])),
            "protected_blocks": pa.array(A[:, A_PROT]),
            "protected_claim_seqs": pa.ListArray.from_arrays(
                pa.array(loff), pa.array(run.fseq[AL] if AL.size else np.zeros(0, np.int64))),
            "protected_claim_ids": pa.ListArray.from_arrays(
                pa.array(id_off), pa.DictionaryArray.from_arrays(
                    pa.array(id_local.astype(np.int32)), run.ids.take(pa.array(ids_used)))),
            "cached_blocks": pa.array(A[:, A_CACHED]),
            "evictable_blocks": pa.array(A[:, A_EVICTABLE]),
            "held_blocks": pa.array(A[:, A_HELD]),
            "live_blocks": pa.array(A[:, A_LIVE])}))


def _finish(run: _Run, sink: _Sink) -> None:
    """Open predicate intervals end with the run (to_seq NULL); late materializations are
    noted for ``loss_claims``."""
    sink.end_run(run)
    open_ = run.ib + np.flatnonzero(run.IS[:run.ihi - run.ib, I_PRED] == 1)
    if open_.size:
        sink.add("kv_pred", pa.table({
            "run_id": _const(run.rid, open_.size),
            "claim_id": take_compact(run.fclaim, open_),
            "claim_seq": pa.array(run.fseq[open_]),
            "from_seq": pa.array(run.IS[open_ - run.ib, I_PRED_FROM]),
            "to_seq": pa.nulls(open_.size, pa.int64())}))


def build(con: Any, folder: str | Path, *,
          sources: Callable[[str], Iterable[pa.RecordBatch]] | None = None,
          window: int | None = None, progress: Callable[[int], None] | None = None,
          persist: bool = False) -> list[Path]:
    """Run the labelling pass over every run of ``kv_runs`` (needs ``kv_claim_facts``); write
    the tables listed in the module docstring (except ``losses``, which stage 04's SQL
    selects from ``kv_losses``) as Parquet files in ``folder``, each read through a view of its
    name (``sink.ParquetSink``); return the files. Its own inputs are TEMP tables unless
    ``persist`` (``persistence``).

    ``sources(run_id)`` yields the run's events (loader schema, ``PASS_COLUMNS`` at least) in
    seq order, e.g. straight from its Parquet file; without it they are read from ``events``.
    ``window``: rows passed at once (default ``WINDOW_ROWS``); the results never depend on it.
    """
    window = WINDOW_ROWS if window is None else window
    schemas = {created(ddl): ddl_schema(con, ddl) for ddl in DDL}
    schemas["kv_loss_claims"] = ddl_schema(con, LOSS_CLAIMS_DDL)
    runs = con.execute("SELECT run_id, unknown_from_seq FROM kv_runs ORDER BY run_id").fetchall()
    sink = _Sink(ParquetSink(folder, schemas))
    # NOTE: the pass's own inputs (kv_hash_last, kv_pass_facts) are stored in their ORDER BY,
    # what a zonemap prunes the per-run and per-window reads on
    keep_order = con.execute(
        "SELECT current_setting('preserve_insertion_order')").fetchall()[0][0]
    con.execute("SET preserve_insertion_order = true")
    HELD["hashes"] = HELD["instances"] = 0
    try:
        con.execute(persistence(_HASH_LAST_SQL, persist))
        con.execute(persistence(_FACTS_SQL, persist))
        for r, (rid, unknown_from) in enumerate(runs):
            run = _Run(con, rid, r, unknown_from)
            sink.start_run(run)
            # NOTE: without files, the run's events are fetched whole (they are an in-memory
            # table then): an open reader would block the queries the pass makes per window
            batches = (sources(rid) if sources is not None else
                       con.sql(_RUN_SQL, params={"rid": rid}).to_arrow_table()
                       .to_batches(min(window, 1 << 16)))
            for t in _timed(_windows(batches, window), "input"):
                s = t.column("seq").to_numpy()
                if t.num_rows > 1 and not bool(np.all(s[1:] >= s[:-1])):
                    raise ValueError(f"run {rid}: events not in seq order")
                t0 = time.perf_counter()
                inner = TIMINGS["loop"] + TIMINGS["write"]
                _window(run, sink, t)
                # NOTE: up to the seq before the window's last: the next window may repeat it
                run.forget(int(s[-1]) - 1)
                run.leave(int(s[-1]), sink)
                TIMINGS["outputs"] += (time.perf_counter() - t0
                                       - (TIMINGS["loop"] + TIMINGS["write"] - inner))
                if progress is not None:
                    progress(t.num_rows)
            _finish(run, sink)
        paths = sink.close(con)
        con.execute("DROP TABLE IF EXISTS kv_hash_last")
        con.execute("DROP TABLE IF EXISTS kv_pass_facts")
    finally:
        con.execute(f"SET preserve_insertion_order = {bool(keep_order)}")
    return paths
