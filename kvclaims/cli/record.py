"""``kvclaims record`` and ``kvclaims sweep``: record on real vLLM, then let the reconstructor
decide what happened. They compose the parts in data-flow order (recorder -> run directories ->
reconstructor -> queries); no part calls back into an earlier one.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kvclaims.progress import Progress
from kvclaims.contract.policies import POLICIES
from kvclaims.contract.vocabulary import REQUEST_OUTCOME, fill_sql
from kvclaims.sources.scenarios import SCENARIOS
from kvclaims.contract.schema import InputError
from kvclaims.sources import scenarios
from kvclaims.sources.scenarios import check_run_id, record
import kvclaims
from kvclaims.reconstruct.loader import read_manifest

SWEEP_COLUMNS = ("run_id", "policy", "usable_blocks", "active_outcome", "resident_blocks_lost",
                 "claim_outcome", "blocking_claim_ids", "shortfall_blocks", "harm", "expiry",
                 "relaxation", "eviction", "unknown", "blocks_lost")


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``record`` and ``sweep``."""
    p = sub.add_parser(
        "record", help="record a built-in scenario on a real vLLM engine",
        description="Record a built-in scenario into a run directory on one fresh vLLM engine "
                    "(the tiny local model unless --model is given), then print what the "
                    "reconstructor says happened to its claims, resident blocks and requests.")
    p.add_argument("--scenario", required=True, choices=sorted(SCENARIOS))
    p.add_argument("--usable-blocks", type=int, default=None,
                   help="usable KV blocks (vLLM gets one more, its null block); "
                        "default: the scenario's own")
    p.add_argument("--policy", choices=sorted(POLICIES), default=None,
                   help="run policy; default: the scenario's own")
    p.add_argument("--out", required=True, type=Path, help="run directory to create")
    p.add_argument("--run-id", default=None, metavar="ID",
                   help="the run's id (default: <scenario>-<policy>-<usable blocks>-<UTC "
                        "time>, which no other recording shares)")
    p.add_argument("--model", type=Path, default=None,
                   help="model folder (default: the tiny random-weight model, built locally)")
    p.add_argument("--json", action="store_true",
                   help="print the result as one JSON object (docs/operating.md)")
    _noise_flags(p)
    p.set_defaults(func=_record)

    s = sub.add_parser(
        "sweep", help="record a scenario over capacities x policies and tabulate it",
        description="One fresh vLLM engine per (policy, capacity) point, a run directory per "
                    "point under --out, DIR/sweep.json and a printed table. Resumable: points "
                    "whose run directory is complete are skipped.")
    s.add_argument("--scenario", default="resident60_active70", choices=sorted(SCENARIOS))
    s.add_argument("--capacities", default="80,90,100,110,120,130,150",
                   help="comma-separated usable block counts")
    s.add_argument("--policies", default="native,write_no_admit,hard_protected",
                   help="comma-separated run policies")
    s.add_argument("--out", required=True, type=Path, help="sweep directory")
    s.add_argument("--model", type=Path, default=None, help="model folder (default: tiny)")
    s.add_argument("--json", action="store_true",
                   help="print the rows as one JSON array ([] when empty)")
    _noise_flags(s)
    s.set_defaults(func=_sweep)


def _noise_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quiet", action="store_true",
                   help="no progress line on stderr (it is shown only on a terminal anyway)")
    p.add_argument("--verbose", action="store_true",
                   help="show vLLM's own log (hidden by default, errors excepted)")


# -- record ---------------------------------------------------------------------------------------

def _quiet_vllm(verbose: bool = False) -> None:
    """vLLM logs to stdout, where our result (and ``--json``) goes: send its log to stderr and
    keep only its errors unless ``verbose`` (a user's own settings win)."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "INFO" if verbose else "ERROR")
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    if not verbose:
        warnings.filterwarnings("ignore")  # third-party deprecation chatter, not our result
        os.environ.setdefault("TQDM_DISABLE", "1")  # vLLM's own loading bars


@contextmanager
def _engine_noise_aside(verbose: bool) -> Iterator[Any]:
    """Keep what vLLM, torch and Triton print on the process's stderr (C++ warnings, prints
    that bypass logging) out of the operator's terminal: file descriptor 2 goes to a log file
    while the engine runs, unless ``verbose``. Yields the stream progress is drawn on (the
    real stderr). On failure the log is kept and named on stderr; on success it is removed.

    NOTE: fd 2 is restored before this returns, so the CLI's own error line reaches the user.
    """
    if verbose:
        yield sys.stderr
        return
    sys.stderr.flush()
    saved = os.dup(2)
    log = tempfile.NamedTemporaryFile(prefix="kvclaims-vllm-", suffix=".log", delete=False)
    terminal = os.fdopen(os.dup(saved), "w", buffering=1)
    os.dup2(log.fileno(), 2)
    failed = True
    try:
        yield terminal
        failed = False
    except InputError:  # bad input is one line: the engine's log has nothing to add
        failed = False
        raise
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        log.close()
        terminal.close()
        if failed:
            print(f"kvclaims record: vLLM's own output is in {log.name}", file=sys.stderr)
        else:
            os.unlink(log.name)


@contextmanager
def _progress_of_driver(progress: Progress) -> Iterator[None]:
    """Report a scenario's progress (requests finished of submitted, engine steps) from the
    engine driver while ``record`` runs: engine start until the first request, then the
    scenario, then closing.

    NOTE: ``kvclaims.sources.scenarios.record`` takes no progress callback yet, so the driver's
    ``submit``/``step`` are wrapped for the duration and restored after (proposed to the
    recorder's owner: a ``progress`` parameter on ``record``).
    """

    submit, step = scenarios.Driver.submit, scenarios.Driver.step
    counts = {"steps": 0}

    def report(driver: Any) -> None:
        finished = sum(1 for o in driver.outcomes.values() if o.finish_reason is not None)
        progress.stage(f"scenario, step {counts['steps']}: requests finished",
                       done=finished, total=len(driver.outcomes))

    def wrapped_submit(self: Any, *a: Any, **k: Any) -> Any:
        out = submit(self, *a, **k)
        report(self)
        return out

    def wrapped_step(self: Any) -> None:
        step(self)
        counts["steps"] += 1
        report(self)

    scenarios.Driver.submit, scenarios.Driver.step = wrapped_submit, wrapped_step  # type: ignore
    try:
        yield
    finally:
        scenarios.Driver.submit, scenarios.Driver.step = submit, step  # type: ignore


def _record(args: argparse.Namespace) -> int:

    if args.run_id is not None:
        check_run_id(args.run_id)   # NOTE: bad input is refused before the engine starts
    _quiet_vllm(args.verbose)
    with _engine_noise_aside(args.verbose) as terminal, \
            Progress("record", quiet=args.quiet, key=f"record {args.scenario}",
                     stream=terminal) as progress:
        progress.stage("engine start")
        with _progress_of_driver(progress):
            view = record(args.scenario, args.usable_blocks, args.policy, args.out,
                          model_dir=args.model, run_id=args.run_id)
        progress.stage("closing: reconstructing the trace")
        claims, losses = _claims_and_losses(args.out)
    if args.json:
        print(json.dumps({**view, "run_dir": str(args.out), "claims": claims,
                          "losses_by_label": losses}, indent=2, default=str))
        return 0
    print(f"recorded {view['scenario']} (policy {view['policy']}, {view['usable_blocks']} usable "
          f"blocks) into {args.out} as run {view['run_id']}")
    print("requests (vLLM's own report):")
    for r in view["requests"]:
        stop = f"  [{r['stop_reason']}]" if r.get("stop_reason") else ""
        print(f"  {r['name']:<14} prompt {r['num_prompt_tokens'] // 32:>3} blocks  "
              f"cached {r['num_cached_tokens'] or 0:>5} tokens  finish {r['finish_reason']}{stop}")
    print("claims (reconstructed from the trace):")
    for c in claims:
        print(f"  {c['claim_id']:<16} {c['tenant'] or '-':<16} {c['protection_mode'] or '-':<15} "
              f"{c['outcome']:<19} lost: harm {c['blocks_lost_harm']}, expiry "
              f"{c['blocks_lost_expiry']}, relaxation {c['blocks_lost_relaxation']}, eviction "
              f"{c['blocks_lost_eviction']}")
        if c.get("positions_lost"):
            print(f"  {'':<16} positions lost: {_ranges(c['positions_lost'])} of "
                  f"{c['bound_blocks']} bound blocks")
        if c.get("first_harm_seq") is not None:
            print(f"  {'':<16} first harm at seq {c['first_harm_seq']} by request "
                  f"{c['first_harm_by_request_id']}; value lost {c['value_lost']}")
    print("block losses by label: " + (", ".join(f"{k} {v}" for k, v in losses.items())
                                       or "none"))
    return 0


def open_audit(run_dirs: list[Path]) -> Any:
    """The one place ``record`` and ``sweep`` open an audit: the audit facade, whose
    ``.sql(text)`` sees ``events``, the reconstructed tables and the documented views."""

    return kvclaims.open(run_dirs)


def _claims_and_losses(run_dir: Path) -> tuple[list[dict[str, Any]], dict[str, int]]:
    con = open_audit([run_dir])
    claims = con.sql(fill_sql("""
        SELECT o.*, p.positions_lost, b.bound_blocks FROM claim_outcomes o
        LEFT JOIN (SELECT run_id, claim_id, list(DISTINCT position ORDER BY position)
                          AS positions_lost FROM loss_claims GROUP BY ALL) p USING (run_id, claim_id)
        LEFT JOIN (SELECT run_id, claim_id, count(DISTINCT position) AS bound_blocks
                   FROM events WHERE event = {event.claim_bound} GROUP BY ALL)
                  b USING (run_id, claim_id)
        ORDER BY o.claim_id""")).to_arrow_table().to_pylist()
    losses = dict(con.sql("SELECT label, count(*) FROM losses GROUP BY label "
                          "ORDER BY label").fetchall())
    return claims, losses


def _ranges(positions: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    spans: list[list[int]] = []
    for p in positions:
        if spans and p == spans[-1][1] + 1:
            spans[-1][1] = p
        else:
            spans.append([p, p])
    return ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in spans)


# -- sweep ----------------------------------------------------------------------------------------

def _sweep(args: argparse.Namespace) -> int:
    _quiet_vllm(args.verbose)
    capacities, policies = _ints(args.capacities), _names(args.policies, POLICIES)
    with _engine_noise_aside(args.verbose) as terminal:
        rows = sweep(args.scenario, capacities, policies, args.out, model_dir=args.model,
                     quiet=args.quiet, stream=terminal)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(sweep_summary(rows))
        print(render_table(rows))
    return 0


def sweep(scenario: str, capacities: list[int], policies: list[str], out: Path, *,
          model_dir: Path | None = None, quiet: bool = False,
          stream: Any = None) -> list[dict[str, Any]]:
    """Record every (policy, capacity) point not yet complete, then tabulate them all;
    progress on ``stream`` (default stderr) when it is a terminal and not ``quiet``."""

    out.mkdir(parents=True, exist_ok=True)
    points = [(p, c) for p in policies for c in sorted(capacities)]
    with Progress(f"sweep {scenario}", quiet=quiet, key=f"sweep {scenario} x{len(points)}",
                  stream=stream) as progress:
        for i, (policy, usable) in enumerate(points):
            run_dir = out / f"{scenario}-{policy}-{usable}"
            progress.stage(f"point {policy} @ {usable}", done=i, total=len(points))
            if _complete(run_dir, read_manifest):
                continue
            shutil.rmtree(run_dir, ignore_errors=True)  # a partial point is recorded again
            # NOTE: a sweep's point is named by its place in the grid, the same on every
            # recording (a resumed or re-recorded sweep keeps its points' ids); readers given
            # two runs with one id tell them apart by path
            record(scenario, usable, policy, run_dir, model_dir=model_dir, run_id=run_dir.name)
        progress.stage("closing: reconstructing every point", done=len(points),
                       total=len(points))
    rows = [{"scenario": scenario, **row}
            for row in sweep_rows([out / f"{scenario}-{p}-{c}" for p, c in points])]
    (out / "sweep.json").write_text(json.dumps({"scenario": scenario, "rows": rows}, indent=2))
    return rows


def sweep_rows(run_dirs: list[Path]) -> list[dict[str, Any]]:
    """One row per run directory, every number decided by the reconstructor."""
    if not run_dirs:
        return []
    rel = open_audit(run_dirs).sql(f"SELECT {', '.join(SWEEP_COLUMNS)} FROM capacity_sweep "
                                   "ORDER BY policy, usable_blocks, run_id")
    return rel.to_arrow_table().to_pylist()


def sweep_summary(rows: list[dict[str, Any]]) -> str:
    """The sweep in one line: points, where the active request harmed resident claimed
    blocks, where it was refused, where it was served."""
    harmed = sum(1 for r in rows if r["harm"])
    refused = sum(1 for r in rows if r["active_outcome"] == REQUEST_OUTCOME.refused)
    served = sum(1 for r in rows if (r["active_outcome"] or "").endswith("served"))
    any_harm = sum(1 for r in rows if "=harmed" in (r["claim_outcome"] or ""))
    return (f"{len(rows)} points: a claim was harmed at {any_harm} ({harmed} by the active "
            f"request's allocation); the active request was refused at {refused}, served at "
            f"{served}.")


#: The text table: (title, row key, right-aligned). Decisive columns first; the label columns
#: count only the blocks the active request evicted (the title says so).
_TABLE: tuple[tuple[str, str, bool], ...] = (
    ("policy", "policy", False), ("usable", "usable_blocks", True),
    ("active", "active_outcome", False), ("resident lost", "resident_blocks_lost", True),
    ("of which harm", "harm", True), ("claim", "claim_outcome", False),
    ("shortfall", "shortfall_blocks", True), ("refusal named", "blocking_claim_ids", False),
    ("expiry", "expiry", True), ("relax", "relaxation", True), ("evict", "eviction", True),
    ("unknown", "unknown", True), ("all lost", "blocks_lost", True))


def render_table(rows: list[dict[str, Any]]) -> str:
    """The sweep as a fixed-width text table, numbers right-aligned, rows by policy then
    usable blocks (numerically)."""
    def cell(v: Any) -> str:
        if v is None:
            return "-"
        return ",".join(v) or "-" if isinstance(v, list) else str(v)

    rows = sorted(rows, key=lambda r: (str(r["policy"]), int(r["usable_blocks"] or 0)))
    lines = [tuple(t for t, _, _ in _TABLE)]
    lines += [tuple(cell(r.get(k)) for _, k, _ in _TABLE) for r in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(_TABLE))]
    return "\n".join(
        "  ".join(c.rjust(w) if right else c.ljust(w)
                  for c, w, (_, _, right) in zip(line, widths, _TABLE)).rstrip()
        for line in lines)


def _complete(run_dir: Path, read_manifest: Any) -> bool:
    try:
        return bool(read_manifest(run_dir).get("complete"))
    except InputError:
        return False


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise InputError(f"--capacities must be comma-separated integers, got {text!r}") from None
    if not values or min(values) < 2:
        raise InputError("--capacities needs at least one value, each at least 2")
    return values


def _names(text: str, known: dict[str, Any]) -> list[str]:
    names = [v.strip() for v in text.split(",") if v.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise InputError(f"unknown policies {unknown}; choose from {sorted(known)}")
    return names
