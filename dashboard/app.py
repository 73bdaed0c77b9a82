"""kvclaims audit dashboard (Streamlit).

    streamlit run dashboard/app.py -- [RUN_DIR_OR_SWEEP_DIR ...]

Without paths it audits the shipped traces (every folder under ``traces/`` except the paper
prototype's JSON Lines). Every number on every page comes from a documented view
(``queries/*.sql``) or a reconstructed table (docs/reconstruction.md), through
``dashboard/data.py``; see docs/dashboard.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script by `streamlit run`: make the repo importable
    _ROOT = str(Path(__file__).resolve().parent.parent)
    if _ROOT not in sys.path:
        sys.path.insert(0, _ROOT)

import pandas as pd  # noqa: E402
import streamlit as st  # noqa: E402

from dashboard import charts, data  # noqa: E402
from recorder.schema import InputError  # noqa: E402

TABS = ("Capacity sweep", "Claims", "Pool occupancy", "Loss labels", "Tenant explanations",
        "Findings & conformance")
ALL_RUNS = "all runs"
_VERDICT_COLORS = {"pass": "#d7f0d7", "fail": "#f7c6c6", "unknown": "#e6e6e6",
                   "not_applicable": ""}


@st.cache_resource(show_spinner=False, max_entries=8)
def load(paths: tuple[str, ...]) -> data.Audit:
    """Reconstruct once per set of paths (shared by every session)."""
    return data.load_audit(list(paths))


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


def _height(rows: int, most: int = 22) -> int:
    """A data grid tall enough for ``rows`` rows (at most ``most``, then it scrolls)."""
    return 35 * (min(rows, most) + 1) + 3


def _source(*names: str) -> None:
    st.caption("Source: " + ", ".join(f"`{n}`" for n in names) + " (see docs/dashboard.md)")


def _verdict_style(v: object) -> str:
    color = _VERDICT_COLORS.get(str(v), "")
    return f"background-color: {color}" if color else ""


# -- pages -------------------------------------------------------------------------------------

def page_capacity_sweep(audit: data.Audit) -> None:
    st.subheader("Capacity sweep")
    choice = st.selectbox("Scenario", [*data.sweep_scenarios(audit), ALL_RUNS],
                          key="sweep_scenario")
    scenario = None if choice == ALL_RUNS else choice
    table = data.capacity_sweep(audit, scenario)
    if scenario is not None:
        table = table.drop(columns="scenario")
    st.dataframe(table, hide_index=True, width="stretch", height=_height(len(table)))
    _source("capacity_sweep")
    if scenario is None:
        st.info("Choose one scenario to plot its sweep.")
        return
    series = data.sweep_series(audit, scenario)
    left, right = st.columns(2)
    left.altair_chart(charts.sweep_chart(series, "resident blocks lost"),
                      width="stretch")
    right.altair_chart(charts.sweep_chart(series, "shortfall"), width="stretch")
    st.caption("Resident blocks lost: cached blocks the active request's allocation evicted "
               "(`capacity_sweep.resident_blocks_lost`). Shortfall: blocks the active request "
               "was short of at its refusal (`capacity_sweep.shortfall_blocks`, 0 if not "
               "refused). Policies with equal values draw over each other; hover a point for "
               "its run.")


def page_claims(audit: data.Audit) -> None:
    st.subheader("Claim outcomes")
    outcomes = data.claim_outcomes(audit)
    st.dataframe(outcomes, hide_index=True, width="stretch", height=_height(len(outcomes), 12))
    _source("claim_outcomes", "events (claim_bound → bound_blocks)")
    keys = data.claim_keys(audit)
    if not keys:
        st.info("No claims in these runs.")
        return
    st.subheader("Claim timeline")
    key = st.selectbox("Claim", keys, format_func=lambda k: f"{k[1]}  ·  {k[0]}", key="claim")
    run_id, claim_id = key
    lifecycle = data.claim_lifecycle(audit, run_id, claim_id)
    losses = data.claim_losses(audit, run_id, claim_id)
    row = outcomes[(outcomes["run_id"] == run_id) & (outcomes["claim_id"] == claim_id)].iloc[0]
    bound = row["bound_blocks"]
    cols = st.columns(6)
    cols[0].metric("outcome", str(row["outcome"]))
    cols[1].metric("bound blocks", "-" if pd.isna(bound) else int(bound))
    for col, label in zip(cols[2:], ("harm", "expiry", "relaxation", "eviction")):
        col.metric(f"lost: {label}", int(row[f"blocks_lost_{label}"]))
    st.altair_chart(charts.claim_timeline_chart(lifecycle, losses), width="stretch")
    st.caption("Dashed rules: the claim's lifecycle events (`events`). Points: its block losses "
               "at their position in the claim, coloured by label (`loss_claims`).")
    left, right = st.columns(2)
    left.markdown("**Lifecycle events**")
    left.dataframe(lifecycle[["seq", "event", "request_id", "protection_mode", "reason",
                              "block_hash"]], hide_index=True, width="stretch")
    right.markdown(f"**Block losses** ({len(losses)})")
    right.dataframe(losses[["seq", "position", "label", "block_id", "by_request_id",
                            "decided_by_seq", "breaks_predicate"]],
                    hide_index=True, width="stretch")


def page_pool_occupancy(audit: data.Audit) -> None:
    st.subheader("Pool occupancy")
    run_id = st.selectbox("Run", audit.run_ids, key="pool_run")
    occ = data.pool_occupancy(audit, run_id)
    usable = data.usable_blocks(audit, run_id)
    cols = st.columns(3)
    cols[0].metric("usable blocks", "-" if usable is None else usable)
    cols[1].metric("peak cached blocks", int(occ["cached_blocks"].max()) if len(occ) else 0)
    cols[2].metric("losses", int(occ["change"].str.startswith("loss:").sum()))
    if occ.empty:
        st.info("No cached blocks in this run.")
    else:
        st.altair_chart(charts.occupancy_chart(occ, usable), width="stretch")
    _source("pool_occupancy")
    with st.expander("Changes"):
        st.dataframe(occ, hide_index=True, width="stretch")


def page_loss_labels(audit: data.Audit) -> None:
    st.subheader("Loss labels")
    labels = data.loss_labels(audit)
    if labels.empty:
        st.info("No block losses in these runs.")
        return
    st.altair_chart(charts.loss_label_chart(labels), width="stretch")
    st.dataframe(labels, hide_index=True, width="stretch")
    _source("loss_labels")


def page_tenants(audit: data.Audit) -> None:
    st.subheader("Tenant explanations")
    names = data.tenants(audit)
    if not names:
        st.info("No tenant declared a claim in these runs.")
        return
    tenant = st.selectbox("Tenant", names, key="tenant")
    rows = data.tenant_explanations(audit, tenant)
    if rows.empty:
        st.success(f"Nothing to explain to {tenant}: none of its claims lost blocks after "
                   "harm, a demotion, a release or an expiry.")
    for r in rows.itertuples(index=False):
        st.markdown(f"**{r.claim_id}** — {r.outcome} — run `{r.run_id}`")
        (st.warning if r.outcome == "harmed" else st.info)(r.explanation)
        st.caption(f"evidence seqs: {r.evidence_seqs}")
    _source("tenant_explanations")
    st.markdown(f"**Every claim of {tenant}**")
    st.dataframe(data.tenant_claims(audit, tenant), hide_index=True, width="stretch")
    _source("claim_outcomes")


def page_findings(audit: data.Audit) -> None:
    st.subheader("Findings")
    found = data.findings(audit)
    if found.empty:
        st.success("No findings: no hole, disagreement, violation or anomaly in these runs.")
    else:
        st.dataframe(found, hide_index=True, width="stretch")
    _source("findings")
    st.subheader("Conformance (L1–L7 and invariants)")
    for col, (verdict, n) in zip(st.columns(4), data.verdict_counts(audit).items()):
        col.metric(verdict, n)
    matrix = data.conformance_matrix(audit)
    checks = [c for c in matrix.columns if c != "run_id"]
    st.dataframe(matrix.style.map(_verdict_style, subset=checks), hide_index=True,
                 width="stretch", height=_height(len(matrix), 30))
    run_id = st.selectbox("Run", audit.run_ids, key="conformance_run")
    st.table(data.conformance(audit, run_id)[["check", "verdict", "evidence_seqs", "detail"]]
             .set_index("check"))
    _source("conformance")


PAGES = (page_capacity_sweep, page_claims, page_pool_occupancy, page_loss_labels, page_tenants,
         page_findings)


# -- main --------------------------------------------------------------------------------------

def main(argv: list[str]) -> None:
    st.set_page_config(page_title="kvclaims audit", layout="wide")
    st.title("kvclaims audit")
    try:
        initial = _initial_paths(argv)
    except InputError as exc:
        initial = []
        st.error(str(exc))
    text = st.sidebar.text_area("Run or sweep directories, one per line",
                                value="\n".join(initial), height=180, key="paths")
    good, errors = data.check_paths(data.parse_paths(text))
    for msg in errors:
        st.error(msg)
    if not good:
        st.error("No run directory to audit: name a run directory (holding manifest.json) or "
                 "a sweep directory that contains run directories.")
        st.stop()
    try:
        with st.spinner(f"Reconstructing {len(good)} path(s)…"):
            audit = load(tuple(str(Path(p).resolve()) for p in good))
    except InputError as exc:
        st.error(f"Cannot read the trace: {exc}")
        st.stop()
    st.caption(f"{len(audit.run_ids)} run(s) from {len(good)} path(s), reconstructed offline "
               "with DuckDB.")
    for note in audit.truncations:
        st.warning(note)
    for tab, page in zip(st.tabs(list(TABS)), PAGES):
        with tab:
            page(audit)


main(sys.argv[1:])
