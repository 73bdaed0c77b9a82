"""Every sentence of an explanation is true of the tables it came from: each number in a
capacity, demotion or loss sentence is recomputed here from ``feasibility``, ``loss_claims``,
``claims`` and ``events`` (independently of kvclaims.explaining) and compared."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import kvclaims
from kvclaims.explaining import NO_WHATIF, Section, explain

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO / "traces"
NATIVE_80 = TRACES / "sweep-resident60_active70" / "resident60_active70-native-80"

_CAPACITY = re.compile(
    r"at its admission \(seq (\d+)\) it needed (\d+) block\(s\) while (\d+) were usable and "
    r"(\d+) were protected by claims in force \((\d+) claim\(s\) of yours, (\d+) of other "
    r"tenants\) - (\d+) \+ (\d+) (<=|>) (\d+): (it fit|it did not fit)")
_DEMOTION = re.compile(
    r"\(seq (\d+)\) your claim was demoted to admit .*?: it needed (\d+) block\(s\) while "
    r"(\d+) were usable and (\d+) blocks of claims in force were protected at the decision "
    r"\((\d+) claim\(s\) of yours, (\d+) of other tenants\) - (\d+) \+ (\d+) (<=|>) (\d+): "
    r"it did not fit, so (\d+) claim\(s\) holding (\d+) block\(s\) were demoted; after that "
    r"(\d+) \+ (\d+) (<=|>) (\d+) at its admission \(seq (\d+)\)")
_LOSS = re.compile(r"(?:seq (\d+)-(\d+): )?(\d+) block\(s\) lost \(positions ([\d, -]+)"
                   r"(?:; physical block ids ([\d, -]+))?\)")


@pytest.fixture(scope="module")
def shipped() -> Iterator[Any]:
    paths = sorted(p for p in TRACES.iterdir() if p.is_dir() and p.name != "arbiter-prototype")
    with kvclaims.open(paths) as a:
        yield a


def _sections(audit: Any) -> list[Section]:
    tenants = [r[0] for r in audit.sql("SELECT DISTINCT tenant FROM claims "
                                       "WHERE tenant IS NOT NULL ORDER BY 1").fetchall()]
    return [s for t in tenants for s in explain(audit, t).sections if s.kind == "claim"]


def _expand(ranges: str) -> set[int]:
    out: set[int] = set()
    for part in ranges.split(", "):
        a, _, b = part.partition("-")
        out |= set(range(int(a), int(b or a) + 1))
    return out


def _tenant_of(audit: Any, run: str, claim_seq: int) -> str | None:
    rows = audit.sql(f"SELECT tenant FROM claims WHERE run_id = '{run}' "
                     f"AND claim_seq = {claim_seq}").fetchall()
    return rows[0][0] if rows else None


def capacity_problems(audit: Any, s: Section, tenant: str, sentence: str) -> list[str]:
    """What in a capacity sentence the ``feasibility`` admission row does not say."""
    m = _CAPACITY.search(sentence)
    if m is None:
        return []
    seq, need, usable, prot, mine, theirs, p2, n2, rel, u2, verdict = m.groups()
    rows = audit.sql(f"""
        SELECT blocks_required, usable_blocks, protected_blocks, protected_claim_seqs
        FROM feasibility WHERE run_id = '{s.run_id}' AND seq = {seq}
          AND decision = 'admitted'""").fetchall()
    if len(rows) != 1:
        return [f"no admission row at seq {seq}"]
    f_need, f_usable, f_prot, seqs = rows[0]
    own = sum(_tenant_of(audit, s.run_id, x) == tenant for x in seqs or [])
    want = (f_need, f_usable, f_prot, own, len(seqs or []) - own, f_prot, f_need, f_usable)
    got = tuple(int(x) for x in (need, usable, prot, mine, theirs, p2, n2, u2))
    probs = [f"figures {got} != table {want}"] if got != want else []
    fits = f_prot + f_need <= f_usable
    if (rel == "<=") != fits or (verdict == "it fit") != fits:
        probs.append(f"relation {rel}/{verdict} wrong for {f_prot}+{f_need} vs {f_usable}")
    return probs


def _resident(audit: Any, run: str, claim_seq: int, claim_id: str, before: int) -> int:
    bound, lost = audit.sql(f"""
        SELECT (SELECT count(DISTINCT position) FROM events WHERE run_id = '{run}'
                  AND event = 'claim_bound' AND claim_id = '{claim_id}'
                  AND seq >= {claim_seq} AND seq < {before}),
               (SELECT count(DISTINCT position) FROM loss_claims WHERE run_id = '{run}'
                  AND claim_seq = {claim_seq} AND seq < {before})""").fetchall()[0]
    return bound - lost


def demotion_problems(audit: Any, s: Section, tenant: str, sentence: str) -> list[str]:
    """What in a demotion sentence the tables do not say."""
    m = _DEMOTION.search(sentence)
    if m is None:
        return []
    g = [x if x in ("<=", ">") else int(x) for x in m.groups()]
    dseq, need, usable, before, mine, theirs, b2, n2, rel, u2, k, freed, after, n3, rel2, u3, \
        adm_seq = g
    by = audit.sql(f"SELECT by_request_id FROM events WHERE run_id = '{s.run_id}' "
                   f"AND seq = {dseq}").fetchall()[0][0]
    f_need, f_usable, f_prot, seqs = audit.sql(f"""
        SELECT blocks_required, usable_blocks, protected_blocks, protected_claim_seqs
        FROM feasibility WHERE run_id = '{s.run_id}' AND seq = {adm_seq}
          AND request_id = '{by}' AND decision = 'admitted'""").fetchall()[0]
    demoted = audit.sql(f"""
        SELECT c.claim_seq, c.claim_id FROM claims c JOIN events e
          ON e.run_id = c.run_id AND e.seq = c.release_seq
        WHERE c.run_id = '{s.run_id}' AND c.release_event = 'claim_demoted'
          AND e.by_request_id = '{by}'""").fetchall()
    t_freed = sum(_resident(audit, s.run_id, cs, cid, dseq) for cs, cid in demoted)
    in_force = set(seqs or []) | {cs for cs, _ in demoted}
    own = sum(_tenant_of(audit, s.run_id, x) == tenant for x in in_force)
    want = (f_need, f_usable, f_prot + t_freed, own, len(in_force) - own, len(demoted), t_freed,
            f_prot)
    got = (need, usable, before, mine, theirs, k, freed, after)
    probs = [f"figures {got} != tables {want}"] if got != want else []
    if (b2, n2, u2, n3, u3) != (before, need, usable, need, usable):
        probs.append("the arithmetic repeats other figures")
    if (rel == ">") != (before + need > usable) or (rel2 == "<=") != (after + need <= usable):
        probs.append("a relation is wrong")
    return probs


def loss_problems(audit: Any, s: Section, seq: int, text: str) -> list[str]:
    """What in a loss line (at ``seq``) the claim's ``loss_claims`` rows at that moment do
    not say."""
    m = _LOSS.search(text)
    if m is None:
        return []
    first, last, n, positions, blocks = m.groups()
    lo, hi = (int(first), int(last)) if first else (seq, seq)
    rows = audit.sql(f"""
        SELECT seq, position, block_id FROM loss_claims
        WHERE run_id = '{s.run_id}' AND claim_seq = {s.instance_seq}
          AND seq BETWEEN {lo} AND {hi}""").fetchall()
    probs = []
    if {r[1] for r in rows} != _expand(positions):
        probs.append(f"positions {positions} != {sorted({r[1] for r in rows})}")
    if blocks and {r[2] for r in rows} != _expand(blocks):
        probs.append(f"block ids {blocks} != {sorted({r[2] for r in rows})}")
    if int(n) != len(_expand(positions)):
        probs.append(f"{n} blocks but {len(_expand(positions))} positions")
    return probs


# -- the tests -----------------------------------------------------------------------------------

def test_every_capacity_and_demotion_sentence_matches_its_tables(shipped) -> None:
    checked, probs = 0, []
    for s in _sections(shipped):
        tenant = _tenant_of(shipped, s.run_id, s.instance_seq)
        for w in s.why:
            found = capacity_problems(shipped, s, tenant, w) + demotion_problems(
                shipped, s, tenant, w)
            checked += bool(_CAPACITY.search(w) or _DEMOTION.search(w))
            probs += [f"{s.run_id}/{s.id}: {p}" for p in found]
    assert checked >= 20 and not probs, (checked, probs[:5])


def test_a_wrong_figure_is_caught(shipped) -> None:
    # negative twin: the same check rejects a sentence with one number changed
    for s in _sections(shipped):
        tenant = _tenant_of(shipped, s.run_id, s.instance_seq)
        for w in s.why:
            m = _CAPACITY.search(w)
            if m:
                bad = w.replace(f"and {m.group(4)} were protected",
                                f"and {int(m.group(4)) + 1} were protected")
                assert capacity_problems(shipped, s, tenant, bad)
                return
    pytest.fail("no capacity sentence")


def test_the_multi_tenant_demotion_is_told_as_the_conflict_it_was(shipped) -> None:
    s = next(x for x in _sections(shipped) if x.id == "b:doc")
    w = next(w for w in s.why if _DEMOTION.search(w))
    assert not demotion_problems(shipped, s, "tenant-b", w)
    assert "it did not fit" in w and "both fit" not in "\n".join(s.why)


def test_every_loss_line_names_the_positions_and_block_ids_it_lost(shipped) -> None:
    checked, probs = 0, []
    for s in _sections(shipped):
        for m in s.timeline:
            if _LOSS.search(m.text):
                checked += 1
                probs += [f"{s.run_id}/{s.id}: {p}"
                          for p in loss_problems(shipped, s, m.seq, m.text)]
    assert checked >= 10 and not probs, probs[:5]


def test_a_wrong_position_is_caught(shipped) -> None:
    # negative twin: a loss line with its positions shifted by one is rejected
    s = next(x for x in _sections(shipped) if x.id == "claim:resident"
             and x.run_id == "resident60_active70-native-80")
    m = next(m for m in s.timeline if _LOSS.search(m.text))
    assert loss_problems(shipped, s, m.seq, m.text.replace("positions 16-59", "positions 15-58"))


def test_one_loss_line_per_distinct_moment(shipped) -> None:
    for s in _sections(shipped):
        lines = [m for m in s.timeline if _LOSS.search(m.text)]
        moments = shipped.sql(f"""
            SELECT count(DISTINCT (e.step, l.label, l.by_request_id)) FROM loss_claims l
            JOIN events e USING (run_id, seq)
            WHERE l.run_id = '{s.run_id}' AND l.claim_seq = {s.instance_seq}""").fetchall()[0][0]
        assert len(lines) == moments, (s.run_id, s.id)


def test_the_native_80_harm_is_two_moments(shipped) -> None:
    s = next(x for x in _sections(shipped)
             if x.run_id == "resident60_active70-native-80" and x.id == "claim:resident")
    lines = [m.text for m in s.timeline if _LOSS.search(m.text)]
    assert [_LOSS.search(t).group(3) for t in lines] == ["44", "6"]
    assert "positions 16-59" in lines[0] and "positions 10-15" in lines[1]


def test_advice_never_promises_what_the_mode_cannot(shipped) -> None:
    for s in _sections(shipped):
        text = " ".join(s.prevention)
        assert "None s" not in text
        if s.outcome == "demoted":
            assert ("demotable lets the arbiter demote" in text) == \
                (s.promised["mode"] == "demotable")


def test_the_headline_counts_unknown_claims(shipped) -> None:
    ex = explain(shipped, "tenant-a")
    unknown = sum(s.kind == "claim" and s.outcome == "unknown" for s in ex.sections)
    assert f", {unknown} unknown;" in ex.to_text().splitlines()[0]


def test_an_expiry_without_ttl_gets_no_ttl_advice() -> None:
    from kvclaims.explaining import _Facts

    advice = _Facts.claim_prevention(None, {"protection_mode": "expiring",  # type: ignore
                                            "outcome": "expired", "ttl_s": None}, {})
    assert "ttl_s" not in " ".join(advice) and "no TTL" in " ".join(advice)


def test_a_hard_protected_demotion_is_called_a_bug_not_advice() -> None:
    from kvclaims.explaining import _Facts

    advice = _Facts.claim_prevention(None, {"protection_mode": "hard_protected",  # type: ignore
                                            "outcome": "demoted"}, {})
    assert "runtime bug" in advice[0] and "demotable lets" not in " ".join(advice)


def test_a_demotable_demotion_gets_the_demotable_advice() -> None:
    from kvclaims.explaining import _Facts

    advice = _Facts.claim_prevention(None, {"protection_mode": "demotable",  # type: ignore
                                            "outcome": "demoted"}, {})
    assert advice[0].startswith("demotable lets the arbiter demote your claim")
    assert advice[1:] == [NO_WHATIF]  # no replay computed: nothing said of another policy
