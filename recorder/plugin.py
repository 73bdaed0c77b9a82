"""The ``vllm.general_plugins`` entry point.

vLLM loads general plugins in every process it starts (the API server, the engine core), before
the scheduler class named by ``--scheduler-cls`` is imported. ``register`` checks that this vLLM
has the extension points the recorder relies on, so an incompatible vLLM is reported once, at
start-up, by name, instead of failing inside a scheduler step.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import sys
import warnings
from typing import Any

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


# -- the old scheduler path, for one release ----------------------------------------------------
# NOTE: before the parts moved under ``kvclaims``, deployments named the scheduler
# ``recorder.scheduler.KVClaimsScheduler``. vLLM loads this plugin before it imports the
# scheduler class, so the plugin lets that name resolve to ``kvclaims.recorder`` (with a
# DeprecationWarning) without installing a top-level ``recorder`` package; a real top-level
# ``recorder`` package, if one is installed, is left alone.
LEGACY_PACKAGE = "recorder"


class _LegacyLoader(importlib.abc.Loader):
    """Hands out the ``kvclaims.recorder`` module itself under its old name."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.real_spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        warnings.warn(f"{spec.name} is deprecated: use {self.target}", DeprecationWarning,
                      stacklevel=2)
        module = importlib.import_module(self.target)
        self.real_spec = module.__spec__
        return module

    def exec_module(self, module: Any) -> None:
        # NOTE: the import system set the alias's spec on the real module: give it back
        module.__spec__ = self.real_spec


class _LegacyFinder(importlib.abc.MetaPathFinder):
    """Resolves ``recorder`` and ``recorder.*`` to ``kvclaims.recorder`` and its modules."""

    def find_spec(self, fullname: str, path: Any = None,
                  target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != LEGACY_PACKAGE and not fullname.startswith(LEGACY_PACKAGE + "."):
            return None
        new = "kvclaims." + fullname
        ours = importlib.util.find_spec(new)
        if ours is None:
            return None
        if fullname == LEGACY_PACKAGE:
            real = importlib.machinery.PathFinder.find_spec(LEGACY_PACKAGE)
            if real is not None and real.origin != ours.origin:
                return None  # someone else's real top-level package: leave it alone
        return importlib.machinery.ModuleSpec(
            fullname, _LegacyLoader(new), is_package=fullname == LEGACY_PACKAGE)


def install_legacy_alias() -> None:
    """Let ``recorder.scheduler.KVClaimsScheduler`` keep working (deprecated, one release)."""
    # NOTE: first in line, so that a source checkout's own recorder/ folder (on sys.path) is
    # not imported a second time under the old name
    if not any(isinstance(f, _LegacyFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _LegacyFinder())


def register() -> None:
    """Entry point: verify compatibility; never raises (a plugin must not stop vLLM)."""
    install_legacy_alias()
    try:
        missing = missing_hooks()
    except Exception:  # noqa: BLE001
        logger.exception("kvclaims: compatibility check failed")
        return
    if missing:
        logger.error("kvclaims: this vLLM lacks %s; KVClaimsScheduler will not work here",
                     ", ".join(missing))
