"""The run directory writer: Arrow IPC stream segments plus an atomically replaced manifest.

A run directory holds ``manifest.json`` and ``events-000000.arrows``, ``events-000001.arrows``,
… (see docs/trace-format.md). Each segment is an Arrow IPC *stream* (not the random-access file
format) so that a crash leaves a readable prefix: every complete record batch before the cut can
be recovered by ``kvclaims.reconstruct.loader``.

NOTE: invariants this module keeps
- segments are numbered densely from 0 and never rewritten once rotated;
- events inside and across segments are in the order they were handed in (the buffer hands them
  in ``seq`` order);
- a segment file only ever holds whole *batch groups* (the messages of one record batch: its
  replacement dictionaries, then the batch), except while a write is in flight: the stream is
  serialised in memory and appended with ``os.write``; a failed append is truncated back to the
  last complete group before the error is raised (``write_batch`` raises ``WriteError``);
- every record batch carries a CRC-32 of its whole group (``kvclaims.crc32`` custom metadata,
  see ``batch_group_crc``), so a reader can tell a damaged batch from a good one;
- ``manifest.json`` always exists from the moment the writer opens (a crashed run still has
  one) and is replaced atomically (tmp + ``os.replace``), so a reader never sees half of it; a
  manifest that cannot be written (disk full) is retried at the next write, rotation or close;
- ``complete`` is true only after ``close()``;
- block content hashes are keyed (``hash_scheme``) before they reach the file, unless the
  operator chose ``vllm-raw``; the key itself is never written anywhere.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import socket
import stat
import struct
import time
import zlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from kvclaims.contract.schema import (ARROW_SCHEMA, RECORDER_VERSION, SCHEMA_VERSION, InputError,
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
    "recorder_errors", "complete", "batch_checksum", "hash_scheme", "hash_key_id", "clock",
    "write_failures", "sealed"})

# A closed run's events, sealed into one Parquet file (plain strings, zstd, page checksums)
# that readers scan directly; the IPC segments stay beside it (the crash-safe source).
SEALED_NAME: Final[str] = "events.parquet"
SEAL_ROW_GROUP: Final[int] = 1 << 18
# The sealed file's content checksum in the manifest (``sealed.sha256``): Parquet's page CRCs
# do not cover the footer (row-group statistics that DuckDB prunes by), this covers every byte.
SEALED_CHECKSUM: Final[str] = "sha256"
_HASH_CHUNK: Final[int] = 1 << 20


def open_regular(path: str | Path) -> int:
    """Open ``path`` read-only and return the descriptor; raise ``OSError`` unless it is a
    regular file.

    NOTE: ``O_NONBLOCK``: opening a FIFO for reading would otherwise wait for a writer
    forever; the type is then checked on the open descriptor (no swap between check and use).
    """
    fd = os.open(str(path), os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file (a FIFO, device or socket "
                                        "is never read)")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def file_sha256(path: str | Path) -> tuple[str, int]:
    """``(hex SHA-256, size)`` of a regular file's bytes, read in 1 MiB chunks (the hash
    releases the GIL). Raises ``OSError`` for a file that is not regular or unreadable."""
    fd = open_regular(path)
    h = hashlib.sha256()
    size = 0
    with os.fdopen(fd, "rb", buffering=0) as fh:
        while True:
            chunk = fh.read(_HASH_CHUNK)
            if not chunk:
                break
            size += len(chunk)
            h.update(chunk)
    return h.hexdigest(), size

# -- batch checksums --------------------------------------------------------------------------

# The custom-metadata value of every record batch: "kvcrc32:" + 8 lower-case hex digits. The
# writer serialises the batch with the placeholder, computes the CRC over the group's bytes,
# then patches the digits in place (same length, so the flatbuffer stays valid).
CHECKSUM_KEY: Final[str] = "kvclaims.crc32"
CHECKSUM_TAG: Final[bytes] = b"kvcrc32:"
CHECKSUM_PLACEHOLDER: Final[bytes] = b"--------"
CHECKSUM_SCHEME: Final[str] = "crc32-group"
_CONTINUATION: Final[bytes] = b"\xff\xff\xff\xff"
END_OF_STREAM: Final[bytes] = _CONTINUATION + b"\x00\x00\x00\x00"
HEADER_SCHEMA: Final[int] = 1
HEADER_DICTIONARY: Final[int] = 2
HEADER_RECORD_BATCH: Final[int] = 3  # MessageHeader union: 1 Schema, 2 Dictionary, 3 Batch


def message_header(meta: bytes | memoryview) -> tuple[int, int]:
    """Read ``(header_type, bodyLength)`` from an IPC message's flatbuffer ``Message`` table.

    Fields: 0 version (short), 1 header_type (ubyte), 2 header (offset), 3 bodyLength (long).
    Raises ``struct.error`` on a table that points outside ``meta``.
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


def iter_messages(data: bytes | bytearray | memoryview
                  ) -> Iterator[tuple[int, int, int, int, int]]:
    """Yield ``(start, meta_start, meta_end, end, kind)`` for each complete message in ``data``.

    Only for bytes this module produced itself (well-formed, no end-of-stream marker); the
    loader has its own defensive walk.
    """
    pos = 0
    size = len(data)
    while pos + 8 <= size:
        meta_len = struct.unpack_from("<i", data, pos + 4)[0]
        meta_start = pos + 8
        kind, body = message_header(memoryview(data)[meta_start:meta_start + meta_len])
        end = meta_start + meta_len + body
        yield pos, meta_start, meta_start + meta_len, end, kind
        pos = end


def batch_group_crc(data: bytes | bytearray | memoryview, meta_start: int, meta_end: int,
                    tag_at: int) -> int:
    """CRC-32 of one batch group with the checksum digits read as the placeholder.

    ``data`` is the group (every byte since the previous record batch ended, through this
    record batch's body); ``meta_start..meta_end`` is the record batch message's metadata and
    ``tag_at`` the offset of ``CHECKSUM_TAG`` inside ``data``.
    NOTE: covers every byte of the group (schema or dictionary messages, the batch's
    metadata and body), so any flipped bit is caught, wherever it lands.
    """
    view = memoryview(data)
    digits = tag_at + len(CHECKSUM_TAG)
    crc = zlib.crc32(view[:digits])
    crc = zlib.crc32(CHECKSUM_PLACEHOLDER, crc)
    return zlib.crc32(view[digits + len(CHECKSUM_PLACEHOLDER):], crc)


def find_checksum_tag(data: bytes | bytearray | memoryview, meta_start: int,
                      meta_end: int) -> int:
    """Offset (in ``data``) of ``CHECKSUM_TAG`` inside a record batch's metadata, or -1."""
    chunk = bytes(memoryview(data)[meta_start:meta_end])
    i = chunk.rfind(CHECKSUM_TAG)
    return -1 if i < 0 or i + len(CHECKSUM_TAG) + 8 > len(chunk) else meta_start + i


def _seal_group(data: bytearray) -> None:
    """Patch the CRC of a freshly serialised group into its record batch's metadata."""
    last = None
    for msg in iter_messages(data):
        last = msg
    assert last is not None and last[4] == HEADER_RECORD_BATCH
    _start, meta_start, meta_end, _end, _kind = last
    tag_at = find_checksum_tag(data, meta_start, meta_end)
    assert tag_at >= 0, "record batch serialised without its checksum placeholder"
    crc = batch_group_crc(data, meta_start, meta_end, tag_at)
    digits = tag_at + len(CHECKSUM_TAG)
    data[digits:digits + 8] = b"%08x" % crc


# -- keyed content hashes ---------------------------------------------------------------------

HASH_KEYED: Final[str] = "keyed-siphash24-64"
HASH_RAW: Final[str] = "vllm-raw"
HASH_IMPORTED: Final[str] = "imported"   # kept exactly as the imported file had them
HASH_SCHEMES: Final[tuple[str, ...]] = (HASH_KEYED, HASH_RAW, HASH_IMPORTED)
# Environment: a file holding the deployment's key material (any bytes; the operator controls
# and rotates it), and the scheme (``vllm-raw`` keeps vLLM's hashes for joining its KV events).
ENV_HASH_KEY_FILE: Final[str] = "KVCLAIMS_HASH_KEY_FILE"
ENV_HASH_SCHEME: Final[str] = "KVCLAIMS_HASH_SCHEME"
HASHED_COLUMNS: Final[tuple[str, ...]] = ("block_hash", "parent_hash")

_M64 = (1 << 64) - 1


def _rotl_into(x: np.ndarray, b: int, tmp: np.ndarray) -> None:
    """x = rotl(x, b), in place (``tmp`` is scratch of the same shape)."""
    np.right_shift(x, np.uint64(64 - b), out=tmp)
    np.left_shift(x, np.uint64(b), out=x)
    np.bitwise_or(x, tmp, out=x)


def _sipround(v0: np.ndarray, v1: np.ndarray, v2: np.ndarray, v3: np.ndarray,
              tmp: np.ndarray) -> None:
    """One SipRound on the four state vectors, in place (no temporaries per step)."""
    v0 += v1
    _rotl_into(v1, 13, tmp)
    v1 ^= v0
    _rotl_into(v0, 32, tmp)
    v2 += v3
    _rotl_into(v3, 16, tmp)
    v3 ^= v2
    v0 += v3
    _rotl_into(v3, 21, tmp)
    v3 ^= v0
    v2 += v1
    _rotl_into(v1, 17, tmp)
    v1 ^= v2
    _rotl_into(v2, 32, tmp)


def siphash64(key: bytes, values: np.ndarray) -> np.ndarray:
    """SipHash-2-4 (a keyed PRF) of each uint64 in ``values``, message = its 8 little-endian
    bytes, vectorised over the array. ``key`` is 16 bytes. Matches the reference
    implementation's test vectors (tests/test_trace_writer.py)."""
    k0, k1 = (np.uint64(int.from_bytes(key[i:i + 8], "little")) for i in (0, 8))
    m = np.ascontiguousarray(values, dtype=np.uint64)
    v0 = np.full_like(m, k0 ^ np.uint64(0x736F6D6570736575))
    v1 = np.full_like(m, k1 ^ np.uint64(0x646F72616E646F6D))
    v2 = np.full_like(m, k0 ^ np.uint64(0x6C7967656E657261))
    v3 = np.full_like(m, k1 ^ np.uint64(0x7465646279746573))
    tmp = np.empty_like(m)
    v3 ^= m
    for _ in range(2):
        _sipround(v0, v1, v2, v3, tmp)
    v0 ^= m
    b = np.uint64(8 << 56)  # the final block: message length 8, no tail bytes
    v3 ^= b
    for _ in range(2):
        _sipround(v0, v1, v2, v3, tmp)
    v0 ^= b
    v2 ^= np.uint64(0xFF)
    for _ in range(4):
        _sipround(v0, v1, v2, v3, tmp)
    v0 ^= v1
    v2 ^= v3
    v0 ^= v2
    return v0


def key_id(key: bytes) -> str:
    """A non-secret name for a key: equal ids mean hashes that can be compared across runs."""
    return hashlib.blake2b(key, digest_size=8, person=b"kvclaims-keyid").hexdigest()


def derive_key(material: bytes) -> bytes:
    """The 16-byte SipHash key for any key material (a file's bytes)."""
    return hashlib.blake2b(material, digest_size=16, person=b"kvclaims-hashkey").digest()


def resolve_hash_key(scheme: str | None, key: bytes | None) -> tuple[str, bytes | None]:
    """Pick the hash scheme and key: arguments first, then the environment, then a random
    per-run key (held in memory only). Raises ``InputError`` for an unknown scheme or an
    unreadable key file."""
    scheme = scheme or os.environ.get(ENV_HASH_SCHEME) or HASH_KEYED
    if scheme not in HASH_SCHEMES:
        raise InputError(f"hash scheme {scheme!r} is not one of {', '.join(HASH_SCHEMES)} "
                         f"(argument or ${ENV_HASH_SCHEME})")
    if scheme != HASH_KEYED:
        return scheme, None
    if key is not None:
        return scheme, derive_key(key)
    path = os.environ.get(ENV_HASH_KEY_FILE)
    if path:
        try:
            material = Path(path).read_bytes()
        except OSError as exc:
            raise InputError(f"{path}: cannot read the hash key file "
                             f"(${ENV_HASH_KEY_FILE}): {exc.strerror or exc}") from None
        if len(material.strip()) < 16:
            raise InputError(f"{path}: hash key file holds fewer than 16 bytes")
        return scheme, derive_key(material.strip())
    return scheme, derive_key(os.urandom(32))


def keyed_hash_column(key: bytes, col: pa.Array) -> pa.Array:
    """A uint64 column with every non-null value replaced by its keyed hash (nulls kept)."""
    if col.null_count == len(col):
        return col
    values = np.asarray(pc.fill_null(col, 0).to_numpy(zero_copy_only=False), dtype=np.uint64)
    hashed = siphash64(key, values)
    mask = np.asarray(col.is_null().to_numpy(zero_copy_only=False)) if col.null_count else None
    return pa.array(hashed, type=pa.uint64(), mask=mask)


def hash_batch(key: bytes, batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` with its content-hash columns keyed (equal inputs stay equal)."""
    arrays = list(batch.columns)
    for name in HASHED_COLUMNS:
        i = batch.schema.get_field_index(name)
        arrays[i] = keyed_hash_column(key, arrays[i])
    return pa.RecordBatch.from_arrays(arrays, schema=batch.schema)


# -- wall clock -------------------------------------------------------------------------------

def clock_anchor() -> dict[str, Any]:
    """The run's wall-clock anchor: UTC now, the monotonic clock the events use, the host.

    NOTE: events carry ``time.monotonic_ns()`` (``ts_ns``); UTC of an event is
    ``utc_ns + (ts_ns - monotonic_ns)``. Both clocks are read back to back.
    """
    mono = time.monotonic_ns()
    utc_ns = time.time_ns()
    sec, ns = divmod(utc_ns, 1_000_000_000)
    iso = datetime.fromtimestamp(sec, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    return {"utc": f"{iso}.{ns:09d}Z", "utc_ns": utc_ns, "monotonic_ns": mono,
            "host": socket.gethostname()}


# -- files ------------------------------------------------------------------------------------

def segment_name(index: int) -> str:
    """File name of segment number ``index`` (``events-000000.arrows``)."""
    return f"{SEGMENT_PREFIX}{index:06d}{SEGMENT_SUFFIX}"


@contextmanager
def replacing(final: Path) -> Iterator[Path]:
    """Yield a tmp path beside ``final``; once the block wrote it, fsync it and rename it over
    ``final``. A failure removes the tmp file (a full disk must not keep a half file around).

    NOTE: readers see either the old file or the new one, never a half-written one.
    """
    tmp = final.with_name(final.name + ".tmp")
    try:
        yield tmp
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, final)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise


@contextmanager
def atomic_output(out: str | Path) -> Iterator[Path]:
    """``replacing`` for a file a command writes on request (``--out``): a failure to write is
    one line (``InputError``) and leaves an existing ``out`` untouched."""
    try:
        with replacing(Path(out)) as tmp:
            yield tmp
    except OSError as exc:
        raise InputError(f"{out}: cannot write: {exc.strerror or exc}") from None


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write ``obj`` as JSON to ``path`` so that readers see either the old or the new file.

    NOTE: tmp + fsync + ``os.replace``: a crash mid-write leaves the previous manifest intact.
    A failed write removes its tmp file (a full disk must not keep a half file around).
    """
    data = json.dumps(obj, indent=2, ensure_ascii=False) + "\n"
    with replacing(path) as tmp:
        tmp.write_text(data, encoding="utf-8")


class WriteError(OSError):
    """A batch could not be appended (disk full, I/O error, or backing off after one); the
    segment was rolled back to its last complete batch and the batch is lost."""


class _Capture:
    """A write-only in-memory file for pyarrow's stream writer: collects what it writes."""

    closed = False

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.pos = 0

    def write(self, data: Any) -> int:
        b = bytes(data)
        self.chunks.append(b)
        self.pos += len(b)
        return len(b)

    def take(self) -> bytearray:
        out = bytearray(b"".join(self.chunks))
        self.chunks.clear()
        return out

    def tell(self) -> int:
        return self.pos

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def writable(self) -> bool:
        return True


def _write_all(fd: int, data: bytes | bytearray) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:  # pragma: no cover - os.write raises instead
            raise OSError(errno.EIO, "short write")
        view = view[n:]


class _Segment:
    """One open IPC stream segment and its running statistics.

    NOTE: pyarrow serialises into memory (``_Capture``); this class appends whole batch groups
    to the file. After a failed append the file is truncated back to ``size`` and the stream
    serialiser is replaced: its dictionary state included the lost batch. The next batch then
    starts with a fresh serialiser whose schema message is dropped (the file has one) and which
    re-sends every dictionary, a valid continuation of the stream.
    """

    def __init__(self, path: Path, options: pa.ipc.IpcWriteOptions) -> None:
        self.path = path
        self.options = options
        # NOTE: unbuffered fd: every batch reaches the OS as it is written, so a crash
        # of the engine process loses nothing already handed to the writer.
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        self.opened_at = time.monotonic()
        self.size = 0            # bytes in the file, always at the end of a complete group
        self.events = 0
        self.first_seq: int | None = None
        self.last_seq: int | None = None
        self.eos = False
        self._cap: _Capture | None = None
        self._stream: Any = None

    def _serialiser(self) -> tuple[_Capture, Any]:
        if self._stream is None:
            self._cap = _Capture()
            self._stream = pa.ipc.new_stream(pa.PythonFile(self._cap, mode="w"), ARROW_SCHEMA,
                                             options=self.options)
        assert self._cap is not None
        return self._cap, self._stream

    def _reset_serialiser(self) -> None:
        self._stream = None
        self._cap = None

    def write(self, batch: pa.RecordBatch) -> None:
        """Append one batch group; on failure truncate back and raise ``WriteError``.

        NOTE: a fresh serialiser per batch makes every group self-contained (it re-sends every
        dictionary), so a reader can skip a damaged group and still decode the next one.
        """
        self._reset_serialiser()
        cap, stream = self._serialiser()
        stream.write_batch(batch, custom_metadata={
            CHECKSUM_KEY: (CHECKSUM_TAG + CHECKSUM_PLACEHOLDER).decode()})
        data = cap.take()
        self._reset_serialiser()
        if self.size > 0:
            # NOTE: the serialiser begins with the schema message; the file has it already
            first = next(iter_messages(data))
            assert first[4] == HEADER_SCHEMA
            del data[:first[3]]
        _seal_group(data)
        try:
            _write_all(self.fd, data)
        except OSError as exc:
            self._rollback()
            raise WriteError(exc.errno, f"{self.path.name}: {exc.strerror or exc}") from exc
        self.size += len(data)
        n = batch.num_rows
        seqs = batch.column(1)  # NOTE: "seq" is column 1 of ARROW_SCHEMA
        if self.first_seq is None:
            self.first_seq = seqs[0].as_py()
        self.last_seq = seqs[n - 1].as_py()
        self.events += n

    def _rollback(self) -> None:
        self._reset_serialiser()
        try:
            os.ftruncate(self.fd, self.size)
            os.lseek(self.fd, self.size, os.SEEK_SET)
        except OSError:  # pragma: no cover - truncation of a regular file does not fail
            pass

    @property
    def bytes(self) -> int:
        return self.size

    def entry(self) -> dict[str, Any]:
        """This segment's manifest entry."""
        out = {"file": self.path.name, "events": self.events, "bytes": self.size,
               "first_seq": self.first_seq, "last_seq": self.last_seq}
        if not self.eos:
            out["eos"] = False
        return out

    def close(self) -> dict[str, Any]:
        """Write the end-of-stream marker (if the disk allows), close the file, return its
        manifest entry. A missing marker is recorded as ``eos: false``."""
        try:
            _write_all(self.fd, END_OF_STREAM)
            self.size += len(END_OF_STREAM)
            self.eos = True
        except OSError:
            self._rollback()
        finally:
            try:
                os.close(self.fd)
            except OSError:  # pragma: no cover
                pass
        return self.entry()


def plain_schema() -> pa.Schema:
    """``ARROW_SCHEMA`` with dictionary strings as plain strings (what readers get)."""
    return pa.schema([pa.field(f.name, f.type.value_type if pa.types.is_dictionary(f.type)
                               else f.type, nullable=f.nullable) for f in ARROW_SCHEMA],
                     metadata=ARROW_SCHEMA.metadata)


def _plain(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """``batch`` in ``schema``, by column name: a segment of an older schema version lacks the
    columns added since, which are null."""
    cols = []
    for f in schema:
        i = batch.schema.get_field_index(f.name)
        c = batch.column(i) if i >= 0 else pa.nulls(batch.num_rows, f.type)
        cols.append(c.dictionary_decode() if pa.types.is_dictionary(c.type) else c)
    return pa.RecordBatch.from_arrays(cols, schema=schema)


def seal_segments(run_dir: Path, files: list[str]) -> dict[str, Any]:
    """Write the events of a closed run's segments as ``events.parquet``; return its manifest
    entry ``{file, format, events, bytes}``.

    NOTE: written to a tmp file, fsynced and renamed, so a crash mid-seal leaves no sealed
    file (readers then use the segments). Page checksums let readers detect a damaged page;
    ``sha256`` (of every byte, the footer's statistics included) lets them refuse any change.
    """
    schema = plain_schema()
    final = run_dir / SEALED_NAME
    rows = 0
    pending: list[pa.RecordBatch] = []
    with replacing(final) as tmp:
        with pq.ParquetWriter(str(tmp), schema, compression="zstd",
                              write_page_checksum=True) as out:
            def flush() -> None:
                if pending:
                    out.write_table(pa.Table.from_batches(pending, schema=schema))
                    pending.clear()

            for name in files:
                with pa.memory_map(str(run_dir / name), "r") as src:
                    for batch in pa.ipc.open_stream(src):
                        pending.append(_plain(batch, schema))
                        rows += batch.num_rows
                        if sum(b.num_rows for b in pending) >= SEAL_ROW_GROUP:
                            flush()
            flush()
        digest, size = file_sha256(tmp)
    return {"file": SEALED_NAME, "format": "parquet", "events": rows, "bytes": size,
            SEALED_CHECKSUM: digest}


class RunWriter:
    """Write one run's events as rotated Arrow IPC stream segments plus ``manifest.json``.

    ``run_info`` holds the run facts (``run_id`` is required; ``runtime``, ``runtime_version``,
    ``model``, ``block_size``, ``num_blocks``, ``usable_blocks``, ``policy`` default to None)
    and any extra JSON-serialisable keys, which the manifest carries unchanged.

    ``hash_scheme``: ``keyed-siphash24-64`` (default; key from ``hash_key``, else the file named
    by ``$KVCLAIMS_HASH_KEY_FILE``, else a random key held only in memory), ``vllm-raw`` (keep
    the runtime's hashes) or ``imported`` (importers: keep the file's values). ``clock``: record
    the wall-clock anchor (importers pass False: their source has none).

    On a write error (disk full, I/O error) ``write_batch`` rolls the segment back to its last
    complete batch and raises ``WriteError``; later calls raise at once until a back-off delay
    has passed (doubling from 50 ms to 5 s), so the caller never waits on a failing disk.

    Not thread-safe: one caller (the ``EventBuffer``'s writer thread, or an importer) at a time.
    """

    BACKOFF_FIRST_S: Final[float] = 0.05
    BACKOFF_MAX_S: Final[float] = 5.0

    def __init__(self, run_dir: str | Path, run_info: Mapping[str, Any], *,
                 rotate_bytes: int = 8 * MiB, rotate_seconds: float = 60.0,
                 compression: str | None = "zstd", hash_scheme: str | None = None,
                 hash_key: bytes | None = None, clock: bool = True,
                 seal: bool = True) -> None:
        self.run_dir = Path(run_dir)
        # NOTE: most of the 40 columns are null for any one event; uncompressed they still
        # cost their full width on disk. IPC buffer compression makes them nearly free, and
        # pyarrow compresses without holding the GIL.
        self._ipc_options = pa.ipc.IpcWriteOptions(compression=compression)
        self.rotate_bytes = int(rotate_bytes)
        self.rotate_seconds = float(rotate_seconds)
        self.seal = bool(seal)
        scheme, self._hash_key = resolve_hash_key(hash_scheme, hash_key)
        self._manifest = _initial_manifest(run_info)
        self._manifest.update({
            "batch_checksum": CHECKSUM_SCHEME, "hash_scheme": scheme,
            "hash_key_id": key_id(self._hash_key) if self._hash_key else None,
            "clock": clock_anchor() if clock else None, "write_failures": 0})
        self._segments: list[dict[str, Any]] = []
        self._current: _Segment | None = None
        self._closed = False
        self._retry_at = 0.0
        self._backoff = 0.0
        self._manifest_dirty = False
        self.last_write_error: str | None = None
        _prepare_run_dir(self.run_dir)
        # at open: a run that crashes still has a manifest (here a failure is the caller's)
        write_json_atomic(self.run_dir / MANIFEST_NAME, self._manifest_on_disk())

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
    def hash_scheme(self) -> str:
        """How block hashes are written (``keyed-siphash24-64``, ``vllm-raw``, ``imported``)."""
        return self._manifest["hash_scheme"]

    def key_hashes(self, values: Any) -> np.ndarray:
        """Map runtime hash values (uint64s) the way this run writes them: keyed, or as they
        are (``vllm-raw``, ``imported``). For code that must match the trace's hashes, e.g.
        claims declared beside the engine as block-hash chains."""
        arr = np.asarray(values, dtype=np.uint64)
        return siphash64(self._hash_key, arr) if self._hash_key is not None else arr

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
        dictionary when they change, and readers decode each batch with its own. Raises
        ``WriteError`` when the batch could not be written (nothing of it stays on disk).
        """
        if self._closed:
            raise InputError(f"{self.run_dir}: writer is closed")
        if not batch.schema.equals(ARROW_SCHEMA, check_metadata=False):
            raise SchemaError(f"{self.run_dir}: batch schema differs from ARROW_SCHEMA")
        if batch.num_rows == 0:
            return
        now = time.monotonic()
        if now < self._retry_at:
            raise WriteError(errno.EAGAIN, f"{self.run_dir}: backing off after a write error "
                                           f"({self.last_write_error}); batch not written")
        if self._hash_key is not None:
            batch = hash_batch(self._hash_key, batch)
        try:
            if self._current is None:
                self._current = _Segment(self.run_dir / segment_name(len(self._segments)),
                                         self._ipc_options)
            self._current.write(batch)
        except OSError as exc:
            self._failed(exc)
            if self._current is not None and self._current.size == 0:
                self._discard_empty_segment()
            if isinstance(exc, WriteError):
                raise
            raise WriteError(exc.errno, f"{self.run_dir}: {exc.strerror or exc}") from exc
        self._backoff = 0.0
        self._manifest["events_written"] += batch.num_rows
        if self._should_rotate(self._current):
            self.rotate()
        elif self._manifest_dirty:
            self._try_write_manifest()

    def maybe_rotate(self) -> None:
        """Rotate if the open segment is due by size or age (called on idle ticks, so a quiet
        run still closes segments every ``rotate_seconds``); retry a manifest a failing disk
        refused."""
        if self._current is not None and self._should_rotate(self._current):
            self.rotate()
        elif self._manifest_dirty and time.monotonic() >= self._retry_at:
            self._try_write_manifest()

    def rotate(self) -> None:
        """Close the current segment (if any) and write the manifest; the next batch opens a
        new segment."""
        if self._current is None:
            return
        entry = self._current.close()
        self._current = None
        self._segments.append(entry)
        self._try_write_manifest()

    def close(self) -> None:
        """Close the last segment and write the final manifest with ``complete: true``.

        Idempotent. A manifest the disk refuses is retried for about a second (the run is
        shutting down; nothing waits on it), then left as the last one written and
        ``WriteError`` is raised (the caller counts it).
        """
        if self._closed:
            return
        if self._current is not None:
            self._segments.append(self._current.close())
            self._current = None
        self._closed = True
        self._manifest["complete"] = True
        if self.seal and self._segments and all(
                seg.get("eos", True) for seg in self._segments):
            try:
                self._manifest["sealed"] = seal_segments(
                    self.run_dir, [seg["file"] for seg in self._segments])
            except (OSError, pa.ArrowException) as exc:  # e.g. disk full: segments suffice
                self._manifest["write_failures"] += 1
                self.last_write_error = f"seal: {exc}"
        for delay in (0.0, 0.05, 0.1, 0.2, 0.3, 0.4):
            time.sleep(delay)
            if self._try_write_manifest():
                return
        raise WriteError(errno.EIO, f"{self.run_dir}: final manifest not written "
                                    f"({self.last_write_error}); the run reads as incomplete")

    def __enter__(self) -> RunWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ---------------------------------------------------------------------------
    def _failed(self, exc: OSError) -> None:
        """Count a failed write and back off before touching the disk again."""
        self._manifest["write_failures"] += 1
        self.last_write_error = f"{type(exc).__name__}: {exc.strerror or exc}"
        self._backoff = min(self.BACKOFF_MAX_S, max(self.BACKOFF_FIRST_S, self._backoff * 2))
        self._retry_at = time.monotonic() + self._backoff
        self._manifest_dirty = True

    def _discard_empty_segment(self) -> None:
        """A segment that never got a batch is removed (no empty unlisted files)."""
        seg = self._current
        self._current = None
        if seg is None:
            return
        try:
            os.close(seg.fd)
        except OSError:  # pragma: no cover
            pass
        try:
            seg.path.unlink()
        except OSError:  # pragma: no cover
            pass

    def _should_rotate(self, seg: _Segment) -> bool:
        return (seg.bytes >= self.rotate_bytes
                or time.monotonic() - seg.opened_at >= self.rotate_seconds)

    def _manifest_now(self) -> dict[str, Any]:
        segments = list(self._segments)
        if self._current is not None:
            segments.append(self._current.entry())
        return {**self._manifest, "segments": segments}

    def _manifest_on_disk(self) -> dict[str, Any]:
        # NOTE: only closed segments are listed; an open segment is found on disk by the loader
        # (it is the one a crash may have truncated).
        return {**self._manifest, "segments": list(self._segments)}

    def _try_write_manifest(self) -> bool:
        """Write the manifest; on failure keep it due (retried later) and return False."""
        try:
            write_json_atomic(self.run_dir / MANIFEST_NAME, self._manifest_on_disk())
        except OSError as exc:
            self._manifest["write_failures"] += 1
            self.last_write_error = f"manifest: {exc.strerror or exc}"
            self._manifest_dirty = True
            return False
        self._manifest_dirty = False
        return True


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
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"{run_dir}: cannot create the run directory: "
                         f"{exc.strerror or exc}") from None
    if (run_dir / MANIFEST_NAME).exists() or any(run_dir.glob(f"{SEGMENT_PREFIX}*{SEGMENT_SUFFIX}")):
        raise InputError(f"{run_dir}: already holds a run (manifest.json or segments); "
                         "choose a new directory")
