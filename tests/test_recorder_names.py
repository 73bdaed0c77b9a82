"""The recorder never shadows vLLM: every name it adds to vLLM's objects is ``kvc_*`` (issue 9).

Assigning ``self.policy`` once overwrote vLLM's ``Scheduler.policy`` and broke priority
scheduling. These checks read the recorder's source and vLLM's installed classes (no engine).
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from types import SimpleNamespace

import pytest

pytest.importorskip("vllm")

from vllm.v1.core.block_pool import BlockHashToBlockMap, BlockPool  # noqa: E402
from vllm.v1.core.kv_cache_manager import KVCacheManager  # noqa: E402
from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402

from kvclaims.recorder import hooks, scheduler  # noqa: E402

# The vLLM methods the recorder overrides on purpose (everything else it adds is kvc_*).
OVERRIDES = {
    "scheduler": {"add_request", "schedule", "update_from_output", "_preempt_request",
                  "_free_request", "shutdown", "__init__", "__new__"},
    "pool": {"get_new_blocks", "evict_blocks", "move_block_hashes", "cache_full_blocks",
             "free_blocks", "reset_prefix_cache"},
    "index": {"pop"},
    "manager": {"allocate_slots", "free"},
}


def assigned_self_attributes(source: str) -> set[str]:
    """Names assigned as ``self.X = ...`` / ``obj.X = ...`` anywhere in ``source``."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(textwrap.dedent(source))):
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        for t in targets:
            for el in (t.elts if isinstance(t, ast.Tuple) else [t]):
                if isinstance(el, ast.Attribute) and isinstance(el.value, ast.Name):
                    names.add(el.attr)
    return names


def added_names(*classes: type, extra_source: str = "") -> set[str]:
    """What recorder classes add to the vLLM object they are mixed into."""
    names: set[str] = set()
    for cls in classes:
        # NOTE: annotations add no attribute; _abc_impl is ABCMeta's own bookkeeping
        names |= {n for n in vars(cls) if not (n.startswith("__") and n.endswith("__"))
                  and n != "_abc_impl"}
        names |= assigned_self_attributes(inspect.getsource(cls))
    names |= assigned_self_attributes(extra_source)
    # NOTE: ``obj.__class__ = ...`` is how install() mixes the hooks in, not an added name
    return {n for n in names if not (n.startswith("__") and n.endswith("__"))}


def vllm_names(*classes: type) -> set[str]:
    """Every attribute vLLM's classes (and their vLLM bases) define or assign on self."""
    names: set[str] = set()
    for cls in classes:
        for base in cls.__mro__:
            if not base.__module__.startswith("vllm"):
                continue
            names |= set(vars(base))
            names |= assigned_self_attributes(inspect.getsource(base))
    return names


def shadowed(added: set[str], vllm: set[str], allowed: set[str]) -> set[str]:
    """Added names that collide with vLLM's and are not intended overrides."""
    return (added & vllm) - allowed


CASES = [
    ("scheduler", (scheduler.KVClaimsMixin, scheduler.KVClaimsScheduler,
                   scheduler.KVClaimsAsyncScheduler), (Scheduler, AsyncScheduler), ""),
    ("pool", (hooks.RecordingBlockPool,), (BlockPool,), inspect.getsource(hooks.install)),
    ("manager", (hooks.RecordingKVCacheManager,), (KVCacheManager,), ""),
    ("index", (hooks.RecordingHashIndex,), (BlockHashToBlockMap,), ""),
]


@pytest.mark.parametrize("kind, ours, theirs, extra", CASES, ids=[c[0] for c in CASES])
def test_recorder_shadows_no_vllm_attribute(kind, ours, theirs, extra):
    assert shadowed(added_names(*ours, extra_source=extra), vllm_names(*theirs),
                    OVERRIDES[kind]) == set()


@pytest.mark.parametrize("kind, ours, theirs, extra", CASES, ids=[c[0] for c in CASES])
def test_every_added_name_is_kvc_prefixed_or_an_intended_override(kind, ours, theirs, extra):
    added = added_names(*ours, extra_source=extra)
    assert {n for n in added if not n.startswith("kvc_")} - OVERRIDES[kind] == set()


@pytest.mark.parametrize("kind, theirs", [("scheduler", (Scheduler,)), ("pool", (BlockPool,)),
                                          ("manager", (KVCacheManager,)),
                                          ("index", (BlockHashToBlockMap,))])
def test_intended_overrides_are_real_vllm_methods(kind, theirs):
    assert OVERRIDES[kind] - {"__init__", "__new__"} <= vllm_names(*theirs)


def test_the_detector_catches_an_attribute_that_shadows_vllm():
    source = "class Bad:\n    def __init__(self):\n        self.policy = 'native'\n"
    added = assigned_self_attributes(source)
    assert shadowed(added, vllm_names(Scheduler), OVERRIDES["scheduler"]) == {"policy"}


# --- the scheduler vLLM would have chosen ------------------------------------------------------

def _config(async_scheduling: bool | None) -> SimpleNamespace:
    return SimpleNamespace(scheduler_config=SimpleNamespace(async_scheduling=async_scheduling))


def test_async_scheduling_on_builds_the_async_recorder():
    obj = scheduler.KVClaimsScheduler.__new__(scheduler.KVClaimsScheduler,
                                              vllm_config=_config(True))
    assert type(obj) is scheduler.KVClaimsAsyncScheduler and isinstance(obj, AsyncScheduler)


@pytest.mark.parametrize("value", [False, None])
def test_async_scheduling_off_builds_the_plain_recorder(value):
    obj = scheduler.KVClaimsScheduler.__new__(scheduler.KVClaimsScheduler, _config(value))
    assert type(obj) is scheduler.KVClaimsScheduler and not isinstance(obj, AsyncScheduler)


def test_async_recorder_hooks_reach_vllms_async_scheduler_first():
    mro = scheduler.KVClaimsAsyncScheduler.__mro__
    assert mro.index(scheduler.KVClaimsMixin) < mro.index(AsyncScheduler) < mro.index(Scheduler)
