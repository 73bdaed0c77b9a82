"""The run directory writer: Arrow IPC stream segments plus an atomically replaced manifest.

A run directory holds ``manifest.json`` and ``events-000000.arrows``, ``events-000001.arrows``,
… (see docs/trace-format.md). Each segment is an Arrow IPC *stream* (not the random-access file
format) so that a crash leaves a readable prefix: every complete record batch before the cut can
be recovered by ``reconstruct.loader``.

NOTE: invariants this module keeps
- segments are numbered densely from 0 and never rewritten once rotated;
- events inside and across segments are in the order they were handed in (the buffer hands them
  in ``seq`` order);
- ``manifest.json`` always exists from the moment the writer opens (a crashed run still has
  one) and is replaced atomically (tmp + ``os.replace``), so a reader never sees half of it;
- ``complete`` is true only after ``close()``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import pyarrow as pa

from recorder.schema import (ARROW_SCHEMA, RECORDER_VERSION, SCHEMA_VERSION, InputError,
                             SchemaError)

MANIFEST_NAME: Final[str] = "manifest.json"
SEGMENT_PREFIX: Final[str] = "events-"
SEGMENT_SUFFIX: Final[str] = ".arrows"
MiB: Final[int] = 1024 * 1024

# Run facts every manifest carries, in this order (None when unknown). Extra keys a caller passes
# in run_info (enforcement, hardware, scenario, ...) follow them unchanged.
RUN_FACTS: Final[tuple[str, ...]] = (
    "run_id", "runtime", "runtime_version", "model", "block_size", "num_blocks",
    "usable_blocks", "policy")

# Keys the writer owns: a caller may not set them through run_info.
_WRITER_KEYS: Final[frozenset[str]] = frozenset({
    "schema_version", "recorder_version", "segments", "events_written", "events_dropped",
    "recorder_errors", "complete"})


def segment_name(index: int) -> str:
    """File name of segment number ``index`` (``events-000000.arrows``)."""
    return f"{SEGMENT_PREFIX}{index:06d}{SEGMENT_SUFFIX}"


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write ``obj`` as JSON to ``path`` so that readers see either the old or the new file.

    NOTE: tmp + fsync + ``os.replace``: a crash mid-write leaves the previous manifest intact.
    """
    tmp = path.with_name(path.name + ".tmp")
    data = json.dumps(obj, indent=2, ensure_ascii=False) + "\n"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


class _Segment:
    """One open IPC stream segment and its running statistics."""

    def __init__(self, path: Path, options: pa.ipc.IpcWriteOptions) -> None:
        self.path = path
        # NOTE: OSFile is unbuffered: every batch reaches the OS as soon as it is written, so a
        # crash of the engine process loses nothing already handed to the writer.
        self.sink = pa.OSFile(str(path), "wb")
        self.writer = pa.ipc.new_stream(self.sink, ARROW_SCHEMA, options=options)
        self.opened_at = time.monotonic()
        self.events = 0
        self.first_seq: int | None = None
        self.last_seq: int | None = None

    def write(self, batch: pa.RecordBatch) -> None:
        self.writer.write_batch(batch)
        n = batch.num_rows
        if n:
            seqs = batch.column(1)  # NOTE: "seq" is column 1 of ARROW_SCHEMA
            if self.first_seq is None:
                self.first_seq = seqs[0].as_py()
            self.last_seq = seqs[n - 1].as_py()
            self.events += n

    @property
    def bytes(self) -> int:
        return self.sink.tell()

    def close(self) -> dict[str, Any]:
        """Write the end-of-stream marker, close the file and return its manifest entry."""
        self.writer.close()
        size = self.sink.tell()
        self.sink.close()
        return {"file": self.path.name, "events": self.events, "bytes": size,
                "first_seq": self.first_seq, "last_seq": self.last_seq}


class RunWriter:
    """Write one run's events as rotated Arrow IPC stream segments plus ``manifest.json``.

    ``run_info`` holds the run facts (``run_id`` is required; ``runtime``, ``runtime_version``,
    ``model``, ``block_size``, ``num_blocks``, ``usable_blocks``, ``policy`` default to None)
    and any extra JSON-serialisable keys, which the manifest carries unchanged.

    Not thread-safe: one caller (the ``EventBuffer``'s writer thread, or an importer) at a time.
    """

    def __init__(self, run_dir: str | Path, run_info: Mapping[str, Any], *,
                 rotate_bytes: int = 8 * MiB, rotate_seconds: float = 60.0,
                 compression: str | None = "zstd") -> None:
        self.run_dir = Path(run_dir)
        # NOTE: most of the 40 columns are null for any one event; uncompressed they still
        # cost their full width on disk. IPC buffer compression makes them nearly free, and
        # pyarrow compresses without holding the GIL.
        self._ipc_options = pa.ipc.IpcWriteOptions(compression=compression)
        self.rotate_bytes = int(rotate_bytes)
        self.rotate_seconds = float(rotate_seconds)
        self._manifest = _initial_manifest(run_info)
        self._segments: list[dict[str, Any]] = []
        self._current: _Segment | None = None
        self._closed = False
        _prepare_run_dir(self.run_dir)
        self._write_manifest()  # at open: a run that crashes still has a manifest

    # -- public API --------------------------------------------------------------------------
    @property
    def run_id(self) -> str:
        """The run's id (from ``run_info``)."""
        return self._manifest["run_id"]

    @property
    def run_info(self) -> dict[str, Any]:
        """The run facts and extra keys as given (a copy)."""
        return {k: v for k, v in self._manifest.items() if k not in _WRITER_KEYS}

    @property
    def events_written(self) -> int:
        """Events handed to segments so far (closed and open)."""
        return self._manifest["events_written"]

    @property
    def closed(self) -> bool:
        """True after ``close()``."""
        return self._closed

    def manifest(self) -> dict[str, Any]:
        """The manifest as it would be written now (a deep copy, including the open segment)."""
        return json.loads(json.dumps(self._manifest_now()))

    def set_counters(self, *, events_dropped: int | None = None,
                     recorder_errors: int | None = None) -> None:
        """Record the producer's loss counters; they reach disk with the next manifest write."""
        if events_dropped is not None:
            self._manifest["events_dropped"] = int(events_dropped)
        if recorder_errors is not None:
            self._manifest["recorder_errors"] = int(recorder_errors)

    def set_extra(self, key: str, value: Any) -> None:
        """Set one extra manifest key (e.g. error samples); writer-owned keys are refused."""
        if key in _WRITER_KEYS or key in RUN_FACTS:
            raise InputError(f"manifest key '{key}' is owned by the writer")
        json.dumps(value)  # refuse what could not be written later
        self._manifest[key] = value

    def write_batch(self, batch: pa.RecordBatch) -> None:
        """Append one batch (schema ``ARROW_SCHEMA``) to the current segment, rotating after it.

        Each batch may carry its own dictionaries: the IPC stream format writes a replacement
        dictionary when they change, and readers decode each batch with its own.
        """
        if self._closed:
            raise InputError(f"{self.run_dir}: writer is closed")
        if not batch.schema.equals(ARROW_SCHEMA, check_metadata=False):
            raise SchemaError(f"{self.run_dir}: batch schema differs from ARROW_SCHEMA")
        if batch.num_rows == 0:
            return
        if self._current is None:
            self._current = _Segment(self.run_dir / segment_name(len(self._segments)),
                                     self._ipc_options)
        self._current.write(batch)
        self._manifest["events_written"] += batch.num_rows
        if self._should_rotate(self._current):
            self.rotate()

    def maybe_rotate(self) -> None:
        """Rotate if the open segment is due by size or age (called on idle ticks, so a quiet
        run still closes segments every ``rotate_seconds``)."""
        if self._current is not None and self._should_rotate(self._current):
            self.rotate()

    def rotate(self) -> None:
        """Close the current segment (if any) and write the manifest; the next batch opens a
        new segment."""
        if self._current is None:
            return
        entry = self._current.close()
        self._current = None
        self._segments.append(entry)
        self._write_manifest()

    def close(self) -> None:
        """Close the last segment and write the final manifest with ``complete: true``.

        Idempotent.
        """
        if self._closed:
            return
        if self._current is not None:
            self._segments.append(self._current.close())
            self._current = None
        self._closed = True
        self._manifest["complete"] = True
        self._write_manifest()

    def __enter__(self) -> RunWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ---------------------------------------------------------------------------
    def _should_rotate(self, seg: _Segment) -> bool:
        return (seg.bytes >= self.rotate_bytes
                or time.monotonic() - seg.opened_at >= self.rotate_seconds)

    def _manifest_now(self) -> dict[str, Any]:
        segments = list(self._segments)
        if self._current is not None:
            cur = self._current
            segments.append({"file": cur.path.name, "events": cur.events, "bytes": cur.bytes,
                             "first_seq": cur.first_seq, "last_seq": cur.last_seq})
        return {**self._manifest, "segments": segments}

    def _write_manifest(self) -> None:
        # NOTE: only closed segments are listed; an open segment is found on disk by the loader
        # (it is the one a crash may have truncated).
        write_json_atomic(self.run_dir / MANIFEST_NAME,
                          {**self._manifest, "segments": list(self._segments)})


def _initial_manifest(run_info: Mapping[str, Any]) -> dict[str, Any]:
    """Build the manifest dict: writer keys and run facts in a fixed order, extras after."""
    run_id = run_info.get("run_id")
    if not isinstance(run_id, str) or not run_id:
        raise InputError("run_info needs a non-empty string 'run_id'")
    owned = sorted(set(run_info) & _WRITER_KEYS)
    if owned:
        raise InputError(f"run_info may not set writer-owned manifest keys: {owned}")
    manifest: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "recorder_version": RECORDER_VERSION,
    }
    for key in RUN_FACTS:
        manifest[key] = run_info.get(key)
    manifest.update({"segments": [], "events_written": 0, "events_dropped": 0,
                     "recorder_errors": 0, "complete": False})
    for key, val in run_info.items():
        if key not in RUN_FACTS:
            manifest[key] = val
    try:
        json.dumps(manifest)
    except (TypeError, ValueError) as exc:
        raise InputError(f"run_info is not JSON-serialisable: {exc}") from exc
    return manifest


def _prepare_run_dir(run_dir: Path) -> None:
    """Create ``run_dir``; refuse one that already holds a run (never overwrite a trace)."""
    if run_dir.exists() and not run_dir.is_dir():
        raise InputError(f"{run_dir}: exists and is not a directory")
    run_dir.mkdir(parents=True, exist_ok=True)
    if (run_dir / MANIFEST_NAME).exists() or any(run_dir.glob(f"{SEGMENT_PREFIX}*{SEGMENT_SUFFIX}")):
        raise InputError(f"{run_dir}: already holds a run (manifest.json or segments); "
                         "choose a new directory")
