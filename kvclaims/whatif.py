"""``kvclaims whatif``: replay a recorded run's workload under another policy or pool size,
through vLLM's own ``Scheduler`` with the kvclaims recorder and arbiter attached, no model.

A recorded run holds what a replay needs (docs/whatif.md): each request's arrival step and
prompt length, the block-hash chain of its prompt (``block_cached`` / ``block_hit`` with
positions), its output length (``request_finished``), its claim (``claim_submitted``) and the
releases it asked for; from schema 3 on, the scheduler settings (``run_started``). The replay
rebuilds that request stream with synthetic token ids derived from the recorded hashes (equal
chains share prefixes in vLLM's own hashing, different chains never collide), drives
``KVClaimsScheduler.schedule()`` / ``update_from_output()`` with constructed model outputs,
and writes an ordinary run directory per point (manifest ``evidence: replayed``,
``source_run_id``), which the reconstructor audits like any other run.

What a replay cannot know is said, never guessed silently: the manifest's ``replay`` section
lists every approximation (``exact: false`` with reasons), and ``fidelity`` compares a replay
under the recorded settings with the recorded run, event by event.
"""

from __future__ import annotations

import copy
import json
import os
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kvclaims
from kvclaims.contract.policies import get_policy
from kvclaims.contract.schema import InputError
from kvclaims.contract.vocabulary import fill_sql
from kvclaims.recorder import buffer as rec_buffer
from kvclaims.recorder import hooks as rec_hooks
# NOTE: the comparison lives with the other readers of computed what-ifs (report, dashboard,
# explain); it is re-exported here, where the command that prints it always found it
from kvclaims.replays import SUMMARY_COLUMNS, render_comparison, summarize  # noqa: F401
from kvclaims.reconstruct.loader import load_runs
from kvclaims.sources.scenarios import SCENARIOS, engine_args
from kvclaims.sources.tiny_model import TINY_CONFIG

# Token ids of the synthetic prompts. NOTE: the first token of a block says what it is made of
# (a recorded hash, content unknown to the trace, a partial tail, generated output), so blocks
# of different kinds never have equal content, and within a kind the rest is injective.
_TAG_HASHED, _TAG_UNKNOWN, _TAG_TAIL = 1, 2, 3
_OUTPUT_TOKEN_BASE = 1_000  # generated tokens: identical prompts generate identical outputs
_STALL_STEPS = 200  # steps without any scheduled token before a replay stops as stuck
_EXTRA_STEPS = 10_000  # a replay may take this many steps more than the recorded run


@dataclass(frozen=True)
class ReplayRequest:
    """One request of a recorded run, as a replay submits it."""

    request_id: str
    seq: int  # the recorded arrival's seq (orders arrivals within a step)
    arrival_step: int
    arrival_ts_ns: int
    num_prompt_tokens: int
    prompt_hashes: tuple[int | None, ...]  # recorded hash per full prompt block; None: unknown
    output_tokens: int
    tenant: str | None
    claim: dict[str, Any] | None
    releases: tuple[str, ...]
    abort_at: tuple[int, int] | None  # (step, seq) of the recorded abort, if it was aborted


@dataclass
class Workload:
    """A recorded run's request stream and engine settings."""

    source_run_id: str
    source_dir: Path
    block_size: int
    usable_blocks: int
    policy: str
    schema_version: int
    model: str | None
    scenario: str | None
    max_num_batched_tokens: int | None
    max_num_seqs: int | None
    max_defer_steps: int
    max_defer_s: float
    max_protected_blocks_per_tenant: int | None
    requests: list[ReplayRequest]
    operator_releases: list[tuple[int, int, str]]  # (step, seq, claim_id)
    step_ts_ns: dict[int, int]  # recorded step -> first event's ts (the replay's clock)
    last_step: int
    approximations: list[str] = field(default_factory=list)


# -- reading a recorded run -----------------------------------------------------------------------

def read_workload(run_dir: str | Path) -> Workload:
    """Rebuild the request stream of the recorded run in ``run_dir``.

    Raises ``InputError`` (one line) where no replay can be built: not a single run, an
    observed run, a run without arrival steps (schema 1, most imports), a hole in the trace.
    """
    run_dir = Path(run_dir)
    trace = load_runs([run_dir])
    if len(trace.manifests) != 1:
        raise InputError(f"{run_dir}: whatif replays one run directory, found "
                         f"{len(trace.manifests)} runs")
    (run_id, manifest), = trace.manifests.items()
    _check_replayable(run_dir, manifest, trace)
    con = trace.connect()
    approx: list[str] = []
    if not manifest.get("complete"):
        approx.append("the recorded run did not finish (manifest not complete): what its "
                      "requests would have done after its end is unknown")
    start = _one(con, fill_sql(
        "SELECT block_size, usable_blocks, policy, schema_version, max_num_batched_tokens, "
        "max_num_seqs, max_defer_steps, max_defer_s FROM events "
        "WHERE event = {event.run_started}"))
    if not start or start[0] is None or start[1] is None:
        raise InputError(f"{run_dir}: run_started has no block_size or usable_blocks; "
                         "nothing to replay against")
    block_size, usable, policy, version, batched, seqs, defer_steps, defer_s = start
    if defer_steps is None:
        defer_steps, defer_s = _scenario_deferral(manifest, approx)
    defer_steps = int(defer_steps if defer_steps is not None
                      else _manifest_int(manifest, "max_defer_steps", 1))
    defer_s = float(defer_s if defer_s is not None
                    else _manifest_float(manifest, "max_defer_s", 0.0))
    if batched is None:
        approx.append(f"scheduler settings not in the trace (schema {version}; recorded from "
                      "schema 3 on): vLLM's defaults for this engine are assumed "
                      f"(max_num_batched_tokens, max_num_seqs; max_defer_steps {defer_steps}, "
                      f"max_defer_s {defer_s})")
    if manifest.get("scheduler") == "KVClaimsAsyncScheduler":
        approx.append("the recorded engine used vLLM's AsyncScheduler; the replay drives "
                      "Scheduler (the same admission and eviction code, one step earlier "
                      "output)")
    failures = _one(con, fill_sql(
        "SELECT count(*) FROM events WHERE event = {event.hook_failed}"))[0]
    if failures:
        approx.append(f"the recorded run has {failures} hook_failed events: from the first "
                      "on its enforcement is unknown, while the replay enforces throughout")
    requests, req_notes = _requests(con, block_size)
    approx += req_notes
    steps = dict(con.sql("SELECT step, min(ts_ns) FROM events WHERE step IS NOT NULL "
                         "GROUP BY step").fetchall())
    operator = con.sql(fill_sql(
        "SELECT step, seq, claim_id FROM events WHERE event = {event.claim_released} "
        "AND released_by = {releaser.operator} ORDER BY seq")).fetchall()
    tenant_limit = manifest.get("max_protected_blocks_per_tenant")
    return Workload(
        source_run_id=run_id, source_dir=run_dir, block_size=int(block_size),
        usable_blocks=int(usable), policy=str(policy or manifest.get("policy") or "native"),
        schema_version=int(version or manifest.get("schema_version") or 0),
        model=manifest.get("model"), scenario=manifest.get("scenario"),
        max_num_batched_tokens=batched, max_num_seqs=seqs,
        max_defer_steps=defer_steps, max_defer_s=defer_s,
        max_protected_blocks_per_tenant=tenant_limit if isinstance(tenant_limit, int) else None,
        requests=requests, operator_releases=[(int(s), int(q), str(c)) for s, q, c in operator],
        step_ts_ns={int(s): int(t) for s, t in steps.items()},
        last_step=max(steps) if steps else 0, approximations=approx)


def _scenario_deferral(manifest: dict[str, Any], notes: list[str]) -> tuple[Any, Any]:
    """The arbiter's deferral limits of a run recorded before schema 3: those of the built-in
    scenario its manifest names (``kvclaims record`` sets them), else None (the defaults)."""
    spec = SCENARIOS.get(str(manifest.get("scenario")))
    if spec is None or not ({"max_defer_steps", "max_defer_s"} & set(spec.engine)):
        return None, None
    notes.append(f"deferral limits not in the trace: those of the built-in scenario "
                 f"{spec.name!r} its manifest names ({dict(spec.engine)})")
    return spec.engine.get("max_defer_steps"), spec.engine.get("max_defer_s")


def _check_replayable(run_dir: Path, manifest: dict[str, Any], trace: Any) -> None:
    """Refuse, in one line, a run whose request stream cannot be rebuilt."""
    if manifest.get("evidence") == "observed":
        raise InputError(f"{run_dir}: an observed run (vLLM's KV events) has no admissions or "
                         "arrival steps recorded in the engine; record the workload with the "
                         "kvclaims scheduler to replay it")
    if trace.truncated_runs or trace.holes:
        raise InputError(f"{run_dir}: the trace has a hole ({_first_hole(trace)}); events "
                         "behind it (arrivals, claims, releases) are unknown, so the workload "
                         "cannot be rebuilt")
    con = trace.connect()
    gaps, dropped, steps, arrivals = _one(con, fill_sql("""
        SELECT count(*) FILTER (WHERE event = {event.recorder_gap}),
               coalesce(max(events_dropped), 0),
               count(step),
               count(*) FILTER (WHERE event = {event.request_arrived})
        FROM events"""))
    if gaps or dropped:
        raise InputError(f"{run_dir}: the trace has a hole ({gaps} recorder_gap, {dropped} "
                         "events dropped); the workload cannot be rebuilt")
    if arrivals == 0:
        raise InputError(f"{run_dir}: no request_arrived events; nothing to replay")
    if steps == 0:
        raise InputError(f"{run_dir}: the trace has no arrival steps (schema "
                         f"{manifest.get('schema_version')}; steps are recorded from schema 2 "
                         "on); re-record the run to replay it")


def _first_hole(trace: Any) -> str:
    if trace.holes:
        h = trace.holes[0]
        return f"{h.reason} in {h.file}"
    return trace.truncations[0] if trace.truncations else "truncated"


def _requests(con: Any, block_size: int) -> tuple[list[ReplayRequest], list[str]]:
    """Every arrival of the run, in arrival order, with what the trace says about it."""
    arrivals = con.sql(fill_sql("""
        SELECT request_id, seq, step, ts_ns, num_prompt_tokens, tenant, claim_id
        FROM events WHERE event = {event.request_arrived} ORDER BY seq""")).fetchall()
    chains: dict[str, dict[int, int]] = {}
    for rid, pos, h in con.sql(fill_sql("""
            SELECT request_id, position, block_hash FROM events
            WHERE event IN ({event.block_cached}, {event.block_hit}) AND position IS NOT NULL
            ORDER BY seq""")).fetchall():
        chains.setdefault(rid, {}).setdefault(int(pos), int(h))
    finished = {r[0]: r[1:] for r in con.sql(fill_sql("""
        SELECT request_id, finish_reason, num_output_tokens, reason, step, seq FROM events
        WHERE event = {event.request_finished}""")).fetchall()}
    claims = {r[0]: r[1:] for r in con.sql(fill_sql("""
        SELECT request_id, claim_id, tenant, protection_mode, threshold_blocks, ttl_s, value
        FROM events WHERE event = {event.claim_submitted}""")).fetchall()}
    releases: dict[str, list[str]] = {}
    for rid, cid in con.sql(fill_sql("""
            SELECT request_id, claim_id FROM events
            WHERE (event = {event.claim_released} AND released_by = {releaser.tenant})
               OR event = {event.claim_release_refused} ORDER BY seq""")).fetchall():
        if rid is not None:
            releases.setdefault(rid, []).append(cid)
    out: list[ReplayRequest] = []
    notes: list[str] = []
    seen: set[str] = set()
    for rid, seq, step, ts, prompt, tenant, _claim_id in arrivals:
        if rid in seen:
            notes.append(f"request {rid} arrived twice; the replay submits it once")
            continue
        seen.add(rid)
        if step is None or prompt is None:
            raise InputError(f"request {rid}: its arrival has no step or prompt length; "
                             "the workload cannot be rebuilt")
        full = int(prompt) // block_size
        chain = chains.get(rid, {})
        hashes = tuple(chain.get(p) for p in range(full))
        unknown = [p for p, h in enumerate(hashes) if h is None]
        fin = finished.get(rid)
        output, abort_at = _output_of(rid, fin, notes)
        if unknown:
            notes.append(f"request {rid}: {len(unknown)} of {full} prompt blocks never reached "
                         "the cache in the recorded run (content unknown); replayed as content "
                         "no other request shares")
        claim = None
        if rid in claims:
            c = claims[rid]
            claim = {k: v for k, v in zip(("claim_id", "tenant", "protection_mode",
                                           "threshold_blocks", "ttl_s", "value"), c)
                     if v is not None}
        out.append(ReplayRequest(
            request_id=str(rid), seq=int(seq), arrival_step=int(step), arrival_ts_ns=int(ts),
            num_prompt_tokens=int(prompt), prompt_hashes=hashes, output_tokens=output,
            tenant=tenant, claim=claim, releases=tuple(releases.get(rid, ())),
            abort_at=abort_at))
    return out, notes


def _output_of(rid: str, fin: tuple[Any, ...] | None,
               notes: list[str]) -> tuple[int, tuple[int, int] | None]:
    """(output tokens to generate, (step, seq) of its abort) of one request, noting what is
    unknown."""
    if fin is None:
        notes.append(f"request {rid} never finished in the recorded run; its output length "
                     "is unknown (replayed with 1 token)")
        return 1, None
    finish_reason, n_out, reason, step, seq = fin
    n_out = int(n_out or 0)
    if finish_reason == "abort":
        # NOTE: aborted by the client between steps: the replay aborts it at the same step;
        # the length it asked for is unknown, so it may generate one token more until then
        return n_out + 1, (int(step), int(seq)) if step is not None else None
    if finish_reason in ("length", "stop") and n_out > 0:
        return n_out, None
    notes.append(f"request {rid} finished '{finish_reason}'"
                 + (f" ({reason})" if reason else "")
                 + " before generating its requested output; its output length is unknown "
                   "(replayed with 1 token)")
    return 1, None


def _one(con: Any, sql: str) -> tuple[Any, ...]:
    rows = con.sql(sql).fetchall()
    return tuple(rows[0]) if rows else ()


def _manifest_int(manifest: dict[str, Any], key: str, default: int) -> int:
    v = manifest.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) else default


def _manifest_float(manifest: dict[str, Any], key: str, default: float) -> float:
    v = manifest.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else default


# -- synthetic prompts ----------------------------------------------------------------------------

def prompt_tokens(req: ReplayRequest, index: int, block_size: int) -> list[int]:
    """The synthetic prompt of ``req`` (the ``index``-th request of the workload).

    NOTE: a block with recorded hash h is ``[1, h's four 16-bit words, 0, ...]``: vLLM hashes a
    block with its parent, so requests whose recorded chains agree up to a position get equal
    vLLM hashes there, and any difference in the recorded chain is a difference in content.
    A block the trace does not know (never cached) is ``[2, request index, position, 0...]``
    and a partial tail ``[3, request index, 0, ...]``: never equal to any other block.
    """
    if block_size < 5:
        raise InputError(f"block_size {block_size} is too small to replay (needs >= 5)")
    pad = [0] * (block_size - 5)
    tokens: list[int] = []
    for pos, h in enumerate(req.prompt_hashes):
        if h is None:
            tokens += [_TAG_UNKNOWN, index, pos, 0, 0] + pad
        else:
            tokens += [_TAG_HASHED, (h >> 48) & 0xFFFF, (h >> 32) & 0xFFFF,
                       (h >> 16) & 0xFFFF, h & 0xFFFF] + pad
    tail = req.num_prompt_tokens - len(tokens)
    if tail > 0:
        tokens += ([_TAG_TAIL, index] + [0] * block_size)[:tail]
    return tokens


# -- driving vLLM's scheduler ----------------------------------------------------------------------

@dataclass
class ReplayResult:
    """One replayed point."""

    run_dir: Path
    run_id: str
    policy: str
    usable_blocks: int
    steps: int
    seconds: float
    exact: bool
    approximations: list[str]


def replay(workload: Workload, policy: str, usable_blocks: int, out: str | Path, *,
           run_id: str | None = None) -> ReplayResult:
    """Replay ``workload`` under ``policy`` with ``usable_blocks`` into the new run directory
    ``out`` (one vLLM ``Scheduler`` with the kvclaims recorder, constructed model outputs)."""
    policy = get_policy(policy).name
    if usable_blocks < 2:
        raise InputError("--usable-blocks must be at least 2")
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise InputError(f"{out} already exists and is not empty")
    run_id = run_id or f"{workload.source_run_id}-whatif-{policy}-{usable_blocks}"
    notes = list(workload.approximations)
    started = time.perf_counter()
    clock = _Clock()
    with _recorder_on(clock):
        sched, skipped = _build_scheduler(workload, policy, usable_blocks, out, run_id, notes)
        steps = _drive(sched, workload, usable_blocks, skipped, notes, clock)
    seconds = time.perf_counter() - started
    _finish_manifest(out, notes, steps)
    return ReplayResult(out, run_id, policy, usable_blocks, steps, seconds, not notes, notes)


def _replay_manifest(workload: Workload, policy: str, usable: int) -> dict[str, Any]:
    return {
        "evidence": "replayed", "source_run_id": workload.source_run_id,
        "source_run_dir": str(workload.source_dir), "scenario": workload.scenario,
        "replay": {"source_policy": workload.policy,
                   "source_usable_blocks": workload.usable_blocks,
                   "policy": policy, "usable_blocks": usable,
                   "source_schema_version": workload.schema_version,
                   "source_model": workload.model,
                   "driver": "vllm.v1.core.sched.scheduler.Scheduler with constructed model "
                             "outputs (no model forward)"}}


_CONFIG_CACHE: dict[tuple[Any, ...], Any] = {}


def _vllm_config(workload: Workload, usable: int, kvclaims_cfg: dict[str, Any]) -> Any:
    """vLLM's config of the engine ``kvclaims record`` would build at ``usable`` blocks, with
    the recorded scheduler limits where the trace has them.

    NOTE: built once per (block size, capacity, limits) and copied per point: building it
    resolves the platform and reads the model's configuration, which costs seconds.
    """
    key = (workload.block_size, usable, workload.max_num_batched_tokens, workload.max_num_seqs)
    if key not in _CONFIG_CACHE:
        from vllm import EngineArgs

        args = engine_args(_stub_model_dir(), usable, {}, block_size=workload.block_size)
        if workload.max_num_batched_tokens is not None:
            args["max_num_batched_tokens"] = workload.max_num_batched_tokens
        if workload.max_num_seqs is not None:
            args["max_num_seqs"] = workload.max_num_seqs
        try:
            _CONFIG_CACHE[key] = EngineArgs(**args).create_engine_config()
        except (ValueError, TypeError) as exc:  # e.g. a block size this platform refuses
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise InputError(f"vLLM cannot configure an engine for this replay (block_size "
                             f"{workload.block_size}, {usable} usable blocks): {first}") \
                from None
    cfg = copy.deepcopy(_CONFIG_CACHE[key])
    cfg.additional_config = {"kvclaims": kvclaims_cfg}
    cfg.scheduler_config.async_scheduling = False
    return cfg


def _stub_model_dir() -> Path:
    """A model folder holding only the tiny model's configuration (no weights): the scheduler
    reads the configuration; no forward pass runs in a replay."""
    base = Path(os.environ.get("KVCLAIMS_CACHE", Path.home() / ".cache" / "kvclaims"))
    d = base / "whatif-model-config"
    cfg_file = d / "config.json"
    want = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "torch_dtype": "float32", "tie_word_embeddings": False, "rms_norm_eps": 1e-6,
            "hidden_act": "silu", "rope_theta": 10000.0, "bos_token_id": 1, "eos_token_id": 2,
            **TINY_CONFIG}
    if not cfg_file.exists() or json.loads(cfg_file.read_text()) != want:
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f"config.json.{os.getpid()}"
        tmp.write_text(json.dumps(want, indent=2))
        tmp.replace(cfg_file)  # NOTE: atomic: concurrent replays never read half a file
    return d


def _build_scheduler(workload: Workload, policy: str, usable: int, out: Path, run_id: str,
                     notes: list[str]) -> tuple[Any, set[str]]:
    """The recording scheduler of one point; requests the engine would reject are listed."""
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    from kvclaims.recorder.scheduler import KVClaimsScheduler

    kv_cfg: dict[str, Any] = {
        "out": str(out), "policy": policy, "run_id": run_id,
        "max_defer_steps": workload.max_defer_steps, "max_defer_s": workload.max_defer_s,
        "manifest": _replay_manifest(workload, policy, usable)}
    if workload.max_protected_blocks_per_tenant is not None:
        kv_cfg["max_protected_blocks_per_tenant"] = workload.max_protected_blocks_per_tenant
    vllm_config = _vllm_config(workload, usable, kv_cfg)
    vllm_config.cache_config.num_gpu_blocks = usable + 1  # + vLLM's null block
    kv_cache_config = KVCacheConfig(
        num_blocks=usable + 1, kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer"], FullAttentionSpec(
            block_size=workload.block_size, num_kv_heads=1, head_size=64,
            dtype=torch.float32))])
    max_len = vllm_config.model_config.max_model_len
    skipped = {r.request_id for r in workload.requests if r.num_prompt_tokens > max_len}
    for rid in sorted(skipped):
        notes.append(f"request {rid} is longer than max_model_len {max_len} at {usable} "
                     "blocks: the engine rejects it at submission (not replayed)")
    sched = KVClaimsScheduler(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
                              structured_output_manager=StructuredOutputManager(vllm_config),
                              block_size=workload.block_size)
    return sched, skipped


class _Clock:
    """The arbiter's clock in a replay: the recorded run's monotonic time at the matching
    moment (ttl and deferral deadlines then fall at the same steps as recorded)."""

    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def _step_time(workload: Workload, recorded_step: int) -> float:
    """Seconds on the recorded clock at the start of ``recorded_step`` (extrapolated past
    the recorded run at 1 ms a step)."""
    ts = workload.step_ts_ns.get(recorded_step)
    if ts is None:
        last = workload.step_ts_ns.get(workload.last_step, 0)
        ts = last + max(recorded_step - workload.last_step, 0) * 1_000_000
    return ts / 1e9


@contextmanager
def _recorder_on(clock: _Clock) -> Iterator[None]:
    """Run the recorder on the replay's clock: every ``ts_ns`` it writes is the recorded run's
    time at the matching step, so the audit judges a TTL in the replay as in the recording.

    NOTE: the recorder reads the monotonic clock through these module names (bound once, for
    the hot path); a replay runs no vLLM engine that could need the real clock meanwhile.
    """
    import kvclaims.recorder.scheduler as rec_scheduler  # NOTE: imports vLLM

    def now_ns() -> int:
        return int(clock.now_s * 1e9)

    saved = (rec_buffer._monotonic_ns, rec_hooks._now, rec_scheduler._now)
    rec_buffer._monotonic_ns = rec_hooks._now = rec_scheduler._now = now_ns
    try:
        yield
    finally:
        rec_buffer._monotonic_ns, rec_hooks._now, rec_scheduler._now = saved


def _drive(sched: Any, workload: Workload, usable: int, skipped: set[str],
           notes: list[str], clock: _Clock) -> int:
    """Run the request stream through ``sched`` until every request has finished."""
    from vllm.v1.request import RequestStatus

    # NOTE: the arbiter reads the same clock for ttl deadlines and deferral times
    sched.kvc_arbiter._clock = clock
    hasher = _block_hasher(sched)
    # NOTE: what the client did between steps (arrivals, aborts, operator releases), in the
    # recorded order: within a step, an abort before an arrival is not an arrival before it
    actions: list[tuple[int, int, str, Any]] = [
        (r.arrival_step, r.seq, "arrive", (i, r)) for i, r in enumerate(workload.requests)
        if r.request_id not in skipped]
    actions += [(r.abort_at[0], r.abort_at[1], "abort", r.request_id)
                for r in workload.requests if r.abort_at is not None
                and r.request_id not in skipped]
    actions += [(s, q, "release", c) for s, q, c in workload.operator_releases]
    actions.sort(key=lambda a: (a[0], a[1]))
    pending = deque(actions)
    step, shift, stalled = 0, 0, 0  # replay step = recorded step + shift
    limit = workload.last_step + _EXTRA_STEPS
    try:
        while True:
            if not sched.has_unfinished_requests() and pending and \
                    pending[0][0] + shift > step:
                shift = step - pending[0][0]  # idle: the next action comes now
            while pending and pending[0][0] + shift <= step:
                _, _, kind, what = pending.popleft()
                if kind == "arrive":
                    index, req = what
                    clock.now_s = req.arrival_ts_ns / 1e9
                    sched.add_request(_vllm_request(req, index, workload.block_size, hasher))
                elif kind == "abort" and what in sched.requests:
                    sched.finish_requests([what], RequestStatus.FINISHED_ABORTED)
                elif kind == "release":
                    sched.kvc_release_claim(what)
            if not pending and not sched.has_unfinished_requests():
                break
            if step >= limit or stalled >= _STALL_STEPS:
                waiting = sorted(r for r in sched.requests)
                notes.append(f"replay stopped after {step} steps: requests {waiting[:5]} "
                             "could not be scheduled (they never fit the pool)")
                break
            clock.now_s = _step_time(workload, step + 1 - shift)
            output = sched.schedule()
            stalled = 0 if output.total_num_scheduled_tokens else stalled + 1
            sched.update_from_output(output, _model_output(sched, output))
            step += 1
    finally:
        sched.shutdown()
    return step


def _block_hasher(sched: Any) -> Callable[[Any], list[Any]]:
    """vLLM's own request block hasher, as its engine core builds it."""
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

    fn = get_hash_fn_by_name(sched.vllm_config.cache_config.prefix_caching_hash_algo)
    init_none_hash(fn)
    return get_request_block_hasher(sched.block_size, fn)


def _vllm_request(req: ReplayRequest, index: int, block_size: int, hasher: Any) -> Any:
    """vLLM's ``Request`` for one recorded request: synthetic prompt, the recorded output
    length, and the claim / tenant / releases it declared (``extra_args``)."""
    from vllm import SamplingParams
    from vllm.v1.request import Request

    extra: dict[str, Any] = {}
    if req.claim is not None:
        extra["kv_claim"] = dict(req.claim)
    if req.releases:
        extra["kv_claim_release"] = list(req.releases)
    if req.tenant is not None and req.claim is None:
        extra["kv_tenant"] = req.tenant
    params = SamplingParams(max_tokens=max(req.output_tokens, 1), ignore_eos=True,
                            temperature=0.0, extra_args=extra or None)
    return Request(request_id=req.request_id,
                   prompt_token_ids=prompt_tokens(req, index, block_size),
                   sampling_params=params, pooling_params=None,
                   arrival_time=req.arrival_ts_ns / 1e9, block_hasher=hasher)


def _model_output(sched: Any, output: Any) -> Any:
    """The model runner's output for one step, constructed: one new token for each request
    whose known tokens are all computed after this step (a partial prefill samples none)."""
    from vllm.v1.outputs import ModelRunnerOutput

    req_ids = list(output.num_scheduled_tokens)
    sampled: list[list[int]] = []
    for rid in req_ids:
        r = sched.requests.get(rid)
        if r is not None and r.num_computed_tokens >= r.num_tokens:
            sampled.append([_OUTPUT_TOKEN_BASE + r.num_output_tokens])
        else:
            sampled.append([])
    return ModelRunnerOutput(req_ids=req_ids,
                             req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
                             sampled_token_ids=sampled)


def _finish_manifest(out: Path, notes: list[str], steps: int) -> None:
    """Add the replay's verdict on itself to the closed run's manifest."""
    path = out / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest.setdefault("replay", {}).update(
        {"exact": not notes, "approximations": notes, "steps": steps})
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(manifest, indent=2))
    tmp.replace(path)


# -- fidelity: a replay under the recorded settings against the recording -------------------------

#: The aspects compared, in report order.
FIDELITY_ASPECTS: tuple[str, ...] = (
    "requests", "refusals", "prefix_hits", "blocks", "evictions", "claims", "losses", "steps")


def fidelity(recorded: str | Path, replayed: str | Path, *, examples: int = 5) -> dict[str, Any]:
    """Compare a replay with the recorded run, aspect by aspect (``FIDELITY_ASPECTS``).

    Each aspect is a multiset of event signatures without seqs, timestamps or hash values
    (a block is named by the request and position that first cached it in its own trace, so
    the replay's synthetic content compares with the recorded one): per aspect the counts,
    how many match and a few signatures only one side has. ``exact`` is True when every
    aspect matches; ``steps`` (the step of each request event) is reported apart from it, as
    the recorded timing a replay reproduces or not.
    """
    rec, rep = _signatures(Path(recorded)), _signatures(Path(replayed))
    aspects = {}
    for name in FIDELITY_ASPECTS:
        a, b = rec[name], rep[name]
        missing, extra = a - b, b - a
        aspects[name] = {"recorded": sum(a.values()), "replayed": sum(b.values()),
                         "matched": sum((a & b).values()),
                         "only_recorded": [_show(s) for s in list(missing.elements())[:examples]],
                         "only_replayed": [_show(s) for s in list(extra.elements())[:examples]]}
    exact = all(not v["only_recorded"] and not v["only_replayed"]
                for k, v in aspects.items() if k != "steps")
    return {"recorded": str(recorded), "replayed": str(replayed), "exact": exact,
            "same_steps": not aspects["steps"]["only_recorded"]
            and not aspects["steps"]["only_replayed"], "aspects": aspects}


def _show(sig: tuple[Any, ...]) -> str:
    return " ".join("-" if v is None else str(v) for v in sig)


def _signatures(run_dir: Path) -> dict[str, Counter]:
    """The comparable signatures of one run directory's events and reconstructed losses."""
    audit = kvclaims.open([run_dir])
    try:
        rows = audit.sql("""
            SELECT event, step, request_id, position, block_hash, cause, by_request_id,
                   claim_id, reason, released_by, blocks_required, free_blocks,
                   protected_blocks, shortfall_blocks, blocking_claim_ids, finish_reason,
                   num_cached_tokens, num_output_tokens
            FROM events ORDER BY seq""").fetchall()
        losses = audit.sql("SELECT block_hash, label, list_sort(claim_ids), by_request_id, "
                           "cause FROM losses ORDER BY seq").fetchall()
    finally:
        audit.close()
    ident: dict[int, tuple[str, int]] = {}
    for r in rows:
        if r[0] in ("block_cached", "block_hit") and r[4] is not None:
            ident.setdefault(int(r[4]), (r[2], r[3]))

    def name(h: Any) -> tuple[Any, Any] | None:
        return ident.get(int(h), ("?", "?")) if h is not None else None

    out: dict[str, Counter] = {k: Counter() for k in FIDELITY_ASPECTS}
    for (event, step, rid, pos, h, cause, by, cid, reason, released_by, required, free,
         protected, shortfall, blocking, finish, cached, n_out) in rows:
        if event.startswith("request_"):
            out["requests"][(event, rid, required, free, protected, finish, cached, n_out)] += 1
            out["steps"][(event, rid, step)] += 1
            if event in ("request_deferred", "request_refused"):
                out["refusals"][(event, rid, shortfall, tuple(sorted(blocking or ())),
                                 reason)] += 1
        elif event == "block_hit":
            out["prefix_hits"][(rid, pos)] += 1
        elif event in ("block_cached", "block_allocated", "block_freed"):
            out["blocks"][(event, rid, pos)] += 1
        elif event == "block_evicted":
            out["evictions"][(name(h), cause, by)] += 1
        elif event == "claim_harmed":
            out["claims"][(event, cid, name(h))] += 1
        elif event.startswith("claim_"):
            out["claims"][(event, cid, reason, by, released_by, pos)] += 1
    for h, label, claim_ids, by, cause in losses:
        out["losses"][(name(h), label, tuple(claim_ids or ()), by, cause)] += 1
    return out


# -- the whole command -----------------------------------------------------------------------------

SWEEP_POLICIES: tuple[str, ...] = ("native", "write_no_admit", "hard_protected")
SWEEP_CAPACITIES: tuple[int, ...] = (80, 90, 100, 110, 120, 130, 150)


@dataclass
class WhatIf:
    """A what-if over one recorded run: the points replayed and the comparison."""

    source: Path
    out: Path
    points: list[ReplayResult]
    rows: list[dict[str, Any]]
    fidelity: dict[str, Any] | None
    seconds: float


def whatif(run: str | Path, policies: Iterable[str], capacities: Iterable[int],
           out: str | Path, *, check_fidelity: bool = True,
           progress: Callable[[str], None] | None = None) -> WhatIf:
    """Replay the recorded run ``run`` at every (policy, capacity) point into ``out/<point>``;
    compare each with the recording (``summarize``); where a point is the recorded policy and
    pool, measure its fidelity. Writes ``out/whatif.json``."""
    started = time.perf_counter()
    workload = read_workload(run)
    points = [(get_policy(p).name, int(c)) for p in policies for c in capacities]
    if not points:
        raise InputError("whatif needs at least one policy and one capacity")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for i, (policy, usable) in enumerate(points):
        if progress:
            progress(f"point {i + 1}/{len(points)}: {policy} @ {usable}")
        results.append(replay(workload, policy, usable, out / f"{policy}-{usable}"))
    if progress:
        progress("auditing every point")
    rows = summarize([workload.source_dir, *[r.run_dir for r in results]],
                     ["recorded", *[f"{r.policy}@{r.usable_blocks}" for r in results]])
    fid = None
    own = next((r for r in results if r.policy == workload.policy
                and r.usable_blocks == workload.usable_blocks), None)
    if check_fidelity and own is not None:
        fid = fidelity(workload.source_dir, own.run_dir)
    result = WhatIf(workload.source_dir, out, results, rows, fid,
                    time.perf_counter() - started)
    (out / "whatif.json").write_text(json.dumps(to_json(result), indent=2, default=str))
    return result


def to_json(result: WhatIf) -> dict[str, Any]:
    """The what-if as plain JSON (``whatif.json``, ``--json``)."""
    return {"source": str(result.source), "out": str(result.out),
            "seconds": round(result.seconds, 3),
            "points": [{"run_dir": str(p.run_dir), "run_id": p.run_id, "policy": p.policy,
                        "usable_blocks": p.usable_blocks, "steps": p.steps,
                        "seconds": round(p.seconds, 4), "exact": p.exact,
                        "approximations": p.approximations} for p in result.points],
            "comparison": result.rows, "fidelity": result.fidelity}
