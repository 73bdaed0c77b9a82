"""Arrow record batches in the trace schema, built column-wise from Python lists.

What the recorder's writer thread (``kvclaims.recorder.buffer``) and the importers (JSON Lines, the
paper prototype's traces) share: pure functions, no engine state. Block hashes given as
``bytes`` (vLLM's ``BlockHashWithGroupId`` / ``BlockHash``) become the schema's 64-bit integers
(the digest's low 64 bits, like vLLM's own KV events), vectorised.
NOTE: this module must never import the engine's hot path (buffer, hooks, scheduler, arbiter):
the offline side imports it (tests/test_layout.py).
"""

from __future__ import annotations

import numbers
from typing import Any, Final

import numpy as np
import pyarrow as pa

from kvclaims.contract.schema import ARROW_SCHEMA, COLUMNS, ENVELOPE

_FIELD_COLUMNS: Final[tuple[str, ...]] = tuple(c for c in COLUMNS if c not in ENVELOPE)


def _kind(typ: pa.DataType) -> str:
    if pa.types.is_integer(typ):
        return "int"
    if pa.types.is_floating(typ):
        return "float"
    if pa.types.is_list(typ):
        return "list"
    return "str"


KINDS: Final[dict[str, str]] = {name: _kind(typ) for name, typ in COLUMNS.items()}
_type_ok_cache: dict[tuple[str, type], bool] = {}


def _type_ok(kind: str, typ: type) -> bool:
    """Whether a Python value of type ``typ`` may go into a column of ``kind``.

    NOTE: stricter than ``pa.array`` (which silently truncates 1.5 into an int column, takes
    bytes for strings and splits a str into a list): a value pyarrow would mangle is refused.
    numpy scalars are accepted (the engine may hand them in).
    """
    key = (kind, typ)
    ok = _type_ok_cache.get(key)
    if ok is None:
        if typ is type(None):
            ok = True
        elif issubclass(typ, bool):
            ok = False
        elif kind == "int":
            ok = issubclass(typ, numbers.Integral)
        elif kind == "float":
            ok = issubclass(typ, numbers.Real)
        elif kind == "list":
            ok = typ in (list, tuple)
        else:
            ok = issubclass(typ, str)
        _type_ok_cache[key] = ok
    return ok


# Hash columns that take vLLM's raw digests (bytes) and how many trailing bytes to strip first:
# ``block_hash`` carries BlockHashWithGroupId (4-byte group id appended), ``parent_hash`` a plain
# BlockHash.
_HASH_STRIP: Final[dict[str, int]] = {"block_hash": 4, "parent_hash": 0}


def _hash_ints(values: list[Any], strip: int) -> list[Any]:
    """Turn vLLM digests (bytes) in a hash column into their low-64-bit integers.

    NOTE: vectorised when every value is bytes of one length (the usual case: one hash
    function per engine); ints and None pass through unchanged otherwise.
    """
    types = set(map(type, values))
    if bytes not in types:
        return values
    if types == {bytes}:
        width = len(values[0])
        if width >= 8 + strip and all(len(v) == width for v in values):
            raw = np.frombuffer(b"".join(values), dtype=np.uint8).reshape(len(values), width)
            low = raw[:, width - strip - 8:width - strip]
            return np.ascontiguousarray(low).view(">u8").ravel().astype(np.uint64).tolist()
    return [_hash_one(v, strip) if isinstance(v, bytes) else v for v in values]


def _hash_one(value: bytes, strip: int) -> int:
    body = value[:len(value) - strip] if strip else value
    return int.from_bytes(body[-8:], "big", signed=False)


def value_problem(name: str, value: Any) -> str | None:
    """Describe why ``value`` cannot go into column ``name``, or None if it can."""
    if isinstance(value, bytes) and name in _HASH_STRIP:
        value = _hash_one(value, _HASH_STRIP[name])
    kind = KINDS[name]
    if not _type_ok(kind, type(value)):
        return f"field '{name}' has wrong type {type(value).__name__}"
    if kind == "list" and value is not None and not all(isinstance(x, str) for x in value):
        return f"field '{name}' must be a list of strings"
    try:
        pa.array([value], COLUMNS[name])
    except (pa.ArrowException, OverflowError, TypeError, ValueError) as exc:
        return f"field '{name}' value {value!r} does not fit {COLUMNS[name]}: {exc}"
    return None


def _column_array(name: str, values: list[Any]) -> pa.Array:
    kind = KINDS[name]
    if name in _HASH_STRIP:
        values = _hash_ints(values, _HASH_STRIP[name])
    for typ in set(map(type, values)):  # NOTE: a handful of distinct types: cheap
        if not _type_ok(kind, typ):
            raise TypeError(f"field '{name}' has wrong type {typ.__name__}")
    if kind == "list":
        for v in values:
            if v is not None and not all(isinstance(x, str) for x in v):
                raise TypeError(f"field '{name}' must be a list of strings")
    return pa.array(values, COLUMNS[name])


def _step_array(seqs: list[int], marks: list[tuple[int, int]] | None) -> pa.Array | None:
    """The ``step`` column: each seq takes the step of the last mark at or before it."""
    if not marks or not seqs:
        return None
    mark_seqs = np.fromiter((m[0] for m in marks), dtype=np.int64, count=len(marks))
    mark_steps = np.fromiter((m[1] for m in marks), dtype=np.int64, count=len(marks))
    idx = np.searchsorted(mark_seqs, np.asarray(seqs, dtype=np.int64), side="right") - 1
    before = idx < 0
    steps = mark_steps[np.maximum(idx, 0)]
    return pa.array(steps, pa.int64(), mask=before if before.any() else None)


def build_batch(seqs: list[int], ts: list[int], events: list[str],
                run_ids: str | list[str], columns: dict[str, list[Any]],
                step_marks: list[tuple[int, int]] | None = None) -> pa.RecordBatch:
    """Build one ``ARROW_SCHEMA`` batch from column lists (missing columns are all null).

    ``run_ids`` is one id for every row (the recorder) or one per row (importers).
    ``step_marks`` (``(first_seq, step)``, ascending) fill the ``step`` column unless
    ``columns`` has one. Raises (TypeError, ArrowException, OverflowError, ...) if a value does
    not fit its column.
    """
    n = len(seqs)
    if isinstance(run_ids, str):
        run_col = pa.DictionaryArray.from_arrays(pa.array([0] * n, pa.int32()),
                                                 pa.array([run_ids], pa.string()))
    else:
        run_col = pa.array(run_ids, COLUMNS["run_id"])
    arrays: list[pa.Array] = [run_col, pa.array(seqs, pa.int64()), pa.array(ts, pa.int64()),
                              pa.array(events, COLUMNS["event"])]
    steps = None if "step" in columns else _step_array(seqs, step_marks)
    for name in _FIELD_COLUMNS:
        values = columns.get(name)
        if name == "step" and steps is not None:
            arrays.append(steps)
        else:
            arrays.append(pa.nulls(n, COLUMNS[name]) if values is None
                          else _column_array(name, values))
    return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)
