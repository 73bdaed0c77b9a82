"""The README is a user's page: short, every `kvclaims` command in it parses, every link resolves."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from kvclaims import cli

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
MAX_BYTES = 15_000  # NOTE: 15 KB
_FENCE = re.compile(r"```bash\n(.*?)```", re.S)
_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def command_lines(markdown: str) -> list[list[str]]:
    """Every ``kvclaims ...`` command of the page's bash blocks, as argv (continuations joined)."""
    found = []
    for block in _FENCE.findall(markdown):
        for line in block.replace("\\\n", " ").splitlines():
            if line.startswith("kvclaims "):  # NOTE: other lines (curl, JSON) are not shell-split
                found.append(shlex.split(line, comments=True)[1:])
    return found


def broken_links(markdown: str, base: Path) -> list[str]:
    """Relative link targets of the page that do not exist under ``base``."""
    return [t for t in _LINK.findall(markdown)
            if "://" not in t and not (base / t).exists()]


def test_readme_stays_a_short_page() -> None:
    assert README.stat().st_size <= MAX_BYTES, (
        f"README.md is {README.stat().st_size} bytes: figures go to docs/benchmarks.md, "
        "reference to docs/")


def test_every_kvclaims_command_in_the_readme_parses() -> None:
    commands = command_lines(README.read_text())
    assert len(commands) >= 5
    for argv in commands:
        cli.build_parser().parse_args(argv)  # NOTE: SystemExit(2) on an unknown option


def test_a_made_up_option_does_not_parse() -> None:
    (argv,) = command_lines("```bash\nkvclaims report runs/demo --out r.html --made-up\n```\n")
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(argv)


def test_every_relative_link_in_the_readme_resolves() -> None:
    assert broken_links(README.read_text(), REPO) == []


def test_a_missing_link_target_is_reported(tmp_path: Path) -> None:
    assert broken_links("see [gone](docs/gone.md) and [web](https://x.org/a.md)", tmp_path) == \
        ["docs/gone.md"]


def make_targets_named(markdown: str) -> set[str]:
    """Every ``make TARGET`` the page names as code (`make x` inline, or a line of a block)."""
    return set(re.findall(r"(?:`|^)make ([a-z][\w-]*)", markdown, re.M))


def test_every_make_target_in_the_readme_exists() -> None:
    makefile = (REPO / "Makefile").read_text()
    named = make_targets_named(README.read_text())
    assert {"demo", "test"} <= named
    assert {t for t in named if not re.search(rf"^{t}:", makefile, re.M)} == set()


def test_a_made_up_make_target_is_named() -> None:
    text = "run `make demo`, then\nmake unicorn  # a block line\nto make room for prose"
    assert make_targets_named(text) == {"demo", "unicorn"}
