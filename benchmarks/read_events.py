"""What reading a trace costs: the IPC segments (crash-safe path) vs the sealed Parquet file.

    python benchmarks/read_events.py [--events N] [--batch N] [--repeat R]

Writes one run of N events (default 2,000,000; the recorder_cost block-event mix) with
``RunWriter`` in batches of ``--batch`` events (the recorder's default flush size), closes it
(which seals it into ``events.parquet``), then prints side by side, best of ``--repeat``:

- floor: pyarrow alone decoding the segments (no checks) and reading the Parquet file;
- ``iter_batches(sealed=False)``: the loader over the IPC segments (framing scan, CRC of every
  batch group, decode, validation, value ranges, dictionary decode, seq checks);
- ``iter_batches()``: the loader over the sealed Parquet file (page checksums, value ranges,
  seq checks);
- the ratio, and the bytes on disk of each form.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from benchmarks import _report  # noqa: E402
from benchmarks.recorder_cost import workload  # noqa: E402
from kvclaims.recorder.buffer import pending_to_batch  # noqa: E402
from kvclaims.contract.trace_writer import SEALED_NAME, RunWriter  # noqa: E402
from kvclaims.reconstruct.loader import iter_batches  # noqa: E402


def write_run(run: Path, n: int, batch: int) -> tuple[float, float]:
    """Write n events in batches of ``batch``; return (seconds writing, seconds sealing).

    The batches are converted before the clock starts: this measures the writer, not the
    recorder's conversion (benchmarks/recorder_cost.py measures that)."""
    events = workload(min(n, 200_000))
    batches = []
    for start in range(0, n, batch):
        stop = min(start + batch, n)
        chunk = [events[i % len(events)] for i in range(start, stop)]
        pending = (list(range(start, stop)), list(range(start, stop)),
                   [e for e, _ in chunk], [f for _, f in chunk])
        batches.append(pending_to_batch(pending, "bench-read"))
    t0 = time.perf_counter()
    writer = RunWriter(run, {"run_id": "bench-read"})  # keyed hashes, as recorded by default
    for b in batches:
        writer.write_batch(b)
    t1 = time.perf_counter()
    writer.close()
    return t1 - t0, time.perf_counter() - t1


def best(fn: Callable[[], int], repeat: int) -> tuple[float, int]:
    times, rows = [], 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        rows = fn()
        times.append(time.perf_counter() - t0)
    return min(times), rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=2_000_000)
    ap.add_argument("--batch", type=int, default=65536)
    ap.add_argument("--repeat", type=int, default=3)
    _report.add_doc_option(ap)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="kvclaims-read-"))
    try:
        run = tmp / "run"
        wrote, sealed_s = write_run(run, args.events, args.batch)
        segs = sorted(run.glob("events-*.arrows"))
        ipc_bytes = sum(p.stat().st_size for p in segs)
        pq_bytes = (run / SEALED_NAME).stat().st_size

        def floor_ipc() -> int:
            rows = 0
            for p in segs:
                with pa.memory_map(str(p)) as src:
                    for b in pa.ipc.open_stream(src):
                        rows += b.num_rows
            return rows

        def floor_parquet() -> int:
            return sum(b.num_rows for b in
                       pq.ParquetFile(str(run / SEALED_NAME), pre_buffer=False).iter_batches(
                           batch_size=65536))

        def loader(sealed: bool) -> Callable[[], int]:
            return lambda: sum(b.num_rows for b in iter_batches([run], sealed=sealed))

        rows = [("pyarrow floor: IPC segments", *best(floor_ipc, args.repeat), ipc_bytes),
                ("pyarrow floor: sealed Parquet", *best(floor_parquet, args.repeat), pq_bytes),
                ("loader: IPC segments (checked)", *best(loader(False), args.repeat), ipc_bytes),
                ("loader: sealed Parquet (checked)", *best(loader(True), args.repeat),
                 pq_bytes)]
        head = (f"{args.events:,} events in batches of {args.batch:,}: writer (keyed hashes, "
                f"CRC, zstd) {args.events / wrote / 1e6:.2f} M events/s; sealing at close "
                f"{sealed_s:.2f} s ({args.events / sealed_s / 1e6:.2f} M events/s)")
        print(head)
        print(f"{'path':<36}{'seconds':>9}{'M events/s':>12}{'MiB':>8}")
        for name, secs, n, size in rows:
            assert n == args.events, (name, n)
            print(f"{name:<36}{secs:>9.3f}{n / secs / 1e6:>12.2f}{size / 2**20:>8.1f}")
        ipc, par = rows[2][1], rows[3][1]
        tail = f"sealed Parquet vs IPC segments through the loader: {ipc / par:.1f}x faster"
        print(tail)
        table = _report.markdown_table(
            ["path", f"seconds (best of {args.repeat})", "M events/s", "MiB"],
            [(name, f"{secs:.3f}", f"{n / secs / 1e6:.2f}", f"{size / 2**20:.1f}")
             for name, secs, n, size in rows])
        _report.write_section("read_events", f"{head}\n\n{table}\n\n{tail}", args.doc,
                              script=__file__)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
