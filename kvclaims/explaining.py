"""Post-incident explanations for one tenant: ``explain(audit, tenant) -> Explanation``.

One section per claim instance of the tenant and per refused, deferred or preempted request of
the tenant: what was promised and whether the runtime could honour that mode (the lowering
verdict), the timeline in UTC and seq, why in capacity terms, the value lost, and what would
have prevented it. ``kvclaims explain`` and the dashboard's tenant page both render this one
object (``to_text``, ``to_markdown``, ``to_html``, ``to_json``). docs/explain.md.

NOTE (tenant isolation): other tenants appear only as "another tenant": counts and block
numbers are fine; their tenant names, claim ids, request ids, hashes and positions never. Text
we compose names only the tenant's own ids; text the runtime wrote (reasons) passes through
``_scrub``, which replaces every identifier that is not the tenant's own.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any, Final

from kvclaims.contract.schema import InputError
from kvclaims.contract.vocabulary import LABELS
from kvclaims.contract.policies import MODE_ENFORCEMENT, POLICIES
from kvclaims.reconstruct.core import PROTOTYPE_ENFORCING

#: A loss label in plain words, for someone who does not know our internals.
LABEL_WORDS: Final[dict[str, str]] = {
    "harm": "harm: lost while your claim was in force and materialized, breaking its promise",
    "unknown": "unknown: lost behind a hole in the trace, so the evidence cannot tell whether "
               "the promise broke",
    "expiry": "expiry: lost after your claim's TTL ran out, as an ordinary cache entry",
    "relaxation": "relaxation: lost after your claim was demoted or released, as an ordinary "
                  "cache entry",
    "eviction": "eviction: lost without breaking a promise of your claim (it was not in "
                "force yet, its mode does not promise residency here, or enough of its blocks "
                "stayed resident)",
}
ANOTHER: Final[str] = "another tenant"
_LABEL_ORDER: Final[dict[str, int]] = {label: i for i, label in enumerate(LABELS)}


@dataclass
class Moment:
    """One line of a timeline: seq, UTC time (None: no clock) and what happened."""

    seq: int
    utc: str | None
    text: str


@dataclass
class Section:
    """One claim instance or one request of the tenant."""

    kind: str                      # claim | request
    run_id: str
    id: str                        # the tenant's own claim id or request id
    instance_seq: int | None       # claim instance (seq of its submit) / request arrival
    outcome: str
    title: str
    promised: dict[str, Any] = field(default_factory=dict)
    lowering: dict[str, Any] = field(default_factory=dict)
    timeline: list[Moment] = field(default_factory=list)
    why: list[str] = field(default_factory=list)
    value_lost: float | None = None
    prevention: list[str] = field(default_factory=list)


@dataclass
class Explanation:
    """A tenant's post-incident explanation over every run of an audit."""

    tenant: str
    runs: list[str]
    clock: str
    sections: list[Section] = field(default_factory=list)

    # -- renderings ----------------------------------------------------------------------------

    def to_json(self) -> str:
        """One JSON object: {tenant, runs, clock, sections: [...]} (sections [] when none)."""
        return json.dumps(self.to_dict(), indent=2, ensure_ascii=False) + "\n"

    def to_dict(self) -> dict[str, Any]:
        """The explanation as plain data (the JSON shape)."""
        return {"tenant": self.tenant, "runs": self.runs, "clock": self.clock,
                "sections": [asdict(s) for s in self.sections]}

    def to_text(self) -> str:
        """Plain text, one block per section."""
        out = [self._headline(), self.clock, ""]
        for s in self.sections:
            out.append(s.title)
            out.append("=" * len(s.title))
            out += [f"  {line}" for line in _promise_lines(s)]
            out.append("  Timeline:")
            out += [f"    {_when(m)}  {m.text}" for m in s.timeline] or ["    (no events)"]
            if s.why:
                out.append("  Why:")
                out += [f"    {w}" for w in s.why]
            if s.kind == "claim":
                out.append(f"  Value lost: {_value(s.value_lost)}")
            if s.prevention:
                out.append("  What would have prevented it:")
                out += [f"    {p}" for p in s.prevention]
            out.append("")
        return "\n".join(out).rstrip() + "\n"

    def to_markdown(self) -> str:
        """Markdown: a heading per section, bullet lists."""
        out = [f"# {self._headline()}", "", f"_{self.clock}_", ""]
        for s in self.sections:
            out += [f"## {s.title}", ""]
            out += [f"- {line}" for line in _promise_lines(s)]
            out += ["", "**Timeline**", "", "| time | seq | what |", "|---|---|---|"]
            out += [f"| {m.utc or '-'} | {m.seq} | {_md_cell(m.text)} |" for m in s.timeline]
            if s.why:
                out += ["", "**Why**", ""] + [f"- {w}" for w in s.why]
            if s.kind == "claim":
                out += ["", f"**Value lost:** {_value(s.value_lost)}"]
            if s.prevention:
                out += ["", "**What would have prevented it**", ""]
                out += [f"- {p}" for p in s.prevention]
            out.append("")
        return "\n".join(out).rstrip() + "\n"

    def to_html(self) -> str:
        """One self-contained HTML page (inline style, no scripts, no external resources)."""
        e = html.escape
        parts = [
            "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
            f"<title>{e(self._headline())}</title>", f"<style>{_CSS}</style></head><body>",
            f"<h1>{e(self._headline())}</h1>", f'<p class="clock">{e(self.clock)}</p>']
        for s in self.sections:
            parts.append(f'<section class="{e(s.outcome)}"><h2>{e(s.title)}</h2><ul>')
            parts += [f"<li>{e(line)}</li>" for line in _promise_lines(s)]
            parts.append("</ul><h3>Timeline</h3><table><tr><th>time (UTC)</th><th>seq</th>"
                         "<th>what</th></tr>")
            parts += [f"<tr><td>{e(m.utc or '-')}</td><td>{m.seq}</td><td>{e(m.text)}</td></tr>"
                      for m in s.timeline]
            parts.append("</table>")
            if s.why:
                parts.append("<h3>Why</h3><ul>" + "".join(f"<li>{e(w)}</li>" for w in s.why)
                             + "</ul>")
            if s.kind == "claim":
                parts.append(f"<p><b>Value lost:</b> {e(_value(s.value_lost))}</p>")
            if s.prevention:
                parts.append("<h3>What would have prevented it</h3><ul>"
                             + "".join(f"<li>{e(p)}</li>" for p in s.prevention) + "</ul>")
            parts.append("</section>")
        parts.append("</body></html>")
        return "\n".join(parts) + "\n"

    def render(self, fmt: str) -> str:
        """``text`` | ``md`` | ``html`` | ``json``."""
        renderers = {"text": self.to_text, "md": self.to_markdown, "html": self.to_html,
                     "json": self.to_json}
        if fmt not in renderers:
            raise InputError(f"unknown format {fmt!r}; choose one of {sorted(renderers)}")
        return renderers[fmt]()

    def _headline(self) -> str:
        claims = sum(s.kind == "claim" for s in self.sections)
        harmed = sum(s.kind == "claim" and s.outcome == "harmed" for s in self.sections)
        reqs = sum(s.kind == "request" for s in self.sections)
        return (f"Explanation for {self.tenant}: {claims} claim(s), {harmed} harmed; "
                f"{reqs} request(s) refused, deferred or preempted")


_CSS: Final[str] = (
    "body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;"
    "color:#222}section{border-left:4px solid #999;padding:0 1rem;margin:1.5rem 0}"
    "section.harmed,section.refused{border-color:#b2182b}table{border-collapse:collapse}"
    "td,th{border:1px solid #ccc;padding:2px 6px;text-align:left;vertical-align:top}"
    ".clock{color:#555}")


def _promise_lines(s: Section) -> list[str]:
    lines = [f"Outcome: {s.outcome}"]
    if s.promised:
        lines.append("Promised: " + ", ".join(f"{k} {v}" for k, v in s.promised.items()))
    if s.lowering:
        lines.append(f"Could the runtime honour it: {s.lowering.get('verdict')} "
                     f"({s.lowering.get('evidence')})")
    return lines


def _when(m: Moment) -> str:
    return f"{m.utc or '(no clock)':>16}  seq {m.seq:>6}"


def _value(v: float | None) -> str:
    return "unknown (the trace has a hole)" if v is None else f"{v:g}"


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|")


# -- building -------------------------------------------------------------------------------------

def explain(audit: Any, tenant: str, claim: str | None = None,
            request: str | None = None) -> Explanation:
    """The explanation for ``tenant`` over every run of ``audit`` (``kvclaims.open``); only
    the claim ``claim`` / request ``request`` if given.

    Raises ``InputError`` for an unknown tenant, or a claim or request that is not the
    tenant's (the message never says whose it is).
    """
    facts = _Facts(audit, tenant)
    if not facts.known_tenant():
        raise InputError(f"unknown tenant {tenant!r}: no claim or request of it in "
                         f"{len(audit.runs)} run(s)")
    if claim is not None and claim not in facts.own_claims:
        raise InputError(f"claim {claim!r} is not a claim of tenant {tenant!r}")
    if request is not None and request not in facts.own_requests:
        raise InputError(f"request {request!r} is not a request of tenant {tenant!r}")
    sections: list[Section] = []
    if request is None:
        for row in facts.claim_rows(claim):
            sections.append(facts.claim_section(row))
    if claim is None:
        for row in facts.request_rows(request):
            sections.append(facts.request_section(row))
    return Explanation(tenant=tenant, runs=facts.runs(), clock=facts.clock_note(),
                       sections=sections)


def tenants_by_harm(audit: Any) -> list[str]:
    """Every tenant with a claim or request, the one with the most blocks lost as harm first
    (then value lost, then name): where a tenant page starts."""
    rows = audit.con.sql("""
        WITH t AS (SELECT DISTINCT tenant FROM claims WHERE tenant IS NOT NULL
                   UNION SELECT DISTINCT tenant FROM requests WHERE tenant IS NOT NULL)
        SELECT t.tenant, coalesce(sum(c.blocks_lost_harm), 0) AS harm,
               coalesce(sum(c.value_lost), 0) AS value
        FROM t LEFT JOIN claims c ON c.tenant = t.tenant
        GROUP BY t.tenant ORDER BY harm DESC, value DESC, t.tenant""").fetchall()
    return [r[0] for r in rows]


class _Facts:
    """The rows one tenant's explanation reads, and what identifies everyone else."""

    def __init__(self, audit: Any, tenant: str) -> None:
        self.audit = audit
        self.con = audit.con
        self.tenant = tenant
        claim_cols = set(self.con.table("claims").columns)
        # NOTE: claim instances (claim_seq) are being added to `claims`; until then the
        # instance is the claim's submission
        self.instance_col = "claim_seq" if "claim_seq" in claim_cols else "submitted_seq"
        self.own_claims = {r[0] for r in self.con.execute(
            "SELECT DISTINCT claim_id FROM claims WHERE tenant = ?", [tenant]).fetchall()}
        self.own_requests = {r[0] for r in self.con.execute(
            "SELECT DISTINCT request_id FROM requests WHERE tenant = ?", [tenant]).fetchall()}
        # a claim's submitting request is the tenant's own even when it carried no tenant
        self.own_requests |= {r[0] for r in self.con.execute(
            "SELECT DISTINCT request_id FROM claims WHERE tenant = ? AND request_id IS NOT NULL",
            [tenant]).fetchall()}
        self.foreign = self._foreign_ids()

    def known_tenant(self) -> bool:
        return bool(self.own_claims or self.own_requests or self.con.execute(
            "SELECT count(*) FROM events WHERE tenant = ?", [self.tenant]).fetchall()[0][0])

    def runs(self) -> list[str]:
        return [r[0] for r in self.con.execute("""
            SELECT run_id FROM claims WHERE tenant = $t UNION
            SELECT run_id FROM requests WHERE tenant = $t ORDER BY 1""",
            {"t": self.tenant}).fetchall()]

    def clock_note(self) -> str:
        runs = self.runs()
        clocks = self.audit.clocks
        missing = [r for r in runs if clocks.get(r) is None]
        if not missing:
            return "Times are UTC (from each run's wall-clock anchor); seq numbers are the trace's."
        if len(missing) == len(runs):
            return ("This trace has no wall-clock anchor (no clock): times are shown by seq "
                    "number only.")
        return (f"{len(missing)} of {len(runs)} run(s) have no wall-clock anchor (no clock): "
                "their times are shown by seq number only; the others in UTC.")

    def _foreign_ids(self) -> list[str]:
        """Every identifier in the audit that is not this tenant's: other tenants' names and
        every claim and request id that is not the tenant's own (longest first)."""
        rows = self.con.execute("""
            SELECT DISTINCT tenant FROM events WHERE tenant IS NOT NULL AND tenant <> $t
            UNION SELECT DISTINCT claim_id FROM events WHERE claim_id IS NOT NULL
            UNION SELECT DISTINCT request_id FROM events WHERE request_id IS NOT NULL
            UNION SELECT DISTINCT by_request_id FROM events WHERE by_request_id IS NOT NULL
            UNION SELECT DISTINCT unnest(blocking_claim_ids) FROM events
                  WHERE blocking_claim_ids IS NOT NULL""", {"t": self.tenant}).fetchall()
        own = self.own_claims | self.own_requests | {self.tenant}
        return sorted((r[0] for r in rows if r[0] not in own), key=lambda s: (-len(s), s))

    # -- text helpers -------------------------------------------------------------------------

    def scrub(self, text: str | None) -> str:
        """Runtime-written text with every other tenant's identifier replaced."""
        if not text:
            return ""
        for ident in self.foreign:
            text = re.sub(r"(?<![\w.:-])" + re.escape(ident) + r"(?![\w.:-])",
                          f"[{ANOTHER}'s id]", text)
        return text

    def whose_request(self, request_id: str | None) -> str:
        if request_id is None:
            return "a request the trace does not name"
        if request_id in self.own_requests:
            return f"your own request {request_id}"
        return f"{ANOTHER}'s request"

    def utc(self, ts: datetime | None) -> str | None:
        return None if ts is None else ts.strftime("%H:%M:%S.") + f"{ts.microsecond // 1000:03d}"

    def at(self, seq: int, ts: datetime | None) -> str:
        u = self.utc(ts)
        return f"at {u} UTC (seq {seq})" if u else f"at seq {seq}"

    # -- claims -------------------------------------------------------------------------------

    def claim_rows(self, claim: str | None) -> list[dict[str, Any]]:
        rel = self.con.execute(f"""
            SELECT c.*, c.{self.instance_col} AS instance_seq, m.manifest_json,
                   coalesce(m.policy, (SELECT any_value(e.policy) FROM events e
                                       WHERE e.run_id = c.run_id
                                         AND e.event = 'run_started')) AS policy
            FROM claims c LEFT JOIN manifests m ON m.run_id = c.run_id
            WHERE c.tenant = $t AND ($c IS NULL OR c.claim_id = $c)
            ORDER BY c.run_id, instance_seq NULLS FIRST, c.claim_id""",
            {"t": self.tenant, "c": claim})
        cols = [d[0] for d in rel.description]
        return [dict(zip(cols, r)) for r in rel.fetchall()]

    def claim_section(self, c: dict[str, Any]) -> Section:
        mode = c.get("protection_mode") or "(none declared)"
        promised = {
            "mode": mode,
            "predicate": (f"at least {c.get('threshold_blocks')} of its "
                          f"{c.get('positions_bound') or '?'} block(s) stay resident"
                          if c.get("threshold_blocks") is not None
                          else "all of its blocks stay resident"),
            "ttl": "none" if c.get("ttl_s") is None else f"{c['ttl_s']:g} s",
            "value": "unset" if c.get("value") is None else f"{c['value']:g}",
        }
        s = Section(kind="claim", run_id=c["run_id"], id=c["claim_id"],
                    instance_seq=c.get("instance_seq"), outcome=c["outcome"],
                    title=f"Claim {c['claim_id']} in run {c['run_id']}: {c['outcome']}",
                    promised=promised, lowering=self.lowering(c), value_lost=c.get("value_lost"))
        s.timeline = self.claim_timeline(c)
        s.why = self.claim_why(c)
        s.prevention = self.claim_prevention(c, s.lowering)
        return s

    def lowering(self, c: dict[str, Any]) -> dict[str, Any]:
        """What the runtime does with the claim's mode in its run: the ``lowering`` table's
        verdict when the trace has one, else derived from the run policy (and said so)."""
        mode = c.get("protection_mode")
        if "lowering" in self.audit.tables:
            cols = self.con.table("lowering").columns
            mode_col = next((x for x in ("protection_mode", "mode") if x in cols), None)
            verdict_col = next((x for x in ("verdict", "lowering") if x in cols), None)
            ev_col = next((x for x in ("evidence", "detail", "reason") if x in cols), None)
            if mode_col and verdict_col:
                row = self.con.execute(
                    f'SELECT "{verdict_col}"' + (f', "{ev_col}"' if ev_col else "")
                    + f' FROM lowering WHERE run_id = ? AND "{mode_col}" = ? LIMIT 1',
                    [c["run_id"], mode]).fetchall()
                if row:
                    return {"verdict": row[0][0],
                            "evidence": self.scrub(str(row[0][1])) if ev_col else "lowering table",
                            "source": "lowering table"}
        return derive_lowering(c.get("policy"), mode, c.get("manifest_json"))

    def claim_timeline(self, c: dict[str, Any]) -> list[Moment]:
        rows = self.con.execute("""
            SELECT seq, ts, kind, what, label, block_id, position, request_id, released_by,
                   reason, by_request_id, tenant
            FROM claim_timeline
            WHERE run_id = $r AND claim_id = $c AND ($i IS NULL OR claim_seq = $i)
            ORDER BY seq, kind DESC, block_id NULLS FIRST""",
            {"r": c["run_id"], "c": c["claim_id"], "i": c.get("instance_seq")}).fetchall()
        out: list[Moment] = []
        bound: list[tuple[int, Any, int]] = []
        # NOTE: consecutive losses with the same label and cause form one line (a request
        # evicting 50 blocks is one moment, not 50)
        run: list[Any] | None = None   # [first seq, ts, last seq, label, by, blocks]
        for seq, ts, kind, what, label, block_id, position, req, released_by, reason, by, \
                _tenant in rows:
            if kind == "loss":
                if run is not None and run[3] == label and run[4] == by:
                    run[2] = seq
                    run[5].append(block_id)
                else:
                    if run is not None:
                        out.append(self.loss_moment(run))
                    run = [seq, ts, seq, label, by, [block_id]]
                continue
            if what == "claim_bound":
                bound.append((seq, ts, position))
                continue
            if run is not None:
                out.append(self.loss_moment(run))
                run = None
            out.append(Moment(seq, self.utc(ts), self.event_text(
                what, req, released_by, reason, by)))
        if run is not None:
            out.append(self.loss_moment(run))
        if bound:
            seq, ts, _ = bound[0]
            out.append(Moment(seq, self.utc(ts),
                              f"{len(bound)} block(s) bound to the claim (positions "
                              f"{_ranges(sorted(p for _, _, p in bound if p is not None))})"))
        out.sort(key=lambda m: m.seq)
        return out

    def loss_moment(self, run: list[Any]) -> Moment:
        first, ts, last, label, by, blocks = run
        span = f"seq {first}-{last}: " if last != first else ""
        return Moment(first, self.utc(ts),
                      f"{span}{len(blocks)} block(s) lost (block {_ranges(sorted(set(blocks)))})"
                      f" to make room for {self.whose_request(by)} - "
                      f"{LABEL_WORDS.get(label, label)}")

    def event_text(self, what: str, req: str | None, released_by: str | None,
                   reason: str | None, by: str | None) -> str:
        why = f" ({self.scrub(reason)})" if reason else ""
        if what == "claim_submitted":
            return "you submitted the claim" + (f" with request {req}" if req else "")
        if what == "claim_accepted":
            return "the runtime accepted the claim: from here it is in force"
        if what == "claim_rejected":
            return "the runtime rejected the claim" + why
        if what == "claim_materialized":
            return "the claim materialized: enough of its blocks were resident (the runtime " \
                   "reported it)"
        if what == "claim_demoted":
            return ("the operator's arbiter demoted the claim to admit "
                    f"{self.whose_request(by)}: from here its blocks are ordinary cache entries")
        if what == "claim_expired":
            return "the claim expired (its TTL ran out): from here its blocks are ordinary"
        if what == "claim_released":
            who = self.releaser(released_by, req)
            return f"{who} released the claim: from here its blocks are ordinary"
        if what == "claim_release_refused":
            return "a release of the claim was refused" + why
        if what == "claim_harmed":
            return ("the runtime reported the claim harmed (the audit's own verdict is the label "
                    "of each loss)")
        return what.replace("_", " ") + why

    def releaser(self, released_by: str | None, req: str | None) -> str:
        if released_by == "tenant":
            return "you (the tenant)"
        if released_by in ("operator", "arbiter"):
            return "the operator"
        if req is not None and req in self.own_requests:
            return f"you (request {req})"
        return "someone (the trace does not say who)"

    def claim_why(self, c: dict[str, Any]) -> list[str]:
        """Capacity arithmetic for each request whose admission cost the claim blocks."""
        size = c.get("positions_bound")
        rows = self.con.execute("""
            SELECT by_request_id, min(seq) AS first_seq, arg_min(ts, seq) AS ts, label,
                   count(DISTINCT (seq, block_id)) AS n
            FROM claim_timeline
            WHERE run_id = $r AND claim_id = $c AND ($i IS NULL OR claim_seq = $i)
              AND kind = 'loss'
            GROUP BY by_request_id, label ORDER BY first_seq""",
            {"r": c["run_id"], "c": c["claim_id"], "i": c.get("instance_seq")}).fetchall()
        out = []
        for by, seq, ts, label, n in rows:
            adm = self.admission(c["run_id"], by, seq)
            head = (f"{self.at(seq, ts)} {n} of your {size or '?'} block(s) were evicted "
                    f"({label}) to admit {self.whose_request(by)}")
            out.append(head + self.capacity(size, adm))
        if c.get("release_event") == "claim_demoted" and c.get("release_seq") is not None:
            dem = self.con.execute("""
                SELECT by_request_id, ts FROM events WHERE run_id = ? AND seq = ?""",
                [c["run_id"], c["release_seq"]]).fetchall()
            if dem:
                by, ts = dem[0]
                adm = self.admission(c["run_id"], by, c["release_seq"] + 1)
                out.insert(0, f"{self.at(c['release_seq'], ts)} your claim was demoted to "
                              f"admit {self.whose_request(by)}" + self.capacity(size, adm))
        if c["outcome"] == "rejected":
            out.append(f"rejected at submission: {self.scrub(c.get('reject_reason')) or 'no reason given'}")
        return out

    def admission(self, run_id: str, request_id: str | None, seq: int) -> tuple | None:
        """The request's admission decision nearest to ``seq`` (the last one at or before it,
        else the first after: the recorder may log the admission after the allocation)."""
        if request_id is None:
            return None
        rows = self.con.execute("""
            SELECT required_blocks, usable_blocks, protected_blocks, free_blocks
            FROM feasibility WHERE run_id = $r AND request_id = $q AND decision = 'admitted'
            ORDER BY seq > $s, abs(seq - $s) LIMIT 1""",
            {"r": run_id, "q": request_id, "s": seq}).fetchall()
        return rows[0] if rows else None

    @staticmethod
    def capacity(size: int | None, adm: tuple | None) -> str:
        if adm is None:
            return "; the trace does not show that request's admission (no capacity figures)"
        req, usable, _protected, _free = adm
        if req is None or usable is None or size is None:
            return f"; it needed {req if req is not None else '?'} block(s) while " \
                   f"{usable if usable is not None else '?'} were usable"
        rel = ">" if size + req > usable else "<="
        tail = "" if rel == ">" else (": both fit, so the blocks went to ordinary cache "
                                      "pressure, not to a capacity conflict")
        return (f" that needed {req} block(s) while {usable} were usable - "
                f"{size} + {req} {rel} {usable}{tail}")

    def claim_prevention(self, c: dict[str, Any], lowering: dict[str, Any]) -> list[str]:
        mode, outcome = c.get("protection_mode"), c["outcome"]
        if outcome == "harmed":
            if lowering.get("verdict") != "adapter-policy evidence":
                return [f"Your mode ({mode}) was not enforced in this run "
                        f"({lowering.get('evidence')}). Under hard_protected in an enforcing "
                        "run, the blocks would have stayed and the other request would have "
                        "been deferred or refused instead."]
            if mode == "soft_priority":
                return ["soft_priority only orders evictions. Under hard_protected the blocks "
                        "would have stayed and the other request would have been deferred or "
                        "refused instead."]
            return ["An enforced claim was harmed: this is a runtime bug (see the findings and "
                    "conformance of this run); report it with this explanation."]
        if outcome == "demoted":
            return ["demotable lets the arbiter demote your claim under a conflict. Under "
                    "hard_protected it would not have been demoted (the other request would "
                    "have been deferred or refused instead), or declare a higher value."]
        if outcome == "expired":
            return [f"A longer ttl_s (it was {c.get('ttl_s')} s), or renewing the claim before "
                    "it ran out."]
        if outcome == "rejected":
            return ["Submit the claim with a mode this runtime supports (see the lowering "
                    "verdict), or with fewer blocks."]
        if outcome == "unknown":
            return ["Nothing can be said: the trace has a hole. Keep the recorder's queue "
                    "large enough that it drops no events."]
        return []

    # -- requests -----------------------------------------------------------------------------

    def request_rows(self, request: str | None) -> list[dict[str, Any]]:
        rel = self.con.execute("""
            SELECT * FROM requests
            WHERE tenant = $t AND ($q IS NULL OR request_id = $q)
              AND ($q IS NOT NULL OR outcome IN ('refused', 'deferred_then_served', 'preempted')
                   OR deferrals > 0 OR preemptions > 0)
            ORDER BY run_id, arrived_seq NULLS LAST, request_id""",
            {"t": self.tenant, "q": request})
        cols = [d[0] for d in rel.description]
        return [dict(zip(cols, r)) for r in rel.fetchall()]

    def request_section(self, q: dict[str, Any]) -> Section:
        s = Section(kind="request", run_id=q["run_id"], id=q["request_id"],
                    instance_seq=q.get("arrived_seq"), outcome=q["outcome"],
                    title=f"Request {q['request_id']} in run {q['run_id']}: {q['outcome']}")
        rows = self.con.execute("""
            SELECT seq, ts, decision, required_blocks, protected_blocks, usable_blocks,
                   shortfall_blocks,
                   count(*) FILTER (WHERE blocking_tenant = $t) AS mine,
                   count(*) FILTER (WHERE blocking_claim_id IS NOT NULL
                                    AND blocking_tenant IS DISTINCT FROM $t) AS theirs,
                   list(blocking_claim_id ORDER BY blocking_claim_id)
                       FILTER (WHERE blocking_tenant = $t) AS my_claims
            FROM refusals_with_blockers WHERE run_id = $r AND request_id = $q
            GROUP BY ALL ORDER BY seq""",
            {"t": self.tenant, "r": q["run_id"], "q": q["request_id"]}).fetchall()
        events = self.con.execute("""
            SELECT e.seq, e.ts, e.event, e.free_blocks, f.protected_blocks, e.usable_blocks,
                   e.blocking_claim_ids
            FROM events e
            -- NOTE: the protected figure is the rebuilt one (feasibility), never the runtime's
            LEFT JOIN feasibility f ON f.run_id = e.run_id AND f.seq = e.seq
            WHERE e.run_id = ? AND e.request_id = ?
              AND e.event IN ('request_arrived', 'request_admitted', 'request_preempted',
                              'request_finished')
            ORDER BY e.seq""", [q["run_id"], q["request_id"]]).fetchall()
        timeline: list[Moment] = []
        for seq, ts, ev, free, prot, usable, blocking in events:
            text = {"request_arrived": "the request arrived",
                    "request_admitted": "the request was admitted",
                    "request_finished": "the request finished",
                    "request_preempted": "the request was preempted (its KV blocks were taken "
                                         "back; vLLM recomputes it)"}[ev]
            timeline.append(Moment(seq, self.utc(ts), text))
            if ev == "request_preempted":
                s.why.append(self.preemption_why(seq, ts, free, prot, usable, blocking))
        for seq, ts, decision, req, prot, usable, short, mine, theirs, my_claims in rows:
            timeline.append(Moment(seq, self.utc(ts), f"the request was {decision}"))
            s.why.append(
                f"{self.at(seq, ts)} {decision}: {_n(prot)} block(s) were protected by claims "
                f"in force ({mine} of yours, {theirs} of other tenants), you needed {_n(req)}, "
                f"{_n(usable)} were usable, shortfall {_n(short)}"
                + (f"; your blocking claim(s): {', '.join(my_claims)}" if my_claims else ""))
        timeline.sort(key=lambda m: m.seq)
        s.timeline = timeline
        if rows:
            last = rows[-1]
            req, short = last[3], last[6]
            tips = []
            if short:
                tips.append(f"{short} more usable block(s), or a request of at most "
                            f"{req - short} block(s)" if req is not None
                            else f"{short} more usable block(s)")
            if last[9]:
                tips.append(f"releasing your own claim(s) {', '.join(last[9])} once you no "
                            "longer need them")
            if last[8]:
                tips.append("the other tenants' claims being released or expiring earlier "
                            "(an operator decision)")
            s.prevention = ["Any of: " + "; ".join(tips) + "."] if tips else []
        if s.kind == "request" and q["outcome"] == "preempted" and not s.prevention:
            s.prevention = ["More usable blocks, or fewer concurrent long requests: vLLM "
                            "preempts the newest running request when the pool runs out."]
        return s

    def preemption_why(self, seq: int, ts: Any, free: Any, prot: Any, usable: Any,
                       blocking: Sequence[str] | None) -> str:
        if free is None and prot is None and usable is None:
            return (f"{self.at(seq, ts)} preempted; the trace does not record the pool state "
                    "at the preemption")
        mine = sum(1 for b in blocking or [] if b in self.own_claims)
        theirs = len(blocking or []) - mine
        return (f"{self.at(seq, ts)} preempted: {_n(free)} block(s) free, {_n(prot)} protected "
                f"by claims in force ({mine} of yours, {theirs} of other tenants), "
                f"{_n(usable)} usable")


def derive_lowering(policy: str | None, mode: str | None,
                    manifest_json: str | None = None) -> dict[str, Any]:
    """The lowering verdict when the trace has no ``lowering`` table: from the manifest's
    ``enforcement`` section, else from the run policy (``kvclaims.contract.policies``)."""

    note = "derived from the run policy: this trace has no lowering table"
    modes: dict[str, Any] = {}
    if manifest_json:
        try:
            modes = (json.loads(manifest_json).get("enforcement") or {}).get("modes") or {}
        except (ValueError, AttributeError):
            modes = {}
    p = POLICIES.get(policy or "")
    enforce = p.enforce if p is not None else (policy in PROTOTYPE_ENFORCING or None)
    if enforce is None:
        return {"verdict": "unknown evidence", "evidence": f"run policy {policy!r} is unknown; "
                f"{note}", "source": "derived"}
    if not enforce:
        return {"verdict": "adapter-observational evidence", "evidence": f"run policy {policy} "
                f"records claims and enforces none; {note}", "source": "derived"}
    text = modes.get(mode) if isinstance(modes.get(mode), str) else MODE_ENFORCEMENT.get(mode or "")
    if text is None:
        return {"verdict": "unknown evidence", "evidence": f"mode {mode!r} is not one this "
                f"runtime knows; {note}", "source": "derived"}
    # NOTE: fail-closed: without the lowering table the run's evidence is not read, so what the
    # policy promises is the runtime's claim, never a verdict that it was kept
    return {"verdict": "unknown evidence", "evidence": f"{mode} under {policy}: the runtime "
            f"claims {text}; {note}", "source": "derived"}


def _n(v: Any) -> str:
    return "?" if v is None else str(v)


def _ranges(values: Iterable[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    spans: list[list[int]] = []
    for v in values:
        if spans and v == spans[-1][1] + 1:
            spans[-1][1] = v
        elif not spans or v != spans[-1][1]:
            spans.append([v, v])
    return ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in spans) or "-"
