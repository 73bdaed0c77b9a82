"""``KVClaimsScheduler``: vLLM's v1 scheduler with the kvclaims recorder and claim arbiter.

Attach it through vLLM's own extension point, with no patch to vLLM:

- Python: ``LLM(..., scheduler_cls="recorder.scheduler.KVClaimsScheduler",
  additional_config={"kvclaims": {"out": "runs/r1", "policy": "hard_protected"}})``
- server: ``--scheduler-cls recorder.scheduler.KVClaimsScheduler
  --additional-config '{"kvclaims": {"out": "runs/r1"}}'``

Configuration keys (``additional_config["kvclaims"]``, or environment variables
``KVCLAIMS_OUT`` / ``KVCLAIMS_POLICY`` / ``KVCLAIMS_RUN_ID`` when absent): ``out`` (run
directory; default ``./kvclaims-runs/<run_id>``), ``policy`` (default ``native``), ``run_id``,
``max_defer_steps`` (default 1) and ``max_defer_s`` (default 0: a request infeasible because
of protected blocks is refused once it has been deferred that many steps and that long), ``manifest`` (extra manifest keys, e.g. ``scenario``).

NOTE: whatever goes wrong in recording, the engine keeps serving: configuration problems are
logged and the recorder falls back to defaults; event errors are counted by the buffer.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from pathlib import Path
from typing import Any

from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs
from vllm.v1.request import RequestStatus

from recorder import hooks
from recorder.arbiter import ClaimArbiter
from recorder.claims import declared_claim_id, raw_claim, release_ids
from recorder.buffer import EventBuffer
from recorder.policies import MODE_ENFORCEMENT, POLICIES, get_policy
from recorder.schema import InputError
from recorder.trace_writer import RunWriter

logger = logging.getLogger("kvclaims.recorder")

REFUSAL_STOP_REASON = "kv_claim_refused"


def recorder_config(vllm_config: Any) -> dict[str, Any]:
    """The recorder's settings: ``additional_config["kvclaims"]``, else environment variables."""
    extra = getattr(vllm_config, "additional_config", None) or {}
    cfg = dict(extra.get("kvclaims", {})) if isinstance(extra, dict) else {}
    for key, env in (("out", "KVCLAIMS_OUT"), ("policy", "KVCLAIMS_POLICY"),
                     ("run_id", "KVCLAIMS_RUN_ID")):
        if key not in cfg and os.environ.get(env):
            cfg[key] = os.environ[env]
    return cfg


class KVClaimsScheduler(Scheduler):
    """Records block, request and claim events and enforces claims per the run policy."""

    def __init__(self, vllm_config: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(vllm_config, *args, **kwargs)
        cfg = recorder_config(vllm_config)
        try:
            policy = get_policy(str(cfg.get("policy", "native")))
        except InputError as exc:
            logger.error("kvclaims: %s; recording with policy 'native'", exc)
            policy = POLICIES["native"]
        self.policy = policy
        self.run_id = str(cfg.get("run_id") or f"run-{time.strftime('%Y%m%dT%H%M%S')}-"
                          f"{uuid.uuid4().hex[:6]}")
        pool = self.kv_cache_manager.block_pool
        self.num_blocks = pool.num_gpu_blocks
        self.usable_blocks = pool.num_gpu_blocks - 1  # vLLM's block 0 is the null block
        run_info = self._run_info(vllm_config, cfg)
        out = Path(cfg.get("out") or Path("kvclaims-runs") / self.run_id)
        self.events: EventBuffer | None = None
        try:
            self.events = EventBuffer(RunWriter(out, run_info), self.run_id)
            self.emit = self.events.emit  # the buffer has already emitted run_started
        except Exception:  # noqa: BLE001 - an unwritable run directory must not stop serving
            logger.exception("kvclaims: cannot record to %s; serving without a trace", out)
            self.emit = _discard
        self.current_request_id: str | None = None
        self.reuse_denied: set[str] = set()
        self._admitted_cached_tokens: dict[str, int] = {}
        self._to_refuse: dict[str, dict[str, Any]] = {}
        self._pending_admission: dict[str, Any] = {}
        self.hook_failures = 0
        self.arbiter = ClaimArbiter(policy, self.usable_blocks, self.emit,
                                    pin=lambda b: pool.kvc_pin(b),
                                    unpin=lambda b: pool.kvc_unpin(b),
                                    max_defer_steps=int(cfg.get("max_defer_steps", 1)),
                                    max_defer_s=float(cfg.get("max_defer_s", 0.0)))
        hooks.install(self)
        logger.info("kvclaims: recording run %s (policy %s) to %s", self.run_id, policy.name, out)

    def _run_info(self, vllm_config: Any, cfg: dict[str, Any]) -> dict[str, Any]:
        import vllm

        model = str(getattr(vllm_config.model_config, "served_model_name", None)
                    or vllm_config.model_config.model)
        info: dict[str, Any] = {
            "run_id": self.run_id, "runtime": "vllm",
            "runtime_version": getattr(vllm, "__version__", "unknown"), "model": model,
            "block_size": int(vllm_config.cache_config.block_size),
            "num_blocks": int(self.num_blocks), "usable_blocks": int(self.usable_blocks),
            "policy": self.policy.name, "hardware": describe_hardware(),
            "enforcement": {"policy": self.policy.summary,
                            "modes": MODE_ENFORCEMENT if self.policy.enforce else
                            {m: "recorded only (policy does not enforce)" for m in
                             MODE_ENFORCEMENT}},
        }
        manifest_extra = cfg.get("manifest")
        if isinstance(manifest_extra, dict):
            info.update({k: v for k, v in manifest_extra.items() if k not in info})
        return info

    # ----------------------------------------------------------------- requests
    def add_request(self, request: Any) -> None:
        if request.request_id not in self.requests:
            self._on_arrival(request)
        super().add_request(request)

    def _on_arrival(self, request: Any) -> None:
        try:
            params = request.sampling_params
            extra = getattr(params, "extra_args", None) if params is not None else None
            raw = raw_claim(extra)
            claim_id = declared_claim_id(raw, request.request_id) if raw is not None else None
            tenant = (raw or {}).get("tenant") or (extra or {}).get("kv_tenant")
            self.emit("request_arrived", request_id=request.request_id,
                      tenant=tenant if isinstance(tenant, str) else None,
                      num_prompt_tokens=request.num_prompt_tokens, claim_id=claim_id)
            full_blocks = request.num_prompt_tokens // self.block_size
            self.arbiter.on_request(request.request_id, raw, release_ids(extra),
                                    request.block_hashes[:full_blocks])
            if self.policy.deny_reuse and claim_id is None:
                self.reuse_denied.add(request.request_id)
                self.emit("reuse_denied", request_id=request.request_id)
        except Exception:  # noqa: BLE001 - the engine must keep serving
            logger.exception("kvclaims: could not record the arrival of %s", request.request_id)

    def is_admission(self, request: Any) -> bool:
        """A waiting (or preempted) request asking for its first blocks."""
        return request.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED) \
            and request.request_id not in self._to_refuse

    def admit(self, request: Any, *args: Any, **kwargs: Any) -> bool:
        """Ask the arbiter; on defer or refuse, record it and keep the request out."""
        hits = _hit_blocks(kwargs.get("new_computed_blocks"))
        pinned_hits = sum(1 for b in hits if self.arbiter.is_protected(b.block_id))
        required = -(-request.num_tokens // self.block_size) - pinned_hits
        free = self.kv_cache_manager.block_pool.get_num_free_blocks()
        decision = self.arbiter.admit(request.request_id, required, free)
        if decision.action == "admit":
            # free_blocks after any demotion the decision made
            self._pending_admission = {**decision.fields, "free_blocks":
                                       self.kv_cache_manager.block_pool.get_num_free_blocks()}
            return True
        if decision.action == "defer":
            self.emit("request_deferred", **decision.fields)
        elif decision.action == "refuse":
            self.emit("request_refused", **decision.fields)
            self._to_refuse[request.request_id] = decision.fields
        return False

    def admitted(self, request: Any, *args: Any, **kwargs: Any) -> None:
        """The allocation went through: record admission, hits and claim protection."""
        self.emit("request_admitted", **self._pending_admission)
        hits = _hit_blocks(kwargs.get("new_computed_blocks"))
        self._admitted_cached_tokens[request.request_id] = \
            int(kwargs.get("num_new_computed_tokens", 0) or 0)
        hashes = request.block_hashes
        for position, block in enumerate(hits):
            if block.is_null or block.block_hash is None:
                continue
            content = hooks.content_hash(block.block_hash)
            self.emit("block_hit", block_id=block.block_id,
                      block_hash=hooks.hash64(content), position=position,
                      request_id=request.request_id)
            if position < len(hashes):
                self.arbiter.on_resident(block, content)

    def safely(self, fn: Any, *args: Any, fallback: Any = None, **kwargs: Any) -> Any:
        """Run recorder or arbiter work inside vLLM's hot path; a failure never reaches vLLM.

        NOTE: failing open is deliberate: a broken arbiter serves like stock vLLM rather than
        stopping the engine. Failures are logged (the first ten) and counted.
        """
        try:
            return fn(*args, **kwargs)
        except Exception:  # noqa: BLE001
            self.hook_failures += 1
            if self.hook_failures <= 10:
                logger.exception("kvclaims: %s failed; vLLM continues unaffected",
                                 getattr(fn, "__name__", fn))
            return fallback

    def release_claim(self, claim_id: str, reason: str = "released by API") -> bool:
        """Release a claim from Python (in-process engines); see ``recorder.api``."""
        return self.arbiter.release(claim_id, reason)

    # ----------------------------------------------------------------- scheduler steps
    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        try:
            self.arbiter.tick()
        except Exception:  # noqa: BLE001
            logger.exception("kvclaims: claim expiry check failed")
        return super().schedule(*args, **kwargs)

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        if self._to_refuse:
            self._finish_refused(outputs)
        return outputs

    def _finish_refused(self, outputs: dict[int, Any]) -> None:
        refused = self.finish_requests(list(self._to_refuse), RequestStatus.FINISHED_ERROR)
        for request in refused:
            fields = self._to_refuse.get(request.request_id, {})
            stop = (f"{REFUSAL_STOP_REASON}: blocking_claim_ids="
                    f"{','.join(fields.get('blocking_claim_ids', []))} "
                    f"shortfall_blocks={fields.get('shortfall_blocks')}")
            out = EngineCoreOutput(request_id=request.request_id, new_token_ids=[],
                                   finish_reason=request.get_finished_reason(),
                                   stop_reason=stop)
            outputs.setdefault(request.client_index, EngineCoreOutputs()).outputs.append(out)
        self._to_refuse.clear()

    def _preempt_request(self, request: Any, *args: Any, **kwargs: Any) -> None:
        self.emit("request_preempted", request_id=request.request_id)
        super()._preempt_request(request, *args, **kwargs)

    def _free_request(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        reason = request.get_finished_reason()
        self.emit("request_finished", request_id=request.request_id,
                  finish_reason=str(reason) if reason is not None else None,
                  num_cached_tokens=self._admitted_cached_tokens.pop(request.request_id, 0),
                  num_output_tokens=request.num_output_tokens,
                  reason=REFUSAL_STOP_REASON if request.request_id in self._to_refuse else None)
        self.reuse_denied.discard(request.request_id)
        return super()._free_request(request, *args, **kwargs)

    def shutdown(self) -> None:
        try:
            super().shutdown()
        finally:
            if self.events is not None:
                self.events.close()


def describe_hardware() -> dict[str, Any]:
    """What the engine ran on, for the manifest (CPU model, core count, accelerator if any)."""
    import platform

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


def _hit_blocks(new_computed_blocks: Any) -> list:
    """Blocks of the first KV-cache group that a request hit in the prefix cache."""
    if new_computed_blocks is None:
        return []
    groups = getattr(new_computed_blocks, "blocks", None)
    return list(groups[0]) if groups else []
