"""Python helpers for applications that declare claims through vLLM's request API."""

from __future__ import annotations

from typing import Any

from kvclaims.contract.schema import InputError


def claim_args(claim_id: str, *, tenant: str | None = None, protection_mode: str | None = None,
               threshold_blocks: int | None = None, ttl_s: float | None = None,
               value: float | None = None) -> dict[str, Any]:
    """``extra_args`` for ``SamplingParams`` declaring a claim on the request's prompt prefix."""
    fields = {"claim_id": claim_id, "tenant": tenant, "protection_mode": protection_mode,
              "threshold_blocks": threshold_blocks, "ttl_s": ttl_s, "value": value}
    return {"kv_claim": {k: v for k, v in fields.items() if v is not None}}


def release_args(claim_id: str | list[str], tenant: str) -> dict[str, Any]:
    """``extra_args`` for a request of ``tenant`` releasing its own claims.

    NOTE: vLLM authenticates no one: ``kv_tenant`` must be set by a trusted gateway in front
    of the server, never taken from the end user as is.
    """
    return {"kv_claim_release": claim_id, "kv_tenant": tenant}


def release_claim(llm: Any, claim_id: str | list[str], *, tenant: str | None = None) -> None:
    """Release claims through a running ``vllm.LLM``.

    Without ``tenant``: the operator's release, called on the in-process engine's scheduler and
    recorded with ``released_by="operator"`` (raises ``InputError`` when the engine runs in
    its own process: there is no trusted path to it from here). With ``tenant``: a one-token
    request of that tenant carrying ``kv_claim_release`` (works for any engine); it is honoured
    only for the tenant's own claims (``released_by="tenant"``), otherwise recorded as
    ``claim_release_refused``.
    """
    ids = [claim_id] if isinstance(claim_id, str) else list(claim_id)
    if tenant is None:
        scheduler = in_process_scheduler(llm)
        if scheduler is None:
            raise InputError("operator release needs the engine in this process "
                             "(VLLM_ENABLE_V1_MULTIPROCESSING=0); otherwise release as the "
                             "claim's tenant: release_claim(llm, ids, tenant=...)")
        for cid in ids:
            scheduler.kvc_release_claim(cid)
        return
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=1, extra_args=release_args(ids, tenant))
    llm.generate([TokensPrompt(prompt_token_ids=[1])], params, use_tqdm=False)


def in_process_scheduler(llm: Any) -> Any:
    """The recorder's scheduler of an ``LLM`` / ``LLMEngine`` whose engine runs in this
    process, or None."""
    engine = getattr(llm, "llm_engine", llm)
    core = getattr(getattr(engine, "engine_core", None), "engine_core", None)
    scheduler = getattr(core, "scheduler", None)
    return scheduler if hasattr(scheduler, "kvc_release_claim") else None
