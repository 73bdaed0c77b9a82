"""kvclaims audit dashboard (Streamlit).

    kvclaims dashboard [RUN_DIR_OR_SWEEP_DIR ...] [--port 8501] [--host 127.0.0.1]
    streamlit run dashboard/app.py -- [RUN_DIR_OR_SWEEP_DIR ...]

Without paths it audits the shipped traces (every folder under ``traces/`` except the paper
prototype's JSON Lines). It browses only under the directories it was started with. Every
number comes from a documented view or a reconstructed table through ``dashboard/data.py``;
see docs/dashboard.md.

NOTE: trace strings (tenants, claim and request ids, run ids) never reach markdown or HTML
unescaped: they are shown in tables, charts, plain-text widgets, or through ``_md`` (which
escapes every markdown character), so a crafted trace cannot make the browser fetch anything.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import streamlit as st

from kvclaims.contract.vocabulary import LABEL, REQUEST_OUTCOME, VERDICT
from kvclaims.dashboard import charts, data, report
from kvclaims.explaining import WHATIF_HEADING, promise_lines
from kvclaims.contract.schema import InputError

#: Pages: (title, URL slug). The slug is ``?page=`` in the address bar.
PAGES = (("Overview", "overview"), ("Timeline", "timeline"), ("Claims", "claims"),
         ("Capacity sweep", "sweep"), ("What-if", "whatif"), ("Tenants", "tenants"),
         ("Findings & conformance", "conformance"))
ALL_RUNS = "all runs"
TIMELINE_WIDTH = 640
#: The timeline's x axes (``charts.AXES``) as the page names them.
AXIS_TITLES = {"utc": "time (UTC)", "seq": "seq"}
#: A run id column wide enough that long run names stay told apart.
_RUN_COLUMN = st.column_config.TextColumn("run", width="large", pinned=True)
_VERDICT_COLORS = {VERDICT.fail: "background-color: #D55E00; color: white",
                   LABEL.unknown: "background-color: black; color: white",
                   VERDICT.pass_: "background-color: #cfe6f5",
                   VERDICT.not_exercised: "color: #888888"}
_md = data.md_text


#: How the command line hands the app a computed what-if (``kvclaims dashboard --whatif DIR``).
WHATIF_ARG = "--whatif="


@st.cache_resource(show_spinner=False, max_entries=8)
def load(paths: tuple[str, ...], whatif: tuple[str, ...] = (), _progress=None) -> data.Pages:
    """Reconstruct once per set of paths (shared by every session)."""
    return data.load_audit(list(paths), progress=_progress, whatif=list(whatif))


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """The app's arguments: (run or sweep paths, computed what-if folders)."""
    whatif = [a[len(WHATIF_ARG):] for a in argv if a.startswith(WHATIF_ARG)]
    return [a for a in argv if not a.startswith(WHATIF_ARG)], whatif


def _initial_paths(argv: list[str]) -> list[str]:
    """The command line's paths, else the shipped traces (relative to the cwd when inside)."""
    if argv:
        return argv
    out = []
    for p in data.default_paths():
        try:
            out.append(str(p.relative_to(Path.cwd())))
        except ValueError:
            out.append(str(p))
    return out


def allowed_roots(argv: list[str]) -> list[Path]:
    """The directories this dashboard may browse: those it was started with (a run
    directory's own folder counts), else the shipped traces."""
    if not argv:
        return [data.TRACES_DIR.resolve()]
    return [Path(p).resolve() for p in argv]


def confine(paths: list[str], roots: list[Path]) -> tuple[list[str], list[str]]:
    """Split typed paths into those inside ``roots`` and one error line for each other one.
    Nothing outside the roots is opened or walked."""
    good: list[str] = []
    errors: list[str] = []
    for p in paths:
        resolved = Path(p).resolve()
        if any(resolved == r or r in resolved.parents for r in roots):
            good.append(p)
        else:
            errors.append(f"{p}: outside the directories this dashboard was started with "
                          f"({', '.join(map(str, roots))}); restart it with that path to "
                          "audit it")
    return good, errors


def _height(rows: int, most: int = 22) -> int:
    """A data grid tall enough for ``rows`` rows (at most ``most``, then it scrolls)."""
    return 35 * (min(rows, most) + 1) + 3


def _source(*names: str) -> None:
    st.caption("Source: " + ", ".join(f"`{n}`" for n in names) + " (see docs/dashboard.md)")


def _verdict_style(v: object) -> str:
    return _VERDICT_COLORS.get(str(v), "")


def _go(page: str, **state: object) -> None:
    """Button callback: switch page (and set widgets' state) before the next run."""
    st.session_state["page"] = page
    for k, v in state.items():
        st.session_state[k] = v


# -- pages -------------------------------------------------------------------------------------

def page_overview(audit: data.Pages) -> None:
    st.subheader("What happened")
    head = data.headline(audit)
    harmed = int(head["lost_harm"].sum())
    (st.error if harmed else st.success)(_md(data.summary_text(audit)))
    worst = head.sort_values(["lost_harm", REQUEST_OUTCOME.refused], ascending=False, kind="stable")
    for r in worst.head(8).to_dict("records"):
        line = f"**{_md(r['run_id'])}** — {_md(data.headline_text(r))}"
        if r["lost_harm"]:
            st.markdown(f":red[●] {line}")
        else:
            st.markdown(f"○ {line}")
    if len(head) > 8:
        st.caption(f"{len(head) - 8} more run(s) in the table below.")
    if int(head[[f"lost_{k}" for k in data.LABELS]].to_numpy().sum()):
        st.altair_chart(charts.headline_chart(head, width="container"), width="stretch")
    cols = ["run_id", "policy", "usable_blocks", "claims_harmed", "lost_harm",
            REQUEST_OUTCOME.refused, "lost_unknown", "lost_expiry", "lost_relaxation",
            "lost_eviction", "deferred", REQUEST_OUTCOME.preempted, "claims", "requests",
            "findings", "checks_failed", "checks_unknown"]
    st.dataframe(head[cols], hide_index=True, width="stretch", height=_height(len(head), 14),
                 column_config={"run_id": _RUN_COLUMN, "lost_harm": "blocks lost: harm",
                                "claims_harmed": "claims harmed",
                                REQUEST_OUTCOME.refused: "requests refused"})
    _source("claims", "losses", "requests", "findings", "conformance")


def page_timeline(audit: data.Pages) -> None:
    st.subheader("Timeline")
    head = data.headline(audit)
    order = head.sort_values(["lost_harm", REQUEST_OUTCOME.refused], ascending=False, kind="stable")
    run_id = st.selectbox("Run", order["run_id"].tolist(), key="timeline_run")
    harmed = data.harmed_claims(audit, run_id)
    claim_seq = claim = None
    if harmed:
        claim_seq = st.selectbox("Harmed claim", [q for _, q in harmed], key="timeline_claim",
                                 format_func=lambda q: data.claim_label(audit, run_id, q))
        claim = data.claim_label(audit, run_id, claim_seq)
    occ = data.occupancy(audit, run_id)
    cols = st.columns(4)
    cols[0].metric("usable blocks", data.usable_blocks(audit, run_id) or "-")
    cols[1].metric("peak protected", int(occ["protected"].max()) if len(occ) else 0)
    cols[2].metric("peak held", int(occ["held"].max()) if len(occ) else 0)
    cols[3].metric("losses", int(data.run_losses(audit, run_id)["blocks"].sum()))
    axis = "seq"
    if data.has_clock(audit, run_id):
        axis = st.radio("x axis", list(AXIS_TITLES), format_func=AXIS_TITLES.get,
                        horizontal=True, key="timeline_axis")
    # NOTE: a fixed plot width: the lanes' labels and the legends must fit beside it in the
    # main column at 1400 px (vega's "container" width does not apply inside a vconcat).
    st.altair_chart(report.run_timeline(audit, run_id, highlight=claim, width=TIMELINE_WIDTH,
                                        axis=axis), width="content")
    clock = ("zoom with the wheel or a drag along x, double-click to reset" if
             data.has_clock(audit, run_id)
             else "this run's manifest has no wall clock: seq only")
    st.caption("Pool: protected by claims (in force, pinning mode, enforcing policy) / held by "
               "requests / cached, unreferenced (evictable) / free; dashed: usable blocks; "
               "ticks above: every loss by label. Lanes: claim states and losses, request "
               f"states and end marks; {clock}.")
    if claim_seq is not None:
        st.markdown(f"**Who evicted {_md(claim)}'s blocks as harm, and why they were "
                    "admitted**")
        ev = data.harm_evictors(audit, run_id, claim_seq)
        for r in ev.itertuples(index=False):
            who = "no tenant" if pd.isna(r.tenant) else r.tenant
            st.markdown(f"- **{_md(r.request_id)}** ({_md(who)}) evicted {r.harm_blocks} of "
                        f"its blocks from seq {r.first_seq}: {_md(r.why)}")
        st.dataframe(ev.drop(columns="why"), hide_index=True, width="stretch")
        tenant = audit.tables["claims"].query(
            "run_id == @run_id and claim_seq == @claim_seq")["tenant"]
        if len(tenant) and not pd.isna(tenant.iloc[0]):
            st.button("Open this tenant's explanation", key="to_tenant", on_click=_go,
                      args=("Tenants",), kwargs={"tenant": tenant.iloc[0]})
        _source("loss_claims", "feasibility", "requests")
    with st.expander("Occupancy after every change"):
        st.dataframe(occ, hide_index=True, width="stretch")


def page_claims(audit: data.Pages) -> None:
    st.subheader("Claim outcomes")
    outcomes = data.claim_outcomes(audit)
    st.dataframe(outcomes, hide_index=True, width="stretch", height=_height(len(outcomes), 12),
                 column_config={"run_id": _RUN_COLUMN})
    _source("claim_outcomes", "events (claim_bound → bound_blocks)")
    keys = data.claim_keys(audit)
    if not keys:
        st.info("No claims in these runs.")
        return
    st.subheader("Claim timeline")
    key = st.selectbox("Claim", keys, key="claim", format_func=lambda k: (
        f"{data.claim_label(audit, k[0], k[1])}  ·  {k[0]}"))
    run_id, claim_seq = key
    lifecycle = data.claim_lifecycle(audit, run_id, claim_seq)
    losses = data.claim_losses(audit, run_id, claim_seq)
    row = outcomes[(outcomes["run_id"] == run_id) & (outcomes["claim_seq"] == claim_seq)].iloc[0]
    bound = row["bound_blocks"]
    cols = st.columns(6)
    cols[0].metric("outcome", str(row["outcome"]))
    cols[1].metric("bound blocks", "-" if pd.isna(bound) else int(bound))
    for col, label in zip(cols[2:], (LABEL.harm, LABEL.expiry, LABEL.relaxation, LABEL.eviction)):
        col.metric(f"lost: {label}", int(row[f"blocks_lost_{label}"]))
    st.altair_chart(charts.claim_timeline_chart(lifecycle, losses), width="stretch")
    st.caption("Dashed rules: the claim's lifecycle events (`events`), named in the legend. "
               "Points: its block losses at their position in the claim, coloured by label "
               "(`loss_claims`).")
    st.markdown("**Its blocks, one lane per position**")
    st.altair_chart(report.position_lanes(
        audit, run_id, claim_seq, width=TIMELINE_WIDTH,
        axis="utc" if data.has_clock(audit, run_id) else "seq"), width="content")
    st.caption("Each position of the claim: resident from its binding to its loss (a tick "
               "coloured by label) or the end of the run (`claim_timeline`).")
    left, right = st.columns(2)
    left.markdown("**Lifecycle events**")
    left.dataframe(lifecycle[["seq", "event", "request_id", "protection_mode", "reason",
                              "block_hash"]], hide_index=True, width="stretch")
    right.markdown(f"**Block losses** ({len(losses)})")
    right.dataframe(losses[["seq", "position", "label", "block_id", "by_request_id",
                            "decided_by_seq", "breaks_predicate"]],
                    hide_index=True, width="stretch")


def page_sweep(audit: data.Pages) -> None:
    st.subheader("Capacity sweep")
    choice = st.selectbox("Scenario", [*data.sweep_scenarios(audit), ALL_RUNS],
                          key="sweep_scenario")
    scenario = None if choice == ALL_RUNS else choice
    table = data.capacity_sweep(audit, scenario)
    if scenario is not None:
        table = table.drop(columns="scenario")
    table = table.drop(columns=["active_request_id"], errors="ignore")
    harmed = table[table[LABEL.harm] > 0]
    refused = table[table["active_outcome"] == REQUEST_OUTCOME.refused]
    st.markdown(f"**{len(table)} points**: the active request's allocation evicted resident "
                f"blocks as harm at {len(harmed)} of them; it was refused at {len(refused)}.")
    st.dataframe(table, hide_index=True, width="stretch", height=_height(len(table)),
                 column_config={**{k: v for k, v in data.SWEEP_TITLES.items() if k in table},
                                "run_id": _RUN_COLUMN})
    st.caption("*resident blocks lost* and *of those: …* count only the cached blocks the "
               "active request (largest demand) evicted; *all blocks lost* counts every loss "
               "in the run, by any request.")
    _source("capacity_sweep")
    if scenario is None:
        st.info("Choose one scenario to plot its sweep.")
        return
    series = data.sweep_series(audit, scenario)
    left, right = st.columns(2)
    left.altair_chart(charts.sweep_chart(series, "resident blocks lost"), width="stretch")
    right.altair_chart(charts.sweep_chart(series, "shortfall"), width="stretch")


def page_whatif(audit: data.Pages) -> None:
    st.subheader("What-if")
    runs = data.whatif_runs(audit)
    orphans = data.whatif_orphans(audit)
    if not runs:
        st.info(_md(data.NO_WHATIF) + " Open its --out folder here (beside the recorded run), "
                "or start the dashboard with --whatif DIR.")
    else:
        run_id = st.selectbox("Recorded run", runs, key="whatif_run")
        comparison = data.whatif_comparison(audit, run_id)
        st.markdown(f"**{_md(run_id)}** {_md(data.whatif_caption(comparison))}")
        st.dataframe(data.whatif_table(comparison), hide_index=True, width="stretch",
                     height=_height(len(comparison)),
                     column_config={"point": st.column_config.TextColumn(pinned=True)})
        _source("kvclaims.replays.compare (claim_outcomes, requests, losses)")
        if data.whatif_chartable(comparison):
            series = data.whatif_series(comparison)
            for col, (metric, _c, unit) in zip(st.columns(2), data.WHATIF_METRICS):
                col.altair_chart(charts.sweep_chart(series, metric, unit), width="stretch")
    if orphans:
        st.caption(f"{len(orphans)} replay(s) of runs not audited here: add the recorded run "
                   "to set them beside it.")


def page_tenants(audit: data.Pages) -> None:
    st.subheader("Tenant explanations")
    names = data.tenants(audit)
    if not names:
        st.info("No tenant declared a claim or sent a request in these runs.")
        return
    if st.session_state.get("tenant") not in names:
        st.session_state["tenant"] = names[0]  # the tenant with the most harm
    tenant = st.selectbox("Tenant (most harm first)", names, key="tenant")
    expl = data.explanation(audit, tenant)
    # NOTE: the explanation is rendered from its sections through ``_md`` (every markdown
    # character escaped) and tables, never as its own markdown: its text quotes trace strings.
    st.markdown(_md(expl.headline()))
    st.caption(_md(expl.clock))
    st.download_button("Download this explanation (HTML, for a ticket)", expl.to_html(),
                       file_name="explanation.html", mime="text/html", key="explain_html")
    if not expl.sections:
        st.success(f"Nothing to explain to {_md(tenant)}: no claim and no refused, deferred "
                   "or preempted request.")
    # incidents (harmed claims, refused or preempted requests) open, first; the rest folded
    incidents = [s for s in expl.sections if s.outcome in data.INCIDENT_OUTCOMES]
    others = [s for s in expl.sections if s.outcome not in data.INCIDENT_OUTCOMES]
    for s in incidents:
        st.markdown(f"**{_md(s.title)}**")
        _explanation_section(s, st.warning)
    for s in others:
        with st.expander(_md(s.title)):
            _explanation_section(s, st.info)
    _source("kvclaims.explaining.explain (claims, requests, loss_claims, feasibility, "
            "lowering)")
    st.markdown(f"**Every claim of {_md(tenant)}**")
    st.dataframe(data.tenant_claims(audit, tenant), hide_index=True, width="stretch")
    _source("claims")


def _explanation_section(s, box) -> None:
    """One section of a tenant's explanation, every trace string escaped or in a table."""
    box(_md(" · ".join(promise_lines(s))))
    for w in s.why:
        st.markdown(f"- {_md(w)}")
    for p in s.prevention:
        st.caption(f"Would have prevented it: {_md(p)}")
    if s.whatif:  # only what a computed replay showed (kvclaims.replays)
        st.markdown(f"**{_md(WHATIF_HEADING)}**")
        for w in s.whatif:
            st.markdown(f"- {_md(w)}")
    timeline = pd.DataFrame([{"time (UTC)": m.utc, "seq": m.seq, "what": m.text}
                             for m in s.timeline], columns=["time (UTC)", "seq", "what"])
    if timeline["time (UTC)"].isna().all():
        timeline = timeline.drop(columns="time (UTC)")
    # NOTE: a static table: its cells wrap, so "what" is never cut mid-word (a data grid
    # cuts long text at the column's edge); trace strings in it are shown as text
    st.table(timeline.set_index("seq"))


def page_conformance(audit: data.Pages) -> None:
    st.subheader("Findings")
    found = data.findings(audit)
    if found.empty:
        st.success("No findings: no hole, disagreement, violation or anomaly in these runs.")
    else:
        st.dataframe(found, hide_index=True, width="stretch")
    _source("findings")
    st.subheader("Conformance")
    counts = data.verdict_counts(audit)
    for col, (verdict, n) in zip(st.columns(4), counts.items()):
        col.metric(verdict.replace("_", " "), n)
    head = data.headline(audit)
    harm = int(head["lost_harm"].sum())
    st.caption("A check that nothing in a run exercised is *not exercised*, never a pass. "
               "Conformance asks whether the runtime kept its policy's rules"
               + (f"; the {harm} blocks lost as harm in these runs are on the Overview "
                  "(a policy that does not enforce claims can pass every check and still "
                  "harm them)." if harm else "."))
    matrix = data.conformance_matrix(audit)
    checks = [c for c in matrix.columns if c != "run_id"]
    titles = data.check_titles(audit)
    st.dataframe(matrix.style.map(_verdict_style, subset=checks), hide_index=True,
                 width="stretch", height=_height(len(matrix), 30),
                 column_config={"run_id": _RUN_COLUMN,
                                **{c: st.column_config.TextColumn(
                                    c.removeprefix("INV_"), width="small",
                                    help=titles.get(c)) for c in checks}})
    run_id = st.selectbox("Run", audit.run_ids, key="conformance_run")
    table = data.conformance(audit, run_id)[["check", "title", "verdict", "evidence_seqs",
                                             "detail", "needs"]]
    st.dataframe(table.style.map(_verdict_style, subset=["verdict"]), hide_index=True,
                 width="stretch", height=_height(len(table)),
                 column_config={"check": st.column_config.TextColumn(width="small"),
                                "title": st.column_config.TextColumn(width="medium"),
                                "verdict": st.column_config.TextColumn(width="small"),
                                "evidence_seqs": st.column_config.TextColumn(width="small"),
                                "detail": st.column_config.TextColumn(width="large"),
                                "needs": st.column_config.TextColumn(
                                    "exercised by", width="medium")})
    _source("conformance")
    st.subheader("Could the runtime honour each mode here?")
    low = data.lowering(audit, run_id)
    st.dataframe(low.drop(columns="run_id"), hide_index=True, width="stretch",
                 column_config={"evidence": st.column_config.TextColumn(width="large")})
    _source("lowering")


PAGE_FUNCS = {"Overview": page_overview, "Timeline": page_timeline, "Claims": page_claims,
              "Capacity sweep": page_sweep, "What-if": page_whatif, "Tenants": page_tenants,
              "Findings & conformance": page_conformance}


# -- main --------------------------------------------------------------------------------------

def _choose_page() -> str:
    titles = [t for t, _ in PAGES]
    slug_of = dict(PAGES)
    if "page" not in st.session_state:
        wanted = st.query_params.get("page")
        st.session_state["page"] = next((t for t, s in PAGES if s == wanted), titles[0])
    page = st.sidebar.radio("Page", titles, key="page")
    st.query_params["page"] = slug_of[page]
    return page


def main(argv: list[str]) -> None:
    st.set_page_config(page_title="kvclaims audit", layout="wide")
    argv, whatif = split_argv(argv)
    st.title("kvclaims audit")
    page = _choose_page()
    try:
        initial = _initial_paths(argv)
    except InputError as exc:
        initial = []
        st.error(_md(exc))
    roots = allowed_roots(argv)
    text = st.sidebar.text_area("Run or sweep directories, one per line (under the "
                                "directories this dashboard was started with)",
                                value="\n".join(initial), height=160, key="paths")
    inside, errors = confine(data.parse_paths(text), roots)
    good, bad = data.check_paths(inside)
    for msg in errors + bad:
        st.error(_md(msg))
    if not good:
        st.error("No run directory to audit: name a run directory (holding manifest.json) or "
                 "a sweep directory that contains run directories.")
        st.stop()
    key = tuple(str(Path(p).resolve()) for p in good)
    try:
        with st.status(f"Reconstructing {len(good)} path(s)…", expanded=False) as status:
            audit = load(key, tuple(str(Path(p).resolve()) for p in whatif),
                         _progress=lambda stage: status.update(
                label=f"Reconstructing {len(good)} path(s): {stage}…"))
            status.update(label=f"{len(audit.run_ids)} run(s) from {len(good)} path(s), "
                                "reconstructed offline with DuckDB.", state="complete")
    except InputError as exc:
        st.error(f"Cannot read the trace: {_md(exc)}")
        st.stop()
    for note in audit.truncations:
        st.warning(_md(note))
    try:
        PAGE_FUNCS[page](audit)
    except InputError as exc:  # bad input on a page: one line, never a traceback
        st.error(_md(exc))


main(sys.argv[1:])
