"""Tenant isolation of explanations, by construction: no output for one tenant names another
tenant's identifiers, in any format, on every shipped trace and on generated multi-run,
multi-tenant traces whose ids are reused across runs and tenants (one-letter ids).

Golden files: tests/golden/explain/shipped/<tenant>.<txt|md|html|json> (every tenant of every
shipped trace; regenerate with KVCLAIMS_UPDATE_GOLDEN=1).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

import kvclaims
from kvclaims.explaining import WITHHELD, Explanation, Section, explain, md_escape
from kvclaims.sources.jsonl import event_to_json
from kvclaims.reconstruct.loader import iter_batches
from kvclaims.replays import Replay, find_replays
from tests.test_queries import check_golden
from tests.test_whatif import DEMOTE, multi_whatif, tenanted  # noqa: F401 (fixtures: replays)

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO / "traces"
MULTI = TRACES / "multi_tenant"
MULTI_RUN = "multi_tenant-hard_protected-80"
GOLDEN = REPO / "tests" / "golden" / "explain" / "shipped"
FORMATS = {"text": "txt", "md": "md", "html": "html", "json": "json"}
#: One-letter claim ids for generated traces: letters our own wording never has on their own
#: (no "A" or "I", which start English sentences).
CLAIM_LETTERS = "QZJKWVXY"
REQUEST_LETTERS = "qzjkwvy"  # no "x": tenant-x ends in it


def shipped_paths() -> list[Path]:
    """Every shipped trace in our format (the paper prototype's JSON Lines under
    ``arbiter-prototype`` are another format: they go through ``kvclaims import-arbiter``)."""
    return sorted(p for p in TRACES.iterdir() if p.is_dir() and p.name != "arbiter-prototype")


@pytest.fixture(scope="module")
def shipped() -> Iterator[Any]:
    with kvclaims.open(shipped_paths()) as a:
        yield a


# -- identities, as the leak check sees them ----------------------------------------------------

def identities(audit: Any) -> dict[str, dict[str, set[str]]]:
    """Per run, per tenant: every identifier that is that tenant's (its name, its claim and
    request ids, the hashes its claims bound)."""
    rows = audit.sql("""
        SELECT run_id, tenant, tenant FROM events WHERE tenant IS NOT NULL
        UNION SELECT run_id, tenant, claim_id FROM claims WHERE tenant IS NOT NULL
        UNION SELECT run_id, tenant, request_id FROM requests WHERE tenant IS NOT NULL
        UNION SELECT run_id, tenant, request_id FROM claims
              WHERE tenant IS NOT NULL AND request_id IS NOT NULL
        UNION SELECT e.run_id, c.tenant, e.block_hash::VARCHAR FROM events e
              JOIN claims c ON c.run_id = e.run_id AND c.claim_id = e.claim_id
              WHERE e.event = 'claim_bound' AND c.tenant IS NOT NULL""").fetchall()
    out: dict[str, dict[str, set[str]]] = {}
    for run, tenant, ident in rows:
        out.setdefault(run, {}).setdefault(tenant, set()).add(ident)
    return out


def foreign_in(ids: dict[str, dict[str, set[str]]], tenant: str, run: str) -> set[str]:
    """Identifiers of run ``run`` that belong to someone else and not to ``tenant`` there."""
    mine = ids.get(run, {}).get(tenant, set())
    theirs = set().union(*[v for t, v in ids.get(run, {}).items() if t != tenant] or [set()])
    return theirs - mine


def mentions(text: str, ident: str) -> bool:
    """``ident`` occurs in ``text`` as a token: only letters, digits and ``_`` glue it to its
    neighbours (so ``b:doc.`` and ``b:doc-`` count). Markdown escapes are undone first."""
    plain = re.sub(r"\\(.)", r"\1", text)
    return re.search(rf"(?<![A-Za-z0-9_]){re.escape(ident)}(?![A-Za-z0-9_])", plain) is not None


def leaks(audit: Any, tenant: str, ids: dict[str, dict[str, set[str]]],
          whatifs: Sequence[Replay] = ()) -> list[str]:
    """Every (format, section, identifier) where the tenant's explanation (citing ``whatifs``)
    names an identifier that is not its own in the run the section is about."""
    ex = explain(audit, tenant, whatifs=whatifs)
    own_anywhere = set().union(*[r.get(tenant, set()) for r in ids.values()] or [set()])
    never_own = set().union(*[foreign_in(ids, tenant, r) for r in ids]) - own_anywhere
    found = []
    for fmt in FORMATS:
        whole = ex.render(fmt)
        found += [f"{fmt}: {i}" for i in sorted(never_own) if mentions(whole, i)]
        for s in ex.sections:
            one = Explanation(ex.tenant, ex.runs, ex.clock, [s]).render(fmt)
            found += [f"{fmt} {s.run_id}/{s.id}: {i}"
                      for i in sorted(foreign_in(ids, tenant, s.run_id)) if mentions(one, i)]
    return found


# -- generated traces: ids reused across runs and tenants ---------------------------------------

def _events(path: Path) -> list[dict[str, Any]]:
    return [r for b in iter_batches([path]) for r in b.to_pylist()]


def _rename(ev: dict[str, Any], run_id: str, ids: dict[str, str],
            tenants: dict[str, str]) -> dict[str, Any]:
    out = dict(ev, run_id=run_id)
    for k in ("claim_id", "request_id", "by_request_id"):
        if out.get(k) is not None:
            out[k] = ids[out[k]]
    if out.get("blocking_claim_ids"):
        out["blocking_claim_ids"] = [ids[c] for c in out["blocking_claim_ids"]]
    if out.get("tenant") is not None:
        out["tenant"] = tenants[out["tenant"]]
    if out.get("reason"):
        # the runtime's reasons quote ids; they quote the renamed ones
        out["reason"] = re.sub(r"[\w:.-]+", lambda m: ids.get(m.group(0), m.group(0)),
                               out["reason"])
    return out


def generated_traces(folder: Path) -> list[Path]:
    """Two runs of the multi-tenant trace as JSON Lines: one-letter claim and request ids,
    the same ids in both runs, but in run B every tenant owns what its neighbour owned in
    run A (a tenant-b request in B has the id of a tenant-a request in A)."""
    events = _events(MULTI)
    claims = sorted({e["claim_id"] for e in events if e.get("claim_id")})
    reqs = sorted({e[k] for e in events for k in ("request_id", "by_request_id") if e.get(k)})
    ids = dict(zip(claims, CLAIM_LETTERS, strict=False))
    assert len(ids) == len(claims), "more claims than one-letter ids"
    ids.update({r: (REQUEST_LETTERS[i] if i < len(REQUEST_LETTERS) else f"r{i}")
                for i, r in enumerate(reqs)})
    names = sorted({e["tenant"] for e in events if e.get("tenant")})
    same = {t: t for t in names}
    shifted = {t: names[(i + 1) % len(names)] for i, t in enumerate(names)}
    paths = []
    for run, tenants in (("gen-A", same), ("gen-B", shifted)):
        p = folder / f"{run}.jsonl"
        p.write_text("".join(event_to_json(_rename(e, run, ids, tenants)) + "\n"
                             for e in events))
        paths.append(p)
    return paths


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    paths = generated_traces(tmp_path_factory.mktemp("gen"))
    with kvclaims.open(paths) as a:
        yield a


def _tenants(audit: Any) -> list[str]:
    return sorted(r[0] for r in audit.sql(
        "SELECT DISTINCT tenant FROM events WHERE tenant IS NOT NULL").fetchall())


# -- the leak tests -----------------------------------------------------------------------------

def test_no_shipped_trace_explanation_names_a_foreign_identifier(shipped) -> None:
    ids = identities(shipped)
    tenants = _tenants(shipped)
    assert len(tenants) >= 6
    found = {t: leaks(shipped, t, ids) for t in tenants}
    assert not any(found.values()), {t: v[:5] for t, v in found.items() if v}


def test_no_explanation_citing_a_replay_names_a_foreign_identifier(multi_whatif: Path) -> None:
    found = find_replays([multi_whatif])
    with kvclaims.open([MULTI, DEMOTE]) as audit:
        ids = identities(audit)
        tenants = _tenants(audit)
        found_leaks = {t: leaks(audit, t, ids, found) for t in tenants}
        cited = [line for t in tenants
                 for s in explain(audit, t, whatifs=found).sections for line in s.whatif]
    assert not any(found_leaks.values()), {t: v[:5] for t, v in found_leaks.items() if v}
    assert len(cited) >= 3  # the check ran over citations: tenant-b twice, the demotion once


def test_no_explanation_citing_replays_of_requests_names_a_foreign_identifier(
        tenanted: tuple[Path, Path]) -> None:
    run, folder = tenanted
    found = find_replays([folder])
    with kvclaims.open([run]) as audit:
        ids = identities(audit)
        tenants = _tenants(audit)
        found_leaks = {t: leaks(audit, t, ids, found) for t in tenants}
        cited = {t: [line for s in explain(audit, t, whatifs=found).sections
                     if s.kind == "request" for line in s.whatif] for t in tenants}
    assert not any(found_leaks.values()), {t: v[:5] for t, v in found_leaks.items() if v}
    # the check ran over request citations: tenant-b's two requests and tenant-c's one, each
    # cited by three replays; the replay named after tenant-b's request is withheld from c only
    assert len(cited["tenant-b"]) == 6 and len(cited["tenant-c"]) == 3
    assert any("run id withheld" in line for line in cited["tenant-c"])
    assert not any("run id withheld" in line for line in cited["tenant-b"])


def test_a_replay_whose_run_id_names_another_tenants_claim_is_cited_without_it(
        multi_whatif: Path) -> None:
    named = [r for r in find_replays([multi_whatif]) if r.run_id == "whatif-of-a:doc"]
    with kvclaims.open([MULTI]) as audit:
        # the twin: that run id does name tenant-a's claim, foreign to tenant-b
        assert "a:doc" in foreign_in(identities(audit), "tenant-b", MULTI_RUN)
        assert mentions(named[0].run_id, "a:doc")
        (s,) = [x for x in explain(audit, "tenant-b", whatifs=named).sections
                if x.outcome == "demoted"]
    (line,) = s.whatif
    assert "run id withheld" in line and not mentions(line, "a:doc")


def test_the_generated_traces_reuse_ids_across_runs_and_tenants(generated) -> None:
    ids = identities(generated)
    a, b = ids["gen-A"], ids["gen-B"]
    # the same one-letter id belongs to different tenants in the two runs
    assert any(len(i) == 1 and i in a["tenant-a"] and i in b["tenant-b"]
               for i in a["tenant-a"])


def test_no_generated_trace_explanation_names_a_foreign_identifier(generated) -> None:
    ids = identities(generated)
    found = {t: leaks(generated, t, ids) for t in _tenants(generated)}
    assert not any(found.values()), {t: v[:5] for t, v in found.items() if v}


def test_the_leak_check_finds_another_runs_owner_named_as_yours(generated) -> None:
    # negative twin: a section of run B that calls tenant-a's run-A request "your own" there
    ids = identities(generated)
    theirs = sorted(i for i in foreign_in(ids, "tenant-a", "gen-B")
                    if i in ids["gen-A"]["tenant-a"] and len(i) == 1)
    assert theirs
    s = Section(kind="claim", run_id="gen-B", id="x", instance_seq=1, outcome="demoted",
                title="t", why=[f"to admit your own request {theirs[0]}."])
    ex = Explanation("tenant-a", ["gen-B"], "", [s])
    assert all(mentions(ex.render(f), theirs[0]) for f in FORMATS)


def test_a_cross_run_request_is_never_called_the_tenants_own(generated) -> None:
    ids = identities(generated)
    for s in explain(generated, "tenant-a").sections:
        mine = ids[s.run_id]["tenant-a"]
        for line in [m.text for m in s.timeline] + s.why:
            for rid in re.findall(r"your own request ([^\s;:,]+)", line):
                assert rid in mine, (s.run_id, line)


def test_runtime_text_naming_a_foreign_id_is_withheld_whole(generated) -> None:
    from kvclaims.explaining import _Facts

    facts = _Facts(generated, "tenant-a")
    other = sorted(i for i in facts.foreign_ids("gen-A") if len(i) == 1)[0]
    assert facts.safe_text("gen-A", f"conflict with claim {other}") == WITHHELD
    # negative twin: text naming only the tenant's own ids is shown as written
    own = sorted(c for r, c in facts.own_claims if r == "gen-A")[0]
    assert facts.safe_text("gen-A", f"conflict with claim {own}") == f"conflict with claim {own}"


def test_withholding_is_by_token_including_dot_colon_and_dash(generated) -> None:
    from kvclaims.explaining import _Facts

    facts = _Facts(generated, "tenant-a")
    other = sorted(i for i in facts.foreign_ids("gen-A") if len(i) == 1)[0]
    for tail in (".", ":", "-", " ", ""):
        assert facts.safe_text("gen-A", f"claim {other}{tail} held") == WITHHELD, tail
    # negative twin: the letter inside a word is no token
    assert facts.safe_text("gen-A", f"abc{other}def") == f"abc{other}def"


# -- markdown -----------------------------------------------------------------------------------

def test_markdown_escapes_trace_strings() -> None:
    s = Section(kind="claim", run_id="r](http://evil/x.png)", id="![x](http://evil/y.png)",
                instance_seq=1, outcome="preserved", title="Claim ![x](http://evil/y.png)",
                why=["<img src=x> *bold* | pipe\n# heading"])
    md = Explanation("t<b>", ["r"], "", [s]).to_markdown()
    assert not re.search(r"(?<!\\)!(?<!\\)\[|(?<!\\)<img|\n# heading", md)
    assert "\\!\\[x\\]\\(" in md and "\\<img" in md


def test_markdown_escape_keeps_plain_text_readable() -> None:
    assert md_escape("seq 402-409: 8 block(s)") == "seq 402-409: 8 block\\(s\\)"


# -- golden explanations: every tenant of the shipped traces, every format -----------------------

def test_every_shipped_tenant_has_a_golden_in_every_format(shipped) -> None:
    checked = 0
    for tenant in _tenants(shipped):
        ex = explain(shipped, tenant)
        for fmt, ext in FORMATS.items():
            check_golden(GOLDEN / f"{tenant}.{ext}", ex.render(fmt))
            checked += 1
    assert checked == len(_tenants(shipped)) * len(FORMATS) >= 24


def test_json_times_are_iso_8601_with_zone(shipped) -> None:
    doc = json.loads(explain(shipped, "tenant-b").to_json())
    utcs = [m["utc"] for s in doc["sections"] for m in s["timeline"] if m["utc"]]
    assert utcs and all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", u)
                        for u in utcs)
