"""The what-if replay against recording, on the paper's 21-point sweep, in one run.

1. Record the sweep (``resident60_active70``; policies native, write_no_admit, hard_protected;
   usable blocks 80..150) on the vLLM engine with the model, one fresh engine per point, as
   ``kvclaims sweep`` does; the time per point is engine start + scenario + closing the run.
2. Replay the same 21 points from the recorded ``native`` run at 80 blocks alone
   (``kvclaims.whatif``: vLLM's Scheduler with the recorder attached, no model), timed from
   reading the recorded run to the last replayed run directory closed (the first vLLM
   configuration built included).
3. Audit both sets with the reconstructor (the same for both; reported apart) and compare
   the sweep tables row by row, and the replay under the recorded settings event by event.

The table goes into docs/benchmarks.md between ``<!-- whatif:begin -->`` and
``<!-- whatif:end -->`` (the rest of the file is left as it is).

Run: ``flock /tmp/kvc-vllm.lock python benchmarks/whatif.py [--out DIR] [--doc PATH]``
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import kvclaims  # noqa: E402,F401 - maps the checkout's folders (kvclaims.recorder, ...)
from kvclaims import whatif  # noqa: E402

BEGIN, END = "<!-- whatif:begin -->", "<!-- whatif:end -->"
SCENARIO = "resident60_active70"


def record_sweep(out: Path) -> tuple[dict[tuple[str, int], Path], list[float]]:
    """Record every point on a fresh engine; the seconds each took."""
    from kvclaims.sources.scenarios import record

    dirs, times = {}, []
    for policy in whatif.SWEEP_POLICIES:
        for usable in whatif.SWEEP_CAPACITIES:
            run_dir = out / f"{SCENARIO}-{policy}-{usable}"
            t = time.perf_counter()
            record(SCENARIO, usable, policy, run_dir)
            times.append(time.perf_counter() - t)
            dirs[(policy, usable)] = run_dir
    return dirs, times


def replay_sweep(source: Path, out: Path) -> tuple[list[whatif.ReplayResult], float]:
    """Replay every point from ``source``; the results and the total seconds."""
    t = time.perf_counter()
    workload = whatif.read_workload(source)
    results = [whatif.replay(workload, p, c, out / f"{p}-{c}")
               for p in whatif.SWEEP_POLICIES for c in whatif.SWEEP_CAPACITIES]
    return results, time.perf_counter() - t


def import_vllm() -> float:
    """Import what both sides need from vLLM (the engine, its scheduler, the recorder's
    scheduler class), once, before either is timed; the seconds it took."""
    t = time.perf_counter()
    import vllm  # noqa: F401
    from vllm import EngineArgs, LLMEngine  # noqa: F401
    from vllm.v1.core.sched.scheduler import Scheduler  # noqa: F401

    from kvclaims.recorder.scheduler import KVClaimsScheduler  # noqa: F401
    return time.perf_counter() - t


def cold_cli(source: Path, out: Path) -> float:
    """Wall seconds of ``kvclaims whatif SOURCE --sweep`` in a new process (nothing warm)."""
    import subprocess

    shutil.rmtree(out, ignore_errors=True)
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "kvclaims.cli", "whatif", str(source), "--sweep",
                    "--quiet", "--out", str(out)], cwd=REPO, check=True,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


def machine() -> str:
    """CPU model and core count, and the vLLM build."""
    from kvclaims.recorder.scheduler import describe_hardware

    hw = describe_hardware()
    import vllm

    return (f"{hw.get('cpu')} ({hw.get('cpu_count')} cores), {hw.get('accelerator')}; "
            f"vLLM {vllm.__version__}, Python {platform.python_version()}")


def render(rows: list[tuple[str, str]], command: str, when: str, where: str) -> str:
    """The docs section (markers included)."""
    lines = [BEGIN, "", "### What-if replay vs recording: the paper's 21-point sweep", "",
             f"Command: `{command}`  ", f"Date: {when}  ", f"Machine: {where}", "",
             "| measure | value |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in rows]
    lines += ["", "Recording: one fresh vLLM engine with the tiny model per point (engine start, "
              "scenario, closing the run). Replay: vLLM's `Scheduler` with the kvclaims "
              "recorder, constructed model outputs, from the recorded native run at 80 "
              "blocks alone (reading it and building vLLM's configuration included). Both "
              "sides run in one process after vLLM is imported; the fresh-process row pays "
              "the imports, the audit and the chart as the command does. "
              "Auditing is the same work for both and is shown apart.", "", END]
    return "\n".join(lines)


def write_section(doc: Path, section: str) -> None:
    """Replace the marked section of ``doc`` (append it, or create the file, if absent)."""
    text = doc.read_text() if doc.exists() else "# Benchmarks\n"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head + section + rest.split(END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    doc.write_text(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="work directory (default: a temp)")
    ap.add_argument("--doc", type=Path, default=REPO / "docs" / "benchmarks.md")
    args = ap.parse_args(argv)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    work = args.out or Path(tempfile.mkdtemp(prefix="kvclaims-whatif-bench-"))
    shutil.rmtree(work / "recorded", ignore_errors=True)
    shutil.rmtree(work / "replayed", ignore_errors=True)

    import_s = import_vllm()
    recorded, rec_times = record_sweep(work / "recorded")
    record_s = sum(rec_times)
    results, replay_s = replay_sweep(recorded[("native", 80)], work / "replayed")

    cold_s = cold_cli(recorded[("native", 80)], work / "cli")

    from kvclaims.cli.record import sweep_rows

    t = time.perf_counter()
    rec_rows = sweep_rows(list(recorded.values()))
    audit_rec_s = time.perf_counter() - t
    t = time.perf_counter()
    rep_rows = sweep_rows([r.run_dir for r in results])
    audit_rep_s = time.perf_counter() - t

    def key(rows: list[dict[str, Any]]) -> dict[tuple[str, int], dict[str, Any]]:
        return {(r["policy"], r["usable_blocks"]): {k: v for k, v in r.items() if k != "run_id"}
                for r in rows}

    rk, pk = key(rec_rows), key(rep_rows)
    agree = sum(1 for k in rk if pk.get(k) == rk[k])
    own = next(r for r in results if r.policy == "native" and r.usable_blocks == 80)
    fid = whatif.fidelity(recorded[("native", 80)], own.run_dir)
    exact_points = sum(1 for r in results if r.exact)
    rows = [
        ("importing vLLM, once per process, before either side is timed (s)",
         f"{import_s:.1f}"),
        ("recording the 21 points on the engine (s)", f"{record_s:.1f}"),
        ("  per point, mean (s)", f"{record_s / len(rec_times):.2f}"),
        ("replaying the 21 points from one recorded run (s)", f"{replay_s:.2f}"),
        ("  the first point, which builds vLLM's configuration (s)",
         f"{results[0].seconds:.2f}"),
        ("  per point after the first, mean (s)",
         f"{sum(r.seconds for r in results[1:]) / (len(results) - 1):.3f}"),
        ("speed-up (recording / replay)", f"{record_s / replay_s:.1f}x"),
        ("sweep table rows equal, replayed vs recorded", f"{agree}/{len(rk)}"),
        ("replay under the recorded settings, event by event",
         "exact" if fid["exact"] and fid["same_steps"] else "differs"),
        ("points replayed without approximation", f"{exact_points}/{len(results)}"),
        ("auditing the recorded / replayed sweep (s)", f"{audit_rec_s:.1f} / {audit_rep_s:.1f}"),
        ("`kvclaims whatif RUN --sweep` in a fresh process: imports, vLLM's configuration, "
         "21 replays, audit, table and chart (s)", f"{cold_s:.1f}"),
        ("speed-up (recording / that command)", f"{record_s / cold_s:.1f}x"),
    ]
    when = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    section = render(rows, "flock /tmp/kvc-vllm.lock python benchmarks/whatif.py", when,
                     machine())
    write_section(args.doc, section)
    print(section)
    return 0 if agree == len(rk) else 1


if __name__ == "__main__":
    raise SystemExit(main())
