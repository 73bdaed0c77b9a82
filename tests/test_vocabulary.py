"""The vocabulary lives in one module (kvclaims/contract/vocabulary.py): SQL, the dashboard, the
report and the explanations read it instead of spelling it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from kvclaims.contract import vocabulary as V
from kvclaims.contract.schema import EVENTS
from kvclaims.reconstruct.checks import CHECKS

REPO = Path(__file__).resolve().parents[1]
SQL_FILES = sorted([*(REPO / "reconstruct" / "sql").glob("*.sql"),
                    *(REPO / "queries").rglob("*.sql")])
# Python that renders the vocabulary to people: every term it names comes from the module.
PY_FILES = sorted([*(REPO / "dashboard").glob("*.py"), REPO / "kvclaims" / "explaining.py"])
TERMS = frozenset(t for names in V.GROUPS.values() for t in names)
# NOTE: Python pages name these groups through the module (``LABEL.harm``); releasers, eviction
# causes, decisions and a run's evidence are also column names or lane states there (``tenant``,
# ``deferred``) and are checked in SQL only.
PY_TERMS = frozenset(t for g, names in V.GROUPS.items()
                     if g not in ("releaser", "cause", "decision", "evidence", "lifecycle_source")
                     for t in names)
_QUOTED = re.compile(r"'([A-Za-z0-9_]+)'")
# Python on the offline side that runs SQL over traces and tables (the what-if reader, the
# reconstructor's drivers, the facade, the CLI): its SQL fills terms with ``fill_sql`` too.
PY_SQL_FILES = sorted(p for part in ("kvclaims", "reconstruct", "queries", "dashboard")
                      for p in (REPO / part).rglob("*.py"))
_SQL_WORDS = re.compile(r"\b(SELECT|WHERE|FILTER|CASE WHEN)\b")


def sql_literals(text: str) -> list[str]:
    """Quoted vocabulary terms in SQL code (comments are prose and may name them)."""
    found = []
    for line in text.splitlines():
        code = line.split("--", 1)[0]
        found += [m for m in _QUOTED.findall(code) if m in TERMS]
    return found


def python_literals(text: str) -> list[str]:
    """String constants in Python code that are vocabulary terms (docstrings excluded)."""
    tree = ast.parse(text)
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
            and n.body and isinstance(n.body[0], ast.Expr)
            and isinstance(n.body[0].value, ast.Constant)}
    found = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs:
            # NOTE: a term alone, or quoted inside SQL the page runs
            found += [n.value] if n.value in PY_TERMS else \
                [m for m in _QUOTED.findall(n.value) if m in PY_TERMS]
    return found


def python_sql_literals(text: str) -> list[str]:
    """Quoted vocabulary terms in the SQL a Python file runs: every string (an f-string's
    literal parts taken together) with a SQL keyword."""
    tree = ast.parse(text)
    parts = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    found = []
    for n in ast.walk(tree):
        if id(n) in parts:
            continue
        if isinstance(n, ast.JoinedStr):
            code = " ".join(v.value for v in n.values
                            if isinstance(v, ast.Constant) and isinstance(v.value, str))
        elif isinstance(n, ast.Constant) and isinstance(n.value, str):
            code = n.value
        else:
            continue
        if _SQL_WORDS.search(code):
            found += sql_literals(code)
    return found


@pytest.mark.parametrize("path", SQL_FILES, ids=lambda p: p.name)
def test_sql_names_the_vocabulary_only_through_placeholders(path: Path) -> None:
    assert sql_literals(path.read_text()) == []


def test_a_quoted_label_in_sql_is_caught() -> None:
    assert sql_literals("SELECT * FROM losses WHERE label = 'harm' -- 'eviction'") == ["harm"]


@pytest.mark.parametrize("path", PY_FILES, ids=lambda p: p.name)
def test_pages_name_the_vocabulary_only_through_the_module(path: Path) -> None:
    assert python_literals(path.read_text()) == []


@pytest.mark.parametrize("path", PY_SQL_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_sql_run_from_python_names_the_vocabulary_only_through_placeholders(path: Path) -> None:
    assert python_sql_literals(path.read_text()) == []


def test_a_term_quoted_in_sql_run_from_python_is_caught() -> None:
    assert python_sql_literals(
        'con.sql(f"SELECT count(*) FROM events WHERE event = \'hook_failed\' AND x = {x}")\n'
        'MESSAGE = "mode \'expiring\' needs a ttl"\n') == ["hook_failed"]


def test_a_label_spelled_in_python_is_caught() -> None:
    assert python_literals('"""harm"""\nCOLOURS = {"harm": "#D55E00"}\n') == ["harm"]


def test_a_term_quoted_in_sql_inside_python_is_caught() -> None:
    assert python_literals('Q = """SELECT 1 FROM events WHERE event = \'claim_bound\'"""\n') \
        == ["claim_bound"]


def test_a_placeholder_is_filled_with_the_term() -> None:
    assert V.fill_sql("label = {label.harm}") == "label = 'harm'"


def test_a_placeholder_the_vocabulary_lacks_fails_loudly() -> None:
    with pytest.raises(ValueError, match="not a term"):
        V.fill_sql("outcome = {claim_outcome.harm}")


def test_labels_rank_in_one_order_and_the_codes_follow_it() -> None:
    assert [V.LABEL_SEVERITY[x] for x in V.LABELS] == sorted(V.LABEL_SEVERITY.values(), reverse=True)


def test_the_schema_gives_fields_for_exactly_the_vocabulary_events() -> None:
    assert tuple(EVENTS) == V.EVENT_NAMES


def test_every_sql_file_fills_without_error() -> None:
    for path in SQL_FILES:
        V.fill_sql(path.read_text())


def test_the_check_table_names_exactly_the_vocabulary_checks_in_order() -> None:
    assert tuple(c.name for c in sorted(CHECKS, key=lambda c: c.ord)) == V.CHECK_NAMES


def test_every_kind_that_fails_a_check_is_a_finding_kind() -> None:
    assert {k for c in CHECKS for k in c.fails_on} <= set(V.FINDING_KINDS)


def test_a_finding_kind_the_vocabulary_lacks_fails_loudly() -> None:
    with pytest.raises(ValueError, match="not a term"):
        V.fill_sql("kind = {finding.harm_unreported}")


def findings_made() -> set[str]:
    """The finding kinds the stages can make: 07_findings names each one as ``{finding.x}``,
    02_claims the lifecycle rules a claim event breaks (its ``broken_rule``)."""
    sql = "".join((REPO / "reconstruct" / "sql" / name).read_text()
                  for name in ("02_claims.sql", "07_findings.sql"))
    return set(re.findall(r"\{finding\.([a-z_]+)\}", sql))


def test_the_vocabulary_lists_exactly_the_finding_kinds_the_stages_make() -> None:
    assert findings_made() == set(V.FINDING_KINDS)


def test_a_check_fails_only_on_kinds_the_stages_make() -> None:
    assert {k for c in CHECKS for k in c.fails_on} <= findings_made()
