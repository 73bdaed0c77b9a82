"""kvclaims queries: the public, documented SQL library over events + reconstructed tables.

One concept per ``.sql`` file, each creating one view, with a comment above the view and
above every column (Perfetto stdlib style). ``kvclaims.open(paths)`` applies them all; from the
CLI, ``kvclaims query NAME RUN_DIR...`` shows one and ``kvclaims query --list`` lists them::

    import kvclaims
    kvclaims.open(["traces/sweep-resident60_active70"]).view("capacity_sweep").pl()
"""

from __future__ import annotations

import re
from importlib import resources
from typing import Any, Final

from kvclaims.contract.vocabulary import TABLE_NAMES, fill_sql

# Views in the order they are created (a view may use one created before it).
VIEWS: Final[tuple[str, ...]] = (
    "loss_labels", "loss_labels_by_tenant", "claim_outcomes", "claim_timeline",
    "request_outcomes", "refusals_with_blockers", "feasibility_violations",
    "tenant_explanations", "pool_occupancy", "block_states", "capacity_sweep")

#: Views over a whole fleet dataset (``queries/fleet/*.sql``: where runs meet), each one SQL
#: text that Spark SQL and DuckDB both run (docs/fleet.md); created by ``apply_fleet``.
FLEET_VIEWS: Final[tuple[str, ...]] = (
    "fleet_claims_harmed", "fleet_capacity_by_policy", "fleet_findings_by_kind")

#: The tables every audit has (docs/reconstruction.md), with their one-line description.
TABLES: Final[dict[str, str]] = {
    "events": "every recorded event, one row per event, strings decoded (docs/trace-format.md)",
    "manifests": "one row per run: the manifest's facts and its full JSON",
    "losses": "every block loss with its label: the most severe of its claims' labels",
    "loss_claims": "one row per (block loss, claim bound to the lost content) with the label",
    "claims": "every claim's final outcome, value lost, and the seqs of its lifecycle",
    "requests": "every request's outcome, deferrals, refusal and what it cached",
    "feasibility": "every admission decision: protected + live + required vs usable blocks",
    "findings": "holes in the evidence, disagreements with the runtime, violations, anomalies",
    "conformance": "litmus checks and invariants per run: verdict and the seqs that prove it",
}
assert set(TABLE_NAMES) <= set(TABLES)  # NOTE: every reconstructed table is described here


def sql_text(view: str) -> str:
    """The SQL (with its documentation comments) that defines one view."""
    if view not in VIEWS:
        raise KeyError(f"unknown view {view!r}; choose one of {list(VIEWS)}")
    return fill_sql(resources.files("kvclaims.queries").joinpath(f"{view}.sql")
                    .read_text(encoding="utf-8"))


def fleet_sql_text(view: str) -> str:
    """The SQL of one fleet view (``FLEET_VIEWS``): the same text on Spark SQL and DuckDB."""
    if view not in FLEET_VIEWS:
        raise KeyError(f"unknown fleet view {view!r}; choose one of {list(FLEET_VIEWS)}")
    return fill_sql(resources.files("kvclaims.queries").joinpath("fleet", f"{view}.sql")
                    .read_text(encoding="utf-8"))


def description(view: str) -> str:
    """A view's one-line description: its first comment sentence, after ``name:``."""
    words: list[str] = []
    for line in sql_text(view).splitlines():
        if not line.startswith("--"):
            break
        words.append(line[2:].strip())
        if words[-1].endswith("."):
            break
    text = " ".join(words)
    return re.sub(r"^" + re.escape(view) + r":\s*", "", text).strip()


def apply(con: Any, views: tuple[str, ...] | list[str] = VIEWS) -> list[str]:
    """Create the views on ``con``; return their names."""
    for view in views:
        con.execute(sql_text(view))
    return list(views)


def apply_fleet(con: Any) -> list[str]:
    """Create the fleet views (``FLEET_VIEWS``) on a DuckDB connection; return their names."""
    for view in FLEET_VIEWS:
        con.execute(fleet_sql_text(view))
    return list(FLEET_VIEWS)
