"""End to end on real vLLM: one OpenAI server (CPU build, tiny model) publishes its KV events on
loopback *and* records in-engine; ``kvclaims listen`` records the same engine from the outside.
The observed run's labels for the claimed blocks must match the in-engine run's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from kvclaims.cli import main
from kvclaims.sources.scenarios import tokens
from kvclaims.sources.tiny_model import ensure_tiny_model
from tests.conftest import query, scalar
from tests.test_http_server import _complete, _free_port, _wait_healthy

pytestmark = pytest.mark.vllm
CLAIM = "claim:resident"


@pytest.fixture(scope="module")
def both_runs(tmp_path_factory: pytest.TempPathFactory):
    """resident60_active70 over HTTP with 80 usable blocks; yield (in-engine, observed) dirs."""
    root = tmp_path_factory.mktemp("kv-events")
    engine_run, observed_run = root / "in-engine", root / "observed"
    model = ensure_tiny_model()
    port, pub, rep = _free_port(), _free_port(), _free_port()
    claims = root / "claims.jsonl"
    claims.write_text(json.dumps({"claim_id": CLAIM, "tenant": "tenant-http",
                                  "mode": "hard_protected", "from": "start",
                                  "token_ids": tokens(1, 60)}) + "\n")
    repo = str(Path(__file__).resolve().parents[1])
    env = {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    env["PYTHONPATH"] = repo + os.pathsep + env.get("PYTHONPATH", "")
    listen_log = open(root / "listen.log", "w")
    # NOTE: vLLM *connects* its PUB socket to an endpoint that names a host, so the listener
    # binds it: nothing listens beyond loopback. The replay ROUTER is bound by vLLM.
    listener = subprocess.Popen(
        [sys.executable, "-m", "kvclaims.cli", "listen", "--bind",
         "--endpoint", f"tcp://127.0.0.1:{pub}", "--replay", f"tcp://127.0.0.1:{rep}",
         "--topic", "kv", "--claims", str(claims), "--out", str(observed_run),
         "--model", str(model), "--num-blocks", "81"],
        stdout=listen_log, stderr=subprocess.STDOUT, env=env)
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
           "--skip-tokenizer-init", "--enable-prefix-caching", "--block-size", "32",
           "--num-gpu-blocks-override", "81", "--max-model-len", "2560", "--dtype", "float32",
           "--enforce-eager", "--gpu-memory-utilization", "0.3", "--enable-prompt-tokens-details",
           "--host", "127.0.0.1", "--port", str(port),
           "--scheduler-cls", "kvclaims.recorder.scheduler.KVClaimsScheduler",
           "--additional-config", json.dumps({"kvclaims": {
               "out": str(engine_run), "policy": "native", "run_id": "in-engine"}}),
           "--kv-events-config", json.dumps({
               "enable_kv_cache_events": True, "publisher": "zmq",
               "endpoint": f"tcp://127.0.0.1:{pub}", "replay_endpoint": f"tcp://127.0.0.1:{rep}",
               "topic": "kv"})]
    log = open(root / "server.log", "w")
    server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        _wait_healthy(port, server)
        _complete(port, str(model), tokens(1, 60), {
            "kv_claim_id": CLAIM, "kv_claim_tenant": "tenant-http",
            "kv_claim_mode": "hard_protected"})
        _complete(port, str(model), tokens(2, 70), None)
        _complete(port, str(model), tokens(1, 60), None)
        time.sleep(1.5)  # one recorder flush; the last KV event batch reaches the listener
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
        listener.send_signal(signal.SIGTERM)
        try:
            listener.wait(timeout=30)
        except subprocess.TimeoutExpired:
            listener.kill()
        log.close()
        listen_log.close()
    assert listener.returncode == 0, (root / "listen.log").read_text()
    yield engine_run, observed_run


def claim_labels(run: Path, out: Path, *, exit_codes: tuple[int, ...] = (0,)
                 ) -> list[tuple[int, str]]:
    """(position, label) of every loss of CLAIM, via `kvclaims reconstruct`."""
    assert main(["reconstruct", str(run), "--out", str(out)]) in exit_codes
    rows = pq.read_table(out / "loss_claims.parquet").to_pylist()
    return sorted((r["position"], r["label"]) for r in rows if r["claim_id"] == CLAIM)


def test_observed_labels_match_the_in_engine_labels(both_runs, tmp_path, capsys):
    engine_run, observed_run = both_runs
    # NOTE: vLLM's API server force-kills its engine at shutdown, so the in-engine run's last
    # segment may be cut short: exit 3 (a hole at the tail, after every loss compared here)
    engine = claim_labels(engine_run, tmp_path / "e", exit_codes=(0, 3))
    observed = claim_labels(observed_run, tmp_path / "o")
    with capsys.disabled():  # the side-by-side for docs/stock-vllm.md
        print(f"\n{'run':<10} {'losses':>6}  labels          positions")
        for name, rows in (("in-engine", engine), ("observed", observed)):
            pos = [p for p, _ in rows]
            print(f"{name:<10} {len(rows):>6}  {dict(Counter(lab for _, lab in rows))}  "
                  f"{min(pos) if pos else '-'}..{max(pos) if pos else '-'}")
    assert observed == engine
    assert engine == [(p, "harm") for p in range(10, 60)]


def test_observed_hashes_are_the_engines_own(both_runs):
    _, observed_run = both_runs
    m = json.loads((observed_run / "manifest.json").read_text())
    assert m["kv_events"]["hash_check"] == "verified", m["kv_events"]
    assert m["kv_events"]["hash_verified"] >= 60 and m["kv_events"]["hash_mismatched"] == 0


def test_observed_run_has_no_gap_and_says_it_was_observed(both_runs):
    _, observed_run = both_runs
    m = json.loads((observed_run / "manifest.json").read_text())
    assert (m["evidence"], m["complete"], m["kv_events"]["batches_lost"]) == ("observed", True, 0)
    assert scalar(observed_run, "SELECT count(*) FROM events WHERE event = 'recorder_gap'") == 0


def test_observed_losses_name_no_evicting_request_where_the_engine_does(both_runs):
    engine_run, observed_run = both_runs
    assert query(observed_run, "SELECT DISTINCT cause, by_request_id FROM events "
                               "WHERE event = 'block_evicted'") == [("unknown", None)]
    assert scalar(engine_run, "SELECT count(*) FROM events WHERE event = 'block_evicted' "
                              "AND cause = 'allocation' AND by_request_id IS NOT NULL") >= 50
