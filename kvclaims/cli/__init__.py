"""kvclaims: record, reconstruct and audit resident KV claims in vLLM.

The command line is a thin facade over the product's parts.

Each module registers its own subcommands, so this file only wires them together:
``kvclaims.cli.record`` (record, sweep: they compose recorder and reconstructor),
``kvclaims.cli.io`` (import, export, query), ``kvclaims.cli.reconstruct`` (reconstruct,
conformance), ``kvclaims.cli.listen`` (a stock vLLM's KV events) and
``kvclaims.dashboard.commands`` (dashboard, report).

Exit status (docs/guarantees.md): 0 ok; 1 a check failed (e.g. conformance); 2 bad input,
path, option or environment (one line on stderr naming the file and what is wrong); 3 the
result is partial: the input had holes (damaged, cut or missing events), reported on stderr;
4 an internal error (a bug: the line says so; ``--debug`` shows the traceback); 130
interrupted (Ctrl-C); 141 stdout closed early (e.g. piped to ``head``); 143 terminated
(SIGTERM). Both signals unwind, so temporary folders and half-written outputs are removed.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import threading
import traceback
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as dist_version
from typing import Any, Final

from kvclaims.cli import io, listen, reconstruct, record, whatif
from kvclaims.contract.schema import RECORDER_VERSION, InputError
from kvclaims.dashboard import commands as dashboard_commands
from kvclaims.reconstruct import loader

# Every subcommand's module registers its own subparsers (``register(sub)``), in this order.
_PARTS = (record, io, reconstruct, listen, dashboard_commands, whatif)

EXIT_OK: Final[int] = 0
EXIT_CHECK_FAILED: Final[int] = 1
EXIT_BAD_INPUT: Final[int] = 2
EXIT_PARTIAL: Final[int] = 3
EXIT_INTERNAL: Final[int] = 4
EXIT_INTERRUPTED: Final[int] = 130
EXIT_TERMINATED: Final[int] = 143
EXIT_BROKEN_PIPE: Final[int] = 141

# A Python exception DuckDB wrapped while scanning one of our readers: its last line names the
# exception type and message (e.g. "kvclaims.reconstruct.loader.TraceError: x.arrows: ...").
_WRAPPED: Final = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?(\w+(?:Error|Exception)): (.+)$", re.M)
_INPUT_ERRORS: Final[frozenset[str]] = frozenset({"TraceError", "InputError", "SchemaError"})


_PARSER: argparse.ArgumentParser | None = None


def _parser() -> argparse.ArgumentParser:
    """The parser, built once per process (building it costs more than most commands)."""
    global _PARSER
    if _PARSER is None:
        _PARSER = build_parser()
    return _PARSER


def version() -> str:
    """The installed package's version (pyproject), else the source tree's."""
    try:
        return dist_version("kvclaims")
    except PackageNotFoundError:
        return RECORDER_VERSION


def build_parser() -> argparse.ArgumentParser:
    """Build the parser with every part's subcommands registered."""
    parser = argparse.ArgumentParser(prog="kvclaims", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"kvclaims {version()}")
    parser.add_argument("--debug", action="store_true",
                        help="show a Python traceback for errors (for bug reports)")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in _PARTS:
        module.register(sub)
    return parser


def describe_error(exc: BaseException) -> tuple[int, str]:
    """Map an exception that reached the CLI door to ``(exit status, one line)``.

    NOTE: bad input arrives in many forms: our ``InputError``; DuckDB wrapping it (the
    loader runs inside a DuckDB scan); ``OSError`` from paths and full or read-only disks;
    ``ValueError``/``RecursionError``/``MemoryError`` from hostile JSON (huge integers, deep
    nesting). Each is one line naming what is wrong; anything else is a bug (exit 4).
    """
    if isinstance(exc, InputError):
        return EXIT_BAD_INPUT, _one_line(str(exc))
    if _is_duckdb_error(exc):
        text = str(exc)
        wrapped = _WRAPPED.findall(text)
        if wrapped:
            kind, msg = wrapped[-1]
            return (EXIT_BAD_INPUT if kind in _INPUT_ERRORS or kind.endswith("Error")
                    else EXIT_INTERNAL), _one_line(msg)
        return EXIT_BAD_INPUT, _one_line(text)
    if isinstance(exc, OSError):
        where = exc.filename if exc.filename is not None else ""
        what = exc.strerror or str(exc) or type(exc).__name__
        return EXIT_BAD_INPUT, _one_line(f"{where}: {what}" if where else what)
    if isinstance(exc, RecursionError):
        return EXIT_BAD_INPUT, "input nested too deeply to read (e.g. deeply nested JSON)"
    if isinstance(exc, MemoryError):
        return EXIT_BAD_INPUT, "out of memory reading the input (is it what you meant to give?)"
    if isinstance(exc, (ValueError, OverflowError, UnicodeError)):
        return EXIT_BAD_INPUT, _one_line(f"bad value: {exc}")
    return EXIT_INTERNAL, _one_line(f"internal error ({type(exc).__name__}: {exc}); "
                                    "rerun with --debug and report it")


def _is_duckdb_error(exc: BaseException) -> bool:
    return any(c.__module__.split(".")[0] in ("duckdb", "_duckdb") and c.__name__ == "Error"
               for c in type(exc).__mro__)


def _one_line(text: str) -> str:
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    line = lines[0] if lines else "error"
    return line if len(line) <= 500 else line[:497] + "..."


def _quiet_broken_pipe() -> int:
    """stdout was closed early (``| head``): Python's documented way to exit quietly."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return EXIT_BROKEN_PIPE


# Signals that reached this command (SIGINT, SIGTERM): they end it with 130 / 143 whatever
# shape the interruption took on its way out (DuckDB turns one into "Query interrupted").
_SIGNALLED: list[int] = []


def _on_sigterm(sig: int, _frame: Any) -> None:
    _SIGNALLED.append(sig)
    # NOTE: raised here, not re-sent as SIGINT: a shell starts a background job with SIGINT
    # ignored, and a re-sent SIGINT was lost there (the command ran on to exit 0)
    raise KeyboardInterrupt


def _catch_signals() -> None:
    """SIGTERM (main thread, default handler only) is turned into ``KeyboardInterrupt``, the
    interruption DuckDB and every cleanup understand: ``finally`` blocks run (temporary audit databases,
    half-written outputs) instead of the process vanishing.

    NOTE: SIGINT keeps Python's own handler: DuckDB interrupts a running query cleanly only
    under it (with another handler an interrupt inside a scan of Python data can deadlock).
    """
    _SIGNALLED.clear()
    if threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, _on_sigterm):
        signal.signal(signal.SIGTERM, _on_sigterm)


def _interrupted(exc: BaseException) -> bool:
    """DuckDB's shapes of a Ctrl-C that reached a running query."""
    return (isinstance(exc, RuntimeError) and str(exc).strip() == "Query interrupted") or \
        type(exc).__name__ == "InterruptException"


def _signal_status(command: str, exc: BaseException | None = None) -> int | None:
    """Exit status and line for a command a signal ended, or None."""
    if not _SIGNALLED and not (exc is not None and _interrupted(exc)):
        return None
    if _SIGNALLED and _SIGNALLED[0] == signal.SIGTERM:
        print(f"kvclaims {command}: terminated", file=sys.stderr)
        return EXIT_TERMINATED
    print(f"kvclaims {command}: interrupted", file=sys.stderr)
    return EXIT_INTERRUPTED


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: each subcommand sets ``func(args) -> int`` on its parser.

    Never raises (except ``SystemExit`` from ``--help`` and usage errors, status 2): every
    error is one line on stderr and an exit status (module docstring).
    """
    args = _parser().parse_args(argv)
    command = getattr(args, "command", "?")
    loader.take_reported_holes()  # NOTE: count only this command's holes
    _catch_signals()
    try:
        status = int(args.func(args) or 0)
        sys.stdout.flush()
        # NOTE: a signal some library swallowed still ends the command as signalled: the
        # operator asked it to stop, and a supervisor reads the status
        status_ = _signal_status(command)
        if status_ is not None:
            return status_
    except BrokenPipeError:
        return _quiet_broken_pipe()
    except KeyboardInterrupt:
        status_ = _signal_status(command)
        if status_ is not None:
            return status_
        print(f"kvclaims {command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (Exception, MemoryError, RecursionError) as exc:  # noqa: BLE001 - the CLI door
        status_ = _signal_status(command, exc)
        if status_ is not None:
            return status_
        status, line = describe_error(exc)
        if args.debug:
            traceback.print_exc()
        print(f"kvclaims {command}: error: {line}", file=sys.stderr)
        return status
    holes = loader.take_reported_holes()
    if status == EXIT_OK and holes:
        runs = sorted({h.run_id for h in holes})
        print(f"kvclaims {command}: partial result: {len(holes)} hole(s) in "
              f"{len(runs)} run(s) ({', '.join(runs[:5])}{', ...' if len(runs) > 5 else ''}); "
              "labels after a hole are unknown (exit status 3)", file=sys.stderr)
        return EXIT_PARTIAL
    return status


