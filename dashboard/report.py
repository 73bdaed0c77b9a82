"""A shareable incident report: one self-contained HTML page for a set of run directories.

``kvclaims report RUN_DIR... --out report.html`` (or ``build_report(paths)``) writes the
headline, the block-level timeline of the runs that matter, the claims table, the findings and
the conformance verdicts (``not_exercised`` kept apart from ``pass``). Charts are the
dashboard's own (``kvclaims.dashboard.charts``), rendered offline to PNG and embedded as images, so the
page fetches nothing when opened and runs no script; every trace string is HTML-escaped.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Any

import pandas as pd

from kvclaims.dashboard import charts, data

#: Timelines drawn at most (runs with harm, refusals or failing checks first).
MAX_TIMELINES = 6
#: Request lanes drawn at most per timeline (the ones that matter first).
MAX_REQUEST_LANES = 30

_CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px auto; max-width: 1240px;
       color: #111; }
h1 { font-size: 24px; margin-bottom: 4px; } h2 { margin-top: 32px; border-bottom: 1px solid #ccc; }
.summary { font-size: 17px; padding: 10px 14px; background: #f4f4f4;
           border-left: 6px solid #D55E00; }
.ok { border-left-color: #0072B2; }
table { border-collapse: collapse; margin: 8px 0 16px; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 3px 7px; text-align: left; vertical-align: top; }
th { background: #eee; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.harm { color: #D55E00; font-weight: 600; }
.v-fail { background: #D55E00; color: #fff; } .v-unknown { background: #000; color: #fff; }
.v-pass { background: #cfe6f5; } .v-not_exercised { background: #fff; color: #777; }
img.chart { max-width: 100%; } .note { color: #555; font-size: 12px; }
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
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def chart_html(chart: Any, alt_text: str) -> str:
    """A chart as an embedded PNG image (a ``data:`` URI: it loads nothing). NOTE: PNG, not
    SVG: an SVG's text is re-laid out with the viewer's fonts and long labels get clipped."""
    png = base64.b64encode(charts.to_png(chart)).decode("ascii")
    return (f'<img class="chart" alt="{html.escape(alt_text)}" '
            f'src="data:image/png;base64,{png}">')


def timeline_runs(audit: data.Audit) -> list[str]:
    """The runs whose timeline the report draws: harm, refusals, failing or unknown checks
    first (most harm first), then the rest, at most ``MAX_TIMELINES``."""
    h = data.headline(audit)
    h = h.assign(_k=-(h["lost_harm"] * 1000 + h["refused"] * 10 + h["checks_failed"]
                      + h["checks_unknown"]))
    return h.sort_values("_k", kind="stable")["run_id"].head(MAX_TIMELINES).tolist()


def important_requests(audit: data.Audit, run_id: str, limit: int = MAX_REQUEST_LANES
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
    score = {lane: (lane in evictors) * 8 + ("refused" in s) * 4 + ("preempted" in s) * 2
             + ("deferred" in s) for lane, s in states.items()}
    order = list(dict.fromkeys(lanes["lane"]))
    keep = sorted(order, key=lambda x: -score[x])[:limit]
    keep_set = set(keep)
    return lanes[lanes["lane"].isin(keep_set)]


def important_claims(audit: data.Audit, run_id: str, highlight: str | None = None,
                     limit: int = MAX_REQUEST_LANES) -> pd.DataFrame:
    """A run's claim lanes, the ones that lost blocks first (harm first, then any label), the
    highlighted one always, at most ``limit`` claims."""
    lanes = data.claim_lanes(audit, run_id)
    marks = data.claim_loss_marks(audit, run_id)
    severity = {k: len(data.LABELS) - i for i, k in enumerate(data.LABELS)}
    worst = marks.assign(s=marks["label"].map(severity)).groupby("lane")["s"].max().to_dict()
    lost = marks.groupby("lane")["blocks"].sum().to_dict()
    order = list(dict.fromkeys(lanes["lane"]))
    ranked = sorted(order, key=lambda c: (c != highlight, -worst.get(c, 0), -lost.get(c, 0)))
    keep = set(ranked[:limit])
    return lanes[lanes["lane"].isin(keep)]


def run_timeline(audit: data.Audit, run_id: str, highlight: str | None = None,
                 width: int | str = charts.WIDTH) -> Any:
    """The timeline chart of one run (shared by the app's Timeline page and the report):
    every change of the pool, the claims and requests that matter most (at most
    ``MAX_REQUEST_LANES`` lanes each)."""
    claims = important_claims(audit, run_id, highlight)
    marks = data.claim_loss_marks(audit, run_id)
    return charts.timeline_chart(
        data.occupancy_long(audit, run_id), data.usable_blocks(audit, run_id),
        data.run_losses(audit, run_id), claims, marks[marks["lane"].isin(set(claims["lane"]))],
        important_requests(audit, run_id), highlight=highlight, width=width)


def build_report(source: data.Source, title: str = "kvclaims incident report") -> str:
    """The whole report as one HTML string (see the module docstring)."""
    audit = source if isinstance(source, data.Audit) else data.load_audit(source)
    head = data.headline(audit)
    harmful = int(head["lost_harm"].sum()) > 0
    made = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    out = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
           f"</title><style>{_CSS}</style></head><body>",
           f"<h1>{html.escape(title)}</h1>",
           f"<p class='note'>Made {made} from {len(audit.run_ids)} run(s): "
           f"{_e(', '.join(audit.paths))}</p>",
           f"<p class='summary{'' if harmful else ' ok'}'>{_e(data.summary_text(audit))}</p>",
           "<h2>Headline per run</h2><ul>"]
    for r in head.to_dict("records"):
        cls = " class='harm'" if r["lost_harm"] else ""
        out.append(f"<li><b>{_e(r['run_id'])}</b> ({_e(r['policy'])}, {_e(r['usable_blocks'])} "
                   f"usable blocks): <span{cls}>{_e(data.headline_text(r))}</span></li>")
    out.append("</ul>")
    if len(head):
        out.append(chart_html(charts.headline_chart(head), "blocks lost per run by label"))
    cols = ["run_id", "policy", "usable_blocks", "claims_harmed", "lost_harm", "refused",
            "lost_unknown", "lost_expiry", "lost_relaxation", "lost_eviction", "deferred",
            "preempted", "findings", "checks_failed", "checks_unknown"]
    out.append(table_html(head[cols].rename(columns=lambda c: c.replace("_", " ")),
                          {"lost harm": lambda v: "harm" if v else "",
                           "claims harmed": lambda v: "harm" if v else ""}))

    out.append("<h2>Timeline</h2><p class='note'>Pool occupancy stacked as protected by "
               "claims / held by requests / cached-unreferenced / free, usable blocks dashed, "
               "every loss a tick coloured by label; below, one lane per claim and per "
               "request, on the same seq axis.</p>")
    shown = timeline_runs(audit)
    for run_id in shown:
        out.append(f"<h3>{_e(run_id)}</h3>")
        out.append(chart_html(run_timeline(audit, run_id), f"timeline of {run_id}"))
        for rid, cseq in data.harmed_claims(audit, run_id):
            ev = data.harm_evictors(audit, rid, cseq)
            out.append(f"<p><b class='harm'>{_e(data.claim_label(audit, rid, cseq))}</b> was "
                       "harmed by:</p>")
            out.append(table_html(ev[["request_id", "tenant", "harm_blocks", "first_seq",
                                      "why"]]))
    if len(audit.run_ids) > len(shown):
        out.append(f"<p class='note'>{len(audit.run_ids) - len(shown)} more run(s) without "
                   "a timeline here; open them in the dashboard.</p>")

    out.append("<h2>Claims</h2>")
    claims = data.claim_outcomes(audit)
    out.append(table_html(claims, {"outcome": lambda v: "harm" if v == "harmed" else "",
                                   "blocks_lost_harm": lambda v: "harm" if v else ""}))
    out.append("<h2>Tenant explanations</h2>")
    for tenant in data.tenants(audit):
        out.append(explanation_html(data.explanation(audit, tenant)))

    out.append("<h2>Findings</h2>")
    found = data.findings(audit)
    out.append(table_html(found) if len(found) else
               "<p>No findings: no hole, disagreement, violation or anomaly.</p>")
    out.append("<h2>Conformance</h2>")
    counts = data.verdict_counts(audit)
    out.append("<p>" + ", ".join(f"{n} {v.replace('_', ' ')}" for v, n in counts.items())
               + ". A check nothing in a run exercised is <i>not exercised</i>, never a pass. "
               "Conformance asks whether the runtime kept the rules of its policy; harm under "
               "a policy that does not enforce claims is reported above, not here.</p>")
    conf = data.conformance(audit)
    out.append(table_html(conf[["run_id", "check", "title", "verdict", "evidence_seqs",
                                "detail"]], {"verdict": lambda v: f"v-{v}"}))
    out.append("</body></html>")
    return "\n".join(out)


def write_report(paths: Sequence[str], out: str,
                 progress: Callable[[str], None] | None = None) -> str:
    """Build the report for ``paths`` and write it to ``out``; return ``out``."""
    audit = data.load_audit(list(paths), progress=progress)
    if progress:
        progress("report")
    text = build_report(audit)
    from kvclaims.io_commands import atomic_output

    with atomic_output(out) as tmp:   # NOTE: a failed write never truncates an older report
        tmp.write_text(text, encoding="utf-8")
    return out


def explanation_html(expl: Any) -> str:
    """One tenant's explanation (``kvclaims.explaining.explain``) as a report section: its
    headline, then per claim or request the promise, the timeline, why and what would have
    prevented it. Every value escaped."""
    out = [f"<h3>{_e(expl.tenant)}</h3>", f"<p>{_e(data.explanation_headline(expl))}</p>"]
    for s in expl.sections:
        cls = "harm" if s.outcome in data.INCIDENT_OUTCOMES else ""
        out.append(f"<h4 class='{cls}'>{_e(s.title)}</h4><ul>")
        out += [f"<li>{_e(line)}</li>" for line in data.explanation_lines(s)]
        out += [f"<li>{_e(w)}</li>" for w in s.why]
        out += [f"<li>Would have prevented it: {_e(p)}</li>" for p in s.prevention]
        out.append("</ul><table><tr><th>time (UTC)</th><th>seq</th><th>what</th></tr>")
        out += [f"<tr><td>{_e(m.utc or '-')}</td><td>{m.seq}</td><td>{_e(m.text)}</td></tr>"
                for m in s.timeline]
        out.append("</table>")
    return "\n".join(out)
