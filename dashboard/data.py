"""The dashboard's data: run directories in, the DataFrames each page shows out.

Data flows one way (DESIGN.md §6): run directories -> ``reconstruct.loader.load_runs`` ->
``queries.audit`` (the reconstructor, then ``queries.apply``) -> the documented views. Nothing here
imports the recorder's scheduler or vLLM, and no number is computed here that a view or a
reconstructed table does not already hold: these functions select, filter and reshape.

``load_audit(paths)`` reconstructs once and keeps every view as a pandas DataFrame (an
``Audit``); the page functions take an ``Audit`` or, for one-off use, the run directory paths
themselves (which reconstructs them)::

    from dashboard import data
    audit = data.load_audit(["traces/sweep-resident60_active70", "traces/multi_tenant"])
    data.capacity_sweep(audit)              # the capacity_sweep view, one row per run
    data.tenant_explanations(audit, "tenant-d")
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypeAlias

import pandas as pd

from recorder.schema import InputError

PathLike: TypeAlias = "str | Path"

#: The repository's shipped traces (the app's default input).
TRACES_DIR: Final[Path] = Path(__file__).resolve().parent.parent / "traces"
#: Folders under ``traces/`` that are not run directories in our format (JSON Lines).
NOT_RUN_FOLDERS: Final[frozenset[str]] = frozenset({"arbiter-prototype"})

#: Loss labels, most severe first (docs/reconstruction.md), and the colour each page uses.
LABELS: Final[tuple[str, ...]] = ("harm", "unknown", "expiry", "relaxation", "eviction")
LABEL_COLORS: Final[dict[str, str]] = {
    "harm": "#d62728", "unknown": "#7f7f7f", "expiry": "#ff7f0e", "relaxation": "#1f77b4",
    "eviction": "#2ca02c"}
#: The L1-L7 checks, then the invariants, in the order the conformance page lists them.
CHECKS: Final[tuple[str, ...]] = (
    "L1", "L2", "L3", "L4", "L5", "L6", "L7", "INV_no_harm_without_acceptance",
    "INV_release_precedes_loss", "INV_refusal_names_protected_claim", "INV_no_protected_loss",
    "INV_feasible_admission")
#: Claim events shown on a claim's timeline (``claim_bound`` is shown as a count instead).
LIFECYCLE_EVENTS: Final[tuple[str, ...]] = (
    "claim_submitted", "claim_accepted", "claim_rejected", "claim_materialized",
    "claim_demoted", "claim_expired", "claim_released", "claim_harmed")

_VIEWS: Final[tuple[str, ...]] = (
    "capacity_sweep", "claim_outcomes", "loss_labels", "pool_occupancy", "request_outcomes",
    "tenant_explanations")


@dataclass(frozen=True)
class Audit:
    """Everything the pages show, reconstructed once from a set of run directories.

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

    @property
    def run_ids(self) -> list[str]:
        """Every run, in run_id order."""
        return self.runs["run_id"].tolist()


Source: TypeAlias = "Audit | Sequence[PathLike]"


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
    runs) and error messages for the others. Only manifests are checked here; a corrupt
    segment is reported by ``load_audit``."""
    from reconstruct.loader import open_runs

    good: list[str] = []
    errors: list[str] = []
    for p in paths:
        try:
            open_runs([p])
        except InputError as exc:
            errors.append(str(exc))
        else:
            good.append(str(p))
    return good, errors


# -- reconstruction ------------------------------------------------------------------------------

def load_audit(paths: Sequence[PathLike],
               progress: Callable[[str], None] | None = None) -> Audit:
    """Load and reconstruct the run directories ``paths`` names (run or sweep directories),
    apply the SQL library and fetch what the pages show.

    Raises ``recorder.schema.InputError`` (a ``TraceError``, naming the file) when a path is
    not a run directory or a trace cannot be read. ``progress`` is told each stage's name.
    """
    import queries
    from reconstruct.loader import load_runs

    if isinstance(paths, (str, Path)):
        paths = [paths]
    if not paths:
        raise InputError("no run directories given")
    trace = load_runs(list(paths))
    con = queries.audit(trace, progress=progress)
    try:
        views = {v: con.sql(f"SELECT * FROM {v}").df() for v in _VIEWS}
        findings = con.sql("SELECT * REPLACE (block_hash::VARCHAR AS block_hash) FROM findings "
                           "ORDER BY run_id, seq NULLS LAST, kind").df()
        conformance = con.sql("SELECT * FROM conformance ORDER BY run_id").df()
        lifecycle = ", ".join(f"'{e}'" for e in LIFECYCLE_EVENTS)
        claim_events = con.sql(f"""
            SELECT run_id, claim_id, seq, ts_ns, event, request_id, tenant, protection_mode,
                   reason, by_request_id, block_hash::VARCHAR AS block_hash
            FROM events WHERE claim_id IS NOT NULL AND event IN ({lifecycle})
            ORDER BY run_id, claim_id, seq""").df()
        bound = con.sql("""
            SELECT run_id, claim_id, count(DISTINCT position) AS bound_blocks FROM events
            WHERE event = 'claim_bound' GROUP BY ALL""").df()
        claim_losses = con.sql("""
            SELECT run_id, claim_id, seq, ts_ns, position, label, block_id,
                   block_hash::VARCHAR AS block_hash, by_request_id, decided_by_seq,
                   breaks_predicate, broken_seq
            FROM loss_claims ORDER BY run_id, claim_id, seq, position""").df()
    finally:
        con.close()
    views["claim_outcomes"] = views["claim_outcomes"].merge(
        bound, on=["run_id", "claim_id"], how="left").astype({"bound_blocks": "Int64"})
    runs = pd.DataFrame([{
        "run_id": rid, "scenario": m.get("scenario") or _scenario_from_run_id(rid, m),
        "policy": m.get("policy"), "usable_blocks": m.get("usable_blocks"),
        "complete": bool(m.get("complete")), "run_dir": str(trace.run_dirs.get(rid, ""))}
        for rid, m in sorted(trace.manifests.items())],
        columns=["run_id", "scenario", "policy", "usable_blocks", "complete", "run_dir"])
    return Audit(paths=tuple(str(p) for p in paths), runs=runs, views=views, findings=findings,
                 conformance=conformance, claim_events=claim_events, claim_losses=claim_losses,
                 truncations=tuple(trace.truncations))


def _scenario_from_run_id(run_id: str, manifest: dict[str, Any]) -> str:
    """``<scenario>-<policy>-<usable>`` (how ``kvclaims record`` names runs), else the run id."""
    suffix = f"-{manifest.get('policy')}-{manifest.get('usable_blocks')}"
    return run_id[: -len(suffix)] if run_id.endswith(suffix) else run_id


def _audit(source: Source) -> Audit:
    return source if isinstance(source, Audit) else load_audit(source)


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


# -- Capacity sweep ------------------------------------------------------------------------------

def capacity_sweep(source: Source, scenario: str | None = None) -> pd.DataFrame:
    """The ``capacity_sweep`` view (one row per run), with the run's scenario; only
    ``scenario``'s runs if given. ``blocking_claim_ids`` as comma-separated text."""
    a = _audit(source)
    df = a.views["capacity_sweep"].merge(a.runs[["run_id", "scenario"]], on="run_id", how="left")
    if scenario is not None:
        df = df[df["scenario"] == scenario]
    cols = ["scenario", *[c for c in df.columns if c != "scenario"]]
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

def claim_outcomes(source: Source) -> pd.DataFrame:
    """The ``claim_outcomes`` view (one row per run and claim), plus ``bound_blocks``: how
    many positions the claim bound (``claim_bound`` events)."""
    return _audit(source).views["claim_outcomes"].reset_index(drop=True)


def claim_keys(source: Source) -> list[tuple[str, str]]:
    """Every ``(run_id, claim_id)``; claims that lost blocks first, then the others."""
    df = claim_outcomes(source)
    lost = df[[c for c in df.columns if c.startswith("blocks_lost_")]].sum(axis=1) > 0
    keyed = list(zip(df["run_id"], df["claim_id"]))
    return [k for k, m in zip(keyed, lost) if m] + [k for k, m in zip(keyed, lost) if not m]


def claim_lifecycle(source: Source, run_id: str, claim_id: str) -> pd.DataFrame:
    """One claim's lifecycle events from ``events`` (submitted, accepted or rejected,
    materialized as reported, demoted/expired/released, harmed as reported), by seq."""
    df = _audit(source).claim_events
    return df[(df["run_id"] == run_id) & (df["claim_id"] == claim_id)].reset_index(drop=True)


def claim_losses(source: Source, run_id: str, claim_id: str) -> pd.DataFrame:
    """One claim's block losses from ``loss_claims``: seq, position in the claim, label
    (harm | unknown | expiry | relaxation | eviction) and the evidence, by seq."""
    df = _audit(source).claim_losses
    return df[(df["run_id"] == run_id) & (df["claim_id"] == claim_id)].reset_index(drop=True)


# -- Pool occupancy ------------------------------------------------------------------------------

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
    """Every tenant that declared a claim (``claim_outcomes``); tenants with an explanation
    (a harmed, demoted, released or expired claim that lost blocks) first."""
    a = _audit(source)
    explained = set(a.views["tenant_explanations"]["tenant"].dropna())
    every = set(a.views["claim_outcomes"]["tenant"].dropna())
    return sorted(explained) + sorted(every - explained)


def tenant_explanations(source: Source, tenant: str | None = None) -> pd.DataFrame:
    """The ``tenant_explanations`` view (one sentence per claim), only ``tenant``'s rows if
    given; ``evidence_seqs`` as comma-separated text."""
    df = _audit(source).views["tenant_explanations"]
    if tenant is not None:
        df = df[df["tenant"] == tenant]
    return _lists_to_text(df, ["evidence_seqs"]).reset_index(drop=True)


def tenant_claims(source: Source, tenant: str) -> pd.DataFrame:
    """Every claim of one tenant from ``claim_outcomes`` (with or without an incident)."""
    df = claim_outcomes(source)
    return df[df["tenant"] == tenant].reset_index(drop=True)


# -- Findings & conformance ----------------------------------------------------------------------

def findings(source: Source, run_id: str | None = None) -> pd.DataFrame:
    """The ``findings`` table (holes, disagreements, violations, anomalies), ``seqs`` as text."""
    df = _audit(source).findings
    if run_id is not None:
        df = df[df["run_id"] == run_id]
    return _lists_to_text(df, ["seqs"]).reset_index(drop=True)


def conformance(source: Source, run_id: str | None = None) -> pd.DataFrame:
    """The ``conformance`` table: per run and check (L1-L7, then the invariants) its verdict
    (pass | fail | not_applicable | unknown), ``evidence_seqs`` as text, and the detail."""
    df = _audit(source).conformance
    if run_id is not None:
        df = df[df["run_id"] == run_id]
    order = {c: i for i, c in enumerate(CHECKS)}
    df = df.assign(_o=df["check"].map(order).fillna(len(order))).sort_values(["run_id", "_o"])
    return _lists_to_text(df.drop(columns="_o"), ["evidence_seqs"]).reset_index(drop=True)


def verdict_counts(source: Source) -> dict[str, int]:
    """How many (run, check) verdicts are pass, fail, unknown and not_applicable."""
    counts = _audit(source).conformance["verdict"].value_counts()
    return {v: int(counts.get(v, 0)) for v in ("pass", "fail", "unknown", "not_applicable")}


def conformance_matrix(source: Source) -> pd.DataFrame:
    """Verdicts as a matrix: one row per run, one column per check (L1-L7, invariants)."""
    df = conformance(source)
    wide = df.pivot(index="run_id", columns="check", values="verdict")
    cols = [c for c in CHECKS if c in wide.columns] + [c for c in wide.columns
                                                        if c not in CHECKS]
    wide = wide[cols]
    wide.columns.name = None
    return wide.reset_index()
