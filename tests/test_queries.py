"""Golden-output diff tests of the public SQL library (queries/*.sql), one per view, through
the one audit facade (``kvclaims.open``).

Regenerate every golden file (views and explanations) after an intended change:

    KVCLAIMS_UPDATE_GOLDEN=1 pytest tests/test_queries.py tests/test_explain.py
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

import kvclaims
from kvclaims import queries

FIX = Path(__file__).parent / "fixtures"
GOLDEN = Path(__file__).parent / "golden"
UPDATE = bool(os.environ.get("KVCLAIMS_UPDATE_GOLDEN"))


@pytest.fixture(scope="module")
def audit():
    with kvclaims.open(sorted(FIX.glob("*.jsonl"))) as a:
        yield a


def render(audit, view: str) -> str:
    rel = audit.view(view)
    lines = [json.dumps(rel.columns)]
    lines += [json.dumps(list(r), default=str) for r in rel.fetchall()]
    return "\n".join(lines) + "\n"


def check_golden(path: Path, got: str) -> None:
    """Compare with the golden file, or rewrite it under KVCLAIMS_UPDATE_GOLDEN=1."""
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(got, encoding="utf-8")
    assert path.is_file(), f"{path}: no golden file (run with KVCLAIMS_UPDATE_GOLDEN=1)"
    assert got == path.read_text(encoding="utf-8")


@pytest.mark.parametrize("view", queries.VIEWS)
def test_view_matches_golden_output(audit, view: str) -> None:
    check_golden(GOLDEN / f"{view}.jsonl", render(audit, view))


@pytest.mark.parametrize("view", queries.VIEWS)
def test_every_view_and_column_has_a_comment_above_it(view: str) -> None:
    lines = queries.sql_text(view).splitlines()
    body = [i for i, line in enumerate(lines) if line.startswith("CREATE OR REPLACE VIEW")]
    assert body and lines[body[0] - 1].startswith("--")
    select = max(i for i in range(body[0], len(lines))
                 if lines[i].strip() == "SELECT" and not lines[i].startswith(" "))
    prev_code = lines[select]
    for i in range(select + 1, len(lines)):
        line = lines[i]
        if line.startswith(("FROM", "WHERE", "ORDER", "GROUP", "LEFT", "JOIN", "ASOF")):
            break
        if line.strip().startswith("--") or not line.strip():
            continue
        starts_column = prev_code.rstrip().endswith(",") or prev_code.strip() == "SELECT"
        if starts_column and re.match(r"^    [^ ]", line):
            assert lines[i - 1].strip().startswith("--"), \
                f"{view}.sql:{i + 1}: no comment above {line!r}"
        prev_code = line


@pytest.mark.parametrize("view", queries.VIEWS)
def test_every_view_has_a_one_sentence_description(view: str) -> None:
    text = queries.description(view)
    assert text.endswith(".") and not text.startswith(view)


def test_a_view_without_its_file_is_unknown() -> None:
    with pytest.raises(KeyError):
        queries.sql_text("no_such_view")


def test_queries_ship_as_package_data() -> None:
    for view in queries.VIEWS:
        assert queries.sql_text(view).strip()


def test_tenant_explanations_never_name_another_tenants_request(audit) -> None:
    rows = audit.sql("""
        SELECT e.explanation, q.request_id FROM tenant_explanations e
        JOIN requests q ON q.run_id = e.run_id AND q.tenant IS DISTINCT FROM e.tenant""")
    found = rows.fetchall()
    assert found
    for sentence, other in found:
        assert not re.search(rf"(?<![\w:-]){re.escape(other)}(?![\w:-])", sentence), other


def test_claim_timeline_is_in_seq_order_per_claim_instance(audit) -> None:
    rows = audit.sql("SELECT run_id, claim_id, claim_seq, seq FROM claim_timeline").fetchall()
    assert rows and rows == sorted(rows, key=lambda r: (r[0], r[1], r[2], r[3]))
    assert all(r[3] >= r[2] for r in rows)   # nothing before the instance starts


def _admissions(tmp_path: Path, claimed: int, required: int) -> Path:
    """A native run (nothing enforced): a claim keeps ``claimed`` of 10 usable blocks cached
    and bound, then another request needing ``required`` blocks is admitted and allocates
    them (evicting claimed blocks when the free ones run out)."""
    ev: list[dict] = [
        {"event": "run_started", "model": "m", "block_size": 16, "num_blocks": 11,
         "usable_blocks": 10, "policy": "native"},
        {"event": "request_arrived", "request_id": "r1", "tenant": "t",
         "num_prompt_tokens": 16 * claimed, "claim_id": "c1"},
        {"event": "claim_submitted", "claim_id": "c1", "tenant": "t", "request_id": "r1",
         "protection_mode": "hard_protected", "threshold_blocks": claimed, "value": 1.0},
        {"event": "claim_accepted", "claim_id": "c1"},
    ]
    ev += [{"event": "claim_bound", "claim_id": "c1", "block_hash": 100 + i, "position": i}
           for i in range(claimed)]
    ev.append({"event": "request_admitted", "request_id": "r1", "blocks_required": claimed,
               "free_blocks": 10, "protected_blocks": 0, "usable_blocks": 10})
    for i in range(claimed):
        ev.append({"event": "block_allocated", "block_id": i + 1, "request_id": "r1"})
        ev.append({"event": "block_cached", "block_id": i + 1, "block_hash": 100 + i,
                   "position": i, "request_id": "r1"})
    ev.append({"event": "claim_materialized", "claim_id": "c1"})
    ev.append({"event": "request_finished", "request_id": "r1", "finish_reason": "length"})
    ev += [{"event": "block_freed", "block_id": i + 1, "request_id": "r1"}
           for i in range(claimed)]
    ev.append({"event": "request_arrived", "request_id": "r2", "tenant": "u",
               "num_prompt_tokens": 16 * required})
    ev.append({"event": "request_admitted", "request_id": "r2", "blocks_required": required,
               "free_blocks": 10 - claimed, "protected_blocks": claimed, "usable_blocks": 10})
    # r2 takes the free blocks first, then evicts cached (claimed) ones
    for b in range(required):
        block = claimed + 1 + b if b < 10 - claimed else b - (10 - claimed) + 1
        if b >= 10 - claimed:
            ev.append({"event": "block_evicted", "block_id": block, "block_hash": 100 + block - 1,
                       "cause": "allocation", "by_request_id": "r2"})
        ev.append({"event": "block_allocated", "block_id": block, "request_id": "r2"})
    path = tmp_path / "cap.jsonl"
    path.write_text("".join(json.dumps({"run_id": "cap", "seq": i, "ts_ns": 1000 + i, **e}) + "\n"
                            for i, e in enumerate(ev)))
    return path


def test_an_admission_that_does_not_fit_is_a_feasibility_violation(tmp_path: Path) -> None:
    with kvclaims.open([_admissions(tmp_path, 8, 5)]) as a:
        rows = a.sql("SELECT request_id, violation FROM feasibility_violations").fetchall()
    assert rows == [("r2", "infeasible_admission")]


def test_an_admission_that_fits_is_no_violation(tmp_path: Path) -> None:
    with kvclaims.open([_admissions(tmp_path, 2, 5)]) as a:
        assert a.sql("SELECT count(*) FROM feasibility_violations").fetchall() == [(0,)]
