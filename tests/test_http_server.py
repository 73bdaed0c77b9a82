"""The recorder behind vLLM's OpenAI server: claims as ``vllm_xargs``, engine in its own process."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from kvclaims.sources.scenarios import tokens
from kvclaims.sources.tiny_model import ensure_tiny_model
from tests.conftest import query, scalar

pytestmark = pytest.mark.vllm


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served_run(tmp_path_factory: pytest.TempPathFactory):
    """Serve the tiny model with the recorder (policy native, 80 usable blocks), send the
    resident / active / probe requests over HTTP, stop the server; yield (run_dir, replies)."""
    run_dir = tmp_path_factory.mktemp("http") / "run"
    model = ensure_tiny_model()
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
           "--skip-tokenizer-init", "--enable-prefix-caching", "--block-size", "32",
           "--num-gpu-blocks-override", "81", "--max-model-len", "2560", "--dtype", "float32",
           "--enforce-eager", "--gpu-memory-utilization", "0.3", "--enable-prompt-tokens-details",
           "--host", "127.0.0.1", "--port", str(port),
           "--scheduler-cls", "kvclaims.recorder.scheduler.KVClaimsScheduler",
           "--additional-config", json.dumps({"kvclaims": {
               "out": str(run_dir), "policy": "native", "run_id": "http"}})]
    log = open(run_dir.parent / "server.log", "w")
    server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        _wait_healthy(port, server)
        replies = {
            "resident": _complete(port, str(model), tokens(1, 60), {
                "kv_claim_id": "claim:resident", "kv_claim_tenant": "tenant-http",
                "kv_claim_mode": "hard_protected"}),
            "active": _complete(port, str(model), tokens(2, 70), None),
            "probe": _complete(port, str(model), tokens(1, 60), {
                "kv_claim": json.dumps({"claim_id": "claim:json", "tenant": "tenant-json"})}),
        }
        # NOTE: vLLM's server force-kills its engine process on shutdown; the recorder flushes
        # every 0.2 s, so give it one flush before stopping (the loader reports the rest).
        time.sleep(1.0)
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()
    yield run_dir, replies


def _wait_healthy(port: int, server: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"vLLM server exited with {server.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(1)
    raise RuntimeError("vLLM server did not become healthy")


def _complete(port: int, model: str, prompt: list[int], xargs: dict[str, Any] | None) -> dict:
    body: dict[str, Any] = {"model": model, "prompt": prompt, "max_tokens": 1}
    if xargs:
        body["vllm_xargs"] = xargs
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                                 json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as reply:
        return json.loads(reply.read())


def test_flat_vllm_xargs_claim_reaches_the_scheduler(served_run):
    run, _ = served_run
    assert query(run, "SELECT claim_id, tenant, protection_mode FROM events "
                      "WHERE event = 'claim_submitted' ORDER BY seq")[0] == \
        ("claim:resident", "tenant-http", "hard_protected")


def test_json_string_vllm_xargs_claim_reaches_the_scheduler(served_run):
    run, _ = served_run
    assert scalar(run, "SELECT count(*) FROM events WHERE event = 'claim_accepted' "
                       "AND claim_id = 'claim:json'") == 1


def test_http_active_request_evicts_fifty_resident_blocks(served_run):
    run, _ = served_run
    rows = query(run, """SELECT DISTINCT b.position FROM events e JOIN events b
        ON b.event = 'claim_bound' AND b.claim_id = 'claim:resident'
        AND b.block_hash = e.block_hash
        WHERE e.event = 'block_evicted' AND e.cause = 'allocation' AND e.seq <
        (SELECT min(seq) FROM events WHERE event = 'claim_submitted' AND claim_id = 'claim:json')
        ORDER BY 1""")
    assert [r[0] for r in rows] == list(range(10, 60))


def test_http_cached_tokens_match_the_trace(served_run):
    run, replies = served_run
    cached = replies["probe"]["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached == 10 * 32
    assert scalar(run, """SELECT f.num_cached_tokens FROM events f JOIN events a
        ON a.event = 'request_arrived' AND a.request_id = f.request_id
        WHERE f.event = 'request_finished' AND a.claim_id = 'claim:json'""") == cached


def test_engine_ran_in_its_own_process(served_run):
    run, _ = served_run
    log = (run.parent / "server.log").read_text()
    assert "(EngineCore pid=" in log and "(APIServer pid=" in log
    assert scalar(run, "SELECT count(*) FROM events WHERE event = 'request_finished'") == 3
