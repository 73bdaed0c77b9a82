"""The reconstruction facade: a trace in, the reconstructed tables (``TABLE_NAMES``) out.

``reconstruct(trace)`` runs small stateless stages, one SQL file each (``reconstruct/sql/``),
over a DuckDB connection that exposes the trace as the relation ``events``:

=====================  ======================================================================
``01_runs.sql``        per-run facts: policy, usable blocks, first hole (gap, seq hole, truncation)
``02_claims.sql``      claim instances (``claim_seq``: ``reconstruct/identity.py``'s ordered
                       pass per run, before the SQL) and their lifecycle facts
``03_pass``             the labelling pass, Python, no SQL file: one ordered, compiled pass per
                       run (``reconstruct/labels.py``): losses, labels, predicates, pool
                       snapshots (``PASS_TABLES``)
``04_labels.sql``      ``losses`` (``loss_claims``, one row per loss x bound claim instance,
                       is the pass's own output)
``05_feasibility.sql`` ``feasibility``, rebuilt from the pass's pool snapshots
``06_outcomes.sql``    ``claims``, ``requests``
``07_findings.sql``    ``findings``: holes, disagreements with the runtime, violations, anomalies
``08_conformance.sql`` ``conformance`` and ``lowering``: the verdicts (docs/conformance.md)
=====================  ======================================================================

The semantics are in docs/design.md; the exact rules are in docs/reconstruction.md.

NOTE: every stage orders by ``seq`` within a run and joins on ``run_id``: runs never mix.
NOTE: memory is bounded by DuckDB's ``memory_limit`` (it spills to ``temp_directory``) plus
one window of events in stage 03 (``labels.WINDOW_ROWS``) and the claim ids of a run in
stage 02; the streamed passes write their tables as Parquet files (``reconstruct/sink.py``);
the SQL stages run window functions only over request, decision and claim-reference rows,
never over every event or every claim event.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Final

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from kvclaims.contract.policies import MODE_ENFORCEMENT, POLICIES
from kvclaims.contract.schema import InputError
from kvclaims.contract.vocabulary import (PINNING_MODES, PROTECTION_MODES, RESIDENCY_MODES,
                                          TABLE_NAMES, VERDICT_TABLES, fill_sql, sql_string)
from kvclaims.reconstruct import checks, identity, labels
from kvclaims.reconstruct.sink import created_table
from kvclaims.contract import policies
from kvclaims.reconstruct import loader
from kvclaims.sources.jsonl import read_jsonl

# The stages in order: SQL files under reconstruct/sql/, and the labelling pass (PASS_STAGE).
PASS_STAGE: Final[str] = "03_pass"
# NOTE: claim identity (reconstruct/identity.py) runs before this stage's SQL
CLAIMS_STAGE: Final[str] = "02_claims.sql"
STAGES: Final[tuple[str, ...]] = (
    "01_runs.sql", "02_claims.sql", PASS_STAGE, "04_labels.sql", "05_feasibility.sql",
    "06_outcomes.sql", "07_findings.sql", "08_conformance.sql")
# What the labelling pass writes, one row per:
#   kv_losses           block loss: run_id, seq, ts_ns, block_id, block_hash, cause,
#                       by_request_id, label, claim_ids, decided_by_seq, decided_by_claim_id,
#                       claim_seq (of the deciding instance), was_resident, synthetic, step,
#                       repaired_in_step, reported_hash, held_hash, pinned_in_force (a
#                       pinning instance in force), covered / covered_harm (a bound
#                       instance accepted before it; one labelling it harm)
#   loss_claims         (loss, bound claim instance), in its final shape (the reconstructed
#                       table; labels.LOSS_CLAIMS_DDL), the instance facts from kv_claim_facts
#   kv_pred             interval where an instance's predicate holds: run_id, claim_id,
#                       claim_seq, from_seq, to_seq (NULL: still holds at the end of the run)
#   kv_materialized     materialized instance: run_id, claim_id, claim_seq, materialized_seq
#   kv_copies           copy overwritten without an eviction: run_id, block_id, block_hash,
#                       start_seq, end_seq, end_kind ('overwritten')
#   kv_admission_state  admission decision or preemption: run_id, seq, request_id,
#                       protected_blocks, protected_claim_seqs, protected_claim_ids
#                       (their claim ids, distinct, sorted), cached_blocks,
#                       evictable_blocks, held_blocks, live_blocks (held, not protected:
#                       the active live KV of seed 000)

# Policy names written by the paper's prototype (imported traces keep them) that enforce claims.
# NOTE: our own policies say it themselves (kvclaims.contract.policies.POLICIES[...].enforce).
PROTOTYPE_ENFORCING: Final[dict[str, str]] = {
    "hard_resident_exclude": "hard_protected",
    "live_scheduler_hard_exclude_pressure": "hard_protected",
    "claim_lifecycle_demote": "hard_protected",
    "claim_lifecycle_expire": "hard_protected",
}


def stage_sql(name: str) -> str:
    """The text of one stage's SQL file (shipped as package data), its vocabulary terms
    (``vocabulary.fill_sql``) and the check and lowering-class tables (``checks.fill_sql``)
    filled in."""
    return checks.fill_sql(fill_sql(resources.files("kvclaims.reconstruct")
                                    .joinpath("sql", name).read_text(encoding="utf-8")))


def split_statements(sql: str) -> list[str]:
    """Split a SQL file into statements: each ends with ';' at the end of a line.

    Full-line comments are dropped first (they may contain ';').
    """
    lines = [line for line in sql.splitlines() if not line.lstrip().startswith("--")]
    parts = re.split(r";[ \t]*$", "\n".join(lines), flags=re.MULTILINE)
    return [p.strip() for p in parts if p.strip()]


def _where(exc: BaseException, stage: str, i: int, n: int, stmt: str) -> str:
    """``exc``'s text with its first line saying which statement of which stage failed."""
    first, _, rest = str(exc).strip().partition("\n")
    made = created_table(stmt)
    what = f"{stage}, statement {i} of {n}" + (f" ({made})" if made else "")
    return f"{first} [in {what}]" + (f"\n{rest}" if rest else "")


@dataclass
class Tables:
    """The reconstructed tables, living in a DuckDB connection.

    Each table is fetched as Arrow on first access (``tables.losses``...); ``write`` copies
    them to Parquet without going through Python memory.
    """

    con: Any
    run_ids: list[str] = field(default_factory=list)
    _cache: dict[str, pa.Table] = field(default_factory=dict, repr=False)

    def table(self, name: str) -> pa.Table:
        """One reconstructed table as a ``pa.Table`` (cached)."""
        if name not in TABLE_NAMES and name not in VERDICT_TABLES:
            raise KeyError(name)
        if name not in self._cache:
            self._cache[name] = self.con.sql(f"SELECT * FROM {name}").to_arrow_table()
        return self._cache[name]

    def __getattr__(self, name: str) -> pa.Table:
        if name in TABLE_NAMES or name in VERDICT_TABLES:
            return self.table(name)
        raise AttributeError(name)

    def write(self, out_dir: str | Path, run_id: str | None = None) -> list[Path]:
        """Write every table as ``OUT_DIR/<table>.parquet`` (only ``run_id``'s rows if given).

        Streams record batches through pyarrow, so it works on a locked-down connection (no
        DuckDB file access) in bounded memory.
        """
        return write_tables(self.con, TABLE_NAMES, out_dir, run_id=run_id)

    def summary(self) -> list[dict[str, Any]]:
        """Per run: loss counts by label, claim outcomes, request outcomes, findings."""
        rows = self.con.sql(fill_sql("""
            SELECT r.run_id, r.policy, r.usable_blocks, r.n_events AS events,
                   r.unknown_from_seq, r.truncated,
                   (SELECT count(*) FROM losses l WHERE l.run_id = r.run_id) AS losses,
                   (SELECT map(list(label), list(n)) FROM (
                        SELECT label, count(*) AS n FROM losses l WHERE l.run_id = r.run_id
                        GROUP BY label ORDER BY label)) AS labels,
                   (SELECT map(list(outcome), list(n)) FROM (
                        SELECT outcome, count(*) AS n FROM claims c WHERE c.run_id = r.run_id
                        GROUP BY outcome ORDER BY outcome)) AS claim_outcomes,
                   (SELECT map(list(outcome), list(n)) FROM (
                        SELECT outcome, count(*) AS n FROM requests q WHERE q.run_id = r.run_id
                        GROUP BY outcome ORDER BY outcome)) AS request_outcomes,
                   (SELECT map(list(severity), list(n)) FROM (
                        SELECT severity, count(*) AS n FROM findings f
                        WHERE f.run_id = r.run_id AND severity <> {severity.hole}
                        GROUP BY severity ORDER BY severity)) AS findings
            FROM kv_runs r ORDER BY r.run_id""")).fetchall()
        cols = ["run_id", "policy", "usable_blocks", "events", "unknown_from_seq", "truncated",
                "losses", "labels", "claim_outcomes", "request_outcomes", "findings"]
        # NOTE: one shape: an empty count is {}, never null
        maps = {"labels", "claim_outcomes", "request_outcomes", "findings"}
        return [{c: (dict(v or {}) if c in maps else v) for c, v in zip(cols, row)}
                for row in rows]


def _sql_path(path: Path) -> str:
    return str(path).replace("'", "''")


# How the reconstructed tables are written. NOTE: no Parquet dictionary pages: hashing every
# value to build them was the writer's largest cost, and zstd compresses the repeated values
# (run ids, labels, causes) as well, so the files come out smaller; the content is the same.
WRITE_OPTIONS: Final[dict[str, Any]] = {"compression": "zstd", "use_dictionary": False}


def write_tables(con: Any, names: Sequence[str], out_dir: str | Path, *,
                 run_id: str | None = None) -> list[Path]:
    """Write tables of ``con`` as ``OUT_DIR/<name>.parquet`` (zstd, ``WRITE_OPTIONS``),
    ``run_id``'s rows only if given. Batches stream through pyarrow: memory stays bounded and
    DuckDB needs no file access (the audit connection has it disabled)."""
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"{out}: cannot create output directory: {exc.strerror}") from None
    paths = []
    for name in names:
        path = out / f"{name}.parquet"
        rel = con.table(name)
        if run_id is not None:
            rel = rel.filter(duckdb.ColumnExpression("run_id") == duckdb.ConstantExpression(run_id))
        reader = rel.to_arrow_reader(batch_size=1 << 16)
        try:
            with pq.ParquetWriter(str(path), reader.schema, **WRITE_OPTIONS) as writer:
                for batch in reader:
                    writer.write_batch(batch)
        except OSError as exc:
            raise InputError(f"{path}: cannot write: {exc}") from None
        paths.append(path)
    return paths


# DuckDB's size units (1000^i and 1024^i); a bare number is refused: its unit would be a guess.
_SIZE_RE: Final = re.compile(r"(\d+(?:\.\d+)?)\s*(B|KB|MB|GB|TB|KIB|MIB|GIB|TIB)", re.IGNORECASE)


def validate_memory_limit(text: str) -> str:
    """A ``--memory-limit`` value as DuckDB reads it (e.g. ``2GB``, ``512MiB``), or InputError.

    NOTE: the value is only ever passed to DuckDB as a bound parameter, never formatted into
    SQL; this check gives a clear message for a typo.
    """
    m = _SIZE_RE.fullmatch(str(text).strip())
    if m is None:
        raise InputError(f"--memory-limit {text!r}: expected a size such as 512MB, 2GB or "
                         "4GiB (units B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)")
    unit = m.group(2).upper().replace("I", "i")
    return f"{m.group(1)}{unit}"


def validate_temp_directory(path: str | Path) -> Path:
    """A spill directory: created if missing; InputError when it is not a usable directory."""
    p = Path(path)
    if "\0" in str(p):
        raise InputError("--temp-dir: path contains a NUL byte")
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"--temp-dir {p}: cannot create directory: {exc.strerror}") from None
    if not p.is_dir() or not os.access(p, os.W_OK):
        raise InputError(f"--temp-dir {p}: not a writable directory")
    return p


def configure(con: Any, *, memory_limit: str | None = None,
              temp_directory: str | Path | None = None, threads: int | None = None) -> None:
    """Bound DuckDB's memory: beyond ``memory_limit`` it spills to ``temp_directory``.

    NOTE: every value is validated, then bound as a parameter: never formatted into SQL.
    """
    if memory_limit:
        con.execute("SET memory_limit = ?", [validate_memory_limit(memory_limit)])
    if temp_directory:
        con.execute("SET temp_directory = ?", [str(validate_temp_directory(temp_directory))])
    if threads:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise InputError(f"threads must be a positive integer, not {threads!r}")
        con.execute("SET threads = ?", [threads])
    # NOTE: our outputs carry explicit ORDER BYs; not preserving scan order saves memory.
    con.execute("SET preserve_insertion_order = false")
    # NOTE: DuckDB's own progress bar would print into our stdout (CSV, JSON): ours is on stderr
    con.execute("SET enable_progress_bar = false")


def _policies_table() -> pa.Table:
    rows = [{"policy": p.name, "enforce": p.enforce, "default_mode": p.default_mode}
            for p in POLICIES.values()]
    rows += [{"policy": name, "enforce": True, "default_mode": mode}
             for name, mode in PROTOTYPE_ENFORCING.items()]
    assert all(r["default_mode"] in PINNING_MODES or not r["enforce"] for r in rows)
    return pa.Table.from_pylist(rows, schema=pa.schema(
        [("policy", pa.string()), ("enforce", pa.bool_()), ("default_mode", pa.string())]))


def _modes_table() -> pa.Table:
    """Every protection mode with what an enforcing policy does with it (kvclaims/contract/policies.py):
    the fallback of the ``lowering`` table when a manifest has no lowering section.

    ``enforced_verdict`` comes from ``kvclaims.contract.policies.ENFORCED_LOWERING`` where the recorder
    defines it (NULL otherwise: the SQL then derives it, docs/conformance.md "Lowering").
    """

    enforced: dict[str, tuple[str, str]] = policies.ENFORCED_LOWERING
    rows = [{"mode": m,
             "enforced_verdict": enforced[m][0] if m in enforced else None,
             "enforcement": enforced[m][1] if m in enforced else MODE_ENFORCEMENT.get(m),
             "residency": m in RESIDENCY_MODES}
            for m in PROTECTION_MODES]
    return pa.Table.from_pylist(rows, schema=pa.schema(
        [("mode", pa.string()), ("enforced_verdict", pa.string()), ("enforcement", pa.string()),
         ("residency", pa.bool_())]))


_MANIFEST_SCHEMA: Final[pa.Schema] = pa.schema(
    [("run_id", pa.string()), ("policy", pa.string()), ("usable_blocks", pa.int32()),
     ("truncated", pa.bool_()), ("evidence", pa.string()), ("source_format", pa.string())])

_LOWERING_SCHEMA: Final[pa.Schema] = pa.schema(
    [("run_id", pa.string()), ("mode", pa.string()), ("verdict", pa.string()),
     ("evidence", pa.string())])


def manifest_lowering_table(manifests: dict[str, dict[str, Any]] | None) -> pa.Table:
    """The manifest's ``lowering`` section ({mode: {"verdict", "evidence"}}) as rows.

    Entries that are not of that shape are skipped (the reconstruction then derives the
    verdict from the run policy; docs/conformance.md "Lowering").
    """
    rows = []
    for rid, m in sorted((manifests or {}).items()):
        lowering = m.get("lowering")
        if not isinstance(lowering, dict):
            continue
        for mode, entry in sorted(lowering.items()):
            if isinstance(entry, dict) and isinstance(entry.get("verdict"), str):
                ev = entry.get("evidence")
                rows.append({"run_id": rid, "mode": str(mode), "verdict": entry["verdict"],
                             "evidence": ev if isinstance(ev, str) else None})
    return pa.Table.from_pylist(rows, schema=_LOWERING_SCHEMA)


def manifest_table(manifests: dict[str, dict[str, Any]] | None,
                   truncated_runs: set[str] | None) -> pa.Table:
    """The per-run facts the reconstruction takes from outside the events."""
    manifests = manifests or {}
    truncated_runs = truncated_runs or set()
    rows = []
    for rid in sorted(set(manifests) | set(truncated_runs)):
        m = manifests.get(rid, {})
        usable = m.get("usable_blocks")
        rows.append({"run_id": rid,
                     "policy": m.get("policy") if isinstance(m.get("policy"), str) else None,
                     "usable_blocks": usable if isinstance(usable, int) else None,
                     "truncated": rid in truncated_runs,
                     # "observed": the stock-vLLM listener (no in-engine admissions/requests)
                     "evidence": m.get("evidence") if isinstance(m.get("evidence"), str)
                     else None,
                     # the format an import came from (kvclaims import --from ...)
                     "source_format": m.get("source_format")
                     if isinstance(m.get("source_format"), str) else None})
    return pa.Table.from_pylist(rows, schema=_MANIFEST_SCHEMA)


# NOTE: at this many events or more an audit keeps the SQL stages' tables in its database file,
# compressed as DuckDB writes them, instead of TEMP tables, which it holds in memory up to its
# memory_limit and spills uncompressed beyond it: a lower peak RSS for more CPU
# (benchmarks/audit_disk.py); the streamed passes' tables are compressed files at any size.
COMPACT_EVENTS: Final[int] = 200_000_000


def run_stages(con: Any, *, manifests: dict[str, dict[str, Any]] | None = None,
               truncated_runs: set[str] | None = None,
               progress: Callable[[str], None] | None = None, persist: bool = True,
               sources: dict[str, Path] | None = None,
               folder: str | Path | None = None) -> list[str]:
    """Run every stage on ``con`` (which must expose ``events``); return the run ids.

    ``sources`` maps a run id to the Parquet file holding its events in seq order
    (``stage_events``): the labelling pass reads them from there, not back from DuckDB.

    The streamed passes (claim identity, labelling) write their tables as Parquet files in
    ``folder`` (``reconstruct/sink.py``), read through views: it must live as long as ``con``
    is used. Without one, a temporary folder is made and removed once ``con`` is gone.

    ``persist=False`` makes the reconstructed tables TEMP tables: same contents, but in a
    file-backed database they are not compressed and written to its file (they still spill
    to ``temp_directory`` beyond ``memory_limit``). ``persist=True`` makes every table the
    SQL stages create, their ``kv_*`` intermediates included, a table of the database file:
    compressed as DuckDB writes it (``COMPACT_EVENTS``).
    """
    kv_manifest = manifest_table(manifests, truncated_runs)
    kv_policies = _policies_table()
    kv_manifest_lowering = manifest_lowering_table(manifests)
    kv_modes = _modes_table()
    con.register("kv_modes_in", kv_modes)
    con.execute("CREATE OR REPLACE TEMP TABLE kv_modes AS SELECT * FROM kv_modes_in")
    con.unregister("kv_modes_in")
    con.register("kv_manifest_in", kv_manifest)
    con.register("kv_policies_in", kv_policies)
    con.register("kv_manifest_lowering_in", kv_manifest_lowering)
    con.execute("CREATE OR REPLACE TEMP TABLE kv_manifest AS SELECT * FROM kv_manifest_in")
    con.execute("CREATE OR REPLACE TEMP TABLE kv_policies AS SELECT * FROM kv_policies_in")
    con.execute("CREATE OR REPLACE TEMP TABLE kv_manifest_lowering AS "
                "SELECT * FROM kv_manifest_lowering_in")
    for name in ("kv_manifest_in", "kv_policies_in", "kv_manifest_lowering_in"):
        con.unregister(name)
    if folder is None:
        # NOTE: named as an audit's folder: a killed process's is removed by a later run
        folder = tempfile.mkdtemp(prefix=f"{AUDIT_PREFIX}{os.getpid()}-")
        weakref.finalize(con, shutil.rmtree, folder, True)
    for stage in STAGES:
        if stage == CLAIMS_STAGE:  # claim identity (numba, streamed): reconstruct/identity.py
            identity.build(con, Path(folder) / "identity", sources=None if sources is None else
                           _file_batches(sources, identity.COLUMNS, identity.CODED))
        if stage == PASS_STAGE:  # the labelling pass (numba, streamed): reconstruct/labels.py
            labels.build(con, Path(folder) / "pass", sources=None if sources is None else
                         _file_batches(sources, labels.PASS_COLUMNS), persist=persist)
            if progress is not None:
                progress(stage)
            continue
        stmts = split_statements(stage_sql(stage))
        for i, stmt in enumerate(stmts, 1):
            try:
                con.execute(labels.persistence(stmt, persist))
            except duckdb.Error as exc:
                # NOTE: the same error type, its first line naming the statement that failed
                # (a stage of several statements: which one ran out of memory_limit)
                raise type(exc)(_where(exc, stage, i, len(stmts), stmt)) from exc
        if progress is not None:
            progress(stage)
    return [r[0] for r in con.sql("SELECT run_id FROM kv_runs ORDER BY run_id").fetchall()]


def reconstruct(trace: Any, *, con: Any = None, memory_limit: str | None = None,
                temp_directory: str | Path | None = None, threads: int | None = None,
                progress: Callable[[str], None] | None = None) -> Tables:
    """Reconstruct losses, labels, claim/request outcomes, feasibility and findings.

    ``trace`` is a loader ``Trace`` (``kvclaims.reconstruct.loader.load_runs``) or a ``pa.Table`` of
    events in the loader's schema (plain strings). Returns ``Tables`` bound to the DuckDB
    connection that holds them (``con`` if given).
    """
    con = duckdb.connect() if con is None else con
    configure(con, memory_limit=memory_limit, temp_directory=temp_directory, threads=threads)
    manifests: dict[str, dict[str, Any]] = {}
    truncated: set[str] = set()
    if isinstance(trace, pa.Table):
        con.register("events", trace)
    elif hasattr(trace, "events") and hasattr(trace, "manifests"):
        con.register("events", trace.events)
        manifests = dict(trace.manifests)
        truncated = set(getattr(trace, "truncated_runs", set()))
    else:
        raise TypeError(f"reconstruct() needs a Trace or a pa.Table, not {type(trace).__name__}")
    run_ids = run_stages(con, manifests=manifests, truncated_runs=truncated, progress=progress)
    return Tables(con, run_ids)


# -- run directories, streamed (bounded memory) ------------------------------------------------
# NOTE: ``kvclaims.open`` (kvclaims/audit.py) is the one public way in; these are its parts.

@dataclass
class StreamedInput:
    """What streaming a set of run directories into DuckDB learned about them."""

    manifests: dict[str, dict[str, Any]]
    run_dirs: dict[str, Path]
    truncations: list[str]
    truncated_runs: set[str]


def _file_batches(files: dict[str, Path], columns: Sequence[str],
                  coded: Sequence[str] = ("event",)) -> Callable[[str], Iterator[pa.RecordBatch]]:
    """A streamed pass's source: ``columns`` of a run's events, straight from its Parquet
    file, those of ``coded`` decoded as dictionaries (the passes code them per distinct name
    anyway)."""

    def batches(run_id: str) -> Iterator[pa.RecordBatch]:
        path = files.get(run_id)
        if path is None:
            return iter(())
        return loader.parquet_file(path, read_dictionary=list(coded)).iter_batches(
            batch_size=1 << 16, columns=list(columns))
    return batches


def _copy_prefix(sealed: Path, rows: int, writer: Any) -> None:
    """Copy the first ``rows`` events of a sealed file (read and checked before it turned out
    damaged further on) into ``writer``."""

    pf = loader.parquet_file(sealed, page_checksum_verification=True)
    for batch in pf.iter_batches(batch_size=1 << 16):
        if rows <= 0:
            break
        batch = pa.RecordBatch.from_arrays(batch.columns, schema=loader.EVENTS_SCHEMA)
        writer.write_batch(batch.slice(0, rows))
        rows -= batch.num_rows


def stage_events(runs: Sequence[Any], info: StreamedInput, folder: str | Path,
                 extra: pa.Table | None = None,
                 progress: Callable[[int], None] | None = None) -> tuple[dict[str, Path], int]:
    """Read every opened run (``loader.open_runs``) once, checked, and say where its events
    lie as Parquet in seq order: returns ({run_id: file}, events read).

    A run read entirely from its sealed ``events.parquet`` is left there (nothing copied);
    any other run (a crashed run read from its IPC segments, a damaged sealed copy, the runs
    of ``extra``: events from JSON Lines) is written to a Parquet file in ``folder`` during
    the read. Manifests, run directories and truncations are recorded in ``info``.
    NOTE: memory stays one batch: nothing is held for the whole trace.
    """
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    files: dict[str, Path] = {}
    total = 0

    def own_file(rid: str) -> Path:
        return out / f"events-{len(files):06d}.parquet"   # NOTE: not named after the run

    if extra is not None and extra.num_rows:
        rid_col = extra.column("run_id")
        for rid in sorted(rid_col.unique().to_pylist()):
            part = extra.filter(pc.equal(rid_col, rid))
            path = own_file(rid)
            pq.write_table(part, str(path), compression="lz4")
            files[rid] = path
            total += part.num_rows
    for run in runs:
        rid = run.run_id
        info.manifests[rid] = run.manifest
        info.run_dirs[rid] = run.path
        info.truncations.extend(run.notes)   # NOTE: warnings (an aliased run id), no hole
        # NOTE: an aliased run is always copied: its sealed file carries the recorded run id
        entry = loader._sealed_entry(run) if run.recorded_run_id is None else None
        if not loader.sealed_verified(entry):
            # NOTE: DuckDB prunes row groups by the footer's statistics, which Parquet's page
            # checksums do not cover: only a file whose whole content was verified against
            # the manifest is scanned in place; any other run's events are copied
            entry = None
        state = {"fell_back": False}

        def note(msg: str, rid: str = rid) -> None:
            info.truncations.append(msg)
            info.truncated_runs.add(rid)

        def warn(msg: str) -> None:
            # NOTE: a damaged sealed copy is shown, but the segments then deliver every
            # event: no hole, so the run is not marked truncated
            info.truncations.append(msg)
            state["fell_back"] = True

        sealed_rows = 0
        writer = None
        path = own_file(rid)
        try:
            # NOTE: a verified sealed file stays where it is, so its batches are only checked
            for batch in loader.read_run(run, note, warn=warn,
                                         checked_only=entry is not None):
                total += batch.num_rows
                if progress is not None:
                    progress(batch.num_rows)
                if entry is not None and not state["fell_back"]:
                    sealed_rows += batch.num_rows    # NOTE: the sealed file holds it
                    continue
                if writer is None:
                    writer = pq.ParquetWriter(str(path), loader.EVENTS_SCHEMA,
                                              compression="lz4")
                    if sealed_rows:
                        _copy_prefix(run.path / loader.SEALED_NAME, sealed_rows, writer)
                writer.write_batch(batch)
            if writer is None and state["fell_back"] and sealed_rows:
                writer = pq.ParquetWriter(str(path), loader.EVENTS_SCHEMA, compression="lz4")
                _copy_prefix(run.path / loader.SEALED_NAME, sealed_rows, writer)
        finally:
            if writer is not None:
                writer.close()
        if writer is not None:
            files[rid] = path
        elif sealed_rows:
            files[rid] = run.path / loader.SEALED_NAME
    return files, total


# Characters DuckDB's read_parquet reads as a glob pattern.
GLOB_CHARS: Final[frozenset[str]] = frozenset("*?[]{}")


def expose_events(con: Any, files: dict[str, Path], folder: str | Path) -> list[str]:
    """Make ``events`` (loader schema) a view over the runs' Parquet files; return the paths
    DuckDB reads (what a locked-down connection must still be allowed to read).

    Each file is reached through a link in ``folder`` with a plain name: a run directory's
    own name could hold characters that DuckDB would read as a glob pattern.
    NOTE: no copy into DuckDB: its Parquet reader scans the files, in parallel, for each
    query (what ingesting every event into a table cost dominated the reconstruction).
    """

    out = Path(folder)
    paths = []
    for i, (rid, path) in enumerate(sorted(files.items())):
        link = out / f"run-{i:06d}.parquet"
        if path.parent.resolve() == out.resolve():
            link = path
        else:
            os.symlink(os.path.abspath(path), link)
        paths.append(str(link))
    if not paths or any(c in GLOB_CHARS for c in str(out)):
        # NOTE: nothing to scan (an empty run), or a folder name DuckDB would glob: a table
        con.register("kv_events_in", pa.RecordBatchReader.from_batches(
            loader.EVENTS_SCHEMA, _read_files(paths)))
        try:
            con.execute("CREATE OR REPLACE TEMP TABLE events AS SELECT * FROM kv_events_in")
        finally:
            con.unregister("kv_events_in")
        return []
    listed = ", ".join(map(sql_string, paths))
    # NOTE: by name: a run sealed by an older schema lacks the columns added since (NULL here)
    con.execute(f"CREATE OR REPLACE TEMP VIEW events AS SELECT * FROM read_parquet([{listed}], "
                "union_by_name = true)")
    return paths


def _read_files(paths: Sequence[str]) -> Iterator[pa.RecordBatch]:

    for p in paths:
        for batch in loader.parquet_file(p).iter_batches(batch_size=1 << 16):
            yield pa.RecordBatch.from_arrays(batch.columns, schema=loader.EVENTS_SCHEMA)


def open_database(*, memory_limit: str | None = None, temp_directory: str | Path | None = None,
                  threads: int | None = None) -> tuple[Any, str]:
    """A DuckDB connection on a fresh temporary on-disk database (inside ``temp_directory``
    if given), configured; returns it and the folder to remove when done."""
    if memory_limit is not None:
        memory_limit = validate_memory_limit(memory_limit)
    parent = None if temp_directory is None else str(validate_temp_directory(temp_directory))
    remove_stale_databases(parent)
    tmp = tempfile.mkdtemp(prefix=f"{AUDIT_PREFIX}{os.getpid()}-", dir=parent)
    try:
        con = duckdb.connect(os.path.join(tmp, "audit.duckdb"))
        configure(con, memory_limit=memory_limit,
                  temp_directory=temp_directory if temp_directory is not None
                  else os.path.join(tmp, "spill"), threads=threads)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return con, tmp


# Temporary audit databases: ``kvclaims-audit-<pid>-<random>`` (the pid lets a later run
# remove the folder of a process that was killed before it could).
AUDIT_PREFIX: Final[str] = "kvclaims-audit-"
_STALE_RE: Final = re.compile(re.escape(AUDIT_PREFIX) + r"(\d+)-\w+\Z")


def remove_stale_databases(parent: str | None) -> list[str]:
    """Remove ``kvclaims-audit-<pid>-*`` folders (in ``parent``, default the temp dir) whose
    process is gone (killed with SIGKILL, or a power loss); return what was removed.

    NOTE: only folders this user owns and whose pid no longer exists are touched; a folder
    of a live process (another audit running now) is never removed.
    """
    folder = parent if parent is not None else tempfile.gettempdir()
    removed = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        m = _STALE_RE.match(entry.name)
        if m is None or not entry.is_dir(follow_symlinks=False):
            continue
        try:
            if entry.stat(follow_symlinks=False).st_uid != os.getuid():
                continue
            os.kill(int(m.group(1)), 0)
            continue   # the process lives
        except ProcessLookupError:
            pass
        except (OSError, OverflowError):
            continue   # e.g. EPERM: someone else's live process
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(entry.path)
    return removed


def drop_database(con: Any, tmp: str | None) -> None:
    """Close a connection and remove the temporary database folder made for it, if any.

    NOTE: a connection a signal interrupted mid-query may refuse to close ("busy"); the
    folder is removed all the same and the signal, not that refusal, is what propagates.
    """
    try:
        con.close()
    except duckdb.Error:
        pass
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def load_jsonl(paths: Sequence[str | Path] | str | Path) -> pa.Table:
    """Read JSON Lines traces (our vocabulary) as one events table in the loader's schema.

    Handy for fixtures and small imported traces; large traces go through ``kvclaims import``
    and ``kvclaims.open``.
    """

    if isinstance(paths, (str, Path)):
        paths = [paths]
    batches = []
    for p in paths:
        for batch in read_jsonl(p).to_batches():
            batches.append(loader.decode_batch(batch))
    table = pa.Table.from_batches(batches, schema=loader.EVENTS_SCHEMA)
    return table.sort_by([("run_id", "ascending"), ("seq", "ascending")])
