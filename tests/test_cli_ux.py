"""The command line as an operator meets it: ``--version``, ``kvclaims dashboard`` (serves on
127.0.0.1 and answers its health endpoint), progress on a terminal and none in a pipe, the
JSON shapes of ``record``/``sweep``, and the sweep's text table.

Real parts only: the CLI runs as a subprocess (a pseudo-terminal for stderr where a terminal is
the point), Streamlit really serves, the shipped traces are real recordings; one test records
on the real vLLM CPU engine.
"""

from __future__ import annotations

import io
import json
import os
import pty
import select
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TRACES = REPO / "traces"
SWEEP = TRACES / "sweep-resident60_active70"
LIVE = TRACES / "live_pressure"
ENV = {**{k: v for k, v in os.environ.items() if not k.startswith("VLLM_LOGGING")},
       "PYTHONPATH": str(REPO)}


def _cli(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvclaims.cli", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=600, env=ENV, **kw)


def _on_a_terminal(*args: str, timeout: float = 600) -> tuple[int, str, str]:
    """Run the CLI with stderr on a pseudo-terminal and stdout on a pipe:
    (exit code, stdout, what the terminal showed)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "kvclaims.cli", *args], cwd=REPO, env=ENV,
                            stdout=subprocess.PIPE, stderr=slave, text=True)
    os.close(slave)
    shown = bytearray()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the terminal closed: the process is gone
                break
            if not chunk:
                break
            shown += chunk
        elif proc.poll() is not None:
            break
    os.close(master)
    out, _ = proc.communicate(timeout=60)
    return proc.returncode, out, shown.decode("utf-8", "replace")


# -- --version and usage ---------------------------------------------------------------------------

def test_version_prints_the_package_version() -> None:
    from importlib.metadata import version

    done = _cli("--version")
    assert done.returncode == 0
    assert done.stdout == f"kvclaims {version('kvclaims')}\n"


def test_an_unknown_option_is_a_usage_error_without_traceback() -> None:
    done = _cli("--no-such-option")
    assert done.returncode == 2
    assert "usage: kvclaims" in done.stderr and "Traceback" not in done.stderr


# -- dashboard -------------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening_addresses(port: int) -> set[str]:
    """Local IPv4 addresses listening on ``port`` (from /proc/net/tcp, state 0A = LISTEN)."""
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        addr, p = local.split(":")
        if int(p, 16) == port and state == "0A":
            found.add(socket.inet_ntoa(bytes.fromhex(addr)[::-1]))
    return found


def test_dashboard_serves_on_loopback_and_answers_its_health_endpoint(tmp_path: Path) -> None:
    import requests

    port = _free_port()
    log = tmp_path / "dashboard.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "kvclaims.cli", "dashboard", str(LIVE),
                                 "--port", str(port)], cwd=REPO, env=ENV, stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                health = requests.get(f"http://127.0.0.1:{port}/_stcore/health", timeout=2)
                break
            except requests.ConnectionError:
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)  # polling interval, bounded by the deadline
        assert health.status_code == 200 and health.text == "ok"
        assert _listening_addresses(port) == {"127.0.0.1"}  # not 0.0.0.0
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert f"http://127.0.0.1:{port}/" in log.read_text()
    # the server was the process we stopped (exec), not an orphaned child still serving
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{port}/_stcore/health", timeout=2)


def test_dashboard_exposes_itself_only_when_asked_and_hides_tracebacks() -> None:
    from kvclaims.dashboard.commands import streamlit_command

    local = streamlit_command(["runs"], 8501, "127.0.0.1")
    exposed = streamlit_command(["runs"], 8501, "0.0.0.0")
    assert local[local.index("--server.address") + 1] == "127.0.0.1"
    assert exposed[exposed.index("--server.address") + 1] == "0.0.0.0"
    assert local[local.index("--client.showErrorDetails") + 1] == "none"
    assert local[-2:] == ["--", "runs"]


def test_dashboard_with_a_missing_directory_is_one_line_and_exit_2(tmp_path: Path) -> None:
    done = _cli("dashboard", str(tmp_path / "missing"))
    assert done.returncode == 2
    assert done.stderr == f"kvclaims dashboard: error: {tmp_path / 'missing'}: no such " \
                          "directory\n"


def test_dashboard_rejects_a_bad_port_as_usage() -> None:
    done = _cli("dashboard", "--port", "99999")
    assert done.returncode == 2 and "port out of range" in done.stderr
    assert "Traceback" not in done.stderr


# -- report and progress ---------------------------------------------------------------------------

def test_report_shows_progress_on_a_terminal(tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    code, stdout, shown = _on_a_terminal("report", str(LIVE), "--out", str(out))
    assert code == 0, shown
    assert stdout == f"{out}\n"
    assert "report: " in shown and "elapsed" in shown
    assert out.read_text().startswith("<!DOCTYPE html>")


def test_report_shows_no_progress_when_piped(tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    done = _cli("report", str(LIVE), "--out", str(out))
    assert done.returncode == 0
    assert done.stdout == f"{out}\n" and done.stderr == ""


def test_quiet_hides_progress_on_a_terminal(tmp_path: Path) -> None:
    code, _, shown = _on_a_terminal("report", str(LIVE), "--out", str(tmp_path / "r.html"),
                                    "--quiet")
    assert code == 0 and "elapsed" not in shown


def test_report_into_a_missing_folder_is_one_line_and_exit_2(tmp_path: Path) -> None:
    done = _cli("report", str(LIVE), "--out", str(tmp_path / "no" / "r.html"))
    assert done.returncode == 2
    assert done.stderr.startswith("kvclaims report: error: ") and done.stderr.count("\n") == 1


def test_progress_line_says_time_left_once_the_work_has_a_known_duration(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kvclaims import progress as progress_mod

    monkeypatch.setattr(progress_mod, "DURATIONS", tmp_path / "durations.json")
    first = progress_mod.Progress("record", key="record x")
    assert "left" not in first.line()
    progress_mod._save("record x", 30.0)
    second = progress_mod.Progress("record", key="record x")
    second.stage("scenario", done=2, total=5)
    assert second.line().startswith("record: scenario 2/5 · 0s elapsed · ~30s left")



class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_stage_shorter_than_the_tick_is_still_drawn() -> None:
    from kvclaims import progress as progress_mod

    term = _Terminal()
    with progress_mod.Progress("record", stream=term, interval=60) as p:
        p.stage("scenario")
        p.stage("closing")
    assert "record: scenario" in term.getvalue() and "record: closing" in term.getvalue()


def test_a_stage_is_not_redrawn_before_the_tick_when_only_its_count_moves() -> None:
    from kvclaims import progress as progress_mod

    term = _Terminal()
    with progress_mod.Progress("record", stream=term, interval=60) as p:
        p.stage("scenario", done=1, total=3)
        p.stage("scenario", done=2, total=3)
    assert "scenario 1/3" in term.getvalue() and "scenario 2/3" not in term.getvalue()

# -- JSON shapes and the sweep table ---------------------------------------------------------------

def _sweep_copy(tmp_path: Path, capacities: tuple[int, ...]) -> Path:
    out = tmp_path / "sweep"
    for c in capacities:
        name = f"resident60_active70-native-{c}"
        shutil.copytree(SWEEP / name, out / name)
    return out


def test_sweep_json_is_one_array_of_rows_with_fixed_keys(tmp_path: Path) -> None:
    from kvclaims.cli.record import SWEEP_COLUMNS

    out = _sweep_copy(tmp_path, (80, 90))  # complete points: nothing is recorded again
    done = _cli("sweep", "--capacities", "90,80", "--policies", "native", "--out", str(out),
                "--json")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert isinstance(rows, list) and len(rows) == 2
    assert [set(r) for r in rows] == [{"scenario", *SWEEP_COLUMNS}] * 2
    assert [r["usable_blocks"] for r in rows] == [80, 90]
    assert done.stderr == ""  # no progress in a pipe


def test_sweep_text_starts_with_a_summary_and_aligns_numbers(tmp_path: Path) -> None:
    out = _sweep_copy(tmp_path, (80, 90, 100))
    done = _cli("sweep", "--capacities", "100,90,80", "--policies", "native", "--out",
                str(out))
    assert done.returncode == 0, done.stderr
    summary, header, *rows = done.stdout.splitlines()
    assert summary.startswith("3 points: a claim was harmed at 3 (3 by the active request")
    right = header.index("usable") + len("usable")
    assert [r[:right].split()[-1] for r in rows] == ["80", "90", "100"]  # right-aligned, sorted
    assert all(r[right] == " " for r in rows)


def test_sweep_rows_of_no_runs_is_an_empty_list() -> None:
    from kvclaims.cli.record import sweep_rows

    assert sweep_rows([]) == []


def test_record_losses_by_label_is_an_object_even_when_nothing_was_lost() -> None:
    from kvclaims.cli.record import _claims_and_losses

    claims, losses = _claims_and_losses(SWEEP / "resident60_active70-hard_protected-80")
    assert losses == {} and [c["outcome"] for c in claims] == ["preserved"]
    _, native = _claims_and_losses(SWEEP / "resident60_active70-native-80")
    assert native == {"eviction": 50, "harm": 50}


@pytest.mark.vllm
def test_record_on_a_terminal_shows_its_stages_and_prints_json_on_stdout(
        tmp_path: Path) -> None:
    out = tmp_path / "run"
    code, stdout, shown = _on_a_terminal("record", "--scenario", "live_pressure", "--out",
                                         str(out), "--json")
    assert code == 0, shown
    view = json.loads(stdout)  # stdout holds the JSON alone
    assert set(view) == {"scenario", "policy", "usable_blocks", "run_id", "requests",
                         "run_dir", "claims", "losses_by_label"}
    assert isinstance(view["losses_by_label"], dict) and isinstance(view["claims"], list)
    for stage in ("record: engine start", "record: scenario", "record: closing"):
        assert stage in shown, shown
    assert " INFO " not in shown  # vLLM's own log stays out of the way without --verbose
