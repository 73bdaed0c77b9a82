"""The Streamlit audit dashboard (dashboard/): its data functions on the shipped traces, the app
under Streamlit's AppTest, and the app served by ``streamlit run`` in a real headless Chromium.

No mocks: every test reconstructs real run directories (the shipped traces, a JSON Lines
fixture imported as a run directory, or a copy with a corrupted segment).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from kvclaims.contract.vocabulary import CHECK_VERDICTS
from kvclaims.dashboard import data
from kvclaims import fleet
from kvclaims.contract.schema import InputError
from tests.test_whatif import native80, native_whatif  # noqa: F401 (fixtures: a what-if)

REPO = Path(__file__).resolve().parent.parent
APP = REPO / "dashboard" / "app.py"
TRACES = REPO / "traces"
SWEEP = TRACES / "sweep-resident60_active70"
MULTI = TRACES / "multi_tenant"
DEMOTE = TRACES / "lifecycle_demote"
LIVE = TRACES / "live_pressure"
MULTI_RUN = "multi_tenant-hard_protected-80"
DEMOTE_RUN = "lifecycle_demote-demote_on_conflict-80"
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
PAGES = ["Overview", "Timeline", "Claims", "Capacity sweep", "What-if", "Tenants",
         "Findings & conformance"]
SCREENSHOTS = REPO / "docs" / "screenshots"
NATIVE_80 = "resident60_active70-native-80"
HARD_80 = "resident60_active70-hard_protected-80"


@pytest.fixture(scope="module")
def audit() -> data.Pages:
    """Every shipped trace, reconstructed once for the module."""
    return data.load_audit(data.default_paths())


def _corrupt_copy(src: Path, dst: Path) -> Path:
    """A copy of a run directory whose only segment has 64 bytes of garbage in its header
    (and no sealed ``events.parquet``, so the segment is what is read)."""
    shutil.copytree(src, dst)
    (dst / "events.parquet").unlink(missing_ok=True)
    seg = dst / "events-000000.arrows"
    raw = bytearray(seg.read_bytes())
    raw[100:164] = b"\xff" * 64
    seg.write_bytes(bytes(raw))
    return dst


def _sweep_row(df, policy: str, usable: int) -> dict:
    rows = df[(df["policy"] == policy) & (df["usable_blocks"] == usable)]
    assert len(rows) == 1, rows
    return rows.iloc[0].to_dict()


# -- data functions --------------------------------------------------------------------------------

def test_default_paths_are_the_shipped_run_folders_without_the_prototype() -> None:
    paths = data.default_paths()
    names = [p.name for p in paths]
    assert {"lifecycle_demote", "lifecycle_expire", "live_pressure", "multi_tenant",
            "sweep-resident60_active70"} <= set(names)
    assert names == sorted(names) and all(p.is_dir() and p.parent == TRACES for p in paths)
    assert "arbiter-prototype" not in names and (TRACES / "arbiter-prototype").is_dir()


def test_sweep_hard_protected_at_80_is_refused_with_shortfall_50(audit: data.Pages) -> None:
    row = _sweep_row(data.capacity_sweep(audit, "resident60_active70"), "hard_protected", 80)
    assert row["active_outcome"] == "refused"
    assert row["shortfall_blocks"] == 50
    assert row["blocking_claim_ids"] == "claim:resident"
    assert row["resident_blocks_lost"] == 0


def test_sweep_native_at_80_is_served_and_loses_50_resident_blocks_as_harm(
        audit: data.Pages) -> None:
    row = _sweep_row(data.capacity_sweep(audit, "resident60_active70"), "native", 80)
    assert row["active_outcome"] == "served"
    assert pd.isna(row["shortfall_blocks"]) and pd.isna(row["blocking_claim_ids"])
    assert (row["resident_blocks_lost"], row["harm"]) == (50, 50)


def test_capacity_sweep_shows_the_same_rows_as_kvclaims_sweep(audit: data.Pages) -> None:
    from kvclaims.cli.record import SWEEP_COLUMNS, sweep_rows

    cli = sweep_rows(sorted(p for p in SWEEP.iterdir() if p.is_dir()))
    shown = data.capacity_sweep(audit, "resident60_active70")
    assert len(shown) == len(cli) == 21
    for want in cli:
        got = _sweep_row(shown, want["policy"], want["usable_blocks"])
        for col in SWEEP_COLUMNS:
            if col == "blocking_claim_ids":  # a list there, comma-separated text here
                assert got[col] == (", ".join(want[col]) if want[col] else None) or (
                    not want[col] and pd.isna(got[col])), want["run_id"]
            elif want[col] is None:
                assert pd.isna(got[col]), (want["run_id"], col)
            else:
                assert got[col] == want[col], (want["run_id"], col)


def test_sweep_series_has_one_line_per_policy_per_metric(audit: data.Pages) -> None:
    series = data.sweep_series(audit, "resident60_active70")
    assert len(series) == 3 * 7 * 2
    hard = series[(series["policy"] == "hard_protected") & (series["metric"] == "shortfall")]
    assert hard["value"].tolist() == [50, 40, 30, 20, 10, 0, 0]
    native = series[(series["policy"] == "native")
                    & (series["metric"] == "resident blocks lost")]
    assert native["value"].tolist() == [50, 40, 30, 20, 10, 0, 0]


def test_sweep_series_of_another_scenario_holds_only_its_runs(audit: data.Pages) -> None:
    series = data.sweep_series(audit, "live_pressure")
    assert set(series["run_id"]) == {"live_pressure-hard_protected-67"}
    short = series[series["metric"] == "shortfall"]
    assert short["value"].tolist() == [19]


def test_the_tenant_explanation_is_kvclaims_explain(audit: data.Pages) -> None:
    from kvclaims.explaining import explain

    shown = data.explanation(audit, "tenant-resident")
    assert shown.to_json() == explain(audit.facade, "tenant-resident").to_json()
    harmed = [s for s in shown.sections if s.outcome == "harmed"]
    assert {s.run_id for s in harmed} == set(
        data.claim_outcomes(audit).query("outcome == 'harmed'")["run_id"])


def test_tenant_a_explanation_is_relaxation_not_harm(audit: data.Pages) -> None:
    (claim,) = [s for s in data.explanation(audit, "tenant-a").sections if s.kind == "claim"]
    assert claim.outcome == "released"
    text = " ".join(m.text for m in claim.timeline)
    assert "released the claim" in text and "relaxation" in text and "harm:" not in text


def test_an_unknown_tenant_has_no_explanation(audit: data.Pages) -> None:
    with pytest.raises(InputError, match="unknown tenant"):
        data.explanation(audit, "tenant-nobody")


def test_tenant_without_incident_is_listed_and_its_claim_preserved(audit: data.Pages) -> None:
    assert "tenant-live" in data.tenants(audit)
    expl = data.explanation(audit, "tenant-live")
    assert [s.outcome for s in expl.sections if s.kind == "claim"] == ["preserved"]
    assert data.tenant_claims(audit, "tenant-live")["outcome"].tolist() == ["preserved"]


def _other_tenants_ids(audit: data.Pages, tenant: str) -> set[str]:
    """Every tenant name, claim id and request id in the audit that is not ``tenant``'s."""
    claims, req = audit.tables["claims"], audit.tables["requests"]
    own = set(claims.loc[claims["tenant"] == tenant, "claim_id"]) | set(
        req.loc[req["tenant"] == tenant, "request_id"]) | set(
        claims.loc[claims["tenant"] == tenant, "request_id"].dropna())
    ids = set(claims["tenant"].dropna()) | set(req["tenant"].dropna()) | set(
        claims["claim_id"]) | set(req["request_id"])
    return {i for i in ids if i not in own and i != tenant}


def test_a_tenant_page_names_no_other_tenants_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    at = _page(_app(monkeypatch, MULTI), "Tenants")
    audit = data.load_audit([MULTI])
    for tenant in at.selectbox(key="tenant").options:
        at.selectbox(key="tenant").set_value(tenant).run()
        shown = " ".join(str(el.value) for el in [*at.markdown, *at.warning, *at.info,
                                                  *at.caption, *at.success])
        shown += " ".join(d.value.to_csv() for d in at.dataframe)
        foreign = _other_tenants_ids(audit, tenant)
        leaks = {i for i in foreign if i in shown or data.md_text(i) in shown}
        assert foreign and not leaks, (tenant, leaks)
        assert data.md_text(tenant) in shown  # the page is about this tenant


def test_a_tenant_page_check_finds_another_tenants_id(audit: data.Pages) -> None:
    """The isolation check above can fail: tenant-a's own text names ids foreign to tenant-b."""
    own = data.explanation(audit, "tenant-a").to_text()
    assert {i for i in _other_tenants_ids(audit, "tenant-b") if i in own}


def test_claim_timeline_of_a_harmed_claim_shows_harm_after_acceptance(audit: data.Pages) -> None:
    (q,) = data.claim_instances(audit, NATIVE_80, "claim:resident")
    events = data.claim_lifecycle(audit, NATIVE_80, q)
    assert events["event"].tolist()[:2] == ["claim_submitted", "claim_accepted"]
    losses = data.claim_losses(audit, NATIVE_80, q)
    assert set(losses["label"]) == {"harm"} and len(losses) == 50
    accepted = int(events.loc[events["event"] == "claim_accepted", "seq"].iloc[0])
    outcome = data.claim_outcomes(audit)
    first_harm = outcome.loc[(outcome["run_id"] == NATIVE_80)
                             & (outcome["claim_seq"] == q), "first_harm_seq"].iloc[0]
    assert losses["seq"].min() == first_harm > accepted


def test_claim_timeline_of_a_demoted_claim_shows_relaxation_after_demotion(
        audit: data.Pages) -> None:
    (q,) = data.claim_instances(audit, DEMOTE_RUN, "claim:resident")
    events = data.claim_lifecycle(audit, DEMOTE_RUN, q)
    assert "claim_harmed" not in set(events["event"])
    demoted = int(events.loc[events["event"] == "claim_demoted", "seq"].iloc[0])
    losses = data.claim_losses(audit, DEMOTE_RUN, q)
    assert set(losses["label"]) == {"relaxation"} and len(losses) == 50
    assert losses["seq"].min() > demoted


@pytest.fixture(scope="module")
def reused(tmp_path_factory: pytest.TempPathFactory) -> data.Pages:
    """tests/fixtures/reuse_demoted.jsonl: claim:a demoted, then submitted again (a second
    instance), whose block is then evicted."""
    from kvclaims.sources.jsonl import import_jsonl

    (run,) = import_jsonl(REPO / "tests" / "fixtures" / "reuse_demoted.jsonl",
                          tmp_path_factory.mktemp("reuse") / "run")
    return data.load_audit([run])


def test_a_reused_claim_id_is_two_instances_with_their_own_losses(reused: data.Pages) -> None:
    (run_id,) = reused.run_ids
    first, second = data.claim_instances(reused, run_id, "claim:a")
    assert data.claim_lifecycle(reused, run_id, first)["event"].tolist()[-1] == "claim_demoted"
    assert "claim_demoted" not in set(data.claim_lifecycle(reused, run_id, second)["event"])
    assert data.claim_losses(reused, run_id, first)["label"].tolist() == ["relaxation"]
    assert data.claim_losses(reused, run_id, second)["label"].tolist() == ["harm"]
    assert data.harmed_claims(reused) == [(run_id, second)]


def test_a_reused_claim_id_draws_one_lane_per_instance(reused: data.Pages) -> None:
    (run_id,) = reused.run_ids
    first, second = data.claim_instances(reused, run_id, "claim:a")
    lanes = data.claim_lanes(reused, run_id)
    assert list(dict.fromkeys(lanes["lane"])) == [f"claim:a #{first}", f"claim:a #{second}"]
    marks = data.claim_loss_marks(reused, run_id).set_index("lane")["label"].to_dict()
    assert marks == {f"claim:a #{first}": "relaxation", f"claim:a #{second}": "harm"}


def test_a_claim_id_used_once_is_labelled_by_its_id_alone(audit: data.Pages) -> None:
    (q,) = data.claim_instances(audit, DEMOTE_RUN, "claim:resident")
    assert data.claim_label(audit, DEMOTE_RUN, q) == "claim:resident"


def test_claims_that_lost_blocks_come_first_in_the_claim_chooser(audit: data.Pages) -> None:
    keys = data.claim_keys(audit)
    outcome = data.claim_outcomes(audit).set_index(["run_id", "claim_seq"])
    lost = [sum(outcome.loc[k, f"blocks_lost_{x}"] for x in
                ("harm", "expiry", "relaxation", "eviction", "unknown")) for k in keys]
    assert lost[0] > 0
    assert lost == sorted(lost, key=lambda n: n == 0)
    assert len(keys) == len(outcome)


def test_pool_occupancy_stays_within_the_pool(audit: data.Pages) -> None:
    for run_id in audit.run_ids:
        occ = data.pool_occupancy(audit, run_id)
        assert set(occ["run_id"]) <= {run_id}
        assert occ["seq"].is_monotonic_increasing
        assert occ["cached_blocks"].between(0, data.usable_blocks(audit, run_id)).all(), run_id
    assert data.pool_occupancy(audit, MULTI_RUN)["cached_blocks"].max() == 80


def test_pool_occupancy_of_an_unknown_run_is_empty(audit: data.Pages) -> None:
    assert data.pool_occupancy(audit, "no-such-run").empty
    assert data.usable_blocks(audit, "no-such-run") is None


def test_loss_labels_count_every_label_of_multi_tenant(audit: data.Pages) -> None:
    labels = data.loss_labels(audit)
    mt = labels[labels["run_id"] == MULTI_RUN].set_index("label")["blocks_lost"].to_dict()
    claims = data.claim_outcomes(audit).query("run_id == @MULTI_RUN")
    for label in ("harm", "expiry", "relaxation"):  # every label a claim lost, counted
        assert mt.get(label, 0) >= int(claims[f"blocks_lost_{label}"].sum())
    assert mt["relaxation"] == 43 and mt["expiry"] == 10 and "harm" not in mt


def test_loss_labels_of_a_refusing_hard_protected_run_are_empty(audit: data.Pages) -> None:
    labels = data.loss_labels(audit)
    assert "resident60_active70-hard_protected-80" not in set(labels["run_id"])


def test_conformance_of_shipped_runs_passes_or_is_not_exercised(audit: data.Pages) -> None:
    conf = data.conformance(audit)
    for run_id in audit.run_ids:
        assert conf.loc[conf["run_id"] == run_id, "check"].tolist() == list(data.CHECKS)
    assert set(conf["verdict"]) <= set(CHECK_VERDICTS)
    def verdicts(df: pd.DataFrame) -> dict:
        return {(r, c): v for r, c, v in df[["run_id", "check", "verdict"]].itertuples(
            index=False)}
    assert verdicts(conf) == verdicts(audit.conformance)  # the table's, none rewritten
    matrix = data.conformance_matrix(audit)
    assert list(matrix.columns) == ["run_id", *data.CHECKS]
    assert matrix["run_id"].tolist() == audit.run_ids  # natural order: -80 before -100


def test_a_trace_with_a_recorder_gap_shows_a_hole_finding_and_unknown_verdicts(
        tmp_path: Path) -> None:
    from kvclaims.sources.jsonl import import_jsonl

    run = import_jsonl(REPO / "tests" / "fixtures" / "gap.jsonl", tmp_path / "gap")
    gap = data.load_audit(run)
    found = data.findings(gap)
    assert found[["kind", "severity"]].values.tolist() == [["recorder_gap", "hole"]]
    assert set(data.conformance(gap)["verdict"]) == {"unknown"}


def test_a_non_run_directory_gives_a_clear_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not a run directory"):
        data.load_audit([tmp_path])
    good, errors = data.check_paths([LIVE, tmp_path, tmp_path / "missing"])
    assert good == [str(LIVE)]
    assert errors == [f"{tmp_path}: not a run directory (no manifest.json or events-*.arrows), "
                      "contains none and is no fleet dataset (no events/ and manifests/)",
                      f"{tmp_path / 'missing'}: no such file or directory"]



def test_a_fleet_dataset_shows_the_same_claims_as_its_run_directory(tmp_path: Path) -> None:
    dataset = tmp_path / "dataset"
    fleet.audit_runs(fleet.find_fleet_runs([LIVE]), dataset)
    assert data.check_paths([dataset]) == ([str(dataset)], [])
    shown = data.load_audit([dataset]).views["claim_outcomes"]
    assert shown.equals(data.load_audit([LIVE]).views["claim_outcomes"]) and len(shown) > 0

def test_a_corrupt_segment_gives_a_clear_input_error_naming_the_file(tmp_path: Path) -> None:
    bad = _corrupt_copy(LIVE, tmp_path / "live")
    assert data.check_paths([bad]) == ([str(bad)], [])  # the manifest itself is fine
    with pytest.raises(InputError, match=r"events-000000\.arrows: corrupt"):
        data.load_audit([bad])


def test_the_dashboard_never_imports_the_scheduler_or_vllm() -> None:
    code = ("import sys; from dashboard import data, charts; "
            f"data.load_audit([{str(LIVE)!r}]); "
            "bad = [m for m in sys.modules if m == 'vllm' or m.startswith(('vllm.', "
            "'kvclaims.recorder.scheduler', 'torch'))]; print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# -- headline, sorting, timeline, evictors ------------------------------------------------------

def _headline_row(audit: data.Pages, run_id: str) -> dict:
    h = data.headline(audit)
    return h[h["run_id"] == run_id].iloc[0].to_dict()


def test_headline_of_native_80_is_one_harmed_claim_and_50_harm_blocks(audit: data.Pages) -> None:
    row = _headline_row(audit, NATIVE_80)
    assert (row["claims_harmed"], row["lost_harm"], row["refused"]) == (1, 50, 0)
    assert "1 of 1 claims harmed; blocks lost: 50 harm" in data.headline_text(row)


def test_headline_of_hard_protected_80_is_a_refusal_and_no_harm(audit: data.Pages) -> None:
    row = _headline_row(audit, HARD_80)
    assert (row["claims_harmed"], row["lost_harm"], row["refused"]) == (0, 0, 1)
    assert "blocks lost: none; 1 of 3 requests refused" in data.headline_text(row)


def test_summary_counts_every_harmed_claim(audit: data.Pages) -> None:
    h = data.headline(audit)
    assert f"{int(h['claims_harmed'].sum())} claims harmed" in data.summary_text(audit)
    assert int(h["lost_harm"].sum()) > 0


def test_runs_and_sweep_rows_sort_capacities_numerically(audit: data.Pages) -> None:
    ids = [r for r in audit.run_ids if r.startswith("resident60_active70-hard_protected-")]
    assert [int(r.rsplit("-", 1)[1]) for r in ids] == [80, 90, 100, 110, 120, 130, 150]
    assert sorted(ids) != ids  # plain text order would put -100 before -80
    sweep = data.capacity_sweep(audit, "resident60_active70")
    hard = sweep[sweep["policy"] == "hard_protected"]["usable_blocks"].tolist()
    assert hard == [80, 90, 100, 110, 120, 130, 150]


def test_sweep_table_leads_with_the_decisive_columns(audit: data.Pages) -> None:
    cols = data.capacity_sweep(audit).columns.tolist()
    assert cols[:6] == ["policy", "usable_blocks", "active_outcome", "resident_blocks_lost",
                        "claim_outcome", "harm"]
    assert cols.index("run_id") > cols.index("blocks_lost")
    assert data.SWEEP_TITLES["harm"] == "of those: harm"  # counts the active request's only


def test_occupancy_categories_fill_exactly_the_usable_pool(audit: data.Pages) -> None:
    occ = audit.tables["occupancy"]
    total = occ["protected"] + occ["held"] + occ["cached"] + occ["free"]
    assert (total == occ["usable_blocks"]).all()
    assert (occ[["protected", "held", "cached", "free"]] >= 0).all().all()


def test_only_an_enforcing_policy_protects_blocks(audit: data.Pages) -> None:
    assert data.occupancy(audit, HARD_80)["protected"].max() >= 60
    assert data.occupancy(audit, NATIVE_80)["protected"].max() == 0


def _runtime_view(audit: data.Pages, occ: pd.DataFrame) -> pd.DataFrame:
    """Each admission decision's reported free/protected blocks beside the reconstructed pool
    just before that request's first allocation of the decision (or before the decision)."""
    import duckdb

    feas = audit.tables["feasibility"]
    req = audit.tables["requests"]
    once = set(req.loc[req["preemptions"].fillna(0) == 0, "request_id"])
    feas = feas[feas["request_id"].isin(once)]
    first = feas.merge(req[["run_id", "request_id", "first_alloc_seq"]],
                       on=["run_id", "request_id"], how="left")
    first["at"] = [int(a) if d == "admitted" and not pd.isna(a) and a < s else int(s)
                   for d, a, s in zip(first["decision"], first["first_alloc_seq"],
                                      first["seq"])]
    return duckdb.sql("""
        SELECT f.run_id, f.seq, f.free_blocks, f.runtime_protected_blocks AS protected_blocks,
               coalesce(o.free + o.cached, f.usable_blocks) AS evictable,
               coalesce(o.protected, 0) AS protected
        FROM first f ASOF LEFT JOIN occ o ON o.run_id = f.run_id AND o.seq < f.at""").df()


def test_occupancy_agrees_with_the_runtimes_own_counts_at_every_admission(
        audit: data.Pages) -> None:
    got = _runtime_view(audit, audit.tables["occupancy"])
    assert len(got) > 90
    assert (got["free_blocks"] == got["evictable"]).all(), got
    assert (got["protected_blocks"] == got["protected"]).all(), got


def test_occupancy_shifted_by_one_change_disagrees_with_the_runtime(audit: data.Pages) -> None:
    occ = audit.tables["occupancy"].copy()
    occ[["protected", "held", "cached", "free"]] = occ.groupby("run_id")[
        ["protected", "held", "cached", "free"]].shift(1).fillna(0)
    got = _runtime_view(audit, occ)
    assert not ((got["free_blocks"] == got["evictable"]).all()
                and (got["protected_blocks"] == got["protected"]).all())


def test_request_lanes_end_refused_preempted_or_served(audit: data.Pages) -> None:
    lanes = data.request_lanes(audit, MULTI_RUN)
    ends = lanes[lanes["kind"] == "mark"].set_index("lane")["state"].to_dict()
    name = {lane.rsplit("-", 1)[0]: lane for lane in ends}  # request ids end in a hash
    assert ends[name["i-huge"]] == "refused"
    assert ends[name["j-long-2"]] == "preempted"
    assert ends[name["a-doc"]] == "served"
    wait = lanes[lanes["lane"] == name["h-wait"]]["state"].tolist()
    assert wait[:3] == ["queued", "deferred", "running"]
    assert "deferred" not in lanes[lanes["lane"] == name["a-doc"]]["state"].tolist()


def test_claim_lanes_show_a_demotion_after_force(audit: data.Pages) -> None:
    lanes = data.claim_lanes(audit, MULTI_RUN)
    b = lanes[lanes["lane"] == "b:doc"].set_index("state")
    demoted = data.claim_outcomes(audit).query("run_id == @MULTI_RUN and claim_id == 'b:doc'")
    assert int(b.loc["in force", "end"]) == int(b.loc["demoted", "start"]) == int(
        demoted["release_seq"].iloc[0])
    assert "in force" not in set(lanes[lanes["lane"] == "e:bad"]["state"])  # rejected
    marks = data.claim_loss_marks(audit, MULTI_RUN)
    assert set(marks.loc[marks["lane"] == "b:doc", "label"]) == {"relaxation"}


def test_harm_evictors_name_the_active_request_and_why_it_was_admitted(
        audit: data.Pages) -> None:
    (q,) = data.claim_instances(audit, NATIVE_80, "claim:resident")
    ev = data.harm_evictors(audit, NATIVE_80, q)
    assert len(ev) == 1
    row = ev.iloc[0]
    assert row["request_id"].startswith("active-") and row["harm_blocks"] == 50
    assert (row["required_blocks"], row["protected_blocks"], row["usable_blocks"]) == (70, 60, 80)
    assert "policy native does not enforce claims" in row["why"]
    assert "60 + 0 + 70 does not fit in 80" in row["why"]


def test_a_preserved_claim_has_no_evictors(audit: data.Pages) -> None:
    (q,) = data.claim_instances(audit, HARD_80, "claim:resident")
    assert data.harm_evictors(audit, HARD_80, q).empty
    assert data.harmed_claims(audit, HARD_80) == []


def test_tenants_start_with_the_most_harm(audit: data.Pages) -> None:
    names = data.tenants(audit)
    assert names[0] == "tenant-resident"  # 50 blocks lost as harm in each harmed sweep run
    assert set(names) >= {"tenant-a", "tenant-live"}
    assert names[1:] == sorted(names[1:]) == data.tenants(data.load_audit([MULTI, LIVE]))


def test_conformance_shows_titles_and_never_calls_not_exercised_a_pass(
        audit: data.Pages) -> None:
    conf = data.conformance(audit, MULTI_RUN).set_index("check")
    assert conf.loc["L2", "verdict"] == "not_exercised"  # no reuse_denied in this run
    assert conf.loc["L3", "title"] == data.check_titles(audit)["L3"]
    assert conf.loc["L3", "title"] == audit.conformance.query("check == 'L3'")["title"].iloc[0]
    counts = data.verdict_counts(audit)
    assert sum(counts.values()) == len(audit.conformance)
    assert counts["pass"] == int((audit.conformance["verdict"] == "pass").sum())
    assert counts["not_exercised"] > 0 and "not_applicable" not in counts


def test_conformance_evidence_seqs_are_sorted(audit: data.Pages) -> None:
    for text in data.conformance(audit)["evidence_seqs"].dropna():
        seqs = [int(v) for v in text.split(" … ")[0].split(", ") if v]
        assert seqs == sorted(seqs)


def _evidence_cells(audit: data.Pages) -> list[tuple[str, list[int], int]]:
    """(the page's evidence text, the table's evidence_seqs, evidence_seq_count) per row."""
    shown = data.conformance(audit).set_index(["run_id", "check"])["evidence_seqs"]
    return [(shown[(r["run_id"], r["check"])], sorted(r["evidence_seqs"]),
             r["evidence_seq_count"]) for _, r in audit.conformance.iterrows()]


def test_conformance_evidence_says_how_many_more_seqs_there_are(audit: data.Pages) -> None:
    cut = [(t, s, n) for t, s, n in _evidence_cells(audit) if n > len(s)]
    assert cut, "the fixture must hold a check with more evidence than evidence_seqs keeps"
    for text, seqs, n in cut:
        assert text == ", ".join(map(str, seqs)) + f" … and {n - len(seqs):,} more"


def test_conformance_evidence_held_whole_says_no_more(audit: data.Pages) -> None:
    whole = [(t, s, n) for t, s, n in _evidence_cells(audit) if 0 < n == len(s)]
    assert whole
    for text, seqs, _ in whole:
        assert text == ", ".join(map(str, seqs))


# -- the HTML report -----------------------------------------------------------------------------

def test_report_is_one_self_contained_page_with_the_headline(audit: data.Pages) -> None:
    from kvclaims.dashboard.report import build_report

    page = build_report(data.load_audit([SWEEP / NATIVE_80, MULTI]))
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    # one script: the charts' specs (JSON) and the inlined Vega libraries; nothing fetched
    assert page.count("<script") == 2 and "<link" not in page and "<script src" not in page
    assert "src=\"http" not in page and "href=\"http" not in page
    assert page.count('class="chart"') >= 4  # headline + two timelines + a block lane
    assert "1 of 1 claims harmed; blocks lost: 50 harm" in page
    assert "not exercised" in page and "v-not_exercised" in page


def test_report_folds_all_but_each_tenants_first_incident(audit: data.Pages) -> None:
    from kvclaims.dashboard.report import explanation_html

    expl = data.explanation(audit, "tenant-resident")
    page = explanation_html(expl)
    harmed = sum(s.outcome == "harmed" for s in expl.sections)
    assert harmed >= 10 and page.count("<details") == len(expl.sections)
    assert page.count("<details open>") == 1  # the first incident; the others one click away


def test_report_has_a_capacity_sweep_section_for_a_sweep(audit: data.Pages) -> None:
    from kvclaims.dashboard.report import build_report

    page = build_report(data.load_audit([SWEEP]))
    assert "<h2>Capacity sweep</h2>" in page
    assert "21 points: the active request's allocation evicted resident blocks as harm at 10" \
        in page


def test_report_of_one_run_has_no_sweep_section() -> None:
    # negative twin
    from kvclaims.dashboard.report import build_report

    assert "Capacity sweep" not in build_report(data.load_audit([SWEEP / NATIVE_80]))


def test_report_chart_specs_cannot_close_their_script(tmp_path: Path) -> None:
    from kvclaims.dashboard.report import build_report

    page = build_report([_evil_run(tmp_path, "http://127.0.0.1:9")])
    specs = page.split('id="kvc-charts">', 1)[1].split("</script>", 1)[0]
    assert "<" not in specs and "\\u003cimg" in specs


def test_every_lane_state_of_a_chart_has_its_own_colour() -> None:
    from kvclaims.dashboard.charts import CLAIM_STATE_COLORS, REQUEST_STATE_COLORS

    for colors in (CLAIM_STATE_COLORS, REQUEST_STATE_COLORS):
        assert len(set(colors.values())) == len(colors), colors
        assert data.LABEL_COLORS["harm"] not in colors.values()  # vermillion is harm's
    assert CLAIM_STATE_COLORS["demoted"] != CLAIM_STATE_COLORS["expired"] != \
        CLAIM_STATE_COLORS["released"] != CLAIM_STATE_COLORS["demoted"]
    assert REQUEST_STATE_COLORS["served"] != REQUEST_STATE_COLORS["deferred_then_served"]


def test_the_timeline_on_a_wall_clock_axis_is_in_utc_milliseconds(audit: data.Pages) -> None:
    from kvclaims.dashboard.report import run_timeline

    spec = run_timeline(audit, MULTI_RUN, axis="utc").to_dict()
    enc = spec["vconcat"][0]["layer"][0]["encoding"]["x"]
    assert enc["field"] == "seq_utc" and "utcFormat" in enc["axis"]["labelExpr"]
    occ = data.add_utc(audit, MULTI_RUN, data.occupancy_long(audit, MULTI_RUN))
    first = data.seq_utc(audit, MULTI_RUN)
    seq = int(occ["seq"].iloc[0])
    assert occ["seq_utc"].iloc[0] == first[seq].value / 1e6


def test_a_run_without_a_clock_draws_its_timeline_by_seq(reused: data.Pages) -> None:
    # negative twin: no clock, so the UTC axis falls back to seq
    from kvclaims.dashboard.report import run_timeline

    (run_id,) = reused.run_ids
    spec = run_timeline(reused, run_id, axis="utc").to_dict()
    assert spec["vconcat"][0]["layer"][0]["encoding"]["x"]["field"] == "seq"


def test_a_claims_block_lane_has_one_row_per_position(audit: data.Pages) -> None:
    lanes = data.claim_position_lanes(audit, NATIVE_80, 2)
    assert list(lanes["position"]) == list(range(60))
    lost = lanes.dropna(subset=["label"])
    assert len(lost) == 50 and set(lost["label"]) == {"harm"}
    assert sorted(lost["position"]) == list(range(10, 60))


def _evil_run(tmp_path: Path, url: str) -> Path:
    """A real trace (tests/fixtures/multi_claim.jsonl imported) whose tenant, claim id and
    request id are markdown/HTML that would fetch ``url`` if rendered."""
    import json

    from kvclaims.sources.jsonl import import_jsonl

    names = {"tenant": ("tenant-a", f"![x]({url}/md.png)"),
             "claim_id": ("claim:a", f'<img src="{url}/html.png">'),
             "request_id": ("r", f"[link]({url}/req) <b>bold</b>")}
    lines = []
    for line in (REPO / "tests" / "fixtures" / "multi_claim.jsonl").read_text().splitlines():
        event = json.loads(line)
        for key, (old, new) in names.items():
            if event.get(key) == old:
                event[key] = new
        lines.append(json.dumps(event))
    src = tmp_path / "evil.jsonl"
    src.write_text("\n".join(lines) + "\n")
    (run,) = import_jsonl(src, tmp_path / "evil")
    return run


def test_report_escapes_trace_strings(tmp_path: Path) -> None:
    from kvclaims.dashboard.report import build_report

    page = build_report([_evil_run(tmp_path, "http://127.0.0.1:9")])
    assert "<img src=\"http://127.0.0.1:9" not in page and "<b>bold</b>" not in page
    assert "&lt;img src=&quot;http://127.0.0.1:9/html.png&quot;&gt;" in page
    assert "1 of 2 claims harmed" in page


# -- the app under AppTest -------------------------------------------------------------------------

def _app(monkeypatch: pytest.MonkeyPatch, *paths: Path | str):
    """Run the app as ``streamlit run dashboard/app.py -- PATHS`` would (same argv)."""
    from streamlit.testing.v1 import AppTest

    monkeypatch.setattr(sys, "argv", [str(APP), *map(str, paths)])
    at = AppTest.from_file(str(APP), default_timeout=120)
    return at.run()


def _page(at, page: str):
    return at.sidebar.radio(key="page").set_value(page).run()


def test_app_renders_every_page_on_the_shipped_traces(monkeypatch: pytest.MonkeyPatch) -> None:
    at = _app(monkeypatch)  # no paths: the shipped traces
    assert at.sidebar.radio(key="page").options == PAGES
    for page in PAGES:
        _page(at, page)
        assert not at.exception, page
        assert not at.error or page == "Overview", (page, [e.value for e in at.error])


def test_app_overview_states_the_headline_before_any_table(
        monkeypatch: pytest.MonkeyPatch) -> None:
    at = _app(monkeypatch, SWEEP)
    (summary,) = at.error  # harm in these runs: the summary is the alarming box
    expected = data.summary_text(data.load_audit([SWEEP])).split(" (")[0]
    assert expected.startswith("21 runs: ") and " 0 claims harmed" not in expected
    assert summary.value.startswith(data.md_text(expected))
    lines = [m.value for m in at.markdown]
    assert "resident60\\_active70\\-native\\-80" in lines[0]
    assert "50 harm" in lines[0]


def test_app_overview_of_harmless_runs_is_not_alarming(monkeypatch: pytest.MonkeyPatch) -> None:
    at = _app(monkeypatch, LIVE)
    assert not at.error and at.success[0].value.startswith("1 runs\\: 0 claims harmed")


def test_app_timeline_shows_who_evicted_the_harmed_claim(monkeypatch: pytest.MonkeyPatch) -> None:
    at = _page(_app(monkeypatch, SWEEP), "Timeline")
    assert at.selectbox(key="timeline_run").value == NATIVE_80  # the most harm first
    (q,) = data.claim_instances(data.load_audit([SWEEP / NATIVE_80]), NATIVE_80,
                                "claim:resident")
    assert at.selectbox(key="timeline_claim").value == q
    (evictors,) = [d.value for d in at.dataframe if "harm_blocks" in d.value.columns]
    assert evictors["harm_blocks"].tolist() == [50]
    (why,) = [m.value for m in at.markdown if "evicted 50 of its blocks" in m.value]
    assert "policy native does not enforce claims" in why
    at.button(key="to_tenant").click().run()
    assert at.sidebar.radio(key="page").value == "Tenants"
    assert at.selectbox(key="tenant").value == "tenant-resident"


def test_app_timeline_of_a_run_without_harm_offers_no_evictors(
        monkeypatch: pytest.MonkeyPatch) -> None:
    at = _page(_app(monkeypatch, SWEEP), "Timeline")
    at.selectbox(key="timeline_run").set_value(HARD_80).run()
    assert not at.exception
    assert "timeline_claim" not in {s.key for s in at.selectbox}


def test_app_whatif_page_shows_the_recorded_run_beside_each_replay(
        monkeypatch: pytest.MonkeyPatch, native_whatif: Path) -> None:
    at = _page(_app(monkeypatch, SWEEP / NATIVE_80, f"--whatif={native_whatif}"), "What-if")
    assert not at.exception and not at.error
    (table,) = [d.value for d in at.dataframe if "point" in d.value.columns]
    assert table["point"].tolist() == ["recorded", "hard_protected@80", "hard_protected@100",
                                       "native@100"]
    assert table["refused"].tolist() == [0, 1, 1, 0]
    assert table["harmed"].tolist() == [1, 0, 0, 1]
    assert len(at.get("vega_lite_chart")) == 2  # two pool sizes: the sweep charts


def test_app_whatif_page_without_a_computed_whatif_says_so(
        monkeypatch: pytest.MonkeyPatch) -> None:
    at = _page(_app(monkeypatch, SWEEP / NATIVE_80), "What-if")
    assert not at.exception and not at.dataframe
    (info,) = at.info
    assert info.value.startswith(data.md_text("No what-if computed for these runs"))


def test_app_tenant_page_cites_a_computed_replay(monkeypatch: pytest.MonkeyPatch,
                                                native_whatif: Path) -> None:
    at = _page(_app(monkeypatch, SWEEP / NATIVE_80, f"--whatif={native_whatif}"), "Tenants")
    cited = [m.value for m in at.markdown if m.value.startswith("- A replay of this run")]
    assert len(cited) == 3 and any("preserved this claim" in c for c in cited)


def test_app_tenant_page_without_a_replay_cites_none(monkeypatch: pytest.MonkeyPatch) -> None:
    at = _page(_app(monkeypatch, SWEEP / NATIVE_80), "Tenants")
    assert not [m.value for m in at.markdown if "A replay of this run" in m.value]
    assert any("No what\\-if of this run was computed" in c.value for c in at.caption)


def test_app_tenant_page_starts_at_the_tenant_with_the_most_harm(
        monkeypatch: pytest.MonkeyPatch) -> None:
    at = _page(_app(monkeypatch, SWEEP / NATIVE_80, MULTI), "Tenants")
    assert at.selectbox(key="tenant").value == "tenant-resident"
    (harmed,) = [w.value for w in at.warning]
    assert harmed.startswith("Outcome\\: harmed")
    assert any("44 of your 60 block" in m.value for m in at.markdown)  # the first moment
    assert any("6 of your 60 block" in m.value for m in at.markdown)   # the second
    at.selectbox(key="tenant").set_value("tenant-a").run()
    assert not at.warning and any(i.value.startswith("Outcome\\: released") for i in at.info)


def test_app_tenant_timeline_is_a_table_that_keeps_every_word(
        monkeypatch: pytest.MonkeyPatch) -> None:
    at = _page(_app(monkeypatch, MULTI), "Tenants")
    at.selectbox(key="tenant").set_value("tenant-b").run()
    whats = [w for t in at.table for w in t.value["what"]]
    expl = data.explanation(data.load_audit([MULTI]), "tenant-b")
    assert whats == [m.text for s in expl.sections for m in s.timeline]


def test_app_timeline_offers_a_utc_axis_for_a_run_with_a_clock(
        monkeypatch: pytest.MonkeyPatch) -> None:
    at = _page(_app(monkeypatch, MULTI), "Timeline")
    axis = at.radio(key="timeline_axis")
    assert axis.options == ["time (UTC)", "seq"]
    axis.set_value("seq").run()
    assert not at.exception


def test_app_timeline_of_a_run_without_a_clock_has_no_axis_choice(
        monkeypatch: pytest.MonkeyPatch, reused: data.Pages) -> None:
    # negative twin: a JSON Lines import has no clock, so seq is the only axis
    at = _page(_app(monkeypatch, *reused.paths), "Timeline")
    assert not at.exception and "timeline_axis" not in {r.key for r in at.radio}


def test_app_claims_page_draws_the_claims_block_lane(monkeypatch: pytest.MonkeyPatch) -> None:
    at = _page(_app(monkeypatch, SWEEP / NATIVE_80), "Claims")
    assert not at.exception
    assert any("one lane per position" in m.value for m in at.markdown)


def test_app_conformance_never_counts_not_exercised_as_pass(
        monkeypatch: pytest.MonkeyPatch) -> None:
    at = _page(_app(monkeypatch, MULTI), "Findings & conformance")
    metrics = {m.label: int(m.value) for m in at.metric}
    table = data.load_audit([MULTI]).conformance["verdict"].value_counts()
    assert metrics == {"fail": table.get("fail", 0), "unknown": table.get("unknown", 0),
                       "pass": table.get("pass", 0),
                       "not exercised": table.get("not_exercised", 0)}
    assert metrics["not exercised"] >= 1  # L2: no reuse_denied in this run


def test_app_conformance_shows_the_lowering_verdicts(monkeypatch: pytest.MonkeyPatch) -> None:
    at = _page(_app(monkeypatch, MULTI), "Findings & conformance")
    (low,) = [d.value for d in at.dataframe if "mode" in d.value.columns]
    expected = data.load_audit([MULTI]).tables["lowering"]
    assert sorted(low["mode"]) == sorted(expected["mode"])
    assert dict(zip(low["mode"], low["verdict"])) == dict(zip(expected["mode"],
                                                              expected["verdict"]))


def test_app_audits_only_the_paths_on_its_command_line(monkeypatch: pytest.MonkeyPatch) -> None:
    at = _page(_app(monkeypatch, LIVE), "Capacity sweep")
    assert not at.exception and not at.error
    assert at.selectbox(key="sweep_scenario").options == ["live_pressure", "all runs"]


def test_app_refuses_a_path_outside_the_directories_it_was_started_with(
        monkeypatch: pytest.MonkeyPatch) -> None:
    at = _app(monkeypatch, SWEEP)
    at.sidebar.text_area(key="paths").set_value("/root\n" + str(MULTI)).run()
    assert not at.exception
    errors = [e.value for e in at.error]
    assert any(e.startswith("/root\\: outside the directories") for e in errors)
    assert any(str(MULTI).replace("_", "\\_").replace("-", "\\-").replace(".", "\\.") in e
               for e in errors)  # a sibling of the root is outside too


def test_app_accepts_a_path_inside_the_directories_it_was_started_with(
        monkeypatch: pytest.MonkeyPatch) -> None:
    at = _app(monkeypatch, SWEEP)
    at.sidebar.text_area(key="paths").set_value(str(SWEEP / NATIVE_80)).run()
    assert not at.exception and not [e for e in at.error if "outside" in e.value]
    assert at.error[0].value.startswith("1 runs\\: 1 claims harmed")


#: Markdown that would become HTML, an image or a link: an unescaped ``<`` or ``](``.
_LIVE_MARKUP = re.compile(r"(?<!\\)<|(?<!\\)\]\(")


def test_crafted_trace_strings_are_live_markup_unless_escaped(tmp_path: Path) -> None:
    evil = data.tenants(data.load_audit([_evil_run(tmp_path, "http://127.0.0.1:9")]))[0]
    assert _LIVE_MARKUP.search(evil)  # the raw tenant name would render as an image
    assert not _LIVE_MARKUP.search(data.md_text(evil))


def test_app_never_renders_trace_strings_as_markdown(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    run = _evil_run(tmp_path, "http://127.0.0.1:9")
    at = _app(monkeypatch, run)
    shown = 0
    for page in PAGES:
        _page(at, page)
        assert not at.exception, page
        for el in [*at.markdown, *at.warning, *at.info, *at.success, *at.error, *at.caption]:
            assert not _LIVE_MARKUP.search(el.value), (page, el.value)
            shown += "127\\.0\\.0\\.1" in el.value
    assert shown >= 3  # the crafted strings were shown (as text), not dropped


def test_app_reports_a_non_run_directory_as_an_error_without_traceback(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    at = _app(monkeypatch, tmp_path)
    assert not at.exception
    assert [e.value for e in at.error][0].startswith(data.md_text(tmp_path))
    assert "not a run directory" in at.error[0].value
    assert not at.dataframe


def test_app_reports_a_corrupt_trace_as_an_error_without_traceback(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    bad = _corrupt_copy(LIVE, tmp_path / "live")
    at = _app(monkeypatch, bad)
    assert not at.exception
    (err,) = [e.value for e in at.error]
    assert err.startswith("Cannot read the trace: ") and "events\\-000000\\.arrows" in err
    assert not at.dataframe


# -- the app in a real browser ---------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(paths: list[Path], log: Path):
    """``kvclaims dashboard PATHS --port P`` (the CLI) until healthy; (process, url)."""
    import requests

    port = _free_port()
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kvclaims.cli", "dashboard", *map(str, paths),
             "--port", str(port)], cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(REPO)})
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + 90
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"dashboard exited:\n{log.read_text()}")
        try:
            if requests.get(url + "_stcore/health", timeout=2).ok:
                return proc, url
        except requests.ConnectionError:
            pass
        if time.monotonic() > deadline:
            _stop(proc)
            raise AssertionError(f"dashboard never became healthy:\n{log.read_text()}")
        time.sleep(0.2)  # polling interval, bounded by the deadline above


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=15)


@pytest.fixture()
def chromium(tmp_path: Path):
    """Headless Chromium driven by chromedriver (both from the Debian packages), 1400 px wide."""
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        pytest.skip("needs /usr/bin/chromium and /usr/bin/chromedriver: run `make browser`")
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--window-size=1400,1000",
                 "--hide-scrollbars", f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


#: What each page must show once rendered (headline figures of the shipped sweep + multi_tenant).
_PAGE_TEXT = {
    "overview": "22 runs: ",  # then the summary line, checked below
    "timeline": "Who evicted claim:resident's blocks as harm",
    "claims": "Claim timeline",
    "sweep": "21 points: the active request's allocation evicted resident blocks as harm at",
    "tenants": "Tenant explanations",
    "conformance": "not exercised",
}


_HEIGHT_JS = """
const m = document.querySelector('[data-testid="stMainBlockContainer"]');
return Math.max(m ? m.scrollHeight + m.getBoundingClientRect().top : 0,
                document.body.scrollHeight);
"""


def _shot(driver, path: Path) -> None:
    """A screenshot of the whole page at 1400 px: once Streamlit has finished drawing (no
    running script, no skeletons), the window grows to the page's height."""
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, 60, poll_frequency=0.25).until(lambda d: d.execute_script(
        "return !Array.from(document.querySelectorAll('[data-testid=\"stStatusWidget\"], "
        "[data-testid=\"stSkeleton\"]')).some(e => e.offsetParent !== null);"))
    time.sleep(2.0)  # charts (vega) draw after the script has finished
    height = driver.execute_script(_HEIGHT_JS)
    driver.set_window_size(1400, min(max(int(height) + 80, 900), 5000))
    time.sleep(2.0)  # let the page re-lay out at the new size
    driver.save_screenshot(str(path))


def _wait_text(driver, text: str, log: Path) -> str:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, 90, poll_frequency=0.25).until(
        lambda d: text in d.find_element(By.TAG_NAME, "body").text,
        f"{text!r} never shown; server log:\n{log.read_text()}")
    return driver.find_element(By.TAG_NAME, "body").text


def test_browser_opens_every_page_and_the_report_at_1400px(chromium, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    from kvclaims.dashboard.report import write_report

    log = tmp_path / "dashboard.log"
    summary = data.summary_text(data.load_audit([SWEEP, MULTI])).split(" (")[0]
    proc, url = _serve([SWEEP.relative_to(REPO), MULTI.relative_to(REPO)], log)
    shots = tmp_path / "shots"
    shots.mkdir()
    try:
        for slug, text in _PAGE_TEXT.items():
            chromium.get(f"{url}?page={slug}")
            body = _wait_text(chromium, text, log)
            assert slug != "overview" or summary in body
            assert not chromium.find_elements(By.CSS_SELECTOR, '[data-testid="stException"]')
            assert "Traceback" not in body
            width = chromium.execute_script("return document.documentElement.scrollWidth")
            assert width <= 1400, (slug, width)  # no sideways scrolling
            _shot(chromium, shots / f"{slug}.png")
    finally:
        _stop(proc)
    report = tmp_path / "report.html"
    write_report([str(SWEEP), str(MULTI)], str(report))
    chromium.get(report.as_uri())
    body = _wait_text(chromium, summary, log)
    assert "claim:resident was harmed by:" in body
    assert "Capacity sweep" in body and "21 points: the active request's allocation" in body
    _wait_charts(chromium)
    assert chromium.execute_script("return document.documentElement.scrollWidth") <= 1400
    legends = chromium.execute_script(_LEGENDS_JS)
    states = [g for g in legends if (g["title"] or "").endswith(": state")]
    assert {g["title"] for g in states} >= {"claims: state", "requests: state"}, legends
    for g in states:  # every state on a lane has its own colour
        assert len(g["fills"]) >= 2 and len(set(g["fills"])) == len(g["fills"]), g
    _shot(chromium, shots / "report.png")
    for png in shots.iterdir():
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if os.environ.get("KVCLAIMS_UPDATE_SCREENSHOTS") == "1" or not SCREENSHOTS.exists():
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        for png in shots.iterdir():
            shutil.copyfile(png, SCREENSHOTS / png.name)


#: Every legend the report's charts drew: its title and the fill of each symbol.
_LEGENDS_JS = """
return Array.from(document.querySelectorAll('.chart svg g.role-legend')).map(l => ({
  title: (l.querySelector('.role-legend-title text') || {}).textContent || null,
  fills: Array.from(l.querySelectorAll('.role-legend-symbol path'))
              .map(p => p.getAttribute('fill'))}));
"""


def _wait_charts(driver) -> None:
    """Until Vega has drawn an SVG in every chart placeholder of the report."""
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, 60, poll_frequency=0.25).until(lambda d: d.execute_script(
        "const c = document.querySelectorAll('.chart');"
        "return c.length > 0 && document.querySelectorAll('.chart svg').length >= c.length;"))


def test_browser_dashboard_over_two_runs_with_one_id_shows_both(chromium,
                                                                tmp_path: Path) -> None:
    """Two copies of one run (one run id) under one folder: the app keeps going, both runs
    told apart by path, with a warning; never a blank app."""
    for name in ("first", "second"):
        shutil.copytree(MULTI, tmp_path / "runs" / name)
    log = tmp_path / "dashboard.log"
    proc, url = _serve([tmp_path / "runs"], log)
    try:
        chromium.get(f"{url}?page=overview")
        body = _wait_text(chromium, "also the id of", log)
        assert "Cannot read the trace" not in body and "2 runs" in body
        assert f"{MULTI_RUN}@{tmp_path / 'runs' / 'first'}" in body
    finally:
        _stop(proc)


def test_browser_fetches_nothing_a_crafted_trace_names(chromium, tmp_path: Path) -> None:
    """Tenant, claim and request ids written as markdown images, HTML and links: the browser
    must not fetch them (a local HTTP server counts every request it gets)."""
    import http.server
    import threading

    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
            hits.append(self.path)
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    bait = f"http://127.0.0.1:{server.server_address[1]}"
    run = _evil_run(tmp_path, bait)
    log = tmp_path / "dashboard.log"
    proc, url = _serve([run], log)
    try:
        for slug in ("overview", "timeline", "claims", "tenants", "conformance"):
            chromium.get(f"{url}?page={slug}")
            _wait_text(chromium, "Page", log)
            time.sleep(1.5)  # give any image a chance to load
        body = _wait_text(chromium, "Page", log)
        chromium.get(f"{url}?page=tenants")
        body = _wait_text(chromium, "![x](" + bait, log)  # shown as text
        assert "<img" not in chromium.execute_script(
            "return Array.from(document.querySelectorAll('[data-testid=\"stMarkdown\"], "
            "[data-testid=\"stAlert\"]')).map(e => e.innerHTML).join(' ')").replace(
            "&lt;img", "")
    finally:
        _stop(proc)
        server.shutdown()
    assert hits == [], hits
    assert "Traceback" not in body


def _with_clock(src: Path, dst: Path, utc_ns: int, monotonic_ns: int) -> Path:
    """A copy of a run directory whose manifest anchors its clock (as the recorder writes it)."""
    import json

    shutil.copytree(src, dst)
    manifest = json.loads((dst / "manifest.json").read_text())
    manifest["clock"] = {"utc_ns": utc_ns, "monotonic_ns": monotonic_ns, "host": "test"}
    (dst / "manifest.json").write_text(json.dumps(manifest))
    return dst


def test_a_run_with_a_clock_anchor_shows_utc_beside_seq(tmp_path: Path) -> None:
    plain = data.load_audit([LIVE])
    (run_id,) = plain.run_ids
    first_ts = int(data.occupancy(plain, run_id)["ts_ns"].iloc[0])
    anchored = data.load_audit([_with_clock(LIVE, tmp_path / "live", 1_764_500_000_000_000_000,
                                            first_ts)])
    occ = data.occupancy(anchored, run_id)
    assert data.has_clock(anchored, run_id)
    assert occ["utc"].iloc[0] == pd.Timestamp(1_764_500_000_000_000_000, unit="ns", tz="UTC")


def test_a_run_without_a_clock_anchor_is_seq_only(reused: data.Pages) -> None:
    plain = reused  # imported from JSON Lines: no wall clock
    (run_id,) = plain.run_ids
    assert not data.has_clock(plain, run_id)
    assert "utc" not in data.occupancy(plain, run_id).columns


def test_timeline_lanes_keep_the_claims_and_requests_that_matter(audit: data.Pages) -> None:
    from kvclaims.dashboard import report

    claims = report.important_claims(audit, MULTI_RUN, limit=2)
    # the worst label first (expiry before relaxation), then the most blocks lost
    assert set(claims["lane"]) == {"c:doc", "x:hold"}  # expiry 10; relaxation 20 (b:doc 12)
    assert "d:best" not in set(claims["lane"])  # lost nothing
    kept = report.important_claims(audit, MULTI_RUN, highlight="d:best", limit=2)
    assert "d:best" in set(kept["lane"])  # the chosen claim is always drawn
    req = audit.tables["requests"].query("run_id == @MULTI_RUN")
    refused = set(req.loc[req["outcome"] == "refused", "request_id"])
    requests = report.important_requests(audit, MULTI_RUN, limit=len(refused))
    assert refused and set(requests["lane"]) == refused  # refusals before plain requests


def test_browser_whatif_page_shows_the_comparison_and_its_charts(
        chromium, tmp_path: Path, native_whatif: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    log = tmp_path / "dashboard.log"
    proc, url = _serve([SWEEP / NATIVE_80, "--whatif", native_whatif], log)
    try:
        chromium.get(f"{url}?page=whatif")
        body = _wait_text(chromium, "beside 3 replayed point(s)", log)
        assert NATIVE_80 in body and "Traceback" not in body
        assert not chromium.find_elements(By.CSS_SELECTOR, '[data-testid="stException"]')
        WebDriverWait(chromium, 60, poll_frequency=0.25).until(
            lambda d: len(d.find_elements(By.CSS_SELECTOR, ".vega-embed svg, "
                                                           ".vega-embed canvas")) >= 2,
            f"the two what-if charts were never drawn; server log:\n{log.read_text()}")
        assert chromium.find_elements(By.CSS_SELECTOR, '[data-testid="stDataFrame"]')
        assert chromium.execute_script("return document.documentElement.scrollWidth") <= 1400
    finally:
        _stop(proc)


def test_browser_whatif_page_without_a_whatif_says_none_was_computed(
        chromium, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    log = tmp_path / "dashboard.log"
    proc, url = _serve([SWEEP / NATIVE_80], log)
    try:
        chromium.get(f"{url}?page=whatif")
        body = _wait_text(chromium, "No what-if computed for these runs", log)
        assert "replayed point" not in body
        assert not chromium.find_elements(By.CSS_SELECTOR, '[data-testid="stDataFrame"]')
    finally:
        _stop(proc)
