"""The package layout: one import namespace, the import graph one way, the engine hot path apart.

The repository keeps one top-level folder per part; installed, they all live under ``kvclaims``
(pyproject.toml ``package-dir``), so installing kvclaims claims no generic top-level name.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PARTS = ("recorder", "reconstruct", "queries", "dashboard")
# The engine's hot path: modules that only ever run inside vLLM's scheduler.
HOT_PATH = ("kvclaims.recorder.buffer", "kvclaims.recorder.hooks", "kvclaims.recorder.scheduler",
            "kvclaims.recorder.arbiter")


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


def test_offline_side_never_imports_the_engine_hot_path() -> None:
    done = _python("import sys\n"
                   "import kvclaims.audit, kvclaims.queries, kvclaims.explaining\n"
                   "import kvclaims.sources.jsonl, kvclaims.sources.arbiter_traces\n"
                   "import kvclaims.sources.synthetic, kvclaims.sources.shapes\n"
                   "import kvclaims.reconstruct.core, kvclaims.reconstruct.loader\n"
                   f"print(sorted(m for m in sys.modules if m in {HOT_PATH!r} "
                   "or m.split('.')[0] == 'vllm'))")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_command_line_never_imports_vllm_or_torch() -> None:
    done = _python("import sys, kvclaims.cli\nkvclaims.cli.build_parser()\n"
                   "print(sorted({m.split('.')[0] for m in sys.modules} & {'vllm', 'torch'}))")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_hot_path_check_sees_the_scheduler_when_it_is_imported() -> None:
    done = _python("import sys, kvclaims.recorder.buffer\n"
                   f"print(sorted(m for m in sys.modules if m in {HOT_PATH!r}))")
    assert done.returncode == 0, done.stderr
    assert "kvclaims.recorder.buffer" in done.stdout


# -- the import graph, read statically from the files ------------------------------------------
# NOTE: the run directory is the seam (docs/design.md §9): the contract is the bottom; the
# recorder runs inside vLLM; sources produce run directories; the reconstructor reads them;
# queries, the facade, the dashboard and the CLI are built on top, in that order.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("kvclaims.contract",),
    ("kvclaims.recorder",),
    ("kvclaims.sources",),
    ("kvclaims.reconstruct",),
    ("kvclaims.queries",),
    ("kvclaims",),           # the facade: kvclaims.open, Audit, explain
    ("kvclaims.dashboard",),
    ("kvclaims.cli",),
)
FOLDERS = {"recorder": "kvclaims.recorder", "reconstruct": "kvclaims.reconstruct",
           "queries": "kvclaims.queries", "dashboard": "kvclaims.dashboard",
           "kvclaims": "kvclaims"}
# Function-level imports of our own modules that are there for a reason other than hiding an
# arrow (the layer test above still reads them): the facade's ``kvclaims.open`` loads DuckDB only
# when called, so that the recorder, which imports ``kvclaims.contract`` inside vLLM, never pays
# for it; and the engine side that imports vLLM itself is loaded only by the code that runs it.
LAZY_ALLOWED = {"kvclaims"}
VLLM_SIDE = {"kvclaims.recorder.scheduler", "kvclaims.recorder.hooks"}


def layer_of(module: str) -> int:
    """The index in ``LAYERS`` of the longest prefix that owns ``module``."""
    best, size = -1, -1
    for i, prefixes in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > size:
                best, size = i, len(p)
    return best


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    parts[0] = FOLDERS[parts[0]]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def internal_imports(source: str) -> list[tuple[str, int, bool]]:
    """``(imported module, line, inside a function or class)`` for each import of kvclaims."""
    import ast

    tree = ast.parse(source)
    top = {id(n) for n in tree.body}
    for n in tree.body:  # an `if TYPE_CHECKING:` block at module level is top level too
        if isinstance(n, ast.If):
            top |= {id(m) for m in ast.walk(n)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = ([f"kvclaims.{a.name}" for a in node.names] if node.module == "kvclaims"
                     else [node.module])
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found += [(m, node.lineno, id(node) not in top) for m in names
                  if m.split(".")[0] == "kvclaims"]
    return found


def arrows_up(source: str, module: str) -> list[str]:
    """The imports in ``source`` (the module ``module``) that point to a higher layer."""
    return [f"{module}:{line} -> {target}" for target, line, _ in internal_imports(source)
            if layer_of(target) > layer_of(module)]


def _package_files() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (REPO / folder).rglob("*.py"))


def test_imports_point_only_down_the_layers() -> None:
    ups = [a for p in _package_files() for a in arrows_up(p.read_text(), module_name(p))]
    assert ups == []


def test_an_import_from_a_higher_layer_is_caught() -> None:
    src = "from kvclaims.reconstruct import core\n"
    assert arrows_up(src, "kvclaims.recorder.hooks") == [
        "kvclaims.recorder.hooks:1 -> kvclaims.reconstruct"]
    assert arrows_up("def f():\n    from kvclaims.dashboard import data\n",
                     "kvclaims.queries") == ["kvclaims.queries:2 -> kvclaims.dashboard"]


def test_own_modules_are_imported_at_the_top_of_the_file() -> None:
    hidden = [f"{module_name(p)}:{line} -> {target}" for p in _package_files()
              for target, line, inner in internal_imports(p.read_text())
              if inner and module_name(p) not in LAZY_ALLOWED and target not in VLLM_SIDE]
    assert hidden == []


def test_an_import_inside_a_function_is_seen() -> None:
    assert internal_imports("def f():\n    import kvclaims.audit\n") == [
        ("kvclaims.audit", 2, True)]
