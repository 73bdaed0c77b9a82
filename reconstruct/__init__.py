"""kvclaims reconstruct: offline replay of traces into labelled losses and outcomes.

Consumers open an audit with ``kvclaims.open(paths)`` (kvclaims/audit.py: streamed, bounded
memory); ``reconstruct.reconstruct(events_table) -> Tables`` is the in-memory core that tests
use. The rules are in docs/reconstruction.md. Imported lazily so that ``kvclaims.reconstruct.loader`` users do not pay for
DuckDB.
"""

from __future__ import annotations

from typing import Any
from kvclaims.reconstruct import core

__all__ = ["reconstruct", "Tables", "TABLE_NAMES", "load_jsonl"]


def __getattr__(name: str) -> Any:
    if name in __all__:

        return getattr(core, name)
    raise AttributeError(name)
