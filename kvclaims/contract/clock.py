"""A run's wall-clock anchor, read from its manifest (docs/trace-format.md "clock").

The recorder writes ``manifest["clock"]`` (``trace_writer.clock_anchor``); every reader turns
engine-monotonic ``ts_ns`` into UTC through ``clock_anchor`` here, so all pages tell one time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import pyarrow as pa


@dataclass(frozen=True)
class Clock:
    """A run's wall-clock anchor: ``utc`` is the moment the monotonic clock read ``ts_ns``."""

    utc: datetime
    ts_ns: int
    host: str | None = None


def clock_anchor(manifest: dict[str, Any]) -> Clock | None:
    """The manifest's wall-clock anchor, or None ("no clock": imports, older traces).

    Reads the recorder's ``manifest["clock"] = {"utc": ISO-8601, "utc_ns": int,
    "monotonic_ns": int, "host": str}`` (``utc_ns`` wins over ``utc`` when both are there;
    also accepted: ``ts_ns``/``start_ts_ns``/``anchor_ts_ns`` for the monotonic reading).
    """
    c = manifest.get("clock")
    if not isinstance(c, dict):
        return None
    ts = _first(c, ("monotonic_ns", "ts_ns", "start_ts_ns", "anchor_ts_ns"))
    if not isinstance(ts, int) or isinstance(ts, bool):
        return None
    when: datetime | None = None
    utc_ns = c.get("utc_ns")
    if isinstance(utc_ns, int) and not isinstance(utc_ns, bool):
        try:
            when = datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(
                microseconds=utc_ns // 1000)
        except (OverflowError, OSError, ValueError):
            when = None
    if when is None and isinstance(c.get("utc"), str):
        try:
            when = datetime.fromisoformat(c["utc"].replace("Z", "+00:00"))
        except ValueError:
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=timezone.utc)
    if when is None:
        return None
    host = _first(c, ("host", "hostname"))
    return Clock(when.astimezone(timezone.utc), ts, host if isinstance(host, str) else None)


def _first(d: dict[str, Any], keys: Sequence[str]) -> Any:
    for k in keys:
        if k in d:
            return d[k]
    return None


def clock_table(manifests: dict[str, dict[str, Any]]) -> pa.Table:
    """One row per run: its wall-clock anchor (``utc``, ``ts_ns``, ``host``), nulls without one
    (the ``kv_clock`` table the views convert seq times with)."""
    rows = []
    for rid, m in sorted(manifests.items()):
        c = clock_anchor(m)
        rows.append({"run_id": rid,
                     "utc": None if c is None else c.utc.replace(tzinfo=None),
                     "ts_ns": None if c is None else c.ts_ns,
                     "host": None if c is None else c.host})
    return pa.Table.from_pylist(rows, schema=pa.schema([
        ("run_id", pa.string()), ("utc", pa.timestamp("us")), ("ts_ns", pa.int64()),
        ("host", pa.string())]))
