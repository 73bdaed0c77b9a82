"""The streamed passes' outputs (reconstruct/sink.py): each table a Parquet file with the
DDL's columns as DuckDB types them, read back through a view of its name."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from kvclaims.reconstruct.sink import ParquetSink, created, ddl_schema

DDL = "CREATE OR REPLACE TEMP TABLE kv_t (run_id VARCHAR, seq BIGINT, ids VARCHAR[])"


def _sink(con: duckdb.DuckDBPyConnection, folder: Path, flush_rows: int = 10) -> ParquetSink:
    return ParquetSink(folder, {created(DDL): ddl_schema(con, DDL)}, flush_rows)


def _coded(values: list[str]) -> pa.Array:
    return pa.array(values, pa.string()).dictionary_encode()


def test_rows_handed_over_are_read_back_through_a_view_with_the_ddl_types(
        tmp_path: Path) -> None:
    con = duckdb.connect()
    sink = _sink(con, tmp_path)
    for i in range(3):   # more rows than flush_rows: several row groups
        sink.add("kv_t", pa.table({"run_id": _coded(["a"] * 6), "seq": pa.array(range(6 * i,
                                                                                  6 * i + 6)),
                                   "ids": pa.array([["x"]] * 6)}))
    (path,) = sink.close(con)
    assert path == tmp_path / "kv_t.parquet"
    assert con.sql("SELECT count(*), min(seq), max(seq) FROM kv_t").fetchall() == [(18, 0, 17)]
    assert con.sql("SELECT column_name, column_type FROM (DESCRIBE kv_t)").fetchall() == [
        ("run_id", "VARCHAR"), ("seq", "BIGINT"), ("ids", "VARCHAR[]")]
    assert con.sql("SELECT count(*) FROM duckdb_tables() WHERE table_name = 'kv_t'"
                   ).fetchall() == [(0,)]


def test_twin_a_table_without_rows_is_an_empty_view_with_the_same_columns(
        tmp_path: Path) -> None:
    con = duckdb.connect()
    _sink(con, tmp_path).close(con)
    assert con.sql("SELECT count(*) FROM kv_t").fetchall() == [(0,)]
    assert [c for c, _t in con.sql("SELECT column_name, column_type FROM (DESCRIBE kv_t)"
                                   ).fetchall()] == ["run_id", "seq", "ids"]


@pytest.mark.parametrize("first", ["coded", "plain"])
def test_plain_and_coded_strings_of_one_column_land_in_one_file(tmp_path: Path,
                                                                first: str) -> None:
    # e.g. a run without claims hands over plain strings where the others hand a dictionary
    con = duckdb.connect()
    sink = _sink(con, tmp_path, flush_rows=1)
    parts = {"coded": _coded(["a", "b"]), "plain": pa.array(["c", "d"], pa.string())}
    for kind in (first, "plain" if first == "coded" else "coded"):
        sink.add("kv_t", pa.table({"run_id": parts[kind], "seq": pa.array([1, 2]),
                                   "ids": pa.array([None, ["y"]], pa.list_(pa.string()))}))
    sink.close(con)
    assert sorted(r[0] for r in con.sql("SELECT run_id FROM kv_t").fetchall()) == [
        "a", "b", "c", "d"]


def test_a_statement_that_creates_no_table_is_refused() -> None:
    with pytest.raises(ValueError, match="not a CREATE TABLE"):
        created("CREATE VIEW v AS SELECT 1")
