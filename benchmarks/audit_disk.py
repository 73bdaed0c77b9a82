"""What an audit leaves on disk: its tables as TEMP tables against tables of its database file.

    python benchmarks/audit_disk.py [--events N] [--shape dense] [--memory-limit 1GB]
                                    [--traces DIR]

Reconstructs one generated trace (``benchmarks/reconstruct.py``'s shapes; ``--traces`` keeps
and reuses it) twice, each in its own process so the peak RSS is its own: with the tables as
TEMP tables (what ``kvclaims.open`` does below ``reconstruct.core.COMPACT_EVENTS`` events) and
as tables of the audit's database file (what it does from there on). For each it prints the CPU
seconds (process, all threads), wall, the most bytes under ``temp_directory`` (the audit's
database file and DuckDB's spill, sampled every 0.2 s while the audit opens) and the peak RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import _report  # noqa: E402
from benchmarks.reconstruct import cpu_s, kept_traces  # noqa: E402
from kvclaims.audit import open_audit  # noqa: E402
from kvclaims.reconstruct import core  # noqa: E402

MODES = ("temp", "file")   # TEMP tables; tables of the database file
HEADER = ["tables", "events", "CPU s", "wall s", "most on disk, MiB", "peak RSS, MiB"]


def folder_bytes(folder: Path) -> int:
    """Bytes of the files under ``folder`` now (files removed while it walks are skipped)."""
    total = 0
    for root, _dirs, files in os.walk(folder):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def peak_rss_mib() -> float:
    """This process's own peak RSS (VmHWM: ru_maxrss would carry the parent's over exec)."""
    status = Path("/proc/self/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) / 1024


def one(mode: str, paths: list[Path], memory_limit: str, work: Path) -> dict[str, Any]:
    """Open the audit once with ``mode``'s tables; its figures."""
    core.COMPACT_EVENTS = 0 if mode == "file" else 1 << 62
    spill = work / f"spill-{mode}"
    spill.mkdir(parents=True)
    most = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.2):
            most[0] = max(most[0], folder_bytes(spill))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0, c0 = time.perf_counter(), cpu_s()
    audit = open_audit(paths, memory_limit=memory_limit, temp_directory=spill, reuse=False,
                       lock=False, views=False)
    wall, cpu = time.perf_counter() - t0, cpu_s() - c0
    done.set()
    sampler.join()
    most[0] = max(most[0], folder_bytes(spill))
    (events,), = audit.con.execute("SELECT count(*) FROM events").fetchall()
    return {"mode": mode, "events": events, "cpu_s": cpu, "wall_s": wall,
            "disk_mib": most[0] / 2**20, "rss_mib": peak_rss_mib()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=10_000_000)
    ap.add_argument("--shape", default="dense")
    ap.add_argument("--memory-limit", default="1GB")
    ap.add_argument("--traces", metavar="DIR", help="keep the generated trace in DIR and reuse it")
    ap.add_argument("--one", choices=MODES, help=argparse.SUPPRESS)
    ap.add_argument("--paths", help=argparse.SUPPRESS)
    _report.add_doc_option(ap)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kvclaims-audit-disk-") as tmp:
        if args.one:
            res = one(args.one, [Path(p) for p in json.loads(args.paths)], args.memory_limit,
                      Path(tmp))
            print(json.dumps(res))
            return 0
        traces = Path(args.traces) if args.traces else Path(tmp) / "traces"
        paths, _n, _reused = kept_traces(traces, args.shape, args.events)
        rows = []
        for mode in MODES:
            child = subprocess.run(
                [sys.executable, __file__, "--one", mode, "--paths",
                 json.dumps([str(p) for p in paths]), "--memory-limit", args.memory_limit],
                capture_output=True, text=True, check=False)
            if child.returncode != 0:
                print(f"{mode}: failed\n{child.stderr[-2000:]}", file=sys.stderr)
                return 1
            r = json.loads(child.stdout.splitlines()[-1])
            rows.append([mode, f"{r['events']:,}", f"{r['cpu_s']:.1f}", f"{r['wall_s']:.1f}",
                         f"{r['disk_mib']:,.0f}", f"{r['rss_mib']:,.0f}"])
            print(" | ".join(rows[-1]), flush=True)
    _report.write_section(
        "audit_disk", _report.markdown_table(HEADER, rows)
        + f"\n\n`{args.shape}` events, DuckDB memory_limit {args.memory_limit}. `temp`: TEMP "
        "tables (below `reconstruct.core.COMPACT_EVENTS` events); `file`: tables of the "
        "audit's database file, compressed (from there on). Most on disk: the audit's folder "
        "(database file and DuckDB's spill), sampled every 0.2 s.", args.doc, script=__file__)
    return 0


if __name__ == "__main__":
    sys.exit(main())
