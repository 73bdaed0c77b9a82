"""The Streamlit audit dashboard (dashboard/): its data functions on the shipped traces, the app
under Streamlit's AppTest, and the app served by ``streamlit run`` in a real headless Chromium.

No mocks: every test reconstructs real run directories (the shipped traces, a JSON Lines
fixture imported as a run directory, or a copy with a corrupted segment).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from dashboard import data
from recorder.schema import InputError

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
TABS = ["Capacity sweep", "Claims", "Pool occupancy", "Loss labels", "Tenant explanations",
        "Findings & conformance"]


@pytest.fixture(scope="module")
def audit() -> data.Audit:
    """Every shipped trace, reconstructed once for the module."""
    return data.load_audit(data.default_paths())


def _corrupt_copy(src: Path, dst: Path) -> Path:
    """A copy of a run directory whose only segment has 64 bytes of garbage in its header."""
    shutil.copytree(src, dst)
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


def test_sweep_hard_protected_at_80_is_refused_with_shortfall_50(audit: data.Audit) -> None:
    row = _sweep_row(data.capacity_sweep(audit, "resident60_active70"), "hard_protected", 80)
    assert row["active_outcome"] == "refused"
    assert row["shortfall_blocks"] == 50
    assert row["blocking_claim_ids"] == "claim:resident"
    assert row["resident_blocks_lost"] == 0


def test_sweep_native_at_80_is_served_and_loses_50_resident_blocks_as_harm(
        audit: data.Audit) -> None:
    row = _sweep_row(data.capacity_sweep(audit, "resident60_active70"), "native", 80)
    assert row["active_outcome"] == "served"
    assert pd.isna(row["shortfall_blocks"]) and pd.isna(row["blocking_claim_ids"])
    assert (row["resident_blocks_lost"], row["harm"]) == (50, 50)


def test_capacity_sweep_shows_the_same_rows_as_kvclaims_sweep(audit: data.Audit) -> None:
    from kvclaims.recording import SWEEP_COLUMNS, sweep_rows

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


def test_sweep_series_has_one_line_per_policy_per_metric(audit: data.Audit) -> None:
    series = data.sweep_series(audit, "resident60_active70")
    assert len(series) == 3 * 7 * 2
    hard = series[(series["policy"] == "hard_protected") & (series["metric"] == "shortfall")]
    assert hard["value"].tolist() == [50, 40, 30, 20, 10, 0, 0]
    native = series[(series["policy"] == "native")
                    & (series["metric"] == "resident blocks lost")]
    assert native["value"].tolist() == [50, 40, 30, 20, 10, 0, 0]


def test_sweep_series_of_another_scenario_holds_only_its_runs(audit: data.Audit) -> None:
    series = data.sweep_series(audit, "live_pressure")
    assert set(series["run_id"]) == {"live_pressure-hard_protected-67"}
    short = series[series["metric"] == "shortfall"]
    assert short["value"].tolist() == [19]


def test_tenant_d_explanations_mention_harm(audit: data.Audit) -> None:
    rows = data.tenant_explanations(audit, "tenant-d")
    assert set(rows["claim_id"]) == {"d:best", "d:soft"}
    for sentence in rows["explanation"]:
        assert "broke it while it was still in force" in sentence
        assert "lost as harm" in sentence


def test_tenant_a_explanation_is_relaxation_not_harm(audit: data.Audit) -> None:
    (sentence,) = data.tenant_explanations(audit, "tenant-a")["explanation"]
    assert "released at seq" in sentence and "(relaxation)" in sentence
    assert "harm" not in sentence


def test_tenant_without_incident_is_listed_but_has_no_sentence(audit: data.Audit) -> None:
    assert "tenant-live" in data.tenants(audit)
    assert data.tenant_explanations(audit, "tenant-live").empty
    assert data.tenant_claims(audit, "tenant-live")["outcome"].tolist() == ["preserved"]


def test_claim_timeline_of_a_harmed_claim_shows_harm_after_acceptance(audit: data.Audit) -> None:
    events = data.claim_lifecycle(audit, MULTI_RUN, "d:best")
    assert events["event"].tolist() == ["claim_submitted", "claim_accepted",
                                        "claim_materialized", "claim_harmed"]
    losses = data.claim_losses(audit, MULTI_RUN, "d:best")
    assert set(losses["label"]) == {"harm"}
    assert sorted(losses["position"]) == list(range(6))
    accepted = int(events.loc[events["event"] == "claim_accepted", "seq"].iloc[0])
    outcome = data.claim_outcomes(audit)
    first_harm = outcome.loc[(outcome["run_id"] == MULTI_RUN)
                             & (outcome["claim_id"] == "d:best"), "first_harm_seq"].iloc[0]
    assert losses["seq"].min() == first_harm > accepted


def test_claim_timeline_of_a_demoted_claim_shows_relaxation_after_demotion(
        audit: data.Audit) -> None:
    events = data.claim_lifecycle(audit, DEMOTE_RUN, "claim:resident")
    assert "claim_harmed" not in set(events["event"])
    demoted = int(events.loc[events["event"] == "claim_demoted", "seq"].iloc[0])
    losses = data.claim_losses(audit, DEMOTE_RUN, "claim:resident")
    assert set(losses["label"]) == {"relaxation"} and len(losses) == 50
    assert losses["seq"].min() > demoted


def test_claims_that_lost_blocks_come_first_in_the_claim_chooser(audit: data.Audit) -> None:
    keys = data.claim_keys(audit)
    outcome = data.claim_outcomes(audit).set_index(["run_id", "claim_id"])
    lost = [sum(outcome.loc[k, f"blocks_lost_{x}"] for x in
                ("harm", "expiry", "relaxation", "eviction", "unknown")) for k in keys]
    assert lost[0] > 0
    assert lost == sorted(lost, key=lambda n: n == 0)
    assert len(keys) == len(outcome)


def test_pool_occupancy_stays_within_the_pool(audit: data.Audit) -> None:
    for run_id in audit.run_ids:
        occ = data.pool_occupancy(audit, run_id)
        assert set(occ["run_id"]) <= {run_id}
        assert occ["seq"].is_monotonic_increasing
        assert occ["cached_blocks"].between(0, data.usable_blocks(audit, run_id)).all(), run_id
    assert data.pool_occupancy(audit, MULTI_RUN)["cached_blocks"].max() == 80


def test_pool_occupancy_of_an_unknown_run_is_empty(audit: data.Audit) -> None:
    assert data.pool_occupancy(audit, "no-such-run").empty
    assert data.usable_blocks(audit, "no-such-run") is None


def test_loss_labels_count_every_label_of_multi_tenant(audit: data.Audit) -> None:
    labels = data.loss_labels(audit)
    mt = labels[labels["run_id"] == MULTI_RUN].set_index("label")["blocks_lost"].to_dict()
    assert mt == {"eviction": 196, "expiry": 10, "harm": 16, "relaxation": 43}


def test_loss_labels_of_a_refusing_hard_protected_run_are_empty(audit: data.Audit) -> None:
    labels = data.loss_labels(audit)
    assert "resident60_active70-hard_protected-80" not in set(labels["run_id"])


def test_conformance_of_shipped_runs_passes_or_is_not_applicable(audit: data.Audit) -> None:
    conf = data.conformance(audit)
    for run_id in audit.run_ids:
        assert conf.loc[conf["run_id"] == run_id, "check"].tolist() == list(data.CHECKS)
    assert set(conf["verdict"]) == {"pass", "not_applicable"}
    matrix = data.conformance_matrix(audit)
    assert list(matrix.columns) == ["run_id", *data.CHECKS]
    assert matrix["run_id"].tolist() == audit.run_ids
    assert data.findings(audit).empty


def test_a_trace_with_a_recorder_gap_shows_a_hole_finding_and_unknown_verdicts(
        tmp_path: Path) -> None:
    from reconstruct.jsonl import import_jsonl

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
    assert errors == [f"{tmp_path}: not a run directory (no manifest.json or events-*.arrows) "
                      "and contains none", f"{tmp_path / 'missing'}: no such file or directory"]


def test_a_corrupt_segment_gives_a_clear_input_error_naming_the_file(tmp_path: Path) -> None:
    bad = _corrupt_copy(LIVE, tmp_path / "live")
    assert data.check_paths([bad]) == ([str(bad)], [])  # the manifest itself is fine
    with pytest.raises(InputError, match=r"events-000000\.arrows: corrupt"):
        data.load_audit([bad])


def test_the_dashboard_never_imports_the_scheduler_or_vllm() -> None:
    code = ("import sys; from dashboard import data, charts; "
            f"data.load_audit([{str(LIVE)!r}]); "
            "bad = [m for m in sys.modules if m == 'vllm' or m.startswith(('vllm.', "
            "'recorder.scheduler', 'torch'))]; print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# -- the app under AppTest -------------------------------------------------------------------------

def _app(monkeypatch: pytest.MonkeyPatch, *paths: Path | str):
    """Run the app as ``streamlit run dashboard/app.py -- PATHS`` would (same argv)."""
    from streamlit.testing.v1 import AppTest

    monkeypatch.setattr(sys, "argv", [str(APP), *map(str, paths)])
    at = AppTest.from_file(str(APP), default_timeout=60)
    return at.run()


def test_app_renders_every_tab_on_the_shipped_traces(monkeypatch: pytest.MonkeyPatch) -> None:
    at = _app(monkeypatch)  # no paths: the shipped traces
    assert not at.exception
    assert not at.error
    assert [t.label for t in at.tabs] == TABS
    assert f"from {len(data.default_paths())} path(s)" in at.caption[0].value
    assert {s.key for s in at.selectbox} == {"sweep_scenario", "claim", "pool_run", "tenant",
                                              "conformance_run"}
    assert at.selectbox(key="sweep_scenario").value == "resident60_active70"
    assert any("Your claim a:doc was released" in i.value for i in at.info)


def test_app_shows_the_chosen_tenants_harm_sentences(monkeypatch: pytest.MonkeyPatch) -> None:
    at = _app(monkeypatch, MULTI)
    at.selectbox(key="tenant").set_value("tenant-d").run()
    assert not at.exception
    sentences = [w.value for w in at.warning]
    assert len(sentences) == 2 and all("broke it while it was still in force" in s
                                       for s in sentences)
    assert not any("Your claim a:doc" in i.value for i in at.info)


def test_app_audits_only_the_paths_on_its_command_line(monkeypatch: pytest.MonkeyPatch) -> None:
    at = _app(monkeypatch, LIVE)
    assert not at.exception and not at.error
    assert "1 run(s) from 1 path(s)" in at.caption[0].value
    assert at.selectbox(key="sweep_scenario").options == ["live_pressure", "all runs"]


def test_app_reports_a_non_run_directory_as_an_error_without_traceback(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    at = _app(monkeypatch, tmp_path)
    assert not at.exception
    assert [e.value for e in at.error][0].startswith(f"{tmp_path}: not a run directory")
    assert not at.tabs


def test_app_reports_a_corrupt_trace_as_an_error_without_traceback(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    bad = _corrupt_copy(LIVE, tmp_path / "live")
    at = _app(monkeypatch, bad)
    assert not at.exception
    (err,) = [e.value for e in at.error]
    assert err.startswith("Cannot read the trace: ") and "events-000000.arrows: corrupt" in err
    assert not at.tabs


# -- the app in a real browser ---------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def served_app(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """``streamlit run dashboard/app.py -- SWEEP MULTI`` on a free port; (url, its log)."""
    import requests

    port = _free_port()
    log = tmp_path / "streamlit.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "streamlit", "run", str(APP), "--server.headless", "true",
             "--server.port", str(port), "--server.address", "127.0.0.1",
             "--browser.gatherUsageStats", "false", "--",
             str(SWEEP.relative_to(REPO)), str(MULTI.relative_to(REPO))],
            cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, f"streamlit exited:\n{log.read_text()}"
            try:
                if requests.get(url + "_stcore/health", timeout=2).ok:
                    break
            except requests.ConnectionError:
                pass
            assert time.monotonic() < deadline, f"streamlit never became healthy:\n" \
                                                f"{log.read_text()}"
            time.sleep(0.2)  # polling interval, bounded by the deadline above
        yield url, log
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)


@pytest.fixture()
def chromium(tmp_path: Path):
    """Headless Chromium driven by chromedriver (both from the Debian packages)."""
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        pytest.skip("needs /usr/bin/chromium and /usr/bin/chromedriver: run `make browser`")
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--window-size=1500,1700",
                 f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


_GRID_ROWS_JS = """
return Array.from(document.querySelectorAll('[data-testid="stDataFrame"] tr'))
    .map(tr => Array.from(tr.querySelectorAll('td')).map(td => td.textContent));
"""


def test_browser_shows_the_sweep_and_a_tenant_sentence(
        served_app: tuple[str, Path], chromium, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    url, log = served_app
    wait = WebDriverWait(chromium, 60, poll_frequency=0.25)
    chromium.get(url)

    def sweep_row(driver) -> list[str] | None:
        # The data grid draws on a canvas; its accessible table holds the rendered cells.
        for row in driver.execute_script(_GRID_ROWS_JS):
            if "resident60_active70-hard_protected-80" in row:
                return row
        return None

    row = wait.until(sweep_row, f"no sweep row rendered; server log:\n{log.read_text()}")
    assert {"hard_protected", "80", "refused", "50", "claim:resident"} <= set(row)
    body = chromium.find_element(By.TAG_NAME, "body")
    assert "22 run(s) from 2 path(s)" in body.text
    chromium.save_screenshot(str(tmp_path / "sweep.png"))

    tab = chromium.find_element(
        By.XPATH, "//*[@role='tab'][normalize-space(.)='Tenant explanations']")
    tab.click()
    wait.until(lambda d: "Your claim a:doc was released at seq 1273"
               in d.find_element(By.TAG_NAME, "body").text)

    tenant = next(el for el in chromium.find_elements(By.CSS_SELECTOR,
                                                      '[data-testid="stSelectbox"]')
                  if el.is_displayed() and el.text.startswith("Tenant"))
    box = tenant.find_element(By.CSS_SELECTOR, "input")
    box.click()
    box.send_keys("tenant-d", Keys.ENTER)
    wait.until(lambda d: "Your claim d:best was accepted (seq 62)"
               in d.find_element(By.TAG_NAME, "body").text)
    text = chromium.find_element(By.TAG_NAME, "body").text
    assert "broke it while it was still in force" in text
    assert "Your claim a:doc" not in text
    chromium.save_screenshot(str(tmp_path / "tenant.png"))

    for name in ("sweep.png", "tenant.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    doc = REPO / "docs" / "dashboard.png"
    if os.environ.get("KVCLAIMS_UPDATE_SCREENSHOT") == "1" or not doc.exists():
        shutil.copyfile(tmp_path / "sweep.png", doc)
