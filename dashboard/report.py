"""A shareable incident report: one self-contained HTML page for a set of run directories.

``kvclaims report RUN_DIR... --out report.html`` (or ``build_report(paths)``) writes the
headline, the capacity sweep (where the runs form one), the computed what-ifs (``--whatif DIR``:
each recorded run beside its replays, docs/whatif.md), the block-level timeline of the runs
that matter (wall-clock time on the x axis where the run has a clock) with a per-position block
lane for each harmed claim, the claims, every tenant's explanation, the findings and the
conformance verdicts (``not_exercised`` kept apart from ``pass``).

Charts are the dashboard's own (``kvclaims.dashboard.charts``), drawn in the page by Vega-Lite
with its own zoom (wheel/drag along x, double-click resets) and hover tooltips; the Vega
libraries are inlined (``vl_convert.javascript_bundle``), so the page fetches nothing when
opened. The page fits a 1,400 px window: tables put the decisive columns first and wrap.
NOTE: every trace string is HTML-escaped; the chart specs are JSON inside a
``<script type="application/json">`` with ``<`` escaped, so no trace string can close it.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Any

import pandas as pd

from kvclaims.contract.vocabulary import (CLAIM_OUTCOME, LABEL, LABEL_SEVERITY, REQUEST_OUTCOME,
                                          VERDICT)
from kvclaims.contract.trace_writer import atomic_output
from kvclaims.dashboard import charts, data
from kvclaims.replays import TITLES

#: Timelines drawn at most (runs with harm, refusals or failing checks first).
MAX_TIMELINES = 6
#: Request lanes drawn at most per timeline (the ones that matter first).
MAX_REQUEST_LANES = 30
#: Plot width of the report's charts (their labels and legends fit beside it in 1,400 px).
REPORT_WIDTH = 720
#: Runs a capacity sweep needs before the report gives it a section.
MIN_SWEEP_RUNS = 2

_CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px auto; max-width: 1340px;
       padding: 0 12px; color: #111; box-sizing: border-box; }
h1 { font-size: 24px; margin-bottom: 4px; } h2 { margin-top: 32px; border-bottom: 1px solid #ccc; }
.summary { font-size: 17px; padding: 10px 14px; background: #f4f4f4;
           border-left: 6px solid #D55E00; }
.ok { border-left-color: #0072B2; }
.wrap { max-width: 100%; overflow-x: auto; }
table { border-collapse: collapse; margin: 8px 0 16px; font-size: 13px; width: 100%; }
th, td { border: 1px solid #ccc; padding: 3px 7px; text-align: left; vertical-align: top;
         overflow-wrap: break-word; }
th { background: #eee; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.harm { color: #D55E00; font-weight: 600; }
.v-fail { background: #D55E00; color: #fff; } .v-unknown { background: #000; color: #fff; }
.v-pass { background: #cfe6f5; } .v-not_exercised { background: #fff; color: #777; }
.chart { max-width: 100%; overflow-x: auto; margin: 8px 0; }
details > summary { font-weight: 600; margin: 6px 0; cursor: pointer; }
.pair { display: flex; flex-wrap: wrap; gap: 16px; } .note { color: #555; font-size: 12px; }
"""

#: The script that draws every chart of the page (bundled with the Vega libraries).
_EMBED_JS = """
const specs = JSON.parse(document.getElementById("kvc-charts").textContent);
for (const [id, spec] of Object.entries(specs)) {
  vegaEmbed("#" + id, spec, {actions: false, renderer: "svg"});
}
"""


def _e(v: Any) -> str:
    """A cell as escaped text (missing values as a dash)."""
    if data._na(v) or (isinstance(v, float) and pd.isna(v)):
        return "-"
    return html.escape(str(v))


def table_html(df: pd.DataFrame, classes: dict[str, Callable[[Any], str]] | None = None) -> str:
    """A DataFrame as an escaped HTML table; numbers right-aligned; ``classes`` maps a column
    to a function giving a cell's CSS class from its value."""
    classes = classes or {}
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in df.columns)
    rows = []
    for rec in df.itertuples(index=False):
        cells = []
        for col, v in zip(df.columns, rec):
            cls = classes.get(col, lambda _: "")(v)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                cls = (cls + " num").strip()
            cells.append(f'<td class="{cls}">{_e(v)}</td>' if cls else f"<td>{_e(v)}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    # NOTE: a table wider than the page scrolls inside its own box; the page never does
    return (f"<div class='wrap'><table><thead><tr>{head}</tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table></div>")


class Charts:
    """The charts of one page: each gets a ``<div>`` where it is drawn; ``script()`` is the
    one inline script (specs + Vega) that draws them all."""

    def __init__(self) -> None:
        self.specs: dict[str, Any] = {}

    def html(self, chart: Any, alt_text: str) -> str:
        """A placeholder for ``chart`` (its spec kept for ``script``)."""
        cid = f"chart-{len(self.specs)}"
        self.specs[cid] = json.loads(chart.to_json())
        return (f'<div class="chart" id="{cid}" role="img" aria-label="{html.escape(alt_text)}">'
                "</div>")

    def script(self) -> str:
        """The specs as JSON (every ``<`` escaped) and the Vega bundle that draws them."""
        if not self.specs:
            return ""
        import vl_convert

        specs = json.dumps(self.specs).replace("<", "\\u003c").replace("\u2028", "\\u2028")
        return (f'<script type="application/json" id="kvc-charts">{specs}</script>\n'
                f'<script type="module">{vl_convert.javascript_bundle(_EMBED_JS)}</script>')


def timeline_runs(audit: data.Pages) -> list[str]:
    """The runs whose timeline the report draws: harm, refusals, failing or unknown checks
    first (most harm first), then the rest, at most ``MAX_TIMELINES``."""
    h = data.headline(audit)
    h = h.assign(_k=-(h["lost_harm"] * 1000 + h[REQUEST_OUTCOME.refused] * 10 + h["checks_failed"]
                      + h["checks_unknown"]))
    return h.sort_values("_k", kind="stable")["run_id"].head(MAX_TIMELINES).tolist()


def important_requests(audit: data.Pages, run_id: str, limit: int = MAX_REQUEST_LANES
                       ) -> pd.DataFrame:
    """A run's request lanes, the ones that matter first (evicted a claimed block as harm,
    refused, preempted, deferred), at most ``limit`` requests."""
    lanes = data.request_lanes(audit, run_id)
    if lanes.empty:
        return lanes
    evictors = set()
    for rid, cseq in data.harmed_claims(audit, run_id):
        evictors |= set(data.harm_evictors(audit, rid, cseq)["request_id"])
    states = lanes.groupby("lane")["state"].agg(set)
    score = {lane: (lane in evictors) * 8 + (REQUEST_OUTCOME.refused in s) * 4
             + (REQUEST_OUTCOME.preempted in s) * 2 + ("deferred" in s)
             for lane, s in states.items()}
    order = list(dict.fromkeys(lanes["lane"]))
    keep = sorted(order, key=lambda x: -score[x])[:limit]
    keep_set = set(keep)
    return lanes[lanes["lane"].isin(keep_set)]


def important_claims(audit: data.Pages, run_id: str, highlight: str | None = None,
                     limit: int = MAX_REQUEST_LANES) -> pd.DataFrame:
    """A run's claim lanes, the ones that lost blocks first (harm first, then any label), the
    highlighted one always, at most ``limit`` claims."""
    lanes = data.claim_lanes(audit, run_id)
    marks = data.claim_loss_marks(audit, run_id)
    worst = marks.assign(s=marks["label"].map(LABEL_SEVERITY)).groupby("lane")["s"].max().to_dict()
    lost = marks.groupby("lane")["blocks"].sum().to_dict()
    order = list(dict.fromkeys(lanes["lane"]))
    ranked = sorted(order, key=lambda c: (c != highlight, -worst.get(c, 0), -lost.get(c, 0)))
    keep = set(ranked[:limit])
    return lanes[lanes["lane"].isin(keep)]


def run_timeline(audit: data.Pages, run_id: str, highlight: str | None = None,
                 width: int | str = charts.WIDTH, axis: str = "seq") -> Any:
    """The timeline chart of one run (shared by the app's Timeline page and the report):
    every change of the pool, the claims and requests that matter most (at most
    ``MAX_REQUEST_LANES`` lanes each), on seq or (``axis="utc"``, a run with a clock) UTC."""
    if axis == "utc" and not data.has_clock(audit, run_id):
        axis = "seq"
    claims = important_claims(audit, run_id, highlight)
    marks = data.claim_loss_marks(audit, run_id)
    marks = marks[marks["lane"].isin(set(claims["lane"]))]
    occ = data.occupancy_long(audit, run_id)
    losses = data.run_losses(audit, run_id)
    requests = important_requests(audit, run_id)
    if axis == "utc":
        t = lambda df, cols=("seq",): data.add_utc(audit, run_id, df, cols)  # noqa: E731
        # NOTE: a stacked area stacks the rows of one x value: seqs of one millisecond
        # would add up, so each category keeps its last state per millisecond
        occ = t(occ)
        occ = occ.assign(_ms=occ["seq_utc"].floordiv(1)).drop_duplicates(
            ["category", "_ms"], keep="last").drop(columns="_ms")
        losses, marks = t(losses), t(marks)
        claims, requests = t(claims, ("start", "end")), t(requests, ("start", "end"))
    return charts.timeline_chart(occ, data.usable_blocks(audit, run_id), losses, claims, marks,
                                 requests, highlight=highlight, width=width, axis=axis)


def position_lanes(audit: data.Pages, run_id: str, claim_seq: int,
                   width: int | str = charts.WIDTH, axis: str = "seq") -> Any:
    """A claim instance's per-position block lane (``charts.position_lanes_chart``)."""
    if axis == "utc" and not data.has_clock(audit, run_id):
        axis = "seq"
    df = data.claim_position_lanes(audit, run_id, claim_seq)
    if axis == "utc":
        df = data.add_utc(audit, run_id, df, ("start", "end"))
    return charts.position_lanes_chart(
        df, width=width, axis=axis,
        title=f"blocks of {data.claim_label(audit, run_id, claim_seq)}, by position")


#: Headline columns, decisive first (what was harmed or refused, then the run's setup).
HEADLINE_COLUMNS = ("run_id", "claims_harmed", "lost_harm", REQUEST_OUTCOME.refused, "lost_unknown",
                    "checks_failed", "checks_unknown", "findings", "policy", "usable_blocks",
                    "lost_expiry", "lost_relaxation", "lost_eviction", "deferred",
                    REQUEST_OUTCOME.preempted)
#: Sweep columns shown in the report, decisive first (``data.SWEEP_TITLES`` names them).
SWEEP_COLUMNS = ("policy", "usable_blocks", "active_outcome", "resident_blocks_lost", LABEL.harm,
                 "shortfall_blocks", "blocking_claim_ids", "claim_outcome", "blocks_lost",
                 "run_id")


def sweep_section(audit: data.Pages, chart: Charts) -> list[str]:
    """The capacity-sweep section: per scenario with at least ``MIN_SWEEP_RUNS`` runs, what
    happened at each point and the two sweep plots."""
    out: list[str] = []
    for scenario in data.sweep_scenarios(audit):
        table = data.capacity_sweep(audit, scenario)
        if len(table) < MIN_SWEEP_RUNS:
            continue
        harmed = int((table[LABEL.harm] > 0).sum())
        refused = int((table["active_outcome"] == REQUEST_OUTCOME.refused).sum())
        out.append(f"<h3>{_e(scenario)}</h3><p>{len(table)} points: the active request's "
                   f"allocation evicted resident blocks as harm at {harmed} of them; it was "
                   f"refused at {refused}.</p>")
        cols = [c for c in SWEEP_COLUMNS if c in table.columns]
        shown = table[cols].rename(columns=lambda c: data.SWEEP_TITLES.get(c, c))
        out.append(table_html(shown, {"of those: harm": lambda v: LABEL.harm if v else ""}))
        series = data.sweep_series(audit, scenario)
        out.append("<div class='pair'>" + "".join(
            chart.html(charts.sweep_chart(series, m).properties(width=440), f"{m} by capacity")
            for m in ("resident blocks lost", "shortfall")) + "</div>")
    if out:
        out.insert(0, "<h2>Capacity sweep</h2>")
    return out


def whatif_section(audit: data.Pages, chart: Charts) -> list[str]:
    """The what-if section: for each audited run with computed replays, the recorded run
    beside each replayed point (``data.whatif_comparison``, the table ``kvclaims whatif``
    prints) and, when the points span pool sizes, the sweep chart of harm and refusals;
    without any replay, one line saying none was computed."""
    out = ["<h2 id='whatif'>What-if</h2>"]
    runs = data.whatif_runs(audit)
    if not runs:
        out.append(f"<p class='note'>{_e(data.NO_WHATIF)} kvclaims report RUN_DIR... "
                   "--whatif DIR shows one here.</p>")
    for run_id in runs:
        comparison = data.whatif_comparison(audit, run_id)
        out.append(f"<h3>{_e(run_id)}</h3><p>The recorded run "
                   f"{_e(data.whatif_caption(comparison))}</p>")
        out.append(table_html(data.whatif_table(comparison), {
            f"blocks lost: {LABEL.harm}": lambda v: LABEL.harm if v else "",
            TITLES["claims_harmed"]: lambda v: LABEL.harm if v else ""}))
        if data.whatif_chartable(comparison):
            series = data.whatif_series(comparison)
            out.append("<div class='pair'>" + "".join(
                chart.html(charts.sweep_chart(series, m, unit).properties(width=440),
                           f"{m} by usable blocks, recorded and replayed")
                for m, _col, unit in data.WHATIF_METRICS) + "</div>")
    orphans = data.whatif_orphans(audit)
    if orphans:
        out.append(f"<p class='note'>{len(orphans)} replay(s) of runs not in this report "
                   "(give the recorded run too to set them beside it).</p>")
    return out


def build_report(source: data.Source, title: str = "kvclaims incident report") -> str:
    """The whole report as one HTML string (see the module docstring)."""
    audit = source if isinstance(source, data.Pages) else data.load_audit(source)
    chart = Charts()
    head = data.headline(audit)
    harmful = int(head["lost_harm"].sum()) > 0
    made = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    out = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
           f"<meta name='viewport' content='width=device-width'><title>{html.escape(title)}"
           f"</title><style>{_CSS}</style></head><body>",
           f"<h1>{html.escape(title)}</h1>",
           f"<p class='note'>Made {made} from {len(audit.run_ids)} run(s): "
           f"{_e(', '.join(audit.paths))}</p>",
           f"<p class='summary{'' if harmful else ' ok'}'>{_e(data.summary_text(audit))}</p>"]
    out += [f"<p class='note'>Warning: {_e(w)}</p>" for w in audit.truncations]
    out.append("<h2>Headline per run</h2>")
    worst = head.assign(_k=-(head["lost_harm"] * 1000 + head[REQUEST_OUTCOME.refused] * 10
                             + head["checks_failed"] + head["checks_unknown"]))
    worst = worst[worst["_k"] < 0].sort_values("_k", kind="stable").head(8)
    if len(worst):
        out.append("<ul>")
        for r in worst.to_dict("records"):
            cls = f" class='{LABEL.harm}'" if r["lost_harm"] else ""
            out.append(f"<li><b>{_e(r['run_id'])}</b> ({_e(r['policy'])}, "
                       f"{_e(r['usable_blocks'])} usable blocks): "
                       f"<span{cls}>{_e(data.headline_text(r))}</span></li>")
        out.append("</ul>")
    if len(head) and int(head[[f"lost_{k}" for k in data.LABELS]].to_numpy().sum()):
        out.append(chart.html(charts.headline_chart(head, width=REPORT_WIDTH),
                              "blocks lost per run by label"))
    cols = [c for c in HEADLINE_COLUMNS if c in head.columns]
    out.append(table_html(head[cols].rename(columns=lambda c: c.replace("_", " ")),
                          {"lost harm": lambda v: LABEL.harm if v else "",
                           "claims harmed": lambda v: LABEL.harm if v else ""}))
    out += sweep_section(audit, chart)
    out += whatif_section(audit, chart)

    out.append("<h2>Timeline</h2><p class='note'>Pool occupancy stacked as protected by "
               "claims / held by requests / cached-unreferenced / free, usable blocks dashed, "
               "every loss a tick coloured by label; below, one lane per claim and per "
               "request, on one shared x axis: UTC where the run has a wall clock, else seq. "
               "Zoom with the mouse wheel or a drag along x, double-click to reset; hover for "
               "the figures.</p>")
    shown = timeline_runs(audit)
    for run_id in shown:
        out.append(f"<h3>{_e(run_id)}</h3>")
        out.append(chart.html(run_timeline(audit, run_id, width=REPORT_WIDTH, axis="utc"),
                              f"timeline of {run_id}"))
        for rid, cseq in data.harmed_claims(audit, run_id):
            ev = data.harm_evictors(audit, rid, cseq)
            name = _e(data.claim_label(audit, rid, cseq))
            out.append(f"<p><b class='{LABEL.harm}'>{name}</b> was harmed by:</p>")
            out.append(table_html(ev[["request_id", "tenant", "harm_blocks", "first_seq",
                                      "why"]]))
            out.append(chart.html(position_lanes(audit, rid, cseq, width=REPORT_WIDTH,
                                                 axis="utc"),
                                  f"blocks of {data.claim_label(audit, rid, cseq)}"))
    if len(audit.run_ids) > len(shown):
        out.append(f"<p class='note'>{len(audit.run_ids) - len(shown)} more run(s) without "
                   "a timeline here; open them in the dashboard.</p>")

    out.append("<h2>Claims</h2>")
    claims = data.claim_outcomes(audit)
    out.append(table_html(claims, {
        "outcome": lambda v: LABEL.harm if v == CLAIM_OUTCOME.harmed else "",
        "blocks_lost_harm": lambda v: LABEL.harm if v else ""}))
    out.append("<h2>Tenant explanations</h2>")
    for tenant in data.tenants(audit):
        out.append(explanation_html(data.explanation(audit, tenant)))

    out.append("<h2>Findings</h2>")
    found = data.findings(audit)
    out.append(table_html(found) if len(found) else
               "<p>No findings: no hole, disagreement, violation or anomaly.</p>")
    out.append("<h2>Capacity decisions</h2>")
    decisions = data.capacity_decisions(audit)
    out.append("<p>Rebuilt from the block timeline: protected + live (other running requests) "
               "+ required (the request's own need) against usable; the runtime's own figures "
               "beside them.</p>")
    out.append(table_html(decisions) if len(decisions) else
               "<p>No deferral, refusal, preemption or infeasible admission.</p>")
    out.append("<h2>Lowering</h2>")
    low = data.lowering(audit)
    out.append(table_html(low[[c for c in ("run_id", "mode", "verdict", "declared", "evidence")
                               if c in low.columns]]))
    out.append("<h2>Conformance</h2>")
    counts = data.verdict_counts(audit)
    out.append("<p>" + ", ".join(f"{n} {v.replace('_', ' ')}" for v, n in counts.items())
               + ". A check nothing in a run exercised is <i>not exercised</i>, never a pass. "
               "Conformance asks whether the runtime kept the rules of its policy; harm under "
               "a policy that does not enforce claims is reported above, not here.</p>")
    matrix = data.conformance_matrix(audit)
    checks = [c for c in matrix.columns if c != "run_id"]
    out.append(table_html(matrix.rename(columns=lambda c: c.removeprefix("INV_")),
                          {c.removeprefix("INV_"): (lambda v: f"v-{v}") for c in checks}))
    conf = data.conformance(audit)
    bad = conf[conf["verdict"].isin([VERDICT.fail, VERDICT.unknown])]
    if len(bad):
        out.append("<p>Every check that failed or is unknown, with its evidence:</p>")
        out.append(table_html(bad[["run_id", "check", "verdict", "title", "evidence_seqs",
                                   "detail"]], {"verdict": lambda v: f"v-{v}"}))
    out.append(chart.script())
    out.append("</body></html>")
    return "\n".join(out)


def write_report(paths: Sequence[str], out: str,
                 progress: Callable[[str], None] | None = None,
                 whatif: Sequence[str] = ()) -> str:
    """Build the report for ``paths`` (with the computed what-ifs under ``whatif``) and write
    it to ``out``; return ``out``."""
    audit = data.load_audit(list(paths), progress=progress, whatif=list(whatif))
    if progress:
        progress("report")
    text = build_report(audit)
    with atomic_output(out) as tmp:   # NOTE: a failed write never truncates an older report
        tmp.write_text(text, encoding="utf-8")
    return out


def explanation_html(expl: Any) -> str:
    """One tenant's explanation as a report section: its headline, then its sections as
    ``kvclaims.explaining`` renders them, each folded except the tenant's first incident (a
    sweep's many sections do not make the page endless)."""
    return "\n".join([f"<h3>{_e(expl.tenant)}</h3>", f"<p>{_e(expl.headline())}</p>",
                      *expl.html_sections(fold=data.INCIDENT_OUTCOMES)])
