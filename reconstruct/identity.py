"""Claim identity: the claim instance of every claim event, in one ordered pass per run
(docs/reconstruction.md, "Claim instances"; stages 02 and 05-08 read what it writes).

Each run's claim events (``claim_*`` with a ``claim_id``) are read in seq order, straight from
its Parquet file where the audit has one, and one compiled loop gives each its ``claim_seq``
with the rule of stage 02: a ``claim_submitted`` starts a new instance and its decision
(``claim_accepted`` / ``claim_rejected``) belongs to it; any other event joins the latest
instance of its id not rejected before it, else the latest earlier one never rejected; an id's
events before any submit form the instance named by the first of them. Writes:

- ``kv_claim_ev``: the claim events but bindings, with their ``claim_seq`` (no other event);
- ``kv_claim_binds``: the bindings (``claim_bound``), with their ``claim_seq``: only the
  columns stage 02 reads of them (``BIND_COLUMNS``);
- ``kv_claim_subs``: one row per submission: its first rejection and the latest earlier
  submission of its id never rejected (``prev_live_seq``), which the labelling pass reads;
- ``kv_stage_events``: the events stages 05-08 read besides block events and bindings
  (``STAGE_EVENTS``, ``STAGE_COLUMNS``), from the same read (a scan of its own decodes
  those columns for every event again).

NOTE: every fact of the rule is known when the pass reaches the event (a decision follows its
submission, so a submission's window is closed when the next one of its id arrives): no sort
(the rule as window functions sorts every claim event by id and seq). Memory is five integers
and the name per claim id of the run (the ids are the run's, not its events).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Final

import numba
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kvclaims.contract.vocabulary import EVENT, sql_string
from kvclaims.reconstruct.sink import ParquetSink, created, ddl_schema

#: The events columns ``kv_claim_ev`` keeps (besides ``run_id`` and ``claim_seq``), in its order.
CLAIM_COLUMNS: Final[tuple[str, ...]] = (
    "seq", "ts_ns", "step", "event", "claim_id", "tenant", "request_id", "protection_mode",
    "threshold_blocks", "ttl_s", "value", "block_hash", "position", "reason", "by_request_id",
    "released_by")
#: What ``kv_claim_binds`` keeps of a binding, in its order. NOTE: bindings are most claim
#: events (one per bound block) and stage 02 reads four columns of them: a narrow table of
#: their own, not rows of ``kv_claim_ev``'s eighteen columns.
BIND_COLUMNS: Final[tuple[str, ...]] = ("run_id", "seq", "claim_id", "claim_seq", "position",
                                        "block_hash")
#: The events stages 05-08 read besides block events and claim bindings (``kv_stage_events``:
#: requests and their decisions, claim lifecycle and runtime reports after submission, resets,
#: gaps, hook failures), and the columns those stages read of them, in the table's order.
STAGE_EVENTS: Final[frozenset[str]] = frozenset({
    EVENT.request_arrived, EVENT.request_admitted, EVENT.request_deferred,
    EVENT.request_refused, EVENT.request_preempted, EVENT.request_finished,
    EVENT.reuse_denied, EVENT.claim_accepted, EVENT.claim_rejected, EVENT.claim_demoted,
    EVENT.claim_expired, EVENT.claim_released, EVENT.claim_release_refused,
    EVENT.claim_materialized, EVENT.claim_harmed, EVENT.cache_reset, EVENT.recorder_gap,
    EVENT.hook_failed})
STAGE_COLUMNS: Final[tuple[str, ...]] = (
    "run_id", "seq", "ts_ns", "step", "event", "request_id", "tenant", "claim_id", "block_hash",
    # decisions and requests
    "num_prompt_tokens", "protected_blocks", "blocks_required", "usable_blocks", "free_blocks",
    "shortfall_blocks", "blocking_claim_ids", "finish_reason", "num_cached_tokens",
    "num_output_tokens",
    # releases, refusals, gaps, hook failures
    "reason", "released_by", "first_seq", "last_seq", "events_dropped", "hook", "error_type")
#: What the pass reads of a run's events: both tables' columns.
COLUMNS: Final[tuple[str, ...]] = (
    *CLAIM_COLUMNS, *(c for c in STAGE_COLUMNS if c != "run_id" and c not in CLAIM_COLUMNS))
#: Columns worth reading as dictionaries: few distinct names each.
CODED: Final[tuple[str, ...]] = ("event", "claim_id", "tenant", "protection_mode", "reason",
                                 "released_by", "finish_reason", "hook", "error_type")
_EV_ORDER: Final[tuple[str, ...]] = ("run_id", "seq", "ts_ns", "step", "event", "claim_id",
                                     "claim_seq", *CLAIM_COLUMNS[5:])
# event codes the rule reads; every other claim event is 0
_OTHER, _SUBMIT, _ACCEPT, _REJECT = 0, 1, 2, 3
_CODES: Final[dict[str, int]] = {EVENT.claim_submitted: _SUBMIT, EVENT.claim_accepted: _ACCEPT,
                                 EVENT.claim_rejected: _REJECT}
# per-id state columns
_FIRST, _SUB, _REJ, _LIVE, _PREV = range(5)

_EV_DDL: Final[str] = (
    "CREATE OR REPLACE TEMP TABLE kv_claim_ev AS SELECT "
    + ", ".join("NULL::BIGINT AS claim_seq" if c == "claim_seq" else c for c in _EV_ORDER)
    + " FROM events LIMIT 0")
_SUBS_DDL: Final[str] = (
    "CREATE OR REPLACE TEMP TABLE kv_claim_subs (run_id VARCHAR, claim_id VARCHAR, "
    "sub_seq BIGINT, rejected_seq BIGINT, prev_live_seq BIGINT)")
_BINDS_DDL: Final[str] = (
    "CREATE OR REPLACE TEMP TABLE kv_claim_binds AS SELECT "
    + ", ".join("NULL::BIGINT AS claim_seq" if c == "claim_seq" else c for c in BIND_COLUMNS)
    + " FROM events LIMIT 0")
_STAGE_DDL: Final[str] = (f"CREATE OR REPLACE TEMP TABLE kv_stage_events AS SELECT "
                          f"{', '.join(STAGE_COLUMNS)} FROM events LIMIT 0")
# NOTE: only for a connection whose events are not in files (an in-memory table already)
_RUN_SQL: Final[str] = (
    f"SELECT {', '.join(COLUMNS)} FROM events WHERE run_id = $rid AND ("
    r"(claim_id IS NOT NULL AND event LIKE 'claim\_%' ESCAPE '\') OR event IN ("
    + ", ".join(sql_string(e) for e in sorted(STAGE_EVENTS)) + ")) ORDER BY seq")


@numba.njit(cache=True)
def _claim_seqs(seq: np.ndarray, ev: np.ndarray, code: np.ndarray, state: np.ndarray,
                subs: np.ndarray) -> tuple[np.ndarray, int]:
    """``claim_seq`` of each claim event (``code``: its id's row of ``state``), and how many
    submission windows closed: each as a row (id, sub_seq, rejected_seq, prev_live_seq) of
    ``subs`` (room for one per submission in the batch is the caller's: a window closes only
    when a submission of its id arrives). Seqs are -1 for none."""
    out = np.empty(seq.shape[0], dtype=np.int64)
    nsubs = 0
    for i in range(seq.shape[0]):
        c = code[i]
        s = seq[i]
        e = ev[i]
        if state[c, _FIRST] < 0:
            state[c, _FIRST] = s
        if e == _SUBMIT:
            if state[c, _SUB] >= 0:
                nsubs = _close(state, c, subs, nsubs)
            state[c, _PREV] = state[c, _LIVE]
            state[c, _SUB] = s
            state[c, _REJ] = -1
        elif e == _REJECT and state[c, _SUB] >= 0 and state[c, _REJ] < 0:
            state[c, _REJ] = s
        if state[c, _SUB] < 0:
            out[i] = state[c, _FIRST]
        elif e != _OTHER:
            out[i] = state[c, _SUB]
        elif state[c, _REJ] >= 0 and state[c, _REJ] < s and state[c, _PREV] >= 0:
            # NOTE: a rejected submission never captures the events of the instance in force
            out[i] = state[c, _PREV]
        else:
            out[i] = state[c, _SUB]
    return out, nsubs


@numba.njit(cache=True)
def _close(state: np.ndarray, c: int, subs: np.ndarray, nsubs: int) -> int:
    """End id ``c``'s current submission window: record it; never rejected, it is the latest
    live submission the id's later events may fall back to."""
    subs[nsubs, 0] = c
    subs[nsubs, 1] = state[c, _SUB]
    subs[nsubs, 2] = state[c, _REJ]
    subs[nsubs, 3] = state[c, _PREV]
    if state[c, _REJ] < 0:
        state[c, _LIVE] = state[c, _SUB]
    return nsubs + 1


class _Ids:
    """A run's claim ids as dense codes, with the state the rule keeps per id."""

    def __init__(self) -> None:
        self.code: dict[str, int] = {}
        self.names: list[str] = []
        self.state = np.full((64, 5), -1, dtype=np.int64)
        # the last dictionary coded, and its codes: a file's batches carry their row group's
        # (comparing it is a memcmp; coding it again, a dict lookup per id)
        self.words: pa.Array | None = None
        self.table = np.zeros(1, dtype=np.int64)

    def codes(self, ids: pa.Array) -> np.ndarray:
        """The code of each id (new ones get the next codes; state grows to hold them)."""
        enc = ids if pa.types.is_dictionary(ids.type) else pc.dictionary_encode(ids)
        if self.words is None or not enc.dictionary.equals(self.words):
            self.words = enc.dictionary
            self.table = np.empty(max(1, len(enc.dictionary)), dtype=np.int64)
            for j, name in enumerate(enc.dictionary.to_pylist()):
                c = self.code.get(name)
                if c is None:
                    c = self.code[name] = len(self.names)
                    self.names.append(name)
                self.table[j] = c
        table = self.table
        if len(self.names) > self.state.shape[0]:
            grown = np.full((2 * len(self.names), 5), -1, dtype=np.int64)
            grown[:self.state.shape[0]] = self.state
            self.state = grown
        return table[enc.indices.to_numpy(zero_copy_only=False)]


def _masks(batch: pa.RecordBatch) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Which rows of the batch are claim events (named ``claim_*``, with a ``claim_id``), which
    are ``STAGE_EVENTS``, which are bindings, and each row's event code for the rule
    (``_CODES``).

    NOTE: the event names are coded once per batch; each answer is a lookup of their words."""
    event = batch.column("event")
    enc = event if pa.types.is_dictionary(event.type) else pc.dictionary_encode(event)
    words = enc.dictionary.to_pylist()
    idx = enc.indices.fill_null(len(words)).to_numpy(zero_copy_only=False)
    is_claim = np.array([w.startswith("claim_") for w in words] + [False])[idx]
    is_claim &= batch.column("claim_id").is_valid().to_numpy(zero_copy_only=False)
    codes = np.array([_CODES.get(w, _OTHER) for w in words] + [_OTHER], dtype=np.int8)[idx]
    is_bind = np.array([w == EVENT.claim_bound for w in words] + [False])[idx]
    return is_claim, np.array([w in STAGE_EVENTS for w in words] + [False])[idx], is_bind, codes


def _run(out: ParquetSink, rid: str, batches: Iterable[pa.RecordBatch]) -> None:
    """One run: its claim events with their instance, its submissions, its stage events."""
    ids = _Ids()
    last = -(1 << 62)
    run_id = pa.array([rid])

    def run_ids(n: int) -> pa.Array:
        return pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, dtype=np.int32)), run_id)

    def add_subs(rows: np.ndarray) -> None:
        # NOTE: handed over batch by batch: a run's submissions are never held whole
        out.add("kv_claim_subs", pa.table({
            "run_id": run_ids(rows.shape[0]),
            # NOTE: the names of these rows only: an array of every name of the run per batch
            # grew with the run's ids (one per instance on traces with distinct ids)
            "claim_id": pa.array([ids.names[c] for c in rows[:, 0].tolist()], pa.string()),
            "sub_seq": pa.array(rows[:, 1]),
            "rejected_seq": pa.array(rows[:, 2], mask=rows[:, 2] < 0),
            "prev_live_seq": pa.array(rows[:, 3], mask=rows[:, 3] < 0)}))

    for batch in batches:
        is_claim, is_stage, is_bind, codes = _masks(batch)
        # NOTE: each table's columns are selected before its rows are: a filter copies every
        # column it is given
        if is_stage.any():
            b = batch.select(STAGE_COLUMNS[1:]).filter(pa.array(is_stage))
            out.add("kv_stage_events", pa.table(
                {c: run_ids(b.num_rows) if c == "run_id" else b.column(c) for c in STAGE_COLUMNS}))
        if not is_claim.any():
            continue
        seq = batch.column("seq").to_numpy(zero_copy_only=False)[is_claim].astype(
            np.int64, copy=False)
        if seq[0] < last or not bool(np.all(seq[1:] >= seq[:-1])):
            raise ValueError(f"run {rid}: events not in seq order")
        last = int(seq[-1])
        code = ids.codes(batch.column("claim_id").filter(pa.array(is_claim)))
        ev = codes[is_claim]
        # room for every submission window the batch can close: one per submission in it
        subs = np.empty((int(np.count_nonzero(ev == _SUBMIT)), 4), dtype=np.int64)
        claim_seq, nsubs = _claim_seqs(seq, ev, code, ids.state, subs)
        if nsubs:
            add_subs(subs[:nsubs])
        for table, order, rows in (("kv_claim_binds", BIND_COLUMNS, is_claim & is_bind),
                                   ("kv_claim_ev", _EV_ORDER, is_claim & ~is_bind)):
            if not rows.any():
                continue
            part = batch.select([c for c in order if c in CLAIM_COLUMNS]).filter(pa.array(rows))
            cols = {"run_id": run_ids(part.num_rows),
                    "claim_seq": pa.array(claim_seq[rows[is_claim]])}
            out.add(table, pa.table({c: cols[c] if c in cols else part.column(c)
                                     for c in order}))
    # the windows still open at the run's end
    open_ids = np.flatnonzero(ids.state[:len(ids.names), _SUB] >= 0)
    add_subs(np.column_stack([open_ids, ids.state[open_ids, _SUB], ids.state[open_ids, _REJ],
                              ids.state[open_ids, _PREV]]).astype(np.int64))


def build(con: Any, folder: str | Path, *,
          sources: Callable[[str], Iterator[pa.RecordBatch]] | None = None) -> list[Path]:
    """Write ``kv_claim_ev``, ``kv_claim_binds``, ``kv_claim_subs`` and ``kv_stage_events``
    for every run of ``kv_runs`` as Parquet files in ``folder``, each read through a view of
    its name (``sink.ParquetSink``); return the files.

    ``sources(run_id)`` yields the run's events (loader schema, ``COLUMNS`` at least) in
    seq order, e.g. straight from its Parquet file; without it they are read from ``events``.
    """
    out = ParquetSink(folder, {created(ddl): ddl_schema(con, ddl)
                               for ddl in (_EV_DDL, _BINDS_DDL, _SUBS_DDL, _STAGE_DDL)})
    for (rid,) in con.execute("SELECT run_id FROM kv_runs ORDER BY run_id").fetchall():
        batches = (sources(rid) if sources is not None else
                   con.sql(_RUN_SQL, params={"rid": rid}).to_arrow_table().to_batches())
        _run(out, rid, batches)
    return out.close(con)
