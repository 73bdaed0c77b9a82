"""Golden-output diff tests of the public SQL library (queries/*.sql), one per view.

Regenerate after an intended change: KVCLAIMS_UPDATE_GOLDEN=1 pytest tests/test_queries.py
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

import queries
from reconstruct import core

FIX = Path(__file__).parent / "fixtures"
GOLDEN = Path(__file__).parent / "golden"


@pytest.fixture(scope="module")
def con():
    tables = core.reconstruct(core.load_jsonl(sorted(FIX.glob("*.jsonl"))))
    queries.apply(tables.con)
    return tables.con


def render(con, view: str) -> str:
    rel = con.sql(f"SELECT * FROM {view}")
    lines = [json.dumps(rel.columns)]
    lines += [json.dumps(list(r), default=str) for r in rel.fetchall()]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("view", queries.VIEWS)
def test_view_matches_golden_output(con, view: str) -> None:
    path = GOLDEN / f"{view}.jsonl"
    got = render(con, view)
    if os.environ.get("KVCLAIMS_UPDATE_GOLDEN"):
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(got)
    assert got == path.read_text()


@pytest.mark.parametrize("view", queries.VIEWS)
def test_every_view_and_column_has_a_comment_above_it(view: str) -> None:
    lines = queries.sql_text(view).splitlines()
    body = [i for i, line in enumerate(lines) if line.startswith("CREATE OR REPLACE VIEW")]
    assert body and lines[body[0] - 1].startswith("--")
    select = next(i for i in range(body[0], len(lines))
                  if lines[i].strip() == "SELECT" and not lines[i].startswith(" "))
    prev_code = lines[select]
    for i in range(select + 1, len(lines)):
        line = lines[i]
        if line.startswith(("FROM", "WHERE", "ORDER", "GROUP", "LEFT", "JOIN")):
            break
        if line.strip().startswith("--") or not line.strip():
            continue
        starts_column = prev_code.rstrip().endswith(",") or prev_code.strip() == "SELECT"
        if starts_column and re.match(r"^    [^ ]", line):
            assert lines[i - 1].strip().startswith("--"), \
                f"{view}.sql:{i + 1}: no comment above {line!r}"
        prev_code = line


def test_queries_ship_as_package_data() -> None:
    for view in queries.VIEWS:
        assert queries.sql_text(view).strip()
