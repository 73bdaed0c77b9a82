"""The JSON Lines interchange encoding of traces: read, import into run dirs, export.

One JSON object per line, with the same field names as the Arrow columns (docs/design.md, "Event vocabulary"). On
export, keys follow the schema's column order and null fields are omitted; that is the
*canonical* form, and canonical input survives JSONL -> run dir -> JSONL byte for byte.

Every line is validated with ``kvclaims.contract.schema.check_event``; errors name ``FILE:LINE`` and the
field. ``seq`` must be strictly increasing per ``run_id``.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Final

import pyarrow as pa

from kvclaims.contract.batches import build_batch
from kvclaims.contract.schema import (ARROW_SCHEMA, COLUMNS, ENVELOPE, SCHEMA_VERSION, InputError,
                                      SchemaError, check_event, range_problem)
from kvclaims.contract.trace_writer import HASH_IMPORTED, RunWriter, open_regular

_FIELDS: Final[tuple[str, ...]] = tuple(c for c in COLUMNS if c not in ENVELOPE)
_BATCH_ROWS: Final[int] = 65536
# Run facts the manifest takes from a run_started event.
_RUN_FACTS: Final[tuple[str, ...]] = (
    "runtime", "runtime_version", "model", "block_size", "num_blocks", "usable_blocks", "policy",
    "recorder_version")


# -- parsing and validation -------------------------------------------------------------------

def _reject_constant(name: str) -> float:
    raise ValueError(f"non-finite number {name} is not JSON")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, val in pairs:
        if key in obj:
            raise ValueError(f"duplicate field '{key}'")
        obj[key] = val
    return obj


def parse_line(text: str, where: str) -> dict[str, Any]:
    """Parse one JSON Lines line into an event dict and validate it.

    ``where`` is the ``FILE:LINE`` prefix every error message starts with.
    """
    try:
        obj = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_reject_constant)
    except ValueError as exc:  # JSONDecodeError is a ValueError; so are our hooks' errors
        # NOTE: also Python's limit on integers of more than 4300 digits
        raise InputError(f"{where}: invalid JSON: {str(exc)[:200]}") from None
    except RecursionError:
        raise InputError(f"{where}: invalid JSON: nested too deeply") from None
    if not isinstance(obj, dict):
        raise SchemaError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    check_located(obj, where)
    return obj


def check_located(event: dict[str, Any], where: str) -> None:
    """``check_event`` with the location prefixed and the field named in every message."""
    try:
        check_event(event)
    except SchemaError as exc:
        msg = str(exc)
        if "field '" not in msg:  # e.g. "unknown event 'x'": say which field is wrong
            msg = f"field 'event': {msg}"
        raise SchemaError(f"{where}: {msg}") from None
    for key, val in event.items():
        problem = range_problem(key, val)
        if problem:  # NOTE: readers rely on these ranges (kvclaims.reconstruct.loader.VALUE_RANGES)
            raise SchemaError(f"{where}: {problem}")
    if event["event"] == "run_started":
        version = event.get("schema_version")
        if isinstance(version, int) and version > SCHEMA_VERSION:
            raise SchemaError(f"{where}: field 'schema_version' is {version}, newer than this "
                              f"kvclaims reads ({SCHEMA_VERSION}); upgrade kvclaims")


def iter_jsonl(path: str | Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield ``(FILE:LINE, event)`` for every non-blank line, each validated."""
    p = Path(path)
    try:
        fh = open(open_regular(p), encoding="utf-8")   # NOTE: a FIFO is refused, not waited on
    except OSError as exc:
        raise InputError(f"{p}: cannot open: {exc.strerror or exc}") from None
    with fh:
        lineno = 0
        try:
            for lineno, line in enumerate(fh, start=1):
                if line.strip():
                    where = f"{p}:{lineno}"
                    yield where, parse_line(line, where)
        except UnicodeDecodeError as exc:
            raise InputError(f"{p}:{lineno + 1}: not UTF-8 text: {exc.reason}") from None


def check_order(located: Iterable[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Check ``seq`` is strictly increasing per run_id; return the events in input order."""
    last: dict[str, tuple[int, str]] = {}
    events: list[dict[str, Any]] = []
    for where, ev in located:
        rid, seq = ev["run_id"], ev["seq"]
        prev = last.get(rid)
        if prev is not None and seq <= prev[0]:
            raise SchemaError(f"{where}: field 'seq' is {seq}, not greater than {prev[0]} "
                              f"(at {prev[1]}) for run_id {rid!r}")
        last[rid] = (seq, where)
        events.append(ev)
    return events


def events_to_table(events: Sequence[dict[str, Any]]) -> pa.Table:
    """Build an ``ARROW_SCHEMA`` table from validated event dicts (column-wise)."""
    batches = []
    for start in range(0, len(events), _BATCH_ROWS):
        chunk = events[start:start + _BATCH_ROWS]
        columns: dict[str, list[Any]] = {}
        n = len(chunk)
        for i, ev in enumerate(chunk):
            for key, val in ev.items():
                if key in ENVELOPE or val is None:
                    continue
                col = columns.get(key)
                if col is None:
                    col = columns[key] = [None] * n
                col[i] = val
        batches.append(build_batch([e["seq"] for e in chunk], [e["ts_ns"] for e in chunk],
                                   [e["event"] for e in chunk], [e["run_id"] for e in chunk],
                                   columns))
    return pa.Table.from_batches(batches, schema=ARROW_SCHEMA)


def read_jsonl(path: str | Path) -> pa.Table:
    """Read and validate a JSON Lines trace into an ``ARROW_SCHEMA`` table (input order)."""
    return events_to_table(check_order(iter_jsonl(path)))


# -- import -----------------------------------------------------------------------------------

def _safe_dirname(run_id: str) -> str:
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", run_id).strip(".") or "run"
    return name


def _run_info(run_id: str, events: Sequence[dict[str, Any]], source: str,
              extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Manifest run facts: from the run's run_started event when there is one."""
    info: dict[str, Any] = {"run_id": run_id}
    started = next((e for e in events if e["event"] == "run_started"), None)
    if started is not None:
        for key in _RUN_FACTS:
            if started.get(key) is not None and key != "recorder_version":
                info[key] = started[key]
        if started.get("recorder_version") is not None:
            info["source_recorder_version"] = started["recorder_version"]
    info["imported_from"] = source
    info["source_has_run_finished"] = any(e["event"] == "run_finished" for e in events)
    info.update(extra or {})
    return info


def _dropped(events: Sequence[dict[str, Any]]) -> int:
    """events_dropped for the manifest: run_finished's count, else the gaps' sum."""
    for ev in reversed(events):
        if ev["event"] == "run_finished" and ev.get("events_dropped") is not None:
            return int(ev["events_dropped"])
    return sum(int(e.get("events_dropped") or 0) for e in events if e["event"] == "recorder_gap")


def write_run(events: Sequence[dict[str, Any]], run_dir: str | Path, *, source: str,
              extra: dict[str, Any] | None = None) -> Path:
    """Write one run's validated events (all the same run_id, seq order) as a run directory.

    ``extra`` keys go into the manifest unchanged (e.g. an importer's summary).
    """
    run_id = events[0]["run_id"]
    # NOTE: an import keeps the file's hashes as they are and has no wall clock (clock: null)
    with RunWriter(run_dir, _run_info(run_id, events, source, extra),
                   hash_scheme=HASH_IMPORTED, clock=False) as writer:
        writer.set_counters(events_dropped=_dropped(events))
        for batch in events_to_table(events).to_batches(max_chunksize=_BATCH_ROWS):
            writer.write_batch(batch)
    return Path(run_dir)


def import_events(events: Sequence[dict[str, Any]], out_dir: str | Path, *,
                  source: str, extra: dict[str, Any] | None = None) -> list[Path]:
    """Write validated events as run directories.

    One run: ``out_dir`` is its run directory. Several runs: ``out_dir`` becomes a sweep
    directory with one sub-directory per run_id.
    """
    by_run: dict[str, list[dict[str, Any]]] = {}
    for ev in events:
        by_run.setdefault(ev["run_id"], []).append(ev)
    if not by_run:
        raise InputError(f"{source}: no events to import")
    out = Path(out_dir)
    if len(by_run) == 1:
        (only,) = by_run.values()
        return [write_run(only, out, source=source, extra=extra)]
    used: set[str] = set()
    dirs = []
    for rid in sorted(by_run):
        name = _safe_dirname(rid)
        while name in used:
            name += "_"
        used.add(name)
        dirs.append(write_run(by_run[rid], out / name, source=source, extra=extra))
    return dirs


def validate_events(events: Iterable[Any], source: str) -> list[dict[str, Any]]:
    """Validate event dicts from another converter (no line numbers: ``SOURCE: event #N``)."""
    located = []
    for i, ev in enumerate(events, start=1):
        where = f"{source}: event #{i}"
        if not isinstance(ev, dict):
            raise SchemaError(f"{where}: expected an event object, got {type(ev).__name__}")
        check_located(ev, where)
        located.append((where, ev))
    return check_order(located)


def import_jsonl(path: str | Path, out_dir: str | Path) -> list[Path]:
    """Validate a JSON Lines trace and write it as run directories (see ``import_events``)."""
    events = check_order(iter_jsonl(path))
    return import_events(events, out_dir, source=Path(path).name)


# -- export -----------------------------------------------------------------------------------

def event_to_json(row: dict[str, Any]) -> str:
    """The canonical JSON line of one event: schema column order, nulls omitted."""
    obj = {k: row[k] for k in COLUMNS if row.get(k) is not None}
    for key in ("ttl_s", "value"):  # NOTE: floats: JSON has no NaN/Infinity
        val = obj.get(key)
        if isinstance(val, float) and not math.isfinite(val):
            raise InputError(f"event seq {row.get('seq')}: field '{key}' is {val}, not JSON")
    return json.dumps(obj, ensure_ascii=False)


def write_jsonl(batches: Iterable[pa.RecordBatch], out: IO[str]) -> int:
    """Write batches as canonical JSON lines; return the number of events."""
    count = 0
    for batch in batches:
        for row in batch.to_pylist():
            out.write(event_to_json(row))
            out.write("\n")
            count += 1
    return count


@contextmanager
def open_out(out: str | Path | IO[str]) -> Iterator[IO[str]]:
    """A text stream for ``out``: '-' is stdout; a path is written atomically (tmp + rename)."""
    if not isinstance(out, (str, Path)):
        yield out
        return
    if str(out) == "-":
        yield sys.stdout
        return
    path = Path(out)
    tmp = path.with_name(path.name + ".tmp")
    try:
        fh = open(tmp, "w", encoding="utf-8", newline="\n")
    except OSError as exc:
        raise InputError(f"{path}: cannot write: {exc.strerror or exc}") from None
    try:
        with fh:
            yield fh
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
