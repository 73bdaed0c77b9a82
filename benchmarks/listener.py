"""How fast ``kvclaims listen`` keeps up with vLLM's KV-event publisher (loopback only, bounded).

Three figures, side by side:

1. **processing**: pre-encoded payloads fed straight to the ``Listener`` (decode + translate +
   Arrow write), no sockets: the ceiling of the processing thread;
2. **flood**: a raw ZMQ PUB in another process sends the same frames as it can over
   loopback to the listener's SUB (receive thread + processing thread); batches the listener
   could not take show up as lost publisher seqs (recorder_gap), never as a stall upstream;
3. **paced**: the same at fixed rates, to find the highest rate sustained with no loss.

The batch shape: one ``BlockStored`` of ``--blocks`` blocks (with their token ids, as vLLM
sends them) and one ``BlockRemoved`` of as many, i.e. 2 x blocks block events per batch.

    python benchmarks/listener.py [--batches 20000] [--blocks 16] [--rates 2000,5000,10000]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import random
import socket
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import msgspec  # noqa: E402

from benchmarks import _report  # noqa: E402
from kvclaims.sources import kv_events as kv  # noqa: E402

BS = 32


def make_payloads(n: int, blocks: int, seed: int = 7) -> list[bytes]:
    """Batch i stores a fresh chain and removes the chain stored 4 batches earlier."""
    rnd = random.Random(seed)
    chains = [[rnd.getrandbits(64) for _ in range(blocks)] for _ in range(n)]
    tokens = [rnd.randrange(500) for _ in range(blocks * BS)]
    out = []
    for i in range(n):
        events: list = [{"type": "BlockStored", "block_hashes": chains[i],
                         "parent_block_hash": None, "token_ids": tokens, "block_size": BS,
                         "lora_id": None, "medium": "GPU", "lora_name": None}]
        if i >= 4:
            events.append({"type": "BlockRemoved", "block_hashes": chains[i - 4],
                           "medium": "GPU"})
        out.append(msgspec.msgpack.encode([time.time(), events, 0]))
    return out


def _listener(out: Path) -> kv.Listener:
    run = kv.ObservedRun(out, kv.run_info(out.name))
    return kv.Listener(run, kv.Translator(None), warn=lambda m: None)


def bench_processing(payloads: list[bytes], tmp: Path) -> dict[str, float]:
    lis = _listener(tmp / "processing")
    t0 = time.perf_counter()
    for seq, data in enumerate(payloads):
        lis.on_frames([b"", seq.to_bytes(8, "big"), data], 0)
    lis.run.flush()
    dt = time.perf_counter() - t0
    s = lis.close()
    return {"batches_s": s["batches"] / dt, "kv_events_s": s["events"] / dt,
            "block_events_s": (s["blocks_stored"] + s["blocks_removed"]) / dt, "lost": 0}


def _publisher(port: int, payloads: list[bytes], rate: float, ready: mp.Event) -> None:
    import zmq

    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.SNDHWM, 100_000)  # vLLM's default hwm
    pub.connect(f"tcp://127.0.0.1:{port}")
    ready.wait(10)
    time.sleep(0.5)  # the subscription reaches the PUB
    t0 = time.perf_counter()
    for seq, data in enumerate(payloads):
        if rate:
            wait = t0 + seq / rate - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
        pub.send_multipart([b"", seq.to_bytes(8, "big"), data])
    time.sleep(0.2)
    pub.close(linger=2000)
    ctx.term()


def bench_socket(payloads: list[bytes], tmp: Path, rate: float, name: str) -> dict[str, float]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    src = kv.ZmqSource(f"tcp://127.0.0.1:{port}", bind=True)
    lis = _listener(tmp / name)
    ready = mp.Event()
    proc = mp.get_context("fork").Process(target=_publisher, args=(port, payloads, rate, ready))
    proc.start()
    ready.set()
    t0 = None
    last = time.perf_counter()
    n = len(payloads)
    deadline = time.perf_counter() + 60
    while time.perf_counter() < deadline:
        items = src.get(0.2)
        if items and t0 is None:
            t0 = time.perf_counter()
        for frames, wall in items:
            lis.on_frames(frames, wall)
        if items:
            last = time.perf_counter()
        if lis.expected == n or (not proc.is_alive() and not items
                                 and time.perf_counter() - last > 1.0):
            break
    lis.run.flush()
    dt = max(last - (t0 or last), 1e-9)
    proc.join(5)
    src.close()
    s = lis.close()
    # NOTE: seqs never received after the last one are lost too (the tail)
    lost = s["batches_lost"] + (n - (lis.expected or 0))
    return {"batches_s": s["batches"] / dt, "kv_events_s": s["events"] / dt,
            "block_events_s": (s["blocks_stored"] + s["blocks_removed"]) / dt, "lost": lost}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=20000)
    ap.add_argument("--blocks", type=int, default=16, help="blocks stored (and removed) per batch")
    ap.add_argument("--rates", default="2000,5000,10000", help="paced rates, batches/s")
    _report.add_doc_option(ap)
    args = ap.parse_args()
    payloads = make_payloads(args.batches, args.blocks)
    head = (f"{args.batches} batches, {2 * args.blocks} block events each "
            f"({sum(map(len, payloads)) / len(payloads):.0f} bytes/batch)")
    print(head, flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        rows.append(("processing (no socket)", bench_processing(payloads, t)))
        print("  processing done", flush=True)
        rows.append(("flood (PUB as it can)", bench_socket(payloads, t, 0, "flood")))
        print("  flood done", flush=True)
        for rate in [float(r) for r in args.rates.split(",") if r]:
            sub = payloads[: max(1000, min(len(payloads), int(rate * 3)))]
            rows.append((f"paced {rate:.0f} batches/s", bench_socket(sub, t, rate, f"p{rate}")))
            print(f"  paced {rate:.0f} done", flush=True)
    base = rows[0][1]["block_events_s"]
    print(f"\n{'mode':<32} {'batches/s':>10} {'KV events/s':>12} {'block ev/s':>11} "
          f"{'lost':>6} {'vs processing':>14}")
    for name, r in rows:
        print(f"{name:<32} {r['batches_s']:>10.0f} {r['kv_events_s']:>12.0f} "
              f"{r['block_events_s']:>11.0f} {r['lost']:>6} "
              f"{r['block_events_s'] / base:>13.2f}x")
    table = _report.markdown_table(
        ["mode", "batches/s", "KV events/s", "block events/s", "lost", "vs processing"],
        [(name, f"{r['batches_s']:,.0f}", f"{r['kv_events_s']:,.0f}",
          f"{r['block_events_s']:,.0f}", r["lost"], f"{r['block_events_s'] / base:.2f}x")
         for name, r in rows])
    _report.write_section("listener", f"{head}, loopback\n\n{table}", args.doc,
                          script=__file__)


if __name__ == "__main__":
    main()
