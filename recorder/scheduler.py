"""vLLM's v1 schedulers with the kvclaims recorder and claim arbiter.

Attach it through vLLM's own extension point, with no patch to vLLM:

- Python: ``LLM(..., scheduler_cls="kvclaims.recorder.scheduler.KVClaimsScheduler",
  additional_config={"kvclaims": {"out": "runs/r1", "policy": "hard_protected"}})``
- server: ``--scheduler-cls kvclaims.recorder.scheduler.KVClaimsScheduler
  --additional-config '{"kvclaims": {"out": "runs/r1"}}'``

``KVClaimsScheduler`` builds whichever scheduler vLLM itself would have built: when vLLM's
config has ``scheduler_config.async_scheduling`` on (vLLM 0.32's default on GPUs) it returns a
``KVClaimsAsyncScheduler`` (over vLLM's ``AsyncScheduler``), otherwise a ``KVClaimsScheduler``
(over ``Scheduler``). Both share ``KVClaimsMixin``: identical events and enforcement.

Configuration keys (``additional_config["kvclaims"]``, or environment variables
``KVCLAIMS_OUT`` / ``KVCLAIMS_POLICY`` / ``KVCLAIMS_RUN_ID`` when absent): ``out`` (run
directory; default ``./kvclaims-runs/<run_id>``), ``policy`` (default ``native``), ``run_id``,
``max_defer_steps`` (default 1) and ``max_defer_s`` (default 0: a request infeasible because
of protected blocks is refused once it has been deferred that many steps and that long),
``max_protected_blocks_per_tenant`` (default unlimited), ``manifest`` (extra manifest keys,
e.g. ``scenario``).

NOTE: invariants
- every attribute the recorder adds to vLLM's objects is named ``kvc_*``; the only other names
  are the vLLM methods it overrides (``tests/test_recorder_names.py`` checks both);
- whatever goes wrong in recording, the engine keeps serving: configuration problems are
  logged and the recorder falls back to defaults; a failing hook or arbiter call is caught,
  counted and recorded as ``hook_failed`` (fail-open, never silent).
"""

from __future__ import annotations

import logging
import os
import platform
import time
import uuid
from operator import attrgetter
from pathlib import Path
from time import monotonic_ns as _now
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs
from vllm.v1.request import RequestStatus

from kvclaims.recorder import hooks
from kvclaims.recorder.arbiter import ClaimArbiter
from kvclaims.recorder.buffer import EventBuffer
from kvclaims.recorder.claims import declared_claim_id, raw_claim, release_ids
from kvclaims.contract.policies import MODE_ENFORCEMENT, POLICIES, get_policy, lowering
from kvclaims.contract.schema import InputError
from kvclaims.contract.trace_writer import RunWriter

logger = logging.getLogger("kvclaims.recorder")

REFUSAL_STOP_REASON = "kv_claim_refused"
# str(FinishReason) per reason (vLLM's __str__ is a Python call; the texts never change)
_REASON_TEXT: dict[Any, str] = {}
_MAX_LOGGED_FAILURES = 10


def recorder_config(vllm_config: Any) -> dict[str, Any]:
    """The recorder's settings: ``additional_config["kvclaims"]``, else environment variables."""
    extra = getattr(vllm_config, "additional_config", None) or {}
    cfg = dict(extra.get("kvclaims", {})) if isinstance(extra, dict) else {}
    for key, env in (("out", "KVCLAIMS_OUT"), ("policy", "KVCLAIMS_POLICY"),
                     ("run_id", "KVCLAIMS_RUN_ID")):
        if key not in cfg and os.environ.get(env):
            cfg[key] = os.environ[env]
    return cfg


def async_scheduling_on(vllm_config: Any) -> bool:
    """Whether vLLM resolved async scheduling on (it then builds ``AsyncScheduler``)."""
    sched = getattr(vllm_config, "scheduler_config", None)
    return bool(getattr(sched, "async_scheduling", False))


def _scheduler_settings(vllm_config: Any) -> dict[str, int | None]:
    """vLLM's scheduling limits of this engine (``run_started``, schema 3): a replay of the run
    schedules with the same token budget per step (chunked prefill) and the same batch size."""
    sched = getattr(vllm_config, "scheduler_config", None)

    def number(name: str) -> int | None:
        value = getattr(sched, name, None)
        return int(value) if isinstance(value, int) and not isinstance(value, bool) else None

    return {"max_num_batched_tokens": number("max_num_batched_tokens"),
            "max_num_seqs": number("max_num_seqs")}


def _tenant_limit(cfg: dict[str, Any]) -> int | None:
    value = cfg.get("max_protected_blocks_per_tenant")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        logger.error("kvclaims: max_protected_blocks_per_tenant must be an integer >= 0, got "
                     "%r; no per-tenant limit", value)
        return None
    return value


class KVClaimsMixin:
    """Records block, request and claim events and enforces claims per the run policy.

    Mixed in before vLLM's ``Scheduler`` or ``AsyncScheduler``; every name it adds is
    ``kvc_*``.
    """

    # vLLM attributes the mixin reads (set by vLLM's own __init__)
    kv_cache_manager: Any
    block_size: int
    requests: dict[str, Any]

    # NOTE: False until kvc_setup has run. A scheduler built without __init__ (vLLM's own
    # tests build one with object.__new__ and set its attributes by hand) is plain vLLM:
    # every override below passes straight through.
    kvc_ready: bool = False
    kvc_refusal_reason = REFUSAL_STOP_REASON
    # set by ``hooks.install``: whether a hit can only name copies the arbiter knows
    kvc_hits_mirrored: bool = False

    def __init__(self, vllm_config: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(vllm_config, *args, **kwargs)  # type: ignore[call-arg]
        self.kvc_setup(vllm_config)

    def kvc_setup(self, vllm_config: Any) -> None:
        """Open the run directory, build the arbiter and install the block-pool hooks."""
        cfg = recorder_config(vllm_config)
        try:
            policy = get_policy(str(cfg.get("policy", "native")))
        except InputError as exc:
            logger.error("kvclaims: %s; recording with policy 'native'", exc)
            policy = POLICIES["native"]
        self.kvc_policy = policy
        self.kvc_run_id = str(cfg.get("run_id") or f"run-{time.strftime('%Y%m%dT%H%M%S')}-"
                              f"{uuid.uuid4().hex[:6]}")
        pool = self.kv_cache_manager.block_pool
        self.kvc_num_blocks = pool.num_gpu_blocks
        self.kvc_usable_blocks = pool.num_gpu_blocks - 1  # vLLM's block 0 is the null block
        self.kvc_hook_failures = 0
        limit = _tenant_limit(cfg)
        max_defer_steps = int(cfg.get("max_defer_steps", 1))
        max_defer_s = float(cfg.get("max_defer_s", 0.0))
        run_info = self.kvc_run_info(vllm_config, cfg, limit)
        # NOTE: the settings a replay needs (schema 3): what this scheduler and arbiter use
        run_info.update(_scheduler_settings(vllm_config), max_defer_steps=max_defer_steps,
                        max_defer_s=max_defer_s)
        out = Path(cfg.get("out") or Path("kvclaims-runs") / self.kvc_run_id)
        self.kvc_events: EventBuffer | None = None
        self.kvc_stage: Any = _discard_entry
        self.kvc_emit: Any = _discard
        self.kvc_emit_many: Any = _discard_many
        self.kvc_advance_step: Any = _no_step
        try:
            # step 0: everything before the first schedule() (run_started, early arrivals)
            self.kvc_events = EventBuffer(RunWriter(out, run_info), self.kvc_run_id, step=0)
            # NOTE: every event of the engine is staged (no lock per event; the buffer has
            # already emitted run_started): the hot hooks stage their entries directly,
            # the rarer events (arbiter, failures) through the kwargs form
            self.kvc_stage = self.kvc_events.stage
            self.kvc_emit = self.kvc_events.emit_staged
            # the arbiter's rare bulk events (claim_bound): locked, after the staged ones
            self.kvc_emit_many = self.kvc_events.emit_many
            self.kvc_advance_step = self.kvc_events.advance_step
        except Exception:  # noqa: BLE001 - an unwritable run directory must not stop serving
            logger.exception("kvclaims: cannot record to %s; serving without a trace", out)
        self.kvc_reuse_denied: set[str] = set()
        self.kvc_tenants: dict[str, str] = {}
        self.kvc_admitted_cached_tokens: dict[str, int] = {}
        self.kvc_to_refuse: dict[str, str] = {}  # request -> client-visible stop reason
        self.kvc_pending_admission: dict[str, Any] = {}
        self.kvc_arbiter = ClaimArbiter(
            policy, self.kvc_usable_blocks, self.kvc_emit,
            pin=lambda b: pool.kvc_pin(b), unpin=lambda b: pool.kvc_unpin(b),
            max_defer_steps=max_defer_steps, max_defer_s=max_defer_s,
            lookup=lambda key: hooks.cached_blocks(pool, key),
            max_protected_blocks_per_tenant=limit, emit_many=self.kvc_emit_many)
        hooks.install(self)
        self.kvc_ready = True
        logger.info("kvclaims: recording run %s (policy %s, %s) to %s", self.kvc_run_id,
                    policy.name, type(self).__name__, out)

    def kvc_run_info(self, vllm_config: Any, cfg: dict[str, Any],
                     tenant_limit: int | None) -> dict[str, Any]:
        """The run facts and extra manifest keys (lowering verdicts, hardware, ...)."""
        import vllm

        model = str(getattr(vllm_config.model_config, "served_model_name", None)
                    or vllm_config.model_config.model)
        policy = self.kvc_policy
        info: dict[str, Any] = {
            "run_id": self.kvc_run_id, "runtime": "vllm",
            "runtime_version": getattr(vllm, "__version__", "unknown"), "model": model,
            "block_size": int(vllm_config.cache_config.block_size),
            "num_blocks": int(self.kvc_num_blocks), "usable_blocks": int(self.kvc_usable_blocks),
            "policy": policy.name, "hardware": describe_hardware(),
            "scheduler": type(self).__name__,
            "hooks": "python",
            "enforcement": {"policy": policy.summary,
                            "modes": MODE_ENFORCEMENT if policy.enforce else
                            {m: "recorded only (policy does not enforce)" if m != "offloadable"
                             else MODE_ENFORCEMENT[m] for m in MODE_ENFORCEMENT}},
            "lowering": lowering(policy),
            "max_protected_blocks_per_tenant": tenant_limit,
            # NOTE: present from the start (0) so later updates never add a key while the
            # writer thread serialises the manifest; updated at every failure.
            "hook_failures": 0,
        }
        manifest_extra = cfg.get("manifest")
        if isinstance(manifest_extra, dict):
            info.update({k: v for k, v in manifest_extra.items() if k not in info})
        return info

    # ----------------------------------------------------------------- fail-open
    def kvc_safely(self, fn: Any, *args: Any, fallback: Any = None, **kwargs: Any) -> Any:
        """Run recorder or arbiter work inside vLLM's hot path; a failure never reaches vLLM.

        NOTE: failing open is deliberate: a broken arbiter serves like stock vLLM rather than
        stopping the engine. Every failure leaves a ``hook_failed`` event and is counted.
        """
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001
            self.kvc_failed(getattr(fn, "__name__", "unknown"), exc)
            return fallback

    def kvc_failed(self, hook: str, exc: BaseException) -> None:
        """Record one fail-open failure: the hook and the exception type, never its message
        (it may quote tenant data)."""
        try:
            self.kvc_hook_failures += 1
            if self.kvc_hook_failures <= _MAX_LOGGED_FAILURES:
                logger.error("kvclaims: %s failed (%s); vLLM continues unaffected", hook,
                             type(exc).__name__, exc_info=exc)
            self.kvc_emit("hook_failed", hook=hook, error_type=type(exc).__name__)
            if self.kvc_events is not None:
                self.kvc_events.writer.set_extra("hook_failures", self.kvc_hook_failures)
        except Exception:  # noqa: BLE001 - nothing may escape into vLLM
            pass

    # ----------------------------------------------------------------- requests
    def add_request(self, request: Any) -> None:
        if self.kvc_ready and request.request_id not in self.requests:
            try:
                self.kvc_on_arrival(request)
            except Exception as exc:  # noqa: BLE001 - fail open, as kvc_safely
                self.kvc_failed("kvc_on_arrival", exc)
        super().add_request(request)  # type: ignore[misc]

    def kvc_on_arrival(self, request: Any) -> None:
        """Record the arrival; hand the claim and releases it declares to the arbiter."""
        params = request.sampling_params
        extra = getattr(params, "extra_args", None) if params is not None else None
        if not extra and not self.kvc_policy.deny_reuse:
            # NOTE: the usual request (no claim, tenant or release; reuse allowed): one event
            self.kvc_stage(("request_arrived", 1, _now(), {
                "request_id": request.request_id, "tenant": None,
                "num_prompt_tokens": request.num_prompt_tokens, "claim_id": None}))
            return
        raw = raw_claim(extra)
        claim_id = declared_claim_id(raw, request.request_id) if raw is not None else None
        tenant = (raw or {}).get("tenant") or (extra or {}).get("kv_tenant")
        tenant = tenant if isinstance(tenant, str) else None
        if tenant is not None:
            self.kvc_tenants[request.request_id] = tenant
        self.kvc_emit("request_arrived", request_id=request.request_id, tenant=tenant,
                      num_prompt_tokens=request.num_prompt_tokens, claim_id=claim_id)
        releases = release_ids(extra)
        if raw is not None or releases:
            full_blocks = request.num_prompt_tokens // self.block_size
            keys = hooks.group_keys(request.block_hashes[:full_blocks]) if raw is not None \
                else []
            self.kvc_arbiter.on_request(request.request_id, raw, releases, keys, tenant)
        if self.kvc_policy.deny_reuse and claim_id is None:
            self.kvc_reuse_denied.add(request.request_id)
            self.kvc_emit("reuse_denied", request_id=request.request_id)

    def kvc_admit(self, request: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """Ask the arbiter; on defer or refuse, record it and keep the request out.

        Called for a waiting (or preempted) request asking for its first blocks
        (``RecordingKVCacheManager.allocate_slots``, with the positional and keyword
        arguments vLLM passed after ``num_new_tokens``) while a claim pins blocks or a request
        is deferred (otherwise the arbiter can only admit: ``kvc_allocate_admitting`` records
        ``ClaimArbiter.admitted_fields`` itself).
        """
        arbiter = self.kvc_arbiter
        pool = self.kv_cache_manager.block_pool
        required = -(-request.num_tokens // self.block_size)
        pinned = bool(arbiter.pins)
        if pinned:
            hits = _hit_blocks(_computed_blocks(args, kwargs))
            required -= sum(1 for b in hits if arbiter.is_protected(b.block_id))
        decision = arbiter.admit(request.request_id, required, pool.get_num_free_blocks())
        if decision.action == "admit":
            # NOTE: free_blocks after any demotion the decision made (the decision's own
            # dict); only a claim holding pins can be demoted, so without pins the pool is
            # as it was
            if pinned:
                decision.fields["free_blocks"] = pool.get_num_free_blocks()
            self.kvc_pending_admission = decision.fields
            return True
        if decision.action == "defer":
            self.kvc_emit("request_deferred", **decision.fields)
        elif decision.action == "refuse":
            self.kvc_emit("request_refused", **decision.fields)
            self.kvc_to_refuse[request.request_id] = self.kvc_refusal_message(
                request.request_id, decision.fields)
        return False

    def kvc_refusal_message(self, request_id: str, fields: dict[str, Any]) -> str:
        """The client-visible stop reason of a refusal.

        NOTE: tenants are isolated: the message counts the blocks other tenants' claims
        protect but never names their claims; the trace keeps every id.
        """
        others, own = self.kvc_arbiter.protected_split(self.kvc_tenants.get(request_id))
        text = f"{REFUSAL_STOP_REASON}: {others} blocks protected by claims of other tenants"
        if own:
            text += f", {own} by your own tenant's claims"
        return f"{text}; shortfall_blocks={fields.get('shortfall_blocks')}"

    def kvc_admitted(self, request: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """The allocation went through: record admission, hits and claim protection."""
        # NOTE: the decision's dict is staged as is: arbiter.admit builds a new one per call
        self.kvc_stage(("request_admitted", 1, _now(), self.kvc_pending_admission))
        self.kvc_admitted_cached_tokens[request.request_id] = \
            int(kwargs.get("num_new_computed_tokens", args[0] if args else 0) or 0)
        hits = _hit_blocks(_computed_blocks(args, kwargs))
        if not hits:
            return
        pool = self.kv_cache_manager.block_pool
        keys = list(map(pool.kvc_hash, hits))
        ids = tuple(map(_BLOCK_ID, hits))
        null = pool.kvc_null_id
        if not all(keys) or null in ids:  # NOTE: all(): see RecordingBlockPool's cache hook
            kept = [p for p in range(len(hits)) if keys[p] is not None and ids[p] != null]
            if not kept:
                return
            hits = [hits[p] for p in kept]
            keys = [keys[p] for p in kept]
            ids = tuple([ids[p] for p in kept])
            positions: Any = tuple(kept)
        else:
            positions = range(len(hits))  # NOTE: the usual case: no per-block Python
        self.kvc_stage(("block_hit", len(ids), _now(), _HIT, request.request_id,
                        *ids, *keys, *positions))
        arbiter = self.kvc_arbiter
        # NOTE: a hit block holds its key in vLLM's index (the manager touched it before this
        # allocation evicted anything), and where ``kvc_hits_mirrored`` the arbiter already
        # knows every such block as a copy of the key (``hooks.hits_mirrored``): for a known
        # copy ``on_resident_many`` only pins it for the protecting claims, so with none in
        # force the call would change nothing and emit nothing
        if self.kvc_hits_mirrored and not arbiter.has_protecting:
            return
        watched = arbiter.watched
        if watched and any(map(watched.__contains__, keys)):
            arbiter.on_resident_many(hits, keys)

    def kvc_release_claim(self, claim_id: str, reason: str = "released by the operator") -> bool:
        """The operator's release from Python (in-process engines; see ``kvclaims.recorder.api``);
        recorded with ``released_by="operator"``."""
        return bool(self.kvc_safely(self.kvc_arbiter.release, claim_id, reason,
                                    fallback=False))

    # ----------------------------------------------------------------- scheduler steps
    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        if self.kvc_ready:
            arbiter = self.kvc_arbiter
            if arbiter.broken:
                self.kvc_safely(arbiter.end_of_step)  # the previous step ended
            try:
                self.kvc_advance_step()
            except Exception as exc:  # noqa: BLE001 - fail open, as kvc_safely
                self.kvc_failed("advance_step", exc)
            if arbiter.has_deadlines:
                self.kvc_safely(arbiter.tick)
        return super().schedule(*args, **kwargs)  # type: ignore[misc]

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        outputs = super().update_from_output(  # type: ignore[misc]
            scheduler_output, model_runner_output)
        if self.kvc_ready and self.kvc_to_refuse:
            self.kvc_finish_refused(outputs)
        return outputs

    def kvc_finish_refused(self, outputs: dict[int, Any]) -> None:
        """Finish the refused requests with an error and the refusal as stop reason."""
        refused = self.finish_requests(  # type: ignore[attr-defined]
            list(self.kvc_to_refuse), RequestStatus.FINISHED_ERROR)
        for request in refused:
            stop = self.kvc_to_refuse.get(request.request_id, REFUSAL_STOP_REASON)
            out = EngineCoreOutput(request_id=request.request_id, new_token_ids=[],
                                   finish_reason=request.get_finished_reason(),
                                   stop_reason=stop)
            outputs.setdefault(request.client_index, EngineCoreOutputs()).outputs.append(out)
        self.kvc_to_refuse.clear()

    def _preempt_request(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        if self.kvc_ready:
            self.kvc_safely(self.kvc_on_preempt, request)
        return super()._preempt_request(request, *args, **kwargs)  # type: ignore[misc]

    def kvc_on_preempt(self, request: Any) -> None:
        """Record a preemption with what the claims held at that moment."""
        arbiter = self.kvc_arbiter
        self.kvc_emit("request_preempted", request_id=request.request_id,
                      free_blocks=self.kv_cache_manager.block_pool.get_num_free_blocks(),
                      protected_blocks=arbiter.protected_blocks,
                      usable_blocks=self.kvc_usable_blocks,
                      blocking_claim_ids=arbiter.blocking_claim_ids())

    def _free_request(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        if self.kvc_ready:
            # NOTE: a finished request (any reason) is recorded and its bookkeeping dropped
            # here, inline (no frame of its own: one per finished request)
            try:
                rid = request.request_id
                reason = request.get_finished_reason()
                text = _REASON_TEXT.get(reason)
                if text is None and reason is not None:
                    text = _REASON_TEXT[reason] = str(reason)
                self.kvc_stage(("request_finished", 1, _now(), {
                    "request_id": rid, "finish_reason": text,
                    "num_cached_tokens": self.kvc_admitted_cached_tokens.pop(rid, 0),
                    "num_output_tokens": request.num_output_tokens,
                    "reason": REFUSAL_STOP_REASON if rid in self.kvc_to_refuse else None}))
                if self.kvc_reuse_denied:
                    self.kvc_reuse_denied.discard(rid)
                if self.kvc_tenants:
                    self.kvc_tenants.pop(rid, None)
                self.kvc_arbiter.forget(rid)
            except Exception as exc:  # noqa: BLE001 - fail open, as kvc_safely
                self.kvc_failed("kvc_on_finish", exc)
        return super()._free_request(request, *args, **kwargs)  # type: ignore[misc]

    def shutdown(self) -> None:
        try:
            super().shutdown()  # type: ignore[misc]
        finally:
            if self.kvc_ready:
                self.kvc_safely(self.kvc_arbiter.end_of_step)
            if self.kvc_ready and self.kvc_events is not None:
                self.kvc_events.close()


class KVClaimsScheduler(KVClaimsMixin, Scheduler):
    """The recorder over vLLM's ``Scheduler``; builds ``KVClaimsAsyncScheduler`` instead when
    vLLM's config has async scheduling on, so ``--scheduler-cls ...KVClaimsScheduler`` never
    costs a user vLLM's async scheduling."""

    def __new__(cls, *args: Any, **kwargs: Any) -> KVClaimsScheduler:
        vllm_config = kwargs.get("vllm_config", args[0] if args else None)
        if cls is KVClaimsScheduler and async_scheduling_on(vllm_config):
            cls = KVClaimsAsyncScheduler
        return super().__new__(cls)


class KVClaimsAsyncScheduler(KVClaimsScheduler, AsyncScheduler):
    """The recorder over vLLM's ``AsyncScheduler`` (same mixin, same events and enforcement).

    NOTE: MRO: KVClaimsAsyncScheduler, KVClaimsScheduler, KVClaimsMixin, AsyncScheduler,
    Scheduler: every hook's ``super()`` reaches AsyncScheduler's overrides first.
    """


def describe_hardware() -> dict[str, Any]:
    """What the engine ran on, for the manifest (CPU model, core count, accelerator if any)."""
    info: dict[str, Any] = {"machine": platform.machine(), "cpu_count": os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next((ln.split(":", 1)[1].strip() for ln in f
                                if ln.startswith("model name")), platform.processor())
    except OSError:
        info["cpu"] = platform.processor()
    try:
        import torch

        if torch.cuda.is_available():
            info["accelerator"] = torch.cuda.get_device_name(0)
    except Exception:  # noqa: BLE001 - hardware facts are best effort
        pass
    info.setdefault("accelerator", "none (CPU backend)")
    return info


def _discard(event: str, **fields: Any) -> None:
    """The emitter used when no run directory could be opened."""


def _discard_many(event: str, n: int, fields: Any) -> None:
    """The bulk emitter used when no run directory could be opened."""


def _discard_entry(entry: Any) -> None:
    """The stager used when no run directory could be opened."""


def _no_step() -> None:
    """The step marker used when no run directory could be opened."""


_BLOCK_ID = attrgetter("block_id")
_HIT = hooks.HIT


def _computed_blocks(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``new_computed_blocks`` of an ``allocate_slots`` call (keyword or third positional)."""
    if "new_computed_blocks" in kwargs:
        return kwargs["new_computed_blocks"]
    return args[1] if len(args) > 1 else None


def _hit_blocks(new_computed_blocks: Any) -> list:
    """Blocks of the first KV-cache group that a request hit in the prefix cache."""
    if new_computed_blocks is None:
        return []
    groups = getattr(new_computed_blocks, "blocks", None)
    return list(groups[0]) if groups else []
