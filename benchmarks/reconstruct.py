"""Reconstruction benchmark across trace shapes, against a plain-Python replay of the labels.

    python benchmarks/reconstruct.py [--events N] [--shapes sparse,dense,sweep]
                                     [--memory-limit 2GB] [--python-events N]
    python benchmarks/reconstruct.py --events 10000000,100000000 --shapes dense   # scaling
    python benchmarks/reconstruct.py --out-of-core        # opt-in: 1 B dense events

Each shape runs in its own process (so peak RSS is its own) and prints, side by side: a bare
pyarrow scan of only the columns the labelling pass reads (``labels.PASS_COLUMNS``, from each
run's sealed Parquet file, as the pass opens it: the floor), read
events/s (the loader alone: run directory -> decoded Arrow batches), read into the audit (the
checked read that leaves ``events`` a view over the runs' Parquet files), label events/s (read +
stages 01-04: every loss labelled), all tables events/s (stages 01-07), end to end events/s
(read + all tables + Parquet written), per-stage seconds (wall and CPU) and the parts of the
labelling pass, peak RSS (the trace is generated in a child process), the plain-Python
replay's events/s on the
same labels and the ratio, and whether both agree on every label of the replayed part.

Shapes (kvclaims/sources/synthetic.py): ``sparse`` (1 request in 10 claims a prefix), ``dense``
(every other request claims its whole prompt, chains shared by many claims, several copies
of a hash, every lifecycle end, claim-id reuse, resets, a 2000-block pool, one scheduler step
per request), ``sweep`` (21 sparse runs of a capacity sweep, reconstructed together),
``mixed`` (not designed for: ``MIXED_RUNS`` short runs, their policies in turn, one request in
three claims, claims ending 160 requests after their request: long-lived while their blocks are
evicted and re-cached).

Every stage is given in events per CPU-second (user + system of the process and its children,
all threads: ``os.times``) and wall. The issue's targets (issue 28: end to end >= 2 M events
per CPU-second, within 4x of the bare scan, >= 10x the plain-Python replay) are checked; one
missed is printed with how far off it is and the stage that dominates the CPU. Given several
sizes (``--events 10000000,100000000``), it also states how the CPU per event grows from each
size to the next, per shape (target: at most 1.1x per event from 10 M to 100 M, i.e. 11x the
CPU), and at 100 M requested events whether the peak RSS is within 2 GiB.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import _report  # noqa: E402
from kvclaims.audit import open_audit  # noqa: E402
from kvclaims.reconstruct import core, labels, loader  # noqa: E402
from kvclaims.contract.trace_writer import SEALED_NAME  # noqa: E402
from kvclaims.sources import synthetic  # noqa: E402

#: The trace shapes, in the tables' order (``mixed``: the one not designed for).
SHAPES = ("sparse", "dense", "sweep", "mixed")
SWEEP_RUNS = 21
MIXED_RUNS = 64
# issue 28's targets, in CPU terms
TARGET_E2E_RATE = 2e6        # events per CPU-second end to end
TARGET_SCAN_RATIO = 4.0      # end-to-end CPU / bare-scan CPU at most
TARGET_PY_RATIO = 10.0       # end-to-end rate / plain-Python replay rate at least
TARGET_GROWTH = 1.1          # CPU per event at 10x the events / at 1x, at most (10 M -> 100 M: 11x)
TARGET_PEAK_GIB = 2.0        # peak RSS at TARGET_PEAK_EVENTS requested events, at most
TARGET_PEAK_EVENTS = 100_000_000
MODE_CLASS = {"best_effort": 0, "soft_priority": 1}  # anything else: residency (2)


def write_shape(work: Path, shape: str, events: int) -> tuple[list[Path], int]:
    """Write the shape's run directories under ``work``; return (paths, events written)."""
    if shape == "sweep":
        total, paths = 0, []
        for i in range(SWEEP_RUNS):
            pool = 1024 + 256 * i
            path = work / "sweep" / f"run{i:02d}"
            total += synthetic.write_trace(path, events // SWEEP_RUNS, 8, pool,
                                           run_id=f"sweep-{i:02d}", progress=False)
            paths.append(path)
        return [work / "sweep"], total
    if shape == "mixed":
        total = synthetic.write_mixed(work / "mixed", events, MIXED_RUNS)
        return [work / "mixed"], total
    path = work / shape
    n = synthetic.write_trace(path, events, run_id=shape, progress=True,
                              shape=synthetic.SHAPES[shape])
    return [path], n


def generate(work: Path, shape: str, events: int) -> tuple[list[Path], int]:
    """``write_shape`` in a child process: the generator's memory is not the reconstruction's
    peak RSS."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run([sys.executable, __file__, "--gen", shape, "--events", str(events),
                        "--work", str(work), "--json-out", out.name], check=True)
        got = json.loads(Path(out.name).read_text())
    return [Path(p) for p in got["paths"]], got["events"]


# -- the plain-Python replay ---------------------------------------------------------------------

def python_replay(run_dir: Path, limit: int) -> tuple[int, float, dict[tuple[int, int], str]]:
    """Plain-Python replay of the loss labels over the first ``limit`` events of one run (to the
    end of the step holding the last one), reading the same run directory.

    Returns (events replayed, seconds, {(seq, block_id): label}). Dicts keep per-block content
    and request references, per-hash copies and bindings, per-instance predicate counts, and the
    counters the soft_priority rule needs. It assumes what the synthetic traces guarantee: no
    gap, no hook failure, claims with a declared threshold, every event with a step.
    """
    content: dict[int, int] = {}
    refs: dict[int, int] = {}
    copies: dict[int, int] = {}
    evc: dict[int, int] = {}            # hash -> evictable copies
    soft: dict[int, int] = {}           # hash -> in-force soft-or-stronger bindings
    low = 0                             # evictable blocks whose hash no such binding covers
    binds: dict[int, list[list[Any]]] = {}   # hash -> [instance, position] bindings
    inst: dict[str, dict[str, Any]] = {}      # claim id -> latest instance
    pending: list[tuple[int, int, list[tuple[dict[str, Any], bool]]]] = []
    labels: dict[tuple[int, int], str] = {}
    sev = {"eviction": 1, "relaxation": 2, "expiry": 3, "harm": 4}

    def judge(now: int) -> None:
        for seq, b, pairs in pending:
            best = "eviction"
            for c, low_then in pairs:
                if c["acc"] is None or c["acc"] >= seq:
                    lab = "eviction"
                elif c["rel"] is not None and c["rel"] < seq:
                    lab = "expiry" if c["relev"] == "claim_expired" else "relaxation"
                elif c["mode"] == 0 or c["mat"] is None or c["mat"] >= seq or c["ok"] == c["k"]:
                    lab = "eviction"
                elif c["mode"] == 1 and not low_then:
                    lab = "eviction"
                else:
                    lab = "harm"
                if sev[lab] > sev[best]:
                    best = lab
            labels[(seq, b)] = best
        pending.clear()
        for c in dirty:
            if (c["mat"] is None and c["ok"] == c["k"] and c["acc"] is not None
                    and c["rel"] is None):
                c["mat"] = now
        dirty.clear()

    def resident(h: int, d: int) -> None:
        for c, p in binds.get(h, ()):
            if p < c["k"]:
                c["ok"] += d
                if c["ok"] == c["k"]:
                    dirty.append(c)

    def add_copy(b: int, h: int, d: int) -> None:
        nonlocal low
        if refs.get(b, 0) == 0:
            evc[h] = evc.get(h, 0) + d
            if soft.get(h, 0) == 0:
                low += d
        n = copies.get(h, 0) + d
        copies[h] = n
        if (d > 0 and n == 1) or (d < 0 and n == 0):
            resident(h, d)

    def ref(b: int, d: int) -> None:
        nonlocal low
        old = refs.get(b, 0)
        new = max(0, old + d)
        refs[b] = new
        h = content.get(b)
        if h is not None and (old == 0) != (new == 0):
            e = -1 if new else 1
            evc[h] = evc.get(h, 0) + e
            if soft.get(h, 0) == 0:
                low += e

    def cover(c: dict[str, Any], h: int, d: int) -> None:
        nonlocal low
        if c["mode"] == 0:
            return
        old = soft.get(h, 0)
        soft[h] = old + d
        if old == 0 and d > 0:
            low -= evc.get(h, 0)
        elif old + d == 0:
            low += evc.get(h, 0)

    dirty: list[dict[str, Any]] = []
    done = 0
    last_step = None
    t0 = time.perf_counter()
    for batch in loader.iter_batches([run_dir]):
        cols = batch.select(["seq", "step", "event", "block_id", "block_hash", "claim_id",
                             "position", "threshold_blocks", "protection_mode"]).to_pydict()
        for seq, step, ev, b, h, cid, p, k, mode in zip(*cols.values()):
            if last_step is not None and step != last_step:
                judge(seq - 1)
                if done >= limit:
                    return done, time.perf_counter() - t0, labels
            last_step = step
            if ev == "block_cached" or ev == "block_hit":
                if ev == "block_hit":
                    ref(b, 1)
                old = content.get(b)
                if old != h:
                    if old is not None:
                        del content[b]
                        add_copy(b, old, -1)
                    content[b] = h
                    add_copy(b, h, 1)
            elif ev == "block_evicted":
                if h is None:
                    h = content.get(b)
                pairs = []
                seen = set()
                for c, _p in binds.get(h, ()):
                    if id(c) not in seen:
                        seen.add(id(c))
                        pairs.append((c, low > 0))
                pending.append((seq, b, pairs))
                old = content.pop(b, None)
                if old is not None:
                    add_copy(b, old, -1)
            elif ev == "cache_reset":
                for blk in sorted(content):
                    hh = content[blk]
                    cs = {id(c): c for c, _p in binds.get(hh, ())}
                    pending.append((seq, blk, [(c, False) for c in cs.values()]))
                for blk in list(content):
                    add_copy(blk, content.pop(blk), -1)
            elif ev == "block_allocated":
                ref(b, 1)
            elif ev == "block_freed":
                ref(b, -1)
            elif ev == "claim_submitted":
                inst[cid] = {"k": k, "ok": 0, "mat": None, "acc": None, "rel": None,
                             "relev": None, "mode": MODE_CLASS.get(mode, 2), "bound": []}
            elif ev == "claim_accepted":
                c = inst[cid]
                c["acc"] = seq
                for hh, pp in c["bound"]:
                    if pp < c["k"]:
                        cover(c, hh, 1)
                dirty.append(c)
            elif ev == "claim_bound":
                c = inst[cid]
                binds.setdefault(h, []).append([c, p])
                c["bound"].append((h, p))
                if p < c["k"] and copies.get(h, 0) > 0:
                    c["ok"] += 1
                    dirty.append(c)
                if c["acc"] is not None and c["rel"] is None and p < c["k"]:
                    cover(c, h, 1)
            elif ev in ("claim_released", "claim_demoted", "claim_expired"):
                c = inst[cid]
                if c["rel"] is None:
                    c["rel"], c["relev"] = seq, ev
                    if c["acc"] is not None:
                        for hh, pp in c["bound"]:
                            if pp < c["k"]:
                                cover(c, hh, -1)
            done += 1
    judge(-1)
    return done, time.perf_counter() - t0, labels


# -- one shape, in its own process ---------------------------------------------------------------

def peak_rss_mib() -> float:
    """Peak resident set size of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cpu_s() -> float:
    """CPU seconds (user + system) of this process so far, all threads, plus its waited-for
    children's."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def run_dirs(paths: list[Path]) -> list[Path]:
    """Every run directory under ``paths``, in the order the audit reads them."""
    return [d for p in paths for d in loader.find_run_dirs(p)]


def bare_scan(paths: list[Path]) -> tuple[int, float, float]:
    """Scan only the columns the labelling pass reads from each run's sealed Parquet file,
    opened as the pass opens it (``event`` as a dictionary, 64 k-row batches), decoding
    nothing further: the floor. Returns (rows, wall s, CPU s)."""
    rows, t0, c0 = 0, time.perf_counter(), cpu_s()
    for run in run_dirs(paths):
        pf = loader.parquet_file(run / SEALED_NAME, read_dictionary=["event"])
        for batch in pf.iter_batches(batch_size=1 << 16, columns=list(labels.PASS_COLUMNS)):
            rows += batch.num_rows
    return rows, time.perf_counter() - t0, cpu_s() - c0


def replay_runs(paths: list[Path], limit: int
                ) -> tuple[int, float, float, dict[str, tuple[int, dict[tuple[int, int], str]]]]:
    """``python_replay`` over the runs in order until ``limit`` events are replayed.

    Returns (events, wall s, CPU s, {run_id: (last seq judged, {(seq, block_id): label})})."""
    done, wall, c0, out = 0, 0.0, cpu_s(), {}
    for run in run_dirs(paths):
        if done >= limit:
            break
        n, t, got = python_replay(run, limit - done)
        done, wall = done + n, wall + t
        out[loader.read_manifest(run)["run_id"]] = (max((q for q, _b in got), default=-1), got)
    return done, wall, cpu_s() - c0, out


def cross_check(con: Any, replayed: dict[str, tuple[int, dict[tuple[int, int], str]]]
                ) -> tuple[int, list[str]]:
    """Compare the replayed labels with ``losses`` over the replayed part of each run;
    return (labels checked, mismatches as text)."""
    checked, bad = 0, []
    for rid, (last, want) in replayed.items():
        got = {(q, b): lab for q, b, lab in con.execute(
            "SELECT seq, block_id, label FROM losses WHERE run_id = $rid AND seq <= $last",
            {"rid": rid, "last": last}).fetchall()}
        checked += len(want)
        bad += [str((rid, k, got.get(k), want.get(k))) for k in sorted(set(got) | set(want))
                if got.get(k) != want.get(k)]
    return checked, bad


def warm_up(work: Path) -> None:
    """Load (or compile, once per install) the numba pass before anything is timed.

    NOTE: numba caches the compiled pass beside its source; a fresh install or an edited
    ``labels.py`` pays about 20 s once, which is not the reconstruction's cost."""
    synthetic.write_trace(work, 20_000, run_id="warm", progress=False,
                          shape=synthetic.SHAPES["dense"])
    open_audit([work], reuse=False, lock=False, views=False)
    for key in labels.TIMINGS:
        labels.TIMINGS[key] = 0.0


def kept_traces(traces: Path, shape: str, events: int) -> tuple[list[Path], int, bool]:
    """The shape's traces under ``traces``, generated there once and reused by later runs
    (``--traces``); returns (paths, events, whether they were reused).

    NOTE: a ``.done`` file beside the traces marks a finished generation: an interrupted one,
    or one whose ``.done`` names no events or a path that is gone, is generated again.
    """
    where = traces / f"{shape}-{events}"
    done = traces / f"{shape}-{events}.done"
    if done.exists():
        got = json.loads(done.read_text())
        if got.get("events") and all(Path(p).exists() for p in got.get("paths", ())):
            return [Path(p) for p in got["paths"]], got["events"], True
    shutil.rmtree(where, ignore_errors=True)
    traces.mkdir(parents=True, exist_ok=True)
    paths, n = generate(where, shape, events)
    done.write_text(json.dumps({"paths": [str(p) for p in paths], "events": n}))
    return paths, n, False


def run_one(shape: str, events: int, memory_limit: str, python_events: int,
            work: Path, traces: Path | None = None) -> dict[str, Any]:
    """Generate (or reuse, ``traces``), read, reconstruct, write and replay one shape; return
    its figures."""
    t_gen = time.perf_counter()
    reused = False
    if traces is None:
        paths, n = generate(work, shape, events)
    else:
        paths, n, reused = kept_traces(traces, shape, events)
    t_gen = time.perf_counter() - t_gen
    warm_up(work / "warm")
    rss_gen = peak_rss_mib()
    scanned, t_scan, cpu_scan = bare_scan(paths)
    assert scanned == n, (scanned, n)
    t0, c0 = time.perf_counter(), cpu_s()
    read = sum(b.num_rows for b in loader.iter_batches(paths))
    t_read, cpu_read = time.perf_counter() - t0, cpu_s() - c0
    assert read == n, (read, n)
    marks: dict[str, float] = {}
    cpu_marks: dict[str, float] = {}

    def progress(stage: str) -> None:
        marks[stage] = time.perf_counter()
        cpu_marks[stage] = cpu_s()
        print(f"  {shape}: {stage} {marks[stage] - start:.1f} s", file=sys.stderr, flush=True)

    start = time.perf_counter()
    cpu0 = cpu_s()
    # the audit facade every consumer uses, without the views (the tables are the output)
    tables = open_audit(paths, memory_limit=memory_limit, temp_directory=work / "spill",
                        progress=progress, reuse=False, lock=False, views=False)
    t_all, cpu_all = time.perf_counter(), cpu_s() - cpu0
    tables.write(work / "out")
    t_written = time.perf_counter()
    cpu_e2e = cpu_s() - cpu0
    rss = peak_rss_mib()
    stages, prev = {}, start
    for name, t in marks.items():
        stages[name] = round(t - prev, 2)
        prev = t
    stages["write"] = round(t_written - t_all, 2)
    stages_cpu, prev = {}, cpu0
    for name, c in cpu_marks.items():
        stages_cpu[name] = round(c - prev, 2)
        prev = c
    stages_cpu["write"] = round(cpu0 + cpu_e2e - prev, 2)
    pass_parts = {k: round(v, 2) for k, v in labels.TIMINGS.items()}
    held = dict(labels.HELD)   # the measured audit's pass (the last build in this process)
    py_n, py_t, py_cpu, replayed = replay_runs(paths, python_events)
    checked, mismatches = cross_check(tables.con, replayed)
    counts = dict(tables.con.sql(
        "SELECT label, count(*) FROM losses GROUP BY label ORDER BY label").fetchall())
    pairs = tables.con.sql("SELECT count(*) FROM loss_claims").fetchall()[0][0]
    tables.con.close()
    t_import = marks["read"] - start
    return {
        "shape": shape, "events": n, "scan_s": t_scan, "scan_cpu_s": cpu_scan,
        "read_s": t_read, "read_cpu_s": cpu_read, "import_s": t_import,
        "import_cpu_s": cpu_marks["read"] - cpu0, "pass_s": stages[core.PASS_STAGE],
        "pass_cpu_s": stages_cpu[core.PASS_STAGE], "all_cpu_s": cpu_all,
        "py_cpu_s": py_cpu, "runs_replayed": len(replayed),
        "label_s": marks["04_labels.sql"] - start, "all_s": t_all - start,
        "e2e_s": t_written - start, "e2e_cpu_s": cpu_e2e, "write_s": t_written - t_all,
        "rss_mib": rss, "rss_gen_mib": rss_gen, "held": held, "gen_s": t_gen, "reused": reused,
        "py_events": py_n, "py_s": py_t,
        "checked": checked, "mismatches": mismatches[:5],
        "n_mismatches": len(mismatches), "labels": counts, "loss_claims": pairs,
        "stages": stages, "stages_cpu": stages_cpu, "pass_parts": pass_parts,
    }


def rates(r: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """Each measured stage as (events per CPU-second, events per wall second)."""
    n = r["events"]
    spans = {"scan": ("scan_s", "scan_cpu_s"), "loader": ("read_s", "read_cpu_s"),
             "import": ("import_s", "import_cpu_s"), "pass": ("pass_s", "pass_cpu_s"),
             "all": ("all_s", "all_cpu_s"), "e2e": ("e2e_s", "e2e_cpu_s")}
    return {k: (n / max(r[c], 1e-9), n / max(r[w], 1e-9)) for k, (w, c) in spans.items()}


def py_rate(r: dict[str, Any]) -> float:
    """The plain-Python replay's events per CPU-second (it is single-threaded)."""
    return r["py_events"] / max(r["py_cpu_s"], 1e-9)


def dominant(r: dict[str, Any]) -> str:
    """The stage with the most CPU end to end (with the pass's parts when it is the pass)."""
    name, cpu = max(r["stages_cpu"].items(), key=lambda kv: kv[1])
    text = f"{name} ({cpu:.1f} of {r['e2e_cpu_s']:.1f} CPU s, {cpu / r['e2e_cpu_s']:.0%})"
    if name == core.PASS_STAGE:
        parts = r["pass_parts"]
        text += (f"; its parts (wall s): input {parts['input']:.1f}, loop {parts['loop']:.1f}, "
                 f"outputs as Arrow {parts['outputs']:.1f}, "
                 f"written as Parquet {parts['write']:.1f}")
    return text


def targets(r: dict[str, Any]) -> list[str]:
    """Issue 28's targets for one shape: met, or missed by how much and what dominates."""
    e2e = rates(r)["e2e"][0]
    ratio = r["e2e_cpu_s"] / max(r["scan_cpu_s"], 1e-9)
    vs_py = e2e / py_rate(r)
    checks = [
        (e2e >= TARGET_E2E_RATE, f">= {TARGET_E2E_RATE / 1e6:.0f} M events per CPU-s end to end",
         f"{e2e / 1e6:.2f} M: {TARGET_E2E_RATE / e2e:.1f}x too slow"),
        (ratio <= TARGET_SCAN_RATIO, f"within {TARGET_SCAN_RATIO:.0f}x of the bare scan",
         f"{ratio:.1f}x the scan's CPU: {ratio / TARGET_SCAN_RATIO:.1f}x over"),
        (vs_py >= TARGET_PY_RATIO, f">= {TARGET_PY_RATIO:.0f}x the plain-Python replay",
         f"{vs_py:.1f}x: {TARGET_PY_RATIO / vs_py:.1f}x short"),
    ]
    if r.get("requested", r["events"]) >= TARGET_PEAK_EVENTS:
        gib = r["rss_mib"] / 1024
        checks.append((gib <= TARGET_PEAK_GIB,
                       f"peak RSS <= {TARGET_PEAK_GIB:.0f} GiB at this size",
                       f"{gib:.2f} GiB: {gib / TARGET_PEAK_GIB:.2f}x the target"))
    lines = [f"  target {goal:<44} " + ("met" if ok else f"MISSED, {how}")
             for ok, goal, how in checks]
    if not all(ok for ok, _g, _h in checks):
        lines.append(f"  dominant stage               {dominant(r)}")
    return lines


def fmt(r: dict[str, Any]) -> list[str]:
    """The printed figures of one shape."""
    n = r["events"]
    rt = rates(r)

    def rate(key: str, wall_key: str) -> str:
        cpu, wall = rt[key]
        return (f"{cpu / 1e6:7.2f} M/CPU-s {wall / 1e6:7.2f} M/s "
                f"({r[wall_key]:6.1f} s wall, {n / cpu:6.1f} CPU s)")

    ratio = r["e2e_cpu_s"] / max(r["scan_cpu_s"], 1e-9)
    return [
        f"{r['shape']} — {n:,} events, {r['loss_claims']:,} loss_claims rows "
        + ("(traces reused)" if r.get("reused") else f"(generated in {r.get('gen_s', 0):.0f} s)"),
        f"  bare scan (pass columns)     {rate('scan', 'scan_s')}  (pyarrow, sealed Parquet, "
        f"{len(labels.PASS_COLUMNS)} columns)",
        f"  read (loader alone)          {rate('loader', 'read_s')}",
        f"  read into the audit          {rate('import', 'import_s')}  (checked; events = a "
        "view over the Parquet files)",
        f"  labelling pass alone         {rate('pass', 'pass_s')}  (stage {core.PASS_STAGE})",
        f"  label (read + 01-04)         {n / r['label_s'] / 1e6:7.2f} M/s ({r['label_s']:6.1f} s"
        " wall)",
        f"  all tables (read + 01-08)    {rate('all', 'all_s')}",
        f"  end to end (+ Parquet)       {rate('e2e', 'e2e_s')}",
        f"  end to end / bare scan       {ratio:5.1f}x CPU, "
        f"{r['e2e_s'] / max(r['scan_s'], 1e-9):5.1f}x wall",
        f"  plain-Python replay          {py_rate(r) / 1e6:7.2f} M/CPU-s "
        f"{r['py_events'] / r['py_s'] / 1e6:7.2f} M/s on {r['py_events']:,} events "
        f"({r['runs_replayed']} run(s))  -> end to end = {rt['e2e'][0] / py_rate(r):5.1f}x python "
        "(CPU)",
        f"  peak RSS                     {r['rss_mib']:,.0f} MiB "
        f"(before reading, after a 20 k-event warm-up audit: {r['rss_gen_mib']:,.0f} MiB; "
        "generated in a child process)",
        f"  pass held, most at once      {r['held']['hashes']:,} content hashes, "
        f"{r['held']['instances']:,} claim instances (labels.HELD)",
        "  labels check                 "
        + (f"OK: {r['checked']:,} losses agree" if not r["n_mismatches"] else
           f"MISMATCH: {r['n_mismatches']:,} of {r['checked']:,}, e.g. {r['mismatches']}"),
        f"  labels                       {r['labels']}",
        f"  per stage (wall s)           {r['stages']}",
        f"  per stage (CPU s)            {r['stages_cpu']}",
        f"  03_pass parts (s)            {r['pass_parts']}  (input: Parquet -> coded Arrow "
        "windows; loop: the compiled pass; outputs: state kept, outputs as Arrow; write: as "
        "Parquet; disjoint)",
        *targets(r),
    ]


def summary_row(r: dict[str, Any]) -> list[str]:
    """One result as a row of the docs table (``SUMMARY_HEADER``)."""
    n = r["events"]
    rt = rates(r)
    check = (f"{r['checked']:,} agree" if not r["n_mismatches"] else
             f"MISMATCH {r['n_mismatches']:,} of {r['checked']:,}")
    return [r["shape"], f"{n / 1e6:.2f} M",
            *(f"{rt[k][0] / 1e6:.2f} / {rt[k][1] / 1e6:.2f}"
              for k in ("scan", "loader", "pass", "all", "e2e")),
            f"{r['e2e_cpu_s'] / max(r['scan_cpu_s'], 1e-9):.1f}x",
            f"{py_rate(r) / 1e6:.2f}", f"{rt['e2e'][0] / py_rate(r):.1f}x",
            f"{r['rss_mib'] / 1024:.2f} GiB", check]


SUMMARY_HEADER = ["shape", "events", "bare scan, M ev/CPU-s / M ev/s",
                  "checked loader", "pass alone", "all tables", "end to end (+ Parquet)",
                  "e2e / scan (CPU)", "plain-Python replay, M ev/CPU-s", "e2e / replay",
                  "peak RSS", "labels cross-check"]
TARGETS_NOTE = ("Targets (issue 28, CPU terms): end to end >= "
                f"{TARGET_E2E_RATE / 1e6:.0f} M events per CPU-second, "
                f"<= {TARGET_SCAN_RATIO:.0f}x the bare scan's CPU, "
                f">= {TARGET_PY_RATIO:.0f}x the plain-Python replay. CPU: user + system of the "
                "process and its children, all threads.")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=_sizes, default=[10_000_000],
                    help="events per shape; several sizes, comma-separated, also state how the "
                         "CPU per event grows from each size to the next")
    ap.add_argument("--shapes", default=",".join(SHAPES),
                    help="comma-separated; a run of fewer than all writes its sections under "
                         "names of their own (reconstruct.SIZE.SHAPES, reconstruct.growth.SHAPES),"
                         " so that it never replaces the figures of every shape")
    ap.add_argument("--memory-limit", default="2GB")
    ap.add_argument("--python-events", type=int, default=1_000_000,
                    help="events the plain-Python replay runs on (its rate is per event)")
    ap.add_argument("--out-of-core", action="store_true",
                    help="opt-in: 1 B dense events, memory_limit 2GB (hours of both cores; "
                         "11 GB of traces; the audit's disk: benchmarks/audit_disk.py)")
    ap.add_argument("--work", metavar="DIR", help="work directory (default: a temporary one)")
    ap.add_argument("--traces", metavar="DIR",
                    help="keep the generated traces in DIR and reuse them in later runs of the "
                         "same shape and size (default: generate per run, then delete)")
    ap.add_argument("--generate-only", action="store_true",
                    help="with --traces: generate the traces (if not there yet) and stop")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--gen", help=argparse.SUPPRESS)
    ap.add_argument("--json-out", help=argparse.SUPPRESS)
    _report.add_doc_option(ap)
    args = ap.parse_args(argv)
    if args.out_of_core:
        args.events, args.shapes = [1_000_000_000], "dense"
    if (args.one or args.gen) and len(args.events) != 1:
        ap.error("one size per child")

    if args.gen:
        paths, n = write_shape(Path(args.work), args.gen, args.events[0])
        Path(args.json_out).write_text(json.dumps({"paths": [str(p) for p in paths],
                                                   "events": n}))
        return 0

    if args.one:
        if args.work:
            Path(args.work).mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f"kvclaims-bench-{args.one}-", dir=args.work))
        try:
            res = run_one(args.one, args.events[0], args.memory_limit, args.python_events, work,
                          Path(args.traces) if args.traces else None)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        Path(args.json_out).write_text(json.dumps(res))
        return 0

    if args.generate_only:
        if not args.traces:
            ap.error("--generate-only needs --traces DIR")
        for shape, size in ((sh, sz) for sz in args.events for sh in args.shapes.split(",")):
            paths, n, reused = kept_traces(Path(args.traces), shape, size)
            print(f"{shape}: {n:,} events in {', '.join(map(str, paths))}"
                  + (" (already there)" if reused else ""))
        return 0

    by_size = []
    for size in args.events:
        results = _run_shapes(args, size)
        if results is None:
            return 1
        by_size.append(results)
        print(f"\n{os.cpu_count()} CPUs, DuckDB memory_limit {args.memory_limit}\n")
        for r in results:
            print("\n".join(fmt(r)))
            print()
        details = [line for r in results for line in fmt(r)]
        # NOTE: a section per trace size, so a 100 M run does not replace the 10 M figures
        _report.write_section(
            section_name(f"reconstruct.{_size_name(size)}", args.shapes.split(",")),
            _report.markdown_table(SUMMARY_HEADER, [summary_row(r) for r in results])
            + f"\n\n{TARGETS_NOTE}\n\nDuckDB memory_limit {args.memory_limit}; per shape:\n\n"
            + _report.preformatted(details), args.doc, script=__file__)
    if len(by_size) > 1:
        rows = growth_rows(by_size)
        print("\n".join(" | ".join(row) for row in [GROWTH_HEADER, *rows]))
        _report.write_section(
            section_name("reconstruct.growth", args.shapes.split(",")),
            _report.markdown_table(GROWTH_HEADER, rows)
            + f"\n\nTarget (issue 28): CPU per event at 10x the events at most "
            f"{TARGET_GROWTH}x (10 M -> 100 M: at most {10 * TARGET_GROWTH:.0f}x the CPU); "
            f"peak RSS at most {TARGET_PEAK_GIB:.0f} GiB at "
            f"{TARGET_PEAK_EVENTS // 1_000_000} M events. DuckDB memory_limit "
            f"{args.memory_limit}.", args.doc, script=__file__)
    return 0 if all(r["n_mismatches"] == 0 for rs in by_size for r in rs) else 1


def section_name(name: str, shapes: list[str]) -> str:
    """docs/benchmarks.md's section ``name`` for a run of ``shapes``: one of its own
    (``name.SHAPES``) unless the run covers every shape."""
    return name if set(shapes) >= set(SHAPES) else f"{name}.{'+'.join(shapes)}"


def _sizes(text: str) -> list[int]:
    """``--events``: one size or several, comma-separated, ascending."""
    try:
        sizes = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected sizes such as 10000000 or "
                                         "10000000,100000000") from None
    if not sizes or min(sizes) < 1 or sizes != sorted(set(sizes)):
        raise argparse.ArgumentTypeError(f"{text!r}: sizes must be positive and ascending")
    return sizes


def _size_name(size: int) -> str:
    return f"{size // 1_000_000}M" if size >= 1_000_000 else str(size)


def _run_shapes(args: argparse.Namespace, size: int) -> list[dict[str, Any]] | None:
    """Every shape at ``size`` events, each in its own child process (None if one failed)."""
    results = []
    for shape in args.shapes.split(","):
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            cmd = [sys.executable, __file__, "--one", shape, "--events", str(size),
                   "--memory-limit", args.memory_limit, "--python-events",
                   str(args.python_events), "--json-out", out.name]
            if args.work:
                cmd += ["--work", args.work]
            if args.traces:
                cmd += ["--traces", str(Path(args.traces).resolve())]
            if subprocess.run(cmd, check=False).returncode != 0:
                print(f"{shape}: failed", file=sys.stderr)
                return None
            res = json.loads(Path(out.name).read_text())
            res["requested"] = size
            results.append(res)
    return results


GROWTH_HEADER = ["shape", "from", "to", "events ×", "end-to-end CPU ×", "CPU per event ×",
                 "fastest-growing stage (CPU ×)", "peak RSS (to)", "target"]


def growth_rows(by_size: list[list[dict[str, Any]]]) -> list[list[str]]:
    """Per shape, from each size to the next: how events, CPU and CPU per event grow."""
    rows = []
    for small, large in zip(by_size, by_size[1:]):
        for a, b in zip(small, large):
            ev = b["events"] / a["events"]
            cpu = b["e2e_cpu_s"] / max(a["e2e_cpu_s"], 1e-9)
            per_event = cpu / ev
            # NOTE: among the stages with at least 2% of the CPU (a tiny stage's ratio is noise)
            stage, grew = max(((k, b["stages_cpu"][k] / max(v, 1e-9))
                               for k, v in a["stages_cpu"].items()
                               if v >= 0.02 * a["e2e_cpu_s"]), key=lambda kv: kv[1])
            ok = per_event <= TARGET_GROWTH
            rows.append([a["shape"], f"{a['events'] / 1e6:.2f} M", f"{b['events'] / 1e6:.2f} M",
                         f"{ev:.1f}x", f"{cpu:.1f}x", f"{per_event:.2f}x",
                         f"{stage} ({grew:.1f}x)", f"{b['rss_mib'] / 1024:.2f} GiB",
                         "met" if ok else f"MISSED by {per_event / TARGET_GROWTH:.2f}x"])
    return rows


if __name__ == "__main__":
    sys.exit(main())
