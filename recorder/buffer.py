"""The recorder's hot path: an in-memory event buffer drained by a background writer thread.

``EventBuffer.emit(event, **fields)`` is what the engine calls. It only stamps ``seq`` and
``ts_ns`` and appends to four pending lists under a lock: no validation, no Arrow work.
``EventBuffer.emit_many(event, n, fields)`` records ``n`` events of one kind from one hook call
as ONE pending entry whose field values are columns (lists of length ``n``) or scalars shared by
all ``n`` rows: a whole allocation, free list or cache step costs one append, not ``n``. A
daemon thread wakes every ``flush_interval_s`` (or as soon as ``batch_events`` entries are
waiting), expands, validates and converts the pending events column-wise into
``pa.RecordBatch``es and hands them to a ``RunWriter``.

The engine's own hot path stages instead of emitting: ``EventBuffer.stage`` is a bare
``list.append`` of one flat tuple per hook call (``(event, 1, ts_ns, fields)`` for one event;
``(event, n, ts_ns, layout, *values)`` for ``n`` events, see ``stage``), with no lock, no seq
and no Python frame of the buffer's own. Staged entries are moved into the pending lists, one
``_Staged`` group per scheduler step (taking consecutive seqs for all its events), under the lock
at the next ``emit``/``emit_many`` call or writer-thread drain, or once ``_MOVE_EVERY`` entries
are staged, whichever comes first; the writer thread expands each group back into entries.

The engine's scheduler step: ``advance_step()`` (called once per ``schedule()``) stages a step
mark (a constant: no lock, no seq); the move turns each into a mark ``(first seq of the step,
step)`` and the writer thread fills the ``step`` column of every event from those marks (a
vectorised search by ``seq``), so stamping the step costs the hot path one ``list.append``. A
buffer built with ``step=None`` writes null steps (importers).

Block hashes: a ``bytes`` value in ``block_hash`` is vLLM's ``BlockHashWithGroupId`` (the digest
then a 4-byte group id) and in ``parent_hash`` a plain ``BlockHash``; the writer thread turns
them into the 64-bit integers of the schema (the digest's low 64 bits, like vLLM's own KV
events), vectorised, so the engine never converts a hash.

NOTE: invariants
- ``seq`` is strictly increasing from 0 and every seq is accounted for: it is either written,
  or covered by a ``recorder_gap`` event written later (``first_seq..last_seq``);
- seqs follow the order of the calls: staged entries get their seqs before any later
  ``emit``/``emit_many``/step mark takes one (each of those moves the staged entries first);
- ``run_started`` is seq 0 (emitted by the constructor from the writer's run facts) and
  ``run_finished`` is the last event (emitted by ``close()``);
- memory is bounded: at most ``capacity`` pending entries (an entry is one event, or the
  events of one ``emit_many`` call, at most one per block of the pool, or one staged group,
  at most one scheduler step's hooks) are waiting (pending or being converted), and at most
  ``_MOVE_EVERY`` entries staged after a step mark; past
  that, events are dropped and counted, and the next accepted event is preceded by a
  ``recorder_gap`` (reason ``buffer_full``) covering the dropped span;
- ``emit`` never raises into the caller and never blocks on I/O; every internal failure is
  caught and counted in the manifest's ``recorder_errors`` (a bad event becomes a
  ``recorder_gap`` with reason ``invalid_event``; a failed write, one with ``write_failed``).
"""

from __future__ import annotations

import atexit
import bisect
import os
import threading
import time
import weakref
from itertools import repeat
from operator import itemgetter
from typing import Any, Final

import pyarrow as pa

from kvclaims.contract.batches import KINDS as _KINDS
from kvclaims.contract.batches import build_batch, value_problem
from kvclaims.contract.schema import EVENTS, RECORDER_VERSION, SCHEMA_VERSION, InputError
from kvclaims.contract.trace_writer import RunWriter

# Pending events as four parallel lists: seqs, ts_ns, event names, field dicts (the emit()
# kwargs). NOTE: parallel lists, not a tuple per event: the kwargs dict of ints and strings is
# untracked by the cyclic GC, a tuple holding it is not, and thousands of tracked survivors
# would trigger full collections of the engine's whole heap.
PendingLists = tuple[list[int], list[int], list[str], list[dict[str, Any]]]

_monotonic_ns = time.monotonic_ns
_ALLOWED: Final[dict[str, frozenset[str]]] = {ev: frozenset(f) for ev, f in EVENTS.items()}
_MAX_ERROR_SAMPLES: Final[int] = 10
_RUN_STARTED_FACTS: Final[tuple[str, ...]] = (
    "runtime", "runtime_version", "model", "block_size", "num_blocks", "usable_blocks", "policy",
    "max_num_batched_tokens", "max_num_seqs", "max_defer_steps", "max_defer_s")


# -- validation of pending entries (run on the writer thread) -----------------------------

def event_problem(event: Any, fields: dict[str, Any]) -> str | None:
    """Describe why one pending event cannot be written, or None if it can."""
    if _is_bulk(event):
        fields = dict(fields)
        try:
            _expand(([0], [0], [event], [fields]))
        except Exception as exc:  # noqa: BLE001 - any reason makes the entry unwritable
            return f"event {event[0]!r} x{event[1]}: {exc}"
        for name, value in fields.items():
            for v in (value if isinstance(value, _COLUMN_TYPES) and _KINDS.get(name) != "list"
                      else [value]):
                problem = value_problem(name, v)
                if problem:
                    return f"event {event[0]!r}: {problem}"
        return None
    allowed = _ALLOWED.get(event) if isinstance(event, str) else None
    if allowed is None:
        return f"unknown event {event!r}"
    for name, value in fields.items():
        if name not in allowed:
            return f"field '{name}' does not belong to event '{event}'"
        problem = value_problem(name, value)
        if problem:
            return f"event '{event}': {problem}"
    return None


# NOTE: a pending ``emit_many`` entry's event slot is a plain ``(name, n)`` tuple and its
# columns are tuples (or lists, converted by the caller's choice): plain tuples and dicts of
# ints, bytes, str and None are untracked by the cyclic GC at its first pass, so thousands of
# pending entries never make the engine's full collections walk them.
def _is_bulk(event: Any) -> bool:
    return event.__class__ is tuple


def _entry_len(event: Any) -> int:
    """How many events (seqs) one pending entry holds."""
    if event.__class__ is tuple:
        return event[1]
    return int(event) if event.__class__ is _Staged else 1


class _Staged(int):
    """The event slot of a pending entry holding staged entries: how many events they hold
    (its fields slot is their list).

    NOTE: an int subclass, built in C (no Python ``__init__``) once per move; never reaches
    validation or conversion: ``_unstage`` expands it first.
    """

    __slots__ = ()


_STAGED_N = itemgetter(1)


class _StepMark:
    """The type of ``_STEP_MARK``: compares equal to nothing but itself (``list.index`` finds
    it by identity)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<step mark>"


# NOTE: staged by ``advance_step`` (one shared constant: nothing built per step); steps are
# consecutive, so the mark needs no number: the move counts them
_STEP_MARK: Final = _StepMark()
# staged entries after which ``advance_step`` moves them itself (bounds the staged list when
# nothing else moves it, e.g. a writer thread stalled in a slow write)
_MOVE_EVERY: Final[int] = 4096
_MALFORMED: Final[str] = "malformed_staged_entry"  # no event has it: the entry is gapped


def _staged_len(entry: Any) -> int:
    """How many events a staged entry claims (1 when its count is unusable)."""
    try:
        n = entry[1]
    except Exception:  # noqa: BLE001 - a malformed entry still takes one seq
        return 1
    return n if n.__class__ is int and n >= 1 else 1


def layout(scalars: tuple[str, ...], columns: tuple[str, ...]) -> tuple[tuple[str, ...],
                                                                        tuple[str, ...]]:
    """The layout of a staged entry for ``n`` events: its scalar fields (one value shared by
    all ``n``), then its column fields (``n`` values each, one after the other).

    NOTE: built once per event kind at import (a constant), never per entry.
    """
    return (tuple(scalars), tuple(columns))


def _layout_fields(entry: tuple[Any, ...], n: int) -> dict[str, Any]:
    """The fields of a staged entry for ``n`` events: each scalar once, each column as the
    tuple of its ``n`` values (``emit_many``'s fields, as a dict).

    A malformed entry (a value count that does not match its layout) gets a field no event
    carries, so the writer drops it and covers its seqs with a ``recorder_gap``.

    NOTE: runs on the writer thread, but every container it builds lives until the chunk is
    written, and each counts towards the cyclic GC's next collection, which often falls on the
    engine's thread: one dict plus one tuple per column per entry (no ``(name, value)`` pair
    tuples, no copy of the values).
    """
    spec = entry[3]
    if spec.__class__ is not tuple or len(spec) != 2:
        return {_MALFORMED: 0}
    scalars, columns = spec
    k = len(scalars)
    if len(entry) != 4 + k + n * len(columns):
        return {_MALFORMED: len(entry) - 4}
    fields = dict(zip(scalars, entry[4:4 + k]))
    start = 4 + k
    for name in columns:
        fields[name] = entry[start:start + n]
        start += n
    return fields


# NOTE: one ``(event, n)`` slot per distinct pair, shared by every entry that has it: looking
# one up builds a temporary tuple (freed at once), keeping one per entry would not be
_EVENT_SLOTS: dict[tuple[Any, int], tuple[Any, int]] = {}
_MAX_EVENT_SLOTS: Final[int] = 65536


def _event_slot(name: Any, n: int) -> tuple[Any, int]:
    """The shared ``(name, n)`` event slot of an ``n``-event entry."""
    key = (name, n)
    slot = _EVENT_SLOTS.get(key)
    if slot is None:
        if len(_EVENT_SLOTS) >= _MAX_EVENT_SLOTS:
            _EVENT_SLOTS.clear()
        slot = _EVENT_SLOTS[key] = key
    return slot


def _unstage(pending: PendingLists) -> PendingLists:
    """Expand staged groups into ordinary entries (singles and ``emit_many`` entries)."""
    seqs, ts, events, field_dicts = pending
    if not any(e.__class__ is _Staged for e in events):
        return pending
    out: PendingLists = ([], [], [], [])
    o_seq, o_ts, o_ev, o_f = (lst.append for lst in out)
    for seq, t, event, fields in zip(seqs, ts, events, field_dicts):
        if event.__class__ is not _Staged:
            o_seq(seq)
            o_ts(t)
            o_ev(event)
            o_f(fields)
            continue
        for entry in fields:
            n = _staged_len(entry)
            try:
                entry_ts = entry[2]
                if entry[3].__class__ is dict and n == 1:  # one event: (event, 1, ts, fields)
                    name, entry_fields = entry[0], entry[3]
                else:  # n events: (event, n, ts, layout, *scalars, *column, *column, ...)
                    name, entry_fields = _event_slot(entry[0], n), _layout_fields(entry, n)
            except Exception:  # noqa: BLE001 - a malformed entry: dropped and gapped
                entry_ts, name, entry_fields = t, (_MALFORMED, n), {_MALFORMED: 0}
            o_seq(seq)
            o_ts(entry_ts)
            o_ev(name)
            o_f(entry_fields)
            seq += n
    return out


_COLUMN_TYPES = (list, tuple, range)


def _check_names(events: list[Any], field_dicts: list[dict[str, Any]]) -> None:
    for event, names in set(zip(events, map(tuple, field_dicts))):
        allowed = _ALLOWED.get(event)
        if allowed is None:
            raise KeyError(f"unknown event {event!r}")
        if not allowed.issuperset(names):
            raise KeyError(f"event {event!r} has fields it may not carry")


def _expand(pending: PendingLists) -> tuple[list[int], list[int], list[str],
                                            dict[str, list[Any]]]:
    """Expand pending entries (single events and ``emit_many`` entries) into row columns.

    NOTE: runs of single events go through C-level ``map`` passes; each bulk entry extends the
    columns by its lists (or its scalar repeated), so the Python work is per entry, not per row.
    """
    seqs, ts, events, field_dicts = pending
    bulk_at = [i for i, e in enumerate(events) if e.__class__ is tuple]
    if bulk_at:
        # bulk entries hold their columns as a tuple of (name, values) pairs (see emit_many)
        field_dicts = [dict(f) if f.__class__ is tuple else f for f in field_dicts]
    if not bulk_at:
        _check_names(events, field_dicts)
        used = set().union(*field_dicts)
        # NOTE: map(dict.get, ...) runs the per-event loop in C
        return seqs, ts, events, {name: list(map(dict.get, field_dicts, repeat(name)))
                                  for name in used}
    out_seq: list[int] = []
    out_ts: list[int] = []
    out_ev: list[str] = []
    singles = [i for i in range(len(events)) if events[i].__class__ is not tuple]
    _check_names([events[i] for i in singles], [field_dicts[i] for i in singles])
    for i in bulk_at:
        name, n = events[i]
        allowed = _ALLOWED.get(name)
        if allowed is None:
            raise KeyError(f"unknown event {name!r}")
        if not allowed.issuperset(field_dicts[i]):
            raise KeyError(f"event {name!r} has fields it may not carry")
        for key, value in field_dicts[i].items():
            if isinstance(value, _COLUMN_TYPES) and _KINDS[key] != "list" and len(value) != n:
                raise ValueError(f"event {name!r}: column '{key}' has {len(value)} values "
                                 f"for {n} events")
    used = set().union(*field_dicts)
    columns: dict[str, list[Any]] = {name: [] for name in used}
    bulk_set = set(bulk_at)
    i = 0
    while i < len(events):
        if i in bulk_set:
            name, n = events[i]
            out_seq.extend(range(seqs[i], seqs[i] + n))
            out_ts.extend(repeat(ts[i], n))
            out_ev.extend(repeat(name, n))
            fields = field_dicts[i]
            for key, col in columns.items():
                value = fields.get(key)
                if isinstance(value, _COLUMN_TYPES) and _KINDS[key] != "list":
                    col.extend(value)
                else:
                    col.extend(repeat(value, n))
            i += 1
            continue
        j = i
        while j < len(events) and j not in bulk_set:
            j += 1
        out_seq.extend(seqs[i:j])
        out_ts.extend(ts[i:j])
        out_ev.extend(events[i:j])
        run = field_dicts[i:j]
        for key, col in columns.items():
            col.extend(map(dict.get, run, repeat(key)))
        i = j
    return out_seq, out_ts, out_ev, columns


def pending_to_batch(pending: PendingLists, run_id: str,
                     step_marks: list[tuple[int, int]] | None = None) -> pa.RecordBatch:
    """Convert pending entries column-wise into a batch; raises if any event is bad.

    NOTE: the fast path checks each distinct (event, field names) combination once and value
    types per column, so its Python work is a few C-level passes over the lists; the caller
    falls back to ``event_problem`` per entry only when this raises.
    """
    seqs, ts, events, columns = _expand(pending)
    return build_batch(seqs, ts, events, run_id, columns, step_marks)


def _slice(pending: PendingLists, start: int, stop: int) -> PendingLists:
    return (pending[0][start:stop], pending[1][start:stop], pending[2][start:stop],
            pending[3][start:stop])


def _spans(seqs: list[int]) -> list[tuple[int, int]]:
    """Group sorted seqs into runs of consecutive integers: [3,4,5,9] -> [(3,5),(9,9)]."""
    spans: list[tuple[int, int]] = []
    for s in seqs:
        if spans and spans[-1][1] == s - 1:
            spans[-1] = (spans[-1][0], s)
        else:
            spans.append((s, s))
    return spans


# -- the buffer -------------------------------------------------------------------------------

class _State:
    """The buffer's mutable counters, shared by the ``emit`` closure and the writer thread.

    NOTE: every field is read and written under ``EventBuffer._lock``. ``limit`` folds three
    conditions into the one comparison the hot path makes: it is ``capacity - inflight`` while
    the buffer is open and no gap is pending, and -1 otherwise (closed, or a gap to emit), so
    every emit then takes the slow path.
    """

    __slots__ = ("next_seq", "limit", "capacity", "inflight", "gap_first", "gap_last",
                 "dropped", "closed", "after_close")

    def __init__(self, capacity: int) -> None:
        self.next_seq = 0
        self.capacity = capacity
        self.inflight = 0          # taken from pending, not yet written
        self.limit = capacity
        self.gap_first: int | None = None  # first dropped seq not yet covered by a gap
        self.gap_last = 0
        self.dropped = 0
        self.closed = False
        self.after_close = 0       # emits ignored after close (no seq consumed)

    def update_limit(self) -> None:
        self.limit = (-1 if self.closed or self.gap_first is not None
                      else self.capacity - self.inflight)


class EventBuffer:
    """Buffer events in memory and write them in the background through a ``RunWriter``.

    The constructor emits ``run_started`` (seq 0) from the writer's run facts, unless
    ``emit_run_started`` is False (then the caller's first event is seq 0); ``close()`` emits
    ``run_finished`` and finishes the run directory. ``close()`` is also registered with
    ``atexit``.
    """

    def __init__(self, writer: RunWriter, run_id: str, *, capacity: int = 1_000_000,
                 flush_interval_s: float = 0.2, batch_events: int = 65536,
                 emit_run_started: bool = True, step: int | None = None) -> None:
        if run_id != writer.run_id:
            raise InputError(f"run_id {run_id!r} differs from the writer's {writer.run_id!r}")
        if capacity < 1 or batch_events < 1 or flush_interval_s <= 0:
            raise InputError("capacity and batch_events must be >= 1, flush_interval_s > 0")
        self.writer = writer
        self.run_id = run_id
        self._batch_events = int(batch_events)
        self._flush_interval_s = float(flush_interval_s)
        self._lock = threading.Lock()          # guards the pending lists and _state
        self._write_lock = threading.Lock()    # serialises drains (thread, flush, close)
        self._close_lock = threading.Lock()
        self._state = _State(int(capacity))
        # NOTE: the pending lists are never replaced (drains copy and clear them), so the hot
        # path can hold their bound append methods.
        self._p_seq: list[int] = []
        self._p_ts: list[int] = []
        self._p_ev: list[str] = []
        self._p_fields: list[dict[str, Any]] = []
        # NOTE: the engine's staged entries (see ``stage``); appended to without the lock (a
        # list append is atomic under the GIL), taken under the lock by ``_move_staged`` with
        # a slice and a ``del`` of that slice, so an append racing with a move is never lost.
        self._staged: list[tuple[Any, ...]] = []
        self.stage = self._staged.append
        # (first seq of a step, step), ascending; pruned as the writer moves past them
        self._marks: list[tuple[int, int]] = [] if step is None else [(0, int(step))]
        self._step = step
        self._marked_step = step  # the step of the last mark moved into ``_marks``
        self._errors = 0
        self._error_samples: list[str] = []
        self._pid = os.getpid()
        self._wake = threading.Event()
        self._stop = threading.Event()
        # NOTE: the instance attribute shadows the documented method below: a closure over
        # locals costs about a third less per call than a method reading self.* attributes.
        self.emit = self._make_emit()  # type: ignore[method-assign]
        self.emit_many = self._make_emit_many()  # type: ignore[method-assign]
        self.emit_staged = self._make_emit_staged()  # type: ignore[method-assign]
        if emit_run_started:
            self.emit("run_started", **self._run_started_fields())
        self._thread = threading.Thread(target=self._run, name=f"kvclaims-recorder-{run_id}",
                                        daemon=True)
        self._thread.start()
        atexit.register(self.close)
        ref = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _disable_in_child(ref))

    # -- hot path ----------------------------------------------------------------------------
    def emit(self, event: str, **fields: Any) -> None:
        """Record one event. Never raises, never waits for I/O.

        ``fields`` are the event's fields (docs/design.md, "Event vocabulary"); they are
        validated later on the writer thread, and an invalid event is replaced by a
        ``recorder_gap``.
        """
        self._make_emit()(event, **fields)  # pragma: no cover - shadowed per instance

    def _make_emit(self) -> Any:
        lock = self._lock
        state = self._state
        seqs = self._p_seq
        add_seq, add_ts = seqs.append, self._p_ts.append
        add_ev, add_fields = self._p_ev.append, self._p_fields.append
        wake_at = self._batch_events - 1
        wake = self._wake.set
        slow = self._emit_slow
        note_error = self._note_error
        clock = _monotonic_ns
        staged = self._staged
        move = self._move_staged

        def emit(event: str, **fields: Any) -> None:
            """Record one event. Never raises, never waits for I/O."""
            try:
                ts = clock()
                with lock:
                    if staged:
                        move()
                    n = len(seqs)
                    if n >= state.limit:
                        slow(ts, event, fields)
                        return
                    seq = state.next_seq
                    state.next_seq = seq + 1
                    add_seq(seq)
                    add_ts(ts)
                    add_ev(event)
                    add_fields(fields)
                    if n == wake_at:
                        wake()
            except Exception as exc:  # NOTE: the engine must never see a recorder failure
                note_error(f"emit: {exc!r}")

        return emit

    def emit_many(self, event: str, n: int,
                  fields: dict[str, Any] | tuple[tuple[str, Any], ...]) -> None:
        """Record ``n`` events of one kind as one entry. Never raises, never waits for I/O.

        ``fields`` is a dict, or the same as a tuple of ``(name, value)`` pairs (what the
        engine's hooks pass: nothing to convert). Each value is a tuple (or list, or ``range``)
        of ``n`` values, one per event, or one value shared by all ``n`` (a list-typed column,
        ``blocking_claim_ids``, is always shared). Tuples keep the pending entry invisible to
        the cyclic GC. The events take ``n`` consecutive seqs and one ``ts_ns``.
        """
        self._make_emit_many()(event, n, fields)  # pragma: no cover - shadowed per instance

    def _make_emit_many(self) -> Any:
        lock = self._lock
        state = self._state
        seqs = self._p_seq
        add_seq, add_ts = seqs.append, self._p_ts.append
        add_ev, add_fields = self._p_ev.append, self._p_fields.append
        wake_at = self._batch_events - 1
        wake = self._wake.set
        slow = self._emit_slow
        note_error = self._note_error
        clock = _monotonic_ns
        staged = self._staged
        move = self._move_staged

        def emit_many(event: str, n: int, fields: Any) -> None:
            """Record ``n`` events of one kind as one entry. Never raises."""
            if n <= 0:
                return
            try:
                ts = clock()
                entry = (event, n)
                # NOTE: pairs, not the dict: a tuple of tuples of untracked values is untracked
                # by the GC's first pass; a dict holding tuples would stay tracked while pending.
                # The engine's hooks pass the pairs themselves (no dict to build and convert).
                if fields.__class__ is dict:
                    fields = tuple(fields.items())
                with lock:
                    if staged:
                        move()
                    k = len(seqs)
                    if k >= state.limit:
                        slow(ts, entry, fields)
                        return
                    seq = state.next_seq
                    state.next_seq = seq + n
                    add_seq(seq)
                    add_ts(ts)
                    add_ev(entry)
                    add_fields(fields)
                    if k == wake_at:
                        wake()
            except Exception as exc:  # NOTE: the engine must never see a recorder failure
                note_error(f"emit_many: {exc!r}")

        return emit_many

    def stage(self, entry: tuple[Any, ...]) -> None:
        """Stage one entry from the engine's hot path: no lock, no seq yet.

        ``entry`` is ``(event, 1, ts_ns, fields)`` for one event (``fields`` a dict, as
        ``emit``'s kwargs), or ``(event, n, ts_ns, layout, *scalars, *column, *column, ...)``
        for ``n`` events (``layout`` from ``layout()``: the scalar values in its order, then
        each column's ``n`` values in its order, all flattened into the one tuple);
        ``ts_ns`` is ``time.monotonic_ns()`` at the call; ``n >= 1``. The entry takes its seqs,
        in staging order, when the staged entries are moved (next ``emit``/``emit_many``, drain,
        or ``_MOVE_EVERY`` entries); it is validated on the writer thread like any other.

        NOTE: the instance attribute is the staged list's own bound ``append`` (a C call: the
        hook pays no Python frame of the buffer's). One flat tuple per entry, no nested pairs
        or column tuples: every tuple built in the engine and kept until the writer drains
        counts towards the cyclic GC's next collection, and those collections were a third
        of the recorder's cost inside the scheduler.
        """
        self._staged.append(entry)  # pragma: no cover - shadowed per instance

    def emit_staged(self, event: str, **fields: Any) -> None:
        """``emit``'s signature, staged (``stage``): for the engine thread's rarer events, so
        they keep their order among the staged ones without taking the lock."""
        self._make_emit_staged()(event, **fields)  # pragma: no cover - shadowed per instance

    def _make_emit_staged(self) -> Any:
        add = self._staged.append
        clock = _monotonic_ns

        def emit_staged(event: str, **fields: Any) -> None:
            """Stage one event. Never raises, never waits for I/O."""
            add((event, 1, clock(), fields))

        return emit_staged

    def _move_staged(self) -> None:
        """Move every staged entry into the pending lists, one group entry per step; caller holds
        _lock.

        NOTE: each step's entries go through the same checks as one ``emit_many`` (closed, full,
        a gap to write first) and take consecutive seqs, in staging order; each staged step mark
        becomes a mark ``(next seq, step)``, exactly where ``advance_step`` staged it.
        """
        staged = self._staged
        k = len(staged)
        group = staged[:k]
        del staged[:k]
        if not group:
            return
        start = 0
        while True:
            try:
                end = group.index(_STEP_MARK, start)
            except ValueError:  # NOTE: the usual end: no (further) step mark
                self._move_group(group if start == 0 else group[start:])
                return
            if end > start:
                self._move_group(group[start:end])
            step = 0 if self._marked_step is None else self._marked_step + 1
            self._marked_step = step
            self._marks.append((self._state.next_seq, step))
            start = end + 1
            if start == k:
                return

    def _move_group(self, group: list[Any]) -> None:
        """Move one step's staged entries as one group entry; caller holds _lock."""
        if not group:
            return
        # NOTE: the C-level sum is the count ``_unstage`` will use whenever every entry's
        # count is an int >= 1; otherwise count exactly as it does (a malformed entry: 1)
        try:
            n = sum(map(_STAGED_N, group))
            exact = n.__class__ is int and min(map(_STAGED_N, group)) >= 1
        except Exception:  # noqa: BLE001
            exact = False
        if not exact:
            n = sum(map(_staged_len, group))
        first = group[0]
        ts = first[2] if first.__class__ is tuple and len(first) > 2 \
            and first[2].__class__ is int else _monotonic_ns()
        event = _Staged(n)
        st = self._state
        k = len(self._p_seq)
        if k >= st.limit:
            self._emit_slow(ts, event, group)
            return
        seq = st.next_seq
        st.next_seq = seq + n
        self._append(seq, ts, event, group)  # type: ignore[arg-type]
        if k >= self._batch_events - 1:
            self._wake.set()

    def advance_step(self) -> int:
        """Start the engine's next scheduler step: every later event carries it. Returns it.

        NOTE: one staged step mark per step, no event, no lock (the engine thread is the only
        caller): the move turns it into the mark the writer fills the ``step`` column from. The
        staged entries are moved here only when ``_MOVE_EVERY`` of them wait, or once the buffer
        is closed (so entries staged after ``close()`` are counted as ignored).
        """
        step = 0 if self._step is None else self._step + 1
        self._step = step
        staged = self._staged
        staged.append(_STEP_MARK)
        if len(staged) >= _MOVE_EVERY or self._state.closed:
            with self._lock:
                self._move_staged()
        return step

    @property
    def step(self) -> int | None:
        """The current scheduler step (None: this buffer records no steps)."""
        return self._step

    def _emit_slow(self, ts: int, event: Any, fields: dict[str, Any]) -> None:
        """Closed, full, or a gap to write first. Caller holds _lock."""
        st = self._state
        if st.closed:
            st.after_close += len(fields) if event.__class__ is _Staged else 1
            return
        seq = st.next_seq
        n = _entry_len(event)
        if len(self._p_seq) + st.inflight >= st.capacity:
            # NOTE: the dropped events still consume their seqs, so the gap is exact.
            st.next_seq = seq + n
            if st.gap_first is None:
                st.gap_first = seq
                st.update_limit()
            st.gap_last = seq + n - 1
            st.dropped += n
            return
        if st.gap_first is not None:
            seq = self._append_gap(seq, ts)
        st.next_seq = seq + n
        self._append(seq, ts, event, fields)
        if len(self._p_seq) >= self._batch_events:
            self._wake.set()

    # -- public control ----------------------------------------------------------------------
    @property
    def events_dropped(self) -> int:
        """Events dropped so far (overflow, invalid events, failed writes)."""
        return self._state.dropped

    @property
    def recorder_errors(self) -> int:
        """Internal errors caught so far."""
        return self._errors

    @property
    def events_after_close(self) -> int:
        """Emits ignored because the buffer was closed (they consume no seq)."""
        return self._state.after_close

    @property
    def closed(self) -> bool:
        """True once ``close()`` has run."""
        return self._state.closed

    def flush(self) -> None:
        """Write every event emitted so far, synchronously (tests, shutdown). Never raises."""
        self._drain()

    def close(self) -> None:
        """Flush, emit ``run_finished``, write the final manifest (``complete: true``).

        Idempotent; never raises. A process forked after construction does nothing here (the
        run belongs to the parent).
        """
        with self._close_lock:
            if self._state.closed or os.getpid() != self._pid:
                return
            try:
                self._stop.set()
                self._wake.set()
                if self._thread.is_alive() and self._thread is not threading.current_thread():
                    self._thread.join(timeout=30.0)
                self._finish()
            except Exception as exc:
                self._note_error(f"close: {exc!r}")
                with self._lock:
                    self._state.closed = True
                    self._state.update_limit()
            try:
                self._push_counters()
                self.writer.close()
            except Exception as exc:
                self._note_error(f"close: {exc!r}")
            try:
                atexit.unregister(self.close)
            except Exception:  # pragma: no cover - atexit.unregister does not raise in practice
                pass

    def __enter__(self) -> EventBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- pending lists (callers hold _lock) ---------------------------------------------------
    def _append(self, seq: int, ts: int, event: str, fields: dict[str, Any]) -> None:
        self._p_seq.append(seq)
        self._p_ts.append(ts)
        self._p_ev.append(event)
        self._p_fields.append(fields)

    def _append_gap(self, seq: int, ts: int) -> int:
        """Append the gap covering the dropped span at ``seq``; return the next free seq."""
        st = self._state
        first = st.gap_first
        assert first is not None
        self._append(seq, ts, "recorder_gap", {
            "first_seq": first, "last_seq": st.gap_last,
            "events_dropped": st.gap_last - first + 1, "reason": "buffer_full"})
        st.gap_first = None
        st.update_limit()
        return seq + 1

    def _take_pending(self) -> tuple[PendingLists, list[tuple[int, int]]]:
        """Take every pending entry and the step marks that cover them; caller holds _lock.

        Staged entries are moved first; groups are still groups (``_unstage`` them after
        releasing the lock).
        """
        if self._staged:
            self._move_staged()
        taken = (self._p_seq[:], self._p_ts[:], self._p_ev[:], self._p_fields[:])
        for lst in (self._p_seq, self._p_ts, self._p_ev, self._p_fields):
            lst.clear()
        marks = self._marks
        if marks and taken[0]:
            # NOTE: later entries have larger seqs: marks before the one covering the first
            # taken seq are never needed again.
            keep = bisect.bisect_right(marks, (taken[0][0], float("inf"))) - 1
            if keep > 0:
                del marks[:keep]
        return taken, list(marks)

    # -- writer thread -----------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self._flush_interval_s)
            self._wake.clear()
            self._drain()

    def _finish(self) -> None:
        """Drain, then append ``run_finished`` as the very last event and drain again."""
        for _ in range(10):  # NOTE: converges: recorder gaps written by a drain are valid
            self._drain()
            with self._lock:
                if self._staged:
                    self._move_staged()
                if self._p_seq:
                    continue
                self._append_run_finished(self.writer.events_written)
                break
        else:  # a concurrent emitter kept the buffer busy: finish anyway
            with self._lock:
                if self._staged:
                    self._move_staged()
                self._append_run_finished(self.writer.events_written
                                          + sum(map(_entry_len, self._p_ev)))
        self._drain()

    def _append_run_finished(self, written_before: int) -> None:
        """Append run_finished (after a pending gap) and stop accepting; caller holds _lock."""
        st = self._state
        seq = st.next_seq
        ts = _monotonic_ns()
        if st.gap_first is not None:
            seq = self._append_gap(seq, ts)
            written_before += 1
        # NOTE: counts include run_finished itself, so count(*) == events_written for a
        # complete run; dropped is final: nothing after run_finished can be dropped.
        self._append(seq, ts, "run_finished", {
            "events_written": written_before + 1, "events_dropped": st.dropped})
        st.next_seq = seq + 1
        st.closed = True
        st.update_limit()

    def _drain(self) -> None:
        """Convert and write everything pending. Never raises.

        NOTE: two passes: the second writes the gaps the first one produced (invalid events,
        failed writes). Never loop until empty: a writer that keeps failing produces a new gap
        per pass, and the drain must end.
        """
        try:
            with self._write_lock:
                for _pass in range(2):
                    with self._lock:
                        if not self._p_seq and not self._staged:
                            break
                        taken, marks = self._take_pending()
                        self._set_inflight(len(taken[0]))
                    try:
                        # NOTE: outside the lock: expanding a group is the writer's work
                        taken = _unstage(taken)
                        total = len(taken[0])
                        for start in range(0, total, self._batch_events):
                            stop = min(start + self._batch_events, total)
                            self._write_chunk(_slice(taken, start, stop), marks)
                            with self._lock:
                                self._set_inflight(total - stop)
                    finally:
                        with self._lock:
                            self._set_inflight(0)
                self.writer.maybe_rotate()
                self._push_counters()
        except Exception as exc:
            self._note_error(f"drain: {exc!r}")

    def _set_inflight(self, n: int) -> None:
        self._state.inflight = n
        self._state.update_limit()

    def _write_chunk(self, chunk: PendingLists, marks: list[tuple[int, int]]) -> None:
        try:
            batch = pending_to_batch(chunk, self.run_id, marks)
        except Exception:
            chunk = self._drop_invalid(chunk)
            if not chunk[0]:
                return
            try:
                batch = pending_to_batch(chunk, self.run_id, marks)
            except Exception as exc:  # pragma: no cover - event_problem should have caught it
                self._lose(chunk, "invalid_event", f"convert: {exc!r}")
                return
        try:
            self.writer.write_batch(batch)
        except Exception as exc:
            self._lose(chunk, "write_failed", f"write: {exc!r}")

    def _drop_invalid(self, chunk: PendingLists) -> PendingLists:
        """Keep the valid events; each run of consecutive bad seqs becomes one gap."""
        keep = []
        bad: list[int] = []
        seqs, ts, events, field_dicts = chunk
        for i, (event, fields) in enumerate(zip(events, field_dicts)):
            problem = event_problem(event, fields)
            if problem is None:
                keep.append(i)
            else:
                bad.extend(range(seqs[i], seqs[i] + _entry_len(event)))
                self._note_error(f"seq {seqs[i]}: {problem}")
        self._count_dropped(len(bad))
        for first, last in _spans(bad):
            self.emit("recorder_gap", first_seq=first, last_seq=last,
                      events_dropped=last - first + 1, reason="invalid_event")
        return ([seqs[i] for i in keep], [ts[i] for i in keep],
                [events[i] for i in keep], [field_dicts[i] for i in keep])

    def _lose(self, chunk: PendingLists, reason: str, message: str) -> None:
        """A chunk could not be written: count it and cover its seq span with a gap."""
        self._note_error(message)
        seqs, _ts, events, field_dicts = chunk
        first, last = seqs[0], seqs[-1] + _entry_len(events[-1]) - 1
        count = sum(map(_entry_len, events))
        dropped = count
        for event, fields in zip(events, field_dicts):
            if event == "recorder_gap":
                # NOTE: a lost gap takes its span with it: the new gap covers that span too
                # (it may be wider than what was lost, never narrower) and carries its count
                inner = fields.get("first_seq")
                if isinstance(inner, int):
                    first = min(first, inner)
                dropped += int(fields.get("events_dropped") or 0)
        self._count_dropped(count)
        self.emit("recorder_gap", first_seq=first, last_seq=last,
                  events_dropped=dropped, reason=reason)

    def _count_dropped(self, n: int) -> None:
        with self._lock:
            self._state.dropped += n

    def _note_error(self, message: str) -> None:
        """Count one internal error and keep the first few messages for the manifest."""
        try:
            self._errors += 1
            if len(self._error_samples) < _MAX_ERROR_SAMPLES:
                self._error_samples.append(message[:500])
        except Exception:  # pragma: no cover - nothing left to report to
            pass

    def _push_counters(self) -> None:
        self.writer.set_counters(events_dropped=self._state.dropped,
                                 recorder_errors=self._errors)
        if self._error_samples:
            self.writer.set_extra("recorder_error_samples", list(self._error_samples))

    def _run_started_fields(self) -> dict[str, Any]:
        info = self.writer.run_info
        fields = {k: info.get(k) for k in _RUN_STARTED_FACTS}
        fields.update(schema_version=SCHEMA_VERSION, recorder_version=RECORDER_VERSION)
        return fields


def _disable_in_child(ref: weakref.ReferenceType[EventBuffer]) -> None:
    """After fork: the child must not write into the parent's run (it has no writer thread).

    NOTE: callers may hold the emit closure itself (``self.emit = buffer.emit``), so the closure
    must keep working in the child: the buffer is marked closed (every emit takes the slow path
    and is ignored), and the lock is released if the parent's writer thread held it at fork time
    (that thread does not exist in the child, so nobody else would ever release it).
    """
    buf = ref()
    if buf is None:
        return
    if buf._lock.locked():
        buf._lock.release()
    buf._state.closed = True
    buf._state.limit = -1
