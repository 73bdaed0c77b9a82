"""Fuzzing the CLI door: hostile segments, manifests, JSON Lines and prototype telemetry.

Each case mutates a real input, runs ``kvclaims.cli.main([...])`` in-process (stdout/stderr
captured, a wall-clock bound per case) and checks the contract of docs/guarantees.md:

- no uncaught exception, no hang: ``main`` returns 0, 2 or 3 within the bound;
- a refusal (2) is one line ``kvclaims CMD: error: ...`` and no traceback;
- a partial result (3) says so on stderr;
- an accepted mutation (0) is harmless: the events read back are exactly the original ones
  (segments, manifests) or exactly what the mutated file says (JSON Lines).

``KVCLAIMS_FUZZ_CASES`` (default 10000, split across the four families) and
``KVCLAIMS_FUZZ_SEED`` scale and vary it; a failure message names the seed and case.

Two more families (issue 26) have their own counts: ``KVCLAIMS_FUZZ_SEALED_CASES`` (default
200; 10000 takes minutes) mutates the sealed ``events.parquet`` of a run, half the cases in
its footer (every case exports exactly the original events: the checksum sends a changed
file to the segments), and ``KVCLAIMS_FUZZ_FRAME_CASES`` (default 10000, a few seconds) feeds
mutated vLLM KV-event frames to the listener (no exception; every frame is applied or
counted; the run it writes always reads back).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import shutil
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from benchmarks.recorder_cost import workload
from kvclaims.cli import main
from kvclaims.recorder.buffer import EventBuffer
from kvclaims.contract.trace_writer import RunWriter

ROOT = Path(__file__).resolve().parents[1]
CASES = int(os.environ.get("KVCLAIMS_FUZZ_CASES", "10000"))
SEED = int(os.environ.get("KVCLAIMS_FUZZ_SEED", "0"))
CASE_SECONDS = 20.0
SHARES = {"segment": 0.3, "manifest": 0.35, "jsonl": 0.2, "prototype": 0.15}
SEALED_CASES = int(os.environ.get("KVCLAIMS_FUZZ_SEALED_CASES", "200"))
FRAME_CASES = int(os.environ.get("KVCLAIMS_FUZZ_FRAME_CASES", "10000"))


class Hang(BaseException):
    """A case ran past its bound (BaseException: the CLI door must not swallow it)."""


@contextlib.contextmanager
def bounded(seconds: float) -> Iterator[None]:
    def alarm(_sig: int, _frame: Any) -> None:
        raise Hang(f"case ran longer than {seconds} s")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def run_cli(args: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with bounded(CASE_SECONDS), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(args)
    return rc, out.getvalue(), err.getvalue()


def check_door(rc: int, err: str, command: str, case: str) -> None:
    """The exit status and stderr obey the error discipline."""
    assert rc in (0, 2, 3), f"{case}: exit status {rc}: {err[-500:]}"
    assert "Traceback" not in err, f"{case}: traceback on stderr: {err[-800:]}"
    if rc == 2:
        lines = err.strip().splitlines()
        assert lines and lines[-1].startswith(f"kvclaims {command}: error: "), f"{case}: {err}"
    if rc == 3:
        assert "partial result" in err, f"{case}: {err}"


def count(family: str) -> int:
    return max(1, int(CASES * SHARES[family]))


# -- inputs ------------------------------------------------------------------------------------

def record_run(run_dir: Path, compression: str | None) -> Path:
    """A real two-segment recording (realistic block events, many small batches); the
    compressed one is also sealed into events.parquet, the other is read from its segments."""
    writer = RunWriter(run_dir, {"run_id": "fz", "block_size": 32, "usable_blocks": 80,
                                 "policy": "native"}, compression=compression,
                       rotate_bytes=20_000, seal=compression is not None)
    buf = EventBuffer(writer, "fz", flush_interval_s=3600)
    for i, (name, fields) in enumerate(workload(60)):
        buf.emit(name, **fields)
        if i % 20 == 19:
            buf.flush()
    buf.close()
    return run_dir


def export(run_dir: Path) -> tuple[int, str, str]:
    """``kvclaims export RUN --format jsonl`` to stdout: (status, the JSON Lines, stderr)."""
    return run_cli(["export", str(run_dir), "--format", "jsonl"])


HOSTILE: list[Any] = [
    None, True, -1, 0, 2**31 - 1, 2**31, 2**40, 2**63, 2**64, -(2**63) - 1, 1.5, 1e308,
    "", "x" * 5000, "\u202e\x00<img src=x>", [], [1, "a"], {}, {"a": {"b": []}}, "NaN",
]
RAW_HOSTILE: list[str] = ["1e999", "-1e999", "9" * 5000, "[" * 3000 + "]" * 3000, "NaN",
                          "Infinity", '"\\ud800"', "{}", "[]"]


def mutate_bytes(rng: random.Random, data: bytes) -> bytes:
    buf = bytearray(data)
    kind = rng.randrange(7)
    if not buf:
        return bytes(rng.randbytes(rng.randrange(1, 64)))
    i = rng.randrange(len(buf))
    if kind == 0:
        for _ in range(rng.randint(1, 3)):
            j = rng.randrange(len(buf))
            buf[j] ^= 1 << rng.randrange(8)
    elif kind == 1:
        del buf[i:]
    elif kind == 2:
        del buf[i:i + rng.randint(1, 64)]
    elif kind == 3:
        buf[i:i] = rng.randbytes(rng.randint(1, 64))
    elif kind == 4:
        n = rng.randint(1, 64)
        buf[i:i + n] = bytes([rng.choice((0, 0xFF))]) * n
    elif kind == 5:
        j = rng.randrange(len(buf))
        buf[i:i] = buf[j:j + rng.randint(8, 512)]
    else:
        buf += rng.randbytes(rng.randint(1, 32))
    return bytes(buf)


# -- families ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def test_fuzzed_segments_are_refused_reported_or_harmless(work: Path) -> None:
    rng = random.Random(SEED)
    bases = {c: record_run(work / f"base-{c}", c) for c in (None, "zstd")}
    baselines = {}
    for c, base in bases.items():
        rc, baselines[c], err = export(base)
        assert rc == 0 and len(list(base.glob("events-*"))) >= 2, err
    run = work / "seg"
    for n in range(count("segment")):
        comp = "zstd" if n % 10 == 0 else None  # compressed cases cost more: a tenth of them
        shutil.rmtree(run, ignore_errors=True)
        shutil.copytree(bases[comp], run)
        segs = sorted(run.glob("events-*.arrows")) + sorted(run.glob("events.parquet"))
        action = rng.randrange(10)
        if action < 8:
            seg = rng.choice(segs)
            seg.write_bytes(mutate_bytes(rng, seg.read_bytes()))
        elif action == 8:
            rng.choice(segs).unlink()
        else:
            a, b = segs[0], segs[-1]
            da, db = a.read_bytes(), b.read_bytes()
            a.write_bytes(db)
            b.write_bytes(da)
        case = f"seed {SEED} segment case {n}"
        rc, got, err = export(run)
        check_door(rc, err, "export", case)
        if rc == 0:
            assert got == baselines[comp], f"{case}: accepted and changed the events"


def test_fuzzed_manifests_are_refused_reported_or_harmless(work: Path) -> None:
    rng = random.Random(SEED + 1)
    base = record_run(work / "mbase", None)
    rc, baseline, err = export(base)
    assert rc == 0, err
    manifest = json.loads((base / "manifest.json").read_text())
    run = work / "man"
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree(base, run)
    for n in range(count("manifest")):
        m = json.loads(json.dumps(manifest))
        target: dict[str, Any] = m
        if rng.random() < 0.3 and m["segments"]:
            target = rng.choice(m["segments"])
        key = rng.choice(sorted(target) + ["junk"])
        action = rng.randrange(4)
        if action == 0:
            target.pop(key, None)
            text = json.dumps(m)
        elif action == 1:
            target[key] = rng.choice(HOSTILE)
            text = json.dumps(m)
        elif action == 2:
            target[key] = "__RAW__"
            text = json.dumps(m).replace('"__RAW__"', rng.choice(RAW_HOSTILE))
        else:
            text = mutate_bytes(rng, json.dumps(m).encode()).decode("utf-8", "replace")
        (run / "manifest.json").write_text(text)
        case = f"seed {SEED} manifest case {n}: {key}"
        rc, got, err = export(run)
        check_door(rc, err, "export", case)
        if rc == 0:
            assert got == baseline, f"{case}: accepted and changed the events"


def _events_of(text: str) -> list[dict[str, Any]]:
    """What a JSON Lines file says, as comparable dicts (nulls dropped)."""
    out = []
    for line in text.splitlines():
        if line.strip():
            out.append({k: v for k, v in json.loads(line).items() if v is not None})
    return sorted(out, key=lambda e: (e["run_id"], e["seq"]))


def _mutate_json_lines(rng: random.Random, lines: list[str],
                       keys: Callable[[dict[str, Any]], list[str]]) -> list[str]:
    lines = list(lines)
    i = rng.randrange(len(lines))
    action = rng.randrange(8)
    if action <= 2:
        obj = json.loads(lines[i])
        key = rng.choice(keys(obj) + ["junk"])
        if action == 0:
            obj.pop(key, None)
            lines[i] = json.dumps(obj)
        elif action == 1:
            obj[key] = rng.choice(HOSTILE)
            lines[i] = json.dumps(obj)
        else:
            obj[key] = "__RAW__"
            lines[i] = json.dumps(obj).replace('"__RAW__"', rng.choice(RAW_HOSTILE))
    elif action == 3:
        lines.insert(i, lines[rng.randrange(len(lines))])
    elif action == 4:
        j = rng.randrange(len(lines))
        lines[i], lines[j] = lines[j], lines[i]
    elif action == 5:
        del lines[i]
    elif action == 6:
        lines[i] = lines[i][:rng.randrange(len(lines[i]) + 1)]
    else:
        lines[i] = mutate_bytes(rng, lines[i].encode()).decode("utf-8", "replace")
    return lines or ["{}"]


def test_fuzzed_json_lines_are_refused_or_imported_exactly(work: Path) -> None:
    rng = random.Random(SEED + 2)
    lines = (ROOT / "tests" / "fixtures" / "gap.jsonl").read_text().splitlines()
    src = work / "in.jsonl"
    for n in range(count("jsonl")):
        mutated = _mutate_json_lines(rng, lines, lambda o: sorted(o))
        src.write_text("\n".join(mutated) + "\n", encoding="utf-8")
        dest = work / "imp"
        shutil.rmtree(dest, ignore_errors=True)
        case = f"seed {SEED} jsonl case {n}"
        rc, _o, err = run_cli(["import", str(src), "--out", str(dest)])
        check_door(rc, err, "import", case)
        if rc == 0:
            # NOTE: 3 is fine here: e.g. a file without seq 0 imports, and reads as a hole
            rc2, got, err2 = export(dest)
            check_door(rc2, err2, "export", case)
            assert rc2 in (0, 3), f"{case}: imported but not readable: {err2}"
            assert _events_of(got) == _events_of(src.read_text()), \
                f"{case}: accepted and changed the events"


def test_fuzzed_prototype_telemetry_is_refused_or_imported_readably(work: Path) -> None:
    rng = random.Random(SEED + 3)
    lines = (ROOT / "traces" / "arbiter-prototype" / "native_80.jsonl").read_text() \
        .splitlines()[:30]
    src = work / "proto.jsonl"
    for n in range(count("prototype")):
        mutated = _mutate_json_lines(rng, lines, lambda o: sorted(o))
        src.write_text("\n".join(mutated) + "\n", encoding="utf-8")
        dest = work / "pimp"
        shutil.rmtree(dest, ignore_errors=True)
        case = f"seed {SEED} prototype case {n}"
        rc, _o, err = run_cli(["import", str(src), "--out", str(dest), "--from",
                               "arbiter-jsonl"])
        check_door(rc, err, "import", case)
        if rc == 0:
            rc2, _o, err2 = export(dest)
            assert rc2 == 0, f"{case}: imported but not readable: {err2}"
            summary = json.loads((dest / "manifest.json").read_text())["import_summary"]
            assert summary["input_events"] == sum(1 for ln in mutated if ln.strip())


def test_fuzzed_sealed_files_fall_back_to_the_segments_or_are_refused(work: Path) -> None:
    import struct

    rng = random.Random(SEED + 4)
    base = record_run(work / "sbase", "zstd")
    assert "sha256" in json.loads((base / "manifest.json").read_text())["sealed"]
    rc, baseline, err = export(base)
    assert rc == 0 and err == "", err
    original = (base / "events.parquet").read_bytes()
    footer = len(original) - 8 - struct.unpack("<I", original[-8:-4])[0]
    run = work / "sealed"
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree(base, run)
    for n in range(SEALED_CASES):
        data = bytearray(original)
        if n % 2:   # half the cases land in the footer (statistics, offsets, schema)
            i = rng.randrange(footer, len(data))
            data[i] ^= 1 << rng.randrange(8)
            mutated = bytes(data)
        else:
            mutated = mutate_bytes(rng, original)
        (run / "events.parquet").write_bytes(mutated)
        case = f"seed {SEED} sealed case {n}"
        rc, got, err = export(run)
        check_door(rc, err, "export", case)
        assert rc == 0 and got == baseline, f"{case}: accepted and changed the events"
        if mutated != original:
            assert "sealed copy unusable" in err, f"{case}: a changed file was used: {err}"


def _frames() -> list[list[bytes]]:
    """Realistic vLLM KV-event frames: tagged maps and positional arrays, stored with tokens
    and parents, removed, cleared, another medium."""
    import msgspec

    enc = msgspec.msgpack.encode
    stored = {"type": "BlockStored", "block_hashes": [11, 12, 13], "parent_block_hash": None,
              "token_ids": list(range(48)), "block_size": 16, "lora_id": None,
              "medium": "GPU"}
    batches = [
        [1000.0, [stored], 0],
        [1000.5, [["BlockStored", [14, 15], 13, list(range(32)), 16, None, "GPU"]], 0],
        [1001.0, [{"type": "BlockRemoved", "block_hashes": [12, 15], "medium": "GPU"}], 0],
        [1001.5, [{"type": "BlockRemoved", "block_hashes": [99], "medium": "CPU"}], None],
        [1002.0, [["AllBlocksCleared"]], 0],
        {"ts": 1002.5, "events": [stored], "data_parallel_rank": 0},
    ]
    return [[b"", i.to_bytes(8, "big"), enc(b)] for i, b in enumerate(batches)]


def _mutate_frame(rng: random.Random, frames: list[list[bytes]]) -> list[Any]:
    import msgspec

    topic, seq, payload = rng.choice(frames)
    action = rng.randrange(6)
    if action == 0:
        payload = mutate_bytes(rng, payload)
    elif action == 1:
        seq = mutate_bytes(rng, seq)
    elif action == 2:   # one field of the batch or of an event gets a hostile value
        obj = msgspec.msgpack.decode(payload)
        target = obj
        if isinstance(obj, list) and obj[1] and rng.random() < 0.6:
            target = obj[1][0]
        if isinstance(target, dict):
            target[rng.choice(sorted(target) + ["junk"])] = rng.choice(HOSTILE + [
                float("inf"), float("nan"), -1e300, 2**64 - 1, b"\x00" * 9])
        else:
            target[rng.randrange(len(target))] = rng.choice(HOSTILE + [float("inf"),
                                                                       2**64 - 1])
        try:
            payload = msgspec.msgpack.encode(obj)
        except (TypeError, OverflowError, msgspec.EncodeError):
            payload = mutate_bytes(rng, payload)
    elif action == 3:
        seq = rng.choice([b"\xff" * 8, (2**62).to_bytes(8, "big"), b"\x00" * 7, b""])
    elif action == 4:
        return rng.choice([[topic, seq], [topic, seq, payload, b""], [], [payload]])
    return [topic, seq, payload]


def test_fuzzed_listener_frames_are_applied_or_counted_never_raised(work: Path) -> None:
    from kvclaims.reconstruct.loader import load_runs
    from kvclaims.sources import kv_events as kv

    rng = random.Random(SEED + 5)
    frames = _frames()
    per_run = 500
    for start in range(0, FRAME_CASES, per_run):
        out = work / f"listen-{start}"
        shutil.rmtree(out, ignore_errors=True)
        run = kv.ObservedRun(out, kv.run_info("fz-listen"), clock=lambda: 0)
        lis = kv.Listener(run, kv.Translator(), wall0=999 * 10**9, mono0=0,
                          warn=lambda _m: None)
        fed = 0
        for n in range(start, min(start + per_run, FRAME_CASES)):
            msg = frames[n % len(frames)] if n % 4 == 0 else _mutate_frame(rng, frames)
            with bounded(CASE_SECONDS):
                lis.on_frames(msg, (1000 + n) * 10**9)
            fed += 1
        summary = lis.close((1000 + FRAME_CASES) * 10**9)
        handled = sum(summary[k] for k in ("batches", "undecodable", "malformed_frames",
                                           "oversized_frames", "foreign_topic"))
        case = f"seed {SEED} frame cases {start}..{start + fed - 1}"
        assert handled == fed, f"{case}: {fed} frames, {handled} applied or counted"
        load_runs([out])   # the run it wrote reads back (raises TraceError otherwise)


def test_the_door_catches_what_the_fuzzer_is_looking_for(work: Path) -> None:
    """Negative twin: an input the door must refuse is refused, not accepted silently."""
    src = work / "bad.jsonl"
    src.write_text('{"run_id": "r", "seq": 0, "ts_ns": 1, "event": "no_such_event"}\n')
    rc, _o, err = run_cli(["import", str(src), "--out", str(work / "bad-out")])
    assert rc == 2 and err.startswith("kvclaims import: error: ")


# -- the door, one behaviour at a time -----------------------------------------------------------

def _small_run(work: Path) -> Path:
    run = work / "small"
    if not run.exists():
        record_run(run, None)
    return run


def test_stdout_closed_early_exits_quietly(work: Path) -> None:
    import subprocess
    import sys

    run = _small_run(work)
    proc = subprocess.run(
        f"{sys.executable} -m kvclaims.cli export {run} --format jsonl | head -c 10",
        shell=True, capture_output=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout and proc.stderr == b""


def test_an_interrupt_is_status_130_without_a_traceback(
        work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kvclaims.sources import jsonl

    def interrupted(*_a: object, **_k: object) -> None:
        signal.raise_signal(signal.SIGINT)  # a real SIGINT, as Ctrl-C sends

    monkeypatch.setattr(jsonl, "import_jsonl", interrupted)
    rc, _o, err = run_cli(["import", str(ROOT / "tests/fixtures/gap.jsonl"),
                           "--out", str(work / "int")])
    assert rc == 130 and "Traceback" not in err and "interrupted" in err


def test_an_output_directory_that_cannot_be_written_is_one_line(work: Path) -> None:
    rc, _o, err = run_cli(["import", str(ROOT / "tests/fixtures/gap.jsonl"),
                           "--out", "/proc/kvclaims-cannot-write-here/run"])
    assert rc == 2 and err.count("\n") == 1 and "/proc/kvclaims-cannot-write-here" in err


def test_an_unreadable_input_path_is_one_line() -> None:
    rc, _o, err = run_cli(["export", "/proc/1", "--format", "jsonl"])
    assert rc == 2 and err.startswith("kvclaims export: error: /proc/1")


def test_debug_shows_the_traceback_the_default_hides(work: Path) -> None:
    args = ["export", str(work / "no-such-run"), "--format", "jsonl"]
    rc, _o, err = run_cli(args)
    rc_debug, _o, err_debug = run_cli(["--debug"] + args)
    assert rc == rc_debug == 2
    assert "Traceback" not in err and "Traceback" in err_debug


def test_a_partial_result_is_status_3(work: Path) -> None:
    run = work / "partial"
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree(_small_run(work), run)
    seg = sorted(run.glob("events-*.arrows"))[-1]
    seg.write_bytes(seg.read_bytes()[:-100])
    rc, _o, err = run_cli(["export", str(run), "--format", "jsonl"])
    assert rc == 3 and "partial result" in err
    rc_ok, _o, err_ok = run_cli(["export", str(_small_run(work)), "--format", "jsonl"])
    assert rc_ok == 0 and err_ok == ""
