"""The reconstruction facade: a trace in, the six reconstructed tables out.

``reconstruct(trace)`` runs small stateless stages, one SQL file each (``reconstruct/sql/``),
over a DuckDB connection that exposes the trace as the relation ``events``:

=====================  ======================================================================
``01_runs.sql``        per-run facts: policy, usable blocks, first hole (gap, seq hole, truncation)
``02_blocks.sql``      block content timeline (copies of each hash) and every block loss,
                       computed by ``reconstruct/blocks.py`` (NumPy, streamed in windows)
``03_claims.sql``      claim lifecycle, bindings, residency of bound content, predicate intervals
``04_labels.sql``      ``loss_claims`` (one row per loss x bound claim) and ``losses``
``05_outcomes.sql``    ``claims``, ``requests``, ``feasibility``
``06_findings.sql``    ``findings``: holes, disagreements with the runtime, violations, anomalies
=====================  ======================================================================

The semantics are DESIGN.md §4; the exact rules are in docs/reconstruction.md.

NOTE: every stage orders by ``seq`` within a run and joins on ``run_id``: runs never mix.
NOTE: memory is bounded by DuckDB's ``memory_limit`` (it spills to ``temp_directory``) plus
one window of block events in stage 02 (``blocks.WINDOW_SEQS``); the SQL stages only run
window functions over the (small) set of claim-bound content and claims.
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

from recorder.policies import MODE_ENFORCEMENT, PINNING_MODES, POLICIES
from recorder.schema import PROTECTION_MODES
from recorder.schema import InputError
from reconstruct import blocks

# The reconstructed tables, in the order they are built and written.
TABLE_NAMES: Final[tuple[str, ...]] = (
    "losses", "loss_claims", "claims", "requests", "feasibility", "findings")
# Verdict tables: computed from the others, readable like them, not written by ``write``
# (docs/conformance.md).
VERDICT_TABLES: Final[tuple[str, ...]] = ("conformance", "lowering")

STAGES: Final[tuple[str, ...]] = (
    "01_runs.sql", "02_blocks.sql", "03_claims.sql", "04_labels.sql", "05_outcomes.sql",
    "06_findings.sql", "07_conformance.sql")

# Policy names written by the paper's prototype (imported traces keep them) that enforce claims.
# NOTE: our own policies say it themselves (recorder.policies.POLICIES[...].enforce).
PROTOTYPE_ENFORCING: Final[dict[str, str]] = {
    "hard_resident_exclude": "hard_protected",
    "live_scheduler_hard_exclude_pressure": "hard_protected",
    "claim_lifecycle_demote": "hard_protected",
    "claim_lifecycle_expire": "hard_protected",
}


def stage_sql(name: str) -> str:
    """The text of one stage's SQL file (shipped as package data)."""
    return resources.files("reconstruct").joinpath("sql", name).read_text(encoding="utf-8")


def split_statements(sql: str) -> list[str]:
    """Split a SQL file into statements: each ends with ';' at the end of a line.

    Full-line comments are dropped first (they may contain ';').
    """
    lines = [line for line in sql.splitlines() if not line.lstrip().startswith("--")]
    parts = re.split(r";[ \t]*$", "\n".join(lines), flags=re.MULTILINE)
    return [p.strip() for p in parts if p.strip()]


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
        """Write every table as ``OUT_DIR/<table>.parquet`` (only ``run_id``'s rows if given)."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        paths = []
        for name in TABLE_NAMES:
            path = out / f"{name}.parquet"
            where = "" if run_id is None else " WHERE run_id = $rid"
            sql = (f"COPY (SELECT * FROM {name}{where}) TO '{_sql_path(path)}' "
                   "(FORMAT parquet, COMPRESSION zstd)")
            if run_id is None:
                self.con.execute(sql)
            else:
                self.con.execute(sql, {"rid": run_id})
            paths.append(path)
        return paths

    def summary(self) -> list[dict[str, Any]]:
        """Per run: loss counts by label, claim outcomes, request outcomes, findings."""
        rows = self.con.sql("""
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
                        WHERE f.run_id = r.run_id AND severity <> 'hole'
                        GROUP BY severity ORDER BY severity)) AS findings
            FROM kv_runs r ORDER BY r.run_id""").fetchall()
        cols = ["run_id", "policy", "usable_blocks", "events", "unknown_from_seq", "truncated",
                "losses", "labels", "claim_outcomes", "request_outcomes", "findings"]
        return [{c: (dict(v) if isinstance(v, dict) else v) for c, v in zip(cols, row)}
                for row in rows]


def _sql_path(path: Path) -> str:
    return str(path).replace("'", "''")


def configure(con: Any, *, memory_limit: str | None = None,
              temp_directory: str | Path | None = None, threads: int | None = None) -> None:
    """Bound DuckDB's memory: beyond ``memory_limit`` it spills to ``temp_directory``."""
    if memory_limit:
        con.execute(f"SET memory_limit = '{memory_limit}'")
    if temp_directory:
        con.execute(f"SET temp_directory = '{_sql_path(Path(temp_directory))}'")
    if threads:
        con.execute(f"SET threads = {int(threads)}")
    # NOTE: our outputs carry explicit ORDER BYs; not preserving scan order saves memory.
    con.execute("SET preserve_insertion_order = false")


def _policies_table() -> pa.Table:
    rows = [{"policy": p.name, "enforce": p.enforce, "default_mode": p.default_mode}
            for p in POLICIES.values()]
    rows += [{"policy": name, "enforce": True, "default_mode": mode}
             for name, mode in PROTOTYPE_ENFORCING.items()]
    assert all(r["default_mode"] in PINNING_MODES or not r["enforce"] for r in rows)
    return pa.Table.from_pylist(rows, schema=pa.schema(
        [("policy", pa.string()), ("enforce", pa.bool_()), ("default_mode", pa.string())]))


def _modes_table() -> pa.Table:
    """Every protection mode with what an enforcing policy does with it (recorder/policies.py):
    the fallback of the ``lowering`` table when a manifest has no lowering section.

    ``enforced_verdict`` comes from ``recorder.policies.ENFORCED_LOWERING`` where the recorder
    defines it (NULL otherwise: the SQL then derives it, docs/conformance.md "Lowering").
    """
    from recorder import policies

    enforced: dict[str, tuple[str, str]] = getattr(policies, "ENFORCED_LOWERING", {})
    rows = [{"mode": m,
             "enforced_verdict": enforced[m][0] if m in enforced else None,
             "enforcement": enforced[m][1] if m in enforced else MODE_ENFORCEMENT.get(m)}
            for m in PROTECTION_MODES]
    return pa.Table.from_pylist(rows, schema=pa.schema(
        [("mode", pa.string()), ("enforced_verdict", pa.string()), ("enforcement", pa.string())]))


_MANIFEST_SCHEMA: Final[pa.Schema] = pa.schema(
    [("run_id", pa.string()), ("policy", pa.string()), ("usable_blocks", pa.int32()),
     ("truncated", pa.bool_()), ("evidence", pa.string())])

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
                     else None})
    return pa.Table.from_pylist(rows, schema=_MANIFEST_SCHEMA)


def run_stages(con: Any, *, manifests: dict[str, dict[str, Any]] | None = None,
               truncated_runs: set[str] | None = None,
               progress: Callable[[str], None] | None = None, persist: bool = True) -> list[str]:
    """Run every stage on ``con`` (which must expose ``events``); return the run ids.

    ``persist=False`` makes the reconstructed tables TEMP tables: same contents, but in a
    file-backed database they are not compressed and written to its file (they still spill
    to ``temp_directory`` beyond ``memory_limit``).
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
    for stage in STAGES:
        sql = stage_sql(stage)
        if stage == "02_blocks.sql":
            blocks.build(con)  # the block timeline (NumPy, streamed): see reconstruct/blocks.py
        for stmt in split_statements(sql):
            if not persist:
                stmt = stmt.replace("CREATE OR REPLACE TABLE ", "CREATE OR REPLACE TEMP TABLE ", 1)
            con.execute(stmt)
        if progress is not None:
            progress(stage)
    return [r[0] for r in con.sql("SELECT run_id FROM kv_runs ORDER BY run_id").fetchall()]


def reconstruct(trace: Any, *, con: Any = None, memory_limit: str | None = None,
                temp_directory: str | Path | None = None, threads: int | None = None,
                progress: Callable[[str], None] | None = None) -> Tables:
    """Reconstruct losses, labels, claim/request outcomes, feasibility and findings.

    ``trace`` is a loader ``Trace`` (``reconstruct.loader.load_runs``) or a ``pa.Table`` of
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

@dataclass
class StreamedInput:
    """What streaming a set of run directories into DuckDB learned about them."""

    manifests: dict[str, dict[str, Any]]
    run_dirs: dict[str, Path]
    truncations: list[str]
    truncated_runs: set[str]


def _stream_runs(paths: Sequence[str | Path], info: StreamedInput) -> Iterator[pa.RecordBatch]:
    from reconstruct import loader

    for run in loader.open_runs(paths):
        info.manifests[run.run_id] = run.manifest
        info.run_dirs[run.run_id] = run.path

        def note(msg: str, rid: str = run.run_id) -> None:
            info.truncations.append(msg)
            info.truncated_runs.add(rid)

        yield from loader.read_run(run, note)


def reconstruct_paths(paths: Sequence[str | Path], *, database: str | Path | None = None,
                      memory_limit: str | None = None, temp_directory: str | Path | None = None,
                      threads: int | None = None,
                      progress: Callable[[str], None] | None = None,
                      persist: bool | None = None) -> tuple[Tables, StreamedInput]:
    """Reconstruct run directories (or sweep directories) in bounded memory.

    The events are streamed batch by batch into a DuckDB table (in ``database`` if given,
    else a temporary on-disk database, inside ``temp_directory`` if given), so a trace larger
    than memory never has to fit. The reconstructed tables are stored in ``database`` when one
    is given (``persist``, default: whether ``database`` is given); otherwise they are TEMP
    tables of the connection.
    """
    if persist is None:
        persist = database is not None
    tmp: str | None = None
    if database is None:
        if temp_directory is not None:
            Path(temp_directory).mkdir(parents=True, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix="kvclaims-reconstruct-",
                               dir=None if temp_directory is None else str(temp_directory))
        database = os.path.join(tmp, "reconstruct.duckdb")
    con = duckdb.connect(str(database))
    try:
        tables, info = _reconstruct_into(con, paths, memory_limit=memory_limit,
                                         temp_directory=temp_directory, threads=threads,
                                         progress=progress, persist=persist)
    except BaseException:
        _drop_database(con, tmp)
        raise
    if tmp is not None:
        # NOTE: a database we made up lives exactly as long as the tables that use it
        weakref.finalize(tables, _drop_database, con, tmp)
    return tables, info


def _drop_database(con: Any, tmp: str | None) -> None:
    """Close a connection and remove the temporary database folder made for it, if any."""
    try:
        con.close()
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def _reconstruct_into(con: Any, paths: Sequence[str | Path], *, memory_limit: str | None,
                      temp_directory: str | Path | None, threads: int | None,
                      progress: Callable[[str], None] | None,
                      persist: bool) -> tuple[Tables, StreamedInput]:
    from reconstruct import loader

    configure(con, memory_limit=memory_limit, temp_directory=temp_directory, threads=threads)
    info = StreamedInput({}, {}, [], set())
    reader = pa.RecordBatchReader.from_batches(loader.EVENTS_SCHEMA, _stream_runs(paths, info))
    con.register("events_in", reader)
    # NOTE: the loader yields each run in seq order; keeping that order on disk lets the
    # block stage read windows of seqs that DuckDB's zone maps find without a full scan.
    con.execute("SET preserve_insertion_order = true")
    con.execute("CREATE OR REPLACE TABLE events AS SELECT * FROM events_in")
    con.execute("SET preserve_insertion_order = false")
    con.unregister("events_in")
    if progress is not None:
        progress("import")
    if con.execute("SELECT count(*) FROM events").fetchall()[0][0] == 0 and not info.manifests:
        raise InputError("no events to reconstruct")
    run_ids = run_stages(con, manifests=info.manifests, truncated_runs=info.truncated_runs,
                         progress=progress, persist=persist)
    return Tables(con, run_ids), info


def load_jsonl(paths: Sequence[str | Path] | str | Path) -> pa.Table:
    """Read JSON Lines traces (our vocabulary) as one events table in the loader's schema.

    Handy for fixtures and small imported traces; large traces go through ``kvclaims import``
    and ``reconstruct_paths``.
    """
    from reconstruct import loader
    from reconstruct.jsonl import read_jsonl

    if isinstance(paths, (str, Path)):
        paths = [paths]
    batches = []
    for p in paths:
        for batch in read_jsonl(p).to_batches():
            batches.append(loader.decode_batch(batch))
    table = pa.Table.from_batches(batches, schema=loader.EVENTS_SCHEMA)
    return table.sort_by([("run_id", "ascending"), ("seq", "ascending")])
