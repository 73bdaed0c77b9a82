"""Built-in scenarios, recorded on a real vLLM engine with ``KVClaimsScheduler``.

A scenario is a short script against a ``Driver`` (submit prompts with or without claims, step
the engine until idle, sleep on the engine's clock, abort). ``record`` builds one fresh engine,
runs the script and closes the run directory. Prompts are token-id lists (no tokenizer); each
prompt is built from whole blocks so block counts are exact.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from kvclaims.contract.schema import InputError
from kvclaims.contract.policies import get_policy
from kvclaims.sources.tiny_model import ensure_tiny_model

BLOCK_SIZE = 32  # the CPU backend needs a multiple of 32
VOCAB = 500  # token ids stay below the tiny model's vocabulary (512)


def tokens(seed: int, n_blocks: int, block_size: int = BLOCK_SIZE) -> list[int]:
    """A deterministic prompt of ``n_blocks`` whole blocks; different seeds never share a block."""
    return [1 + (seed * 7919 + i * 31 + (i * i) % 97) % (VOCAB - 1)
            for i in range(n_blocks * block_size)]


@dataclass
class Outcome:
    """What vLLM itself reported for one request (the client's view)."""

    name: str
    request_id: str
    num_prompt_tokens: int
    num_cached_tokens: int | None = None
    finish_reason: str | None = None
    stop_reason: str | None = None
    num_output_tokens: int = 0


class Driver:
    """Drives one ``LLMEngine`` step by step; names requests for the scenario's readers."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.outcomes: dict[str, Outcome] = {}  # by name, which is vLLM's external request id

    def submit(self, name: str, prompt: list[int], *, claim: dict[str, Any] | None = None,
               max_tokens: int = 1, extra: dict[str, Any] | None = None) -> str:
        """Queue a request; ``claim`` becomes ``extra_args["kv_claim"]``."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        extra_args = dict(extra or {})
        if claim is not None:
            extra_args["kv_claim"] = claim
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0,
                                extra_args=extra_args or None)
        request_id = self.engine.add_request(name, TokensPrompt(prompt_token_ids=prompt), params)
        outcome = Outcome(name, request_id, len(prompt))
        self.outcomes[name] = outcome
        return request_id

    def run(self, max_steps: int = 100_000) -> None:
        """Step the engine until every queued request has finished."""
        for _ in range(max_steps):
            if not self.engine.has_unfinished_requests():
                return
            self.step()
        raise RuntimeError("scenario did not finish within max_steps")

    def step(self) -> None:
        """One engine step; record every finished request's outcome."""
        for out in self.engine.step():
            if not out.finished:
                continue
            outcome = self.outcomes.get(out.request_id)
            if outcome is None:
                continue
            completion = out.outputs[0] if out.outputs else None
            outcome.num_cached_tokens = out.num_cached_tokens
            outcome.finish_reason = completion.finish_reason if completion else None
            stop = completion.stop_reason if completion else None
            outcome.stop_reason = None if stop is None else str(stop)
            outcome.num_output_tokens = len(completion.token_ids) if completion else 0

    def sleep(self, seconds: float) -> None:
        """Let the engine clock advance (claim ttls are checked at each scheduler step)."""
        time.sleep(seconds)

    def abort(self, name: str) -> None:
        """Abort a queued or running request."""
        self.engine.abort_request([self.outcomes[name].request_id], internal=True)
        self.outcomes[name].finish_reason = "abort"


ScenarioFn = Callable[[Driver, str], None]


@dataclass(frozen=True)
class Scenario:
    """A named, documented scenario."""

    name: str
    run: ScenarioFn
    summary: str
    default_policy: str
    default_usable_blocks: int
    engine: dict[str, Any] = field(default_factory=dict)  # extra kvclaims config


TTL_S = 2.0  # the expiring claims' ttl; the scenarios wait a little longer before pressure


def _resident_then_active(d: Driver, claim: dict[str, Any]) -> None:
    """A 60-block resident prompt carrying ``claim``, a 70-block active prompt (after the claim's
    ttl if it has one), then the resident prompt again: its cache hit shows what survived."""
    d.submit("resident", tokens(1, 60), claim={"claim_id": "claim:resident",
                                               "tenant": "tenant-resident", **claim})
    d.run()
    if "ttl_s" in claim:
        d.sleep(claim["ttl_s"] + 0.2)
    d.submit("active", tokens(2, 70))
    d.run()
    d.submit("probe", tokens(1, 60))
    d.run()


def resident60_active70(d: Driver, policy: str) -> None:
    """The paper's case; the claim's mode is the policy's default (``ttl_s`` under ttl_expiry)."""
    _resident_then_active(d, {"ttl_s": TTL_S} if policy == "ttl_expiry" else {})


def lifecycle_demote(d: Driver, policy: str) -> None:
    """resident60_active70 with a demotable claim: demoted at the conflict, then evicted."""
    _resident_then_active(d, {"protection_mode": "demotable"})


def lifecycle_expire(d: Driver, policy: str) -> None:
    """resident60_active70 with an expiring claim that lapses before the active request."""
    _resident_then_active(d, {"protection_mode": "expiring", "ttl_s": TTL_S})


def live_pressure(d: Driver, policy: str) -> None:
    """40 protected blocks + a 46-block request over 67 allocatable blocks, submitted together
    with small requests: the big one is deferred, then refused (shortfall 19); the small ones
    are served."""
    d.submit("live-resident", tokens(1, 40), claim={"claim_id": "claim:live-resident",
                                                    "tenant": "tenant-live",
                                                    "protection_mode": "hard_protected"})
    d.run()
    d.submit("active", tokens(2, 46))
    for i in range(3):
        d.submit(f"small-{i}", tokens(10 + i, 4), max_tokens=4)
    d.run()


def multi_tenant(d: Driver, policy: str) -> None:
    """Six tenants, claims of every protection mode, a shared prefix, and enough pressure that
    every loss label and every request outcome occurs (docs/scenarios.md walks through it)."""
    shared = tokens(100, 8)  # a system prompt every tenant shares
    d.submit("a-doc", shared + tokens(101, 12), claim={  # hard: protected until released
        "claim_id": "a:doc", "tenant": "tenant-a", "protection_mode": "hard_protected"})
    d.submit("b-doc", shared + tokens(102, 12), claim={  # demoted at the first conflict
        "claim_id": "b:doc", "tenant": "tenant-b", "protection_mode": "demotable",
        "value": 0.5})
    d.submit("c-doc", tokens(103, 10), claim={  # lapses after TTL_S
        "claim_id": "c:doc", "tenant": "tenant-c", "protection_mode": "expiring", "ttl_s": TTL_S})
    d.submit("d-best", tokens(104, 6), claim={  # not pinned: harmed under pressure
        "claim_id": "d:best", "tenant": "tenant-d", "protection_mode": "best_effort"})
    d.submit("d-soft", tokens(105, 6), claim={  # evicted after every unclaimed block
        "claim_id": "d:soft", "tenant": "tenant-d", "protection_mode": "soft_priority"})
    d.submit("e-off", tokens(106, 4), claim={  # rejected: no lower tier here; still served
        "claim_id": "e:off", "tenant": "tenant-e", "protection_mode": "offloadable"})
    d.submit("e-bad", tokens(107, 2), claim={  # rejected, still served
        "claim_id": "e:bad", "tenant": "tenant-e", "protection_mode": "pinned-forever"})
    d.run()
    d.submit("a-reader", shared + tokens(101, 12) + tokens(108, 2))  # prefix-cache hits
    d.submit("f-scratch", tokens(109, 6))
    d.run()
    d.sleep(TTL_S + 0.2)  # c:doc expires at the next scheduler step
    d.submit("g-big", tokens(110, 50))  # 32 protected + 50 > 80: b:doc is demoted
    d.run()
    d.submit("x-hold", tokens(111, 20), claim={
        "claim_id": "x:hold", "tenant": "tenant-x", "protection_mode": "hard_protected"})
    d.run()
    d.submit("h-wait", tokens(112, 45))  # 40 protected + 45 > 80: deferred ...
    for _ in range(3):
        d.step()
    d.submit("x-release", tokens(113, 1), extra={"kv_claim_release": "x:hold",
                                                 "kv_tenant": "tenant-x"})  # the owner
    d.run()  # ... until x:hold is released: then served
    d.submit("i-huge", tokens(114, 75))  # 20 protected + 75 > 80: deferred, then refused
    d.run()
    for i in range(3):  # decode pressure in a nearly full pool: preemption
        d.submit(f"j-long-{i}", tokens(120 + i, 12), max_tokens=400)
    d.run()
    d.submit("k-abort", tokens(130, 8), max_tokens=400)
    d.step()
    d.abort("k-abort")
    d.run()
    d.submit("a-release", tokens(131, 1), extra={"kv_claim_release": "a:doc",
                                                 "kv_tenant": "tenant-a"})
    d.submit("l-big", tokens(132, 70))  # a:doc's blocks go now: relaxation
    d.run()


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("resident60_active70", resident60_active70,
             "60-block resident prefix with a claim, then a 70-block active prompt, then the "
             "resident prompt again", "native", 80),
    Scenario("lifecycle_demote", lifecycle_demote,
             "resident60_active70 with a demotable claim", "demote_on_conflict", 80),
    Scenario("lifecycle_expire", lifecycle_expire,
             "resident60_active70 with an expiring claim (ttl 2 s)", "ttl_expiry", 80),
    Scenario("live_pressure", live_pressure,
             "40 protected + 46 required over 67 allocatable: deferred, then refused",
             "hard_protected", 67),
    Scenario("multi_tenant", multi_tenant,
             "six tenants, every protection mode, a shared prefix, every label and outcome",
             "hard_protected", 80, {"max_defer_steps": 20}),
)}


def get_scenario(name: str) -> Scenario:
    """Look a scenario up by name, with a clear error listing the choices."""
    try:
        return SCENARIOS[name]
    except KeyError:
        raise InputError(f"unknown scenario {name!r}; choose one of {sorted(SCENARIOS)}") \
            from None


def engine_args(model_dir: Path, usable_blocks: int, kvclaims: dict[str, Any],
                block_size: int = BLOCK_SIZE) -> dict[str, Any]:
    """``LLM``/``EngineArgs`` keyword arguments for a recorded engine of ``usable_blocks``."""
    return dict(
        model=str(model_dir), skip_tokenizer_init=True, enable_prefix_caching=True,
        block_size=block_size, num_gpu_blocks_override=usable_blocks + 1,  # + the null block
        max_model_len=usable_blocks * block_size, enforce_eager=True, dtype="float32",
        gpu_memory_utilization=float(os.environ.get("KVCLAIMS_GPU_MEMORY_UTILIZATION", 0.3)),
        scheduler_cls="kvclaims.recorder.scheduler.KVClaimsScheduler",
        additional_config={"kvclaims": kvclaims},
    )


def default_run_id(scenario: str, policy: str, usable: int,
                   now: datetime | None = None) -> str:
    """A run id no other recording shares: ``<scenario>-<policy>-<usable>-<UTC time>``
    (``20261201T162511.123456Z``). NOTE: the time, to the microsecond, keeps two recordings
    of one configuration apart (a new demo run beside a shipped sweep point)."""
    now = now or datetime.now(timezone.utc)
    return f"{scenario}-{policy}-{usable}-{now.astimezone(timezone.utc):%Y%m%dT%H%M%S.%fZ}"


def check_run_id(run_id: str) -> str:
    """A run id given on the command line: 1-200 printable characters without '/', '@'
    (``<id>@<path>`` tells runs apart that share an id) or surrounding spaces."""
    if (not run_id or len(run_id) > 200 or run_id != run_id.strip()
            or any(c in run_id for c in "/@\\") or not run_id.isprintable()):
        raise InputError(f"bad run id {run_id[:60]!r}: 1-200 printable characters, no "
                         "'/', '\\', '@' and no surrounding spaces")
    return run_id


def record(scenario: str | Scenario, usable_blocks: int | None, policy: str | None, out: Path,
           *, model_dir: Path | None = None, run_id: str | None = None,
           extra_manifest: dict[str, Any] | None = None) -> dict[str, Any]:
    """Record one scenario (a built-in name, or a ``Scenario``) into ``out`` on a fresh engine;
    return the client's view. The engine runs in-process unless
    ``VLLM_ENABLE_V1_MULTIPROCESSING`` says otherwise.
    """

    spec = scenario if isinstance(scenario, Scenario) else get_scenario(scenario)
    scenario = spec.name
    policy = get_policy(policy or spec.default_policy).name
    usable = usable_blocks or spec.default_usable_blocks
    if usable < 2:
        raise InputError("--usable-blocks must be at least 2")
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise InputError(f"{out} already exists and is not empty")
    model = Path(model_dir) if model_dir else ensure_tiny_model()
    run_id = check_run_id(run_id) if run_id is not None else default_run_id(
        scenario, policy, usable)
    manifest = {"scenario": scenario, **(extra_manifest or {})}
    cfg = {"out": str(out), "policy": policy, "run_id": run_id, "manifest": manifest,
           **spec.engine}
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from vllm import EngineArgs, LLMEngine

    engine = LLMEngine.from_engine_args(EngineArgs(**engine_args(model, usable, cfg)))
    driver = Driver(engine)
    try:
        spec.run(driver, policy)
    finally:
        engine.engine_core.shutdown()
    view = {"scenario": scenario, "policy": policy, "usable_blocks": usable, "run_id": run_id,
            "requests": [vars(o) for o in driver.outcomes.values()]}
    (out / "client_outputs.json").write_text(json.dumps(view, indent=2))
    return view
