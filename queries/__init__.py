"""kvclaims queries: the public, documented SQL library over events + reconstructed tables.

One concept per ``.sql`` file, each creating one view, with a comment above the view and
above every column (Perfetto stdlib style). Apply them to a DuckDB connection that has
``events`` and the reconstructed tables (``reconstruct.reconstruct(trace).con`` has both)::

    from queries import apply
    apply(con)
    con.sql("SELECT * FROM capacity_sweep")
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import resources
from typing import Any, Final

# Views in the order they are created (none depends on another today; the order is fixed so
# that one may later).
VIEWS: Final[tuple[str, ...]] = (
    "loss_labels", "claim_outcomes", "request_outcomes", "tenant_explanations",
    "pool_occupancy", "capacity_sweep")


def sql_text(view: str) -> str:
    """The SQL (with its documentation comments) that defines one view."""
    if view not in VIEWS:
        raise KeyError(f"unknown view {view!r}; choose one of {list(VIEWS)}")
    return resources.files("queries").joinpath(f"{view}.sql").read_text(encoding="utf-8")


def apply(con: Any, views: tuple[str, ...] | list[str] = VIEWS) -> list[str]:
    """Create the views on ``con``; return their names."""
    for view in views:
        con.execute(sql_text(view))
    return list(views)


def audit(trace: Any, progress: Callable[[str], None] | None = None) -> Any:
    """Reconstruct a loaded trace (``reconstruct.loader.load_runs(paths)``) and apply every
    view: the one DuckDB connection the CLI summaries and the dashboard read from (``events``,
    the reconstructed tables, and the views). ``progress`` is told each stage's name.
    """
    from reconstruct.core import reconstruct

    con = reconstruct(trace, progress=progress).con
    apply(con)
    return con
