"""The dashboard's data: run directories in, the DataFrames each page shows out.

Data flows one way (docs/design.md): run directories -> ``kvclaims.open`` (the streamed
reconstruction, then the documented views) -> the pages. Nothing here
imports the recorder's scheduler or vLLM, and no number is computed here that a view or a
reconstructed table does not already hold: these functions select, filter and reshape.

``load_audit(paths)`` reconstructs once and keeps every view as a pandas DataFrame (an
``Pages``); the page functions take a ``Pages`` or, for one-off use, the run directory paths
themselves (which reconstructs them)::

    from kvclaims.dashboard import data
    audit = data.load_audit(["traces/sweep-resident60_active70", "traces/multi_tenant"])
    data.capacity_sweep(audit)              # the capacity_sweep view, one row per run
    data.explanation(audit, "tenant-d").to_text()   # kvclaims.explaining.explain

Claims are keyed by claim instance ``(run_id, claim_seq)`` (docs/design.md): a reused
``claim_id`` names several instances, each its own row, lane and timeline.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Final, TypeAlias

import pandas as pd

import kvclaims
from kvclaims.contract.vocabulary import (CHECK_VERDICTS, CLAIM_OUTCOME, DECISION, EVENT, LABEL,
                                          LABELS, REQUEST_OUTCOME, VERDICT, fill_sql)
from kvclaims.audit import is_dataset
from kvclaims.contract.schema import InputError
from kvclaims.explaining import explain, tenants_by_harm
from kvclaims.reconstruct.checks import CHECKS as _CHECK_TABLE
from kvclaims.reconstruct.loader import open_runs
from kvclaims.replays import (SUMMARY_COLUMNS, TITLES, Replay, ReplayFacts, cell, compare, gather,
                              replays_of)

PathLike: TypeAlias = "str | Path"

#: The repository's shipped traces (the app's default input).
TRACES_DIR: Final[Path] = Path(__file__).resolve().parent.parent / "traces"
#: Folders under ``traces/`` that are not run directories in our format (JSON Lines).
NOT_RUN_FOLDERS: Final[frozenset[str]] = frozenset({"arbiter-prototype"})

#: The colour each page uses for a loss label (labels ranked as ``vocabulary.LABELS``).
#: NOTE: colour-blind-safe (Okabe-Ito hues); harm is the one alarming colour (vermillion),
#: every other label is a calm blue/grey so that harm stands out under any colour vision.
LABEL_COLORS: Final[dict[str, str]] = {
    LABEL.harm: "#D55E00", LABEL.unknown: "#000000", LABEL.expiry: "#56B4E9",
    LABEL.relaxation: "#0072B2", LABEL.eviction: "#BBBBBB"}
#: The checks in the order the conformance page lists them: the one table of
#: ``kvclaims.reconstruct.checks.CHECKS``.
CHECKS: Final[tuple[str, ...]] = tuple(c.name for c in sorted(_CHECK_TABLE, key=lambda c: c.ord))
#: Claim events shown on a claim's timeline (``claim_bound`` is shown as a count instead).
LIFECYCLE_EVENTS: Final[tuple[str, ...]] = (
    EVENT.claim_submitted, EVENT.claim_accepted, EVENT.claim_rejected, EVENT.claim_materialized,
    EVENT.claim_demoted, EVENT.claim_expired, EVENT.claim_released, EVENT.claim_harmed)

_VIEWS: Final[tuple[str, ...]] = (
    "capacity_sweep", "loss_labels", "pool_occupancy", "request_outcomes")
#: claim_outcomes' columns, one row per claim instance: the documented view's columns plus
#: the instance key and the positions it bound, read from ``claims`` (the view has no
#: ``claim_seq``; NOTE: keep in step with queries/claim_outcomes.sql).
_CLAIM_OUTCOMES_SQL: Final[str] = """
    SELECT run_id, claim_id, claim_seq, tenant, protection_mode, outcome, value_lost,
           first_harm_seq, first_harm_by_request_id, materialized_seq, release_seq,
           blocks_lost_harm, blocks_lost_expiry, blocks_lost_relaxation, blocks_lost_eviction,
           blocks_lost_unknown, positions_bound AS bound_blocks
    FROM claims ORDER BY run_id, claim_seq"""


@dataclass(frozen=True)
class Pages:
    """Everything the pages show, fetched once from one ``kvclaims.Audit`` (``facade``) over a
    set of run directories: the dashboard's frames, not a second audit type.

    Each frame is a documented view (``queries/*.sql``) or a reconstructed table
    (docs/reconstruction.md), fetched whole; ``claim_events`` and ``claim_losses`` are the
    claim-related rows of ``events`` and ``loss_claims``.
    """

    paths: tuple[str, ...]
    runs: pd.DataFrame
    views: dict[str, pd.DataFrame]
    findings: pd.DataFrame
    conformance: pd.DataFrame
    claim_events: pd.DataFrame
    claim_losses: pd.DataFrame
    truncations: tuple[str, ...] = field(default_factory=tuple)
    #: reconstructed tables and derived series: requests, feasibility, claims,
    #: losses_by_label, losses, occupancy (see ``load_audit``)
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    #: the open audit facade (``kvclaims.open``) the explanations are built from
    facade: Any = None
    #: computed what-ifs: replays among the runs and under ``load_audit``'s ``whatif`` paths
    replays: tuple[Replay, ...] = field(default_factory=tuple)
    _explained: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    _compared: dict[str, pd.DataFrame] = field(default_factory=dict, repr=False, compare=False)
    _seq_utc: dict[str, pd.Series] = field(default_factory=dict, repr=False, compare=False)
    _lock: Any = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def run_ids(self) -> list[str]:
        """Every run, in natural run_id order (``-80`` before ``-100``)."""
        return self.runs["run_id"].tolist()

    @cached_property
    def replay_facts(self) -> ReplayFacts:
        """The replays of the audited runs, opened on first use and kept: one audit of them
        for every tenant explained (``explanation``), not one per tenant."""
        audited = set(self.run_ids)
        return ReplayFacts([r for r in self.replays if r.source_run_id in audited])


Source: TypeAlias = "Pages | Sequence[PathLike]"


_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>~$:&])")


def md_text(text: object) -> str:
    """Plain text made safe for (Streamlit) markdown: every markdown and HTML character is
    backslash-escaped, so ``![x](http://evil/x.png)`` or ``<img src=...>`` from a trace is
    shown as those characters and never fetches anything."""
    return _MD_SPECIAL.sub(r"\\\1", str(text))


# -- input ---------------------------------------------------------------------------------------

def default_paths(traces_dir: PathLike = TRACES_DIR) -> list[Path]:
    """The shipped trace folders: every folder under ``traces_dir`` except the paper
    prototype's JSON Lines traces (``arbiter-prototype``), sorted by name."""
    root = Path(traces_dir)
    if not root.is_dir():
        raise InputError(f"{root}: no such directory (expected the shipped traces)")
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name not in NOT_RUN_FOLDERS)


def parse_paths(text: str) -> list[str]:
    """Paths typed one per line (blank lines and surrounding spaces ignored)."""
    return [line.strip() for line in text.splitlines() if line.strip()]


def check_paths(paths: Sequence[PathLike]) -> tuple[list[str], list[str]]:
    """Split paths into those naming readable run directories (a run, or a sweep holding
    runs) or a fleet dataset, and error messages for the others. Only manifests are checked here; a corrupt
    segment is reported by ``load_audit``."""

    good: list[str] = []
    errors: list[str] = []
    for p in paths:
        if is_dataset(p):  # a fleet dataset opens like runs (``kvclaims.open``)
            good.append(str(p))
            continue
        try:
            open_runs([p])
        except InputError as exc:
            errors.append(str(exc))
        else:
            good.append(str(p))
    return good, errors


# -- reconstruction ------------------------------------------------------------------------------

def load_audit(paths: Sequence[PathLike],
               progress: Callable[[str], None] | None = None,
               whatif: Sequence[PathLike] = ()) -> Pages:
    """Load and reconstruct the run directories ``paths`` names (run or sweep directories),
    apply the SQL library and fetch what the pages show. Computed what-ifs are the replays
    among those runs and under ``whatif`` (``kvclaims.replays.gather``; these are not audited
    as runs of their own).

    Raises ``kvclaims.contract.schema.InputError`` (a ``TraceError``, naming the file) when a
    path is not a run directory or a trace cannot be read. ``progress`` is told each stage's name.
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    if not paths:
        raise InputError("no run directories given")
    audit = kvclaims.open(list(paths), progress=progress)
    runs = pd.DataFrame([{
        "run_id": rid, "scenario": m.get("scenario") or _scenario_from_run_id(rid, m),
        "policy": m.get("policy"), "usable_blocks": m.get("usable_blocks"),
        "complete": bool(m.get("complete")), "run_dir": str(audit.run_dirs.get(rid, "")),
        "utc_start_ns": _utc_anchor(m)[0], "mono_start_ns": _utc_anchor(m)[1]}
        for rid, m in sorted(audit.manifests.items(), key=lambda kv: natural_key(kv[0]))],
        columns=["run_id", "scenario", "policy", "usable_blocks", "complete", "run_dir",
                 "utc_start_ns", "mono_start_ns"])
    try:
        if progress:
            progress("dashboard tables")
        last = audit.sql("SELECT run_id, max(seq) AS last_seq FROM events GROUP BY run_id").df()
        runs = runs.merge(last, on="run_id", how="left")
        views = {v: audit.sql(f"SELECT * FROM {v}").df() for v in _VIEWS}
        findings = audit.sql("SELECT * REPLACE (block_hash::VARCHAR AS block_hash) FROM findings "
                           "ORDER BY run_id, seq NULLS LAST, kind").df()
        conformance = audit.sql("SELECT * FROM conformance ORDER BY run_id").df()
        lowering = audit.sql("SELECT * FROM lowering ORDER BY run_id, mode").df()
        views["claim_outcomes"] = audit.sql(_CLAIM_OUTCOMES_SQL).df().astype(
            {"bound_blocks": "Int64"})
        lifecycle = ", ".join(f"'{e}'" for e in LIFECYCLE_EVENTS)
        # NOTE: an event names the latest instance of its claim_id at or before it (the
        # instance rule); ASOF picks the claims row with the greatest claim_seq <= seq.
        claim_events = audit.sql(f"""
            SELECT e.run_id, e.claim_id, c.claim_seq, e.seq, e.ts_ns, e.event, e.request_id,
                   e.tenant, e.protection_mode, e.reason, e.by_request_id,
                   e.block_hash::VARCHAR AS block_hash
            FROM (SELECT * FROM events WHERE claim_id IS NOT NULL
                  AND event IN ({lifecycle})) e
            ASOF LEFT JOIN (SELECT run_id, claim_id, claim_seq FROM claims) c
              ON c.run_id = e.run_id AND c.claim_id = e.claim_id AND e.seq >= c.claim_seq
            ORDER BY e.run_id, c.claim_seq, e.seq""").df()
        claim_losses = audit.sql("""
            SELECT run_id, claim_id, claim_seq, seq, ts_ns, position, label, block_id,
                   block_hash::VARCHAR AS block_hash, by_request_id, decided_by_seq,
                   breaks_predicate, broken_seq
            FROM loss_claims ORDER BY run_id, claim_seq, seq, position""").df()
        tables = {
            "requests": audit.sql(fill_sql("""
                SELECT r.*, a.first_alloc_seq FROM requests r LEFT JOIN (
                    SELECT run_id, request_id, min(seq) AS first_alloc_seq FROM events
                    WHERE event IN ({event.block_allocated}, {event.block_hit}) GROUP BY ALL) a
                USING (run_id, request_id) ORDER BY run_id, arrived_seq""")).df(),
            "feasibility": audit.sql("SELECT * FROM feasibility ORDER BY run_id, seq").df(),
            "claims": audit.sql("SELECT * FROM claims ORDER BY run_id, submitted_seq").df(),
            "losses_by_label": audit.sql("""
                SELECT run_id, label, count(*) AS blocks FROM losses GROUP BY ALL""").df(),
            "losses": audit.sql("""
                SELECT run_id, seq, ts_ns, label, by_request_id, cause FROM losses
                ORDER BY run_id, seq""").df(),
            "occupancy": _occupancy(audit),
            "lowering": lowering,
        }
        replays = tuple(gather(audit, whatif))
    except BaseException:
        audit.close()
        raise
    # NOTE: the facade stays open: tenant explanations are built from it on demand
    # (``explanation``), one tenant at a time, under the audit's lock.
    return Pages(paths=tuple(str(p) for p in paths), runs=runs, views=views, findings=findings,
                 conformance=conformance, claim_events=claim_events, claim_losses=claim_losses,
                 truncations=tuple(audit.truncations), tables=tables, facade=audit,
                 replays=replays)


def natural_key(text: Any) -> tuple[Any, ...]:
    """Sort key that orders embedded numbers numerically (``-80`` before ``-100``)."""
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(text)))


def _utc_anchor(manifest: dict[str, Any]) -> tuple[int | None, int | None]:
    """``(utc_ns, monotonic_ns)`` of the run's start, where the manifest has a wall clock.

    NOTE: the manifest's clock anchor (issue 12 item 1) is being added concurrently; this
    reads ``clock: {utc_ns | utc, monotonic_ns}`` or top-level ``started_utc_ns`` /
    ``started_monotonic_ns``; anything else means "no clock" (UTC is then not shown).
    """
    clock = manifest.get("clock") if isinstance(manifest.get("clock"), dict) else {}
    utc = clock.get("utc_ns", manifest.get("started_utc_ns"))
    if utc is None and isinstance(clock.get("utc"), str):
        try:
            utc = int(pd.Timestamp(clock["utc"]).value)
        except (ValueError, TypeError):
            utc = None
    mono = clock.get("monotonic_ns", manifest.get("started_monotonic_ns"))
    if not isinstance(utc, int) or not isinstance(mono, int):
        return None, None
    return utc, mono


def _occupancy(con: Any) -> pd.DataFrame:
    """Pool occupancy by category after every change: the documented view ``block_states``."""
    return con.sql("SELECT * FROM block_states").df().astype(
        {"usable_blocks": "Int64", "free": "Int64"})


def _scenario_from_run_id(run_id: str, manifest: dict[str, Any]) -> str:
    """``<scenario>-<policy>-<usable>`` (how ``kvclaims record`` names runs), else the run id."""
    suffix = f"-{manifest.get('policy')}-{manifest.get('usable_blocks')}"
    return run_id[: -len(suffix)] if run_id.endswith(suffix) else run_id


def _audit(source: Source) -> Pages:
    return source if isinstance(source, Pages) else load_audit(source)


def _lists_to_text(df: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """List columns as comma-separated text (a table cell, and readable in any browser)."""
    out = df.copy()
    for c in columns:
        out[c] = [", ".join(str(v) for v in x) if x is not None and not _isna(x) else None
                  for x in out[c]]
    return out


def _isna(x: Any) -> bool:
    try:
        return bool(pd.isna(x))
    except (TypeError, ValueError):  # an array: not a missing value
        return False


# -- Headline ------------------------------------------------------------------------------------

def _verdict(v: Any) -> str:
    return str(v)


def headline(source: Source) -> pd.DataFrame:
    """One row per run, the figures an operator asks for first: claims harmed, blocks lost
    by label (every loss in the run), requests refused / deferred / preempted, findings and
    failing checks; runs in natural order (``-80`` before ``-100``)."""
    a = _audit(source)
    runs = a.runs[["run_id", "scenario", "policy", "usable_blocks"]].copy()
    claims = a.tables["claims"]
    req = a.tables["requests"]
    lost = a.tables["losses_by_label"].pivot_table(index="run_id", columns="label",
                                                   values="blocks", aggfunc="sum")
    out = runs.set_index("run_id")
    out["claims"] = claims.groupby("run_id").size()
    harmed = claims[claims["outcome"] == CLAIM_OUTCOME.harmed]
    out["claims_harmed"] = harmed.groupby("run_id").size()
    for label in LABELS:
        out[f"lost_{label}"] = lost[label] if label in lost.columns else 0
    out["requests"] = req.groupby("run_id").size()
    for outcome in (REQUEST_OUTCOME.refused, REQUEST_OUTCOME.preempted):
        out[outcome] = req[req["outcome"] == outcome].groupby("run_id").size()
    out["deferred"] = req[req["deferrals"].fillna(0) > 0].groupby("run_id").size()
    out["findings"] = a.findings.groupby("run_id").size()
    conf = a.conformance.assign(verdict=a.conformance["verdict"].map(_verdict))
    out["checks_failed"] = conf[conf["verdict"] == VERDICT.fail].groupby("run_id").size()
    out["checks_unknown"] = conf[conf["verdict"] == VERDICT.unknown].groupby("run_id").size()
    counts = [c for c in out.columns if c not in ("scenario", "policy", "usable_blocks")]
    out[counts] = out[counts].fillna(0).astype("int64")
    return out.reset_index()


def headline_text(row: Any) -> str:
    """One run's headline as a plain sentence (no markup: it may quote trace strings)."""
    r = row if isinstance(row, dict) else row._asdict() if hasattr(row, "_asdict") else dict(row)
    lost = ", ".join(f"{r[f'lost_{k}']} {k}" for k in LABELS if r[f"lost_{k}"])
    parts = [f"{r['claims_harmed']} of {r['claims']} claims harmed",
             f"blocks lost: {lost or 'none'}",
             f"{r[REQUEST_OUTCOME.refused]} of {r['requests']} requests refused"]
    if r["deferred"]:
        parts.append(f"{r['deferred']} deferred")
    if r[REQUEST_OUTCOME.preempted]:
        parts.append(f"{r[REQUEST_OUTCOME.preempted]} preempted")
    if r["checks_failed"] or r["checks_unknown"]:
        parts.append(f"{r['checks_failed']} checks failed, {r['checks_unknown']} unknown")
    return "; ".join(parts)


def summary_text(source: Source) -> str:
    """The whole audit in one line: runs, claims harmed, harm blocks, refusals, checks."""
    h = headline(source)
    harmed_runs = int((h["claims_harmed"] > 0).sum())
    return (f"{len(h)} runs: {int(h['claims_harmed'].sum())} claims harmed in {harmed_runs} "
            f"runs ({int(h['lost_harm'].sum())} blocks lost as harm, "
            f"{int(h['lost_unknown'].sum())} unknown); {int(h[REQUEST_OUTCOME.refused].sum())} requests "
            f"refused; {int(h['checks_failed'].sum())} checks failed, "
            f"{int(h['checks_unknown'].sum())} unknown.")


# -- Capacity sweep ------------------------------------------------------------------------------

#: The sweep table's columns, decisive first, with titles that say what they count.
SWEEP_TITLES: Final[dict[str, str]] = {
    "policy": "policy", "usable_blocks": "usable blocks", "active_outcome": "active request",
    "resident_blocks_lost": "resident blocks lost", "claim_outcome": "claim outcome",
    LABEL.harm: "of those: harm", "shortfall_blocks": "shortfall at refusal",
    "blocking_claim_ids": "refusal named", CLAIM_OUTCOME.unknown: "of those: unknown",
    LABEL.expiry: "of those: expiry", LABEL.relaxation: "of those: relaxation",
    LABEL.eviction: "of those: eviction", "blocks_lost": "all blocks lost (any request)",
    "run_id": "run", "scenario": "scenario"}


def capacity_sweep(source: Source, scenario: str | None = None) -> pd.DataFrame:
    """The ``capacity_sweep`` view (one row per run), with the run's scenario; only
    ``scenario``'s runs if given; decisive columns first (``SWEEP_TITLES`` order), rows by
    policy then usable blocks numerically. ``blocking_claim_ids`` as comma-separated text."""
    a = _audit(source)
    df = a.views["capacity_sweep"].merge(a.runs[["run_id", "scenario"]], on="run_id", how="left")
    if scenario is not None:
        df = df[df["scenario"] == scenario]
    df = df.sort_values(["policy", "usable_blocks", "run_id"],
                        key=lambda c: c.map(natural_key) if c.dtype == object else c)
    cols = [c for c in SWEEP_TITLES if c in df.columns]
    cols += [c for c in df.columns if c not in cols]
    return _lists_to_text(df[cols], ["blocking_claim_ids"]).reset_index(drop=True)


def sweep_scenarios(source: Source) -> list[str]:
    """Scenarios in the capacity sweep, the one with the most runs first (then by name)."""
    df = capacity_sweep(source)
    counts = df.groupby("scenario").size()
    return sorted(counts.index, key=lambda s: (-counts[s], s))


def sweep_series(source: Source, scenario: str | None = None) -> pd.DataFrame:
    """The sweep plot's points, long format: ``policy, usable_blocks, metric, value`` where
    metric is ``resident blocks lost`` (``capacity_sweep.resident_blocks_lost``) or
    ``shortfall`` (``capacity_sweep.shortfall_blocks``, 0 when not refused)."""
    df = capacity_sweep(source, scenario)
    lost = df.assign(metric="resident blocks lost", value=df["resident_blocks_lost"])
    short = df.assign(metric="shortfall", value=df["shortfall_blocks"].fillna(0))
    out = pd.concat([lost, short])[["scenario", "policy", "usable_blocks", "metric", "value",
                                    "run_id"]]
    out["value"] = out["value"].astype("int64")
    return out.sort_values(["metric", "policy", "usable_blocks"]).reset_index(drop=True)


# -- Claims --------------------------------------------------------------------------------------

#: claim_outcomes columns, decisive first.
CLAIM_COLUMNS: Final[tuple[str, ...]] = (
    "claim_id", "tenant", "outcome", "blocks_lost_harm", "value_lost", "run_id", "claim_seq",
    "protection_mode", "blocks_lost_unknown", "blocks_lost_expiry", "blocks_lost_relaxation",
    "blocks_lost_eviction", "bound_blocks", "first_harm_seq", "first_harm_by_request_id",
    "materialized_seq", "release_seq")


def claim_outcomes(source: Source) -> pd.DataFrame:
    """The ``claim_outcomes`` columns, one row per claim instance ``(run_id, claim_seq)``,
    plus ``bound_blocks``: how many positions the instance bound; decisive columns first,
    harmed claims (most harm) first."""
    df = _audit(source).views["claim_outcomes"]
    df = df.sort_values(["blocks_lost_harm", "run_id", "claim_seq"],
                        ascending=[False, True, True], kind="stable")
    cols = [c for c in CLAIM_COLUMNS if c in df.columns]
    return df[cols + [c for c in df.columns if c not in cols]].reset_index(drop=True)


def claim_keys(source: Source) -> list[tuple[str, int]]:
    """Every claim instance ``(run_id, claim_seq)``; those that lost blocks first."""
    df = claim_outcomes(source)
    lost = df[[c for c in df.columns if c.startswith("blocks_lost_")]].sum(axis=1) > 0
    keyed = [(r, int(q)) for r, q in zip(df["run_id"], df["claim_seq"])]
    return [k for k, m in zip(keyed, lost) if m] + [k for k, m in zip(keyed, lost) if not m]


def claim_instances(source: Source, run_id: str, claim_id: str) -> list[int]:
    """The ``claim_seq`` of every instance of ``claim_id`` in a run, in order."""
    df = _audit(source).views["claim_outcomes"]
    df = df[(df["run_id"] == run_id) & (df["claim_id"] == claim_id)]
    return sorted(int(q) for q in df["claim_seq"])


def claim_label(source: Source, run_id: str, claim_seq: int) -> str:
    """A claim instance as people read it: its claim_id, and ``#claim_seq`` when the id names
    more than one instance in the run."""
    df = _audit(source).views["claim_outcomes"]
    df = df[df["run_id"] == run_id]
    row = df[df["claim_seq"] == claim_seq]
    if row.empty:
        return f"#{claim_seq}"
    cid = row["claim_id"].iloc[0]
    return f"{cid} #{claim_seq}" if int((df["claim_id"] == cid).sum()) > 1 else str(cid)


def claim_lifecycle(source: Source, run_id: str, claim_seq: int) -> pd.DataFrame:
    """One claim instance's lifecycle events from ``events`` (submitted, accepted or rejected,
    materialized as reported, demoted/expired/released, harmed as reported), by seq."""
    df = _audit(source).claim_events
    return df[(df["run_id"] == run_id) & (df["claim_seq"] == claim_seq)].reset_index(drop=True)


def claim_losses(source: Source, run_id: str, claim_seq: int) -> pd.DataFrame:
    """One claim instance's block losses from ``loss_claims``: seq, position in the claim,
    label (harm | unknown | expiry | relaxation | eviction) and the evidence, by seq."""
    df = _audit(source).claim_losses
    return df[(df["run_id"] == run_id) & (df["claim_seq"] == claim_seq)].reset_index(drop=True)


def harmed_claims(source: Source, run_id: str | None = None) -> list[tuple[str, int]]:
    """``(run_id, claim_seq)`` of every claim instance that lost blocks as harm, most harm
    first."""
    df = claim_outcomes(source)
    df = df[df["blocks_lost_harm"] > 0]
    if run_id is not None:
        df = df[df["run_id"] == run_id]
    return [(r, int(q)) for r, q in zip(df["run_id"], df["claim_seq"])]


def harm_evictors(source: Source, run_id: str, claim_seq: int) -> pd.DataFrame:
    """The requests whose allocations evicted a claim instance's blocks as harm, and why each
    was admitted: its admission row of ``feasibility`` (demand, protected, usable, free,
    policy, enforcing) and a plain sentence. One row per evicting request, most blocks
    first."""
    a = _audit(source)
    lost = claim_losses(a, run_id, claim_seq)
    lost = lost[lost["label"] == LABEL.harm]
    if lost.empty:
        return pd.DataFrame(columns=["request_id", "tenant", "harm_blocks", "first_seq",
                                     "admitted_seq", "why"])
    by = lost.groupby(lost["by_request_id"].fillna("(unknown)")).agg(
        harm_blocks=("seq", "size"), first_seq=("seq", "min")).reset_index()
    by = by.rename(columns={"by_request_id": "request_id"})
    req = a.tables["requests"]
    req = req[req["run_id"] == run_id][["request_id", "tenant"]]
    feas = a.tables["feasibility"]
    feas = feas[(feas["run_id"] == run_id) & (feas["decision"] == DECISION.admitted)]
    feas = feas.drop_duplicates("request_id", keep="last")[
        ["request_id", "seq", "required_blocks", "live_blocks", "protected_blocks",
         "usable_blocks", "free_blocks", "feasible", "policy", "enforcing"]].rename(
            columns={"seq": "admitted_seq"})
    out = by.merge(req, on="request_id", how="left").merge(feas, on="request_id", how="left")
    out["why"] = [_why_admitted(r) for r in out.itertuples(index=False)]
    out = out.sort_values(["harm_blocks", "first_seq"], ascending=[False, True])
    first = ["request_id", "tenant", "harm_blocks", "first_seq", "admitted_seq", "why"]
    return out[first + [c for c in out.columns if c not in first]].reset_index(drop=True)


def _why_admitted(r: Any) -> str:
    """Why a request that evicted claimed blocks was admitted, from its feasibility row."""
    if pd.isna(getattr(r, "admitted_seq", None)):
        return "no admission decision recorded for this request (unknown)"
    # NOTE: feasibility's rebuilt figures (the pool as the decision's scheduler step found
    # it): required = prompt blocks less hits, protected = resident blocks of in-force
    # residency claims, whatever the policy enforces.
    if _na(r.required_blocks) or _na(r.protected_blocks) or _na(r.usable_blocks):
        return (f"admitted at seq {int(r.admitted_seq)}; the trace lacks the figures to say "
                "whether it fit (unknown)")
    need, prot, usable = int(r.required_blocks), int(r.protected_blocks), int(r.usable_blocks)
    live = 0 if _na(getattr(r, "live_blocks", None)) else int(r.live_blocks)
    # NOTE: the seed's inequality: protected + live (other running requests) + need <= usable
    fits = "fits" if prot + live + need <= usable else "does not fit"
    if not bool(r.enforcing):
        return (f"admitted at seq {int(r.admitted_seq)}: policy {r.policy} does not enforce "
                f"claims, so nothing protected the claim; it needed {need} blocks while "
                f"{prot} were claimed and {live} held by other running requests, of {usable} "
                f"usable ({prot} + {live} + {need} {fits} in {usable}).")
    return (f"admitted at seq {int(r.admitted_seq)} under {r.policy}: {prot} protected + "
            f"{live} live + {need} needed {fits} in {usable} usable; the claim's mode did not "
            "pin its blocks.")


# -- Timeline (block level) ------------------------------------------------------------------------

#: Occupancy categories, bottom to top of the stack, and their colours (colour-blind safe).
OCCUPANCY: Final[tuple[str, ...]] = ("protected", "held", "cached", "free")
OCCUPANCY_COLORS: Final[dict[str, str]] = {
    "protected": "#0072B2", "held": "#009E73", "cached": "#F0E442", "free": "#E8E8E8"}
OCCUPANCY_TITLES: Final[dict[str, str]] = {
    "protected": "protected by claims", "held": "held by requests",
    "cached": "cached, unreferenced", "free": "free"}


def _with_utc(a: Pages, run_id: str, df: pd.DataFrame, ts: str = "ts_ns") -> pd.DataFrame:
    """Add ``utc`` (a timestamp) where the run's manifest has a clock anchor."""
    row = a.runs[a.runs["run_id"] == run_id]
    if row.empty or pd.isna(row["utc_start_ns"].iloc[0]) or ts not in df.columns:
        return df
    utc0, mono0 = int(row["utc_start_ns"].iloc[0]), int(row["mono_start_ns"].iloc[0])
    return df.assign(utc=pd.to_datetime(df[ts] - mono0 + utc0, unit="ns", utc=True))


def seq_utc(source: Source, run_id: str) -> pd.Series:
    """Each seq of a run and its UTC time (a Series indexed by seq; empty without a clock),
    from the events' monotonic ``ts_ns`` and the manifest's clock anchor."""
    a = _audit(source)
    if run_id not in a._seq_utc:
        row = a.runs[a.runs["run_id"] == run_id]
        if row.empty or pd.isna(row["utc_start_ns"].iloc[0]) or a.facade is None:
            a._seq_utc[run_id] = pd.Series(dtype="datetime64[ns, UTC]")
        else:
            with a._lock:
                ev = a.facade.con.execute(
                    "SELECT seq, ts_ns FROM events WHERE run_id = $r ORDER BY seq",
                    {"r": run_id}).df()
            utc0, mono0 = int(row["utc_start_ns"].iloc[0]), int(row["mono_start_ns"].iloc[0])
            a._seq_utc[run_id] = pd.Series(
                pd.to_datetime(ev["ts_ns"] - mono0 + utc0, unit="ns", utc=True).to_numpy(),
                index=ev["seq"].to_numpy())
    return a._seq_utc[run_id]


def add_utc(source: Source, run_id: str, df: pd.DataFrame,
            columns: Sequence[str] = ("seq",)) -> pd.DataFrame:
    """``df`` with ``<column>_utc`` beside each seq column: the UTC time of that seq as
    milliseconds since the epoch (float), for a wall-clock x axis, and ``<column>_iso`` (ISO
    8601, for tooltips); unchanged when the run has no clock."""
    times = seq_utc(source, run_id)
    if times.empty:
        return df
    ms = pd.Series(times.dt.tz_convert("UTC").dt.tz_localize(None).to_numpy()
                   .astype("datetime64[ns]").astype("int64") / 1e6, index=times.index)
    out = df.copy()
    for c in columns:
        if c in out.columns:
            out[f"{c}_utc"] = [None if _na(v) else ms.get(int(v)) for v in out[c]]
            out[f"{c}_iso"] = [None if _na(v) or int(v) not in times.index
                               else times[int(v)].isoformat(timespec="milliseconds")
                               .replace("+00:00", "Z") for v in out[c]]
    return out


def claim_position_lanes(source: Source, run_id: str, claim_seq: int) -> pd.DataFrame:
    """One row per position of a claim instance: ``position, start`` (the seq it was bound),
    ``end`` (the seq it was lost, else the run's last seq), ``label``, ``block_id`` and
    ``by_request_id`` of the loss (None while it stayed), from ``claim_timeline``."""
    a = _audit(source)
    cols = ["position", "start", "end", "label", "block_id", "by_request_id"]
    if a.facade is None:
        return pd.DataFrame(columns=cols)
    with a._lock:
        df = a.facade.con.execute(f"""
            WITH b AS (SELECT position, min(seq) AS start FROM claim_timeline
                       WHERE run_id = $r AND claim_seq = $i AND what = '{EVENT.claim_bound}'
                         AND position IS NOT NULL GROUP BY position),
                 l AS (SELECT position, min(seq) AS lost,
                              arg_min(label, seq) AS label, arg_min(block_id, seq) AS block_id,
                              arg_min(by_request_id, seq) AS by_request_id
                       FROM claim_timeline
                       WHERE run_id = $r AND claim_seq = $i AND kind = 'loss'
                         AND position IS NOT NULL GROUP BY position)
            SELECT coalesce(b.position, l.position) AS position, b.start, l.lost,
                   l.label, l.block_id, l.by_request_id
            FROM b FULL JOIN l USING (position) ORDER BY position""",
            {"r": run_id, "i": claim_seq}).df()
    last = _last_seq(a, run_id)
    df["end"] = [lost if not _na(lost) else last for lost in df["lost"]]
    return df[cols].astype({"start": "Int64", "end": "Int64"})


def has_clock(source: Source, run_id: str) -> bool:
    """Whether the run's manifest anchors its monotonic clock to UTC."""
    row = _audit(source).runs.query("run_id == @run_id")
    return bool(len(row)) and not pd.isna(row["utc_start_ns"].iloc[0])


def occupancy(source: Source, run_id: str) -> pd.DataFrame:
    """The pool after every change, by category (protected by claims, held by requests,
    cached-unreferenced, free), one row per change: ``seq, ts_ns, protected, held, cached,
    free, usable_blocks`` (and ``utc`` where the run has a clock)."""
    a = _audit(source)
    df = a.tables["occupancy"]
    return _with_utc(a, run_id, df[df["run_id"] == run_id].reset_index(drop=True))


def occupancy_long(source: Source, run_id: str) -> pd.DataFrame:
    """``occupancy`` in long format for a stacked area: ``seq, category, blocks``."""
    df = occupancy(source, run_id)
    return df.melt(id_vars=["seq"], value_vars=list(OCCUPANCY), var_name="category",
                   value_name="blocks").assign(
        category=lambda d: d["category"].map(OCCUPANCY_TITLES))


def run_losses(source: Source, run_id: str) -> pd.DataFrame:
    """Every loss of a run as a mark: ``seq, label, blocks`` (losses at one seq summed) and
    the requests that caused them."""
    df = _audit(source).tables["losses"]
    df = df[df["run_id"] == run_id]
    if df.empty:
        return pd.DataFrame(columns=["seq", "label", "blocks", "by_request_id"])
    return df.groupby(["seq", "label"]).agg(
        blocks=("ts_ns", "size"),
        by_request_id=("by_request_id", lambda v: ", ".join(sorted(set(v.dropna()))))
    ).reset_index()


def request_lanes(source: Source, run_id: str) -> pd.DataFrame:
    """One lane per request: spans ``queued`` (arrival to a decision), ``deferred`` (first
    deferral to admission or refusal), ``running`` (admission to finish), and an end mark
    (``served``, ``refused``, ``preempted``, ``aborted``...) from the ``requests`` table."""
    a = _audit(source)
    req = a.tables["requests"]
    req = req[req["run_id"] == run_id]
    end_of_run = _last_seq(a, run_id)
    rows: list[dict[str, Any]] = []
    for r in req.itertuples(index=False):
        decided = _first(r.first_deferred_seq, r.first_alloc_seq, r.admitted_seq, r.refused_seq,
                         r.finished_seq)
        ended = _first(r.finished_seq, end_of_run)
        lane = r.request_id
        if decided is not None and r.arrived_seq is not None and decided > r.arrived_seq:
            rows.append(_span(lane, r.tenant, "queued", r.arrived_seq, decided))
        if not _na(r.first_deferred_seq):
            rows.append(_span(lane, r.tenant, "deferred", r.first_deferred_seq,
                              _first(r.admitted_seq, r.refused_seq, ended)))
        # NOTE: the recorder emits request_admitted after the step's allocations: a request
        # runs from its first allocation (or hit) when that comes before its admission event.
        started = _first(min(v for v in (r.admitted_seq, r.first_alloc_seq) if not _na(v))
                         if not (_na(r.admitted_seq) and _na(r.first_alloc_seq)) else None)
        if started is not None:
            rows.append(_span(lane, r.tenant, "running", started, ended))
        rows.append({"lane": lane, "tenant": r.tenant, "state": str(r.outcome),
                     "start": _first(r.refused_seq, r.last_preempted_seq
                                     if r.outcome == REQUEST_OUTCOME.preempted else None, ended),
                     "end": None, "kind": "mark"})
    return pd.DataFrame(rows, columns=["lane", "tenant", "state", "start", "end", "kind"])


def claim_lanes(source: Source, run_id: str) -> pd.DataFrame:
    """One lane per claim: spans ``submitted`` (to acceptance or rejection), ``accepted``
    (to materialization), ``in force`` (materialized, to its release or the end), and
    ``demoted`` / ``expired`` / ``released`` after a release; rejections as marks."""
    a = _audit(source)
    claims = a.tables["claims"]
    claims = claims[claims["run_id"] == run_id]
    end_of_run = _last_seq(a, run_id)
    after = {EVENT.claim_demoted: CLAIM_OUTCOME.demoted, EVENT.claim_expired: CLAIM_OUTCOME.expired,
             EVENT.claim_released: CLAIM_OUTCOME.released}
    rows: list[dict[str, Any]] = []
    reused = claims["claim_id"].duplicated(keep=False).tolist()
    for c, dup in zip(claims.itertuples(index=False), reused):
        lane, t = (f"{c.claim_id} #{c.claim_seq}" if dup else c.claim_id), c.tenant
        decided = _first(c.accepted_seq, c.rejected_seq)
        if decided is not None and not _na(c.submitted_seq):
            rows.append(_span(lane, t, "submitted", c.submitted_seq, decided))
        if not _na(c.rejected_seq) and _na(c.accepted_seq):
            rows.append({"lane": lane, "tenant": t, "state": CLAIM_OUTCOME.rejected,
                         "start": int(c.rejected_seq), "end": None, "kind": "mark"})
            continue
        if _na(c.accepted_seq):
            continue
        release = _first(c.release_seq)
        if not _na(c.materialized_seq):
            rows.append(_span(lane, t, "accepted", c.accepted_seq, c.materialized_seq))
            rows.append(_span(lane, t, "in force", c.materialized_seq,
                              _first(release, end_of_run)))
        else:
            rows.append(_span(lane, t, "accepted", c.accepted_seq, _first(release, end_of_run)))
        if release is not None:
            rows.append(_span(lane, t, after.get(c.release_event, CLAIM_OUTCOME.released), release,
                              end_of_run))
    return pd.DataFrame(rows, columns=["lane", "tenant", "state", "start", "end", "kind"])


def claim_loss_marks(source: Source, run_id: str) -> pd.DataFrame:
    """Every claim instance's block losses as marks on its lane: ``lane, seq, label,
    blocks`` (the lane named as ``claim_lanes`` names it)."""
    a = _audit(source)
    df = a.claim_losses
    df = df[df["run_id"] == run_id]
    out = df.groupby(["claim_seq", "seq", "label"]).size().rename("blocks").reset_index()
    out["lane"] = [claim_label(a, run_id, int(q)) for q in out["claim_seq"]]
    return out[["lane", "seq", "label", "blocks"]]


def _last_seq(a: Pages, run_id: str) -> int | None:
    row = a.runs[a.runs["run_id"] == run_id]
    return None if row.empty or pd.isna(row["last_seq"].iloc[0]) else int(row["last_seq"].iloc[0])


def _na(v: Any) -> bool:
    return v is None or (isinstance(v, float) and pd.isna(v)) or v is pd.NA or v is pd.NaT


def _first(*values: Any) -> int | None:
    """The first value that is present, as an int."""
    for v in values:
        if not _na(v):
            return int(v)
    return None


def _span(lane: str, tenant: Any, state: str, start: Any, end: Any) -> dict[str, Any]:
    return {"lane": lane, "tenant": tenant, "state": state, "start": int(start),
            "end": None if _na(end) else int(end), "kind": "span"}


# -- Pool occupancy (the cached-blocks view) -------------------------------------------------------

def pool_occupancy(source: Source, run_id: str) -> pd.DataFrame:
    """The ``pool_occupancy`` view for one run: cached blocks after each change, by seq."""
    df = _audit(source).views["pool_occupancy"]
    return df[df["run_id"] == run_id].reset_index(drop=True)


def usable_blocks(source: Source, run_id: str) -> int | None:
    """The run's usable blocks (its manifest; vLLM's null block excluded)."""
    runs = _audit(source).runs
    v = runs.loc[runs["run_id"] == run_id, "usable_blocks"]
    return None if v.empty or pd.isna(v.iloc[0]) else int(v.iloc[0])


# -- Loss labels ---------------------------------------------------------------------------------

def loss_labels(source: Source) -> pd.DataFrame:
    """The ``loss_labels`` view: blocks lost per run and label, with seq range and resets."""
    return _audit(source).views["loss_labels"].reset_index(drop=True)


# -- Tenant explanations -------------------------------------------------------------------------

def tenants(source: Source) -> list[str]:
    """Every tenant with a claim or a request, the one with the most harm first (blocks lost
    as harm, then value lost, then name): ``kvclaims.explaining.tenants_by_harm``."""

    a = _audit(source)
    with a._lock:
        return tenants_by_harm(a.facade)


def explanation(source: Source, tenant: str) -> Any:
    """The tenant's post-incident explanation: ``kvclaims.explaining.explain`` (the one
    implementation, shared with ``kvclaims explain``), an ``Explanation`` with
    ``sections`` and ``to_html`` / ``to_markdown`` / ``to_text`` / ``to_json``.

    NOTE: built once per tenant and kept on the audit; the facade's DuckDB connection is
    used by one session at a time (the audit's lock). The replays the explanations cite are
    opened once, on the first tenant, and kept open beside the facade (one audit of them per
    page set, not one per tenant). Raises ``InputError`` for a tenant the audit does not know.
    """

    a = _audit(source)
    with a._lock:
        if tenant not in a._explained:
            a._explained[tenant] = explain(a.facade, tenant, replay_facts=a.replay_facts)
        return a._explained[tenant]


#: Section outcomes a tenant page opens first (the rest are folded).
INCIDENT_OUTCOMES: Final[frozenset[str]] = frozenset(
    {CLAIM_OUTCOME.harmed, LABEL.unknown, REQUEST_OUTCOME.refused, REQUEST_OUTCOME.preempted})


def tenant_claims(source: Source, tenant: str) -> pd.DataFrame:
    """Every claim instance of one tenant (with or without an incident)."""
    df = claim_outcomes(source)
    df = df[df["tenant"] == tenant].drop(columns="tenant")
    df = df.iloc[sorted(range(len(df)), key=lambda i: natural_key(df["run_id"].iloc[i]))]
    first = ["run_id", "claim_id", "outcome", "blocks_lost_harm", "value_lost"]
    return df[first + [c for c in df.columns if c not in first]].reset_index(drop=True)


# -- Findings & conformance ----------------------------------------------------------------------

def check_titles(source: Source) -> dict[str, str]:
    """What each check asks, from the ``conformance`` table's ``title`` column (defined once,
    in reconstruct/sql/08_conformance.sql)."""
    df = _audit(source).conformance.dropna(subset=["title"])
    return dict(zip(df["check"], df["title"]))


def findings(source: Source, run_id: str | None = None) -> pd.DataFrame:
    """The ``findings`` table (holes, disagreements, violations, anomalies), ``seqs`` as text."""
    df = _audit(source).findings
    if run_id is not None:
        df = df[df["run_id"] == run_id]
    return _lists_to_text(df, ["seqs"]).reset_index(drop=True)


def conformance(source: Source, run_id: str | None = None) -> pd.DataFrame:
    """The ``conformance`` table: per run and check (in the order of the check table) its title,
    verdict (fail | unknown | pass | not_exercised), ``evidence_seqs`` as sorted text (ending
    "… and N more" where the table holds only the smallest of them), the detail and what would
    exercise it (``needs``); runs in natural order."""
    df = _audit(source).conformance
    if run_id is not None:
        df = df[df["run_id"] == run_id]
    order = {c: i for i, c in enumerate(CHECKS)}
    df = df.assign(verdict=df["verdict"].map(_verdict),
                   _r=df["run_id"].map(natural_key),
                   _o=df["check"].map(order).fillna(len(order)),
                   evidence_seqs=[None if _na(x) else sorted(x) for x in df["evidence_seqs"]])
    df = df.sort_values(["_r", "_o"]).drop(columns=["_o", "_r"])
    first = ["run_id", "check", "title", "verdict"]
    df = df[first + [c for c in df.columns if c not in first]]
    out = _lists_to_text(df, ["evidence_seqs"])
    if "evidence_seq_count" in df.columns:
        out["evidence_seqs"] = [
            t if _na(t) or _na(n) or n <= len(x) else f"{t} … and {int(n) - len(x):,} more"
            for t, x, n in zip(out["evidence_seqs"], df["evidence_seqs"],
                               df["evidence_seq_count"])]
    return out.reset_index(drop=True)


def verdict_counts(source: Source) -> dict[str, int]:
    """How many (run, check) verdicts are fail, unknown, pass and not_exercised."""
    counts = _audit(source).conformance["verdict"].map(_verdict).value_counts()
    return {v: int(counts.get(v, 0)) for v in CHECK_VERDICTS}


def conformance_matrix(source: Source) -> pd.DataFrame:
    """Verdicts as a matrix: one row per run, one column per check (the check table's order)."""
    df = conformance(source)
    wide = df.pivot(index="run_id", columns="check", values="verdict")
    cols = [c for c in CHECKS if c in wide.columns] + [c for c in wide.columns
                                                        if c not in CHECKS]
    wide = wide[cols]
    wide = wide.loc[sorted(wide.index, key=natural_key)]
    wide.columns.name = None
    return wide.reset_index()


def capacity_decisions(source: Source) -> pd.DataFrame:
    """The ``feasibility`` rows worth a reader's eye: every deferral, refusal and preemption,
    and every admission that was infeasible or where the runtime's verdict differs; the rebuilt
    figures first, the runtime's beside them."""
    df = _audit(source).tables["feasibility"]
    keep = (df["decision"] != DECISION.admitted) | (df["feasible"] == False) | (  # noqa: E712
        df["agrees"] == False)  # noqa: E712
    cols = ["run_id", "seq", "decision", "request_id", "protected_blocks", "live_blocks",
            "required_blocks", "usable_blocks", "feasible", "shortfall_blocks",
            "runtime_protected_blocks", "runtime_required_blocks", "runtime_shortfall_blocks",
            "runtime_feasible"]
    return df[keep][[c for c in cols if c in df.columns]].reset_index(drop=True)


def lowering(source: Source, run_id: str | None = None) -> pd.DataFrame:
    """The ``lowering`` table: per run and protection mode, the class the run's evidence
    supports (seed 004's classes, fail-closed), the evidence, and what the manifest declared
    beside it; runs in natural order."""
    df = _audit(source).tables["lowering"]
    if run_id is not None:
        df = df[df["run_id"] == run_id]
    df = df.iloc[sorted(range(len(df)), key=lambda i: (natural_key(df["run_id"].iloc[i]),
                                                        str(df["mode"].iloc[i])))]
    return df.reset_index(drop=True)


# -- What-if -------------------------------------------------------------------------------------

#: Said where no what-if was computed for any audited run (report, dashboard).
NO_WHATIF: Final[str] = (
    "No what-if computed for these runs: nothing here says what another policy or pool size "
    "would have done. kvclaims whatif RUN --policy P --usable-blocks N --out DIR computes one.")


def whatif_runs(source: Source) -> list[str]:
    """The recorded runs of the audit with at least one computed what-if, in natural order."""
    a = _audit(source)
    replayed = {r.run_dir.resolve() for r in a.replays}
    return [rid for rid, d in zip(a.runs["run_id"], a.runs["run_dir"])
            if replays_of(a.replays, rid) and Path(d).resolve() not in replayed]


def whatif_orphans(source: Source) -> list[Replay]:
    """Computed what-ifs whose recorded run is not among the audited runs (nothing to set
    them beside)."""
    a = _audit(source)
    known = set(a.run_ids)
    return [r for r in a.replays if r.source_run_id not in known]


def whatif_comparison(source: Source, run_id: str) -> pd.DataFrame:
    """The recorded run ``run_id`` (row ``recorded``) beside each computed replay of it:
    ``kvclaims.replays.compare``, the comparison ``kvclaims whatif`` prints (its columns,
    ``SUMMARY_COLUMNS``, then ``run_id``); built once per run and kept on the audit."""
    a = _audit(source)
    with a._lock:
        if run_id not in a._compared:
            run_dir = a.runs.loc[a.runs["run_id"] == run_id, "run_dir"]
            if not len(run_dir) or not run_dir.iloc[0]:
                raise InputError(f"run {run_id!r}: no run directory to compare replays with")
            rows = compare(run_dir.iloc[0], replays_of(a.replays, run_id))
            a._compared[run_id] = pd.DataFrame(rows)[[*SUMMARY_COLUMNS, "run_id"]]
        return a._compared[run_id]


def whatif_table(comparison: pd.DataFrame) -> pd.DataFrame:
    """The comparison as the page shows it: ``kvclaims whatif``'s column titles, value lost
    per tenant and exactness as text (``kvclaims.replays.cell``)."""
    out = comparison.copy()
    for c in ("value_lost_by_tenant", "exact"):
        out[c] = [cell(v if isinstance(v, dict) or not _isna(v) else None) for v in out[c]]
    lost = {f"lost_{label}": f"blocks lost: {label}" for label in LABELS}
    return out.rename(columns={**TITLES, **lost, "run_id": "run"})


def whatif_caption(comparison: pd.DataFrame) -> str:
    """What the comparison shows, in words the pages put after the recorded run's name: how
    many replayed points, how they were made, how many are approximate."""
    replayed = comparison[comparison["point"] != "recorded"]
    approx = int((replayed["exact"] != True).sum())  # noqa: E712 - NULL is not exact
    return (f"beside {len(replayed)} replayed point(s), each replayed through vLLM's scheduler "
            "with the recorder and arbiter (kvclaims whatif) and audited like a recording"
            + (f"; {approx} approximate (see each replay's manifest)." if approx else "."))


#: The what-if chart's metrics: (title, comparison column, unit).
WHATIF_METRICS: Final[tuple[tuple[str, str, str], ...]] = (
    ("blocks lost as harm", f"lost_{LABEL.harm}", "blocks"),
    ("requests refused", REQUEST_OUTCOME.refused, "requests"))


def whatif_series(comparison: pd.DataFrame) -> pd.DataFrame:
    """The what-if chart's points, long format as ``sweep_series`` (``policy, usable_blocks,
    metric, value, run_id``): one line per replayed policy, the recorded run as its own
    point (policy ``recorded (<policy>)``)."""
    rows = []
    for r in comparison.to_dict("records"):
        policy = (f"recorded ({r['policy']})" if r["point"] == "recorded" else r["policy"])
        for title, col, _unit in WHATIF_METRICS:
            rows.append({"policy": policy, "usable_blocks": r["usable_blocks"], "metric": title,
                         "value": int(r[col]), "run_id": r["run_id"]})
    return pd.DataFrame(rows, columns=["policy", "usable_blocks", "metric", "value", "run_id"])


def whatif_chartable(comparison: pd.DataFrame) -> bool:
    """Whether the what-if reads better as a chart too: its replays span at least two pool
    sizes (a line per policy); a single size is read from the table."""
    replayed = comparison[comparison["point"] != "recorded"]
    return replayed["usable_blocks"].nunique() >= 2
