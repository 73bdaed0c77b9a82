"""The package layout: one import namespace, homes for shared parts, the old scheduler path.

The repository keeps one top-level folder per part; installed, they all live under ``kvclaims``
(pyproject.toml ``package-dir``), so installing kvclaims claims no generic top-level name.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PARTS = ("recorder", "reconstruct", "queries", "dashboard")
# The engine's hot path: modules that only ever run inside vLLM's scheduler.
HOT_PATH = ("kvclaims.recorder.buffer", "kvclaims.recorder.hooks", "kvclaims.recorder.scheduler",
            "kvclaims.recorder.arbiter", "kvclaims.recorder._hooks")


def _python(code: str, cwd: Path = REPO, extra_path: str | None = None,
            checkout: bool = True) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter; ``checkout``: with this checkout on sys.path (else
    only what is installed)."""
    path = [extra_path, str(REPO) if checkout else None]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}
    return subprocess.run([sys.executable, "-W", "always::DeprecationWarning", "-c", code],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    build = tmp_path_factory.mktemp("build")
    # NOTE: build from a copy: setuptools writes build/ and *.egg-info next to the sources
    for name in ("pyproject.toml", "README.md", "kvclaims", *PARTS):
        subprocess.run(["cp", "-r", str(REPO / name), str(build)], check=True)
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                           "--no-build-isolation", "-q", "-w", str(out), str(build)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    (path,) = out.glob("kvclaims-*.whl")
    return zipfile.ZipFile(path)


def test_installed_package_claims_only_the_kvclaims_name(wheel: zipfile.ZipFile) -> None:
    tops = {name.split("/")[0] for name in wheel.namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"kvclaims"}


def test_installed_package_holds_every_part_under_kvclaims(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    for part in PARTS:
        assert f"kvclaims/{part}/__init__.py" in names
    assert "kvclaims/reconstruct/sql/04_labels.sql" in names   # package data travels too
    assert "kvclaims/queries/loss_labels.sql" in names
    assert "kvclaims/queries/fleet/fleet_claims_harmed.sql" in names
    assert not any(n.startswith(("recorder/", "queries/", "dashboard/")) for n in names)


def test_installed_package_carries_the_compiled_hooks(wheel: zipfile.ZipFile) -> None:
    """recorder/_hooks.c is built into the wheel where a C compiler is (optional elsewhere)."""
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler on this machine")
    assert any(n.startswith("kvclaims/recorder/_hooks.") and n.endswith((".so", ".pyd"))
               for n in wheel.namelist())


def test_vllm_plugin_entry_point_names_the_namespaced_module(wheel: zipfile.ZipFile) -> None:
    (ep,) = [n for n in wheel.namelist() if n.endswith("entry_points.txt")]
    text = wheel.read(ep).decode()
    assert "kvclaims = kvclaims.recorder.plugin:register" in text
    assert "= recorder." not in text


def test_checkout_parts_import_as_kvclaims_subpackages_from_this_checkout() -> None:
    done = _python("import kvclaims.reconstruct.core as c, kvclaims.queries as q; "
                   "print(c.__file__); print(q.__file__)")
    assert done.returncode == 0, done.stderr
    core, queries = done.stdout.split()
    assert Path(core) == REPO / "reconstruct" / "core.py"
    assert Path(queries) == REPO / "queries" / "__init__.py"


def test_unknown_kvclaims_subpackage_is_not_invented() -> None:
    done = _python("import kvclaims.tests")
    assert done.returncode != 0 and "No module named 'kvclaims.tests'" in done.stderr


def test_old_scheduler_path_is_the_same_class_with_a_deprecation_warning(tmp_path: Path) -> None:
    # NOTE: run from elsewhere, so the checkout's own recorder/ folder is not on sys.path
    done = _python("from kvclaims.recorder import plugin; plugin.register()\n"
                   "import recorder.scheduler as old, kvclaims.recorder.scheduler as new\n"
                   "print(old.KVClaimsScheduler is new.KVClaimsScheduler)", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"
    assert "recorder.scheduler is deprecated: use kvclaims.recorder.scheduler" in done.stderr


def test_old_scheduler_path_does_not_exist_without_the_plugin(tmp_path: Path) -> None:
    # NOTE: as installed: a checkout on sys.path has its own top-level recorder/ folder
    done = _python("import kvclaims.recorder.scheduler\nimport recorder.scheduler", cwd=tmp_path,
                   checkout=False)
    assert done.returncode != 0 and "No module named 'recorder'" in done.stderr


def test_old_path_alias_leaves_someone_elses_recorder_package_alone(tmp_path: Path) -> None:
    other = tmp_path / "site" / "recorder"
    other.mkdir(parents=True)
    (other / "__init__.py").write_text("WHO = 'someone else'\n")
    done = _python("from kvclaims.recorder import plugin; plugin.register()\n"
                   "import recorder; print(recorder.WHO)", cwd=tmp_path,
                   extra_path=str(tmp_path / "site"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "someone else"


def test_offline_side_never_imports_the_engine_hot_path() -> None:
    done = _python("import sys\n"
                   "import kvclaims.audit, kvclaims.io_commands, kvclaims.reconstruct_commands\n"
                   "import kvclaims.importers.jsonl, kvclaims.importers.arbiter\n"
                   "import kvclaims.generators.synthetic, kvclaims.generators.shapes\n"
                   "import kvclaims.reconstruct.core, kvclaims.reconstruct.loader\n"
                   f"print(sorted(m for m in sys.modules if m in {HOT_PATH!r} "
                   "or m.split('.')[0] == 'vllm'))")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_hot_path_check_sees_the_scheduler_when_it_is_imported() -> None:
    done = _python("import sys, kvclaims.recorder.buffer\n"
                   f"print(sorted(m for m in sys.modules if m in {HOT_PATH!r}))")
    assert done.returncode == 0, done.stderr
    assert "kvclaims.recorder.buffer" in done.stdout
