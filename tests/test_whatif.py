"""``kvclaims whatif``: a recorded workload replayed through vLLM's own Scheduler (no model).

Every replay here drives the real ``vllm.v1.core.sched.scheduler.Scheduler`` with the kvclaims
recording scheduler and arbiter, writes a real run directory and is audited by the real
reconstructor; fidelity is measured against the shipped recordings, event by event.
Run under ``flock /tmp/kvc-vllm.lock`` (it builds vLLM configurations).
"""

from __future__ import annotations

import dataclasses
import html
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import kvclaims
from kvclaims import explaining, replays, whatif
from kvclaims.cli import main
from kvclaims.dashboard import data
from kvclaims.dashboard.report import build_report
from kvclaims.explaining import NO_WHATIF, RECORDED_ARITHMETIC, explain
from kvclaims.reconstruct.loader import find_run_dirs
from kvclaims.contract.schema import InputError, SCHEMA_VERSION
from kvclaims.cli.record import sweep_rows

from tests.conftest import scalar

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO / "traces"
SWEEP = TRACES / "sweep-resident60_active70"
NATIVE_80 = SWEEP / "resident60_active70-native-80"
MULTI = TRACES / "multi_tenant"
DEMOTE = TRACES / "lifecycle_demote"
DEMOTE_RUN = "lifecycle_demote-demote_on_conflict-80"
SHIPPED = [d for d in find_run_dirs(TRACES) if "arbiter-prototype" not in d.parts]


@pytest.fixture(scope="module")
def native80() -> whatif.Workload:
    return whatif.read_workload(NATIVE_80)


@pytest.fixture(scope="module")
def hard80(native80: whatif.Workload, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("whatif") / "hard_protected-80"
    whatif.replay(native80, "hard_protected", 80, out)
    return out


@pytest.fixture(scope="module")
def own80(native80: whatif.Workload, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("whatif") / "native-80"
    whatif.replay(native80, "native", 80, out)
    return out


@pytest.fixture(scope="module")
def native_whatif(native80: whatif.Workload, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A computed what-if of the recorded native run at 80 blocks, as ``kvclaims whatif
    --out`` leaves it: one folder, hard_protected at 80 and 100 blocks and native at 100."""
    out = tmp_path_factory.mktemp("native-whatif")
    for policy, usable in (("hard_protected", 80), ("hard_protected", 100), ("native", 100)):
        whatif.replay(native80, policy, usable, out / f"{policy}-{usable}")
    return out


@pytest.fixture(scope="module")
def multi_whatif(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A computed what-if of the multi-tenant run (tenant-b's claim demoted there) and of the
    demotion run: native at 80 blocks, and hard_protected at 80 blocks under a run id that
    names another tenant's claim (``a:doc``, tenant-a's), which tenant-b must never see."""
    out = tmp_path_factory.mktemp("multi-whatif")
    multi = whatif.read_workload(MULTI)
    whatif.replay(multi, "native", 80, out / "native-80")
    whatif.replay(multi, "hard_protected", 80, out / "named", run_id="whatif-of-a:doc")
    whatif.replay(whatif.read_workload(DEMOTE), "hard_protected", 80, out / "demote-hard-80")
    return out


#: Whose the multi-tenant run's deferred, refused and preempted requests are in ``tenanted``
#: (by request name; the recording sent them without a tenant).
REQUEST_TENANTS = {"h-wait": "tenant-b", "i-huge": "tenant-b", "j-long": "tenant-c"}


@pytest.fixture(scope="module")
def tenanted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A run in which tenants' own requests are deferred, refused and preempted, and a
    computed what-if of it (native at 80 blocks, hard_protected at 120, and hard_protected
    at 80 under a run id that names tenant-b's h-wait request, which tenant-c must never see):
    (run dir, what-if folder). No shipped recording has such a request (their refused
    requests carry no tenant), so the run is the multi-tenant workload driven through vLLM's
    Scheduler with the recorder and arbiter (``kvclaims.whatif``) under its recorded policy and
    pool, with h-wait and i-huge sent as tenant-b's and the j-long requests as tenant-c's
    (``kv_tenant``); it reproduces the recorded outcomes of every request.
    """
    out = tmp_path_factory.mktemp("tenanted")
    multi = whatif.read_workload(MULTI)
    owners = [next((t for name, t in REQUEST_TENANTS.items() if r.request_id.startswith(name)),
                   r.tenant) for r in multi.requests]
    sent = dataclasses.replace(multi, requests=[dataclasses.replace(r, tenant=t)
                                                for r, t in zip(multi.requests, owners)])
    run = out / "run"
    whatif.replay(sent, multi.policy, multi.usable_blocks, run, run_id="multi_tenant-tenanted")
    recorded = whatif.read_workload(run)
    for policy, usable in (("native", 80), ("hard_protected", 120)):
        whatif.replay(recorded, policy, usable, out / "whatif" / f"{policy}-{usable}")
    wait = next(r.request_id for r in multi.requests if r.request_id.startswith("h-wait"))
    whatif.replay(recorded, "hard_protected", 80, out / "whatif" / "named",
                  run_id=f"whatif-of-{wait}")
    return run, out / "whatif"


# -- fidelity ------------------------------------------------------------------------------------

@pytest.mark.parametrize("run_dir", SHIPPED, ids=[d.name for d in SHIPPED])
def test_replay_of_a_shipped_trace_under_its_own_settings_reproduces_it(
        run_dir: Path, tmp_path: Path) -> None:
    workload = whatif.read_workload(run_dir)
    whatif.replay(workload, workload.policy, workload.usable_blocks, tmp_path / "r")
    fid = whatif.fidelity(run_dir, tmp_path / "r")
    differing = {k: (v["only_recorded"], v["only_replayed"]) for k, v in fid["aspects"].items()
                 if v["only_recorded"] or v["only_replayed"]}
    assert fid["exact"] and fid["same_steps"], differing
    assert fid["aspects"]["requests"]["matched"] > 0


def test_replay_under_another_policy_differs_from_the_recording_where_it_should(
        hard80: Path) -> None:
    fid = whatif.fidelity(NATIVE_80, hard80)
    assert not fid["exact"]
    refusals = fid["aspects"]["refusals"]
    assert refusals["recorded"] == 0 and refusals["replayed"] == 2  # deferred, then refused
    assert fid["aspects"]["losses"]["only_recorded"]  # the recorded harm did not happen


# -- the paper's case ----------------------------------------------------------------------------

def test_hard_protected_replay_of_the_native_run_at_80_refuses_with_shortfall_50(
        hard80: Path) -> None:
    assert scalar(hard80, "SELECT shortfall_blocks FROM events "
                          "WHERE event = 'request_refused'") == 50
    assert scalar(hard80, "SELECT list(blocking_claim_ids) FROM events "
                          "WHERE event = 'request_refused'") == [["claim:resident"]]


def test_native_replay_of_the_native_run_at_80_refuses_nothing(own80: Path) -> None:
    assert scalar(own80, "SELECT count(*) FROM events WHERE event = 'request_refused'") == 0
    assert scalar(own80, "SELECT count(*) FROM events WHERE event = 'claim_harmed'") == 1


def test_replayed_sweep_from_one_run_reproduces_the_recorded_sweep_table(
        tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    proc = _cli("whatif", str(NATIVE_80), "--sweep", "--out", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    replayed = _by_point(json.loads(proc.stdout)["sweep"])
    recorded = _by_point(sweep_rows([d for d in find_run_dirs(SWEEP)]))
    assert len(replayed) == 21 and replayed == recorded
    assert (out / "sweep.svg").read_text().startswith("<svg")
    # NOTE: the twin: the same rows one capacity apart do differ (the table discriminates)
    shifted = {(p, c): recorded[(p, d)] for (p, c), d in zip(
        sorted(recorded), [c for _, c in sorted(recorded)][1:] + [80])}
    assert replayed != shifted


def _by_point(rows: list[dict[str, Any]]) -> dict[tuple[str, int], dict[str, Any]]:
    return {(r["policy"], r["usable_blocks"]): {k: v for k, v in r.items() if k != "run_id"}
            for r in rows}


# -- what a replay says about itself -------------------------------------------------------------

def test_replayed_run_manifest_says_replayed_and_names_its_source(hard80: Path) -> None:
    manifest = json.loads((hard80 / "manifest.json").read_text())
    assert manifest["evidence"] == "replayed"
    assert manifest["source_run_id"] == "resident60_active70-native-80"
    assert manifest["policy"] == "hard_protected" and manifest["usable_blocks"] == 80


def test_a_schema_2_recording_replays_as_approximate_naming_the_missing_settings(
        own80: Path) -> None:
    replay = json.loads((own80 / "manifest.json").read_text())["replay"]
    assert replay["exact"] is False
    assert any("schema 2" in n and "max_num_batched_tokens" in n
               for n in replay["approximations"])


@pytest.mark.vllm
def test_a_schema_3_recording_replays_exactly(record_run: Any, tmp_path: Path) -> None:
    run_dir, _ = record_run("resident60_active70", "native", 80)
    assert scalar(run_dir, "SELECT max_num_batched_tokens FROM events "
                           "WHERE event = 'run_started'") > 0
    result = whatif.replay(whatif.read_workload(run_dir), "native", 80, tmp_path / "r")
    assert result.exact and result.approximations == []
    assert SCHEMA_VERSION >= 3
    assert whatif.fidelity(run_dir, tmp_path / "r")["exact"]


def test_a_refused_request_replayed_elsewhere_is_approximate(tmp_path: Path) -> None:
    workload = whatif.read_workload(SWEEP / "resident60_active70-hard_protected-80")
    result = whatif.replay(workload, "native", 80, tmp_path / "r")
    assert not result.exact
    assert any("active" in n and "never reached the cache" in n for n in result.approximations)
    assert any("active" in n and "output length is unknown" in n
               for n in result.approximations)


# -- hostile and incomplete input ----------------------------------------------------------------

def test_a_run_without_arrival_steps_is_refused_in_one_line(tmp_path: Path) -> None:
    run = tmp_path / "imported"
    assert main(["import", str(REPO / "tests/fixtures/hard_60_70_80.jsonl"),
                 "--out", str(run)]) == 0
    with pytest.raises(InputError, match="no arrival steps"):
        whatif.read_workload(run)


def test_a_run_without_arrival_steps_is_exit_2_from_the_cli(tmp_path: Path) -> None:
    run = tmp_path / "imported"
    assert main(["import", str(REPO / "tests/fixtures/hard_60_70_80.jsonl"),
                 "--out", str(run)]) == 0
    proc = _cli("whatif", str(run), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "no arrival steps" in proc.stderr


def test_a_trace_with_a_hole_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "cut"
    shutil.copytree(NATIVE_80, run)
    (run / "events.parquet").unlink()
    manifest = json.loads((run / "manifest.json").read_text())
    manifest.pop("sealed")
    (run / "manifest.json").write_text(json.dumps(manifest))
    segment = run / manifest["segments"][0]["file"]
    segment.write_bytes(segment.read_bytes()[: segment.stat().st_size // 2])
    with pytest.raises(InputError, match="hole"):
        whatif.read_workload(run)


def test_the_intact_copy_of_that_trace_is_replayable(tmp_path: Path) -> None:
    run = tmp_path / "whole"
    shutil.copytree(NATIVE_80, run)
    assert len(whatif.read_workload(run).requests) == 3


def test_an_occupied_out_directory_is_refused(native80: whatif.Workload,
                                              tmp_path: Path) -> None:
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "keep").write_text("")
    with pytest.raises(InputError, match="not empty"):
        whatif.replay(native80, "native", 80, tmp_path / "x")


# -- synthetic prompts ---------------------------------------------------------------------------

def test_equal_recorded_chains_give_equal_prompts_and_different_ones_differ() -> None:
    def req(hashes: tuple[int | None, ...]) -> whatif.ReplayRequest:
        return whatif.ReplayRequest("r", 0, 0, 0, 32 * len(hashes), hashes, 1, None, None,
                                    (), None)

    a = whatif.prompt_tokens(req((1, 2, 3)), 0, 32)
    b = whatif.prompt_tokens(req((1, 2, 4)), 1, 32)
    assert a[:64] == b[:64] and a[64:] != b[64:]
    unknown = whatif.prompt_tokens(req((None,)), 0, 32), whatif.prompt_tokens(req((None,)), 1, 32)
    assert unknown[0] != unknown[1]  # content the trace does not know is never shared


# -- the command ---------------------------------------------------------------------------------

def test_cli_prints_the_recorded_run_beside_each_point(tmp_path: Path) -> None:
    proc = _cli("whatif", str(NATIVE_80), "--policy", "native,hard_protected",
                "--usable-blocks", "80", "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    table = [ln.split() for ln in lines if ln.split()[:1] in (["recorded"], ["native@80"],
                                                               ["hard_protected@80"])]
    assert [t[0] for t in table] == ["recorded", "native@80", "hard_protected@80"]
    # harmed / refused columns: the recorded run harmed the claim, the hard replay refused
    assert table[0][4] == "1" and table[2][3] == "1" and table[2][9] == "1"
    assert any(ln.startswith("fidelity") and ": exact;" in ln for ln in lines)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvclaims.cli", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=600)


# -- computed what-ifs, shown: explain, the report, the dashboard --------------------------------

def _claim_outcome(run_dir: Path, claim_id: str) -> str:
    """The reconstructor's outcome of a claim in one run (the figure a citation must match)."""
    with kvclaims.open([run_dir]) as a:
        (row,) = a.sql(f"SELECT outcome FROM claims WHERE claim_id = '{claim_id}'").fetchall()
    return row[0]


def test_a_whatif_folder_holds_one_replay_per_point_naming_its_source(
        native_whatif: Path) -> None:
    found = replays.find_replays([native_whatif])
    assert sorted(r.point for r in found) == ["hard_protected@100", "hard_protected@80",
                                              "native@100"]
    assert {r.source_run_id for r in found} == {NATIVE_80.name}
    assert all(r.computed_utc and r.computed_utc.endswith("Z") for r in found)


def test_recorded_runs_are_not_whatifs() -> None:
    assert replays.find_replays([SWEEP, MULTI]) == []


def test_a_whatif_path_without_runs_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not a run directory"):
        replays.find_replays([tmp_path])


def test_a_whatif_path_holding_only_recordings_is_one_line() -> None:
    with kvclaims.open([NATIVE_80]) as a:
        with pytest.raises(InputError, match="no replayed run there"):
            replays.gather(a, [SWEEP])


def test_a_whatif_path_holding_replays_is_gathered(native_whatif: Path) -> None:
    """Negative twin: a kvclaims whatif --out folder passes."""
    with kvclaims.open([NATIVE_80]) as a:
        assert len(replays.gather(a, [native_whatif])) == 3


def test_explain_cites_each_computed_replay_of_a_harmed_claim(native_whatif: Path) -> None:
    found = replays.find_replays([native_whatif])
    with kvclaims.open([NATIVE_80]) as a:
        (s,) = explain(a, "tenant-resident", whatifs=found).sections
    assert s.outcome == "harmed" and len(s.whatif) == 3
    assert NO_WHATIF not in s.prevention
    by_point = {r.point: r for r in found}
    for line in s.whatif:
        point = re.search(r"under (\w+) at (\d+) usable blocks", line)
        r = by_point[f"{point[1]}@{point[2]}"]
        outcome = _claim_outcome(r.run_dir, "claim:resident")
        assert f"computed {r.computed_utc}, run {r.run_id}" in line
        assert ("preserved this claim" if outcome == "preserved"
                else f"left this claim {outcome}") in line
    hard = next(x for x in s.whatif if "hard_protected at 80" in x)
    refused = scalar(by_point["hard_protected@80"].run_dir,
                     "SELECT count(*) FROM events WHERE event = 'request_refused'")
    assert "preserved this claim" in hard and refused == 1
    assert "1 request(s) of other tenants were refused" in hard and "(recorded: 0, 0, 0)" in hard


def test_explain_without_a_computed_replay_says_nothing_counterfactual() -> None:
    with kvclaims.open(SHIPPED) as a:
        tenants = [r[0] for r in a.sql("SELECT DISTINCT tenant FROM claims "
                                       "WHERE tenant IS NOT NULL").fetchall()]
        sections = [s for t in tenants for s in explain(a, t).sections]
    assert {s.outcome for s in sections} >= {"harmed", "demoted"}
    assert all(not s.whatif for s in sections)
    said = [line for s in sections for line in (*s.why, *s.prevention)]
    assert not [line for line in said if re.search(r"\bwould\b|\bunder hard_protected\b", line)
                and line != NO_WHATIF]
    incidents = [s for s in sections if s.outcome == "harmed" and "not enforced" in
                 " ".join(s.prevention)]
    assert incidents and all(NO_WHATIF in s.prevention for s in incidents)


def test_explain_cites_a_replay_of_a_demoted_claim(multi_whatif: Path) -> None:
    found = [r for r in replays.find_replays([multi_whatif]) if r.source_run_id == DEMOTE_RUN]
    assert len(found) == 1
    with kvclaims.open([DEMOTE]) as a:
        (s,) = [x for x in explain(a, "tenant-resident", whatifs=found).sections
                if x.kind == "claim"]
    (line,) = s.whatif
    outcome = _claim_outcome(found[0].run_dir, "claim:resident")
    assert s.outcome == "demoted" and "under hard_protected at 80 usable blocks" in line
    assert ("preserved this claim" if outcome == "preserved"
            else f"left this claim {outcome}") in line


def test_a_replay_of_another_run_is_never_cited(native_whatif: Path) -> None:
    with kvclaims.open([DEMOTE]) as a:
        (s,) = [x for x in explain(a, "tenant-resident",
                                   whatifs=replays.find_replays([native_whatif])).sections
                if x.kind == "claim"]
    assert s.whatif == [] and NO_WHATIF in s.prevention


def test_cli_explain_cites_the_whatif_it_is_given(native_whatif: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    args = ["explain", str(NATIVE_80), "--tenant", "tenant-resident", "--format", "json"]
    assert main([*args, "--whatif", str(native_whatif)]) == 0
    (cited,) = json.loads(capsys.readouterr().out)["sections"]
    assert len(cited["whatif"]) == 3
    assert main(args) == 0
    (plain,) = json.loads(capsys.readouterr().out)["sections"]
    assert plain["whatif"] == [] and NO_WHATIF in plain["prevention"]


def test_cli_explain_whatif_that_does_not_exist_is_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", str(NATIVE_80), "--tenant", "tenant-resident",
                 "--whatif", str(tmp_path / "none")]) == 2
    assert capsys.readouterr().err.strip().count("\n") == 0


def test_report_shows_the_recorded_run_beside_each_replayed_point(native_whatif: Path) -> None:
    audit = data.load_audit([NATIVE_80], whatif=[native_whatif])
    page = build_report(audit)
    section = page[page.index("<h2 id='whatif'>"):page.index("<h2>Timeline</h2>")]
    expected = replays.compare(NATIVE_80, replays.replays_of(audit.replays, NATIVE_80.name))
    assert [r["point"] for r in expected] == ["recorded", "hard_protected@80",
                                              "hard_protected@100", "native@100"]
    for row in expected:
        cells = [html.escape(replays.cell(row[c])) for c in ("point", "claims_harmed",
                                                             "refused", "lost_harm")]
        assert re.search(r"<td>{}</td>.*?<td class=\"[^\"]*num\">{}</td>.*?"
                         r"<td class=\"[^\"]*num\">{}</td>.*?<td class=\"[^\"]*num\">{}</td>"
                         .format(*map(re.escape, cells)), section), row["point"]
    assert "blocks lost as harm by usable blocks" in section  # two pool sizes: the chart
    assert data.NO_WHATIF not in page


def test_report_without_a_computed_whatif_says_so_and_shows_none() -> None:
    page = build_report(data.load_audit([NATIVE_80]))
    section = page[page.index("<h2 id='whatif'>"):page.index("<h2>Timeline</h2>")]
    assert html.escape(data.NO_WHATIF) in section and "hard_protected@80" not in section


def test_a_whatif_folder_among_the_paths_is_found_beside_its_run(native_whatif: Path) -> None:
    audit = data.load_audit([NATIVE_80, native_whatif])
    assert data.whatif_runs(audit) == [NATIVE_80.name] and not data.whatif_orphans(audit)


def test_a_whatif_without_its_recorded_run_is_set_beside_nothing(native_whatif: Path) -> None:
    audit = data.load_audit([native_whatif])
    assert data.whatif_runs(audit) == [] and len(data.whatif_orphans(audit)) == 3


def test_a_single_pool_size_is_a_table_without_a_chart(hard80: Path) -> None:
    audit = data.load_audit([NATIVE_80], whatif=[hard80])
    comparison = data.whatif_comparison(audit, NATIVE_80.name)
    assert len(comparison) == 2 and not data.whatif_chartable(comparison)
    assert "blocks lost as harm by usable blocks" not in build_report(audit)


# -- computed what-ifs cited for requests --------------------------------------------------------

#: What a citation says a replay did with a request, by the request's outcome there.
FATE = {"served": "served this request", "refused": "refused this request",
        "deferred_then_served": "deferred this request, then served it",
        "preempted": "preempted this request"}


def _request_fate(run_dir: Path, request_id: str) -> tuple[str, int, int]:
    """The reconstructor's outcome, deferrals and preemptions of a request in one run."""
    with kvclaims.open([run_dir]) as a:
        (row,) = a.sql("SELECT outcome, deferrals, preemptions FROM requests "
                       f"WHERE request_id = '{request_id}'").fetchall()
    return row


def test_the_tenanted_run_defers_refuses_and_preempts_tenants_own_requests(
        tenanted: tuple[Path, Path]) -> None:
    with kvclaims.open([tenanted[0]]) as a:
        rows = a.sql("SELECT tenant, outcome FROM requests WHERE outcome IN "
                     "('deferred_then_served', 'refused', 'preempted')").fetchall()
    assert sorted(rows) == [("tenant-b", "deferred_then_served"), ("tenant-b", "refused"),
                            ("tenant-c", "preempted")]


def test_explain_cites_what_each_replay_did_with_a_tenants_request(
        tenanted: tuple[Path, Path]) -> None:
    run, folder = tenanted
    found = replays.find_replays([folder])
    by_point = {r.point: r for r in found}
    with kvclaims.open([run]) as a:
        sections = [s for t in ("tenant-b", "tenant-c")
                    for s in explain(a, t, whatifs=found).sections if s.kind == "request"]
    assert sorted(s.outcome for s in sections) == ["deferred_then_served", "preempted",
                                                   "refused"]
    changed = 0
    for s in sections:
        assert len(s.whatif) == 3 and NO_WHATIF not in s.prevention
        for line in s.whatif:
            point = re.search(r"under (\w+) at (\d+) usable blocks", line)
            outcome, deferrals, preemptions = _request_fate(
                by_point[f"{point[1]}@{point[2]}"].run_dir, s.id)
            assert (f"{FATE[outcome]} ({deferrals} deferral(s), {preemptions} preemption(s); "
                    f"recorded: {s.outcome} after") in line, line
            changed += outcome != s.outcome
    assert changed  # the replays did serve what the recording refused, deferred, preempted


def test_a_request_citation_counts_the_cost_to_other_tenants_from_the_replay(
        tenanted: tuple[Path, Path]) -> None:
    run, folder = tenanted
    native = [r for r in replays.find_replays([folder]) if r.point == "native@80"]
    with kvclaims.open([native[0].run_dir]) as a:
        (harmed,) = a.sql("SELECT count(*) FROM claims WHERE outcome = 'harmed' "
                          "AND tenant IS DISTINCT FROM 'tenant-b'").fetchall()[0]
    with kvclaims.open([run]) as a:
        (s,) = [x for x in explain(a, "tenant-b", whatifs=native).sections
                if x.outcome == "refused"]
    assert harmed == 2  # tenant-a's and tenant-d's: native keeps no claim resident
    assert f"{harmed} claim(s) of other tenants were harmed and 0 demoted (recorded: 0, 0)" \
        in s.whatif[0]


def test_a_request_without_a_computed_replay_gets_no_counterfactual(
        tenanted: tuple[Path, Path]) -> None:
    with kvclaims.open([tenanted[0]]) as a:
        sections = [s for t in ("tenant-b", "tenant-c")
                    for s in explain(a, t).sections if s.kind == "request"]
    assert len(sections) == 3
    assert all(not s.whatif and NO_WHATIF in s.prevention for s in sections)
    said = [line for s in sections for line in s.prevention if line != NO_WHATIF]
    assert said and all(line.startswith(RECORDED_ARITHMETIC) or "vLLM preempts" in line
                        for line in said)


def test_a_replay_of_another_run_is_never_cited_for_a_request(
        tenanted: tuple[Path, Path], native_whatif: Path) -> None:
    with kvclaims.open([tenanted[0]]) as a:
        sections = [s for s in explain(a, "tenant-b", whatifs=replays.find_replays(
            [native_whatif])).sections if s.kind == "request"]
    assert sections and all(not s.whatif and NO_WHATIF in s.prevention for s in sections)


def test_the_pages_open_the_replays_once_for_every_tenant_they_explain(
        tenanted: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[int] = []

    class Counted(replays.ReplayFacts):
        def __init__(self, found: Any) -> None:
            opened.append(len(found))
            super().__init__(found)

    monkeypatch.setattr(data, "ReplayFacts", Counted)
    monkeypatch.setattr(explaining, "ReplayFacts", Counted)  # explain opens none of its own
    audit = data.load_audit([tenanted[0]], whatif=[tenanted[1]])
    page = build_report(audit)
    assert len(data.tenants(audit)) >= 6 and opened == [3]
    assert page.count("A replay of this run under native at 80 usable blocks") >= 4
