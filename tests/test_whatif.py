"""``kvclaims whatif``: a recorded workload replayed through vLLM's own Scheduler (no model).

Every replay here drives the real ``vllm.v1.core.sched.scheduler.Scheduler`` with the kvclaims
recording scheduler and arbiter, writes a real run directory and is audited by the real
reconstructor; fidelity is measured against the shipped recordings, event by event.
Run under ``flock /tmp/kvc-vllm.lock`` (it builds vLLM configurations).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kvclaims import whatif
from kvclaims.cli import main
from kvclaims.reconstruct.loader import find_run_dirs
from kvclaims.contract.schema import InputError, SCHEMA_VERSION
from kvclaims.cli.record import sweep_rows

from tests.conftest import scalar

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO / "traces"
SWEEP = TRACES / "sweep-resident60_active70"
NATIVE_80 = SWEEP / "resident60_active70-native-80"
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
