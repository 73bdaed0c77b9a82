"""Claim identity: the claim instance of every claim event, in one ordered pass per run
(docs/reconstruction.md, "Claim instances"; stage 02 reads what it writes).

Each run's claim events (``claim_*`` with a ``claim_id``) are read in seq order, straight from
its Parquet file where the audit has one, and one compiled loop gives each its ``claim_seq``
with the rule of stage 02: a ``claim_submitted`` starts a new instance and its decision
(``claim_accepted`` / ``claim_rejected``) belongs to it; any other event joins the latest
instance of its id not rejected before it, else the latest earlier one never rejected; an id's
events before any submit form the instance named by the first of them. Writes:

- ``kv_claim_ev``: the claim events with their ``claim_seq`` (no other event);
- ``kv_claim_subs``: one row per submission: its first rejection and the latest earlier
  submission of its id never rejected (``prev_live_seq``), which the labelling pass reads.

NOTE: every fact of the rule is known when the pass reaches the event (a decision follows its
submission, so a submission's window is closed when the next one of its id arrives): no window
function and no sort, where stage 02 once sorted every claim event by (id, seq). Memory is
five integers and the name per claim id of the run (the ids are the run's, not its events).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, Final

import numba
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kvclaims.reconstruct.labels import persistence

#: The events columns ``kv_claim_ev`` keeps (besides ``run_id`` and ``claim_seq``), in its order.
CLAIM_COLUMNS: Final[tuple[str, ...]] = (
    "seq", "ts_ns", "step", "event", "claim_id", "tenant", "request_id", "protection_mode",
    "threshold_blocks", "ttl_s", "value", "block_hash", "position", "reason", "by_request_id",
    "released_by")
#: Columns worth reading as dictionaries: few distinct names each.
CODED: Final[tuple[str, ...]] = ("event", "claim_id", "tenant", "protection_mode", "reason",
                                 "released_by")
_EV_ORDER: Final[tuple[str, ...]] = ("run_id", "seq", "ts_ns", "step", "event", "claim_id",
                                     "claim_seq", *CLAIM_COLUMNS[5:])
# event codes the rule reads; every other claim event is 0
_OTHER, _SUBMIT, _ACCEPT, _REJECT = 0, 1, 2, 3
_CODES: Final[dict[str, int]] = {"claim_submitted": _SUBMIT, "claim_accepted": _ACCEPT,
                                 "claim_rejected": _REJECT}
# per-id state columns
_FIRST, _SUB, _REJ, _LIVE, _PREV = range(5)
# rows of kv_claim_ev held before one INSERT
_FLUSH_ROWS: Final[int] = 500_000

_EV_DDL: Final[str] = (
    "CREATE OR REPLACE TEMP TABLE kv_claim_ev AS SELECT "
    + ", ".join("NULL::BIGINT AS claim_seq" if c == "claim_seq" else c for c in _EV_ORDER)
    + " FROM events LIMIT 0")
_SUBS_DDL: Final[str] = (
    "CREATE OR REPLACE TEMP TABLE kv_claim_subs (run_id VARCHAR, claim_id VARCHAR, "
    "sub_seq BIGINT, rejected_seq BIGINT, prev_live_seq BIGINT)")
# NOTE: only for a connection whose events are not in files (an in-memory table already)
_RUN_SQL: Final[str] = (f"SELECT {', '.join(CLAIM_COLUMNS)} FROM events WHERE run_id = $rid "
                        r"AND claim_id IS NOT NULL AND event LIKE 'claim\_%' ESCAPE '\' "
                        "ORDER BY seq")


@numba.njit(cache=True)
def _claim_seqs(seq: np.ndarray, ev: np.ndarray, code: np.ndarray, state: np.ndarray,
                subs: np.ndarray, nsubs: int) -> tuple[np.ndarray, int]:
    """``claim_seq`` of each claim event (``code``: its id's row of ``state``); a closed
    submission window appends (id, sub_seq, rejected_seq, prev_live_seq) to ``subs``
    (room for one row per submission in the batch is the caller's). Seqs are -1 for none."""
    out = np.empty(seq.shape[0], dtype=np.int64)
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

    def codes(self, ids: pa.Array) -> np.ndarray:
        """The code of each id (new ones get the next codes; state grows to hold them)."""
        enc = ids if pa.types.is_dictionary(ids.type) else pc.dictionary_encode(ids)
        table = np.empty(max(1, len(enc.dictionary)), dtype=np.int64)
        for j, name in enumerate(enc.dictionary.to_pylist()):
            c = self.code.get(name)
            if c is None:
                c = self.code[name] = len(self.names)
                self.names.append(name)
            table[j] = c
        if len(self.names) > self.state.shape[0]:
            grown = np.full((2 * len(self.names), 5), -1, dtype=np.int64)
            grown[:self.state.shape[0]] = self.state
            self.state = grown
        return table[enc.indices.to_numpy(zero_copy_only=False)]


def _claim_rows(batch: pa.RecordBatch) -> pa.RecordBatch:
    """The batch's claim events: an event named ``claim_*`` with a ``claim_id``."""
    event = batch.column("event")
    if pa.types.is_dictionary(event.type):
        words = event.dictionary.to_pylist()
        is_claim = np.array([w.startswith("claim_") for w in words] + [False])
        mask = is_claim[event.indices.fill_null(len(words)).to_numpy(zero_copy_only=False)]
    else:
        mask = pc.fill_null(pc.starts_with(event, "claim_"), False).to_numpy(
            zero_copy_only=False)
    mask &= batch.column("claim_id").is_valid().to_numpy(zero_copy_only=False)
    return batch.filter(pa.array(mask))


def _event_codes(event: pa.Array) -> np.ndarray:
    enc = event if pa.types.is_dictionary(event.type) else pc.dictionary_encode(event)
    table = np.array([_CODES.get(w, _OTHER) for w in enc.dictionary.to_pylist()] or [0],
                     dtype=np.int8)
    return table[enc.indices.to_numpy(zero_copy_only=False)]


class _Out:
    """The rows of both tables held across runs, handed to DuckDB in one INSERT per table
    every ``_FLUSH_ROWS`` claim events and at the end.

    NOTE: one thread, as the labelling pass's ``_Sink``: an INSERT of Arrow in insertion order
    gains nothing from more; and not one INSERT per run (a trace of many short runs paid
    several ms each)."""

    def __init__(self, con: Any) -> None:
        self.con = con
        self.ev: list[pa.Table] = []
        self.subs: list[pa.Table] = []
        self.rows = 0

    def add(self, ev: pa.Table | None = None, subs: pa.Table | None = None) -> None:
        if ev is not None:
            self.ev.append(ev)
            self.rows += ev.num_rows
        if subs is not None:
            self.subs.append(subs)
        if self.rows >= _FLUSH_ROWS:
            self.flush()

    def flush(self) -> None:
        threads = self.con.execute("SELECT current_setting('threads')").fetchall()[0][0]
        self.con.execute("SET threads = 1")
        try:
            for table, held in (("kv_claim_ev", self.ev), ("kv_claim_subs", self.subs)):
                if not held:
                    continue
                self.con.register("kv_identity_in", pa.concat_tables(
                    held, promote_options="permissive"))
                try:
                    self.con.execute(f"INSERT INTO {table} SELECT * FROM kv_identity_in")
                finally:
                    self.con.unregister("kv_identity_in")
                held.clear()
        finally:
            self.con.execute("SET threads = ?", [int(threads)])
        self.rows = 0


def _run(out: _Out, rid: str, batches: Iterable[pa.RecordBatch]) -> None:
    """Give one run's claim events their instance; hand them and its submissions to ``out``."""
    ids = _Ids()
    subs = np.empty((0, 4), dtype=np.int64)
    nsubs = 0
    last = -(1 << 62)
    run_id = pa.array([rid])
    for batch in batches:
        b = _claim_rows(batch)
        if b.num_rows == 0:
            continue
        seq = b.column("seq").to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        if seq[0] < last or not bool(np.all(seq[1:] >= seq[:-1])):
            raise ValueError(f"run {rid}: events not in seq order")
        last = int(seq[-1])
        code = ids.codes(b.column("claim_id"))
        ev = _event_codes(b.column("event"))
        need = nsubs + int(np.count_nonzero(ev == _SUBMIT))
        if need > subs.shape[0]:
            grown = np.empty((max(need, 2 * subs.shape[0]), 4), dtype=np.int64)
            grown[:nsubs] = subs[:nsubs]
            subs = grown
        claim_seq, nsubs = _claim_seqs(seq, ev, code, ids.state, subs, nsubs)
        cols = {"run_id": pa.DictionaryArray.from_arrays(
            pa.array(np.zeros(b.num_rows, dtype=np.int32)), run_id),
            "claim_seq": pa.array(claim_seq)}
        out.add(ev=pa.table({c: cols[c] if c in cols else b.column(c) for c in _EV_ORDER}))
    # the windows still open at the run's end
    open_ids = np.flatnonzero(ids.state[:len(ids.names), _SUB] >= 0)
    tail = np.column_stack([open_ids, ids.state[open_ids, _SUB], ids.state[open_ids, _REJ],
                            ids.state[open_ids, _PREV]]).astype(np.int64)
    rows = np.concatenate([subs[:nsubs], tail])
    if rows.shape[0]:
        out.add(subs=pa.table({
            "run_id": pa.DictionaryArray.from_arrays(
                pa.array(np.zeros(rows.shape[0], dtype=np.int32)), run_id),
            "claim_id": pa.array(ids.names, pa.string()).take(pa.array(rows[:, 0])),
            "sub_seq": pa.array(rows[:, 1]),
            "rejected_seq": pa.array(rows[:, 2], mask=rows[:, 2] < 0),
            "prev_live_seq": pa.array(rows[:, 3], mask=rows[:, 3] < 0)}))


def build(con: Any, *, sources: Callable[[str], Iterator[pa.RecordBatch]] | None = None,
          persist: bool = False) -> None:
    """Write ``kv_claim_ev`` and ``kv_claim_subs`` for every run of ``kv_runs``.

    ``sources(run_id)`` yields the run's events (loader schema, ``CLAIM_COLUMNS`` at least) in
    seq order, e.g. straight from its Parquet file; without it they are read from ``events``.
    TEMP tables unless ``persist`` (``labels.persistence``)."""
    con.execute(persistence(_EV_DDL, persist))
    con.execute(persistence(_SUBS_DDL, persist))
    out = _Out(con)
    for (rid,) in con.execute("SELECT run_id FROM kv_runs ORDER BY run_id").fetchall():
        batches = (sources(rid) if sources is not None else
                   con.sql(_RUN_SQL, params={"rid": rid}).to_arrow_table().to_batches())
        _run(out, rid, batches)
    out.flush()
