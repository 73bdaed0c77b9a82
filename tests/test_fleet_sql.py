"""The Spark rewrites of the stage SQL (kvclaims/fleet.py), checked without Spark.

The stage files (``core.STAGES`` after the labelling core) are transpiled at run time: every
one must become Spark SQL that parses back, with none of DuckDB's own constructs left.
"""

from __future__ import annotations

import pytest

pytest.importorskip("sqlglot")

import sqlglot  # noqa: E402

from kvclaims import fleet  # noqa: E402


def test_every_sql_stage_transpiles_to_spark_sql() -> None:
    for stage in fleet.sql_stages():
        statements = fleet.spark_stage(stage)
        assert statements, stage
        for st in statements:
            assert " FOR " not in st.sql
            sqlglot.parse_one(st.sql, read="spark")  # Spark SQL that parses back


def test_a_statement_that_is_not_a_created_table_is_refused() -> None:
    with pytest.raises(NotImplementedError, match="not a CREATE TABLE"):
        fleet.spark_stage("x.sql", "INSERT INTO t VALUES (1);")


def test_ordered_list_keeps_order_nulls_and_empty_as_null() -> None:
    sql = fleet.spark_stage("x.sql", "CREATE TABLE t AS SELECT list(a ORDER BY b) FILTER "
                                     "(WHERE c) AS l FROM s GROUP BY d;")[0].sql
    assert "SORT_ARRAY" in sql.upper() and "COLLECT_LIST" in sql.upper()
    assert "CASE WHEN" in sql.upper()  # NULL when no row passes the filter
