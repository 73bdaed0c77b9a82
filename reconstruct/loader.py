"""Load run directories (Arrow IPC stream segments + manifest) into one events table.

``load_runs(paths)`` is what every offline tool starts from. It accepts run directories and
sweep directories (any folder containing run directories, at any depth), checks everything it
reads, and either returns a ``Trace`` or raises ``TraceError`` with a message that names the
offending file: never a traceback, never silently less data.

Rules (docs/trace-format.md, "Reading"):
- a run's LAST segment may be truncated (the recorder crashed or was killed mid-write): every
  complete record batch is kept and the truncation is reported in ``Trace.truncations`` and
  ``Trace.truncated_runs``;
- a truncated segment that is not the last, a file that is not an Arrow IPC stream, a missing
  manifest, a manifest from a newer schema version, segment files that disagree with the
  manifest, or a path that is not a run directory -> ``TraceError``.

For traces too large to hold in memory, ``iter_batches(paths)`` / ``batch_reader(paths)`` yield
the same decoded, checked batches one at a time.
"""

from __future__ import annotations

import json
import os
import re
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc

from recorder.schema import ARROW_SCHEMA, COLUMNS, ENVELOPE, SCHEMA_VERSION, InputError
from recorder.trace_writer import MANIFEST_NAME, SEGMENT_PREFIX, SEGMENT_SUFFIX

_SEGMENT_RE: Final = re.compile(
    re.escape(SEGMENT_PREFIX) + r"(\d{6})" + re.escape(SEGMENT_SUFFIX) + r"\Z")
_CONTINUATION: Final[bytes] = b"\xff\xff\xff\xff"
_MAX_METADATA: Final[int] = 64 * 1024 * 1024   # a larger flatbuffer header is garbage
_MAX_BODY: Final[int] = 1 << 40


class TraceError(InputError):
    """A trace that cannot be read as recorded; the message names the file."""


def _decoded_type(typ: pa.DataType) -> pa.DataType:
    return typ.value_type if pa.types.is_dictionary(typ) else typ


# The schema of loaded events: ARROW_SCHEMA with dictionary strings decoded to plain strings,
# so joins in DuckDB/Polars need no casts.
EVENTS_SCHEMA: Final[pa.Schema] = pa.schema(
    [pa.field(f.name, _decoded_type(f.type), nullable=f.nullable) for f in ARROW_SCHEMA],
    metadata=ARROW_SCHEMA.metadata)


# -- IPC framing ------------------------------------------------------------------------------

@dataclass(frozen=True)
class StreamScan:
    """What the byte-level walk of one IPC stream found."""

    complete_end: int   # bytes worth decoding: up to the end of the last complete record batch
    batches: int        # complete record batches within complete_end
    eos: bool           # ends with the end-of-stream marker
    cut: bool           # ends inside a message (truncated mid-write)

    @property
    def truncated(self) -> bool:
        """Not closed properly: cut mid-message, or no end-of-stream marker."""
        return self.cut or not self.eos


_HEADER_RECORD_BATCH: Final[int] = 3  # MessageHeader union: 1 Schema, 2 Dictionary, 3 Batch


def _message_header(meta: bytes) -> tuple[int, int]:
    """Read ``(header_type, bodyLength)`` from an IPC message's flatbuffer ``Message`` table.

    Fields: 0 version (short), 1 header_type (ubyte), 2 header (offset), 3 bodyLength (long).
    """
    table = struct.unpack_from("<I", meta, 0)[0]
    vtable = table - struct.unpack_from("<i", meta, table)[0]
    vt_size = struct.unpack_from("<H", meta, vtable)[0]

    def field_offset(index: int) -> int:
        slot = 4 + 2 * index
        return struct.unpack_from("<H", meta, vtable + slot)[0] if slot + 2 <= vt_size else 0

    off_type, off_body = field_offset(1), field_offset(3)
    header_type = struct.unpack_from("<B", meta, table + off_type)[0] if off_type else 0
    body = struct.unpack_from("<q", meta, table + off_body)[0] if off_body else 0
    return header_type, body


def scan_stream(data: bytes | memoryview, name: str) -> StreamScan:
    """Walk the message framing of an Arrow IPC stream without decoding it.

    Distinguishes a stream cut short (a valid prefix: every length it declares runs past the
    end) from garbage (bad marker, impossible lengths), which raises ``TraceError``.

    NOTE: a writer emits a batch's dictionaries as separate messages just before it, so a cut
    stream is only decodable up to the end of its last complete *record batch*: dictionaries
    after it belong to a batch that never made it.
    """
    size = len(data)
    pos = batches = 0
    usable = 0  # end of the schema message, then of each record batch

    def result(eos: bool, cut: bool) -> StreamScan:
        end = pos if (eos and not cut) else usable
        return StreamScan(end, batches, eos=eos, cut=cut)

    while True:
        left = size - pos
        if left == 0:
            return result(eos=False, cut=False)
        head = bytes(data[pos:pos + 8])
        if left < 4:
            if _CONTINUATION.startswith(head):
                return result(eos=False, cut=True)
            raise TraceError(f"{name}: not an Arrow IPC stream (bad message marker at byte {pos})")
        if head[:4] != _CONTINUATION:
            if head[:4] == b"\x00\x00\x00\x00" and left == 4:  # legacy end-of-stream
                pos += 4
                return result(eos=True, cut=False)
            raise TraceError(f"{name}: not an Arrow IPC stream (bad message marker at byte {pos})")
        if left < 8:
            return result(eos=False, cut=True)
        meta_len = struct.unpack_from("<i", head, 4)[0]
        if meta_len == 0:
            if left != 8:
                raise TraceError(f"{name}: {left - 8} bytes of garbage after end of stream")
            pos += 8
            return result(eos=True, cut=False)
        if meta_len < 0 or meta_len % 8 or meta_len > _MAX_METADATA:
            raise TraceError(f"{name}: corrupt IPC message header at byte {pos}")
        if left < 8 + meta_len:
            return result(eos=False, cut=True)
        try:
            kind, body = _message_header(bytes(data[pos + 8:pos + 8 + meta_len]))
        except struct.error:
            raise TraceError(f"{name}: corrupt IPC message header at byte {pos}") from None
        if body < 0 or body > _MAX_BODY or not 1 <= kind <= 5:
            raise TraceError(f"{name}: corrupt IPC message header at byte {pos}")
        if left < 8 + meta_len + body:
            return result(eos=False, cut=True)
        pos += 8 + meta_len + body
        if kind == _HEADER_RECORD_BATCH:
            batches += 1
            usable = pos
        elif usable == 0:
            usable = pos  # the schema message


# -- run directories --------------------------------------------------------------------------

@dataclass
class RunDir:
    """One run directory: its checked manifest and its segment files in order."""

    path: Path
    manifest: dict[str, Any]
    segments: list[Path]

    @property
    def run_id(self) -> str:
        """The run id from the manifest."""
        return self.manifest["run_id"]


def is_run_dir(path: Path) -> bool:
    """A directory holding ``manifest.json`` or at least one segment file."""
    if (path / MANIFEST_NAME).is_file():
        return True
    return any(_SEGMENT_RE.match(p.name) for p in path.iterdir() if p.is_file())


def find_run_dirs(path: str | Path) -> list[Path]:
    """The run directories a path names: itself, or every run directory below it (a sweep)."""
    p = Path(path)
    if not p.exists():
        raise TraceError(f"{p}: no such file or directory")
    if not p.is_dir():
        hint = " (a JSON Lines trace: use 'kvclaims import' first)" if p.suffix == ".jsonl" else ""
        raise TraceError(f"{p}: is a file, not a run directory{hint}")
    if is_run_dir(p):
        return [p]
    found: list[Path] = []
    for root, dirs, _files in os.walk(p):
        dirs.sort()
        here = Path(root)
        if here != p and is_run_dir(here):
            found.append(here)
            dirs.clear()  # NOTE: a run directory never nests another run
    if not found:
        raise TraceError(f"{p}: not a run directory (no {MANIFEST_NAME} or "
                         f"{SEGMENT_PREFIX}*{SEGMENT_SUFFIX}) and contains none")
    return found


def read_manifest(run_dir: str | Path) -> dict[str, Any]:
    """Read and check ``manifest.json`` of a run directory."""
    path = Path(run_dir) / MANIFEST_NAME
    if not path.is_file():
        raise TraceError(f"{path}: missing manifest (every run directory has one)")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TraceError(f"{path}: unreadable manifest: {exc}") from None
    if not isinstance(manifest, dict):
        raise TraceError(f"{path}: manifest must be a JSON object")
    version = manifest.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise TraceError(f"{path}: manifest field 'schema_version' missing or not an integer")
    if version > SCHEMA_VERSION:
        raise TraceError(f"{path}: schema_version {version} is newer than this kvclaims reads "
                         f"({SCHEMA_VERSION}); upgrade kvclaims")
    if not isinstance(manifest.get("run_id"), str) or not manifest["run_id"]:
        raise TraceError(f"{path}: manifest field 'run_id' missing or not a string")
    segments = manifest.get("segments")
    if not isinstance(segments, list) or not all(
            isinstance(s, dict) and isinstance(s.get("file"), str) for s in segments):
        raise TraceError(f"{path}: manifest field 'segments' must be a list of {{file, ...}}")
    if not isinstance(manifest.get("complete"), bool):
        raise TraceError(f"{path}: manifest field 'complete' missing or not a boolean")
    return manifest


def open_run(run_dir: str | Path) -> RunDir:
    """Check a run directory's manifest against the segment files on disk."""
    path = Path(run_dir)
    manifest = read_manifest(path)
    on_disk: dict[int, Path] = {}
    for p in path.iterdir():
        m = _SEGMENT_RE.match(p.name)
        if m:
            on_disk[int(m.group(1))] = p
    segments = [on_disk[i] for i in sorted(on_disk)]
    for i, seg in enumerate(segments):
        if _SEGMENT_RE.match(seg.name).group(1) != f"{i:06d}":  # type: ignore[union-attr]
            missing = path / f"{SEGMENT_PREFIX}{i:06d}{SEGMENT_SUFFIX}"
            raise TraceError(f"{missing}: segment missing (later segments exist)")
    listed = [s["file"] for s in manifest["segments"]]
    names = [s.name for s in segments]
    for i, name in enumerate(listed):
        if i >= len(names) or names[i] != name:
            raise TraceError(f"{path / name}: listed in the manifest but missing")
    if manifest["complete"] and len(names) > len(listed):
        raise TraceError(f"{path / names[len(listed)]}: not listed in the manifest of a "
                         "complete run")
    return RunDir(path, manifest, segments)


def open_runs(paths: Sequence[str | Path]) -> list[RunDir]:
    """Find and check every run the paths name, ordered by run_id; run ids must be unique."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    runs: dict[str, RunDir] = {}
    for p in paths:
        for run_dir in find_run_dirs(p):
            run = open_run(run_dir)
            other = runs.get(run.run_id)
            if other is not None:
                if other.path.resolve() == run.path.resolve():
                    continue  # the same directory named twice
                raise TraceError(f"{run.path / MANIFEST_NAME}: run_id {run.run_id!r} also in "
                                 f"{other.path / MANIFEST_NAME}")
            runs[run.run_id] = run
    return [runs[k] for k in sorted(runs)]


# -- segments ---------------------------------------------------------------------------------

def _check_schema(schema: pa.Schema, name: str) -> None:
    meta = schema.metadata or {}
    raw = meta.get(b"kvclaims.schema_version")
    if raw is not None:
        try:
            version = int(raw)
        except ValueError:
            raise TraceError(f"{name}: bad kvclaims.schema_version {raw!r}") from None
        if version > SCHEMA_VERSION:
            raise TraceError(f"{name}: schema_version {version} is newer than this kvclaims "
                             f"reads ({SCHEMA_VERSION}); upgrade kvclaims")
    for f in schema:
        if f.name not in COLUMNS:
            raise TraceError(f"{name}: unknown column '{f.name}'")
        if _decoded_type(f.type) != EVENTS_SCHEMA.field(f.name).type:
            raise TraceError(f"{name}: column '{f.name}' has type {f.type}, expected "
                             f"{COLUMNS[f.name]}")
    for col in ENVELOPE:
        if schema.get_field_index(col) < 0:
            raise TraceError(f"{name}: missing column '{col}'")


def decode_batch(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Decode dictionary columns and add columns an older schema lacked (as nulls)."""
    arrays = []
    for f in EVENTS_SCHEMA:
        idx = batch.schema.get_field_index(f.name)
        if idx < 0:
            arrays.append(pa.nulls(batch.num_rows, f.type))
            continue
        col = batch.column(idx)
        arrays.append(col.dictionary_decode() if pa.types.is_dictionary(col.type) else col)
    return pa.RecordBatch.from_arrays(arrays, schema=EVENTS_SCHEMA)


def read_segment(path: Path, *, allow_truncated: bool,
                 report: Callable[[str], None]) -> Iterator[pa.RecordBatch]:
    """Yield the decoded batches of one segment.

    A truncated segment is an error unless ``allow_truncated`` (the run's last segment); then
    its complete batches are yielded and ``report`` gets one human message.
    """
    name = str(path)
    try:
        source = pa.memory_map(name, "r")
        buf = source.read_buffer()
    except (OSError, pa.ArrowException) as exc:
        raise TraceError(f"{name}: cannot read: {exc}") from None
    scan = scan_stream(memoryview(buf), name)
    if scan.truncated and not allow_truncated:
        how = "cut mid-write" if scan.cut else "has no end-of-stream marker"
        raise TraceError(f"{name}: segment {how}, but it is not the run's last segment "
                         "(corrupt trace)")
    kept = 0
    if scan.complete_end:
        try:
            reader = pa.ipc.open_stream(buf.slice(0, scan.complete_end))
            _check_schema(reader.schema, name)
            for batch in reader:
                # NOTE: full validation turns corrupt offsets/indices into an error instead of
                # out-of-bounds reads later (DuckDB, Polars)
                batch.validate(full=True)
                yield decode_batch(batch)
                kept += 1
        except TraceError:
            raise
        except (pa.ArrowException, OSError, ValueError) as exc:
            # NOTE: pyarrow reports a bad flatbuffer as OSError, bad data as ArrowInvalid
            raise TraceError(f"{name}: corrupt Arrow IPC stream: {exc}") from None
    if scan.truncated:
        if len(buf) == 0:
            how = "empty file"
        elif scan.cut:
            how = f"cut mid-write at byte {scan.complete_end} of {len(buf)}"
        else:
            how = "no end-of-stream marker, the writer did not close it"
        report(f"{name}: truncated segment ({how}); kept {kept} complete batches")


def _check_batch(batch: pa.RecordBatch, run_id: str, prev_seq: int | None, name: str) -> int | None:
    """Check envelope, run id and seq order; return the batch's last seq."""
    if batch.num_rows == 0:
        return prev_seq
    for col in ENVELOPE:
        if batch.column(col).null_count:
            raise TraceError(f"{name}: null values in required column '{col}'")
    if not pc.all(pc.equal(batch.column("run_id"), run_id)).as_py():
        raise TraceError(f"{name}: events with a run_id other than the manifest's {run_id!r}")
    seq = batch.column("seq")
    if batch.num_rows > 1 and not pc.all(pc.greater(seq.slice(1), seq.slice(0, len(seq) - 1))).as_py():
        raise TraceError(f"{name}: seq is not strictly increasing")
    first = seq[0].as_py()
    if prev_seq is not None and first <= prev_seq:
        raise TraceError(f"{name}: seq {first} does not follow {prev_seq} of the previous batch")
    return seq[len(seq) - 1].as_py()


def read_run(run: RunDir, report: Callable[[str], None]) -> Iterator[pa.RecordBatch]:
    """Yield a run's decoded, checked batches in seq order."""
    prev: int | None = None
    listed = run.manifest["segments"]
    last = len(run.segments) - 1
    for i, seg in enumerate(run.segments):
        rows = 0
        truncated: list[str] = []

        def note(msg: str) -> None:
            truncated.append(msg)
            report(msg)

        for batch in read_segment(seg, allow_truncated=(i == last), report=note):
            prev = _check_batch(batch, run.run_id, prev, str(seg))
            rows += batch.num_rows
            yield batch
        expected = listed[i].get("events") if i < len(listed) else None
        if not truncated and isinstance(expected, int) and expected != rows:
            raise TraceError(f"{seg}: holds {rows} events, the manifest says {expected}")


def iter_batches(paths: Sequence[str | Path], *,
                 truncations: list[str] | None = None) -> Iterator[pa.RecordBatch]:
    """Stream the decoded batches of every run the paths name (by run_id, then seq).

    Every run is found and its manifest checked before the first batch is yielded; segment
    errors raise ``TraceError`` when reached. Truncation messages are appended to
    ``truncations`` if given.
    """
    runs = open_runs(paths)
    sink = truncations.append if truncations is not None else (lambda _msg: None)
    for run in runs:
        yield from read_run(run, sink)


def batch_reader(paths: Sequence[str | Path], *,
                 truncations: list[str] | None = None) -> pa.RecordBatchReader:
    """``iter_batches`` as a ``pa.RecordBatchReader`` (DuckDB can scan it once, streaming)."""
    return pa.RecordBatchReader.from_batches(EVENTS_SCHEMA,
                                             iter_batches(paths, truncations=truncations))


# -- the loaded trace -------------------------------------------------------------------------

@dataclass
class Trace:
    """Every event of the loaded runs plus what is known about each run."""

    events: pa.Table
    manifests: dict[str, dict[str, Any]]
    run_dirs: dict[str, Path] = field(default_factory=dict)
    truncations: list[str] = field(default_factory=list)
    truncated_runs: set[str] = field(default_factory=set)

    @property
    def incomplete_runs(self) -> set[str]:
        """Runs whose manifest is not ``complete`` (crashed, killed, or still recording)."""
        return {rid for rid, m in self.manifests.items() if not m.get("complete")}

    def manifests_table(self) -> pa.Table:
        """One row per run: the manifest's main facts plus its full JSON."""
        rows = []
        for rid, m in self.manifests.items():
            rows.append({
                "run_id": rid, "complete": bool(m.get("complete")),
                "truncated": rid in self.truncated_runs,
                **{k: _fact(m.get(k), typ) for k, typ in _MANIFEST_COLUMNS},
                "segments": len(m.get("segments", [])),
                "run_dir": str(self.run_dirs.get(rid, "")),
                "manifest_json": json.dumps(m, sort_keys=True),
            })
        return pa.Table.from_pylist(rows, schema=_MANIFESTS_SCHEMA)

    def connect(self, con: Any = None) -> Any:
        """Register ``events`` and ``manifests`` on a DuckDB connection (a new one if None)."""
        import duckdb  # NOTE: imported lazily: the recorder side never needs DuckDB

        con = duckdb.connect() if con is None else con
        con.register("events", self.events)
        con.register("manifests", self.manifests_table())
        return con

    def to_polars(self) -> Any:
        """The events as a Polars DataFrame."""
        import polars as pl

        return pl.from_arrow(self.events)


_MANIFEST_COLUMNS: Final[tuple[tuple[str, pa.DataType], ...]] = (
    ("schema_version", pa.int32()), ("recorder_version", pa.string()),
    ("runtime", pa.string()), ("runtime_version", pa.string()), ("model", pa.string()),
    ("block_size", pa.int32()), ("num_blocks", pa.int32()), ("usable_blocks", pa.int32()),
    ("policy", pa.string()), ("events_written", pa.int64()), ("events_dropped", pa.int64()),
    ("recorder_errors", pa.int64()))
_MANIFESTS_SCHEMA: Final[pa.Schema] = pa.schema(
    [("run_id", pa.string()), ("complete", pa.bool_()), ("truncated", pa.bool_())]
    + list(_MANIFEST_COLUMNS)
    + [("segments", pa.int32()), ("run_dir", pa.string()), ("manifest_json", pa.string())])


def _fact(value: Any, typ: pa.DataType) -> Any:
    """A manifest value if it fits its column, else None (the full JSON is kept beside it)."""
    if pa.types.is_integer(typ):
        return value if isinstance(value, int) and not isinstance(value, bool) else None
    return value if isinstance(value, str) else None


def load_runs(paths: Sequence[str | Path]) -> Trace:
    """Load every run the paths name (run dirs or sweep dirs) into one ``Trace``.

    Raises ``TraceError`` (naming the file) for anything that cannot be read as recorded.
    """
    runs = open_runs(paths)
    trace = Trace(events=EVENTS_SCHEMA.empty_table(), manifests={})
    batches: list[pa.RecordBatch] = []
    for run in runs:
        trace.manifests[run.run_id] = run.manifest
        trace.run_dirs[run.run_id] = run.path

        def note(msg: str, rid: str = run.run_id) -> None:
            trace.truncations.append(msg)
            trace.truncated_runs.add(rid)

        batches.extend(read_run(run, note))
    trace.events = pa.Table.from_batches(batches, schema=EVENTS_SCHEMA)
    return trace
