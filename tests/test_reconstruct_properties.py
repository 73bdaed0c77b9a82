"""Property tests: the SQL reconstructor agrees with a small, independent plain-Python labeler
on random event sequences (cache/evict/reset, claim lifecycle, rebinding, gaps)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reconstruct import core, loader
from reconstruct.jsonl import events_to_table

SEV = {"harm": 5, "unknown": 4, "expiry": 3, "relaxation": 2, "eviction": 1}
CLAIMS = ("c1", "c2")
HASHES = (11, 12, 13)
BLOCKS = (1, 2, 3, 4)


def reference_labels(events: list[dict[str, Any]]) -> dict[tuple[int, int], str]:
    """(seq, block_id) -> block label, computed event by event (DESIGN §4)."""
    content: dict[int, int] = {}            # block -> hash it holds
    last_block_ev: dict[int, tuple[str, int | None]] = {}
    copies: dict[int, int] = {}
    claims: dict[str, dict[str, Any]] = {}
    unknown_from = min([min(e["seq"], e.get("first_seq", e["seq"]))
                        for e in events if e["event"] == "recorder_gap"], default=None)
    out: dict[tuple[int, int], str] = {}
    # NOTE: a claim submitted only after a loss cannot have been in force at it (acceptance
    # follows submission): that loss is an eviction. Only a claim never submitted anywhere in
    # the run has a state that cannot be established (unknown).
    submitted_ever = {e["claim_id"] for e in events if e["event"] == "claim_submitted"}

    def claim(cid: str) -> dict[str, Any]:
        return claims.setdefault(cid, {"submitted": None, "accepted": None, "release": None,
                                       "k": None, "bind": {}, "mat": None, "maxpos": -1})

    def pred(c: dict[str, Any]) -> bool:
        k = c["k"] if c["k"] is not None else c["maxpos"] + 1
        if k < 1:
            return False
        return all(p in c["bind"] and copies.get(c["bind"][p][0], 0) > 0 for p in range(k))

    def lose(block: int) -> None:
        h = content.pop(block)
        copies[h] -= 1

    for e in events:
        seq, ev = e["seq"], e["event"]
        losses: list[tuple[int, int | None]] = []
        if ev in ("block_cached", "block_hit"):
            b, h = e["block_id"], e["block_hash"]
            if content.get(b) != h:
                if b in content:
                    lose(b)
                content[b] = h
                copies[h] = copies.get(h, 0) + 1
            last_block_ev[b] = (ev, h)
        elif ev == "block_evicted":
            b = e["block_id"]
            prev = last_block_ev.get(b)
            h = e.get("block_hash")
            if h is None and prev is not None and prev[0] != "block_evicted":
                h = prev[1]
            if b in content:
                lose(b)
            last_block_ev[b] = (ev, None)
            losses.append((b, h))
        elif ev == "cache_reset":
            for b in sorted(content):
                losses.append((b, content[b]))
                lose(b)
        elif ev.startswith("claim_"):
            c = claim(e["claim_id"])
            if ev == "claim_submitted" and c["submitted"] is None:
                c["submitted"], c["k"] = seq, e.get("threshold_blocks")
            elif ev == "claim_accepted" and c["accepted"] is None:
                c["accepted"] = seq
            elif ev in ("claim_demoted", "claim_expired", "claim_released") and not c["release"]:
                c["release"] = (seq, ev)
            elif ev == "claim_bound":
                c["bind"][e["position"]] = (e["block_hash"], seq)
                c["maxpos"] = max(c["maxpos"], e["position"])
        # materialization: first seq the predicate holds while in force
        for c in claims.values():
            in_force = (c["accepted"] is not None and c["accepted"] <= seq
                        and (c["release"] is None or seq < c["release"][0]))
            if c["mat"] is None and in_force and pred(c):
                c["mat"] = seq
        for b, h in losses:
            labs = []
            for cid, c in claims.items():
                if h is None or not any(bh == h and bs < seq for bh, bs in c["bind"].values()):
                    continue
                if unknown_from is not None and seq >= unknown_from:
                    labs.append("unknown")
                elif cid not in submitted_ever:
                    labs.append("unknown")
                elif c["accepted"] is None or c["accepted"] > seq:
                    labs.append("eviction")
                elif c["release"] and c["release"][0] < seq:
                    labs.append("expiry" if c["release"][1] == "claim_expired" else "relaxation")
                elif c["mat"] is not None and c["mat"] < seq and not pred(c):
                    labs.append("harm")
                else:
                    labs.append("eviction")
            if (unknown_from is not None and seq >= unknown_from) or h is None:
                out[(seq, b)] = "unknown"
            else:
                out[(seq, b)] = max(labs, key=SEV.__getitem__) if labs else "eviction"
    return out


# -- random traces -----------------------------------------------------------------------------

block_op = st.one_of(
    st.tuples(st.just("block_cached"), st.sampled_from(BLOCKS), st.sampled_from(HASHES)),
    st.tuples(st.just("block_hit"), st.sampled_from(BLOCKS), st.sampled_from(HASHES)),
    st.tuples(st.just("block_evicted"), st.sampled_from(BLOCKS),
              st.one_of(st.none(), st.sampled_from(HASHES))),
    st.tuples(st.just("cache_reset")),
)
claim_op = st.one_of(
    st.tuples(st.just("claim_submitted"), st.sampled_from(CLAIMS),
              st.one_of(st.none(), st.integers(1, 3))),
    st.tuples(st.sampled_from(["claim_accepted", "claim_rejected", "claim_demoted",
                               "claim_expired", "claim_released"]), st.sampled_from(CLAIMS)),
    st.tuples(st.just("claim_bound"), st.sampled_from(CLAIMS), st.sampled_from(HASHES),
              st.integers(0, 2)),
)
gap_op = st.tuples(st.just("recorder_gap"))
ops = st.lists(st.one_of(block_op, block_op, claim_op, gap_op.filter(lambda _: True)),
               min_size=1, max_size=40)


def build(run_id: str, program: list[tuple]) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [{"event": "run_started", "policy": "native"}]
    for op in program:
        name = op[0]
        if name in ("block_cached", "block_hit"):
            events.append({"event": name, "block_id": op[1], "block_hash": op[2], "position": 0})
        elif name == "block_evicted":
            ev = {"event": name, "block_id": op[1], "cause": "allocation"}
            if op[2] is not None:
                ev["block_hash"] = op[2]
            events.append(ev)
        elif name == "cache_reset":
            events.append({"event": name})
        elif name == "claim_submitted":
            ev = {"event": name, "claim_id": op[1], "protection_mode": "best_effort"}
            if op[2] is not None:
                ev["threshold_blocks"] = op[2]
            events.append(ev)
        elif name == "claim_bound":
            events.append({"event": name, "claim_id": op[1], "block_hash": op[2],
                           "position": op[3]})
        elif name == "recorder_gap":
            events.append({"event": name, "events_dropped": 0})
        else:
            events.append({"event": name, "claim_id": op[1]})
    out = []
    for i, ev in enumerate(events):
        ev = {"run_id": run_id, "seq": i, "ts_ns": 1000 * (i + 1), **ev}
        if ev["event"] == "recorder_gap":
            ev.update(first_seq=i, last_seq=i)  # a gap that dropped nothing still bounds trust
        out.append(ev)
    return out


def sql_labels(events: list[dict[str, Any]]) -> dict[tuple[str, int, int], str]:
    batches = [loader.decode_batch(b) for b in events_to_table(events).to_batches()]
    t = core.reconstruct(pa.Table.from_batches(batches, schema=loader.EVENTS_SCHEMA))
    return {(r, s, b): lab for r, s, b, lab in
            t.con.sql("SELECT run_id, seq, block_id, label FROM losses").fetchall()}


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops, ops)
def test_sql_labels_equal_reference_labels(prog_a: list[tuple], prog_b: list[tuple]) -> None:
    ev_a, ev_b = build("a", prog_a), build("b", prog_b)
    expected = {("a", s, b): lab for (s, b), lab in reference_labels(ev_a).items()}
    expected |= {("b", s, b): lab for (s, b), lab in reference_labels(ev_b).items()}
    assert sql_labels(ev_a + ev_b) == expected
