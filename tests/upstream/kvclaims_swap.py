"""pytest plugin loaded into vLLM's own test run (``-p kvclaims_swap``) by ``upstream.py``.

``KVCLAIMS_UPSTREAM_SWAP`` picks the side:

- ``vllm``: nothing is swapped (vLLM's own classes); outcomes are only recorded;
- ``native`` / ``hard_protected``: every ``Scheduler`` / ``AsyncScheduler`` that vLLM's test
  modules name (module globals, e.g. ``create_scheduler``'s in ``tests/v1/core/utils.py``) is
  replaced by the recorder's ``KVClaimsScheduler`` / ``KVClaimsAsyncScheduler``, under that run
  policy, with no claims (vLLM's tests declare none);
- ``shadow_policy``: the harness's negative control, a ``Scheduler`` subclass that overwrites
  vLLM's ``Scheduler.policy`` (the bug of issue 9): the comparison must flag it.

Each test's outcome and how many schedulers it built (recorder's vs vLLM's) go to the JSON file
``KVCLAIMS_UPSTREAM_REPORT``. NOTE: the instrumentation (a counting wrapper around vLLM's
``Scheduler.__init__``) is the same on every side, so the sides differ only by the swap.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

SIDE = os.environ.get("KVCLAIMS_UPSTREAM_SWAP", "vllm")
REPORT = os.environ.get("KVCLAIMS_UPSTREAM_REPORT")
_RUNS = Path(os.environ.get("KVCLAIMS_UPSTREAM_RUNS") or tempfile.mkdtemp(prefix="kvc-up-"))

_outcomes: dict[str, str] = {}
_built: dict[str, list[int]] = {}  # nodeid -> [recorder schedulers, other schedulers]
_current: list[str] = [""]
_live: list[Any] = []
_swap: dict[type, type] = {}
_counter = itertools.count()
_RANK = {"passed": 0, "skipped": 1, "xfailed": 1, "xpassed": 2, "failed": 3, "error": 4}


def _recording(base: type) -> type:
    """The recorder's class, each instance recording into its own run directory.

    NOTE: the subclass adds nothing but ``KVCLAIMS_OUT`` (read by the recorder's constructor)
    and a list of live instances, whose buffers are closed when the test ends.
    """

    class Swapped(base):  # type: ignore[misc, valid-type]
        kvc_upstream_swap = True

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            os.environ["KVCLAIMS_OUT"] = str(_RUNS / f"s{next(_counter)}")
            super().__init__(*args, **kwargs)
            _live.append(self)

    Swapped.__name__ = Swapped.__qualname__ = base.__name__
    return Swapped


def _classes() -> dict[type, type]:
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    if SIDE == "vllm":
        return {}
    if SIDE == "shadow_policy":
        class ShadowingScheduler(Scheduler):
            kvc_upstream_swap = True

            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                self.policy = "shadowed"  # the bug the comparison must catch

        return {Scheduler: ShadowingScheduler}
    os.environ["KVCLAIMS_POLICY"] = SIDE
    import kvclaims.recorder.scheduler as rs

    swap = {Scheduler: _recording(rs.KVClaimsScheduler)}
    async_cls = getattr(rs, "KVClaimsAsyncScheduler", None)
    if async_cls is not None:
        swap[AsyncScheduler] = _recording(async_cls)
    return swap


def _count_built() -> None:
    """Count every scheduler construction per test, by whether it is a swapped class."""
    from vllm.v1.core.sched.scheduler import Scheduler

    original = Scheduler.__init__

    @functools.wraps(original)
    def counted(self: Any, *args: Any, **kwargs: Any) -> None:
        entry = _built.setdefault(_current[0], [0, 0])
        entry[0 if getattr(type(self), "kvc_upstream_swap", False) else 1] += 1
        original(self, *args, **kwargs)

    Scheduler.__init__ = counted  # type: ignore[method-assign]


def _swap_globals() -> None:
    """Replace vLLM's scheduler classes in every loaded module of vLLM's test package."""
    if not _swap:
        return
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "tests" or name.startswith("tests.")):
            continue
        namespace = vars(module)
        for attr, value in list(namespace.items()):
            if isinstance(value, type) and value in _swap:
                namespace[attr] = _swap[value]


def pytest_configure(config: pytest.Config) -> None:
    _swap.update(_classes())
    _count_built()


def pytest_collection_finish(session: pytest.Session) -> None:
    _swap_globals()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _current[0] = item.nodeid
    _swap_globals()  # modules a test imports lazily


def pytest_runtest_teardown(item: pytest.Item) -> None:
    while _live:
        scheduler = _live.pop()
        try:
            scheduler.shutdown()  # the recorder's shutdown closes its event buffer
        except Exception:  # noqa: BLE001 - a test may have shut it down already
            pass


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call":
        outcome = report.outcome
        if hasattr(report, "wasxfail"):
            outcome = "xfailed" if report.skipped else "xpassed"
    elif report.failed:
        outcome = "error"
    elif report.skipped:
        outcome = "skipped"
    else:
        return
    previous = _outcomes.get(report.nodeid)
    if previous is None or _RANK[outcome] > _RANK[previous]:
        _outcomes[report.nodeid] = outcome


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not REPORT:
        return
    rs = sys.modules.get("kvclaims.recorder.scheduler")
    Path(REPORT).write_text(json.dumps({
        "side": SIDE,
        "swapped": sorted(f"{k.__name__} -> {v.__mro__[1].__module__}.{v.__mro__[1].__name__}"
                          for k, v in _swap.items()),
        "recorder_file": getattr(rs, "__file__", None),
        "outcomes": _outcomes,
        "built": _built,
        "finished_at": time.time(),
    }, indent=1, sort_keys=True))
