"""kvclaims: record, reconstruct and audit resident KV claims in vLLM.

The command line is a thin facade over the product's parts.

Each part registers its own subcommands, so this file only wires them together:
``kvclaims.recording`` (record, sweep: they compose recorder and reconstructor),
``reconstruct.io_commands`` (import, export, query) and ``reconstruct.commands``
(reconstruct, conformance).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from recorder.schema import InputError

_PARTS = ("kvclaims.recording", "reconstruct.io_commands", "reconstruct.commands",
          "dashboard.commands")


def version() -> str:
    """The installed package's version (pyproject), else the source tree's."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("kvclaims")
    except PackageNotFoundError:
        from recorder.schema import RECORDER_VERSION

        return RECORDER_VERSION


def build_parser() -> argparse.ArgumentParser:
    """Build the parser with every part's subcommands registered."""
    parser = argparse.ArgumentParser(prog="kvclaims", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"kvclaims {version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in _PARTS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:  # a part not built yet must not break the others
            if exc.name != name:
                raise
            continue
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: each subcommand sets ``func(args) -> int`` on its parser."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except InputError as exc:  # bad input is one clear line, never a traceback
        print(f"kvclaims {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
