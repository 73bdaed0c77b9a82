"""Stage 02's core: the block content timeline, in NumPy, streamed in bounded memory.

For every run it reads the block events (``block_cached``, ``block_hit``, ``block_evicted``)
window by window in ``seq`` order and fills two DuckDB tables:

- ``kv_losses``: one row per block loss (every ``block_evicted``, plus one synthetic row per
  block holding content at a ``cache_reset``), with the content it lost;
- ``kv_copies``: the copies of content later stages read, ``[start_seq, end_seq)`` with
  ``end_kind``: copies of content that may be bound to a claim, and overwritten copies.

The rules (docs/reconstruction.md, stage 02; the column meanings are in ``02_blocks.sql``):

- a copy starts at a ``block_cached``/``block_hit`` with a hash and ends at the next block event
  on the same ``block_id`` or at the run's next ``cache_reset``, whichever comes first;
- an eviction without a hash takes the hash of the block's previous event when that was a
  ``block_cached``/``block_hit``; the block was resident when that previous event exists, is a
  ``block_cached``/``block_hit`` and no ``cache_reset`` lies between the two.

NOTE: why NumPy and not SQL: these rules need each block event's neighbours on its block, a
window function over every block event partitioned by block. DuckDB's window sort over millions
of rows was most of the reconstruction's time. Here a window of events (in seq order) is put in
block order by a stable 16-bit radix sort (two passes when block ids span more than 2^16), and
a block's neighbours are adjacent entries. Across windows each block's last event is carried
(one row per block). Memory: one window (``WINDOW_SEQS`` seqs, about 100 bytes of arrays per
block event) plus the carried rows, whatever the trace's size; the tables filled live in
DuckDB, which spills them under its ``memory_limit``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import pyarrow as pa

# Block event kinds (the ``kind`` column of the window query).
CACHED: Final[int] = 0
HIT: Final[int] = 1
EVICTED: Final[int] = 2
_NONE: Final[int] = 255  # no previous event on the block

# end_kind codes of a copy (written as text into kv_copies).
END_OPEN: Final[int] = 0
END_RESET: Final[int] = 1
END_EVICTED: Final[int] = 2
END_OVERWRITTEN: Final[int] = 3
END_CONTINUED: Final[int] = 4

# Seqs of one run read at once (a window holds at most this many events): with about 100
# bytes of arrays per block event, at most ~200 MB outside DuckDB's memory_limit.
WINDOW_SEQS: Final[int] = 2_000_000

_BLOCK_EVENTS: Final[str] = "('block_cached', 'block_hit', 'block_evicted')"
_BOUND_WHERE: Final[str] = ("event = 'claim_bound' AND claim_id IS NOT NULL "
                            "AND block_hash IS NOT NULL AND position >= 0")

# The window's block events, narrow (every kind) ...
_WINDOW_SQL: Final[str] = f"""
SELECT seq, block_id,
       CASE event WHEN 'block_evicted' THEN 2 WHEN 'block_hit' THEN 1 ELSE 0 END::UTINYINT
           AS kind,
       block_hash
FROM events
WHERE run_id = $rid AND seq >= $lo AND seq < $hi AND event IN {_BLOCK_EVENTS}
"""
# ... and what a loss row copies from its eviction event.
_EVICTIONS_SQL: Final[str] = """
SELECT seq, ts_ns, cause, by_request_id
FROM events
WHERE run_id = $rid AND seq >= $lo AND seq < $hi AND event = 'block_evicted'
"""

LOSSES_DDL: Final[str] = """
CREATE OR REPLACE TEMP TABLE kv_losses (
    run_id VARCHAR, seq BIGINT, ts_ns BIGINT, block_id INTEGER, block_hash UBIGINT,
    cause VARCHAR, by_request_id VARCHAR, was_resident BOOLEAN, reported_hash UBIGINT,
    held_hash UBIGINT, synthetic BOOLEAN, bound BOOLEAN)
"""

COPIES_DDL: Final[str] = """
CREATE OR REPLACE TEMP TABLE kv_copies (
    run_id VARCHAR, block_id INTEGER, block_hash UBIGINT, start_seq BIGINT, end_seq BIGINT,
    end_kind VARCHAR)
"""

_LOSSES_INSERT: Final[str] = """
INSERT INTO kv_losses
SELECT $rid, seq, ts_ns, block_id, block_hash, cause, by_request_id, was_resident,
       reported_hash, held_hash, synthetic, bound
FROM kv_losses_chunk
"""

_COPIES_INSERT: Final[str] = """
INSERT INTO kv_copies
SELECT $rid, block_id, block_hash, start_seq, end_seq,
       CASE end_kind WHEN 1 THEN 'reset' WHEN 2 THEN 'evicted' WHEN 3 THEN 'overwritten'
                     WHEN 4 THEN 'continued' END
FROM kv_copies_chunk
"""

_LOSSES_SCHEMA: Final[pa.Schema] = pa.schema([
    ("seq", pa.int64()), ("ts_ns", pa.int64()), ("block_id", pa.int32()),
    ("block_hash", pa.uint64()), ("cause", pa.string()), ("by_request_id", pa.string()),
    ("was_resident", pa.bool_()), ("reported_hash", pa.uint64()), ("held_hash", pa.uint64()),
    ("synthetic", pa.bool_()), ("bound", pa.bool_())])

_NO_BLOCK: Final[int] = 0  # block key of a NULL block_id (real ids map to 1..2^32-1)

# Slots of the bound-hash bitmap (primes): the smallest at least 8x the run's bound hashes.
_BITMAP_SIZES: Final[tuple[int, ...]] = (1021, 65521, 1048573, 16777213)


def bitmap_size(n_bound: int) -> int:
    """Slots of the bound-hash bitmap of a run with ``n_bound`` distinct bound hashes."""
    for size in _BITMAP_SIZES:
        if size >= 8 * n_bound:
            return size
    return _BITMAP_SIZES[-1]


def order_by_block(key: np.ndarray) -> np.ndarray:
    """A stable permutation sorting ``key`` (uint32): one or two 16-bit radix passes."""
    if key.size == 0:
        return np.zeros(0, dtype=np.intp)
    if int(key.max()) < 1 << 16:
        return np.argsort(key.astype(np.uint16), kind="stable")
    low = np.argsort((key & 0xFFFF).astype(np.uint16), kind="stable")
    high = np.argsort((key[low] >> 16).astype(np.uint16), kind="stable")
    return low[high]


def _values(arr: Any, dtype: Any) -> tuple[np.ndarray, np.ndarray]:
    """(values, valid) of an Arrow column; NULLs become 0."""
    arr = arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr
    if arr.null_count:
        valid = np.asarray(arr.is_valid())
        arr = arr.fill_null(0)
    else:
        valid = np.ones(len(arr), dtype=bool)
    return arr.to_numpy(zero_copy_only=False).astype(dtype, copy=False), valid


def _masked(values: np.ndarray, valid: np.ndarray, typ: pa.DataType) -> pa.Array:
    return pa.array(values, type=typ, mask=None if valid.all() else ~valid)


@dataclass
class _Events:
    """Block events as arrays: one window, or the carried last event of each block."""

    seq: np.ndarray
    key: np.ndarray      # uint32 block key: block_id - base + 1, _NO_BLOCK for NULL
    kind: np.ndarray
    hash: np.ndarray
    hash_ok: np.ndarray

    @classmethod
    def empty(cls) -> _Events:
        return cls(np.zeros(0, np.int64), np.zeros(0, np.uint32), np.zeros(0, np.uint8),
                   np.zeros(0, np.uint64), np.zeros(0, bool))

    def take(self, idx: np.ndarray) -> _Events:
        return _Events(self.seq[idx], self.key[idx], self.kind[idx], self.hash[idx],
                       self.hash_ok[idx])

    def concat(self, other: _Events) -> _Events:
        return _Events(*(np.concatenate([a, b]) for a, b in zip(
            (self.seq, self.key, self.kind, self.hash, self.hash_ok),
            (other.seq, other.key, other.kind, other.hash, other.hash_ok))))


class RunTimeline:
    """One run's block timeline, fed window by window in seq order.

    ``step(window, evictions, final)`` returns the losses and copies the window decides: an
    eviction's loss needs only the events before it; a copy's end needs the next event on its
    block, so a copy whose block has no later event yet waits (carried) until one comes or the
    run ends (``final``).
    """

    def __init__(self, resets_seq: np.ndarray, resets_ts: pa.Array,
                 bitmap: np.ndarray | None, block_base: int) -> None:
        self.resets_seq = resets_seq          # sorted
        self.resets_ts = resets_ts
        # True at (hash % size) for every bound hash of the run; None: nothing is bound
        self.bitmap = bitmap
        self.block_base = block_base
        self.carry = _Events.empty()          # sorted by key, one row per block

    # -- helpers -------------------------------------------------------------------------------

    def _epoch(self, seq: np.ndarray) -> np.ndarray:
        """Resets at or before each seq (same epoch <=> no reset in between)."""
        return np.searchsorted(self.resets_seq, seq, side="right")

    def maybe_bound(self, h: np.ndarray, ok: np.ndarray) -> np.ndarray:
        """False where the hash is surely bound to no claim (true may be a bitmap collision:
        the SQL join with the bindings is the exact test)."""
        if self.bitmap is None:
            return np.zeros(h.size, dtype=bool)
        return ok & self.bitmap[h % np.uint64(self.bitmap.size)]

    def _window(self, table: pa.Table | None) -> _Events:
        if table is None or table.num_rows == 0:
            return _Events.empty()
        blk, blk_ok = _values(table.column("block_id"), np.int64)
        key = np.where(blk_ok, blk - self.block_base + 1, _NO_BLOCK).astype(np.uint32)
        h, h_ok = _values(table.column("block_hash"), np.uint64)
        return _Events(table.column("seq").to_numpy(), key, table.column("kind").to_numpy(),
                       h, h_ok)

    # -- one window ----------------------------------------------------------------------------

    def step(self, table: pa.Table | None, evictions: pa.Table | None,
             final: bool) -> tuple[pa.Table | None, pa.Table | None]:
        """Add a window (block events, seq order) and its evictions' payload (seq order)."""
        w, c = self._window(table), self.carry
        n = w.seq.size
        # neighbours on the same block inside the window (window indices), by block order
        order = order_by_block(w.key)
        s_key = w.key[order]
        starts = np.ones(n, dtype=bool)                   # sorted position starts a block
        starts[1:] = s_key[1:] != s_key[:-1]
        linked = ~starts[1:]
        before, after = order[:-1][linked], order[1:][linked]
        prev = np.full(n, -1, dtype=np.intp)
        prev[after] = before
        nxt = np.full(n, -1, dtype=np.intp)
        nxt[before] = after
        first = order[starts]                             # each block's first row, by key
        ends = np.ones(n, dtype=bool)
        ends[:-1] = starts[1:]
        last = order[ends]                                # each block's last row, by key
        # a block's carried row comes just before its first row in the window
        carried_prev = np.full(n, -1, dtype=np.intp)      # window row -> carried row
        carried_next = np.full(c.seq.size, -1, dtype=np.intp)
        if c.seq.size and n:
            f_key = s_key[starts]
            pos = np.minimum(np.searchsorted(c.key, f_key), c.seq.size - 1)
            hit = c.key[pos] == f_key
            carried_prev[first[hit]] = pos[hit]
            carried_next[pos[hit]] = first[hit]

        losses = self._losses(w, prev, carried_prev, evictions)
        copies, synthetic = self._copies(w, nxt, carried_next, final)
        if synthetic is not None:
            losses = synthetic if losses is None else pa.concat_tables([losses, synthetic])
        if not final:
            kept = c.take(np.flatnonzero(carried_next < 0))
            fresh = w.take(last)
            if kept.seq.size:
                both = kept.concat(fresh)
                self.carry = both.take(np.argsort(both.key, kind="stable"))
            else:
                self.carry = fresh
        return losses, copies

    def _losses(self, w: _Events, prev: np.ndarray, carried_prev: np.ndarray,
                evictions: pa.Table | None) -> pa.Table | None:
        """One row per eviction of the window: its content, whether the block held it."""
        idx = np.flatnonzero(w.kind == EVICTED)
        if idx.size == 0:
            return None
        p_kind = np.full(idx.size, _NONE, dtype=np.uint8)
        p_hash = np.zeros(idx.size, dtype=np.uint64)
        p_ok = np.zeros(idx.size, dtype=bool)
        p_seq = np.zeros(idx.size, dtype=np.int64)
        for src, pick in ((w, prev[idx]), (self.carry, carried_prev[idx])):
            has = pick >= 0
            at = pick[has]
            p_kind[has] = src.kind[at]
            p_hash[has] = src.hash[at]
            p_ok[has] = src.hash_ok[at]
            p_seq[has] = src.seq[at]
        prev_copy = p_kind <= HIT
        resident = prev_copy
        if self.resets_seq.size:
            resident = prev_copy & (self._epoch(p_seq) == self._epoch(w.seq[idx]))
        e_hash, e_ok = w.hash[idx], w.hash_ok[idx]
        hash_ok = e_ok | (prev_copy & p_ok)
        block_hash = np.where(e_ok, e_hash, p_hash)
        seq = w.seq[idx]
        assert evictions is not None and evictions.num_rows == idx.size
        ev_seq = evictions.column("seq").to_numpy()
        if not np.array_equal(ev_seq, seq):
            evictions = evictions.take(pa.array(np.argsort(ev_seq, kind="stable")))
        blk = w.key[idx].astype(np.int64) + self.block_base - 1
        return pa.Table.from_arrays([
            pa.array(seq), evictions.column("ts_ns"),
            _masked(blk, w.key[idx] != _NO_BLOCK, pa.int32()),
            _masked(block_hash, hash_ok, pa.uint64()),
            evictions.column("cause"), evictions.column("by_request_id"),
            pa.array(resident), _masked(e_hash, e_ok, pa.uint64()),
            _masked(p_hash, resident & p_ok, pa.uint64()),
            pa.array(np.zeros(idx.size, dtype=bool)),
            pa.array(self.maybe_bound(block_hash, hash_ok)),
        ], schema=_LOSSES_SCHEMA)

    def _copies(self, w: _Events, nxt: np.ndarray, carried_next: np.ndarray,
                final: bool) -> tuple[pa.Table | None, pa.Table | None]:
        """The copies whose end the window decides, and the losses resets make of them."""
        c = self.carry
        w_idx = np.flatnonzero((w.kind != EVICTED) & w.hash_ok)
        w_to = nxt[w_idx]
        c_idx = np.flatnonzero((c.kind != EVICTED) & c.hash_ok)
        c_to = carried_next[c_idx]
        if not final:  # a copy without a next event yet waits for one
            w_idx, w_to = w_idx[w_to >= 0], w_to[w_to >= 0]
            c_idx, c_to = c_idx[c_to >= 0], c_to[c_to >= 0]
        if w_idx.size + c_idx.size == 0:
            return None, None
        start = np.concatenate([c.seq[c_idx], w.seq[w_idx]])
        key = np.concatenate([c.key[c_idx], w.key[w_idx]])
        h = np.concatenate([c.hash[c_idx], w.hash[w_idx]])
        to = np.concatenate([c_to, w_to])
        has_next = to >= 0
        if w.seq.size:
            at = np.where(has_next, to, 0)
            n_seq, n_kind, n_hash, n_ok = w.seq[at], w.kind[at], w.hash[at], w.hash_ok[at]
        else:
            n_seq = np.zeros(to.size, np.int64)
            n_kind = np.zeros(to.size, np.uint8)
            n_hash, n_ok = np.zeros(to.size, np.uint64), np.zeros(to.size, bool)
        if self.resets_seq.size:
            epoch = self._epoch(start)
            has_reset = epoch < self.resets_seq.size
            r_seq = self.resets_seq[np.minimum(epoch, self.resets_seq.size - 1)]
        else:
            epoch = np.zeros(to.size, dtype=np.intp)
            has_reset = np.zeros(to.size, dtype=bool)
            r_seq = np.zeros(to.size, dtype=np.int64)
        end_seq = np.where(has_next & has_reset, np.minimum(n_seq, r_seq),
                           np.where(has_next, n_seq, r_seq))
        by_reset = has_reset & (~has_next | (r_seq < n_seq))
        end_kind = np.select(
            [by_reset, ~has_next, n_kind == EVICTED, ~n_ok | (n_hash != h)],
            [END_RESET, END_OPEN, END_EVICTED, END_OVERWRITTEN], END_CONTINUED
        ).astype(np.uint8)
        blk = key.astype(np.int64) + self.block_base - 1
        blk_ok = key != _NO_BLOCK
        all_ok = np.ones(to.size, dtype=bool)
        copies = None
        keep = (end_kind == END_OVERWRITTEN) | self.maybe_bound(h, all_ok)
        if keep.any():
            copies = pa.table({
                "block_id": _masked(blk[keep], blk_ok[keep], pa.int32()),
                "block_hash": pa.array(h[keep], pa.uint64()),
                "start_seq": pa.array(start[keep]),
                "end_seq": _masked(end_seq[keep], (has_next | has_reset)[keep], pa.int64()),
                "end_kind": pa.array(end_kind[keep]),
            })
        synthetic = None
        rs = np.flatnonzero(end_kind == END_RESET)
        if rs.size:
            k = rs.size
            synthetic = pa.Table.from_arrays([
                pa.array(r_seq[rs]), self.resets_ts.take(pa.array(epoch[rs])),
                _masked(blk[rs], blk_ok[rs], pa.int32()), pa.array(h[rs], pa.uint64()),
                pa.array(["reset"] * k, pa.string()), pa.nulls(k, pa.string()),
                pa.array(np.ones(k, dtype=bool)), pa.nulls(k, pa.uint64()),
                pa.array(h[rs], pa.uint64()), pa.array(np.ones(k, dtype=bool)),
                pa.array(self.maybe_bound(h[rs], all_ok[rs])),
            ], schema=_LOSSES_SCHEMA)
        return copies, synthetic


def build(con: Any, *, window: int | None = None,
          progress: Callable[[int], None] | None = None) -> None:
    """Fill ``kv_losses`` and ``kv_copies`` on ``con`` (needs ``events`` and ``kv_runs``).

    ``window``: seqs read at once (default ``WINDOW_SEQS``); the results never depend on it.
    """
    window = WINDOW_SEQS if window is None else window
    con.execute(LOSSES_DDL)
    con.execute(COPIES_DDL)
    runs = con.execute(f"""
        SELECT r.run_id, r.first_seq, r.last_seq, b.min_block
        FROM kv_runs r
        JOIN (SELECT run_id, min(block_id) AS min_block FROM events
              WHERE event IN {_BLOCK_EVENTS} GROUP BY run_id) b USING (run_id)
        ORDER BY r.run_id""").fetchall()
    resets: dict[str, tuple[np.ndarray, pa.Array]] = {}
    for rid, seqs, tss in con.execute("""
            SELECT run_id, list(seq ORDER BY seq), list(ts_ns ORDER BY seq) FROM events
            WHERE event = 'cache_reset' GROUP BY run_id""").fetchall():
        resets[rid] = (np.asarray(seqs, dtype=np.int64), pa.array(tss, pa.int64()))
    n_bound = dict(con.execute(f"""
        SELECT run_id, count(DISTINCT block_hash) FROM events WHERE {_BOUND_WHERE}
        GROUP BY run_id""").fetchall())
    no_resets = (np.zeros(0, np.int64), pa.array([], pa.int64()))
    # NOTE: windows come in the table's order (the loader writes each run in seq order), so
    # they need no sort when that holds; a window out of order is sorted here.
    keep_order = con.execute(
        "SELECT current_setting('preserve_insertion_order')").fetchall()[0][0]
    con.execute("SET preserve_insertion_order = true")
    try:
        for rid, first, last, min_block in runs:
            bitmap = None
            if n_bound.get(rid):
                size = bitmap_size(n_bound[rid])
                slots = con.execute(f"""
                    SELECT DISTINCT block_hash % $size AS slot FROM events
                    WHERE run_id = $rid AND {_BOUND_WHERE}""",
                                    {"rid": rid, "size": size}).fetchnumpy()["slot"]
                bitmap = np.zeros(size, dtype=bool)
                bitmap[np.asarray(slots, dtype=np.int64)] = True
            r_seq, r_ts = resets.get(rid, no_resets)
            timeline = RunTimeline(r_seq, r_ts, bitmap, 0 if min_block is None else min_block)
            lo = int(first)
            while True:
                hi = lo + window
                final = hi > last
                params = {"rid": rid, "lo": lo, "hi": hi}
                table = con.sql(_WINDOW_SQL, params=params).to_arrow_table()
                if table.num_rows > 1:
                    seqs = table.column("seq").to_numpy()
                    if not bool(np.all(seqs[1:] > seqs[:-1])):
                        table = table.take(pa.array(np.argsort(seqs, kind="stable")))
                evictions = con.sql(_EVICTIONS_SQL, params=params).to_arrow_table()
                evictions = evictions.combine_chunks()
                losses, copies = timeline.step(table, evictions, final)
                _insert(con, "kv_losses_chunk", _LOSSES_INSERT, losses, rid)
                _insert(con, "kv_copies_chunk", _COPIES_INSERT, copies, rid)
                if progress is not None:
                    progress(table.num_rows)
                if final:
                    break
                lo = hi
                if table.num_rows == 0:  # skip a stretch of seqs without block events
                    nxt = con.execute(f"""
                        SELECT min(seq) FROM events
                        WHERE run_id = $rid AND seq >= $lo AND event IN {_BLOCK_EVENTS}""",
                                      {"rid": rid, "lo": lo}).fetchall()[0][0]
                    lo = max(lo, int(last) if nxt is None else int(nxt))
    finally:
        con.execute(f"SET preserve_insertion_order = {bool(keep_order)}")


def _insert(con: Any, name: str, sql: str, table: pa.Table | None, rid: str) -> None:
    if table is None or table.num_rows == 0:
        return
    con.register(name, table)
    try:
        con.execute(sql, {"rid": rid})
    finally:
        con.unregister(name)
