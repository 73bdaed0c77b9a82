"""Where the streamed passes put their outputs: one Parquet file per table, which the SQL
stages read through a view of the same name (docs/reconstruction.md, "What bounds memory and
time"). No DuckDB table in between.

A pass holds its output rows as Arrow and writes each table's held rows as one row group each
time ``FLUSH_ROWS`` rows are held in all, and at the end; ``close`` makes the views.

NOTE: an INSERT of Arrow into DuckDB cost about twice the CPU of writing the same rows as
lz4 Parquet (loss_claims of 10 M dense events: 2.1 against 1.1 CPU-s), and into a table of the
database file (large inputs, ``core.COMPACT_EVENTS``) three times that again; the files are
compressed whatever the input's size, and hold nothing in DuckDB's memory.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Final

import pyarrow as pa
import pyarrow.parquet as pq

from kvclaims.contract.schema import InputError
from kvclaims.contract.vocabulary import sql_string

# NOTE: lz4: the files are read a few times by the stages and then removed with the audit;
# zstd took 18-35% more CPU to write them for 14-33% less disk (loss_claims and kv_losses of
# 10 M dense events).
COMPRESSION: Final[str] = "lz4"

# Output rows a pass holds (all its tables together) before each table's are written.
FLUSH_ROWS: Final[int] = 500_000

_CREATED_RE: Final = re.compile(
    r"CREATE\s+(?:OR\s+REPLACE\s+)?(?:TEMP\s+)?(TABLE|VIEW)\s+(\w+)", re.IGNORECASE)


def created_table(sql: str) -> str | None:
    """The table or view a statement creates (None: it creates none)."""
    made = _CREATED_RE.search(sql)
    return made.group(2) if made else None


def _table_made(ddl: str) -> re.Match[str]:
    made = _CREATED_RE.search(ddl)
    if made is None or made.group(1).upper() != "TABLE":
        raise ValueError(f"not a CREATE TABLE statement: {ddl[:60]!r}")
    return made


def created(ddl: str) -> str:
    """The table a ``CREATE [OR REPLACE] [TEMP] TABLE name ...`` statement creates."""
    return _table_made(ddl).group(2)


def ddl_schema(con: Any, ddl: str) -> pa.Schema:
    """The Arrow schema of the table ``ddl`` creates, as DuckDB types it: the DDL stays the one
    statement of a table's columns."""
    made = _table_made(ddl)
    probe = f"kv_schema_{made.group(2)}"
    con.execute(f"CREATE OR REPLACE TEMP TABLE {probe}{ddl[made.end():]}")
    try:
        return con.table(probe).limit(0).to_arrow_table().schema
    finally:
        con.execute(f"DROP TABLE {probe}")


class ParquetSink:
    """Output rows held as Arrow, written to ``FOLDER/<table>.parquet``.

    ``schemas``: each table's columns as DuckDB types them (``ddl_schema``). A string column
    is written dictionary-encoded when the first rows handed over hold it so (the passes code
    repeated names: run ids, claim ids, labels), plain otherwise; later rows are cast to the
    file's schema.
    """

    def __init__(self, folder: str | Path, schemas: dict[str, pa.Schema],
                 flush_rows: int = FLUSH_ROWS) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.schemas = dict(schemas)
        self.flush_rows = flush_rows
        self.parts: dict[str, list[pa.Table]] = {name: [] for name in schemas}
        self.writers: dict[str, pq.ParquetWriter] = {}
        self.rows = 0

    def path(self, table: str) -> Path:
        """Where ``table``'s rows go."""
        return self.folder / f"{table}.parquet"

    def add(self, table: str, data: pa.Table) -> None:
        """Hold ``data`` (``table``'s columns, in its order) for the next write."""
        if data.num_rows == 0:
            return
        self.parts[table].append(data)
        self.rows += data.num_rows
        if self.rows >= self.flush_rows:
            self.flush()

    def flush(self) -> None:
        """Write every table's held rows (one row group per table)."""
        for table, parts in self.parts.items():
            if not parts:
                continue
            writer = self._writer(table, parts[0].schema)
            data = pa.concat_tables([p.cast(writer.schema) if not p.schema.equals(writer.schema)
                                     else p for p in parts])
            # NOTE: one dictionary per column and row group: Parquet's writer takes an Arrow
            # dictionary's indices as they are only while its dictionary does not change
            data = data.unify_dictionaries()
            try:
                writer.write_table(data, row_group_size=data.num_rows)
            except OSError as exc:
                raise InputError(f"{self.path(table)}: cannot write: {exc}") from None
            parts.clear()
        self.rows = 0

    def _writer(self, table: str, first: pa.Schema) -> pq.ParquetWriter:
        if table not in self.writers:
            want = self.schemas[table]
            fields = [pa.field(f.name, first.field(f.name).type)
                      if pa.types.is_string(f.type)
                      and pa.types.is_dictionary(first.field(f.name).type) else f
                      for f in want]
            schema = pa.schema(fields)
            coded = [f.name for f in fields if pa.types.is_dictionary(f.type)]
            try:
                self.writers[table] = pq.ParquetWriter(
                    str(self.path(table)), schema, compression=COMPRESSION,
                    use_dictionary=coded or False)
            except OSError as exc:
                raise InputError(f"{self.path(table)}: cannot write: {exc}") from None
        return self.writers[table]

    def close(self, con: Any) -> list[Path]:
        """Write what is held, close the files and make each table a view over its file on
        ``con`` (``CREATE TEMP VIEW <table>``); return the files."""
        self.flush()
        for table, schema in self.schemas.items():
            if table not in self.writers:   # no rows: an empty file of the table's columns
                self._writer(table, schema)
        paths = []
        for table, writer in self.writers.items():
            writer.close()
            paths.append(self.path(table))
            con.execute(f"CREATE OR REPLACE TEMP VIEW {table} AS SELECT * FROM "
                        f"read_parquet({sql_string(str(self.path(table)))})")
        self.writers.clear()
        return paths
