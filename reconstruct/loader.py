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

import dataclasses
import json
import math
import mmap
import os
import re
import struct
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from kvclaims.contract.schema import (BLOCK_RANGE, COLUMN_SINCE, VALUE_RANGES, range_problem,
                                      ARROW_SCHEMA, COLUMNS, ENVELOPE, READABLE_SCHEMA_VERSIONS,
                             SCHEMA_VERSION, InputError)
from kvclaims.contract.trace_writer import (CHECKSUM_SCHEME, HEADER_RECORD_BATCH, HEADER_SCHEMA,
                                   MANIFEST_NAME, SEALED_CHECKSUM, SEALED_NAME, SEGMENT_PREFIX,
                                   SEGMENT_SUFFIX, batch_group_crc, file_sha256,
                                   find_checksum_tag, message_header, open_regular)

_SEGMENT_RE: Final = re.compile(
    re.escape(SEGMENT_PREFIX) + r"(\d{6})" + re.escape(SEGMENT_SUFFIX) + r"\Z")
_CONTINUATION: Final[bytes] = b"\xff\xff\xff\xff"
_MAX_METADATA: Final[int] = 64 * 1024 * 1024   # a larger flatbuffer header is garbage
_MAX_BODY: Final[int] = 1 << 40

class TraceError(InputError):
    """A trace that cannot be read as recorded; the message names the file."""


@dataclass(frozen=True)
class Hole:
    """Seqs of a run the loader could not deliver (damaged, cut or missing); ``last_seq`` is
    None when the end is unknown. Every label from ``first_seq`` on is ``unknown``."""

    run_id: str
    file: str
    first_seq: int
    last_seq: int | None
    reason: str     # truncated | corrupt_batch | missing_columns | missing_head | missing_tail
    #                 | damaged (no seq missing: last_seq < first_seq, the file holds foreign bytes)
    message: str


# What checking a batch reads: the envelope and every range-checked column. A sealed file
# verified whole against its manifest's SHA-256 is checked on these alone when its batches
# are not kept (``read_run(checked_only=True)``): the checksum already covers every byte.
CHECKED_COLUMNS: Final[tuple[str, ...]] = tuple(dict.fromkeys((*ENVELOPE, *VALUE_RANGES)))

# Every hole reported since the last ``take_reported_holes()`` (the CLI's exit status 3).
_REPORTED: list[Hole] = []


def take_reported_holes() -> list[Hole]:
    """Return and forget the holes reported so far in this process (for the CLI door)."""
    out = list(_REPORTED)
    _REPORTED.clear()
    return out


def _decoded_type(typ: pa.DataType) -> pa.DataType:
    return typ.value_type if pa.types.is_dictionary(typ) else typ


# The schema of loaded events: ARROW_SCHEMA with dictionary strings decoded to plain strings,
# so joins in DuckDB/Polars need no casts.
EVENTS_SCHEMA: Final[pa.Schema] = pa.schema(
    [pa.field(f.name, _decoded_type(f.type), nullable=f.nullable) for f in ARROW_SCHEMA],
    metadata=ARROW_SCHEMA.metadata)


# -- IPC framing ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Group:
    """One record batch and the messages before it (schema or dictionaries): byte offsets."""

    start: int
    meta_start: int   # the record batch message's metadata
    meta_end: int
    end: int


@dataclass(frozen=True)
class StreamScan:
    """What the byte-level walk of one IPC stream found."""

    complete_end: int   # bytes worth decoding: up to the end of the last complete record batch
    batches: int        # complete record batches within complete_end
    eos: bool           # ends with the end-of-stream marker
    cut: bool           # ends inside a message (truncated mid-write)
    groups: tuple[Group, ...] = ()
    schema_end: int = 0  # end of the schema message (0: none)
    garbage_at: int | None = None  # framing broke here (after a valid prefix)
    garbage: str = ""              # what was wrong there

    @property
    def truncated(self) -> bool:
        """Not closed properly: cut mid-message, or no end-of-stream marker."""
        return self.cut or not self.eos or self.garbage_at is not None


def scan_stream(data: bytes | memoryview, name: str) -> StreamScan:
    """Walk the message framing of an Arrow IPC stream without decoding it.

    Distinguishes a stream cut short (a valid prefix: every length it declares runs past the
    end) from garbage. Garbage at the very start raises ``TraceError`` (not an IPC stream);
    garbage after a valid prefix ends the walk there (``garbage_at``): the prefix is kept.

    NOTE: a writer emits a batch's dictionaries as separate messages just before it, so a cut
    stream is only decodable up to the end of its last complete *record batch*: dictionaries
    after it belong to a batch that never made it.
    """
    size = len(data)
    pos = batches = 0
    usable = 0  # end of the schema message, then of each record batch
    schema_end = 0
    group_start = 0  # NOTE: the first group includes the schema message (the writer's CRC does)
    groups: list[Group] = []

    def result(eos: bool, cut: bool, garbage: int | None = None, msg: str = "") -> StreamScan:
        end = pos if (eos and not cut) else usable
        return StreamScan(end, batches, eos=eos, cut=cut, groups=tuple(groups),
                          schema_end=schema_end, garbage_at=garbage, garbage=msg)

    def bad(msg: str) -> StreamScan:
        if schema_end == 0:
            raise TraceError(f"{name}: {msg}")
        return result(eos=False, cut=False, garbage=pos, msg=msg)

    while True:
        left = size - pos
        if left == 0:
            return result(eos=False, cut=False)
        head = bytes(data[pos:pos + 8])
        if left < 4:
            if _CONTINUATION.startswith(head):
                return result(eos=False, cut=True)
            return bad(f"not an Arrow IPC stream (bad message marker at byte {pos})")
        if head[:4] != _CONTINUATION:
            if head[:4] == b"\x00\x00\x00\x00" and left == 4:  # legacy end-of-stream
                pos += 4
                return result(eos=True, cut=False)
            return bad(f"not an Arrow IPC stream (bad message marker at byte {pos})")
        if left < 8:
            return result(eos=False, cut=True)
        meta_len = struct.unpack_from("<i", head, 4)[0]
        if meta_len == 0:
            if left != 8:
                return bad(f"{left - 8} bytes of garbage after end of stream")
            pos += 8
            return result(eos=True, cut=False)
        if meta_len < 0 or meta_len % 8 or meta_len > _MAX_METADATA:
            return bad(f"corrupt IPC message header at byte {pos}")
        if left < 8 + meta_len:
            return result(eos=False, cut=True)
        try:
            kind, body = message_header(bytes(data[pos + 8:pos + 8 + meta_len]))
        except struct.error:
            return bad(f"corrupt IPC message header at byte {pos}")
        if body < 0 or body > _MAX_BODY or not 1 <= kind <= 5 or (
                kind == HEADER_SCHEMA) != (schema_end == 0):
            return bad(f"corrupt IPC message header at byte {pos}")
        if left < 8 + meta_len + body:
            return result(eos=False, cut=True)
        start = pos
        pos += 8 + meta_len + body
        if kind == HEADER_RECORD_BATCH:
            batches += 1
            groups.append(Group(group_start, start + 8, start + 8 + meta_len, pos))
            usable = group_start = pos
        elif kind == HEADER_SCHEMA:
            schema_end = usable = pos


def group_checksum(data: bytes | memoryview, group: Group) -> tuple[int | None, int | None]:
    """``(stored, computed)`` CRC-32 of one batch group; ``(None, None)`` when the batch
    carries no checksum (a trace from before checksums)."""
    view = memoryview(data)[group.start:group.end]
    rel_meta = (group.meta_start - group.start, group.meta_end - group.start)
    tag_at = find_checksum_tag(view, *rel_meta)
    if tag_at < 0:
        return None, None
    digits = bytes(view[tag_at + 8:tag_at + 16])
    try:
        stored = int(digits, 16)
    except ValueError:
        return -1, batch_group_crc(view, *rel_meta, tag_at)
    return stored, batch_group_crc(view, *rel_meta, tag_at)


# -- run directories --------------------------------------------------------------------------

@dataclass
class RunDir:
    """One run directory: its checked manifest and its segment files in order."""

    path: Path
    manifest: dict[str, Any]
    segments: list[Path]
    #: the run id its files carry, when ``run_id`` is an alias (another run given beside it
    #: has the same id: each is told apart by its path; see ``open_runs``)
    recorded_run_id: str | None = None
    #: warnings about this run that are no hole (e.g. the alias)
    notes: list[str] = field(default_factory=list)

    @property
    def run_id(self) -> str:
        """The run id from the manifest (an alias naming the path when the id is shared)."""
        return self.manifest["run_id"]


def is_run_dir(path: Path) -> bool:
    """A directory holding ``manifest.json`` or at least one segment file."""
    if (path / MANIFEST_NAME).is_file():
        return True
    return any(_SEGMENT_RE.match(p.name) for p in path.iterdir() if p.is_file())


def find_run_dirs(path: str | Path) -> list[Path]:
    """The run directories a path names: itself, or every run directory below it (a sweep)."""
    p = Path(path)
    try:
        return _find_run_dirs(p)
    except OSError as exc:  # unreadable directory (/proc/1, no permission)
        raise TraceError(f"{exc.filename or p}: cannot read: {_one_line(exc)}") from None


def _find_run_dirs(p: Path) -> list[Path]:
    if not p.exists():
        raise TraceError(f"{p}: no such file or directory")
    if not p.is_dir():
        hint = " (a JSON Lines trace: use 'kvclaims import' first)" if p.suffix == ".jsonl" else ""
        raise TraceError(f"{p}: is a file, not a run directory{hint}")
    if is_run_dir(p):
        return [p]
    found: list[Path] = []
    def walk_error(exc: OSError) -> None:
        raise exc

    for root, dirs, _files in os.walk(p, onerror=walk_error):
        dirs.sort()
        here = Path(root)
        if here != p and is_run_dir(here):
            found.append(here)
            dirs.clear()  # NOTE: a run directory never nests another run
    if not found:
        raise TraceError(f"{p}: not a run directory (no {MANIFEST_NAME} or "
                         f"{SEGMENT_PREFIX}*{SEGMENT_SUFFIX}), contains none and is no fleet "
                         "dataset (no events/ and manifests/)")
    return found


_MANIFEST_INTS: Final[dict[str, tuple[int, int]]] = {
    "block_size": (1, 2**30 - 1), "num_blocks": BLOCK_RANGE, "usable_blocks": BLOCK_RANGE,
    "events_written": (0, 2**62), "events_dropped": (0, 2**62), "recorder_errors": (0, 2**62),
    "write_failures": (0, 2**62)}
_MANIFEST_STRS: Final[tuple[str, ...]] = ("runtime", "runtime_version", "model", "policy",
                                          "recorder_version")
_SEGMENT_INTS: Final[tuple[str, ...]] = ("events", "bytes", "first_seq", "last_seq")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_manifest(manifest: Any, where: str) -> dict[str, Any]:
    """Check a parsed manifest's keys and value ranges; raise ``TraceError`` naming ``where``."""
    if not isinstance(manifest, dict):
        raise TraceError(f"{where}: manifest must be a JSON object")
    version = manifest.get("schema_version")
    if not _is_int(version):
        raise TraceError(f"{where}: manifest field 'schema_version' missing or not an integer")
    if version > SCHEMA_VERSION:
        raise TraceError(f"{where}: schema_version {version} is newer than this kvclaims reads "
                         f"({SCHEMA_VERSION}); upgrade kvclaims")
    if version not in READABLE_SCHEMA_VERSIONS:
        raise TraceError(f"{where}: schema_version {version} is not one this kvclaims reads "
                         f"({sorted(READABLE_SCHEMA_VERSIONS)})")
    if not isinstance(manifest.get("run_id"), str) or not manifest["run_id"]:
        raise TraceError(f"{where}: manifest field 'run_id' missing or not a string")
    if len(manifest["run_id"]) > 1024:
        raise TraceError(f"{where}: manifest field 'run_id' is longer than 1024 characters")
    for key, (lo, hi) in _MANIFEST_INTS.items():
        val = manifest.get(key)
        if val is not None and (not _is_int(val) or not lo <= val <= hi):
            raise TraceError(f"{where}: manifest field '{key}' is {_short(val)}, expected an "
                             f"integer in {lo}..{hi} or null")
    for key in ("run_id",) + _MANIFEST_STRS:
        val = manifest.get(key)
        if val is not None and not isinstance(val, str):
            raise TraceError(f"{where}: manifest field '{key}' is {_short(val)}, expected a "
                             "string or null")
        if isinstance(val, str) and not _utf8(val):
            raise TraceError(f"{where}: manifest field '{key}' is not valid Unicode text")
    segments = manifest.get("segments")
    if not isinstance(segments, list) or not all(
            isinstance(s, dict) and isinstance(s.get("file"), str) for s in segments):
        raise TraceError(f"{where}: manifest field 'segments' must be a list of {{file, ...}}")
    for i, seg in enumerate(segments):
        for key in _SEGMENT_INTS:
            val = seg.get(key)
            if val is not None and (not _is_int(val) or not 0 <= val <= 2**62):
                raise TraceError(f"{where}: segments[{i}].{key} is {_short(val)}, expected a "
                                 "non-negative integer or null")
    if not isinstance(manifest.get("complete"), bool):
        raise TraceError(f"{where}: manifest field 'complete' missing or not a boolean")
    for key in ("batch_checksum", "hash_scheme"):
        val = manifest.get(key)
        if val is not None and not isinstance(val, str):
            raise TraceError(f"{where}: manifest field '{key}' must be a string or null")
    _check_fields(manifest.get("clock"), _CLOCK_FIELDS, f"{where}: manifest field 'clock'")
    _check_lowering(manifest.get("lowering"), where)
    _check_fields(manifest.get("sealed"), _SEALED_FIELDS, f"{where}: manifest field 'sealed'")
    return manifest


# Typed sub-objects of a manifest: field -> (type, (lo, hi) for integers). Other fields pass.
_INT64: Final[tuple[int, int]] = (-(2**63), 2**63 - 1)
_CLOCK_FIELDS: Final[dict[str, tuple[type, tuple[int, int] | None]]] = {
    "utc": (str, None), "utc_ns": (int, _INT64), "monotonic_ns": (int, (0, 2**63 - 1)),
    "ts_ns": (int, (0, 2**63 - 1)), "start_ts_ns": (int, (0, 2**63 - 1)),
    "anchor_ts_ns": (int, (0, 2**63 - 1)), "host": (str, None), "hostname": (str, None)}
_SEALED_FIELDS: Final[dict[str, tuple[type, tuple[int, int] | None]]] = {
    "file": (str, None), "format": (str, None), "events": (int, (0, 2**62)),
    "bytes": (int, (0, 2**62)), SEALED_CHECKSUM: (str, None)}
_SHA256_RE: Final = re.compile(r"[0-9a-f]{64}\Z")


def _check_fields(obj: Any, fields: dict[str, tuple[type, tuple[int, int] | None]],
                  what: str) -> None:
    """An optional manifest object: null, or an object whose known fields have their types.

    NOTE: a wrong-typed value is refused (one line), never read as "no value": a clock given
    as a string must not silently turn every ``ts`` NULL.
    """
    if obj is None:
        return
    if not isinstance(obj, dict):
        raise TraceError(f"{what} is {_short(obj)}, expected an object or null")
    for key, (typ, bounds) in fields.items():
        val = obj.get(key)
        if val is None:
            continue
        if typ is int:
            lo, hi = bounds if bounds is not None else _INT64
            if _is_int(val) and lo <= val <= hi:
                continue
            raise TraceError(f"{what}.{key} is {_short(val)}, expected an integer in "
                             f"{lo}..{hi} or null")
        if typ is str and (not isinstance(val, str) or not _utf8(val)):
            raise TraceError(f"{what}.{key} is {_short(val)}, expected a string or null")
    digest = obj.get(SEALED_CHECKSUM) if fields is _SEALED_FIELDS else None
    if digest is not None and not _SHA256_RE.match(digest):
        raise TraceError(f"{what}.{SEALED_CHECKSUM} is {_short(digest)}, expected 64 lower-case "
                         "hex digits")


def _check_lowering(obj: Any, where: str) -> None:
    """``lowering``: null, or {mode: {"verdict": str, "evidence": str | null}}."""
    if obj is None:
        return
    what = f"{where}: manifest field 'lowering'"
    if not isinstance(obj, dict):
        raise TraceError(f"{what} is {_short(obj)}, expected an object of modes or null")
    for mode, entry in obj.items():
        if not isinstance(entry, dict):
            raise TraceError(f"{what}.{_short(mode)} is {_short(entry)}, expected "
                             "{verdict, evidence}")
        verdict, evidence = entry.get("verdict"), entry.get("evidence")
        if not isinstance(verdict, str) or not _utf8(verdict):
            raise TraceError(f"{what}.{_short(mode)}.verdict is {_short(verdict)}, expected "
                             "a string")
        if evidence is not None and (not isinstance(evidence, str) or not _utf8(evidence)):
            raise TraceError(f"{what}.{_short(mode)}.evidence is {_short(evidence)}, "
                             "expected a string or null")


def _utf8(text: str) -> bool:
    """Whether text can be stored (JSON allows lone surrogates; UTF-8 and Arrow do not)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _short(value: Any) -> str:
    text = repr(value) if not _is_int(value) or abs(value) < 10**30 else f"an integer of " \
        f"{len(str(abs(value)))} digits"
    return text if len(text) <= 60 else text[:57] + "..."


def read_manifest(run_dir: str | Path) -> dict[str, Any]:
    """Read and check ``manifest.json`` of a run directory."""
    path = Path(run_dir) / MANIFEST_NAME
    try:
        if not path.is_file():
            raise TraceError(f"{path}: missing manifest (every run directory has one)")
        text = read_small_file(path, 64 * 1024 * 1024, "manifest").decode("utf-8")
        manifest = json.loads(text, parse_constant=_reject_constant)
    except TraceError:
        raise
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        # NOTE: ValueError covers bad JSON and Python's limit on 4300-digit integers
        raise TraceError(f"{path}: unreadable manifest: {_one_line(exc)}") from None
    return check_manifest(manifest, str(path))


def read_small_file(path: Path, limit: int, what: str) -> bytes:
    """A regular file's bytes, at most ``limit`` (else ``TraceError``); a FIFO or device is
    refused before anything waits on it (``open_regular``)."""
    try:
        fd = open_regular(path)
    except OSError as exc:
        raise TraceError(f"{path}: cannot read the {what}: {_one_line(exc)}") from None
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise TraceError(f"{path}: {what} larger than {limit // (1024 * 1024)} MiB")
    return data


def _reject_constant(name: str) -> float:
    raise ValueError(f"non-finite number {name} is not JSON")


def _one_line(exc: BaseException) -> str:
    text = (getattr(exc, "strerror", None) or str(exc) or type(exc).__name__).splitlines()
    return text[0][:200] if text else type(exc).__name__


def open_run(run_dir: str | Path) -> RunDir:
    """Check a run directory's manifest against the segment files on disk."""
    path = Path(run_dir)
    manifest = read_manifest(path)
    on_disk: dict[int, Path] = {}
    try:
        entries = list(path.iterdir())
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {_one_line(exc)}") from None
    for p in entries:
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
    """Find and check every run the paths name, ordered by run_id.

    Runs whose manifests share one run id (two recordings given one name, a copy beside its
    original) are all kept: each is told apart by its path, as run id ``<id>@<path>``, and
    carries a warning in ``notes``. NOTE: the alias is applied when the run's events are read
    (``read_run``), so every table and view sees distinct runs.
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    found: list[RunDir] = []
    where: set[Path] = set()
    for p in paths:
        for run_dir in find_run_dirs(p):
            run = open_run(run_dir)
            if run.path.resolve() in where:
                continue  # the same directory named twice
            where.add(run.path.resolve())
            found.append(run)
    by_id: dict[str, list[RunDir]] = {}
    for run in found:
        by_id.setdefault(run.run_id, []).append(run)
    for rid, group in by_id.items():
        if len(group) > 1:
            for run in group:
                _alias(run, [o.path for o in group if o is not run])
    runs = {r.run_id: r for r in found}
    return [runs[k] for k in sorted(runs)]


def _alias(run: RunDir, others: Sequence[Path]) -> None:
    """Tell ``run`` apart from ``others`` (same run id) by its path, with a warning."""
    rid = run.run_id
    alias = f"{rid}@{run.path}"
    run.recorded_run_id = rid
    run.manifest = {**run.manifest, "run_id": alias}
    run.notes.append(f"{run.path / MANIFEST_NAME}: run_id {rid!r} is also the id of "
                     f"{', '.join(str(o) for o in others)}; this run is shown as {alias!r}")


def _relabel(batch: pa.RecordBatch, run_id: str) -> pa.RecordBatch:
    """The batch with every event's run_id replaced (an aliased run, ``open_runs``)."""
    i = batch.schema.get_field_index("run_id")
    return batch.set_column(i, batch.schema.field(i), pa.array([run_id] * batch.num_rows,
                                                               pa.string()))


# -- segments ---------------------------------------------------------------------------------

def _check_schema(schema: pa.Schema, name: str, version: int) -> list[str]:
    """Check a segment's schema; return the required columns it lacks (a hole, not an error:
    the segment's events cannot be trusted without them)."""
    meta = schema.metadata or {}
    raw = meta.get(b"kvclaims.schema_version")
    if raw is not None:
        try:
            version = int(raw)
        except ValueError:
            raise TraceError(f"{name}: bad kvclaims.schema_version {raw[:40]!r}") from None
        if version > SCHEMA_VERSION:
            raise TraceError(f"{name}: schema_version {version} is newer than this kvclaims "
                             f"reads ({SCHEMA_VERSION}); upgrade kvclaims")
    for f in schema:
        if f.name not in COLUMNS:
            raise TraceError(f"{name}: unknown column '{f.name[:80]}'")
        if _decoded_type(f.type) != EVENTS_SCHEMA.field(f.name).type:
            raise TraceError(f"{name}: column '{f.name}' has type {f.type}, expected "
                             f"{COLUMNS[f.name]}")
    for col in ENVELOPE:
        if schema.get_field_index(col) < 0:
            raise TraceError(f"{name}: missing column '{col}'")
    return [c for c in COLUMNS if schema.get_field_index(c) < 0
            and COLUMN_SINCE.get(c, 1) <= version]


def decode_batch(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Decode dictionary columns and add columns an older schema lacked (as nulls)."""
    arrays = []
    for f in EVENTS_SCHEMA:
        idx = batch.schema.get_field_index(f.name)
        if idx < 0:
            arrays.append(pa.nulls(batch.num_rows, f.type))
            continue
        col = batch.column(idx)
        if pa.types.is_dictionary(col.type):
            # NOTE: most columns are null for every event of a batch: no take() for those
            col = (pa.nulls(len(col), f.type) if col.null_count == len(col)
                   else col.dictionary_decode())
        arrays.append(col)
    return pa.RecordBatch.from_arrays(arrays, schema=EVENTS_SCHEMA)


def check_ranges(batch: pa.RecordBatch, name: str) -> None:
    """Refuse values outside ``VALUE_RANGES`` (naming column and seq): readers rely on them.

    NOTE: one min/max kernel per non-null column; the offending row is looked up only when
    a bound is broken.
    """
    for col, (lo, hi) in VALUE_RANGES.items():
        idx = batch.schema.get_field_index(col)
        if idx < 0:
            continue
        arr = batch.column(idx)
        if arr.null_count == len(arr):
            continue
        mm = pc.min_max(arr)
        low, high = mm["min"].as_py(), mm["max"].as_py()
        nan = pa.types.is_floating(arr.type) and pc.any(pc.is_nan(arr)).as_py()
        if low >= lo and high <= hi and not nan and (
                not pa.types.is_floating(arr.type) or math.isfinite(low + high)):
            continue
        bad = pc.invert(pc.and_kleene(pc.greater_equal(arr, lo), pc.less_equal(arr, hi)))
        if pa.types.is_floating(arr.type):
            bad = pc.or_kleene(bad, pc.is_nan(arr))
        i = pc.index(pc.fill_null(bad, False), True).as_py()
        seq = batch.column("seq")[i].as_py()
        problem = range_problem(col, arr[i].as_py()) or f"field '{col}' is out of range"
        raise TraceError(f"{name}: seq {seq}: {problem}")


@dataclass
class SegmentRead:
    """What reading one segment found besides its batches."""

    truncation: str | None = None        # a cut or unfinished end (the run's last segment)
    damaged: list[tuple[int | None, int | None, str]] = field(default_factory=list)
    # ^ (after_seq, before_seq, why): a damaged span between two kept batches (None: edge)
    missing_columns: list[str] = field(default_factory=list)


def read_segment(path: Path, *, report: Callable[[str], None], expect_checksums: bool = False,
                 version: int = SCHEMA_VERSION, eos_expected: bool = True,
                 found: SegmentRead | None = None) -> Iterator[pa.RecordBatch]:
    """Yield the decoded batches of one segment that can be trusted.

    A batch whose checksum does not match, that cannot be decoded, or that a broken framing
    cuts off is skipped and described in ``found.damaged`` (a hole); so is the whole segment
    when it lacks a required column. A cut or unfinished end is reported through ``report``
    (one message); the run's segments are checked against the manifest by ``read_run``.
    """
    name = str(path)
    found = found if found is not None else SegmentRead()
    try:
        buf = map_regular(path)
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise TraceError(f"{name}: cannot read: {_one_line(exc)}") from None
    view = memoryview(buf)
    scan = scan_stream(view, name)
    kept = 0
    if scan.schema_end:
        try:
            schema = pa.ipc.open_stream(buf.slice(0, scan.schema_end)).schema
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise TraceError(f"{name}: corrupt Arrow IPC schema: {_one_line(exc)}") from None
        found.missing_columns = _check_schema(schema, name, version)
    good: list[Group] = []
    last_seq_before: list[int | None] = []
    for g in scan.groups:
        stored, computed = group_checksum(view, g)
        if stored is None and expect_checksums:
            good.append(Group(-1, 0, 0, 0))  # a batch without its checksum: damaged
        elif stored is not None and stored != computed:
            good.append(Group(-1, 0, 0, 0))
        else:
            good.append(g)
    if found.missing_columns:
        found.damaged.append((None, None, "lacks required column(s) "
                              + ", ".join(found.missing_columns)))
        good = []
    prev_seq: int | None = None
    pending_damage: str | None = None
    for batch in _decode_groups(buf, scan, good, name, found):
        if batch is None:  # a damaged group at this point
            pending_damage = pending_damage or "checksum mismatch or undecodable batch"
            continue
        if pending_damage is not None:
            found.damaged.append((prev_seq, batch.column("seq")[0].as_py() if batch.num_rows
                                  else None, pending_damage))
            pending_damage = None
        kept += 1
        if batch.num_rows:
            prev_seq = batch.column("seq")[batch.num_rows - 1].as_py()
        yield batch
    if pending_damage is not None:
        found.damaged.append((prev_seq, None, pending_damage))
    if scan.garbage_at is not None:
        found.damaged.append((prev_seq, None, f"corrupt IPC framing ({scan.garbage})"))
    elif scan.truncated and not (scan.cut is False and not scan.eos and not eos_expected
                                 and scan.complete_end == len(buf)):
        if len(buf) == 0:
            how = "empty file"
        elif scan.cut:
            how = f"cut mid-write at byte {scan.complete_end} of {len(buf)}"
        else:
            how = "no end-of-stream marker, the writer did not close it"
        found.truncation = f"{name}: truncated segment ({how}); kept {kept} complete batches"
        report(found.truncation)


def map_regular(path: Path) -> pa.Buffer:
    """A read-only memory map of a regular file as an Arrow buffer (empty for an empty file).

    NOTE: the descriptor is opened with ``O_NONBLOCK`` and checked before mapping, so a FIFO
    or device in place of a segment is refused at once instead of blocking the reader.
    """
    fd = open_regular(path)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return pa.py_buffer(b"")
        return pa.py_buffer(mmap.mmap(fd, size, access=mmap.ACCESS_READ))
    finally:
        os.close(fd)


def _decode_groups(buf: pa.Buffer, scan: StreamScan, groups: list[Group], name: str,
                   found: SegmentRead) -> Iterator[pa.RecordBatch | None]:
    """Decode the kept groups in order; None stands for a damaged one.

    NOTE: a checksummed group is self-contained (the writer sends every dictionary with every
    batch), so the good groups after a damaged one decode on their own. A trace from before
    checksums is decoded as one stream; a batch that fails to decode ends the segment there.
    """
    if not groups:
        return
    intact = all(g.start >= 0 for g in groups) and all(
        a.end == b.start for a, b in zip(groups, groups[1:]))
    if intact:
        yield from _decode_stream(buf.slice(0, groups[-1].end), name)
        return
    schema_msg = buf.slice(0, scan.schema_end).to_pybytes()
    for g in groups:
        if g.start < 0:
            yield None
            continue
        piece = (b"" if g.start == 0 else schema_msg) + buf.slice(
            g.start, g.end - g.start).to_pybytes()
        yield from _decode_stream(pa.py_buffer(piece), name)


def _decode_stream(data: pa.Buffer, name: str) -> Iterator[pa.RecordBatch | None]:
    try:
        reader = pa.ipc.open_stream(data)
        while True:
            try:
                batch = reader.read_next_batch()
            except StopIteration:
                return
            # NOTE: full validation turns corrupt offsets/indices into an error instead of
            # out-of-bounds reads later (DuckDB, Polars)
            batch.validate(full=True)
            check_ranges(batch, name)
            yield decode_batch(batch)
    except TraceError:
        raise
    except (pa.ArrowException, OSError, ValueError, IndexError) as exc:
        # NOTE: pyarrow reports a bad flatbuffer as OSError, bad data (e.g. "ZSTD
        # decompression failed") as ArrowInvalid: the batch is damaged, not the whole run
        del exc
        yield None


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


def _hole(run: RunDir, file: str, first: int, last: int | None, reason: str, why: str,
          report: Callable[[str], None] | None,
          on_hole: Callable[[Hole], None] | None) -> None:
    """Record one hole (and report its message unless ``report`` is None: already said)."""
    span = f"seq {first}" + ("" if last == first else
                             f"..{last}" if last is not None else " onwards")
    msg = f"{file}: {why}: {span} of run {run.run_id!r} cannot be read (a hole: unknown)"
    if last is not None and last < first:
        msg = (f"{file}: {why}: every listed event of run {run.run_id!r} was read, but the "
               "file is damaged (a hole: what follows it is unknown)")
    hole = Hole(run.run_id, file, first, last, reason, msg if report else why)
    _REPORTED.append(hole)
    if on_hole is not None:
        on_hole(hole)
    if report is not None:
        report(msg)


def _sealed_entry(run: RunDir) -> dict[str, Any] | None:
    """The manifest's sealed-Parquet entry when it is usable (a complete run, file present)."""
    sealed = run.manifest.get("sealed")
    if not (run.manifest["complete"] and isinstance(sealed, dict)
            and sealed.get("file") == SEALED_NAME and _is_int(sealed.get("events"))):
        return None
    path = run.path / SEALED_NAME
    return sealed if path.is_file() else None


def sealed_verified(entry: dict[str, Any] | None) -> bool:
    """Whether a sealed entry carries a content checksum (``read_sealed`` verifies it before
    the first byte is used). A file sealed before checksums is still read through pyarrow
    (page checksums, no statistics consulted), but never handed to a reader that prunes by
    its footer statistics: ``reconstruct.core.stage_events`` copies its events instead."""
    return entry is not None and isinstance(entry.get(SEALED_CHECKSUM), str)


def verify_sealed(path: Path, entry: dict[str, Any]) -> None:
    """Check the sealed file's size and SHA-256 against the manifest; ``TraceError`` (the
    caller falls back to the segments) on any difference."""
    digest, size = file_sha256(path)
    if _is_int(entry.get("bytes")) and size != entry["bytes"]:
        raise TraceError(f"{path}: {size} bytes, the manifest says {entry['bytes']}")
    if digest != entry[SEALED_CHECKSUM]:
        raise TraceError(f"{path}: content checksum differs from the manifest's (the file "
                         "changed after sealing)")


def open_regular_check(path: Path) -> None:
    """Raise ``OSError`` unless ``path`` is a regular file (opened without waiting)."""
    os.close(open_regular(path))


def parquet_file(path: str | Path, **options: Any) -> Any:
    """A ``pq.ParquetFile`` to stream batches from (``iter_batches``), in bounded memory.

    NOTE: ``pre_buffer=False``: with pyarrow's default, ``iter_batches`` keeps every column
    chunk it pre-buffered until the iterator ends, so memory grows with the file (measured:
    ~6 bytes per event, 180 MB by the end of a 30 M-event run); without it memory stays one
    row group, at no CPU cost.
    """
    return pq.ParquetFile(str(path), pre_buffer=False, **options)


def read_sealed(run: RunDir, sealed: dict[str, Any], *,
                checked_only: bool = False) -> Iterator[pa.RecordBatch]:
    """Yield the batches of a run's ``events.parquet`` (checked like segment batches).

    Raises ``TraceError`` when it disagrees with the manifest, and pyarrow/OS errors for a
    damaged file (page checksums are verified); ``read_run`` then falls back to the segments.
    ``checked_only``: a file verified against the manifest's SHA-256 yields only
    ``CHECKED_COLUMNS`` (the rest is not decoded); an unverified one is read whole regardless.
    """
    path = run.path / SEALED_NAME
    verified = sealed_verified(sealed)
    if verified:
        verify_sealed(path, sealed)
    else:
        open_regular_check(path)
    pf = parquet_file(path, page_checksum_verification=True)
    listed = sum(s.get("events") or 0 for s in run.manifest["segments"])
    if pf.metadata.num_rows != sealed["events"] or pf.metadata.num_rows != listed:
        raise TraceError(f"{path}: holds {pf.metadata.num_rows} events, the manifest says "
                         f"{sealed['events']} (segments: {listed})")
    schema = pf.schema_arrow
    current = schema.equals(EVENTS_SCHEMA, check_metadata=False)
    if not current and not _older_sealed_schema(schema, run.manifest.get("schema_version")):
        raise TraceError(f"{path}: schema differs from the events schema")
    if checked_only and verified:
        present = set(schema.names)
        columns = [c for c in CHECKED_COLUMNS if c in present]
        for batch in pf.iter_batches(batch_size=1 << 16, columns=columns):
            check_ranges(batch, str(path))
            yield batch
        return
    for batch in pf.iter_batches(batch_size=1 << 16):
        # NOTE: a run sealed by an older schema lacks the columns added since (read as null)
        batch = pa.RecordBatch.from_arrays(batch.columns, schema=EVENTS_SCHEMA) if current \
            else decode_batch(batch)
        check_ranges(batch, str(path))
        yield batch


def _older_sealed_schema(schema: pa.Schema, version: Any) -> bool:
    """Whether a sealed file's schema is the events schema of the older ``version``: the same
    columns in the same order, less exactly those added after that version."""
    if not _is_int(version) or version >= SCHEMA_VERSION:
        return False
    expected = [f for f in EVENTS_SCHEMA if COLUMN_SINCE.get(f.name, 1) <= version]
    return len(schema) == len(expected) and all(
        a.equals(b) for a, b in zip(schema, expected))


def read_run(run: RunDir, report: Callable[[str], None],
             on_hole: Callable[[Hole], None] | None = None, *,
             sealed: bool = True, checked_only: bool = False,
             warn: Callable[[str], None] | None = None) -> Iterator[pa.RecordBatch]:
    """Yield a run's decoded, checked batches in seq order.

    A complete run sealed into ``events.parquet`` is read from it (``sealed=False``: always
    from the IPC segments); a sealed file that is damaged or disagrees with the manifest is
    reported and the segments are read instead, from where it stopped. Whatever cannot be
    delivered is reported (``report`` gets one line per problem; ``on_hole`` a ``Hole``): a cut
    last segment, a damaged batch, a segment lacking a required column, a missing head (the run
    does not start with ``run_started`` at seq 0) or a missing tail (a complete run that ends
    before its manifest says). ``warn`` (default ``report``) gets what is no hole: a damaged
    sealed copy whose segments deliver every event instead. ``checked_only``: the caller
    keeps no batch of a verified sealed file (``read_sealed``); segment batches are whole.
    """
    warn = warn or report
    if run.recorded_run_id is not None:
        # NOTE: the files carry the recorded id; checked against it, then relabelled
        recorded = RunDir(run.path, {**run.manifest, "run_id": run.recorded_run_id},
                          run.segments)
        alias_hole = (None if on_hole is None else
                      (lambda h: on_hole(dataclasses.replace(h, run_id=run.run_id))))
        for batch in read_run(recorded, report, alias_hole, sealed=sealed,
                              checked_only=checked_only, warn=warn):
            yield _relabel(batch, run.run_id)
        return
    skip_through: int | None = None
    entry = _sealed_entry(run) if sealed else None
    if entry is not None:
        prev_sealed: int | None = None
        try:
            for batch in read_sealed(run, entry, checked_only=checked_only):
                if batch.num_rows == 0:
                    continue
                if prev_sealed is None:
                    head = batch.column("seq")[0].as_py()
                    if head != 0 or ("imported_from" not in run.manifest and
                                     batch.column("event")[0].as_py() != "run_started"):
                        raise TraceError(f"{run.path / SEALED_NAME}: does not start at seq 0")
                prev_sealed = _check_batch(batch, run.run_id, prev_sealed,
                                           str(run.path / SEALED_NAME))
                yield batch
            return
        except (TraceError, pa.ArrowException, OSError, ValueError) as exc:
            warn(f"{run.path / SEALED_NAME}: sealed copy unusable ({_one_line(exc)}); "
                 "reading the segments instead")
            skip_through = prev_sealed
    yield from _read_segments(run, report, on_hole, skip_through)


def _read_segments(run: RunDir, report: Callable[[str], None],
                   on_hole: Callable[[Hole], None] | None,
                   skip_through: int | None) -> Iterator[pa.RecordBatch]:
    """``read_run`` over the IPC segments; batches up to ``skip_through`` were delivered."""
    prev: int | None = None
    listed = run.manifest["segments"]
    expect = run.manifest.get("batch_checksum") == CHECKSUM_SCHEME
    version = run.manifest["schema_version"]
    recorded = "imported_from" not in run.manifest
    first_seen = False
    mine: list[Hole] = []  # this run's holes (the head and tail checks look at them)
    outer_on_hole = on_hole

    def on_hole(hole: Hole) -> None:  # type: ignore[no-redef]
        mine.append(hole)
        if outer_on_hole is not None:
            outer_on_hole(hole)

    for i, seg in enumerate(run.segments):
        rows = 0
        entry = listed[i] if i < len(listed) else {}
        found = SegmentRead()
        seg_first: int | None = None
        truncated: list[str] = []

        def note(msg: str) -> None:
            truncated.append(msg)
            report(msg)

        for batch in read_segment(seg, report=note,
                                  expect_checksums=expect, version=version,
                                  eos_expected=entry.get("eos", True) is not False,
                                  found=found):
            if skip_through is not None and batch.num_rows:
                # NOTE: the sealed file already delivered seqs up to skip_through: count them
                # against the manifest, do not yield them twice
                first_seen = True
                seq_col = batch.column("seq")
                if seg_first is None:
                    seg_first = seq_col[0].as_py()
                rest = batch.filter(pc.greater(seq_col, skip_through))
                rows += batch.num_rows - rest.num_rows
                if rest.num_rows == 0:
                    prev = seq_col[batch.num_rows - 1].as_py()
                    continue
                if batch.num_rows > rest.num_rows:
                    prev = skip_through
                batch = rest
                skip_through = None
            if batch.num_rows == 0:
                continue
            if not first_seen:
                first_seen = True
                head = batch.column("seq")[0].as_py()
                covered = any(h.first_seq == 0 for h in mine)
                if not covered and (head != 0 or (
                        recorded and batch.column("event")[0].as_py() != "run_started")):
                    _hole(run, str(seg), 0, head - 1 if head > 0 else 0, "missing_head",
                          "the run's head is missing (it must start with run_started at seq 0)",
                          report, on_hole)
            prev = _check_batch(batch, run.run_id, prev, str(seg))
            if seg_first is None:
                seg_first = batch.column("seq")[0].as_py()
            rows += batch.num_rows
            yield batch
        listed_first, listed_last = entry.get("first_seq"), entry.get("last_seq")
        for after, before, why in found.damaged:
            first = (after + 1) if after is not None else (
                listed_first if listed_first is not None else 0)
            end = (before - 1) if before is not None else listed_last
            reason = "missing_columns" if found.missing_columns else "corrupt_batch"
            if end is not None and first > end:
                # NOTE: every listed event was read, but the file holds bytes kvclaims did not
                # write (e.g. appended after the end-of-stream marker): damage that marks the
                # run, so it is a hole (exit 3), never a silent "no events lost"
                reason = "damaged"
            _hole(run, str(seg), first, end, reason, why, report, on_hole)
        damaged = bool(found.damaged) or bool(truncated)
        if i < len(listed) and not damaged and rows and listed_first is None:
            listed_first, listed_last = seg_first, prev
        expected = entry.get("events")
        if not damaged and isinstance(expected, int) and expected != rows:
            raise TraceError(f"{seg}: holds {rows} events, the manifest says {expected}")
        if not damaged and rows and listed_first is not None and (
                seg_first != listed_first or prev != listed_last):
            raise TraceError(f"{seg}: holds seqs {seg_first}..{prev}, the manifest says "
                             f"{listed_first}..{listed_last}")
        if truncated and i < len(listed) and listed_last is not None and (
                prev is None or prev < listed_last) and not found.damaged:
            _hole(run, str(seg), (prev + 1) if prev is not None else (listed_first or 0),
                  listed_last, "truncated", "segment listed in the manifest is cut short",
                  report, on_hole)
        elif truncated and not found.damaged:
            # a crash cut the open segment: whatever followed is unknown (already reported)
            _hole(run, str(seg), (prev + 1) if prev is not None else 0, None, "truncated",
                  truncated[0], None, on_hole)
    if not first_seen and (run.manifest["complete"] or run.segments):
        _hole(run, str(run.path), 0, None, "missing_head", "the run holds no readable events",
              report, on_hole)
    elif run.manifest["complete"] and listed:
        final = listed[-1].get("last_seq")
        if isinstance(final, int) and prev is not None and prev < final and not any(
                h.last_seq in (None, final) for h in mine):
            _hole(run, str(run.path), prev + 1, final, "missing_tail",
                  "the complete run ends before its manifest says", report, on_hole)


def iter_batches(paths: Sequence[str | Path], *,
                 truncations: list[str] | None = None,
                 holes: list[Hole] | None = None,
                 sealed: bool = True) -> Iterator[pa.RecordBatch]:
    """Stream the decoded batches of every run the paths name (by run_id, then seq).

    Every run is found and its manifest checked before the first batch is yielded; segment
    errors raise ``TraceError`` when reached. Truncation and hole messages are appended to
    ``truncations`` if given; ``holes`` gets each ``Hole``.
    """
    runs = open_runs(paths)
    sink = truncations.append if truncations is not None else (lambda _msg: None)
    for run in runs:
        for note in run.notes:
            sink(note)
        yield from read_run(run, sink, holes.append if holes is not None else None,
                            sealed=sealed)


def batch_reader(paths: Sequence[str | Path], *,
                 truncations: list[str] | None = None,
                 holes: list[Hole] | None = None,
                 sealed: bool = True) -> pa.RecordBatchReader:
    """``iter_batches`` as a ``pa.RecordBatchReader`` (DuckDB can scan it once, streaming)."""
    return pa.RecordBatchReader.from_batches(
        EVENTS_SCHEMA, iter_batches(paths, truncations=truncations, holes=holes,
                                    sealed=sealed))


# -- the loaded trace -------------------------------------------------------------------------

@dataclass
class Trace:
    """Every event of the loaded runs plus what is known about each run."""

    events: pa.Table
    manifests: dict[str, dict[str, Any]]
    run_dirs: dict[str, Path] = field(default_factory=dict)
    truncations: list[str] = field(default_factory=list)
    truncated_runs: set[str] = field(default_factory=set)
    holes: list[Hole] = field(default_factory=list)

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


def load_runs(paths: Sequence[str | Path], *, sealed: bool = True) -> Trace:
    """Load every run the paths name (run dirs or sweep dirs) into one ``Trace``.

    Raises ``TraceError`` (naming the file) for anything that cannot be read as recorded.
    """
    runs = open_runs(paths)
    trace = Trace(events=EVENTS_SCHEMA.empty_table(), manifests={})
    batches: list[pa.RecordBatch] = []
    for run in runs:
        trace.manifests[run.run_id] = run.manifest
        trace.run_dirs[run.run_id] = run.path
        trace.truncations.extend(run.notes)   # NOTE: a warning, not a hole

        def note(msg: str, rid: str = run.run_id) -> None:
            # NOTE: every hole marks the run truncated: downstream, outcomes that could have
            # changed behind it are unknown and a finding names it
            trace.truncations.append(msg)
            trace.truncated_runs.add(rid)

        batches.extend(read_run(run, note, trace.holes.append, sealed=sealed))
    trace.events = pa.Table.from_batches(batches, schema=EVENTS_SCHEMA)
    return trace
