"""The listener: vLLM's own KV events (real vLLM structs and publisher, no engine) -> observed
runs, claims declared beside the engine, and the reconstructor's labels on them."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import pyarrow.parquet as pq
import pytest

from kvclaims.cli import main
from kvclaims.sources import kv_events as kv
from kvclaims.sources.declared_claims import HashScheme, load_claims
from tests.conftest import query, scalar

vkv = pytest.importorskip("vllm.distributed.kv_events")
SCHEME = HashScheme()
BS = 32


def toks(seed: int, n_blocks: int) -> list[int]:
    return [1 + (seed * 7919 + i * 31) % 499 for i in range(n_blocks * BS)]


def stored(tokens: list[int], parent: int | None = None, hashes: list[int] | None = None,
           **kw: Any) -> Any:
    return vkv.BlockStored(block_hashes=hashes or SCHEME.chain64(tokens, BS),
                           parent_block_hash=parent, token_ids=tokens, block_size=BS,
                           lora_id=None, medium=kw.pop("medium", "GPU"), lora_name=None, **kw)


def removed(hashes: list[int]) -> Any:
    return vkv.BlockRemoved(block_hashes=hashes, medium="GPU")


def payload(events: list[Any], ts: float) -> bytes:
    return msgspec.msgpack.encode(vkv.KVEventBatch(ts=ts, events=events))


def observe(out: Path, batches: list[tuple[int, bytes]], claims: list[dict] | None = None,
            replay: Any = None) -> dict[str, Any]:
    """Feed (publisher seq, payload) batches to a listener; batch ts are 1000 s + seq."""
    declared = []
    if claims:
        f = out.parent / f"{out.name}-claims.jsonl"
        f.write_text("".join(json.dumps(c) + "\n" for c in claims))
        declared = load_claims(f)
    run = kv.ObservedRun(out, kv.run_info(out.name, scheme=SCHEME), clock=lambda: 0)
    lis = kv.Listener(run, kv.Translator(SCHEME), claims=declared, replay=replay,
                      wall0=999 * 10**9, mono0=0, warn=lambda m: None)
    for seq, data in batches:
        lis.on_batch(seq, data, (1000 + seq) * 10**9)
    return lis.close((1000 + len(batches) + 100) * 10**9)


def labels(run: Path, tmp: Path) -> list[tuple[str, int, str]]:
    """(claim_id, position, label) of every claimed loss, via `kvclaims reconstruct`."""
    out = tmp / f"{run.name}-tables"
    assert main(["reconstruct", str(run), "--out", str(out)]) == 0
    rows = pq.read_table(out / "loss_claims.parquet").to_pylist()
    return sorted((r["claim_id"], r["position"], r["label"]) for r in rows)


# -- decoding ---------------------------------------------------------------------------------

def test_tagged_maps_and_positional_arrays_decode_alike():
    t = toks(1, 2)
    h = SCHEME.chain64(t, BS)
    tagged = payload([stored(t), removed(h[1:])], 5.0)
    positional = msgspec.msgpack.encode(
        [5.0, [["BlockStored", h, None, t, BS, None, "GPU"], ["BlockRemoved", h[1:], "GPU"]], 0])
    assert kv.decode_batch(tagged)[1] == kv.decode_batch(positional)[1]
    assert kv.decode_batch(tagged)[1][0][:3] == (kv.STORED, h, None)


def test_unknown_event_type_is_refused():
    bad = msgspec.msgpack.encode([5.0, [{"type": "BlockMoved", "block_hashes": [1]}], 0])
    with pytest.raises(kv.KVEventsError, match="BlockMoved"):
        kv.decode_batch(bad)


def test_bytes_hashes_are_their_low_64_bits():
    digest = bytes(range(32))
    ev = kv.decode_batch(msgspec.msgpack.encode(
        [1.0, [{"type": "BlockRemoved", "block_hashes": [digest], "medium": None}]]))[1][0]
    assert ev[1] == [int.from_bytes(digest, "big") & (2**64 - 1)]


def test_a_string_hash_is_refused():
    with pytest.raises(kv.KVEventsError, match="str"):
        kv.decode_batch(msgspec.msgpack.encode(
            [1.0, [{"type": "BlockRemoved", "block_hashes": ["abc"]}]]))


# -- translation ------------------------------------------------------------------------------

def test_positions_and_parents_follow_the_chain(tmp_path):
    t = toks(1, 3)
    h = SCHEME.chain64(t, BS)
    observe(tmp_path / "r", [(0, payload([stored(t[:BS])], 1.0)),
                             (1, payload([stored(t[BS:], parent=h[0], hashes=h[1:])], 2.0))])
    rows = query(tmp_path / "r", "SELECT block_hash, parent_hash, position, request_id FROM "
                                 "events WHERE event = 'block_cached' ORDER BY seq")
    # NOTE: the trace holds keyed hashes (docs/design.md §4): the chain survives keying
    k = [r[0] for r in rows]
    assert rows == [(k[0], None, 0, None), (k[1], k[0], 1, None), (k[2], k[1], 2, None)]
    assert set(k).isdisjoint(h)


def test_an_unseen_parent_leaves_the_position_unknown(tmp_path):
    t = toks(1, 2)
    h = SCHEME.chain64(t, BS)
    summary = observe(tmp_path / "r", [(0, payload([stored(t[BS:], parent=h[0],
                                                           hashes=h[1:])], 1.0))])
    assert scalar(tmp_path / "r", "SELECT position FROM events WHERE event = 'block_cached'") \
        is None
    assert summary["position_unknown"] == 1


def test_evictions_have_unknown_cause_and_no_evicting_request(tmp_path):
    t = toks(1, 2)
    h = SCHEME.chain64(t, BS)
    observe(tmp_path / "r", [(0, payload([stored(t)], 1.0)), (1, payload([removed(h)], 2.0))])
    assert query(tmp_path / "r", "SELECT DISTINCT cause, by_request_id FROM events "
                                 "WHERE event = 'block_evicted'") == [("unknown", None)]


def test_a_second_copy_of_a_hash_gets_its_own_block_id(tmp_path):
    t = toks(1, 1)
    h = SCHEME.chain64(t, BS)
    observe(tmp_path / "r", [(0, payload([stored(t), stored(t)], 1.0)),
                             (1, payload([removed(h)], 2.0))])
    ids = query(tmp_path / "r", "SELECT event, block_id FROM events WHERE block_id IS NOT NULL "
                                "ORDER BY seq")
    assert ids == [("block_cached", 1), ("block_cached", 2), ("block_evicted", 2)]


def test_one_copy_lost_of_two_is_not_harm(tmp_path):
    t = toks(1, 1)
    h = SCHEME.chain64(t, BS)
    run = tmp_path / "r"
    observe(run, [(0, payload([stored(t), stored(t)], 1.0)), (1, payload([removed(h)], 2.0))],
            claims=[{"claim_id": "c", "tenant": "t", "token_ids": t}])
    assert labels(run, tmp_path) == [("c", 0, "eviction")]


def test_the_last_copy_lost_is_harm(tmp_path):
    t = toks(1, 1)
    h = SCHEME.chain64(t, BS)
    run = tmp_path / "r"
    observe(run, [(0, payload([stored(t), stored(t)], 1.0)),
                  (1, payload([removed(h), removed(h)], 2.0))],
            claims=[{"claim_id": "c", "tenant": "t", "token_ids": t}])
    assert labels(run, tmp_path) == [("c", 0, "eviction"), ("c", 0, "harm")]


def test_all_blocks_cleared_is_a_cache_reset(tmp_path):
    t = toks(1, 2)
    run = tmp_path / "r"
    observe(run, [(0, payload([stored(t)], 1.0)), (1, payload([vkv.AllBlocksCleared()], 2.0))],
            claims=[{"claim_id": "c", "tenant": "t", "token_ids": t}])
    assert scalar(run, "SELECT reason FROM events WHERE event = 'cache_reset'") == \
        "all_blocks_cleared"
    assert labels(run, tmp_path) == [("c", 0, "harm"), ("c", 1, "harm")]


def test_offload_tier_events_are_not_pool_blocks(tmp_path):
    summary = observe(tmp_path / "r", [(0, payload([stored(toks(1, 2), medium="CPU")], 1.0))])
    assert scalar(tmp_path / "r", "SELECT count(*) FROM events WHERE event = 'block_cached'") \
        == 0
    assert summary["other_medium"] == 2


# -- gaps, replay, restarts -------------------------------------------------------------------

def test_missing_batches_without_replay_become_a_gap_and_unknown_losses(tmp_path):
    t = toks(1, 2)
    h = SCHEME.chain64(t, BS)
    run = tmp_path / "r"
    summary = observe(run, [(0, payload([stored(t)], 1.0)), (3, payload([removed(h)], 2.0))],
                      claims=[{"claim_id": "c", "tenant": "t", "token_ids": t}])
    gap = query(run, "SELECT first_seq, last_seq, events_dropped, reason FROM events "
                     "WHERE event = 'recorder_gap'")
    assert len(gap) == 1 and gap[0][2] == 2 and gap[0][3] == "publisher_batches_lost"
    assert summary["gaps"][0]["publisher_first_seq"] == 1
    assert summary["gaps"][0]["publisher_last_seq"] == 2
    assert {lab for _, _, lab in labels(run, tmp_path)} == {"unknown"}


def test_contiguous_batches_leave_no_gap(tmp_path):
    t = toks(1, 2)
    h = SCHEME.chain64(t, BS)
    run = tmp_path / "r"
    observe(run, [(0, payload([stored(t)], 1.0)), (1, payload([removed(h)], 2.0))],
            claims=[{"claim_id": "c", "tenant": "t", "token_ids": t}])
    assert scalar(run, "SELECT count(*) FROM events WHERE event = 'recorder_gap'") == 0
    assert {lab for _, _, lab in labels(run, tmp_path)} == {"harm"}


def test_replayed_batches_fill_the_hole(tmp_path):
    t = toks(1, 2)
    h = SCHEME.chain64(t, BS)
    lost = payload([stored(t)], 1.0)
    summary = observe(tmp_path / "r", [(1, payload([removed(h)], 2.0))],
                      replay=lambda start: [(b"", 0, lost)] if start == 0 else [])
    assert summary["replayed"] == 1 and summary["batches_lost"] == 0
    assert [r[0] for r in query(tmp_path / "r", "SELECT event FROM events ORDER BY seq")] == [
        "run_started", "block_cached", "block_cached", "block_evicted", "block_evicted",
        "run_finished"]


def test_a_replay_that_no_longer_has_the_batch_is_a_gap(tmp_path):
    summary = observe(tmp_path / "r", [(2, payload([], 2.0))], replay=lambda start: [
        (b"", 1, payload([], 1.0))])
    assert summary["replayed"] == 1 and summary["batches_lost"] == 1


def test_a_seq_going_forward_is_no_restart(tmp_path):
    summary = observe(tmp_path / "r", [(0, payload([stored(toks(1, 1))], 1.0)),
                                       (1, payload([], 2.0))])
    assert summary["restarts"] == 0


def test_a_seq_going_back_is_a_publisher_restart(tmp_path):
    run = kv.ObservedRun(tmp_path / "r2", kv.run_info("r2"))
    lis = kv.Listener(run, kv.Translator(), warn=lambda m: None)
    lis.on_batch(0, payload([stored(toks(1, 1))], 1.0), time.time_ns())
    lis.on_batch(1, payload([], 2.0), time.time_ns())
    lis.on_batch(0, payload([], 3.0), time.time_ns())
    assert lis.close()["restarts"] == 1
    assert scalar(tmp_path / "r2", "SELECT reason FROM events WHERE event = 'cache_reset'") == \
        "publisher_restarted"


def test_an_undecodable_batch_is_a_gap(tmp_path):
    summary = observe(tmp_path / "r", [(0, b"\xc1 not msgpack")])
    assert summary["undecodable"] == 1
    assert scalar(tmp_path / "r", "SELECT reason FROM events WHERE event = 'recorder_gap'") == \
        "undecodable_batch"


# -- the manifest -----------------------------------------------------------------------------

def test_manifest_says_observed_and_what_cannot_be_checked(tmp_path):
    observe(tmp_path / "r", [(0, payload([stored(toks(1, 1))], 1.0))])
    m = json.loads((tmp_path / "r" / "manifest.json").read_text())
    assert (m["evidence"], m["runtime"], m["policy"], m["complete"]) == (
        "observed", "vllm-kv-events", "native", True)
    assert {"L3", "L7"} <= set(m["checks_not_exercised"])
    assert m["kv_events"]["hash_check"] == "verified"
    assert scalar(tmp_path / "r", "SELECT count(*) FROM events WHERE step IS NOT NULL") == 0


# -- claims over time -------------------------------------------------------------------------

def _resident_then_active(claim: dict[str, Any], tmp: Path) -> list[tuple[str, int, str]]:
    """4 resident blocks cached at ts 1000, 3 of them lost at ts 1001."""
    t = toks(1, 4)
    h = SCHEME.chain64(t, BS)
    run = tmp / "r"
    observe(run, [(0, payload([stored(t)], 1000.0)), (1, payload([removed(h[1:])], 1001.0))],
            claims=[{"claim_id": "c", "tenant": "t", "token_ids": t, **claim}])
    return labels(run, tmp)


def test_a_claim_in_force_loses_its_blocks_as_harm(tmp_path):
    assert _resident_then_active({"from": "start"}, tmp_path) == [
        ("c", 1, "harm"), ("c", 2, "harm"), ("c", 3, "harm")]


def test_a_claim_released_before_the_loss_is_relaxation(tmp_path):
    assert {lab for *_, lab in _resident_then_active({"until": 1000.5}, tmp_path)} == \
        {"relaxation"}


def test_a_claim_declared_after_the_loss_has_no_claimed_loss(tmp_path):
    assert _resident_then_active({"from": 1001.5}, tmp_path) == []


def test_a_claim_below_its_threshold_is_not_harmed_by_one_loss(tmp_path):
    assert {lab for *_, lab in _resident_then_active({"threshold_blocks": 1}, tmp_path)} == \
        {"eviction"}


def test_a_claim_by_known_hash_chain_binds_like_one_by_tokens(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    by_tokens = _resident_then_active({}, tmp_path / "a")
    by_hashes = _resident_then_active({"token_ids": None,
                                       "block_hashes": SCHEME.chain64(toks(1, 4), BS)},
                                      tmp_path / "b")
    assert by_hashes == by_tokens and len(by_tokens) == 3


def test_claim_events_are_timestamped_on_the_run_clock(tmp_path):
    _resident_then_active({"from": 1000.5}, tmp_path)
    ts = dict(query(tmp_path / "r", "SELECT event, ts_ns FROM events WHERE event IN "
                                    "('claim_submitted', 'block_evicted') ORDER BY seq"))
    # wall0 999 s pairs with ts 0: from 1000.5 s is 1.5 s, the loss batch at 1001 s is 2 s
    assert ts == {"claim_submitted": 1_500_000_000, "block_evicted": 2_000_000_000}


def test_a_claim_longer_than_its_content_is_refused(tmp_path):
    f = tmp_path / "c.jsonl"
    f.write_text(json.dumps({"claim_id": "c", "tenant": "t", "threshold_blocks": 5,
                             "token_ids": toks(1, 4)}) + "\n")
    with pytest.raises(kv.InputError, match="threshold_blocks 5 exceeds the 4 full blocks"):
        load_claims(f)[0].hashes(SCHEME, BS)


# -- the claims file --------------------------------------------------------------------------

@pytest.mark.parametrize("line, message", [
    ('{"claim_id": "c", "tenant": "t"}', "give exactly one of"),
    ('{"claim_id": "c", "tenant": "t", "token_ids": [1], "mode": "pinned"}', "'mode'"),
    ('{"claim_id": "c", "tenant": "t", "token_ids": [1], "from": "2026-01-01T00:00:00"}',
     "no timezone"),
    ('{"claim_id": "c", "tenant": "t", "token_ids": [1], "colour": "red"}', "unknown field"),
    ('{"claim_id": "c", "tenant": "t", "token_ids": [1], "from": 5, "until": 4}',
     "'until' is not after 'from'"),
    ('{"claim_id": "c", "tenant": "t", "token_ids": [1], "mode": "expiring"}', "ttl_s"),
    ('{"claim_id": "c", "tenant": ', "invalid JSON"),
])
def test_a_bad_claims_file_is_one_clear_line(tmp_path, capsys, line, message):
    f = tmp_path / "claims.jsonl"
    f.write_text(line + "\n")
    code = main(["listen", "--endpoint", "tcp://127.0.0.1:1", "--claims", str(f),
                 "--out", str(tmp_path / "r"), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0] and f"{f}:1" in err[0]
    assert not (tmp_path / "r").exists()


def test_a_good_claims_file_loads(tmp_path):
    f = tmp_path / "claims.jsonl"
    f.write_text('# resident system prompt\n' + json.dumps({
        "claim_id": "c", "tenant": "t", "mode": "hard_protected", "threshold_blocks": 1,
        "from": "2026-11-30T04:00:00Z", "until": 1890000000, "token_ids": toks(1, 1)}) + "\n")
    (c,) = load_claims(f)
    assert (c.claim_id, c.from_ns, c.until_ns) == ("c", 1796011200 * 10**9, 1890000000 * 10**9)


def test_yaml_claims_file_loads_like_json_lines(tmp_path):
    f = tmp_path / "claims.yaml"
    f.write_text("claims:\n  - claim_id: c\n    tenant: t\n    from: start\n"
                 "    block_hashes: [1, 2]\n")
    (c,) = load_claims(f)
    assert c.hashes(SCHEME, None) == [1, 2]


def test_duplicate_claim_ids_are_refused(tmp_path):
    f = tmp_path / "claims.jsonl"
    line = json.dumps({"claim_id": "c", "tenant": "t", "token_ids": [1]})
    f.write_text(line + "\n" + line + "\n")
    with pytest.raises(kv.InputError, match="already declared"):
        load_claims(f)


def test_text_claims_use_the_local_tokenizer(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    from transformers import PreTrainedTokenizerFast

    words = [f"w{i}" for i in range(40)]
    vocab = {w: i + 3 for i, w in enumerate(words)} | {"[UNK]": 0}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    folder = tmp_path / "tok"
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(folder)
    f = tmp_path / "claims.jsonl"
    f.write_text(json.dumps({"claim_id": "c", "tenant": "t", "text": " ".join(words[:32]),
                             "tokenizer": str(folder)}) + "\n")
    from kvclaims.cli.listen import load_declared

    (c,) = load_declared(f, SCHEME, BS, None)
    assert c.token_ids == list(range(3, 35))
    assert c.hashes(SCHEME, BS) == SCHEME.chain64(list(range(3, 35)), BS)


def test_a_text_claim_without_a_tokenizer_is_refused(tmp_path):
    f = tmp_path / "claims.jsonl"
    f.write_text(json.dumps({"claim_id": "c", "tenant": "t", "text": "hello"}) + "\n")
    from kvclaims.cli.listen import load_declared

    with pytest.raises(kv.InputError, match="tokenizer"):
        load_declared(f, SCHEME, BS, None)


# -- vLLM's hash scheme -----------------------------------------------------------------------

@pytest.mark.parametrize("algo", ["sha256", "sha256_cbor"])
def test_hash_scheme_equals_vllms_hash_block_tokens(algo):
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils as u

    fn = get_hash_fn_by_name(algo)
    u.init_none_hash(fn)
    t = toks(3, 3)
    ours = HashScheme(algo).chain(t, BS)
    parent = None
    theirs = []
    for i in range(3):
        parent = u.hash_block_tokens(fn, parent, t[i * BS:(i + 1) * BS])
        theirs.append(bytes(parent))
    assert ours == theirs


def test_another_seed_gives_other_hashes():
    t = toks(3, 1)
    assert HashScheme("sha256", "1234").chain(t, BS) != HashScheme("sha256").chain(t, BS)


def test_a_wrong_hash_algo_is_reported_as_a_mismatch(tmp_path):
    t = toks(1, 2)
    run = kv.ObservedRun(tmp_path / "r", kv.run_info("r"))
    lis = kv.Listener(run, kv.Translator(HashScheme("sha256_cbor")), warn=lambda m: None)
    lis.on_batch(0, payload([stored(t)], 1.0), time.time_ns())
    assert lis.close()["hash_check"] == "mismatch"


# -- sockets: vLLM's own publisher, the CLI, captures -----------------------------------------

def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(path: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.05)


def test_listen_records_vllms_publisher_and_stops_on_sigterm(tmp_path):
    pub_port, replay_port = _port(), _port()
    run = tmp_path / "run"
    t = toks(1, 3)
    h = SCHEME.chain64(t, BS)
    claims = tmp_path / "claims.jsonl"
    claims.write_text(json.dumps({"claim_id": "c", "tenant": "t", "token_ids": t}) + "\n")
    # one deployment key for the live run and the re-import, so their keyed hashes agree
    key = tmp_path / "hash.key"
    key.write_text("kvclaims-test-deployment-key-0123456789")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
           "KVCLAIMS_HASH_KEY_FILE": str(key)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvclaims.cli", "listen", "--bind", "--endpoint",
         f"tcp://127.0.0.1:{pub_port}", "--replay", f"tcp://127.0.0.1:{replay_port}",
         "--claims", str(claims), "--out", str(run), "--capture", str(tmp_path / "cap.bin")],
        env=env, stderr=subprocess.PIPE, text=True)
    pub = vkv.ZmqEventPublisher(0, endpoint=f"tcp://127.0.0.1:{pub_port}",
                                replay_endpoint=f"tcp://127.0.0.1:{replay_port}")
    try:
        _wait_for(run / "manifest.json")
        time.sleep(1.0)  # the SUB's subscription reaches the connecting PUB
        pub.publish(vkv.KVEventBatch(ts=time.time(), events=[stored(t)]))
        pub.publish(vkv.KVEventBatch(ts=time.time(), events=[removed(h[2:])]))
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        pub.shutdown()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    m = json.loads((run / "manifest.json").read_text())
    assert m["complete"] and m["kv_events"]["batches"] == 2
    assert labels(run, tmp_path) == [("c", 2, "harm")]
    # the capture re-imports into the same events (timestamps aside)
    os.environ["KVCLAIMS_HASH_KEY_FILE"] = str(key)
    try:
        assert main(["import", str(tmp_path / "cap.bin"), "--from", "vllm-kv-events",
                     "--out", str(tmp_path / "imported")]) == 0
    finally:
        del os.environ["KVCLAIMS_HASH_KEY_FILE"]
    sql = ("SELECT event, block_id, block_hash, position, claim_id FROM events "
           "WHERE event NOT IN ('run_started', 'run_finished') ORDER BY seq")
    imported = query(tmp_path / "imported", sql)
    assert [r for r in imported if r[4] is None] == [r for r in query(run, sql) if r[4] is None]


def test_a_capture_that_is_not_one_is_one_clear_line(tmp_path, capsys):
    f = tmp_path / "x.bin"
    f.write_bytes(b"hello")
    assert main(["import", str(f), "--from", "vllm-kv-events", "--out",
                 str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a kvclaims capture" in err[0]


def test_a_bad_endpoint_is_one_clear_line(tmp_path, capsys):
    assert main(["listen", "--endpoint", "localhost:5557", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "tcp://HOST:PORT" in err[0]


def test_a_capture_cut_off_mid_record_imports_its_complete_frames(tmp_path):
    cap = tmp_path / "cap.bin"
    with kv.open_capture(cap) as fh:
        kv.write_capture_record(fh, 10**18, b"", (0).to_bytes(8, "big"),
                                payload([stored(toks(1, 2))], 1.0))
        kv.write_capture_record(fh, 10**18, b"", (1).to_bytes(8, "big"), payload([], 2.0))
    cap.write_bytes(cap.read_bytes()[:-3])
    summary = kv.import_capture(cap, tmp_path / "r")
    m = json.loads((tmp_path / "r" / "manifest.json").read_text())
    assert summary["batches"] == 1 and "cut off after 1 complete" in m["capture_truncated"]


def test_a_complete_capture_notes_no_truncation(tmp_path):
    cap = tmp_path / "cap.bin"
    with kv.open_capture(cap) as fh:
        kv.write_capture_record(fh, 10**18, b"", (0).to_bytes(8, "big"), payload([], 1.0))
    kv.import_capture(cap, tmp_path / "r")
    assert "capture_truncated" not in json.loads((tmp_path / "r" / "manifest.json").read_text())


def test_data_parallel_rank_offsets_the_port_like_vllm():
    assert kv.check_endpoint("tcp://127.0.0.1:5557", rank=2) == \
        vkv.ZmqEventPublisher.offset_endpoint_port("tcp://127.0.0.1:5557", 2)
    assert kv.check_endpoint("tcp://127.0.0.1:5557", rank=0) == "tcp://127.0.0.1:5557"


def test_binding_every_interface_is_refused():
    with pytest.raises(kv.InputError, match="every interface"):
        kv.check_endpoint("tcp://*:5557", bind=True)
    assert kv.check_endpoint("tcp://*:5557") == "tcp://*:5557"  # connecting to it is fine


def test_a_failed_write_becomes_a_gap_and_the_listener_goes_on(tmp_path, monkeypatch):
    run = kv.ObservedRun(tmp_path / "r", kv.run_info("r"), batch_events=1)
    real = run.writer.write_batch
    calls = {"n": 0}

    def flaky(batch):  # NOTE: stands in for a full disk, which this machine cannot provide
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(28, "No space left on device")
        real(batch)

    monkeypatch.setattr(run.writer, "write_batch", flaky)
    lis = kv.Listener(run, kv.Translator(), warn=lambda m: None)
    lis.on_batch(0, payload([stored(toks(1, 1))], 1.0), time.time_ns())
    lis.on_batch(1, payload([stored(toks(2, 1))], 2.0), time.time_ns())
    lis.close()
    rows = query(tmp_path / "r", "SELECT event, first_seq, last_seq, reason FROM events "
                                 "WHERE event IN ('recorder_gap', 'block_cached') ORDER BY seq")
    # the first batch's block is written, the second's is lost and covered by the gap
    assert rows == [("block_cached", None, None, None), ("recorder_gap", 2, 2, "write_failed")]
    assert json.loads((tmp_path / "r" / "manifest.json").read_text())["complete"]


def test_a_claim_waits_out_the_clock_grace_on_an_idle_listener(tmp_path):
    f = tmp_path / "c.jsonl"
    f.write_text(json.dumps({"claim_id": "c", "tenant": "t", "from": 1000,
                             "block_hashes": [1]}) + "\n")
    run = kv.ObservedRun(tmp_path / "r", kv.run_info("r"))
    lis = kv.Listener(run, kv.Translator(), claims=load_claims(f), warn=lambda m: None)
    lis.tick(1001 * 10**9)
    assert lis.summary()["claims_started"] == 0
    lis.tick(1003 * 10**9)
    assert lis.summary()["claims_started"] == 1
    lis.close()
