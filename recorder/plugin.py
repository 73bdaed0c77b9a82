"""The ``vllm.general_plugins`` entry point.

vLLM loads general plugins in every process it starts (the API server, the engine core), before
the scheduler class named by ``--scheduler-cls`` is imported. ``register`` checks that this vLLM
has the extension points the recorder relies on, so an incompatible vLLM is reported once, at
start-up, by name, instead of failing inside a scheduler step.
"""

from __future__ import annotations

import importlib
import logging

logger = logging.getLogger("kvclaims.recorder")

# (module, class, methods) the recorder's subclasses override.
REQUIRED_HOOKS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("vllm.v1.core.block_pool", "BlockPool",
     ("get_new_blocks", "evict_blocks", "move_block_hashes", "cache_full_blocks",
      "free_blocks", "reset_prefix_cache", "touch")),
    ("vllm.v1.core.block_pool", "BlockHashToBlockMap", ("pop",)),
    ("vllm.v1.core.kv_cache_manager", "KVCacheManager", ("allocate_slots", "free")),
    ("vllm.v1.core.sched.scheduler", "Scheduler",
     ("add_request", "schedule", "update_from_output", "_preempt_request", "_free_request",
      "finish_requests")),
    ("vllm.v1.core.sched.async_scheduler", "AsyncScheduler", ("schedule",)),
)


def missing_hooks() -> list[str]:
    """Names of the vLLM classes or methods the recorder needs but this vLLM lacks."""
    missing: list[str] = []
    for module_name, class_name, methods in REQUIRED_HOOKS:
        try:
            cls = getattr(importlib.import_module(module_name), class_name)
        except (ImportError, AttributeError):
            missing.append(f"{module_name}.{class_name}")
            continue
        missing += [f"{class_name}.{m}" for m in methods if not callable(getattr(cls, m, None))]
    return missing


def register() -> None:
    """Entry point: verify compatibility; never raises (a plugin must not stop vLLM)."""
    try:
        missing = missing_hooks()
    except Exception:  # noqa: BLE001
        logger.exception("kvclaims: compatibility check failed")
        return
    if missing:
        logger.error("kvclaims: this vLLM lacks %s; KVClaimsScheduler will not work here",
                     ", ".join(missing))
