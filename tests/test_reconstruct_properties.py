"""Property tests: the labelling core (reconstruct/labels.py) agrees with a small, independent
plain-Python labeler on random traces: cache/hit/evict/reset with several copies of a hash,
request references, claim-id reuse (each submit a new instance; a rejected one never captures
the id's later events), every protection mode, lifecycle ends legitimate or not (docs/design.md
§5 "Lifecycle legitimacy"), hits the timeline contradicts, scheduler steps, gaps (a gap's whole
step) and hook failures (docs/design.md §5 "Label rules")."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvclaims.reconstruct import core, loader
from kvclaims.sources.jsonl import events_to_table
from kvclaims.contract.vocabulary import LABEL_SEVERITY, RESIDENCY_MODES

CLAIMS = ("c1", "c2")
HASHES = (11, 12, 13)
BLOCKS = (1, 2, 3, 4)
MODES = ("best_effort", "soft_priority", "hard_protected", "demotable", "expiring")
TENANTS = ("ta", "tb")
TTLS = (None, 2e-06, 1.0)     # seconds: 2000 ns is two events of the generated traces
RELEASES = ("claim_demoted", "claim_expired", "claim_released")


def _legit(c: dict[str, Any], e: dict[str, Any]) -> bool:
    """Whether lifecycle end ``e`` may end instance ``c``'s force (docs/design.md §5)."""
    ev = e["event"]
    if ev == "claim_demoted":
        return c["mode"] == "demotable"
    if ev == "claim_expired":
        return (c["mode"] == "expiring" and c["ttl"] is not None and c["accepted_ts"] is not None
                and e["ts_ns"] >= c["accepted_ts"] + round(c["ttl"] * 1e9))
    return e.get("released_by") == "operator" or (
        e.get("released_by") == "tenant" and e.get("tenant") is not None
        and e.get("tenant") == c["tenant"])


def instances(events: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """claim_seq -> the instance's whole-trace facts; sets e["claim_seq"] on claim events.

    A submit starts an instance; its acceptance/rejection belongs to it; any other event goes to
    the latest instance not rejected before it (else the latest earlier one never rejected)."""
    latest: dict[str, int] = {}
    rejected: dict[int, int] = {}        # submission seq -> its first rejection seq
    subs: dict[str, list[int]] = {}
    for e in events:                     # first pass: the submissions and their rejections
        if not e["event"].startswith("claim_") or e.get("claim_id") is None:
            continue
        cid = e["claim_id"]
        if e["event"] == "claim_submitted":
            latest[cid] = e["seq"]
            subs.setdefault(cid, []).append(e["seq"])
        elif e["event"] == "claim_rejected" and cid in latest:
            rejected.setdefault(latest[cid], e["seq"])
    latest = {}
    out: dict[int, dict[str, Any]] = {}
    for e in events:
        if not e["event"].startswith("claim_") or e.get("claim_id") is None:
            continue
        cid = e["claim_id"]
        ev = e["event"]
        if ev == "claim_submitted" or cid not in latest:
            latest[cid] = e["seq"]
            out[e["seq"]] = {"id": cid, "submitted": False, "mode": "hard_protected",
                             "threshold": None, "maxpos": -1, "accepted": None,
                             "accepted_ts": None, "release": None, "tenant": None,
                             "ttl": None}
        cs = latest[cid]
        if ev not in ("claim_submitted", "claim_accepted", "claim_rejected") \
                and rejected.get(cs, e["seq"]) < e["seq"]:
            live = [x for x in subs.get(cid, []) if x < cs and x not in rejected]
            cs = live[-1] if live else cs
        c = out[cs]
        e["claim_seq"] = cs
        if ev == "claim_submitted":
            c.update(submitted=True, mode=e.get("protection_mode") or "hard_protected",
                     threshold=e.get("threshold_blocks"), tenant=e.get("tenant"),
                     ttl=e.get("ttl_s"))
        elif ev == "claim_accepted" and c["accepted"] is None:
            c["accepted"] = e["seq"]
            c["accepted_ts"] = e["ts_ns"]
        elif ev in RELEASES and c["release"] is None and _legit(c, e):
            c["release"] = (e["seq"], ev)
        elif ev == "claim_bound":
            c["maxpos"] = max(c["maxpos"], e["position"])
    for c in out.values():
        c["k"] = c["threshold"] if c["threshold"] is not None else c["maxpos"] + 1
    return out


def unknown_from_seq(events: list[dict[str, Any]]) -> int | None:
    """The first seq from which every loss is unknown: a gap's first dropped seq, or the first
    seq of the scheduler step of the last event held before it."""
    gap = min([min(e["seq"], e.get("first_seq", e["seq"]))
               for e in events if e["event"] == "recorder_gap"], default=None)
    if gap is None:
        return None
    before = [e for e in events if e["seq"] < gap]
    step = before[-1].get("step") if before else None
    if step is None:
        return gap
    return min([gap] + [e["seq"] for e in events if e.get("step") == step])


def reference(events: list[dict[str, Any]]) -> tuple[dict, dict]:
    """((seq, block) -> loss label, (seq, block, claim_seq) -> pair label), event by event."""
    inst = instances(events)
    content: dict[int, int] = {}          # block -> hash held
    refs: dict[int, int] = {}             # block -> request references
    last: dict[int, tuple[str, int | None]] = {}
    binds: dict[int, dict[int, int]] = {cs: {} for cs in inst}   # claim_seq -> pos -> hash
    mat: dict[int, int] = {}
    unknown_from = unknown_from_seq(events)
    hook: int | None = None
    pending: list[tuple[int, int, int | None, dict[int, bool]]] = []
    losses: dict[tuple[int, int], str] = {}
    pairs: dict[tuple[int, int, int], str] = {}

    def copies(h: int) -> int:
        return sum(1 for x in content.values() if x == h)

    def pred(cs: int) -> bool:
        k = inst[cs]["k"]
        return k >= 1 and all(p in binds[cs] and copies(binds[cs][p]) > 0 for p in range(k))

    def in_force(cs: int, now: int) -> bool:
        c = inst[cs]
        return (c["accepted"] is not None and c["accepted"] <= now
                and (c["release"] is None or c["release"][0] > now)
                and not (c["release"] is not None and c["release"][0] < c["accepted"]))

    def lower_priority_evictable(now: int) -> bool:
        covered = {h for cs, b in binds.items() if in_force(cs, now)
                   and inst[cs]["mode"] != "best_effort"
                   for p, h in b.items() if p < inst[cs]["k"]}
        return any(refs.get(b, 0) == 0 and h not in covered for b, h in content.items())

    def lose(seq: int, block: int, h: int | None, low: bool) -> None:
        bound = {} if h is None else {cs: low for cs, b in binds.items() if h in b.values()}
        pending.append((seq, block, h, bound))

    def judge(now: int) -> None:
        for seq, block, h, bound in pending:
            labs = []
            for cs, low in bound.items():
                c = inst[cs]
                if unknown_from is not None and seq >= unknown_from:
                    lab = "unknown"
                elif not c["submitted"]:
                    lab = "unknown"
                elif c["accepted"] is None or c["accepted"] > seq:
                    lab = "eviction"
                elif c["release"] is not None and c["release"][0] < seq:
                    lab = "expiry" if c["release"][1] == "claim_expired" else "relaxation"
                elif c["mode"] == "best_effort":
                    lab = "eviction"
                elif hook is not None and hook < seq:
                    lab = "unknown"
                elif cs not in mat or mat[cs] >= seq or pred(cs):
                    lab = "eviction"
                elif c["mode"] == "soft_priority" and not low:
                    lab = "eviction"
                else:
                    # a residency promise, or soft_priority with a lower-priority block to take
                    assert c["mode"] in RESIDENCY_MODES or c["mode"] == "soft_priority"
                    lab = "harm"
                pairs[(seq, block, cs)] = lab
                labs.append(lab)
            if (unknown_from is not None and seq >= unknown_from) or h is None:
                losses[(seq, block)] = "unknown"
            else:
                losses[(seq, block)] = max(labs, key=LABEL_SEVERITY.__getitem__,
                                           default="eviction")
        pending.clear()
        for cs in inst:
            if cs not in mat and pred(cs) and in_force(cs, now):
                mat[cs] = now

    for i, e in enumerate(events):
        seq, ev = e["seq"], e["event"]
        if ev == "block_hit":
            # presence only where the timeline has it: a contradicting hit changes no content
            refs[e["block_id"]] = refs.get(e["block_id"], 0) + 1
        elif ev == "block_cached":
            b, h = e["block_id"], e["block_hash"]
            content[b] = h
            last[b] = (ev, h)
        elif ev == "block_allocated":
            refs[e["block_id"]] = refs.get(e["block_id"], 0) + 1
        elif ev == "block_freed":
            refs[e["block_id"]] = max(0, refs.get(e["block_id"], 0) - 1)
        elif ev == "block_evicted":
            b = e["block_id"]
            h = e.get("block_hash")
            if h is None and last.get(b, ("", None))[0] == "block_cached":
                h = last[b][1]
            lose(seq, b, h, lower_priority_evictable(seq))
            content.pop(b, None)
            last[b] = (ev, None)
        elif ev == "cache_reset":
            for b in sorted(content):
                # NOTE: a reset drops every block at once: no eviction order is broken
                lose(seq, b, content[b], False)
            content.clear()
        elif ev == "claim_bound":
            binds[e["claim_seq"]][e["position"]] = e["block_hash"]
        elif ev == "hook_failed" and hook is None:
            hook = seq
        # judged after a stepless event, or at the end of a scheduler step
        nxt = events[i + 1] if i + 1 < len(events) else None
        if e.get("step") is None or nxt is None or nxt.get("step") != e["step"]:
            judge(seq)
    return losses, pairs


# -- random traces -----------------------------------------------------------------------------

block_op = st.one_of(
    st.tuples(st.just("block_cached"), st.sampled_from(BLOCKS), st.sampled_from(HASHES)),
    st.tuples(st.just("block_hit"), st.sampled_from(BLOCKS), st.sampled_from(HASHES)),
    st.tuples(st.just("block_evicted"), st.sampled_from(BLOCKS),
              st.one_of(st.none(), st.sampled_from(HASHES))),
    st.tuples(st.sampled_from(["block_allocated", "block_freed"]), st.sampled_from(BLOCKS)),
    st.tuples(st.just("cache_reset")),
)
claim_op = st.one_of(
    st.tuples(st.just("claim_submitted"), st.sampled_from(CLAIMS),
              st.one_of(st.none(), st.integers(1, 3)), st.sampled_from(MODES),
              st.sampled_from(TENANTS), st.sampled_from(TTLS)),
    st.tuples(st.sampled_from(["claim_accepted", "claim_rejected", "claim_demoted",
                               "claim_expired"]),
              st.sampled_from(CLAIMS)),
    st.tuples(st.just("claim_released"), st.sampled_from(CLAIMS),
              st.sampled_from(["tenant", "operator", "arbiter", None]),
              st.sampled_from(TENANTS)),
    st.tuples(st.just("claim_bound"), st.sampled_from(CLAIMS), st.sampled_from(HASHES),
              st.integers(0, 2)),
)
# composite ops make the interesting cases common: a claim covering two cached hashes at once,
# and a block lost and cached again with the same content (in one step when the trace has steps)
compound_op = st.one_of(
    st.tuples(st.just("claim_all"), st.sampled_from(CLAIMS), st.sampled_from(MODES)),
    st.tuples(st.just("churn"), st.sampled_from(BLOCKS), st.sampled_from(HASHES[:2])),
)
rare_op = st.sampled_from([("recorder_gap",), ("hook_failed",)])
step_op = st.just(("next_step",))
random_ops = st.lists(st.one_of(block_op, block_op, claim_op, claim_op, compound_op,
                                compound_op, step_op, step_op, rare_op),
                      min_size=1, max_size=40)
# half the programs start with a materialized claim (the cases where labels differ most)
materialized = st.sampled_from(MODES).map(lambda mode: [
    ("claim_all", "c1", mode), ("block_cached", 1, HASHES[0]), ("block_cached", 2, HASHES[1]),
    ("next_step",)])
ops = st.tuples(st.one_of(st.just([]), materialized), random_ops).map(lambda t: t[0] + t[1])


def _expand(op: tuple) -> list[tuple]:
    """Composite ops as plain ones."""
    if op[0] == "claim_all":
        ttl = 2e-06 if op[2] == "expiring" else None
        return [("claim_submitted", op[1], 2, op[2], "ta", ttl), ("claim_accepted", op[1]),
                ("claim_bound", op[1], HASHES[0], 0), ("claim_bound", op[1], HASHES[1], 1)]
    if op[0] == "churn":
        return [("block_evicted", op[1], op[2]), ("block_cached", op[1], op[2])]
    return [op]


def build(run_id: str, program: list[tuple], stepped: bool) -> list[dict[str, Any]]:
    """A trace of ``program``; with ``stepped`` every event carries its scheduler step."""
    events: list[dict[str, Any]] = [{"event": "run_started", "policy": "native"}]
    step = 0
    program = [part for op in program for part in _expand(op)]
    for op in program:
        name = op[0]
        ev: dict[str, Any]
        if name == "next_step":
            step += 1
            continue
        if name in ("block_cached", "block_hit"):
            ev = {"event": name, "block_id": op[1], "block_hash": op[2], "position": 0}
        elif name == "block_evicted":
            ev = {"event": name, "block_id": op[1], "cause": "allocation"}
            if op[2] is not None:
                ev["block_hash"] = op[2]
        elif name in ("block_allocated", "block_freed"):
            ev = {"event": name, "block_id": op[1], "request_id": "r"}
        elif name == "cache_reset":
            ev = {"event": name}
        elif name == "claim_submitted":
            ev = {"event": name, "claim_id": op[1], "protection_mode": op[3], "tenant": op[4]}
            if op[2] is not None:
                ev["threshold_blocks"] = op[2]
            if op[5] is not None:
                ev["ttl_s"] = op[5]
        elif name == "claim_released":
            ev = {"event": name, "claim_id": op[1], "tenant": op[3]}
            if op[2] is not None:
                ev["released_by"] = op[2]
        elif name == "claim_bound":
            ev = {"event": name, "claim_id": op[1], "block_hash": op[2], "position": op[3]}
        elif name == "recorder_gap":
            ev = {"event": name, "events_dropped": 0}
        elif name == "hook_failed":
            ev = {"event": name, "hook": "schedule", "error_type": "RuntimeError"}
        else:
            ev = {"event": name, "claim_id": op[1]}
        if stepped:
            ev["step"] = step
        events.append(ev)
    out = []
    for i, ev in enumerate(events):
        ev = {"run_id": run_id, "seq": i, "ts_ns": 1000 * (i + 1), **ev}
        if ev["event"] == "recorder_gap":
            ev.update(first_seq=i, last_seq=i)  # a gap that dropped nothing still bounds trust
        out.append(ev)
    return out


def core_labels(events: list[dict[str, Any]]) -> tuple[dict, dict]:
    batches = [loader.decode_batch(b) for b in events_to_table(events).to_batches()]
    t = core.reconstruct(pa.Table.from_batches(batches, schema=loader.EVENTS_SCHEMA))
    losses = {(r, s, b): lab for r, s, b, lab in
              t.con.sql("SELECT run_id, seq, block_id, label FROM losses").fetchall()}
    pairs = {(r, s, b, c): lab for r, s, b, c, lab in t.con.sql(
        "SELECT run_id, seq, block_id, claim_seq, label FROM loss_claims").fetchall()}
    return losses, pairs


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops, ops, st.booleans())
def test_core_labels_equal_reference_labels(prog_a: list[tuple], prog_b: list[tuple],
                                            stepped: bool) -> None:
    ev_a, ev_b = build("a", prog_a, stepped), build("b", prog_b, not stepped)
    want_losses: dict = {}
    want_pairs: dict = {}
    for rid, evs in (("a", ev_a), ("b", ev_b)):
        losses, pairs = reference([dict(e) for e in evs])
        want_losses |= {(rid, *key): lab for key, lab in losses.items()}
        want_pairs |= {(rid, *key): lab for key, lab in pairs.items()}
    got_losses, got_pairs = core_labels(ev_a + ev_b)
    assert got_losses == want_losses
    assert got_pairs == want_pairs


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops, ops)
def test_every_claim_event_joins_the_reference_instance(prog_a: list[tuple],
                                                        prog_b: list[tuple]) -> None:
    """reconstruct/identity.py's one ordered pass gives each claim event the instance the
    reference gives it (kv_claim_ev, kv_claim_binds), and each submission its first rejection
    (kv_claim_subs)."""
    evs = build("a", prog_a, False) + build("b", prog_b, True)
    want: dict[tuple[str, int], int] = {}
    want_rejected: dict[tuple[str, int], int | None] = {}
    for rid in ("a", "b"):
        ref = [dict(e) for e in evs if e["run_id"] == rid]
        instances(ref)
        want |= {(rid, e["seq"]): e["claim_seq"] for e in ref if "claim_seq" in e}
        for e in ref:
            if e["event"] == "claim_submitted":
                want_rejected[(rid, e["seq"])] = None
            elif e["event"] == "claim_rejected" and (rid, e["claim_seq"]) in want_rejected:
                want_rejected[(rid, e["claim_seq"])] = (want_rejected[(rid, e["claim_seq"])]
                                                        or e["seq"])
    batches = [loader.decode_batch(b) for b in events_to_table(evs).to_batches()]
    t = core.reconstruct(pa.Table.from_batches(batches, schema=loader.EVENTS_SCHEMA))
    got = {(r, s): c for r, s, c in
           t.con.sql("SELECT run_id, seq, claim_seq FROM kv_claim_ev UNION ALL "
                     "SELECT run_id, seq, claim_seq FROM kv_claim_binds").fetchall()}
    assert got == want
    got_rejected = {(r, s): j for r, s, j in t.con.sql(
        "SELECT run_id, sub_seq, rejected_seq FROM kv_claim_subs").fetchall()}
    assert got_rejected == want_rejected
