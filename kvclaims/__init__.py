"""kvclaims: auditable resident KV claims for vLLM.

The one way into an audit (docs/sql.md)::

    import kvclaims
    with kvclaims.open(["traces/multi_tenant"]) as audit:
        audit.sql("SELECT * FROM losses").pl()
    with kvclaims.open("fleet/") as audit:          # a fleet dataset: the same Audit
        audit.view("fleet_claims_harmed").pl()

``kvclaims.open`` and ``kvclaims.explain`` are imported lazily so that ``import kvclaims`` (the
CLI) does not pay for DuckDB.
"""

from __future__ import annotations

from typing import Any

__all__ = ["open", "Audit", "SQLRefused", "explain", "Explanation"]


def open(paths: Any, *, memory_limit: str | None = None, progress: Any = None,  # noqa: A001
         **options: Any) -> Any:
    """Open run directories, sweep directories, globs or JSON Lines traces, or one fleet
    dataset (``kvclaims reconstruct --engine spark --out``), as one read-only ``Audit`` (see
    ``kvclaims.audit.open_audit`` for ``temp_directory``, ``threads``, ``reuse``, ``runs``)."""
    from kvclaims.audit import open_audit

    return open_audit(paths, memory_limit=memory_limit, progress=progress, **options)


def __getattr__(name: str) -> Any:
    if name in ("Audit", "SQLRefused"):
        from kvclaims import audit

        return getattr(audit, name)
    if name in ("explain", "Explanation"):
        from kvclaims import explaining

        return getattr(explaining, name)
    raise AttributeError(name)
