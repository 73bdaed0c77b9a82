"""docs/cli.md is generated from the parser's --help (kvclaims/cli/reference.py) and kept fresh."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from kvclaims import cli
from kvclaims.cli import reference as cli_reference

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "cli.md"


def test_cli_reference_is_what_the_parser_prints() -> None:
    assert DOC.read_text() == cli_reference.render(), (
        "docs/cli.md is stale: run `python -m kvclaims.cli.reference` (or `make docs`)")


def test_cli_reference_holds_every_subcommands_help() -> None:
    text = cli_reference.render()
    sub = next(a for a in cli.build_parser()._actions
               if isinstance(a, argparse._SubParsersAction))
    assert sub.choices, "the parser has subcommands"
    for name in sub.choices:
        assert f"\n## kvclaims {name}\n" in text
        assert f"usage: kvclaims {name} " in text


def test_cli_reference_follows_a_new_option() -> None:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    before = cli_reference.render(cli.build_parser())
    sub.choices["sql"].add_argument("--made-up-option", help="an option the file does not know")
    after = cli_reference.render(parser)
    assert "--made-up-option" in after and after != before


def test_cli_reference_does_not_depend_on_the_terminal_width() -> None:
    env = {"COLUMNS": "40", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c",
                           "from kvclaims.cli import reference as cli_reference; "
                           "print(cli_reference.render(), end='')"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == cli_reference.render()


def test_check_passes_on_a_fresh_reference(tmp_path: Path) -> None:
    out = tmp_path / "cli.md"
    assert cli_reference.main(["--out", str(out)]) == 0
    assert cli_reference.main(["--out", str(out), "--check"]) == 0


def test_check_fails_on_a_stale_reference_and_says_how_to_regenerate(tmp_path: Path) -> None:
    out = tmp_path / "cli.md"
    out.write_text(cli_reference.render().replace("--memory-limit", "--mem-limit"))
    done = subprocess.run([sys.executable, "-m", "kvclaims.cli.reference", "--check",
                           "--out", str(out)], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1
    assert "is stale: run `python -m kvclaims.cli.reference`" in done.stderr
