"""`kvclaims explain`: a tenant's post-incident explanation, redacted of every other tenant.

Golden files: tests/golden/explain/<tenant>.txt (regenerate with KVCLAIMS_UPDATE_GOLDEN=1).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

import kvclaims
from kvclaims.cli import main
from kvclaims.explaining import Explanation, explain, tenants_by_harm
from kvclaims.contract.schema import InputError
from tests.test_queries import check_golden

REPO = Path(__file__).resolve().parents[1]
MULTI = REPO / "traces" / "multi_tenant"
NATIVE_80 = REPO / "traces" / "sweep-resident60_active70" / "resident60_active70-native-80"
FIX = REPO / "tests" / "fixtures"
GOLDEN = REPO / "tests" / "golden" / "explain"
FORMATS = ("text", "md", "html", "json")


@pytest.fixture(scope="module")
def audit():
    with kvclaims.open([MULTI]) as a:
        yield a


def tenants(audit) -> list[str]:
    return sorted(r[0] for r in audit.sql(
        "SELECT DISTINCT tenant FROM events WHERE tenant IS NOT NULL").fetchall())


def test_the_shipped_trace_has_several_tenants(audit) -> None:
    assert len(tenants(audit)) >= 5


@pytest.mark.parametrize("tenant", ["tenant-a", "tenant-b", "tenant-c", "tenant-d", "tenant-e",
                                    "tenant-x"])
def test_explanation_matches_golden(audit, tenant: str) -> None:
    check_golden(GOLDEN / f"{tenant}.txt", explain(audit, tenant).to_text())


def _foreign_identifiers(audit, tenant: str) -> set[str]:
    """Every other tenant's name, claim ids, request ids and block hashes."""
    rows = audit.sql(f"""
        SELECT DISTINCT tenant FROM events WHERE tenant IS NOT NULL AND tenant <> '{tenant}'
        UNION SELECT DISTINCT claim_id FROM claims WHERE tenant IS DISTINCT FROM '{tenant}'
        UNION SELECT DISTINCT request_id FROM requests WHERE tenant IS DISTINCT FROM '{tenant}'
          AND request_id NOT IN (SELECT request_id FROM claims WHERE tenant = '{tenant}')
        UNION SELECT DISTINCT e.block_hash::VARCHAR FROM events e
          JOIN claims c ON c.run_id = e.run_id AND c.claim_id = e.claim_id
          WHERE e.event = 'claim_bound' AND c.tenant IS DISTINCT FROM '{tenant}'""").fetchall()
    return {r[0] for r in rows}


def _mentions(text: str, ident: str) -> bool:
    return re.search(rf"(?<![\w:.-]){re.escape(ident)}(?![\w:.-])", text) is not None


def test_no_explanation_names_another_tenants_identifiers(audit) -> None:
    checked = 0
    for tenant in tenants(audit):
        foreign = _foreign_identifiers(audit, tenant)
        assert foreign
        for fmt in FORMATS:
            text = explain(audit, tenant).render(fmt)
            leaked = sorted(i for i in foreign if _mentions(text, i))
            assert not leaked, f"{tenant} ({fmt}) names {leaked}"
            checked += 1
    assert checked == len(tenants(audit)) * len(FORMATS)


def test_the_leak_check_would_find_a_leak(audit) -> None:
    # negative twin: the same search finds another tenant's claim id when it is there
    text = explain(audit, "tenant-d").to_text() + " see also b:doc"
    assert _mentions(text, "b:doc") and "b:doc" in _foreign_identifiers(audit, "tenant-d")


def test_an_explanation_names_the_tenants_own_claims(audit) -> None:
    text = explain(audit, "tenant-d").to_text()
    assert "d:best" in text and "d:soft" in text and "another tenant's request" in text


def test_an_explanation_leaves_out_other_tenants_claims(audit) -> None:
    assert "a:doc" not in explain(audit, "tenant-d").to_text()


def test_unknown_tenant_is_an_error(audit) -> None:
    with pytest.raises(InputError, match="unknown tenant"):
        explain(audit, "tenant-nobody")


def test_another_tenants_claim_is_an_error_that_does_not_say_whose(audit) -> None:
    with pytest.raises(InputError) as exc:
        explain(audit, "tenant-d", claim="b:doc")
    assert "tenant-b" not in str(exc.value)


def test_one_claim_of_the_tenant_gives_one_section(audit) -> None:
    ex = explain(audit, "tenant-d", claim="d:soft")
    assert [s.id for s in ex.sections] == ["d:soft"]


def test_a_refusal_is_explained_in_capacity_terms() -> None:
    with kvclaims.open([FIX / "hard_60_70_80.jsonl"]) as a:
        ex = explain(a, "tenant-b")
        text = ex.to_text()
    assert [s.outcome for s in ex.sections] == ["refused"]
    assert ("60 block(s) were protected by claims in force (0 of yours, 1 of other tenants), "
            "other running requests held 0, you needed 70, 80 were usable, shortfall 50") in text
    assert "claim:resident" not in text and "tenant-a" not in text


def test_a_harm_is_explained_in_capacity_terms_with_utc(tmp_path: Path) -> None:
    from tests.test_facade import _with_clock

    run = _with_clock(NATIVE_80, tmp_path / "run")
    with kvclaims.open([run]) as a:
        harmed = a.sql("SELECT tenant, first_harm_seq FROM claims WHERE outcome = 'harmed' "
                       "ORDER BY first_harm_seq LIMIT 1").fetchall()
        assert harmed, "the shipped native-80 trace has a harmed claim"
        tenant, seq = harmed[0]
        text = explain(a, tenant).to_text()
    assert re.search(rf"at \d{{4}}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{{3}}Z \(seq {seq}\) \d+ of "
                     r"your \d+ block\(s\) were evicted \(harm\) to admit another tenant's "
                     r"request; at its admission \(seq \d+\) it needed \d+ block\(s\) while \d+ "
                     r"were usable and \d+ were protected by claims in force \(\d+ claim\(s\) of "
                     r"yours, \d+ of other tenants\) - \d+ \+ \d+ (>|<=) \d+", text)
    assert "no clock" not in text


def test_without_a_clock_the_explanation_says_so(tmp_path: Path) -> None:
    from tests.test_facade import _copy

    run = _copy(MULTI, tmp_path / "run")
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["clock"] = None  # as an import without a clock writes it
    (run / "manifest.json").write_text(json.dumps(manifest))
    with kvclaims.open([run]) as a:
        assert "no clock" in explain(a, "tenant-d").clock


def test_with_a_clock_the_explanation_gives_utc(audit) -> None:
    assert "no clock" not in explain(audit, "tenant-d").clock


def test_tenants_by_harm_starts_with_the_most_harmed(audit) -> None:
    order = tenants_by_harm(audit)
    most = audit.sql("SELECT tenant FROM claims GROUP BY tenant "
                     "ORDER BY sum(blocks_lost_harm) DESC, sum(value_lost) DESC, tenant "
                     "LIMIT 1").fetchall()[0][0]
    assert order[0] == most and set(order) == set(tenants(audit))


def test_json_has_one_shape(audit) -> None:
    doc = json.loads(explain(audit, "tenant-b").to_json())
    assert set(doc) == {"tenant", "runs", "clock", "window", "sections"}
    assert set(doc["sections"][0]) >= {"kind", "id", "outcome", "promised", "lowering",
                                       "timeline", "why", "value_lost", "prevention"}


def test_html_is_one_self_contained_file(audit) -> None:
    page = explain(audit, "tenant-d").to_html()
    assert page.startswith("<!DOCTYPE html>") and "</html>" in page
    assert not re.search(r"(src|href)\s*=|<script|<link|https?://", page)


# -- the CLI --------------------------------------------------------------------------------------

def test_cli_writes_an_html_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "tenant-d.html"
    assert main(["explain", str(MULTI), "--tenant", "tenant-d", "--format", "html",
                 "--out", str(out), "--quiet"]) == 0
    assert "d:best" in out.read_text()


def test_cli_unknown_tenant_is_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["explain", str(MULTI), "--tenant", "nobody"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvclaims explain: error: unknown tenant") and err.count("\n") == 1


def test_cli_claim_of_another_tenant_is_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", str(MULTI), "--tenant", "tenant-d", "--claim", "a:doc"]) == 2


def test_explanation_type_is_the_one_the_dashboard_renders(audit) -> None:
    assert isinstance(explain(audit, "tenant-a"), Explanation)


def test_a_copied_trace_explains_the_same(tmp_path: Path, audit) -> None:
    shutil.copytree(MULTI, tmp_path / "copy")
    with kvclaims.open([tmp_path / "copy"]) as a:
        assert explain(a, "tenant-c").to_text() == explain(audit, "tenant-c").to_text()


# -- time windows ---------------------------------------------------------------------------------

def test_at_a_time_of_day_keeps_the_sections_with_a_moment_there(audit) -> None:
    from kvclaims.explaining import run_days, time_window

    w = time_window("05:56:46.6", "50ms", days=run_days(audit))
    ex = explain(audit, "tenant-b", window=w)
    assert [s.id for s in ex.sections] == ["b:doc"]
    assert ex.window == {"since": "2026-11-30T05:56:46.550Z", "until": "2026-11-30T05:56:46.650Z"}


def test_a_window_with_nothing_in_it_keeps_no_section(audit) -> None:
    # negative twin
    from kvclaims.explaining import time_window

    w = time_window(since="2026-11-30T06:00:00Z", until="2026-11-30T07:00:00Z")
    assert explain(audit, "tenant-b", window=w).sections == []


def test_cli_at_gives_iso_times_in_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", str(MULTI), "--tenant", "tenant-b", "--at",
                 "2026-11-30T05:56:46Z", "--window", "2s", "--format", "json", "--quiet"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["window"]["since"] == "2026-11-30T05:56:44.000Z"
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", m["utc"])
               for s in doc["sections"] for m in s["timeline"])


@pytest.mark.parametrize("args, msg", [
    (["--at", "25:00"], "bad time"), (["--at", "05:56", "--window", "soon"], "bad duration"),
    (["--window", "1m"], "--window needs --at"),
    (["--since", "05:56:44", "--until", "05:56:40"], "before --since"),
    (["--at", "05:56", "--since", "05:56"], "not both")])
def test_cli_bad_window_is_one_line_exit_2(args: list[str], msg: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["explain", str(MULTI), "--tenant", "tenant-b", *args]) == 2
    err = capsys.readouterr().err
    assert msg in err and err.count("\n") == 1
