"""kvclaims: auditable resident KV claims for vLLM.

The one way into an audit (docs/sql.md)::

    import kvclaims
    with kvclaims.open(["traces/multi_tenant"]) as audit:
        audit.sql("SELECT * FROM losses").pl()

``kvclaims.open`` and ``kvclaims.explain`` are imported lazily so that ``import kvclaims`` (the
CLI) does not pay for DuckDB.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from pathlib import Path
from typing import Any

__all__ = ["open", "Audit", "SQLRefused", "explain", "Explanation"]


def open(paths: Any, *, memory_limit: str | None = None, progress: Any = None,  # noqa: A001
         **options: Any) -> Any:
    """Open run directories, sweep directories, globs or JSON Lines traces as one read-only
    ``Audit`` (see ``kvclaims.audit.open_audit`` for ``temp_directory``, ``threads``,
    ``reuse``)."""
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


# -- the parts, in a source checkout -------------------------------------------------------------
# NOTE: the repository keeps one top-level folder per part (recorder/, reconstruct/, queries/,
# dashboard/); installed, setuptools places them under this package (pyproject.toml,
# ``package-dir``), so ``kvclaims.recorder`` is the one name everywhere. In a source checkout
# this finder gives the same names from the checkout in hand (ahead of any installed copy).
PARTS: tuple[str, ...] = ("recorder", "reconstruct", "queries", "dashboard")


class _CheckoutParts(importlib.abc.MetaPathFinder):
    """Finds ``kvclaims.<part>`` in the source checkout's top-level folder of that name."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def find_spec(self, fullname: str, path: Any = None,
                  target: Any = None) -> importlib.machinery.ModuleSpec | None:
        head, _, part = fullname.partition(".")
        if head != __name__ or part not in PARTS:
            return None
        folder = self.root / part
        return importlib.util.spec_from_file_location(
            fullname, folder / "__init__.py", submodule_search_locations=[str(folder)])


def _install_checkout_finder() -> None:
    root = Path(__file__).resolve().parent.parent
    if not ((root / "pyproject.toml").is_file() and (root / "recorder" / "__init__.py").is_file()):
        return  # installed: the parts are real subpackages
    if not any(isinstance(f, _CheckoutParts) and f.root == root for f in sys.meta_path):
        sys.meta_path.insert(0, _CheckoutParts(root))


_install_checkout_finder()
