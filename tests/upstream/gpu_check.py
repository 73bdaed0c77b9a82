"""The GPU check (issue 9): run on a machine with an NVIDIA GPU and a CUDA build of vLLM 0.32.

Run from the repository root: ``python tests/upstream/gpu_check.py [--skip-upstream]``. Needs no
network if ``KVCLAIMS_CACHE`` holds ``vllm-sdist/vllm-0.32.0`` (made here by
``tests/upstream/vllm_upstream.py``; copy it along) and ``KVCLAIMS_MODEL_DIR`` (or
``~/.cache/kvclaims/tiny-llama``) is writable: the tiny model is built locally from a config.

Checks, each printed PASS/FAIL with its figures; exit 1 if any fails:

1. ``--scheduler-cls kvclaims.recorder.scheduler.KVClaimsScheduler`` with nothing else set: vLLM resolves
   async scheduling on, and the engine's scheduler is the recorder over ``AsyncScheduler``;
2. the same multi-turn workload on vLLM's own ``AsyncScheduler`` and on the recorder (``native``)
   gives every request the same ``num_cached_tokens``, finish reason and output length;
3. the recorder's scheduler CPU time over vLLM's (``hard_protected`` with claims too), per event;
4. ``tests/test_async_scheduler.py`` (the composition test) passes;
5. vLLM's own ``tests/v1/core``: every test passing with vLLM's classes passes with the
   recorder's (more of them run on a GPU than on the CPU build).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

FAILED: list[str] = []


def report(name: str, ok: bool, detail: str) -> None:
    """One PASS/FAIL line."""
    print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}", flush=True)
    if not ok:
        FAILED.append(name)


def check_async_kept(tmp: Path) -> None:
    """1: the recorder named as --scheduler-cls keeps vLLM's async scheduling."""
    from vllm import EngineArgs, LLMEngine
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    from kvclaims.sources.scenarios import engine_args
    from kvclaims.recorder.scheduler import KVClaimsAsyncScheduler
    from kvclaims.sources.tiny_model import ensure_tiny_model

    args = engine_args(ensure_tiny_model(), 120, {"out": str(tmp / "async-kept")})
    engine = LLMEngine.from_engine_args(EngineArgs(**args))
    try:
        core = engine.engine_core.engine_core
        scheduler = core.scheduler
        on = bool(engine.vllm_config.scheduler_config.async_scheduling)
        report("async scheduling kept", on and isinstance(scheduler, AsyncScheduler)
               and isinstance(scheduler, KVClaimsAsyncScheduler),
               f"async_scheduling={on}, scheduler={type(scheduler).__name__}, "
               f"batch_queue={getattr(core, 'batch_queue', None) is not None}")
    finally:
        engine.engine_core.shutdown()


def check_workload(tmp: Path) -> None:
    """2 and 3: same client view as vLLM's AsyncScheduler; the scheduler CPU cost."""
    import recorder_overhead as bench

    phases, usable = bench.multiturn_shape()
    runs = {c: bench.run_engine(c, phases, usable, tmp / c, async_scheduling=True)
            for c in ("plain", "native", "hard")}
    plain, native = runs["plain"], runs["native"]
    report("num_cached_tokens plain == native (async)",
           plain["cached"] == native["cached"] and plain["finish"] == native["finish"],
           f"{len(plain['cached'])} requests, {sum(plain['cached'].values()):,} cached tokens")
    for config in ("native", "hard"):
        r = runs[config]
        per_event = (r["cpu_s"] - plain["cpu_s"]) / max(r["events"], 1) * 1e6
        print(f"      {config}: scheduler CPU {r['cpu_s']:.3f} s vs plain "
              f"{plain['cpu_s']:.3f} s (x{r['cpu_s'] / plain['cpu_s']:.2f}), "
              f"{r['events']:,} events, {per_event:.2f} µs/event", flush=True)


def check_pytest(args: list[str], name: str) -> None:
    """4 and 5: a test run in a fresh interpreter."""
    proc = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, check=False)
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-12:]
    report(name, proc.returncode == 0, "\n      " + "\n      ".join(tail))


def main(argv: list[str] | None = None) -> int:
    """Run the checks; exit 1 if any fails, 2 without a GPU."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-upstream", action="store_true", help="skip check 5 (slowest)")
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("error: no CUDA device: this check is for a GPU machine", file=sys.stderr)
        return 2
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    print(f"device: {torch.cuda.get_device_name(0)}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        check_async_kept(Path(tmp))
        check_workload(Path(tmp))
    check_pytest(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_async_scheduler.py"],
                 "async composition test")
    if not args.skip_upstream:
        check_pytest([str(HERE / "vllm_upstream.py")], "vLLM's tests/v1/core with the recorder")
    print(f"{len(FAILED)} failed: {', '.join(FAILED)}" if FAILED else "all GPU checks passed")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
