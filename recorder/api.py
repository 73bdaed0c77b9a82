"""Python helpers for applications that declare claims through vLLM's request API."""

from __future__ import annotations

from typing import Any


def claim_args(claim_id: str, *, tenant: str | None = None, protection_mode: str | None = None,
               threshold_blocks: int | None = None, ttl_s: float | None = None,
               value: float | None = None) -> dict[str, Any]:
    """``extra_args`` for ``SamplingParams`` declaring a claim on the request's prompt prefix."""
    fields = {"claim_id": claim_id, "tenant": tenant, "protection_mode": protection_mode,
              "threshold_blocks": threshold_blocks, "ttl_s": ttl_s, "value": value}
    return {"kv_claim": {k: v for k, v in fields.items() if v is not None}}


def release_claim(llm: Any, claim_id: str | list[str]) -> None:
    """Release claims through a running ``vllm.LLM`` (in-process or with its engine process).

    NOTE: the release travels as a one-token request carrying ``{"kv_claim_release": ...}``, the
    same path as over HTTP, so it is ordered with the engine's other requests and recorded as
    ``claim_released`` whether or not the engine lives in this process.
    """
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=1, extra_args={"kv_claim_release": claim_id})
    llm.generate([TokensPrompt(prompt_token_ids=[1])], params, use_tqdm=False)
