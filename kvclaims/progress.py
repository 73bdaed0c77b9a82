"""Progress for long commands: one line on stderr, redrawn in place, only on a terminal.

    with Progress("record", quiet=args.quiet) as p:
        p.stage("engine start")
        ...
        p.stage("scenario", done=3, total=7)

The line names the stage, the time spent and, where a previous run of the same work took a
known time (or the stage says how much is done), the time left. Nothing is written when stderr
is not a terminal or with ``quiet``, so pipes and ``--json`` stay clean.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

#: Where the last duration of each kind of work is kept (for "time left" the next time).
DURATIONS = Path(os.environ.get("KVCLAIMS_CACHE", Path.home() / ".cache" / "kvclaims")
                 ) / "durations.json"


def _fmt(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class Progress:
    """A progress line for one command (see the module docstring). ``key`` names the work
    whose duration is remembered for the next estimate (e.g. ``record resident60_active70``)."""

    def __init__(self, command: str, *, quiet: bool = False, key: str | None = None,
                 stream: IO[str] | None = None, interval: float = 0.5) -> None:
        self.command = command
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = not quiet and _isatty(self.stream)
        self.key = key
        self.interval = interval
        self._stage = "starting"
        self._done: int | None = None
        self._total: int | None = None
        self._start = time.monotonic()
        self._expected = _load(key) if key else None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._drawing = threading.Lock()
        self._thread: threading.Thread | None = None
        self._width = 0

    def __enter__(self) -> Progress:
        self._start = time.monotonic()
        if self.enabled:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        if self.enabled:
            self._write("")  # clear the line
        if exc_type is None and self.key:
            _save(self.key, time.monotonic() - self._start)

    def stage(self, name: str, done: int | None = None, total: int | None = None) -> None:
        """Enter (or update) a stage; ``done``/``total`` say how far it is."""
        with self._lock:
            entered = name != self._stage
            self._stage, self._done, self._total = name, done, total
        # NOTE: a stage is drawn the moment it is entered, not at the next tick, so a stage
        # shorter than the interval is still seen.
        if self.enabled and (entered or self._thread is None):
            self._draw()

    def line(self) -> str:
        """The current progress line (what is drawn)."""
        elapsed = time.monotonic() - self._start
        with self._lock:
            stage, done, total = self._stage, self._done, self._total
        parts = [f"{self.command}: {stage}"]
        if done is not None and total:
            parts[0] += f" {done}/{total}"
        parts.append(f"{_fmt(elapsed)} elapsed")
        if self._expected:
            parts.append(f"~{_fmt(self._expected - elapsed)} left" if elapsed < self._expected
                         else "taking longer than last time")
        return " · ".join(parts)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._draw()
        # a final draw is not needed: __exit__ clears the line

    def _draw(self) -> None:
        self._write(self.line())

    def _write(self, text: str) -> None:
        with self._drawing:  # the ticking thread and a stage change may draw at once
            pad = max(0, self._width - len(text))
            try:
                self.stream.write("\r" + text + " " * pad + ("\r" if not text else ""))
                self.stream.flush()
            except (OSError, ValueError):  # a closed terminal must not break the command
                self.enabled = False
            self._width = len(text)


def _isatty(stream: IO[str]) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _load(key: str) -> float | None:
    try:
        value = json.loads(DURATIONS.read_text()).get(key)
    except (OSError, ValueError):
        return None
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def _save(key: str, seconds: float) -> None:
    try:
        known = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
        if not isinstance(known, dict):
            known = {}
        known[key] = round(seconds, 1)
        DURATIONS.parent.mkdir(parents=True, exist_ok=True)
        DURATIONS.write_text(json.dumps(known, indent=1, sort_keys=True))
    except (OSError, ValueError):  # a cache we cannot write only costs the next estimate
        pass
