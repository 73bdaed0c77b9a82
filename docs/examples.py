"""The example outputs in the docs, produced by the commands they show, on the shipped traces.

A fenced block right after a marker line

    <!-- example: kvclaims explain traces/multi_tenant --tenant tenant-b -->

is the output of that command: ``$ COMMAND`` and then what it printed (stdout, then stderr),
run from a scratch folder that holds a copy of ``traces/`` and of the sweep point
``resident60_active70-native-80`` as ``native-80`` (commands such as ``kvclaims reconstruct``
write beside a run). ``kvclaims`` is this checkout's CLI.

    python docs/examples.py            # rewrite every marked block of DOCS
    python docs/examples.py --check    # exit 1 and name each block that differs

tests/test_doc_examples.py runs the check, so an example cannot go stale.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: The docs whose marked blocks are generated.
DOCS = ("README.md", "docs/explain.md", "docs/sql.md", "docs/after-an-incident.md")
MARKER = re.compile(r"^<!-- example: (?P<cmd>.+?) -->\n(?P<fence>```\w*)\n(?P<body>.*?)^```$",
                    re.M | re.S)
#: The sweep point after-an-incident.md works on, copied as ``native-80``.
NATIVE_80 = "traces/sweep-resident60_active70/resident60_active70-native-80"


@dataclass(frozen=True)
class Block:
    """One marked block: its document, command and the text it shows now."""

    doc: str
    command: str
    shown: str


def blocks(doc: str) -> list[Block]:
    """Every marked block of ``doc`` (a path relative to the repository)."""
    text = (REPO / doc).read_text(encoding="utf-8")
    return [Block(doc, m["cmd"], m["body"]) for m in MARKER.finditer(text)]


def scratch() -> Path:
    """A scratch folder with ``traces/`` and ``native-80`` (copies; removed by the caller)."""
    root = Path(tempfile.mkdtemp(prefix="kvclaims-doc-examples-"))
    shutil.copytree(REPO / "traces", root / "traces",
                    ignore=shutil.ignore_patterns("reconstructed"))
    shutil.copytree(REPO / NATIVE_80, root / "native-80",
                    ignore=shutil.ignore_patterns("reconstructed"))
    return root


def run(command: str, cwd: Path) -> str:
    """``$ COMMAND`` and its output, as a block shows it."""
    argv = shlex.split(command)
    if argv[0] != "kvclaims":
        raise ValueError(f"example command {command!r}: only kvclaims commands are run")
    proc = subprocess.run([sys.executable, "-m", "kvclaims.cli", *argv[1:]], cwd=cwd,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"})
    return f"$ {command}\n{proc.stdout}{proc.stderr}"


def generate(docs: tuple[str, ...] = DOCS) -> dict[tuple[str, str], str]:
    """Every marked block's output, keyed by (doc, command), run in document order."""
    root = scratch()
    try:
        return {(b.doc, b.command): run(b.command, root) for d in docs for b in blocks(d)}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def rewrite(doc: str, outputs: dict[tuple[str, str], str]) -> bool:
    """Put the outputs into ``doc``'s marked blocks; True if the file changed."""
    path = REPO / doc
    text = path.read_text(encoding="utf-8")

    def fill(m: re.Match[str]) -> str:
        out = outputs[(doc, m["cmd"])]
        return f"<!-- example: {m['cmd']} -->\n{m['fence']}\n{out.rstrip()}\n```"

    new = MARKER.sub(fill, text)
    if new != text:
        path.write_text(new, encoding="utf-8")
    return new != text


def stale(outputs: dict[tuple[str, str], str]) -> list[Block]:
    """Every marked block whose text is not what its command prints."""
    return [b for d in DOCS for b in blocks(d)
            if b.shown.rstrip() != outputs[(b.doc, b.command)].rstrip()]


def main(argv: list[str]) -> int:
    outputs = generate()
    if "--check" in argv:
        bad = stale(outputs)
        for b in bad:
            print(f"{b.doc}: the example of `{b.command}` is stale "
                  "(python docs/examples.py rewrites it)", file=sys.stderr)
        return 1 if bad else 0
    for doc in DOCS:
        if rewrite(doc, outputs):
            print(f"rewrote {doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
