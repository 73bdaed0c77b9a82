"""Post-incident explanations for one tenant: ``explain(audit, tenant) -> Explanation``.

One section per claim instance of the tenant and per refused, deferred or preempted request of
the tenant: what was promised and whether the runtime could honour that mode (the lowering
verdict), the timeline (ISO 8601 UTC date-times and seq), why in capacity terms (the rebuilt
figures of the ``feasibility`` table and the claim's own rows of ``claim_timeline``), the value
lost, what would have prevented it, and - only where one was computed - what each replay of the
run (``kvclaims whatif``, read through ``kvclaims.replays``) did with a harmed or demoted claim
or with a refused, deferred or preempted request, and at what cost to others (counted): nothing
counterfactual is said otherwise. ``kvclaims explain`` and the dashboard's tenant page
both render this one object (``to_text``, ``to_markdown``, ``to_html``, ``to_json``).
docs/explain.md.

NOTE (tenant isolation, by construction): every identity is keyed by (run, id). The tenant's
own claims and requests are the rows of its runs whose tenant is the tenant (plus the request
that submitted an own claim), as (run_id, id) pairs; a row of another run that shares an id is
someone else's. Text we compose names only own identities of the section's run, and other
tenants only as "another tenant" (their counts are fine). Text the runtime wrote (reasons,
lowering evidence) is shown only when it contains no identifier of the run that is not the
tenant's own; otherwise it is withheld as a whole, never edited: replacing an id inside text
would itself show where the id was.
"""

from __future__ import annotations

import contextlib
import html
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Final

from kvclaims.contract.vocabulary import (CLAIM_OUTCOME, DECISION, EVENT, LABEL, LABELS, MODE,
                                          REQUEST_OUTCOME, fill_sql)
from kvclaims.contract.schema import InputError
from kvclaims.contract.policies import MODE_ENFORCEMENT, POLICIES
from kvclaims.reconstruct.core import PROTOTYPE_ENFORCING
from kvclaims.replays import Counts, Replay, ReplayFacts, RequestFate, counts

#: A loss label in plain words, for someone who does not know our internals.
LABEL_WORDS: Final[dict[str, str]] = {
    LABEL.harm: "harm: lost while your claim was in force and materialized, breaking its promise",
    LABEL.unknown: "unknown: lost behind a hole in the trace, so the evidence cannot tell whether "
               "the promise broke",
    LABEL.expiry: "expiry: lost after your claim's TTL ran out, as an ordinary cache entry",
    LABEL.relaxation: "relaxation: lost after your claim was demoted or released, as an ordinary "
                  "cache entry",
    LABEL.eviction: "eviction: lost without breaking a promise of your claim (it was not in "
                "force yet, its mode does not promise residency here, or enough of its blocks "
                "stayed resident)",
}
ANOTHER: Final[str] = "another tenant"
#: The heading of a section's computed what-ifs (``Section.whatif``).
WHATIF_HEADING: Final[str] = "What a computed replay shows"
#: Said instead of a counterfactual when no replay of the run was computed.
NO_WHATIF: Final[str] = ("No what-if of this run was computed (kvclaims whatif computes one: "
                         "docs/whatif.md).")
#: How a request section's advice starts: it is arithmetic on the recorded figures, which a
#: reader must not take for what a replay computed.
RECORDED_ARITHMETIC: Final[str] = ("By the recorded figures at the decision (arithmetic on "
                                   "them, not a replay), any of: ")
#: What a replay did with a request, by its outcome there (``fate_words``).
_FATE_WORDS: Final[dict[str, str]] = {
    REQUEST_OUTCOME.served: "served this request",
    REQUEST_OUTCOME.deferred_then_served: "deferred this request, then served it",
    REQUEST_OUTCOME.refused: "refused this request",
    REQUEST_OUTCOME.preempted: "preempted this request",
    REQUEST_OUTCOME.aborted: ("saw this request aborted (a replay aborts it where the recording "
                              "did)"),
    REQUEST_OUTCOME.unknown: "left this request's outcome unknown (the replay's trace has a hole)",
}
#: What replaces a runtime-written text that names someone else's identifier.
WITHHELD: Final[str] = "the runtime's text is withheld: it names another tenant's identifiers"
_LABEL_ORDER: Final[dict[str, int]] = {label: i for i, label in enumerate(LABELS)}
#: Characters that glue an id to its neighbours: an id is "in" a text wherever none of these
#: continues it on either side. NOTE: so an id followed by `.`, `:` or `-` is still found (a
#: reason may quote "claim b:doc." or "b:doc-2"); over-matching only withholds more text.
_WORD: Final[str] = r"A-Za-z0-9_"


@dataclass
class Moment:
    """One line of a timeline: seq, ISO 8601 UTC date-time (None: no clock) and what
    happened."""

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
    #: what each computed replay of the section's run shows for it (``kvclaims.replays``);
    #: empty when none was computed: then nothing counterfactual is said at all
    whatif: list[str] = field(default_factory=list)


@dataclass
class Explanation:
    """A tenant's post-incident explanation over every run of an audit."""

    tenant: str
    runs: list[str]
    clock: str
    sections: list[Section] = field(default_factory=list)
    #: the time window asked for (``--at``/``--since``/``--until``), ISO 8601; None: all
    window: dict[str, str] | None = None

    # -- renderings ----------------------------------------------------------------------------

    def to_json(self) -> str:
        """One JSON object: {tenant, runs, clock, window, sections: [...]} (sections [] when
        none; window null when the whole trace was asked for)."""
        return json.dumps(self.to_dict(), indent=2, ensure_ascii=False) + "\n"

    def to_dict(self) -> dict[str, Any]:
        """The explanation as plain data (the JSON shape)."""
        return {"tenant": self.tenant, "runs": self.runs, "clock": self.clock,
                "window": self.window, "sections": [asdict(s) for s in self.sections]}

    def to_text(self) -> str:
        """Plain text, one block per section."""
        out = [self.headline(), self.clock] + ([self.window_note()] if self.window else [])
        out.append("")
        for s in self.sections:
            out.append(s.title)
            out.append("=" * len(s.title))
            out += [f"  {line}" for line in promise_lines(s)]
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
            if s.whatif:
                out.append(f"  {WHATIF_HEADING}:")
                out += [f"    {w}" for w in s.whatif]
            out.append("")
        return "\n".join(out).rstrip() + "\n"

    def to_markdown(self) -> str:
        """Markdown: a heading per section, bullet lists. NOTE: every line is escaped
        (``md_escape``): the lines quote trace strings (ids, run ids, reasons)."""
        m = md_escape
        out = [f"# {m(self.headline())}", "", f"_{m(self.clock)}_", ""]
        if self.window:
            out += [f"_{m(self.window_note())}_", ""]
        for s in self.sections:
            out += [f"## {m(s.title)}", ""]
            out += [f"- {m(line)}" for line in promise_lines(s)]
            out += ["", "**Timeline**", "", "| time (UTC) | seq | what |", "|---|---|---|"]
            out += [f"| {m(t.utc or '-')} | {t.seq} | {m(t.text)} |" for t in s.timeline]
            if s.why:
                out += ["", "**Why**", ""] + [f"- {m(w)}" for w in s.why]
            if s.kind == "claim":
                out += ["", f"**Value lost:** {m(_value(s.value_lost))}"]
            if s.prevention:
                out += ["", "**What would have prevented it**", ""]
                out += [f"- {m(p)}" for p in s.prevention]
            if s.whatif:
                out += ["", f"**{WHATIF_HEADING}**", ""] + [f"- {m(w)}" for w in s.whatif]
            out.append("")
        return "\n".join(out).rstrip() + "\n"

    def to_html(self) -> str:
        """One self-contained HTML page (inline style, no scripts, no external resources)."""
        e = html.escape
        parts = [
            "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
            f"<title>{e(self.headline())}</title>", f"<style>{_CSS}</style></head><body>",
            f"<h1>{e(self.headline())}</h1>", f'<p class="clock">{e(self.clock)}</p>']
        if self.window:
            parts.append(f'<p class="clock">{e(self.window_note())}</p>')
        parts += self.html_sections()
        parts.append("</body></html>")
        return "\n".join(parts) + "\n"

    def html_sections(self, fold: frozenset[str] | None = None) -> list[str]:
        """Each section as an HTML fragment, every value escaped: the one HTML rendering, used
        by ``to_html`` and the report. ``fold``: outcomes that count as incidents; each section
        becomes a ``<details>``, only the first incident open (a long explanation stays
        readable)."""
        e = html.escape
        parts: list[str] = []
        opened = fold is None
        for s in self.sections:
            if fold is None:
                parts.append(f'<section class="{e(s.outcome)}"><h2>{e(s.title)}</h2><ul>')
            else:
                incident = s.outcome in fold
                attr = " open" if incident and not opened else ""
                opened = opened or incident
                cls = LABEL.harm if incident else ""
                parts.append(f"<details{attr}><summary class='{cls}'>{e(s.title)}</summary>"
                             f'<section class="{e(s.outcome)}"><ul>')
            parts += [f"<li>{e(line)}</li>" for line in promise_lines(s)]
            parts.append("</ul><h3>Timeline</h3><div class='wrap'><table><tr><th>time (UTC)</th>"
                         "<th>seq</th><th>what</th></tr>")
            parts += [f"<tr><td>{e(m.utc or '-')}</td><td>{m.seq}</td><td>{e(m.text)}</td></tr>"
                      for m in s.timeline]
            parts.append("</table></div>")
            if s.why:
                parts.append("<h3>Why</h3><ul>" + "".join(f"<li>{e(w)}</li>" for w in s.why)
                             + "</ul>")
            if s.kind == "claim":
                parts.append(f"<p><b>Value lost:</b> {e(_value(s.value_lost))}</p>")
            if s.prevention:
                parts.append("<h3>What would have prevented it</h3><ul>"
                             + "".join(f"<li>{e(p)}</li>" for p in s.prevention) + "</ul>")
            if s.whatif:
                parts.append(f"<h3>{WHATIF_HEADING}</h3><ul>"
                             + "".join(f"<li>{e(w)}</li>" for w in s.whatif) + "</ul>")
            parts.append("</section>" if fold is None else "</section></details>")
        return parts

    def render(self, fmt: str) -> str:
        """``text`` | ``md`` | ``html`` | ``json``."""
        renderers = {"text": self.to_text, "md": self.to_markdown, "html": self.to_html,
                     "json": self.to_json}
        if fmt not in renderers:
            raise InputError(f"unknown format {fmt!r}; choose one of {sorted(renderers)}")
        return renderers[fmt]()

    def window_note(self) -> str:
        """The time window asked for, in words ('' when none)."""
        if not self.window:
            return ""
        return (f"Only claims and requests with something between {self.window['since']} "
                f"and {self.window['until']}.")

    def headline(self) -> str:
        claims = [s for s in self.sections if s.kind == "claim"]
        harmed = sum(s.outcome == CLAIM_OUTCOME.harmed for s in claims)
        unknown = sum(s.outcome == CLAIM_OUTCOME.unknown for s in claims)
        reqs = sum(s.kind == "request" for s in self.sections)
        return (f"Explanation for {self.tenant}: {len(claims)} claim(s), {harmed} harmed, "
                f"{unknown} unknown; {reqs} request(s) refused, deferred or preempted")


_CSS: Final[str] = (
    "body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;"
    "color:#222}section{border-left:4px solid #999;padding:0 1rem;margin:1.5rem 0}"
    "section.harmed,section.refused{border-color:#b2182b}table{border-collapse:collapse}"
    "td,th{border:1px solid #ccc;padding:2px 6px;text-align:left;vertical-align:top;"
    "overflow-wrap:anywhere}.clock{color:#555}")

#: Markdown (CommonMark + GFM) characters that can start markup: links, images, emphasis,
#: code, raw HTML, entities, tables, headings, strikethrough, math.
_MD_SPECIAL: Final[re.Pattern[str]] = re.compile(r"([\\`*_{}\[\]()<>#+!|~&$])")


def md_escape(text: str) -> str:
    """Text made inert in Markdown: every markup character backslash-escaped and line breaks
    turned into spaces (a trace string can neither add markup nor start a new block)."""
    return _MD_SPECIAL.sub(r"\\\1", re.sub(r"[\r\n\u2028\u2029]+", " ", str(text)))


def promise_lines(s: Section) -> list[str]:
    lines = [f"Outcome: {s.outcome}"]
    if s.promised:
        lines.append("Promised: " + ", ".join(f"{k} {v}" for k, v in s.promised.items()))
    if s.lowering:
        lines.append(f"Could the runtime honour it: {s.lowering.get('verdict')} "
                     f"({s.lowering.get('evidence')})")
    return lines


def _when(m: Moment) -> str:
    return f"{m.utc or '(no clock)':>24}  seq {m.seq:>6}"


def _value(v: float | None) -> str:
    return "unknown (the trace has a hole)" if v is None else f"{v:g}"


def iso_utc(ts: datetime | None) -> str | None:
    """An ISO 8601 date-time in UTC with its zone, to the millisecond
    (``2026-11-30T05:56:44.199Z``); None for None. Naive values are UTC (the ``ts`` columns)."""
    if ts is None:
        return None
    ts = ts.replace(tzinfo=timezone.utc) if ts.tzinfo is None else ts.astimezone(timezone.utc)
    return ts.isoformat(timespec="milliseconds").replace("+00:00", "Z")


# -- time windows ---------------------------------------------------------------------------------

_DURATION: Final[re.Pattern[str]] = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h)?\s*$")
_CLOCK_TIME: Final[re.Pattern[str]] = re.compile(r"^\d{1,2}:\d{2}(:\d{2}(\.\d{1,6})?)?$")


def parse_duration(text: str) -> timedelta:
    """``90``, ``90s``, ``500ms``, ``2m``, ``1h`` -> a timedelta; ``InputError`` otherwise."""
    m = _DURATION.match(text or "")
    if not m:
        raise InputError(f"bad duration {text!r}: give e.g. 30s, 500ms, 2m or 1h")
    n = float(m.group(1))
    unit = m.group(2) or "s"
    return timedelta(seconds=n * {"ms": 0.001, "s": 1, "m": 60, "min": 60, "h": 3600}[unit])


def parse_time(text: str, days: Sequence[datetime] = ()) -> list[datetime]:
    """A point in time, UTC: an ISO 8601 date-time (no zone: UTC), or a time of day
    ``HH:MM[:SS[.ffffff]]`` (UTC), which means that time on each day in ``days`` (the runs'
    days). Returns every candidate; ``InputError`` for anything else."""
    t = (text or "").strip()
    if _CLOCK_TIME.match(t):
        parts = t.split(":")
        h, mi = int(parts[0]), int(parts[1])
        sec = float(parts[2]) if len(parts) > 2 else 0.0
        if h > 23 or mi > 59 or sec >= 61:
            raise InputError(f"bad time {text!r}: hours 0-23, minutes and seconds 0-59")
        if not days:
            raise InputError(f"time of day {text!r} needs a run with a wall clock; give a "
                             "full date-time instead")
        out = []
        for d in sorted({x.date() for x in days}):
            base = datetime(d.year, d.month, d.day, tzinfo=timezone.utc)
            out.append(base + timedelta(hours=h, minutes=mi, seconds=sec))
        return out
    try:
        ts = datetime.fromisoformat(t)
    except ValueError:
        raise InputError(f"bad time {text!r}: give an ISO 8601 date-time "
                         "(2026-11-30T05:56:46Z) or a UTC time of day (05:56)") from None
    return [ts.replace(tzinfo=timezone.utc) if ts.tzinfo is None else ts.astimezone(timezone.utc)]


def time_window(at: str | None = None, window: str | None = None, since: str | None = None,
                until: str | None = None, days: Sequence[datetime] = ()
                ) -> tuple[datetime, datetime] | None:
    """The window ``--at TIME [--window DURATION]`` (TIME +- DURATION, default 1 minute) or
    ``--since``/``--until`` names, in UTC; None when none was given. A time of day is taken on
    the runs' first day (``days``). ``InputError`` for a bad or empty window."""
    if at is None and since is None and until is None:
        if window is not None:
            raise InputError("--window needs --at TIME")
        return None
    if at is not None and (since is not None or until is not None):
        raise InputError("give either --at or --since/--until, not both")
    if at is not None:
        half = parse_duration(window) if window is not None else timedelta(minutes=1)
        t = parse_time(at, days)[0]
        return t - half, t + half
    if window is not None:
        raise InputError("--window goes with --at, not with --since/--until")
    lo = parse_time(since, days)[0] if since is not None else datetime.min.replace(
        tzinfo=timezone.utc)
    hi = parse_time(until, days)[-1] if until is not None else datetime.max.replace(
        tzinfo=timezone.utc)
    if hi < lo:
        raise InputError(f"--until {until!r} is before --since {since!r}")
    return lo, hi


# -- building -------------------------------------------------------------------------------------

def explain(audit: Any, tenant: str, claim: str | None = None,
            request: str | None = None,
            window: tuple[datetime, datetime] | None = None,
            whatifs: Sequence[Replay] = (),
            replay_facts: ReplayFacts | None = None) -> Explanation:
    """The explanation for ``tenant`` over every run of ``audit`` (``kvclaims.open``); only
    the claim ``claim`` / request ``request`` if given; only the sections with a moment in
    ``window`` (UTC, inclusive; see ``time_window``) if given.

    ``whatifs``: computed what-ifs (``kvclaims.replays.find_replays``). A harmed or demoted
    claim, or a refused, deferred or preempted request, of a run with replays among them cites
    what each replay did with it and at what cost to others (counting, never naming, other
    tenants' requests and claims); without one, no counterfactual is said.
    ``replay_facts``: those replays already opened (``ReplayFacts``), cited instead of opening
    ``whatifs`` again: a command explaining many tenants opens them once; the caller closes it.

    Raises ``InputError`` for an unknown tenant, or a claim or request that is not the
    tenant's (the message never says whose it is).
    """
    facts = _Facts(audit, tenant)
    if not facts.known_tenant():
        raise InputError(f"unknown tenant {tenant!r}: no claim or request of it in "
                         f"{len(audit.runs)} run(s)")
    if claim is not None and claim not in {c for _, c in facts.own_claims}:
        raise InputError(f"claim {claim!r} is not a claim of tenant {tenant!r}")
    if request is not None and request not in {q for _, q in facts.own_requests}:
        raise InputError(f"request {request!r} is not a request of tenant {tenant!r}")
    sections: list[Section] = []
    own_runs = set(facts.runs())
    with contextlib.ExitStack() as opened:
        facts.replays = replay_facts if replay_facts is not None else opened.enter_context(
            ReplayFacts([r for r in whatifs if r.source_run_id in own_runs]))
        if request is None:
            for row in facts.claim_rows(claim):
                sections.append(facts.claim_section(row))
        if claim is None:
            for row in facts.request_rows(request):
                sections.append(facts.request_section(row))
    note = None
    if window is not None:
        if not any(facts.audit.clocks.get(r) for r in facts.runs()):
            raise InputError("a time window needs a wall clock, and no run of "
                             f"{tenant!r} has one (its times are seq numbers only)")
        sections = [s for s in sections if _in_window(s, window)]
        note = {"since": iso_utc(window[0]) or "", "until": iso_utc(window[1]) or ""}
    return Explanation(tenant=tenant, runs=facts.runs(), clock=facts.clock_note(),
                       sections=sections, window=note)


def _in_window(s: Section, window: tuple[datetime, datetime]) -> bool:
    lo, hi = window
    for m in s.timeline:
        if m.utc is not None and lo <= datetime.fromisoformat(m.utc) <= hi:
            return True
    return False


def run_days(audit: Any) -> list[datetime]:
    """Each run's wall-clock start (UTC), for times of day (``parse_time``)."""
    out = []
    for clock in audit.clocks.values():
        utc = getattr(clock, "utc", None)
        if utc is not None:
            out.append(utc if utc.tzinfo else utc.replace(tzinfo=timezone.utc))
    return out


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


@dataclass
class _Loss:
    """One distinct moment a claim lost blocks: one engine step (else one seq), one label,
    one evicting request."""

    first_seq: int
    last_seq: int
    ts: datetime | None
    label: str
    by: str | None
    positions: list[int]
    block_ids: list[int]


class _Facts:
    """The rows one tenant's explanation reads, and what identifies everyone else, keyed by
    run."""

    def __init__(self, audit: Any, tenant: str) -> None:
        self.audit = audit
        self.con = audit.con
        self.tenant = tenant
        claim_cols = set(self.con.table("claims").columns)
        # NOTE: claim instances (claim_seq) key claims; older tables key by the submission
        self.instance_col = "claim_seq" if "claim_seq" in claim_cols else "submitted_seq"
        self.feas_cols = set(self.con.table("feasibility").columns) \
            if "feasibility" in self.audit.tables else set()
        #: (run_id, claim_id) and (run_id, instance) of the tenant's own claims
        self.own_claims: set[tuple[str, str]] = set()
        self.own_instances: set[tuple[str, int]] = set()
        for run, cid, inst in self.con.execute(
                f"SELECT run_id, claim_id, {self.instance_col} FROM claims WHERE tenant = ?",
                [tenant]).fetchall():
            self.own_claims.add((run, cid))
            if inst is not None:
                self.own_instances.add((run, inst))
        #: (run_id, request_id) of the tenant's own requests; a claim's submitting request is
        #: the tenant's own even when it carried no tenant
        self.own_requests: set[tuple[str, str]] = {tuple(r) for r in self.con.execute("""
            SELECT run_id, request_id FROM requests WHERE tenant = $t
            UNION SELECT run_id, request_id FROM claims
                  WHERE tenant = $t AND request_id IS NOT NULL""", {"t": tenant}).fetchall()}
        self._foreign: dict[str, re.Pattern[str] | None] = {}
        #: computed what-ifs of the tenant's runs (set by ``explain``)
        self.replays: ReplayFacts | None = None

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
            return ("Times are ISO 8601 date-times in UTC (from each run's wall-clock anchor); "
                    "seq numbers are the trace's.")
        if len(missing) == len(runs):
            return ("This trace has no wall-clock anchor (no clock): times are shown by seq "
                    "number only.")
        return (f"{len(missing)} of {len(runs)} run(s) have no wall-clock anchor (no clock): "
                "their times are shown by seq number only; the others in UTC.")

    # -- identities ---------------------------------------------------------------------------

    def foreign_ids(self, run_id: str) -> set[str]:
        """Every identifier of run ``run_id`` that is not this tenant's own in that run: other
        tenants' names, claim ids, request ids (also as causes and blockers) and block hashes
        of other tenants' claims."""
        rows = self.con.execute(fill_sql("""
            SELECT DISTINCT tenant, 't' FROM events WHERE run_id = $r AND tenant IS NOT NULL
            UNION SELECT DISTINCT claim_id, 'c' FROM events
                  WHERE run_id = $r AND claim_id IS NOT NULL
            UNION SELECT DISTINCT request_id, 'q' FROM events
                  WHERE run_id = $r AND request_id IS NOT NULL
            UNION SELECT DISTINCT by_request_id, 'q' FROM events
                  WHERE run_id = $r AND by_request_id IS NOT NULL
            UNION SELECT DISTINCT unnest(blocking_claim_ids), 'c' FROM events
                  WHERE run_id = $r AND blocking_claim_ids IS NOT NULL
            UNION SELECT DISTINCT e.block_hash::VARCHAR, 'h' FROM events e
                  JOIN claims c ON c.run_id = e.run_id AND c.claim_id = e.claim_id
                  WHERE e.run_id = $r AND e.event = {event.claim_bound}
                    AND c.tenant IS DISTINCT FROM $t"""),
            {"r": run_id, "t": self.tenant}).fetchall()
        own = {"t": {self.tenant}, "c": {c for r, c in self.own_claims if r == run_id},
               "q": {q for r, q in self.own_requests if r == run_id}, "h": set()}
        return {v for v, kind in rows if v is not None and v not in own[kind]}

    def _foreign_pattern(self, run_id: str) -> re.Pattern[str] | None:
        if run_id not in self._foreign:
            ids = sorted(self.foreign_ids(run_id), key=lambda s: (-len(s), s))
            self._foreign[run_id] = re.compile(
                rf"(?<![{_WORD}])(?:{'|'.join(map(re.escape, ids))})(?![{_WORD}])"
            ) if ids else None
        return self._foreign[run_id]

    def safe_text(self, run_id: str, text: str | None) -> str:
        """Runtime-written text of run ``run_id`` as written when it names no identifier of
        that run but the tenant's own; else ``WITHHELD`` (never a partial edit)."""
        if not text:
            return ""
        pattern = self._foreign_pattern(run_id)
        return WITHHELD if pattern is not None and pattern.search(text) else text

    def whose_request(self, run_id: str, request_id: str | None) -> str:
        if request_id is None:
            return "a request the trace does not name"
        if (run_id, request_id) in self.own_requests:
            return f"your own request {request_id}"
        return f"{ANOTHER}'s request"

    def utc(self, ts: datetime | None) -> str | None:
        return iso_utc(ts)

    def at(self, seq: int, ts: datetime | None) -> str:
        u = self.utc(ts)
        return f"at {u} (seq {seq})" if u else f"at seq {seq}"

    # -- claims -------------------------------------------------------------------------------

    def claim_rows(self, claim: str | None) -> list[dict[str, Any]]:
        rel = self.con.execute(f"""
            SELECT c.*, c.{self.instance_col} AS instance_seq, m.manifest_json,
                   coalesce(m.policy, (SELECT any_value(e.policy) FROM events e
                                       WHERE e.run_id = c.run_id
                                         AND e.event = '{EVENT.run_started}')) AS policy
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
        losses = self.claim_losses(c)
        s.timeline = self.claim_timeline(c, losses)
        s.why = self.claim_why(c, losses)
        s.prevention = self.claim_prevention(c, s.lowering, self.has_whatif(c["run_id"]))
        if c["outcome"] in (CLAIM_OUTCOME.harmed, CLAIM_OUTCOME.demoted):
            s.whatif = self.claim_whatif(c)
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
                            "evidence": (self.safe_text(c["run_id"], str(row[0][1]))
                                         if ev_col else "lowering table"),
                            "source": "lowering table"}
        return derive_lowering(c.get("policy"), mode, c.get("manifest_json"))

    def _instance(self, c: dict[str, Any]) -> dict[str, Any]:
        return {"r": c["run_id"], "c": c["claim_id"], "i": c.get("instance_seq")}

    def claim_losses(self, c: dict[str, Any]) -> list[_Loss]:
        """The claim instance's block losses (``claim_timeline``), one ``_Loss`` per distinct
        moment: the same engine step (the same seq when the trace has no step), label and
        evicting request."""
        rows = self.con.execute("""
            SELECT t.seq, t.ts, t.label, t.by_request_id, t.position, t.block_id,
                   coalesce(e.step::VARCHAR, 'seq ' || t.seq::VARCHAR) AS moment
            FROM claim_timeline t
            LEFT JOIN events e ON e.run_id = t.run_id AND e.seq = t.seq
            WHERE t.run_id = $r AND t.claim_id = $c AND ($i IS NULL OR t.claim_seq = $i)
              AND t.kind = 'loss'
            ORDER BY t.seq, t.block_id""", self._instance(c)).fetchall()
        out: list[_Loss] = []
        key: tuple[Any, ...] | None = None
        for seq, ts, label, by, position, block_id, moment in rows:
            k = (moment, label, by)
            if k != key:
                out.append(_Loss(seq, seq, ts, label, by, [], []))
                key = k
            cur = out[-1]
            cur.last_seq = seq
            if position is not None:
                cur.positions.append(position)
            if block_id is not None:
                cur.block_ids.append(block_id)
        return out

    def claim_timeline(self, c: dict[str, Any], losses: list[_Loss]) -> list[Moment]:
        rows = self.con.execute("""
            SELECT seq, ts, kind, what, position, request_id, released_by, reason,
                   by_request_id
            FROM claim_timeline
            WHERE run_id = $r AND claim_id = $c AND ($i IS NULL OR claim_seq = $i)
              AND kind <> 'loss'
            ORDER BY seq""", self._instance(c)).fetchall()
        run_id = c["run_id"]
        out: list[Moment] = [self.loss_moment(run_id, x) for x in losses]
        bound: list[tuple[int, Any, int | None]] = []
        for seq, ts, _kind, what, position, req, released_by, reason, by in rows:
            if what == EVENT.claim_bound:
                bound.append((seq, ts, position))
                continue
            out.append(Moment(seq, self.utc(ts), self.event_text(
                run_id, what, req, released_by, reason, by)))
        if bound:
            seq, ts, _ = bound[0]
            out.append(Moment(seq, self.utc(ts),
                              f"{len(bound)} block(s) bound to the claim (positions "
                              f"{_ranges(sorted(p for _, _, p in bound if p is not None))})"))
        out.sort(key=lambda m: m.seq)
        return out

    def loss_moment(self, run_id: str, x: _Loss) -> Moment:
        span = f"seq {x.first_seq}-{x.last_seq}: " if x.last_seq != x.first_seq else ""
        where = (f"positions {_ranges(sorted(set(x.positions)))}" if x.positions
                 else "positions not recorded")
        blocks = (f"; physical block ids {_ranges(sorted(set(x.block_ids)))}"
                  if x.block_ids else "")
        n = max(len(set(x.positions)), len(set(x.block_ids)))
        return Moment(x.first_seq, self.utc(x.ts),
                      f"{span}{n} block(s) lost ({where}{blocks}) to make room for "
                      f"{self.whose_request(run_id, x.by)} - {LABEL_WORDS.get(x.label, x.label)}")

    def event_text(self, run_id: str, what: str, req: str | None, released_by: str | None,
                   reason: str | None, by: str | None) -> str:
        why = f" ({self.safe_text(run_id, reason)})" if reason else ""
        if what == EVENT.claim_submitted:
            own = req is not None and (run_id, req) in self.own_requests
            return "you submitted the claim" + (f" with request {req}" if own else "")
        if what == EVENT.claim_accepted:
            return "the runtime accepted the claim: from here it is in force"
        if what == EVENT.claim_rejected:
            return "the runtime rejected the claim" + why
        if what == EVENT.claim_materialized:
            return "the claim materialized: enough of its blocks were resident (the runtime " \
                   "reported it)"
        if what == EVENT.claim_demoted:
            return ("the operator's arbiter demoted the claim to admit "
                    f"{self.whose_request(run_id, by)}: from here its blocks are ordinary "
                    "cache entries")
        if what == EVENT.claim_expired:
            return "the claim expired (its TTL ran out): from here its blocks are ordinary"
        if what == EVENT.claim_released:
            who = self.releaser(run_id, released_by, req)
            return f"{who} released the claim: from here its blocks are ordinary"
        if what == EVENT.claim_release_refused:
            return "a release of the claim was refused" + why
        if what == EVENT.claim_harmed:
            return ("the runtime reported the claim harmed (the audit's own verdict is the label "
                    "of each loss)")
        return what.replace("_", " ") + why

    def releaser(self, run_id: str, released_by: str | None, req: str | None) -> str:
        if released_by == "tenant":
            return "you (the tenant)"
        if released_by in ("operator", "arbiter"):
            return "the operator"
        if req is not None and (run_id, req) in self.own_requests:
            return f"you (request {req})"
        return "someone (the trace does not say who)"

    # -- why ----------------------------------------------------------------------------------

    def claim_why(self, c: dict[str, Any], losses: list[_Loss]) -> list[str]:
        """One sentence per distinct loss moment (and the demotion), each computed from the
        rebuilt ``feasibility`` figures of the evicting request's admission."""
        run_id = c["run_id"]
        size = c.get("positions_bound")
        out = []
        for x in losses:
            n = max(len(set(x.positions)), len(set(x.block_ids)))
            head = (f"{self.at(x.first_seq, x.ts)} {n} of your {size or '?'} block(s) were "
                    f"evicted ({x.label}) to admit {self.whose_request(run_id, x.by)}")
            out.append(head + self.capacity(self.admission(run_id, x.by, x.first_seq)))
        if c.get("release_event") == EVENT.claim_demoted and c.get("release_seq") is not None:
            out.insert(0, self.demotion_why(c))
        if c["outcome"] == CLAIM_OUTCOME.rejected:
            reason = self.safe_text(run_id, c.get("reject_reason")) or "no reason given"
            out.append(f"rejected at submission: {reason}")
        return out

    def admission(self, run_id: str, request_id: str | None, seq: int) -> dict[str, Any] | None:
        """The request's admission row of ``feasibility`` nearest to ``seq`` (the last one at
        or before it, else the first after: the recorder may log the admission after the
        allocation), with the rebuilt figures read by name."""
        if request_id is None or not self.feas_cols:
            return None
        need = next((x for x in ("blocks_required", "required_blocks")
                     if x in self.feas_cols), None)
        cols = {"seq": "seq", "need": need, "usable": "usable_blocks",
                "protected": "protected_blocks", "claims": "protected_claim_seqs"}
        sel = ", ".join(f'"{v}" AS {k}' if v in self.feas_cols else f"NULL AS {k}"
                        for k, v in cols.items())
        rel = self.con.execute(f"""
            SELECT {sel} FROM feasibility
            WHERE run_id = $r AND request_id = $q AND decision = $d
            ORDER BY seq > $s, abs(seq - $s) LIMIT 1""",
            {"r": run_id, "q": request_id, "s": seq, "d": DECISION.admitted})
        row = rel.fetchone()
        return None if row is None else {**dict(zip(cols, row)), "_run": run_id}

    def split(self, run_id: str, claim_seqs: Iterable[int] | None) -> tuple[int, int]:
        """How many of these claim instances of ``run_id`` are the tenant's, how many not."""
        seqs = list(claim_seqs or [])
        mine = sum((run_id, s) in self.own_instances for s in seqs)
        return mine, len(seqs) - mine

    def capacity(self, adm: dict[str, Any] | None) -> str:
        if adm is None:
            return "; the trace does not show that request's admission (no capacity figures)"
        need, usable, prot = adm["need"], adm["usable"], adm["protected"]
        mine, theirs = self.split_for(adm)
        if need is None or usable is None or prot is None:
            return (f"; at its admission (seq {adm['seq']}) it needed {_n(need)} block(s), "
                    f"{_n(usable)} were usable and {_n(prot)} protected (the trace lacks a "
                    "figure, so no comparison)")
        fits = prot + need <= usable
        return (f"; at its admission (seq {adm['seq']}) it needed {need} block(s) while "
                f"{usable} were usable and {prot} were protected by claims in force "
                f"({mine} claim(s) of yours, {theirs} of other tenants) - {prot} + {need} "
                f"{'<=' if fits else '>'} {usable}: "
                + ("it fit beside the claims in force, so these blocks went to ordinary "
                   "cache pressure" if fits else
                   "it did not fit beside the claims in force (a capacity conflict)"))

    def split_for(self, adm: dict[str, Any]) -> tuple[int, int]:
        return self.split(adm.get("_run", ""), adm.get("claims"))

    def resident_at(self, run_id: str, claim_seq: int, seq: int) -> int:
        """Blocks of claim instance ``claim_seq`` resident just before ``seq``: positions bound
        before it less positions lost before it (``claim_timeline``)."""
        row = self.con.execute(fill_sql("""
            SELECT count(DISTINCT position) FILTER (WHERE what = {event.claim_bound}),
                   count(DISTINCT position) FILTER (WHERE kind = 'loss')
            FROM claim_timeline
            WHERE run_id = $r AND claim_seq = $i AND seq < $s"""),
            {"r": run_id, "i": claim_seq, "s": seq}).fetchone()
        return max(0, (row[0] or 0) - (row[1] or 0)) if row else 0

    def demotion_why(self, c: dict[str, Any]) -> str:
        """The conflict behind a demotion: the demanding request's admission figures plus the
        blocks of every claim demoted for it (protected at the decision, released by it)."""
        run_id, dseq = c["run_id"], c["release_seq"]
        row = self.con.execute("SELECT by_request_id, ts FROM events WHERE run_id = ? AND seq = ?",
                               [run_id, dseq]).fetchone()
        by, ts = row if row else (None, None)
        head = (f"{self.at(dseq, ts)} your claim was demoted to admit "
                f"{self.whose_request(run_id, by)}")
        adm = self.admission(run_id, by, dseq + 1)
        if adm is None or None in (adm["need"], adm["usable"], adm["protected"]):
            return head + "; the trace does not show that request's admission figures"
        demoted = [r[0] for r in self.con.execute(f"""
            SELECT c.{self.instance_col} FROM claims c JOIN events e
              ON e.run_id = c.run_id AND e.seq = c.release_seq
            WHERE c.run_id = $r AND c.release_event = '{EVENT.claim_demoted}'
              AND e.by_request_id = $q AND c.{self.instance_col} IS NOT NULL""",
            {"r": run_id, "q": by}).fetchall()]
        freed = sum(self.resident_at(run_id, s, dseq) for s in demoted)
        in_force = list(adm["claims"] or []) + [s for s in demoted
                                                if s not in (adm["claims"] or [])]
        mine, theirs = self.split(run_id, in_force)
        need, usable = adm["need"], adm["usable"]
        before = adm["protected"] + freed
        fits = before + need <= usable
        return (f"{head}: it needed {need} block(s) while {usable} were usable and {before} "
                f"blocks of claims in force were protected at the decision ({mine} claim(s) "
                f"of yours, {theirs} of other tenants) - {before} + {need} "
                f"{'<=' if fits else '>'} {usable}: "
                + (f"it did not fit, so {len(demoted)} claim(s) holding {freed} block(s) were "
                   f"demoted; after that {adm['protected']} + {need} "
                   f"{'<=' if adm['protected'] + need <= usable else '>'} {usable} at its "
                   f"admission (seq {adm['seq']})" if not fits else
                   "it fit without a demotion, so the figures do not call for one (see the "
                   "findings of this run)"))

    def claim_prevention(self, c: dict[str, Any], lowering: dict[str, Any],
                         computed: bool = False) -> list[str]:
        """Advice the contract supports for the claim's mode and outcome (docs/claims.md).
        NOTE: what another policy or pool would have done is never said here: only a computed
        replay can say it (``claim_whatif``); without one (``computed`` False), ``NO_WHATIF``
        says so."""
        mode, outcome = c.get("protection_mode"), c["outcome"]
        unknown_otherwise = [] if computed else [NO_WHATIF]
        if outcome == CLAIM_OUTCOME.harmed:
            if lowering.get("verdict") != "adapter-policy evidence":
                return [f"Your mode ({mode}) was not enforced in this run "
                        f"({lowering.get('evidence')}).", *unknown_otherwise]
            if mode == MODE.soft_priority:
                return ["soft_priority only orders evictions: it never keeps blocks resident "
                        f"when a request needs them; {MODE.hard_protected} is the mode that "
                        "does.", *unknown_otherwise]
            return ["An enforced claim was harmed: this is a runtime bug (see the findings and "
                    "conformance of this run); report it with this explanation."]
        if outcome == CLAIM_OUTCOME.demoted:
            if mode != MODE.demotable:
                return [f"Your mode ({mode}) does not allow a demotion, yet the trace shows "
                        "one: this is a runtime bug (see the findings and conformance of this "
                        "run); report it with this explanation."]
            return ["demotable lets the arbiter demote your claim when a request does not fit "
                    f"beside the claims in force; {MODE.hard_protected} is the mode it never "
                    "demotes.", *unknown_otherwise]
        if outcome == CLAIM_OUTCOME.expired:
            if c.get("ttl_s") is None:
                return ["The claim declared no TTL, yet the trace shows an expiry: see the "
                        "findings and conformance of this run."]
            return [f"A longer ttl_s (it was {c['ttl_s']:g} s), or renewing the claim before "
                    "it ran out."]
        if outcome == CLAIM_OUTCOME.rejected:
            return ["Submit the claim with a mode this runtime supports (see the lowering "
                    "verdict), or with fewer blocks."]
        if outcome == CLAIM_OUTCOME.unknown:
            return ["Nothing can be said: the trace has a hole. Keep the recorder's queue "
                    "large enough that it drops no events."]
        return []

    def has_whatif(self, run_id: str) -> bool:
        """Whether a replay of run ``run_id`` was computed and given to ``explain``."""
        return bool(self.replays is not None and self.replays.of(run_id))

    def claim_whatif(self, c: dict[str, Any]) -> list[str]:
        """One sentence per computed replay of the claim's run: the claim instance's outcome
        in it, and the requests it refused, deferred or preempted beside the recorded ones,
        counted (other tenants' requests are never named: the counts come from
        ``kvclaims.replays``, which only counts)."""
        run_id = c["run_id"]
        if self.replays is None or not self.replays.of(run_id):
            return []
        nth = self.con.execute(f"""
            SELECT count(*) FROM claims
            WHERE run_id = $r AND claim_id = $c
              AND ($i IS NULL OR {self.instance_col} <= $i)""", self._instance(c)).fetchone()
        nth = max(1, int(nth[0] or 0)) if c.get("instance_seq") is not None else 1
        rec = counts(self.con, run_id, self.tenant)
        out = []
        for r in self.replays.of(run_id):
            outcome = self.replays.claim_outcome(r, c["claim_id"], nth)
            did = ("preserved this claim" if outcome == CLAIM_OUTCOME.preserved else
                   f"left this claim {outcome}" if outcome is not None else
                   "has no record of this claim (its request was not submitted there)")
            out.append(f"{self.replay_head(run_id, r)} {did}. "
                       f"{cost_sentence(self.replays.counts(r, self.tenant), rec)}")
        return out

    def replay_head(self, run_id: str, r: Replay) -> str:
        """Which replay of run ``run_id`` a citation reads: its policy, pool, when it was
        computed, its run id (withheld when it names someone else's identifier) and whether
        it is exact (approximations counted, not quoted: they name requests)."""
        name = r.run_id if self.safe_text(run_id, r.run_id) == r.run_id else \
            "its run id withheld: it names another tenant's identifiers"
        how = ("exact" if r.exact else
               f"approximate: {len(r.approximations)} thing(s) the recording did not pin "
               "down, listed in its manifest")
        return (f"A replay of this run under {r.policy} at {_n(r.usable_blocks)} usable blocks "
                f"(computed {r.computed_utc or 'at an unknown time'}, run {name}; {how})")

    # -- requests -----------------------------------------------------------------------------

    def request_rows(self, request: str | None) -> list[dict[str, Any]]:
        rel = self.con.execute(fill_sql("""
            SELECT * FROM requests
            WHERE tenant = $t AND ($q IS NULL OR request_id = $q)
              AND ($q IS NOT NULL OR outcome IN ({request_outcome.refused},
                       {request_outcome.deferred_then_served}, {request_outcome.preempted})
                   OR deferrals > 0 OR preemptions > 0)
            ORDER BY run_id, arrived_seq NULLS LAST, request_id"""),
            {"t": self.tenant, "q": request})
        cols = [d[0] for d in rel.description]
        return [dict(zip(cols, r)) for r in rel.fetchall()]

    def request_section(self, q: dict[str, Any]) -> Section:
        run_id = q["run_id"]
        s = Section(kind="request", run_id=run_id, id=q["request_id"],
                    instance_seq=q.get("arrived_seq"), outcome=q["outcome"],
                    title=f"Request {q['request_id']} in run {run_id}: {q['outcome']}")
        # NOTE: a blocking claim is the tenant's own only as (run, claim instance)
        rows = self.con.execute("""
            SELECT seq, ts, decision, required_blocks, protected_blocks, usable_blocks,
                   shortfall_blocks, list(blocking_claim_seq) FILTER
                       (WHERE blocking_claim_seq IS NOT NULL) AS seqs,
                   list(DISTINCT blocking_claim_id ORDER BY blocking_claim_id) FILTER
                       (WHERE blocking_claim_id IS NOT NULL) AS ids, live_blocks
            FROM refusals_with_blockers WHERE run_id = $r AND request_id = $q
            GROUP BY ALL ORDER BY seq""", {"r": run_id, "q": q["request_id"]}).fetchall()
        events = self.con.execute(fill_sql("""
            SELECT e.seq, e.ts, e.event, e.free_blocks, f.protected_blocks, e.usable_blocks,
                   e.blocking_claim_ids
            FROM events e
            -- NOTE: the protected figure is the rebuilt one (feasibility), never the runtime's
            LEFT JOIN feasibility f ON f.run_id = e.run_id AND f.seq = e.seq
            WHERE e.run_id = ? AND e.request_id = ?
              AND e.event IN ({event.request_arrived}, {event.request_admitted},
                              {event.request_preempted}, {event.request_finished})
            ORDER BY e.seq"""), [run_id, q["request_id"]]).fetchall()
        timeline: list[Moment] = []
        for seq, ts, ev, free, prot, usable, blocking in events:
            text = {EVENT.request_arrived: "the request arrived",
                    EVENT.request_admitted: "the request was admitted",
                    EVENT.request_finished: "the request finished",
                    EVENT.request_preempted: "the request was preempted (its KV blocks were taken "
                                         "back; vLLM recomputes it)"}[ev]
            timeline.append(Moment(seq, self.utc(ts), text))
            if ev == EVENT.request_preempted:
                s.why.append(self.preemption_why(run_id, seq, ts, free, prot, usable, blocking))
        last_mine: list[str] = []
        last_theirs = 0
        for seq, ts, decision, req, prot, usable, short, seqs, ids, live in rows:
            mine_seqs = [x for x in (seqs or []) if (run_id, x) in self.own_instances]
            my_claims = sorted({c for c in (ids or []) if (run_id, c) in self.own_claims})
            theirs = len(set(seqs or [])) - len(set(mine_seqs))
            timeline.append(Moment(seq, self.utc(ts), f"the request was {decision}"))
            s.why.append(
                f"{self.at(seq, ts)} {decision}: {_n(prot)} block(s) were protected by claims "
                f"in force ({len(set(mine_seqs))} of yours, {theirs} of other tenants), other "
                f"running requests held {_n(live)}, you needed {_n(req)}, {_n(usable)} were "
                f"usable, shortfall {_n(short)}"
                + (f"; your blocking claim(s): {', '.join(my_claims)}" if my_claims else ""))
            last_mine, last_theirs = my_claims, theirs
        timeline.sort(key=lambda m: m.seq)
        s.timeline = timeline
        if rows:
            req, short = rows[-1][3], rows[-1][6]
            tips = []
            if short:
                tips.append(f"{short} more usable block(s), or a request of at most "
                            f"{req - short} block(s)" if req is not None
                            else f"{short} more usable block(s)")
            if last_mine:
                tips.append(f"releasing your own claim(s) {', '.join(last_mine)} once you no "
                            "longer need them")
            if last_theirs:
                tips.append("the other tenants' claims being released or expiring earlier "
                            "(an operator decision)")
            # NOTE: arithmetic on the recorded figures of the last decision, not a replay:
            # the wording says so, so it is never read as what another pool would have done
            s.prevention = [RECORDED_ARITHMETIC + "; ".join(tips) + "."] if tips else []
        if q["outcome"] == REQUEST_OUTCOME.preempted and not s.prevention:
            s.prevention = ["More usable blocks, or fewer concurrent long requests: vLLM "
                            "preempts the newest running request when the pool runs out."]
        if self.has_whatif(run_id):
            s.whatif = self.request_whatif(q)
        else:
            s.prevention.append(NO_WHATIF)
        return s

    def request_whatif(self, q: dict[str, Any]) -> list[str]:
        """One sentence per computed replay of the request's run: what it did with this
        request (matched by id: a replay keeps the recorded request ids) beside the recording,
        and at what cost to others, counted (``kvclaims.replays`` only counts them)."""
        run_id = q["run_id"]
        if self.replays is None:
            return []
        rec = counts(self.con, run_id, self.tenant)
        recorded = RequestFate(q["outcome"], int(q.get("deferrals") or 0),
                               int(q.get("preemptions") or 0))
        return [f"{self.replay_head(run_id, r)} "
                f"{fate_words(self.replays.request_fate(r, q['request_id']), recorded)}. "
                f"{cost_sentence(self.replays.counts(r, self.tenant), rec)}"
                for r in self.replays.of(run_id)]

    def preemption_why(self, run_id: str, seq: int, ts: Any, free: Any, prot: Any, usable: Any,
                       blocking: Sequence[str] | None) -> str:
        if free is None and prot is None and usable is None:
            return (f"{self.at(seq, ts)} preempted; the trace does not record the pool state "
                    "at the preemption")
        mine = sum(1 for b in blocking or [] if (run_id, b) in self.own_claims)
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


def fate_words(fate: RequestFate | None, recorded: RequestFate) -> str:
    """What a replay did with a request, in words, with its deferrals and preemptions beside
    the recorded ones; a replay that never submitted it says so."""
    if fate is None:
        return "has no record of this request (it was not submitted there)"
    what = _FATE_WORDS.get(fate.outcome, f"left this request {fate.outcome}")
    return (f"{what} ({fate.deferrals} deferral(s), {fate.preemptions} preemption(s); "
            f"recorded: {recorded.outcome} after {recorded.deferrals} deferral(s), "
            f"{recorded.preemptions} preemption(s))")


def cost_sentence(got: Counts, rec: Counts) -> str:
    """What a replay cost others and the tenant, counted, beside the recorded run's counts
    (other tenants' requests and claims are never named)."""
    return (f"In it {got.others_refused} request(s) of other tenants were refused, "
            f"{got.others_deferred} deferred and {got.others_preempted} preempted (recorded: "
            f"{rec.others_refused}, {rec.others_deferred}, {rec.others_preempted}), and "
            f"{got.others_harmed} claim(s) of other tenants were harmed and "
            f"{got.others_demoted} demoted (recorded: {rec.others_harmed}, "
            f"{rec.others_demoted}); {got.own_refused} of your own requests were refused and "
            f"{got.own_deferred} deferred (recorded: {rec.own_refused}, {rec.own_deferred}).")


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
